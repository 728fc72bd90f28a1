//! Shapes, strided layouts and the checks every op shares (sizes, broadcasting, axes).
//!
//! Sizes: every op checks each shape it records with [`checked_size`], so a node's element
//! count, its size in bytes and every stride of its layouts fit an `isize`; no kernel
//! computes a size that wrapped.

use smallvec::SmallVec;

use crate::dtype::DType;
use crate::error::{Error, Result};

/// Axes a [`Layout`] keeps inline before it allocates (ranks up to 5 cost no allocation:
/// a storage's layout is copied on every op of the hot path). Five, not more: a storage is
/// then 128 bytes, which the compiler moves with inline stores instead of a `memcpy` call
/// (a storage moves several times per node on the GPU's hot path).
pub const INLINE_DIMS: usize = 5;
/// A shape held inline up to [`INLINE_DIMS`] axes.
pub type Dims = SmallVec<[usize; INLINE_DIMS]>;
/// Strides held inline up to [`INLINE_DIMS`] axes.
pub type Strides = SmallVec<[isize; INLINE_DIMS]>;

/// Number of elements of a shape (1 for a scalar). The shape of an array always has a
/// count that fits (see [`checked_size`]).
pub fn numel(shape: &[usize]) -> usize {
    shape.iter().product()
}

/// The bytes `shape` spans with elements of `size` bytes, empty axes counted as 1 (as the
/// strides of its layout do); `None` past `isize::MAX`.
fn span_bytes(shape: &[usize], size: usize) -> Option<usize> {
    shape.iter().try_fold(size, |n, &d| n.checked_mul(d.max(1))).filter(|&n| n <= isize::MAX as usize)
}

/// Number of elements of `shape` holding `dtype`, or an `Error::Shape` naming `op` when
/// the elements would take more than `isize::MAX` bytes, the most one allocation can hold
/// (as in NumPy, empty axes count as 1 here, so every stride of the shape fits too).
pub fn checked_size(op: &'static str, shape: &[usize], dtype: DType) -> Result<usize> {
    match span_bytes(shape, dtype.size()) {
        Some(_) => Ok(numel(shape)),
        None => Err(Error::shape(
            op,
            format!("shape {shape:?} has too many elements: more than isize::MAX bytes of {dtype}"),
        )),
    }
}

/// Row-major (C order) element strides of a shape.
pub fn contiguous_strides(shape: &[usize]) -> Strides {
    let mut strides: Strides = smallvec::smallvec![0isize; shape.len()];
    let mut acc = 1isize;
    for i in (0..shape.len()).rev() {
        strides[i] = acc;
        acc *= shape[i].max(1) as isize;
    }
    strides
}

/// NumPy broadcasting of two shapes.
pub fn broadcast_shapes(op: &'static str, a: &[usize], b: &[usize]) -> Result<Vec<usize>> {
    let n = a.len().max(b.len());
    let mut out = vec![0; n];
    for i in 0..n {
        let da = if i + a.len() >= n { a[i + a.len() - n] } else { 1 };
        let db = if i + b.len() >= n { b[i + b.len() - n] } else { 1 };
        out[i] = if da == db || db == 1 {
            da
        } else if da == 1 {
            db
        } else {
            return Err(Error::shape(
                op,
                format!("shapes {a:?} and {b:?} cannot be broadcast together (axis {i}: {da} vs {db})"),
            ));
        };
    }
    // Each operand fits, their broadcast need not (the op checks its bytes).
    if span_bytes(&out, 1).is_none() {
        return Err(Error::shape(
            op,
            format!("shapes {a:?} and {b:?} broadcast to {out:?}, which has more than isize::MAX elements"),
        ));
    }
    Ok(out)
}

/// The broadcast of all `ins` (`[]` for none).
pub(crate) fn broadcast_all(name: &'static str, ins: &[&[usize]]) -> Result<Vec<usize>> {
    let mut s: Vec<usize> = Vec::new();
    for i in ins {
        s = broadcast_shapes(name, &s, i)?;
    }
    Ok(s)
}

