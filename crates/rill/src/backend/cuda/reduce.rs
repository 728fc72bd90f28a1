//! Reductions and fused softmax.
//!
//! A reduction of a stored array is first read in place as `[outer, red, inner]`
//! ([`form`]: the kept and reduced axes merge, by their strides, into at most three runs,
//! reduced in the middle), so no copy is made when
//! - the reduced run has stride 1 (a row reduction: output `o` reduces the row that starts
//!   at `(o / inner) * s1 + (o % inner) * s2`), or
//! - the inner kept run has stride 1 (a column reduction, `k_col*`: each thread owns one
//!   or, where rows are 16-byte aligned, a vector of consecutive inner columns and loops
//!   over `red` with coalesced loads; a block is `bx` column threads by `by` threads that
//!   split `red` and combine in a shared-memory tree; when the columns cannot fill the GPU
//!   `red` is also split over grid y into partials that `k_colfin` combines: up to 32
//!   columns a block, each column's partials split over the block's other threads in a
//!   fixed order).
//!
//! Anything else (reduced axes that merge into several runs, broadcast or negative
//! strides, strided rows of a full reduction) is copied with the reduced axes last.
//!
//! Sums and products accumulate in f32 for f16/bf16/f32 and f64 for f64, integers wrap in
//! their own type; max/min propagate NaN. Every combine happens in an order fixed by the
//! shape and the launch plan (no float atomics), so a result has the same bits every run.
//! Three launch shapes for rows, chosen from rows/cols and the number of SMs:
//! - short rows (`cols <= WARP_COLS`), and enough stored rows of up to [`WARP_ROW_BYTES`]
//!   to give every SM 32 warps: `g` lanes of a warp per row (`k_warp`, `g` from the row
//!   length, 16-byte vector loads of the aligned middle of each stored row);
//! - many long rows: one block per row (`k_block`, 16-byte vector loads of the aligned
//!   middle of each row, warp shuffles, one shared slot per warp);
//! - few long rows (a full reduction): each row is split over many blocks (for a stored
//!   array, [`SPLIT_BLOCK`] threads with eight vectors in flight each) that write
//!   partial results to a temporary buffer; the block that finishes a row's last chunk
//!   (counted with an atomic per row) combines that row's partials in index order and
//!   writes the result, so a full reduction is one kernel launch. The counters live with
//!   the stream (one per possible row, zeroed once) and the last block sets its row's back
//!   to zero; launches on one stream never overlap, so each launch starts from zeros.
//!
//! The row module's source is generated for one way of reading the elements ([`Elems`]): a
//! stored array, or values computed by generated code at each element (a fused
//! program's, see `fused.rs`), which `k_warp` and `k_block` read through the macro
//! `ELEM(j)` after declaring each row's state. Computed rows are read one element at a
//! time but combined in the order of the stored array's kernel: the plan of the stored
//! values' reduction ([`plan_stored`]), and within a row the same virtual 16-byte vectors,
//! accumulators, head and tail as if the values were stored contiguously (row `r` at
//! element `r * cols` of an aligned buffer). So a fused reduction gives the bits of the
//! values stored and then reduced, whether or not fusion ran. [`launch`] enqueues either
//! kind.
//!
//! Softmax of rows up to `1024 * 32` elements (16384 for f64) loads each row once into
//! registers (16-byte loads when rows are aligned), reduces the maximum and the sum of
//! exponentials across the block, and writes the row once; rows one warp holds are read
//! by `g` lanes each, several rows to a warp and eight warps to a block (`k_sub`). Longer rows use a generic
//! kernel with an online (max, sum) pair per thread that reads the row twice.

use cudarc::driver::{CudaFunction, LaunchConfig};

use crate::backend::Storage;
use crate::backend::cuda::fused_src::RowRead;
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::primitives::ReduceOp;
use crate::shape::Layout;

use super::buffer::{CudaBuffer, cuda_of, new_storage};
use super::driver::GpuStream;
use super::launch::Launch;
use super::nvrtc::{self, BLOCK};
use super::source::{PRELUDE, ctype, ftype, load, store_float, utype};

/// Rows up to this many elements are reduced by one warp each.
const WARP_COLS: usize = 1024;
/// Threads per block of the reduction kernels.
const RBLOCK: u32 = 256;
/// Threads per block of the sub-warp softmax (`k_sub`).
const SUB_BLOCK: u32 = 256;
/// The head of a kernel that gives `g` lanes of a warp (a power of two, at most 32, the
/// kernel's `int g`) to each of `rows` rows: it opens the warp-uniform loop over groups of
/// `32 / g` consecutive rows, with `lane`, `sub` (the lane within the row), `r` (the row)
/// in scope; the kernel closes the loop.
pub(crate) const WARP_ROWS: &str = "    int lane = threadIdx.x & 31, sub = lane & (g - 1);
    i64 per = 32 / g;
    i64 w = (blockIdx.x * (i64)blockDim.x + threadIdx.x) >> 5;
    i64 nw = ((i64)gridDim.x * blockDim.x) >> 5;
    for (i64 r0 = w * per; r0 < rows; r0 += nw * per) {
        i64 r = r0 + lane / g;";
/// Threads per block of a stored array's reduction split over many blocks (with eight
/// 16-byte vectors in flight per thread and four accumulators): enough loads in flight
/// to keep the memory busy; the fastest shape of a sweep over block sizes and vectors in
/// flight for a full sum (`rill bench sum`, docs/PERFORMANCE.md).
const SPLIT_BLOCK: u32 = 512;
/// Threads each SM is given by a split reduction.
const SPLIT_THREADS_PER_SM: usize = 2048;
/// `k_block`'s launch bound when it computes its elements ([`Elems::Computed`]): it is
/// launched with [`RBLOCK`] or [`SPLIT_BLOCK`] threads, but the larger bound caps
/// registers at 64 per thread, which makes the fused reductions faster (`rill bench
/// fused_reduce`); a stored array's reduction is faster with the bound of `SPLIT_BLOCK`,
/// so only this kernel has the larger bound.
const COMPUTED_BOUND: u32 = 1024;
/// Most elements one thread keeps in registers in the row-cached softmax.
const SOFTMAX_REG_ELEMS: usize = 32;

/// `x` with `axes` moved last, as a contiguous storage: (storage, rows, cols).
pub(crate) fn rows_last(cs: &GpuStream<'_>, x: &Storage, axes: &[usize]) -> Result<(Storage, usize, usize)> {
    let nd = x.layout.shape.len();
    let mut perm: Vec<usize> = (0..nd).filter(|a| !axes.contains(a)).collect();
    perm.extend_from_slice(axes);
    let v = x.with_layout(x.layout.permute(&perm));
    let v = if v.layout.is_contiguous() { v } else { super::elementwise::copy(cs, &v)? };
    let cols: usize = axes.iter().map(|&a| x.layout.shape[a]).product();
    let rows: usize = (0..nd).filter(|a| !axes.contains(a)).map(|a| x.layout.shape[a]).product();
    Ok((v, rows, cols))
}

/// The device address of a storage's first element.
fn elem_ptr(x: &Storage) -> u64 {
    cuda_of(x).map(|b| b.ptr()).unwrap_or(0) + (x.layout.offset * x.dtype.size()) as u64
}

/// Launches `k_rows(out, x, rows, cols)` of the module `key` with one block per row.
pub(crate) fn launch_rows(
    cs: &GpuStream<'_>,
    key: &str,
    src: impl FnOnce() -> String,
    out: u64,
    x: &Storage,
    rows: usize,
    cols: usize,
) -> Result<()> {
    if rows == 0 {
        return Ok(());
    }
    let f = nvrtc::function(cs.driver(), &cs.dev, key, "k_rows", src)?;
    let px = elem_ptr(x);
    let (r64, c64) = (rows as i64, cols as i64);
    let grid = rows.min(cs.dev.sms as usize * 32).max(1) as u32;
    let cfg = LaunchConfig { grid_dim: (grid, 1, 1), block_dim: (BLOCK, 1, 1), shared_mem_bytes: 0 };
    let _ = cs.bind();
    let mut b = Launch::new(&f);
    b.arg(&out).arg(&px).arg(&r64).arg(&c64);
    // SAFETY: `out` holds `rows` (or rows*cols) elements and `x` rows*cols contiguous ones.
    unsafe { b.launch(cs, cfg) }.map_err(|e| super::backend_err("launch", e))?;
    Ok(())
}

/// The pieces of a reduction kernel for one (op, dtype).
struct ReduceSpec {
    /// Stored C type.
    t: &'static str,
    /// Output C type (the stored type, or `float` for a widening f16/bf16 reduction).
    o: &'static str,
    /// Accumulator C type.
    acc: &'static str,
    /// The type an accumulator is shuffled as (`int` for 1-byte accumulators).
    shfl: &'static str,
    init: String,
    /// Combines accumulators `a` and `b`.
    combine: String,
    /// Converts a stored value `v` to an accumulator.
    ld: String,
    /// Stores an accumulator `a` as the output dtype.
    st: String,
}

fn reduce_spec(op: ReduceOp, d: DType) -> ReduceSpec {
    let t = ctype(d);
    if d.is_float() {
        let f = ftype(d);
        let inf =
            if f == "float" { "__int_as_float(0x7f800000)" } else { "__longlong_as_double(0x7ff0000000000000ll)" };
        let (init, combine) = match op {
            ReduceOp::Sum | ReduceOp::Mean => ("0".to_string(), "a + b".to_string()),
            ReduceOp::Prod => ("1".to_string(), "a * b".to_string()),
            ReduceOp::Max => (format!("-{inf}"), "((a != a || a > b) ? a : b)".to_string()),
            ReduceOp::Min => (inf.to_string(), "((a != a || a < b) ? a : b)".to_string()),
        };
        return ReduceSpec {
            t,
            o: t,
            acc: f,
            shfl: f,
            init,
            combine,
            ld: load(d, "v"),
            st: store_float(d, result(op), d == DType::F64),
        };
    }
    let u = utype(d);
    let (lo, hi) = match d {
        DType::I32 => ("(i32)0x80000000u", "(i32)0x7fffffff"),
        DType::I64 => ("(i64)0x8000000000000000ull", "(i64)0x7fffffffffffffffll"),
        DType::U32 => ("(u32)0", "(u32)0xffffffffu"),
        _ => ("(u8)0", "(u8)255"),
    };
    let (init, combine) = match op {
        ReduceOp::Sum if d == DType::Bool => ("0".to_string(), "(u8)(a != 0 || b != 0)".to_string()),
        ReduceOp::Prod if d == DType::Bool => ("1".to_string(), "(u8)(a != 0 && b != 0)".to_string()),
        // No integer mean is recorded (`reduce` refuses one): its ints sum.
        ReduceOp::Sum | ReduceOp::Mean => ("0".to_string(), format!("({t})(({u})a + ({u})b)")),
        ReduceOp::Prod => ("1".to_string(), format!("({t})(({u})a * ({u})b)")),
        ReduceOp::Max => (lo.to_string(), "(a > b ? a : b)".to_string()),
        ReduceOp::Min => (hi.to_string(), "(a < b ? a : b)".to_string()),
    };
    let shfl = if d.size() < 4 { "int" } else { t };
    ReduceSpec { t, o: t, acc: t, shfl, init, combine, ld: "v".to_string(), st: "a".to_string() }
}

/// The value a reduction stores, from its accumulator `a` and count `n`: a mean divides
/// the sum by the count in the accumulator's type (IEEE division, as a separate division
/// would), before the one rounding to the output dtype.
fn result(op: ReduceOp) -> &'static str {
    if op == ReduceOp::Mean { "(a / (A)n)" } else { "a" }
}

