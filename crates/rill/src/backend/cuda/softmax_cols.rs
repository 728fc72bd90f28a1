//! Softmax and log-softmax over an axis that is not last, read in place.
//!
//! The row kernels (`reduce.rs`) need the softmax axis last, which for any other axis costs
//! a transposing copy of the input (read and write) before the softmax itself reads and
//! writes it. When the input reads in place as `[outer, red, inner]` ([`form`]) with the
//! softmax axis as `red` and the inner run of stride 1, the column kernels here read it
//! where it is, in the style of the column reductions (`k_col*`): each thread owns one or
//! (where every row is 16-byte aligned) a vector of consecutive inner columns, and a block
//! is `bx` column threads by `by` threads that split `red`.
//!
//! - Pass 1: each thread keeps, per column, an online pair (maximum `m`, sum of
//!   `exp(x - m)`) over its rows, four rows in flight; the block's `by` pairs are combined
//!   in a shared-memory tree, a fixed order (no atomics), so results have the same bits
//!   every run.
//! - Pass 2: each thread reads its rows again, last row first (the rows it read last are the
//!   likeliest to be in L2 still), and writes `exp(x - m) * (1 / s)` or `x - m - log(s)`.
//!
//! The output is a fresh row-major array of the input's shape. Special values give what
//! the register-cached row kernel gives: NaN or +inf anywhere in a lane makes the lane NaN,
//! -inf entries give 0 (-inf for log-softmax), and a lane of only -inf is NaN.
//! When the columns are too few to fill the GPU, more of each block's threads split `red`
//! ([`plan`]); the axis is never split over blocks, so where few long columns still leave
//! the GPU under half full the row path runs instead ([`worth`]).

use cudarc::driver::LaunchConfig;

use crate::backend::Storage;
use crate::dtype::DType;
use crate::error::Result;
use crate::shape::Layout;

use super::buffer::{cuda_of, new_storage};
use super::driver::GpuStream;
use super::launch::Launch;
use super::nvrtc;
use super::reduce::{Form, Read, col_vec, form, vec_elems};
use super::source::{PRELUDE, ctype, ftype, load, store_float};

/// Threads per block.
const BLOCK: usize = 256;
/// Most column threads of a block (at least `BLOCK / MAX_BX` threads split `red`).
const MAX_BX: usize = 64;
/// Most threads splitting `red`: with 16-byte vectors a block still reads 64 contiguous
/// bytes of each row.
const MAX_BY: usize = 64;
/// Fewest rows of `red` per thread worth another splitting thread (the rows in flight).
const MIN_ROWS: usize = 4;
/// Threads each SM is given where the shape allows (132 SMs: about 135k threads).
const THREADS_PER_SM: usize = 1024;
/// Most rows a thread reads in each pass when the plan leaves the GPU under half full
/// (few long columns): past it the transposing copy and the row kernels, which fill the
/// GPU, are expected to be faster than so few threads looping (an estimate to check on a GPU).
const MAX_ROWS_UNDERFILLED: usize = 64;
/// Least bytes of the inner run: each row of a column group is then at least one whole
/// 32-byte memory sector, so column reads stay whole-sector (coalesced); shorter inner runs
/// are transposed by the tiled copy and read as rows.
const MIN_INNER_BYTES: usize = 32;

/// How the column kernel is launched: blocks of `bx` column threads (each owning `vc`
/// consecutive columns) by `by` threads splitting the softmax axis, `gx` blocks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Plan {
    pub(crate) bx: u32,
    pub(crate) by: u32,
    pub(crate) gx: u32,
    pub(crate) vc: usize,
}

/// The in-place form of softmax over `axis` of a layout when the column kernel takes it:
/// a column read ([`Read::Cols`]) whose kept runs are exactly the axes before `axis`
/// (`no`) and after it (`ni`), so that the output in the same positions is row-major,
/// with an inner run of at least [`MIN_INNER_BYTES`]. None: the row path.
pub(crate) fn col_form(l: &Layout, axis: usize, elem_size: usize) -> Option<Form> {
    if l.numel() == 0 {
        return None;
    }
    let outer: usize = l.shape[..axis].iter().product();
    let inner: usize = l.shape[axis + 1..].iter().product();
    if inner * elem_size < MIN_INNER_BYTES {
        return None;
    }
    let f = form(&l.shape, &l.strides, &[axis])?;
    (f.read() == Some(Read::Cols) && f.no == outer && f.ni == inner && f.s2 == 1).then_some(f)
}

/// The launch plan of `cols` columns of `red` rows, `vc` columns per thread, on `sms` SMs.
pub(crate) fn plan(cols: usize, red: usize, vc: usize, sms: usize) -> Plan {
    let tx = cols.div_ceil(vc).max(1);
    // Enough threads in all, each with at least MIN_ROWS rows.
    let want = (sms.max(1) * THREADS_PER_SM).div_ceil(tx).next_power_of_two();
    let rows = (red / MIN_ROWS).max(1);
    let most = 1 << rows.ilog2();
    let by = want.min(most).clamp(BLOCK / MAX_BX, MAX_BY);
    let bx = (BLOCK / by).min(tx.next_power_of_two());
    let gx = tx.div_ceil(bx);
    Plan { bx: bx as u32, by: by as u32, gx: gx.min(u32::MAX as usize) as u32, vc }
}

/// Whether the column kernel runs with plan `p` for columns of `red` rows on `sms` SMs: unless
/// it leaves the GPU under half full with more than [`MAX_ROWS_UNDERFILLED`] rows per thread.
pub(crate) fn worth(p: &Plan, red: usize, sms: usize) -> bool {
    let threads = p.gx as usize * p.bx as usize * p.by as usize;
    2 * threads >= sms * THREADS_PER_SM || red <= p.by as usize * MAX_ROWS_UNDERFILLED
}

