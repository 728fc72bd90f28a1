//! The parts of attention's gradient (`Primitive::AttentionGrad`) on the GPU, in the
//! manner of FlashAttention-2's backward pass: no `[Tq, Tk]` matrix touches global memory.
//! Each kernel recomputes its tile's scores with `mma.sync.m16n8k16` (f32 accumulation)
//! and turns them into probabilities with the row log-sum-exp that `Stats` stored.
//!
//! | part | kernel |
//! |---|---|
//! | `Stats` | `k_attn_bwd_stats`: the forward kernel's walk over key tiles without `P V` (a running maximum and sum per row), then each row's `dO·o` |
//! | `Dq` | `k_attn_bwd_dq`: a block per 64 queries (16 a warp, `Q` and `dO` fragments in registers); per key tile `S = Q Kᵀ`, `dP = dO Vᵀ`, `dS = P ∘ (dP − delta)` and `dQ += dS K` |
//! | `Dkv` | `k_attn_bwd_dkv`: a block per 64 keys (16 a warp, `K` and `V` fragments in registers); per query tile of every query head of the group `Sᵀ = K Qᵀ`, `dPᵀ = V dOᵀ`, `dV += Pᵀ dO` and `dK += dSᵀ Q`; each key's sums stay in its warp's registers, so no atomics |
//!
//! f16 and bf16 with `D == Dv` a multiple of 16 up to 128, no mask or the causal one: the
//! cases `primitives/attention.rs` gives these nodes. P and dS are rounded to the inputs'
//! type before their products, as the forward rounds P. q, k, v, o and dO are read
//! through (batch, head, token) strides with the last axis contiguous (others are copied).

use cudarc::driver::LaunchConfig;

use crate::backend::Storage;
use crate::dtype::DType;
use crate::error::Result;
use crate::primitives::AttentionGradPart;
use crate::shape::Layout;

use super::attention::{PARAMS_SRC, attn_params, tc_helpers};
use super::buffer::new_storage;
use super::driver::GpuStream;
use super::launch::Launch;
use super::norm::elem_ptr;
use super::nvrtc;
use super::source::{PRELUDE, load};

/// Rows (queries or keys) a block owns, and the tile of the other side it walks.
const TILE: usize = 64;

