//! Arg-reductions and cumulative sums along one axis.
//!
//! Argmax/argmin read the input in place as `[outer, len, inner]` (`reduce::form`; a
//! contiguous copy with the axis last when the strides do not allow it), like the
//! reductions:
//! - the axis has stride 1 (rows): `g` lanes of a warp per row up to [`WARP_COLS`]
//!   elements (`k_awarp`), else a block per row (`k_ablock`), a row split over several
//!   blocks when the rows cannot fill the GPU, their partials combined by `k_afin`; the
//!   16-byte aligned middle of each row (or chunk) is read as vectors;
//! - the inner kept run has stride 1 (columns): each thread owns a column, or where the
//!   rows of each column group are 16-byte aligned a vector of consecutive columns
//!   (`k_acolv`), and walks the axis with coalesced loads (`k_acol`, the same blocks and
//!   grid-y split as the column reductions), the grid-y partials combined by `k_afin`.
//!
//! Each thread walks its elements in increasing index order, keeping the first NaN or
//! else the first strict maximum (minimum); partial results are combined with the index
//! as the tie-break (the smaller index of two NaNs or of two equal values wins), which
//! gives the CPU's rule (`backend/cpu/reduce/scan.rs`: the first NaN wins, otherwise the
//! first maximum or minimum) whatever the order of the combine. Values compare in f32 for
//! f16/bf16 (exact) and in their own type otherwise.
//!
//! Cumsum reads a contiguous copy as `[outer, len, inner]` and runs one thread per
//! `(outer, inner)` column, sequentially along `len` (neighbouring threads read
//! neighbouring elements when `inner > 1`). Floats accumulate in f32 (f64 for f64)
//! and are rounded to the dtype at each output, integers wrap in their own type.

use cudarc::driver::LaunchConfig;

use crate::backend::Storage;
use crate::dtype::DType;
use crate::error::Result;
use crate::primitives::ArgReduceOp;

use super::buffer::{CudaBuffer, new_storage};
use super::driver::GpuStream;
use super::launch::Launch;
use super::norm::elem_ptr;
use super::nvrtc::{self, grid_for};
use super::reduce::{Form, Read, WARP_ROWS, col_plan, col_vec, in_place, vec_elems};
use super::source::{PRELUDE, ctype, ftype, load, store_float, utype};

/// Rows up to this many elements are reduced by lanes of one warp each.
const WARP_COLS: usize = 1024;
/// Threads per block of `k_ablock`.
const ABLOCK: u32 = 256;

/// How an arg-reduction of `rows` rows of `cols` elements is launched.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ArgPlan {
    /// `lanes` lanes of a warp per row (a power of two, at most 32).
    Warp { lanes: u32 },
    /// Each row split into `splits` chunks of one block each (1: a block per row).
    Block { splits: usize },
}

/// The row plan of an arg-reduction on a GPU of `sms` SMs, `vn` elements per vector read.
pub(crate) fn arg_plan(rows: usize, cols: usize, vn: usize, sms: usize) -> ArgPlan {
    if cols <= WARP_COLS {
        // About one vector per lane: short rows leave no lanes idle.
        return ArgPlan::Warp { lanes: cols.div_ceil(vn).next_power_of_two().clamp(1, 32) as u32 };
    }
    if rows >= 2 * sms {
        return ArgPlan::Block { splits: 1 };
    }
    // Eight blocks per SM, chunks of at least 16 elements per thread.
    let want = (sms * 8).div_ceil(rows);
    let most = (cols / (ABLOCK as usize * 16)).max(1);
    ArgPlan::Block { splits: want.clamp(1, most) }
}

/// The C type values of `d` compare in.
fn val_type(d: DType) -> &'static str {
    if d.is_float() { ftype(d) } else { ctype(d) }
}

