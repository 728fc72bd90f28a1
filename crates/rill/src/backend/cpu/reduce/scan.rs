//! Arg-reductions and cumulative sums along one axis.

use crate::backend::cpu::reduce::acc::{Acc, Reducible};
use crate::backend::cpu::{CpuBuffer, PAR_CHUNK, par, strided};
use crate::backend::{Buffer, Storage};
use crate::dtype::DType;
use crate::error::Result;
use crate::primitives::ArgReduceOp;
use crate::shape::numel;

/// The elements of `x` in row-major order of its shape with `axis` moved last.
fn axis_last<T: Reducible>(x: &Storage, axis: usize) -> std::borrow::Cow<'_, [T]> {
    let nd = x.layout.shape.len();
    if axis + 1 == nd || x.layout.shape[axis + 1..].iter().all(|&d| d == 1) {
        return strided::contiguous::<T>(x);
    }
    let mut perm: Vec<usize> = (0..nd).filter(|&i| i != axis).collect();
    perm.push(axis);
    let mut v = vec![T::zero(); x.layout.numel()];
    strided::gather(strided::buffer::<T>(x), &x.layout.permute(&perm), &mut v);
    std::borrow::Cow::Owned(v)
}

/// Index of the first maximum (`max`) or minimum of a non-empty row; the first NaN wins,
/// as in NumPy.
#[inline]
fn arg_row<T: Reducible>(row: &[T], max: bool) -> i64 {
    let mut best = row[0].up();
    if best.is_nan() {
        return 0;
    }
    let mut bi = 0;
    for (i, &v) in row.iter().enumerate().skip(1) {
        let v = v.up();
        if v.is_nan() {
            return i as i64;
        }
        if (max && v > best) || (!max && v < best) {
            best = v;
            bi = i;
        }
    }
    bi as i64
}

/// Argmax/argmin over `axis` (of size at least 1, checked by the op) into an i64 storage
/// of `shape` (the input shape with that axis set to 1).
pub(crate) fn arg_reduce(op: ArgReduceOp, x: &Storage, axis: usize, shape: &[usize]) -> Result<Storage> {
    let n_out = numel(shape);
    let mut buf = CpuBuffer::alloc(DType::I64, n_out)?;
    let out = buf.typed_mut::<i64>();
    let len = x.layout.shape[axis];
    if n_out > 0 && len > 0 {
        let max = op == ArgReduceOp::ArgMax;
        crate::with_dtype!(x.dtype, T => {
            let data = axis_last::<T>(x, axis);
            let rows_per = PAR_CHUNK.div_ceil(len).max(1);
            par::zip(out, rows_per, &data, rows_per * len, |o, xs| {
                for (o, row) in o.iter_mut().zip(xs.chunks_exact(len)) {
                    *o = arg_row(row, max);
                }
            });
        });
    }
    Ok(Storage::contiguous(Buffer::Cpu(buf), DType::I64, shape))
}

/// Cumulative sum along `axis` into a new contiguous storage of the input's shape and dtype.
pub(crate) fn cumsum(x: &Storage, axis: usize, reverse: bool, exclusive: bool) -> Result<Storage> {
    let shape = x.layout.shape.clone();
    let n = numel(&shape);
    let mut buf = CpuBuffer::alloc(x.dtype, n)?;
    crate::with_dtype!(x.dtype, T => {
        scan::<T>(&strided::contiguous::<T>(x), buf.typed_mut::<T>(), &shape, axis, reverse, exclusive)
    });
    Ok(Storage::contiguous(Buffer::Cpu(buf), x.dtype, &shape))
}

/// Scans a contiguous `[outer, len, inner]` array along the middle axis, carrying a
/// running vector of `inner` sums (vectorises across `inner`).
fn scan<T: Reducible>(x: &[T], out: &mut [T], shape: &[usize], axis: usize, reverse: bool, exclusive: bool) {
    let len = shape[axis];
    let inner: usize = shape[axis + 1..].iter().product();
    let slab = len * inner;
    if x.is_empty() || slab == 0 {
        return;
    }
    let one = |xs: &[T], os: &mut [T]| {
        let mut acc = vec![T::A::ZERO; inner];
        for step in 0..len {
            let r = if reverse { len - 1 - step } else { step };
            let (xr, or) = (&xs[r * inner..(r + 1) * inner], &mut os[r * inner..(r + 1) * inner]);
            if exclusive {
                for ((a, o), &v) in acc.iter_mut().zip(or.iter_mut()).zip(xr) {
                    *o = T::down(*a);
                    *a = a.add(v.up());
                }
            } else {
                for ((a, o), &v) in acc.iter_mut().zip(or.iter_mut()).zip(xr) {
                    *a = a.add(v.up());
                    *o = T::down(*a);
                }
            }
        }
    };
    let per = PAR_CHUNK.div_ceil(slab).max(1);
    par::zip(out, per * slab, x, per * slab, |os, xs| {
        for (xs, os) in xs.chunks_exact(slab).zip(os.chunks_exact_mut(slab)) {
            one(xs, os);
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::cpu::from_f64_slice;
    use crate::shape::Layout;

    #[test]
    fn arg_and_scan_on_permuted_layouts() {
        let vals: Vec<f64> = (0..24).map(|i| ((i * 7) % 11) as f64).collect();
        let l = Layout::contiguous(&[2, 3, 4]).permute(&[2, 0, 1]); // shape [4, 2, 3]
        let s = from_f64_slice(&vals, DType::F64, &[2, 3, 4]).unwrap().with_layout(l.clone());
        let at = |i: usize, j: usize, k: usize| vals[l.offset_of(&[i, j, k])];
        // argmax over axis 0 of the view
        let got = arg_reduce(ArgReduceOp::ArgMax, &s, 0, &[1, 2, 3]).unwrap();
        let got = crate::backend::cpu::to_f64_vec(&got);
        for j in 0..2 {
            for k in 0..3 {
                let mut bi = 0;
                for i in 1..4 {
                    if at(i, j, k) > at(bi, j, k) {
                        bi = i;
                    }
                }
                assert_eq!(got[j * 3 + k], bi as f64);
            }
        }
        // reverse exclusive cumsum over axis 1 of the view
        let got = crate::backend::cpu::to_f64_vec(&cumsum(&s, 1, true, true).unwrap());
        for i in 0..4 {
            for k in 0..3 {
                assert_eq!(got[i * 6 + k], at(i, 1, k));
                assert_eq!(got[i * 6 + 3 + k], 0.0);
            }
        }
    }
}
