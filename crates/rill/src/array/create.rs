//! Creating arrays from host data and constants.

use crate::array::Array;
use crate::backend::cpu::CpuBuffer;
use crate::backend::{Buffer, Storage};
use crate::dtype::{DType, Element, Scalar};
use crate::error::{Error, Result};
use crate::ops::{on_device, target_stream};
use crate::primitives::Primitive;
use crate::runtime::device::Device;
use crate::shape::numel;

fn check_len(op: &'static str, len: usize, shape: &[usize]) -> Result<()> {
    let n = shape.iter().try_fold(1usize, |acc, &d| acc.checked_mul(d));
    match n {
        Some(n) if n == len => Ok(()),
        Some(n) => Err(Error::shape(op, format!("{len} values do not fill shape {shape:?} ({n} elements)"))),
        None => Err(Error::shape(op, format!("shape {shape:?} has too many elements"))),
    }
}

/// Wraps host data, placing it on the target stream's device (a lazy copy when that is
/// a GPU).
fn from_host(storage: Storage) -> Result<Array> {
    let stream = target_stream(&[])?;
    let cpu_stream = Device::cpu().default_stream()?;
    let host = Array::from_storage(storage, cpu_stream);
    Ok(on_device(&host, &stream))
}

impl Array {
    /// An array holding a copy of `data` with `shape` (row-major).
    pub fn from_slice<T: Element>(data: &[T], shape: &[usize]) -> Result<Array> {
        check_len("from_slice", data.len(), shape)?;
        let buf = CpuBuffer::from_slice(data)?;
        from_host(Storage::contiguous(Buffer::Cpu(buf), T::DTYPE, shape))
    }
    /// An array taking the values of `data` with `shape` (row-major).
    pub fn from_vec<T: Element>(data: Vec<T>, shape: &[usize]) -> Result<Array> {
        Array::from_slice(&data, shape)
    }
    /// A bool array from Rust bools.
    pub fn from_bools(data: &[bool], shape: &[usize]) -> Result<Array> {
        check_len("from_bools", data.len(), shape)?;
        let bytes: Vec<u8> = data.iter().map(|&b| b as u8).collect();
        let buf = CpuBuffer::from_slice(&bytes)?;
        from_host(Storage::contiguous(Buffer::Cpu(buf), DType::Bool, shape))
    }
    /// A 0-d array holding one Rust value (`f32`, `i64`, `bool`, ...), with the value's
    /// own dtype.
    pub fn scalar<T: Element>(value: T) -> Result<Array> {
        Array::from_slice(&[value], &[])
    }
    /// An array of `shape` filled with `value`, of `dtype`.
    pub fn full(shape: &[usize], value: impl Into<Scalar>, dtype: DType) -> Result<Array> {
        check_len("full", numel(shape), shape)?;
        let stream = target_stream(&[])?;
        let value = value.into().as_f64();
        Ok(Array::from_op(Primitive::Full { value }, Vec::new(), shape.to_vec(), dtype, stream))
    }
    /// Zeros of `shape` and `dtype`.
    pub fn zeros(shape: &[usize], dtype: DType) -> Result<Array> {
        Array::full(shape, 0.0, dtype)
    }
    /// Ones of `shape` and `dtype`.
    pub fn ones(shape: &[usize], dtype: DType) -> Result<Array> {
        Array::full(shape, 1.0, dtype)
    }
    /// Zeros with the shape and dtype of `self`.
    pub fn zeros_like(&self) -> Result<Array> {
        Array::zeros(self.shape(), self.dtype())
    }
    /// Ones with the shape and dtype of `self`.
    pub fn ones_like(&self) -> Result<Array> {
        Array::ones(self.shape(), self.dtype())
    }
}
