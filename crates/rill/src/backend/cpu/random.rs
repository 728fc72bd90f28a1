//! Counter-based random numbers (threefry-2x32).

use crate::backend::Storage;
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::primitives::Distribution;

pub(crate) fn random(_shape: &[usize], _dtype: DType, _key: [u32; 2], _dist: Distribution) -> Result<Storage> {
    Err(Error::Unsupported { op: "random", backend: "cpu", msg: "not yet implemented".into() })
}
