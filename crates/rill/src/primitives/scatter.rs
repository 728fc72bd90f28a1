//! Shape rules and gradient rules of the index scatters and the per-element gather:
//! `ScatterAdd` (`take`'s adjoint), `TakeAlongAxis` and `PutAlongAxis` (assign, or with
//! `accumulate` sum: `TakeAlongAxis`'s adjoint).
//!
//! Indices follow `take`: integer arrays (u8, u32, i32, i64), a negative index counts from
//! the end, and an index outside `[-size, size)` fails the node with `Error::Index` when
//! it is computed (the values are only known then). The ops (`ops/scatter.rs`) broadcast
//! the indices, updates and values to the shapes these rules require before recording
//! the node, so the kernels (`backend/cpu/scatter.rs`, `backend/cuda/scatter.rs`) see
//! exact shapes; shapeless replay (`compile/shapes.rs`) calls the same rules.

use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::shape::checked_size;

/// The shape `take(x, indices, axis)` gives (`axis` in range): `x[..axis] + indices +
/// x[axis + 1..]`, the shape of a `ScatterAdd`'s updates.
pub(crate) fn gathered(name: &'static str, x: &[usize], indices: &[usize], axis: usize) -> Result<Vec<usize>> {
    if axis >= x.len() {
        return Err(Error::Axis { op: name, axis: axis as isize, ndim: x.len() });
    }
    Ok([&x[..axis], indices, &x[axis + 1..]].concat())
}

/// `ScatterAdd { axis }` of `x` with indices of shape `indices` and updates of shape
/// `updates` (exactly [`gathered`]'s shape): the shape of `x`.
pub(crate) fn scatter_add(x: &[usize], indices: &[usize], updates: &[usize], axis: usize) -> Result<Vec<usize>> {
    let want = gathered("scatter_add", x, indices, axis)?;
    if updates != want {
        return Err(Error::shape(
            "scatter_add",
            format!(
                "updates of shape {updates:?} do not match the gather of x {x:?} at indices {indices:?} along axis {axis} ({want:?})"
            ),
        ));
    }
    Ok(x.to_vec())
}

/// The shapes `x` and `indices` are broadcast to for a gather or put along `axis` (in
/// range): one rank, equal on every axis but `axis`, where an axis of size 1 is stretched
/// (NumPy's `take_along_axis`). When `x_broadcasts` is false (a put: `x` is the output)
/// only the indices stretch.
pub(crate) fn along(
    name: &'static str,
    x: &[usize],
    indices: &[usize],
    axis: usize,
    x_broadcasts: bool,
) -> Result<(Vec<usize>, Vec<usize>)> {
    if indices.len() != x.len() {
        return Err(Error::shape(name, format!("indices of shape {indices:?} must have the rank of x {x:?}")));
    }
    if axis >= x.len() {
        return Err(Error::Axis { op: name, axis: axis as isize, ndim: x.len() });
    }
    let (mut xs, mut is) = (x.to_vec(), indices.to_vec());
    for d in (0..x.len()).filter(|&d| d != axis) {
        match (x[d], indices[d]) {
            (a, b) if a == b => {}
            (a, 1) => is[d] = a,
            (1, b) if x_broadcasts => xs[d] = b,
            _ => {
                return Err(Error::shape(
                    name,
                    format!(
                        "indices of shape {indices:?} do not broadcast against x {x:?} on axis {d} (along axis {axis})"
                    ),
                ));
            }
        }
    }
    Ok((xs, is))
}

/// `TakeAlongAxis { axis }` of `x` with indices of shape `indices`, both already
/// broadcast ([`along`] leaves them as they are), checked for `dtype`: the indices'
/// shape.
pub(crate) fn take_along_axis(x: &[usize], indices: &[usize], axis: usize, dtype: DType) -> Result<Vec<usize>> {
    const NAME: &str = "take_along_axis";
    let (xs, is) = along(NAME, x, indices, axis, true)?;
    if xs != x || is != indices {
        return Err(Error::shape(NAME, format!("x {x:?} and indices {indices:?} are not broadcast")));
    }
    checked_size(NAME, indices, dtype)?;
    Ok(indices.to_vec())
}

/// `PutAlongAxis { axis, .. }` of `x` with indices and values of the same shape, the
/// indices' already broadcast to `x`'s except along `axis`: the shape of `x`.
pub(crate) fn put_along_axis(
    name: &'static str,
    x: &[usize],
    indices: &[usize],
    values: &[usize],
    axis: usize,
) -> Result<Vec<usize>> {
    let (_, is) = along(name, x, indices, axis, false)?;
    if is != indices || values != indices {
        return Err(Error::shape(
            name,
            format!("indices {indices:?} and values {values:?} must both have x's shape {x:?} but along axis {axis}"),
        ));
    }
    Ok(x.to_vec())
}

// ---- gradient rules (see `grad.rs`) ----

use super::Primitive;
use super::grad::{Jvp, Vjp, no_rule, record};
use crate::array::Array;
use crate::ops::elementwise::where_;
use crate::ops::scatter::{put_along, take_along_axis as take_along_op};

