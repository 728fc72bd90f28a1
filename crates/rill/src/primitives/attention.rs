//! Shape rule of `Attention` (scaled dot-product attention, `ops/attention.rs`).
//!
//! `q [..., Hq, Tq, D]`, `k [..., Hkv, Tk, D]`, `v [..., Hkv, Tk, Dv]` with equal leading
//! (batch) axes and `Hq` a multiple of `Hkv` (grouped-query attention: query head `h`
//! reads key/value head `h / (Hq / Hkv)`), and an optional mask broadcastable to the
//! scores `[..., Hq, Tq, Tk]`. The output is `[..., Hq, Tq, Dv]`. Used by the op when it
//! records the node and by `compile/shapes.rs` when a shapeless replay re-derives it.

use crate::error::{Error, Result};

/// Most batch axes (before `H, T, D`) the kernels address.
pub(crate) const MAX_BATCH_DIMS: usize = 8;

/// How the scores of an `Attention` node are masked (the array of `Array` is the node's
/// fourth input).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum AttentionMaskKind {
    /// Every query attends every key.
    None,
    /// Query `i` attends keys `j <= i + Tk - Tq` (aligned at the bottom right).
    Causal,
    /// A bool (true: attend) or additive float mask, broadcast to `[..., Hq, Tq, Tk]`.
    Array,
}

/// Which part of `Attention`'s gradient an `AttentionGrad` node computes.
///
/// With `P = softmax(scale · q kᵀ)` (masked) and `dO` the output's cotangent: `Stats` is
/// `[..., Hq, Tq, 2]` (f32; f64 for f64 inputs) holding each query row's
/// `lse = ln Σⱼ exp(scale · q·kⱼ)` over the keys it attends (`+inf` for a row that attends
/// none, so its `P` row is 0) and `delta = dO·o`; `Dq` is `dq = scale · (P ∘ (dO vᵀ −
/// delta)) k` (q's shape); `Dkv` is `dk` and `dv = Pᵀ dO` stacked on a new first axis
/// (`[2, ...k's shape]`), each summed over the query heads that share a key/value head.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum AttentionGradPart {
    /// Each query row's log-sum-exp and `dO·o`.
    Stats,
    /// The cotangent of q.
    Dq,
    /// The cotangents of k and v, stacked.
    Dkv,
}

/// The output shape of an `AttentionGrad` node of `part` over its inputs' shapes (see
/// [`AttentionGradPart`]): q, k, v shaped as for attention with `D == Dv`, `o` and `dO`
/// of the output's shape, and `stats` of q's rows.
pub(crate) fn attention_grad(name: &'static str, part: AttentionGradPart, ins: &[&[usize]]) -> Result<Vec<usize>> {
    let [q, k, v, x, y] = ins else {
        return Err(Error::shape(name, format!("5 inputs, got {}", ins.len())));
    };
    let out = attention(name, q, k, v, None)?;
    if out != *q {
        return Err(Error::shape(name, format!("needs v's head dimension equal to q's: q {q:?}, v {v:?}")));
    }
    let stats: Vec<usize> = q[..q.len() - 1].iter().copied().chain([2]).collect();
    let (want_x, want_y) = match part {
        AttentionGradPart::Stats => (&out, &out),
        AttentionGradPart::Dq | AttentionGradPart::Dkv => (&out, &stats),
    };
    if x != want_x || y != want_y {
        return Err(Error::shape(
            name,
            format!("inputs 4 and 5 of {part:?} need shapes {want_x:?} and {want_y:?}, got {x:?} and {y:?}"),
        ));
    }
    Ok(match part {
        AttentionGradPart::Stats => stats,
        AttentionGradPart::Dq => q.to_vec(),
        AttentionGradPart::Dkv => [2].iter().chain(k.iter()).copied().collect(),
    })
}

