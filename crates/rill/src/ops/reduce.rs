//! Reductions: sum, prod, max, min, mean, var, logsumexp, argmax/argmin and cumsum.
//!
//! Axes: every reduction takes a set of axes (negative axes count from the end); an
//! **empty set means all axes**. Out-of-range or repeated axes are errors naming the axis
//! and the rank. With `keepdims` the reduced axes stay with size 1, otherwise they are
//! removed (a reshape view of the kept-dims result).
//!
//! Dtypes (as JAX): `sum`, `prod` and `cumsum` of bool give i32 and of u8 give u32; other
//! integers keep their dtype (with wrapping overflow) and floats keep theirs (f16 and bf16
//! accumulate in f32). `max`/`min` keep the dtype. `mean`, `var` and `logsumexp` of bool
//! and integers give f32; f16 and bf16 compute in f32 and round the result back.
//!
//! Empty reductions: `sum` gives 0, `prod` 1, `mean` and `var` NaN, `logsumexp` -inf;
//! `max`, `min`, `argmax` and `argmin` are errors (they have no identity), as in NumPy.
//!
//! The counts `mean` and `var` divide by and the reshapes that remove reduced axes are
//! computed from shapes: during a shapeless trace they are noted (`compile::rules`) so a
//! replay on other shapes recomputes them.

use crate::array::Array;
use crate::compile::rules::{self, Note};
use crate::dtype::{DType, Scalar};
use crate::error::{Error, Result};
use crate::ops::elementwise::where_;
use crate::ops::{on_device, prepare, scalar_on, target_stream};
use crate::primitives::reduce::{self as rule, float_dtypes, sum_dtype};
use crate::primitives::{ArgReduceOp, Primitive, ReduceOp, movement};
use crate::runtime::stream::Stream;
use crate::shape::{checked_size, normalize_axes};

/// Resolves the axes of a reduction (empty = all).
fn resolve_axes(op: &'static str, x: &Array, axes: &[isize]) -> Result<Vec<usize>> {
    let nd = x.ndim();
    if axes.is_empty() {
        return Ok((0..nd).collect());
    }
    normalize_axes(op, axes, nd).map_err(|e| match e {
        Error::InvalidArgument { op, msg } => Error::invalid(op, format!("{msg} (array of rank {nd})")),
        e => e,
    })
}

/// A reshape view of `x` to `shape` (same number of elements).
pub(crate) fn reshape_node(x: Array, shape: Vec<usize>, stream: &Stream) -> Array {
    if x.shape() == shape.as_slice() {
        return x;
    }
    let dtype = x.dtype();
    Array::from_op(Primitive::Reshape, vec![x], shape, dtype, stream.clone())
}

/// `r` (with `axes` of size 1) without those axes unless `keepdims` (a reshape view,
/// noted as removing them).
fn drop_reduced(r: Array, axes: &[usize], keepdims: bool, stream: &Stream) -> Result<Array> {
    if keepdims {
        return Ok(r);
    }
    let out = reshape_node(r.clone(), movement::squeeze(r.shape(), axes)?, stream);
    if out.id() != r.id() {
        rules::note(&out, Note::Squeeze(axes.to_vec()));
    }
    Ok(out)
}

/// Records `Reduce` of `x` converted to `dtype`, keeping the reduced axes with size 1.
fn reduce_kept(x: &Array, op: ReduceOp, axes: Vec<usize>, dtype: DType) -> Result<Array> {
    let kept = rule::reduce(op, x.shape(), &axes)?;
    // The converted input is the largest node recorded.
    checked_size(rule::name(op), x.shape(), dtype)?;
    let stream = target_stream(&[x])?;
    let input = prepare(x, dtype, &stream);
    Ok(Array::from_op(Primitive::Reduce { op, axes }, vec![input], kept, dtype, stream))
}

/// Records `Reduce` of `x` converted to `dtype`, then removes the reduced axes unless
/// `keepdims`.
fn reduce_node(x: &Array, op: ReduceOp, axes: Vec<usize>, keepdims: bool, dtype: DType) -> Result<Array> {
    let r = reduce_kept(x, op, axes.clone(), dtype)?;
    let stream = r.stream();
    drop_reduced(r, &axes, keepdims, &stream)
}

