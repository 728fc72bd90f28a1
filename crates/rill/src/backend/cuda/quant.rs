//! Block-quantized kernels on the GPU: `x @ wᵀ` read from the packed blocks of `w`
//! (u8 `[N, K / 32 * block_bytes]`), and dequantization. One CUDA source per (format,
//! x dtype[, rows]) with the format's block math under `#if QFMT`:
//!
//! | rows of `x` | kernel |
//! |---|---|
//! | 1 to [`MV_CHUNKED_ROWS`] (decode, batched decode) of f32 `x`, fewer than [`TC_ROWS`] of f16/bf16 | `k_qmvf` in its plain form (`qfused.rs`): a warp per weight row, 4 warps a block, a grid row per chunk of up to [`MV_MAX_ROWS`] rows of `x`; each lane takes a quarter of a block (8 values: 4 code bytes of a 4-bit format, 8 of Q8_0), 8 consecutive blocks per warp step, so a warp's loads cover one contiguous run of the row; the codes dot the `x` rows in registers (`d · Σ q·x` plus the block's offset times `Σ x`) and the lanes' sums meet through shuffles |
//! | [`TC_ROWS`] or more of f16/bf16 `x` with 16-byte aligned rows | `k_qmm_tc`: 64 x 64 output tiles on tensor cores (`mma.sync`), the codes as exact integers of x's type, each block's f32 tile scaled into the accumulator ([`qmm_tc_source`]) |
//! | more, otherwise | `k_qmm`: 64 x 64 output tiles, 256 threads of 4 x 4 outputs; per block of K, the 64 weight rows' blocks are dequantized into shared memory as f32 (a quarter block per thread) beside the `x` tile, then 32 rank-1 updates in f32 |
//!
//! With `RILL_QMM_SPLITK=1`, a tiled product with too few tiles to fill the GPU (batched
//! decode, short prefill: 64 rows of a 576-wide output are 9 tiles) splits its K across
//! the grid's z axis ([`k_splits`]) and `k_qmm_sum` adds the splits' f32 partial sums in
//! order (opt-in until these kernels have run on a GPU).
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
use crate::sync::OnceLock;

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
/// The fewest rows of f16/bf16 `x` that go to the tensor-core kernel. At 64 rows it
/// beats the chunked matrix-vector kernel on every weight shape of `rill bench qmatmul`
/// (the 49152-row output head by 18x); at 16 rows each wins on some shapes.
const TC_ROWS: usize = 64;
/// [`TC_ROWS`] unless `RILL_QMM_TC_ROWS` says otherwise (a tuning knob for comparing the
/// two kernels on the rows they share).
fn tc_rows() -> usize {
    static ROWS: OnceLock<usize> = OnceLock::new();
    *ROWS.get_or_init(|| std::env::var("RILL_QMM_TC_ROWS").ok().and_then(|v| v.parse().ok()).unwrap_or(TC_ROWS))
}
/// Fewest blocks of K (32 values each) one split of a tiled product takes.
const SPLIT_MIN_BLOCKS: usize = 3;
/// Most splits of K of a tiled product.
const MAX_SPLITS: usize = 16;
/// Most f32 partial sums the splits of one product write (16 MiB).
const MAX_PARTIALS: usize = 1 << 22;

/// Whether tiled products split K: only with `RILL_QMM_SPLITK=1` until the split kernels
/// (and `k_qmm_sum_post`) have run on a GPU.
fn split_k_on() -> bool {
    static ON: OnceLock<bool> = OnceLock::new();
    *ON.get_or_init(|| std::env::var("RILL_QMM_SPLITK").as_deref() == Ok("1"))
}

