//! Arg-reductions and cumulative sums along one axis.
//!
//! Argmax/argmin move the axis last (a contiguous copy when needed) and reduce each row
//! in one block: every thread keeps the best `(value, index)` of its elements, then a
//! shared-memory tree combines them. The rule matches the CPU (`backend/cpu/reduce/scan.rs`):
//! the first NaN wins, otherwise the first maximum (minimum) wins.
//!
//! Cumsum reads a contiguous copy as `[outer, len, inner]` and runs one thread per
//! `(outer, inner)` column, sequentially along `len` (neighbouring threads read
//! neighbouring elements when `inner > 1`). Floats accumulate in f32 (f64 for f64)
//! and are rounded to the dtype at each output, integers wrap in their own type.

use crate::backend::Storage;
use crate::dtype::DType;
use crate::error::Result;
use crate::primitives::ArgReduceOp;

use super::buffer::new_storage;
use super::driver::GpuStream;
use super::launch::Launch;
use super::norm::elem_ptr;
use super::nvrtc::{self, BLOCK, grid_for};
use super::reduce::{launch_rows, rows_last};
use super::source::{PRELUDE, ctype, ftype, load, store_float, utype};

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
    let t = ctype(d);
    let v = if d.is_float() { ftype(d) } else { t };
    let ld = load(d, "p[j]");
    let better = if op == ArgReduceOp::ArgMax { "bv > av" } else { "bv < av" };
    let (xs, rows, cols) = rows_last(cs, x, &[axis])?;
    let key = format!("argreduce:{op:?}:{}", d.name());
    let src = move || {
        format!(
            r#"{PRELUDE}
__device__ __forceinline__ void comb({v}& av, i64& ai, {v} bv, i64 bi) {{
    if (bi < 0) return;
    if (ai < 0) {{ av = bv; ai = bi; return; }}
    bool an = av != av, bn = bv != bv;
    if (an || bn) {{
        if (bn && (!an || bi < ai)) {{ av = bv; ai = bi; }}
        return;
    }}
    if (({better}) || (bv == av && bi < ai)) {{ av = bv; ai = bi; }}
}}
extern "C" __global__ void k_rows(i64* out, const {t}* x, i64 rows, i64 cols) {{
    __shared__ {v} sv[{BLOCK}];
    __shared__ i64 si[{BLOCK}];
    for (i64 r = blockIdx.x; r < rows; r += gridDim.x) {{
        const {t}* p = x + r * cols;
        {v} a = ({v})0;
        i64 ai = -1;
        for (i64 j = threadIdx.x; j < cols; j += blockDim.x) comb(a, ai, ({v})({ld}), j);
        sv[threadIdx.x] = a;
        si[threadIdx.x] = ai;
        __syncthreads();
        for (int s = blockDim.x / 2; s > 0; s >>= 1) {{
            if (threadIdx.x < s) {{
                {v} av = sv[threadIdx.x];
                i64 ia = si[threadIdx.x];
                comb(av, ia, sv[threadIdx.x + s], si[threadIdx.x + s]);
                sv[threadIdx.x] = av;
                si[threadIdx.x] = ia;
            }}
            __syncthreads();
        }}
        if (threadIdx.x == 0) out[r] = si[0] < 0 ? 0 : si[0];
        __syncthreads();
    }}
}}
"#
        )
    };
    launch_rows(cs, &key, src, elem_ptr(&out), &xs, rows, cols)?;
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
