//! Movement ops, part one: zero-copy views.
//!
//! `reshape`, `flatten`, `expand_dims`, `squeeze` record a `Reshape` node, `transpose`,
//! `t`, `swapaxes` a `Permute`, `broadcast_to` a `BroadcastTo`, and `slice`, `slice_axis`,
//! `index` a `Slice`. Their output shares the input's buffer (strides in elements, possibly
//! zero or negative); only a reshape of a layout that cannot be re-strided copies.
//! The copies (`take`, `concatenate`, `stack`, `split`, `pad`) live in [`copies`].

pub(crate) mod copies;

use std::ops::{Range, RangeFrom, RangeFull, RangeTo};

use crate::array::Array;
use crate::compile::rules::{self, Note};
use crate::error::{Error, Result};
use crate::ops::{on_device, target_stream};
use crate::primitives::Primitive;
use crate::shape::{checked_size, normalize_axes, normalize_axis, numel};

/// One axis of [`Array::slice`]: NumPy's `start:stop:step`.
///
/// `None` bounds take NumPy's defaults (the whole axis in the direction of `step`);
/// negative bounds count from the end; out-of-range bounds are clamped; a negative `step`
/// walks backwards; a zero `step` is an error. Ranges convert: `(1..3).into()`,
/// `(..2).into()`, `(1..).into()`, `(..).into()`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct SliceArg {
    /// First index (inclusive); `None` is the start of the walk.
    pub start: Option<isize>,
    /// Last index (exclusive); `None` walks to the end.
    pub stop: Option<isize>,
    /// The step (never zero).
    pub step: isize,
}

impl SliceArg {
    /// `start:stop:step`.
    pub const fn new(start: Option<isize>, stop: Option<isize>, step: isize) -> Self {
        SliceArg { start, stop, step }
    }
    /// The whole axis, `:`.
    pub const fn full() -> Self {
        SliceArg { start: None, stop: None, step: 1 }
    }
    /// `start:stop`.
    pub const fn range(start: isize, stop: isize) -> Self {
        SliceArg { start: Some(start), stop: Some(stop), step: 1 }
    }
    /// The whole axis reversed, `::-1`.
    pub const fn reversed() -> Self {
        SliceArg { start: None, stop: None, step: -1 }
    }
    /// The same bounds with another step.
    pub const fn step_by(self, step: isize) -> Self {
        SliceArg { step, ..self }
    }
    /// Resolves against an axis of size `n`: the first index taken and the length, as
    /// NumPy's `slice.indices` does. A step of zero is an error naming `axis`.
    pub fn resolve(&self, n: usize, axis: usize) -> Result<(usize, usize)> {
        let step = self.step;
        if step == 0 {
            return Err(Error::invalid("slice", format!("slice step cannot be 0 (axis {axis})")));
        }
        let n = n as isize;
        let wrap = |v: isize| if v < 0 { v + n } else { v };
        let (start, stop) = if step > 0 {
            let clamp = |v: isize| wrap(v).clamp(0, n);
            (self.start.map_or(0, clamp), self.stop.map_or(n, clamp))
        } else {
            let clamp = |v: isize| wrap(v).clamp(-1, n - 1);
            (self.start.map_or(n - 1, clamp), self.stop.map_or(-1, clamp))
        };
        let len = if step > 0 && stop > start {
            (stop - start - 1) as usize / step.unsigned_abs() + 1
        } else if step < 0 && start > stop {
            (start - stop - 1) as usize / step.unsigned_abs() + 1
        } else {
            0
        };
        Ok((if len > 0 { start as usize } else { 0 }, len))
    }
}

impl Default for SliceArg {
    fn default() -> Self {
        SliceArg::full()
    }
}
impl From<Range<isize>> for SliceArg {
    fn from(r: Range<isize>) -> Self {
        SliceArg::range(r.start, r.end)
    }
}
impl From<RangeFrom<isize>> for SliceArg {
    fn from(r: RangeFrom<isize>) -> Self {
        SliceArg::new(Some(r.start), None, 1)
    }
}
impl From<RangeTo<isize>> for SliceArg {
    fn from(r: RangeTo<isize>) -> Self {
        SliceArg::new(None, Some(r.end), 1)
    }
}
impl From<RangeFull> for SliceArg {
    fn from(_: RangeFull) -> Self {
        SliceArg::full()
    }
}

/// Records a view node of `x` with `shape`.
fn view(x: &Array, prim: Primitive, shape: Vec<usize>) -> Result<Array> {
    let stream = target_stream(&[x])?;
    let input = on_device(x, &stream);
    let dtype = x.dtype();
    Ok(Array::from_op(prim, vec![input], shape, dtype, stream))
}

