//! Block-quantized kernels on the GPU: `x @ wᵀ` read from the packed blocks of `w`
//! (u8 `[N, K / 32 * block_bytes]`), and dequantization. One CUDA source per (format,
//! x dtype[, rows]) with the format's block math under `#if QFMT`:
//!
//! | rows of `x` | kernel |
//! |---|---|
//! | 1 to [`MV_CHUNKED_ROWS`] (decode, batched decode) | `k_qmv`: a warp per weight row, 4 warps a block, a grid row per chunk of up to [`MV_MAX_ROWS`] rows of `x`; each lane takes a quarter of a block (8 values: 4 code bytes of a 4-bit format, 8 of Q8_0), 8 consecutive blocks per warp step, so a warp's loads cover one contiguous run of the row; the codes dot the `x` rows in registers (`d · Σ q·x` plus the block's offset times `Σ x`) and the lanes' sums meet through shuffles |
//! | more (prefill) | `k_qmm`: 64 x 64 output tiles, 256 threads of 4 x 4 outputs; per block of K, the 64 weight rows' blocks are dequantized into shared memory as f32 (a quarter block per thread) beside the `x` tile, then 32 rank-1 updates in f32 |
//!
//! Blocks are 18, 20 or 34 bytes: a row starts 2-byte aligned (4 for Q4_1) when the
//! weight's first byte is 4-byte aligned (an unaligned or strided weight is copied
//! first), so scales load as u16 and codes as u16 pairs (u32 for Q4_1). `x` is read
//! contiguous (strided `x` is copied first) and accumulates in f32.

use cudarc::driver::LaunchConfig;

use crate::backend::Storage;
use crate::dtype::DType;
use crate::error::Result;
use crate::quant::QuantFormat;

use super::buffer::new_storage;
use super::driver::GpuStream;
use super::launch::Launch;
use super::norm::elem_ptr;
use super::nvrtc;
use super::source::{PRELUDE, ctype, load, store_float};

/// Rows of `x` one block of the matrix-vector kernel takes.
pub(crate) const MV_MAX_ROWS: usize = 8;
/// Most rows of `x` the matrix-vector kernel takes (in chunks of [`MV_MAX_ROWS`], a grid
/// row each, every chunk reading the weight again, from L2); more go to the tiled kernel.
/// Up to here the chunks' many blocks beat the tiled kernel's few (64 rows of `x` make
/// one row of 64 x 64 tiles: 9 blocks for a 576-wide output).
pub(crate) const MV_CHUNKED_ROWS: usize = 64;
/// Weight rows per block of the matrix-vector kernel (a warp each).
const MV_WARPS: u32 = 4;
/// Output tile of the tiled kernel (rows of `x` and of `w`).
const TILE: usize = 64;

fn fmt_code(f: QuantFormat) -> u32 {
    match f {
        QuantFormat::Q4_0 => 0,
        QuantFormat::Q4_1 => 1,
        QuantFormat::Q8_0 => 2,
    }
}

/// The block math of every kernel: the format's constants and its code/scale reads.
const BLOCK_SRC: &str = r#"
__device__ __forceinline__ float qscale(const u8* blk) { return ld_f16(*(const u16*)blk); }
__device__ __forceinline__ float qmin(const u8* blk) {
#if QFMT == 1
    return ld_f16(*(const u16*)(blk + 2));
#else
    (void)blk;
    return 0.f;
#endif
}
// Value index of code i (0..7) of quarter p (0..3) of a block: a 4-bit format's quarter
// is code bytes 4p..4p+3, whose low nibbles are values 4p.. and high nibbles 16+4p..;
// Q8_0's quarter is values 8p..8p+7.
__device__ __forceinline__ int part_idx(int p, int i) {
#if QFMT == 2
    return 8 * p + i;
#else
    return i < 4 ? 4 * p + i : 16 + 4 * p + (i - 4);
#endif
}
// The 8 codes of quarter p as floats (signed for Q8_0), in part_idx order.
__device__ __forceinline__ void part_codes(const u8* blk, int p, float* q) {
#if QFMT == 2
    #pragma unroll
    for (int c = 0; c < 4; c++) {
        u32 h = *(const u16*)(blk + 2 + 8 * p + 2 * c);
        q[2 * c] = (float)(signed char)(h & 0xffu);
        q[2 * c + 1] = (float)(signed char)(h >> 8);
    }
#else
#if QFMT == 0
    u32 w = (u32)*(const u16*)(blk + 2 + 4 * p) | ((u32)*(const u16*)(blk + 4 + 4 * p) << 16);
#else
    u32 w = *(const u32*)(blk + 4 + 4 * p);
#endif
    #pragma unroll
    for (int i = 0; i < 4; i++) {
        q[i] = (float)((w >> (8 * i)) & 15u);
        q[4 + i] = (float)((w >> (8 * i + 4)) & 15u);
    }
#endif
}
// A code's value, rounded as the host's dequantize rounds it.
__device__ __forceinline__ float deq(float q, float d, float m) {
#if QFMT == 0
    (void)m;
    return __fmul_rn(q - 8.f, d);
#elif QFMT == 1
    return __fadd_rn(__fmul_rn(q, d), m);
#else
    (void)m;
    return __fmul_rn(q, d);
#endif
}
"#;