/// The output shape of attention over `q`, `k`, `v` (and `mask`, when given); `name` is
/// the op's name in errors.
pub(crate) fn attention(
    name: &'static str,
    q: &[usize],
    k: &[usize],
    v: &[usize],
    mask: Option<&[usize]>,
) -> Result<Vec<usize>> {
    let r = q.len();
    if r < 3 || k.len() != r || v.len() != r {
        return Err(Error::shape(
            name,
            format!("q, k and v need the same rank of at least 3 ([..., H, T, D]), got q {q:?}, k {k:?}, v {v:?}"),
        ));
    }
    let nb = r - 3;
    if nb > MAX_BATCH_DIMS {
        return Err(Error::shape(name, format!("at most {MAX_BATCH_DIMS} batch axes, got q {q:?}")));
    }
    if q[..nb] != k[..nb] || q[..nb] != v[..nb] {
        return Err(Error::shape(name, format!("batch axes differ: q {q:?}, k {k:?}, v {v:?}")));
    }
    let (hq, tq, d) = (q[nb], q[nb + 1], q[nb + 2]);
    let (hkv, tk) = (k[nb], k[nb + 1]);
    if k[nb + 2] != d {
        return Err(Error::shape(name, format!("q's head dimension {d} differs from k's: q {q:?}, k {k:?}")));
    }
    if v[nb] != hkv || v[nb + 1] != tk {
        return Err(Error::shape(
            name,
            format!("k and v need the same heads and length ([..., Hkv, Tk, _]), got k {k:?}, v {v:?}"),
        ));
    }
    if (hkv == 0 && hq != 0) || (hkv != 0 && hq % hkv != 0) {
        return Err(Error::shape(
            name,
            format!("query heads {hq} are not a multiple of key/value heads {hkv}: q {q:?}, k {k:?}"),
        ));
    }
    let scores: Vec<usize> = q[..nb].iter().copied().chain([hq, tq, tk]).collect();
    if let Some(m) = mask {
        let fits = m.len() <= r && m.iter().rev().zip(scores.iter().rev()).all(|(&a, &b)| a == b || a == 1);
        if !fits {
            return Err(Error::shape(
                name,
                format!("mask of shape {m:?} does not broadcast to the scores' shape {scores:?} ([..., Hq, Tq, Tk])"),
            ));
        }
    }
    Ok(q[..nb].iter().copied().chain([hq, tq, v[nb + 2]]).collect())
}

// ---- gradient rules (see `grad.rs`) ----

use super::Primitive;
use super::grad::{Jvp, Vjp, no_rule};
use crate::array::Array;
use crate::ops::elementwise::where_;

