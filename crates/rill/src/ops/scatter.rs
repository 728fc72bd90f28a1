//! Scatters and gathers with index arrays along an axis: [`scatter_add`] (the adjoint of
//! [`Array::take`]), [`take_along_axis`], [`put_along_axis`] and
//! [`scatter_add_along_axis`] (the adjoint of `take_along_axis`).
//!
//! Indices are integer arrays (u8, u32, i32, i64) as for `take`: a negative index counts
//! from the end, and since the values are only known when the result is computed, an
//! index outside `[-size, size)` is reported then: evaluating the result (and anything
//! built from it) returns `Error::Index` naming the op, the first bad index in row-major
//! order of the index array, the axis and its size. Every result is a new array; `x` is
//! never modified.
//!
//! **Duplicate indices.** `scatter_add` and `scatter_add_along_axis` sum every update
//! into its target. On the CPU the sums run in row-major order of the updates, so a
//! result is the same on every run; on a GPU they are atomic adds in no fixed order, so
//! float results with duplicate indices may differ from run to run in the last bits
//! (integer and bool results are exact: integers wrap, bool adds are logical or, as
//! `add` is). `put_along_axis` keeps, for each target, the value of the last index
//! position in row-major order that names it, on every backend.

use crate::array::Array;
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::ops::{on_device, prepare, target_stream};
use crate::primitives::{Primitive, scatter as rule};
use crate::shape::normalize_axis;

/// `x` with each slice of `updates` added into the slice of `x` that `indices` names
/// along `axis`: for `take(x, indices, axis)` of shape `x.shape[..axis] + indices.shape +
/// x.shape[axis + 1..]`, `out[.., indices[j..], ..] += updates[.., j.., ..]` over every
/// `j..`, so `scatter_add(zeros_like(x), indices, ct, axis)` is `take`'s vector-Jacobian
/// product. Duplicate indices accumulate (see the module's notes on their order).
///
/// `updates` broadcasts to that shape and is converted to `x`'s dtype; the result has
/// `x`'s shape and dtype.
///
/// ```
/// # use rill::Array;
/// let x = Array::zeros(&[4], rill::DType::F32)?;
/// let idx = Array::from_slice(&[1i32, 3, 1, -1], &[4])?;
/// let up = Array::from_slice(&[1.0f32, 2.0, 3.0, 4.0], &[4])?;
/// assert_eq!(rill::scatter_add(&x, &idx, &up, 0)?.to_vec::<f32>()?, [0.0, 4.0, 0.0, 6.0]);
/// # Ok::<(), rill::Error>(())
/// ```
///
/// Errors: an axis out of range, non-integer indices, updates that do not broadcast to
/// the gathered shape; when evaluated, an index out of range (`Error::Index`).
pub fn scatter_add(x: &Array, indices: &Array, updates: &Array, axis: isize) -> Result<Array> {
    const NAME: &str = "scatter_add";
    check_indices(NAME, indices)?;
    let ax = normalize_axis(NAME, axis, x.ndim())?;
    let want = rule::gathered(NAME, x.shape(), indices.shape(), ax)?;
    check_broadcast(NAME, "updates", updates.shape(), &want)?;
    let dtype = x.dtype();
    let stream = target_stream(&[x, indices, updates])?;
    let updates = stretch(prepare(updates, dtype, &stream), &want)?;
    let shape = rule::scatter_add(x.shape(), indices.shape(), updates.shape(), ax)?;
    let inputs = vec![on_device(x, &stream), on_device(indices, &stream), updates];
    Ok(Array::from_op(Primitive::ScatterAdd { axis: ax }, inputs, shape, dtype, stream))
}

/// Gathers one element per index along `axis` (NumPy's `take_along_axis`): `indices` has
/// `x`'s rank, and `out[i.., j, k..] = x[i.., indices[i.., j, k..], k..]` with `j` along
/// `axis`. On every other axis `x` and `indices` broadcast against each other (equal, or
/// one of them 1); the result has the broadcast shape with `indices`' length along
/// `axis`, and `x`'s dtype. Negative indices count from the end.
///
/// ```
/// # use rill::Array;
/// let x = Array::from_slice(&[10.0f32, 30.0, 20.0, 5.0, 7.0, 6.0], &[2, 3])?;
/// let idx = x.argmax(1, true)?; // [[1], [1]]
/// assert_eq!(rill::take_along_axis(&x, &idx, 1)?.to_vec::<f32>()?, [30.0, 7.0]);
/// # Ok::<(), rill::Error>(())
/// ```
///
/// Errors: an axis out of range, non-integer indices, a rank or shape that does not
/// broadcast; when evaluated, an index out of range (`Error::Index`).
pub fn take_along_axis(x: &Array, indices: &Array, axis: isize) -> Result<Array> {
    const NAME: &str = "take_along_axis";
    check_indices(NAME, indices)?;
    let ax = normalize_axis(NAME, axis, x.ndim())?;
    let (xs, is) = rule::along(NAME, x.shape(), indices.shape(), ax, true)?;
    let shape = rule::take_along_axis(&xs, &is, ax, x.dtype())?;
    let stream = target_stream(&[x, indices])?;
    let inputs = vec![stretch(on_device(x, &stream), &xs)?, stretch(on_device(indices, &stream), &is)?];
    Ok(Array::from_op(Primitive::TakeAlongAxis { axis: ax }, inputs, shape, x.dtype(), stream))
}

