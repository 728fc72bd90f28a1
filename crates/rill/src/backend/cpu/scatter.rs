//! Scatters and the per-element gather (`primitives/scatter.rs`): `ScatterAdd`,
//! `TakeAlongAxis`, `PutAlongAxis`.
//!
//! Every index is checked before anything is written (`Error::Index` names the first bad
//! one in row-major order, as `take` does). The scatters copy `x` into a new buffer and
//! then visit the updates in row-major order, split across the pool by the rows before
//! the axis (each task owns its rows of the output), so duplicates are summed, or
//! overwritten, in the same order on every run: the last write to an element wins.

use crate::backend::cpu::movement::{min_rows, wrapped_indices};
use crate::backend::cpu::{CpuBuffer, par, strided};
use crate::backend::{Buffer, Storage};
use crate::dtype::{DType, Element};
use crate::error::Result;
use crate::primitives::BinaryOp;
use crate::shape::numel;

/// `a + b` as the `add` op computes it (`primitives/binary.rs`): integers wrap, f16 and
/// bf16 add in f32 and round once. (Bool, stored as u8, is handled by its caller.)
trait Accumulate: Element {
    fn acc(a: Self, b: Self) -> Self;
}
macro_rules! acc_int {
    ($($t:ty),*) => {$(
        impl Accumulate for $t {
            #[inline(always)]
            fn acc(a: Self, b: Self) -> Self { BinaryOp::Add.int(a, b) }
        }
    )*};
}
acc_int!(u8, u32, i32, i64);
impl Accumulate for f32 {
    #[inline(always)]
    fn acc(a: Self, b: Self) -> Self {
        BinaryOp::Add.float(a, b)
    }
}
impl Accumulate for f64 {
    #[inline(always)]
    fn acc(a: Self, b: Self) -> Self {
        BinaryOp::Add.float(a, b)
    }
}
macro_rules! acc_half {
    ($($t:ty),*) => {$(
        impl Accumulate for $t {
            #[inline(always)]
            fn acc(a: Self, b: Self) -> Self { <$t>::from_f32(BinaryOp::Add.float(a.to_f32(), b.to_f32())) }
        }
    )*};
}
acc_half!(half::f16, half::bf16);

/// The offsets `sum(i[d] * strides[d])` of every multi-index `i` of `shape`, row-major.
fn offsets(shape: &[usize], strides: &[isize]) -> Vec<isize> {
    let mut v = vec![0isize];
    for (&d, &s) in shape.iter().zip(strides) {
        v = v.iter().flat_map(|&b| (0..d).map(move |i| b + i as isize * s)).collect();
    }
    v
}

/// A new contiguous buffer holding `x`'s elements.
fn copy_of(x: &Storage) -> Result<CpuBuffer> {
    let mut buf = CpuBuffer::alloc(x.dtype, x.layout.numel())?;
    crate::with_dtype!(x.dtype, T => {
        strided::gather(strided::buffer::<T>(x), &x.layout, buf.typed_mut::<T>());
    });
    Ok(buf)
}

/// Writes `src[i]` into `out` at the target of each index position `i` of the updates
/// (`[outer, m, inner]` row-major), combined with the element there by `f`: `target(o,
/// i)` is the row of `x`'s axis that position `i` of outer row `o` names.
fn scatter_rows<T: Copy + Send + Sync>(
    out: &mut [T],
    src: &[T],
    (m, size, inner): (usize, usize, usize),
    target: impl Fn(usize) -> usize + Sync,
    f: impl Fn(T, T) -> T + Sync,
) {
    if out.is_empty() || inner == 0 || m == 0 {
        return;
    }
    let row = size * inner;
    par::chunks_min(out, row, min_rows(row), |o, dst| {
        for k in 0..m {
            let at = (o * m + k) * inner;
            for c in 0..inner {
                let t = target(at + c) * inner + c;
                dst[t] = f(dst[t], src[at + c]);
            }
        }
    });
}

/// Bool's `add` (stored as u8): the logical or.
#[inline(always)]
fn logical_or<T: Element>(a: T, v: T) -> T {
    if v != T::zero() { T::one() } else { a }
}

/// Sums the update rows each output row lists (`order[start[r]..start[r + 1]]`, in index
/// order) into it with `f`, in parallel over the output rows (`[outer * size, inner]`).
fn sum_listed_rows<T: Copy + Send + Sync>(
    out: &mut [T],
    src: &[T],
    (start, order): (&[usize], &[usize]),
    (m, size, inner): (usize, usize, usize),
    f: impl Fn(T, T) -> T + Sync,
) {
    par::chunks_min(out, inner, min_rows(inner), |row, dst| {
        let (o, r) = (row / size, row % size);
        for &k in &order[start[r]..start[r + 1]] {
            let from = &src[(o * m + k) * inner..(o * m + k + 1) * inner];
            for (d, &v) in dst.iter_mut().zip(from) {
                *d = f(*d, v);
            }
        }
    });
}

