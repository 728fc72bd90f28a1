//! Scaled dot-product attention on the GPU. The kernels here are flash-attention style: a
//! block takes a tile of queries, walks the keys in tiles with an online softmax, and keeps
//! the running maximum, sum and output rows in registers; no `[Tq, Tk]` matrix touches
//! global memory. f32 and f64 over several query rows instead go through cuBLAS
//! (`attention_gemm.rs`), with the scores of at most 512 MiB in global memory at once.
//!
//! | inputs | kernel |
//! |---|---|
//! | f16/bf16, `D` and `Dv` multiples of 16 up to 128 | `k_attn_tc`: 4 warps, 64 queries a block (16 a warp; 128 and two row tiles a warp when `D`, `Dv` ≤ 64 with no array mask and blocks enough, so each K and V fragment read from shared memory feeds twice the products) and 64 keys a tile; Q, K and V tiles in shared memory (`cp.async`, rows padded by 16 bytes so `ldmatrix` is conflict-free), `mma.sync.m16n8k16` with f32 accumulation for `Q Kᵀ` and `P V` (P rounded to the inputs' type, as in FlashAttention), the next V tile loading while `Q Kᵀ` runs and the next K tile while `P V` runs; one kernel per (dtype, `D`, `Dv`, mask) |
//! | one query row (`Tq = 1`, decoding), f16/bf16/f32, `D` and `Dv` up to 256 | `k_attn_dec`: a block takes up to 8 query heads of one key/value head (they share each key and value it loads) and one split of the keys, 4 warps of 32 keys a step (a lane per key's dot products, then the lanes share the output columns); splits of at least 512 keys are chosen to give about two blocks per multiprocessor, and `k_attn_dec_sum` merges them (a cache of up to 512 keys is one split, one kernel) |
//! | f32/f64, more than one query row | `attention_gemm.rs`: the scores of a chunk of planes by a batched cuBLAS product, `k_attn_rows` (mask and softmax in place), then `P V` by a second product |
//! | anything else (f16/bf16 of other `D`, or with `RILL_ATTN_GEMM=0`; `D` up to 256 per lane group) | `k_attn_simt`: a warp per query row, 32 keys per step (a lane per key's dot product, then the lanes share the `Dv` columns of the output) |
//!
//! Both read q, k, v through (batch, head, token) strides with the last axis contiguous
//! (other inputs are copied first), the mask through its broadcast strides, and write a
//! contiguous output. Causal masking stops the key loop at the last tile a query block
//! can see; query blocks are launched in reverse so the longest start first. A row with
//! no key left after masking is 0 (its sum is 0, and the division is skipped).

use cudarc::driver::LaunchConfig;

use crate::backend::Storage;
use crate::dtype::DType;
use crate::error::Result;
use crate::primitives::AttentionMaskKind;
use crate::primitives::attention::MAX_BATCH_DIMS;
use crate::shape::Layout;

use super::buffer::new_storage;
use super::driver::GpuStream;
use super::launch::Launch;
use super::map::merge_dims;
use super::norm::elem_ptr;
use super::nvrtc;
use super::source::{PRELUDE, ctype, ftype, load, store_float};

/// Query rows per block of the tensor-core kernel.
const BQ: usize = 64;
/// Query rows per block of the SIMT kernel (one per warp).
const SIMT_ROWS: usize = 4;
/// Largest `Dv` the SIMT kernel holds in registers (per lane: `Dv / 32`).
const SIMT_MAX_DV: usize = 256;

/// The kernel parameter struct (mirrors `struct AttnP` in the source), as i64 words.
pub(crate) const P_WORDS: usize = 65;

pub(crate) const PARAMS_SRC: &str = r#"
#define NEG_INF __int_as_float(0xff800000u)
struct AttnP {
    i64 nb; i64 bshape[8];
    i64 bq[8]; i64 bk[8]; i64 bv[8]; i64 bm[8]; i64 bo[8];
    i64 hq, hkv, tq, tk;
    i64 qh, qt, kh, kt, vh, vt, mh, mq, mk, oh, ot;
    double scale;
};
// The offsets of the (batch, query head) plane `bh` in q, k, v, the mask and the output.
__device__ __forceinline__ void attn_offsets(const AttnP& p, i64 bh, i64& oq, i64& ok, i64& ov, i64& om, i64& oo) {
    i64 b = bh / p.hq, h = bh % p.hq;
    i64 hk = h / (p.hq / p.hkv);
    oq = h * p.qh; ok = hk * p.kh; ov = hk * p.vh; om = h * p.mh; oo = h * p.oh;
    for (int a = (int)p.nb - 1; a >= 0; --a) {
        i64 i = b % p.bshape[a];
        b /= p.bshape[a];
        oq += i * p.bq[a]; ok += i * p.bk[a]; ov += i * p.bv[a]; om += i * p.bm[a]; oo += i * p.bo[a];
    }
}
"#;

/// The mask's part of a kernel: its C type and a statement applying the mask element at
/// `idx` (an expression) to the score `x` (log2-scaled when `log2`).
pub(crate) fn mask_src(kind: AttentionMaskKind, md: Option<DType>, log2: bool, idx: &str) -> (String, String) {
    match (kind, md) {
        (AttentionMaskKind::Array, Some(d)) => {
            let t = ctype(d).to_string();
            let e = if d == DType::Bool {
                "x = mask[idx] ? x : NEG_INF;".to_string()
            } else {
                let v = load(d, "mask[idx]");
                if log2 { format!("x += (float)({v}) * 1.4426950408889634f;") } else { format!("x += ({v});") }
            };
            (t, format!("{{ const i64 idx = {idx}; {e} }}"))
        }
        _ => ("u8".to_string(), "{}".to_string()),
    }
}

