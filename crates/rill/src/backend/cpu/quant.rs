//! Block-quantized kernels on the CPU: `x @ wᵀ` read from the packed blocks, and
//! dequantization. Below [`GEMM_M`] rows of `x` the product runs [`qdot::tile`] (each
//! block decoded once into vector registers and multiplied into up to eight rows of
//! `x`), split over the runtime's pool (`par.rs`):
//!
//! - for a few rows of `x` (decode) over pieces of weight rows, so each packed row is
//!   read once from memory and the weight is never dequantized;
//! - for more over pieces of output rows, each walking the weight in small tiles that
//!   stay in cache.
//!
//! From [`GEMM_M`] rows on (prefill) the weight is dequantized in f32 panels of at most
//! [`PANEL_BYTES`], each multiplied with all of `x` by `gemm` over the pool.
//!
//! A CPU without a vector build of `qdot` (no AVX2 with FMA) runs the portable tile for a
//! few rows and, for more, dequantizes pieces of weight rows into f32 panels multiplied by
//! `gemm`. Everything accumulates in f32; f16 and bf16 are converted on the way in and out.

use half::{bf16, f16};

use crate::backend::cpu::qdot::{self, Level};
use crate::backend::cpu::{CpuBuffer, par, strided};
use crate::backend::{Buffer, Storage};
use crate::dtype::{DType, Element};
use crate::error::{Error, Result};
use crate::quant::{BLOCK, QuantFormat, dequantize_block};

/// Weight rows per parallel piece when `x` has few rows.
const NB: usize = 16;
/// From this many rows of `x` on, the pieces are output rows.
const ROW_SPLIT_M: usize = 32;
/// Output rows per parallel piece when `x` has many rows.
const PM: usize = 32;
/// Weight rows per tile of a piece of output rows (with eight rows of `x`, about 6–16 KiB
/// of packed weight and 18–48 KiB of `x` for widths 576–1536).
const TN: usize = 16;
/// Without a vector `qdot`, from this many rows of `x` on a piece dequantizes its rows
/// into a panel for `gemm`.
const PANEL_M: usize = 4;
/// Weight rows per parallel piece of a panel product (larger pieces amortise `gemm`'s
/// packing of `x` over more rows).
const NP: usize = 64;
/// From this many rows of `x` on (prefill), at every level, the weight is dequantized in
/// panels of up to [`PANEL_BYTES`] of f32 and each panel is multiplied by one `gemm` over
/// the pool: the blocked f32 product runs up to twice the rate of the register tiles of
/// `qdot` there (SmolLM2's shapes on two AVX-512 cores: about even at 128 rows, 1.4x at
/// 160, 2x at 512), and a decoded value serves every row of `x`.
const GEMM_M: usize = 160;
/// [`GEMM_M`] unless `RILL_CPU_QGEMM_ROWS` says otherwise (a measurement aid comparing
/// the two kernels on the rows they share).
fn gemm_rows() -> usize {
    static ROWS: crate::sync::OnceLock<usize> = crate::sync::OnceLock::new();
    *ROWS.get_or_init(|| std::env::var("RILL_CPU_QGEMM_ROWS").ok().and_then(|v| v.parse().ok()).unwrap_or(GEMM_M))
}
/// Most bytes of f32 weights a prefill product dequantizes at once (the whole weight of a
/// 576 x 1536 projection; an output head of 49152 rows takes several panels).
const PANEL_BYTES: usize = 4 << 20;
/// Blocks of K per parallel piece of a panel's dequantization.
const KB: usize = 2;

