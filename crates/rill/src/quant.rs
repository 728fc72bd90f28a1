//! Block-quantized weights: the Q4_0, Q4_1 and Q8_0 formats of GGUF files.
//!
//! Each format cuts a row into blocks of [`BLOCK`] values and stores per block one or two
//! f16 scale words and the quantized values:
//!
//! | format | bytes per block | layout | value `j` |
//! |---|---|---|---|
//! | Q4_0 | 18 | `d: f16`, 16 bytes of 4-bit codes | `(q_j - 8) * d` |
//! | Q4_1 | 20 | `d: f16`, `m: f16`, 16 bytes of 4-bit codes | `q_j * d + m` |
//! | Q8_0 | 34 | `d: f16`, 32 signed bytes | `q_j * d` |
//!
//! In the 4-bit formats byte `j` of the codes holds value `j` in its low nibble and value
//! `j + 16` in its high nibble. [`quantize`] follows the reference rounding of those
//! formats (scale from the block's extreme value, codes rounded and clamped), so that a
//! rill-quantized tensor has the bytes other GGUF tools write for the same values.
//!
//! On arrays: [`QMatrix`] keeps a weight matrix packed on a device, [`qmatmul`] multiplies
//! by it reading the blocks in place, [`dequantize_packed`] turns packed rows into floats
//! (docs/DTYPES.md, "Quantized weights").

use half::f16;

use crate::error::{Error, Result};

pub use crate::ops::quant::{QMatrix, dequantize_packed, qmatmul};

/// Values per block, in every format here.
pub const BLOCK: usize = 32;

/// A block-quantized storage format.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[allow(non_camel_case_types)]
pub enum QuantFormat {
    /// 4-bit codes with one scale, centred on 8.
    Q4_0,
    /// 4-bit codes with a scale and a minimum.
    Q4_1,
    /// 8-bit signed codes with one scale.
    Q8_0,
}

impl QuantFormat {
    /// Every format, in declaration order.
    pub const ALL: [QuantFormat; 3] = [QuantFormat::Q4_0, QuantFormat::Q4_1, QuantFormat::Q8_0];

    /// The format's name as GGUF tools write it.
    pub fn name(self) -> &'static str {
        match self {
            QuantFormat::Q4_0 => "Q4_0",
            QuantFormat::Q4_1 => "Q4_1",
            QuantFormat::Q8_0 => "Q8_0",
        }
    }

    /// Bytes of one block of [`BLOCK`] values.
    pub fn block_bytes(self) -> usize {
        match self {
            QuantFormat::Q4_0 => 2 + BLOCK / 2,
            QuantFormat::Q4_1 => 4 + BLOCK / 2,
            QuantFormat::Q8_0 => 2 + BLOCK,
        }
    }

    /// Bytes of `n` values (`n` a multiple of [`BLOCK`]), or an error naming `op`.
    pub fn bytes_for(self, op: &'static str, n: usize) -> Result<usize> {
        if !n.is_multiple_of(BLOCK) {
            return Err(Error::invalid(
                op,
                format!(
                    "{} holds values in blocks of {BLOCK}; {n} values is not a whole number of blocks",
                    self.name()
                ),
            ));
        }
        (n / BLOCK)
            .checked_mul(self.block_bytes())
            .ok_or_else(|| Error::invalid(op, format!("{n} values of {} overflow the address space", self.name())))
    }
}

/// The f16 at byte `at` of a block (its scale, or Q4_1's offset), as f32.
#[inline(always)]
pub(crate) fn scale(b: &[u8], at: usize) -> f32 {
    f16::from_bits(u16::from_le_bytes([b[at], b[at + 1]])).to_f32()
}

/// Dequantizes `bytes` (whole blocks of `format`) into `out`, one value per element:
/// `out.len()` must be the number of values the bytes hold.
pub fn dequantize(format: QuantFormat, bytes: &[u8], out: &mut [f32]) -> Result<()> {
    const OP: &str = "dequantize";
    let need = format.bytes_for(OP, out.len())?;
    if bytes.len() != need {
        return Err(Error::invalid(
            OP,
            format!("{} values of {} take {need} bytes, got {}", out.len(), format.name(), bytes.len()),
        ));
    }
    for (b, o) in bytes.chunks_exact(format.block_bytes()).zip(out.chunks_exact_mut(BLOCK)) {
        dequantize_block(format, b, o);
    }
    Ok(())
}

/// One block (`b` of `format.block_bytes()`, `o` of [`BLOCK`]).
#[inline]
pub(crate) fn dequantize_block(format: QuantFormat, b: &[u8], o: &mut [f32]) {
    match format {
        QuantFormat::Q4_0 => {
            let d = scale(b, 0);
            for j in 0..BLOCK / 2 {
                let q = b[2 + j];
                o[j] = ((q & 0x0f) as i32 - 8) as f32 * d;
                o[j + BLOCK / 2] = ((q >> 4) as i32 - 8) as f32 * d;
            }
        }
        QuantFormat::Q4_1 => {
            let (d, m) = (scale(b, 0), scale(b, 2));
            for j in 0..BLOCK / 2 {
                let q = b[4 + j];
                o[j] = (q & 0x0f) as f32 * d + m;
                o[j + BLOCK / 2] = (q >> 4) as f32 * d + m;
            }
        }
        QuantFormat::Q8_0 => {
            let d = scale(b, 0);
            for j in 0..BLOCK {
                o[j] = b[2 + j] as i8 as f32 * d;
            }
        }
    }
}