/// Resolves a possibly negative axis against a rank.
pub fn normalize_axis(op: &'static str, axis: isize, ndim: usize) -> Result<usize> {
    let a = if axis < 0 { axis + ndim as isize } else { axis };
    if a < 0 || a >= ndim as isize {
        return Err(Error::Axis { op, axis, ndim });
    }
    Ok(a as usize)
}

/// Resolves a set of axes; rejects repeats. An empty `axes` with `all_if_empty` means all.
pub fn normalize_axes(op: &'static str, axes: &[isize], ndim: usize) -> Result<Vec<usize>> {
    let mut out = Vec::with_capacity(axes.len());
    for &a in axes {
        let n = normalize_axis(op, a, ndim)?;
        if out.contains(&n) {
            return Err(Error::invalid(op, format!("axis {a} is repeated in {axes:?}")));
        }
        out.push(n);
    }
    out.sort_unstable();
    Ok(out)
}

/// Where the elements of an evaluated array lie in its buffer: shape, element strides
/// (possibly zero for broadcast axes or negative for reversed slices) and offset.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Layout {
    /// The logical shape.
    pub shape: Dims,
    /// Element strides, one per axis.
    pub strides: Strides,
    /// Offset of element `[0, 0, ...]` in elements.
    pub offset: usize,
}

