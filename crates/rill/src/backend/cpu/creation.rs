//! Source kernels: full, arange, eye.

use crate::backend::cpu::CpuBuffer;
use crate::backend::{Buffer, Storage};
use crate::dtype::{DType, Element};
use crate::error::Result;
use crate::shape::numel;

pub(crate) fn full(shape: &[usize], dtype: DType, value: f64) -> Result<Storage> {
    let n = numel(shape);
    let mut buf = CpuBuffer::alloc(dtype, n)?;
    let v = if dtype == DType::Bool { (value != 0.0) as u8 as f64 } else { value };
    crate::with_dtype!(dtype, T => buf.typed_mut::<T>().fill(T::from_f64(v)));
    Ok(Storage::contiguous(Buffer::Cpu(buf), dtype, shape))
}

pub(crate) fn arange(shape: &[usize], dtype: DType, start: f64, step: f64) -> Result<Storage> {
    let n = numel(shape);
    let mut buf = CpuBuffer::alloc(dtype, n)?;
    crate::with_dtype!(dtype, T => {
        for (i, o) in buf.typed_mut::<T>().iter_mut().enumerate() {
            *o = T::from_f64(start + i as f64 * step);
        }
    });
    Ok(Storage::contiguous(Buffer::Cpu(buf), dtype, shape))
}

pub(crate) fn eye(shape: &[usize], dtype: DType, k: isize) -> Result<Storage> {
    let (n, m) = (shape[0], shape[1]);
    let mut buf = CpuBuffer::alloc(dtype, n * m)?;
    crate::with_dtype!(dtype, T => {
        let out = buf.typed_mut::<T>();
        out.fill(T::zero());
        for i in 0..n {
            let j = i as isize + k;
            if j >= 0 && (j as usize) < m {
                out[i * m + j as usize] = T::one();
            }
        }
    });
    Ok(Storage::contiguous(Buffer::Cpu(buf), dtype, shape))
}
