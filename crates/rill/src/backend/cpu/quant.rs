//! Block-quantized kernels on the CPU: `x @ wᵀ` read from the packed blocks, and
//! dequantization. The weight is never dequantized as a whole: work is split over
//! pieces of weight rows (through `par.rs`, on the runtime's pool), and
//!
//! - for a few rows of `x` (decode, `M < PANEL_M`) each block is folded into the dot
//!   product where it is read (`d · Σ q·x` plus the block's offset times `Σ x`, the sums
//!   of `x` per block computed once), so a row of the weight is read once per `x` row
//!   from cache and memory traffic is the packed bytes;
//! - for more rows (prefill) a piece's [`NP`] rows are dequantized once into a small
//!   f32 panel, multiplied with all of `x` by `gemm` (single-threaded inside a piece;
//!   the pieces run on the pool).
//!
//! Everything accumulates in f32; f16 and bf16 are converted on the way in and out.

use half::{bf16, f16};

use crate::backend::cpu::{CpuBuffer, par, strided};
use crate::backend::{Buffer, Storage};
use crate::dtype::{DType, Element};
use crate::error::{Error, Result};
use crate::quant::{BLOCK, QuantFormat, dequantize_block, scale};

/// Weight rows per parallel piece.
const NB: usize = 16;
/// From this many rows of `x` on, a piece dequantizes its rows into a panel first.
const PANEL_M: usize = 4;
/// Weight rows per parallel piece of a panel product (larger pieces amortise `gemm`'s
/// packing of `x` over more rows).
const NP: usize = 64;

/// The float element types of the quantized kernels.
trait QFloat: Element {
    fn up(self) -> f32;
    fn down(v: f32) -> Self;
}
impl QFloat for f32 {
    fn up(self) -> f32 {
        self
    }
    fn down(v: f32) -> Self {
        v
    }
}
impl QFloat for f16 {
    fn up(self) -> f32 {
        self.to_f32()
    }
    fn down(v: f32) -> Self {
        f16::from_f32(v)
    }
}
impl QFloat for bf16 {
    fn up(self) -> f32 {
        self.to_f32()
    }
    fn down(v: f32) -> Self {
        bf16::from_f32(v)
    }
}

fn unsupported(op: &'static str, d: DType) -> Error {
    Error::Unsupported { op, backend: "cpu", msg: format!("dtype {d} (f32, bf16 and f16 only)") }
}

/// `x [.., K] @ wᵀ` for the packed weight `w` (u8 `[N, K / 32 * block_bytes]`).
pub(crate) fn qmatmul(x: &Storage, w: &Storage, format: QuantFormat, shape: &[usize], dtype: DType) -> Result<Storage> {
    match dtype {
        DType::F32 => qmatmul_t::<f32>(x, w, format, shape, dtype),
        DType::F16 => qmatmul_t::<f16>(x, w, format, shape, dtype),
        DType::BF16 => qmatmul_t::<bf16>(x, w, format, shape, dtype),
        d => Err(unsupported("qmatmul", d)),
    }
}

/// Packed u8 blocks `[.., B * block_bytes]` as `[.., B * 32]` floats of `dtype`.
pub(crate) fn dequantize(b: &Storage, format: QuantFormat, shape: &[usize], dtype: DType) -> Result<Storage> {
    match dtype {
        DType::F32 => dequantize_t::<f32>(b, format, shape, dtype),
        DType::F16 => dequantize_t::<f16>(b, format, shape, dtype),
        DType::BF16 => dequantize_t::<bf16>(b, format, shape, dtype),
        d => Err(unsupported("dequantize", d)),
    }
}

fn dequantize_t<T: QFloat>(b: &Storage, format: QuantFormat, shape: &[usize], dtype: DType) -> Result<Storage> {
    let n: usize = shape.iter().product();
    let mut buf = CpuBuffer::alloc(dtype, n)?;
    let bytes = strided::contiguous::<u8>(b);
    let bb = format.block_bytes();
    // Pieces of whole blocks; each block through a stack buffer.
    let per = (crate::backend::cpu::PAR_CHUNK / BLOCK).max(1) * BLOCK;
    par::chunks(buf.typed_mut::<T>(), per, |i, o| {
        let first = i * per / BLOCK;
        let mut v = [0f32; BLOCK];
        for (k, ob) in o.chunks_exact_mut(BLOCK).enumerate() {
            let at = (first + k) * bb;
            dequantize_block(format, &bytes[at..at + bb], &mut v);
            for (d, s) in ob.iter_mut().zip(v) {
                *d = T::down(s);
            }
        }
    });
    Ok(Storage::contiguous(Buffer::Cpu(buf), dtype, shape))
}

