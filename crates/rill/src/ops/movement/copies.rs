//! Movement ops, part two: copies (`contiguous`, `take`, `concatenate`, `stack`, `split`,
//! `pad`).

use crate::array::Array;
use crate::dtype::{Scalar, promote};
use crate::error::{Error, Result};
use crate::ops::{on_device, prepare, target_stream};
use crate::primitives::Primitive;
use crate::primitives::movement as rule;
use crate::shape::normalize_axis;

impl Array {
    /// A row-major copy of the elements in a new buffer: materialises a view (a
    /// transpose, a slice, a broadcast) so that later ops read it contiguously.
    pub fn contiguous(&self) -> Result<Array> {
        let stream = target_stream(&[self])?;
        let input = on_device(self, &stream);
        Ok(Array::from_op(Primitive::Contiguous, vec![input], self.shape().to_vec(), self.dtype(), stream))
    }

    /// Gathers along `axis` with integer `indices` (NumPy's `take`): the result has shape
    /// `self.shape[..axis] + indices.shape + self.shape[axis + 1..]`, and its element at
    /// `[.., j.., ..]` is `self[.., indices[j..], ..]`. Negative indices count from the end.
    ///
    /// `indices` must have an integer dtype (u8, u32, i32, i64). Their values are only
    /// known when the result is computed, so an index outside `[-size, size)` is reported
    /// then: evaluating the result (and anything built from it) returns `Error::Index`.
    pub fn take(&self, indices: &Array, axis: isize) -> Result<Array> {
        if !indices.dtype().is_int() {
            return Err(Error::dtype("take", indices.dtype(), "indices must be an integer dtype (u8, u32, i32, i64)"));
        }
        let ax = normalize_axis("take", axis, self.ndim())?;
        let shape = rule::take(self.shape(), indices.shape(), ax, self.dtype())?;
        let stream = target_stream(&[self, indices])?;
        let inputs = vec![on_device(self, &stream), on_device(indices, &stream)];
        Ok(Array::from_op(Primitive::Take { axis: ax }, inputs, shape, self.dtype(), stream))
    }

    /// Splits into `sections` equal parts along `axis` (views). `sections` must be
    /// positive and divide the axis size.
    pub fn split(&self, sections: usize, axis: isize) -> Result<Vec<Array>> {
        let ax = normalize_axis("split", axis, self.ndim())?;
        let n = self.shape()[ax];
        if sections == 0 || !n.is_multiple_of(sections) {
            return Err(Error::invalid(
                "split",
                format!("{sections} equal sections do not divide axis {ax} of shape {:?}", self.shape()),
            ));
        }
        let w = n / sections;
        (0..sections)
            .map(|i| self.slice_axis(ax as isize, Some((i * w) as isize), Some(((i + 1) * w) as isize), 1))
            .collect()
    }

    /// Splits along `axis` before each of `indices` (views): the parts are
    /// `[..i0]`, `[i0..i1]`, ..., `[ik..]`, with NumPy slice semantics (negative indices
    /// count from the end, indices past the end or out of order give empty parts).
    pub fn split_indices(&self, indices: &[isize], axis: isize) -> Result<Vec<Array>> {
        let ax = normalize_axis("split", axis, self.ndim())? as isize;
        let mut out = Vec::with_capacity(indices.len() + 1);
        let mut prev = Some(0);
        for &i in indices {
            out.push(self.slice_axis(ax, prev, Some(i), 1)?);
            prev = Some(i);
        }
        out.push(self.slice_axis(ax, prev, None, 1)?);
        Ok(out)
    }

    /// Constant padding: `widths[i] = (before, after)` elements of `value` on axis `i`
    /// (one pair applies to every axis). `value` is converted to the array's dtype.
    pub fn pad(&self, widths: &[(usize, usize)], value: impl Into<Scalar>) -> Result<Array> {
        let rule::Pad { widths, shape } = rule::pad(self.shape(), widths, self.dtype())?;
        let stream = target_stream(&[self])?;
        let x = on_device(self, &stream);
        let value = value.into().as_f64();
        Ok(Array::from_op(Primitive::Pad { widths, value }, vec![x], shape, self.dtype(), stream))
    }
}

/// Joins arrays along an existing `axis`. Shapes must agree on every other axis; dtypes
/// promote as in binary ops. Errors name all the shapes.
pub fn concatenate(arrays: &[&Array], axis: isize) -> Result<Array> {
    let first = arrays.first().ok_or_else(|| Error::invalid("concatenate", "needs at least one array"))?;
    let ax = normalize_axis("concatenate", axis, first.ndim())?;
    let dtype = arrays[1..].iter().fold(first.dtype(), |d, a| promote(d, a.dtype()));
    let shapes: Vec<&[usize]> = arrays.iter().map(|a| a.shape()).collect();
    let shape = rule::concatenate(&shapes, ax, dtype)?;
    let stream = target_stream(arrays)?;
    let inputs: Vec<Array> = arrays.iter().map(|a| prepare(a, dtype, &stream)).collect();
    Ok(Array::from_op(Primitive::Concatenate { axis: ax }, inputs, shape, dtype, stream))
}

/// Joins arrays of one shape along a new `axis` of the result (`-1` appends it). Dtypes
/// promote as in [`concatenate`].
pub fn stack(arrays: &[&Array], axis: isize) -> Result<Array> {
    let first = arrays.first().ok_or_else(|| Error::invalid("stack", "needs at least one array"))?;
    if let Some(bad) = arrays.iter().find(|a| a.shape() != first.shape()) {
        return Err(Error::shape(
            "stack",
            format!("all shapes must be equal, got {:?} and {:?}", first.shape(), bad.shape()),
        ));
    }
    let ax = normalize_axis("stack", axis, first.ndim() + 1)? as isize;
    let parts = arrays.iter().map(|a| a.expand_dims(ax)).collect::<Result<Vec<_>>>()?;
    concatenate(&parts.iter().collect::<Vec<_>>(), ax)
}