/// The number of elements `r` (a `Reduce` node) combines, less `ddof` (at least 0), as a
/// 0-d operand of `r`'s dtype. During a shapeless trace it is a node of its own noted as
/// that count, so a replay on other shapes recomputes it instead of dividing by the
/// traced count.
fn count_of(r: &Array, n: usize, ddof: usize) -> Array {
    let (value, dtype, stream) = (rule::count_fill(n, ddof), r.dtype(), r.stream());
    if !rules::tracing() {
        return scalar_on(Scalar::Float(value), dtype, &stream);
    }
    let c = Array::from_op(Primitive::Full { value }, vec![], vec![], dtype, stream);
    rules::note(&c, Note::Count { reduce: r.id(), ddof });
    c
}

impl Array {
    /// Sum over `axes` (empty = all axes). bool sums as i32 and u8 as u32; other dtypes
    /// keep theirs. The sum of no elements is 0.
    pub fn sum(&self, axes: &[isize], keepdims: bool) -> Result<Array> {
        let axes = resolve_axes("sum", self, axes)?;
        reduce_node(self, ReduceOp::Sum, axes, keepdims, sum_dtype(self.dtype()))
    }
    /// Sum of every element, as a 0-d array.
    pub fn sum_all(&self) -> Result<Array> {
        self.sum(&[], false)
    }
    /// Product over `axes` (empty = all axes), with the dtypes of [`Array::sum`]. The
    /// product of no elements is 1.
    pub fn prod(&self, axes: &[isize], keepdims: bool) -> Result<Array> {
        let axes = resolve_axes("prod", self, axes)?;
        reduce_node(self, ReduceOp::Prod, axes, keepdims, sum_dtype(self.dtype()))
    }
    /// Maximum over `axes` (empty = all axes); NaN propagates. Reducing over no elements
    /// is an error.
    pub fn max(&self, axes: &[isize], keepdims: bool) -> Result<Array> {
        self.extremum("max", ReduceOp::Max, axes, keepdims)
    }
    /// Minimum over `axes` (empty = all axes); NaN propagates. Reducing over no elements
    /// is an error.
    pub fn min(&self, axes: &[isize], keepdims: bool) -> Result<Array> {
        self.extremum("min", ReduceOp::Min, axes, keepdims)
    }
    fn extremum(&self, name: &'static str, op: ReduceOp, axes: &[isize], keepdims: bool) -> Result<Array> {
        // The rule rejects a maximum or minimum of no elements.
        let axes = resolve_axes(name, self, axes)?;
        reduce_node(self, op, axes, keepdims, self.dtype())
    }
    /// Arithmetic mean over `axes` (empty = all axes). Integers and bool give f32; the
    /// mean of no elements is NaN.
    pub fn mean(&self, axes: &[isize], keepdims: bool) -> Result<Array> {
        let axes = resolve_axes("mean", self, axes)?;
        // One node: the sum, the division by the count and the rounding to a half
        // happen in the reduction's store (integers are converted to f32 first).
        let (cd, od) = float_dtypes(self.dtype());
        checked_size("mean", self.shape(), cd)?;
        reduce_node(self, ReduceOp::Mean, axes, keepdims, od)
    }
    /// Variance over `axes` (empty = all axes): the mean squared deviation from the mean,
    /// divided by `count - ddof` instead of `count` (NumPy's `ddof`). Computed in two
    /// passes for accuracy; dtypes as [`Array::mean`]. When `count <= ddof` the result is
    /// inf or NaN, as in NumPy.
    pub fn var(&self, axes: &[isize], keepdims: bool, ddof: usize) -> Result<Array> {
        let axes = resolve_axes("var", self, axes)?;
        let (cd, od) = float_dtypes(self.dtype());
        let n = rule::count("var", self.shape(), &axes)?;
        checked_size("var", self.shape(), cd)?;
        let stream = target_stream(&[self])?;
        let x = prepare(self, cd, &stream);
        let r = reduce_kept(&x, ReduceOp::Sum, axes.clone(), cd)?;
        let m = r.div(count_of(&r, n, 0))?;
        let d = x.sub(&m)?.square()?;
        let r = reduce_kept(&d, ReduceOp::Sum, axes.clone(), cd)?;
        let s = drop_reduced(r.clone(), &axes, keepdims, &stream)?;
        s.div(count_of(&r, n, ddof))?.to_dtype(od)
    }
    /// `log(sum(exp(x)))` over `axes` (empty = all axes), computed stably by subtracting
    /// the maximum first. Rows of -inf give -inf, a +inf gives +inf, NaN propagates; an
    /// empty reduction gives -inf. Dtypes as [`Array::mean`].
    pub fn logsumexp(&self, axes: &[isize], keepdims: bool) -> Result<Array> {
        let axes = resolve_axes("logsumexp", self, axes)?;
        let (cd, od) = float_dtypes(self.dtype());
        checked_size("logsumexp", self.shape(), cd)?;
        let stream = target_stream(&[self])?;
        if rule::count("logsumexp", self.shape(), &axes)? == 0 {
            // No elements: -inf, in the shape of the sum it would have taken.
            let kept = rule::reduce(ReduceOp::Sum, self.shape(), &axes)?;
            let shape = if keepdims { kept } else { movement::squeeze(&kept, &axes)? };
            let fill = Array::from_op(Primitive::Full { value: f64::NEG_INFINITY }, vec![], shape, od, stream);
            // Chosen from the traced shapes and without inputs: a replay on shapes with
            // elements must trace them (a 0-d fill would otherwise replay as -inf).
            rules::note(&fill, Note::Opaque);
            return Ok(fill);
        }
        let x = prepare(self, cd, &stream);
        let m = reduce_node(&x, ReduceOp::Max, axes.clone(), true, cd)?;
        // An infinite maximum would give inf - inf = NaN: shift by 0 instead.
        let shift = where_(&m.abs()?.eq(f64::INFINITY)?, 0.0, &m)?;
        let e = x.sub(&shift)?.exp()?;
        let l = reduce_node(&e, ReduceOp::Sum, axes.clone(), true, cd)?.log()?.add(&shift)?;
        drop_reduced(l, &axes, keepdims, &stream)?.to_dtype(od)
    }
    /// Index (i64) of the first maximum along `axis`; a NaN counts as the maximum. The
    /// axis must not be empty.
    pub fn argmax(&self, axis: isize, keepdims: bool) -> Result<Array> {
        self.arg_reduce("argmax", ArgReduceOp::ArgMax, axis, keepdims)
    }
    /// Index (i64) of the first minimum along `axis`; a NaN counts as the minimum. The
    /// axis must not be empty.
    pub fn argmin(&self, axis: isize, keepdims: bool) -> Result<Array> {
        self.arg_reduce("argmin", ArgReduceOp::ArgMin, axis, keepdims)
    }
    fn arg_reduce(&self, name: &'static str, op: ArgReduceOp, axis: isize, keepdims: bool) -> Result<Array> {
        let (ax, kept) = rule::arg_reduce(name, self.shape(), axis)?;
        let stream = target_stream(&[self])?;
        let x = on_device(self, &stream);
        checked_size(name, &kept, DType::I64)?;
        let r = Array::from_op(Primitive::ArgReduce { op, axis: ax }, vec![x], kept, DType::I64, stream.clone());
        drop_reduced(r, &[ax], keepdims, &stream)
    }
    /// Inclusive cumulative sum along `axis`, front to back (dtypes as [`Array::sum`]).
    pub fn cumsum(&self, axis: isize) -> Result<Array> {
        self.cumsum_with(axis, false, false)
    }
    /// Cumulative sum along `axis`: from the end when `reverse`, and without the current
    /// element when `exclusive` (so the first output is 0). Dtypes as [`Array::sum`].
    pub fn cumsum_with(&self, axis: isize, reverse: bool, exclusive: bool) -> Result<Array> {
        let (ax, shape) = rule::cumsum(self.shape(), axis)?;
        let stream = target_stream(&[self])?;
        let dtype = sum_dtype(self.dtype());
        checked_size("cumsum", &shape, dtype)?;
        let x = prepare(self, dtype, &stream);
        let prim = Primitive::Cumsum { axis: ax, reverse, exclusive };
        Ok(Array::from_op(prim, vec![x], shape, dtype, stream))
    }
}