/// The arg-reduction module of `op` over `d`: `k_awarp`, `k_ablock`, `k_acol`, `k_afin`.
///
/// - `k_awarp(i64* out, const T* x, i64 ni, i64 s1, i64 s2, i64 rows, i64 cols, int g)`;
/// - `k_ablock(i64* out, V* pv, i64* pi, const T* x, i64 ni, i64 s1, i64 s2, i64 rows,
///   i64 cols, i64 splits)`, block item `r * splits + c` (partials there when splits > 1);
/// - `k_acol(i64* out, V* pv, i64* pi, const T* x, i64 cols, i64 ni, i64 s1, i64 red,
///   i64 sr)` on `(bx, by)` blocks and a `(gx, gy)` grid (partials at `y * cols + c` when
///   gy > 1);
/// - `k_afin(i64* out, const V* pv, const i64* pi, i64 n, i64 k, i64 so, i64 sk)`: output
///   `o` combines the `k` partials at `o * so + j * sk`.
///
/// Row `r` starts at `(r / ni) * s1 + (r % ni) * s2` and has stride 1; column `c` starts
/// at `(c / ni) * s1 + c % ni` and steps by `sr`.
fn arg_source(op: ArgReduceOp, d: DType) -> String {
    let t = ctype(d);
    let v = val_type(d);
    // The value is shuffled as its own type; only 1-byte integers widen to `int` (f16 and
    // bf16 values are already `float`: an `int` shuffle would truncate them).
    let shfl = if d.is_float() || d.size() >= 4 { v } else { "int" };
    let ld = load(d, "q");
    let better = if op == ArgReduceOp::ArgMax { "bv > av" } else { "bv < av" };
    let vn = vec_elems(d);
    format!(
        r#"{PRELUDE}
#define VN {vn}
template <typename E, int N> struct alignas(sizeof(E) * N) Vec {{ E v[N]; }};
typedef {t} T;
typedef {v} V;
__device__ __forceinline__ V ldv(T q) {{ return (V)({ld}); }}
// Merges (bv, bi) into (av, ai), in any order: index -1 is empty; the smaller index of
// two NaNs or two equal values wins.
__device__ __forceinline__ void comb(V& av, i64& ai, V bv, i64 bi) {{
    if (bi < 0) return;
    if (ai < 0) {{ av = bv; ai = bi; return; }}
    bool an = av != av, bn = bv != bv;
    if (an || bn) {{
        if (bn && (!an || bi < ai)) {{ av = bv; ai = bi; }}
        return;
    }}
    if (({better}) || (bv == av && bi < ai)) {{ av = bv; ai = bi; }}
}}
// Takes element `bi` (a later index than `ai`) when it is the first NaN or a strictly
// better value.
__device__ __forceinline__ void step(V& av, i64& ai, V bv, i64 bi) {{
    if (ai < 0 || (av == av && (bv != bv || {better}))) {{ av = bv; ai = bi; }}
}}
// A combine over groups of `g` lanes; valid in each group's first lane.
__device__ __forceinline__ void group_red(V& av, i64& ai, int g) {{
    for (int o = g >> 1; o > 0; o >>= 1) {{
        V bv = (V)__shfl_down_sync(0xffffffffu, ({shfl})av, o);
        i64 bi = __shfl_down_sync(0xffffffffu, ai, o);
        comb(av, ai, bv, bi);
    }}
}}
// The block's combine, valid in thread 0.
__device__ __forceinline__ void block_red(V& av, i64& ai, V* shv, i64* shi) {{
    int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    group_red(av, ai, 32);
    __syncthreads();
    if (lane == 0) {{ shv[w] = av; shi[w] = ai; }}
    __syncthreads();
    if (w == 0) {{
        int nw = (blockDim.x + 31) >> 5;
        av = lane < nw ? shv[lane] : (V)0;
        ai = lane < nw ? shi[lane] : -1;
        group_red(av, ai, 32);
    }}
}}
// Elements `j0 .. j1` of the row `p` shared by thread `tid` of `nt`: the elements before
// the first 16-byte boundary, then the aligned middle as 16-byte vectors (four in flight),
// then the tail. Each thread meets its elements in increasing index order, as `step`
// needs.
__device__ __forceinline__ void span(V& av, i64& ai, const T* __restrict__ p, i64 j0, i64 j1, i64 tid, i64 nt) {{
    i64 head = (i64)(((16u - ((u32)(u64)(p + j0) & 15u)) & 15u) / sizeof(T));
    if (head > j1 - j0) head = j1 - j0;
    i64 a0 = j0 + head;
    i64 nvec = (j1 - a0) / VN;
    i64 t0 = a0 + nvec * VN;
    for (i64 j = j0 + tid; j < a0; j += nt) {{ T q0 = p[j]; step(av, ai, ldv(q0), j); }}
    const Vec<T, VN>* pv = (const Vec<T, VN>*)(p + a0);
    i64 k = tid;
    for (; k + 3 * nt < nvec; k += 4 * nt) {{
        Vec<T, VN> q[4];
#pragma unroll
        for (int u = 0; u < 4; ++u) q[u] = pv[k + u * nt];
#pragma unroll
        for (int u = 0; u < 4; ++u)
#pragma unroll
            for (int e = 0; e < VN; ++e) step(av, ai, ldv(q[u].v[e]), a0 + (k + u * nt) * VN + e);
    }}
    for (; k < nvec; k += nt) {{
        Vec<T, VN> q0 = pv[k];
#pragma unroll
        for (int e = 0; e < VN; ++e) step(av, ai, ldv(q0.v[e]), a0 + k * VN + e);
    }}
    for (i64 j = t0 + tid; j < j1; j += nt) {{ T q0 = p[j]; step(av, ai, ldv(q0), j); }}
}}
// `g` lanes per row; a warp takes `32 / g` consecutive rows at a time (a warp-uniform loop).
extern "C" __global__ void k_awarp(i64* __restrict__ out, const T* __restrict__ x, i64 ni, i64 s1, i64 s2, i64 rows, i64 cols, int g) {{
{WARP_ROWS}
        V av = (V)0;
        i64 ai = -1;
        if (r < rows) span(av, ai, x + (r / ni) * s1 + (r % ni) * s2, 0, cols, sub, g);
        group_red(av, ai, g);
        if (sub == 0 && r < rows) out[r] = ai < 0 ? 0 : ai;
    }}
}}
extern "C" __global__ void __launch_bounds__({ABLOCK}) k_ablock(i64* __restrict__ out, V* __restrict__ pv, i64* __restrict__ pi, const T* __restrict__ x, i64 ni, i64 s1, i64 s2, i64 rows, i64 cols, i64 splits) {{
    __shared__ V shv[32];
    __shared__ i64 shi[32];
    i64 items = rows * splits;
    for (i64 it = blockIdx.x; it < items; it += gridDim.x) {{
        i64 r = it / splits, c = it - r * splits;
        V av = (V)0;
        i64 ai = -1;
        span(av, ai, x + (r / ni) * s1 + (r % ni) * s2, cols * c / splits, cols * (c + 1) / splits, threadIdx.x, blockDim.x);
        block_red(av, ai, shv, shi);
        if (threadIdx.x == 0) {{
            if (splits == 1) out[r] = ai < 0 ? 0 : ai;
            else {{ pv[it] = av; pi[it] = ai; }}
        }}
        __syncthreads(); // the shared slots are written again by the next item
    }}
}}
// Columns `c0 .. c0 + VC` (one column group: `ni % VC == 0`, every row of it 16-byte
// aligned when VC > 1) over rows `r0 + ty, + by, ..` below `r1` (in increasing order per
// thread, four rows in flight), then the block's `by` partials in a shared-memory tree.
template <int VC>
__device__ __forceinline__ void acol(i64* __restrict__ out, V* __restrict__ pv, i64* __restrict__ pi, const T* __restrict__ x, i64 cols, i64 ni, i64 s1, i64 red, i64 sr, V* shv, i64* shi) {{
    int tx = threadIdx.x, ty = threadIdx.y, bx = blockDim.x, by = blockDim.y;
    i64 c0 = ((i64)blockIdx.x * bx + tx) * VC;
    bool ok = c0 < cols;
    i64 gy = gridDim.y;
    i64 r0 = red * blockIdx.y / gy, r1 = red * (blockIdx.y + 1) / gy;
    V av[VC];
    i64 ai[VC];
#pragma unroll
    for (int k = 0; k < VC; ++k) {{ av[k] = (V)0; ai[k] = -1; }}
    if (ok) {{
        const T* p = x + (c0 / ni) * s1 + (c0 % ni);
        i64 r = r0 + ty;
        for (; r + 3 * by < r1; r += 4 * by) {{
            Vec<T, VC> q[4];
#pragma unroll
            for (int u = 0; u < 4; ++u) q[u] = *(const Vec<T, VC>*)(p + (r + u * by) * sr);
#pragma unroll
            for (int u = 0; u < 4; ++u)
#pragma unroll
                for (int k = 0; k < VC; ++k) step(av[k], ai[k], ldv(q[u].v[k]), r + u * by);
        }}
        for (; r < r1; r += by) {{
            Vec<T, VC> q0 = *(const Vec<T, VC>*)(p + r * sr);
#pragma unroll
            for (int k = 0; k < VC; ++k) step(av[k], ai[k], ldv(q0.v[k]), r);
        }}
    }}
    if (by > 1) {{
        int me = (ty * bx + tx) * VC;
#pragma unroll
        for (int k = 0; k < VC; ++k) {{ shv[me + k] = av[k]; shi[me + k] = ai[k]; }}
        __syncthreads();
        for (int s = by >> 1; s > 0; s >>= 1) {{
            if (ty < s) {{
                int you = ((ty + s) * bx + tx) * VC;
#pragma unroll
                for (int k = 0; k < VC; ++k) {{
                    comb(av[k], ai[k], shv[you + k], shi[you + k]);
                    shv[me + k] = av[k];
                    shi[me + k] = ai[k];
                }}
            }}
            __syncthreads();
        }}
    }}
    if (ty == 0 && ok) {{
#pragma unroll
        for (int k = 0; k < VC; ++k) {{
            i64 c = c0 + k;
            if (gy == 1) out[c] = ai[k] < 0 ? 0 : ai[k];
            else {{ pv[blockIdx.y * cols + c] = av[k]; pi[blockIdx.y * cols + c] = ai[k]; }}
        }}
    }}
}}
extern "C" __global__ void __launch_bounds__(256) k_acol(i64* __restrict__ out, V* __restrict__ pv, i64* __restrict__ pi, const T* __restrict__ x, i64 cols, i64 ni, i64 s1, i64 red, i64 sr) {{
    __shared__ V shv[256];
    __shared__ i64 shi[256];
    acol<1>(out, pv, pi, x, cols, ni, s1, red, sr, shv, shi);
}}
extern "C" __global__ void __launch_bounds__(256) k_acolv(i64* __restrict__ out, V* __restrict__ pv, i64* __restrict__ pi, const T* __restrict__ x, i64 cols, i64 ni, i64 s1, i64 red, i64 sr) {{
    __shared__ V shv[256 * VN];
    __shared__ i64 shi[256 * VN];
    acol<VN>(out, pv, pi, x, cols, ni, s1, red, sr, shv, shi);
}}
extern "C" __global__ void k_afin(i64* __restrict__ out, const V* __restrict__ pv, const i64* __restrict__ pi, i64 n, i64 k, i64 so, i64 sk) {{
    for (i64 o = (i64)blockIdx.x * blockDim.x + threadIdx.x; o < n; o += (i64)gridDim.x * blockDim.x) {{
        V av = (V)0;
        i64 ai = -1;
        for (i64 j = 0; j < k; ++j) comb(av, ai, pv[o * so + j * sk], pi[o * so + j * sk]);
        out[o] = ai < 0 ? 0 : ai;
    }}
}}
"#
    )
}