/// Elements of a 16-byte vector of `d`.
pub(crate) fn vec_elems(d: DType) -> usize {
    (16 / d.size()).max(1)
}

/// Where a reduction kernel reads the elements of its row-major `rows x cols` matrix.
pub(crate) enum Elems<'a> {
    /// A contiguous array `x` of the reduced dtype: `k_block` reads the 16-byte aligned
    /// middle of each row with vector loads.
    Array,
    /// Elements computed by generated code (a fused program, see
    /// [`crate::backend::cuda::fused_src::reduce_read`]), read one at a time.
    Computed(&'a RowRead),
}

impl Elems<'_> {
    /// (kernel data parameters, per-row statements, body of the `ELEM(j)` macro).
    fn parts(&self) -> (&str, &str, &str) {
        match self {
            Elems::Array => (
                "const T* __restrict__ x, i64 ni, i64 s1, i64 s2",
                "const T* p = x + (r / ni) * s1 + (r % ni) * s2;",
                "p[(j)]",
            ),
            Elems::Computed(r) => (&r.params, &r.row, &r.elem),
        }
    }
}

/// The reduction module: `k_warp` (a warp per row), `k_block` (a block per row chunk, to
/// the output, or to partials that the last block of each row combines). Element `j` of
/// row `r` is read as `e` says: the kernels declare the row's state (`{row}`, with `r` in
/// scope) and then read `ELEM(j)`, a value of the stored type `T`.
///
/// Kernel parameters: `k_warp(O* out, DATA, i64 rows, i64 cols)` and
/// `k_block(O* out, A* part, unsigned* count, DATA, i64 rows, i64 cols, i64 splits)`, where
/// `DATA` is `const T* x` for [`Elems::Array`] and [`RowRead::params`] for computed
/// elements.
fn reduce_source(s: &ReduceSpec, vn: usize, e: &Elems<'_>) -> String {
    let ReduceSpec { t, o, acc, shfl, init, combine, ld, st } = s;
    let (params, row, elem) = e.parts();
    // The data parameters and the comma after them (none for a program without inputs).
    let data = if params.is_empty() { String::new() } else { format!("{params}, ") };
    let decls = match e {
        Elems::Array => "",
        Elems::Computed(r) => &r.decls,
    };
    let bound = match e {
        Elems::Array => SPLIT_BLOCK,
        Elems::Computed(_) => COMPUTED_BOUND,
    };
    // This thread's share of chunk `c` of `splits` of row `r`, accumulated into `a`, and a
    // row's share of lane `sub` of `g`.
    let (chunk, warp_body) = match e {
        Elems::Array => (
            "a = chunk(p, cols, c, splits, threadIdx.x, blockDim.x);".to_string(),
            "a = chunk(p, cols, 0, 1, sub, g);".to_string(),
        ),
        Elems::Computed(_) => {
            (computed_chunk("c", "splits", "threadIdx.x", "blockDim.x"), computed_chunk("0", "1", "sub", "g"))
        }
    };
    format!(
        r#"{PRELUDE}
#define VN {vn}
template <typename T, int N> struct alignas(sizeof(T) * N) V {{ T v[N]; }};
typedef {t} T;
typedef {o} O;
typedef {acc} A;
{decls}
#define ELEM(j) ({elem})
__device__ __forceinline__ A comb(A a, A b) {{ return {combine}; }}
__device__ __forceinline__ A ldv(T v) {{ return (A)({ld}); }}
__device__ __forceinline__ O st(A a, i64 n) {{ return {st}; }}
__device__ __forceinline__ A warp_red(A a) {{
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) a = comb(a, (A)__shfl_down_sync(0xffffffffu, ({shfl})a, o));
    return a;
}}
// The block's reduction of `a`, valid in thread 0.
__device__ __forceinline__ A block_red(A a, A* sh) {{
    int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    a = warp_red(a);
    __syncthreads();
    if (lane == 0) sh[w] = a;
    __syncthreads();
    if (w == 0) {{
        int nw = (blockDim.x + 31) >> 5;
        a = lane < nw ? sh[lane] : (A)({init});
        a = warp_red(a);
    }}
    return a;
}}
// The share of thread `tid` of `nt` of chunk `c` of `splits` of the contiguous row `p`
// (`cols` elements): the 16-byte aligned middle of the row as vectors, split evenly;
// chunk 0 also takes the unaligned head and the tail.
__device__ __forceinline__ A chunk(const T* p, i64 cols, i64 c, i64 splits, i64 tid, i64 nt) {{
    A a = (A)({init});
    i64 head = (i64)(((16u - ((u32)(u64)p & 15u)) & 15u) / sizeof(T));
    if (head > cols) head = cols;
    i64 nvec = (cols - head) / VN;
    i64 v0 = nvec * c / splits, v1 = nvec * (c + 1) / splits;
    const V<T, VN>* pv = (const V<T, VN>*)(p + head);
    i64 bd = nt;
    i64 j = v0 + tid;
    // Eight vectors in flight per thread, then four, then one; four accumulators.
    A acc[4] = {{a, a, a, a}};
    for (; j + 7 * bd < v1; j += 8 * bd) {{
        V<T, VN> xs[8];
#pragma unroll
        for (int u = 0; u < 8; ++u) xs[u] = pv[j + u * bd];
#pragma unroll
        for (int u = 0; u < 8; ++u)
#pragma unroll
            for (int e = 0; e < VN; ++e) acc[(u * VN + e) & 3] = comb(acc[(u * VN + e) & 3], ldv(xs[u].v[e]));
    }}
    if (j + 3 * bd < v1) {{
        V<T, VN> xs[4];
#pragma unroll
        for (int u = 0; u < 4; ++u) xs[u] = pv[j + u * bd];
#pragma unroll
        for (int u = 0; u < 4; ++u)
#pragma unroll
            for (int e = 0; e < VN; ++e) acc[(u * VN + e) & 3] = comb(acc[(u * VN + e) & 3], ldv(xs[u].v[e]));
        j += 4 * bd;
    }}
    for (; j < v1; j += bd) {{
        V<T, VN> x0 = pv[j];
#pragma unroll
        for (int e = 0; e < VN; ++e) acc[e & 3] = comb(acc[e & 3], ldv(x0.v[e]));
    }}
    a = comb(comb(acc[0], acc[1]), comb(acc[2], acc[3]));
    if (c == 0) {{
        i64 t0 = head + nvec * VN;
        i64 extra = head + (cols - t0);
        for (i64 k = tid; k < extra; k += bd) {{
            T v = p[k < head ? k : t0 + (k - head)];
            a = comb(a, ldv(v));
        }}
    }}
    return a;
}}
// Item `it` of `rows * splits` is chunk `it % splits` of row `it / splits`. With one
// split the result is stored in `out`. Otherwise the chunk's result is stored as a
// partial in `part` and counted in `count[r]`; the block that counts a row's last chunk
// combines the row's partials in index order (the same order whichever block is last),
// stores the result and resets the counter for the stream's next launch.
extern "C" __global__ void __launch_bounds__({bound}) k_block(O* __restrict__ out, A* __restrict__ part, unsigned int* __restrict__ count, {data}i64 rows, i64 cols, i64 splits) {{
    __shared__ A sh[32];
    __shared__ int last;
    i64 items = rows * splits;
    for (i64 it = blockIdx.x; it < items; it += gridDim.x) {{
        i64 r = it / splits, c = it - r * splits;
        {row}
        A a = (A)({init});
        {chunk}
        a = block_red(a, sh);
        if (splits == 1) {{
            if (threadIdx.x == 0) out[r] = st(a, cols);
            continue;
        }}
        if (threadIdx.x == 0) {{
            part[it] = a;
            __threadfence(); // the partial is visible device-wide before it is counted
            last = atomicAdd(count + r, 1u) == (unsigned int)(splits - 1);
        }}
        __syncthreads();
        if (last) {{
            __threadfence();
            // Volatile: read from L2, where every other block's partial is.
            const volatile A* p = part + r * splits;
            A b = (A)({init});
            for (i64 j = threadIdx.x; j < splits; j += blockDim.x) b = comb(b, (A)p[j]);
            b = block_red(b, sh);
            if (threadIdx.x == 0) {{
                out[r] = st(b, cols);
                count[r] = 0u;
            }}
        }}
        __syncthreads(); // `last` and `sh` are written again by the next item
    }}
}}
// `g` lanes (a power of two, at most 32) per row: a warp reduces `32 / g` consecutive
// rows at a time. The row loop is warp-uniform, so the shuffles see all 32 lanes.
extern "C" __global__ void k_warp(O* __restrict__ out, {data}i64 rows, i64 cols, int g) {{
{WARP_ROWS}
        A a = (A)({init});
        if (r < rows) {{
            {row}
            {warp_body}
        }}
        for (int o = g >> 1; o > 0; o >>= 1) a = comb(a, (A)__shfl_down_sync(0xffffffffu, ({shfl})a, o));
        if (sub == 0 && r < rows) out[r] = st(a, cols);
    }}
}}
"#
    )
}