/// Attention through its math, `softmax(q kᵀ · scale + mask) v` with ops (the `[Tq, Tk]`
/// scores stored), giving the kernels' answers: grouped heads, the bottom-right causal
/// mask, and 0 for a row that attends nothing. The transforms differentiate this, so it is
/// written with the ops whose rules are cheap: one `softmax` (its rule is two passes over
/// the scores), and the rows that attend nothing found from the mask alone where it can
/// (causal, bool) and set to 0 before the softmax (no NaN reaches a gradient) and after.
fn math(ins: &[Array], scale: Option<f64>, kind: AttentionMaskKind, out_dtype: crate::DType) -> Result<Array> {
    let (q, k, v) = (&ins[0], &ins[1], &ins[2]);
    let r = q.ndim();
    let (hq, tq, d) = (q.shape()[r - 3], q.shape()[r - 2], q.shape()[r - 1]);
    let (hkv, tk) = (k.shape()[r - 3], k.shape()[r - 2]);
    let mut out_shape = q.shape().to_vec();
    out_shape[r - 1] = v.shape()[r - 1];
    if tk == 0 || hq == 0 {
        return Array::zeros(&out_shape, out_dtype);
    }
    // Query head h reads key/value head h / (hq / hkv): repeat each kv head that often.
    let repeat = |a: &Array| -> Result<Array> {
        let group = hq / hkv;
        if group == 1 {
            return Ok(a.clone());
        }
        let mut wide = a.shape().to_vec();
        wide.insert(r - 2, group);
        let mut merged = a.shape().to_vec();
        merged[r - 3] = hq;
        let spec: Vec<isize> = merged.iter().map(|&x| x as isize).collect();
        a.expand_dims((r - 2) as isize)?.broadcast_to(&wide)?.reshape(&spec)
    };
    let (k, v) = (repeat(k)?, repeat(v)?);
    let scale = scale.unwrap_or(if d == 0 { 1.0 } else { 1.0 / (d as f64).sqrt() });
    let mut s = q.matmul(&k.swapaxes(-1, -2)?)?.mul(scale)?;
    // A bool that is true on the rows (`[.., Tq, 1]`) whose every score is masked.
    let mut empty: Option<Array> = None;
    match kind {
        AttentionMaskKind::None => {}
        AttentionMaskKind::Causal => {
            let i = Array::arange(0i64, tq as i64, 1i64, crate::DType::I64)?.reshape(&[tq as isize, 1])?;
            let j = Array::arange(0i64, tk as i64, 1i64, crate::DType::I64)?.reshape(&[1, tk as isize])?;
            let last = i.add(tk as i64 - tq as i64)?;
            s = where_(&j.le(&last)?, &s, f64::NEG_INFINITY)?;
            if tq > tk {
                empty = Some(last.lt(0i64)?);
            }
        }
        AttentionMaskKind::Array => {
            let m = &ins[3];
            if m.dtype() == crate::DType::Bool {
                s = where_(m, &s, f64::NEG_INFINITY)?;
                empty = Some(m.astype(crate::DType::F32)?.max(&[-1], true)?.eq(0.0)?);
            } else {
                s = s.add(m)?;
                let top = crate::autodiff::stop_gradient(&s.max(&[-1], true)?)?;
                empty = Some(top.eq(f64::NEG_INFINITY)?);
            }
        }
    }
    let p = match &empty {
        Some(e) => where_(e, 0.0, &where_(e, 0.0, &s)?.softmax(-1)?)?,
        None => s.softmax(-1)?,
    };
    let p = if p.dtype() == v.dtype() { p } else { p.astype(v.dtype())? };
    let o = p.matmul(&v)?;
    if o.dtype() == out_dtype { Ok(o) } else { o.astype(out_dtype) }
}

/// Whether `Attention`'s gradient takes the fused `AttentionGrad` nodes: f16 or bf16 (the
/// dtypes whose GPU kernels use tensor cores), `D == Dv` a multiple of 16 up to 128, no
/// mask or the causal one, and some keys and queries. Anything else is differentiated
/// through [`math`].
fn fused_grad_fits(ins: &[Array], mask: AttentionMaskKind) -> bool {
    let (q, k, v) = (&ins[0], &ins[1], &ins[2]);
    let r = q.ndim();
    let d = q.shape()[r - 1];
    matches!(q.dtype(), crate::DType::F16 | crate::DType::BF16)
        && k.dtype() == q.dtype()
        && v.dtype() == q.dtype()
        && mask != AttentionMaskKind::Array
        && v.shape()[r - 1] == d
        && d % 16 == 0
        && (16..=128).contains(&d)
        && q.shape()[r - 3] > 0
        && q.shape()[r - 2] > 0
        && k.shape()[r - 2] > 0
}

/// The cotangents of q, k and v through the fused nodes: one `Stats` node shared by `Dq`
/// and `Dkv`.
fn fused_grads(ins: &[Array], o: &Array, dout: &Array, scale: f64, causal: bool) -> Result<Vec<Option<Array>>> {
    let (q, k, v) = (&ins[0], &ins[1], &ins[2]);
    let dout = if dout.dtype() == q.dtype() { dout.clone() } else { dout.astype(q.dtype())? };
    let o = if o.dtype() == q.dtype() { o.clone() } else { o.astype(q.dtype())? };
    let node = |part: AttentionGradPart, x: &Array, y: &Array| -> Result<Array> {
        let shapes = [q.shape(), k.shape(), v.shape(), x.shape(), y.shape()];
        let shape = attention_grad("scaled_dot_product_attention_grad", part, &shapes)?;
        let dtype = match part {
            AttentionGradPart::Stats if q.dtype() == crate::DType::F64 => crate::DType::F64,
            AttentionGradPart::Stats => crate::DType::F32,
            _ => q.dtype(),
        };
        let p = Primitive::AttentionGrad { scale, causal, part };
        super::grad::record(p, vec![q.clone(), k.clone(), v.clone(), x.clone(), y.clone()], &shape, dtype)
    };
    let stats = node(AttentionGradPart::Stats, &o, &dout)?;
    let dq = node(AttentionGradPart::Dq, &dout, &stats)?;
    let dkv = node(AttentionGradPart::Dkv, &dout, &stats)?;
    Ok(vec![Some(dq), Some(dkv.index(0, 0)?), Some(dkv.index(0, 1)?)])
}