/// The three kernels for inputs of `d` (f16 or bf16) with head dimension `dim`.
pub(crate) fn bwd_source(d: DType, dim: usize, causal: bool) -> String {
    let ab = if d == DType::BF16 { "bf16" } else { "f16" };
    let helpers = tc_helpers(ab);
    let causal = causal as i32;
    let (ldo, lo) = (load(d, "DO[row * p.ot + c]"), load(d, "O[row * p.mq + c]"));
    format!(
        r#"{PRELUDE}
{PARAMS_SRC}
{helpers}
#define D {dim}
#define SD (D + 8)
#define CAUSAL {causal}
#define LOG2E 1.4426950408889634f
#define LN2 0.6931471805599453f
#define POS_INF __int_as_float(0x7f800000u)
template <int N> __device__ __forceinline__ void zero(float (&s)[N][4]) {{
#pragma unroll
    for (int i = 0; i < N; ++i) {{ s[i][0] = s[i][1] = s[i][2] = s[i][3] = 0.f; }}
}}
// The A fragments of rows row0 .. row0 + 15 of a [.., D] tile in shared memory.
__device__ __forceinline__ void load_a(u32 (&f)[D / 16][4], const u16* sA, int row0, int lane) {{
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {{
        int row = row0 + (lane & 7) + ((lane >> 3) & 1) * 8, col = kk * 16 + (lane >> 4) * 8;
        ldm4(f[kk], smem(sA + row * SD + col));
    }}
}}
// s += A Bᵀ: A the warp's 16 rows (fragments over D), B a [64, D] tile in shared memory.
__device__ __forceinline__ void mma_abt(float (&s)[8][4], const u32 (&a)[D / 16][4], const u16* sB, int lane) {{
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {{
#pragma unroll
        for (int nb = 0; nb < 4; ++nb) {{
            u32 b[4];
            int row = nb * 16 + (lane & 7) + ((lane >> 4) << 3), col = kk * 16 + ((lane >> 3) & 1) * 8;
            ldm4(b, smem(sB + row * SD + col));
            mma(s[2 * nb], a[kk], b[0], b[1]);
            mma(s[2 * nb + 1], a[kk], b[2], b[3]);
        }}
    }}
}}
// o += P B: P the warp's 16 x 64 accumulators (rounded to the inputs' type), B a [64, D]
// tile in shared memory.
__device__ __forceinline__ void mma_ab(float (&o)[D / 8][4], const float (&p)[8][4], const u16* sB, int lane) {{
#pragma unroll
    for (int kk = 0; kk < 4; ++kk) {{
        u32 a[4] = {{ pack(p[2 * kk][0], p[2 * kk][1]), pack(p[2 * kk][2], p[2 * kk][3]),
                      pack(p[2 * kk + 1][0], p[2 * kk + 1][1]), pack(p[2 * kk + 1][2], p[2 * kk + 1][3]) }};
#pragma unroll
        for (int dn = 0; dn < D / 16; ++dn) {{
            u32 b[4];
            int row = kk * 16 + (lane & 7) + ((lane >> 3) & 1) * 8, col = dn * 16 + (lane >> 4) * 8;
            ldm4t(b, smem(sB + row * SD + col));
            mma(o[2 * dn], a, b[0], b[1]);
            mma(o[2 * dn + 1], a, b[2], b[3]);
        }}
    }}
}}
// The query block and (batch, head) plane of a block of the per-query kernels: query
// blocks in reverse, so under the causal mask the longest start first.
__device__ __forceinline__ void query_block(const AttnP& p, i64& q0, i64& bh) {{
    const i64 nqb = (p.tq + 63) / 64;
    const i64 bhn = (i64)gridDim.x / nqb;
    q0 = (nqb - 1 - (i64)blockIdx.x / bhn) * 64;
    bh = (i64)blockIdx.x % bhn;
}}
__device__ __forceinline__ i64 key_end(const AttnP& p, i64 q0) {{
    i64 kend = p.tk;
    if (CAUSAL) {{ i64 lim = q0 + 64 + p.tk - p.tq; if (lim < kend) kend = lim; }}
    return kend > 0 ? kend : 0;
}}
__device__ __forceinline__ bool masked(const AttnP& p, i64 row, i64 key) {{
    return key >= p.tk || (CAUSAL && key > row + p.tk - p.tq);
}}
// Each query row's natural log-sum-exp of its scaled scores (+inf when it attends no
// key) and dO·o, as [lse, delta] pairs. The `mask` slot of `p` addresses o, the output
// slot dO.
extern "C" __global__ void __launch_bounds__(128) k_attn_bwd_stats(float* stats, const u16* q, const u16* k, const u16* o, const u16* dout, AttnP p) {{
    __shared__ __align__(16) u16 sQ[64 * SD];
    __shared__ __align__(16) u16 sK[64 * SD];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    i64 q0, bh;
    query_block(p, q0, bh);
    i64 oq, okk, ov, om, oo;
    attn_offsets(p, bh, oq, okk, ov, om, oo);
    const u16* Q = q + oq; const u16* K = k + okk; const u16* O = o + om; const u16* DO = dout + oo;
    const i64 ntiles = (key_end(p, q0) + 63) / 64;
    load_tile(sQ, SD, Q, p.qt, q0, p.tq, 64, D);
    cp_commit(); cp_wait0(); __syncthreads();
    u32 qf[D / 16][4];
    load_a(qf, sQ, warp * 16, lane);
    const float sl2 = (float)p.scale * LOG2E;
    const i64 r0 = q0 + warp * 16 + (lane >> 2), r1 = r0 + 8;
    float m0 = NEG_INF, m1 = NEG_INF, l0 = 0.f, l1 = 0.f;
    for (i64 t = 0; t < ntiles; ++t) {{
        const i64 k0 = t * 64;
        __syncthreads();
        load_tile(sK, SD, K, p.kt, k0, p.tk, 64, D);
        cp_commit(); cp_wait0(); __syncthreads();
        float s[8][4];
        zero(s);
        mma_abt(s, qf, sK, lane);
        float mx0 = NEG_INF, mx1 = NEG_INF;
#pragma unroll
        for (int nb = 0; nb < 8; ++nb) {{
#pragma unroll
            for (int e = 0; e < 4; ++e) {{
                const i64 key = k0 + nb * 8 + 2 * (lane & 3) + (e & 1);
                float x = s[nb][e] * sl2;
                if (masked(p, e < 2 ? r0 : r1, key)) x = NEG_INF;
                s[nb][e] = x;
            }}
            mx0 = fmaxf(mx0, fmaxf(s[nb][0], s[nb][1]));
            mx1 = fmaxf(mx1, fmaxf(s[nb][2], s[nb][3]));
        }}
        mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 1));
        mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 2));
        mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 1));
        mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 2));
        const float n0 = fmaxf(m0, mx0), n1 = fmaxf(m1, mx1);
        // Every key so far masked: shift by 0 so exp2 gives 0, not NaN.
        const float u0 = n0 == NEG_INF ? 0.f : n0, u1 = n1 == NEG_INF ? 0.f : n1;
        float rs0 = 0.f, rs1 = 0.f;
