//! Scaled dot-product attention: `softmax(q kᵀ · scale + mask) v`, one fused primitive.
//!
//! The kernels never store the `[Tq, Tk]` score matrix: they walk the keys in tiles with
//! an online softmax (`backend/cpu/attention.rs`, `backend/cuda/attention.rs`). f16 and
//! bf16 compute in f32 with f32 accumulation; f64 computes in f64.

use crate::array::Array;
use crate::dtype::{DType, promote};
use crate::error::{Error, Result};
use crate::ops::{on_device, prepare, target_stream};
use crate::primitives::{AttentionMaskKind, Primitive, attention as rule};
use crate::shape::checked_size;

/// The mask of [`scaled_dot_product_attention`].
#[derive(Clone, Copy, Debug)]
pub enum AttentionMask<'a> {
    /// Every query attends every key.
    None,
    /// Causal, aligned at the bottom right: query `i` attends keys `j <= i + Tk - Tq`
    /// (as when `Tq` new queries are decoded against a cache of `Tk` keys). With
    /// `Tq > Tk` the first `Tq - Tk` queries attend nothing (their rows are 0).
    Causal,
    /// An array broadcastable to the scores `[..., Hq, Tq, Tk]` (a BERT padding mask is
    /// `[B, 1, 1, Tk]`): bool (true: attend) or float, added to the scaled scores
    /// (`-inf` masks a key out). Its float dtype is kept (it is not rounded to the
    /// inputs' dtype).
    Array(&'a Array),
}

const NAME: &str = "scaled_dot_product_attention";

/// Scaled dot-product attention: `softmax(q kᵀ · scale + mask) v` over the keys, for
/// `q [..., Hq, Tq, D]`, `k [..., Hkv, Tk, D]` and `v [..., Hkv, Tk, Dv]` with equal
/// leading (batch) axes (at most 8), giving `[..., Hq, Tq, Dv]`.
///
/// - Grouped-query attention: `Hq` must be a multiple of `Hkv`; query head `h` uses
///   key/value head `h / (Hq / Hkv)`.
/// - `scale` defaults to `1 / sqrt(D)` (1 when `D` is 0) and must be finite.
/// - A row whose keys are all masked out (a bool mask all false, an additive mask all
///   `-inf`, a causal row before the first key, or `Tk = 0`) gives **0**, never NaN.
/// - q, k and v must be floats (f16, bf16, f32, f64); they are converted to their
///   promoted dtype, which is the output's. f16 and bf16 compute in f32.
///
/// Errors (`rill::Error`): integer or bool inputs, ranks below 3 or different, batch axes
/// that differ, head dimensions of q and k that differ, k and v of different heads or
/// lengths, `Hq % Hkv != 0`, a mask that does not broadcast to the scores or is not bool
/// or float, a non-finite scale.
pub fn scaled_dot_product_attention(
    q: &Array,
    k: &Array,
    v: &Array,
    mask: AttentionMask<'_>,
    scale: Option<f64>,
) -> Result<Array> {
    for (what, a) in [("q", q), ("k", k), ("v", v)] {
        if !a.dtype().is_float() {
            return Err(Error::dtype(NAME, a.dtype(), format!("{what} must be a float array")));
        }
    }
    let (kind, m) = match mask {
        AttentionMask::None => (AttentionMaskKind::None, None),
        AttentionMask::Causal => (AttentionMaskKind::Causal, None),
        AttentionMask::Array(m) => {
            if !(m.dtype().is_float() || m.dtype() == DType::Bool) {
                return Err(Error::dtype(NAME, m.dtype(), "the mask must be bool (true: attend) or float (added)"));
            }
            (AttentionMaskKind::Array, Some(m))
        }
    };
    if let Some(s) = scale
        && !s.is_finite()
    {
        return Err(Error::invalid(NAME, format!("scale must be finite, got {s}")));
    }
    let shape = rule::attention(NAME, q.shape(), k.shape(), v.shape(), m.map(|m| m.shape()))?;
    let dtype = promote(promote(q.dtype(), k.dtype()), v.dtype());
    checked_size(NAME, &shape, dtype)?;
    let stream = target_stream(&[q, k, v])?;
    let mut inputs = vec![prepare(q, dtype, &stream), prepare(k, dtype, &stream), prepare(v, dtype, &stream)];
    inputs.extend(m.map(|m| on_device(m, &stream)));
    Ok(Array::from_op(Primitive::Attention { scale, mask: kind }, inputs, shape, dtype, stream))
}

impl Array {
    /// [`scaled_dot_product_attention`] with `self` as the queries.
    pub fn scaled_dot_product_attention(
        &self,
        k: &Array,
        v: &Array,
        mask: AttentionMask<'_>,
        scale: Option<f64>,
    ) -> Result<Array> {
        scaled_dot_product_attention(self, k, v, mask, scale)
    }
}
