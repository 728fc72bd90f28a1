//! The ops of autoregressive decoding: [`rope`] (rotary position embedding) and
//! [`slice_update`] (writing new keys and values into a preallocated cache).
//!
//! Positions and start indices are integer *arrays*, not Rust numbers: a compiled decode
//! step (`crate::compile`) takes them as inputs, so the same trace replays for every
//! position instead of tracing a graph per position.

use crate::array::Array;
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::ops::{on_device, prepare, target_stream};
use crate::primitives::{Primitive, RopeLayout, decode as rule};
use crate::shape::checked_size;

/// The parameters of [`rope`].
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RopeOptions {
    /// Features rotated: the first `dims` of the last axis (even); the rest pass through.
    pub dims: usize,
    /// The frequency base: pair `i` of position `p` turns by `p * scale * base^(-2i/dims)`.
    pub base: f64,
    /// Multiplies each position first (linear position scaling; 1 for none).
    pub scale: f64,
    /// Which features form a pair.
    pub layout: RopeLayout,
}

impl RopeOptions {
    /// Rotates all `dims` features with `base`, unscaled, pairs interleaved (the layout of
    /// llama weights in GGUF files).
    pub fn new(dims: usize, base: f64) -> RopeOptions {
        RopeOptions { dims, base, scale: 1.0, layout: RopeLayout::Interleaved }
    }
    /// The same with another pair layout.
    pub fn with_layout(self, layout: RopeLayout) -> RopeOptions {
        RopeOptions { layout, ..self }
    }
}

/// Rotary position embedding of `x [..., T, D]`: row `t` of the second-to-last axis is at
/// position `p = offset + t`, and each pair `(a, b)` of its first `dims` features (pairs
/// laid out as `layout` says) becomes `(a cos θ - b sin θ, a sin θ + b cos θ)` with
/// `θ = p * scale * base^(-2i/dims)` for pair `i`. Features past `dims` are copied.
///
/// `offset` is an integer array (i32, i64, u32 or u8): 0-d for one offset, or
/// `[x.shape[0]]` for one per leading row (a batch of sequences at different positions;
/// `x` then has rank >= 3). The angle and its sine and cosine are computed in f64 and the
/// rotation in the compute dtype (f32 for f16 and bf16); the output has `x`'s float dtype.
///
/// Errors: a non-float `x`, rank below 2, `dims` odd, zero or past `D`, an offset that is
/// not an integer array of one of those shapes, a non-finite `base` or `scale`.
pub fn rope(x: &Array, offset: &Array, options: RopeOptions) -> Result<Array> {
    const NAME: &str = "rope";
    if !x.dtype().is_float() {
        return Err(Error::dtype(NAME, x.dtype(), "x must be a float array"));
    }
    check_index(NAME, "offset", offset)?;
    let RopeOptions { dims, base, scale, layout } = options;
    if !(base.is_finite() && base > 0.0 && scale.is_finite()) {
        return Err(Error::invalid(NAME, format!("base {base} must be finite and positive, scale {scale} finite")));
    }
    let shape = rule::rope(NAME, x.shape(), offset.shape(), dims)?;
    let dtype = x.dtype();
    checked_size(NAME, &shape, dtype)?;
    let stream = target_stream(&[x, offset])?;
    let inputs = vec![prepare(x, dtype, &stream), on_device(offset, &stream)];
    Ok(Array::from_op(Primitive::Rope { dims, base, scale, layout }, inputs, shape, dtype, stream))
}

/// `x` with `update` written into it along `axis` from index `start`: the output equals
/// `x` except `out[.., start + j, ..] = update[.., j, ..]` along `axis`. `update` has
/// `x`'s shape except along `axis` (at most as long) and is converted to `x`'s dtype.
///
/// `start` is an integer array (i32, i64, u32 or u8): 0-d, or `[x.shape[0]]` for one start
/// per leading row (each sequence of a batch writes at its own position; `axis >= 1`).
/// As in JAX's `dynamic_update_slice`, a start is clamped to `[0, len - update_len]` so
/// the update always fits: the kernels read it on the device, where an error cannot be
/// raised. Callers that need a bounds error check the start on the host first (the llama
/// [`Generator`](crate::models::llama::Generator) does).
///
/// **Buffers.** Arrays are immutable values: whoever holds `x` (or a view of it) keeps
/// seeing the old values, and the output is then a new buffer, a full copy of `x` with
/// the update written in. When nothing else holds `x` by the time the op runs (`x` was
/// evaluated earlier, and its last handle went into this op, as a decoder's cache does
/// from one step to the next), `x` is *donated*: only the update is written, into `x`'s
/// own buffer, which becomes the output's (`rill::runtime::stats().buffers_donated`
/// counts it). Nothing observable changes but the memory traffic.
///
/// Errors: shapes that do not fit, an axis out of range, a start that is not an integer
/// array of one of those shapes.
pub fn slice_update(x: &Array, update: &Array, start: &Array, axis: isize) -> Result<Array> {
    const NAME: &str = "slice_update";
    check_index(NAME, "start", start)?;
    let (ax, shape) = rule::slice_update(NAME, x.shape(), update.shape(), start.shape(), axis)?;
    let dtype = x.dtype();
    checked_size(NAME, &shape, dtype)?;
    let stream = target_stream(&[x, update, start])?;
    let inputs = vec![on_device(x, &stream), prepare(update, dtype, &stream), on_device(start, &stream)];
    Ok(Array::from_op(Primitive::SliceUpdate { axis: ax }, inputs, shape, dtype, stream))
}

fn check_index(op: &'static str, what: &str, a: &Array) -> Result<()> {
    match a.dtype() {
        DType::I32 | DType::I64 | DType::U32 | DType::U8 => Ok(()),
        DType::Bool | DType::F16 | DType::BF16 | DType::F32 | DType::F64 => {
            Err(Error::dtype(op, a.dtype(), format!("the {what} must be an integer array (i32, i64, u32 or u8)")))
        }
    }
}

impl Array {
    /// [`rope`] of `self`.
    pub fn rope(&self, offset: &Array, options: RopeOptions) -> Result<Array> {
        rope(self, offset, options)
    }
    /// [`slice_update`] of `self`.
    pub fn slice_update(&self, update: &Array, start: &Array, axis: isize) -> Result<Array> {
        slice_update(self, update, start, axis)
    }
}
