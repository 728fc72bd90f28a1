//! Matrix products through cuBLAS (`cublasGemmEx` for one product,
//! `cublasGemmStridedBatchedEx` for a batch): f32 (TF32 only when
//! allowed), f16 and bf16 with f32 accumulation, f64. Row-major `C = A @ B` is computed
//! as the column-major `Cᵀ = Bᵀ Aᵀ`, so no transposition is materialised. Each stream
//! has its own cuBLAS handle (workspaces are per handle), made on first use.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};

use cudarc::cublas::{result as cb, sys as cbsys};

use crate::backend::Storage;
use crate::dtype::DType;
use crate::error::Result;

use super::buffer::{cuda_of, new_storage};
use super::handles::{Blas, CudaStreamHandle};

static TF32: AtomicBool = AtomicBool::new(false);

/// Bytes of the per-stream cuBLAS workspace.
const WORKSPACE: usize = 32 << 20;

/// Allows f32 matrix products on GPUs to use TF32 tensor cores (faster, about 10 bits of
/// mantissa in the products). Off by default; `RILL_CUDA_TF32=1` also turns it on.
/// Returns the previous setting.
pub fn set_allow_tf32(allow: bool) -> bool {
    TF32.swap(allow, Relaxed)
}

fn tf32() -> bool {
    TF32.load(Relaxed) || std::env::var("RILL_CUDA_TF32").as_deref() == Ok("1")
}

