//! `rill bench matrix --check`: each case computed on the device against a float64
//! reference computed here on the CPU from the same inputs, with plain loops over f64 (and
//! wrapping i64 for integers) that share nothing with rill's kernels; and the seeded,
//! stratified sample of `--sample`.
//!
//! The semantics modelled are docs/DTYPES.md's (integer wrapping, true division of
//! integers, casts that truncate and saturate or round once to nearest even) and the op
//! docs of `rill::Array`. Exact results (integers, bools, copies, max/min, arg-reductions,
//! casts, `where`) must be equal; a float result may differ from the reference by its own
//! rounding plus the error of an f32 computation (TF32 for a TF32 matmul) relative to the
//! magnitude of the terms that make it (`scale`: the sum of |terms| of a sum or a dot
//! product, the terms before a normalisation's or log-softmax's cancellation).

use std::collections::BTreeMap;

use rill::primitives::{BinaryOp, UnaryOp};
use rill::{Array, DType, Result};

use super::{Case, EPS, binary_op, record, sum_dtype, unary_op, with_inputs};

/// An array's elements in row-major order, as f64 (exact for every input the matrix
/// builds), with its shape and dtype.
#[derive(Clone, Debug)]
pub struct Values {
    pub shape: Vec<usize>,
    pub dtype: DType,
    pub v: Vec<f64>,
}

impl Values {
    fn of(x: &Array) -> Result<Values> {
        Ok(Values { shape: x.shape().to_vec(), dtype: x.dtype(), v: x.to_f64_vec()? })
    }
}

/// The reference result, and per element the magnitude its error is measured against.
struct Want {
    dtype: DType,
    shape: Vec<usize>,
    v: Vec<f64>,
    scale: Vec<f64>,
}

/// Computes the case on the current stream: its inputs and its result.
pub fn evaluate(c: &Case) -> Result<(Vec<Values>, Values)> {
    with_inputs(c, |inputs| {
        let y = record(c, inputs)?;
        let got = Values::of(&y)?;
        Ok((inputs.iter().map(Values::of).collect::<Result<_>>()?, got))
    })
}

/// Compares one case's result on the current stream with its float64 reference on the
/// CPU; `Some(description)` of the first difference.
pub fn check_case(c: &Case) -> Result<Option<String>> {
    let (inputs, got) = evaluate(c)?;
    Ok(verify(c, &inputs, &got))
}

/// `Some(description)` when `got` is not the case's result on `inputs`.
pub fn verify(c: &Case, inputs: &[Values], got: &Values) -> Option<String> {
    let want = match reference(c, inputs) {
        Ok(w) => w,
        Err(e) => return Some(format!("no reference: {e}")),
    };
    if got.dtype != want.dtype || got.shape != want.shape {
        return Some(format!("result {}{:?}, expected {}{:?}", got.dtype, got.shape, want.dtype, want.shape));
    }
    if got.v.len() != want.v.len() {
        return Some(format!("{} elements, expected {}", got.v.len(), want.v.len()));
    }
    let (a, b) = tolerance(c, want.dtype);
    // TF32 rounds each operand to 11 significant bits: each product is off by up to twice
    // that roundoff, relative to its magnitude.
    let tf32 = if c.params.tf32 == Some(true) { 4.0 * 2f64.powi(-11) } else { 0.0 };
    let (uo, ua) = (unit(want.dtype), unit(DType::F32));
    let floor = tiny(want.dtype);
    for (k, (&g, &w)) in got.v.iter().zip(&want.v).enumerate() {
        let bound = a * uo * w.abs() + (b * ua + tf32) * want.scale[k] + floor;
        let near = a + b > 0.0 && (g - w).abs() <= bound;
        // The rounded reference last: it is the slowest to compute.
        let ok = g == w || near || (g.is_nan() && w.is_nan()) || g == round_to(w, want.dtype);
        if !ok {
            let how = if a + b > 0.0 { format!("(tolerance {bound:e})") } else { "(exact)".to_string() };
            return Some(format!("element {k}: {g} against the float64 reference {w} {how}"));
        }
    }
    None
}

