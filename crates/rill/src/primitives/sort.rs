//! Shape rules of the `Sort` primitive (sort, argsort, top-k along the last axis) and its
//! gradient slot.
//!
//! A `Sort` node orders each row of its input's last axis by a key: every backend maps a
//! value to the same unsigned key (`backend/cpu/sort.rs` documents the mapping) and sorts
//! (key, index) pairs, so the order is stable (equal values keep their index order, in
//! both directions) and identical on every backend. NaNs compare equal to each other and
//! above `+inf` (last ascending, first descending); `-0.0` equals `0.0`. The ops
//! (`ops/sort.rs`) move the sorted axis last before recording the node and back after.

use crate::error::{Error, Result};
use crate::shape::normalize_axis;

/// What a `Sort` node computes along its input's last axis.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct SortSpec {
    /// Largest first (ties still by lower index).
    pub descending: bool,
    /// Keep only the first `k` of the order (top-k); `None`: the whole row.
    pub k: Option<usize>,
    /// Output the positions (i64) in the row instead of the values.
    pub indices: bool,
}

impl SortSpec {
    /// The op name of the node, in messages and traces.
    pub fn name(&self) -> &'static str {
        match (self.k.is_some(), self.indices) {
            (false, false) => "sort",
            (false, true) => "argsort",
            (true, false) => "topk",
            (true, true) => "topk_indices",
        }
    }
}

/// Rows longer than this are refused: the kernels index a row with 32-bit positions.
pub(crate) const MAX_ROW: usize = (1 << 31) - 1;

/// The axis a sort of `x` along `axis` (negative counts from the end) works on, checked.
pub(crate) fn sort_axis(name: &'static str, x: &[usize], axis: isize) -> Result<usize> {
    let ax = normalize_axis(name, axis, x.len())?;
    if x[ax] > MAX_ROW {
        return Err(Error::shape(name, format!("axis {axis} of shape {x:?} is longer than {MAX_ROW} elements")));
    }
    Ok(ax)
}

/// The output shape of a `Sort` node with `spec` on an input of shape `x` (its last axis
/// sorted): `x`, with the last axis `k` long for a top-k. A top-k needs `k` no larger than
/// the axis.
pub(crate) fn shape(spec: &SortSpec, x: &[usize]) -> Result<Vec<usize>> {
    let name = spec.name();
    let n = sort_axis(name, x, -1).map(|a| x[a])?;
    let mut out = x.to_vec();
    if let Some(k) = spec.k {
        if k > n {
            return Err(Error::shape(name, format!("k = {k} is larger than the sorted axis ({n}) of shape {x:?}")));
        }
        *out.last_mut().expect("a checked axis exists") = k;
    }
    Ok(out)
}

/// Reverse mode: positions are integers (a structurally zero cotangent); the sorted values'
/// rule (a scatter of the cotangent) is not written.
pub(crate) fn vjp(p: &super::Primitive, _: &super::grad::Vjp<'_>) -> Result<Vec<Option<crate::Array>>> {
    match p {
        super::Primitive::Sort(s) if s.indices => Ok(vec![None]),
        _ => Err(super::grad::no_rule(p.name(), "vjp")),
    }
}

/// Forward mode: positions have a zero tangent; the sorted values' rule is not written.
pub(crate) fn jvp(p: &super::Primitive, _: &super::grad::Jvp<'_>) -> Result<Option<crate::Array>> {
    match p {
        super::Primitive::Sort(s) if s.indices => Ok(None),
        _ => Err(super::grad::no_rule(p.name(), "jvp")),
    }
}