/// The cotangents of q, k and v through [`math`]: what the fused nodes compute, as ops
/// (the rules of `AttentionGrad` differentiate this).
fn math_grads(qkv: &[Array], dout: &Array, scale: f64, causal: bool) -> Result<Vec<Array>> {
    let kind = if causal { AttentionMaskKind::Causal } else { AttentionMaskKind::None };
    let dt = qkv[0].dtype();
    let f = move |ins: &[Array]| Ok(vec![math(ins, Some(scale), kind, dt)?]);
    let zero = |a: &Array| a.zeros_like();
    let cts = crate::autodiff::vjp_of(&f, qkv, dout)?;
    cts.into_iter().zip(qkv).map(|(c, a)| c.map_or_else(|| zero(a), Ok)).collect()
}

/// The scale an `Attention` node applies.
fn resolved_scale(scale: Option<f64>, q: &Array) -> f64 {
    let d = q.shape()[q.ndim() - 1];
    scale.unwrap_or(if d == 0 { 1.0 } else { 1.0 / (d as f64).sqrt() })
}

/// `Attention`: the fused `AttentionGrad` nodes where they apply ([`fused_grad_fits`]),
/// otherwise differentiated through [`math`] (recomputing the scores), for q, k, v and a
/// float mask (a bool mask has none). `AttentionGrad`: `Stats` feeds only the other two
/// parts, whose rules differentiate [`math_grads`] (which recomputes what `Stats` holds),
/// so no cotangent reaches it and it passes none on; `Dq` and `Dkv` are differentiated
/// through [`math_grads`] with respect to q, k, v and `dO`.
pub(crate) fn vjp(p: &Primitive, g: &Vjp<'_>) -> Result<Vec<Option<Array>>> {
    match p {
        Primitive::Attention { scale, mask } => {
            if fused_grad_fits(g.inputs, *mask) {
                let s = resolved_scale(*scale, &g.inputs[0]);
                return fused_grads(g.inputs, g.output, g.cotangent, s, *mask == AttentionMaskKind::Causal);
            }
            let (scale, mask, dt) = (*scale, *mask, g.output.dtype());
            crate::autodiff::vjp_of(&move |ins: &[Array]| Ok(vec![math(ins, scale, mask, dt)?]), g.inputs, g.cotangent)
        }
        Primitive::AttentionGrad { part: AttentionGradPart::Stats, .. } => Ok(vec![None; g.inputs.len()]),
        Primitive::AttentionGrad { scale, causal, part } => {
            let (scale, causal, part) = (*scale, *causal, *part);
            let f = move |ins: &[Array]| Ok(vec![grad_part(ins, scale, causal, part)?]);
            let mut cts = crate::autodiff::vjp_of(&f, &g.inputs[..4], g.cotangent)?;
            cts.push(None);
            Ok(cts)
        }
        other => Err(no_rule(other.name(), "vjp")),
    }
}

/// Part `Dq` or `Dkv` of the gradient through [`math_grads`], from `q, k, v, dO`.
fn grad_part(ins: &[Array], scale: f64, causal: bool, part: AttentionGradPart) -> Result<Array> {
    let mut cts = math_grads(&ins[..3], &ins[3], scale, causal)?;
    match part {
        AttentionGradPart::Dq => Ok(cts.swap_remove(0)),
        _ => crate::ops::movement::copies::stack(&[&cts[1], &cts[2]], 0),
    }
}