/// Splits of K for a tiled product of `tiles` output tiles (`outs` outputs) and `nb`
/// blocks of K, and the blocks each split takes. A tile's walk down K is a chain of
/// dependent steps, so when the tiles leave most of the `sms` multiprocessors idle (64
/// rows of a 576-wide output are 9 tiles) K is split for about two blocks on each, every
/// split at least [`SPLIT_MIN_BLOCKS`] long; `k_qmm_sum` then adds the partial sums.
/// With `on` false (the default, [`split_k_on`]) one split.
fn k_splits(on: bool, tiles: usize, nb: usize, outs: usize, sms: usize) -> (usize, usize) {
    let want = if on { (2 * sms).div_ceil(tiles.max(1)) } else { 1 };
    let s = want.min(nb / SPLIT_MIN_BLOCKS).min(MAX_PARTIALS / outs.max(1)).clamp(1, MAX_SPLITS);
    let per = nb.div_ceil(s).max(1);
    (nb.div_ceil(per).max(1), per)
}

/// Weight rows per block of the matrix-vector kernel (a warp each).
pub(crate) const MV_WARPS: u32 = 4;
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
pub(crate) fn head(f: QuantFormat, d: DType) -> String {
    format!(
        "{PRELUDE}\n#define QFMT {}\n#define BB {}\ntypedef {} XT;\n#define LDX(e) ({})\n#define STO(v) ({})\n{BLOCK_SRC}",
        fmt_code(f),
        f.block_bytes(),
        ctype(d),
        load(d, "e"),
        store_float(d, "v", false),
    )
}

/// How a tiled kernel stores an output: whole (one split of K) or as its split's f32
/// partial sums, which `k_qmm_sum` adds in split order.
const PUT_SRC: &str = r#"
#define PUT(om, on, v) do { if (gridDim.z == 1) out[(om) * n + (on)] = STO(v); else part[((i64)blockIdx.z * m + (om)) * n + (on)] = (v); } while (0)
"#;

/// `k_qmm_sum`: the splits' partial sums of each output, added in split order.
fn qmm_sum_source(d: DType) -> String {
    let body = r#"
extern "C" __global__ void k_qmm_sum(XT* out, const float* part, i64 total, i64 splits) {
    const i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= total) return;
    float s = part[i];
    for (i64 t = 1; t < splits; t++) s += part[t * total + i];
    out[i] = STO(s);
}
"#;
    format!(
        "{PRELUDE}
typedef {} XT;
#define STO(v) ({})
{body}",
        ctype(d),
        store_float(d, "v", false)
    )
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
extern "C" __global__ void __launch_bounds__(256) k_qmm(XT* out, float* part, const XT* x, const u8* w, i64 m, i64 n, i64 k, i64 per) {
    __shared__ float xs[32 * XS];
    __shared__ float ws[32 * WS];
    const int t = threadIdx.x, lr = t >> 2, p = t & 3, tx = t & 15, ty = t >> 4;
    const i64 nb = k >> 5;
    const i64 b0 = (i64)blockIdx.z * per, b1 = b0 + per < nb ? b0 + per : nb;
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
        for (i64 b = b0; b < b1; b++) {
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
                if (on < n) PUT(om, on, acc[i][j]);
            }
        }
    }
}
"#;
    head(f, d) + PUT_SRC + &body.replace("$WS", &ws.to_string())
}

