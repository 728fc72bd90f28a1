//! Creating arrays from host data and constants.

use crate::array::Array;
use crate::backend::cpu::CpuBuffer;
use crate::backend::{Buffer, Storage};
use crate::dtype::{DType, Element, Scalar};
use crate::error::Result;
use crate::ops::{on_device, target_stream};
use crate::primitives::{Primitive, creation as rule};
use crate::runtime::device::Device;

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
        rule::constant("from_slice", data.len(), shape, T::DTYPE)?;
        let buf = CpuBuffer::from_slice(data)?;
        from_host(Storage::contiguous(Buffer::Cpu(buf), T::DTYPE, shape))
    }
    /// An array taking the values of `data` with `shape` (row-major).
    pub fn from_vec<T: Element>(data: Vec<T>, shape: &[usize]) -> Result<Array> {
        Array::from_slice(&data, shape)
    }
    /// A bool array from Rust bools.
    pub fn from_bools(data: &[bool], shape: &[usize]) -> Result<Array> {
        rule::constant("from_bools", data.len(), shape, DType::Bool)?;
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
        let shape = rule::full("full", shape, dtype)?;
        let stream = target_stream(&[])?;
        let value = value.into().as_f64();
        Ok(Array::from_op(Primitive::Full { value }, Vec::new(), shape, dtype, stream))
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
    /// `value` everywhere, with the shape and dtype of `self`.
    pub fn full_like(&self, value: impl Into<Scalar>) -> Result<Array> {
        Array::full(self.shape(), value, self.dtype())
    }

    /// `start, start + step, ...` up to `stop` (exclusive), as NumPy's `arange`: the
    /// length is `ceil((stop - start) / step)` (0 when negative). Values are computed in
    /// f64 as `start + i * step` and converted to `dtype` (integers truncate toward zero).
    ///
    /// Errors when `step` is 0, a bound is not finite, `dtype` is bool, or the length is
    /// too large.
    pub fn arange(
        start: impl Into<Scalar>,
        stop: impl Into<Scalar>,
        step: impl Into<Scalar>,
        dtype: DType,
    ) -> Result<Array> {
        let (start, stop, step) = (start.into().as_f64(), stop.into().as_f64(), step.into().as_f64());
        let shape = rule::arange(start, stop, step, dtype)?;
        let stream = target_stream(&[])?;
        Ok(Array::from_op(Primitive::Arange { start, step }, Vec::new(), shape, dtype, stream))
    }

    /// `num` evenly spaced values from `start` to `stop`, both included (NumPy's
    /// `linspace` with `endpoint=True`): `start + i * (stop - start) / (num - 1)` computed
    /// in f64, with the last value exactly `stop`, converted to `dtype` (integers truncate
    /// toward zero).
    pub fn linspace(start: impl Into<Scalar>, stop: impl Into<Scalar>, num: usize, dtype: DType) -> Result<Array> {
        let (start, stop) = (start.into().as_f64(), stop.into().as_f64());
        let shape = rule::linspace(start, stop, num, dtype)?;
        let stream = target_stream(&[])?;
        if num <= 1 {
            return Ok(Array::from_op(Primitive::Full { value: start }, Vec::new(), shape, dtype, stream));
        }
        let step = (stop - start) / (num - 1) as f64;
        let body = Array::from_op(Primitive::Arange { start, step }, Vec::new(), vec![num - 1], dtype, stream.clone());
        let last = Array::from_op(Primitive::Full { value: stop }, Vec::new(), vec![1], dtype, stream.clone());
        Ok(Array::from_op(Primitive::Concatenate { axis: 0 }, vec![body, last], shape, dtype, stream))
    }

    /// An `n x m` matrix (`m` defaults to `n`) with ones on the `k`-th diagonal (`k > 0`
    /// above the main diagonal, `k < 0` below) and zeros elsewhere.
    pub fn eye(n: usize, m: Option<usize>, k: isize, dtype: DType) -> Result<Array> {
        let shape = rule::eye(n, m.unwrap_or(n), dtype)?;
        let stream = target_stream(&[])?;
        Ok(Array::from_op(Primitive::Eye { k }, Vec::new(), shape, dtype, stream))
    }

    /// The `n x n` identity matrix.
    pub fn identity(n: usize, dtype: DType) -> Result<Array> {
        Array::eye(n, None, 0, dtype)
    }
}