/// Runs `scatter_rows` with the combining function of `dtype`: the sum (logical or for
/// bool, as `add`), or the value itself when `assign`.
fn scatter_into(
    out: &mut CpuBuffer,
    src: &Storage,
    dims: (usize, usize, usize),
    target: impl Fn(usize) -> usize + Sync,
    assign: bool,
) {
    let dtype = src.dtype;
    crate::with_dtype!(dtype, T => {
        let s = strided::contiguous::<T>(src);
        let o = out.typed_mut::<T>();
        if assign {
            scatter_rows(o, &s, dims, target, |_, v| v);
        } else if dtype == DType::Bool {
            scatter_rows(o, &s, dims, target, logical_or::<T>);
        } else {
            scatter_rows(o, &s, dims, target, T::acc);
        }
    });
}

/// `x` with `updates` (`x.shape[..axis] + idx.shape + x.shape[axis + 1..]`) summed into
/// the rows `idx` names along `axis`.
pub(crate) fn scatter_add(inputs: &[&Storage], axis: usize) -> Result<Storage> {
    let (x, idx, updates) = (inputs[0], inputs[1], inputs[2]);
    let shape = &x.layout.shape;
    let pos = wrapped_indices("scatter_add", idx, axis, shape[axis])?;
    let mut out = copy_of(x)?;
    let (m, size, inner) = (pos.len(), shape[axis], numel(&shape[axis + 1..]));
    if out.len() == 0 || m == 0 || inner == 0 {
        return Ok(Storage::contiguous(Buffer::Cpu(out), x.dtype, shape));
    }
    // Every row along the axis lists the update rows summed into it (in index order), so
    // the loop runs over output rows: in parallel even when there is one outer row (an
    // embedding table's gradient), each element summed in the order a loop over the
    // updates would sum it.
    let mut start = vec![0usize; size + 1];
    for &p in &pos {
        start[p + 1] += 1;
    }
    for r in 0..size {
        start[r + 1] += start[r];
    }
    let mut fill = start.clone();
    let mut order = vec![0usize; m];
    for (k, &p) in pos.iter().enumerate() {
        order[fill[p]] = k;
        fill[p] += 1;
    }
    let dtype = updates.dtype;
    crate::with_dtype!(dtype, T => {
        let src = strided::contiguous::<T>(updates);
        let (o, lists, dims) = (out.typed_mut::<T>(), (&start[..], &order[..]), (m, size, inner));
        if dtype == DType::Bool {
            sum_listed_rows(o, &src, lists, dims, logical_or::<T>);
        } else {
            sum_listed_rows(o, &src, lists, dims, T::acc);
        }
    });
    Ok(Storage::contiguous(Buffer::Cpu(out), x.dtype, shape))
}

/// `x` with `values` (the shape of `idx`) assigned, or summed when `accumulate`, at one
/// index per value along `axis`.
pub(crate) fn put_along_axis(inputs: &[&Storage], axis: usize, accumulate: bool) -> Result<Storage> {
    let (x, idx, values) = (inputs[0], inputs[1], inputs[2]);
    let name = if accumulate { "scatter_add_along_axis" } else { "put_along_axis" };
    let shape = &x.layout.shape;
    let pos = wrapped_indices(name, idx, axis, shape[axis])?;
    let mut out = copy_of(x)?;
    let dims = (idx.layout.shape[axis], shape[axis], numel(&shape[axis + 1..]));
    scatter_into(&mut out, values, dims, |i| pos[i], !accumulate);
    Ok(Storage::contiguous(Buffer::Cpu(out), x.dtype, shape))
}

/// Gathers one element of `x` per index along `axis`; `x` (any layout, broadcast views
/// read in place) and `idx` agree on every other axis, and the output has `idx`'s shape.
pub(crate) fn take_along_axis(x: &Storage, idx: &Storage, axis: usize, shape: &[usize]) -> Result<Storage> {
    let l = &x.layout;
    let pos = wrapped_indices("take_along_axis", idx, axis, l.shape[axis])?;
    let n = numel(shape);
    let mut buf = CpuBuffer::alloc(x.dtype, n)?;
    let (m, inner) = (shape[axis], numel(&shape[axis + 1..]));
    if n > 0 {
        let obase = offsets(&l.shape[..axis], &l.strides[..axis]);
        let cbase = offsets(&l.shape[axis + 1..], &l.strides[axis + 1..]);
        let (st, off) = (l.strides[axis], l.offset as isize);
        let row = m * inner;
        crate::with_dtype!(x.dtype, T => {
            let src = strided::buffer::<T>(x);
            par::chunks_min(buf.typed_mut::<T>(), row, min_rows(row), |o, dst| {
                for (i, d) in dst.iter_mut().enumerate() {
                    let c = i % inner;
                    let at = off + obase[o] + pos[o * row + i] as isize * st + cbase[c];
                    *d = src[at as usize];
                }
            });
        });
    }
    Ok(Storage::contiguous(Buffer::Cpu(buf), x.dtype, shape))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn offsets_walk_row_major_with_any_strides() {
        assert_eq!(offsets(&[2, 3], &[3, 1]), vec![0, 1, 2, 3, 4, 5]);
        assert_eq!(offsets(&[2, 2], &[0, -1]), vec![0, -1, 0, -1]);
        assert_eq!(offsets(&[], &[]), vec![0]);
        assert!(offsets(&[2, 0], &[1, 1]).is_empty());
    }
}
