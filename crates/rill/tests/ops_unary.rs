//! Unary elementwise ops against float64 references, for every dtype, on 0-d, 1-D, 3-D,
//! empty and large (parallel) inputs.

mod common;
mod elem_ref;

use std::f64::consts::{FRAC_1_SQRT_2, PI};

use common::Rng;
use elem_ref::*;
use rill::{Array, DType, Result};

/// How an op treats integer and bool inputs.
#[derive(Clone, Copy, PartialEq)]
enum Kind {
    /// Computes in float: integers and bool become f32.
    Float,
    /// Computes in the input's integer dtype (bool becomes i32 unless `keeps_bool`).
    Int { keeps_bool: bool },
    /// Bool output.
    Logical,
}

struct Case {
    name: &'static str,
    op: fn(&Array) -> Result<Array>,
    f: fn(f64) -> f64,
    /// Integer reference for `Kind::Int` ops (before wrapping).
    i: fn(i128) -> i128,
    kind: Kind,
    /// Float input domain.
    lo: f64,
    hi: f64,
    /// Integer input domain for float-computing ops.
    ilo: f64,
    ihi: f64,
}

fn sigmoid(x: f64) -> f64 {
    1.0 / (1.0 + (-x).exp())
}

/// -1, 0 or 1; zeros keep their sign and NaN stays NaN.
fn sign_ref(x: f64) -> f64 {
    if x > 0.0 {
        1.0
    } else if x < 0.0 {
        -1.0
    } else {
        x
    }
}

/// `max(x, 0)` with NaN propagated.
fn relu_ref(x: f64) -> f64 {
    if x.is_nan() { x } else { x.max(0.0) }
}

fn cases() -> Vec<Case> {
    let id = |v: i128| v;
    let none = |_: i128| 0;
    let fl = |name, op, f, lo, hi, ilo, ihi| Case { name, op, f, i: none, kind: Kind::Float, lo, hi, ilo, ihi };
    let int = |name, op, f, i, keeps_bool| Case {
        name,
        op,
        f,
        i,
        kind: Kind::Int { keeps_bool },
        lo: -4.0,
        hi: 4.0,
        ilo: 0.0,
        ihi: 0.0,
    };
    vec![
        int("neg", Array::neg, |x| -x, |v| -v, false),
        int("abs", Array::abs, f64::abs, i128::abs, true),
        int("sign", Array::sign, sign_ref, i128::signum, false),
        int("square", Array::square, |x| x * x, |v| v * v, true),
        int("relu", Array::relu, relu_ref, |v| v.max(0), true),
        int("floor", Array::floor, f64::floor, id, false),
        int("ceil", Array::ceil, f64::ceil, id, false),
        int("round", Array::round, round_half_even, id, false),
        fl("exp", Array::exp, f64::exp, -5.0, 5.0, -5.0, 6.0),
        fl("log", Array::log, f64::ln, 0.05, 10.0, 1.0, 30.0),
        fl("log1p", Array::log1p, f64::ln_1p, -0.9, 5.0, 0.0, 30.0),
        fl("sqrt", Array::sqrt, f64::sqrt, 0.0, 10.0, 0.0, 30.0),
        fl("rsqrt", Array::rsqrt, |x| 1.0 / x.sqrt(), 0.05, 10.0, 1.0, 30.0),
        fl("reciprocal", Array::reciprocal, |x| 1.0 / x, 0.1, 5.0, -10.0, 11.0),
        fl("sin", Array::sin, f64::sin, -4.0, 4.0, -5.0, 6.0),
        fl("cos", Array::cos, f64::cos, -4.0, 4.0, -5.0, 6.0),
        fl("tanh", Array::tanh, f64::tanh, -4.0, 4.0, -5.0, 6.0),
        fl("sigmoid", Array::sigmoid, sigmoid, -6.0, 6.0, -5.0, 6.0),
        fl("gelu", Array::gelu, |x| 0.5 * x * (1.0 + libm::erf(x * FRAC_1_SQRT_2)), -4.0, 4.0, -5.0, 6.0),
        fl(
            "gelu_tanh",
            Array::gelu_tanh,
            |x| 0.5 * x * (1.0 + ((2.0 / PI).sqrt() * (x + 0.044715 * x * x * x)).tanh()),
            -4.0,
            4.0,
            -5.0,
            6.0,
        ),
        fl("silu", Array::silu, |x| x * sigmoid(x), -6.0, 6.0, -5.0, 6.0),
        fl("gelu_grad", Array::gelu_grad, gelu_grad_ref, -4.0, 4.0, -5.0, 6.0),
        fl("gelu_tanh_grad", Array::gelu_tanh_grad, gelu_tanh_grad_ref, -4.0, 4.0, -5.0, 6.0),
        fl("silu_grad", Array::silu_grad, |x| sigmoid(x) * (1.0 + x * (1.0 - sigmoid(x))), -6.0, 6.0, -5.0, 6.0),
        fl("erf", Array::erf, libm::erf, -3.0, 3.0, -3.0, 4.0),
        Case {
            name: "logical_not",
            op: Array::logical_not,
            f: |x| (x == 0.0) as u8 as f64,
            i: |v| (v == 0) as i128,
            kind: Kind::Logical,
            lo: -2.0,
            hi: 2.0,
            ilo: -3.0,
            ihi: 4.0,
        },
    ]
}

