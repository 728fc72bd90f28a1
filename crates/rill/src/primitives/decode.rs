//! Shape rules of the primitives of autoregressive decoding: `Rope` (rotary position
//! embedding) and `SliceUpdate` (writing new keys and values into a preallocated cache).
//!
//! Both take their positions as an integer array input, not a parameter, so a compiled
//! decode step replays for every position without tracing again. Used by
//! `ops/decode.rs` when it records the node and by `compile/shapes.rs` when a shapeless
//! replay re-derives it.

use crate::array::Array;
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::primitives::Primitive;
use crate::primitives::grad::{Jvp, Vjp, no_rule, record};
use crate::shape::normalize_axis;

/// How the rotated pairs of a head's features are laid out.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum RopeLayout {
    /// Pairs `(x[2i], x[2i+1])` (GPT-J, ggml's rope mode 0: llama weights in GGUF files,
    /// whose q/k projections llama.cpp's converter permuted for it).
    Interleaved,
    /// Pairs `(x[i], x[i + dims/2])` (GPT-NeoX, Hugging Face's `rotate_half`).
    Halves,
}

/// `Rope` of `x [..., T, D]` at offsets of shape `[]` or `[x.shape[0]]` (one per leading
/// row, for rank >= 3) rotating the first `dims` features (even, at most `D`): the
/// shape of `x`.
pub(crate) fn rope(name: &'static str, x: &[usize], offset: &[usize], dims: usize) -> Result<Vec<usize>> {
    let r = x.len();
    if r < 2 {
        return Err(Error::shape(name, format!("x must be [..., T, D] (rank >= 2), got {x:?}")));
    }
    let d = x[r - 1];
    if !dims.is_multiple_of(2) || dims > d || dims == 0 {
        return Err(Error::invalid(
            name,
            format!("dims must be even, positive and at most the feature size {d}, got {dims}"),
        ));
    }
    let ok = offset.is_empty() || (r >= 3 && offset == [x[0]]);
    if !ok {
        return Err(Error::shape(
            name,
            format!("the offset must be 0-d or one per leading row ([{}]) of x {x:?}, got shape {offset:?}", x[0]),
        ));
    }
    Ok(x.to_vec())
}

/// `SliceUpdate` of `x` with `update` along `axis` at start offsets of shape `[]` or
/// `[x.shape[0]]` (one per leading row, for `axis >= 1`): the axis resolved, and the
/// shape of `x`. `update` has `x`'s rank and shape except along `axis`, where it is at
/// most as long.
pub(crate) fn slice_update(
    name: &'static str,
    x: &[usize],
    update: &[usize],
    start: &[usize],
    axis: isize,
) -> Result<(usize, Vec<usize>)> {
    let ax = normalize_axis(name, axis, x.len())?;
    let fits = update.len() == x.len()
        && x.iter().zip(update).enumerate().all(|(i, (&a, &b))| if i == ax { b <= a } else { a == b });
    if !fits {
        return Err(Error::shape(
            name,
            format!("update of shape {update:?} does not fit in {x:?} along axis {ax} (same shape elsewhere)"),
        ));
    }
    let ok = start.is_empty() || (ax >= 1 && start == [x[0]]);
    if !ok {
        return Err(Error::shape(
            name,
            format!("the start must be 0-d or, for axis >= 1, one per leading row ([{}]), got shape {start:?}", x[0]),
        ));
    }
    Ok((ax, x.to_vec()))
}

/// Reverse rules. `Rope` is a rotation of each feature pair by an angle proportional to
/// the position's scale, so its transpose is the same rotation with the scale negated
/// (the angles negate exactly). `SliceUpdate`: `x` gets the cotangent with the written
/// window zeroed, `update` the window of the cotangent (read with `take`, at the start
/// the kernel used: clamped so the update fits). Positions and starts get none.
pub(crate) fn vjp(p: &Primitive, g: &Vjp<'_>) -> Result<Vec<Option<Array>>> {
    let ct = g.cotangent;
    match p {
        Primitive::Rope { dims, base, scale, layout } => {
            let back = Primitive::Rope { dims: *dims, base: *base, scale: -*scale, layout: *layout };
            let cx = record(back, vec![ct.clone(), g.inputs[1].clone()], ct.shape(), ct.dtype())?;
            Ok(vec![Some(cx), None])
        }
        Primitive::SliceUpdate { axis } => {
            let (update, start) = (&g.inputs[1], &g.inputs[2]);
            let zeros = Array::zeros(update.shape(), ct.dtype())?;
            let cx = ct.slice_update(&zeros, start, *axis as isize)?;
            let cu = window(ct, update.shape()[*axis], start, *axis)?;
            Ok(vec![Some(cx), Some(cu), None])
        }
        other => Err(no_rule(other.name(), "vjp")),
    }
}

/// Forward rules: both primitives are linear in their float inputs.
pub(crate) fn jvp(p: &Primitive, g: &Jvp<'_>) -> Result<Option<Array>> {
    let y = g.output;
    match p {
        Primitive::Rope { .. } => match &g.tangents[0] {
            Some(t) => record(p.clone(), vec![t.clone(), g.inputs[1].clone()], y.shape(), y.dtype()).map(Some),
            None => Ok(None),
        },
        Primitive::SliceUpdate { axis } => {
            let (tx, tu) = (&g.tangents[0], &g.tangents[1]);
            if tx.is_none() && tu.is_none() {
                return Ok(None);
            }
            let tx = match tx {
                Some(t) => t.clone(),
                None => Array::zeros(y.shape(), y.dtype())?,
            };
            let tu = match tu {
                Some(t) => t.clone(),
                None => Array::zeros(g.inputs[1].shape(), y.dtype())?,
            };
            Ok(Some(tx.slice_update(&tu, &g.inputs[2], *axis as isize)?))
        }
        other => Err(no_rule(other.name(), "jvp")),
    }
}

/// `len` entries of `x` along `axis` from `start` (0-d, or one per leading row), clamped
/// as `SliceUpdate`'s kernels clamp it: the window a slice update of that length wrote.
fn window(x: &Array, len: usize, start: &Array, axis: usize) -> Result<Array> {
    let n = x.shape()[axis];
    let lo = Array::zeros(&[], DType::I64)?;
    let hi = Array::full(&[], (n - len) as f64, DType::I64)?;
    let s = start.astype(DType::I64)?.maximum(&lo)?.minimum(&hi)?;
    // Indices [rows or 1, 1, .., len (at axis), .., 1]: start plus step, one per row.
    let mut at_rows = vec![1isize; x.ndim()];
    at_rows[0] = s.size() as isize;
    let mut at_axis = vec![1isize; x.ndim()];
    at_axis[axis] = len as isize;
    let steps = Array::arange(0, len as i64, 1, DType::I64)?.reshape(&at_axis)?;
    x.take_along_axis(&s.reshape(&at_rows)?.add(&steps)?, axis as isize)
}