/// The statements that add the share of thread `tid` of `nt` in chunk `c` of `splits` of
/// row `r` of computed elements (`ELEM(j)`) into `a` (holding the identity), in exactly the
/// order `chunk` adds the same values stored contiguously in a 16-byte aligned buffer,
/// row `r` starting at element `r * cols`: the row's unaligned head and its tail one at a
/// time, the middle as virtual vectors of `VN` elements, eight, four, then one vector a
/// thread in flight, into the same four accumulators.
fn computed_chunk(c: &str, splits: &str, tid: &str, nt: &str) -> String {
    let group = |n: usize| {
        format!(
            r#"#pragma unroll
            for (int u = 0; u < {n}; ++u)
#pragma unroll
                for (int e = 0; e < VN; ++e) {{
                    T x_ = ELEM(head + (j + u * bd) * VN + e);
                    acc[(u * VN + e) & 3] = comb(acc[(u * VN + e) & 3], ldv(x_));
                }}"#
        )
    };
    let (g8, g4) = (group(8), group(4));
    format!(
        r#"{{
        i64 head = (i64)(((16u - ((u32)((u64)r * (u64)cols * sizeof(T)) & 15u)) & 15u) / sizeof(T));
        if (head > cols) head = cols;
        i64 nvec = (cols - head) / VN;
        i64 v0 = nvec * ({c}) / ({splits}), v1 = nvec * (({c}) + 1) / ({splits});
        i64 bd = {nt};
        i64 j = v0 + ({tid});
        A acc[4] = {{a, a, a, a}};
        for (; j + 7 * bd < v1; j += 8 * bd) {{
            {g8}
        }}
        if (j + 3 * bd < v1) {{
            {g4}
            j += 4 * bd;
        }}
        for (; j < v1; j += bd) {{
#pragma unroll
            for (int e = 0; e < VN; ++e) {{ T x_ = ELEM(head + j * VN + e); acc[e & 3] = comb(acc[e & 3], ldv(x_)); }}
        }}
        a = comb(comb(acc[0], acc[1]), comb(acc[2], acc[3]));
        if (({c}) == 0) {{
            i64 t0 = head + nvec * VN;
            i64 extra = head + (cols - t0);
            for (i64 k = {tid}; k < extra; k += bd) {{
                T x_ = ELEM(k < head ? k : t0 + (k - head));
                a = comb(a, ldv(x_));
            }}
        }}
    }}"#
    )
}

/// How a `rows x cols` reduction is launched.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Plan {
    /// `lanes` lanes of a warp per row (a power of two, at most 32).
    Warp { lanes: u32 },
    /// Each row split into `splits` chunks (1: one block per row), one block of
    /// `threads` each.
    Block { splits: usize, threads: u32 },
}

/// Rows a reduction split over several blocks has at most (fewer than `2 * sms`, see
/// [`plan`]): the number of a stream's row counters.
fn split_rows(sms: usize) -> usize {
    2 * sms
}

/// Rows per SM from which a stored array's rows longer than [`WARP_COLS`] (up to
/// [`warp_row_bytes`]) are still reduced by one warp each: enough warps to fill every SM.
const WARP_ROWS_PER_SM: usize = 32;
/// Bytes of a stored row up to which many rows go to a warp each rather than a block
/// each: a block's two barriers and its one or two vectors per thread cost more than a
/// warp's loop over 16 vectors per lane, with eight in flight.
const WARP_ROW_BYTES: usize = 8192;

/// [`WARP_ROW_BYTES`] unless `RILL_REDUCE_WARP_ROW_BYTES` says otherwise (a tuning knob
/// for comparing the two row plans; 0 keeps a block per long row).
pub(crate) fn warp_row_bytes() -> usize {
    static BYTES: crate::sync::OnceLock<usize> = crate::sync::OnceLock::new();
    *BYTES.get_or_init(|| {
        std::env::var("RILL_REDUCE_WARP_ROW_BYTES").ok().and_then(|v| v.parse().ok()).unwrap_or(WARP_ROW_BYTES)
    })
}

/// How a `rows x cols` reduction is launched: `vn` elements per vector read, `split`
/// threads per block when a row is split over several blocks, and `warp_cols`: the
/// longest rows that still go to a warp each when there are many of them (0 for none).
fn plan(rows: usize, cols: usize, vn: usize, sms: usize, split: u32, warp_cols: usize) -> Plan {
    if cols <= WARP_COLS || (cols <= warp_cols && rows >= sms * WARP_ROWS_PER_SM) {
        // About one vector per lane: short rows leave no lanes idle.
        let lanes = cols.div_ceil(vn).next_power_of_two().clamp(1, 32) as u32;
        return Plan::Warp { lanes };
    }
    if rows >= split_rows(sms) {
        return Plan::Block { splits: 1, threads: RBLOCK };
    }
    // Enough blocks to give every SM `SPLIT_THREADS_PER_SM` threads, and chunks of at
    // least four vectors per thread.
    let want = (sms * SPLIT_THREADS_PER_SM / split as usize).div_ceil(rows);
    let most = (cols / (split as usize * vn * 4)).max(1);
    match want.min(most).max(1) {
        1 => Plan::Block { splits: 1, threads: RBLOCK },
        splits => Plan::Block { splits, threads: split },
    }
}

/// The device address of `cs`'s row counters for split reductions ([`split_rows`]
/// zeros; allocated and zeroed in stream order on first use; each launch leaves them zero).
fn row_counters(cs: &GpuStream<'_>) -> Result<u64> {
    if let Some(b) = cs.reduce_counters.get() {
        return Ok(b.ptr());
    }
    let bytes = split_rows(cs.dev.sms as usize) * 4;
    let b = CudaBuffer::alloc(cs, bytes)?;
    // Through `stream()`: sent after the launches recorded so far, before the reduction's.
    let stream = cs.stream().cu_stream();
    // SAFETY: `b` holds `bytes` bytes; the memset is ordered on this stream before every
    // later kernel of the stream.
    unsafe { cs.driver().memset_d8_async(b.ptr(), 0, bytes, stream) }.map_err(|e| super::backend_err("reduce", e))?;
    // Batches of one stream run one at a time, so no other thread sets it meanwhile.
    Ok(cs.reduce_counters.get_or_init(|| b).ptr())
}

/// Blocks for `n` grid-stride items, capped.
fn blocks(n: usize, cap: usize) -> u32 {
    n.clamp(1, cap.min(i32::MAX as usize)) as u32
}

/// A reduction read in place from a strided array: output `o * ni + i` (`o < no`,
/// `i < ni`) reduces the elements at `o * s1 + r * sr + i * s2` (`r < red`), counted from
/// the array's first element.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Form {
    pub(crate) no: usize,
    pub(crate) red: usize,
    pub(crate) ni: usize,
    pub(crate) s1: i64,
    pub(crate) sr: i64,
    pub(crate) s2: i64,
}

/// How a [`Form`] is read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Read {
    /// The reduced run has stride 1: one row per output.
    Rows,
    /// The inner kept run has stride 1: threads own columns.
    Cols,
}

impl Form {
    /// Row-major `rows x cols` (a contiguous copy with the reduced axes last).
    pub(crate) fn rows(rows: usize, cols: usize) -> Form {
        Form { no: rows, red: cols, ni: 1, s1: cols as i64, sr: 1, s2: 0 }
    }

    /// How this form is read in place, if it can be.
    pub(crate) fn read(&self) -> Option<Read> {
        if self.sr == 1 || self.red == 1 {
            Some(Read::Rows)
        } else if self.s2 == 1 && self.ni > 1 {
            Some(Read::Cols)
        } else {
            None
        }
    }
}