/// Quantizes `x` (a whole number of blocks) into `format`'s bytes, with the formats'
/// reference rounding. Non-finite values are an error (no format holds them).
pub fn quantize(format: QuantFormat, x: &[f32]) -> Result<Vec<u8>> {
    const OP: &str = "quantize";
    let n = format.bytes_for(OP, x.len())?;
    if let Some(i) = x.iter().position(|v| !v.is_finite()) {
        return Err(Error::invalid(OP, format!("value {i} is {}: quantized formats hold finite values", x[i])));
    }
    let mut out = vec![0u8; n];
    for (xb, b) in x.chunks_exact(BLOCK).zip(out.chunks_exact_mut(format.block_bytes())) {
        quantize_block(format, xb, b);
    }
    Ok(out)
}

fn put_scale(b: &mut [u8], at: usize, v: f32) {
    b[at..at + 2].copy_from_slice(&f16::from_f32(v).to_bits().to_le_bytes());
}

fn quantize_block(format: QuantFormat, x: &[f32], b: &mut [u8]) {
    // The reciprocal of the unrounded scale, as the reference does; 0 for an all-zero block.
    let inv = |d: f32| if d != 0.0 { 1.0 / d } else { 0.0 };
    match format {
        QuantFormat::Q4_0 => {
            // The value of largest magnitude (the first such) maps to code 0: d = max / -8.
            let mut max = 0.0f32;
            for &v in x {
                if v.abs() > max.abs() {
                    max = v;
                }
            }
            let d = max / -8.0;
            let id = inv(d);
            put_scale(b, 0, d);
            for j in 0..BLOCK / 2 {
                // Truncation of a value >= 0.5 (C's conversion to int8), then the clamp.
                let q0 = ((x[j] * id + 8.5) as i8).min(15) as u8;
                let q1 = ((x[j + BLOCK / 2] * id + 8.5) as i8).min(15) as u8;
                b[2 + j] = q0 | (q1 << 4);
            }
        }
        QuantFormat::Q4_1 => {
            let (mut lo, mut hi) = (f32::INFINITY, f32::NEG_INFINITY);
            for &v in x {
                lo = lo.min(v);
                hi = hi.max(v);
            }
            let d = (hi - lo) / 15.0;
            let id = inv(d);
            put_scale(b, 0, d);
            put_scale(b, 2, lo);
            for j in 0..BLOCK / 2 {
                let q0 = (((x[j] - lo) * id + 0.5) as i8).min(15) as u8;
                let q1 = (((x[j + BLOCK / 2] - lo) * id + 0.5) as i8).min(15) as u8;
                b[4 + j] = q0 | (q1 << 4);
            }
        }
        QuantFormat::Q8_0 => {
            let amax = x.iter().fold(0.0f32, |m, v| m.max(v.abs()));
            let d = amax / 127.0;
            let id = inv(d);
            put_scale(b, 0, d);
            for j in 0..BLOCK {
                // Rounded half away from zero, as C's roundf.
                b[2 + j] = (x[j] * id).round() as i8 as u8;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dequantize_inverts_quantize_within_half_a_step() {
        let mut seed = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            (seed >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0
        };
        for f in QuantFormat::ALL {
            for blocks in [1, 3, 7] {
                let x: Vec<f32> = (0..blocks * BLOCK).map(|_| next() * 3.0).collect();
                let q = quantize(f, &x).unwrap();
                assert_eq!(q.len(), blocks * f.block_bytes());
                let mut y = vec![0.0; x.len()];
                dequantize(f, &q, &mut y).unwrap();
                for (xb, yb) in x.chunks(BLOCK).zip(y.chunks(BLOCK)) {
                    let step = match f {
                        QuantFormat::Q4_0 => xb.iter().fold(0.0f32, |m, v| m.max(v.abs())) / 8.0,
                        QuantFormat::Q4_1 => {
                            (xb.iter().cloned().fold(f32::MIN, f32::max) - xb.iter().cloned().fold(f32::MAX, f32::min))
                                / 15.0
                        }
                        QuantFormat::Q8_0 => xb.iter().fold(0.0f32, |m, v| m.max(v.abs())) / 127.0,
                    };
                    // Half a step, but a whole one for Q4_0's codes on the side opposite its
                    // extreme (code 8 is clamped to 7); plus the f16 rounding of the scale.
                    let steps = if f == QuantFormat::Q4_0 { 1.0 } else { 0.5 };
                    for (a, b) in xb.iter().zip(yb) {
                        assert!(
                            (a - b).abs() <= step * steps + 3.0 * step.max(a.abs()) / 1024.0 + 1e-6,
                            "{f:?} {a} {b}"
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn partial_blocks_and_non_finite_values_are_errors() {
        for f in QuantFormat::ALL {
            assert!(quantize(f, &[0.0; 31]).is_err());
            assert!(quantize(f, &[f32::NAN; 32]).is_err());
            assert!(dequantize(f, &[0; 3], &mut [0.0; 32]).is_err());
            assert!(quantize(f, &[0.0; 32]).unwrap().iter().all(|&b| b == 0 || f == QuantFormat::Q4_0));
        }
    }
}