/// `Attention`: the forward rule through [`math`]. `AttentionGrad`: see [`vjp`] (`Stats`
/// carries no tangent; the others' tangents are those of [`math_grads`]).
pub(crate) fn jvp(p: &Primitive, g: &Jvp<'_>) -> Result<Option<Array>> {
    match p {
        Primitive::Attention { scale, mask } => {
            let (scale, mask, dt) = (*scale, *mask, g.output.dtype());
            crate::autodiff::jvp_of(&move |ins: &[Array]| Ok(vec![math(ins, scale, mask, dt)?]), g.inputs, g.tangents)
        }
        Primitive::AttentionGrad { part: AttentionGradPart::Stats, .. } => Ok(None),
        Primitive::AttentionGrad { scale, causal, part } => {
            let (scale, causal, part) = (*scale, *causal, *part);
            let f = move |ins: &[Array]| Ok(vec![grad_part(ins, scale, causal, part)?]);
            crate::autodiff::jvp_of(&f, &g.inputs[..4], &g.tangents[..4])
        }
        other => Err(no_rule(other.name(), "jvp")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The fused gradient nodes on the CPU against the gradient through [`math`], in f64
    /// (and f32 against the f64 one), for generated shapes: batch axes, grouped heads,
    /// lengths on both sides of each other, causal rows that attend nothing.
    #[test]
    fn fused_grad_nodes_match_the_math() {
        let mut state = 0x2545_f491_4f6c_dd1du64;
        let mut next = |n: usize| {
            state = state.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            ((state >> 33) % n as u64) as usize
        };
        for case in 0..24 {
            let (hkv, group) = (1 + next(2), 1 + next(3));
            let (tq, tk, d) = (1 + next(9), 1 + next(9), 1 + next(8));
            let causal = case % 2 == 1;
            let batch: Vec<usize> = (0..next(3)).map(|_| 1 + next(2)).collect();
            let shape = |h: usize, t: usize| -> Vec<usize> { batch.iter().copied().chain([h, t, d]).collect() };
            let mut rand = |s: &[usize]| {
                let n: usize = s.iter().product();
                let v: Vec<f64> = (0..n).map(|_| next(2001) as f64 / 1000.0 - 1.0).collect();
                Array::from_slice(&v, s).unwrap()
            };
            let hq = hkv * group;
            let (q, k, v) = (rand(&shape(hq, tq)), rand(&shape(hkv, tk)), rand(&shape(hkv, tk)));
            let dout = rand(&shape(hq, tq));
            let scale = 0.3 + next(10) as f64 / 10.0;
            let kind = if causal { AttentionMaskKind::Causal } else { AttentionMaskKind::None };
            let qkv = [q, k, v];
            let o = math(&qkv, Some(scale), kind, crate::DType::F64).unwrap();
            let want = math_grads(&qkv, &dout, scale, causal).unwrap();
            let what = format!("case {case}: q {:?} k {:?} causal {causal}", qkv[0].shape(), qkv[1].shape());
            for dt in [crate::DType::F64, crate::DType::F32] {
                let cast = |a: &Array| a.astype(dt).unwrap();
                let ins: Vec<Array> = qkv.iter().map(cast).collect();
                let got = fused_grads(&ins, &cast(&o), &cast(&dout), scale, causal).unwrap();
                let tol = if dt == crate::DType::F64 { 1e-12 } else { 1e-5 };
                for (i, (g, w)) in got.iter().zip(&want).enumerate() {
                    let g = g.as_ref().unwrap();
                    assert_eq!(g.shape(), w.shape(), "{what}: input {i}");
                    let (g, w) = (g.to_f64_vec().unwrap(), w.to_f64_vec().unwrap());
                    for (a, b) in g.iter().zip(&w) {
                        assert!((a - b).abs() <= tol * (1.0 + b.abs()), "{what} {dt}: input {i}: {a} vs {b}");
                    }
                }
            }
        }
    }
}
