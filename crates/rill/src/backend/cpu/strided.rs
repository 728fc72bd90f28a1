//! Strided addressing for CPU kernels, in one place.
//!
//! Kernels write contiguous outputs and read inputs through [`Layout`]s (views may be
//! transposed, broadcast with stride 0, or reversed with negative strides). [`walk`]
//! visits the elements of `K` operands in row-major order of a shared shape, one inner
//! run at a time, after merging axes that are contiguous for every operand, so that the
//! innermost loop is long and vectorisable.

use std::borrow::Cow;

use crate::backend::Storage;
use crate::dtype::Element;
use crate::shape::Layout;

/// Calls `f(bases, len, strides)` for every inner run of a `shape` walked in row-major
/// order, where `bases[k]` is operand k's offset of the run's first element and
/// `strides[k]` its stride along the run.
pub(crate) fn walk<const K: usize>(
    shape: &[usize],
    strides: [&[isize]; K],
    offsets: [usize; K],
    mut f: impl FnMut([usize; K], usize, [isize; K]),
) {
    if shape.contains(&0) {
        return;
    }
    // Merge axes: drop size-1 axes, then fuse (i, i+1) when contiguous for every operand.
    let mut dims: Vec<(usize, [isize; K])> = Vec::with_capacity(shape.len());
    for (i, &d) in shape.iter().enumerate() {
        if d == 1 {
            continue;
        }
        let st: [isize; K] = std::array::from_fn(|k| strides[k][i]);
        if let Some(last) = dims.last_mut()
            && (0..K).all(|k| last.1[k] == st[k] * d as isize)
        {
            last.0 *= d;
            last.1 = st;
            continue;
        }
        dims.push((d, st));
    }
    if dims.is_empty() {
        f(offsets, 1, [1; K]);
        return;
    }
    let (inner, inner_st) = dims.pop().unwrap_or((1, [1; K]));
    let outer = dims;
    let mut idx = vec![0usize; outer.len()];
    let mut base: [isize; K] = std::array::from_fn(|k| offsets[k] as isize);
    loop {
        f(std::array::from_fn(|k| base[k] as usize), inner, inner_st);
        // Increment the outer multi-index.
        let mut ax = outer.len();
        loop {
            if ax == 0 {
                return;
            }
            ax -= 1;
            idx[ax] += 1;
            for k in 0..K {
                base[k] += outer[ax].1[k];
            }
            if idx[ax] < outer[ax].0 {
                break;
            }
            for k in 0..K {
                base[k] -= outer[ax].1[k] * outer[ax].0 as isize;
            }
            idx[ax] = 0;
        }
    }
}

/// Copies the elements of `layout` over `src` into `dst` in row-major order.
pub(crate) fn gather<T: Copy>(src: &[T], layout: &Layout, dst: &mut [T]) {
    let mut k = 0;
    walk(&layout.shape, [&layout.strides], [layout.offset], |[b], n, [s]| {
        if s == 1 {
            dst[k..k + n].copy_from_slice(&src[b..b + n]);
        } else {
            for i in 0..n {
                dst[k + i] = src[(b as isize + i as isize * s) as usize];
            }
        }
        k += n;
    });
}

/// The elements of a CPU storage in row-major order: borrowed when contiguous, gathered
/// otherwise.
pub(crate) fn contiguous<T: Element>(s: &Storage) -> Cow<'_, [T]> {
    let buf = s.cpu().expect("CPU kernel given a non-CPU storage").typed::<T>();
    let n = s.layout.numel();
    if s.layout.is_contiguous() {
        Cow::Borrowed(&buf[s.layout.offset..s.layout.offset + n])
    } else {
        let mut v = vec![T::zero(); n];
        gather(buf, &s.layout, &mut v);
        Cow::Owned(v)
    }
}

/// The typed buffer of a CPU storage (all of it; index it with the storage's layout).
pub(crate) fn buffer<T: Element>(s: &Storage) -> &[T] {
    s.cpu().expect("CPU kernel given a non-CPU storage").typed::<T>()
}

#[cfg(test)]
mod tests {
    use super::*;
    #[test]
    fn walk_visits_row_major() {
        let l = Layout::contiguous(&[2, 3]).permute(&[1, 0]);
        let src: Vec<i32> = (0..6).collect();
        let mut dst = vec![0; 6];
        gather(&src, &l, &mut dst);
        assert_eq!(dst, vec![0, 3, 1, 4, 2, 5]);
        let b = Layout::contiguous(&[3]).broadcast_to(&[2, 3]);
        let mut dst = vec![0; 6];
        gather(&src, &b, &mut dst);
        assert_eq!(dst, vec![0, 1, 2, 0, 1, 2]);
        let rev = Layout { shape: smallvec::smallvec![3], strides: smallvec::smallvec![-1], offset: 2 };
        let mut dst = vec![0; 3];
        gather(&src, &rev, &mut dst);
        assert_eq!(dst, vec![2, 1, 0]);
    }
}
