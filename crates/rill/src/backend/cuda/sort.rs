//! Sort, argsort and top-k of each row of the last axis (`Primitive::Sort`).
//!
//! Values map to the unsigned keys of the CPU backend (`backend/cpu/sort.rs`: NaNs equal
//! and above `+inf`, `-0.0 == 0.0`, the complement for a descending order), 32-bit for
//! elements of up to 4 bytes and 64-bit for i64 and f64, and rows are sorted as
//! (key, position) pairs: unique, so the bitonic networks below (not stable by themselves)
//! give the stable order, the CPU's exactly. The input is read as contiguous rows (a
//! copy first when it is not).
//!
//! - Rows of at most [`tile`] elements: one block per row sorts the row, padded to a power
//!   of two, in shared memory (`k_sort_small`), and writes the first `k` of the order.
//! - A top-k of a longer row with `k <= tile`: one block per row finds the `k`-th key by
//!   a radix select (8 bits a pass, a shared histogram of the keys that match the prefix
//!   found so far), gathers the keys below it and the first ones equal to it in position
//!   order (a block scan), and sorts those `k` pairs in shared memory (`k_topk`). The row
//!   is read `bits / 8 + 1` times, never sorted.
//! - Longer rows: a bitonic sort over the row padded to a power of two `p`, in global
//!   scratch of `p` pairs per row: tiles sorted in shared memory (`k_sort_tiles`), then
//!   for each merge size above the tile the steps of a stride of at least a tile in
//!   global memory (`k_merge_global`, one launch each) and the smaller strides in shared
//!   memory (`k_merge_tiles`); `k_gather` writes the first `k` of the order. About 30
//!   launches for a 256k row.

use crate::backend::Storage;
use crate::dtype::DType;
use crate::error::Result;
use crate::primitives::SortSpec;
use crate::shape::numel;

use super::buffer::{CudaBuffer, new_storage};
use super::driver::GpuStream;
use super::launch::Launch;
use super::norm::elem_ptr;
use super::nvrtc::{self, grid_for};
use super::source::{PRELUDE, ctype};
use cudarc::driver::LaunchConfig;

/// Threads per block of the shared-memory kernels.
const THREADS: u32 = 1024;

/// Pairs a block sorts in shared memory: 48 KiB at most of keys and positions.
pub(crate) fn tile(d: DType) -> usize {
    if d.size() == 8 { 2048 } else { 4096 }
}

/// The C statements computing `K k` from the stored value `q` (ascending key).
fn key_body(d: DType) -> &'static str {
    match d {
        DType::F32 => "float f = q; K k = fkey(f);",
        DType::F16 => "float f = ld_f16(q); K k = fkey(f);",
        DType::BF16 => "float f = ld_bf16(q); K k = fkey(f);",
        DType::F64 => {
            "double f = q; u64 u = (f != f) ? 0x7ff8000000000000ull : (f == 0.0 ? 0ull : (u64)__double_as_longlong(f)); \
             K k = (u >> 63) ? ~u : (u | 0x8000000000000000ull);"
        }
        DType::I32 => "K k = (u32)q ^ 0x80000000u;",
        DType::I64 => "K k = (u64)q ^ 0x8000000000000000ull;",
        DType::U32 | DType::U8 | DType::Bool => "K k = (K)q;",
    }
}

