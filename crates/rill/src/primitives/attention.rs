//! Shape rule of `Attention` (scaled dot-product attention, `ops/attention.rs`).
//!
//! `q [..., Hq, Tq, D]`, `k [..., Hkv, Tk, D]`, `v [..., Hkv, Tk, Dv]` with equal leading
//! (batch) axes and `Hq` a multiple of `Hkv` (grouped-query attention: query head `h`
//! reads key/value head `h / (Hq / Hkv)`), and an optional mask broadcastable to the
//! scores `[..., Hq, Tq, Tk]`. The output is `[..., Hq, Tq, Dv]`. Used by the op when it
//! records the node and by `compile/shapes.rs` when a shapeless replay re-derives it.

use crate::error::{Error, Result};

/// Most batch axes (before `H, T, D`) the kernels address.
pub(crate) const MAX_BATCH_DIMS: usize = 8;

/// How the scores of an `Attention` node are masked (the array of `Array` is the node's
/// fourth input).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum AttentionMaskKind {
    /// Every query attends every key.
    None,
    /// Query `i` attends keys `j <= i + Tk - Tq` (aligned at the bottom right).
    Causal,
    /// A bool (true: attend) or additive float mask, broadcast to `[..., Hq, Tq, Tk]`.
    Array,
}

/// The output shape of attention over `q`, `k`, `v` (and `mask`, when given); `name` is
/// the op's name in errors.
pub(crate) fn attention(
    name: &'static str,
    q: &[usize],
    k: &[usize],
    v: &[usize],
    mask: Option<&[usize]>,
) -> Result<Vec<usize>> {
    let r = q.len();
    if r < 3 || k.len() != r || v.len() != r {
        return Err(Error::shape(
            name,
            format!("q, k and v need the same rank of at least 3 ([..., H, T, D]), got q {q:?}, k {k:?}, v {v:?}"),
        ));
    }
    let nb = r - 3;
    if nb > MAX_BATCH_DIMS {
        return Err(Error::shape(name, format!("at most {MAX_BATCH_DIMS} batch axes, got q {q:?}")));
    }
    if q[..nb] != k[..nb] || q[..nb] != v[..nb] {
        return Err(Error::shape(name, format!("batch axes differ: q {q:?}, k {k:?}, v {v:?}")));
    }
    let (hq, tq, d) = (q[nb], q[nb + 1], q[nb + 2]);
    let (hkv, tk) = (k[nb], k[nb + 1]);
    if k[nb + 2] != d {
        return Err(Error::shape(name, format!("q's head dimension {d} differs from k's: q {q:?}, k {k:?}")));
    }
    if v[nb] != hkv || v[nb + 1] != tk {
        return Err(Error::shape(
            name,
            format!("k and v need the same heads and length ([..., Hkv, Tk, _]), got k {k:?}, v {v:?}"),
        ));
    }
    if (hkv == 0 && hq != 0) || (hkv != 0 && hq % hkv != 0) {
        return Err(Error::shape(
            name,
            format!("query heads {hq} are not a multiple of key/value heads {hkv}: q {q:?}, k {k:?}"),
        ));
    }
    let scores: Vec<usize> = q[..nb].iter().copied().chain([hq, tq, tk]).collect();
    if let Some(m) = mask {
        let fits = m.len() <= r && m.iter().rev().zip(scores.iter().rev()).all(|(&a, &b)| a == b || a == 1);
        if !fits {
            return Err(Error::shape(
                name,
                format!("mask of shape {m:?} does not broadcast to the scores' shape {scores:?} ([..., Hq, Tq, Tk])"),
            ));
        }
    }
    Ok(q[..nb].iter().copied().chain([hq, tq, v[nb + 2]]).collect())
}

// ---- gradient rules (see `grad.rs`) ----

use super::Primitive;
use super::grad::{Jvp, Vjp, no_rule};
use crate::array::Array;
use crate::ops::elementwise::where_;

