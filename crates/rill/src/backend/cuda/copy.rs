//! Gathers and joins: `take`, `concatenate` and `pad`. They move element bits only, so
//! their kernels are keyed by element size (and by the index dtype for `take`).
//!
//! `take` checks its indices on the device first: a check kernel records the position
//! of the first out-of-range index in one device word, then the host **waits for the
//! stream** (a synchronisation, acceptable for this op) and reads the word back, so that
//! an out-of-range index is returned as `Error::Index` like on the CPU.

use crate::backend::Storage;
use crate::error::{Error, Result};
use crate::shape::Layout;

use super::buffer::{CudaBuffer, new_storage};
use super::driver::GpuStream;
use super::launch::Launch;
use super::map::{Lay, merge_dims};
use super::norm::elem_ptr;
use super::nvrtc::{self, grid_for};
use super::source::{MAX_DIMS, PRELUDE, bits_type, ctype};

fn contiguous(cs: &GpuStream<'_>, s: &Storage) -> Result<Storage> {
    if s.layout.is_contiguous() { Ok(s.clone()) } else { super::elementwise::copy(cs, s) }
}

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

/// Gathers along `axis` of `x` at the indices `idx` (any integer dtype; negative ones
/// count from the end) into a new contiguous storage of `shape`.
pub(crate) fn take(cs: &GpuStream<'_>, x: &Storage, idx: &Storage, axis: usize, shape: &[usize]) -> Result<Storage> {
    let size = x.layout.shape[axis];
    let nidx = idx.layout.numel();
    let it = ctype(idx.dtype);
    let idx = contiguous(cs, idx)?;
    let dev = &cs.dev;
    let launch_err = |e| super::backend_err("launch", e);
    if nidx > 0 {
        // The first bad position, u64::MAX when every index is in range.
        let flag = CudaBuffer::alloc(cs, 8)?;
        let key = format!("take_check:{}", idx.dtype.name());
        let f = nvrtc::function(cs.driver(), dev, &key, "k_check", || {
            format!(
                r#"{PRELUDE}
extern "C" __global__ void k_check(u64* flag, const {it}* idx, i64 n, i64 size) {{
    for (i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (i64)blockDim.x * gridDim.x) {{
        i64 j = (i64)idx[i];
        if (j < 0) j += size;
        if (j < 0 || j >= size) atomicMin(flag, (u64)i);
    }}
}}
"#
            )
        })?;
        let (pf, pi, n64, s64) = (flag.ptr(), elem_ptr(&idx), nidx as i64, size as i64);
        let _ = cs.bind();
        // `cs.stream()` each time: it sends the launches recorded before (the check
        // kernel) so that each copy is ordered after them.
        let raw = || cs.stream().cu_stream();
        // SAFETY: `flag` holds 8 bytes.
        unsafe { cs.driver().memset_d8_async(pf, 0xff, 8, raw()) }.map_err(launch_err)?;
        let mut lb = Launch::new(&f);
        lb.arg(&pf).arg(&pi).arg(&n64).arg(&s64);
        // SAFETY: `idx` holds `nidx` contiguous elements; `flag` one u64.
        unsafe { lb.launch(cs, grid_for(nidx)) }.map_err(launch_err)?;
        // A host wait: the error must be known before the node completes.
        let mut first = [0u64; 1];
        // SAFETY: 8 bytes into `first`, finished by the synchronisation below.
        unsafe { cs.driver().memcpy_dtoh_async(&mut first, pf, raw()) }.map_err(launch_err)?;
        cs.synchronize()?;
        if first[0] != u64::MAX {
            let k = first[0] as usize;
            let mut bytes = [0u8; 8];
            let sz = idx.dtype.size();
            // SAFETY: element `k` of `idx` lies inside its buffer (k < nidx).
            unsafe {
                cs.driver().memcpy_dtoh_async(&mut bytes[..sz], pi + (k * sz) as u64, raw()).map_err(launch_err)?;
            }
            cs.synchronize()?;
            let index = match idx.dtype {
                crate::dtype::DType::I32 => i32::from_le_bytes([bytes[0], bytes[1], bytes[2], bytes[3]]) as i64,
                crate::dtype::DType::I64 => i64::from_le_bytes(bytes),
                crate::dtype::DType::U32 => u32::from_le_bytes([bytes[0], bytes[1], bytes[2], bytes[3]]) as i64,
                _ => bytes[0] as i64,
            };
            return Err(Error::Index { op: "take", index, axis, size });
        }
    }
    let out = new_storage(cs, x.dtype, shape)?;
    let n: usize = shape.iter().product();
    if n == 0 {
        return Ok(out);
    }
    let xs = contiguous(cs, x)?;
    let inner: usize = x.layout.shape[axis + 1..].iter().product();
    let b = bits_type(x.dtype.size());
    let key = format!("take:{b}:{}", idx.dtype.name());
    let f = nvrtc::function(cs.driver(), dev, &key, "k_take", || {
        format!(
            r#"{PRELUDE}
extern "C" __global__ void k_take({b}* out, const {b}* x, const {it}* idx, i64 n, i64 nidx, i64 size, i64 inner) {{
    for (i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (i64)blockDim.x * gridDim.x) {{
        i64 c = i % inner, r = i / inner;
        i64 k = r % nidx, o = r / nidx;
        i64 j = (i64)idx[k];
        if (j < 0) j += size;
        out[i] = x[(o * size + j) * inner + c];
    }}
}}
"#
        )
    })?;
    let (po, px, pi) = (elem_ptr(&out), elem_ptr(&xs), elem_ptr(&idx));
    let (n64, ni64, s64, in64) = (n as i64, nidx as i64, size as i64, inner as i64);
    let _ = cs.bind();
    let mut lb = Launch::new(&f);
    lb.arg(&po).arg(&px).arg(&pi).arg(&n64).arg(&ni64).arg(&s64).arg(&in64);
    // SAFETY: every index was checked in range above; `x` is contiguous.
    unsafe { lb.launch(cs, grid_for(n)) }.map_err(launch_err)?;
    Ok(out)
}
