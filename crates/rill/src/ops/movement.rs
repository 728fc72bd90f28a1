//! Movement ops, part one: zero-copy views.
//!
//! `reshape`, `flatten`, `expand_dims`, `squeeze` record a `Reshape` node, `transpose`,
//! `t`, `swapaxes` a `Permute`, `broadcast_to` a `BroadcastTo`, and `slice`, `slice_axis`,
//! `index` a `Slice`. Their output shares the input's buffer (strides in elements, possibly
//! zero or negative); only a reshape of a layout that cannot be re-strided copies.
//! The copies (`take`, `concatenate`, `stack`, `split`, `pad`) live in [`copies`].

pub(crate) mod copies;

use crate::array::Array;
use crate::compile::rules::{self, Note};
use crate::error::{Error, Result};
use crate::ops::{on_device, target_stream};
use crate::primitives::Primitive;
use crate::primitives::movement as rule;
pub use crate::primitives::movement::SliceArg;
use crate::shape::{normalize_axes, normalize_axis};

/// Records a view node of `x` with `shape`.
fn view(x: &Array, prim: Primitive, shape: Vec<usize>) -> Result<Array> {
    let stream = target_stream(&[x])?;
    let input = on_device(x, &stream);
    let dtype = x.dtype();
    Ok(Array::from_op(prim, vec![input], shape, dtype, stream))
}

impl Array {
    /// The same elements (row-major) with a new shape. One dimension may be `-1`, inferred
    /// from the others. Zero-copy when the layout allows it.
    ///
    /// Errors (`Error::Shape`, naming both shapes) when the element counts differ, a
    /// dimension is negative other than `-1`, or `-1` appears twice or cannot be inferred.
    pub fn reshape(&self, shape: &[isize]) -> Result<Array> {
        let new = rule::reshape(self.shape(), shape, self.dtype())?;
        view(self, Primitive::Reshape, new)
    }
    /// A 1-d view of all the elements in row-major order (a 0-d array becomes shape `[1]`).
    pub fn flatten(&self) -> Result<Array> {
        view(self, Primitive::Reshape, vec![self.size()])
    }
    /// Permutes the axes: axis `i` of the result is axis `perm[i]` of `self`. An empty
    /// `perm` reverses the axes. Errors when `perm` is not a permutation of `0..ndim`.
    pub fn transpose(&self, perm: &[usize]) -> Result<Array> {
        let nd = self.ndim();
        let perm: Vec<usize> = if perm.is_empty() { (0..nd).rev().collect() } else { perm.to_vec() };
        let shape = rule::permute(self.shape(), &perm)?;
        view(self, Primitive::Permute(perm), shape)
    }
    /// The axes reversed (`transpose(&[])`); a matrix transpose for 2-d arrays.
    pub fn t(&self) -> Result<Array> {
        self.transpose(&[])
    }
    /// Exchanges axes `a` and `b` (negative axes count from the end).
    pub fn swapaxes(&self, a: isize, b: isize) -> Result<Array> {
        let nd = self.ndim();
        let (a, b) = (normalize_axis("swapaxes", a, nd)?, normalize_axis("swapaxes", b, nd)?);
        let mut perm: Vec<usize> = (0..nd).collect();
        perm.swap(a, b);
        self.transpose(&perm)
    }
    /// Inserts an axis of size 1 at position `axis` of the result (`-1` appends).
    pub fn expand_dims(&self, axis: isize) -> Result<Array> {
        let ax = normalize_axis("expand_dims", axis, self.ndim() + 1)?;
        let shape = rule::expand(self.shape(), &[ax])?;
        let y = view(self, Primitive::Reshape, shape)?;
        rules::note(&y, Note::Expand(vec![ax]));
        Ok(y)
    }
    /// Removes the given axes, which must have size 1; an empty `axes` removes every axis
    /// of size 1.
    pub fn squeeze(&self, axes: &[isize]) -> Result<Array> {
        // Only axes named by the caller follow from ranks (a shapeless replay keeps them).
        let named = !axes.is_empty();
        let axes = if axes.is_empty() {
            (0..self.ndim()).filter(|&i| self.shape()[i] == 1).collect()
        } else {
            normalize_axes("squeeze", axes, self.ndim())?
        };
        let shape = rule::squeeze(self.shape(), &axes)?;
        let y = view(self, Primitive::Reshape, shape)?;
        if named {
            rules::note(&y, Note::Squeeze(axes));
        }
        Ok(y)
    }
    /// A zero-copy view with `shape` under NumPy broadcasting: `shape` has at least as many
    /// axes, and each trailing axis of `self` equals the target's or is 1.
    pub fn broadcast_to(&self, shape: &[usize]) -> Result<Array> {
        let shape = rule::broadcast_to(self.shape(), shape, self.dtype())?;
        view(self, Primitive::BroadcastTo, shape)
    }
    /// A strided view, NumPy's `x[a:b:c, ...]`: one [`SliceArg`] per leading axis (axes
    /// without one are taken whole). Zero-copy; negative steps walk backwards.
    ///
    /// Errors on more arguments than axes or a step of zero.
    pub fn slice(&self, args: &[SliceArg]) -> Result<Array> {
        let rule::Slice { start, step, shape } = rule::slice(self.shape(), args)?;
        view(self, Primitive::Slice { start, step }, shape)
    }
    /// Slices one axis: `start:stop:step` on `axis`, the others whole.
    pub fn slice_axis(&self, axis: isize, start: Option<isize>, stop: Option<isize>, step: isize) -> Result<Array> {
        let ax = normalize_axis("slice", axis, self.ndim())?;
        let mut args = vec![SliceArg::full(); ax + 1];
        args[ax] = SliceArg::new(start, stop, step);
        self.slice(&args)
    }
    /// Element `i` along `axis`, with that axis removed (NumPy's `x[i]` for axis 0).
    /// Negative `i` counts from the end; out of range is `Error::Index`.
    pub fn index(&self, axis: isize, i: isize) -> Result<Array> {
        let ax = normalize_axis("index", axis, self.ndim())?;
        let size = self.shape()[ax];
        let j = if i < 0 { i + size as isize } else { i };
        if j < 0 || j >= size as isize {
            return Err(Error::Index { op: "index", index: i as i64, axis: ax, size });
        }
        let one = self.slice_axis(ax as isize, Some(j), Some(j + 1), 1)?;
        let shape = rule::squeeze(one.shape(), &[ax])?;
        view(&one, Primitive::Reshape, shape)
    }
}
