//! Layer and RMS normalisation over the last axis: one block per row, a block reduction
//! (warp shuffles, then one value per warp through shared memory) of the row's moments,
//! then one pass writing `(x - mean) * scale [* w] [+ b]`. The formulas are the CPU's
//! (`backend/cpu/nn.rs`): f16/bf16/f32 accumulate in f32 and f64 in f64; layer norm
//! takes its moments shifted by the row's first element, with the variance clamped at 0
//! and `eps` inside the square root; RMS norm scales by `1 / sqrt(mean(x²) + eps)`.
//! f16/bf16 rows that fit (the softmax's register plan, up to 32768 elements) are read
//! once into registers with 16-byte loads (`k_normreg`); other rows, other dtypes and the
//! residual forms read each row twice (`k_norm`).

use cudarc::driver::LaunchConfig;

use crate::backend::Storage;
use crate::dtype::DType;
use crate::error::Result;

use super::buffer::{cuda_of, new_storage};
use super::driver::GpuStream;
use super::launch::Launch;
use super::nvrtc::{self, BLOCK};
use super::source::{PRELUDE, ctype, ftype, load, store_float};

/// Block-wide sums of two values (every thread receives both), for `F` = `float`/`double`.
/// Assumes `blockDim.x` is a multiple of 32 (at most 1024).
pub(crate) fn block_sum2_src(f: &str) -> String {
    format!(
        r#"
__device__ __forceinline__ {f} warp_sum({f} v) {{
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}}
__device__ __forceinline__ void block_sum2({f}& a, {f}& b) {{
    __shared__ {f} sa[32];
    __shared__ {f} sb[32];
    a = warp_sum(a);
    b = warp_sum(b);
    int w = threadIdx.x >> 5, l = threadIdx.x & 31, nw = blockDim.x >> 5;
    if (l == 0) {{ sa[w] = a; sb[w] = b; }}
    __syncthreads();
    a = l < nw ? sa[l] : ({f})0;
    b = l < nw ? sb[l] : ({f})0;
    a = warp_sum(a);
    b = warp_sum(b);
    __syncthreads();
}}
"#
    )
}

/// A contiguous device copy of `s` (itself when already contiguous).
fn contiguous(cs: &GpuStream<'_>, s: &Storage) -> Result<Storage> {
    if s.layout.is_contiguous() { Ok(s.clone()) } else { super::elementwise::copy(cs, s) }
}

/// The device address of a storage's first element.
pub(crate) fn elem_ptr(s: &Storage) -> u64 {
    cuda_of(s).map(|b| b.ptr()).unwrap_or(0) + (s.layout.offset * s.dtype.size()) as u64
}

/// Layer normalisation; inputs `x[, weight][, bias]`.
pub(crate) fn layer_norm(cs: &GpuStream<'_>, inputs: &[Storage], eps: f64, w: bool, b: bool) -> Result<Storage> {
    norm(cs, inputs, eps, Cols { w, b, rms: false }, Residual::None)
}

/// RMS normalisation; inputs `x[, weight]`.
pub(crate) fn rms_norm(cs: &GpuStream<'_>, inputs: &[Storage], eps: f64, w: bool) -> Result<Storage> {
    norm(cs, inputs, eps, Cols { w, b: false, rms: true }, Residual::None)
}

/// `x + r` then layer norm (`rms`: RMS norm) in one kernel; inputs `x, r[, weight][, bias]`.
/// The sum is rounded to the dtype before it is normalised, as the add kernel stores it.
/// `keep_sum`: the output is `[2, ..]`, the sum and then the norm.
pub(crate) fn residual_norm(
    cs: &GpuStream<'_>,
    inputs: &[Storage],
    eps: f64,
    (w, b, rms): (bool, bool, bool),
    keep_sum: bool,
) -> Result<Storage> {
    let residual = if keep_sum { Residual::KeepSum } else { Residual::Add };
    norm(cs, inputs, eps, Cols { w, b, rms }, residual)
}