/// The tensor-core kernels' shared device functions for `ab` (`"f16"` or `"bf16"`):
/// `cp.async` tile loads, `ldmatrix`, `mma.sync.m16n8k16` with f32 accumulation and
/// packing two floats into the inputs' type. Tiles are 128-thread cooperative loads.
pub(crate) fn tc_helpers(ab: &str) -> String {
    format!(
        r#"__device__ __forceinline__ u32 smem(const void* p) {{ return (u32)__cvta_generic_to_shared(p); }}
__device__ __forceinline__ void cp16(u32 dst, const void* src, int n) {{
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" :: "r"(dst), "l"(src), "r"(n) : "memory");
}}
__device__ __forceinline__ void cp_commit() {{ asm volatile("cp.async.commit_group;" ::: "memory"); }}
__device__ __forceinline__ void cp_wait0() {{ asm volatile("cp.async.wait_group 0;" ::: "memory"); }}
__device__ __forceinline__ void ldm4(u32* r, u32 a) {{
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {{%0,%1,%2,%3}}, [%4];"
        : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(a));
}}
__device__ __forceinline__ void ldm4t(u32* r, u32 a) {{
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {{%0,%1,%2,%3}}, [%4];"
        : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(a));
}}
__device__ __forceinline__ void mma(float* c, const u32* a, u32 b0, u32 b1) {{
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.{ab}.{ab}.f32 {{%0,%1,%2,%3}}, {{%4,%5,%6,%7}}, {{%8,%9}}, {{%0,%1,%2,%3}};"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}}
// Two floats as a packed pair (`lo` in the low half), rounded to nearest even.
__device__ __forceinline__ u32 pack(float lo, float hi) {{
    u32 r; asm("cvt.rn.{ab}x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo)); return r;
}}
// Rows `row0 ..` of a [rows, cols] tile (global row stride `gs`) into shared memory
// (row stride `ss`); rows at or past `nvalid` are zero-filled.
__device__ __forceinline__ void load_tile(u16* s, int ss, const u16* g, i64 gs, i64 row0, i64 nvalid, int rows, int cols) {{
    int per = cols / 8;
    for (int c = threadIdx.x; c < rows * per; c += 128) {{
        int r = c / per, cc = (c % per) * 8;
        bool ok = row0 + r < nvalid;
        const u16* src = ok ? g + (row0 + r) * gs + cc : g;
        cp16(smem(s + r * ss + cc), src, ok ? 16 : 0);
    }}
}}
"#
    )
}

/// Row tiles of 16 queries each warp of `k_attn_tc` takes: two (128 queries a block) when
/// `D` and `Dv` are at most 64, there is no array mask, `Tq` is at least 512 and the
/// 128-row blocks of the `planes` still give every multiprocessor two; else one. Two tiles
/// let each K and V fragment read from shared memory feed twice the products, but hold
/// twice the registers: with an array mask read per score, or with fewer blocks than the
/// GPU can run at once, one tile a warp was faster (`rill bench sdpa`).
/// `RILL_ATTN_TC_TILES=1` keeps one, for comparison.
pub(crate) fn tc_tiles(dk: usize, dv: usize, kind: AttentionMaskKind, tq: usize, planes: usize, sms: usize) -> usize {
    static ONE: crate::sync::OnceLock<bool> = crate::sync::OnceLock::new();
    let one = *ONE.get_or_init(|| std::env::var("RILL_ATTN_TC_TILES").as_deref() == Ok("1"));
    let fits = dk <= 64 && dv <= 64 && kind != AttentionMaskKind::Array;
    let busy = tq >= 512 && planes.saturating_mul(tq.div_ceil(2 * BQ)) >= 2 * sms;
    if !one && fits && busy { 2 } else { 1 }
}

/// The tensor-core kernel for `d` (f16 or bf16), head dimensions `dk`/`dv`, `mt` row tiles
/// of 16 queries a warp (`64 * mt` queries a block).
pub(crate) fn tc_source(
    d: DType,
    dk: usize,
    dv: usize,
    kind: AttentionMaskKind,
    md: Option<DType>,
    mt: usize,
) -> String {
    let ab = if d == DType::BF16 { "bf16" } else { "f16" };
    let (mtype, mexpr) = mask_src(kind, md, true, "om + row * p.mq + key * p.mk");
    let causal = (kind == AttentionMaskKind::Causal) as i32;
    let array = (kind == AttentionMaskKind::Array) as i32;
    let bq = BQ * mt;
    let sq = (bq * (dk + 8)).max(64 * (dv + 8));
    let helpers = tc_helpers(ab);
    format!(
        r#"{PRELUDE}
{PARAMS_SRC}
#define MT {mt}
#define BQ {bq}
#define BK 64
#define D {dk}
#define DV {dv}
#define SD (D + 8)
#define SDV (DV + 8)
#define CAUSAL {causal}
#define ARRAY {array}
{helpers}
extern "C" __global__ void __launch_bounds__(128) k_attn_tc(u16* out, const u16* q, const u16* k, const u16* v, const {mtype}* mask, AttnP p) {{
    __shared__ __align__(16) u16 sK[BK * SD];
    __shared__ __align__(16) u16 sQV[{sq}];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const i64 nqb = (p.tq + BQ - 1) / BQ;
    const i64 bhn = (i64)gridDim.x / nqb;
    const i64 x = blockIdx.x;
    const i64 qb = nqb - 1 - x / bhn;
    const i64 bh = x % bhn;
    i64 oq, okk, ov, om, oo;
    attn_offsets(p, bh, oq, okk, ov, om, oo);
    const u16* Q = q + oq; const u16* K = k + okk; const u16* V = v + ov; u16* O = out + oo;
    const i64 q0 = qb * BQ;
    const i64 off = p.tk - p.tq;
    i64 kend = p.tk;
    if (CAUSAL) {{ i64 lim = q0 + BQ + off; if (lim < kend) kend = lim; }}
    const i64 ntiles = kend > 0 ? (kend + BK - 1) / BK : 0;
    load_tile(sQV, SD, Q, p.qt, q0, p.tq, BQ, D);
    cp_commit();
    if (ntiles > 0) {{ load_tile(sK, SD, K, p.kt, 0, p.tk, BK, D); cp_commit(); }}
    cp_wait0();
    __syncthreads();
    // Warp `w` owns query rows w * 16 * MT + mt * 16 .. + 15 of the block.
    u32 qf[MT][D / 16][4];
#pragma unroll
    for (int t = 0; t < MT; ++t) {{
#pragma unroll
        for (int kk = 0; kk < D / 16; ++kk) {{
            int row = (warp * MT + t) * 16 + (lane & 7) + ((lane >> 3) & 1) * 8, col = kk * 16 + (lane >> 4) * 8;
            ldm4(qf[t][kk], smem(sQV + row * SD + col));
        }}
    }}
    __syncthreads();
    float o[MT][DV / 8][4];
    float m[MT][2], l[MT][2];
    i64 r[MT][2];
#pragma unroll
    for (int t = 0; t < MT; ++t) {{
#pragma unroll
        for (int i = 0; i < DV / 8; ++i) {{ o[t][i][0] = o[t][i][1] = o[t][i][2] = o[t][i][3] = 0.f; }}
        m[t][0] = m[t][1] = NEG_INF;
        l[t][0] = l[t][1] = 0.f;
        r[t][0] = q0 + (warp * MT + t) * 16 + (lane >> 2);
        r[t][1] = r[t][0] + 8;
    }}
    const float sl2 = (float)p.scale * 1.4426950408889634f;
    for (i64 tile = 0; tile < ntiles; ++tile) {{
        const i64 k0 = tile * BK;
        load_tile(sQV, SDV, V, p.vt, k0, p.tk, BK, DV);
        cp_commit();
        float s[MT][BK / 8][4];
#pragma unroll
        for (int t = 0; t < MT; ++t) {{
#pragma unroll
            for (int i = 0; i < BK / 8; ++i) {{ s[t][i][0] = s[t][i][1] = s[t][i][2] = s[t][i][3] = 0.f; }}
        }}
#pragma unroll
        for (int kk = 0; kk < D / 16; ++kk) {{
#pragma unroll
            for (int nb = 0; nb < BK / 16; ++nb) {{
                u32 b[4];
                int key = nb * 16 + (lane & 7) + ((lane >> 4) << 3), col = kk * 16 + ((lane >> 3) & 1) * 8;
                ldm4(b, smem(sK + key * SD + col));
#pragma unroll
                for (int t = 0; t < MT; ++t) {{
                    mma(s[t][2 * nb], qf[t][kk], b[0], b[1]);
                    mma(s[t][2 * nb + 1], qf[t][kk], b[2], b[3]);
                }}
            }}
        }}
        // Scale (log2 domain) and mask; the per-element checks only where a tile needs them.
        const bool edge = (k0 + BK > p.tk) || (CAUSAL && k0 + BK - 1 > q0 + off) || ARRAY;
#pragma unroll
        for (int t = 0; t < MT; ++t) {{
#pragma unroll
            for (int nb = 0; nb < BK / 8; ++nb) {{
#pragma unroll
                for (int e = 0; e < 4; ++e) {{
                    float x = s[t][nb][e] * sl2;
                    if (edge) {{
                        i64 row = r[t][e >> 1];
                        i64 key = k0 + nb * 8 + 2 * (lane & 3) + (e & 1);
                        if (ARRAY && row < p.tq && key < p.tk) {mexpr}
                        if (key >= p.tk || (CAUSAL && key > row + off)) x = NEG_INF;
                    }}
                    s[t][nb][e] = x;
                }}
            }}
        }}
#pragma unroll
        for (int t = 0; t < MT; ++t) {{
            float mx0 = NEG_INF, mx1 = NEG_INF;
#pragma unroll
            for (int nb = 0; nb < BK / 8; ++nb) {{
                mx0 = fmaxf(mx0, fmaxf(s[t][nb][0], s[t][nb][1]));
                mx1 = fmaxf(mx1, fmaxf(s[t][nb][2], s[t][nb][3]));
            }}
            mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 1));
            mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 2));
            mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 1));
            mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 2));
            const float n0 = fmaxf(m[t][0], mx0), n1 = fmaxf(m[t][1], mx1);
            // A row with every key so far masked keeps max -inf: shift by 0 so exp2 gives 0, not NaN.
            const float u0 = n0 == NEG_INF ? 0.f : n0, u1 = n1 == NEG_INF ? 0.f : n1;
            const float c0 = exp2f(m[t][0] - u0), c1 = exp2f(m[t][1] - u1);
            m[t][0] = n0; m[t][1] = n1;
            float rs0 = 0.f, rs1 = 0.f;
#pragma unroll
            for (int nb = 0; nb < BK / 8; ++nb) {{
                s[t][nb][0] = exp2f(s[t][nb][0] - u0); s[t][nb][1] = exp2f(s[t][nb][1] - u0);
                s[t][nb][2] = exp2f(s[t][nb][2] - u1); s[t][nb][3] = exp2f(s[t][nb][3] - u1);
                rs0 += s[t][nb][0] + s[t][nb][1];
                rs1 += s[t][nb][2] + s[t][nb][3];
            }}
            l[t][0] = l[t][0] * c0 + rs0;
            l[t][1] = l[t][1] * c1 + rs1;
#pragma unroll
            for (int i = 0; i < DV / 8; ++i) {{ o[t][i][0] *= c0; o[t][i][1] *= c0; o[t][i][2] *= c1; o[t][i][3] *= c1; }}
        }}
        cp_wait0();
        __syncthreads();
        if (tile + 1 < ntiles) {{ load_tile(sK, SD, K, p.kt, k0 + BK, p.tk, BK, D); cp_commit(); }}