/// The unit roundoff of a float dtype (half its relative spacing at 1).
fn unit(d: DType) -> f64 {
    match d {
        DType::BF16 => 2f64.powi(-8),
        DType::F16 => 2f64.powi(-11),
        DType::F32 => 2f64.powi(-24),
        DType::F64 => 2f64.powi(-53),
        DType::Bool | DType::U8 | DType::U32 | DType::I32 | DType::I64 => 0.0,
    }
}

/// The spacing of a float dtype's subnormals: a value computed in f32 and rounded may be
/// one of them off.
fn tiny(d: DType) -> f64 {
    match d {
        DType::BF16 => 2f64.powi(-133),
        DType::F16 => 2f64.powi(-24),
        DType::F32 => 2f64.powi(-149),
        DType::F64 | DType::Bool | DType::U8 | DType::U32 | DType::I32 | DType::I64 => 0.0,
    }
}

/// `(a, b)`: a float result may be `a` units of its dtype's roundoff times |value| plus `b`
/// units of f32's times the scale away (plus TF32's rounding of the operands); (0, 0) is
/// exact.
fn tolerance(c: &Case, out: DType) -> (f64, f64) {
    if !out.is_float() {
        return (0.0, 0.0);
    }
    match c.family {
        "cast" | "where" | "take" | "concatenate" | "transpose" | "argreduce" => (0.0, 0.0),
        "reduce" if c.op == "max" || c.op == "min" => (0.0, 0.0),
        // Sums of up to 2^28 terms (in any order, in f32) and dot products.
        "reduce" | "matmul" => (2.0, 128.0),
        // Row statistics (sums of up to 4096 terms in f32), then one elementwise pass.
        "softmax" | "log_softmax" | "layer_norm" | "rms_norm" => (2.0, 64.0),
        // One function evaluated in f32 (a few ulps) and rounded once.
        _ => (2.0, 16.0),
    }
}

/// Rounds to the nearest value of a float dtype, ties to even, keeping subnormals and
/// overflowing to infinity; from the format's precision and exponent range alone.
pub fn round_to(v: f64, d: DType) -> f64 {
    let (bits, emin, max) = match d {
        DType::F32 => return v as f32 as f64,
        DType::F16 => (11, -14, 65504.0),
        DType::BF16 => (8, -126, (2.0 - 2f64.powi(-7)) * 2f64.powi(127)),
        DType::F64 | DType::Bool | DType::U8 | DType::U32 | DType::I32 | DType::I64 => return v,
    };
    if !v.is_finite() || v == 0.0 {
        return v;
    }
    // The spacing of the dtype's values at |v|: 2^(e - bits + 1), e (|v|'s binary
    // exponent, exact from the bits of a normal f64) at least emin.
    let e = (((v.to_bits() >> 52) & 0x7ff) as i32 - 1023).max(emin);
    let q = 2f64.powi(e - bits + 1);
    let r = (v / q).round_ties_even() * q;
    if r.abs() > max { f64::INFINITY.copysign(v) } else { r }
}

/// An integer wrapped into an integer dtype (two's complement); bool is `v != 0`.
fn wrap(v: i64, d: DType) -> i64 {
    match d {
        DType::Bool => i64::from(v != 0),
        DType::U8 => v as u8 as i64,
        DType::U32 => v as u32 as i64,
        DType::I32 => v as i32 as i64,
        DType::I64 | DType::F16 | DType::BF16 | DType::F32 | DType::F64 => v,
    }
}

/// A float converted to an integer dtype: truncated toward zero, saturated, NaN to 0.
fn saturate(v: f64, d: DType) -> f64 {
    let (lo, hi) = match d {
        DType::U8 => (0.0, 255.0),
        DType::U32 => (0.0, u32::MAX as f64),
        DType::I32 => (i32::MIN as f64, i32::MAX as f64),
        DType::I64 => (i64::MIN as f64, i64::MAX as f64),
        DType::Bool | DType::F16 | DType::BF16 | DType::F32 | DType::F64 => return v,
    };
    if v.is_nan() { 0.0 } else { v.trunc().clamp(lo, hi) }
}

fn cast(v: f64, from: DType, to: DType) -> f64 {
    if to == DType::Bool {
        return f64::from(v != 0.0);
    }
    if to.is_float() {
        return round_to(v, to);
    }
    if from.is_float() { saturate(v, to) } else { wrap(v as i64, to) as f64 }
}

fn truth(t: bool) -> f64 {
    f64::from(u8::from(t))
}