/// The per-column inputs of a normalisation and which one it is.
#[derive(Clone, Copy)]
struct Cols {
    w: bool,
    b: bool,
    rms: bool,
}

/// Whether a residual is added to `x` first (input 1), and whether the sum is stored.
#[derive(Clone, Copy, PartialEq, Debug)]
enum Residual {
    None,
    Add,
    KeepSum,
}

/// The source of the normalisation kernel `k_norm` for dtype `d`.
fn norm_source(d: DType, Cols { w: has_w, b: has_b, rms }: Cols, residual: Residual) -> String {
    let (t, f) = (ctype(d), ftype(d));
    let sqrt = if f == "float" { "sqrtf" } else { "sqrt" };
    let ld = |e: &str| load(d, e);
    // The element read: `x`, or `x + r` rounded to the dtype (the add kernel's value).
    let (lx, lx0) = match residual {
        Residual::None => (ld("p[j]"), ld("p[0]")),
        Residual::Add | Residual::KeepSum => {
            let add = |e: &str| {
                let sum = crate::primitives::BinaryOp::Add.cuda(d, &ld(&format!("p[{e}]")), &ld(&format!("q[{e}]")));
                ld(&store_float(d, &sum, d == DType::F64))
            };
            (add("j"), add("0"))
        }
    };
    let (lw, lb) = (ld("w[j]"), ld("bb[j]"));
    let st = store_float(d, "y", d == DType::F64);
    let moments =
        if rms { "s2 += v * v;".to_string() } else { "{f} t = v - x0; s1 += t; s2 += t * t;".replace("{f}", f) };
    let stats = if rms {
        format!("mean = ({f})0; scale = ({f})1 / {sqrt}(s2 / nf + eps);")
    } else {
        format!(
            "{f} m1 = s1 / nf; {f} var = s2 / nf - m1 * m1; if (var < ({f})0) var = ({f})0; \
             mean = x0 + m1; scale = ({f})1 / {sqrt}(var + eps);"
        )
    };
    let apply_w = if has_w { format!("y = y * {lw};") } else { String::new() };
    let apply_b = if has_b { format!("y = y + {lb};") } else { String::new() };
    let keep = if residual == Residual::KeepSum {
        format!("s[j] = {};", store_float(d, "v", d == DType::F64))
    } else {
        String::new()
    };
    let reduce = block_sum2_src(f);
    {
        format!(
            r#"{PRELUDE}
{reduce}
extern "C" __global__ void k_norm({t}* out, const {t}* x, const {t}* w, const {t}* bb, i64 rows, i64 cols, double eps_d,
                                  const {t}* rx, {t}* sum) {{
    {f} eps = ({f})eps_d;
    {f} nf = ({f})cols;
    for (i64 r = blockIdx.x; r < rows; r += gridDim.x) {{
        const {t}* p = x + r * cols;
        const {t}* q = rx + r * cols;
        {t}* s = sum + r * cols;
        (void)q; (void)s;
        {t}* o = out + r * cols;
        {f} x0 = {lx0};
        {f} s1 = 0, s2 = 0;
        for (i64 j = threadIdx.x; j < cols; j += blockDim.x) {{ {f} v = {lx}; {moments} }}
        block_sum2(s1, s2);
        {f} mean, scale;
        {stats}
        for (i64 j = threadIdx.x; j < cols; j += blockDim.x) {{
            {f} v = {lx};
            {keep}
            {f} y = (v - mean) * scale;
            {apply_w}
            {apply_b}
            o[j] = {st};
        }}
    }}
}}
"#
        )
    }
}

/// Whether rows of `d` that fit are normalised from registers ([`norm_reg_source`]): f16
/// and bf16, whose generic kernel reads each row twice two bytes at a time.
fn in_registers(d: DType) -> bool {
    matches!(d, DType::F16 | DType::BF16)
}