/// The dot product of one packed weight row with `x` (one row of K values); `xs` holds
/// the sum of `x` over each block. On x86-64 with AVX2 and FMA (detected at run time)
/// the same loop is compiled for those instructions; the portable build targets the
/// baseline instruction set.
#[inline]
fn row_dot(format: QuantFormat, row: &[u8], x: &[f32], xs: &[f32]) -> f32 {
    #[cfg(target_arch = "x86_64")]
    if simd::avx2_fma() {
        // SAFETY: the CPU has AVX2 and FMA (checked just above).
        return unsafe { simd::row_dot_avx2(format, row, x, xs) };
    }
    row_dot_body::<false>(format, row, x, xs)
}

#[cfg(target_arch = "x86_64")]
mod simd {
    use super::*;

    /// Whether the CPU has AVX2 and FMA (the standard library caches the detection).
    pub(super) fn avx2_fma() -> bool {
        is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma")
    }

    /// [`row_dot_body`] compiled for AVX2 and FMA (fused multiply-adds).
    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn row_dot_avx2(format: QuantFormat, row: &[u8], x: &[f32], xs: &[f32]) -> f32 {
        row_dot_body::<true>(format, row, x, xs)
    }
}

/// `a * b + c`, fused (one rounding) when `FMA`: only where the CPU has the instruction,
/// as the portable fallback of `mul_add` is a slow library call.
#[inline(always)]
fn madd<const FMA: bool>(a: f32, b: f32, c: f32) -> f32 {
    if FMA { a.mul_add(b, c) } else { a * b + c }
}

/// [`row_dot`]'s loop: sixteen lanes of `d · (q x)` accumulate over the blocks (one
/// horizontal sum per row, not per block); each block's offset term (`m Σ x` for Q4_1,
/// `-8 d Σ x` for Q4_0) adds up separately.
#[inline(always)]
fn row_dot_body<const FMA: bool>(format: QuantFormat, row: &[u8], x: &[f32], xs: &[f32]) -> f32 {
    const H: usize = BLOCK / 2;
    let bb = format.block_bytes();
    let mut acc = [0f32; H];
    let mut off = 0f32;
    let blocks = row.chunks_exact(bb).zip(x.chunks_exact(BLOCK)).zip(xs);
    match format {
        QuantFormat::Q4_0 | QuantFormat::Q4_1 => {
            let q41 = format == QuantFormat::Q4_1;
            let at = if q41 { 4 } else { 2 };
            for ((b, xb), &sx) in blocks {
                let d = scale(b, 0);
                let (Ok(qs), Ok(xl), Ok(xh)) = (
                    <&[u8; H]>::try_from(&b[at..at + H]),
                    <&[f32; H]>::try_from(&xb[..H]),
                    <&[f32; H]>::try_from(&xb[H..]),
                ) else {
                    continue; // not reached: every block has H code bytes and BLOCK values
                };
                for j in 0..H {
                    let q = qs[j];
                    let s = madd::<FMA>((q & 0x0f) as f32, xl[j], (q >> 4) as f32 * xh[j]);
                    acc[j] = madd::<FMA>(d, s, acc[j]);
                }
                off += if q41 { scale(b, 2) * sx } else { -8.0 * d * sx };
            }
        }
        QuantFormat::Q8_0 => {
            for ((b, xb), _) in blocks {
                let d = scale(b, 0);
                let (Ok(ql), Ok(qh), Ok(xl), Ok(xh)) = (
                    <&[u8; H]>::try_from(&b[2..2 + H]),
                    <&[u8; H]>::try_from(&b[2 + H..2 + BLOCK]),
                    <&[f32; H]>::try_from(&xb[..H]),
                    <&[f32; H]>::try_from(&xb[H..]),
                ) else {
                    continue; // not reached: every block has BLOCK code bytes and values
                };
                for j in 0..H {
                    let s = madd::<FMA>(ql[j] as i8 as f32, xl[j], qh[j] as i8 as f32 * xh[j]);
                    acc[j] = madd::<FMA>(d, s, acc[j]);
                }
            }
        }
    }
    acc.iter().sum::<f32>() + off
}