fn erf(x: f64) -> f64 {
    if x.abs() < 3.0 {
        // Maclaurin series: 2/sqrt(pi) sum (-1)^n x^(2n+1) / (n! (2n+1)).
        let (mut term, mut sum, x2) = (x, x, x * x);
        for n in 1..200 {
            term *= -x2 / n as f64;
            let t = term / (2 * n + 1) as f64;
            sum += t;
            if t.abs() < 1e-18 * sum.abs() {
                break;
            }
        }
        sum * std::f64::consts::FRAC_2_SQRT_PI
    } else {
        // erfc's continued fraction, evaluated from the tail.
        let a = x.abs();
        let mut f = a;
        for n in (1..80).rev() {
            f = a + (n as f64 / 2.0) / f;
        }
        let erfc = (-a * a).exp() / (f * std::f64::consts::PI.sqrt());
        (1.0 - erfc).copysign(x)
    }
}

/// The magnitude of the terms a derivative op adds (they cancel near its zeros, where an
/// error of a few ulps of the terms is a large error relative to the value); `None` for
/// the other ops, whose scale is the value's magnitude.
fn unary_scale(op: UnaryOp, x: f64) -> Option<f64> {
    use UnaryOp::*;
    let sigmoid = |x: f64| 1.0 / (1.0 + (-x).exp());
    Some(match op {
        GeluGrad => 1.0 + (x * (-0.5 * x * x).exp()).abs(),
        GeluTanhGrad => 1.0 + (x * 0.8 * (1.0 + 0.134145 * x * x)).abs(),
        SiluGrad => sigmoid(x) * (1.0 + x.abs()),
        _ => return None,
    })
}

fn unary_float(op: UnaryOp, x: f64) -> f64 {
    use UnaryOp::*;
    let sigmoid = |x: f64| 1.0 / (1.0 + (-x).exp());
    match op {
        Neg => -x,
        Abs => x.abs(),
        Sign if x == 0.0 || x.is_nan() => x,
        Sign => x.signum(),
        Exp => x.exp(),
        Log => x.ln(),
        Log1p => x.ln_1p(),
        Sqrt => x.sqrt(),
        Rsqrt => 1.0 / x.sqrt(),
        Square => x * x,
        Reciprocal => 1.0 / x,
        Sin => x.sin(),
        Cos => x.cos(),
        Tanh => x.tanh(),
        Sigmoid => sigmoid(x),
        Relu => x.max(0.0),
        Gelu => 0.5 * x * (1.0 + erf(x / std::f64::consts::SQRT_2)),
        GeluTanh => {
            let k = (2.0 / std::f64::consts::PI).sqrt();
            0.5 * x * (1.0 + (k * (x + 0.044715 * x * x * x)).tanh())
        }
        Silu => x * sigmoid(x),
        GeluGrad => {
            let pdf = (-0.5 * x * x).exp() / (2.0 * std::f64::consts::PI).sqrt();
            0.5 * (1.0 + erf(x / std::f64::consts::SQRT_2)) + x * pdf
        }
        GeluTanhGrad => {
            let (k, a) = ((2.0 / std::f64::consts::PI).sqrt(), 0.044715);
            let t = (k * (x + a * x * x * x)).tanh();
            0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * k * (1.0 + 3.0 * a * x * x)
        }
        SiluGrad => sigmoid(x) * (1.0 + x * (1.0 - sigmoid(x))),
        Erf => erf(x),
        Floor => x.floor(),
        Ceil => x.ceil(),
        Round => x.round_ties_even(),
        LogicalNot => truth(x == 0.0),
    }
}

/// An integer op on an integer dtype (the ops that convert integers to floats are not
/// generated for them).
fn unary_int(op: UnaryOp, x: i64, d: DType) -> std::result::Result<f64, String> {
    use UnaryOp::*;
    let v = match op {
        Neg => x.wrapping_neg(),
        Abs => x.wrapping_abs(),
        Sign => x.signum(),
        Square => x.wrapping_mul(x),
        Relu => x.max(0),
        Floor | Ceil | Round => x,
        LogicalNot => return Ok(truth(x == 0)),
        Exp | Log | Log1p | Sqrt | Rsqrt | Reciprocal | Sin | Cos | Tanh | Sigmoid | Gelu | GeluTanh | Silu | Erf
        | GeluGrad | GeluTanhGrad | SiluGrad => {
            return Err(format!("{} of an integer", op.name()));
        }
    };
    Ok(wrap(v, d) as f64)
}

