//! Fused softmax, layer_norm and rms_norm over one axis.
//!
//! Each row is read once to compute its statistics (max and sum of exponentials, or the
//! shifted sums giving mean and variance) and once more to write the result. f16 and bf16
//! compute in f32. Rows are split across the worker pool when the input is large.
//! Softmax over an axis other than the last gathers the input with that axis last and
//! scatters the result back.

use half::{bf16, f16};

use crate::backend::cpu::reduce::acc::{Acc, Reducible};
use crate::backend::cpu::{CpuBuffer, PAR_CHUNK, par, strided};
use crate::backend::{Buffer, Storage};
use crate::dtype::{DType, Element};
use crate::error::{Error, Result};
use crate::shape::{Layout, numel};

/// Float arithmetic of the compute type (f32 or f64).
pub(crate) trait Real: Acc + std::ops::Sub<Output = Self> + std::ops::Div<Output = Self> {
    fn exp(self) -> Self;
    fn ln(self) -> Self;
    fn sqrt(self) -> Self;
    fn of(v: f64) -> Self;
    fn of_usize(v: usize) -> Self;
    fn as_f64(self) -> f64;
}
impl Real for f32 {
    #[inline(always)]
    fn exp(self) -> Self {
        crate::primitives::vexp::exp_f32(self)
    }
    fn ln(self) -> Self {
        f32::ln(self)
    }
    fn sqrt(self) -> Self {
        f32::sqrt(self)
    }
    fn of(v: f64) -> Self {
        v as f32
    }
    fn of_usize(v: usize) -> Self {
        v as f32
    }
    fn as_f64(self) -> f64 {
        self as f64
    }
}
impl Real for f64 {
    fn exp(self) -> Self {
        f64::exp(self)
    }
    fn ln(self) -> Self {
        f64::ln(self)
    }
    fn sqrt(self) -> Self {
        f64::sqrt(self)
    }
    fn of(v: f64) -> Self {
        v
    }
    fn of_usize(v: usize) -> Self {
        v as f64
    }
    fn as_f64(self) -> f64 {
        self
    }
}

/// A float storage type whose accumulator is [`Real`].
pub(crate) trait FloatElem: Reducible<A: Real> {}
impl FloatElem for f16 {}
impl FloatElem for bf16 {}
impl FloatElem for f32 {}
impl FloatElem for f64 {}

macro_rules! with_float {
    ($op:expr, $dtype:expr, $T:ident => $body:expr) => {
        match $dtype {
            DType::F16 => {
                type $T = f16;
                $body
            }
            DType::BF16 => {
                type $T = bf16;
                $body
            }
            DType::F32 => {
                type $T = f32;
                $body
            }
            DType::F64 => {
                type $T = f64;
                $body
            }
            d => Err(Error::Unsupported { op: $op, backend: "cpu", msg: format!("dtype {d} (floats only)") }),
        }
    };
}

/// Runs `f(in_row, out_row)` on every row of length `d` of `x`, in parallel when large.
fn par_row_map<T: Send + Sync, F: Fn(&[T], &mut [T]) + Sync>(x: &[T], out: &mut [T], d: usize, f: F) {
    if d == 0 {
        return;
    }
    let rows_per = if x.len() >= 2 * PAR_CHUNK { PAR_CHUNK.div_ceil(d).max(1) } else { x.len() / d };
    let chunk = (rows_per * d).max(d);
    par::zip(out, chunk, x, chunk, |os, xs| {
        for (xr, or) in xs.chunks_exact(d).zip(os.chunks_exact_mut(d)) {
            f(xr, or);
        }
    });
}

/// Independent lanes of the softmax row loops: the compiler vectorises across them (a
/// single running max or sum is a dependency chain it may not reorder).
const LANES: usize = 8;

#[inline(always)]
fn max_nan<A: Acc>(m: A, v: A) -> A {
    if v > m || v.is_nan() { v } else { m }
}

crate::backend::cpu::simd::multiversion! {
    /// [`softmax_row`] of f32, built for the CPU's widest vectors.
    fn softmax_row_f32(x: &[f32], out: &mut [f32], log: bool) {
        softmax_row(x, out, log)
    }
}