/// The module of the sort kernels for dtype `d` (see the module docs).
pub(crate) fn sort_source(d: DType) -> String {
    let t = ctype(d);
    let wide = d.size() == 8;
    let k = if wide { "u64" } else { "u32" };
    let bits = if wide { 64 } else { 32 };
    let tile = tile(d);
    let body = key_body(d);
    format!(
        r#"{PRELUDE}
typedef {t} T;
typedef {k} K;
#define TILE {tile}
#define KBITS {bits}
#define KMAX (~(K)0)
__device__ __forceinline__ u32 fkey(float f) {{
    u32 u = (f != f) ? 0x7fc00000u : (f == 0.0f ? 0u : __float_as_uint(f));
    return (u >> 31) ? ~u : (u | 0x80000000u);
}}
__device__ __forceinline__ K key_of(T q, int desc) {{
    {body}
    return desc ? (K)~k : k;
}}
__device__ __forceinline__ bool lt(K ak, u32 ai, K bk, u32 bi) {{ return ak < bk || (ak == bk && ai < bi); }}
// The steps of merge size `k` from stride `j0` down to 1 over the `p` pairs in shared
// memory, whose first position in the whole row is `base` (a step's direction is bit `k`
// of the position: ascending where it is 0).
__device__ void steps(K* sk, u32* si, i64 p, i64 base, i64 k, i64 j0) {{
    for (i64 j = j0; j > 0; j >>= 1) {{
        for (i64 i = threadIdx.x; i < p; i += blockDim.x) {{
            i64 l = i ^ j;
            if (l > i) {{
                bool up = ((base + i) & k) == 0;
                K ak = sk[i], bk = sk[l];
                u32 ai = si[i], bi = si[l];
                if (lt(bk, bi, ak, ai) == up) {{ sk[i] = bk; sk[l] = ak; si[i] = bi; si[l] = ai; }}
            }}
        }}
        __syncthreads();
    }}
}}
// Pairs `start..start + p` of the row (positions past `n`: the largest pair).
__device__ void load_pairs(K* sk, u32* si, const T* row, i64 n, i64 start, i64 p, int desc) {{
    for (i64 i = threadIdx.x; i < p; i += blockDim.x) {{
        i64 g = start + i;
        if (g < n) {{ sk[i] = key_of(row[g], desc); si[i] = (u32)g; }}
        else {{ sk[i] = KMAX; si[i] = 0xffffffffu; }}
    }}
    __syncthreads();
}}
// Rows of `n <= TILE` elements (padded to `p`), one block per row; the first `kout` of the
// order into `vout` (values) or `iout` (positions), whichever is not null.
extern "C" __global__ void __launch_bounds__({THREADS}) k_sort_small(T* vout, i64* iout, const T* __restrict__ x, i64 rows, i64 n, i64 p, i64 kout, int desc) {{
    __shared__ K sk[TILE];
    __shared__ u32 si[TILE];
    for (i64 r = blockIdx.x; r < rows; r += gridDim.x) {{
        const T* row = x + r * n;
        load_pairs(sk, si, row, n, 0, p, desc);
        for (i64 k = 2; k <= p; k <<= 1) steps(sk, si, p, 0, k, k >> 1);
        for (i64 i = threadIdx.x; i < kout; i += blockDim.x) {{
            u32 j = si[i];
            if (iout) iout[r * kout + i] = (i64)j; else vout[r * kout + i] = row[j];
        }}
        __syncthreads();
    }}
}}
// The first pass of long rows: each tile of TILE pairs sorted in the direction the
// whole-row network gives it, into the scratch `gk`/`gi` (`p` pairs per row).
extern "C" __global__ void __launch_bounds__({THREADS}) k_sort_tiles(K* gk, u32* gi, const T* __restrict__ x, i64 rows, i64 n, i64 p, int desc) {{
    __shared__ K sk[TILE];
    __shared__ u32 si[TILE];
    i64 tiles = p / TILE;
    for (i64 it = blockIdx.x; it < rows * tiles; it += gridDim.x) {{
        i64 r = it / tiles, t = it - r * tiles;
        load_pairs(sk, si, x + r * n, n, t * TILE, TILE, desc);
        for (i64 k = 2; k <= TILE; k <<= 1) steps(sk, si, TILE, t * TILE, k, k >> 1);
        for (i64 i = threadIdx.x; i < TILE; i += blockDim.x) {{
            gk[r * p + t * TILE + i] = sk[i];
            gi[r * p + t * TILE + i] = si[i];
        }}
        __syncthreads();
    }}
}}
// One step (merge size `k`, stride `j >= TILE`) over the scratch, a thread per pair.
extern "C" __global__ void k_merge_global(K* gk, u32* gi, i64 rows, i64 p, i64 k, i64 j) {{
    i64 half = p >> 1;
    for (i64 t = (i64)blockIdx.x * blockDim.x + threadIdx.x; t < rows * half; t += (i64)gridDim.x * blockDim.x) {{
        i64 r = t / half, q = t - r * half;
        i64 i = ((q & ~(j - 1)) << 1) | (q & (j - 1));
        i64 l = i + j;
        bool up = (i & k) == 0;
        K* kr = gk + r * p;
        u32* ir = gi + r * p;
        K ak = kr[i], bk = kr[l];
        u32 ai = ir[i], bi = ir[l];
        if (lt(bk, bi, ak, ai) == up) {{ kr[i] = bk; kr[l] = ak; ir[i] = bi; ir[l] = ai; }}
    }}
}}
// The steps of merge size `k` with strides below TILE, a tile per block in shared memory.
extern "C" __global__ void __launch_bounds__({THREADS}) k_merge_tiles(K* gk, u32* gi, i64 rows, i64 p, i64 k) {{
    __shared__ K sk[TILE];
    __shared__ u32 si[TILE];
    i64 tiles = p / TILE;
    for (i64 it = blockIdx.x; it < rows * tiles; it += gridDim.x) {{
        i64 r = it / tiles, t = it - r * tiles;
        i64 o = r * p + t * TILE;
        for (i64 i = threadIdx.x; i < TILE; i += blockDim.x) {{ sk[i] = gk[o + i]; si[i] = gi[o + i]; }}
        __syncthreads();
        steps(sk, si, TILE, t * TILE, k, TILE >> 1);
        for (i64 i = threadIdx.x; i < TILE; i += blockDim.x) {{ gk[o + i] = sk[i]; gi[o + i] = si[i]; }}
        __syncthreads();
    }}
}}
// The first `kout` of each sorted scratch row, as values or positions.
extern "C" __global__ void k_gather(T* vout, i64* iout, const u32* __restrict__ gi, const T* __restrict__ x, i64 rows, i64 n, i64 p, i64 kout) {{
    for (i64 t = (i64)blockIdx.x * blockDim.x + threadIdx.x; t < rows * kout; t += (i64)gridDim.x * blockDim.x) {{
        i64 r = t / kout, i = t - r * kout;
        u32 j = gi[r * p + i];
        if (iout) iout[t] = (i64)j; else vout[t] = x[r * n + j];
    }}
}}
// Top-k (k <= TILE, padded to `kp`) of rows of any length, one block per row: a radix
// select of the k-th key, then the keys below it and the first equal ones (in position
// order) gathered and sorted in shared memory.
extern "C" __global__ void __launch_bounds__({THREADS}) k_topk(T* vout, i64* iout, const T* __restrict__ x, i64 rows, i64 n, i64 k, i64 kp, int desc) {{
    __shared__ K sk[TILE];
    __shared__ u32 si[TILE];
    __shared__ u32 hist[256];
    __shared__ u32 wsum[32];
    __shared__ K s_want;
    __shared__ u32 s_kk, s_lt, s_eq;
    int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = (blockDim.x + 31) >> 5;
    for (i64 r = blockIdx.x; r < rows; r += gridDim.x) {{
        const T* row = x + r * n;
        K want = 0, mask = 0;
        u32 kk = (u32)k;
        for (int shift = KBITS - 8; shift >= 0; shift -= 8) {{
            for (int b = threadIdx.x; b < 256; b += blockDim.x) hist[b] = 0u;
            __syncthreads();
            for (i64 i = threadIdx.x; i < n; i += blockDim.x) {{
                K key = key_of(row[i], desc);
                if ((key & mask) == want) atomicAdd(&hist[(u32)(key >> shift) & 255u], 1u);
            }}
            __syncthreads();
            if (threadIdx.x == 0) {{
                u32 cum = 0u;
                int b = 0;
                for (; b < 255; ++b) {{
                    if (cum + hist[b] >= kk) break;
                    cum += hist[b];
                }}
                s_want = want | ((K)b << shift);
                s_kk = kk - cum;
            }}
            __syncthreads();
            want = s_want;
            kk = s_kk;
            mask |= ((K)255) << shift;
            __syncthreads();
        }}
        // `want` is the k-th key; `kk` of the keys equal to it belong to the top k.
        u32 nlt = (u32)k - kk;
        if (threadIdx.x == 0) {{ s_lt = 0u; s_eq = 0u; }}
        __syncthreads();
        for (i64 c0 = 0; c0 < n; c0 += blockDim.x) {{
            i64 i = c0 + threadIdx.x;
            K key = KMAX;
            bool isl = false, ise = false;
            if (i < n) {{ key = key_of(row[i], desc); isl = key < want; ise = key == want; }}
            if (isl) {{ u32 pos = atomicAdd(&s_lt, 1u); sk[pos] = key; si[pos] = (u32)i; }}
            unsigned bal = __ballot_sync(0xffffffffu, ise);
            if (lane == 0) wsum[w] = __popc(bal);
            __syncthreads();
            u32 off = s_eq;
            for (int v = 0; v < w; ++v) off += wsum[v];
            u32 rank = off + __popc(bal & ((1u << lane) - 1u));
            if (ise && rank < kk) {{ sk[nlt + rank] = key; si[nlt + rank] = (u32)i; }}
            __syncthreads();
            if (threadIdx.x == 0) {{ for (int v = 0; v < nw; ++v) s_eq += wsum[v]; }}
            __syncthreads();
        }}
        for (i64 i = k + threadIdx.x; i < kp; i += blockDim.x) {{ sk[i] = KMAX; si[i] = 0xffffffffu; }}
        __syncthreads();
        for (i64 m = 2; m <= kp; m <<= 1) steps(sk, si, kp, 0, m, m >> 1);
        for (i64 i = threadIdx.x; i < k; i += blockDim.x) {{
            u32 j = si[i];
            if (iout) iout[r * k + i] = (i64)j; else vout[r * k + i] = row[j];
        }}
        __syncthreads();
    }}
}}
"#
    )
}