fn binary_float(op: BinaryOp, a: f64, b: f64) -> f64 {
    use BinaryOp::*;
    match op {
        Add => a + b,
        Sub => a - b,
        Mul => a * b,
        Div => a / b,
        Pow => a.powf(b),
        Maximum => {
            if a.is_nan() || a > b {
                a
            } else {
                b
            }
        }
        Minimum => {
            if a.is_nan() || a < b {
                a
            } else {
                b
            }
        }
        Equal => truth(a == b),
        NotEqual => truth(a != b),
        Less => truth(a < b),
        LessEqual => truth(a <= b),
        Greater => truth(a > b),
        GreaterEqual => truth(a >= b),
        LogicalAnd => truth(a != 0.0 && b != 0.0),
        LogicalOr => truth(a != 0.0 || b != 0.0),
    }
}

/// An integer power that wraps; a negative exponent gives 1 for base 1, ±1 for base -1,
/// 0 otherwise.
fn ipow(a: i64, e: i64) -> i64 {
    if e < 0 {
        return match a {
            1 => 1,
            -1 => 1 - 2 * (e & 1),
            _ => 0,
        };
    }
    let mut r: i64 = 1;
    for _ in 0..e {
        r = r.wrapping_mul(a);
    }
    r
}

fn binary_int(op: BinaryOp, a: i64, b: i64, d: DType) -> f64 {
    use BinaryOp::*;
    let w = |v: i64| wrap(v, d) as f64;
    match op {
        Add => w(a.wrapping_add(b)),
        Sub => w(a.wrapping_sub(b)),
        Mul => w(a.wrapping_mul(b)),
        Pow => w(ipow(a, b)),
        // True division; the f32 rounding is the comparison's.
        Div => a as f64 / b as f64,
        Maximum | Minimum | Equal | NotEqual | Less | LessEqual | Greater | GreaterEqual | LogicalAnd | LogicalOr => {
            binary_float(op, a as f64, b as f64)
        }
    }
}

fn strides(shape: &[usize]) -> Vec<usize> {
    let mut s = vec![1; shape.len()];
    for k in (0..shape.len().saturating_sub(1)).rev() {
        s[k] = s[k + 1] * shape[k + 1];
    }
    s
}

/// The NumPy broadcast of shapes.
fn broadcast(shapes: &[&[usize]]) -> std::result::Result<Vec<usize>, String> {
    let rank = shapes.iter().map(|s| s.len()).max().unwrap_or(0);
    (0..rank)
        .map(|k| {
            let mut dims = shapes.iter().map(|s| if k + s.len() >= rank { s[k + s.len() - rank] } else { 1 });
            dims.try_fold(1, |a, d| match (a, d) {
                (a, d) if a == d || d == 1 => Ok(a),
                (1, d) => Ok(d),
                _ => Err(format!("shapes {shapes:?} do not broadcast")),
            })
        })
        .collect()
}

/// For each axis of `out`, the step in an operand of shape `inp` (right-aligned, 0 where
/// the operand's axis is 1 or missing).
fn steps(out: &[usize], inp: &[usize]) -> Vec<usize> {
    let s = strides(inp);
    let lead = out.len() - inp.len();
    (0..out.len()).map(|k| if k < lead || inp[k - lead] == 1 { 0 } else { s[k - lead] }).collect()
}

/// The offset in an operand with `steps` of the element at flat index `flat` of `out`.
fn offset(out: &[usize], steps: &[usize], mut flat: usize) -> usize {
    let mut off = 0;
    for k in (0..out.len()).rev() {
        off += (flat % out[k]) * steps[k];
        flat /= out[k];
    }
    off
}