/// Softmax (or log-softmax) of the float storage `x` over `axis` by the column kernel, as a
/// fresh row-major storage, or None where the layout is not one it takes ([`col_form`]).
pub(crate) fn softmax(cs: &GpuStream<'_>, x: &Storage, axis: usize, log: bool) -> Result<Option<Storage>> {
    let d = x.dtype;
    let Some(f) = col_form(&x.layout, axis, d.size()) else { return Ok(None) };
    let px = cuda_of(x).map(|b| b.ptr()).unwrap_or(0) + (x.layout.offset * d.size()) as u64;
    let (cols, sms) = (f.no * f.ni, cs.dev.sms as usize);
    let vc = col_vec(&f, px, vec_elems(d));
    let mut p = plan(cols, f.red, vc, sms);
    if !worth(&p, f.red, sms) {
        return Ok(None);
    }
    let out = new_storage(cs, d, &x.layout.shape)?;
    let po = cuda_of(&out).map(|b| b.ptr()).unwrap_or(0);
    // The output's rows and column groups start where the input's do, relative to its
    // first element: vectors need both aligned (new buffers are).
    if vc > 1 && !po.is_multiple_of(16) {
        p = plan(cols, f.red, 1, sms);
    }
    let vc = p.vc;
    if p.gx as usize != cols.div_ceil(vc).div_ceil(p.bx as usize) || p.gx > i32::MAX as u32 {
        return Err(crate::error::Error::backend("softmax", format!("{cols} columns exceed the grid")));
    }
    let key = format!("softmax_cols:{log}:{}", d.name());
    let kernel = if vc > 1 { "k_smcolv" } else { "k_smcol1" };
    let fk = nvrtc::function(cs.driver(), &cs.dev, &key, kernel, || source(d, log))?;
    let (c64, ni, s1, red, sr) = (cols as i64, f.ni as i64, f.s1, f.red as i64, f.sr);
    let _ = cs.bind();
    let mut b = Launch::new(&fk);
    b.arg(&po).arg(&px).arg(&c64).arg(&ni).arg(&s1).arg(&red).arg(&sr);
    let cfg = LaunchConfig { grid_dim: (p.gx, 1, 1), block_dim: (p.bx, p.by, 1), shared_mem_bytes: 0 };
    // SAFETY: `x` addresses `(c / ni) * s1 + c % ni + r * sr` for every column c < cols and
    // row r < red (its form); `out` holds cols*red contiguous elements, written at
    // `(c / ni) * red * ni + r * ni + c % ni`. With vectors (`vc > 1`) both are 16-byte
    // aligned at every row of every column group (`col_vec`, `ni % vc == 0`).
    unsafe { b.launch(cs, cfg) }.map_err(|e| super::backend_err("launch", e))?;
    Ok(Some(out))
}

/// The column softmax module: `k_smcol1` (one column per thread) and `k_smcolv` (`VN`
/// consecutive columns per thread, 16-byte loads and stores), both
/// `(T* out, const T* x, i64 cols, i64 ni, i64 s1, i64 red, i64 sr)`, launched with a
/// `(bx, by)` block (`by` a power of two) on a `gx` grid. The exp and log, and the final
/// `exp(x - m) * (1 / s)` and `x - m - log(s)`, are those of the register-cached row kernel.
pub(crate) fn source(d: DType, log: bool) -> String {
    format!("{PRELUDE}{}", kernels(d, log))
}

