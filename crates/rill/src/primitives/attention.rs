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

// This family has no gradient rules: each slot returns `Unsupported` (see `grad.rs`).
super::grad::no_rules!();
