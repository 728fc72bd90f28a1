//! Reductions over axes, arg-reductions and cumulative sums.
//!
//! `reduce` brings every case to a block form `[outer, red, inner]` over a contiguous run
//! of elements, where `red` is reduced:
//! - `inner == 1` (the reduced axes are the trailing ones): each output is one row
//!   reduced with multi-accumulator loops; outputs are split across the pool, and a
//!   single huge row is split into blocks whose partial results are combined;
//! - `inner > 1` (a leading or middle block is reduced): rows of `inner` elements are
//!   folded into an accumulator vector, which vectorises across `inner`;
//! - anything else (non-contiguous inputs, several separated reduced blocks) is gathered
//!   into a contiguous copy ordered with the reduced axes last, then reduced as rows.
//!
//! Accumulation happens in [`acc::Reducible::A`] (f32 for f16/bf16).

pub(crate) mod acc;
mod scan;

use crate::backend::cpu::{CpuBuffer, PAR_CHUNK, par, strided};
use crate::backend::{Buffer, Storage};
use crate::dtype::{DType, Element};
use crate::error::Result;
use crate::primitives::ReduceOp;
use crate::shape::numel;

use acc::{Combine, MaxOp, MinOp, ProdOp, Reducible, SumOp, accumulate_rows, reduce_row};

pub(crate) use scan::{arg_reduce, cumsum};

/// Reduces `x` over `axes` (sorted, unique) into a new contiguous storage of `shape`
/// (the input shape with the reduced axes set to 1) and `dtype` (the input's dtype).
pub(crate) fn reduce(op: ReduceOp, x: &Storage, axes: &[usize], shape: &[usize], dtype: DType) -> Result<Storage> {
    if op == ReduceOp::Mean {
        return mean(x, axes, shape, dtype);
    }
    if dtype == DType::F16 {
        // The f32 reduction of the values widened a slice at a time (they widen exactly,
        // and f16 accumulates in f32 anyway), rounded once: the same bits, with the
        // conversions vectorised (bf16's widening is a shift, vectorised in place).
        let xw = super::elementwise::cast(x, DType::F32)?;
        return super::elementwise::cast(&reduce(op, &xw, axes, shape, DType::F32)?, dtype);
    }
    crate::with_dtype!(dtype, T => match op {
        ReduceOp::Sum => run::<T, SumOp>(x, axes, shape, dtype),
        ReduceOp::Prod => run::<T, ProdOp>(x, axes, shape, dtype),
        ReduceOp::Max => run::<T, MaxOp>(x, axes, shape, dtype),
        ReduceOp::Min => run::<T, MinOp>(x, axes, shape, dtype),
        ReduceOp::Mean => unreachable!("handled above"),
    })
}

/// `Mean` of a float `x`: the sum in the type the mean computes in (f32 for f16/bf16,
/// their values widened exactly first), divided by the count, rounded to `dtype` once.
fn mean(x: &Storage, axes: &[usize], shape: &[usize], dtype: DType) -> Result<Storage> {
    let wide = match dtype {
        DType::F16 | DType::BF16 => DType::F32,
        DType::F32 | DType::F64 => dtype,
        d => return Err(crate::error::Error::invalid("mean", format!("a mean of {d} (floats only)"))),
    };
    let xw = if x.dtype == wide { x.clone() } else { super::elementwise::cast(x, wide)? };
    let sum = reduce(ReduceOp::Sum, &xw, axes, shape, wide)?;
    let n = crate::primitives::reduce::count("mean", &x.layout.shape, axes)?;
    finish_mean(&sum, n, dtype)
}

/// `sum / n` (a contiguous f32 or f64 sum) rounded to `dtype`: the end of a `Mean`.
pub(crate) fn finish_mean(sum: &Storage, n: usize, dtype: DType) -> Result<Storage> {
    fn scale<T: Element + std::ops::Div<Output = T>>(sum: &Storage, n: T) -> Result<Storage> {
        let (len, off) = (sum.layout.numel(), sum.layout.offset);
        let mut buf = CpuBuffer::alloc(sum.dtype, len)?;
        let src = &strided::buffer::<T>(sum)[off..off + len];
        for (o, &a) in buf.typed_mut::<T>().iter_mut().zip(src) {
            *o = a / n;
        }
        Ok(Storage::contiguous(Buffer::Cpu(buf), sum.dtype, &sum.layout.shape))
    }
    let scaled = if sum.dtype == DType::F64 { scale::<f64>(sum, n as f64)? } else { scale::<f32>(sum, n as f32)? };
    if scaled.dtype == dtype { Ok(scaled) } else { super::elementwise::cast(&scaled, dtype) }
}

