//! Reductions, arg-reductions, cumulative sums, softmax and normalisations.

use crate::backend::Storage;
use crate::error::Result;
use crate::primitives::{ArgReduceOp, ReduceOp};

use super::handles::CudaStreamHandle;
use super::unsupported;

pub(crate) fn reduce(
    _cs: &CudaStreamHandle,
    op: ReduceOp,
    _x: &Storage,
    _axes: &[usize],
    _shape: &[usize],
) -> Result<Storage> {
    let _ = op;
    Err(unsupported("reduce", "no CUDA kernel yet"))
}

pub(crate) fn arg_reduce(
    _cs: &CudaStreamHandle,
    _op: ArgReduceOp,
    _x: &Storage,
    _axis: usize,
    _shape: &[usize],
) -> Result<Storage> {
    Err(unsupported("argmax", "no CUDA kernel yet"))
}

pub(crate) fn cumsum(
    _cs: &CudaStreamHandle,
    _x: &Storage,
    _axis: usize,
    _reverse: bool,
    _exclusive: bool,
) -> Result<Storage> {
    Err(unsupported("cumsum", "no CUDA kernel yet"))
}

pub(crate) fn softmax(_cs: &CudaStreamHandle, _x: &Storage, _axis: usize, _log: bool) -> Result<Storage> {
    Err(unsupported("softmax", "no CUDA kernel yet"))
}

pub(crate) fn layer_norm(
    _cs: &CudaStreamHandle,
    _inputs: &[Storage],
    _eps: f64,
    _w: bool,
    _b: bool,
) -> Result<Storage> {
    Err(unsupported("layer_norm", "no CUDA kernel yet"))
}

pub(crate) fn rms_norm(_cs: &CudaStreamHandle, _inputs: &[Storage], _eps: f64, _w: bool) -> Result<Storage> {
    Err(unsupported("rms_norm", "no CUDA kernel yet"))
}