#pragma unroll
        for (int kk = 0; kk < BK / 16; ++kk) {{
            u32 a[MT][4];
#pragma unroll
            for (int t = 0; t < MT; ++t) {{
                a[t][0] = pack(s[t][2 * kk][0], s[t][2 * kk][1]);
                a[t][1] = pack(s[t][2 * kk][2], s[t][2 * kk][3]);
                a[t][2] = pack(s[t][2 * kk + 1][0], s[t][2 * kk + 1][1]);
                a[t][3] = pack(s[t][2 * kk + 1][2], s[t][2 * kk + 1][3]);
            }}
#pragma unroll
            for (int dn = 0; dn < DV / 16; ++dn) {{
                u32 b[4];
                int key = kk * 16 + (lane & 7) + ((lane >> 3) & 1) * 8, col = dn * 16 + (lane >> 4) * 8;
                ldm4t(b, smem(sQV + key * SDV + col));
#pragma unroll
                for (int t = 0; t < MT; ++t) {{
                    mma(o[t][2 * dn], a[t], b[0], b[1]);
                    mma(o[t][2 * dn + 1], a[t], b[2], b[3]);
                }}
            }}
        }}
        cp_wait0();
        __syncthreads();
    }}
#pragma unroll
    for (int t = 0; t < MT; ++t) {{
        float l0 = l[t][0], l1 = l[t][1];
        l0 += __shfl_xor_sync(0xffffffffu, l0, 1);
        l0 += __shfl_xor_sync(0xffffffffu, l0, 2);
        l1 += __shfl_xor_sync(0xffffffffu, l1, 1);
        l1 += __shfl_xor_sync(0xffffffffu, l1, 2);
        const float i0 = l0 > 0.f ? 1.f / l0 : 0.f, i1 = l1 > 0.f ? 1.f / l1 : 0.f;
        const i64 r0 = r[t][0], r1 = r[t][1];
#pragma unroll
        for (int dn = 0; dn < DV / 8; ++dn) {{
            int col = dn * 8 + 2 * (lane & 3);
            if (r0 < p.tq) *(u32*)(O + r0 * p.ot + col) = pack(o[t][dn][0] * i0, o[t][dn][1] * i0);
            if (r1 < p.tq) *(u32*)(O + r1 * p.ot + col) = pack(o[t][dn][2] * i1, o[t][dn][3] * i1);
        }}
    }}
}}
"#
    )
}