/// The `[outer, red, inner]` form of a contiguous input, when the reduced axes form one
/// block after dropping size-1 axes.
pub(crate) fn block_form(in_shape: &[usize], axes: &[usize]) -> Option<(usize, usize, usize)> {
    let mut blocks: Vec<(bool, usize)> = Vec::new();
    for (i, &d) in in_shape.iter().enumerate() {
        if d == 1 {
            continue;
        }
        let r = axes.contains(&i);
        match blocks.last_mut() {
            Some((lr, n)) if *lr == r => *n *= d,
            _ => blocks.push((r, d)),
        }
    }
    match blocks.as_slice() {
        [] => Some((1, 1, 1)),
        [(false, k)] => Some((*k, 1, 1)),
        [(true, r)] => Some((1, *r, 1)),
        [(false, k), (true, r)] => Some((*k, *r, 1)),
        [(true, r), (false, k)] => Some((1, *r, *k)),
        [(false, k1), (true, r), (false, k2)] => Some((*k1, *r, *k2)),
        _ => None,
    }
}

fn run<T: Reducible, C: Combine<T::A>>(x: &Storage, axes: &[usize], shape: &[usize], dtype: DType) -> Result<Storage> {
    let n_out = numel(shape);
    let mut buf = CpuBuffer::alloc(dtype, n_out)?;
    let out = buf.typed_mut::<T>();
    let n_in = x.layout.numel();
    if n_out > 0 && n_in == 0 {
        out.fill(T::down(C::init()));
    } else if n_out > 0 {
        let src = strided::buffer::<T>(x);
        let l = &x.layout;
        match block_form(&l.shape, axes) {
            Some((outer, red, inner)) if l.is_contiguous() => {
                blocks::<T, C, [T]>(&src[l.offset..l.offset + n_in], outer, red, inner, out);
            }
            _ => {
                // Kept axes first, reduced axes last, gathered row-major.
                let mut perm: Vec<usize> = (0..l.shape.len()).filter(|i| !axes.contains(i)).collect();
                perm.extend_from_slice(axes);
                let mut tmp = vec![T::zero(); n_in];
                strided::gather(src, &l.permute(&perm), &mut tmp);
                blocks::<T, C, [T]>(&tmp, n_out, n_in / n_out, 1, out);
            }
        }
    }
    Ok(Storage::contiguous(Buffer::Cpu(buf), dtype, shape))
}

/// Where [`blocks`] reads its row-major input: a slice, or a generator that computes
/// any range of it on demand (a fused elementwise program feeding the reduction, whose
/// values are then never stored whole).
pub(crate) trait Source<T>: Sync {
    /// Calls `f` with elements `[start, start + len)` of the input.
    fn with<R>(&self, start: usize, len: usize, f: impl FnOnce(&[T]) -> R) -> R;
}

impl<T: Sync> Source<T> for [T] {
    #[inline]
    fn with<R>(&self, start: usize, len: usize, f: impl FnOnce(&[T]) -> R) -> R {
        f(&self[start..start + len])
    }
}

/// A [`Source`] computed by `fill(start, buf)`, which writes elements
/// `[start, start + buf.len())` into `buf`.
pub(crate) struct Generated<F>(pub F);

impl<T: Element, F: Fn(usize, &mut [T]) + Sync> Source<T> for Generated<F> {
    fn with<R>(&self, start: usize, len: usize, f: impl FnOnce(&[T]) -> R) -> R {
        let mut buf = vec![T::zero(); len];
        (self.0)(start, &mut buf);
        f(&buf)
    }
}

/// Reduces the contiguous `[outer, red, inner]` input `src` (`total` elements) over its
/// middle axis into `out` (`outer * inner` elements) with `op`.
pub(crate) fn reduce_blocks<T: Reducible, S: Source<T> + ?Sized>(
    op: ReduceOp,
    src: &S,
    (outer, red, inner): (usize, usize, usize),
    out: &mut [T],
) {
    match op {
        ReduceOp::Sum => blocks::<T, SumOp, S>(src, outer, red, inner, out),
        ReduceOp::Prod => blocks::<T, ProdOp, S>(src, outer, red, inner, out),
        ReduceOp::Max => blocks::<T, MaxOp, S>(src, outer, red, inner, out),
        ReduceOp::Min => blocks::<T, MinOp, S>(src, outer, red, inner, out),
        // The caller sums into the mean's computing type and finishes (`finish_mean`).
        ReduceOp::Mean => blocks::<T, SumOp, S>(src, outer, red, inner, out),
    }
}