/// The defines that specialise a source: format, block bytes, x type and its conversions.
fn head(f: QuantFormat, d: DType) -> String {
    format!(
        "{PRELUDE}\n#define QFMT {}\n#define BB {}\ntypedef {} XT;\n#define LDX(e) ({})\n#define STO(v) ({})\n{BLOCK_SRC}",
        fmt_code(f),
        f.block_bytes(),
        ctype(d),
        load(d, "e"),
        store_float(d, "v", false),
    )
}

/// `k_qmv` for `mr` rows of `x`.
fn qmv_source(f: QuantFormat, d: DType, mr: usize) -> String {
    let body = r#"
#define MR $MR
extern "C" __global__ void __launch_bounds__(128) k_qmv(XT* out, const XT* x, const u8* w, i64 n, i64 k, i64 m) {
    const int lane = threadIdx.x & 31, p = lane & 3;
    // Block row y takes rows MR*y.. of x (fewer in the last chunk).
    const i64 r0 = (i64)blockIdx.y * MR;
    const int rows = (int)(m - r0 < MR ? m - r0 : MR);
    x += r0 * k;
    out += r0 * n;
    const i64 row = (i64)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    if (row >= n) return;
    const i64 nb = k >> 5;
    const u8* wr = w + row * nb * BB;
    float acc[MR];
    #pragma unroll
    for (int r = 0; r < MR; r++) acc[r] = 0.f;
    for (i64 b = lane >> 2; b < nb; b += 8) {
        const u8* blk = wr + b * BB;
        const float d = qscale(blk), m = qmin(blk);
        float q[8];
        part_codes(blk, p, q);
        #pragma unroll
        for (int r = 0; r < MR; r++) {
            if (r >= rows) break;
            const XT* xr = x + r * k + b * 32;
            float s = 0.f, sx = 0.f;
            #pragma unroll
            for (int i = 0; i < 8; i++) {
                const float xv = LDX(xr[part_idx(p, i)]);
                s += q[i] * xv;
                sx += xv;
            }
#if QFMT == 0
            acc[r] += d * (s - 8.f * sx);
            (void)m;
#elif QFMT == 1
            acc[r] += d * s + m * sx;
#else
            acc[r] += d * s;
            (void)sx; (void)m;
#endif
        }
    }
    #pragma unroll
    for (int r = 0; r < MR; r++) {
        if (r >= rows) break;
        float v = acc[r];
        for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
        if (lane == 0) out[r * n + row] = STO(v);
    }
}
"#;
    head(f, d) + &body.replace("$MR", &mr.to_string())
}