/// The SIMT kernel for values of `d` (computing in `float`, or `double` for f64), `Dv`
/// up to `32 * dvl`.
pub(crate) fn simt_source(d: DType, dvl: usize, kind: AttentionMaskKind, md: Option<DType>) -> String {
    let (t, f) = (ctype(d), ftype(d));
    let wide = d == DType::F64;
    let (mt, mexpr) = mask_src(kind, md, false, "om + i * p.mq + j * p.mk");
    let causal = (kind == AttentionMaskKind::Causal) as i32;
    let array = (kind == AttentionMaskKind::Array) as i32;
    let (lq, lk, lv) = (load(d, "Q[c]"), load(d, "K[j * p.kt + c]"), load(d, "V[jj * p.vt + c]"));
    let st = store_float(d, "acc[u] * inv", wide);
    let (exp, fmax) = if wide { ("exp", "fmax") } else { ("expf", "fmaxf") };
    format!(
        r#"{PRELUDE}
{PARAMS_SRC}
#define ROWS {SIMT_ROWS}
#define DVL {dvl}
#define CAUSAL {causal}
#define ARRAY {array}
extern "C" __global__ void __launch_bounds__(128) k_attn_simt({t}* out, const {t}* q, const {t}* k, const {t}* v, const {mt}* mask, AttnP p, i64 nrows, i64 d, i64 dv) {{
    __shared__ {f} sq[ROWS][256];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const i64 row = (i64)blockIdx.x * ROWS + warp;
    if (row >= nrows) return; // a whole warp; no block-wide barrier follows
    const i64 bh = row / p.tq, i = row % p.tq;
    i64 oq, okk, ov, om, oo;
    attn_offsets(p, bh, oq, okk, ov, om, oo);
    const {t}* Q = q + oq + i * p.qt; const {t}* K = k + okk; const {t}* V = v + ov; {t}* O = out + oo + i * p.ot;
    for (i64 c = lane; c < d; c += 32) sq[warp][c] = {lq};
    __syncwarp();
    i64 kend = p.tk;
    if (CAUSAL) {{ i64 lim = i + p.tk - p.tq + 1; kend = lim < 0 ? 0 : (lim < kend ? lim : kend); }}
    const {f} scale = ({f})p.scale;
    {f} m = NEG_INF, l = 0;
    {f} acc[DVL];
#pragma unroll
    for (int u = 0; u < DVL; ++u) acc[u] = 0;
    for (i64 j0 = 0; j0 < kend; j0 += 32) {{
        const i64 j = j0 + lane;
        {f} x = NEG_INF;
        if (j < kend) {{
            {f} dot = 0;
            for (i64 c = 0; c < d; ++c) dot += sq[warp][c] * {lk};
            x = dot * scale;
            if (ARRAY) {mexpr}
        }}
        {f} mx = x;
        for (int s = 16; s > 0; s >>= 1) mx = {fmax}(mx, __shfl_xor_sync(0xffffffffu, mx, s));
        const {f} n = {fmax}(m, mx);
        // Every key so far masked: shift by 0 so the exponentials are 0, not NaN.
        const {f} sh = n == NEG_INF ? ({f})0 : n;
        const {f} c0 = {exp}(m - sh);
        const {f} e = {exp}(x - sh);
        {f} es = e;
        for (int s = 16; s > 0; s >>= 1) es += __shfl_xor_sync(0xffffffffu, es, s);
        l = l * c0 + es;
        m = n;
#pragma unroll
        for (int u = 0; u < DVL; ++u) acc[u] *= c0;
        const i64 cnt = kend - j0 < 32 ? kend - j0 : 32;
        for (i64 r = 0; r < cnt; ++r) {{
            const {f} pr = __shfl_sync(0xffffffffu, e, (int)r);
            const i64 jj = j0 + r;
#pragma unroll
            for (int u = 0; u < DVL; ++u) {{
                const i64 c = lane + 32 * u;
                if (c < dv) acc[u] += pr * {lv};
            }}
        }}
    }}
    const {f} inv = l > 0 ? ({f})1 / l : ({f})0;
#pragma unroll
    for (int u = 0; u < DVL; ++u) {{
        const i64 c = lane + 32 * u;
        if (c < dv) O[c] = {st};
    }}
}}
"#
    )
}

