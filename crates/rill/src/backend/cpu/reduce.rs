//! Reductions over axes, arg-reductions and cumulative sums.

use crate::backend::Storage;
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::primitives::{ArgReduceOp, ReduceOp};

pub(crate) fn reduce(_op: ReduceOp, _x: &Storage, _axes: &[usize], _shape: &[usize], _dtype: DType) -> Result<Storage> {
    Err(Error::Unsupported { op: "reduce", backend: "cpu", msg: "not yet implemented".into() })
}

pub(crate) fn arg_reduce(_op: ArgReduceOp, _x: &Storage, _axis: usize, _shape: &[usize]) -> Result<Storage> {
    Err(Error::Unsupported { op: "argmax", backend: "cpu", msg: "not yet implemented".into() })
}

pub(crate) fn cumsum(_x: &Storage, _axis: usize, _reverse: bool, _exclusive: bool) -> Result<Storage> {
    Err(Error::Unsupported { op: "cumsum", backend: "cpu", msg: "not yet implemented".into() })
}
