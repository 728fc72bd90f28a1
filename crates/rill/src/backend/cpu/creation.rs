//! Source kernels: full, arange, eye.
//!
//! Values are computed in f64 and converted to the node dtype once (`as` semantics:
//! integers truncate toward zero and saturate; bool is `value != 0`).

use crate::backend::cpu::{CpuBuffer, PAR_CHUNK, par};
use crate::backend::{Buffer, Storage};
use crate::dtype::{DType, Element};
use crate::error::Result;
use crate::shape::numel;

pub(crate) fn full(shape: &[usize], dtype: DType, value: f64) -> Result<Storage> {
    let n = numel(shape);
    let mut buf = CpuBuffer::alloc(dtype, n)?;
    let v = if dtype == DType::Bool { (value != 0.0) as u8 as f64 } else { value };
    crate::with_dtype!(dtype, T => {
        let fill = T::from_f64(v);
        par::chunks(buf.typed_mut::<T>(), PAR_CHUNK, |_, c| c.fill(fill));
    });
    Ok(Storage::contiguous(Buffer::Cpu(buf), dtype, shape))
}

/// `start + i * step` (computed in f64) along the only axis.
pub(crate) fn arange(shape: &[usize], dtype: DType, start: f64, step: f64) -> Result<Storage> {
    let n = numel(shape);
    let mut buf = CpuBuffer::alloc(dtype, n)?;
    let bool_out = dtype == DType::Bool;
    crate::with_dtype!(dtype, T => {
        par::chunks(buf.typed_mut::<T>(), PAR_CHUNK, |c, out| {
            for (j, o) in out.iter_mut().enumerate() {
                let v = start + (c * PAR_CHUNK + j) as f64 * step;
                *o = T::from_f64(if bool_out { (v != 0.0) as u8 as f64 } else { v });
            }
        });
    });
    Ok(Storage::contiguous(Buffer::Cpu(buf), dtype, shape))
}

/// Ones where `j == i + k` in an `[n, m]` array, zeros elsewhere.
pub(crate) fn eye(shape: &[usize], dtype: DType, k: isize) -> Result<Storage> {
    let (n, m) = (shape[0], shape[1]);
    let mut buf = CpuBuffer::alloc(dtype, n * m)?;
    crate::with_dtype!(dtype, T => {
        let out = buf.typed_mut::<T>();
        par::chunks(out, PAR_CHUNK, |_, c| c.fill(T::zero()));
        for i in 0..n {
            let j = (i as isize).saturating_add(k);
            if j >= 0 && (j as usize) < m {
                out[i * m + j as usize] = T::one();
            }
        }
    });
    Ok(Storage::contiguous(Buffer::Cpu(buf), dtype, shape))
}