/// Which kernels a sort of `rows` rows of `n` keeping `kout` uses (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum SortPlan {
    /// The row in shared memory, padded to `p`.
    Small { p: usize },
    /// A radix select, then `k` pairs padded to `kp` sorted in shared memory.
    Select { kp: usize },
    /// The multi-pass network over rows padded to `p`.
    Long { p: usize },
}

/// The plan of a sort of rows of `n` elements of `d`, `k` of them kept for a top-k.
pub(crate) fn plan(d: DType, n: usize, k: Option<usize>) -> SortPlan {
    let t = tile(d);
    if n <= t {
        return SortPlan::Small { p: n.next_power_of_two() };
    }
    match k {
        Some(k) if k <= t => SortPlan::Select { kp: k.next_power_of_two() },
        _ => SortPlan::Long { p: n.next_power_of_two() },
    }
}

/// `Sort` of `x` along its last axis into a new contiguous storage of `shape`.
pub(crate) fn sort(cs: &GpuStream<'_>, x: &Storage, spec: &SortSpec, shape: &[usize]) -> Result<Storage> {
    let d = x.dtype;
    let out = new_storage(cs, if spec.indices { DType::I64 } else { d }, shape)?;
    let n = x.layout.shape.last().copied().unwrap_or(1);
    let kout = shape.last().copied().unwrap_or(1);
    if numel(shape) == 0 {
        return Ok(out);
    }
    let rows = numel(shape) / kout;
    let xs = if x.layout.is_contiguous() { x.clone() } else { super::elementwise::copy(cs, x)? };
    let key = format!("sort:{}", d.name());
    let get = |name: &str| nvrtc::function(cs.driver(), &cs.dev, &key, name, || sort_source(d));
    let (pv, pi) = if spec.indices { (0u64, elem_ptr(&out)) } else { (elem_ptr(&out), 0u64) };
    let px = elem_ptr(&xs);
    let (r64, n64, k64) = (rows as i64, n as i64, kout as i64);
    let desc = spec.descending as i32;
    let launch_err = |e| super::backend_err("launch", e);
    let blocks = |items: usize| LaunchConfig {
        grid_dim: (items.clamp(1, 1 << 30) as u32, 1, 1),
        block_dim: (THREADS, 1, 1),
        shared_mem_bytes: 0,
    };
    let _ = cs.bind();
    match plan(d, n, spec.k) {
        SortPlan::Small { p } => {
            let f = get("k_sort_small")?;
            let p64 = p as i64;
            let mut b = Launch::new(&f);
            b.arg(&pv).arg(&pi).arg(&px).arg(&r64).arg(&n64).arg(&p64).arg(&k64).arg(&desc);
            // SAFETY: `x` holds rows*n contiguous elements, the output rows*kout; p <= TILE.
            unsafe { b.launch(cs, blocks(rows)) }.map_err(launch_err)?;
        }
        SortPlan::Select { kp } => {
            let f = get("k_topk")?;
            let kp64 = kp as i64;
            let mut b = Launch::new(&f);
            b.arg(&pv).arg(&pi).arg(&px).arg(&r64).arg(&n64).arg(&k64).arg(&kp64).arg(&desc);
            // SAFETY: as above; kout <= kp <= TILE pairs in shared memory.
            unsafe { b.launch(cs, blocks(rows)) }.map_err(launch_err)?;
        }
        SortPlan::Long { p } => {
            let t = tile(d);
            let tiles = p / t;
            let ksize = if d.size() == 8 { 8 } else { 4 };
            let gk = CudaBuffer::alloc(cs, rows * p * ksize)?;
            let gi = CudaBuffer::alloc(cs, rows * p * 4)?;
            let (pk, pg) = (gk.ptr(), gi.ptr());
            let p64 = p as i64;
            let f = get("k_sort_tiles")?;
            let mut b = Launch::new(&f);
            b.arg(&pk).arg(&pg).arg(&px).arg(&r64).arg(&n64).arg(&p64).arg(&desc);
            // SAFETY: the scratch holds rows*p keys and positions; `x` rows*n elements.
            unsafe { b.launch(cs, blocks(rows * tiles)) }.map_err(launch_err)?;
            let (fg, ft) = (get("k_merge_global")?, get("k_merge_tiles")?);
            let mut k = 2 * t;
            while k <= p {
                let mut j = k / 2;
                let k64 = k as i64;
                while j >= t {
                    let j64 = j as i64;
                    let mut b = Launch::new(&fg);
                    b.arg(&pk).arg(&pg).arg(&r64).arg(&p64).arg(&k64).arg(&j64);
                    // SAFETY: each thread swaps two scratch pairs of one row, i < i + j < p.
                    unsafe { b.launch(cs, grid_for(rows * p / 2)) }.map_err(launch_err)?;
                    j /= 2;
                }
                let mut b = Launch::new(&ft);
                b.arg(&pk).arg(&pg).arg(&r64).arg(&p64).arg(&k64);
                // SAFETY: each block works on one tile of the scratch.
                unsafe { b.launch(cs, blocks(rows * tiles)) }.map_err(launch_err)?;
                k *= 2;
            }
            let f = get("k_gather")?;
            let mut b = Launch::new(&f);
            b.arg(&pv).arg(&pi).arg(&pg).arg(&px).arg(&r64).arg(&n64).arg(&p64).arg(&k64);
            // SAFETY: positions read are < n (the first kout <= n of each row are real).
            unsafe { b.launch(cs, grid_for(rows * kout)) }.map_err(launch_err)?;
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::cuda::nvrtc::check_compiles;

    #[test]
    fn sort_kernels_compile() {
        for d in crate::dtype::ALL_DTYPES {
            if !check_compiles(&format!("test:sort:{}", d.name()), &sort_source(d)) {
                return;
            }
        }
    }

    #[test]
    fn sort_plans() {
        assert_eq!(plan(DType::F32, 1, None), SortPlan::Small { p: 1 });
        assert_eq!(plan(DType::F32, 4096, None), SortPlan::Small { p: 4096 });
        assert_eq!(plan(DType::F32, 49_152, Some(50)), SortPlan::Select { kp: 64 });
        assert_eq!(plan(DType::F32, 49_152, None), SortPlan::Long { p: 65_536 });
        assert_eq!(plan(DType::I64, 2049, Some(2049)), SortPlan::Long { p: 4096 });
        assert_eq!(plan(DType::F64, 3000, Some(2048)), SortPlan::Select { kp: 2048 });
    }
}
