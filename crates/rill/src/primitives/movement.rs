//! Movement primitives' shape rules: `Reshape`, `Permute`, `BroadcastTo`, `Slice` (views)
//! and `Take`, `Concatenate`, `Pad` (copies).
//!
//! Each function is the one rule for its primitive's output shape, used by the op that
//! records the node (`ops/movement.rs`, `ops/movement/copies.rs`, and the ops that squeeze
//! or expand axes: reductions, `matmul`) and, where a shapeless replay re-derives the
//! shape, by `compile/shapes.rs`. They only compute; the element count in bytes is checked
//! with [`checked_size`] by the callers for the dtype of the node.

use std::ops::{Range, RangeFrom, RangeFull, RangeTo};

use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::shape::{checked_size, numel};

/// `Reshape` from `old` to `spec` (with at most one `-1`, inferred from the element
/// count), checked for `dtype`: an empty array's other axes may still be too large.
pub(crate) fn reshape(old: &[usize], spec: &[isize], dtype: DType) -> Result<Vec<usize>> {
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
            if known == 0 || !n.is_multiple_of(known) {
                return Err(bad(&format!(" ({n} elements)")));
            }
            out[i] = n / known;
        }
        None if known != n => return Err(bad(&format!(" ({n} elements vs {known})"))),
        None => {}
    }
    checked_size("reshape", &out, dtype)?;
    Ok(out)
}

/// A `Reshape` removing `axes` of `x`, each of size 1 (`squeeze`, reductions without
/// `keepdims`, `matmul` of 1-D operands, `index`).
pub(crate) fn squeeze(x: &[usize], axes: &[usize]) -> Result<Vec<usize>> {
    if let Some(&a) = axes.iter().find(|&&a| x.get(a) != Some(&1)) {
        return Err(match x.get(a) {
            Some(d) => Error::shape("squeeze", format!("cannot squeeze axis {a} of size {d} in shape {x:?}")),
            None => Error::Axis { op: "squeeze", axis: a as isize, ndim: x.len() },
        });
    }
    Ok(x.iter().enumerate().filter(|(i, _)| !axes.contains(i)).map(|(_, &d)| d).collect())
}

/// A `Reshape` inserting axes of size 1 at `axes` (positions in the output) of `x`
/// (`expand_dims`, `matmul` of 1-D operands).
pub(crate) fn expand(x: &[usize], axes: &[usize]) -> Result<Vec<usize>> {
    let rank = x.len() + axes.len();
    if let Some(&a) = axes.iter().find(|&&a| a >= rank) {
        return Err(Error::Axis { op: "expand_dims", axis: a as isize, ndim: rank });
    }
    let mut dims = x.iter();
    // `axes` are in range and `x` has the rest, so `dims` never runs out.
    Ok((0..rank).map(|i| if axes.contains(&i) { 1 } else { dims.next().copied().unwrap_or(1) }).collect())
}

/// `Permute(perm)` of `x`: axis `i` of the output is axis `perm[i]` of `x`; `perm` must
/// be a permutation of `0..rank`.
pub(crate) fn permute(x: &[usize], perm: &[usize]) -> Result<Vec<usize>> {
    let nd = x.len();
    let mut seen = vec![false; nd];
    let ok = perm.len() == nd && perm.iter().all(|&p| p < nd && !std::mem::replace(&mut seen[p], true));
    if !ok {
        return Err(Error::invalid(
            "transpose",
            format!("axes {perm:?} are not a permutation of the axes of an array of shape {x:?}"),
        ));
    }
    Ok(perm.iter().map(|&p| x[p]).collect())
}

/// `BroadcastTo` of `src` to `shape` under NumPy broadcasting, checked for `dtype`.
pub(crate) fn broadcast_to(src: &[usize], shape: &[usize], dtype: DType) -> Result<Vec<usize>> {
    let off = shape.len().checked_sub(src.len());
    let ok = off.is_some_and(|off| src.iter().enumerate().all(|(i, &d)| d == 1 || d == shape[off + i]));
    if !ok {
        return Err(Error::shape("broadcast_to", format!("cannot broadcast shape {src:?} to shape {shape:?}")));
    }
    checked_size("broadcast_to", shape, dtype)?;
    Ok(shape.to_vec())
}

/// One axis of [`Array::slice`](crate::Array::slice): NumPy's `start:stop:step`.
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

/// The parameters and output shape of a `Slice` of `x`.
pub(crate) struct Slice {
    /// First index taken on each axis.
    pub start: Vec<usize>,
    /// Step on each axis.
    pub step: Vec<isize>,
    /// The output shape.
    pub shape: Vec<usize>,
}

