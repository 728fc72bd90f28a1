//! Reductions and fused softmax. The reduced axes are moved last (a contiguous copy when
//! needed), so every reduction is over the rows of a row-major `rows x cols` matrix.
//!
//! Sums and products accumulate in f32 for f16/bf16/f32 and f64 for f64, integers wrap in
//! their own type; max/min propagate NaN. Three launch shapes, chosen from rows/cols and
//! the number of SMs:
//! - short rows (`cols <= WARP_COLS`): one warp per row (`k_warp`);
//! - many long rows: one block per row (`k_block`, 16-byte vector loads of the aligned
//!   middle of each row, warp shuffles, one shared slot per warp);
//! - few long rows (a full reduction): each row is split over many blocks (for a stored
//!   array, [`SPLIT_BLOCK`] threads with eight vectors in flight each) that write
//!   partial results to a temporary buffer; the block that finishes a row's last chunk
//!   (counted with an atomic per row) combines that row's partials and writes the result,
//!   so a full reduction is one kernel launch. The counters live with the stream (one per
//!   possible row, zeroed once) and the last block sets its row's back to zero; launches on
//!   one stream never overlap, so each launch starts from zeros.
//!
//! The module's source is generated for one way of reading the elements ([`Elems`]): a
//! contiguous array, or values computed by generated code at each element (a fused
//! program's, see `fused.rs`), which `k_warp` and `k_block` read through the macro
//! `ELEM(j)` after declaring each row's state; computed rows are read one element at a
//! time (four per thread in flight in `k_block`), not as 16-byte vectors. [`launch`]
//! enqueues either kind with the same plans.
//!
//! Softmax of rows up to `1024 * 32` elements (16384 for f64) loads each row once into
//! registers (16-byte loads when rows are aligned), reduces the maximum and the sum of
//! exponentials across the block, and writes the row once. Longer rows use a generic
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
/// Threads per block of a stored array's reduction split over many blocks (with eight
/// 16-byte vectors in flight per thread and four accumulators): enough loads in flight
/// to keep the memory busy; the fastest shape of a sweep over block sizes and vectors in
/// flight for a full sum (`rill bench sum`, docs/PERFORMANCE.md).
const SPLIT_BLOCK: u32 = 512;
/// Threads each SM is given by a split reduction.
const SPLIT_THREADS_PER_SM: usize = 2048;
/// `k_block`'s launch bound when it computes its elements ([`Elems::Computed`]): it is
/// launched with [`RBLOCK`] threads, but the larger bound caps registers at 64 per thread
/// (four blocks per SM), which makes the fused reductions faster (`rill bench
/// fused_reduce`); a stored array's reduction is faster with the bound of `RBLOCK`, so
/// only this kernel has the larger bound.
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
            ReduceOp::Sum => ("0".to_string(), "a + b".to_string()),
            ReduceOp::Prod => ("1".to_string(), "a * b".to_string()),
            ReduceOp::Max => (format!("-{inf}"), "((a != a || a > b) ? a : b)".to_string()),
            ReduceOp::Min => (inf.to_string(), "((a != a || a < b) ? a : b)".to_string()),
        };
        return ReduceSpec {
            t,
            acc: f,
            shfl: f,
            init,
            combine,
            ld: load(d, "v"),
            st: store_float(d, "a", d == DType::F64),
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
        ReduceOp::Sum => ("0".to_string(), format!("({t})(({u})a + ({u})b)")),
        ReduceOp::Prod => ("1".to_string(), format!("({t})(({u})a * ({u})b)")),
        ReduceOp::Max => (lo.to_string(), "(a > b ? a : b)".to_string()),
        ReduceOp::Min => (hi.to_string(), "(a < b ? a : b)".to_string()),
    };
    let shfl = if d.size() < 4 { "int" } else { t };
    ReduceSpec { t, acc: t, shfl, init, combine, ld: "v".to_string(), st: "a".to_string() }
}

/// Elements of a 16-byte vector of `d`.
fn vec_elems(d: DType) -> usize {
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
            Elems::Array => ("const T* __restrict__ x", "const T* p = x + r * cols;", "p[(j)]"),
            Elems::Computed(r) => (&r.params, &r.row, &r.elem),
        }
    }
}

