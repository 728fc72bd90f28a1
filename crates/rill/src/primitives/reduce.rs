//! Reduction primitives' shape and dtype rules: `Reduce` (and `FusedReduce`, which
//! reduces like it), `ArgReduce` and `Cumsum`.
//!
//! A reduction keeps its reduced axes with size 1; removing them is a separate `Reshape`
//! ([`super::movement::squeeze`]). Each function is the one rule for its primitive, used by
//! `ops/reduce.rs` when it records the node and by `compile/shapes.rs` when a shapeless
//! replay re-derives it.

use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::primitives::ReduceOp;
use crate::shape::normalize_axis;

/// The name of a reduction in messages (and of its `Reduce` primitive).
pub(crate) fn name(op: ReduceOp) -> &'static str {
    match op {
        ReduceOp::Sum => "sum",
        ReduceOp::Prod => "prod",
        ReduceOp::Max => "max",
        ReduceOp::Min => "min",
        ReduceOp::Mean => "mean",
    }
}

/// The dtype sums, products and cumulative sums accumulate in: bool gives i32, u8 gives
/// u32, others keep theirs.
pub(crate) fn sum_dtype(d: DType) -> DType {
    match d {
        DType::Bool => DType::I32,
        DType::U8 => DType::U32,
        d => d,
    }
}

/// The dtype `mean`/`var`/`logsumexp` compute in, and the dtype of their result.
pub(crate) fn float_dtypes(d: DType) -> (DType, DType) {
    match d {
        DType::F64 => (DType::F64, DType::F64),
        DType::F16 | DType::BF16 => (DType::F32, d),
        _ => (DType::F32, DType::F32),
    }
}

/// The number of elements a reduction of `shape` over `axes` combines (what `mean` and
/// `var` divide by).
pub(crate) fn count(op: &'static str, shape: &[usize], axes: &[usize]) -> Result<usize> {
    axes.iter().try_fold(1usize, |n, &a| {
        let d = *shape.get(a).ok_or(Error::Axis { op, axis: a as isize, ndim: shape.len() })?;
        // A shape that passed `checked_size` cannot overflow here; a rule never wraps.
        n.checked_mul(d).ok_or_else(|| Error::shape(op, format!("shape {shape:?} has too many elements")))
    })
}

/// The value of the 0-d fill `mean` and `var` divide by: `n` elements less `ddof`, at
/// least 0 (NumPy's divisor).
pub(crate) fn count_fill(n: usize, ddof: usize) -> f64 {
    n.saturating_sub(ddof) as f64
}

/// `Reduce { op, axes }` of `x`: `x` with `axes` set to 1. A maximum or minimum of no
/// elements is an error (they have no identity, as in NumPy).
pub(crate) fn reduce(op: ReduceOp, x: &[usize], axes: &[usize]) -> Result<Vec<usize>> {
    let name = name(op);
    let n = count(name, x, axes)?;
    let extremum = match op {
        ReduceOp::Max | ReduceOp::Min => true,
        ReduceOp::Sum | ReduceOp::Prod | ReduceOp::Mean => false,
    };
    if extremum && n == 0 {
        return Err(Error::shape(
            name,
            format!("zero-size reduction over axes {axes:?} of shape {x:?}: {name} has no identity"),
        ));
    }
    Ok(keep(x, axes))
}

/// `shape` with `axes` (in range) set to 1.
fn keep(shape: &[usize], axes: &[usize]) -> Vec<usize> {
    shape.iter().enumerate().map(|(i, &d)| if axes.contains(&i) { 1 } else { d }).collect()
}

/// `ArgReduce` of `x` along `axis` (negative counts from the end): the axis resolved, and
/// `x` with it set to 1. An empty axis is an error (`name` of an empty sequence).
pub(crate) fn arg_reduce(name: &'static str, x: &[usize], axis: isize) -> Result<(usize, Vec<usize>)> {
    let ax = normalize_axis(name, axis, x.len())?;
    if x[ax] == 0 {
        return Err(Error::shape(name, format!("axis {axis} of shape {x:?} is empty: {name} of an empty sequence")));
    }
    Ok((ax, keep(x, &[ax])))
}

/// `Cumsum` of `x` along `axis` (negative counts from the end): the axis resolved, and the
/// shape of `x`.
pub(crate) fn cumsum(x: &[usize], axis: isize) -> Result<(usize, Vec<usize>)> {
    Ok((normalize_axis("cumsum", axis, x.len())?, x.to_vec()))
}

// ---- gradient rules (see `grad.rs`) ----