/// The register-cached normalisation module `k_normreg` (no residual): one block per row,
/// each thread holding `nv` vectors of 16 bytes of the row as `F`, so the row is read
/// from memory once (16-byte loads of `x`, `w` and `b` when `vec` says every row and both
/// per-column arrays are aligned and `cols` is a whole number of vectors). The moments and
/// the formulas are [`norm_source`]'s; only the order in which the block sums them differs.
///
/// `k_normreg(T* out, const T* x, const T* w, const T* b, i64 rows, i64 cols, double eps,
/// int vec)`, rows of at most `nv * VN * blockDim.x` elements, `blockDim.x` a multiple of 32.
fn norm_reg_source(d: DType, Cols { w: has_w, b: has_b, rms }: Cols, nv: usize) -> String {
    let (t, f) = (ctype(d), ftype(d));
    let sqrt = if f == "float" { "sqrtf" } else { "sqrt" };
    let vn = super::reduce::vec_elems(d);
    let ld = load(d, "q");
    let st = store_float(d, "y", d == DType::F64);
    let moments = if rms { "s2 += u * u;" } else { "F t = u - x0; s1 += t; s2 += t * t;" };
    let stats = if rms {
        format!("F mean = (F)0, scale = (F)1 / {sqrt}(s2 / nf + eps);")
    } else {
        format!(
            "F m1 = s1 / nf; F var = s2 / nf - m1 * m1; if (var < (F)0) var = (F)0; \
             F mean = x0 + m1, scale = (F)1 / {sqrt}(var + eps);"
        )
    };
    // `y` from `u` with the column's weight `wv` and bias `bv` (when present).
    let apply_w = if has_w { "y = y * wv;" } else { "" };
    let apply_b = if has_b { "y = y + bv;" } else { "" };
    let reduce = block_sum2_src(f);
    format!(
        r#"{PRELUDE}
#define VN {vn}
#define NV {nv}
template <typename E, int N> struct alignas(sizeof(E) * N) Vec {{ E v[N]; }};
typedef {t} T;
typedef {f} F;
__device__ __forceinline__ F ldv(T q) {{ return {ld}; }}
__device__ __forceinline__ T stv(F y) {{ return {st}; }}
{reduce}
__device__ __forceinline__ T normed(F u, F mean, F scale, F wv, F bv) {{
    (void)wv; (void)bv;
    F y = (u - mean) * scale;
    {apply_w}
    {apply_b}
    return stv(y);
}}
extern "C" __global__ void __launch_bounds__(1024) k_normreg(T* __restrict__ out, const T* __restrict__ x, const T* __restrict__ w, const T* __restrict__ bb, i64 rows, i64 cols, double eps_d, int vec) {{
    F eps = (F)eps_d;
    F nf = (F)cols;
    for (i64 r = blockIdx.x; r < rows; r += gridDim.x) {{
        const T* p = x + r * cols;
        T* o = out + r * cols;
        F x0 = ldv(p[0]);
        (void)x0;
        F v[NV][VN];
        F s1 = 0, s2 = 0;
#pragma unroll
        for (int k = 0; k < NV; ++k) {{
            i64 j = ((i64)k * blockDim.x + threadIdx.x) * VN;
            if (vec) {{
                if (j < cols) {{
                    Vec<T, VN> q = *(const Vec<T, VN>*)(p + j);
#pragma unroll
                    for (int e = 0; e < VN; ++e) v[k][e] = ldv(q.v[e]);
                }}
            }} else {{
#pragma unroll
                for (int e = 0; e < VN; ++e) if (j + e < cols) v[k][e] = ldv(p[j + e]);
            }}
#pragma unroll
            for (int e = 0; e < VN; ++e) if (j + e < cols) {{ F u = v[k][e]; {moments} }}
        }}
        block_sum2(s1, s2);
        {stats}
#pragma unroll
        for (int k = 0; k < NV; ++k) {{
            i64 j = ((i64)k * blockDim.x + threadIdx.x) * VN;
            if (vec) {{
                if (j < cols) {{
                    Vec<T, VN> wq, bq, q;
                    if ({has_w}) wq = *(const Vec<T, VN>*)(w + j);
                    if ({has_b}) bq = *(const Vec<T, VN>*)(bb + j);
#pragma unroll
                    for (int e = 0; e < VN; ++e)
                        q.v[e] = normed(v[k][e], mean, scale, {has_w} ? ldv(wq.v[e]) : (F)1, {has_b} ? ldv(bq.v[e]) : (F)0);
                    *(Vec<T, VN>*)(o + j) = q;
                }}
            }} else {{
#pragma unroll
                for (int e = 0; e < VN; ++e)
                    if (j + e < cols)
                        o[j + e] = normed(v[k][e], mean, scale, {has_w} ? ldv(w[j + e]) : (F)1, {has_b} ? ldv(bb[j + e]) : (F)0);
            }}
        }}
    }}
}}
"#
    )
}