/// `k_qmm_tc`, the tensor-core tiled kernel for f16/bf16 `x`: 64 x 64 output tiles, 4
/// warps of 32 x 32. Per block of K (32 values) the x tile is copied to shared memory as
/// is and the 64 weight rows' codes as exact small integers of x's type (`q - 8` for
/// Q4_0, `q` for Q4_1, the signed byte for Q8_0), beside each row's scale (and Q4_1's
/// offset) and each x row's sum over the block (Q4_1). `mma.sync.m16n8k16` multiplies
/// codes by x into a per-block f32 tile, which is added into the accumulator scaled by
/// the weight row's scale (plus its offset times the x row's sum): the products and sums
/// are the exact products of the values with f32 accumulation, as in the other kernels,
/// only in another order. The next block's tiles load into registers while this one's
/// products run (two shared buffers, one barrier a block). Needs x's rows 16-byte
/// aligned (`k` a multiple of 8 and an aligned first element).
fn qmm_tc_source(f: QuantFormat, d: DType) -> String {
    let ab = if d == DType::BF16 { "bf16" } else { "f16" };
    let body = r#"
#define TM 64
#define TN 64
#define SS 40
__device__ __forceinline__ u32 smem_u32(const void* p) { return (u32)__cvta_generic_to_shared(p); }
__device__ __forceinline__ void ldm4(u32* r, u32 a) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
        : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(a));
}
__device__ __forceinline__ void mma16816(float* c, const u32* a, u32 b0, u32 b1) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.$AB.$AB.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
// Two small integers as a packed pair of x's type (exact).
__device__ __forceinline__ u32 pack2(float lo, float hi) {
    u32 r; asm("cvt.rn.$AB" "x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo)); return r;
}
// What one thread loads for one block of K: half (16 values) of one x row and of one
// weight row.
struct Stage { uint4 x0, x1; u32 c[4]; float d, mn; };
__device__ __forceinline__ void stage_load(Stage& s, const XT* xr, bool xok, const u8* blk, bool wok, int h) {
    if (xok) {
        const uint4* xv = (const uint4*)(xr + 16 * h);
        s.x0 = xv[0]; s.x1 = xv[1];
    } else {
        s.x0 = make_uint4(0, 0, 0, 0); s.x1 = s.x0;
    }
    if (wok) {
        s.d = qscale(blk); s.mn = qmin(blk);
#if QFMT == 2
        const u16* q = (const u16*)(blk + 2 + 16 * h);
        #pragma unroll
        for (int i = 0; i < 4; i++) s.c[i] = (u32)q[2 * i] | ((u32)q[2 * i + 1] << 16);
#elif QFMT == 1
        const u32* q = (const u32*)(blk + 4);
        #pragma unroll
        for (int i = 0; i < 4; i++) s.c[i] = q[i];
#else
        const u16* q = (const u16*)(blk + 2);
        #pragma unroll
        for (int i = 0; i < 4; i++) s.c[i] = (u32)q[2 * i] | ((u32)q[2 * i + 1] << 16);
#endif
    } else {
        s.d = 0.f; s.mn = 0.f;
        #pragma unroll
        for (int i = 0; i < 4; i++) s.c[i] = 0u;
    }
}
// Stores a stage: x half-row, the codes of values 16h..16h+15 as x's type, the row's
// scale and offset (h == 0) and the x half-row's sum (both halves meet by a shuffle).
__device__ __forceinline__ void stage_store(const Stage& s, XT* xs, XT* ws, float* sc, float* mn, float* sx, int row, int h) {
    uint4* xd = (uint4*)(xs + row * SS + 16 * h);
    xd[0] = s.x0; xd[1] = s.x1;
#if QFMT == 1
    float sum = 0.f;
    const XT* xe = (const XT*)&s.x0;
    #pragma unroll
    for (int i = 0; i < 8; i++) sum += LDX(xe[i]);
    xe = (const XT*)&s.x1;
    #pragma unroll
    for (int i = 0; i < 8; i++) sum += LDX(xe[i]);
    sum += __shfl_xor_sync(0xffffffffu, sum, 1);
    if (h == 0) sx[row] = sum;
#else
    (void)sx;
#endif
    u32 p[8];
#if QFMT == 2
    // Bytes 16h.. of the codes: signed.
    #pragma unroll
    for (int i = 0; i < 4; i++) {
        const u32 w = s.c[i];
        p[2 * i] = pack2((float)(signed char)(w & 0xffu), (float)(signed char)((w >> 8) & 0xffu));
        p[2 * i + 1] = pack2((float)(signed char)((w >> 16) & 0xffu), (float)(signed char)(w >> 24));
    }
#else
    // Value j < 16 is the low nibble of code byte j, value 16 + j its high nibble.
    const int sh = 4 * h;
    const float off = QFMT == 0 ? 8.f : 0.f;
    #pragma unroll
    for (int i = 0; i < 4; i++) {
        const u32 w = s.c[i] >> sh;
        p[2 * i] = pack2((float)(w & 15u) - off, (float)((w >> 8) & 15u) - off);
        p[2 * i + 1] = pack2((float)((w >> 16) & 15u) - off, (float)((w >> 24) & 15u) - off);
    }
#endif
    uint4* wd = (uint4*)(ws + row * SS + 16 * h);
    wd[0] = make_uint4(p[0], p[1], p[2], p[3]);
    wd[1] = make_uint4(p[4], p[5], p[6], p[7]);
    if (h == 0) { sc[row] = s.d; mn[row] = s.mn; }
}
extern "C" __global__ void __launch_bounds__(128) k_qmm_tc(XT* out, float* part, const XT* x, const u8* w, i64 m, i64 n, i64 k, i64 per) {
    __shared__ __align__(16) XT xs[2][TM * SS];
    __shared__ __align__(16) XT ws[2][TN * SS];
    __shared__ float sc[2][TN], mn[2][TN], sx[2][TM];
    const int t = threadIdx.x, lane = t & 31, warp = t >> 5;
    const int row = t >> 1, h = t & 1;
    const int wm = (warp >> 1) * 32, wn = (warp & 1) * 32;
    const i64 nb = k >> 5;
    const i64 b0 = (i64)blockIdx.z * per, b1 = b0 + per < nb ? b0 + per : nb;
    const i64 n0 = (i64)blockIdx.x * TN;
    const bool wok = n0 + row < n;
    const u8* wr = w + (wok ? n0 + row : 0) * nb * BB;
    for (i64 m0 = (i64)blockIdx.y * TM; m0 < m; m0 += (i64)gridDim.y * TM) {
        const bool xok = m0 + row < m;
        const XT* xr = x + (xok ? m0 + row : 0) * k;
        float acc[2][4][4];
        #pragma unroll
        for (int i = 0; i < 2; i++)
            #pragma unroll
            for (int j = 0; j < 4; j++)
                #pragma unroll
                for (int e = 0; e < 4; e++) acc[i][j][e] = 0.f;
        Stage st;
        stage_load(st, xr + b0 * 32, xok, wr + b0 * BB, wok, h);
        stage_store(st, xs[0], ws[0], sc[0], mn[0], sx[0], row, h);
        __syncthreads();
        for (i64 b = b0; b < b1; b++) {
            const int cur = (int)((b - b0) & 1);
            if (b + 1 < b1) stage_load(st, xr + (b + 1) * 32, xok, wr + (b + 1) * BB, wok, h);
            float tt[2][4][4];
            #pragma unroll
            for (int i = 0; i < 2; i++)
                #pragma unroll
                for (int j = 0; j < 4; j++)
                    #pragma unroll
                    for (int e = 0; e < 4; e++) tt[i][j][e] = 0.f;
            #pragma unroll
            for (int kk = 0; kk < 32; kk += 16) {
                u32 a[2][4], bf[2][4];
                #pragma unroll
                for (int i = 0; i < 2; i++)
                    ldm4(a[i], smem_u32(&xs[cur][(wm + 16 * i + (lane & 15)) * SS + kk + (lane >> 4) * 8]));
                #pragma unroll
                for (int j = 0; j < 2; j++)
                    ldm4(bf[j], smem_u32(&ws[cur][(wn + 16 * j + (lane & 7) + (lane >> 4) * 8) * SS + kk + ((lane >> 3) & 1) * 8]));
                #pragma unroll
                for (int i = 0; i < 2; i++)
                    #pragma unroll
                    for (int j = 0; j < 2; j++) {
                        mma16816(tt[i][2 * j], a[i], bf[j][0], bf[j][1]);
                        mma16816(tt[i][2 * j + 1], a[i], bf[j][2], bf[j][3]);
                    }
            }
            #pragma unroll
            for (int j = 0; j < 4; j++) {
                const int c0 = wn + 8 * j + 2 * (lane & 3);
                const float d0 = sc[cur][c0], d1 = sc[cur][c0 + 1];
#if QFMT == 1
                const float m0v = mn[cur][c0], m1v = mn[cur][c0 + 1];
#endif
                #pragma unroll
                for (int i = 0; i < 2; i++) {
                    const int r0 = wm + 16 * i + (lane >> 2);
#if QFMT == 1
                    const float s0 = sx[cur][r0], s1 = sx[cur][r0 + 8];
                    acc[i][j][0] += d0 * tt[i][j][0] + m0v * s0;
                    acc[i][j][1] += d1 * tt[i][j][1] + m1v * s0;
                    acc[i][j][2] += d0 * tt[i][j][2] + m0v * s1;
                    acc[i][j][3] += d1 * tt[i][j][3] + m1v * s1;
#else
                    (void)r0;
                    acc[i][j][0] += d0 * tt[i][j][0];
                    acc[i][j][1] += d1 * tt[i][j][1];
                    acc[i][j][2] += d0 * tt[i][j][2];
                    acc[i][j][3] += d1 * tt[i][j][3];
#endif
                }
            }
            if (b + 1 < b1) stage_store(st, xs[cur ^ 1], ws[cur ^ 1], sc[cur ^ 1], mn[cur ^ 1], sx[cur ^ 1], row, h);
            __syncthreads();
        }
        #pragma unroll
        for (int i = 0; i < 2; i++)
            #pragma unroll
            for (int j = 0; j < 4; j++)
                #pragma unroll
                for (int e = 0; e < 4; e++) {
                    const i64 om = m0 + wm + 16 * i + (lane >> 2) + 8 * (e >> 1);
                    const i64 on = n0 + wn + 8 * j + 2 * (lane & 3) + (e & 1);
                    if (om < m && on < n) PUT(om, on, acc[i][j][e]);
                }
    }
}
"#;
    head(f, d) + PUT_SRC + &body.replace("$AB", ab)
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

/// Whether `m` rows of `x` (dtype `d`, `k` columns) take the matrix-vector kernel: up to
/// [`MV_CHUNKED_ROWS`], and not the tensor-core kernel's rows.
pub(crate) fn mv_applies(d: DType, k: usize, m: usize) -> bool {
    m <= MV_CHUNKED_ROWS && !(d != DType::F32 && k.is_multiple_of(8) && m >= tc_rows())
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
    qmatmul_with(cs, x, w, format, shape, dtype, None).map(|(out, _)| out)
}

/// Adds the f32 partial sums of a product split over K (`splits` of the output's shape,
/// in split order) into the result: `qfused` passes one that applies a post program.
pub(crate) type AddSplits<'a> = &'a dyn Fn(&Storage, usize) -> Result<Storage>;

/// [`qmatmul`], where a product split over K is finished by `add` when given (else by
/// `k_qmm_sum`); the flag says whether `add` made the result.
pub(crate) fn qmatmul_with(
    cs: &GpuStream<'_>,
    x: &Storage,
    w: &Storage,
    format: QuantFormat,
    shape: &[usize],
    dtype: DType,
    add: Option<AddSplits<'_>>,
) -> Result<(Storage, bool)> {
    if !crate::primitives::quant::float_ok(dtype) || x.dtype != dtype {
        return Err(super::unsupported("qmatmul", format!("dtype {dtype} (f32, bf16 and f16 only)")));
    }
    let total: usize = shape.iter().product();
    let k = *x.layout.shape.last().unwrap_or(&0);
    if total == 0 {
        return Ok((new_storage(cs, dtype, shape)?, false));
    }
    let n = *shape.last().unwrap_or(&1);
    let m = total / n;
    let (xs, ws) = operands(cs, x, w)?;
    let (px, pw) = (elem_ptr(&xs), elem_ptr(&ws));
    let (n64, k64) = (n as i64, k as i64);
    let name = crate::quant::QuantFormat::name(format);
    let _ = cs.bind();
    let tc = tc_applies(dtype, k, px, m);
    if m <= MV_CHUNKED_ROWS && !tc {
        let out = new_storage(cs, dtype, shape)?;
        let po = elem_ptr(&out);
        // One kernel per exact row count up to a chunk, then one for chunks of 8.
        let mr = m.min(MV_MAX_ROWS);
        let key = format!("qmv:{name}:{}:{mr}", dtype.name());
        let src = move || super::qfused::plain_source(format, dtype, mr);
        let func = nvrtc::function(cs.driver(), &cs.dev, &key, "k_qmvf", src)?;
        let grid = n.div_ceil(MV_WARPS as usize).clamp(1, 1 << 30) as u32;
        let chunks = m.div_ceil(mr) as u32;
        let cfg = LaunchConfig { grid_dim: (grid, chunks, 1), block_dim: (32 * MV_WARPS, 1, 1), shared_mem_bytes: 0 };
        let (m64, col) = (m as i64, 1i64);
        let mut lb = Launch::new(&func);
        lb.arg(&po).arg(&pw).arg(&n64).arg(&k64).arg(&m64).arg(&px).arg(&k64).arg(&col);
        // SAFETY: `x` holds m*k contiguous elements of `dtype` (row stride k, column stride
        // 1), `w` n rows of k/32 blocks from a 4-byte aligned first byte, `out` m*n
        // elements; the grid covers the n rows (a warp each, the rest return) and the m
        // rows in chunks of `mr` (the last one's missing rows skipped); the arguments match
        // the plain `k_qmvf`'s signature.
        unsafe { lb.launch(cs, cfg) }.map_err(|e| super::backend_err("launch", e))?;
        return Ok((out, false));
    }
    let (splits, per) = tiled_splits(m, n, k, cs.dev.sms as usize);
    if splits == 1 {
        let out = new_storage(cs, dtype, shape)?;
        tiled(cs, &xs, &ws, format, dtype, tc, (m, n, k), (elem_ptr(&out), 0), (1, per))?;
        return Ok((out, false));
    }
    let part = new_storage(cs, DType::F32, &[splits * m * n])?;
    tiled(cs, &xs, &ws, format, dtype, tc, (m, n, k), (0, elem_ptr(&part)), (splits, per))?;
    if let Some(add) = add {
        return Ok((add(&part, splits)?, true));
    }
    let out = new_storage(cs, dtype, shape)?;
    let key = format!("qmm_sum:{}", dtype.name());
    let func = nvrtc::function(cs.driver(), &cs.dev, &key, "k_qmm_sum", move || qmm_sum_source(dtype))?;
    let (po, pp, t64, s64) = (elem_ptr(&out), elem_ptr(&part), (m * n) as i64, splits as i64);
    let mut lb = Launch::new(&func);
    lb.arg(&po).arg(&pp).arg(&t64).arg(&s64);
    // SAFETY: `part` holds splits·m·n f32, `out` m·n elements; a thread per output.
    unsafe { lb.launch(cs, nvrtc::grid_for(m * n)) }.map_err(|e| super::backend_err("launch", e))?;
    Ok((out, false))
}

/// Whether `m` rows of contiguous `x` (dtype `d`, `k` columns, first element at `px`)
/// take the tensor-core kernel. K = 0 takes `k_qmm`, whose loop over K writes zeros
/// without a first load.
fn tc_applies(d: DType, k: usize, px: u64, m: usize) -> bool {
    d != DType::F32 && k > 0 && k.is_multiple_of(8) && px.is_multiple_of(16) && m >= tc_rows()
}

/// The splits of K of a tiled product of `m` rows, `n` outputs and `k` features, and the
/// blocks of K each takes ([`k_splits`]).
fn tiled_splits(m: usize, n: usize, k: usize, sms: usize) -> (usize, usize) {
    let tiles = n.div_ceil(TILE).clamp(1, 1 << 30) * m.div_ceil(TILE).clamp(1, 65535);
    k_splits(split_k_on(), tiles, k / 32, m * n, sms)
}

/// Launches a tiled kernel (`k_qmm_tc` with `tc`, else `k_qmm`) over contiguous `xs` and
/// `ws`: with one split it stores the outputs at `po`; with several each split stores its
/// f32 partial sums at `pp` (splits·m·n of them), for the caller to add.
#[allow(clippy::too_many_arguments)]
fn tiled(
    cs: &GpuStream<'_>,
    xs: &Storage,
    ws: &Storage,
    format: QuantFormat,
    dtype: DType,
    tc: bool,
    (m, n, k): (usize, usize, usize),
    (po, pp): (u64, u64),
    (splits, per): (usize, usize),
) -> Result<()> {
    // The tiled kernels share their grid and arguments; tensor cores need f16/bf16 x
    // with every row 16-byte aligned (an aligned first element and `k` a multiple of 8
    // two-byte values, `tc_applies`).
    let (kname, threads) = if tc { ("k_qmm_tc", 128) } else { ("k_qmm", 256) };
    let key = format!("{kname}:{}:{}", format.name(), dtype.name());
    let src = move || if tc { qmm_tc_source(format, dtype) } else { qmm_source(format, dtype) };
    let func = nvrtc::function(cs.driver(), &cs.dev, &key, kname, src)?;
    let gx = n.div_ceil(TILE).clamp(1, 1 << 30) as u32;
    let gy = m.div_ceil(TILE).clamp(1, 65535) as u32;
    let cfg = LaunchConfig { grid_dim: (gx, gy, splits as u32), block_dim: (threads, 1, 1), shared_mem_bytes: 0 };
    let (px, pw) = (elem_ptr(xs), elem_ptr(ws));
    let (m64, n64, k64, per64) = (m as i64, n as i64, k as i64, per as i64);
    let _ = cs.bind();
    let mut lb = Launch::new(&func);
    lb.arg(&po).arg(&pp).arg(&px).arg(&pw).arg(&m64).arg(&n64).arg(&k64).arg(&per64);
    // SAFETY: `x` holds m*k contiguous elements, `w` n rows of k/32 blocks from a 4-byte
    // aligned first byte; the kernels guard rows past m and n and loop over row tiles past
    // the grid's y extent; split z reads blocks [z·per, (z+1)·per) of K (clipped to K) and
    // stores m·n outputs at `po` (one split) or m·n partial sums at z·m·n of `pp`.
    unsafe { lb.launch(cs, cfg) }.map_err(|e| super::backend_err("launch", e))
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
    fn splits_of_k_cover_k_and_leave_no_split_empty() {
        for tiles in [1, 9, 72, 132, 263, 264, 768] {
            for nb in [0, 1, 2, 3, 5, 18, 47, 48, 1000] {
                for outs in [1, 4096, 36_864, 1 << 22, 1 << 23] {
                    let (s, per) = k_splits(true, tiles, nb, outs, 132);
                    assert_eq!(k_splits(false, tiles, nb, outs, 132), (1, nb.max(1)));
                    assert!((1..=MAX_SPLITS).contains(&s) && per >= 1, "{tiles} {nb} {outs}: {s} x {per}");
                    assert!(s * per >= nb && (s - 1) * per < nb.max(1), "{tiles} {nb}: {s} x {per}");
                    assert!(s == 1 || (per >= SPLIT_MIN_BLOCKS && s * outs <= MAX_PARTIALS), "{tiles} {nb} {outs}");
                    // Two blocks a multiprocessor already: no split.
                    if tiles >= 264 {
                        assert_eq!(s, 1);
                    }
                }
            }
        }
        // 64 rows of a 576-wide output over K = 576: 9 tiles, 6 splits of 3 blocks.
        assert_eq!(k_splits(true, 9, 18, 64 * 576, 132), (6, 3));
    }

    #[test]
    fn quant_kernels_compile_for_sm90() {
        for f in QuantFormat::ALL {
            for d in [DType::F32, DType::F16, DType::BF16] {
                let n = f.name();
                for mr in [1, 3, MV_MAX_ROWS] {
                    let src = crate::backend::cuda::qfused::plain_source(f, d, mr);
                    if !check_compiles(&format!("test:qmv:{n}:{d}:{mr}"), &src) {
                        return;
                    }
                }
                check_compiles(&format!("test:qmm:{n}:{d}"), &qmm_source(f, d));
                if d != DType::F32 {
                    check_compiles(&format!("test:qmmtc:{n}:{d}"), &qmm_tc_source(f, d));
                }
                check_compiles(&format!("test:dq:{n}:{d}"), &dq_source(f, d));
                check_compiles(&format!("test:qmm_sum:{d}"), &qmm_sum_source(d));
            }
        }
    }
}