/// The kernels' `AttnP` words: the batch shape `batch` (merged where the five layouts
/// allow), the batch, head and token strides of the layouts in the slots q, k, v, mask and
/// output (`[.., H, T, last]`; the mask slot also its last stride), the sizes
/// `[Hq, Hkv, Tq, Tk]` and the scale.
pub(crate) fn attn_params(batch: &[usize], lays: [&Layout; 5], sizes: [usize; 4], scale: f64) -> [i64; P_WORDS] {
    let nb = batch.len();
    let bst: Vec<&[isize]> = lays.iter().map(|l| &l.strides[..nb]).collect();
    let (dims, mst) = merge_dims(batch, &bst);
    debug_assert!(dims.len() <= MAX_BATCH_DIMS);
    let mut p = [0i64; P_WORDS];
    p[0] = dims.len() as i64;
    for a in 0..MAX_BATCH_DIMS {
        p[1 + a] = dims.get(a).map_or(1, |&x| x as i64);
        for (o, st) in mst.iter().enumerate() {
            p[9 + 8 * o + a] = st.get(a).map_or(0, |&x| x as i64);
        }
    }
    let ht = |l: &Layout| [l.strides[nb] as i64, l.strides[nb + 1] as i64];
    let [hq, hkv, tq, tk] = sizes.map(|x| x as i64);
    let rest = [[hq, hkv], [tq, tk], ht(lays[0]), ht(lays[1]), ht(lays[2]), ht(lays[3])];
    for (i, pair) in rest.iter().enumerate() {
        p[49 + 2 * i] = pair[0];
        p[50 + 2 * i] = pair[1];
    }
    p[61] = lays[3].strides[nb + 2] as i64;
    p[62] = lays[4].strides[nb] as i64;
    p[63] = lays[4].strides[nb + 1] as i64;
    p[64] = scale.to_bits() as i64;
    p
}

/// Query heads one decode block takes (its rows of `q`).
const DEC_ROWS: usize = 8;
/// Most key splits of one decode plane.
const DEC_MAX_SPLITS: usize = 64;
/// Fewest keys a decode split takes: below this the merge kernel costs more than the
/// shorter walk saves, so a short cache is one split and one kernel.
const DEC_MIN_SPLIT_KEYS: usize = 512;

/// Fewest keys a decode split takes: [`DEC_MIN_SPLIT_KEYS`], or
/// `RILL_ATTN_DEC_SPLIT_KEYS` (a measurement aid).
fn dec_min_split_keys() -> usize {
    static KEYS: crate::sync::OnceLock<usize> = crate::sync::OnceLock::new();
    *KEYS.get_or_init(|| {
        std::env::var("RILL_ATTN_DEC_SPLIT_KEYS")
            .ok()
            .and_then(|v| v.parse().ok())
            .filter(|&n| n > 0)
            .unwrap_or(DEC_MIN_SPLIT_KEYS)
    })
}