/// The shape `spec` (with at most one `-1`) resolved for `n` elements.
fn infer_shape(old: &[usize], spec: &[isize]) -> Result<Vec<usize>> {
    let n = numel(old);
    let bad = |why: &str| {
        Error::shape("reshape", format!("cannot reshape an array of shape {old:?} into shape {spec:?}{why}"))
    };
    let mut infer = None;
    let mut known = 1usize;
    for (i, &d) in spec.iter().enumerate() {
        if d == -1 {
            if infer.replace(i).is_some() {
                return Err(bad(": only one dimension may be -1"));
            }
        } else if d < 0 {
            return Err(bad(": dimensions must be non-negative or -1"));
        } else {
            known = known.checked_mul(d as usize).ok_or_else(|| bad(": too many elements"))?;
        }
    }
    let mut out: Vec<usize> = spec.iter().map(|&d| d.max(0) as usize).collect();
    match infer {
        Some(i) => {
            if known == 0 || n % known != 0 {
                return Err(bad(&format!(" ({n} elements)")));
            }
            out[i] = n / known;
        }
        None if known != n => return Err(bad(&format!(" ({n} elements vs {known})"))),
        None => {}
    }
    Ok(out)
}

impl Array {
    /// The same elements (row-major) with a new shape. One dimension may be `-1`, inferred
    /// from the others. Zero-copy when the layout allows it.
    ///
    /// Errors (`Error::Shape`, naming both shapes) when the element counts differ, a
    /// dimension is negative other than `-1`, or `-1` appears twice or cannot be inferred.
    pub fn reshape(&self, shape: &[isize]) -> Result<Array> {
        let new = infer_shape(self.shape(), shape)?;
        // Same count, but an empty array's other axes may still be too large.
        checked_size("reshape", &new, self.dtype())?;
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
        let mut seen = vec![false; nd];
        let ok = perm.len() == nd && perm.iter().all(|&p| p < nd && !std::mem::replace(&mut seen[p], true));
        if !ok {
            return Err(Error::invalid(
                "transpose",
                format!("axes {perm:?} are not a permutation of the axes of an array of shape {:?}", self.shape()),
            ));
        }
        let shape = perm.iter().map(|&p| self.shape()[p]).collect();
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
        let mut shape = self.shape().to_vec();
        shape.insert(ax, 1);
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
        if let Some(&bad) = axes.iter().find(|&&a| self.shape()[a] != 1) {
            return Err(Error::shape(
                "squeeze",
                format!("cannot squeeze axis {bad} of size {} in shape {:?}", self.shape()[bad], self.shape()),
            ));
        }
        let shape = (0..self.ndim()).filter(|i| !axes.contains(i)).map(|i| self.shape()[i]).collect();
        let y = view(self, Primitive::Reshape, shape)?;
        if named {
            rules::note(&y, Note::Squeeze(axes));
        }
        Ok(y)
    }
    /// A zero-copy view with `shape` under NumPy broadcasting: `shape` has at least as many
    /// axes, and each trailing axis of `self` equals the target's or is 1.
    pub fn broadcast_to(&self, shape: &[usize]) -> Result<Array> {
        let src = self.shape();
        let off = shape.len().checked_sub(src.len());
        let ok = off.is_some_and(|off| src.iter().enumerate().all(|(i, &d)| d == 1 || d == shape[off + i]));
        if !ok {
            return Err(Error::shape("broadcast_to", format!("cannot broadcast shape {src:?} to shape {shape:?}")));
        }
        checked_size("broadcast_to", shape, self.dtype())?;
        view(self, Primitive::BroadcastTo, shape.to_vec())
    }
    /// A strided view, NumPy's `x[a:b:c, ...]`: one [`SliceArg`] per leading axis (axes
    /// without one are taken whole). Zero-copy; negative steps walk backwards.
    ///
    /// Errors on more arguments than axes or a step of zero.
    pub fn slice(&self, args: &[SliceArg]) -> Result<Array> {
        let nd = self.ndim();
        if args.len() > nd {
            return Err(Error::shape(
                "slice",
                format!("{} slice arguments given for an array of shape {:?}", args.len(), self.shape()),
            ));
        }
        let (mut start, mut step, mut shape) = (vec![0; nd], vec![1; nd], self.shape().to_vec());
        for (i, a) in args.iter().enumerate() {
            let (first, len) = a.resolve(shape[i], i)?;
            start[i] = first;
            shape[i] = len;
            // A step only matters between two elements, where it is below the axis size.
            step[i] = if len > 1 { a.step } else { 1 };
        }
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
        let mut shape = self.shape().to_vec();
        shape.remove(ax);
        view(&one, Primitive::Reshape, shape)
    }
}