/// The float element types of the quantized kernels.
trait QFloat: Element {
    fn up(self) -> f32;
    fn down(v: f32) -> Self;
    /// The values themselves when they are f32 (no copy).
    fn as_f32(_v: &[Self]) -> Option<&[f32]> {
        None
    }
    fn as_f32_mut(_v: &mut [Self]) -> Option<&mut [f32]> {
        None
    }
}
impl QFloat for f32 {
    fn up(self) -> f32 {
        self
    }
    fn down(v: f32) -> Self {
        v
    }
    fn as_f32(v: &[Self]) -> Option<&[f32]> {
        Some(v)
    }
    fn as_f32_mut(v: &mut [Self]) -> Option<&mut [f32]> {
        Some(v)
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
    let xt = strided::contiguous::<T>(x);
    let widened: Vec<f32>;
    let xf: &[f32] = match T::as_f32(&xt) {
        Some(v) => v,
        None => {
            widened = xt.iter().map(|v| v.up()).collect();
            &widened
        }
    };
    let bytes = strided::contiguous::<u8>(w);
    let level = qdot::level();
    let out = buf.typed_mut::<T>();
    let mut staged = Vec::new();
    let res: &mut [f32] = match T::as_f32_mut(out) {
        Some(o) => o,
        None => {
            staged = vec![0f32; total];
            &mut staged
        }
    };
    if k == 0 {
        res.fill(0.0); // empty dot products
    } else if m >= gemm_rows() {
        wide_product(format, &bytes, xf, m, n, k, res, PANEL_BYTES);
    } else if level == Level::Portable && m >= PANEL_M {
        panel_product(format, &bytes, xf, m, n, k, res);
    } else {
        direct_product(level, format, &bytes, xf, m, n, k, res);
    }
    if !staged.is_empty() {
        for (o, v) in buf.typed_mut::<T>().iter_mut().zip(&staged) {
            *o = T::down(*v);
        }
    }
    Ok(Storage::contiguous(Buffer::Cpu(buf), dtype, shape))
}

/// `res [m, n] = x [m, k] · wᵀ` through [`qdot::tile`]: for many rows of `x`, pieces of
/// [`PM`] output rows (contiguous), each running over the weight in tiles of [`TN`] rows;
/// for a few, pieces of [`NB`] weight rows computed as a transposed `[rows, m]` piece.
#[allow(clippy::too_many_arguments)]
fn direct_product(
    level: Level,
    format: QuantFormat,
    bytes: &[u8],
    xf: &[f32],
    m: usize,
    n: usize,
    k: usize,
    res: &mut [f32],
) {
    let row_bytes = k / BLOCK * format.block_bytes();
    // One tile of `tn` weight rows times `mm` rows of `x`, in groups of MR rows, into
    // `o` at `o[i * rs + r * cs]`.
    let run = |tmp: &mut [f32], w0: usize, tn: usize, x: &[f32], mm: usize, o: &mut [f32], rs: usize, cs: usize| {
        let w = &bytes[w0 * row_bytes..(w0 + tn) * row_bytes];
        for i0 in (0..mm).step_by(qdot::MR) {
            let g = qdot::MR.min(mm - i0);
            qdot::tile(level, format, w, tn, &x[i0 * k..(i0 + g) * k], k, tmp);
            for r in 0..tn {
                for i in 0..g {
                    o[(i0 + i) * rs + r * cs] = tmp[r * g + i];
                }
            }
        }
    };
    if m >= ROW_SPLIT_M {
        par::chunks_init(
            res,
            PM * n,
            || vec![0f32; TN * qdot::MR],
            |tmp, ci, o| {
                let rows = o.len() / n;
                let x = &xf[ci * PM * k..(ci * PM + rows) * k];
                for w0 in (0..n).step_by(TN) {
                    let tn = TN.min(n - w0);
                    run(tmp, w0, tn, x, rows, &mut o[w0..], n, 1);
                }
            },
        );
    } else if m == 1 {
        par::chunks_init(res, NB, || vec![0f32; NB], |tmp, ci, o| run(tmp, ci * NB, o.len(), xf, 1, o, 0, 1));
    } else {
        let mut t = vec![0f32; n * m];
        par::chunks_init(
            &mut t,
            NB * m,
            || vec![0f32; NB * qdot::MR],
            |tmp, ci, o| run(tmp, ci * NB, o.len() / m, xf, m, o, 1, m),
        );
        untranspose(&t, m, n, res);
    }
}

/// `res [m, n] = x [m, k] · wᵀ` where the CPU has no vector build of [`qdot`]: a piece's
/// [`NP`] weight rows are dequantized once into a small f32 panel, multiplied with all of
/// `x` by `gemm` (single-threaded inside a piece; the pieces run on the pool).
fn panel_product(format: QuantFormat, bytes: &[u8], xf: &[f32], m: usize, n: usize, k: usize, res: &mut [f32]) {
    let row_bytes = k / BLOCK * format.block_bytes();
    let bb = format.block_bytes();
    // The result transposed, [N, M]: pieces of weight rows are contiguous.
    let mut t = vec![0f32; n * m];
    par::chunks_init(
        &mut t,
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
    untranspose(&t, m, n, res);
}

/// `res [m, n] = x [m, k] · wᵀ` for many rows of `x`: panels of weight rows (at most
/// `panel_bytes` of f32, whole pieces of [`TN`] rows) are dequantized on the pool, then
/// each is multiplied with all of `x` by one `gemm` on the pool, straight into its
/// columns of `res`.
#[allow(clippy::too_many_arguments)]
fn wide_product(
    format: QuantFormat,
    bytes: &[u8],
    xf: &[f32],
    m: usize,
    n: usize,
    k: usize,
    res: &mut [f32],
    panel_bytes: usize,
) {
    let row_bytes = k / BLOCK * format.block_bytes();
    let bb = format.block_bytes();
    let pr = (panel_bytes / (4 * k) / TN * TN).clamp(TN, n.next_multiple_of(TN));
    let mut panel = vec![0f32; pr.min(n) * k];
    for w0 in (0..n).step_by(pr) {
        let rows = pr.min(n - w0);
        // The panel as `[k, rows]` (what `gemm` packs fastest), in pieces of KB blocks of K.
        let p = &mut panel[..rows * k];
        par::chunks(p, KB * BLOCK * rows, |ci, piece| {
            let cols = piece.len() / rows;
            // [`TN`] rows' blocks at a time, then written out as lines of TN values.
            let mut t = [[0f32; KB * BLOCK]; TN];
            for r0 in (0..rows).step_by(TN) {
                let g = TN.min(rows - r0);
                for (i, ti) in t.iter_mut().enumerate().take(g) {
                    let row = &bytes[(w0 + r0 + i) * row_bytes..(w0 + r0 + i + 1) * row_bytes];
                    let blocks = row.chunks_exact(bb).skip(ci * KB);
                    for (b, pv) in blocks.zip(ti[..cols].chunks_exact_mut(BLOCK)) {
                        dequantize_block(format, b, pv);
                    }
                }
                for (c, line) in piece.chunks_exact_mut(rows).enumerate() {
                    for (o, ti) in line[r0..r0 + g].iter_mut().zip(&t) {
                        *o = ti[c];
                    }
                }
            }
        });
        // SAFETY: `res` holds m rows of n (row stride n) and columns w0..w0 + rows < n
        // are written; `xf` holds m rows of k (row stride k); `p` holds the k x rows
        // matrix `pᵀ` (element (kk, r) at kk * rows + r).
        unsafe {
            gemm::gemm(
                m,
                rows,
                k,
                res.as_mut_ptr().add(w0),
                1,
                n as isize,
                false,
                xf.as_ptr(),
                1,
                k as isize,
                p.as_ptr(),
                1,
                rows as isize,
                0f32,
                1f32,
                false,
                false,
                false,
                par::gemm_parallelism(true),
            );
        }
    }
}

/// `res [m, n]` from its transpose `t [n, m]` (the result of pieces of weight rows).
fn untranspose(t: &[f32], m: usize, n: usize, res: &mut [f32]) {
    for (j, col) in t.chunks_exact(m).enumerate() {
        for (i, v) in col.iter().enumerate() {
            res[i * n + j] = *v;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The panel product against the register tiles (float64 would be the reference;
    /// both are f32 sums of the same products, so they agree to f32 rounding): panels
    /// smaller than the weight, a last panel cut short, and one panel for all.
    #[test]
    fn panels_of_any_size_give_the_product() {
        let (m, n, k) = (70, 45, 96);
        for f in [QuantFormat::Q4_0, QuantFormat::Q4_1, QuantFormat::Q8_0] {
            let w: Vec<f32> = (0..n * k).map(|i| ((i * 7919 % 1013) as f32 / 506.5 - 1.0) * 0.3).collect();
            let bytes = crate::quant::quantize(f, &w).unwrap();
            let x: Vec<f32> = (0..m * k).map(|i| (i * 104_729 % 997) as f32 / 498.5 - 1.0).collect();
            let mut want = vec![0f32; m * n];
            direct_product(Level::Portable, f, &bytes, &x, m, n, k, &mut want);
            for panel_bytes in [1, 16 * 4 * k, 32 * 4 * k, PANEL_BYTES] {
                let mut got = vec![f32::NAN; m * n];
                wide_product(f, &bytes, &x, m, n, k, &mut got, panel_bytes);
                for (i, (g, w)) in got.iter().zip(&want).enumerate() {
                    assert!(
                        (g - w).abs() <= 1e-4 * (1.0 + w.abs()),
                        "{f:?} panel {panel_bytes} element {i}: {g} vs {w}"
                    );
                }
            }
        }
    }
}