fn qmatmul_t<T: QFloat>(
    x: &Storage,
    w: &Storage,
    format: QuantFormat,
    shape: &[usize],
    dtype: DType,
) -> Result<Storage> {
    let k = *x.layout.shape.last().unwrap_or(&0);
    let n = *shape.last().unwrap_or(&0);
    let total: usize = shape.iter().product();
    let mut buf = CpuBuffer::alloc(dtype, total)?;
    if total == 0 {
        return Ok(Storage::contiguous(Buffer::Cpu(buf), dtype, shape));
    }
    let m = total / n;
    let xf: Vec<f32> = strided::contiguous::<T>(x).iter().map(|v| v.up()).collect();
    let bytes = strided::contiguous::<u8>(w);
    let row_bytes = k / BLOCK * format.block_bytes();
    let nbk = k / BLOCK;
    // The result transposed, [N, M]: pieces of weight rows are contiguous.
    let mut t = vec![0f32; if m == 1 { 0 } else { n * m }];
    let mut direct = vec![0f32; if m == 1 { n } else { 0 }];
    let target: &mut [f32] = if m == 1 { &mut direct } else { &mut t };
    if m < PANEL_M {
        let xs: Vec<f32> = xf.chunks_exact(BLOCK).map(|b| b.iter().sum()).collect();
        par::chunks(target, NB * m, |ci, o| {
            for (r, orow) in o.chunks_exact_mut(m).enumerate() {
                let wr = ci * NB + r;
                let row = &bytes[wr * row_bytes..(wr + 1) * row_bytes];
                for (i, ov) in orow.iter_mut().enumerate() {
                    *ov = row_dot(format, row, &xf[i * k..(i + 1) * k], &xs[i * nbk..(i + 1) * nbk]);
                }
            }
        });
    } else {
        let bb = format.block_bytes();
        // A piece's weight rows dequantized once into a panel, then one product of the
        // panel with every row of `x` through `gemm` (register-blocked, SIMD): the
        // transposed output piece is `panel [rows, K] · xᵀ [K, M]`.
        par::chunks_init(
            target,
            NP * m,
            || vec![0f32; NP * k],
            |panel, ci, o| {
                let rows = o.len() / m;
                for r in 0..rows {
                    let wr = ci * NP + r;
                    let row = &bytes[wr * row_bytes..(wr + 1) * row_bytes];
                    for (b, pv) in row.chunks_exact(bb).zip(panel[r * k..(r + 1) * k].chunks_exact_mut(BLOCK)) {
                        dequantize_block(format, b, pv);
                    }
                }
                // SAFETY: `o` is the rows x m piece (row stride m); `panel` holds rows x k
                // values (row stride k); `xf` holds m rows of k, read as the k x m matrix
                // `xᵀ` (element (kk, i) at i * k + kk). All extents are inside the slices.
                unsafe {
                    gemm::gemm(
                        rows,
                        m,
                        k,
                        o.as_mut_ptr(),
                        1,
                        m as isize,
                        false,
                        panel.as_ptr(),
                        1,
                        k as isize,
                        xf.as_ptr(),
                        k as isize,
                        1,
                        0f32,
                        1f32,
                        false,
                        false,
                        false,
                        gemm::Parallelism::None,
                    );
                }
            },
        );
    }
    let out = buf.typed_mut::<T>();
    if m == 1 {
        for (o, v) in out.iter_mut().zip(&direct) {
            *o = T::down(*v);
        }
    } else {
        for (j, col) in t.chunks_exact(m).enumerate() {
            for (i, v) in col.iter().enumerate() {
                out[i * n + j] = T::down(*v);
            }
        }
    }
    Ok(Storage::contiguous(Buffer::Cpu(buf), dtype, shape))
}