fn norm(cs: &GpuStream<'_>, inputs: &[Storage], eps: f64, cols_in: Cols, residual: Residual) -> Result<Storage> {
    let Cols { w: has_w, b: has_b, rms } = cols_in;
    let name = if rms { "rms_norm" } else { "layer_norm" };
    let x = &inputs[0];
    let d = x.dtype;
    if !d.is_float() {
        return Err(super::unsupported(name, format!("dtype {d}")));
    }
    let shape = x.layout.shape.clone();
    let cols = shape.last().copied().unwrap_or(1);
    let n: usize = shape.iter().product();
    let first = (residual != Residual::None) as usize + 1;
    let mut out_shape = shape.to_vec();
    if residual == Residual::KeepSum {
        out_shape.insert(0, 2);
    }
    let out = new_storage(cs, d, &out_shape)?;
    if n == 0 {
        return Ok(out);
    }
    let rows = n / cols;
    let xs = contiguous(cs, x)?;
    let rs = if first == 2 { Some(contiguous(cs, &inputs[1])?) } else { None };
    let ws = if has_w { Some(contiguous(cs, &inputs[first])?) } else { None };
    let bs = if has_b { Some(contiguous(cs, &inputs[first + has_w as usize])?) } else { None };
    let reg = if residual == Residual::None && in_registers(d) {
        super::reduce::softmax_reg_plan(cols, super::reduce::vec_elems(d))
    } else {
        None
    };
    if let Some((threads, nv)) = reg {
        let key = format!("normreg:{rms}:{has_w}:{has_b}:{}:{nv}", d.name());
        let func = nvrtc::function(cs.driver(), &cs.dev, &key, "k_normreg", move || norm_reg_source(d, cols_in, nv))?;
        let (po, px) = (elem_ptr(&out), elem_ptr(&xs));
        let pw = ws.as_ref().map(elem_ptr).unwrap_or(0);
        let pb = bs.as_ref().map(elem_ptr).unwrap_or(0);
        // Vectors only when every row and both per-column arrays start 16-byte aligned.
        let aligned = |p: u64| p.is_multiple_of(16);
        let vec =
            i32::from(aligned(px) && aligned(po) && aligned(pw) && aligned(pb) && (cols * d.size()).is_multiple_of(16));
        let (r64, c64) = (rows as i64, cols as i64);
        let cfg = LaunchConfig {
            grid_dim: (rows.clamp(1, 1 << 30) as u32, 1, 1),
            block_dim: (threads, 1, 1),
            shared_mem_bytes: 0,
        };
        let _ = cs.bind();
        let mut lb = Launch::new(&func);
        lb.arg(&po).arg(&px).arg(&pw).arg(&pb).arg(&r64).arg(&c64).arg(&eps).arg(&vec);
        // SAFETY: `x` and `out` hold rows*cols contiguous elements, `w`/`b` (read only
        // when present) `cols`; `vec` is set only when all of them are 16-byte aligned and
        // rows are whole vectors; rows fit `threads * nv` vectors (the plan).
        unsafe { lb.launch(cs, cfg) }.map_err(|e| super::backend_err("launch", e))?;
        return Ok(out);
    }
    let key = format!("norm:{rms}:{has_w}:{has_b}:{residual:?}:{}", d.name());
    let func = nvrtc::function(cs.driver(), &cs.dev, &key, "k_norm", move || norm_source(d, cols_in, residual))?;
    let size = d.size() as u64;
    let (ps, po) = match residual {
        Residual::KeepSum => (elem_ptr(&out), elem_ptr(&out) + n as u64 * size),
        Residual::None | Residual::Add => (0, elem_ptr(&out)),
    };
    let pr = rs.as_ref().map(elem_ptr).unwrap_or(0);
    let px = elem_ptr(&xs);
    let pw = ws.as_ref().map(elem_ptr).unwrap_or(0);
    let pb = bs.as_ref().map(elem_ptr).unwrap_or(0);
    let (r64, c64) = (rows as i64, cols as i64);
    let grid = rows.min(cs.dev.sms as usize * 32).max(1) as u32;
    let cfg = LaunchConfig { grid_dim: (grid, 1, 1), block_dim: (BLOCK, 1, 1), shared_mem_bytes: 0 };
    let _ = cs.bind();
    let mut lb = Launch::new(&func);
    lb.arg(&po).arg(&px).arg(&pw).arg(&pb).arg(&r64).arg(&c64).arg(&eps).arg(&pr).arg(&ps);
    // SAFETY: `x` (and `r` when added) hold rows*cols contiguous elements, `out` as many
    // (twice as many when the sum is kept: `ps` is its first half, `po` its second);
    // `w`/`b` (read only when present) hold `cols`; the arguments match the kernel's
    // signature.
    unsafe { lb.launch(cs, cfg) }.map_err(|e| super::backend_err("launch", e))?;
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::cuda::nvrtc::check_compiles;

    #[test]
    fn register_norm_kernels_compile_for_sm90() {
        for d in [DType::F32, DType::F16, DType::BF16, DType::F64] {
            for (w, b, rms) in [
                (false, false, false),
                (true, true, false),
                (true, false, false),
                (false, true, false),
                (false, false, true),
                (true, false, true),
            ] {
                for nv in [1, 2, 4, 8] {
                    let key = format!("test:normreg:{rms}:{w}:{b}:{}:{nv}", d.name());
                    if !check_compiles(&key, &norm_reg_source(d, Cols { w, b, rms }, nv)) {
                        return;
                    }
                }
            }
        }
    }

    /// Rows of halves up to 32768 elements are held in registers (the softmax plan: 16-byte
    /// vectors, at most four per thread); longer rows and other dtypes take the generic
    /// kernel.
    #[test]
    fn register_norm_plans() {
        use crate::backend::cuda::reduce::{softmax_reg_plan, vec_elems};
        assert!(in_registers(DType::BF16) && in_registers(DType::F16) && !in_registers(DType::F32));
        let plan = |cols| softmax_reg_plan(cols, vec_elems(DType::BF16));
        assert_eq!(plan(1), Some((32, 1)));
        assert_eq!(plan(4096), Some((128, 4)));
        assert_eq!(plan(8193), Some((512, 3)));
        assert_eq!(plan(32768), Some((1024, 4)));
        assert_eq!(plan(32769), None);
        for cols in (1..=40_000).step_by(7) {
            if let Some((threads, nv)) = plan(cols) {
                assert!(threads % 32 == 0 && threads <= 1024 && (1..=4).contains(&nv));
                assert!(threads as usize * nv * 8 >= cols, "{cols}");
            }
        }
    }

    #[test]
    fn norm_kernels_compile_for_sm90() {
        for d in [DType::F32, DType::F16, DType::BF16, DType::F64] {
            for rms in [false, true] {
                for residual in [Residual::None, Residual::Add, Residual::KeepSum] {
                    let cols = Cols { w: true, b: !rms, rms };
                    let key = format!("test:norm:{rms}:{residual:?}:{}", d.name());
                    if !check_compiles(&key, &norm_source(d, cols, residual)) {
                        return;
                    }
                }
            }
        }
    }
}