impl Layout {
    /// A row-major layout at offset 0.
    pub fn contiguous(shape: &[usize]) -> Self {
        Layout { shape: Dims::from_slice(shape), strides: contiguous_strides(shape), offset: 0 }
    }
    /// Number of elements.
    pub fn numel(&self) -> usize {
        numel(&self.shape)
    }
    /// True when the elements are the row-major range `offset..offset + numel`.
    pub fn is_contiguous(&self) -> bool {
        let mut acc = 1isize;
        for i in (0..self.shape.len()).rev() {
            if self.shape[i] != 1 && self.strides[i] != acc {
                return false;
            }
            acc *= self.shape[i] as isize;
        }
        true
    }
    /// The same elements seen with a broadcast shape (stride 0 on new or size-1 axes).
    pub fn broadcast_to(&self, shape: &[usize]) -> Layout {
        let n = shape.len();
        let k = self.shape.len();
        let mut strides: Strides = smallvec::smallvec![0isize; n];
        for i in 0..k {
            let j = n - k + i;
            strides[j] = if self.shape[i] == shape[j] { self.strides[i] } else { 0 };
        }
        Layout { shape: Dims::from_slice(shape), strides, offset: self.offset }
    }
    /// Permuted axes.
    pub fn permute(&self, perm: &[usize]) -> Layout {
        Layout {
            shape: perm.iter().map(|&p| self.shape[p]).collect(),
            strides: perm.iter().map(|&p| self.strides[p]).collect(),
            offset: self.offset,
        }
    }
    /// A reshape that keeps the buffer, when the strides allow it (no copy); `None` when
    /// a copy is needed.
    pub fn reshape(&self, shape: &[usize]) -> Option<Layout> {
        if self.is_contiguous() {
            return Some(Layout {
                shape: Dims::from_slice(shape),
                strides: contiguous_strides(shape),
                offset: self.offset,
            });
        }
        // Merge runs of the old shape into the new shape when each run is contiguous.
        let old: Vec<(usize, isize)> =
            self.shape.iter().copied().zip(self.strides.iter().copied()).filter(|&(d, _)| d != 1).collect();
        let new_nz: Vec<usize> = shape.iter().copied().filter(|&d| d != 1).collect();
        let mut new_strides_nz = Vec::with_capacity(new_nz.len());
        let (mut i, mut j) = (0, 0);
        while i < old.len() && j < new_nz.len() {
            let (mut osz, mut nsz) = (old[i].0, new_nz[j]);
            let (i0, j0) = (i, j);
            while osz != nsz {
                if osz < nsz {
                    i += 1;
                    osz *= old.get(i)?.0;
                } else {
                    j += 1;
                    nsz *= *new_nz.get(j)?;
                }
            }
            for k in i0..i {
                if old[k].1 != old[k + 1].1 * old[k + 1].0 as isize {
                    return None;
                }
            }
            let mut st = old[i].1;
            let mut tmp = vec![0isize; j - j0 + 1];
            for k in (j0..=j).rev() {
                tmp[k - j0] = st;
                st *= new_nz[k] as isize;
            }
            new_strides_nz.extend(tmp);
            i += 1;
            j += 1;
        }
        if i != old.len() || j != new_nz.len() {
            return None;
        }
        let mut strides = Strides::with_capacity(shape.len());
        let mut it = new_strides_nz.into_iter();
        for &d in shape {
            strides.push(if d == 1 { 0 } else { it.next()? });
        }
        Some(Layout { shape: Dims::from_slice(shape), strides, offset: self.offset })
    }
    /// Offset of the element at a multi-index.
    pub fn offset_of(&self, idx: &[usize]) -> usize {
        let mut o = self.offset as isize;
        for (i, &x) in idx.iter().enumerate() {
            o += x as isize * self.strides[i];
        }
        o as usize
    }
    /// Smallest and one-past-largest element offsets touched (for bounds reasoning).
    pub fn span(&self) -> (usize, usize) {
        if self.numel() == 0 {
            return (self.offset, self.offset);
        }
        let (mut lo, mut hi) = (self.offset as isize, self.offset as isize);
        for (d, s) in self.shape.iter().zip(&self.strides) {
            let ext = (*d as isize - 1) * s;
            if ext < 0 { lo += ext } else { hi += ext }
        }
        (lo as usize, hi as usize + 1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    #[test]
    fn broadcast_rules() {
        assert_eq!(broadcast_shapes("t", &[3, 1], &[4]).unwrap(), vec![3, 4]);
        assert_eq!(broadcast_shapes("t", &[], &[2, 2]).unwrap(), vec![2, 2]);
        assert_eq!(broadcast_shapes("t", &[0, 1], &[1, 5]).unwrap(), vec![0, 5]);
        let e = broadcast_shapes("add", &[3, 2], &[4, 2]).unwrap_err().to_string();
        assert!(e.contains("[3, 2]") && e.contains("[4, 2]"), "{e}");
        let e = broadcast_shapes("add", &[1 << 40], &[1 << 40, 1]).unwrap_err().to_string();
        assert!(e.contains("isize::MAX elements"), "{e}");
    }
    #[test]
    fn sizes_are_checked_in_bytes() {
        let max = isize::MAX as usize;
        assert_eq!(checked_size("t", &[2, 3], DType::F32).unwrap(), 6);
        assert_eq!(checked_size("t", &[max], DType::U8).unwrap(), max);
        assert!(checked_size("t", &[max / 4 + 1], DType::F32).is_err());
        assert!(checked_size("t", &[1 << 32, 1 << 32], DType::U8).is_err(), "the count wraps to 0");
        // Empty axes count as 1, as in NumPy and as strides do.
        assert_eq!(checked_size("t", &[0, 1 << 40], DType::F64).unwrap(), 0);
        assert!(checked_size("t", &[0, 1 << 40, 1 << 40], DType::U8).is_err());
        let e = checked_size("full", &[1 << 62], DType::F64).unwrap_err().to_string();
        assert!(e.contains("[full]") && e.contains("[4611686018427387904]") && e.contains("f64"), "{e}");
    }
    #[test]
    fn reshape_views() {
        let l = Layout::contiguous(&[2, 3, 4]).permute(&[1, 0, 2]);
        assert!(l.reshape(&[3, 8]).is_none());
        assert_eq!(l.reshape(&[3, 2, 2, 2]).unwrap().strides.as_slice(), [4, 12, 2, 1]);
        let t = Layout::contiguous(&[4, 6]).permute(&[1, 0]);
        assert!(t.reshape(&[24]).is_none());
        assert_eq!(t.reshape(&[6, 2, 2]).unwrap().strides.as_slice(), [1, 12, 6]);
    }
}
