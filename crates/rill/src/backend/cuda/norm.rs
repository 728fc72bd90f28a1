//! Layer and RMS normalisation over the last axis: one block per row, a block reduction
//! (warp shuffles, then one value per warp through shared memory) of the row's moments,
//! then one pass writing `(x - mean) * scale [* w] [+ b]`. The formulas are the CPU's
//! (`backend/cpu/nn.rs`): f16/bf16/f32 accumulate in f32 and f64 in f64; layer norm
//! takes its moments shifted by the row's first element, with the variance clamped at 0
//! and `eps` inside the square root; RMS norm scales by `1 / sqrt(mean(x²) + eps)`.

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
