//! `Fused` nodes: the kernel source comes from [`crate::compile::cuda_src::cuda_source`],
//! is compiled once per program (the cache key is the full source, which names every
//! input and output C type and the dtype of every register) and launched as a 1-D
//! grid-stride loop over the contiguous output.

use cudarc::driver::PushKernelArg;

use crate::backend::Storage;
use crate::compile::FusedProgram;
use crate::compile::cuda_src::{CUDA_MAX_DIMS, cuda_source};
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::shape::broadcast_shapes;

use super::buffer::{cuda_of, new_storage};
use super::handles::CudaStreamHandle;
use super::map::merge_dims;
use super::nvrtc::{self, grid_for};

/// The kernel's name in every generated module.
const KERNEL: &str = "rill_fused";

/// Runs the fused program `p` over `inputs` (broadcast to `shape`) into a new contiguous
/// storage of `dtype`.
pub(crate) fn fused(
    cs: &CudaStreamHandle,
    p: &FusedProgram,
    inputs: &[Storage],
    shape: &[usize],
    dtype: DType,
) -> Result<Storage> {
    if inputs.len() != p.input_dtypes().len() || dtype != p.output_dtype() {
        return Err(Error::invalid(
            "fused",
            format!(
                "program expects {} inputs and outputs {}; got {} inputs and output {dtype}",
                p.input_dtypes().len(),
                p.output_dtype(),
                inputs.len()
            ),
        ));
    }
    for (k, (s, &d)) in inputs.iter().zip(p.input_dtypes()).enumerate() {
        let b = broadcast_shapes("fused", &s.layout.shape, shape)?;
        if s.dtype != d || b != shape {
            return Err(Error::invalid(
                "fused",
                format!("input {k} ({}, shape {:?}) does not fit ({d}, shape {shape:?})", s.dtype, s.layout.shape),
            ));
        }
    }
    let out = new_storage(cs, dtype, shape)?;
    let n: usize = shape.iter().product();
    if n == 0 {
        return Ok(out);
    }
    // Merge axes over the output (contiguous) and every input's broadcast strides.
    let lays: Vec<_> = inputs.iter().map(|s| s.layout.broadcast_to(shape)).collect();
    let mut strides: Vec<Vec<isize>> = vec![crate::shape::Layout::contiguous(shape).strides.clone()];
    strides.extend(lays.iter().map(|l| l.strides.clone()));
    let (mut dims, mut mst) = merge_dims(shape, &strides);
    if dims.is_empty() {
        dims.push(1);
        for s in &mut mst {
            s.push(0);
        }
    }
    if dims.len() > CUDA_MAX_DIMS {
        return Err(super::unsupported(
            "fused",
            format!("inputs of rank {} after merging axes (at most {CUDA_MAX_DIMS})", dims.len()),
        ));
    }
    // The parameter struct `{ i64 shape[8]; i64 strides[K1][8]; }`, flattened.
    let k1 = inputs.len().max(1);
    let mut params = vec![0i64; CUDA_MAX_DIMS * (1 + k1)];
    for (d, &s) in dims.iter().enumerate() {
        params[d] = s as i64;
        for k in 0..inputs.len() {
            params[CUDA_MAX_DIMS * (1 + k) + d] = mst[1 + k][d] as i64;
        }
    }
    for p in params.iter_mut().take(CUDA_MAX_DIMS).skip(dims.len()) {
        *p = 1;
    }
    let src = cuda_source(p, KERNEL);
    let key = format!("fused:{src}");
    let f = nvrtc::function(&cs.dev, &key, KERNEL, || src.clone())?;
    let out_ptr = cuda_of(&out).map(|b| b.ptr()).unwrap_or(0);
    let ptrs: Vec<u64> = inputs
        .iter()
        .zip(&lays)
        .map(|(s, l)| cuda_of(s).map(|b| b.ptr()).unwrap_or(0) + (l.offset * s.dtype.size()) as u64)
        .collect();
    let n64 = n as i64;
    let ndim = dims.len() as i32;
    let _ = cs.dev.ctx.bind_to_thread();
    let mut b = cs.stream().launch_builder(&f);
    b.arg(&out_ptr);
    for ptr in &ptrs {
        b.arg(ptr);
    }
    b.arg(&n64).arg(&ndim);
    // The struct parameter: the driver copies as many bytes as the kernel's parameter
    // declares (8 * 8 * (1 + K1)) from this address, which is the start of `params`.
    b.arg(&params[0]);
    // SAFETY: the arguments match the generated signature (pointers, n, ndim, the struct
    // laid out in `params`, alive until the launch returns); every offset the strides
    // produce lies inside its input (views are checked by the op layer).
    unsafe { b.launch(grid_for(&cs.dev, n)) }.map_err(|e| super::backend_err("launch", e))?;
    Ok(out)
}