/// `n` items of `len` outputs each, `f(item, values, scales)` filling one item's; on the
/// CPU's cores when there are many.
fn par_fill(n: usize, len: usize, f: impl Fn(usize, &mut [f64], &mut [f64]) + Sync) -> (Vec<f64>, Vec<f64>) {
    let (mut v, mut s) = (vec![0.0; n * len], vec![0.0; n * len]);
    let threads = if n * len < 1 << 16 || len == 0 {
        1
    } else {
        std::thread::available_parallelism().map_or(1, |t| t.get()).min(32)
    };
    let per = n.div_ceil(threads).max(1);
    std::thread::scope(|scope| {
        for (t, (vc, sc)) in v.chunks_mut(per * len.max(1)).zip(s.chunks_mut(per * len.max(1))).enumerate() {
            let f = &f;
            scope.spawn(move || {
                for (i, (vi, si)) in vc.chunks_mut(len.max(1)).zip(sc.chunks_mut(len.max(1))).enumerate() {
                    f(t * per + i, vi, si);
                }
            });
        }
    });
    (v, s)
}

/// Elementwise: `f(flat index) -> value`, whose scale is its magnitude.
fn elementwise(n: usize, f: impl Fn(usize) -> f64 + Sync) -> (Vec<f64>, Vec<f64>) {
    par_fill(n, 1, |k, v, s| {
        v[0] = f(k);
        s[0] = v[0].abs();
    })
}

fn product(s: &[usize]) -> usize {
    s.iter().product()
}

fn want(dtype: DType, shape: Vec<usize>, (v, scale): (Vec<f64>, Vec<f64>)) -> Want {
    Want { dtype, shape, v, scale }
}