use super::Primitive;
use super::grad::{Jvp, Vjp, no_rule};
use crate::array::Array;
use crate::ops::elementwise::where_;

/// `axes` as the signed axes the ops take.
fn signed(axes: &[usize]) -> Vec<isize> {
    axes.iter().map(|&a| a as isize).collect()
}

/// `x` summed over `axes` with the axes kept (the identity when there are none).
fn sum_kept(x: &Array, axes: &[usize]) -> Result<Array> {
    if axes.is_empty() { Ok(x.clone()) } else { x.sum(&signed(axes), true) }
}

/// `x / n` computed as the mean computes (f32 for f16 and bf16, where `n` is exact), in
/// `x`'s dtype.
fn divide(x: &Array, n: usize) -> Result<Array> {
    let d = x.dtype();
    x.astype(float_dtypes(d).0)?.div(n as f64)?.astype(d)
}

/// `d y / d x` of `y = op(x)` over `axes` (kept), of `x`'s shape; `None` for a sum
/// (the derivative is one) and a mean (one over the count, applied by the callers as a
/// division). `prod`: the product of the other elements, exact when the
/// row holds zeros. `max`/`min`: the derivative is split evenly between the elements
/// equal to the extremum (ties share it).
fn reduce_derivative(op: ReduceOp, axes: &[usize], x: &Array, y: &Array) -> Result<Option<Array>> {
    if axes.is_empty() {
        return Ok(None);
    }
    let d = x.dtype();
    Ok(match op {
        ReduceOp::Sum | ReduceOp::Mean => None,
        ReduceOp::Prod => {
            let zero = x.eq(0.0)?;
            let nonzero = where_(&zero, 1.0, x)?;
            let p = nonzero.prod(&signed(axes), true)?;
            let zeros = zero.astype(d)?.sum(&signed(axes), true)?;
            let one_zero = where_(&zeros.eq(1.0)?.logical_and(&zero)?, &p, 0.0)?;
            Some(where_(&zeros.eq(0.0)?, &p.div(&nonzero)?, &one_zero)?)
        }
        ReduceOp::Max | ReduceOp::Min => {
            let hit = x.eq(y)?.astype(d)?;
            Some(hit.div(&hit.sum(&signed(axes), true)?)?)
        }
    })
}

/// `Reduce`: the cotangent broadcast back over the reduced axes (times the derivative).
/// `ArgReduce`: none (an index). `Cumsum`: the cumulative sum of the cotangent the other
/// way.
pub(crate) fn vjp(p: &Primitive, g: &Vjp<'_>) -> Result<Vec<Option<Array>>> {
    let x = &g.inputs[0];
    match p {
        Primitive::Reduce { op: ReduceOp::Mean, axes } => {
            let n = count("mean", x.shape(), axes)?;
            Ok(vec![Some(divide(g.cotangent, n)?.broadcast_to(x.shape())?)])
        }
        Primitive::Reduce { op, axes } => {
            let ct = g.cotangent.broadcast_to(x.shape())?;
            Ok(vec![Some(match reduce_derivative(*op, axes, x, g.output)? {
                Some(d) => ct.mul(&d)?,
                None => ct,
            })])
        }
        Primitive::ArgReduce { .. } => Ok(vec![None]),
        Primitive::Cumsum { axis, reverse, exclusive } => {
            Ok(vec![Some(g.cotangent.cumsum_with(*axis as isize, !*reverse, *exclusive)?)])
        }
        other => Err(no_rule(other.name(), "vjp")),
    }
}

/// The forward rules of the reductions: the tangent reduced like the input.
pub(crate) fn jvp(p: &Primitive, g: &Jvp<'_>) -> Result<Option<Array>> {
    let Some(t) = &g.tangents[0] else { return Ok(None) };
    match p {
        Primitive::Reduce { op: ReduceOp::Mean, axes } => {
            Ok(Some(if axes.is_empty() { t.clone() } else { t.mean(&signed(axes), true)? }))
        }
        Primitive::Reduce { op, axes } => {
            let t = match reduce_derivative(*op, axes, &g.inputs[0], g.output)? {
                Some(d) => t.mul(&d)?,
                None => t.clone(),
            };
            Ok(Some(sum_kept(&t, axes)?))
        }
        Primitive::ArgReduce { .. } => Ok(None),
        Primitive::Cumsum { axis, reverse, exclusive } => {
            Ok(Some(t.cumsum_with(*axis as isize, *reverse, *exclusive)?))
        }
        other => Err(no_rule(other.name(), "jvp")),
    }
}