/// Argmax/argmin over `axis` into a new i64 storage of `shape` (`axis` set to 1).
pub(crate) fn arg_reduce(
    cs: &GpuStream<'_>,
    op: ArgReduceOp,
    x: &Storage,
    axis: usize,
    shape: &[usize],
) -> Result<Storage> {
    let d = x.dtype;
    let out = new_storage(cs, DType::I64, shape)?;
    let n_out: usize = shape.iter().product();
    if n_out == 0 || x.layout.shape[axis] == 0 {
        return Ok(out);
    }
    let (xs, f, read) = in_place(cs, x, &[axis])?;
    let key = format!("argreduce3:{op:?}:{}", d.name());
    let get = |name: &str| nvrtc::function(cs.driver(), &cs.dev, &key, name, || arg_source(op, d));
    let (po, px) = (elem_ptr(&out), elem_ptr(&xs));
    let sms = cs.dev.sms as usize;
    let vsize = if d.is_float() && d != DType::F64 { 4 } else { d.size() };
    let launch_err = |e| super::backend_err("launch", e);
    let Form { ni, s1, s2, red, sr, .. } = f;
    let (ni, red) = (ni as i64, red as i64);
    // Partial values and indices of `n` outputs by `k` chunks, and their combine.
    let parts = |n: usize, k: usize| -> Result<(CudaBuffer, CudaBuffer)> {
        Ok((CudaBuffer::alloc(cs, n * k * vsize)?, CudaBuffer::alloc(cs, n * k * 8)?))
    };
    let fin = |pv: &CudaBuffer, pi: &CudaBuffer, n: usize, k: usize, so: usize, sk: usize| -> Result<()> {
        let ff = get("k_afin")?;
        let (n64, k64, so, sk) = (n as i64, k as i64, so as i64, sk as i64);
        let (pvp, pip) = (pv.ptr(), pi.ptr());
        let mut b = Launch::new(&ff);
        b.arg(&po).arg(&pvp).arg(&pip).arg(&n64).arg(&k64).arg(&so).arg(&sk);
        // SAFETY: the partials hold n*k values and indices at o*so + j*sk, `out` n indices.
        unsafe { b.launch(cs, grid_for(n)) }.map_err(launch_err)
    };
    let _ = cs.bind();
    match read {
        Read::Cols => {
            let cols = n_out;
            // Consecutive columns per thread, loaded as one 16-byte vector, where every
            // row of every column group is aligned.
            let vc = col_vec(&f, px, vec_elems(d));
            let p = col_plan(cols, f.red, vc, sms);
            let fk = get(if vc > 1 { "k_acolv" } else { "k_acol" })?;
            let part = if p.gy > 1 { Some(parts(cols, p.gy as usize)?) } else { None };
            let (pvp, pip) = part.as_ref().map(|(a, b)| (a.ptr(), b.ptr())).unwrap_or((0, 0));
            let c64 = cols as i64;
            let mut b = Launch::new(&fk);
            b.arg(&po).arg(&pvp).arg(&pip).arg(&px).arg(&c64).arg(&ni).arg(&s1).arg(&red).arg(&sr);
            let cfg = LaunchConfig { grid_dim: (p.gx, p.gy, 1), block_dim: (p.bx, p.by, 1), shared_mem_bytes: 0 };
            // SAFETY: `x` addresses `(c / ni) * s1 + c % ni + r * sr` for c < cols, r < red
            // (its layout's form), 16-byte aligned for each group of `vc > 1` columns
            // (`col_vec`); `out` holds cols indices, the partials gy*cols each.
            unsafe { b.launch(cs, cfg) }.map_err(launch_err)?;
            if let Some((pv, pi)) = part {
                fin(&pv, &pi, cols, p.gy as usize, 1, cols)?;
            }
        }
        Read::Rows => {
            let rows = n_out;
            let (r64, c64) = (rows as i64, red);
            match arg_plan(rows, f.red, vec_elems(d), sms) {
                ArgPlan::Warp { lanes } => {
                    let fk = get("k_awarp")?;
                    let g = lanes as i32;
                    let per_block = (ABLOCK as usize / 32) * (32 / lanes as usize);
                    let grid = rows.div_ceil(per_block).clamp(1, sms * 64) as u32;
                    let mut b = Launch::new(&fk);
                    b.arg(&po).arg(&px).arg(&ni).arg(&s1).arg(&s2).arg(&r64).arg(&c64).arg(&g);
                    let cfg = LaunchConfig { grid_dim: (grid, 1, 1), block_dim: (ABLOCK, 1, 1), shared_mem_bytes: 0 };
                    // SAFETY: row r of `x` is the `cols` elements from (r / ni) * s1 +
                    // (r % ni) * s2 (its layout's form); `out` holds rows indices.
                    unsafe { b.launch(cs, cfg) }.map_err(launch_err)?;
                }
                ArgPlan::Block { splits } => {
                    let fk = get("k_ablock")?;
                    let part = if splits > 1 { Some(parts(rows, splits)?) } else { None };
                    let (pvp, pip) = part.as_ref().map(|(a, b)| (a.ptr(), b.ptr())).unwrap_or((0, 0));
                    let s64 = splits as i64;
                    let grid = (rows * splits).clamp(1, 1 << 30) as u32;
                    let mut b = Launch::new(&fk);
                    b.arg(&po).arg(&pvp).arg(&pip).arg(&px).arg(&ni).arg(&s1).arg(&s2).arg(&r64).arg(&c64).arg(&s64);
                    let cfg = LaunchConfig { grid_dim: (grid, 1, 1), block_dim: (ABLOCK, 1, 1), shared_mem_bytes: 0 };
                    // SAFETY: as for k_awarp; the partials hold rows*splits each.
                    unsafe { b.launch(cs, cfg) }.map_err(launch_err)?;
                    if let Some((pv, pi)) = part {
                        fin(&pv, &pi, rows, splits, splits, 1)?;
                    }
                }
            }
        }
    }
    Ok(out)
}