/// The case's result on `inputs`, computed here.
fn reference(c: &Case, x: &[Values]) -> std::result::Result<Want, String> {
    let p = &c.params;
    let bad = |what: &str| format!("case {} without {what}", c.id);
    let x0 = x.first().ok_or_else(|| bad("inputs"))?;
    let (d, shape) = (x0.dtype, x0.shape.clone());
    let n = x0.v.len();
    match c.family {
        "unary" => {
            let op = unary_op(&c.op).ok_or_else(|| bad("a unary op"))?;
            let out = if op == UnaryOp::LogicalNot { DType::Bool } else { d };
            if d.is_float() {
                let v = par_fill(n, 1, |k, v, s| {
                    v[0] = unary_float(op, x0.v[k]);
                    s[0] = unary_scale(op, x0.v[k]).unwrap_or(v[0].abs());
                });
                Ok(want(out, shape, v))
            } else {
                unary_int(op, 0, d)?;
                Ok(want(out, shape, elementwise(n, |k| unary_int(op, x0.v[k] as i64, d).unwrap_or(f64::NAN))))
            }
        }
        "binary" => {
            let op = binary_op(&c.op).ok_or_else(|| bad("a binary op"))?;
            let (a, b) = (x0, x.get(1).ok_or_else(|| bad("a second input"))?);
            if a.dtype != b.dtype {
                return Err(format!("operands {} and {}", a.dtype, b.dtype));
            }
            let out_shape = broadcast(&[&a.shape, &b.shape])?;
            let (sa, sb) = (steps(&out_shape, &a.shape), steps(&out_shape, &b.shape));
            let out = if op.is_predicate() {
                DType::Bool
            } else if op == BinaryOp::Div && !d.is_float() {
                DType::F32
            } else {
                d
            };
            let f = |k: usize| {
                let (u, w) = (a.v[offset(&out_shape, &sa, k)], b.v[offset(&out_shape, &sb, k)]);
                if d.is_float() { binary_float(op, u, w) } else { binary_int(op, u as i64, w as i64, d) }
            };
            let m = product(&out_shape);
            Ok(want(out, out_shape.clone(), elementwise(m, f)))
        }
        "cast" => {
            let to = p.to.ok_or_else(|| bad("a target dtype"))?;
            Ok(want(to, shape, elementwise(n, |k| cast(x0.v[k], d, to))))
        }
        "where" => {
            let (cond, a, b) = (x0, x.get(1).ok_or_else(|| bad("x"))?, x.get(2).ok_or_else(|| bad("y"))?);
            let out_shape = broadcast(&[&cond.shape, &a.shape, &b.shape])?;
            let s: Vec<Vec<usize>> = [cond, a, b].iter().map(|i| steps(&out_shape, &i.shape)).collect();
            let f = |k: usize| {
                let t = if cond.v[offset(&out_shape, &s[0], k)] != 0.0 { 1 } else { 2 };
                x[t].v[offset(&out_shape, &s[t], k)]
            };
            let m = product(&out_shape);
            Ok(want(a.dtype, out_shape.clone(), elementwise(m, f)))
        }
        "reduce" => reduce(c, x0, p.axes.as_deref().ok_or_else(|| bad("axes"))?),
        "argreduce" => {
            let axis = p.axis.ok_or_else(|| bad("an axis"))?;
            let (outer, len, inner) = around(&shape, axis);
            let max = c.op == "argmax";
            let (v, s) = par_fill(outer * inner, 1, |row, v, _| {
                let (o, i) = (row / inner, row % inner);
                let at = |j: usize| x0.v[(o * len + j) * inner + i];
                let mut best = 0;
                for j in 1..len {
                    let better = if max { at(j) > at(best) } else { at(j) < at(best) };
                    if better && !at(best).is_nan() || at(j).is_nan() && !at(best).is_nan() {
                        best = j;
                    }
                }
                v[0] = best as f64;
            });
            let mut out_shape = shape.clone();
            out_shape.remove(axis);
            Ok(want(DType::I64, out_shape, (v, s)))
        }
        "softmax" | "log_softmax" => {
            let axis = p.axis.ok_or_else(|| bad("an axis"))?;
            let (outer, len, inner) = around(&shape, axis);
            // Per row: the maximum and the sum of exp(x - max).
            let (m, sum) = par_fill(outer * inner, 1, |row, m, s| {
                let (o, i) = (row / inner, row % inner);
                let at = |j: usize| x0.v[(o * len + j) * inner + i];
                m[0] = (0..len).map(at).fold(f64::NEG_INFINITY, f64::max);
                s[0] = (0..len).map(|j| (at(j) - m[0]).exp()).sum();
            });
            let log = c.family == "log_softmax";
            let r = par_fill(n, 1, |k, v, s| {
                let row = (k / (len * inner)) * inner + k % inner;
                let (x, m, sum) = (x0.v[k], m[row], sum[row]);
                if log {
                    v[0] = x - m - sum.ln();
                    s[0] = x.abs() + m.abs() + sum.ln().abs();
                } else {
                    v[0] = (x - m).exp() / sum;
                    s[0] = v[0] * (1.0 + (x - m).abs());
                }
            });
            Ok(want(d, shape, r))
        }
        "layer_norm" | "rms_norm" => {
            let cols = *shape.last().ok_or_else(|| bad("an axis"))?;
            let rows = n / cols.max(1);
            let with_w = p.weight == Some(true);
            let with_b = p.bias == Some(true);
            let w = if with_w { Some(&x.get(1).ok_or_else(|| bad("a weight"))?.v) } else { None };
            let b =
                if with_b { Some(&x.get(if with_w { 2 } else { 1 }).ok_or_else(|| bad("a bias"))?.v) } else { None };
            let layer = c.family == "layer_norm";
            // Per row: the mean (0 for rms_norm) and 1 / sqrt(variance or mean square + eps).
            let (mean, rstd) = par_fill(rows, 1, |row, m, r| {
                let xs = &x0.v[row * cols..(row + 1) * cols];
                m[0] = if layer { xs.iter().sum::<f64>() / cols as f64 } else { 0.0 };
                let var = xs.iter().map(|v| (v - m[0]) * (v - m[0])).sum::<f64>() / cols as f64;
                r[0] = 1.0 / (var + EPS).sqrt();
            });
            // The mean's error is relative to the mean magnitude of the row, which the
            // subtraction does not cancel.
            let (mag, _) = par_fill(rows, 1, |row, m, _| {
                m[0] = x0.v[row * cols..(row + 1) * cols].iter().map(|v| v.abs()).sum::<f64>() / cols as f64;
            });
            let r = par_fill(n, 1, |k, v, s| {
                let (row, j) = (k / cols, k % cols);
                let (wj, bj) = (w.map_or(1.0, |w| w[j]), b.map_or(0.0, |b| b[j]));
                let t = (x0.v[k] - mean[row]) * rstd[row];
                v[0] = t * wj + bj;
                let m = if layer { mag[row] } else { 0.0 };
                s[0] = (x0.v[k].abs() + m) * rstd[row] * wj.abs() + bj.abs();
            });
            Ok(want(d, shape, r))
        }
        "take" => {
            let axis = p.axis.ok_or_else(|| bad("an axis"))?;
            let idx = x.get(1).ok_or_else(|| bad("indices"))?;
            let (outer, len, inner) = around(&shape, axis);
            let m = idx.v.len();
            let f = |k: usize| {
                let (o, j, i) = (k / (m * inner), (k / inner) % m, k % inner);
                let t = idx.v[j] as i64;
                let t = if t < 0 { t + len as i64 } else { t };
                if (0..len as i64).contains(&t) { x0.v[(o * len + t as usize) * inner + i] } else { f64::NAN }
            };
            let mut out_shape = shape[..axis].to_vec();
            out_shape.extend(&idx.shape);
            out_shape.extend(&shape[axis + 1..]);
            Ok(want(d, out_shape, elementwise(outer * m * inner, f)))
        }
        "concatenate" => {
            let axis = p.axis.ok_or_else(|| bad("an axis"))?;
            let lens: Vec<usize> = x.iter().map(|i| i.shape[axis]).collect();
            let total: usize = lens.iter().sum();
            let inner = product(&shape[axis + 1..]);
            let mut out_shape = shape.clone();
            out_shape[axis] = total;
            let f = |k: usize| {
                let (o, mut j, i) = (k / (total * inner), (k / inner) % total, k % inner);
                let mut t = 0;
                while j >= lens[t] {
                    j -= lens[t];
                    t += 1;
                }
                x[t].v[(o * lens[t] + j) * inner + i]
            };
            Ok(want(d, out_shape.clone(), elementwise(product(&out_shape), f)))
        }
        "transpose" => {
            let perm = p.perm.as_deref().ok_or_else(|| bad("a permutation"))?;
            let s = strides(&shape);
            let out_shape: Vec<usize> = perm.iter().map(|&a| shape[a]).collect();
            let st: Vec<usize> = perm.iter().map(|&a| s[a]).collect();
            Ok(want(d, out_shape.clone(), elementwise(n, |k| x0.v[offset(&out_shape, &st, k)])))
        }
        "matmul" => matmul(x0, x.get(1).ok_or_else(|| bad("a second input"))?),
        _ => Err(format!("unknown family {}", c.family)),
    }
}