/// `x` with `values` written along `axis` at `indices` (NumPy's `put_along_axis`, as a
/// new array): `out[i.., indices[i.., j, k..], k..] = values[i.., j, k..]`. `indices` has
/// `x`'s rank and broadcasts to `x`'s shape on every axis but `axis`; `values` broadcasts
/// to the indices' shape and is converted to `x`'s dtype. Where several positions name
/// the same element, the last one in row-major order of the indices wins, on every
/// backend.
///
/// Errors: as for [`take_along_axis`], and values that do not broadcast.
pub fn put_along_axis(x: &Array, indices: &Array, values: &Array, axis: isize) -> Result<Array> {
    put_along(x, indices, values, axis, false)
}

/// `x` with `updates` summed in along `axis` at `indices` (PyTorch's `scatter_add`;
/// NumPy's `np.add.at` with `put_along_axis`'s indexing): `out[i.., indices[i.., j, k..],
/// k..] += updates[i.., j, k..]`, duplicates accumulating, so
/// `scatter_add_along_axis(zeros_like(x), indices, ct, axis)` is `take_along_axis`'s
/// vector-Jacobian product. Shapes and errors as for [`put_along_axis`]; see the
/// module's notes on the order of the sums.
pub fn scatter_add_along_axis(x: &Array, indices: &Array, updates: &Array, axis: isize) -> Result<Array> {
    put_along(x, indices, updates, axis, true)
}

/// [`put_along_axis`] (`accumulate` false) or [`scatter_add_along_axis`].
pub(crate) fn put_along(x: &Array, indices: &Array, values: &Array, axis: isize, accumulate: bool) -> Result<Array> {
    let prim = |axis| Primitive::PutAlongAxis { axis, accumulate };
    let name = prim(0).name();
    check_indices(name, indices)?;
    let ax = normalize_axis(name, axis, x.ndim())?;
    let (_, is) = rule::along(name, x.shape(), indices.shape(), ax, false)?;
    check_broadcast(name, if accumulate { "updates" } else { "values" }, values.shape(), &is)?;
    let dtype = x.dtype();
    let stream = target_stream(&[x, indices, values])?;
    let idx = stretch(on_device(indices, &stream), &is)?;
    let values = stretch(prepare(values, dtype, &stream), &is)?;
    let shape = rule::put_along_axis(name, x.shape(), idx.shape(), values.shape(), ax)?;
    Ok(Array::from_op(prim(ax), vec![on_device(x, &stream), idx, values], shape, dtype, stream))
}

/// Indices must be an integer array.
fn check_indices(op: &'static str, a: &Array) -> Result<()> {
    match a.dtype() {
        DType::I32 | DType::I64 | DType::U32 | DType::U8 => Ok(()),
        DType::Bool | DType::F16 | DType::BF16 | DType::F32 | DType::F64 => {
            Err(Error::dtype(op, a.dtype(), "indices must be an integer array (u8, u32, i32 or i64)"))
        }
    }
}

/// An error naming `op` unless `shape` broadcasts to `to`.
fn check_broadcast(op: &'static str, what: &str, shape: &[usize], to: &[usize]) -> Result<()> {
    let off = to.len().checked_sub(shape.len());
    let ok = off.is_some_and(|off| shape.iter().enumerate().all(|(i, &d)| d == 1 || d == to[off + i]));
    if ok { Ok(()) } else { Err(Error::shape(op, format!("{what} of shape {shape:?} do not broadcast to {to:?}"))) }
}

/// `a` broadcast to `shape` (a view), or `a` itself when it has that shape.
fn stretch(a: Array, shape: &[usize]) -> Result<Array> {
    if a.shape() == shape { Ok(a) } else { a.broadcast_to(shape) }
}

impl Array {
    /// [`scatter_add`] into `self`.
    pub fn scatter_add(&self, indices: &Array, updates: &Array, axis: isize) -> Result<Array> {
        scatter_add(self, indices, updates, axis)
    }
    /// [`take_along_axis`] of `self`.
    pub fn take_along_axis(&self, indices: &Array, axis: isize) -> Result<Array> {
        take_along_axis(self, indices, axis)
    }
    /// [`put_along_axis`] into `self`.
    pub fn put_along_axis(&self, indices: &Array, values: &Array, axis: isize) -> Result<Array> {
        put_along_axis(self, indices, values, axis)
    }
    /// [`scatter_add_along_axis`] into `self`.
    pub fn scatter_add_along_axis(&self, indices: &Array, updates: &Array, axis: isize) -> Result<Array> {
        scatter_add_along_axis(self, indices, updates, axis)
    }
}
