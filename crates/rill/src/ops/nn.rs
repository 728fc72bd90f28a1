//! Fused neural-network ops: softmax, log_softmax, layer_norm and rms_norm.
//!
//! Each records one primitive computed by a fused kernel. They work on float dtypes:
//! bool and integer inputs are converted to f32 first; f16 and bf16 compute in f32
//! inside the kernel and round the result. `weight` and `bias` are converted to the
//! input's (float) dtype and must have shape `[last dimension]`.

use crate::array::Array;
use crate::error::Result;
use crate::ops::{prepare, target_stream};
use crate::primitives::{Primitive, nn as rule};
use crate::shape::checked_size;

impl Array {
    /// `exp(x) / sum(exp(x))` along `axis`, computed stably (the row maximum is
    /// subtracted first). A row of all -inf gives NaN, as in NumPy.
    pub fn softmax(&self, axis: isize) -> Result<Array> {
        softmax(self, axis, false, "softmax")
    }
    /// `x - log(sum(exp(x)))` along `axis`, computed stably.
    pub fn log_softmax(&self, axis: isize) -> Result<Array> {
        softmax(self, axis, true, "log_softmax")
    }
    /// Layer normalisation over the last axis: `(x - mean) / sqrt(var + eps)`, then
    /// multiplied by `weight` and shifted by `bias` when given (both of shape
    /// `[last dimension]`). The variance is the biased one (divided by the count).
    pub fn layer_norm(&self, weight: Option<&Array>, bias: Option<&Array>, eps: f64) -> Result<Array> {
        let (stream, dtype, mut inputs) = norm_inputs("layer_norm", self, weight, bias)?;
        let x = prepare(self, dtype, &stream);
        inputs.insert(0, x);
        let prim = Primitive::LayerNorm { eps, has_weight: weight.is_some(), has_bias: bias.is_some() };
        Ok(Array::from_op(prim, inputs, self.shape().to_vec(), dtype, stream))
    }
    /// RMS normalisation over the last axis: `x / sqrt(mean(x^2) + eps)`, then multiplied
    /// by `weight` (shape `[last dimension]`) when given.
    pub fn rms_norm(&self, weight: Option<&Array>, eps: f64) -> Result<Array> {
        let (stream, dtype, mut inputs) = norm_inputs("rms_norm", self, weight, None)?;
        let x = prepare(self, dtype, &stream);
        inputs.insert(0, x);
        let prim = Primitive::RmsNorm { eps, has_weight: weight.is_some() };
        Ok(Array::from_op(prim, inputs, self.shape().to_vec(), dtype, stream))
    }
}

fn softmax(x: &Array, axis: isize, log: bool, name: &'static str) -> Result<Array> {
    let (ax, shape) = rule::softmax(name, x.shape(), axis)?;
    let stream = target_stream(&[x])?;
    let dtype = x.dtype().to_float();
    checked_size(name, &shape, dtype)?;
    let input = prepare(x, dtype, &stream);
    Ok(Array::from_op(Primitive::Softmax { axis: ax, log }, vec![input], shape, dtype, stream))
}

/// Validates a normalisation's input and its per-column arrays (`weight`, `bias`);
/// returns the stream, the compute dtype, and the given per-column arrays prepared for the
/// kernel.
fn norm_inputs(
    name: &'static str,
    x: &Array,
    weight: Option<&Array>,
    bias: Option<&Array>,
) -> Result<(crate::runtime::stream::Stream, crate::dtype::DType, Vec<Array>)> {
    rule::norm(name, x.shape(), weight.map(|w| w.shape()), bias.map(|b| b.shape()))?;
    let stream = target_stream(&[x])?;
    let dtype = x.dtype().to_float();
    checked_size(name, x.shape(), dtype)?;
    let inputs = [weight, bias].into_iter().flatten().map(|c| prepare(c, dtype, &stream)).collect();
    Ok((stream, dtype, inputs))
}