/// The reduction module: `k_warp` (a warp per row), `k_block` (a block per row chunk, to
/// the output, or to partials that the last block of each row combines). Element `j` of
/// row `r` is read as `e` says: the kernels declare the row's state (`{row}`, with `r` in
/// scope) and then read `ELEM(j)`, a value of the stored type `T`.
///
/// Kernel parameters: `k_warp(T* out, DATA, i64 rows, i64 cols)` and
/// `k_block(T* out, A* part, unsigned* count, DATA, i64 rows, i64 cols, i64 splits)`, where
/// `DATA` is `const T* x` for [`Elems::Array`] and [`RowRead::params`] for computed
/// elements.
fn reduce_source(s: &ReduceSpec, vn: usize, e: &Elems<'_>) -> String {
    let ReduceSpec { t, acc, shfl, init, combine, ld, st } = s;
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
    // This thread's share of chunk `c` of `splits` of row `r`, accumulated into `a`.
    let chunk = match e {
        Elems::Array => "a = chunk(p, cols, c, splits);",
        Elems::Computed(_) => {
            r#"{
            i64 j1 = cols * (c + 1) / splits, bd = blockDim.x;
            i64 j = cols * c / splits + threadIdx.x;
            for (; j + 3 * bd < j1; j += 4 * bd) {
                T x0 = ELEM(j), x1 = ELEM(j + bd), x2 = ELEM(j + 2 * bd), x3 = ELEM(j + 3 * bd);
                a = comb(a, ldv(x0)); a = comb(a, ldv(x1)); a = comb(a, ldv(x2)); a = comb(a, ldv(x3));
            }
            for (; j < j1; j += bd) { T x0 = ELEM(j); a = comb(a, ldv(x0)); }
        }"#
        }
    };
    format!(
        r#"{PRELUDE}
#define VN {vn}
template <typename T, int N> struct alignas(sizeof(T) * N) V {{ T v[N]; }};
typedef {t} T;
typedef {acc} A;
{decls}
#define ELEM(j) ({elem})
__device__ __forceinline__ A comb(A a, A b) {{ return {combine}; }}
__device__ __forceinline__ A ldv(T v) {{ return (A)({ld}); }}
__device__ __forceinline__ T st(A a) {{ return {st}; }}
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
// This thread's share of chunk `c` of `splits` of the contiguous row `p` (`cols`
// elements): the 16-byte aligned middle of the row as vectors, split evenly; chunk 0 also
// takes the unaligned head and the tail.
__device__ __forceinline__ A chunk(const T* p, i64 cols, i64 c, i64 splits) {{
    A a = (A)({init});
    i64 head = (i64)(((16u - ((u32)(u64)p & 15u)) & 15u) / sizeof(T));
    if (head > cols) head = cols;
    i64 nvec = (cols - head) / VN;
    i64 v0 = nvec * c / splits, v1 = nvec * (c + 1) / splits;
    const V<T, VN>* pv = (const V<T, VN>*)(p + head);
    i64 bd = blockDim.x;
    i64 j = v0 + threadIdx.x;
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
        for (i64 k = threadIdx.x; k < extra; k += bd) {{
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
extern "C" __global__ void __launch_bounds__({bound}) k_block(T* __restrict__ out, A* __restrict__ part, unsigned int* __restrict__ count, {data}i64 rows, i64 cols, i64 splits) {{
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
            if (threadIdx.x == 0) out[r] = st(a);
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
                out[r] = st(b);
                count[r] = 0u;
            }}
        }}
        __syncthreads(); // `last` and `sh` are written again by the next item
    }}
}}
// One warp per row (rows are warp-uniform, so the shuffles see all 32 lanes).
extern "C" __global__ void k_warp(T* __restrict__ out, {data}i64 rows, i64 cols) {{
    int lane = threadIdx.x & 31;
    i64 w = (blockIdx.x * (i64)blockDim.x + threadIdx.x) >> 5;
    i64 nw = ((i64)gridDim.x * blockDim.x) >> 5;
    for (i64 r = w; r < rows; r += nw) {{
        {row}
        A a = (A)({init});
#pragma unroll 4
        for (i64 j = lane; j < cols; j += 32) {{ T v = ELEM(j); a = comb(a, ldv(v)); }}
        a = warp_red(a);
        if (lane == 0) out[r] = st(a);
    }}
}}
"#
    )
}