#[inline(always)]
fn softmax_row<T: FloatElem>(x: &[T], out: &mut [T], log: bool) {
    let (zero, lowest) = (<T::A as Acc>::ZERO, <T::A as Acc>::LOWEST);
    let split = x.len() - x.len() % LANES;
    let (body, tail) = x.split_at(split);
    // The maximum (NaN if any element is NaN), in lanes.
    let mut ml = [lowest; LANES];
    for c in body.chunks_exact(LANES) {
        for i in 0..LANES {
            ml[i] = max_nan(ml[i], c[i].up());
        }
    }
    let m = tail.iter().map(|v| v.up()).chain(ml).fold(lowest, max_nan);
    // The sum of exponentials, in lanes (writing them out when the output keeps them).
    let keep = !log && std::mem::size_of::<T>() == std::mem::size_of::<T::A>();
    let mut sl = [zero; LANES];
    let mut s = zero;
    if keep {
        let (obody, otail) = out.split_at_mut(split);
        for (oc, c) in obody.chunks_exact_mut(LANES).zip(body.chunks_exact(LANES)) {
            for i in 0..LANES {
                let e = (c[i].up() - m).exp();
                sl[i] = sl[i].add(e);
                oc[i] = T::down(e);
            }
        }
        for (o, &v) in otail.iter_mut().zip(tail) {
            let e = (v.up() - m).exp();
            s = s.add(e);
            *o = T::down(e);
        }
    } else {
        for c in body.chunks_exact(LANES) {
            for i in 0..LANES {
                sl[i] = sl[i].add((c[i].up() - m).exp());
            }
        }
        for &v in tail {
            s = s.add((v.up() - m).exp());
        }
    }
    let s = sl.into_iter().fold(s, |a, b| a.add(b));
    if log {
        let ls = s.ln();
        for (o, &v) in out.iter_mut().zip(x) {
            *o = T::down(v.up() - m - ls);
        }
    } else if keep {
        let inv = <T::A as Acc>::ONE / s;
        for o in out.iter_mut() {
            *o = T::down(o.up().mul(inv));
        }
    } else {
        // The output type would round the exponentials: recompute them from the input.
        let inv = <T::A as Acc>::ONE / s;
        for (o, &v) in out.iter_mut().zip(x) {
            *o = T::down((v.up() - m).exp().mul(inv));
        }
    }
}

/// Softmax (or log-softmax) over `axis`.
pub(crate) fn softmax(x: &Storage, axis: usize, log: bool) -> Result<Storage> {
    if matches!(x.dtype, DType::F16 | DType::BF16) {
        // f16 and bf16 compute in f32: widened a slice at a time (exactly), the f32 rows
        // run, and the result is rounded once, giving the same bits as widening each value.
        let y = softmax(&super::elementwise::cast(x, DType::F32)?, axis, log)?;
        return super::elementwise::cast(&y, x.dtype);
    }
    let shape = x.layout.shape.clone();
    let n = numel(&shape);
    let mut buf = CpuBuffer::alloc(x.dtype, n)?;
    let name = if log { "log_softmax" } else { "softmax" };
    with_float!(name, x.dtype, T => {
        let out = buf.typed_mut::<T>();
        let d = shape[axis];
        let nd = shape.len();
        if shape[axis + 1..].iter().all(|&s| s == 1) {
            let xs = strided::contiguous::<T>(x);
            row_softmax(&xs, out, d, log);
        } else {
            let mut perm: Vec<usize> = (0..nd).filter(|&i| i != axis).collect();
            perm.push(axis);
            let mut xs = vec![T::zero(); n];
            strided::gather(strided::buffer::<T>(x), &x.layout.permute(&perm), &mut xs);
            let mut tmp = vec![T::zero(); n];
            row_softmax(&xs, &mut tmp, d, log);
            // Back to `shape`: a gather of `tmp` (row-major over the permuted shape) through
            // the inverse permutation, so the transposing copy is the tiled one.
            let pshape: Vec<usize> = perm.iter().map(|&i| shape[i]).collect();
            let mut inv = vec![0; nd];
            for (j, &i) in perm.iter().enumerate() {
                inv[i] = j;
            }
            strided::gather(&tmp, &Layout::contiguous(&pshape).permute(&inv), out);
        }
        Ok(())
    })?;
    Ok(Storage::contiguous(Buffer::Cpu(buf), x.dtype, &shape))
}

