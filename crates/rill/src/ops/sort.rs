//! Sorting ops: sort, argsort and top-k along an axis.
//!
//! Each records one `Sort` node on the input's last axis; another axis is moved last with
//! a view first and back after. The order is stable and the same on every backend: equal
//! values keep their position order (in both directions), NaNs are equal to each other and
//! larger than `+inf` (last when ascending, first when descending, as in PyTorch), and
//! `-0.0` equals `0.0` (see `primitives/sort.rs`). Every dtype sorts, bool as 0/1.

use crate::array::Array;
use crate::error::Result;
use crate::ops::{on_device, target_stream};
use crate::primitives::{Primitive, SortSpec, sort as rule};
use crate::shape::checked_size;

impl Array {
    /// The values along `axis` in increasing order (decreasing when `descending`), stable.
    pub fn sort(&self, axis: isize, descending: bool) -> Result<Array> {
        sort(self, axis, SortSpec { descending, k: None, indices: false })
    }
    /// The positions (i64) that sort the values along `axis` (decreasing values when
    /// `descending`); equal values keep their position order.
    pub fn argsort(&self, axis: isize, descending: bool) -> Result<Array> {
        sort(self, axis, SortSpec { descending, k: None, indices: true })
    }
    /// The `k` largest values along `axis` in decreasing order and their positions (i64),
    /// ties taken by lower position; NaN counts as the largest value. `k` must not exceed
    /// the axis length.
    ///
    /// ```
    /// # use rill::Array;
    /// let x = Array::from_slice(&[1.0f32, 5.0, 3.0, 5.0], &[4])?;
    /// let (values, indices) = x.topk(2, -1)?;
    /// assert_eq!(values.to_vec::<f32>()?, [5.0, 5.0]);
    /// assert_eq!(indices.to_vec::<i64>()?, [1, 3]);
    /// # Ok::<(), rill::Error>(())
    /// ```
    pub fn topk(&self, k: usize, axis: isize) -> Result<(Array, Array)> {
        let values = sort(self, axis, SortSpec { descending: true, k: Some(k), indices: false })?;
        let indices = sort(self, axis, SortSpec { descending: true, k: Some(k), indices: true })?;
        Ok((values, indices))
    }
    /// The positions (i64) of the `k` largest values along `axis`, as [`Array::topk`]'s
    /// second result (one kernel instead of two when the values are not needed).
    pub fn topk_indices(&self, k: usize, axis: isize) -> Result<Array> {
        sort(self, axis, SortSpec { descending: true, k: Some(k), indices: true })
    }
}

fn sort(x: &Array, axis: isize, spec: SortSpec) -> Result<Array> {
    let name = spec.name();
    let ax = rule::sort_axis(name, x.shape(), axis)?;
    let stream = target_stream(&[x])?;
    let last = x.ndim() - 1;
    // The sorted axis last (a view), and the permutation that puts it back.
    let (input, back) = if ax == last {
        (on_device(x, &stream), None)
    } else {
        let mut perm: Vec<usize> = (0..x.ndim()).filter(|&a| a != ax).collect();
        perm.push(ax);
        let mut inv = vec![0; perm.len()];
        for (i, &p) in perm.iter().enumerate() {
            inv[p] = i;
        }
        (on_device(x, &stream).transpose(&perm)?, Some(inv))
    };
    let shape = rule::shape(&spec, input.shape())?;
    let dtype = if spec.indices { crate::DType::I64 } else { x.dtype() };
    checked_size(name, &shape, dtype)?;
    let out = Array::from_op(Primitive::Sort(spec), vec![input], shape, dtype, stream);
    match back {
        Some(inv) => out.transpose(&inv),
        None => Ok(out),
    }
}