/// The module of [`source`] after the prelude (its fixed-width types and f16/bf16
/// conversions): what the host test compiles with a prelude of its own.
fn kernels(d: DType, log: bool) -> String {
    let (t, f) = (ctype(d), ftype(d));
    let sfx = if f == "float" { "f" } else { "" };
    let vn = vec_elems(d);
    let (lowest, inf, nan) = if f == "float" {
        ("(-__int_as_float(0x7f7fffff))", "__int_as_float(0x7f800000)", "__int_as_float(0x7fc00000)")
    } else {
        (
            "(-__longlong_as_double(0x7fefffffffffffffll))",
            "__longlong_as_double(0x7ff0000000000000ll)",
            "__longlong_as_double(0x7ff8000000000000ll)",
        )
    };
    let ld = load(d, "q");
    let st = store_float(d, "y", d == DType::F64);
    // `g`: 1 / s, or log(s); `res`: the output of `v` in the column with maximum `m`.
    let (fin, res) =
        if log { (format!("log{sfx}(s[k])"), "v - m - g") } else { ("(F)1 / s[k]".to_string(), "exp{sfx}(v - m) * g") };
    let res = res.replace("{sfx}", sfx);
    format!(
        r#"
#define VN {vn}
template <typename T, int N> struct alignas(sizeof(T) * N) V {{ T v[N]; }};
typedef {t} T;
typedef {f} F;
__device__ __forceinline__ F ldv(T q) {{ return {ld}; }}
__device__ __forceinline__ T stv(F y) {{ return {st}; }}
__device__ __forceinline__ T outv(F v, F m, F g) {{ F y = {res}; return stv(y); }}
// Merges (m2, s2) into (m, s): `m` a running maximum (the lowest finite value when none),
// `s` the sum of exp(x - m) over the values counted; an element `x` is the pair (x, 1).
// The smaller maximum's sum is scaled by exp(-|m - m2|): one exp. -inf adds exp(-inf) = 0;
// a NaN element, or a second +inf, makes `s` NaN (exp(NaN)), and `m` is never NaN.
__device__ __forceinline__ void merge(F& m, F& s, F m2, F s2) {{
    F d = m2 - m, e = exp{sfx}(-fabs{sfx}(d));
    bool up = d > (F)0;
    s = up ? s * e + s2 : s + s2 * e;
    m = up ? m2 : m;
}}
// Columns `c0 .. c0 + VC` of one column group (`ni % VC == 0`) over the rows `ty, ty + by,
// ..` below `red`.
template <int VC>
__device__ __forceinline__ void col(T* __restrict__ out, const T* __restrict__ x, i64 cols, i64 ni, i64 s1, i64 red, i64 sr, F* shm, F* shs) {{
    int tx = threadIdx.x, ty = threadIdx.y, bx = blockDim.x, by = blockDim.y;
    i64 c0 = ((i64)blockIdx.x * bx + tx) * VC;
    bool ok = c0 < cols;
    F m[VC], s[VC];
#pragma unroll
    for (int k = 0; k < VC; ++k) {{ m[k] = {lowest}; s[k] = (F)0; }}
    const T* p = x;
    T* o = out;
    if (ok) {{
        p = x + (c0 / ni) * s1 + (c0 % ni);
        o = out + (c0 / ni) * (red * ni) + (c0 % ni);
        // Pass 1: four rows in flight.
        i64 r = ty;
        for (; r + 3 * by < red; r += 4 * by) {{
            V<T, VC> q0 = *(const V<T, VC>*)(p + r * sr);
            V<T, VC> q1 = *(const V<T, VC>*)(p + (r + by) * sr);
            V<T, VC> q2 = *(const V<T, VC>*)(p + (r + 2 * by) * sr);
            V<T, VC> q3 = *(const V<T, VC>*)(p + (r + 3 * by) * sr);
#pragma unroll
            for (int k = 0; k < VC; ++k) {{
                merge(m[k], s[k], ldv(q0.v[k]), (F)1);
                merge(m[k], s[k], ldv(q1.v[k]), (F)1);
                merge(m[k], s[k], ldv(q2.v[k]), (F)1);
                merge(m[k], s[k], ldv(q3.v[k]), (F)1);
            }}
        }}
        for (; r < red; r += by) {{
            V<T, VC> q0 = *(const V<T, VC>*)(p + r * sr);
#pragma unroll
            for (int k = 0; k < VC; ++k) merge(m[k], s[k], ldv(q0.v[k]), (F)1);
        }}
    }}
    // The block's `by` pairs of each column: a shared-memory tree (ty < h takes ty + h),
    // then every thread reads the total from the slots of ty == 0.
    if (by > 1) {{
        int me = (ty * bx + tx) * VC;
#pragma unroll
        for (int k = 0; k < VC; ++k) {{ shm[me + k] = m[k]; shs[me + k] = s[k]; }}
        __syncthreads();
        for (int h = by >> 1; h > 0; h >>= 1) {{
            if (ty < h) {{
                int you = ((ty + h) * bx + tx) * VC;
#pragma unroll
                for (int k = 0; k < VC; ++k) {{
                    merge(m[k], s[k], shm[you + k], shs[you + k]);
                    shm[me + k] = m[k];
                    shs[me + k] = s[k];
                }}
            }}
            __syncthreads();
        }}
#pragma unroll
        for (int k = 0; k < VC; ++k) {{ m[k] = shm[tx * VC + k]; s[k] = shs[tx * VC + k]; }}
    }}
    if (!ok) return;
    F g[VC];
#pragma unroll
    for (int k = 0; k < VC; ++k) {{
        // A +inf maximum: the row kernels' sum holds exp(inf - inf) = NaN.
        if (m[k] == {inf}) s[k] = {nan};
        g[k] = {fin};
    }}
    // Pass 2: this thread's rows from its last one down, four in flight.
    i64 r = ty < red ? ty + (red - 1 - ty) / by * by : -1;
    for (; r >= 3 * by; r -= 4 * by) {{
        V<T, VC> q0 = *(const V<T, VC>*)(p + r * sr);
        V<T, VC> q1 = *(const V<T, VC>*)(p + (r - by) * sr);
        V<T, VC> q2 = *(const V<T, VC>*)(p + (r - 2 * by) * sr);
        V<T, VC> q3 = *(const V<T, VC>*)(p + (r - 3 * by) * sr);
        V<T, VC> y0, y1, y2, y3;
#pragma unroll
        for (int k = 0; k < VC; ++k) {{
            y0.v[k] = outv(ldv(q0.v[k]), m[k], g[k]);
            y1.v[k] = outv(ldv(q1.v[k]), m[k], g[k]);
            y2.v[k] = outv(ldv(q2.v[k]), m[k], g[k]);
            y3.v[k] = outv(ldv(q3.v[k]), m[k], g[k]);
        }}
        *(V<T, VC>*)(o + r * ni) = y0;
        *(V<T, VC>*)(o + (r - by) * ni) = y1;
        *(V<T, VC>*)(o + (r - 2 * by) * ni) = y2;
        *(V<T, VC>*)(o + (r - 3 * by) * ni) = y3;
    }}
    for (; r >= 0; r -= by) {{
        V<T, VC> q0 = *(const V<T, VC>*)(p + r * sr);
        V<T, VC> y0;
#pragma unroll
        for (int k = 0; k < VC; ++k) y0.v[k] = outv(ldv(q0.v[k]), m[k], g[k]);
        *(V<T, VC>*)(o + r * ni) = y0;
    }}
}}
extern "C" __global__ void __launch_bounds__({BLOCK}) k_smcol1(T* __restrict__ out, const T* __restrict__ x, i64 cols, i64 ni, i64 s1, i64 red, i64 sr) {{
    __shared__ F shm[{BLOCK}];
    __shared__ F shs[{BLOCK}];
    col<1>(out, x, cols, ni, s1, red, sr, shm, shs);
}}
extern "C" __global__ void __launch_bounds__({BLOCK}) k_smcolv(T* __restrict__ out, const T* __restrict__ x, i64 cols, i64 ni, i64 s1, i64 red, i64 sr) {{
    __shared__ F shm[{BLOCK} * VN];
    __shared__ F shs[{BLOCK} * VN];
    col<VN>(out, x, cols, ni, s1, red, sr, shm, shs);
}}
"#
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::cuda::nvrtc::check_compiles;

    const FLOATS: [DType; 4] = [DType::F32, DType::F16, DType::BF16, DType::F64];

    /// Every variant (dtype, log, scalar and vector kernel) compiles for sm_90.
    #[test]
    fn softmax_col_kernels_compile() {
        for d in FLOATS {
            for log in [false, true] {
                let src = source(d, log);
                assert!(src.contains("k_smcol1") && src.contains("k_smcolv"));
                if !check_compiles(&format!("test:softmax_cols:{log}:{}", d.name()), &src) {
                    return;
                }
            }
        }
    }

    #[test]
    fn plans_fill_the_gpu_and_pick_the_path() {
        let sms = 132;
        // [512, 512, 1024] over axis 1: 2^19 columns, 8 bf16 per thread; the columns fill
        // the GPU, four threads split each column's 512 rows.
        assert_eq!(plan(512 * 1024, 512, 8, sms), Plan { bx: 64, by: 4, gx: 1024, vc: 8 });
        // [128, 128, 256] over axis 1: 32768 columns, 4096 vector threads; 32 threads split
        // the 128 rows (four each) so that 131072 threads run.
        assert_eq!(plan(128 * 256, 128, 8, sms), Plan { bx: 8, by: 32, gx: 512, vc: 8 });
        assert_eq!(plan(128 * 256, 128, 4, sms), Plan { bx: 8, by: 32, gx: 1024, vc: 4 });
        assert_eq!(plan(128 * 256, 128, 1, sms), Plan { bx: 32, by: 8, gx: 1024, vc: 1 });
        // [3, 700, 40] f32: 30 vector threads; the most threads (64) split the 700 rows.
        assert_eq!(plan(3 * 40, 700, 4, sms), Plan { bx: 4, by: 64, gx: 8, vc: 4 });
        // Short axes are not split below four rows per thread (but by >= 4).
        assert_eq!(plan(4096, 2, 1, sms), Plan { bx: 64, by: 4, gx: 64, vc: 1 });
        assert_eq!(plan(16, 3, 1, sms), Plan { bx: 16, by: 4, gx: 1, vc: 1 });
        assert_eq!(plan(1, 100000, 1, 1), Plan { bx: 1, by: 64, gx: 1, vc: 1 });
        // Few long columns leave the GPU idle: the row path, unless each thread's share of
        // the axis is short.
        let worth_it = |cols, red, vc| worth(&plan(cols, red, vc, sms), red, sms);
        assert!(worth_it(512 * 1024, 512, 8) && worth_it(128 * 256, 128, 8) && worth_it(128 * 256, 128, 1));
        assert!(worth_it(120, 700, 4) && worth_it(120, 4096, 4) && !worth_it(120, 4097, 4));
        assert!(!worth_it(256, 100_000, 4) && worth_it(1 << 16, 100_000, 4));

        // Which layouts take the column kernel.
        let c = |shape: &[usize], axis: usize, size: usize| col_form(&Layout::contiguous(shape), axis, size);
        let f = c(&[512, 512, 1024], 1, 2).unwrap();
        assert_eq!((f.no, f.red, f.ni, f.s1, f.sr, f.s2), (512, 512, 1024, 512 * 1024, 1024, 1));
        assert!(c(&[128, 128, 256], 1, 2).is_some());
        assert!(c(&[128, 128, 256], 0, 4).is_some());
        assert!(c(&[4, 5, 16], 1, 2).is_some() && c(&[4, 5, 15], 1, 2).is_none());
        assert!(c(&[4, 5, 8], 1, 4).is_some() && c(&[4, 5, 7], 1, 4).is_none());
        assert!(c(&[4, 5, 4], 1, 8).is_some() && c(&[4, 5, 3], 1, 8).is_none());
        // Tiny inner extents, the last axis, size-1 axes and empty arrays: the row path.
        assert!(c(&[100, 100, 2], 1, 4).is_none());
        assert!(c(&[100, 100], 1, 4).is_none());
        assert!(c(&[100, 1, 64], 1, 4).is_none());
        assert!(c(&[0, 5, 64], 1, 4).is_none());
        assert!(c(&[5, 64, 1, 1], 1, 4).is_none());
        // Size-1 axes after the axis do not hide the inner run; before it, not the outer.
        assert!(c(&[3, 1, 5, 1, 16, 1], 2, 4).is_some());
        // A slice of the last axis (rows strided, the inner run still stride 1) reads in
        // place; so does a permutation that moves only size-1 axes. Other permutations leave
        // runs that do not merge into [outer, red, inner]: the row path.
        let sl = Layout { shape: vec![4, 5, 16].into(), strides: vec![5 * 20, 20, 1].into(), offset: 2 };
        assert_eq!(col_form(&sl, 1, 4).map(|f| (f.s1, f.sr)), Some((100, 20)));
        let ones = Layout::contiguous(&[4, 1, 5, 16]).permute(&[1, 0, 2, 3]);
        assert_eq!(col_form(&ones, 2, 4).map(|f| (f.no, f.red, f.ni)), Some((4, 5, 16)));
        let outer = Layout::contiguous(&[6, 4, 5, 16]).permute(&[1, 0, 2, 3]);
        assert!(col_form(&outer, 2, 4).is_none());
        let inner = Layout::contiguous(&[4, 5, 16, 8]).permute(&[0, 1, 3, 2]);
        assert!(col_form(&inner, 1, 4).is_none());
        // A transposed matrix over its strided last axis (read as columns by the
        // reductions): the row path, which reads its stride-1 axis in place.
        let t = Layout::contiguous(&[64, 32]).permute(&[1, 0]);
        assert!(col_form(&t, 1, 4).is_none());
    }

    /// Every plan over generated shapes stays within the block and grid limits and leaves
    /// no column without a thread.
    #[test]
    fn generated_plans_cover_every_column() {
        let sizes = [1usize, 2, 3, 4, 5, 7, 8, 31, 64, 100, 700, 1024, 4097, 1 << 16, 1 << 20, 1 << 26];
        for sms in [1, 78, 132] {
            for &cols in &sizes {
                for &red in &sizes {
                    for vc in [1, 2, 4, 8] {
                        let p = plan(cols, red, vc, sms);
                        let (bx, by) = (p.bx as usize, p.by as usize);
                        assert!(bx * by <= BLOCK && bx.is_power_of_two() && by.is_power_of_two(), "{p:?}");
                        assert!((BLOCK / MAX_BX..=MAX_BY).contains(&by), "{p:?}");
                        assert!(p.gx as usize * bx * vc >= cols && (p.gx as usize - 1) * bx * vc < cols, "{p:?}");
                        // More splitting threads only where each keeps MIN_ROWS rows.
                        assert!(by == BLOCK / MAX_BX || by * MIN_ROWS <= red, "{p:?} {red}");
                        // The GPU is given its threads unless the shape has too few.
                        let threads = p.gx as usize * bx * by;
                        assert!(threads >= sms * THREADS_PER_SM || by == MAX_BY || by * MIN_ROWS * 2 > red, "{p:?}");
                    }
                }
            }
        }
    }

    /// A host copy of the kernel's index arithmetic (`col` in [`source`]): for each thread of
    /// each block, the input offsets pass 1 reads, pass 2 reads, and the output offsets pass
    /// 2 writes, with the rows in the kernel's order.
    struct Visits {
        pass1: Vec<i64>,
        pass2: Vec<i64>,
        writes: Vec<i64>,
        /// Whether every thread's pass-2 rows are its own (`r % by == ty`), in descending order.
        order_ok: bool,
    }

    fn visit(p: &Plan, f: &Form) -> Visits {
        let (cols, ni, s1, red, sr) = ((f.no * f.ni) as i64, f.ni as i64, f.s1, f.red as i64, f.sr);
        let (bx, by, vc) = (p.bx as i64, p.by as i64, p.vc as i64);
        let mut v = Visits { pass1: Vec::new(), pass2: Vec::new(), writes: Vec::new(), order_ok: true };
        for block in 0..p.gx as i64 {
            for ty in 0..by {
                for tx in 0..bx {
                    let c0 = (block * bx + tx) * vc;
                    if c0 >= cols {
                        continue;
                    }
                    let pb = (c0 / ni) * s1 + (c0 % ni);
                    let ob = (c0 / ni) * (red * ni) + (c0 % ni);
                    let vecs = |r: i64, to: &mut Vec<i64>, base: i64, st: i64| {
                        to.extend((0..vc).map(|k| base + r * st + k));
                    };
                    let mut r = ty;
                    while r + 3 * by < red {
                        for u in 0..4 {
                            vecs(r + u * by, &mut v.pass1, pb, sr);
                        }
                        r += 4 * by;
                    }
                    while r < red {
                        vecs(r, &mut v.pass1, pb, sr);
                        r += by;
                    }
                    let mut r = if ty < red { ty + (red - 1 - ty) / by * by } else { -1 };
                    let mut last = i64::MAX;
                    let mut row = |r: i64, v: &mut Visits| {
                        v.order_ok &= r < last && r % by == ty;
                        last = r;
                        vecs(r, &mut v.pass2, pb, sr);
                        vecs(r, &mut v.writes, ob, ni);
                    };
                    while r >= 3 * by {
                        for u in 0..4 {
                            row(r - u * by, &mut v);
                        }
                        r -= 4 * by;
                    }
                    while r >= 0 {
                        row(r, &mut v);
                        r -= by;
                    }
                }
            }
        }
        v
    }

    /// Over generated layouts (contiguous, sliced, permuted) and every axis: where the column
    /// kernel takes a layout, its threads read every element of the input exactly once in
    /// each pass and write every element of the row-major output exactly once, at the
    /// position of the element they read; vectors stay inside one column group.
    #[test]
    fn generated_shapes_visit_every_element_once() {
        let mut seed = 3u64;
        let mut next = |n: usize| {
            seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            ((seed >> 33) as usize) % n
        };
        let (mut taken, mut vectors, mut split) = (0, 0, 0);
        for case in 0..1500 {
            let nd = 2 + next(3);
            let shape: Vec<usize> = (0..nd).map(|_| [1, 2, 3, 5, 8, 16, 24, 33, 40][next(9)]).collect();
            let mut l = Layout::contiguous(&shape);
            match case % 3 {
                1 => {
                    // A slice: one axis of a larger array, starting one element in.
                    let mut big = shape.clone();
                    let a = next(nd);
                    big[a] += 3;
                    let bl = Layout::contiguous(&big);
                    l = Layout { shape: l.shape.clone(), strides: bl.strides.clone(), offset: bl.strides[a] as usize };
                }
                2 => {
                    let mut perm: Vec<usize> = (0..nd).collect();
                    for i in (1..nd).rev() {
                        perm.swap(i, next(i + 1));
                    }
                    l = Layout::contiguous(&shape).permute(&perm);
                }
                _ => {}
            }
            let axis = next(nd);
            let size = [2, 4, 8][next(3)];
            let Some(f) = col_form(&l, axis, size) else { continue };
            taken += 1;
            let vn = 16 / size;
            // Vectors where the form allows them (an aligned base), else one column.
            let vc = col_vec(&f, 0, vn);
            let sms = [1, 2, 132][next(3)];
            let p = plan(f.no * f.ni, f.red, vc, sms);
            vectors += usize::from(vc > 1);
            split += usize::from(p.by > 4);
            let v = visit(&p, &f);
            assert!(v.order_ok, "{l:?} {axis} {p:?}");
            // Input offsets of every element, by a multi-index walk.
            let n = l.numel();
            let mut want: Vec<i64> = Vec::with_capacity(n);
            for flat in 0..n {
                let mut idx = vec![0; nd];
                let mut r = flat;
                for i in (0..nd).rev() {
                    idx[i] = r % l.shape[i];
                    r /= l.shape[i];
                }
                want.push(l.offset_of(&idx) as i64 - l.offset as i64);
            }
            for (pass, got) in [("pass 1", &v.pass1), ("pass 2", &v.pass2)] {
                let mut got = got.clone();
                got.sort_unstable();
                let mut w = want.clone();
                w.sort_unstable();
                assert_eq!(got, w, "{pass} {l:?} axis {axis} {p:?}");
            }
            // Pass 2 writes, at the row-major position of each element, the element it read.
            let mut out = vec![-1i64; n];
            for (&w, &r) in v.writes.iter().zip(&v.pass2) {
                assert_eq!(out[w as usize], -1, "written twice: {l:?} axis {axis} {p:?}");
                out[w as usize] = r;
            }
            assert_eq!(out, want, "{l:?} axis {axis} {p:?}");
            if vc > 1 {
                assert!(f.ni % vc == 0 && f.s1 % vc as i64 == 0 && f.sr % vc as i64 == 0);
            }
        }
        assert!(taken > 200 && vectors > 50 && split > 50, "{taken} {vectors} {split}");
    }

    /// The kernel's `merge` on the host (f32, as the kernel computes f16/bf16/f32).
    fn merge(m: &mut f32, s: &mut f32, m2: f32, s2: f32) {
        let d = m2 - *m;
        let e = (-d.abs()).exp();
        let up = d > 0.0;
        *s = if up { *s * e + s2 } else { *s + s2 * e };
        *m = if up { m2 } else { *m };
    }

    /// One column through the kernel's steps on the host: each of `by` threads merges its
    /// rows, the tree combines them, the +inf fix-up, then pass 2's outputs.
    fn column(x: &[f32], by: usize, log: bool) -> Vec<f32> {
        let mut ms = vec![(f32::MIN, 0.0f32); by];
        for (ty, (m, s)) in ms.iter_mut().enumerate() {
            for &v in x.iter().skip(ty).step_by(by) {
                merge(m, s, v, 1.0);
            }
        }
        let mut h = by / 2;
        while h > 0 {
            for ty in 0..h {
                let (m2, s2) = ms[ty + h];
                let (m, s) = &mut ms[ty];
                merge(m, s, m2, s2);
            }
            h /= 2;
        }
        let (m, mut s) = ms[0];
        if m == f32::INFINITY {
            s = f32::NAN;
        }
        let g = if log { s.ln() } else { 1.0 / s };
        x.iter().map(|&v| if log { v - m - g } else { (v - m).exp() * g }).collect()
    }

    /// The kernel's arithmetic gives the float64 reference's values, NaN where it has NaN
    /// (NaN or +inf in the lane, a lane of only -inf), 0 or -inf for -inf entries.
    #[test]
    fn online_pairs_match_the_reference_with_special_values() {
        let (inf, nan) = (f32::INFINITY, f32::NAN);
        let lanes: [&[f32]; 9] = [
            &[1.0, 2.0, 3.0, -1.0, 0.5, 7.0, 2.0],
            &[1.0, nan, 2.0, 3.0],
            &[-inf, 0.0, -inf, 1.0, 2.0, -inf, 3.0, 4.0, -inf],
            &[-inf, -inf, -inf, -inf, -inf],
            &[1.0, inf, 2.0],
            &[inf, inf, 1.0, 2.0, 3.0],
            &[-80.0, 0.0, -85.0, -90.0, -200.0, 10.0, 20.0, 30.0, 80.0],
            &[f32::MIN, f32::MIN, -inf],
            // `x - lowest` overflows to +inf in the first merge; `x - m` stays finite.
            &[2.0e38, -1.0e38, 1.0, 2.0e38],
        ];
        for x in lanes {
            let xv: Vec<f64> = x.iter().map(|&v| v as f64).collect();
            let m = xv.iter().copied().fold(f64::NEG_INFINITY, f64::max);
            let s: f64 = xv.iter().map(|v| (v - m).exp()).sum();
            for log in [false, true] {
                let want: Vec<f64> = xv.iter().map(|v| if log { v - m - s.ln() } else { (v - m).exp() / s }).collect();
                for by in [1, 2, 4, 8, 16] {
                    let got = column(x, by, log);
                    for (i, (&g, &w)) in got.iter().zip(&want).enumerate() {
                        let ok = if w.is_nan() {
                            g.is_nan()
                        } else if w.is_infinite() {
                            g as f64 == w
                        } else {
                            (g as f64 - w).abs() <= 1e-5 * (1.0 + w.abs())
                        };
                        assert!(ok, "{x:?} log={log} by={by} element {i}: got {g}, want {w}");
                    }
                }
            }
        }
    }

    /// The CUDA names the kernels use, for a host C++ compiler: each CUDA thread of a block
    /// is a host thread, `__syncthreads` a barrier (counted per thread, so that a barrier not
    /// reached by every thread is seen), `__shared__` arrays statics shared by the block's
    /// threads (blocks run one at a time), the f32/f64 bit casts and the bf16 conversions of
    /// the prelude.
    const HOST_PRELUDE: &str = r#"
#include <barrier>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <math.h>
#include <thread>
#include <vector>
typedef unsigned char u8;
typedef unsigned short u16;
typedef unsigned int u32;
typedef int i32;
typedef long long i64;
typedef unsigned long long u64;
struct dim3 { unsigned x = 0, y = 0, z = 0; };
thread_local dim3 threadIdx, blockIdx;
dim3 blockDim, gridDim;
std::barrier<>* block_barrier;
thread_local int syncs;
inline void __syncthreads() { ++syncs; block_barrier->arrive_and_wait(); }
#define __device__
#define __forceinline__ inline
#define __global__
#define __launch_bounds__(n)
#define __shared__ static
inline float __int_as_float(int i) { float f; memcpy(&f, &i, 4); return f; }
inline float __uint_as_float(u32 i) { float f; memcpy(&f, &i, 4); return f; }
inline u32 __float_as_uint(float f) { u32 i; memcpy(&i, &f, 4); return i; }
inline double __longlong_as_double(long long i) { double d; memcpy(&d, &i, 8); return d; }
inline float ld_bf16(u16 b) {
    u32 u = ((u32)b) << 16;
    if ((b & 0x7fffu) > 0x7f80u) u |= 0x400000u;
    return __uint_as_float(u);
}
inline u16 st_bf16(float f) {
    u32 x = __float_as_uint(f);
    if ((x & 0x7fffffffu) > 0x7f800000u) return (u16)((x >> 16) | 0x40u);
    if ((x & 0x8000u) != 0u && (x & (3u * 0x8000u - 1u)) != 0u) return (u16)((x >> 16) + 1u);
    return (u16)(x >> 16);
}
typedef void (*Launch)(int vec, void* out, const void* x, i64 cols, i64 ni, i64 s1, i64 red, i64 sr);
"#;

    /// Runs variant `argv[1]` on the input file `argv[2]` (raw elements) into `argv[3]`:
    /// `vec cols ni s1 red sr gx bx by offset`, the output first filled
    /// with the bytes 0x5a (a large finite value in every dtype: an element never written
    /// cannot pass). Exit 3: the threads of a block passed different numbers of barriers.
    const HOST_MAIN: &str = r#"
int main(int argc, char** argv) {
    if (argc != 14) return 2;
    int v = atoi(argv[1]);
    int vec = atoi(argv[4]);
    i64 cols = atoll(argv[5]), ni = atoll(argv[6]), s1 = atoll(argv[7]), red = atoll(argv[8]), sr = atoll(argv[9]);
    unsigned gx = atoi(argv[10]), bx = atoi(argv[11]), by = atoi(argv[12]);
    i64 off = atoll(argv[13]);
    size_t es = SIZES[v];
    FILE* f = fopen(argv[2], "rb");
    if (!f) return 2;
    fseek(f, 0, SEEK_END);
    size_t bytes = ftell(f);
    fseek(f, 0, SEEK_SET);
    void* in = nullptr;
    void* out = nullptr;
    size_t obytes = (size_t)(cols * red) * es;
    if (posix_memalign(&in, 64, bytes) || posix_memalign(&out, 64, obytes)) return 2;
    if (fread(in, 1, bytes, f) != bytes) return 2;
    fclose(f);
    memset(out, 0x5a, obytes);
    blockDim.x = bx;
    blockDim.y = by;
    gridDim.x = gx;
    gridDim.y = 1;
    // One host thread per thread of a block, running the blocks in turn; a barrier ends
    // each block (its shared arrays are reused by the next).
    unsigned nt = bx * by;
    std::barrier<> bar(nt);
    block_barrier = &bar;
    std::vector<int> counts((size_t)gx * nt);
    std::vector<std::thread> ts;
    for (unsigned ty = 0; ty < by; ++ty)
        for (unsigned tx = 0; tx < bx; ++tx)
            ts.emplace_back([&, tx, ty] {
                threadIdx.x = tx;
                threadIdx.y = ty;
                for (unsigned b = 0; b < gx; ++b) {
                    blockIdx.x = b;
                    syncs = 0;
                    LAUNCH[v](vec, out, (const char*)in + off * es, cols, ni, s1, red, sr);
                    counts[(size_t)b * nt + ty * bx + tx] = syncs;
                    bar.arrive_and_wait();
                }
                bar.arrive_and_drop();
            });
    for (auto& t : ts) t.join();
    for (unsigned b = 0; b < gx; ++b)
        for (unsigned t = 0; t < nt; ++t)
            if (counts[(size_t)b * nt + t] != counts[(size_t)b * nt]) return 3;
    f = fopen(argv[3], "wb");
    if (!f || fwrite(out, 1, obytes, f) != obytes) return 2;
    fclose(f);
    free(in);
    free(out);
    return 0;
}
"#;

    /// The dtypes the host test runs (f16 differs from bf16 only in the prelude's
    /// conversions, which are inline PTX).
    const HOST_DTYPES: [DType; 3] = [DType::F32, DType::BF16, DType::F64];

    /// Compiles every host variant (`HOST_DTYPES` x softmax, log-softmax) into one program
    /// in `dir`, with AddressSanitizer where the compiler has it (out-of-bounds loads and
    /// stores fail the run). None (after a skip line) without a C++20 compiler.
    fn host_program(dir: &std::path::Path) -> Option<std::path::PathBuf> {
        use std::process::Command;
        let probe = dir.join("probe.cpp");
        std::fs::write(&probe, "#include <barrier>\nint main() { std::barrier<> b(1); b.arrive_and_wait(); }\n")
            .ok()?;
        let works = |flags: &[&str]| {
            let exe = dir.join("probe");
            let mut build = Command::new("c++");
            build.args(["-std=c++20", "-pthread"]).args(flags).arg(&probe).arg("-o").arg(&exe);
            build.status().is_ok_and(|s| s.success()) && Command::new(&exe).status().is_ok_and(|s| s.success())
        };
        let Some(flags) = [&["-fsanitize=address"][..], &[]].into_iter().find(|f| works(f)) else {
            println!("skipped: no C++20 compiler (c++) to run the kernels on the host");
            return None;
        };
        let mut src = HOST_PRELUDE.to_string();
        let (mut launches, mut sizes) = (Vec::new(), Vec::new());
        for (i, (d, log)) in HOST_DTYPES.iter().flat_map(|&d| [(d, false), (d, true)]).enumerate() {
            // C++ linkage: the kernels of each variant live in their own namespace.
            let body = kernels(d, log).replace("extern \"C\" ", "");
            src += &format!(
                "#undef VN\nnamespace v{i} {{\n{body}\nvoid launch(int vec, void* out, const void* x, i64 cols, i64 ni, i64 s1, i64 red, i64 sr) {{\n    if (vec) k_smcolv((T*)out, (const T*)x, cols, ni, s1, red, sr);\n    else k_smcol1((T*)out, (const T*)x, cols, ni, s1, red, sr);\n}}\n}}\n"
            );
            launches.push(format!("v{i}::launch"));
            sizes.push(d.size().to_string());
        }
        src += &format!("Launch LAUNCH[] = {{{}}};\nsize_t SIZES[] = {{{}}};\n", launches.join(", "), sizes.join(", "));
        src += HOST_MAIN;
        let path = dir.join("softmax_cols.cpp");
        std::fs::write(&path, src).unwrap();
        let exe = dir.join("softmax_cols");
        let out = Command::new("c++")
            .args(["-std=c++20", "-pthread", "-O1", "-g", "-Wall", "-Wno-unknown-pragmas"])
            .args(flags)
            .arg(&path)
            .arg("-o")
            .arg(&exe)
            .output()
            .unwrap();
        assert!(out.status.success(), "host build failed:\n{}", String::from_utf8_lossy(&out.stderr));
        Some(exe)
    }

    /// `v` rounded to `d`, as its little-endian bytes and its value.
    fn host_elem(d: DType, v: f64) -> (Vec<u8>, f64) {
        match d {
            DType::F32 => ((v as f32).to_le_bytes().to_vec(), v as f32 as f64),
            DType::BF16 => {
                let b = half::bf16::from_f64(v);
                (b.to_bits().to_le_bytes().to_vec(), b.to_f64())
            }
            _ => (v.to_le_bytes().to_vec(), v),
        }
    }

    fn host_value(d: DType, b: &[u8]) -> f64 {
        match d {
            DType::F32 => f32::from_le_bytes(b.try_into().unwrap()) as f64,
            DType::BF16 => half::bf16::from_bits(u16::from_le_bytes(b.try_into().unwrap())).to_f64(),
            _ => f64::from_le_bytes(b.try_into().unwrap()),
        }
    }

    /// The generated CUDA text itself, run on the host (see [`HOST_PRELUDE`]): contiguous,
    /// sliced and strided layouts, vector and single-column kernels, plans for one SM and for
    /// 132 (the axis split over 4 to 64 threads), NaN and infinite entries and a lane of only
    /// -inf, against the float64 softmax of each lane; out-of-bounds accesses fail under
    /// AddressSanitizer, an element never written fails the comparison.
    #[test]
    fn kernels_run_on_the_host() {
        let dir = tempfile::tempdir().unwrap();
        let Some(exe) = host_program(dir.path()) else { return };
        // (logical shape, strides, offset, axis)
        let sliced = |shape: &[usize], big: &[usize], start: &[usize], step: &[usize]| {
            let bl = Layout::contiguous(big);
            let strides: Vec<isize> = bl.strides.iter().zip(step).map(|(&s, &k)| s * k as isize).collect();
            let offset = bl.offset_of(start);
            Layout { shape: shape.to_vec().into(), strides: strides.into(), offset }
        };
        let cases: Vec<(Layout, usize)> = vec![
            (Layout::contiguous(&[2, 6, 16]), 1),
            (Layout::contiguous(&[3, 70, 40]), 1),
            (Layout::contiguous(&[2, 129, 24]), 1),
            (Layout::contiguous(&[3, 5, 2, 16]), 0),
            (Layout::contiguous(&[3, 5, 2, 16]), 1),
            (sliced(&[5, 9, 17], &[5, 11, 20], &[0, 1, 2], &[1, 1, 1]), 1),
            (sliced(&[4, 7, 32], &[4, 15, 32], &[0, 1, 0], &[1, 2, 1]), 1),
            (sliced(&[3, 37, 16], &[3, 40, 24], &[0, 2, 8], &[1, 1, 1]), 1),
        ];
        let mut seed = 11u64;
        let mut uniform = || {
            seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            (seed >> 11) as f64 / (1u64 << 53) as f64 * 8.0 - 4.0
        };
        let mut runs = [0usize; 2];
        for (case, (l, axis)) in cases.iter().enumerate() {
            let (lo, hi) = l.span();
            assert_eq!(lo, l.offset);
            let mut vals: Vec<f64> = (0..hi).map(|_| uniform()).collect();
            if case == 0 {
                // Lanes of [0, :, c]: c = 0 all -inf, 1 a NaN, 2 +inf, 3 two +inf, 4 -inf entries.
                for r in 0..6 {
                    vals[r * 16] = f64::NEG_INFINITY;
                }
                vals[2 * 16 + 1] = f64::NAN;
                vals[3 * 16 + 2] = f64::INFINITY;
                vals[16 + 3] = f64::INFINITY;
                vals[5 * 16 + 3] = f64::INFINITY;
                vals[4] = f64::NEG_INFINITY;
                vals[5 * 16 + 4] = f64::NEG_INFINITY;
            }
            for (vi, (d, log)) in HOST_DTYPES.iter().flat_map(|&d| [(d, false), (d, true)]).enumerate() {
                let Some(f) = col_form(l, *axis, d.size()) else { continue };
                let es = d.size();
                let mut bytes = Vec::with_capacity(hi * es);
                let mut rounded = Vec::with_capacity(hi);
                for &v in &vals {
                    let (b, r) = host_elem(d, v);
                    bytes.extend(b);
                    rounded.push(r);
                }
                let input = dir.path().join("in.bin");
                std::fs::write(&input, &bytes).unwrap();
                // The float64 reference over the logical row-major elements.
                let n = l.numel();
                let (nd, shape) = (l.shape.len(), &l.shape);
                let logical: Vec<f64> = (0..n)
                    .map(|flat| {
                        let (mut idx, mut r) = (vec![0; nd], flat);
                        for k in (0..nd).rev() {
                            idx[k] = r % shape[k];
                            r /= shape[k];
                        }
                        rounded[l.offset_of(&idx)]
                    })
                    .collect();
                let (outer, red) = (shape[..*axis].iter().product::<usize>(), shape[*axis]);
                let inner: usize = shape[axis + 1..].iter().product();
                let mut want = vec![0.0; n];
                for o in 0..outer {
                    for i in 0..inner {
                        let at = |r: usize| o * red * inner + r * inner + i;
                        let m = (0..red).map(|r| logical[at(r)]).fold(f64::NEG_INFINITY, f64::max);
                        let s: f64 = (0..red).map(|r| (logical[at(r)] - m).exp()).sum();
                        for r in 0..red {
                            let x = logical[at(r)];
                            want[at(r)] = if log { x - m - s.ln() } else { (x - m).exp() / s };
                        }
                    }
                }
                let tol = match d {
                    DType::F64 => 2e-12,
                    DType::F32 => 4e-5,
                    _ => 3.2e-2,
                };
                // Element offsets 16-byte aligned as the host buffer (64-byte aligned) is.
                let px = (l.offset * es) as u64;
                let vn = vec_elems(d);
                let mut vcs = vec![1];
                if col_vec(&f, px, vn) > 1 {
                    vcs.push(vn);
                }
                for vc in vcs {
                    let plans = [plan(f.no * f.ni, f.red, vc, 1), plan(f.no * f.ni, f.red, vc, 132)];
                    for (k, &p) in plans.iter().enumerate() {
                        if k == 1 && p == plans[0] {
                            continue;
                        }
                        let output = dir.path().join("out.bin");
                        let args = [
                            vi.to_string(),
                            input.display().to_string(),
                            output.display().to_string(),
                            usize::from(vc > 1).to_string(),
                            (f.no * f.ni).to_string(),
                            f.ni.to_string(),
                            f.s1.to_string(),
                            f.red.to_string(),
                            f.sr.to_string(),
                            p.gx.to_string(),
                            p.bx.to_string(),
                            p.by.to_string(),
                            l.offset.to_string(),
                        ];
                        let what = format!("{} log={log} {l:?} axis {axis} {p:?}", d.name());
                        let run = std::process::Command::new(&exe).args(&args).output().unwrap();
                        assert!(
                            run.status.success(),
                            "{what}: {:?}\n{}",
                            run.status,
                            String::from_utf8_lossy(&run.stderr)
                        );
                        let got: Vec<f64> =
                            std::fs::read(&output).unwrap().chunks(es).map(|b| host_value(d, b)).collect();
                        assert_eq!(got.len(), n, "{what}");
                        for (k, (&g, &w)) in got.iter().zip(&want).enumerate() {
                            let ok = if w.is_nan() {
                                g.is_nan()
                            } else if w.is_infinite() {
                                g == w
                            } else {
                                (g - w).abs() <= tol * (1.0 + w.abs())
                            };
                            assert!(ok, "{what}: element {k}: got {g}, want {w}");
                        }
                        runs[usize::from(vc > 1)] += 1;
                    }
                }
            }
        }
        // Both kernels ran, on most cases.
        assert!(runs[0] >= 30 && runs[1] >= 15, "{runs:?}");
    }
}