/// `k_qmm`, the tiled kernel.
fn qmm_source(f: QuantFormat, d: DType) -> String {
    // Row strides of the shared tiles, padded so a warp's transposed stores hit distinct
    // banks (4-bit quarters step 4 values, Q8_0 quarters 8).
    let ws = if f == QuantFormat::Q8_0 { 65 } else { 66 };
    let body = r#"
#define TM 64
#define TN 64
#define XS 65
#define WS $WS
extern "C" __global__ void __launch_bounds__(256) k_qmm(XT* out, const XT* x, const u8* w, i64 m, i64 n, i64 k) {
    __shared__ float xs[32 * XS];
    __shared__ float ws[32 * WS];
    const int t = threadIdx.x, lr = t >> 2, p = t & 3, tx = t & 15, ty = t >> 4;
    const i64 nb = k >> 5;
    const i64 n0 = (i64)blockIdx.x * TN;
    const i64 gn = n0 + lr;
    const u8* wr = w + (gn < n ? gn : 0) * nb * BB;
    for (i64 m0 = (i64)blockIdx.y * TM; m0 < m; m0 += (i64)gridDim.y * TM) {
        const i64 gm = m0 + lr;
        const XT* xr = x + (gm < m ? gm : 0) * k;
        float acc[4][4];
        #pragma unroll
        for (int i = 0; i < 4; i++) {
            #pragma unroll
            for (int j = 0; j < 4; j++) acc[i][j] = 0.f;
        }
        for (i64 b = 0; b < nb; b++) {
            #pragma unroll
            for (int i = 0; i < 8; i++) xs[(8 * p + i) * XS + lr] = gm < m ? LDX(xr[b * 32 + 8 * p + i]) : 0.f;
            if (gn < n) {
                const u8* blk = wr + b * BB;
                const float d = qscale(blk), mn = qmin(blk);
                float q[8];
                part_codes(blk, p, q);
                #pragma unroll
                for (int i = 0; i < 8; i++) ws[part_idx(p, i) * WS + lr] = deq(q[i], d, mn);
            } else {
                #pragma unroll
                for (int i = 0; i < 8; i++) ws[part_idx(p, i) * WS + lr] = 0.f;
            }
            __syncthreads();
            #pragma unroll 8
            for (int kk = 0; kk < 32; kk++) {
                float a[4], c[4];
                #pragma unroll
                for (int i = 0; i < 4; i++) a[i] = xs[kk * XS + ty + 16 * i];
                #pragma unroll
                for (int j = 0; j < 4; j++) c[j] = ws[kk * WS + tx + 16 * j];
                #pragma unroll
                for (int i = 0; i < 4; i++) {
                    #pragma unroll
                    for (int j = 0; j < 4; j++) acc[i][j] += a[i] * c[j];
                }
            }
            __syncthreads();
        }
        #pragma unroll
        for (int i = 0; i < 4; i++) {
            const i64 om = m0 + ty + 16 * i;
            if (om >= m) continue;
            #pragma unroll
            for (int j = 0; j < 4; j++) {
                const i64 on = n0 + tx + 16 * j;
                if (on < n) out[om * n + on] = STO(acc[i][j]);
            }
        }
    }
}
"#;
    head(f, d) + &body.replace("$WS", &ws.to_string())
}

/// `k_dq`: one thread per value; bytes read one at a time (any alignment).
fn dq_source(f: QuantFormat, d: DType) -> String {
    let body = r#"
extern "C" __global__ void k_dq(XT* out, const u8* w, i64 total) {
    const i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= total) return;
    const i64 b = i >> 5;
    const int j = (int)(i & 31);
    const u8* blk = w + b * BB;
    const float d = ld_f16((u16)(blk[0] | (blk[1] << 8)));
#if QFMT == 2
    const float v = deq((float)(signed char)blk[2 + j], d, 0.f);
#else
#if QFMT == 1
    const float mn = ld_f16((u16)(blk[2] | (blk[3] << 8)));
    const u8 c = blk[4 + (j & 15)];
#else
    const float mn = 0.f;
    const u8 c = blk[2 + (j & 15)];
#endif
    const float v = deq((float)(j < 16 ? (c & 15) : (c >> 4)), d, mn);
#endif
    out[i] = STO(v);
}
"#;
    head(f, d) + body
}

/// `x` as a contiguous storage, and `w` contiguous with its first byte 4-byte aligned
/// (copies when they are not).
fn operands(cs: &GpuStream<'_>, x: &Storage, w: &Storage) -> Result<(Storage, Storage)> {
    let xs = if x.layout.is_contiguous() { x.clone() } else { super::elementwise::copy(cs, x)? };
    let ws = if w.layout.is_contiguous() && elem_ptr(w).is_multiple_of(4) {
        w.clone()
    } else {
        super::elementwise::copy(cs, w)?
    };
    Ok((xs, ws))
}