/// [`softmax_row`] over every row of length `d`, the f32 rows built for the CPU's vectors.
fn row_softmax<T: FloatElem>(x: &[T], out: &mut [T], d: usize, log: bool) {
    if let (DType::F32, Some(xf), Some(of)) =
        (T::DTYPE, bytemuck::try_cast_slice::<T, f32>(x).ok(), bytemuck::try_cast_slice_mut::<T, f32>(out).ok())
    {
        return par_row_map(xf, of, d, |xr, or| softmax_row_f32(xr, or, log));
    }
    par_row_map(x, out, d, |xr, or| softmax_row(xr, or, log));
}

/// Interleaved partial sums per row statistic: the loop vectorises, and the rounding
/// error grows with the row length over `STAT_LANES` instead of with the row length.
const STAT_LANES: usize = 16;

/// The sums of `f(x)` (`K` statistics at once) over a row, in `STAT_LANES` interleaved
/// partial sums combined pairwise.
#[inline(always)]
fn lane_sums<T: FloatElem, const K: usize>(xr: &[T], f: impl Fn(T::A) -> [T::A; K]) -> [T::A; K] {
    // One array of lanes per statistic (not one array of statistics per lane), so that
    // each statistic's lanes are one vector.
    let mut acc = [[T::A::ZERO; STAT_LANES]; K];
    let mut chunks = xr.chunks_exact(STAT_LANES);
    for c in &mut chunks {
        for (l, &x) in c.iter().enumerate() {
            for (a, v) in acc.iter_mut().zip(f(x.up())) {
                a[l] = a[l].add(v);
            }
        }
    }
    for (l, &x) in chunks.remainder().iter().enumerate() {
        for (a, v) in acc.iter_mut().zip(f(x.up())) {
            a[l] = a[l].add(v);
        }
    }
    let mut w = STAT_LANES;
    while w > 1 {
        w /= 2;
        for a in acc.iter_mut() {
            for k in 0..w {
                a[k] = a[k].add(a[k + w]);
            }
        }
    }
    std::array::from_fn(|j| acc[j][0])
}

#[inline(always)]
fn moments<T: FloatElem>(xr: &[T]) -> (T::A, T::A) {
    let Some(x0) = xr.first().map(|v| v.up()) else { return (T::A::ZERO, T::A::ZERO) };
    let [s1, s2] = lane_sums(xr, |v| {
        let t = v - x0;
        [t, t.mul(t)]
    });
    let n = T::A::of_usize(xr.len());
    let m1 = s1 / n;
    let var = s2 / n - m1.mul(m1);
    (x0.add(m1), if var < T::A::ZERO { T::A::ZERO } else { var })
}

/// The optional per-column `weight`/`bias` inputs converted to the compute type.
fn column_input<T: FloatElem>(s: Option<&Storage>) -> Option<Vec<T::A>> {
    s.map(|s| strided::contiguous::<T>(s).iter().map(|v| v.up()).collect())
}

/// Layer normalisation over the last axis; inputs `x[, weight][, bias]`.
pub(crate) fn layer_norm(inputs: &[&Storage], eps: f64, has_weight: bool, has_bias: bool) -> Result<Storage> {
    norm(inputs, eps, has_weight, has_bias, false)
}

/// RMS normalisation over the last axis; inputs `x[, weight]`.
pub(crate) fn rms_norm(inputs: &[&Storage], eps: f64, has_weight: bool) -> Result<Storage> {
    norm(inputs, eps, has_weight, false, true)
}

fn norm(inputs: &[&Storage], eps: f64, has_weight: bool, has_bias: bool, rms: bool) -> Result<Storage> {
    let x = &inputs[0];
    if matches!(x.dtype, DType::F16 | DType::BF16) {
        // As softmax: the f32 norm of the widened values (and weights), rounded once.
        let wide = inputs.iter().map(|s| super::elementwise::cast(s, DType::F32)).collect::<Result<Vec<_>>>()?;
        let y = norm(&wide.iter().collect::<Vec<_>>(), eps, has_weight, has_bias, rms)?;
        return super::elementwise::cast(&y, x.dtype);
    }
    let shape = x.layout.shape.clone();
    let n = numel(&shape);
    let d = shape.last().copied().unwrap_or(1);
    let mut buf = CpuBuffer::alloc(x.dtype, n)?;
    let name = if rms { "rms_norm" } else { "layer_norm" };
    with_float!(name, x.dtype, T => {
        norm_typed::<T>(inputs, eps, has_weight, has_bias, rms, d, buf.typed_mut::<T>());
        Ok(())
    })?;
    Ok(Storage::contiguous(Buffer::Cpu(buf), x.dtype, &shape))
}