/// `(outer, len, inner)` of a shape around `axis`.
fn around(shape: &[usize], axis: usize) -> (usize, usize, usize) {
    (product(&shape[..axis]), shape[axis], product(&shape[axis + 1..]))
}

fn reduce(c: &Case, x: &Values, axes: &[usize]) -> std::result::Result<Want, String> {
    let shape = &x.shape;
    let kept: Vec<usize> = (0..shape.len()).filter(|k| !axes.contains(k)).collect();
    let out_shape: Vec<usize> = kept.iter().map(|&k| shape[k]).collect();
    let gone: Vec<usize> = axes.iter().map(|&k| shape[k]).collect();
    let s = strides(shape);
    let (ks, gs): (Vec<usize>, Vec<usize>) =
        (kept.iter().map(|&k| s[k]).collect(), axes.iter().map(|&k| s[k]).collect());
    let count = product(&gone);
    let (d, op) = (x.dtype, c.op.as_str());
    let out = match op {
        "sum" | "prod" => sum_dtype(d),
        "max" | "min" => d,
        "mean" if d.is_float() => d,
        _ => return Err(format!("{op} of {d}")),
    };
    let r = par_fill(product(&out_shape), 1, |k, v, sc| {
        let base = offset(&out_shape, &ks, k);
        let at = |j: usize| x.v[base + offset(&gone, &gs, j)];
        if !d.is_float() {
            let mut acc: i64 = if op == "prod" { 1 } else { at(0) as i64 };
            for j in 0..count {
                let t = at(j) as i64;
                acc = match op {
                    "sum" if j == 0 => t,
                    "sum" => acc.wrapping_add(t),
                    "prod" => acc.wrapping_mul(t),
                    "max" => acc.max(t),
                    _ => acc.min(t),
                };
            }
            v[0] = wrap(acc, out) as f64;
            return;
        }
        let (mut acc, mut mag) = (if op == "prod" { 1.0 } else { 0.0 }, if op == "prod" { 1.0 } else { 0.0 });
        if op == "max" || op == "min" {
            acc = at(0);
        }
        for j in 0..count {
            let t = at(j);
            match op {
                "prod" => {
                    acc *= t;
                    mag *= t.abs();
                }
                "max" => acc = if acc.is_nan() || acc > t { acc } else { t },
                "min" => acc = if acc.is_nan() || acc < t { acc } else { t },
                _ => {
                    acc += t;
                    mag += t.abs();
                }
            }
        }
        if op == "mean" {
            acc /= count as f64;
            mag /= count as f64;
        }
        v[0] = acc;
        sc[0] = mag.max(acc.abs());
    });
    Ok(want(out, out_shape, r))
}

