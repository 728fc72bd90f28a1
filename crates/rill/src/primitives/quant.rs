//! Shape and dtype rules of the block-quantized primitives (`ops/quant.rs`):
//!
//! - `QuantMatmul { format }`: inputs `x [..., K]` (f16, bf16 or f32) and the packed
//!   weight `w`, u8 `[N, K / 32 * block_bytes]` (row `n` holds output feature `n`'s
//!   blocks, as GGUF stores a `[K, N]` tensor); the output is `x @ wᵀ`, `[..., N]` in
//!   `x`'s dtype.
//! - `Dequantize { format }`: input u8 `[..., B * block_bytes]`, output
//!   `[..., B * 32]` of the node's float dtype.
//!
//! The op recording a node and shapeless replay (`compile/shapes.rs`) both call these.

use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::quant::{BLOCK, QuantFormat};

/// The float dtypes a quantized product reads and writes.
pub(crate) fn float_ok(d: DType) -> bool {
    matches!(d, DType::F16 | DType::BF16 | DType::F32)
}

/// The output shape of `x @ wᵀ` for `x` of shape `x` and packed bytes of shape `w`.
pub(crate) fn qmatmul(name: &'static str, format: QuantFormat, x: &[usize], w: &[usize]) -> Result<Vec<usize>> {
    let [n, row] = *w else {
        return Err(Error::shape(name, format!("the packed weight must be 2-D [N, row bytes], got {w:?}")));
    };
    let Some((&k, batch)) = x.split_last() else {
        return Err(Error::shape(name, "x needs at least one axis [..., K], got a 0-d array"));
    };
    if k % BLOCK != 0 {
        return Err(Error::shape(
            name,
            format!(
                "x's last axis K = {k} (shape {x:?}) is not a multiple of the {}-value block of {}",
                BLOCK,
                format.name()
            ),
        ));
    }
    let need = k / BLOCK * format.block_bytes();
    if row != need {
        return Err(Error::shape(
            name,
            format!(
                "x has K = {k} (shape {x:?}) but the {} weight's rows are {row} bytes ({} values); K = {k} needs {need}",
                format.name(),
                row / format.block_bytes() * BLOCK
            ),
        ));
    }
    Ok(batch.iter().copied().chain([n]).collect())
}

/// The output shape of dequantizing packed bytes of shape `b` (blocks along the last axis).
pub(crate) fn dequantize(name: &'static str, format: QuantFormat, b: &[usize]) -> Result<Vec<usize>> {
    let Some((&row, lead)) = b.split_last() else {
        return Err(Error::shape(name, "packed bytes need at least one axis [..., row bytes], got a 0-d array"));
    };
    let bb = format.block_bytes();
    if row % bb != 0 {
        return Err(Error::shape(
            name,
            format!("rows of {row} bytes (shape {b:?}) are not whole {}-byte blocks of {}", bb, format.name()),
        ));
    }
    Ok(lead.iter().copied().chain([row / bb * BLOCK]).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rules_give_shapes_and_refuse_partial_blocks() {
        let f = QuantFormat::Q4_1;
        assert_eq!(qmatmul("q", f, &[2, 3, 64], &[7, 40]).unwrap(), vec![2, 3, 7]);
        assert_eq!(qmatmul("q", f, &[64], &[7, 40]).unwrap(), vec![7]);
        assert!(qmatmul("q", f, &[2, 48], &[7, 40]).is_err());
        assert!(qmatmul("q", f, &[2, 32], &[7, 40]).is_err());
        assert!(qmatmul("q", f, &[], &[7, 40]).is_err());
        assert!(qmatmul("q", f, &[2, 64], &[40]).is_err());
        assert_eq!(dequantize("d", QuantFormat::Q8_0, &[3, 68]).unwrap(), vec![3, 64]);
        assert!(dequantize("d", QuantFormat::Q8_0, &[3, 67]).is_err());
    }
}