/// How a `rows x cols` reduction is launched.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Plan {
    /// One warp per row.
    Warp,
    /// Each row split into `splits` chunks (1: one block per row), one block of
    /// `threads` each.
    Block { splits: usize, threads: u32 },
}

/// Rows a reduction split over several blocks has at most (fewer than `2 * sms`, see
/// [`plan`]): the number of a stream's row counters.
fn split_rows(sms: usize) -> usize {
    2 * sms
}

/// How a `rows x cols` reduction is launched: `vn` elements per vector read, `split`
/// threads per block when a row is split over several blocks.
fn plan(rows: usize, cols: usize, vn: usize, sms: usize, split: u32) -> Plan {
    if cols <= WARP_COLS {
        return Plan::Warp;
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

pub(crate) fn reduce(
    cs: &GpuStream<'_>,
    op: ReduceOp,
    x: &Storage,
    axes: &[usize],
    shape: &[usize],
) -> Result<Storage> {
    let d = x.dtype;
    let (xs, rows, cols) = rows_last(cs, x, axes)?;
    let out = new_storage(cs, d, shape)?;
    if rows == 0 {
        return Ok(out);
    }
    let vn = vec_elems(d);
    let key = format!("reduce2:{op:?}:{}", d.name());
    let dev = &cs.dev;
    let mut src = Some(move || reduce_source(&reduce_spec(op, d), vn, &Elems::Array));
    let mut get =
        |name: &str| nvrtc::function(cs.driver(), dev, &key, name, || src.take().map(|f| f()).unwrap_or_default());
    let po = cuda_of(&out).map(|b| b.ptr()).unwrap_or(0);
    let how = plan(rows, cols, vn, dev.sms as usize, SPLIT_BLOCK);
    launch(cs, &mut get, d, how, po, &[elem_ptr(&xs)], &[], rows, cols)?;
    Ok(out)
}

/// The launch plan of a reduction of `rows x cols` elements of `d` read one at a time
/// ([`Elems::Computed`]).
pub(crate) fn plan_computed(rows: usize, cols: usize, sms: usize) -> Plan {
    plan(rows, cols, 1, sms, RBLOCK)
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
        Plan::Warp => {
            let f = get("k_warp")?;
            let mut b = Launch::new(&f);
            b.arg(&po);
            for p in ptrs {
                b.arg(p);
            }
            for i in ints {
                b.arg(i);
            }
            b.arg(&r64).arg(&c64);
            // SAFETY: `out` holds `rows` elements; the data parameters match the module's
            // signature and address rows*cols elements (the caller's contract).
            unsafe { b.launch(cs, cfg(blocks(rows.div_ceil(warps), sms * 64), RBLOCK)) }.map_err(launch_err)?;
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
// One block per row; `vec` says that every row starts 16-byte aligned (cols % VN == 0).
extern "C" __global__ void __launch_bounds__(1024) k_reg(T* __restrict__ out, const T* __restrict__ x, i64 rows, i64 cols, int vec) {{
    __shared__ F shm[32];
    __shared__ F shs[32];
    for (i64 r = blockIdx.x; r < rows; r += gridDim.x) {{
        const T* p = x + r * cols;
        T* o = out + r * cols;
        F v[NV][VN];
#pragma unroll
        for (int k = 0; k < NV; ++k) {{
            i64 j = ((i64)k * blockDim.x + threadIdx.x) * VN;
            if (vec) {{
                if (j < cols) {{
                    V<T, VN> q = *(const V<T, VN>*)(p + j);
#pragma unroll
                    for (int e = 0; e < VN; ++e) v[k][e] = ldv(q.v[e]);
                }} else {{
#pragma unroll
                    for (int e = 0; e < VN; ++e) v[k][e] = -{inf};
                }}
            }} else {{
#pragma unroll
                for (int e = 0; e < VN; ++e) v[k][e] = j + e < cols ? ldv(p[j + e]) : -{inf};
            }}
        }}
        F m = -{inf};
#pragma unroll
        for (int k = 0; k < NV; ++k)
#pragma unroll
            for (int e = 0; e < VN; ++e) m = fmax_nan(m, v[k][e]);
        m = block_all<true>(m, shm);
        // Padding (-inf) adds exp(-inf) = 0 unless the row's maximum is -inf or NaN, in
        // which case the sum is NaN anyway.
        F s = 0;
#pragma unroll
        for (int k = 0; k < NV; ++k)
#pragma unroll
            for (int e = 0; e < VN; ++e) {{ F ex = exp{sfx}(v[k][e] - m); s += ex; {keep_exp} }}
        s = block_all<false>(s, shs);
        {fin}
#pragma unroll
        for (int k = 0; k < NV; ++k) {{
            i64 j = ((i64)k * blockDim.x + threadIdx.x) * VN;
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
}}
"#
    )
}

/// Threads per block and vectors per thread of the register-cached softmax for rows of
/// `cols` elements, or None when a row does not fit in registers.
fn softmax_reg_plan(cols: usize, vn: usize) -> Option<(u32, usize)> {
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
            if (v != v) nan = true;
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
        if (s == ({f})0) m = -__int_as_float(0x7f800000);
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
    let (xs, rows, cols) = rows_last(cs, x, &[axis])?;
    let out = new_storage(cs, d, &xs.layout.shape)?;
    let po = cuda_of(&out).map(|b| b.ptr()).unwrap_or(0);
    let vn = vec_elems(d);
    match softmax_reg_plan(cols, vn) {
        Some((threads, nv)) if rows > 0 && cols > 0 => {
            let key = format!("softmax_reg:{log}:{}:{nv}", d.name());
            let f = nvrtc::function(cs.driver(), &cs.dev, &key, "k_reg", || softmax_reg_source(d, log, nv))?;
            let px = elem_ptr(&xs);
            let vec = i32::from(px % 16 == 0 && (cols * d.size()) % 16 == 0);
            let (r64, c64) = (rows as i64, cols as i64);
            let cfg = LaunchConfig {
                grid_dim: (blocks(rows, 1 << 30), 1, 1),
                block_dim: (threads, 1, 1),
                shared_mem_bytes: 0,
            };
            let _ = cs.bind();
            let mut b = Launch::new(&f);
            b.arg(&po).arg(&px).arg(&r64).arg(&c64).arg(&vec);
            // SAFETY: `out` and `x` hold rows*cols contiguous elements; `vec` is set only
            // when every row start is 16-byte aligned.
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
            for op in [ReduceOp::Sum, ReduceOp::Prod, ReduceOp::Max, ReduceOp::Min] {
                let src = reduce_source(&reduce_spec(op, d), vec_elems(d), &Elems::Array);
                if !check_compiles(&format!("test:reduce:{op:?}:{}", d.name()), &src) {
                    return;
                }
            }
        }
    }

    #[test]
    fn softmax_kernels_compile() {
        for d in [DType::F32, DType::F16, DType::BF16, DType::F64] {
            for log in [false, true] {
                for nv in [1, 4, 8] {
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

    #[test]
    fn reduction_plans() {
        let sms = 132;
        // A full reduction is split over many blocks: for a stored array four blocks of
        // 512 threads per SM.
        assert_eq!(plan(1, 1 << 28, 4, sms, SPLIT_BLOCK), Plan::Block { splits: sms * 4, threads: 512 });
        // Computed elements: eight blocks of 256.
        assert_eq!(plan(1, 1 << 28, 1, sms, RBLOCK), Plan::Block { splits: sms * 8, threads: 256 });
        // Short rows: a warp each; many long rows: a block each.
        assert_eq!(plan(1 << 20, 16, 4, sms, SPLIT_BLOCK), Plan::Warp);
        assert_eq!(plan(65536, 4096, 4, sms, SPLIT_BLOCK), Plan::Block { splits: 1, threads: 256 });
        // Few rows that are not long enough to split stay one block per row.
        assert_eq!(plan(3, 2000, 4, sms, SPLIT_BLOCK), Plan::Block { splits: 1, threads: 256 });
        assert_eq!(plan(3, 40000, 4, sms, RBLOCK), Plan::Block { splits: 9, threads: 256 });
        assert_eq!(plan(3, 40000, 4, sms, SPLIT_BLOCK), Plan::Block { splits: 4, threads: 512 });
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