/// The [`Form`] of reducing `axes` of a non-empty layout of `shape` and `strides`: size-1
/// axes are dropped and neighbouring axes merged where their strides chain; None unless
/// that leaves at most `[kept, reduced, kept]` runs with positive strides.
pub(crate) fn form(shape: &[usize], strides: &[isize], axes: &[usize]) -> Option<Form> {
    // (reduced, size, stride of the run's innermost axis)
    let mut runs: Vec<(bool, usize, i64)> = Vec::new();
    for (i, (&n, &st)) in shape.iter().zip(strides).enumerate() {
        if n == 1 {
            continue;
        }
        if n == 0 || st <= 0 {
            return None;
        }
        let (r, st) = (axes.contains(&i), st as i64);
        match runs.last_mut() {
            Some((lr, ln, ls)) if *lr == r && Some(*ls) == st.checked_mul(n as i64) => {
                *ln *= n;
                *ls = st;
            }
            _ => runs.push((r, n, st)),
        }
    }
    let f = |no, s1, red, sr, ni, s2| Some(Form { no, red, ni, s1, sr, s2 });
    match *runs.as_slice() {
        [] => f(1, 0, 1, 0, 1, 0),
        [(false, k, s)] => f(1, 0, 1, 0, k, s),
        [(true, r, sr)] => f(1, 0, r, sr, 1, 0),
        // A kept run of stride 1 outside a strided reduced run (a transposed view) is read
        // as columns.
        [(false, k, 1), (true, r, sr)] if sr != 1 => f(1, 0, r, sr, k, 1),
        [(false, k, s1), (true, r, sr)] => f(k, s1, r, sr, 1, 0),
        [(true, r, sr), (false, k, s2)] => f(1, 0, r, sr, k, s2),
        [(false, k1, s1), (true, r, sr), (false, k2, s2)] => f(k1, s1, r, sr, k2, s2),
        _ => None,
    }
}

/// `x` as a [`Form`] read in place, or (when it cannot be) a contiguous copy with the
/// reduced axes last and its row form.
pub(crate) fn in_place(cs: &GpuStream<'_>, x: &Storage, axes: &[usize]) -> Result<(Storage, Form, Read)> {
    if let Some(f) = form(&x.layout.shape, &x.layout.strides, axes)
        && let Some(read) = f.read()
    {
        return Ok((x.clone(), f, read));
    }
    let (xs, rows, cols) = rows_last(cs, x, axes)?;
    Ok((xs, Form::rows(rows, cols), Read::Rows))
}

/// Threads per block of the column kernels.
const CBLOCK: usize = 256;
/// Most column threads of a column block (the rest of the block splits the reduced axis).
const CBX: usize = 64;

/// How a column reduction is launched: blocks of `bx` column threads (each owning `vc`
/// consecutive columns) by `by` threads that split the reduced axis, on a `gx x gy` grid
/// (`gy > 1`: the reduced axis split into `gy` chunks whose partials are combined in order).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ColPlan {
    pub(crate) bx: u32,
    pub(crate) by: u32,
    pub(crate) gx: u32,
    pub(crate) gy: u32,
    pub(crate) vc: usize,
}

/// The column plan of `cols` columns reduced over `red` rows, `vc` columns per thread.
pub(crate) fn col_plan(cols: usize, red: usize, vc: usize, sms: usize) -> ColPlan {
    let tx = cols.div_ceil(vc).max(1);
    let bx = tx.next_power_of_two().min(CBX);
    let by = CBLOCK / bx;
    let gx = tx.div_ceil(bx);
    // Enough blocks for eight per SM, each chunk at least 16 rows per thread.
    let want = (sms * 8).div_ceil(gx);
    let most = (red / (by * 16)).clamp(1, 65535);
    let gy = want.clamp(1, most);
    ColPlan { bx: bx as u32, by: by as u32, gx: gx.min(i32::MAX as usize) as u32, gy: gy as u32, vc }
}

/// Threads of a `k_colfin` block.
const FIN_BLOCK: usize = 512;

/// The launch of `k_colfin` over `cols` columns of `gy` partials: up to 32 columns a block
/// and the rest of its threads splitting each column's partials (at most one each).
fn fin_config(cols: usize, gy: usize) -> LaunchConfig {
    let bx = cols.next_power_of_two().min(32);
    let by = (FIN_BLOCK / bx).min(gy.next_power_of_two());
    let gx = cols.div_ceil(bx).min(i32::MAX as usize);
    LaunchConfig { grid_dim: (gx as u32, 1, 1), block_dim: (bx as u32, by as u32, 1), shared_mem_bytes: 0 }
}

/// Columns per thread of a column read: a 16-byte vector when every row of every column
/// group starts aligned.
pub(crate) fn col_vec(f: &Form, px: u64, vn: usize) -> usize {
    let vn64 = vn as i64;
    let aligned = px.is_multiple_of(16)
        && f.ni.is_multiple_of(vn)
        && (f.no == 1 || f.s1 % vn64 == 0)
        && (f.red == 1 || f.sr % vn64 == 0);
    if aligned { vn } else { 1 }
}

/// The column module: `k_col1` (one column per thread), `k_colv` (`VN` consecutive columns
/// per thread, 16-byte loads) and `k_colfin` (the fixed-order combine of grid-y partials).
///
/// `k_col*(O* out, A* part, const T* x, i64 cols, i64 ni, i64 s1, i64 red, i64 sr)`,
/// launched with a `(bx, by)` block (`by` a power of two) on a `(gx, gy)` grid; with
/// `gy == 1` it writes `out`, else `part[y * cols + c]`. `k_colfin(O* out, const A* part,
/// i64 cols, i64 gy, i64 red)`, launched by [`fin_config`].
fn col_source(s: &ReduceSpec, vn: usize) -> String {
    let ReduceSpec { t, o, acc, init, combine, ld, st, .. } = s;
    format!(
        r#"{PRELUDE}
#define VN {vn}
template <typename T, int N> struct alignas(sizeof(T) * N) V {{ T v[N]; }};
typedef {t} T;
typedef {o} O;
typedef {acc} A;
__device__ __forceinline__ A comb(A a, A b) {{ return {combine}; }}
__device__ __forceinline__ A ldv(T v) {{ return (A)({ld}); }}
__device__ __forceinline__ O st(A a, i64 n) {{ return {st}; }}
// Each thread's `VC` values, combined over the block's `by` rows of threads in a
// shared-memory tree (a fixed order); row `ty == 0` ends with the results.
template <int VC>
__device__ __forceinline__ void tree(A (&a)[VC], A* sh) {{
    int tx = threadIdx.x, ty = threadIdx.y, bx = blockDim.x, by = blockDim.y;
    if (by == 1) return;
    int me = (ty * bx + tx) * VC;
#pragma unroll
    for (int k = 0; k < VC; ++k) sh[me + k] = a[k];
    __syncthreads();
    for (int s = by >> 1; s > 0; s >>= 1) {{
        if (ty < s) {{
            int you = ((ty + s) * bx + tx) * VC;
#pragma unroll
            for (int k = 0; k < VC; ++k) {{ a[k] = comb(a[k], sh[you + k]); sh[me + k] = a[k]; }}
        }}
        __syncthreads();
    }}
}}
// Columns `c0 .. c0 + VC` (one column group: `ni % VC == 0`) over rows `r0 + ty, + by, ..`
// below `r1`, four rows in flight in four accumulators; then the block's `by` partials of
// each column in a shared-memory tree (a fixed order).
template <int VC>
__device__ __forceinline__ void col(O* __restrict__ out, A* __restrict__ part, const T* __restrict__ x, i64 cols, i64 ni, i64 s1, i64 red, i64 sr, A* sh) {{
    int tx = threadIdx.x, ty = threadIdx.y, bx = blockDim.x, by = blockDim.y;
    i64 c0 = ((i64)blockIdx.x * bx + tx) * VC;
    bool ok = c0 < cols;
    i64 gy = gridDim.y;
    i64 r0 = red * blockIdx.y / gy, r1 = red * (blockIdx.y + 1) / gy;
    A a[VC];
#pragma unroll
    for (int k = 0; k < VC; ++k) a[k] = (A)({init});
    if (ok) {{
        const T* p = x + (c0 / ni) * s1 + (c0 % ni);
        A b[3][VC];
#pragma unroll
        for (int k = 0; k < VC; ++k) {{ b[0][k] = a[k]; b[1][k] = a[k]; b[2][k] = a[k]; }}
        i64 r = r0 + ty;
        for (; r + 3 * by < r1; r += 4 * by) {{
            V<T, VC> q0 = *(const V<T, VC>*)(p + r * sr);
            V<T, VC> q1 = *(const V<T, VC>*)(p + (r + by) * sr);
            V<T, VC> q2 = *(const V<T, VC>*)(p + (r + 2 * by) * sr);
            V<T, VC> q3 = *(const V<T, VC>*)(p + (r + 3 * by) * sr);
#pragma unroll
            for (int k = 0; k < VC; ++k) {{
                a[k] = comb(a[k], ldv(q0.v[k]));
                b[0][k] = comb(b[0][k], ldv(q1.v[k]));
                b[1][k] = comb(b[1][k], ldv(q2.v[k]));
                b[2][k] = comb(b[2][k], ldv(q3.v[k]));
            }}
        }}
        for (; r < r1; r += by) {{
            V<T, VC> q0 = *(const V<T, VC>*)(p + r * sr);
#pragma unroll
            for (int k = 0; k < VC; ++k) a[k] = comb(a[k], ldv(q0.v[k]));
        }}
#pragma unroll
        for (int k = 0; k < VC; ++k) a[k] = comb(comb(a[k], b[0][k]), comb(b[1][k], b[2][k]));
    }}
    tree<VC>(a, sh);
    if (ty == 0 && ok) {{
        if (gy == 1) {{
#pragma unroll
            for (int k = 0; k < VC; ++k) out[c0 + k] = st(a[k], red);
        }} else {{
            A* q = part + (i64)blockIdx.y * cols + c0;
#pragma unroll
            for (int k = 0; k < VC; ++k) q[k] = a[k];
        }}
    }}
}}
extern "C" __global__ void __launch_bounds__({CBLOCK}) k_col1(O* __restrict__ out, A* __restrict__ part, const T* __restrict__ x, i64 cols, i64 ni, i64 s1, i64 red, i64 sr) {{
    __shared__ A sh[{CBLOCK}];
    col<1>(out, part, x, cols, ni, s1, red, sr, sh);
}}
extern "C" __global__ void __launch_bounds__({CBLOCK}) k_colv(O* __restrict__ out, A* __restrict__ part, const T* __restrict__ x, i64 cols, i64 ni, i64 s1, i64 red, i64 sr) {{
    __shared__ A sh[{CBLOCK} * VN];
    col<VN>(out, part, x, cols, ni, s1, red, sr, sh);
}}
// Column `c`'s `gy` partials of `red` rows: a block is `bx` columns by `by` threads (a
// power of two); thread `ty` combines partials ty, ty + by, .. in order, then the tree.
extern "C" __global__ void __launch_bounds__({FIN_BLOCK}) k_colfin(O* __restrict__ out, const A* __restrict__ part, i64 cols, i64 gy, i64 red) {{
    __shared__ A sh[{FIN_BLOCK}];
    const int ty = threadIdx.y, by = blockDim.y;
    const i64 c = (i64)blockIdx.x * blockDim.x + threadIdx.x;
    A a[1] = {{ (A)({init}) }};
    if (c < cols) {{
#pragma unroll 4
        for (i64 y = ty; y < gy; y += by) a[0] = comb(a[0], part[y * cols + c]);
    }}
    tree<1>(a, sh);
    if (ty == 0 && c < cols) out[c] = st(a[0], red);
}}
"#
    )
}

