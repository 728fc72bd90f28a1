//! Matrix multiplication through the `gemm` crate.

use crate::backend::Storage;
use crate::dtype::DType;
use crate::error::{Error, Result};

pub(crate) fn matmul(_a: &Storage, _b: &Storage, _shape: &[usize], _dtype: DType) -> Result<Storage> {
    Err(Error::Unsupported { op: "matmul", backend: "cpu", msg: "not yet implemented".into() })
}