/// The values a put leaves in place: true at each index position whose value is the
/// one stored at its target, false where a later position (in row-major order) wrote
/// the same element. Each position's number is put along the axis and read back.
fn winners(x: &Array, indices: &Array, axis: usize) -> Result<Array> {
    let n = indices.size() as i64;
    let spec: Vec<isize> = indices.shape().iter().map(|&d| d as isize).collect();
    let pos = Array::arange(0i64, n, 1i64, DType::I64)?.reshape(&spec)?;
    let none = Array::full(x.shape(), -1i64, DType::I64)?;
    let stored = put_along(&none, indices, &pos, axis as isize, false)?;
    take_along_op(&stored, indices, axis as isize)?.eq(&pos)
}

/// Reverse mode. `ScatterAdd`: `x` gets the cotangent, the updates its gather at the
/// indices. `TakeAlongAxis`: the cotangent summed back to where each element came from.
/// `PutAlongAxis`: summing passes the cotangent to both sides as `ScatterAdd` does;
/// assigning gives `x` zeros where values were written and each value the cotangent of
/// its target only where it is the value kept there. Indices have none.
pub(crate) fn vjp(p: &Primitive, g: &Vjp<'_>) -> Result<Vec<Option<Array>>> {
    let (x, idx, ct) = (&g.inputs[0], &g.inputs[1], g.cotangent);
    Ok(match p {
        Primitive::ScatterAdd { axis } => vec![Some(ct.clone()), None, Some(ct.take(idx, *axis as isize)?)],
        Primitive::TakeAlongAxis { axis } => {
            let zeros = Array::zeros(x.shape(), ct.dtype())?;
            vec![Some(put_along(&zeros, idx, ct, *axis as isize, true)?), None]
        }
        Primitive::PutAlongAxis { axis, accumulate: true } => {
            vec![Some(ct.clone()), None, Some(take_along_op(ct, idx, *axis as isize)?)]
        }
        Primitive::PutAlongAxis { axis, accumulate: false } => {
            let ax = *axis as isize;
            let cx = put_along(ct, idx, &Array::zeros(&[], ct.dtype())?, ax, false)?;
            let cv = where_(&winners(x, idx, *axis)?, &take_along_op(ct, idx, ax)?, 0.0)?;
            vec![Some(cx), None, Some(cv)]
        }
        other => return Err(no_rule(other.name(), "vjp")),
    })
}

/// Forward mode: each is linear in `x` and the updates or values together, so the
/// tangent is the same primitive of the tangents (zeros for an input without one).
pub(crate) fn jvp(p: &Primitive, g: &Jvp<'_>) -> Result<Option<Array>> {
    let (x, idx, y, ts) = (&g.inputs[0], &g.inputs[1], g.output, g.tangents);
    let zeros = |a: &Array| Array::zeros(a.shape(), y.dtype());
    match p {
        Primitive::TakeAlongAxis { .. } => match &ts[0] {
            Some(t) => Ok(Some(record(p.clone(), vec![t.clone(), idx.clone()], y.shape(), y.dtype())?)),
            None => Ok(None),
        },
        Primitive::ScatterAdd { .. } | Primitive::PutAlongAxis { .. } => {
            let assigns = matches!(p, Primitive::PutAlongAxis { accumulate: false, .. });
            match (&ts[0], &ts[2]) {
                (None, None) => Ok(None),
                // Adding zeros changes nothing; assigning them does.
                (Some(tx), None) if !assigns => Ok(Some(tx.clone())),
                (tx, tv) => {
                    let tx = match tx {
                        Some(t) => t.clone(),
                        None => zeros(x)?,
                    };
                    let tv = match tv {
                        Some(t) => t.clone(),
                        None => zeros(&g.inputs[2])?,
                    };
                    Ok(Some(record(p.clone(), vec![tx, idx.clone(), tv], y.shape(), y.dtype())?))
                }
            }
        }
        other => Err(no_rule(other.name(), "jvp")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn along_broadcasts_every_axis_but_the_one_indexed() {
        assert_eq!(along("t", &[2, 5, 3], &[2, 4, 3], 1, true).unwrap(), (vec![2, 5, 3], vec![2, 4, 3]));
        assert_eq!(along("t", &[1, 5, 3], &[2, 4, 1], 1, true).unwrap(), (vec![2, 5, 3], vec![2, 4, 3]));
        assert!(along("t", &[1, 5, 3], &[2, 4, 1], 1, false).is_err(), "a put cannot stretch x");
        assert!(along("t", &[2, 5, 3], &[3, 4, 3], 1, true).is_err());
        assert!(along("t", &[2, 5, 3], &[4, 3], 1, true).is_err());
        assert!(matches!(along("t", &[2, 5], &[2, 5], 2, true), Err(Error::Axis { .. })));
        assert_eq!(gathered("s", &[4, 5, 6], &[2, 3], 1).unwrap(), vec![4, 2, 3, 6]);
        assert!(scatter_add(&[4, 5], &[3], &[4, 2], 1).is_err());
        assert_eq!(scatter_add(&[4, 5], &[3], &[4, 3], 1).unwrap(), vec![4, 5]);
        assert!(put_along_axis("p", &[4, 5], &[4, 2], &[4, 1], 1).is_err());
        assert!(take_along_axis(&[1, 5], &[3, 2], 1, DType::F32).is_err(), "not broadcast yet");
    }
}