/// Cumulative sum along `axis` into a new contiguous storage of the input's shape and dtype.
pub(crate) fn cumsum(cs: &GpuStream<'_>, x: &Storage, axis: usize, reverse: bool, exclusive: bool) -> Result<Storage> {
    let d = x.dtype;
    let shape = x.layout.shape.clone();
    let out = new_storage(cs, d, &shape)?;
    let len = shape[axis];
    let inner: usize = shape[axis + 1..].iter().product();
    let outer: usize = shape[..axis].iter().product();
    let cols = outer * inner;
    if cols == 0 || len == 0 {
        return Ok(out);
    }
    let xs = if x.layout.is_contiguous() { x.clone() } else { super::elementwise::copy(cs, x)? };
    let t = ctype(d);
    let (acc, add, st) = if d.is_float() {
        (ftype(d), format!("a + {}", load(d, "v")), store_float(d, "a", d == DType::F64))
    } else if d == DType::Bool {
        ("u8", "(u8)(a != 0 || v != 0)".to_string(), "a".to_string())
    } else {
        let u = utype(d);
        (t, format!("({t})(({u})a + ({u})v)"), "a".to_string())
    };
    let key = format!("cumsum:{}", d.name());
    let src = move || {
        format!(
            r#"{PRELUDE}
extern "C" __global__ void k_scan({t}* out, const {t}* x, i64 outer, i64 len, i64 inner, i32 reverse, i32 exclusive) {{
    i64 cols = outer * inner;
    for (i64 c = (i64)blockIdx.x * blockDim.x + threadIdx.x; c < cols; c += (i64)blockDim.x * gridDim.x) {{
        i64 base = (c / inner) * len * inner + c % inner;
        const {t}* p = x + base;
        {t}* q = out + base;
        {acc} a = ({acc})0;
        for (i64 s = 0; s < len; ++s) {{
            i64 r = (reverse ? len - 1 - s : s) * inner;
            {t} v = p[r];
            if (exclusive) {{ q[r] = {st}; a = {add}; }}
            else {{ a = {add}; q[r] = {st}; }}
        }}
    }}
}}
"#
        )
    };
    let f = nvrtc::function(cs.driver(), &cs.dev, &key, "k_scan", src)?;
    let (po, px) = (elem_ptr(&out), elem_ptr(&xs));
    let (o64, l64, i64_) = (outer as i64, len as i64, inner as i64);
    let (rv, ex) = (reverse as i32, exclusive as i32);
    let _ = cs.bind();
    let mut b = Launch::new(&f);
    b.arg(&po).arg(&px).arg(&o64).arg(&l64).arg(&i64_).arg(&rv).arg(&ex);
    // SAFETY: `out` and `x` hold outer*len*inner contiguous elements; the arguments match
    // the kernel's signature.
    unsafe { b.launch(cs, grid_for(cols)) }.map_err(|e| super::backend_err("launch", e))?;
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::cuda::nvrtc::check_compiles;

    #[test]
    fn arg_kernels_compile() {
        for d in crate::dtype::ALL_DTYPES {
            for op in [ArgReduceOp::ArgMax, ArgReduceOp::ArgMin] {
                if !check_compiles(&format!("test:argreduce:{op:?}:{}", d.name()), &arg_source(op, d)) {
                    return;
                }
            }
        }
    }

    /// Over generated shapes: short rows take lanes of a warp (at least one element per
    /// lane), long rows a block, and few long rows split into chunks of real work.
    #[test]
    fn arg_plans() {
        let sizes = [1usize, 2, 3, 31, 32, 33, 1000, 1024, 1025, 4096, 65537, 1 << 20, 1 << 28];
        for sms in [1, 132] {
            for &rows in &sizes {
                for &cols in &sizes {
                    for vn in [1, 2, 4, 8, 16] {
                        match arg_plan(rows, cols, vn, sms) {
                            ArgPlan::Warp { lanes } => {
                                assert!(cols <= WARP_COLS && lanes.is_power_of_two() && lanes <= 32);
                                assert!((lanes as usize) < 2 * cols.div_ceil(vn));
                            }
                            ArgPlan::Block { splits } => {
                                assert!(cols > WARP_COLS && splits >= 1);
                                assert!(splits == 1 || (rows < 2 * sms && cols >= splits * ABLOCK as usize * 16));
                            }
                        }
                    }
                }
            }
        }
        assert_eq!(arg_plan(1, 1 << 28, 8, 132), ArgPlan::Block { splits: 1056 });
        assert_eq!(arg_plan(1 << 16, 4096, 8, 132), ArgPlan::Block { splits: 1 });
        assert_eq!(arg_plan(100, 5000, 8, 132), ArgPlan::Block { splits: 1 });
        assert_eq!(arg_plan(1 << 20, 10, 1, 132), ArgPlan::Warp { lanes: 16 });
        // bf16 rows of 10 take two lanes (a vector and a bit each), of 1024 all 32.
        assert_eq!(arg_plan(1 << 20, 10, 8, 132), ArgPlan::Warp { lanes: 2 });
        assert_eq!(arg_plan(1 << 10, 1024, 8, 132), ArgPlan::Warp { lanes: 32 });
        assert_eq!(arg_plan(1 << 10, 100, 4, 132), ArgPlan::Warp { lanes: 32 });
    }
}