/// Bytes of a reduction accumulator of `d`.
fn acc_size(d: DType) -> usize {
    match d {
        DType::F16 | DType::BF16 => 4,
        _ => d.size(),
    }
}

/// Enqueues the column reduction of `x` (read as `f`, [`Read::Cols`]) into `po`.
fn launch_cols(cs: &GpuStream<'_>, op: ReduceOp, d: DType, po: u64, px: u64, f: &Form) -> Result<()> {
    let cols = f.no * f.ni;
    let vn = vec_elems(d);
    let vc = col_vec(f, px, vn);
    let p = col_plan(cols, f.red, vc, cs.dev.sms as usize);
    let key = format!("reduce_col:{op:?}:{}", d.name());
    let src = || col_source(&reduce_spec(op, d), vn);
    let kernel = if vc > 1 { "k_colv" } else { "k_col1" };
    let fk = nvrtc::function(cs.driver(), &cs.dev, &key, kernel, src)?;
    let part = if p.gy > 1 { Some(CudaBuffer::alloc(cs, p.gy as usize * cols * acc_size(d))?) } else { None };
    let pp = part.as_ref().map(|b| b.ptr()).unwrap_or(0);
    let (c64, ni, s1, red, sr) = (cols as i64, f.ni as i64, f.s1, f.red as i64, f.sr);
    let launch_err = |e| super::backend_err("launch", e);
    let _ = cs.bind();
    let mut b = Launch::new(&fk);
    b.arg(&po).arg(&pp).arg(&px).arg(&c64).arg(&ni).arg(&s1).arg(&red).arg(&sr);
    let cfg = LaunchConfig { grid_dim: (p.gx, p.gy, 1), block_dim: (p.bx, p.by, 1), shared_mem_bytes: 0 };
    // SAFETY: `x` addresses `(c / ni) * s1 + c % ni + r * sr` for every column c < cols and
    // r < red (the form of its layout); `out` holds `cols` elements and `part` gy*cols
    // accumulators (untouched with one chunk).
    unsafe { b.launch(cs, cfg) }.map_err(launch_err)?;
    if let Some(part) = part {
        let ff = nvrtc::function(cs.driver(), &cs.dev, &key, "k_colfin", src)?;
        let gy = p.gy as i64;
        let mut b = Launch::new(&ff);
        b.arg(&po).arg(&pp).arg(&c64).arg(&gy).arg(&red);
        // SAFETY: `part` holds gy*cols accumulators written by the launch before, `out`
        // `cols` elements.
        unsafe { b.launch(cs, fin_config(cols, p.gy as usize)) }.map_err(launch_err)?;
        drop(part);
    }
    Ok(())
}

pub(crate) fn reduce(
    cs: &GpuStream<'_>,
    op: ReduceOp,
    x: &Storage,
    axes: &[usize],
    shape: &[usize],
) -> Result<Storage> {
    let d = x.dtype;
    if op == ReduceOp::Mean && !d.is_float() {
        return Err(super::unsupported("reduce", format!("{op:?} of {d}")));
    }
    let out = new_storage(cs, d, shape)?;
    let rows: usize = shape.iter().product();
    if rows == 0 {
        return Ok(out);
    }
    let po = cuda_of(&out).map(|b| b.ptr()).unwrap_or(0);
    // An empty reduction is a row reduction of empty rows (each output the identity).
    let (xs, f, read) =
        if x.layout.numel() == 0 { (x.clone(), Form::rows(rows, 0), Read::Rows) } else { in_place(cs, x, axes)? };
    let px = elem_ptr(&xs);
    if read == Read::Cols {
        launch_cols(cs, op, d, po, px, &f)?;
        return Ok(out);
    }
    let key = format!("reduce3:{op:?}:{}", d.name());
    let dev = &cs.dev;
    let mut src = Some(move || reduce_source(&reduce_spec(op, d), vec_elems(d), &Elems::Array));
    let mut get =
        |name: &str| nvrtc::function(cs.driver(), dev, &key, name, || src.take().map(|f| f()).unwrap_or_default());
    let how = plan_stored(rows, f.red, d, dev.sms as usize);
    launch(cs, &mut get, d, how, po, &[px], &[f.ni as i64, f.s1, f.s2], rows, f.red)?;
    Ok(out)
}

/// The launch plan of a row reduction of `rows x cols` elements of `d`: the plan of a
/// stored array's rows, which computed rows of the same values take too (so both combine
/// in one order).
pub(crate) fn plan_stored(rows: usize, cols: usize, d: DType, sms: usize) -> Plan {
    plan(rows, cols, vec_elems(d), sms, SPLIT_BLOCK, warp_row_bytes() / d.size())
}

/// The names of the reduction module's kernels, in the order [`launch`] may ask for them.
pub(crate) const KERNELS: [&str; 2] = ["k_warp", "k_block"];

/// The reduction module of `op` over `d` reading its elements as `e` says (the source
/// [`launch`] expects; the backend's prelude included).
pub(crate) fn source(op: ReduceOp, d: DType, e: &Elems<'_>) -> String {
    reduce_source(&reduce_spec(op, d), vec_elems(d), e)
}

/// Enqueues a `rows x cols` reduction (`rows > 0`) of the reduced dtype `d` into `out`
/// (`rows` elements) as `how` says, with the kernels `get` returns by name (from a
/// module of [`reduce_source`]). The kernels' data parameters are the pointers `ptrs`
/// followed by the integers `ints` (`x` for an array; a program's inputs and row strides
/// for computed elements).
#[allow(clippy::too_many_arguments)]
pub(crate) fn launch(
    cs: &GpuStream<'_>,
    get: &mut dyn FnMut(&str) -> Result<CudaFunction>,
    d: DType,
    how: Plan,
    po: u64,
    ptrs: &[u64],
    ints: &[i64],
    rows: usize,
    cols: usize,
) -> Result<()> {
    let dev = &cs.dev;
    let (r64, c64) = (rows as i64, cols as i64);
    let sms = dev.sms as usize;
    let launch_err = |e| super::backend_err("launch", e);
    let cfg = |grid: u32, threads: u32| LaunchConfig {
        grid_dim: (grid, 1, 1),
        block_dim: (threads, 1, 1),
        shared_mem_bytes: 0,
    };
    let warps = RBLOCK as usize / 32;
    let _ = cs.bind();
    match how {
        Plan::Warp { lanes } => {
            let f = get("k_warp")?;
            let g = lanes as i32;
            let mut b = Launch::new(&f);
            b.arg(&po);
            for p in ptrs {
                b.arg(p);
            }
            for i in ints {
                b.arg(i);
            }
            b.arg(&r64).arg(&c64).arg(&g);
            // SAFETY: `out` holds `rows` elements; the data parameters match the module's
            // signature and address rows*cols elements (the caller's contract).
            let per_block = warps * (32 / lanes as usize);
            unsafe { b.launch(cs, cfg(blocks(rows.div_ceil(per_block), sms * 64), RBLOCK)) }.map_err(launch_err)?;
        }
        Plan::Block { splits, threads } => {
            let acc_size = match d {
                DType::F16 | DType::BF16 => 4,
                _ => d.size(),
            };
            // With several splits: partial results, combined by each row's last block,
            // then freed (stream-ordered, on this stream) after the launch; and the
            // stream's row counters.
            let (part, counters) = if splits > 1 {
                if rows > split_rows(sms) {
                    return Err(Error::backend(
                        "reduce",
                        format!("{rows} rows split over blocks (at most {})", split_rows(sms)),
                    ));
                }
                (Some(CudaBuffer::alloc(cs, rows * splits * acc_size)?), row_counters(cs)?)
            } else {
                (None, 0)
            };
            let pp = part.as_ref().map(|p| p.ptr()).unwrap_or(0);
            let s64 = splits as i64;
            let f = get("k_block")?;
            let mut b = Launch::new(&f);
            b.arg(&po).arg(&pp).arg(&counters);
            for p in ptrs {
                b.arg(p);
            }
            for i in ints {
                b.arg(i);
            }
            b.arg(&r64).arg(&c64).arg(&s64);
            // SAFETY: `out` holds `rows` elements, `part` rows*splits accumulators and the
            // counters at least `rows` zeros (with one split neither is touched); the data
            // parameters as above.
            unsafe { b.launch(cs, cfg(blocks(rows * splits, 1 << 30), threads)) }.map_err(launch_err)?;
            drop(part);
        }
    }
    Ok(())
}