/// `Slice` of `x` by `args`, one per leading axis (the others are taken whole).
pub(crate) fn slice(x: &[usize], args: &[SliceArg]) -> Result<Slice> {
    let nd = x.len();
    if args.len() > nd {
        return Err(Error::shape("slice", format!("{} slice arguments given for an array of shape {x:?}", args.len())));
    }
    let (mut start, mut step, mut shape) = (vec![0; nd], vec![1; nd], x.to_vec());
    for (i, a) in args.iter().enumerate() {
        let (first, len) = a.resolve(shape[i], i)?;
        start[i] = first;
        shape[i] = len;
        // A step only matters between two elements, where it is below the axis size.
        step[i] = if len > 1 { a.step } else { 1 };
    }
    Ok(Slice { start, step, shape })
}

/// `Take { axis }` of `x` with indices of shape `indices`: `x[..axis] + indices +
/// x[axis + 1..]` (`axis` in range), checked for `dtype`.
pub(crate) fn take(x: &[usize], indices: &[usize], axis: usize, dtype: DType) -> Result<Vec<usize>> {
    if axis >= x.len() {
        return Err(Error::Axis { op: "take", axis: axis as isize, ndim: x.len() });
    }
    let shape = [&x[..axis], indices, &x[axis + 1..]].concat();
    checked_size("take", &shape, dtype)?;
    Ok(shape)
}

/// `Concatenate { axis }` of arrays of `shapes` (at least one; `axis` in range), checked
/// for `dtype`: equal on every other axis, summed on `axis`.
pub(crate) fn concatenate(shapes: &[&[usize]], axis: usize, dtype: DType) -> Result<Vec<usize>> {
    let all = || shapes.iter().map(|s| format!("{s:?}")).collect::<Vec<_>>().join(", ");
    let Some(first) = shapes.first() else {
        return Err(Error::invalid("concatenate", "needs at least one array"));
    };
    let nd = first.len();
    if axis >= nd {
        return Err(Error::Axis { op: "concatenate", axis: axis as isize, ndim: nd });
    }
    let mut shape = first.to_vec();
    for s in &shapes[1..] {
        if s.len() != nd || (0..nd).any(|i| i != axis && s[i] != shape[i]) {
            return Err(Error::shape(
                "concatenate",
                format!("shapes {} must match on every axis but axis {axis}", all()),
            ));
        }
        shape[axis] = shape[axis]
            .checked_add(s[axis])
            .ok_or_else(|| Error::shape("concatenate", format!("shapes {} are too large", all())))?;
    }
    checked_size("concatenate", &shape, dtype)?;
    Ok(shape)
}

/// The parameters and output shape of a `Pad` of `x`.
pub(crate) struct Pad {
    /// `(before, after)` for each axis.
    pub widths: Vec<(usize, usize)>,
    /// The output shape.
    pub shape: Vec<usize>,
}

/// `Pad` of `x` by `widths` (one `(before, after)` pair per axis, or one pair for every
/// axis), checked for `dtype`.
pub(crate) fn pad(x: &[usize], widths: &[(usize, usize)], dtype: DType) -> Result<Pad> {
    let nd = x.len();
    let widths: Vec<(usize, usize)> = match widths.len() {
        1 => vec![widths[0]; nd],
        l if l == nd => widths.to_vec(),
        l => {
            return Err(Error::shape("pad", format!("{l} (before, after) pairs given for an array of shape {x:?}")));
        }
    };
    let mut shape = Vec::with_capacity(nd);
    for (&d, &(b, a)) in x.iter().zip(&widths) {
        let s = d.checked_add(b).and_then(|s| s.checked_add(a));
        shape.push(s.ok_or_else(|| Error::shape("pad", format!("padding {widths:?} overflows")))?);
    }
    checked_size("pad", &shape, dtype)?;
    Ok(Pad { widths, shape })
}

// ---- gradient rules (see `grad.rs`) ----

use super::Primitive;
use super::grad::{Jvp, Vjp, no_rule, record, unbroadcast};
use crate::array::Array;
use crate::ops::on_device;

/// `shape` as the signed dimensions `reshape` takes.
fn spec(shape: &[usize]) -> Vec<isize> {
    shape.iter().map(|&d| d as isize).collect()
}

