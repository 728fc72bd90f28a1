//! Movement kernels: views (reshape, slice) and copies (contiguous, take, concatenate, pad).
//!
//! Copies write a new contiguous output. Inputs are read through their layouts: a block
//! whose layout is contiguous is copied with `copy_from_slice`, any other block (transposed,
//! broadcast, reversed) with `strided::gather`. Work is split across the worker pool over
//! output rows.

use crate::backend::cpu::{CpuBuffer, PAR_CHUNK, par, strided};
use crate::backend::{Buffer, Storage};
use crate::dtype::{DType, Element};
use crate::error::{Error, Result};
use crate::shape::{Layout, contiguous_strides, numel};

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
    if shape.contains(&0) {
        // An empty view reads nothing; offset 0 is within every buffer.
        return s.with_layout(Layout::contiguous(shape));
    }
    let mut offset = l.offset as isize;
    let mut strides = l.strides.clone();
    for i in 0..shape.len() {
        offset += start[i] as isize * l.strides[i];
        strides[i] = l.strides[i] * step[i];
    }
    s.with_layout(Layout { shape: shape.into(), strides, offset: offset as usize })
}

/// Buffer offsets of the elements `[o_0, .., o_{k-1}, 0, .., 0]` of `l` for every
/// multi-index `o` over its first `k` axes, in row-major order.
fn outer_bases(l: &Layout, k: usize) -> Vec<usize> {
    let mut v = Vec::with_capacity(numel(&l.shape[..k]));
    strided::walk(&l.shape[..k], [&l.strides[..k]], [l.offset], |[b], n, [s]| {
        for t in 0..n {
            v.push((b as isize + t as isize * s) as usize);
        }
    });
    v
}

/// Copies the elements of `layout` over `src` into `dst` (row-major), with a plain slice
/// copy when the layout is contiguous.
fn copy_block<T: Copy + Send + Sync>(src: &[T], layout: &Layout, dst: &mut [T]) {
    if layout.is_contiguous() {
        dst.copy_from_slice(&src[layout.offset..layout.offset + dst.len()]);
    } else {
        strided::gather(src, layout, dst);
    }
}

/// Rows of at least this many elements are each one parallel task; shorter rows are grouped.
pub(crate) fn min_rows(row: usize) -> usize {
    (PAR_CHUNK / row.max(1)).max(1)
}

/// The values of the index array `idx` (any integer dtype, any layout) in row-major
/// order, negative ones counted from the end of an axis of `size`: `Error::Index` naming
/// `op` for the first one outside `[-size, size)`.
pub(crate) fn wrapped_indices(op: &'static str, idx: &Storage, axis: usize, size: usize) -> Result<Vec<usize>> {
    let raw: Vec<i64> = crate::with_dtype!(idx.dtype, I => {
        strided::contiguous::<I>(idx).iter().map(|v| v.to_i64()).collect()
    });
    let mut pos = Vec::with_capacity(raw.len());
    for &i in &raw {
        let j = if i < 0 { i + size as i64 } else { i };
        if j < 0 || j >= size as i64 {
            return Err(Error::Index { op, index: i, axis, size });
        }
        pos.push(j as usize);
    }
    Ok(pos)
}

/// Gathers along `axis`: the output is `x.shape[..axis] + idx.shape + x.shape[axis + 1..]`.
///
/// Every index is checked first: one outside `[-size, size)` fails the node with
/// `Error::Index` (negative indices count from the end).
pub(crate) fn take(x: &Storage, idx: &Storage, axis: usize, shape: &[usize]) -> Result<Storage> {
    let size = x.layout.shape[axis];
    let pos = wrapped_indices("take", idx, axis, size)?;
    let dtype = x.dtype;
    let n = numel(shape);
    let mut buf = CpuBuffer::alloc(dtype, n)?;
    let inner = numel(&x.layout.shape[axis + 1..]);
    if n > 0 {
        let bases = outer_bases(&x.layout, axis);
        let stride = x.layout.strides[axis];
        let sub = |base: usize| Layout {
            shape: x.layout.shape[axis + 1..].into(),
            strides: x.layout.strides[axis + 1..].into(),
            offset: base,
        };
        let nidx = pos.len();
        crate::with_dtype!(dtype, T => {
            let src = strided::buffer::<T>(x);
            par::chunks_min(buf.typed_mut::<T>(), inner, min_rows(inner), |r, o| {
                let base = bases[r / nidx] as isize + pos[r % nidx] as isize * stride;
                copy_block(src, &sub(base as usize), o);
            });
        });
    }
    Ok(Storage::contiguous(Buffer::Cpu(buf), dtype, shape))
}

/// Joins the inputs (all of the node dtype) along `axis`.
pub(crate) fn concatenate(xs: &[&Storage], axis: usize, shape: &[usize]) -> Result<Storage> {
    let dtype = xs[0].dtype;
    let n = numel(shape);
    let mut buf = CpuBuffer::alloc(dtype, n)?;
    let inner = numel(&shape[axis + 1..]);
    let row = shape[axis] * inner;
    if n > 0 {
        // For each input: the offsets of its outer rows, the width of its block, and where
        // the block starts in an output row.
        let mut at = 0;
        let parts: Vec<(Vec<usize>, usize, usize)> = xs
            .iter()
            .map(|x| {
                let width = x.layout.shape[axis] * inner;
                let p = (outer_bases(&x.layout, axis), width, at);
                at += width;
                p
            })
            .collect();
        crate::with_dtype!(dtype, T => {
            par::chunks_min(buf.typed_mut::<T>(), row, min_rows(row), |r, o| {
                for (x, (bases, width, at)) in xs.iter().zip(&parts) {
                    if *width == 0 {
                        continue;
                    }
                    let l = Layout {
                        shape: x.layout.shape[axis..].into(),
                        strides: x.layout.strides[axis..].into(),
                        offset: bases[r],
                    };
                    copy_block(strided::buffer::<T>(x), &l, &mut o[*at..*at + *width]);
                }
            });
        });
    }
    Ok(Storage::contiguous(Buffer::Cpu(buf), dtype, shape))
}

/// Constant padding: `widths[i] = (before, after)` on axis i; the rest is `value`
/// (converted to the dtype; nonzero is `true` for bool).
pub(crate) fn pad(x: &Storage, widths: &[(usize, usize)], value: f64, shape: &[usize]) -> Result<Storage> {
    let dtype = x.dtype;
    let n = numel(shape);
    let mut buf = CpuBuffer::alloc(dtype, n)?;
    let v = if dtype == DType::Bool { (value != 0.0) as u8 as f64 } else { value };
    let out_strides = contiguous_strides(shape);
    let interior: usize = widths.iter().zip(&out_strides).map(|(w, &s)| w.0 * s as usize).sum();
    crate::with_dtype!(dtype, T => {
        let out = buf.typed_mut::<T>();
        let fill = T::from_f64(v);
        par::chunks(out, PAR_CHUNK, |_, c| c.fill(fill));
        let src = strided::buffer::<T>(x);
        let l = &x.layout;
        strided::walk(&l.shape, [&l.strides, &out_strides], [l.offset, interior], |[bi, bo], len, [si, so]| {
            if si == 1 && so == 1 {
                out[bo..bo + len].copy_from_slice(&src[bi..bi + len]);
            } else {
                for t in 0..len as isize {
                    out[(bo as isize + t * so) as usize] = src[(bi as isize + t * si) as usize];
                }
            }
        });
    });
    Ok(Storage::contiguous(Buffer::Cpu(buf), dtype, shape))
}