/// `[.., M, K] x [.., K, N]` with the batch axes broadcast; the scale is the dot product of
/// the magnitudes.
fn matmul(a: &Values, b: &Values) -> std::result::Result<Want, String> {
    if a.shape.len() < 2 || b.shape.len() < 2 || a.dtype != b.dtype {
        return Err(format!("matmul of {}{:?} and {}{:?}", a.dtype, a.shape, b.dtype, b.shape));
    }
    let (ra, rb) = (a.shape.len(), b.shape.len());
    let (m, k, n) = (a.shape[ra - 2], a.shape[ra - 1], b.shape[rb - 1]);
    if b.shape[rb - 2] != k {
        return Err(format!("matmul of {:?} and {:?}", a.shape, b.shape));
    }
    let batch = broadcast(&[&a.shape[..ra - 2], &b.shape[..rb - 2]])?;
    let (sa, sb) = (steps(&batch, &a.shape[..ra - 2]), steps(&batch, &b.shape[..rb - 2]));
    let r = par_fill(product(&batch) * m, n, |row, v, s| {
        let (bi, i) = (row / m, row % m);
        let (oa, ob) = (offset(&batch, &sa, bi) * m * k, offset(&batch, &sb, bi) * k * n);
        for t in 0..k {
            let x = a.v[oa + i * k + t];
            let brow = &b.v[ob + t * n..ob + (t + 1) * n];
            for j in 0..n {
                v[j] += x * brow[j];
                s[j] += (x * brow[j]).abs();
            }
        }
    });
    let mut shape = batch;
    shape.extend([m, n]);
    Ok(want(a.dtype, shape, r))
}

/// The group a case belongs to for sampling: its family, dtype and layout (the id without
/// its op and size).
pub fn stratum(c: &Case) -> String {
    let parts: Vec<&str> = c.id.split('/').collect();
    let tag = parts.get(3..parts.len().saturating_sub(1)).unwrap_or(&[]).join("/");
    format!("{}/{}/{tag}", c.family, parts.get(2).unwrap_or(&""))
}

/// splitmix64: the sample's seeded generator.
fn next(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

fn shuffle<T>(v: &mut [T], state: &mut u64) {
    for k in (1..v.len()).rev() {
        v.swap(k, (next(state) % (k as u64 + 1)) as usize);
    }
}

/// `n` of the cases, seeded: one of each [`stratum`] (in a shuffled order) before a second
/// of any, and within a stratum its ops in turn, so that `n` at least the number of strata
/// covers every family, dtype and layout. In the order of `cases`.
pub fn sample(cases: &[Case], n: usize, seed: u64) -> Vec<&Case> {
    let mut state = seed;
    let mut groups: BTreeMap<String, Vec<usize>> = BTreeMap::new();
    for (k, c) in cases.iter().enumerate() {
        groups.entry(stratum(c)).or_default().push(k);
    }
    let mut queues: Vec<Vec<usize>> = groups
        .into_values()
        .map(|mut g| {
            shuffle(&mut g, &mut state);
            // The j-th case of each op comes in round j.
            let mut seen: BTreeMap<&str, usize> = BTreeMap::new();
            let mut keyed: Vec<(usize, usize)> = g
                .into_iter()
                .map(|k| {
                    let j = seen.entry(cases[k].op.as_str()).or_default();
                    *j += 1;
                    (*j, k)
                })
                .collect();
            keyed.sort_by_key(|&(j, _)| j);
            keyed.into_iter().rev().map(|(_, k)| k).collect()
        })
        .collect();
    shuffle(&mut queues, &mut state);
    let mut chosen = Vec::new();
    while chosen.len() < n && queues.iter().any(|q| !q.is_empty()) {
        for q in &mut queues {
            if chosen.len() < n {
                chosen.extend(q.pop());
            }
        }
    }
    chosen.sort_unstable();
    chosen.into_iter().map(|k| &cases[k]).collect()
}