/// The cotangent of a `Slice { start, step }` of an input of shape `x`: `ct` placed at
/// the elements the slice took, zeros elsewhere. Per axis: a negative step is walked
/// forwards (the cotangent reversed), a step `s > 1` interleaves `s - 1` zeros after each
/// element, and padding puts the run at its place.
fn unslice(ct: &Array, x: &[usize], start: &[usize], step: &[isize]) -> Result<Array> {
    if ct.size() == 0 {
        return Array::zeros(x, ct.dtype());
    }
    let mut g = ct.clone();
    for ax in 0..x.len() {
        let len = g.shape()[ax];
        let s = step[ax].unsigned_abs();
        let first = if step[ax] < 0 {
            g = g.slice_axis(ax as isize, None, None, -1)?;
            start[ax] - (len - 1) * s
        } else {
            start[ax]
        };
        if s > 1 && len > 1 {
            let mut zshape = g.shape().to_vec();
            zshape.insert(ax + 1, s - 1);
            let zeros = Array::zeros(&zshape, g.dtype())?;
            let spread = crate::ops::movement::copies::concatenate(
                &[&g.expand_dims(ax as isize + 1)?, &zeros],
                ax as isize + 1,
            )?;
            let mut merged = g.shape().to_vec();
            merged[ax] = len * s;
            g = spread.reshape(&spec(&merged))?.slice_axis(
                ax as isize,
                Some(0),
                Some(((len - 1) * s + 1) as isize),
                1,
            )?;
        }
        let covered = g.shape()[ax];
        if covered != x[ax] {
            let mut widths = vec![(0, 0); x.len()];
            widths[ax] = (first, x[ax] - first - covered);
            g = g.pad(&widths, 0.0)?;
        }
    }
    Ok(g)
}

/// The rules of the movement ops: each moves the cotangent back (reshape back, inverse
/// permutation, sum over broadcast axes, unslice, the interior of a pad, the parts of a
/// concatenation, a gather's cotangent scattered back with `scatter_add` (duplicate
/// indices summing; linear in the gathered size), a copy back to the input's device).
pub(crate) fn vjp(p: &Primitive, g: &Vjp<'_>) -> Result<Vec<Option<Array>>> {
    let (x, ct) = (&g.inputs[0], g.cotangent);
    Ok(match p {
        Primitive::Reshape => vec![Some(ct.reshape(&spec(x.shape()))?)],
        Primitive::Permute(perm) => {
            let mut inv = vec![0; perm.len()];
            for (i, &q) in perm.iter().enumerate() {
                inv[q] = i;
            }
            vec![Some(ct.transpose(&inv)?)]
        }
        Primitive::BroadcastTo => vec![Some(unbroadcast(ct, x.shape())?)],
        Primitive::Slice { start, step } => vec![Some(unslice(ct, x.shape(), start, step)?)],
        Primitive::Contiguous => vec![Some(ct.clone())],
        Primitive::Take { axis } => {
            let zeros = Array::zeros(x.shape(), ct.dtype())?;
            vec![Some(crate::ops::scatter::scatter_add(&zeros, &g.inputs[1], ct, *axis as isize)?), None]
        }
        Primitive::Concatenate { axis } => {
            let mut off = 0;
            let mut out = Vec::with_capacity(g.inputs.len());
            for a in g.inputs {
                let len = a.shape()[*axis];
                out.push(Some(ct.slice_axis(*axis as isize, Some(off as isize), Some((off + len) as isize), 1)?));
                off += len;
            }
            out
        }
        Primitive::Pad { widths, .. } => {
            let args: Vec<SliceArg> = widths
                .iter()
                .zip(x.shape())
                .map(|(&(b, _), &d)| SliceArg::range(b as isize, (b + d) as isize))
                .collect();
            vec![Some(ct.slice(&args)?)]
        }
        Primitive::ToDevice => vec![Some(on_device(ct, &x.stream()))],
        other => return Err(no_rule(other.name(), "vjp")),
    })
}

/// The forward rules: every movement op is linear, so the tangent is moved the same way
/// (a pad pads it with zeros; a concatenation joins zeros for inputs without one).
pub(crate) fn jvp(p: &Primitive, g: &Jvp<'_>) -> Result<Option<Array>> {
    let (y, ts) = (g.output, g.tangents);
    let same = |t: &Option<Array>, prim: Primitive| match t {
        Some(t) => record(prim, vec![t.clone()], y.shape(), y.dtype()).map(Some),
        None => Ok(None),
    };
    match p {
        Primitive::Reshape | Primitive::Permute(_) | Primitive::BroadcastTo | Primitive::Slice { .. } => {
            same(&ts[0], p.clone())
        }
        Primitive::Contiguous => Ok(ts[0].clone()),
        Primitive::Pad { widths, .. } => same(&ts[0], Primitive::Pad { widths: widths.clone(), value: 0.0 }),
        Primitive::Take { axis } => match &ts[0] {
            Some(t) => Ok(Some(t.take(&g.inputs[1], *axis as isize)?)),
            None => Ok(None),
        },
        Primitive::Concatenate { axis } => {
            let parts = g
                .inputs
                .iter()
                .zip(ts)
                .map(|(a, t)| match t {
                    Some(t) => Ok(t.clone()),
                    None => Array::zeros(a.shape(), y.dtype()),
                })
                .collect::<Result<Vec<Array>>>()?;
            Ok(Some(crate::ops::movement::copies::concatenate(&parts.iter().collect::<Vec<_>>(), *axis as isize)?))
        }
        Primitive::ToDevice => Ok(ts[0].as_ref().map(|t| on_device(t, &y.stream()))),
        other => Err(no_rule(other.name(), "jvp")),
    }
}