fn norm_typed<T: FloatElem>(
    inputs: &[&Storage],
    eps: f64,
    has_weight: bool,
    has_bias: bool,
    rms: bool,
    d: usize,
    out: &mut [T],
) {
    let (wi, bi) = (
        if has_weight { inputs.get(1).copied() } else { None },
        if has_bias { inputs.get(1 + has_weight as usize).copied() } else { None },
    );
    let (w, b) = (column_input::<T>(wi), column_input::<T>(bi));
    let eps = T::A::of(eps);
    let xs = strided::contiguous::<T>(inputs[0]);
    let (w, b) = (w.as_deref(), b.as_deref());
    if let (DType::F32, Ok(xf), Ok(of)) =
        (T::DTYPE, bytemuck::try_cast_slice::<T, f32>(&xs), bytemuck::try_cast_slice_mut::<T, f32>(out))
    {
        let (wf, bf) = (column_input::<f32>(wi), column_input::<f32>(bi));
        let (wf, bf, epsf) = (wf.as_deref(), bf.as_deref(), eps.as_f64() as f32);
        return par_row_map(xf, of, d, |xr, or| norm_row_f32(xr, or, wf, bf, rms, epsf));
    }
    par_row_map(&xs, out, d, |xr, or| norm_row(xr, or, w, b, rms, eps));
}

crate::backend::cpu::simd::multiversion! {
    /// [`norm_row`] of f32, built for the CPU's widest vectors.
    fn norm_row_f32(xr: &[f32], or: &mut [f32], w: Option<&[f32]>, b: Option<&[f32]>, rms: bool, eps: f32) {
        norm_row(xr, or, w, b, rms, eps)
    }
}

/// One row of a layer norm (or an RMS norm), with the optional weight and bias.
#[inline(always)]
fn norm_row<T: FloatElem>(xr: &[T], or: &mut [T], w: Option<&[T::A]>, b: Option<&[T::A]>, rms: bool, eps: T::A) {
    let d = xr.len();
    let (mean, scale) = if rms {
        let [ss] = lane_sums(xr, |v| [v.mul(v)]);
        let ms = ss / T::A::of_usize(d);
        (T::A::ZERO, T::A::ONE / ms.add(eps).sqrt())
    } else {
        let (mean, var) = moments(xr);
        (mean, T::A::ONE / var.add(eps).sqrt())
    };
    for (j, (o, &v)) in or.iter_mut().zip(xr).enumerate() {
        let mut y = (v.up() - mean).mul(scale);
        if let Some(w) = w {
            y = y.mul(w[j]);
        }
        if let Some(b) = b {
            y = y.add(b[j]);
        }
        *o = T::down(y);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::cpu::from_f64_slice;

    #[test]
    fn softmax_over_a_permuted_view() {
        let vals: Vec<f64> = (0..24).map(|i| ((i * 5) % 7) as f64 * 0.3).collect();
        let l = Layout::contiguous(&[2, 3, 4]).permute(&[2, 0, 1]); // shape [4, 2, 3]
        let s = from_f64_slice(&vals, DType::F64, &[2, 3, 4]).unwrap().with_layout(l.clone());
        for axis in 0..3 {
            let got = crate::backend::cpu::to_f64_vec(&softmax(&s, axis, false).unwrap());
            let sh = [4usize, 2, 3];
            for i in 0..4 {
                for j in 0..2 {
                    for k in 0..3 {
                        let idx = [i, j, k];
                        let mut denom = 0.0;
                        for t in 0..sh[axis] {
                            let mut id = idx;
                            id[axis] = t;
                            denom += vals[l.offset_of(&id)].exp();
                        }
                        let want = vals[l.offset_of(&idx)].exp() / denom;
                        assert!((got[i * 6 + j * 3 + k] - want).abs() < 1e-12);
                    }
                }
            }
        }
    }
}