/// The register-cached softmax module: rows of at most `NV * VN * blockDim.x` elements,
/// each thread holding `NV` vectors of `VN` elements.
fn softmax_reg_source(d: DType, log: bool, nv: usize) -> String {
    let (t, f) = (ctype(d), ftype(d));
    let sfx = if f == "float" { "f" } else { "" };
    let vn = vec_elems(d);
    let inf = if f == "float" { "__int_as_float(0x7f800000)" } else { "__longlong_as_double(0x7ff0000000000000ll)" };
    let ld = load(d, "q");
    let st = store_float(d, "y", d == DType::F64);
    let keep_exp = if log { "" } else { "v[k][e] = ex;" };
    let res = if log { "v[k][e] - m - ls" } else { "v[k][e] * inv" };
    let fin = if log { format!("{f} ls = log{sfx}(s);") } else { format!("{f} inv = ({f})1 / s;") };
    format!(
        r#"{PRELUDE}
#define VN {vn}
#define NV {nv}
template <typename T, int N> struct alignas(sizeof(T) * N) V {{ T v[N]; }};
typedef {t} T;
typedef {f} F;
__device__ __forceinline__ F ldv(T q) {{ return {ld}; }}
__device__ __forceinline__ T stv(F y) {{ return {st}; }}
__device__ __forceinline__ F fmax_nan(F a, F b) {{ return (a != a || a > b) ? a : b; }}
// The block-wide maximum (NaN if any) or sum, in every thread. `sh` holds 32 slots.
template <bool MAX> __device__ __forceinline__ F block_all(F a, F* sh) {{
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {{ F b = __shfl_xor_sync(0xffffffffu, a, o); a = MAX ? fmax_nan(a, b) : a + b; }}
    int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = blockDim.x >> 5;
    if (lane == 0) sh[w] = a;
    __syncthreads();
    a = lane < nw ? sh[lane] : (MAX ? -{inf} : (F)0);
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {{ F b = __shfl_xor_sync(0xffffffffu, a, o); a = MAX ? fmax_nan(a, b) : a + b; }}
    return a;
}}
// This thread's `NV` vectors of the row `p`: vector `k` at element `(k * nt + t) * VN`;
// -inf past the row's end or when the row is not `live`. `vec`: every row starts 16-byte
// aligned (cols % VN == 0), so whole vectors are loaded.
__device__ __forceinline__ void load_row(F (&v)[NV][VN], const T* p, i64 cols, int vec, i64 t, i64 nt, bool live) {{
#pragma unroll
    for (int k = 0; k < NV; ++k) {{
        i64 j = ((i64)k * nt + t) * VN;
        if (vec) {{
            if (live && j < cols) {{
                V<T, VN> q = *(const V<T, VN>*)(p + j);
#pragma unroll
                for (int e = 0; e < VN; ++e) v[k][e] = ldv(q.v[e]);
            }} else {{
#pragma unroll
                for (int e = 0; e < VN; ++e) v[k][e] = -{inf};
            }}
        }} else {{
#pragma unroll
            for (int e = 0; e < VN; ++e) v[k][e] = live && j + e < cols ? ldv(p[j + e]) : -{inf};
        }}
    }}
}}
__device__ __forceinline__ F row_max(const F (&v)[NV][VN]) {{
    F m = -{inf};
#pragma unroll
    for (int k = 0; k < NV; ++k)
#pragma unroll
        for (int e = 0; e < VN; ++e) m = fmax_nan(m, v[k][e]);
    return m;
}}
// This thread's sum of exp(v - m) (the row's maximum `m`). Padding (-inf) adds exp(-inf) =
// 0 unless the row's maximum is -inf or NaN, in which case the sum is NaN anyway.
__device__ __forceinline__ F exp_sum(F (&v)[NV][VN], F m) {{
    F s = 0;
#pragma unroll
    for (int k = 0; k < NV; ++k)
#pragma unroll
        for (int e = 0; e < VN; ++e) {{ F ex = exp{sfx}(v[k][e] - m); s += ex; {keep_exp} }}
    return s;
}}
// Stores this thread's vectors of the result (as `load_row` placed them), from the row's
// maximum `m` and sum `s`.
__device__ __forceinline__ void store_row(const F (&v)[NV][VN], T* o, i64 cols, int vec, i64 t, i64 nt, F m, F s) {{
    {fin}
#pragma unroll
    for (int k = 0; k < NV; ++k) {{
        i64 j = ((i64)k * nt + t) * VN;
        if (vec) {{
            if (j < cols) {{
                V<T, VN> q;
#pragma unroll
                for (int e = 0; e < VN; ++e) {{ F y = {res}; q.v[e] = stv(y); }}
                *(V<T, VN>*)(o + j) = q;
            }}
        }} else {{
#pragma unroll
            for (int e = 0; e < VN; ++e) if (j + e < cols) {{ F y = {res}; o[j + e] = stv(y); }}
        }}
    }}
}}
// One block per row.
extern "C" __global__ void __launch_bounds__(1024) k_reg(T* __restrict__ out, const T* __restrict__ x, i64 rows, i64 cols, int vec) {{
    __shared__ F shm[32];
    __shared__ F shs[32];
    for (i64 r = blockIdx.x; r < rows; r += gridDim.x) {{
        F v[NV][VN];
        load_row(v, x + r * cols, cols, vec, threadIdx.x, blockDim.x, true);
        F m = block_all<true>(row_max(v), shm);
        F s = block_all<false>(exp_sum(v, m), shs);
        store_row(v, out + r * cols, cols, vec, threadIdx.x, blockDim.x, m, s);
    }}
}}
// `g` lanes of a warp per row (a power of two, at most 32), `32 / g` rows a warp at a time,
// for rows of at most `NV * g` vectors; the row loop is warp-uniform, so the shuffles see
// every lane.
extern "C" __global__ void __launch_bounds__(256) k_sub(T* __restrict__ out, const T* __restrict__ x, i64 rows, i64 cols, int vec, int g) {{
{WARP_ROWS}
        bool live = r < rows;
        F v[NV][VN];
        load_row(v, x + (live ? r : 0) * cols, cols, vec, sub, g, live);
        F m = row_max(v);
        for (int d = g >> 1; d > 0; d >>= 1) m = fmax_nan(m, __shfl_xor_sync(0xffffffffu, m, d));
        F s = exp_sum(v, m);
        for (int d = g >> 1; d > 0; d >>= 1) s += __shfl_xor_sync(0xffffffffu, s, d);
        if (live) store_row(v, out + r * cols, cols, vec, sub, g, m, s);
    }}
}}
"#
    )
}

/// Lanes per row and vectors per lane of the sub-warp softmax (`k_sub`) for rows of `vecs`
/// vectors that one warp holds (the register plan's single-warp rows): short rows share a
/// warp instead of leaving lanes idle, and a block holds eight warps rather than one.
pub(crate) fn softmax_sub_plan(vecs: usize) -> (u32, usize) {
    let g = vecs.next_power_of_two().clamp(1, 32);
    (g as u32, vecs.div_ceil(g))
}

/// Threads per block and vectors per thread of the register-cached softmax for rows of
/// `cols` elements, or None when a row does not fit in registers.
pub(crate) fn softmax_reg_plan(cols: usize, vn: usize) -> Option<(u32, usize)> {
    let nv_max = (SOFTMAX_REG_ELEMS / vn).clamp(1, 8);
    let vecs = cols.div_ceil(vn).max(1);
    let threads = vecs.div_ceil(4).next_power_of_two().clamp(32, 1024);
    let nv = vecs.div_ceil(threads);
    (nv <= nv_max).then_some((threads as u32, nv))
}