/// `x [.., K] @ wᵀ` into a new `[.., N]` storage of `dtype` (x's dtype).
pub(crate) fn qmatmul(
    cs: &GpuStream<'_>,
    x: &Storage,
    w: &Storage,
    format: QuantFormat,
    shape: &[usize],
    dtype: DType,
) -> Result<Storage> {
    if !crate::primitives::quant::float_ok(dtype) || x.dtype != dtype {
        return Err(super::unsupported("qmatmul", format!("dtype {dtype} (f32, bf16 and f16 only)")));
    }
    let out = new_storage(cs, dtype, shape)?;
    let total: usize = shape.iter().product();
    let k = *x.layout.shape.last().unwrap_or(&0);
    if total == 0 {
        return Ok(out);
    }
    let n = *shape.last().unwrap_or(&1);
    let m = total / n;
    let (xs, ws) = operands(cs, x, w)?;
    let (po, px, pw) = (elem_ptr(&out), elem_ptr(&xs), elem_ptr(&ws));
    let (n64, k64) = (n as i64, k as i64);
    let name = crate::quant::QuantFormat::name(format);
    let _ = cs.bind();
    if m <= MV_CHUNKED_ROWS {
        // One kernel per exact row count up to a chunk, then one for chunks of 8.
        let mr = m.min(MV_MAX_ROWS);
        let key = format!("qmv:{name}:{}:{mr}", dtype.name());
        let func = nvrtc::function(cs.driver(), &cs.dev, &key, "k_qmv", move || qmv_source(format, dtype, mr))?;
        let grid = n.div_ceil(MV_WARPS as usize).clamp(1, 1 << 30) as u32;
        let chunks = m.div_ceil(mr) as u32;
        let cfg = LaunchConfig { grid_dim: (grid, chunks, 1), block_dim: (32 * MV_WARPS, 1, 1), shared_mem_bytes: 0 };
        let m64 = m as i64;
        let mut lb = Launch::new(&func);
        lb.arg(&po).arg(&px).arg(&pw).arg(&n64).arg(&k64).arg(&m64);
        // SAFETY: `x` holds m*k contiguous elements of `dtype`, `w` n rows of k/32 blocks
        // from a 4-byte aligned first byte, `out` m*n elements; the grid covers the n rows
        // (a warp each, the rest return) and the m rows in chunks of `mr` (the last one's
        // missing rows skipped); the arguments match `k_qmv`'s signature.
        unsafe { lb.launch(cs, cfg) }.map_err(|e| super::backend_err("launch", e))?;
    } else {
        let key = format!("qmm:{name}:{}", dtype.name());
        let func = nvrtc::function(cs.driver(), &cs.dev, &key, "k_qmm", move || qmm_source(format, dtype))?;
        let gx = n.div_ceil(TILE).clamp(1, 1 << 30) as u32;
        let gy = m.div_ceil(TILE).clamp(1, 65535) as u32;
        let cfg = LaunchConfig { grid_dim: (gx, gy, 1), block_dim: (256, 1, 1), shared_mem_bytes: 0 };
        let m64 = m as i64;
        let mut lb = Launch::new(&func);
        lb.arg(&po).arg(&px).arg(&pw).arg(&m64).arg(&n64).arg(&k64);
        // SAFETY: as for `k_qmv`; the kernel guards rows past m and n and loops over row
        // tiles past the grid's y extent.
        unsafe { lb.launch(cs, cfg) }.map_err(|e| super::backend_err("launch", e))?;
    }
    Ok(out)
}

/// Packed u8 blocks `[.., B * block_bytes]` as `[.., B * 32]` values of `dtype`.
pub(crate) fn dequantize(
    cs: &GpuStream<'_>,
    b: &Storage,
    format: QuantFormat,
    shape: &[usize],
    dtype: DType,
) -> Result<Storage> {
    if !crate::primitives::quant::float_ok(dtype) {
        return Err(super::unsupported("dequantize", format!("dtype {dtype} (f32, bf16 and f16 only)")));
    }
    let out = new_storage(cs, dtype, shape)?;
    let total: usize = shape.iter().product();
    if total == 0 {
        return Ok(out);
    }
    let bs = if b.layout.is_contiguous() { b.clone() } else { super::elementwise::copy(cs, b)? };
    let key = format!("dq:{}:{}", format.name(), dtype.name());
    let func = nvrtc::function(cs.driver(), &cs.dev, &key, "k_dq", move || dq_source(format, dtype))?;
    let (po, pb, t64) = (elem_ptr(&out), elem_ptr(&bs), total as i64);
    let _ = cs.bind();
    let mut lb = Launch::new(&func);
    lb.arg(&po).arg(&pb).arg(&t64);
    // SAFETY: `b` holds total/32 contiguous blocks (read bytewise), `out` total elements;
    // one thread per element, the rest return; the arguments match `k_dq`'s signature.
    unsafe { lb.launch(cs, nvrtc::grid_for(total)) }.map_err(|e| super::backend_err("launch", e))?;
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::cuda::nvrtc::check_compiles;

    #[test]
    fn quant_kernels_compile_for_sm90() {
        for f in QuantFormat::ALL {
            for d in [DType::F32, DType::F16, DType::BF16] {
                let n = f.name();
                for mr in [1, 3, MV_MAX_ROWS] {
                    if !check_compiles(&format!("test:qmv:{n}:{d}:{mr}"), &qmv_source(f, d, mr)) {
                        return;
                    }
                }
                check_compiles(&format!("test:qmm:{n}:{d}"), &qmm_source(f, d));
                check_compiles(&format!("test:dq:{n}:{d}"), &dq_source(f, d));
            }
        }
    }
}