/// Attention through its math, `softmax(q kᵀ · scale + mask) v` with ops (the `[Tq, Tk]`
/// scores stored), giving the kernels' answers: grouped heads, the bottom-right causal
/// mask, and 0 for a row that attends nothing. The transforms differentiate this, so it is
/// written with the ops whose rules are cheap: one `softmax` (its rule is two passes over
/// the scores), and the rows that attend nothing found from the mask alone where it can
/// (causal, bool) and set to 0 before the softmax (no NaN reaches a gradient) and after.
fn math(ins: &[Array], scale: Option<f64>, kind: AttentionMaskKind, out_dtype: crate::DType) -> Result<Array> {
    let (q, k, v) = (&ins[0], &ins[1], &ins[2]);
    let r = q.ndim();
    let (hq, tq, d) = (q.shape()[r - 3], q.shape()[r - 2], q.shape()[r - 1]);
    let (hkv, tk) = (k.shape()[r - 3], k.shape()[r - 2]);
    let mut out_shape = q.shape().to_vec();
    out_shape[r - 1] = v.shape()[r - 1];
    if tk == 0 || hq == 0 {
        return Array::zeros(&out_shape, out_dtype);
    }
    // Query head h reads key/value head h / (hq / hkv): repeat each kv head that often.
    let repeat = |a: &Array| -> Result<Array> {
        let group = hq / hkv;
        if group == 1 {
            return Ok(a.clone());
        }
        let mut wide = a.shape().to_vec();
        wide.insert(r - 2, group);
        let mut merged = a.shape().to_vec();
        merged[r - 3] = hq;
        let spec: Vec<isize> = merged.iter().map(|&x| x as isize).collect();
        a.expand_dims((r - 2) as isize)?.broadcast_to(&wide)?.reshape(&spec)
    };
    let (k, v) = (repeat(k)?, repeat(v)?);
    let scale = scale.unwrap_or(if d == 0 { 1.0 } else { 1.0 / (d as f64).sqrt() });
    let mut s = q.matmul(&k.swapaxes(-1, -2)?)?.mul(scale)?;
    // A bool that is true on the rows (`[.., Tq, 1]`) whose every score is masked.
    let mut empty: Option<Array> = None;
    match kind {
        AttentionMaskKind::None => {}
        AttentionMaskKind::Causal => {
            let i = Array::arange(0i64, tq as i64, 1i64, crate::DType::I64)?.reshape(&[tq as isize, 1])?;
            let j = Array::arange(0i64, tk as i64, 1i64, crate::DType::I64)?.reshape(&[1, tk as isize])?;
            let last = i.add(tk as i64 - tq as i64)?;
            s = where_(&j.le(&last)?, &s, f64::NEG_INFINITY)?;
            if tq > tk {
                empty = Some(last.lt(0i64)?);
            }
        }
        AttentionMaskKind::Array => {
            let m = &ins[3];
            if m.dtype() == crate::DType::Bool {
                s = where_(m, &s, f64::NEG_INFINITY)?;
                empty = Some(m.astype(crate::DType::F32)?.max(&[-1], true)?.eq(0.0)?);
            } else {
                s = s.add(m)?;
                let top = crate::autodiff::stop_gradient(&s.max(&[-1], true)?)?;
                empty = Some(top.eq(f64::NEG_INFINITY)?);
            }
        }
    }
    let p = match &empty {
        Some(e) => where_(e, 0.0, &where_(e, 0.0, &s)?.softmax(-1)?)?,
        None => s.softmax(-1)?,
    };
    let p = if p.dtype() == v.dtype() { p } else { p.astype(v.dtype())? };
    let o = p.matmul(&v)?;
    if o.dtype() == out_dtype { Ok(o) } else { o.astype(out_dtype) }
}

/// `Attention`: differentiated through [`math`] (recomputing the scores), for q, k, v and
/// a float mask (a bool mask has none).
pub(crate) fn vjp(p: &Primitive, g: &Vjp<'_>) -> Result<Vec<Option<Array>>> {
    match p {
        Primitive::Attention { scale, mask } => {
            let (scale, mask, dt) = (*scale, *mask, g.output.dtype());
            crate::autodiff::vjp_of(&move |ins: &[Array]| Ok(vec![math(ins, scale, mask, dt)?]), g.inputs, g.cotangent)
        }
        other => Err(no_rule(other.name(), "vjp")),
    }
}

/// `Attention`: the forward rule through [`math`].
pub(crate) fn jvp(p: &Primitive, g: &Jvp<'_>) -> Result<Option<Array>> {
    match p {
        Primitive::Attention { scale, mask } => {
            let (scale, mask, dt) = (*scale, *mask, g.output.dtype());
            crate::autodiff::jvp_of(&move |ins: &[Array]| Ok(vec![math(ins, scale, mask, dt)?]), g.inputs, g.tangents)
        }
        other => Err(no_rule(other.name(), "jvp")),
    }
}