/// The generic softmax module (`k_rows`, one block per row, any row length).
fn softmax_generic_source(d: DType, log: bool) -> String {
    let (t, f) = (ctype(d), ftype(d));
    let sfx = if f == "float" { "f" } else { "" };
    let ld = load(d, "p[j]");
    let res = if log { format!("(v - m) - log{sfx}(s)") } else { format!("exp{sfx}(v - m) / s") };
    let st = store_float(d, "y", d == DType::F64);
    format!(
        r#"{PRELUDE}
__device__ __forceinline__ void merge({f}& m, {f}& s, {f} m2, {f} s2) {{
    if (s2 == ({f})0) return;
    if (s == ({f})0) {{ m = m2; s = s2; return; }}
    {f} mm = m > m2 ? m : m2;
    s = s * exp{sfx}(m - mm) + s2 * exp{sfx}(m2 - mm);
    m = mm;
}}
extern "C" __global__ void k_rows({t}* out, const {t}* x, i64 rows, i64 cols) {{
    __shared__ {f} shm[{BLOCK}];
    __shared__ {f} shs[{BLOCK}];
    for (i64 r = blockIdx.x; r < rows; r += gridDim.x) {{
        const {t}* p = x + r * cols;
        {t}* o = out + r * cols;
        {f} m = 0, s = 0;
        bool nan = false;
        for (i64 j = threadIdx.x; j < cols; j += blockDim.x) {{
            {f} v = {ld};
            // NaN or +inf anywhere makes the row NaN (inf - inf); -inf entries add nothing.
            if (v != v || v == __int_as_float(0x7f800000)) nan = true;
            else if (v > -__int_as_float(0x7f800000)) merge(m, s, v, ({f})1);
        }}
        shm[threadIdx.x] = nan ? ({f})__int_as_float(0x7fc00000) : m;
        shs[threadIdx.x] = s;
        __syncthreads();
        for (int k = blockDim.x / 2; k > 0; k >>= 1) {{
            if (threadIdx.x < k) {{
                {f} a = shm[threadIdx.x], b = shm[threadIdx.x + k];
                if (a != a || b != b) shm[threadIdx.x] = a != a ? a : b;
                else {{ {f} ss = shs[threadIdx.x]; merge(a, ss, b, shs[threadIdx.x + k]); shm[threadIdx.x] = a; shs[threadIdx.x] = ss; }}
            }}
            __syncthreads();
        }}
        m = shm[0]; s = shs[0];
        // A row of only -inf: exp(-inf - -inf) is NaN, as in the reference.
        if (s == ({f})0 && m == m) m = -__int_as_float(0x7f800000);
        for (i64 j = threadIdx.x; j < cols; j += blockDim.x) {{
            {f} v = {ld};
            {f} y = (m != m) ? m : ({res});
            o[j] = {st};
        }}
        __syncthreads();
    }}
}}
"#
    )
}

