//! Shape rules of the source primitives (no inputs): `Constant`, `Full`, `Arange`, `Eye`
//! and `Random`.
//!
//! Their shapes come from parameters, not from input shapes, so a shapeless replay keeps
//! the traced shape (a 0-d `Full` included) and these rules have one user: the op that
//! records the node (`array/create.rs`, `random.rs`).

use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::shape::checked_size;

/// `Constant` of `len` host values with `shape`: they must fill it exactly.
pub(crate) fn constant(op: &'static str, len: usize, shape: &[usize], dtype: DType) -> Result<()> {
    let n = checked_size(op, shape, dtype)?;
    if n != len {
        return Err(Error::shape(op, format!("{len} values do not fill shape {shape:?} ({n} elements)")));
    }
    Ok(())
}

/// `Full` of `shape` (`op` names the caller in messages).
pub(crate) fn full(op: &'static str, shape: &[usize], dtype: DType) -> Result<Vec<usize>> {
    checked_size(op, shape, dtype)?;
    Ok(shape.to_vec())
}

/// `Arange` from `start` to `stop` (exclusive) by `step`, NumPy's length
/// `ceil((stop - start) / step)` (0 when negative): the shape `[length]`. The dtype must be
/// numeric, `step` non-zero and the bounds finite.
pub(crate) fn arange(start: f64, stop: f64, step: f64, dtype: DType) -> Result<Vec<usize>> {
    if dtype == DType::Bool {
        return Err(Error::dtype("arange", dtype, "arange needs a numeric dtype"));
    }
    if step == 0.0 {
        return Err(Error::invalid("arange", "step cannot be 0"));
    }
    let len = ((stop - start) / step).ceil();
    if !len.is_finite() {
        return Err(Error::invalid("arange", format!("start {start}, stop {stop} and step {step} must be finite")));
    }
    if len >= (1u64 << 53) as f64 {
        return Err(Error::invalid("arange", format!("arange({start}, {stop}, {step}) is too long")));
    }
    full("arange", &[len.max(0.0) as usize], dtype)
}

/// `linspace` of `num` values from `start` to `stop`: the shape `[num]`; the bounds must
/// be finite.
pub(crate) fn linspace(start: f64, stop: f64, num: usize, dtype: DType) -> Result<Vec<usize>> {
    if !(start.is_finite() && stop.is_finite()) {
        return Err(Error::invalid("linspace", format!("start {start} and stop {stop} must be finite")));
    }
    full("linspace", &[num], dtype)
}

/// `Eye` of `n` rows and `m` columns: the shape `[n, m]`.
pub(crate) fn eye(n: usize, m: usize, dtype: DType) -> Result<Vec<usize>> {
    full("eye", &[n, m], dtype)
}

/// `Random` of `shape`: at most 2^62 elements, so a normal draw's counters (`2i + 1`) stay
/// below the ones key derivation uses (see `random.rs`).
pub(crate) fn random(op: &'static str, shape: &[usize], dtype: DType) -> Result<Vec<usize>> {
    checked_size(op, shape, dtype)?;
    if shape.iter().product::<usize>() > (1usize << 62) {
        return Err(Error::shape(op, format!("shape {shape:?} has too many elements")));
    }
    Ok(shape.to_vec())
}

/// Sources have no inputs, so no cotangent flows anywhere (see `grad.rs`).
pub(crate) fn vjp(_: &super::Primitive, _: &super::grad::Vjp<'_>) -> Result<Vec<Option<crate::Array>>> {
    Ok(Vec::new())
}

/// A source does not depend on any input: its tangent is zero.
pub(crate) fn jvp(_: &super::Primitive, _: &super::grad::Jvp<'_>) -> Result<Option<crate::Array>> {
    Ok(None)
}