#pragma unroll
        for (int nb = 0; nb < 8; ++nb) {{
            rs0 += exp2f(s[nb][0] - u0) + exp2f(s[nb][1] - u0);
            rs1 += exp2f(s[nb][2] - u1) + exp2f(s[nb][3] - u1);
        }}
        l0 = l0 * exp2f(m0 - u0) + rs0;
        l1 = l1 * exp2f(m1 - u1) + rs1;
        m0 = n0; m1 = n1;
    }}
    l0 += __shfl_xor_sync(0xffffffffu, l0, 1);
    l0 += __shfl_xor_sync(0xffffffffu, l0, 2);
    l1 += __shfl_xor_sync(0xffffffffu, l1, 1);
    l1 += __shfl_xor_sync(0xffffffffu, l1, 2);
    if ((lane & 3) == 0) {{
        if (r0 < p.tq) stats[(bh * p.tq + r0) * 2] = l0 > 0.f ? (m0 + log2f(l0)) * LN2 : POS_INF;
        if (r1 < p.tq) stats[(bh * p.tq + r1) * 2] = l1 > 0.f ? (m1 + log2f(l1)) * LN2 : POS_INF;
    }}
    for (int rr = 0; rr < 16; ++rr) {{
        const i64 row = q0 + warp * 16 + rr;
        if (row >= p.tq) break;
        float acc = 0.f;
        for (int c = lane; c < D; c += 32) acc += {ldo} * {lo};
#pragma unroll
        for (int sh = 16; sh > 0; sh >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, sh);
        if (lane == 0) stats[(bh * p.tq + row) * 2 + 1] = acc;
    }}
}}
// dq = scale * sum over keys of P ∘ (dO vᵀ − delta) k, a contiguous [planes, Tq, D].
extern "C" __global__ void __launch_bounds__(128) k_attn_bwd_dq(u16* dq, const u16* q, const u16* k, const u16* v, const u16* dout, const float* stats, AttnP p) {{
    __shared__ __align__(16) u16 sK[64 * SD];
    __shared__ __align__(16) u16 sV[64 * SD];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    i64 q0, bh;
    query_block(p, q0, bh);
    i64 oq, okk, ov, om, oo;
    attn_offsets(p, bh, oq, okk, ov, om, oo);
    const u16* K = k + okk; const u16* V = v + ov;
    load_tile(sK, SD, q + oq, p.qt, q0, p.tq, 64, D);
    load_tile(sV, SD, dout + oo, p.ot, q0, p.tq, 64, D);
    cp_commit(); cp_wait0(); __syncthreads();
    u32 qf[D / 16][4], df[D / 16][4];
    load_a(qf, sK, warp * 16, lane);
    load_a(df, sV, warp * 16, lane);
    const float sl2 = (float)p.scale * LOG2E;
    const i64 r0 = q0 + warp * 16 + (lane >> 2), r1 = r0 + 8;
    const float L0 = r0 < p.tq ? stats[(bh * p.tq + r0) * 2] * LOG2E : POS_INF;
    const float L1 = r1 < p.tq ? stats[(bh * p.tq + r1) * 2] * LOG2E : POS_INF;
    const float D0 = r0 < p.tq ? stats[(bh * p.tq + r0) * 2 + 1] : 0.f;
    const float D1 = r1 < p.tq ? stats[(bh * p.tq + r1) * 2 + 1] : 0.f;
    float acc[D / 8][4];
    zero(acc);
    const i64 ntiles = (key_end(p, q0) + 63) / 64;
    for (i64 t = 0; t < ntiles; ++t) {{
        const i64 k0 = t * 64;
        __syncthreads();
        load_tile(sK, SD, K, p.kt, k0, p.tk, 64, D);
        load_tile(sV, SD, V, p.vt, k0, p.tk, 64, D);
        cp_commit(); cp_wait0(); __syncthreads();
        float s[8][4], dp[8][4];
        zero(s); zero(dp);
        mma_abt(s, qf, sK, lane);
        mma_abt(dp, df, sV, lane);
#pragma unroll
        for (int nb = 0; nb < 8; ++nb) {{
#pragma unroll
            for (int e = 0; e < 4; ++e) {{
                const i64 key = k0 + nb * 8 + 2 * (lane & 3) + (e & 1);
                const bool lo = e < 2;
                const float pr = masked(p, lo ? r0 : r1, key) ? 0.f : exp2f(s[nb][e] * sl2 - (lo ? L0 : L1));
                s[nb][e] = pr * (dp[nb][e] - (lo ? D0 : D1));
            }}
        }}
        mma_ab(acc, s, sK, lane);
    }}
    const float sc = (float)p.scale;
#pragma unroll
    for (int dn = 0; dn < D / 8; ++dn) {{
        const int col = dn * 8 + 2 * (lane & 3);
        if (r0 < p.tq) *(u32*)(dq + (bh * p.tq + r0) * D + col) = pack(acc[dn][0] * sc, acc[dn][1] * sc);
        if (r1 < p.tq) *(u32*)(dq + (bh * p.tq + r1) * D + col) = pack(acc[dn][2] * sc, acc[dn][3] * sc);
    }}
}}
// dk (scaled) and dv of 64 keys of one key/value plane, summed over its query heads, into
// a contiguous [2, kv planes, Tk, D] (`half` elements apart).
extern "C" __global__ void __launch_bounds__(128) k_attn_bwd_dkv(u16* dkv, const u16* q, const u16* k, const u16* v, const u16* dout, const float* stats, AttnP p, i64 half) {{
    __shared__ __align__(16) u16 sA[64 * SD];
    __shared__ __align__(16) u16 sB[64 * SD];
    __shared__ float sL[64], sD[64];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const i64 nkb = (p.tk + 63) / 64;
    const i64 kvn = (i64)gridDim.x / nkb;
    const i64 kv = (i64)blockIdx.x % kvn, k0 = ((i64)blockIdx.x / kvn) * 64;
    const i64 group = p.hq / p.hkv, b = kv / p.hkv, hk = kv % p.hkv;
    i64 oq, okk, ov, om, oo;
    attn_offsets(p, b * p.hq + hk * group, oq, okk, ov, om, oo);
    load_tile(sA, SD, k + okk, p.kt, k0, p.tk, 64, D);
    load_tile(sB, SD, v + ov, p.vt, k0, p.tk, 64, D);
    cp_commit(); cp_wait0(); __syncthreads();
    u32 kf[D / 16][4], vf[D / 16][4];
    load_a(kf, sA, warp * 16, lane);
    load_a(vf, sB, warp * 16, lane);
    float gk[D / 8][4], gv[D / 8][4];
    zero(gk); zero(gv);
    const float sl2 = (float)p.scale * LOG2E;
    const i64 off = p.tk - p.tq;
    const i64 kr0 = k0 + warp * 16 + (lane >> 2), kr1 = kr0 + 8;
    // Under the causal mask the first query that sees key k0 is k0 - off.
    const i64 first = CAUSAL && k0 - off > 0 ? (k0 - off) / 64 : 0;
    const i64 nqb = (p.tq + 63) / 64;
    for (i64 g = 0; g < group; ++g) {{
        const i64 bh = b * p.hq + hk * group + g;
        attn_offsets(p, bh, oq, okk, ov, om, oo);
        for (i64 qb = first; qb < nqb; ++qb) {{
            const i64 q0 = qb * 64;
            __syncthreads();
            load_tile(sA, SD, q + oq, p.qt, q0, p.tq, 64, D);
            load_tile(sB, SD, dout + oo, p.ot, q0, p.tq, 64, D);
            cp_commit();
            if (threadIdx.x < 64) {{
                const i64 r = q0 + threadIdx.x;
                const bool ok = r < p.tq;
                sL[threadIdx.x] = ok ? stats[(bh * p.tq + r) * 2] * LOG2E : POS_INF;
                sD[threadIdx.x] = ok ? stats[(bh * p.tq + r) * 2 + 1] : 0.f;
            }}
            cp_wait0(); __syncthreads();
            float s[8][4], dp[8][4];
            zero(s); zero(dp);
            mma_abt(s, kf, sA, lane);
            mma_abt(dp, vf, sB, lane);
#pragma unroll
            for (int nb = 0; nb < 8; ++nb) {{
#pragma unroll
                for (int e = 0; e < 4; ++e) {{
                    const int qc = nb * 8 + 2 * (lane & 3) + (e & 1);
                    const i64 key = e < 2 ? kr0 : kr1;
                    const float pr = (CAUSAL && key > q0 + qc + off) ? 0.f : exp2f(s[nb][e] * sl2 - sL[qc]);
                    dp[nb][e] = pr * (dp[nb][e] - sD[qc]);
                    s[nb][e] = pr;
                }}
            }}
            mma_ab(gv, s, sB, lane);
            mma_ab(gk, dp, sA, lane);
        }}
    }}
    const float sc = (float)p.scale;
    u16* DK = dkv + kv * p.tk * D;
    u16* DV = DK + half;
#pragma unroll
    for (int dn = 0; dn < D / 8; ++dn) {{
        const int col = dn * 8 + 2 * (lane & 3);
        if (kr0 < p.tk) {{
            *(u32*)(DK + kr0 * D + col) = pack(gk[dn][0] * sc, gk[dn][1] * sc);
            *(u32*)(DV + kr0 * D + col) = pack(gv[dn][0], gv[dn][1]);
        }}
        if (kr1 < p.tk) {{
            *(u32*)(DK + kr1 * D + col) = pack(gk[dn][2] * sc, gk[dn][3] * sc);
            *(u32*)(DV + kr1 * D + col) = pack(gv[dn][2], gv[dn][3]);
        }}
    }}
}}
"#
    )
}