pub(crate) fn matmul(
    cs: &CudaStreamHandle,
    a: &Storage,
    b: &Storage,
    shape: &[usize],
    dtype: DType,
) -> Result<Storage> {
    use cbsys::cublasComputeType_t as C;
    use cbsys::cudaDataType_t as T;
    let (ty, compute) = match dtype {
        DType::F32 => (T::CUDA_R_32F, if tf32() { C::CUBLAS_COMPUTE_32F_FAST_TF32 } else { C::CUBLAS_COMPUTE_32F }),
        DType::F16 => (T::CUDA_R_16F, C::CUBLAS_COMPUTE_32F),
        DType::BF16 => (T::CUDA_R_16BF, C::CUBLAS_COMPUTE_32F),
        DType::F64 => (T::CUDA_R_64F, C::CUBLAS_COMPUTE_64F),
        d => return Err(super::unsupported("matmul", format!("dtype {d} (cuBLAS handles f16, bf16, f32, f64)"))),
    };
    let nd = shape.len();
    let (m, n) = (shape[nd - 2], shape[nd - 1]);
    let k = a.layout.shape[a.layout.shape.len() - 1];
    let batch: usize = shape[..nd - 2].iter().product();
    if m * n * batch == 0 {
        return new_storage(cs, dtype, shape);
    }
    if k == 0 {
        return super::elementwise::full(cs, shape, dtype, 0.0);
    }
    let too_big = [m, n, k, batch].iter().any(|&v| v > i32::MAX as usize);
    if too_big {
        return Err(super::unsupported("matmul", format!("dimensions beyond i32 for shape {shape:?}")));
    }
    let ac;
    let a = if a.layout.is_contiguous() {
        a
    } else {
        ac = super::elementwise::copy(cs, a)?;
        &ac
    };
    let bc;
    let b = if b.layout.is_contiguous() {
        b
    } else {
        bc = super::elementwise::copy(cs, b)?;
        &bc
    };
    let out = new_storage(cs, dtype, shape)?;
    let size = dtype.size() as u64;
    let pa = cuda_of(a).map(|x| x.ptr()).unwrap_or(0) + a.layout.offset as u64 * size;
    let pb = cuda_of(b).map(|x| x.ptr()).unwrap_or(0) + b.layout.offset as u64 * size;
    let pc = cuda_of(&out).map(|x| x.ptr()).unwrap_or(0);
    let r = catch_unwind(AssertUnwindSafe(|| -> Result<()> {
        // SAFETY: only tries to open the library.
        if !unsafe { cbsys::is_culib_present() } {
            return Err(super::unsupported("matmul", "cuBLAS (libcublas) was not found"));
        }
        let _ = cs.dev.ctx.bind_to_thread();
        let mut g = cs.blas.lock();
        let fresh = g.is_none();
        if fresh {
            let h = cb::create_handle().map_err(|e| super::backend_err("matmul", e))?;
            // A workspace of its own lets cuBLAS pick its fastest Hopper kernels (the
            // default one is small); without memory for it, cuBLAS runs without.
            // SAFETY: scratch memory, written by cuBLAS before it is read.
            let ws = unsafe { cs.stream().alloc::<u8>(WORKSPACE) }.ok();
            if let Some(w) = &ws {
                let (p, _) = cudarc::driver::DevicePtr::device_ptr(w, cs.stream());
                // SAFETY: the workspace outlives the handle (both freed together).
                unsafe { cbsys::cublasSetWorkspace_v2(h, p as *mut std::ffi::c_void, WORKSPACE) };
            }
            *g = Some(Blas { handle: h, workspace: std::mem::ManuallyDrop::new(ws) });
            // cuBLAS is loaded by now (its statics registered their teardown): keep the
            // exit hook ahead of it (see `register_exit_hook`).
            crate::runtime::lifecycle::register_exit_hook();
        }
        let h = g.as_ref().map(|b| b.handle).unwrap_or(std::ptr::null_mut());
        let (one32, zero32, one64, zero64) = (1.0f32, 0.0f32, 1.0f64, 0.0f64);
        let (alpha, beta): (*const std::ffi::c_void, *const std::ffi::c_void) = if dtype == DType::F64 {
            ((&one64 as *const f64).cast(), (&zero64 as *const f64).cast())
        } else {
            ((&one32 as *const f32).cast(), (&zero32 as *const f32).cast())
        };
        let op = cbsys::cublasOperation_t::CUBLAS_OP_N;
        // SAFETY: the handle is ours and bound to this stream; the pointers cover the
        // contiguous [batch, m, k], [batch, k, n] and [batch, m, n] operands.
        let res = unsafe {
            cb::set_stream(h, cs.stream().cu_stream() as cbsys::cudaStream_t)
                .map_err(|e| super::backend_err("matmul", e))
                .and_then(|()| {
                    let (pa, pb) = (pa as *const std::ffi::c_void, pb as *const std::ffi::c_void);
                    let pc = pc as *mut std::ffi::c_void;
                    let (sa, sb, sc) = ((m * k) as i64, (k * n) as i64, (m * n) as i64);
                    let (m, n, k) = (m as i32, n as i32, k as i32);
                    let algo = cbsys::cublasGemmAlgo_t::CUBLAS_GEMM_DFALT;
                    if batch == 1 {
                        // One product: cuBLAS picks faster kernels through this entry
                        // point (bf16 8192^3 on the H200: 1.405 ms vs 1.519 ms strided
                        // with a batch of one, `bench/kernel_lab.py blas`).
                        cb::gemm_ex(h, op, op, n, m, k, alpha, pb, ty, n, pa, ty, k, beta, pc, ty, n, compute, algo)
                    } else {
                        cb::gemm_strided_batched_ex(
                            h,
                            op,
                            op,
                            n,
                            m,
                            k,
                            alpha,
                            pb,
                            ty,
                            n,
                            sb,
                            pa,
                            ty,
                            k,
                            sa,
                            beta,
                            pc,
                            ty,
                            n,
                            sc,
                            batch as i32,
                            compute,
                            algo,
                        )
                    }
                    .map_err(|e| super::backend_err("matmul", e))
                })
        };
        if fresh {
            // Statics cuBLAS built on this handle's first call: the same.
            crate::runtime::lifecycle::register_exit_hook();
        }
        res
    }));
    r.unwrap_or_else(|_| Err(super::unsupported("matmul", "cuBLAS could not be loaded")))?;
    Ok(out)
}