/// The decode kernel `k_attn_dec` (one query row, `Tq = 1`) and its combine
/// `k_attn_dec_sum`: a block takes up to `rows` query heads of one key/value head (they
/// share every key and value it loads) and one contiguous split of the keys; each warp
/// walks 32 keys at a time with a lane per key's dot products, then the lanes share the
/// output columns. With one split the block writes the output; with several each writes
/// its running maximum, sum and unnormalised output (f32) and `k_attn_dec_sum` merges
/// them. Scores are log2-scaled as in the tensor-core kernel. `kvec` (0, or the values
/// in 16 bytes) reads each key row as 16-byte vectors: every key row starts 16-byte
/// aligned and `dk` is a multiple of `kvec` (the host checks); the dot products add in the
/// same order either way.
pub(crate) fn dec_source(
    d: DType,
    dk: usize,
    dv: usize,
    rows: usize,
    kind: AttentionMaskKind,
    md: Option<DType>,
    kvec: usize,
) -> String {
    let t = ctype(d);
    let lke = load(d, "e[i]");
    let (mt, mexpr) = mask_src(kind, md, true, "om + r * p.mh + j * p.mk");
    let causal = (kind == AttentionMaskKind::Causal) as i32;
    let array = (kind == AttentionMaskKind::Array) as i32;
    let (lq, lk, lv) = (load(d, "Q[r * p.qh + c]"), load(d, "Kr[c]"), load(d, "Vr[c]"));
    let st = store_float(d, "L > 0.f ? O / L : 0.f", false);
    format!(
        r#"{PRELUDE}
{PARAMS_SRC}
#define D {dk}
#define DV {dv}
#define R {rows}
#define DVL ((DV + 31) / 32)
#define VB (DVL == 1 ? 32 : DVL == 2 ? 16 : DVL <= 4 ? 8 : 4)
#define CAUSAL {causal}
#define ARRAY {array}
#define KVEC {kvec}
// Block (plane, group chunk, split); a plane is one (batch, key/value head).
__device__ __forceinline__ void dec_block(const AttnP& p, i64 x, i64 splits, i64 groups, i64& s, i64& gi, i64& pk, i64& h0, int& nr) {{
    s = x % splits;
    const i64 rest = x / splits;
    gi = rest % groups;
    pk = rest / groups;
    const i64 gsz = p.hq / p.hkv;
    h0 = (pk / p.hkv) * p.hq + (pk % p.hkv) * gsz + gi * R;
    const i64 left = gsz - gi * R;
    nr = (int)(left < R ? left : R);
}}
extern "C" __global__ void __launch_bounds__(128) k_attn_dec({t}* out, float* wo, float* wml, const {t}* q, const {t}* k, const {t}* v, const {mt}* mask, AttnP p, i64 splits, i64 groups) {{
    __shared__ float sq[R][D];
    __shared__ float sm[4][R], sl[4][R];
    __shared__ float so[4][R][DV];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    i64 s, gi, pk, h0; int nr;
    dec_block(p, blockIdx.x, splits, groups, s, gi, pk, h0, nr);
    i64 oq, okk, ov, om, oo;
    attn_offsets(p, h0, oq, okk, ov, om, oo);
    const {t}* Q = q + oq; const {t}* K = k + okk; const {t}* V = v + ov;
    const float sl2 = (float)p.scale * 1.4426950408889634f;
    for (int e = threadIdx.x; e < R * D; e += 128) {{
        const int r = e / D, c = e % D;
        sq[r][c] = r < nr ? {lq} * sl2 : 0.f;
    }}
    __syncthreads();
    i64 kend = p.tk;
    if (CAUSAL) {{ kend = p.tk - p.tq + 1; if (kend < 0) kend = 0; }}
    const i64 per = ((kend + splits - 1) / splits + 31) / 32 * 32;
    const i64 c0 = s * per;
    const i64 c1 = c0 + per < kend ? c0 + per : kend;
    float m[R], l[R], acc[R][DVL];
#pragma unroll
    for (int r = 0; r < R; ++r) {{
        m[r] = NEG_INF; l[r] = 0.f;
#pragma unroll
        for (int u = 0; u < DVL; ++u) acc[r][u] = 0.f;
    }}
    for (i64 t0 = c0 + 32 * warp; t0 < c1; t0 += 128) {{
        const i64 j = t0 + lane;
        const bool ok = j < c1;
        float xs[R];
#pragma unroll
        for (int r = 0; r < R; ++r) xs[r] = 0.f;
        if (ok) {{
            const {t}* Kr = K + j * p.kt;
#if KVEC
#pragma unroll 8
            for (int cv = 0; cv < D / KVEC; ++cv) {{
                const uint4 u = ((const uint4*)Kr)[cv];
                const {t}* e = (const {t}*)&u;
#pragma unroll
                for (int i = 0; i < KVEC; ++i) {{
                    const float kc = {lke};
#pragma unroll
                    for (int r = 0; r < R; ++r) xs[r] += sq[r][cv * KVEC + i] * kc;
                }}
            }}
#else
#pragma unroll 64
            for (int c = 0; c < D; ++c) {{
                const float kc = {lk};
#pragma unroll
                for (int r = 0; r < R; ++r) xs[r] += sq[r][c] * kc;
            }}
#endif
        }}
#pragma unroll
        for (int r = 0; r < R; ++r) {{
            float x = ok ? xs[r] : NEG_INF;
            if (ARRAY && ok && r < nr) {mexpr}
            float mx = x;
            for (int o = 16; o > 0; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
            const float n = fmaxf(m[r], mx);
            const float u = n == NEG_INF ? 0.f : n;
            const float corr = exp2f(m[r] - u);
            const float e = exp2f(x - u);
            float es = e;
            for (int o = 16; o > 0; o >>= 1) es += __shfl_xor_sync(0xffffffffu, es, o);
            l[r] = l[r] * corr + es;
            m[r] = n;
#pragma unroll
            for (int w = 0; w < DVL; ++w) acc[r][w] *= corr;
            xs[r] = e;
        }}
        // VB value rows loaded at once, so their loads are in flight together (keys past
        // the split have weight 0 and read nothing).
        const int cnt = c1 - t0 < 32 ? (int)(c1 - t0) : 32;
#pragma unroll
        for (int rb = 0; rb < 32; rb += VB) {{
            if (rb < cnt) {{
                float vv[VB][DVL];
#pragma unroll
                for (int i = 0; i < VB; ++i) {{
                    const {t}* Vr = V + (t0 + rb + i) * p.vt;
#pragma unroll
                    for (int w = 0; w < DVL; ++w) {{
                        const int c = lane + 32 * w;
                        vv[i][w] = rb + i < cnt && c < DV ? {lv} : 0.f;
                    }}
                }}
#pragma unroll
                for (int i = 0; i < VB; ++i) {{
#pragma unroll
                    for (int r = 0; r < R; ++r) {{
                        const float pr = __shfl_sync(0xffffffffu, xs[r], rb + i);
#pragma unroll
                        for (int w = 0; w < DVL; ++w) acc[r][w] += pr * vv[i][w];
                    }}
                }}
            }}
        }}
    }}
#pragma unroll
    for (int r = 0; r < R; ++r) {{
        if (lane == 0) {{ sm[warp][r] = m[r]; sl[warp][r] = l[r]; }}
#pragma unroll
        for (int w = 0; w < DVL; ++w) {{ const int c = lane + 32 * w; if (c < DV) so[warp][r][c] = acc[r][w]; }}
    }}
    __syncthreads();
    for (int e = threadIdx.x; e < nr * DV; e += 128) {{
        const int r = e / DV, c = e % DV;
        float M = fmaxf(fmaxf(sm[0][r], sm[1][r]), fmaxf(sm[2][r], sm[3][r]));
        const float u = M == NEG_INF ? 0.f : M;
        float L = 0.f, O = 0.f;
#pragma unroll
        for (int w = 0; w < 4; ++w) {{ const float f = exp2f(sm[w][r] - u); L += sl[w][r] * f; O += so[w][r][c] * f; }}
        if (splits == 1) {{
            out[oo + r * p.oh + c] = {st};
        }} else {{
            const i64 slot = ((pk * groups + gi) * splits + s) * R + r;
            wo[slot * DV + c] = O;
            if (c == 0) {{ wml[2 * slot] = M; wml[2 * slot + 1] = L; }}
        }}
    }}
}}
// One block per (plane, group chunk, row): merges the splits' partial results.
extern "C" __global__ void __launch_bounds__(64) k_attn_dec_sum({t}* out, const float* wo, const float* wml, AttnP p, i64 splits, i64 groups) {{
    const int r = (int)(blockIdx.x % R);
    i64 s, gi, pk, h0; int nr;
    dec_block(p, (i64)(blockIdx.x / R) * splits, splits, groups, s, gi, pk, h0, nr);
    if (r >= nr) return;
    i64 oq, okk, ov, om, oo;
    attn_offsets(p, h0, oq, okk, ov, om, oo);
    const i64 base = (pk * groups + gi) * splits;
    float M = NEG_INF;
    for (i64 t = 0; t < splits; ++t) M = fmaxf(M, wml[2 * ((base + t) * R + r)]);
    const float u = M == NEG_INF ? 0.f : M;
    float L = 0.f;
    for (i64 t = 0; t < splits; ++t) {{ const i64 sl = (base + t) * R + r; L += wml[2 * sl + 1] * exp2f(wml[2 * sl] - u); }}
    for (int c = threadIdx.x; c < DV; c += 64) {{
        float O = 0.f;
        for (i64 t = 0; t < splits; ++t) {{ const i64 sl = (base + t) * R + r; O += wo[sl * DV + c] * exp2f(wml[2 * sl] - u); }}
        out[oo + r * p.oh + c] = {st};
    }}
}}
"#
    )
}

/// Attention over inputs `q, k, v[, mask]` into a new contiguous `shape` of `dtype`.
pub(crate) fn attention(
    cs: &GpuStream<'_>,
    inputs: &[&Storage],
    scale: Option<f64>,
    kind: AttentionMaskKind,
    shape: &[usize],
    dtype: DType,
) -> Result<Storage> {
    const NAME: &str = "scaled_dot_product_attention";
    let qs = inputs[0].layout.shape.clone();
    let r = qs.len();
    let nb = r - 3;
    let (hq, tq, dk) = (qs[nb], qs[nb + 1], qs[nb + 2]);
    let (hkv, tk) = (inputs[1].layout.shape[nb], inputs[1].layout.shape[nb + 1]);
    let dv = inputs[2].layout.shape[nb + 2];
    let out = new_storage(cs, dtype, shape)?;
    if shape.contains(&0) {
        return Ok(out);
    }
    // One query row (decoding against a cache): keys split across blocks.
    let dec = tq == 1 && matches!(dtype, DType::F16 | DType::BF16 | DType::F32) && dk > 0 && dk <= 256 && dv <= 256;
    let tc = !dec
        && matches!(dtype, DType::F16 | DType::BF16)
        && dk > 0
        && dk % 16 == 0
        && dv.is_multiple_of(16)
        && dk <= 128
        && dv <= 128;
    if !tc && (dk > 256 || dv > SIMT_MAX_DV) {
        return Err(super::unsupported(NAME, format!("head dimensions up to 256 on a GPU, got D = {dk}, Dv = {dv}")));
    }
    // q, k, v with the last axis contiguous; for the tensor-core kernel also every row
    // 16-byte aligned (`cp.async`). Others are copied.
    let fit = |s: &Storage| -> Result<Storage> {
        let l = &s.layout;
        let inner = l.shape[r - 1] <= 1 || l.strides[r - 1] == 1;
        let aligned =
            !tc || (elem_ptr(s).is_multiple_of(16) && (0..r - 1).all(|a| l.shape[a] <= 1 || l.strides[a] % 8 == 0));
        if inner && aligned { Ok(s.clone()) } else { super::elementwise::copy(cs, s) }
    };
    let scores: Vec<usize> = qs[..r - 1].iter().copied().chain([tk]).collect();
    let (mask, md) = match kind {
        AttentionMaskKind::Array => (Some(inputs[3]), Some(inputs[3].dtype)),
        AttentionMaskKind::None | AttentionMaskKind::Causal => (None, None),
    };
    let ml = mask.map(|m| m.layout.broadcast_to(&scores)).unwrap_or_else(|| Layout {
        shape: scores.iter().copied().collect(),
        strides: smallvec::smallvec![0; r],
        offset: 0,
    });
    let scale = scale.unwrap_or(if dk == 0 { 1.0 } else { 1.0 / (dk as f64).sqrt() });
    if !dec && super::attention_gemm::applies(inputs, dtype, tq, tk, dk, dv) {
        return super::attention_gemm::attention(cs, inputs, kind, mask, &ml, scale, shape, dtype);
    }
    let (q, k, v) = (fit(inputs[0])?, fit(inputs[1])?, fit(inputs[2])?);
    let ol = Layout::contiguous(shape);
    let p = attn_params(&qs[..nb], [&q.layout, &k.layout, &v.layout, &ml, &ol], [hq, hkv, tq, tk], scale);
    let planes: usize = qs[..nb + 1].iter().product();
    let mname = md.map_or("none", |d| d.name());
    let (po, pq, pk, pv) = (elem_ptr(&out), elem_ptr(&q), elem_ptr(&k), elem_ptr(&v));
    let pm = mask.map_or(0, elem_ptr);
    if dec {
        let group = hq / hkv;
        let groups = group.div_ceil(DEC_ROWS);
        let rows = group.div_ceil(groups);
        let units = planes / hq * hkv * groups;
        let splits = (2 * cs.dev.sms.max(1) as usize)
            .div_ceil(units)
            .clamp(1, tk.div_ceil(dec_min_split_keys()).clamp(1, DEC_MAX_SPLITS));
        let blocks = units * splits;
        if blocks > i32::MAX as usize {
            return Err(super::unsupported(NAME, format!("{blocks} thread blocks (at most 2^31 - 1)")));
        }
        // 16-byte key loads when every key row starts 16-byte aligned.
        let vals = 16 / dtype.size();
        let kl = &k.layout;
        let kvec = if elem_ptr(&k).is_multiple_of(16)
            && dk.is_multiple_of(vals)
            && (0..r - 1).all(|a| kl.shape[a] <= 1 || kl.strides[a] % vals as isize == 0)
        {
            vals
        } else {
            0
        };
        let key = format!("attn_dec:{}:{dk}:{dv}:{rows}:{kind:?}:{mname}:{kvec}", dtype.name());
        let src = || dec_source(dtype, dk, dv, rows, kind, md, kvec);
        let f = nvrtc::function(cs.driver(), &cs.dev, &key, "k_attn_dec", src)?;
        let slots = units * splits * rows;
        let (wo, wml) = if splits > 1 {
            (Some(new_storage(cs, DType::F32, &[slots * dv])?), Some(new_storage(cs, DType::F32, &[slots * 2])?))
        } else {
            (None, None)
        };
        let (pwo, pwml) = (wo.as_ref().map_or(0, elem_ptr), wml.as_ref().map_or(0, elem_ptr));
        let (s64, g64) = (splits as i64, groups as i64);
        let cfg = LaunchConfig { grid_dim: (blocks as u32, 1, 1), block_dim: (128, 1, 1), shared_mem_bytes: 0 };
        let _ = cs.bind();
        let mut lb = Launch::new(&f);
        lb.arg(&po).arg(&pwo).arg(&pwml).arg(&pq).arg(&pk).arg(&pv).arg(&pm).arg_slice(&p).arg(&s64).arg(&g64);
        unsafe { lb.launch(cs, cfg) }.map_err(|e| super::backend_err("launch", e))?;
        if splits > 1 {
            let f = nvrtc::function(cs.driver(), &cs.dev, &key, "k_attn_dec_sum", src)?;
            let cfg =
                LaunchConfig { grid_dim: ((units * rows) as u32, 1, 1), block_dim: (64, 1, 1), shared_mem_bytes: 0 };
            let mut lb = Launch::new(&f);
            lb.arg(&po).arg(&pwo).arg(&pwml).arg_slice(&p).arg(&s64).arg(&g64);
            unsafe { lb.launch(cs, cfg) }.map_err(|e| super::backend_err("launch", e))?;
        }
        return Ok(out);
    }
    let (func, blocks, extra) = if tc {
        let mt = tc_tiles(dk, dv, kind, tq, planes, cs.dev.sms as usize);
        let key = format!("attn_tc:{}:{dk}:{dv}:{kind:?}:{mname}:{mt}", dtype.name());
        let f = nvrtc::function(cs.driver(), &cs.dev, &key, "k_attn_tc", || tc_source(dtype, dk, dv, kind, md, mt))?;
        (f, tq.div_ceil(BQ * mt) * planes, None)
    } else {
        let dvl = dv.div_ceil(32).max(1);
        let key = format!("attn_simt:{}:{dvl}:{kind:?}:{mname}", dtype.name());
        let f = nvrtc::function(cs.driver(), &cs.dev, &key, "k_attn_simt", || simt_source(dtype, dvl, kind, md))?;
        (f, (planes * tq).div_ceil(SIMT_ROWS), Some([(planes * tq) as i64, dk as i64, dv as i64]))
    };
    if blocks > i32::MAX as usize {
        return Err(super::unsupported(NAME, format!("{blocks} thread blocks (at most 2^31 - 1)")));
    }
    let cfg = LaunchConfig { grid_dim: (blocks as u32, 1, 1), block_dim: (128, 1, 1), shared_mem_bytes: 0 };
    let _ = cs.bind();
    let mut lb = Launch::new(&func);
    lb.arg(&po).arg(&pq).arg(&pk).arg(&pv).arg(&pm).arg_slice(&p);
    if let Some(e) = &extra {
        lb.arg(&e[0]).arg(&e[1]).arg(&e[2]);
    }
    // SAFETY: the pointers address q, k, v (and the mask) through the strides in `p`,
    // within their storages' extents, and the contiguous output of `shape`; the
    // arguments match the kernel's signature.
    unsafe { lb.launch(cs, cfg) }.map_err(|e| super::backend_err("launch", e))?;
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::cuda::nvrtc::check_compiles;

    #[test]
    fn attention_kernels_compile() {
        let kinds = [AttentionMaskKind::None, AttentionMaskKind::Causal, AttentionMaskKind::Array];
        for d in [DType::F16, DType::BF16] {
            for (dk, dv) in [(64, 64), (128, 128), (16, 48)] {
                for kind in kinds {
                    let md = (kind == AttentionMaskKind::Array).then_some(DType::Bool);
                    for mt in if dk <= 64 && dv <= 64 { 1..=2 } else { 1..=1 } {
                        let src = tc_source(d, dk, dv, kind, md, mt);
                        if !check_compiles(&format!("test:attn_tc:{d}:{dk}:{dv}:{kind:?}:{mt}"), &src) {
                            return;
                        }
                    }
                }
            }
            check_compiles(
                &format!("test:attn_tc:{d}:f32mask"),
                &tc_source(d, 64, 64, AttentionMaskKind::Array, Some(d), 2),
            );
        }
        for d in [DType::F16, DType::BF16, DType::F32] {
            for (dk, dv, rows) in [(64, 64, 3), (128, 128, 8), (80, 24, 1), (256, 256, 5)] {
                for kind in kinds {
                    let md = (kind == AttentionMaskKind::Array).then_some(DType::Bool);
                    let vals = 16 / d.size();
                    for kvec in [0, vals] {
                        let key = format!("test:attn_dec:{d}:{dk}:{dv}:{rows}:{kind:?}:{kvec}");
                        let src = dec_source(d, dk, dv, rows, kind, md, kvec);
                        if (kvec == 0 || dk % vals == 0) && !check_compiles(&key, &src) {
                            return;
                        }
                    }
                }
            }
            check_compiles(
                &format!("test:attn_dec:{d}:f32mask"),
                &dec_source(d, 64, 64, 2, AttentionMaskKind::Array, Some(d), 0),
            );
        }
        for d in [DType::F16, DType::BF16, DType::F32, DType::F64] {
            for kind in kinds {
                let md = (kind == AttentionMaskKind::Array).then_some(DType::F32);
                check_compiles(&format!("test:attn_simt:{d}:{kind:?}"), &simt_source(d, 8, kind, md));
            }
            check_compiles(
                &format!("test:attn_simt:{d}:f64mask"),
                &simt_source(d, 1, AttentionMaskKind::Array, Some(DType::F64)),
            );
        }
    }
}
