//! Joins: `concatenate` and `pad` (`take` is `take.rs`). They move element bits only,
//! so their kernels are keyed by element size.

use crate::backend::Storage;
use crate::error::Result;
use crate::shape::Layout;

use super::buffer::new_storage;
use super::driver::GpuStream;
use super::launch::Launch;
use super::map::{Lay, merge_dims};
use super::nvrtc::{self, grid_for};
use super::source::{MAX_DIMS, PRELUDE, bits_type};

/// Copies the elements of `src` (any layout) into the view `dst` (a layout of the same
/// shape over `dst_buf`'s buffer, which the caller just allocated).
fn copy_into(cs: &GpuStream<'_>, dst_buf: &Storage, dst: &Layout, src: &Storage) -> Result<()> {
    let n = src.layout.numel();
    if n == 0 {
        return Ok(());
    }
    let (dims, st) = merge_dims(&src.layout.shape, &[&dst.strides[..], &src.layout.strides[..]]);
    if dims.len() > MAX_DIMS {
        return Err(super::unsupported("copy", format!("views of rank {} after merging axes", dims.len())));
    }
    let mut lay = Lay { shape: [1; MAX_DIMS], st: [[0; MAX_DIMS]; 3], off: [0; 3], ndim: dims.len() as i32, pad: 0 };
    for (d, &s) in dims.iter().enumerate() {
        lay.shape[d] = s as i64;
        lay.st[0][d] = st[0][d] as i64;
        lay.st[1][d] = st[1][d] as i64;
    }
    lay.off[0] = dst.offset as i64;
    lay.off[1] = src.layout.offset as i64;
    let b = bits_type(src.dtype.size());
    let key = format!("view_copy:{b}");
    let f = nvrtc::function(cs.driver(), &cs.dev, &key, "k_view", || {
        format!(
            r#"{PRELUDE}
extern "C" __global__ void k_view({b}* dst, const {b}* src, Lay l, i64 n) {{
    for (i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (i64)blockDim.x * gridDim.x) {{
        i64 rem = i, od = l.off[0], os = l.off[1];
        for (int d = l.ndim - 1; d >= 0; --d) {{
            i64 k = rem % l.shape[d];
            rem /= l.shape[d];
            od += k * l.st[0][d];
            os += k * l.st[1][d];
        }}
        dst[od] = src[os];
    }}
}}
"#
        )
    })?;
    let pd = super::buffer::cuda_of(dst_buf).map(|b| b.ptr()).unwrap_or(0);
    let ps = super::buffer::cuda_of(src).map(|b| b.ptr()).unwrap_or(0);
    let n64 = n as i64;
    let _ = cs.bind();
    let mut lb = Launch::new(&f);
    lb.arg(&pd).arg(&ps).arg(&lay).arg(&n64);
    // SAFETY: both views lie inside their buffers (the destination is a sub-view of a new
    // allocation, the source a view checked by the op layer).
    unsafe { lb.launch(cs, grid_for(n)) }.map_err(|e| super::backend_err("launch", e))?;
    Ok(())
}

/// Joins `xs` (all of the node dtype) along `axis` into a new contiguous storage.
pub(crate) fn concatenate(cs: &GpuStream<'_>, xs: &[Storage], axis: usize, shape: &[usize]) -> Result<Storage> {
    let out = new_storage(cs, xs[0].dtype, shape)?;
    let full = Layout::contiguous(shape);
    let mut at = 0usize;
    for x in xs {
        let mut v = full.clone();
        v.shape[axis] = x.layout.shape[axis];
        v.offset = at * full.strides[axis] as usize;
        at += x.layout.shape[axis];
        copy_into(cs, &out, &v, x)?;
    }
    Ok(out)
}

/// Constant padding: fills with `value`, then copies `x` into the interior.
pub(crate) fn pad(
    cs: &GpuStream<'_>,
    x: &Storage,
    widths: &[(usize, usize)],
    value: f64,
    shape: &[usize],
) -> Result<Storage> {
    let out = super::elementwise::full(cs, shape, x.dtype, value)?;
    let full = Layout::contiguous(shape);
    let offset = widths.iter().zip(&full.strides).map(|(w, &s)| w.0 * s as usize).sum();
    let v = Layout { shape: x.layout.shape.clone(), strides: full.strides.clone(), offset };
    copy_into(cs, &out, &v, x)?;
    Ok(out)
}