/// `Φ(x) + x φ(x)` in f64.
fn gelu_grad_ref(x: f64) -> f64 {
    0.5 * (1.0 + libm::erf(x * FRAC_1_SQRT_2)) + x * (-0.5 * x * x).exp() / (2.0 * PI).sqrt()
}

/// The derivative of the tanh-approximated GELU in f64, by the product rule.
fn gelu_tanh_grad_ref(x: f64) -> f64 {
    let (c, a) = ((2.0 / PI).sqrt(), 0.044715);
    let t = (c * (x + a * x.powi(3))).tanh();
    0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * c * (1.0 + 3.0 * a * x * x)
}

/// The result dtype of a unary op on `d` (docs/DTYPES.md).
fn out_dtype(c: &Case, d: DType) -> DType {
    match c.kind {
        Kind::Logical => DType::Bool,
        Kind::Float => {
            if d.is_float() {
                d
            } else {
                DType::F32
            }
        }
        Kind::Int { keeps_bool } => {
            if d == DType::Bool && !keeps_bool {
                DType::I32
            } else {
                d
            }
        }
    }
}

/// Random inputs for case `c` on dtype `d`, with zeros mixed in where the domain has 0.
fn inputs(rng: &mut Rng, c: &Case, d: DType, n: usize) -> Vec<f64> {
    let (lo, hi) = match (c.kind, d.is_float()) {
        (_, true) => (c.lo, c.hi),
        (Kind::Float, false) | (Kind::Logical, false) => (c.ilo, c.ihi),
        (Kind::Int { .. }, false) => int_range(d),
    };
    let mut v = draw(rng, n, lo, hi, d);
    if lo <= 0.0 && hi > 0.0 {
        for x in v.iter_mut().step_by(5) {
            *x = 0.0;
        }
    }
    // Exact halves for round: -2.5, -1.5, ... appear in every float input.
    if c.name == "round" && d.is_float() {
        for (k, x) in v.iter_mut().skip(1).step_by(4).enumerate() {
            *x = (k % 8) as f64 - 3.5;
        }
    }
    v
}

/// The reference for the (already dtype-rounded) inputs `x`.
fn reference(c: &Case, d: DType, x: &[f64]) -> Vec<f64> {
    let od = out_dtype(c, d);
    match c.kind {
        Kind::Int { .. } if !d.is_float() => x.iter().map(|&v| wrap((c.i)(v as i128), od) as f64).collect(),
        Kind::Logical if !d.is_float() => x.iter().map(|&v| (c.i)(v as i128) as f64).collect(),
        _ => x.iter().map(|&v| (c.f)(v)).collect(),
    }
}

fn run_case(c: &Case, d: DType, shape: &[usize], rng: &mut Rng, dev: rill::Device) {
    let vals = inputs(rng, c, d, numel(shape));
    common::on(dev, || {
        let (a, x) = common::array_of(&vals, shape, d);
        let got = (c.op)(&a).unwrap_or_else(|e| panic!("{} {d}: {e}", c.name));
        let want = reference(c, d, &x);
        check(&got, &want, out_dtype(c, d), shape, &format!("{} {d} {shape:?} on {dev:?}", c.name));
    });
}

#[test]
fn unary_ops_every_dtype_and_shape() {
    let mut rng = Rng::new(11);
    for dev in common::devices() {
        for c in cases() {
            for d in ALL {
                for shape in SHAPES {
                    run_case(&c, d, shape, &mut rng, dev);
                }
            }
        }
    }
}

#[test]
fn unary_ops_large_parallel() {
    let mut rng = Rng::new(12);
    for dev in common::devices() {
        for c in cases() {
            for d in [DType::F32, DType::BF16, DType::I32] {
                run_case(&c, d, &[70_001], &mut rng, dev);
            }
        }
    }
}

#[test]
fn unary_nan_and_signed_zero() {
    for dev in common::devices() {
        common::on(dev, || {
            let a = Array::from_slice(&[f32::NAN, -0.0, 0.0, f32::INFINITY, f32::NEG_INFINITY], &[5]).unwrap();
            let x = a.to_f64_vec().unwrap();
            for c in cases() {
                let got = (c.op)(&a).unwrap().to_f64_vec().unwrap();
                let want: Vec<f64> = x.iter().map(|&v| (c.f)(v)).collect();
                // logical_not(NaN) is false: NaN is not zero.
                for (i, (g, w)) in got.iter().zip(&want).enumerate() {
                    assert!(g == w || (g.is_nan() && w.is_nan()), "{} of {}: got {g}, want {w}", c.name, x[i]);
                }
            }
        });
    }
}

#[test]
fn unary_ops_are_lazy_and_keep_inputs() {
    for dev in common::devices() {
        common::on(dev, || {
            let a = Array::from_slice(&[1.0f32, 4.0, 9.0], &[3]).unwrap();
            let s = a.sqrt().unwrap();
            assert!(!s.is_evaluated());
            assert_eq!(s.to_vec::<f32>().unwrap(), vec![1.0, 2.0, 3.0]);
            assert!(s.is_evaluated());
            assert_eq!(a.to_vec::<f32>().unwrap(), vec![1.0, 4.0, 9.0]);
        });
    }
}