/// Reduces a contiguous `[outer, red, inner]` block over its middle axis into `out`
/// (`outer * inner` elements). `red` is at least 1. The input is read in pieces of about
/// [`PAR_CHUNK`] elements (whole rows when `inner == 1`), and the order in which values are
/// combined depends only on the shape, so a slice and a generator of the same values
/// give the same bits.
fn blocks<T: Reducible, C: Combine<T::A>, S: Source<T> + ?Sized>(
    src: &S,
    outer: usize,
    red: usize,
    inner: usize,
    out: &mut [T],
) {
    let total = outer * red * inner;
    if inner == 1 {
        if outer == 1 && total >= 2 * PAR_CHUNK {
            // One long row: partial results of blocks, combined in order.
            let parts: Vec<T::A> = par::map(total.div_ceil(PAR_CHUNK), |c| {
                let s = c * PAR_CHUNK;
                src.with(s, PAR_CHUNK.min(total - s), reduce_row::<T, C>)
            });
            out[0] = T::down(parts.into_iter().fold(C::init(), C::f));
            return;
        }
        let rows_per = if total >= 2 * PAR_CHUNK { PAR_CHUNK.div_ceil(red).max(1) } else { outer };
        par::chunks(out, rows_per, |c, o| {
            src.with(c * rows_per * red, o.len() * red, |xs| {
                for (o, row) in o.iter_mut().zip(xs.chunks_exact(red)) {
                    *o = T::down(reduce_row::<T, C>(row));
                }
            })
        });
        return;
    }
    let slab = red * inner;
    // Rows of a slab are folded in order, in pieces of about PAR_CHUNK elements.
    let rows_per_piece = PAR_CHUNK.div_ceil(inner).max(1);
    let fold_rows = |start: usize, rows: usize, acc: &mut [T::A]| {
        let mut r = 0;
        while r < rows {
            let n = rows_per_piece.min(rows - r);
            src.with(start + r * inner, n * inner, |xs| accumulate_rows::<T, C>(xs, acc));
            r += n;
        }
    };
    let fold_slab = |k: usize, o: &mut [T]| {
        let mut acc = vec![C::init(); inner];
        fold_rows(k * slab, red, &mut acc);
        for (o, a) in o.iter_mut().zip(acc) {
            *o = T::down(a);
        }
    };
    if total < 2 * PAR_CHUNK {
        for (k, o) in out.chunks_exact_mut(inner).enumerate() {
            fold_slab(k, o);
        }
    } else if outer >= 2 * crate::runtime::pool::num_threads() || inner >= PAR_CHUNK {
        // Enough independent slabs (or wide rows): one task per group of slabs.
        let per = PAR_CHUNK.div_ceil(slab).max(1);
        par::chunks(out, per * inner, |c, o| {
            for (k, o) in o.chunks_exact_mut(inner).enumerate() {
                fold_slab(c * per + k, o);
            }
        });
    } else {
        // Few slabs with a long reduced axis: split the reduced axis into pieces reduced in
        // parallel, then combine the partials in order (a parallel `reduce` would combine
        // them in an order that depends on work stealing, and float sums would vary).
        for (k, o) in out.chunks_exact_mut(inner).enumerate() {
            let parts: Vec<Vec<T::A>> = par::map(red.div_ceil(rows_per_piece), |p| {
                let mut acc = vec![C::init(); inner];
                let r0 = p * rows_per_piece;
                fold_rows(k * slab + r0 * inner, rows_per_piece.min(red - r0), &mut acc);
                acc
            });
            let mut acc = vec![C::init(); inner];
            for part in parts {
                for (a, b) in acc.iter_mut().zip(part) {
                    *a = C::f(*a, b);
                }
            }
            for (o, a) in o.iter_mut().zip(acc) {
                *o = T::down(a);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::shape::Layout;

    fn storage_f64(vals: &[f64], layout: Layout) -> Storage {
        let buf = CpuBuffer::from_slice(vals).unwrap();
        Storage::from_arc(std::sync::Arc::new(Buffer::Cpu(buf)), DType::F64, layout)
    }

    /// Reference reduction by multi-index walk.
    fn reference(vals: &[f64], l: &Layout, axes: &[usize], f: fn(f64, f64) -> f64, init: f64) -> Vec<f64> {
        let out_shape: Vec<usize> =
            l.shape.iter().enumerate().map(|(i, &d)| if axes.contains(&i) { 1 } else { d }).collect();
        let mut out = vec![init; numel(&out_shape)];
        let n = l.numel();
        for flat in 0..n {
            let mut idx = vec![0; l.shape.len()];
            let mut r = flat;
            for i in (0..l.shape.len()).rev() {
                idx[i] = r % l.shape[i];
                r /= l.shape[i];
            }
            let mut o = 0;
            for i in 0..l.shape.len() {
                o = o * out_shape[i] + if axes.contains(&i) { 0 } else { idx[i] };
            }
            out[o] = f(out[o], vals[l.offset_of(&idx)]);
        }
        out
    }

    #[test]
    fn permuted_and_broadcast_inputs() {
        let vals: Vec<f64> = (0..120).map(|i| ((i * 37) % 101) as f64 - 50.0).collect();
        let layouts = [
            Layout::contiguous(&[2, 3, 4, 5]).permute(&[2, 0, 3, 1]),
            Layout::contiguous(&[4, 30]).permute(&[1, 0]),
            Layout::contiguous(&[5]).broadcast_to(&[3, 4, 5]),
            Layout { shape: smallvec::smallvec![6, 5], strides: smallvec::smallvec![-20, 2], offset: 100 },
        ];
        for l in layouts {
            let s = storage_f64(&vals, l.clone());
            let nd = l.shape.len();
            let mut sets: Vec<Vec<usize>> = (0..nd).map(|a| vec![a]).collect();
            sets.push((0..nd).collect());
            sets.push(vec![0, nd - 1]);
            for axes in sets {
                let shape: Vec<usize> =
                    l.shape.iter().enumerate().map(|(i, &d)| if axes.contains(&i) { 1 } else { d }).collect();
                for (op, f, init) in [
                    (ReduceOp::Sum, (|a, b| a + b) as fn(f64, f64) -> f64, 0.0),
                    (ReduceOp::Max, f64::max, f64::NEG_INFINITY),
                    (ReduceOp::Min, f64::min, f64::INFINITY),
                ] {
                    let got = reduce(op, &s, &axes, &shape, DType::F64).unwrap();
                    let got = crate::backend::cpu::to_f64_vec(&got);
                    assert_eq!(got, reference(&vals, &l, &axes, f, init), "{l:?} {axes:?} {op:?}");
                }
            }
        }
    }

    #[test]
    fn block_forms() {
        assert_eq!(block_form(&[2, 3, 4], &[2]), Some((6, 4, 1)));
        assert_eq!(block_form(&[2, 3, 4], &[0]), Some((1, 2, 12)));
        assert_eq!(block_form(&[2, 3, 4], &[1]), Some((2, 3, 4)));
        assert_eq!(block_form(&[2, 1, 3, 4], &[0, 2]), Some((1, 6, 4)));
        assert_eq!(block_form(&[2, 3, 4], &[0, 2]), None);
    }

    #[test]
    fn large_blocks_match_small_paths() {
        // Exercise the parallel paths: one long row, few slabs with a long reduced axis.
        let n = 3 * PAR_CHUNK + 7;
        let vals: Vec<f64> = (0..n).map(|i| (i % 13) as f64).collect();
        let want: f64 = vals.iter().sum();
        let s = storage_f64(&vals, Layout::contiguous(&[n]));
        let got = reduce(ReduceOp::Sum, &s, &[0], &[1], DType::F64).unwrap();
        assert_eq!(crate::backend::cpu::to_f64_vec(&got), vec![want]);
        let rows = n / 7;
        let s = storage_f64(&vals[..rows * 7], Layout::contiguous(&[rows, 7]));
        let got = crate::backend::cpu::to_f64_vec(&reduce(ReduceOp::Max, &s, &[0], &[1, 7], DType::F64).unwrap());
        let mut want = vec![f64::NEG_INFINITY; 7];
        for r in 0..rows {
            for c in 0..7 {
                want[c] = want[c].max(vals[r * 7 + c]);
            }
        }
        assert_eq!(got, want);
    }
}
