//! Movement kernels: views (reshape, slice) and copies (contiguous, take, concatenate, pad).

use crate::backend::cpu::{CpuBuffer, strided};
use crate::backend::{Buffer, Storage};
use crate::error::{Error, Result};
use crate::shape::Layout;

/// A row-major copy of any storage.
pub(crate) fn make_contiguous(s: &Storage) -> Result<Storage> {
    let n = s.layout.numel();
    let mut buf = CpuBuffer::alloc(s.dtype, n)?;
    crate::with_dtype!(s.dtype, T => {
        strided::gather(strided::buffer::<T>(s), &s.layout, buf.typed_mut::<T>());
    });
    Ok(Storage::contiguous(Buffer::Cpu(buf), s.dtype, &s.layout.shape))
}

/// A view when the strides allow it, otherwise a copy.
pub(crate) fn reshape(s: &Storage, shape: &[usize]) -> Result<Storage> {
    match s.layout.reshape(shape) {
        Some(l) => Ok(s.with_layout(l)),
        None => {
            let c = make_contiguous(s)?;
            Ok(c.with_layout(Layout::contiguous(shape)))
        }
    }
}

/// A strided view: `start[i]` is the first index taken on axis i, `step[i]` the step.
pub(crate) fn slice_view(s: &Storage, start: &[usize], step: &[isize], shape: &[usize]) -> Storage {
    let l = &s.layout;
    let mut offset = l.offset as isize;
    let mut strides = l.strides.clone();
    for i in 0..shape.len() {
        if shape[i] > 0 {
            offset += start[i] as isize * l.strides[i];
        }
        strides[i] = l.strides[i] * step[i];
    }
    s.with_layout(Layout { shape: shape.to_vec(), strides, offset: offset.max(0) as usize })
}

pub(crate) fn take(_x: &Storage, _idx: &Storage, _axis: usize, _shape: &[usize]) -> Result<Storage> {
    Err(Error::Unsupported { op: "take", backend: "cpu", msg: "not yet implemented".into() })
}

pub(crate) fn concatenate(_xs: &[Storage], _axis: usize, _shape: &[usize]) -> Result<Storage> {
    Err(Error::Unsupported { op: "concatenate", backend: "cpu", msg: "not yet implemented".into() })
}

pub(crate) fn pad(_x: &Storage, _widths: &[(usize, usize)], _value: f64, _shape: &[usize]) -> Result<Storage> {
    Err(Error::Unsupported { op: "pad", backend: "cpu", msg: "not yet implemented".into() })
}
