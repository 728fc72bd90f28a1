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
    let mut dims = merged(shape, strides);
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

/// The axes of `shape` for `K` operands' strides with size-1 axes dropped and each pair
/// `(i, i + 1)` that is contiguous for every operand fused into one.
fn merged<const K: usize>(shape: &[usize], strides: [&[isize]; K]) -> Vec<(usize, [isize; K])> {
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
    dims
}

/// Side of the square tiles of [`gather`]'s transposing copy.
pub(crate) const TILE: usize = 32;

/// Copies the elements of `layout` over `src` into `dst` in row-major order.
pub(crate) fn gather<T: Copy + Send + Sync>(src: &[T], layout: &Layout, dst: &mut [T]) {
    if gather_transposed(src, layout, dst) {
        return;
    }
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

/// [`gather`] of a layout whose last axis is strided while an outer axis `p` has stride
/// ±1 (a transposed view). Walking the last axis would touch one cache line (and, with
/// long rows, one page) per element, and with a power-of-two row length every line of a
/// column falls in the same cache set. So the `(p, last)` plane is copied in square
/// tiles through a small buffer: each tile's reads run along `p` and its writes along
/// the last axis, whole lines both. A plain 2-d transpose splits its rows across the
/// worker pool. False, with nothing copied, for other layouts.
fn gather_transposed<T: Copy + Send + Sync>(src: &[T], layout: &Layout, dst: &mut [T]) -> bool {
    if layout.shape.contains(&0) {
        return false;
    }
    let dims = merged(&layout.shape, [&layout.strides]);
    let k = dims.len();
    if k < 2 || dims[k - 1].1[0].abs() == 1 || dims[k - 1].0 < TILE {
        return false;
    }
    let Some(p) = (0..k - 1).rev().find(|&i| dims[i].1[0].abs() == 1 && dims[i].0 >= TILE) else {
        return false;
    };
    let mut ost = vec![0usize; k];
    let mut size = 1;
    for i in (0..k).rev() {
        ost[i] = size;
        size *= dims[i].0;
    }
    let ((rl, [rs]), (cl, [cs])) = (dims[p], dims[k - 1]);
    let plane = Plane { rs, cl, cs, row: ost[p] };
    let others: Vec<usize> = (0..k - 1).filter(|&i| i != p).collect();
    if others.is_empty() && p == 0 {
        // The output is the plane, row after row: a piece of TILE rows per task.
        let sb = layout.offset as isize;
        crate::backend::cpu::par::chunks(dst, TILE * cl, |i, piece| {
            let r0 = i * TILE;
            plane.copy(src, sb, r0..r0 + piece.len() / cl, piece, r0 * cl);
        });
        return true;
    }
    let mut idx = vec![0usize; others.len()];
    loop {
        let mut sb = layout.offset as isize;
        let mut ob = 0;
        for (j, &ax) in others.iter().enumerate() {
            sb += idx[j] as isize * dims[ax].1[0];
            ob += idx[j] * ost[ax];
        }
        plane.copy(src, sb, 0..rl, &mut dst[ob..], 0);
        let mut j = others.len();
        loop {
            if j == 0 {
                return true;
            }
            j -= 1;
            idx[j] += 1;
            if idx[j] < dims[others[j]].0 {
                break;
            }
            idx[j] = 0;
        }
    }
}

/// One plane of [`gather_transposed`]: rows along the input stride `rs` (±1), `cl`
/// columns along `cs`, output rows `row` apart.
struct Plane {
    rs: isize,
    cl: usize,
    cs: isize,
    row: usize,
}

impl Plane {
    /// Copies rows `rows` of the plane whose first element is `src[sb]` into `dst`, where
    /// output row `r` starts at `dst[r * row - base]`.
    fn copy<T: Copy>(&self, src: &[T], sb: isize, rows: std::ops::Range<usize>, dst: &mut [T], base: usize) {
        let Some(&first) = src.first() else { return };
        let mut tile = [first; TILE * TILE];
        for r0 in rows.clone().step_by(TILE) {
            let h = TILE.min(rows.end - r0);
            for c0 in (0..self.cl).step_by(TILE) {
                let w = TILE.min(self.cl - c0);
                for c in 0..w {
                    let s = sb + (c0 + c) as isize * self.cs + r0 as isize * self.rs;
                    for r in 0..h {
                        tile[r * TILE + c] = src[(s + r as isize * self.rs) as usize];
                    }
                }
                for r in 0..h {
                    let o = (r0 + r) * self.row + c0 - base;
                    dst[o..o + w].copy_from_slice(&tile[r * TILE..r * TILE + w]);
                }
            }
        }
    }
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

    /// The tiled copy of permuted, reversed and sliced views against an element-by-element
    /// walk, on shapes whose sides are not multiples of the tile.
    #[test]
    fn transposed_gathers_match_the_walk() {
        let shapes: [&[usize]; 4] = [&[45, 70], &[3, 33, 40], &[2, 35, 3, 37], &[64, 1, 96]];
        let mut tiled_cases = 0;
        for shape in shapes {
            let n: usize = shape.iter().product();
            let src: Vec<u32> = (0..2 * n as u32 + 5).collect();
            let base = Layout::contiguous(shape);
            let r = shape.len();
            let perms: Vec<Vec<usize>> = match r {
                2 => vec![vec![1, 0]],
                3 => vec![vec![0, 2, 1], vec![2, 1, 0], vec![1, 2, 0], vec![2, 0, 1]],
                _ => vec![vec![0, 2, 3, 1], vec![3, 2, 1, 0], vec![1, 3, 0, 2]],
            };
            for perm in perms {
                let mut views = vec![base.permute(&perm)];
                // Reversed along the new last axis, and offset by 5.
                let mut rev = base.permute(&perm);
                let last = rev.shape.len() - 1;
                rev.offset = ((rev.shape[last] - 1) as isize * rev.strides[last]) as usize + 5;
                rev.strides[last] = -rev.strides[last];
                views.push(rev);
                for l in views {
                    let mut want = vec![0u32; n];
                    let mut k = 0;
                    walk(&l.shape, [&l.strides], [l.offset], |[b], len, [s]| {
                        for i in 0..len {
                            want[k + i] = src[(b as isize + i as isize * s) as usize];
                        }
                        k += len;
                    });
                    let mut got = vec![0u32; n];
                    tiled_cases += gather_transposed(&src, &l, &mut got) as usize;
                    gather(&src, &l, &mut got);
                    assert_eq!(got, want, "shape {shape:?} perm {perm:?} layout {l:?}");
                }
            }
        }
        assert!(tiled_cases >= 10, "the tiled copy ran in {tiled_cases} cases");
    }
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
