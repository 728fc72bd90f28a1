//! Matrix products through cuBLAS (`cublasGemmStridedBatchedEx`).

use std::sync::atomic::{AtomicBool, Ordering::Relaxed};

use crate::backend::Storage;
use crate::dtype::DType;
use crate::error::Result;

use super::handles::CudaStreamHandle;

static TF32: AtomicBool = AtomicBool::new(false);

/// Allows f32 matrix products on GPUs to use TF32 tensor cores (faster, about 10 bits of
/// mantissa in the products). Off by default; `RILL_CUDA_TF32=1` also turns it on.
/// Returns the previous setting.
pub fn set_allow_tf32(allow: bool) -> bool {
    TF32.swap(allow, Relaxed)
}

pub(crate) fn matmul(
    _cs: &CudaStreamHandle,
    _a: &Storage,
    _b: &Storage,
    _shape: &[usize],
    _dtype: DType,
) -> Result<Storage> {
    let _ = TF32.load(Relaxed);
    Err(super::unsupported("matmul", "no CUDA kernel yet"))
}