pub(crate) fn softmax(cs: &GpuStream<'_>, x: &Storage, axis: usize, log: bool) -> Result<Storage> {
    let d = x.dtype;
    if !d.is_float() {
        return Err(super::unsupported("softmax", format!("dtype {d}")));
    }
    // An axis that is not last, read in place by columns where the layout allows it.
    if let Some(y) = super::softmax_cols::softmax(cs, x, axis, log)? {
        return Ok(y);
    }
    let (xs, rows, cols) = rows_last(cs, x, &[axis])?;
    let out = new_storage(cs, d, &xs.layout.shape)?;
    let po = cuda_of(&out).map(|b| b.ptr()).unwrap_or(0);
    let vn = vec_elems(d);
    match softmax_reg_plan(cols, vn) {
        Some((threads, nv)) if rows > 0 && cols > 0 => {
            // Rows one warp holds go to `k_sub`, several to a warp where they are short.
            let sub = (threads == 32).then(|| softmax_sub_plan(cols.div_ceil(vn)));
            let nv = sub.map_or(nv, |(_, n)| n);
            let key = format!("softmax_reg:{log}:{}:{nv}", d.name());
            let name = if sub.is_some() { "k_sub" } else { "k_reg" };
            let f = nvrtc::function(cs.driver(), &cs.dev, &key, name, || softmax_reg_source(d, log, nv))?;
            let px = elem_ptr(&xs);
            let vec = i32::from(px.is_multiple_of(16) && (cols * d.size()).is_multiple_of(16));
            let (r64, c64) = (rows as i64, cols as i64);
            let (grid, threads) = match sub {
                Some((g, _)) => {
                    (blocks(rows.div_ceil(SUB_BLOCK as usize / g as usize), cs.dev.sms as usize * 64), SUB_BLOCK)
                }
                None => (blocks(rows, 1 << 30), threads),
            };
            let cfg = LaunchConfig { grid_dim: (grid, 1, 1), block_dim: (threads, 1, 1), shared_mem_bytes: 0 };
            let _ = cs.bind();
            let mut b = Launch::new(&f);
            b.arg(&po).arg(&px).arg(&r64).arg(&c64).arg(&vec);
            let g = sub.map_or(0, |(g, _)| g as i32);
            if sub.is_some() {
                b.arg(&g);
            }
            // SAFETY: `out` and `x` hold rows*cols contiguous elements; `vec` is set only
            // when every row start is 16-byte aligned; `k_sub` takes `g` lanes a row, at
            // most 32, with `NV * g` vectors covering a row.
            unsafe { b.launch(cs, cfg) }.map_err(|e| super::backend_err("launch", e))?;
        }
        _ => {
            let key = format!("softmax:{log}:{}", d.name());
            launch_rows(cs, &key, move || softmax_generic_source(d, log), po, &xs, rows, cols)?;
        }
    }
    // Back to the input's axis order (a view).
    let nd = x.layout.shape.len();
    let mut perm: Vec<usize> = (0..nd).filter(|&a| a != axis).collect();
    perm.push(axis);
    let mut inv = vec![0; nd];
    for (i, &p) in perm.iter().enumerate() {
        inv[p] = i;
    }
    let l = Layout::contiguous(&out.layout.shape).permute(&inv);
    Ok(out.with_layout(l))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::cuda::nvrtc::check_compiles;

    const DTYPES: [DType; 8] =
        [DType::F32, DType::F16, DType::BF16, DType::F64, DType::I32, DType::I64, DType::U8, DType::Bool];

    #[test]
    fn reduction_kernels_compile() {
        for d in DTYPES.into_iter().chain([DType::U32]) {
            let mean = d.is_float().then_some(ReduceOp::Mean);
            for op in [ReduceOp::Sum, ReduceOp::Prod, ReduceOp::Max, ReduceOp::Min].into_iter().chain(mean) {
                let src = reduce_source(&reduce_spec(op, d), vec_elems(d), &Elems::Array);
                if !check_compiles(&format!("test:reduce:{op:?}:{}", d.name()), &src) {
                    return;
                }
                let src = col_source(&reduce_spec(op, d), vec_elems(d));
                check_compiles(&format!("test:reduce_col:{op:?}:{}", d.name()), &src);
            }
        }
    }

    #[test]
    fn softmax_kernels_compile() {
        for d in [DType::F32, DType::F16, DType::BF16, DType::F64] {
            for log in [false, true] {
                for nv in [1, 2, 4, 8] {
                    if !check_compiles(
                        &format!("test:softmax_reg:{log}:{}:{nv}", d.name()),
                        &softmax_reg_source(d, log, nv),
                    ) {
                        return;
                    }
                }
                check_compiles(&format!("test:softmax:{log}:{}", d.name()), &softmax_generic_source(d, log));
            }
        }
    }

    /// The sub-warp softmax takes every row the register plan gives one warp, covers each
    /// with its lanes' vectors, and leaves at most half the lanes of a row group idle.
    #[test]
    fn softmax_sub_plans_cover_their_rows() {
        for vn in [1, 2, 4, 8] {
            for cols in 1..=4096 {
                let Some((threads, nv)) = softmax_reg_plan(cols, vn) else { continue };
                let vecs = cols.div_ceil(vn);
                if threads != 32 {
                    assert!(vecs > 128, "{cols} x {vn}: {threads} threads");
                    continue;
                }
                let (g, n) = softmax_sub_plan(vecs);
                assert!(g.is_power_of_two() && g <= 32, "{cols}: {g} lanes");
                assert!(n * g as usize * vn >= cols && n <= nv.max(1), "{cols} x {vn}: {g} lanes of {n}");
                assert!(g == 32 || 2 * vecs > g as usize, "{cols} x {vn}: {g} lanes for {vecs} vectors");
            }
        }
    }

    #[test]
    fn reduction_plans() {
        let sms = 132;
        // A full reduction is split over many blocks: for a stored array four blocks of
        // 512 threads per SM.
        assert_eq!(plan(1, 1 << 28, 4, sms, SPLIT_BLOCK, 0), Plan::Block { splits: sms * 4, threads: 512 });
        // Computed elements: eight blocks of 256.
        assert_eq!(plan(1, 1 << 28, 1, sms, RBLOCK, 0), Plan::Block { splits: sms * 8, threads: 256 });
        // Short rows: lanes of a warp each (about a vector per lane); many long rows: a
        // block each.
        assert_eq!(plan(1 << 20, 16, 4, sms, SPLIT_BLOCK, 0), Plan::Warp { lanes: 4 });
        assert_eq!(plan(1 << 20, 1024, 8, sms, SPLIT_BLOCK, 0), Plan::Warp { lanes: 32 });
        assert_eq!(plan(1 << 20, 3, 8, sms, SPLIT_BLOCK, 0), Plan::Warp { lanes: 1 });
        assert_eq!(plan(1 << 20, 100, 1, sms, RBLOCK, 0), Plan::Warp { lanes: 32 });
        assert_eq!(plan(7, 0, 4, sms, SPLIT_BLOCK, 0), Plan::Warp { lanes: 1 });
        assert_eq!(plan(65536, 4096, 4, sms, SPLIT_BLOCK, 0), Plan::Block { splits: 1, threads: 256 });
        // Many rows up to `warp_cols` long: a warp each, once they give every SM 32 warps.
        assert_eq!(plan(65536, 4096, 8, sms, SPLIT_BLOCK, 4096), Plan::Warp { lanes: 32 });
        assert_eq!(plan(sms * 32, 4096, 8, sms, SPLIT_BLOCK, 4096), Plan::Warp { lanes: 32 });
        assert_eq!(plan(sms * 32 - 1, 4096, 8, sms, SPLIT_BLOCK, 4096), Plan::Block { splits: 1, threads: 256 });
        assert_eq!(plan(65536, 4097, 8, sms, SPLIT_BLOCK, 4096), Plan::Block { splits: 1, threads: 256 });
        // Few rows that are not long enough to split stay one block per row.
        assert_eq!(plan(3, 2000, 4, sms, SPLIT_BLOCK, 0), Plan::Block { splits: 1, threads: 256 });
        assert_eq!(plan(3, 40000, 4, sms, RBLOCK, 0), Plan::Block { splits: 9, threads: 256 });
        assert_eq!(plan(3, 40000, 4, sms, SPLIT_BLOCK, 0), Plan::Block { splits: 4, threads: 512 });
    }

    /// Every plan over generated shapes stays inside the launch limits, covers every column
    /// and row, and splits the reduced axis only into chunks of real work.
    #[test]
    fn generated_plans() {
        let sizes = [1usize, 2, 3, 7, 31, 32, 33, 100, 1000, 1024, 1025, 4096, 65537, 1 << 20, 1 << 28];
        for sms in [1, 78, 132] {
            for &rows in &sizes {
                for &cols in &sizes {
                    for (vn, warp_cols) in [1, 2, 4, 8, 16].into_iter().flat_map(|v| [(v, 0), (v, 8192 / v)]) {
                        match plan(rows, cols, vn, sms, SPLIT_BLOCK, warp_cols) {
                            Plan::Warp { lanes } => {
                                assert!(cols <= WARP_COLS.max(warp_cols) && lanes.is_power_of_two() && lanes <= 32);
                                assert!(cols <= WARP_COLS || rows >= sms * WARP_ROWS_PER_SM);
                                assert!((lanes as usize) < 2 * cols.div_ceil(vn).max(1));
                            }
                            Plan::Block { splits, threads } => {
                                assert!(cols > WARP_COLS && splits >= 1);
                                assert!(cols > warp_cols || rows < sms * WARP_ROWS_PER_SM);
                                assert!(splits == 1 || rows <= split_rows(sms), "{rows} {cols}");
                                assert!(splits == 1 || threads == SPLIT_BLOCK);
                            }
                        }
                        let p = col_plan(rows, cols, vn, sms);
                        assert_eq!(p.bx * p.by, CBLOCK as u32);
                        assert!(p.by.is_power_of_two() && p.gy >= 1 && p.gy <= 65535);
                        assert!(p.gx as usize * p.bx as usize * vn >= rows, "{p:?} {rows}");
                        assert!(p.gy == 1 || cols >= p.gy as usize * p.by as usize * 16, "{p:?} {cols}");
                        // When the columns alone fill the GPU the reduced axis is not split.
                        if p.gx as usize >= sms * 8 {
                            assert_eq!(p.gy, 1);
                        }
                    }
                }
            }
        }
        // A [2^24, 4] f32 array summed over axis 0: one column block of 4 threads by 64,
        // its reduced axis split over the grid.
        assert_eq!(col_plan(4, 1 << 24, 4, 132), ColPlan { bx: 1, by: 256, gx: 1, gy: 1056, vc: 4 });
        assert_eq!(col_plan(4096, 4096, 4, 132), ColPlan { bx: 64, by: 4, gx: 16, gy: 64, vc: 4 });
        assert_eq!(col_plan(1 << 20, 64, 1, 132), ColPlan { bx: 64, by: 4, gx: 16384, gy: 1, vc: 1 });
    }

    /// `k_colfin`'s launch covers every column, with a power-of-two split of the partials
    /// no wider than them, within one block's threads.
    #[test]
    fn column_combine_launches() {
        for cols in [1usize, 3, 4, 31, 32, 33, 768, 3072, 1 << 20] {
            for gy in [2usize, 3, 7, 64, 256, 1056, 65535] {
                let c = fin_config(cols, gy);
                let (bx, by) = (c.block_dim.0 as usize, c.block_dim.1 as usize);
                assert!(bx * by <= FIN_BLOCK && by.is_power_of_two() && bx <= 32, "{cols} {gy}: {c:?}");
                assert!(by < 2 * gy && c.grid_dim.0 as usize * bx >= cols, "{cols} {gy}: {c:?}");
            }
        }
        assert_eq!(fin_config(768, 256).block_dim, (32, 16, 1));
        assert_eq!(fin_config(4, 1056).block_dim, (4, 128, 1));
    }

    /// Reference reduction form by enumerating addresses: output o*ni+i reads
    /// o*s1 + r*sr + i*s2.
    fn addresses(f: &Form) -> Vec<Vec<i64>> {
        let mut v = Vec::new();
        for o in 0..f.no {
            for i in 0..f.ni {
                v.push((0..f.red).map(|r| o as i64 * f.s1 + r as i64 * f.sr + i as i64 * f.s2).collect());
            }
        }
        v
    }

    /// The addresses each output of a strided reduction reads, by a multi-index walk.
    fn walk(l: &Layout, axes: &[usize]) -> Vec<Vec<i64>> {
        let nd = l.shape.len();
        let out_shape: Vec<usize> = (0..nd).map(|i| if axes.contains(&i) { 1 } else { l.shape[i] }).collect();
        let mut out = vec![Vec::new(); out_shape.iter().product()];
        for flat in 0..l.numel() {
            let mut idx = vec![0; nd];
            let mut r = flat;
            for i in (0..nd).rev() {
                idx[i] = r % l.shape[i];
                r /= l.shape[i];
            }
            let o = (0..nd).fold(0, |o, i| o * out_shape[i] + if axes.contains(&i) { 0 } else { idx[i] });
            out[o].push(l.offset_of(&idx) as i64 - l.offset as i64);
        }
        out
    }

    /// Over generated shapes, permutations, slices and axis sets: when a form is found it
    /// reads exactly the elements of each output (in the row-major order of the reduced
    /// axes), and the common layouts are read in place.
    #[test]
    fn generated_forms() {
        let mut seed = 7u64;
        let mut next = |n: usize| {
            seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            ((seed >> 33) as usize) % n
        };
        let mut in_place = 0;
        for case in 0..3000 {
            let nd = 1 + next(4);
            let shape: Vec<usize> = (0..nd).map(|_| [1, 2, 3, 5, 8][next(5)]).collect();
            let mut l = Layout::contiguous(&shape);
            match case % 4 {
                1 => {
                    let mut perm: Vec<usize> = (0..nd).collect();
                    for i in (1..nd).rev() {
                        perm.swap(i, next(i + 1));
                    }
                    l = l.permute(&perm);
                }
                2 => {
                    // A slice: every axis of size > 1 starts at 1 (one element dropped).
                    let mut big = shape.clone();
                    let a = next(nd);
                    big[a] += 2;
                    let bl = Layout::contiguous(&big);
                    l = Layout { shape: l.shape.clone(), strides: bl.strides.clone(), offset: bl.strides[a] as usize };
                }
                _ => {}
            }
            let mask = 1 + next((1 << nd) - 1);
            let axes: Vec<usize> = (0..nd).filter(|i| mask & (1 << i) != 0).collect();
            let Some(f) = form(&l.shape, &l.strides, &axes) else { continue };
            if f.read().is_some() {
                in_place += 1;
            }
            let want = walk(&l, &axes);
            assert_eq!(addresses(&f), want, "{l:?} {axes:?} {f:?}");
        }
        assert!(in_place > 1000, "{in_place}");
        let c = |shape: &[usize], axes: &[usize]| {
            let l = Layout::contiguous(shape);
            form(&l.shape, &l.strides, axes).map(|f| (f, f.read()))
        };
        let fm = |no, s1, red, sr, ni, s2| Form { no, red, ni, s1, sr, s2 };
        assert_eq!(c(&[4, 5, 6], &[0]), Some((fm(1, 0, 4, 30, 30, 1), Some(Read::Cols))));
        assert_eq!(c(&[4, 5, 6], &[1]), Some((fm(4, 30, 5, 6, 6, 1), Some(Read::Cols))));
        assert_eq!(c(&[4, 5, 6], &[1, 2]), Some((fm(4, 30, 30, 1, 1, 0), Some(Read::Rows))));
        assert_eq!(c(&[4, 5, 6], &[0, 1, 2]), Some((fm(1, 0, 120, 1, 1, 0), Some(Read::Rows))));
        assert_eq!(c(&[4, 1, 6], &[0, 1]), Some((fm(1, 0, 4, 6, 6, 1), Some(Read::Cols))));
        assert_eq!(c(&[4, 5, 6], &[0, 2]), None);
        // A transposed matrix: the stride-1 axis reduced reads rows, the other columns.
        let t = Layout::contiguous(&[6, 4]).permute(&[1, 0]);
        let g = |axes: &[usize]| form(&t.shape, &t.strides, axes).map(|f| (f, f.read()));
        assert_eq!(g(&[1]), Some((fm(1, 0, 6, 4, 4, 1), Some(Read::Cols))));
        assert_eq!(g(&[0]), Some((fm(1, 0, 4, 1, 6, 4), Some(Read::Rows))));
        // Broadcast and reversed strides are copied.
        assert_eq!(form(&[3, 4], &[0, 1], &[0]), None);
        assert_eq!(form(&[3, 4], &[-4, 1], &[1]), None);
    }

    #[test]
    fn softmax_plans() {
        assert_eq!(softmax_reg_plan(4096, 4), Some((256, 4)));
        assert_eq!(softmax_reg_plan(4097, 4), Some((512, 3)));
        assert_eq!(softmax_reg_plan(32768, 4), Some((1024, 8)));
        assert_eq!(softmax_reg_plan(32769, 4), None);
        assert_eq!(softmax_reg_plan(16384, 2), Some((1024, 8)));
        assert_eq!(softmax_reg_plan(16385, 2), None);
        assert_eq!(softmax_reg_plan(7, 8), Some((32, 1)));
    }
}
