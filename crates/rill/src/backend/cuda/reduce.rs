//! Reductions and fused softmax: the reduced axes are moved last (a contiguous copy when
//! needed), then one block per row reduces it (shared-memory tree). Sums and products
//! accumulate in f32 for f16/bf16/f32 and f64 for f64, integers wrap in their own type;
//! max/min propagate NaN. Softmax keeps an online (max, sum) pair per thread in one pass
//! over the row, then writes the row.

use cudarc::driver::{LaunchConfig, PushKernelArg};

use crate::backend::Storage;
use crate::dtype::DType;
use crate::error::Result;
use crate::primitives::ReduceOp;
use crate::shape::Layout;

use super::buffer::{cuda_of, new_storage};
use super::handles::CudaStreamHandle;
use super::nvrtc::{self, BLOCK};
use super::source::{PRELUDE, ctype, ftype, load, store_float, utype};

/// `x` with `axes` moved last, as a contiguous storage: (storage, rows, cols).
pub(crate) fn rows_last(cs: &CudaStreamHandle, x: &Storage, axes: &[usize]) -> Result<(Storage, usize, usize)> {
    let nd = x.layout.shape.len();
    let mut perm: Vec<usize> = (0..nd).filter(|a| !axes.contains(a)).collect();
    perm.extend_from_slice(axes);
    let v = x.with_layout(x.layout.permute(&perm));
    let v = if v.layout.is_contiguous() { v } else { super::elementwise::copy(cs, &v)? };
    let cols: usize = axes.iter().map(|&a| x.layout.shape[a]).product();
    let rows: usize = (0..nd).filter(|a| !axes.contains(a)).map(|a| x.layout.shape[a]).product();
    Ok((v, rows, cols))
}

/// Launches `k_rows(out, x, rows, cols)` of the module `key` with one block per row.
pub(crate) fn launch_rows(
    cs: &CudaStreamHandle,
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
    let f = nvrtc::function(&cs.dev, key, "k_rows", src)?;
    let px = cuda_of(x).map(|b| b.ptr()).unwrap_or(0) + (x.layout.offset * x.dtype.size()) as u64;
    let (r64, c64) = (rows as i64, cols as i64);
    let grid = rows.min(cs.dev.sms as usize * 32).max(1) as u32;
    let cfg = LaunchConfig { grid_dim: (grid, 1, 1), block_dim: (BLOCK, 1, 1), shared_mem_bytes: 0 };
    let _ = cs.dev.ctx.bind_to_thread();
    let mut b = cs.stream().launch_builder(&f);
    b.arg(&out).arg(&px).arg(&r64).arg(&c64);
    // SAFETY: `out` holds `rows` (or rows*cols) elements and `x` rows*cols contiguous ones.
    unsafe { b.launch(cfg) }.map_err(|e| super::backend_err("launch", e))?;
    Ok(())
}

pub(crate) fn reduce(
    cs: &CudaStreamHandle,
    op: ReduceOp,
    x: &Storage,
    axes: &[usize],
    shape: &[usize],
) -> Result<Storage> {
    let d = x.dtype;
    let t = ctype(d);
    let (acc, init, combine, ld, st) = if d.is_float() {
        let f = ftype(d);
        let inf =
            if f == "float" { "__int_as_float(0x7f800000)" } else { "__longlong_as_double(0x7ff0000000000000ll)" };
        let (init, comb) = match op {
            ReduceOp::Sum => ("0".to_string(), "a + b".to_string()),
            ReduceOp::Prod => ("1".to_string(), "a * b".to_string()),
            ReduceOp::Max => (format!("-{inf}"), "((a != a || a > b) ? a : b)".to_string()),
            ReduceOp::Min => (inf.to_string(), "((a != a || a < b) ? a : b)".to_string()),
        };
        (f, init, comb, load(d, "v"), store_float(d, "a", d == DType::F64))
    } else {
        let u = utype(d);
        let (lo, hi) = match d {
            DType::I32 => ("(i32)0x80000000u", "(i32)0x7fffffff"),
            DType::I64 => ("(i64)0x8000000000000000ull", "(i64)0x7fffffffffffffffll"),
            DType::U32 => ("(u32)0", "(u32)0xffffffffu"),
            _ => ("(u8)0", "(u8)255"),
        };
        let (init, comb) = match op {
            ReduceOp::Sum if d == DType::Bool => ("0".to_string(), "(u8)(a != 0 || b != 0)".to_string()),
            ReduceOp::Prod if d == DType::Bool => ("1".to_string(), "(u8)(a != 0 && b != 0)".to_string()),
            ReduceOp::Sum => ("0".to_string(), format!("({t})(({u})a + ({u})b)")),
            ReduceOp::Prod => ("1".to_string(), format!("({t})(({u})a * ({u})b)")),
            ReduceOp::Max => (lo.to_string(), "(a > b ? a : b)".to_string()),
            ReduceOp::Min => (hi.to_string(), "(a < b ? a : b)".to_string()),
        };
        (t, init, comb, "v".to_string(), "a".to_string())
    };
    let (xs, rows, cols) = rows_last(cs, x, axes)?;
    let out = new_storage(cs, d, shape)?;
    let key = format!("reduce:{op:?}:{t}:{}", d.name());
    let src = move || {
        format!(
            r#"{PRELUDE}
__device__ __forceinline__ {acc} comb({acc} a, {acc} b) {{ return {combine}; }}
extern "C" __global__ void k_rows({t}* out, const {t}* x, i64 rows, i64 cols) {{
    __shared__ {acc} sh[{BLOCK}];
    for (i64 r = blockIdx.x; r < rows; r += gridDim.x) {{
        const {t}* p = x + r * cols;
        {acc} a = ({acc})({init});
        for (i64 j = threadIdx.x; j < cols; j += blockDim.x) {{ {t} v = p[j]; a = comb(a, ({acc})({ld})); }}
        sh[threadIdx.x] = a;
        __syncthreads();
        for (int s = blockDim.x / 2; s > 0; s >>= 1) {{
            if (threadIdx.x < s) sh[threadIdx.x] = comb(sh[threadIdx.x], sh[threadIdx.x + s]);
            __syncthreads();
        }}
        if (threadIdx.x == 0) {{ {acc} a = sh[0]; out[r] = {st}; }}
        __syncthreads();
    }}
}}
"#
        )
    };
    let po = cuda_of(&out).map(|b| b.ptr()).unwrap_or(0);
    launch_rows(cs, &key, src, po, &xs, rows, cols)?;
    Ok(out)
}

pub(crate) fn softmax(cs: &CudaStreamHandle, x: &Storage, axis: usize, log: bool) -> Result<Storage> {
    let d = x.dtype;
    if !d.is_float() {
        return Err(super::unsupported("softmax", format!("dtype {d}")));
    }
    let (t, f) = (ctype(d), ftype(d));
    let sfx = if f == "float" { "f" } else { "" };
    let (xs, rows, cols) = rows_last(cs, x, &[axis])?;
    let out = new_storage(cs, d, &xs.layout.shape)?;
    let ld = load(d, "p[j]");
    let res = if log { format!("(v - m) - log{sfx}(s)") } else { format!("exp{sfx}(v - m) / s") };
    let st = store_float(d, "y", d == DType::F64);
    let key = format!("softmax:{log}:{}", d.name());
    let src = move || {
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
    };
    let po = cuda_of(&out).map(|b| b.ptr()).unwrap_or(0);
    launch_rows(cs, &key, src, po, &xs, rows, cols)?;
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