/// Part `part` of the gradient over inputs `q, k, v, o, do` (`Stats`) or `q, k, v, do,
/// stats`, into a new contiguous `shape` of `dtype`.
pub(crate) fn attention_grad(
    cs: &GpuStream<'_>,
    inputs: &[&Storage],
    scale: f64,
    causal: bool,
    part: AttentionGradPart,
    shape: &[usize],
    dtype: DType,
) -> Result<Storage> {
    const NAME: &str = "scaled_dot_product_attention_grad";
    let qs = inputs[0].layout.shape.clone();
    let r = qs.len();
    let nb = r - 3;
    let (hq, tq, dim) = (qs[nb], qs[nb + 1], qs[nb + 2]);
    let (hkv, tk) = (inputs[1].layout.shape[nb], inputs[1].layout.shape[nb + 1]);
    let dt = inputs[0].dtype;
    let fits = matches!(dt, DType::F16 | DType::BF16)
        && dim.is_multiple_of(16)
        && (16..=128).contains(&dim)
        && inputs[2].layout.shape[nb + 2] == dim;
    if !fits {
        return Err(super::unsupported(
            NAME,
            format!("f16 or bf16 with D == Dv a multiple of 16 up to 128, got {dt} with q {qs:?}"),
        ));
    }
    let out = new_storage(cs, dtype, shape)?;
    let planes: usize = qs[..nb + 1].iter().product();
    if shape.contains(&0) || planes == 0 || tq == 0 {
        return Ok(out);
    }
    // The last axis contiguous and every row 16-byte aligned (`cp.async`); others are copied.
    let fit = |s: &Storage| -> Result<Storage> {
        let l = &s.layout;
        let inner = l.shape[r - 1] <= 1 || l.strides[r - 1] == 1;
        let aligned = elem_ptr(s).is_multiple_of(16) && (0..r - 1).all(|a| l.shape[a] <= 1 || l.strides[a] % 8 == 0);
        if inner && aligned { Ok(s.clone()) } else { super::elementwise::copy(cs, s) }
    };
    let (q, k, v) = (fit(inputs[0])?, fit(inputs[1])?, fit(inputs[2])?);
    let key = format!("attn_bwd:{}:{dim}:{causal}", dt.name());
    let src = || bwd_source(dt, dim, causal);
    let sizes = [hq, hkv, tq, tk];
    let none = Layout { shape: qs.iter().copied().collect(), strides: smallvec::smallvec![0; r], offset: 0 };
    let (po, pq, pk, pv) = (elem_ptr(&out), elem_ptr(&q), elem_ptr(&k), elem_ptr(&v));
    let nqb = tq.div_ceil(TILE);
    // The kernel, its blocks, its parameter words and its pointer arguments (before the
    // words), and `Dkv`'s distance between dk and dv (after them).
    let (func, blocks, p, ptrs, half) = if part == AttentionGradPart::Stats {
        let (o, dout) = (fit(inputs[3])?, fit(inputs[4])?);
        let p = attn_params(&qs[..nb], [&q.layout, &k.layout, &v.layout, &o.layout, &dout.layout], sizes, scale);
        let f = nvrtc::function(cs.driver(), &cs.dev, &key, "k_attn_bwd_stats", src)?;
        (f, nqb * planes, p, vec![po, pq, pk, elem_ptr(&o), elem_ptr(&dout)], None)
    } else {
        let dout = fit(inputs[3])?;
        let st = inputs[4];
        let st = if st.layout.is_contiguous() { st.clone() } else { super::elementwise::copy(cs, st)? };
        let p = attn_params(&qs[..nb], [&q.layout, &k.layout, &v.layout, &none, &dout.layout], sizes, scale);
        let ptrs = vec![po, pq, pk, pv, elem_ptr(&dout), elem_ptr(&st)];
        if part == AttentionGradPart::Dq {
            let f = nvrtc::function(cs.driver(), &cs.dev, &key, "k_attn_bwd_dq", src)?;
            (f, nqb * planes, p, ptrs, None)
        } else {
            let kv_planes = planes / hq * hkv;
            let f = nvrtc::function(cs.driver(), &cs.dev, &key, "k_attn_bwd_dkv", src)?;
            (f, tk.div_ceil(TILE) * kv_planes, p, ptrs, Some((kv_planes * tk * dim) as i64))
        }
    };
    if blocks > i32::MAX as usize {
        return Err(super::unsupported(NAME, format!("{blocks} thread blocks (at most 2^31 - 1)")));
    }
    let cfg = LaunchConfig { grid_dim: (blocks as u32, 1, 1), block_dim: (128, 1, 1), shared_mem_bytes: 0 };
    let _ = cs.bind();
    let mut lb = Launch::new(&func);
    for a in &ptrs {
        lb.arg(a);
    }
    lb.arg_slice(&p);
    if let Some(h) = &half {
        lb.arg(h);
    }
    // SAFETY: the pointers address q, k, v, o, dO (through the strides in `p`, within
    // their storages' extents), the contiguous stats and the contiguous output of `shape`;
    // the arguments match the kernel's signature.
    unsafe { lb.launch(cs, cfg) }.map_err(|e| super::backend_err("launch", e))?;
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::cuda::nvrtc::check_compiles;

    #[test]
    fn attention_grad_kernels_compile() {
        for d in [DType::F16, DType::BF16] {
            for dim in [16, 48, 64, 128] {
                for causal in [false, true] {
                    if !check_compiles(&format!("test:attn_bwd:{d}:{dim}:{causal}"), &bwd_source(d, dim, causal)) {
                        return;
                    }
                }
            }
        }
    }
}
