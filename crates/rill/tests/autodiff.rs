//! The autodiff transforms (`rill::{vjp, jvp, grad, value_and_grad, stop_gradient,
//! checkpoint}`):
//! every rule against central finite differences in float64 on the CPU, on seeded random
//! shapes (broadcasting, keepdims, negative axes, non-contiguous inputs, size-1 and empty
//! axes); forward against reverse mode (`<u, J v>` both ways); second order; `compile`
//! in both orders; many threads and tasks at once; and the errors of bad input.

mod common;

use std::sync::Arc;

use common::Rng;
use rill::primitives::{BinaryOp, UnaryOp};
use rill::{Array, AttentionMask, DType, Error, Result, SliceArg, concatenate, stack, where_};

type Fun = Arc<dyn Fn(&[Array]) -> Result<Vec<Array>> + Send + Sync>;

fn fun(f: impl Fn(&[Array]) -> Result<Vec<Array>> + Send + Sync + 'static) -> Fun {
    Arc::new(f)
}

/// One input of a case: its values, shape, and whether it is passed as a
/// non-contiguous view (the transpose of a transposed copy).
#[derive(Clone)]
struct Input {
    vals: Vec<f64>,
    shape: Vec<usize>,
    strided: bool,
}

fn make(vals: &[f64], shape: &[usize], strided: bool) -> Array {
    let a = Array::from_slice(vals, shape).unwrap();
    if !strided || shape.len() < 2 {
        return a;
    }
    let t = a.transpose(&[]).unwrap().contiguous().unwrap();
    t.eval().unwrap();
    t.transpose(&[]).unwrap()
}

fn run(f: &Fun, inputs: &[Input], vals: &[Vec<f64>]) -> Vec<Vec<f64>> {
    let xs: Vec<Array> = inputs.iter().zip(vals).map(|(i, v)| make(v, &i.shape, i.strided)).collect();
    f(&xs).unwrap().iter().map(|o| o.to_f64_vec().unwrap()).collect()
}

fn dot(a: &[f64], b: &[f64]) -> f64 {
    a.iter().zip(b).map(|(x, y)| x * y).sum()
}

fn close(got: f64, want: f64, tol: f64) -> bool {
    (got - want).abs() <= tol * (1.0 + want.abs()) || (got.is_nan() && want.is_nan())
}

const H: f64 = 1e-5;
const TOL: f64 = 2e-6;

/// Checks `f` at `inputs`: the reverse-mode gradient of `<u, f(x)>` for a random `u`
/// against central differences element by element, the forward-mode `J v` for a random
/// `v` against the central difference along `v`, and `<u, J v>` of the two modes.
fn check(name: &str, f: Fun, inputs: Vec<Input>, rng: &mut Rng) {
    let xs: Vec<Array> = inputs.iter().map(|i| make(&i.vals, &i.shape, i.strided)).collect();
    let outs = f(&xs).unwrap_or_else(|e| panic!("{name}: {e}"));
    let us: Vec<Array> =
        outs.iter().map(|o| Array::from_slice(&rng.vec(o.size(), -1.0, 1.0), o.shape()).unwrap()).collect();
    let uvals: Vec<Vec<f64>> = us.iter().map(|u| u.to_f64_vec().unwrap()).collect();
    let f2 = f.clone();
    let (vouts, grads) = rill::vjp(move |x: &[Array]| f2(x), &xs, &us).unwrap_or_else(|e| panic!("{name}: vjp: {e}"));
    let base: Vec<Vec<f64>> = run(&f, &inputs, &inputs.iter().map(|i| i.vals.clone()).collect::<Vec<_>>());
    for (o, b) in vouts.iter().zip(&base) {
        assert!(common::same_values(&o.to_f64_vec().unwrap(), b), "{name}: vjp's outputs differ from f's");
    }
    let grads: Vec<Vec<f64>> = grads
        .iter()
        .zip(&inputs)
        .map(|(g, i)| {
            assert_eq!(g.shape(), i.shape.as_slice(), "{name}: gradient shape");
            assert_eq!(g.dtype(), DType::F64, "{name}: gradient dtype");
            g.to_f64_vec().unwrap()
        })
        .collect();
    let all: Vec<Vec<f64>> = inputs.iter().map(|i| i.vals.clone()).collect();
    for (i, inp) in inputs.iter().enumerate() {
        for k in 0..inp.vals.len() {
            let (mut up, mut down) = (all.clone(), all.clone());
            up[i][k] += H;
            down[i][k] -= H;
            let (fu, fd) = (run(&f, &inputs, &up), run(&f, &inputs, &down));
            let fdv: f64 = fu.iter().zip(&fd).zip(&uvals).map(|((a, b), u)| (dot(u, a) - dot(u, b)) / (2.0 * H)).sum();
            assert!(
                close(grads[i][k], fdv, TOL),
                "{name}: d/d input {i}[{k}] (shape {:?}): vjp {} vs finite difference {fdv}",
                inp.shape,
                grads[i][k]
            );
        }
    }
    // Forward mode along a random direction.
    let vs: Vec<Vec<f64>> = inputs.iter().map(|i| rng.vec(i.vals.len(), -1.0, 1.0)).collect();
    let varr: Vec<Array> = inputs.iter().zip(&vs).map(|(i, v)| Array::from_slice(v, &i.shape).unwrap()).collect();
    let f3 = f.clone();
    let (_, jv) = rill::jvp(move |x: &[Array]| f3(x), &xs, &varr).unwrap_or_else(|e| panic!("{name}: jvp: {e}"));
    let shift = |s: f64| -> Vec<Vec<f64>> {
        all.iter().zip(&vs).map(|(x, v)| x.iter().zip(v).map(|(a, b)| a + s * b).collect()).collect()
    };
    let (fu, fd) = (run(&f, &inputs, &shift(H)), run(&f, &inputs, &shift(-H)));
    let mut ujv = 0.0;
    for (o, ((j, (a, b)), u)) in jv.iter().zip(fu.iter().zip(&fd)).zip(&uvals).enumerate() {
        assert_eq!(j.shape(), outs[o].shape(), "{name}: tangent shape");
        let j = j.to_f64_vec().unwrap();
        for (e, (jv, (p, m))) in j.iter().zip(a.iter().zip(b)).enumerate() {
            let want = (p - m) / (2.0 * H);
            assert!(close(*jv, want, TOL), "{name}: output {o}[{e}]: jvp {jv} vs finite difference {want}");
        }
        ujv += dot(u, &j);
    }
    let gv: f64 = grads.iter().zip(&vs).map(|(g, v)| dot(g, v)).sum();
    assert!(close(ujv, gv, 1e-9), "{name}: <u, J v> = {ujv} but <J^T u, v> = {gv}");
}

/// A random shape of rank `lo..=hi` with dimensions in `1..=3` (`0..=3` when `empty`).
fn shape(rng: &mut Rng, lo: usize, hi: usize, empty: bool) -> Vec<usize> {
    let r = lo + (rng.next_u64() as usize) % (hi - lo + 1);
    let min = if empty { 0 } else { 1 };
    (0..r).map(|_| min + (rng.next_u64() as usize) % (4 - min)).collect()
}

/// `shape` with some axes set to 1 and some leading axes dropped (broadcasts to it).
fn broadcastable(rng: &mut Rng, shape: &[usize]) -> Vec<usize> {
    let drop = (rng.next_u64() as usize) % (shape.len() + 1);
    shape[drop..].iter().map(|&d| if rng.next_u64().is_multiple_of(3) { 1 } else { d }).collect()
}

/// Values away from 0 (|x| in [0.2, 2]), so kinks and poles are never crossed.
fn away(rng: &mut Rng, n: usize) -> Vec<f64> {
    (0..n).map(|_| if rng.next_u64().is_multiple_of(2) { 1.0 } else { -1.0 } * rng.uniform(0.2, 2.0)).collect()
}

fn rand_input(rng: &mut Rng, shape: &[usize], lo: f64, hi: f64) -> Input {
    let n = shape.iter().product();
    Input { vals: rng.vec(n, lo, hi), shape: shape.to_vec(), strided: rng.next_u64().is_multiple_of(2) }
}

fn axes_of(rng: &mut Rng, rank: usize) -> Vec<isize> {
    let mut out = Vec::new();
    for a in 0..rank as isize {
        if rng.next_u64().is_multiple_of(2) {
            out.push(if rng.next_u64().is_multiple_of(2) { a - rank as isize } else { a });
        }
    }
    out
}

#[test]
fn unary_rules_match_finite_differences() {
    let mut rng = Rng::new(1);
    for op in UnaryOp::ALL {
        if op == UnaryOp::LogicalNot {
            continue;
        }
        for _ in 0..2 {
            let s = shape(&mut rng, 0, 3, false);
            let n = s.iter().product();
            let vals = match op {
                UnaryOp::Log | UnaryOp::Sqrt | UnaryOp::Rsqrt => rng.vec(n, 0.3, 2.0),
                UnaryOp::Log1p => rng.vec(n, -0.5, 2.0),
                _ => away(&mut rng, n),
            };
            let inp = Input { vals, shape: s, strided: true };
            check(op.name(), fun(move |x| Ok(vec![x[0].unary(op)?])), vec![inp], &mut rng);
        }
    }
}

#[test]
fn binary_rules_match_finite_differences_with_broadcasting() {
    let mut rng = Rng::new(2);
    let ops = [
        BinaryOp::Add,
        BinaryOp::Sub,
        BinaryOp::Mul,
        BinaryOp::Div,
        BinaryOp::Pow,
        BinaryOp::Maximum,
        BinaryOp::Minimum,
    ];
    for op in ops {
        for _ in 0..3 {
            let out = shape(&mut rng, 0, 3, false);
            let (sa, sb) = (broadcastable(&mut rng, &out), broadcastable(&mut rng, &out));
            let (na, nb) = (sa.iter().product(), sb.iter().product());
            let (a, b) = match op {
                BinaryOp::Pow => (rng.vec(na, 0.3, 2.0), rng.vec(nb, -2.0, 2.0)),
                _ => (away(&mut rng, na), away(&mut rng, nb)),
            };
            let (a, b) = (Input { vals: a, shape: sa, strided: true }, Input { vals: b, shape: sb, strided: false });
            check(op.name(), fun(move |x| Ok(vec![x[0].binary(&x[1], op)?])), vec![a, b], &mut rng);
        }
    }
    // Scalar operands, and the predicates and logical ops (no derivative) choosing a branch.
    let s = shape(&mut rng, 1, 3, false);
    let x = Input { vals: rng.vec(s.iter().product(), 0.3, 2.0), shape: s.clone(), strided: true };
    check(
        "scalar operands",
        fun(|x| Ok(vec![x[0].mul(2.5)?.sub(1.0)?.pow(3.0)?.div(0.7)?])),
        vec![x.clone()],
        &mut rng,
    );
    for op in [
        BinaryOp::Equal,
        BinaryOp::NotEqual,
        BinaryOp::Less,
        BinaryOp::LessEqual,
        BinaryOp::Greater,
        BinaryOp::GreaterEqual,
        BinaryOp::LogicalAnd,
        BinaryOp::LogicalOr,
    ] {
        let y = Input { vals: away(&mut rng, s.iter().product()), shape: s.clone(), strided: false };
        let f = fun(move |x| Ok(vec![where_(&x[0].binary(&x[1], op)?, &x[0].mul(&x[1])?, &x[1].exp()?)?]));
        check(op.name(), f, vec![x.clone(), y], &mut rng);
    }
}

#[test]
fn cast_where_and_stop_gradient() {
    let mut rng = Rng::new(3);
    let s = shape(&mut rng, 1, 3, false);
    let n = s.iter().product();
    let x = Input { vals: rng.vec(n, -3.0, 3.0), shape: s.clone(), strided: true };
    // Through an integer: no derivative; a same-dtype cast: the identity.
    let f = fun(|x| {
        Ok(vec![x[0].astype(DType::I32)?.astype(DType::F64)?.mul(&x[0])?.add(&x[0].astype(DType::F64)?.sin()?)?])
    });
    check("astype", f, vec![x.clone()], &mut rng);
    for _ in 0..3 {
        let out = shape(&mut rng, 0, 3, false);
        let (sc, sa, sb) =
            (broadcastable(&mut rng, &out), broadcastable(&mut rng, &out), broadcastable(&mut rng, &out));
        let cond: Vec<bool> = (0..sc.iter().product::<usize>()).map(|_| rng.next_u64().is_multiple_of(2)).collect();
        let c = Array::from_bools(&cond, &sc).unwrap();
        let (a, b) = (rand_input(&mut rng, &sa, -1.0, 1.0), rand_input(&mut rng, &sb, -1.0, 1.0));
        check("where", fun(move |x| Ok(vec![where_(&c, &x[0], &x[1])?])), vec![a, b], &mut rng);
    }
    // stop_gradient: x * sg(x) has derivative sg(x) = x, not 2x.
    let xs = Array::from_slice(&x.vals, &s).unwrap();
    let g = rill::grad(|x| Ok(vec![x[0].mul(&rill::stop_gradient(&x[0])?)?.sum_all()?]), &[0]).call(&[xs]).unwrap();
    common::assert_close(&g[0].to_f64_vec().unwrap(), &x.vals, 1e-15, "stop_gradient");
    let (_, t) = rill::jvp(
        |x| Ok(vec![rill::stop_gradient(&x[0])?]),
        &[Array::from_slice(&x.vals, &s).unwrap()],
        &[Array::ones(&s, DType::F64).unwrap()],
    )
    .unwrap();
    assert!(t[0].to_f64_vec().unwrap().iter().all(|&v| v == 0.0));
}

#[test]
fn reduction_rules_match_finite_differences() {
    let mut rng = Rng::new(4);
    for case in 0..24 {
        let s = shape(&mut rng, 0, 3, case % 6 == 5);
        let axes = axes_of(&mut rng, s.len());
        let keep = rng.next_u64().is_multiple_of(2);
        let mut x = rand_input(&mut rng, &s, -1.5, 1.5);
        let which = case % 8;
        if which == 1 && x.vals.len() > 2 && case % 3 == 0 {
            // Exact zeros in a product (one, or two in one row).
            x.vals[0] = 0.0;
            if case % 2 == 0 {
                x.vals[1] = 0.0;
            }
        }
        let empty = x.vals.is_empty() || s.is_empty();
        let a2 = axes.clone();
        let (name, f): (&str, Fun) = match which {
            0 => ("sum", fun(move |x| Ok(vec![x[0].sum(&a2, keep)?]))),
            1 => ("prod", fun(move |x| Ok(vec![x[0].prod(&a2, keep)?]))),
            2 if !x.vals.is_empty() => ("max", fun(move |x| Ok(vec![x[0].max(&a2, keep)?]))),
            3 if !x.vals.is_empty() => ("min", fun(move |x| Ok(vec![x[0].min(&a2, keep)?]))),
            4 => ("mean", fun(move |x| Ok(vec![x[0].mean(&a2, keep)?]))),
            5 if !x.vals.is_empty() => ("var", fun(move |x| Ok(vec![x[0].var(&a2, keep, 0)?]))),
            6 if !x.vals.is_empty() => ("logsumexp", fun(move |x| Ok(vec![x[0].logsumexp(&a2, keep)?]))),
            7 if !empty => {
                let ax = -1 - (rng.next_u64() % s.len() as u64) as isize;
                ("argmax", fun(move |x| Ok(vec![x[0].mul(&x[0].argmax(ax, true)?.astype(DType::F64)?)?])))
            }
            _ => ("sum (all)", fun(|x| Ok(vec![x[0].sum_all()?]))),
        };
        check(&format!("{name} {s:?} axes {axes:?} keepdims {keep}"), f, vec![x], &mut rng);
    }
    for case in 0..8 {
        let s = shape(&mut rng, 1, 3, case == 7);
        let ax = (rng.next_u64() % s.len() as u64) as isize - s.len() as isize;
        let (rev, excl) = (case % 2 == 0, case % 4 < 2);
        let x = rand_input(&mut rng, &s, -1.0, 1.0);
        check(
            &format!("cumsum {s:?} {ax} {rev} {excl}"),
            fun(move |x| Ok(vec![x[0].cumsum_with(ax, rev, excl)?])),
            vec![x],
            &mut rng,
        );
    }
}

/// Ties: a maximum or minimum shared by several elements splits its derivative evenly.
#[test]
fn ties_split_evenly() {
    let x = Array::from_slice(&[1.0, 3.0, 3.0, 2.0, 2.0, 0.0], &[2, 3]).unwrap();
    let g = rill::grad(|x| Ok(vec![x[0].max(&[-1], false)?.sum_all()?]), &[0]).call(std::slice::from_ref(&x)).unwrap();
    assert_eq!(g[0].to_vec::<f64>().unwrap(), vec![0.0, 0.5, 0.5, 0.5, 0.5, 0.0]);
    let y = Array::from_slice(&[2.0, 2.0, 2.0, 2.0, 2.0, 2.0], &[2, 3]).unwrap();
    let g = rill::grad(|x| Ok(vec![x[0].maximum(&x[1])?.sum_all()?]), &[0, 1]).call(&[x, y]).unwrap();
    assert_eq!(g[0].to_vec::<f64>().unwrap(), vec![0.0, 1.0, 1.0, 0.5, 0.5, 0.0]);
    assert_eq!(g[1].to_vec::<f64>().unwrap(), vec![1.0, 0.0, 0.0, 0.5, 0.5, 1.0]);
}

#[test]
fn nn_rules_match_finite_differences() {
    let mut rng = Rng::new(5);
    for case in 0..6 {
        let s = shape(&mut rng, 1, 3, false);
        let ax = (rng.next_u64() % s.len() as u64) as isize - if case % 2 == 0 { s.len() as isize } else { 0 };
        let log = case % 2 == 1;
        let x = rand_input(&mut rng, &s, -2.0, 2.0);
        let f = fun(move |x| Ok(vec![if log { x[0].log_softmax(ax)? } else { x[0].softmax(ax)? }]));
        check(&format!("softmax {s:?} {ax} log {log}"), f, vec![x], &mut rng);
    }
    for case in 0..8 {
        let mut s = shape(&mut rng, 1, 3, false);
        let d = 2 + case % 3;
        *s.last_mut().unwrap() = d;
        let (hw, hb, rms) = (case % 2 == 0, case % 4 < 2, case >= 6);
        let mut ins = vec![rand_input(&mut rng, &s, -2.0, 2.0)];
        if hw {
            ins.push(rand_input(&mut rng, &[d], 0.5, 1.5));
        }
        if hb && !rms {
            ins.push(rand_input(&mut rng, &[d], -1.0, 1.0));
        }
        let f = fun(move |x| {
            let w = if hw { Some(&x[1]) } else { None };
            let b = if hb && !rms { Some(&x[1 + hw as usize]) } else { None };
            Ok(vec![if rms { x[0].rms_norm(w, 1e-5)? } else { x[0].layer_norm(w, b, 1e-5)? }])
        });
        check(&format!("norm {s:?} weight {hw} bias {hb} rms {rms}"), f, ins, &mut rng);
    }
}

#[test]
fn matmul_rule_matches_finite_differences_with_batch_broadcasting() {
    let mut rng = Rng::new(6);
    for case in 0..8 {
        let (m, k, n) = (1 + case % 3, (case / 2) % 4, 1 + (case / 3) % 3);
        let batch = shape(&mut rng, 0, 2, false);
        let (ba, bb) = (broadcastable(&mut rng, &batch), broadcastable(&mut rng, &batch));
        let mut sa = [ba.as_slice(), &[m, k]].concat();
        let mut sb = [bb.as_slice(), &[k, n]].concat();
        if case == 6 {
            sa = vec![k.max(1)];
            sb = [bb.as_slice(), &[k.max(1), n]].concat();
        }
        if case == 7 {
            sb = vec![k];
        }
        let (a, b) = (rand_input(&mut rng, &sa, -1.0, 1.0), rand_input(&mut rng, &sb, -1.0, 1.0));
        check(&format!("matmul {sa:?} @ {sb:?}"), fun(|x| Ok(vec![x[0].matmul(&x[1])?])), vec![a, b], &mut rng);
    }
}

/// An operand shared over a batch (`[B.., M, K] @ [K, N]`, either side, the shared one
/// 2-D or with batch axes of size 1): its cotangent is one product over the folded
/// contraction rather than a batched product summed over the batch. The data operand is
/// sometimes a transposed view, so both ways the fold reads its left factor are taken.
#[test]
fn matmul_gradient_of_an_operand_shared_over_a_batch() {
    let mut rng = Rng::new(23);
    for case in 0..16 {
        let batch = shape(&mut rng, 1, 3, false);
        let (m, k, n) = (1 + case % 3, 1 + (case / 3) % 3, 1 + (case / 2) % 4);
        let ones = (rng.next_u64() as usize) % (batch.len() + 1);
        let shared_batch = vec![1; ones];
        let (shared_left, transposed) = (case % 2 == 1, case % 4 >= 2);
        let (sa, sb) = if shared_left {
            ([shared_batch.as_slice(), &[m, k]].concat(), [batch.as_slice(), &[k, n]].concat())
        } else {
            ([batch.as_slice(), &[m, k]].concat(), [shared_batch.as_slice(), &[k, n]].concat())
        };
        // The data operand is passed with its matrix axes swapped and swapped back in `f`.
        let data = usize::from(!shared_left);
        let mut ins = vec![rand_input(&mut rng, &sa, -1.0, 1.0), rand_input(&mut rng, &sb, -1.0, 1.0)];
        if transposed {
            let s = &mut ins[1 - data].shape;
            let r = s.len();
            s.swap(r - 1, r - 2);
        }
        let f = fun(move |x| {
            let d = if transposed { x[1 - data].swapaxes(-1, -2)? } else { x[1 - data].clone() };
            let (a, b) = if shared_left { (&x[0], &d) } else { (&d, &x[1]) };
            Ok(vec![a.matmul(b)?.tanh()?])
        });
        check(&format!("matmul {sa:?} @ {sb:?} transposed {transposed}"), f, ins, &mut rng);
    }
    // The weight's gradient is one product: no reduction over the batch.
    let gr = rill::grad(|x| Ok(vec![x[0].matmul(&x[1])?.square()?.sum_all()?]), &[1]);
    let g = rill::compile(move |x: &[Array]| gr.call(x));
    let ins = [Array::ones(&[4, 5, 3], DType::F32).unwrap(), Array::ones(&[3, 2], DType::F32).unwrap()];
    let counts = g.primitive_counts(&ins).unwrap();
    assert_eq!(counts.get("sum").copied().unwrap_or(0), 0, "{counts:?}");
}

/// Slices of one array used separately (a fused q/k/v projection split in three): their
/// cotangents, zero paddings of runs of one axis, are joined into one array. Runs that
/// tile the axis, leave gaps, overlap, or are strided, along a random axis.
#[test]
fn gradient_of_slices_that_split_an_array() {
    let mut rng = Rng::new(24);
    for case in 0..16 {
        let s = shape(&mut rng, 1, 3, false).into_iter().map(|d| d + 3).collect::<Vec<_>>();
        let axis = (rng.next_u64() as usize) % s.len();
        let n = s[axis];
        // Up to four runs [lo, hi) with step 1, or 2 in the strided cases.
        let runs: Vec<(usize, usize, isize)> = (0..2 + case % 3)
            .map(|_| {
                let lo = (rng.next_u64() as usize) % n;
                let hi = lo + 1 + (rng.next_u64() as usize) % (n - lo);
                (lo, hi, if case % 5 == 4 { 2 } else { 1 })
            })
            .collect();
        let runs = if case % 4 == 0 {
            // Tiling: consecutive runs covering the axis.
            let cut = 1 + (rng.next_u64() as usize) % (n - 1);
            vec![(0, cut, 1), (cut, n, 1)]
        } else {
            runs
        };
        let rs = runs.clone();
        let f = fun(move |x| {
            let mut out = Vec::new();
            for (i, &(lo, hi, st)) in rs.iter().enumerate() {
                let p = x[0].slice_axis(axis as isize, Some(lo as isize), Some(hi as isize), st)?;
                out.push(if i % 2 == 0 { p.sin()? } else { p.square()? });
            }
            Ok(out)
        });
        check(
            &format!("slices {runs:?} of axis {axis} of {s:?}"),
            f,
            vec![rand_input(&mut rng, &s, -1.0, 1.0)],
            &mut rng,
        );
    }
    // Three parts that tile an axis: their cotangent is one concatenation, not three
    // paddings added.
    let gr = rill::grad(
        |x| {
            let part = |i: isize| x[0].slice_axis(0, Some(2 * i), Some(2 * i + 2), 1);
            Ok(vec![part(0)?.mul(&part(1)?)?.mul(&part(2)?.sin()?)?.sum_all()?])
        },
        &[0],
    );
    let g = rill::compile(move |x: &[Array]| gr.call(x));
    let counts = g.primitive_counts(&[Array::ones(&[6, 5], DType::F32).unwrap()]).unwrap();
    assert_eq!(counts.get("pad").copied().unwrap_or(0), 0, "{counts:?}");
}

#[test]
fn movement_rules_match_finite_differences() {
    let mut rng = Rng::new(7);
    for case in 0..10 {
        let s = shape(&mut rng, 1, 3, case == 9);
        let x = rand_input(&mut rng, &s, -1.0, 1.0);
        let nd = s.len();
        // reshape, transpose, broadcast_to, expand_dims/squeeze, contiguous.
        let mut perm: Vec<usize> = (0..nd).collect();
        perm.rotate_left(case % nd.max(1));
        let p2 = perm.clone();
        let size = x.vals.len() as isize;
        let f = fun(move |x| {
            let t = x[0].transpose(&p2)?;
            let r = t.reshape(&[size])?.reshape(&[-1, 1])?;
            let e = x[0].expand_dims(0)?.broadcast_to(&[[2usize].as_slice(), x[0].shape()].concat())?;
            Ok(vec![r.mul(2.0)?, e.contiguous()?.squeeze(&[])?, t.contiguous()?])
        });
        check(&format!("views {s:?} perm {perm:?}"), f, vec![x.clone()], &mut rng);
        // Slices with steps (negative too) on each axis.
        let args: Vec<SliceArg> = s
            .iter()
            .map(|&d| {
                let step = [1isize, 2, 3, -1, -2][(rng.next_u64() % 5) as usize];
                let start = (rng.next_u64() % (d as u64 + 1)) as isize - (rng.next_u64() % 2) as isize * d as isize;
                SliceArg::new(Some(start), None, step)
            })
            .collect();
        let a2 = args.clone();
        check(&format!("slice {s:?} {args:?}"), fun(move |x| Ok(vec![x[0].slice(&a2)?])), vec![x.clone()], &mut rng);
        // Every axis walked backwards, by 1 or 2, from a random start.
        let back: Vec<SliceArg> = s
            .iter()
            .map(|&d| {
                SliceArg::new(
                    Some((rng.next_u64() % (d as u64 + 1)) as isize),
                    None,
                    -1 - (rng.next_u64() % 2) as isize,
                )
            })
            .collect();
        let b2 = back.clone();
        check(&format!("slice {s:?} {back:?}"), fun(move |x| Ok(vec![x[0].slice(&b2)?])), vec![x.clone()], &mut rng);
        // Pad with a value (its derivative is zero).
        let widths: Vec<(usize, usize)> =
            (0..nd).map(|_| ((rng.next_u64() % 3) as usize, (rng.next_u64() % 2) as usize)).collect();
        check(
            &format!("pad {s:?} {widths:?}"),
            fun(move |x| Ok(vec![x[0].pad(&widths, 1.5)?])),
            vec![x.clone()],
            &mut rng,
        );
        // Concatenate three parts (one possibly empty) along a random axis, stack, split.
        let ax = (rng.next_u64() % nd as u64) as usize;
        let mut s2 = s.clone();
        s2[ax] = (rng.next_u64() % 3) as usize;
        let y = rand_input(&mut rng, &s2, -1.0, 1.0);
        let axi = ax as isize - nd as isize;
        let f = fun(move |x| {
            let c = concatenate(&[&x[0], &x[1], &x[0].mul(3.0)?], axi)?;
            let st = stack(&[&x[0], &x[0].sin()?], -1)?;
            let parts = c.split_indices(&[1, 2], axi)?;
            Ok(vec![c, st, parts[0].clone(), parts[2].exp()?])
        });
        check(&format!("concatenate {s:?} {s2:?} axis {ax}"), f, vec![x.clone(), y], &mut rng);
        // take with repeated and negative indices, 2-d index arrays.
        let d = s[ax] as i64;
        if d > 0 {
            let idx: Vec<i64> = (0..6).map(|_| (rng.next_u64() % (2 * d as u64)) as i64 - d).collect();
            let ia = Array::from_slice(&idx, &[2, 3]).unwrap();
            check(
                &format!("take {s:?} axis {ax} {idx:?}"),
                fun(move |x| Ok(vec![x[0].take(&ia, axi)?])),
                vec![x.clone()],
                &mut rng,
            );
            let i = (rng.next_u64() % d as u64) as isize;
            check("index", fun(move |x| Ok(vec![x[0].index(axi, i)?])), vec![x], &mut rng);
        }
    }
}

/// `scatter_add`, `take_along_axis`, `put_along_axis` and `scatter_add_along_axis` with
/// repeated and negative indices (a put's overwritten values get no gradient), and `take`
/// of an embedding-like table whose vjp is a scatter-add, not a matrix product.
#[test]
fn scatter_rules_match_finite_differences() {
    let mut rng = Rng::new(12);
    for case in 0..12 {
        let s = shape(&mut rng, 1, 3, false);
        let nd = s.len();
        let ax = (rng.next_u64() % nd as u64) as usize;
        let axi = if case % 2 == 0 { ax as isize } else { ax as isize - nd as isize };
        let d = s[ax] as i64;
        // Indices from a range smaller than the axis now and then: repeats are certain.
        let span = if case % 3 == 0 { 1 } else { d };
        let mut pick = |n: usize| -> Vec<i64> {
            (0..n)
                .map(|_| (rng.next_u64() % span as u64) as i64 - if rng.next_u64().is_multiple_of(2) { d } else { 0 })
                .collect()
        };
        let flat = pick(4);
        let ia = Array::from_slice(&flat, &[2, 2]).unwrap();
        let mut gs = s[..ax].to_vec();
        gs.extend([2, 2]);
        gs.extend(&s[ax + 1..]);
        let mut is = s.clone();
        is[ax] = 1 + (case % 4);
        let along = pick(is.iter().product());
        let ib = Array::from_slice(&along, &is).unwrap();
        let x = rand_input(&mut rng, &s, -1.0, 1.0);
        let u = rand_input(&mut rng, &gs, -1.0, 1.0);
        let v = rand_input(&mut rng, &is, -1.0, 1.0);
        let (ia2, ib2, ib3, ib4) = (ia.clone(), ib.clone(), ib.clone(), ib.clone());
        check(
            &format!("scatter_add {s:?} axis {axi} {flat:?}"),
            fun(move |x| Ok(vec![x[0].scatter_add(&ia2, &x[1].sin()?, axi)?.square()?])),
            vec![x.clone(), u],
            &mut rng,
        );
        check(
            &format!("take_along_axis {s:?} axis {axi} {along:?}"),
            fun(move |x| Ok(vec![x[0].take_along_axis(&ib2, axi)?.mul(&x[1])?])),
            vec![x.clone(), v.clone()],
            &mut rng,
        );
        check(
            &format!("put_along_axis {s:?} axis {axi} {along:?}"),
            fun(move |x| Ok(vec![x[0].put_along_axis(&ib3, &x[1].exp()?, axi)?.mul(&x[0])?])),
            vec![x.clone(), v.clone()],
            &mut rng,
        );
        // Values broadcast from one element, and the adjoint pair's second order.
        let one = rand_input(&mut rng, &[1], -1.0, 1.0);
        check(
            &format!("scatter_add_along_axis {s:?} axis {axi} {along:?}"),
            fun(move |x| {
                let y = x[0].scatter_add_along_axis(&ib4, &x[1], axi)?;
                Ok(vec![y.square()?, y.take_along_axis(&ib4, axi)?])
            }),
            vec![x, one],
            &mut rng,
        );
    }
    // An embedding table: many repeated ids, negative ones too.
    let (vocab, dim) = (7, 3);
    let ids: Vec<i64> = (0..10).map(|_| (rng.next_u64() % 3) as i64 * 2 - (rng.next_u64() % 2) as i64 * 7).collect();
    let idx = Array::from_slice(&ids, &[2, 5]).unwrap();
    let table = rand_input(&mut rng, &[vocab, dim], -1.0, 1.0);
    let i2 = idx.clone();
    let lookup = fun(move |x| Ok(vec![x[0].take(&i2, 0)?.tanh()?]));
    check(&format!("embedding take {ids:?}"), lookup, vec![table.clone()], &mut rng);
    let i3 = idx.clone();
    let loss = move |x: &[Array]| Ok(vec![x[0].take(&i3, 0)?.square()?.sum_all()?]);
    let g = rill::grad(loss, &[0]);
    let c = rill::compile(move |x| g.call(x));
    let t = Array::from_slice(&table.vals, &[vocab, dim]).unwrap();
    let counts = c.primitive_counts(&[t]).unwrap();
    assert!(counts.contains_key("scatter_add"), "take's gradient scatters: {counts:?}");
    assert!(!counts.contains_key("matmul"), "take's gradient has no one-hot product: {counts:?}");
}

/// Attention's gradient (the rule recomputes the scores through ops) for generated head
/// groupings, lengths and masks, rows that attend nothing among them (a causal mask with
/// more queries than keys, a bool mask with an all-false row, a float mask of -inf).
#[test]
fn attention_rule_matches_finite_differences() {
    let mut rng = Rng::new(8);
    for case in 0..12 {
        let kind = case % 4;
        let (hkv, group) = (1 + case % 2, 1 + (case / 2) % 2);
        let (mut tq, tk, d, dv) = (1 + case % 3, 2 + case % 2, 2, 1 + case % 2);
        // From case 6 on, a row attends nothing: causal with more queries than keys (the
        // first row), or the last row under the array masks.
        let empty = case >= 6;
        if kind == 1 && empty {
            tq = tk + 1;
        }
        let empty_row = |i: usize| empty && i / tk == tq - 1;
        let hq = hkv * group;
        let q = rand_input(&mut rng, &[1, hq, tq, d], -1.0, 1.0);
        let k = rand_input(&mut rng, &[1, hkv, tk, d], -1.0, 1.0);
        let v = rand_input(&mut rng, &[1, hkv, tk, dv], -1.0, 1.0);
        let mut ins = vec![q, k, v];
        if kind == 3 {
            let mut m = rand_input(&mut rng, &[1, 1, tq, tk], -1.0, 1.0);
            for (i, x) in m.vals.iter_mut().enumerate() {
                if empty_row(i) {
                    *x = f64::NEG_INFINITY;
                }
            }
            ins.push(m);
        }
        let bools: Vec<bool> = (0..tq * tk).map(|i| i % 3 != 1 && !empty_row(i)).collect();
        let bm = Array::from_bools(&bools, &[tq, tk]).unwrap();
        let f = fun(move |x| {
            let mask = match kind {
                0 => AttentionMask::None,
                1 => AttentionMask::Causal,
                2 => AttentionMask::Array(&bm),
                _ => AttentionMask::Array(&x[3]),
            };
            Ok(vec![rill::scaled_dot_product_attention(
                &x[0],
                &x[1],
                &x[2],
                mask,
                if case % 5 == 4 { Some(0.7) } else { None },
            )?])
        });
        check(&format!("attention case {case}"), f, ins, &mut rng);
    }
}

/// Second order: the vjp and jvp of a gradient against finite differences of it.
#[test]
fn grad_of_grad() {
    let mut rng = Rng::new(9);
    let g =
        rill::grad(|x| Ok(vec![x[0].sin()?.mul(&x[0].square()?)?.add(&x[0].exp()?.mul(&x[1])?)?.sum_all()?]), &[0, 1]);
    let s = shape(&mut rng, 1, 2, false);
    let ins = vec![rand_input(&mut rng, &s, -1.0, 1.0), rand_input(&mut rng, &s, -1.0, 1.0)];
    check("grad of elementwise", fun(move |x| g.call(x)), ins, &mut rng);
    let g = rill::grad(|x| Ok(vec![x[0].matmul(&x[1])?.tanh()?.square()?.sum_all()?]), &[0, 1]);
    let ins = vec![rand_input(&mut rng, &[2, 3], -1.0, 1.0), rand_input(&mut rng, &[3, 2], -1.0, 1.0)];
    check("grad of matmul", fun(move |x| g.call(x)), ins, &mut rng);
}

fn mlp(x: &[Array]) -> Result<Vec<Array>> {
    let (w, b, xs, r) = (&x[0], &x[1], &x[2], &x[3]);
    let h = xs.matmul(w)?.add(b)?.relu()?;
    let h = h.add(r)?.layer_norm(None, None, 1e-5)?;
    let y = common::chain(&[h.clone(), h.mul(0.5)?])?.remove(0);
    Ok(vec![y.mean(&[], false)?])
}

fn mlp_inputs(rng: &mut Rng) -> Vec<Array> {
    let mut a = |s: &[usize]| Array::from_slice(&rng.vec(s.iter().product(), -1.0, 1.0), s).unwrap();
    vec![a(&[3, 4]), a(&[4]), a(&[5, 3]), a(&[5, 4])]
}

fn values(a: &[Array]) -> Vec<Vec<f64>> {
    a.iter().map(|a| a.to_f64_vec().unwrap()).collect()
}

/// `compile(grad(f))` and `grad(compile(f))` give eager `grad(f)`; the compiled `f`
/// holds fused nodes (a matmul block, a residual norm, elementwise programs), which the
/// gradient differentiates through the ops they replace.
#[test]
fn compile_and_grad_compose_both_ways() {
    let mut rng = Rng::new(10);
    let eager = rill::grad(mlp, &[0, 1, 2, 3]);
    let g2 = eager.clone();
    let compiled_grad = rill::compile(move |x| g2.call(x));
    let c = rill::compile(mlp);
    let grad_of_compiled = rill::grad(move |x| c.call(x), &[0, 1, 2, 3]);
    let c = rill::compile(mlp);
    let ins = mlp_inputs(&mut rng);
    let counts = c.primitive_counts(&ins).unwrap();
    assert!(counts.keys().any(|k| k.starts_with("fused")), "the compiled function fuses: {counts:?}");
    for _ in 0..2 {
        let ins = mlp_inputs(&mut rng);
        let want = values(&eager.call(&ins).unwrap());
        for (what, got) in [
            ("compile(grad)", compiled_grad.call(&ins).unwrap()),
            ("grad(compile)", grad_of_compiled.call(&ins).unwrap()),
        ] {
            for (g, w) in values(&got).iter().zip(&want) {
                assert!(common::same_values(g, w), "{what}: {g:?} vs {w:?}");
            }
        }
    }
    assert_eq!(compiled_grad.trace_count(), 1);
    // And grad(compile(f)) against finite differences, through the fused nodes.
    let c = rill::compile(mlp);
    let shapes: [&[usize]; 4] = [&[3, 4], &[4], &[5, 3], &[5, 4]];
    let ins = shapes.iter().map(|s| rand_input(&mut rng, s, -1.0, 1.0)).collect();
    check("compiled mlp", fun(move |x| c.call(x)), ins, &mut rng);
}

/// 32 threads and 64 tokio tasks take gradients of one shared function at once: each
/// equals the serial answer, and no stream or thread is created.
#[test]
fn gradients_from_many_threads_and_tasks() {
    let vg = rill::value_and_grad(mlp, &[0, 1]);
    let mut rng = Rng::new(11);
    let inputs: Vec<Vec<Array>> = (0..64).map(|_| mlp_inputs(&mut rng)).collect();
    let serial: Vec<(Vec<f64>, Vec<Vec<f64>>)> = inputs
        .iter()
        .map(|ins| {
            let (v, g) = vg.call(ins).unwrap();
            (v.to_f64_vec().unwrap(), values(&g))
        })
        .collect();
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(4).build().unwrap();
    let before = rill::runtime::stats();
    common::on_threads(32, |k| {
        let (v, g) = vg.call(&inputs[k as usize]).unwrap();
        assert_eq!(v.to_f64_vec().unwrap(), serial[k as usize].0);
        assert_eq!(values(&g), serial[k as usize].1);
    });
    let inputs = Arc::new(inputs);
    let serial = Arc::new(serial);
    rt.block_on(async {
        let tasks: Vec<_> = (0..64)
            .map(|k| {
                let (vg, inputs, serial) = (vg.clone(), inputs.clone(), serial.clone());
                tokio::spawn(async move {
                    let (v, g) = vg.call(&inputs[k]).unwrap();
                    rill::async_eval(std::slice::from_ref(&v)).await.unwrap();
                    tokio::task::yield_now().await;
                    assert_eq!(v.to_f64_vec().unwrap(), serial[k].0);
                    assert_eq!(values(&g), serial[k].1);
                })
            })
            .collect();
        for t in tasks {
            t.await.unwrap();
        }
    });
    let after = rill::runtime::stats();
    assert_eq!(after.streams_created, before.streams_created, "no stream created");
    assert_eq!(after.threads_started, before.threads_started, "no thread created");
}

fn expect_err<T: std::fmt::Debug>(r: Result<T>, what: &str, ok: impl Fn(&Error) -> bool) {
    match r {
        Err(e) => assert!(ok(&e), "{what}: unexpected error {e}"),
        Ok(v) => panic!("{what}: expected an error, got {v:?}"),
    }
}

#[test]
fn bad_input_gives_errors() {
    let x = Array::from_slice(&[1.0, 2.0, 3.0], &[3]).unwrap();
    let i = Array::from_slice(&[1i32, 2, 3], &[3]).unwrap();
    let id = |x: &[Array]| Ok(vec![x[0].sin()?]);
    let dt = |e: &Error| matches!(e, Error::DType { .. });
    let sh = |e: &Error| matches!(e, Error::Shape { .. });
    let inv = |e: &Error| matches!(e, Error::InvalidArgument { .. });
    expect_err(rill::vjp(id, std::slice::from_ref(&i), std::slice::from_ref(&x)), "integer primal", dt);
    expect_err(rill::jvp(id, std::slice::from_ref(&i), std::slice::from_ref(&i)), "integer primal (jvp)", dt);
    expect_err(rill::grad(id, &[0]).call(std::slice::from_ref(&i)), "integer input of grad", dt);
    expect_err(rill::grad(id, &[0]).call(std::slice::from_ref(&x)), "grad of a non-scalar", sh);
    expect_err(
        rill::grad(|x| Ok(vec![x[0].sum_all()?]), &[1]).call(std::slice::from_ref(&x)),
        "argnums out of range",
        inv,
    );
    expect_err(rill::grad(|x| Ok(vec![x[0].sum_all()?]), &[]).call(std::slice::from_ref(&x)), "argnums empty", inv);
    expect_err(
        rill::grad(|x| Ok(vec![x[0].sum_all()?]), &[0, 0]).call(std::slice::from_ref(&x)),
        "argnums repeated",
        inv,
    );
    expect_err(
        rill::grad(|x| Ok(vec![x[0].sum_all()?, x[0].sum_all()?]), &[0]).call(std::slice::from_ref(&x)),
        "two outputs",
        inv,
    );
    let int_out = |x: &[Array]| Ok(vec![x[0].argmax(0, false)?]);
    expect_err(rill::vjp(int_out, std::slice::from_ref(&x), std::slice::from_ref(&i)), "integer output", dt);
    expect_err(rill::grad(int_out, &[0]).call(std::slice::from_ref(&x)), "integer output of grad", dt);
    let x2 = Array::zeros(&[2], DType::F64).unwrap();
    expect_err(rill::vjp(id, std::slice::from_ref(&x), std::slice::from_ref(&x2)), "cotangent shape", sh);
    expect_err(rill::vjp(id, std::slice::from_ref(&x), &[x.astype(DType::F32).unwrap()]), "cotangent dtype", dt);
    expect_err(rill::vjp(id, std::slice::from_ref(&x), &[]), "cotangent count", inv);
    expect_err(rill::jvp(id, std::slice::from_ref(&x), &[x2]), "tangent shape", sh);
    expect_err(rill::jvp(id, std::slice::from_ref(&x), &[]), "tangent count", inv);
    // A primitive without a rule names itself; an error or panic of f comes back.
    let host = |x: &[Array]| {
        Ok(vec![rill::custom("my_host_fn", &[&x[0]], x[0].shape(), DType::F64, |v: &[Vec<f64>]| Ok(v[0].clone()))?])
    };
    expect_err(rill::vjp(host, std::slice::from_ref(&x), std::slice::from_ref(&x)), "host callback", |e| {
        matches!(e, Error::Unsupported { op: "my_host_fn", .. })
    });
    expect_err(
        rill::vjp(|x| Ok(vec![x[0].reshape(&[7])?]), std::slice::from_ref(&x), std::slice::from_ref(&x)),
        "f's error",
        sh,
    );
    expect_err(
        rill::vjp(
            |_: &[Array]| -> Result<Vec<Array>> { panic!("boom") },
            std::slice::from_ref(&x),
            std::slice::from_ref(&x),
        ),
        "f panics",
        |e| matches!(e, Error::Panic { .. }),
    );
    expect_err(
        rill::vjp(
            |x| {
                x[0].eval()?;
                Ok(vec![x[0].clone()])
            },
            std::slice::from_ref(&x),
            std::slice::from_ref(&x),
        ),
        "f evaluates",
        |_| true,
    );
}

/// The body a checkpoint wraps in these tests: a product and several elementwise ops,
/// bounded, so that chains of it stay finite.
fn segment(x: &Array, w: &Array) -> Result<Array> {
    x.matmul(w)?.tanh()?.mul(&x.sin()?)?.add(x)?.tanh()
}

/// `checkpoint` against finite differences: one with two outputs, checkpoints nested and
/// chained (the same function called twice), and one with an integer input.
#[test]
fn checkpoint_rules_match_finite_differences() {
    let mut rng = Rng::new(21);
    let ck = rill::checkpoint(|x: &[Array]| Ok(vec![segment(&x[0], &x[1])?, x[0].cos()?.mul(&x[1].sum_all()?)?]));
    let c = ck.clone();
    let ins = |rng: &mut Rng| vec![rand_input(rng, &[2, 3], -1.0, 1.0), rand_input(rng, &[3, 3], -1.0, 1.0)];
    check("checkpoint with two outputs", fun(move |x| c.call(x)), ins(&mut rng), &mut rng);
    let c = ck.clone();
    let chained = fun(move |x| {
        let h = c.call(x)?.remove(0);
        let [a, b] = <[Array; 2]>::try_from(c.call(&[h, x[1].clone()])?).unwrap();
        Ok(vec![a.mul(&b)?.sum_all()?])
    });
    check("checkpoints chained", chained, ins(&mut rng), &mut rng);
    let c = ck.clone();
    let outer = rill::checkpoint(move |x: &[Array]| {
        let h = c.call(x)?;
        Ok(vec![h[0].exp()?.add(&h[1])?])
    });
    check("checkpoints nested", fun(move |x| outer.call(x)), ins(&mut rng), &mut rng);
    let gather = rill::checkpoint(|x: &[Array]| Ok(vec![x[0].take(&x[1], 0)?.sin()?.square()?, x[1].clone()]));
    let with_indices = fun(move |x| {
        let idx = Array::from_slice(&[2i32, 0, 2, 1], &[4])?;
        let out = gather.call(&[x[0].clone(), idx])?;
        assert_eq!(out[1].dtype(), DType::I32, "an integer output passes through");
        Ok(vec![out[0].clone()])
    });
    check("checkpoint with an integer input", with_indices, vec![rand_input(&mut rng, &[3, 2], -1.0, 1.0)], &mut rng);
}

/// A checkpointed function's gradients equal the plain ones (the recomputation runs the
/// same ops), eager, under `compile` in both orders, and to second order.
#[test]
fn checkpoint_gradients_equal_the_plain_ones() {
    let mut rng = Rng::new(22);
    let layers = |f: Fun| {
        fun(move |x: &[Array]| {
            let mut h = x[0].clone();
            for _ in 0..3 {
                h = f(&[h, x[1].clone()])?.remove(0);
            }
            Ok(vec![h.square()?.mean(&[], false)?])
        })
    };
    let plain = layers(fun(|x| Ok(vec![segment(&x[0], &x[1])?])));
    let ck = rill::checkpoint(|x: &[Array]| Ok(vec![segment(&x[0], &x[1])?]));
    let with = layers(fun(move |x| ck.call(x)));
    let (p, w) = (plain.clone(), with.clone());
    let g_plain = rill::grad(move |x| p(x), &[0, 1]);
    let g_with = rill::grad(move |x| w(x), &[0, 1]);
    let g = g_with.clone();
    let compiled_grad = rill::compile(move |x| g.call(x));
    let w = with.clone();
    let c = rill::compile(move |x| w(x));
    let grad_of_compiled = rill::grad(move |x| c.call(x), &[0, 1]);
    for dtype in [DType::F32, DType::F64] {
        for _ in 0..2 {
            let x = Array::from_slice(&rng.vec(4 * 5, -1.0, 1.0), &[4, 5]).unwrap().astype(dtype).unwrap();
            let m = Array::from_slice(&rng.vec(25, -0.5, 0.5), &[5, 5]).unwrap().astype(dtype).unwrap();
            let ins = [x, m];
            let want = values(&g_plain.call(&ins).unwrap());
            let got = values(&g_with.call(&ins).unwrap());
            assert_eq!(got, want, "{dtype}: checkpointed gradients differ from the plain ones");
            for (what, got) in [
                ("compile(grad)", compiled_grad.call(&ins).unwrap()),
                ("grad(compile)", grad_of_compiled.call(&ins).unwrap()),
            ] {
                for (g, w) in values(&got).iter().zip(&want) {
                    assert!(common::same_values(g, w), "{dtype} {what}: {g:?} vs {w:?}");
                }
            }
        }
    }
    // Second order through the recomputation.
    let g = rill::grad(move |x| with(x), &[0]);
    let ins = vec![rand_input(&mut rng, &[2, 3], -1.0, 1.0), rand_input(&mut rng, &[3, 3], -0.5, 0.5)];
    check("grad of a checkpointed function", fun(move |x| g.call(x)), ins, &mut rng);
}

const CHILD: &str = "RILL_AUTODIFF_TEST_CHILD";

/// The reverse pass of a checkpointed chain holds less memory at its peak than the plain
/// one: it keeps each segment's input, not the values inside the segments. Peak memory is
/// process-wide, so this runs alone in a child process.
#[test]
fn checkpoint_lowers_peak_memory() {
    const NAME: &str = "checkpoint_lowers_peak_memory";
    if std::env::var(CHILD).as_deref() != Ok(NAME) {
        let out = std::process::Command::new(std::env::current_exe().unwrap())
            .args([NAME, "--exact", "--test-threads=1", "--nocapture"])
            .env(CHILD, NAME)
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        eprint!("{}", String::from_utf8_lossy(&out.stderr));
        print!("{stdout}");
        assert!(out.status.success() && stdout.contains("1 passed"), "the child failed: {}", out.status);
        return;
    }
    // On the CPU, whose batches free each value once its last reader ran (a GPU batch
    // keeps its values until it is sealed, which blurs the measure).
    let cpu = rill::Stream::new(&rill::Device::cpu()).unwrap();
    let _on_cpu = cpu.enter();
    // Elementwise ops on 4 MiB arrays: each keeps its inputs for the reverse pass.
    let seg = |x: &Array| -> Result<Array> { x.sin()?.mul(x)?.add(x)?.tanh()?.mul(&x.cos()?)?.tanh() };
    let chain = |f: Fun| {
        fun(move |x: &[Array]| {
            let mut h = x[0].clone();
            for _ in 0..6 {
                h = f(&[h])?.remove(0);
            }
            Ok(vec![h.sum_all()?])
        })
    };
    let plain = chain(fun(move |x| Ok(vec![seg(&x[0])?])));
    let ck = rill::checkpoint(move |x: &[Array]| Ok(vec![seg(&x[0])?]));
    let with = chain(fun(move |x| ck.call(x)));
    let n = 1 << 20;
    let mut rng = Rng::new(23);
    let x = Array::from_slice(&rng.vec(n, -1.0, 1.0).iter().map(|&v| v as f32).collect::<Vec<_>>(), &[n]).unwrap();
    x.eval().unwrap();
    let mut peaks = Vec::new();
    let mut grads = Vec::new();
    for f in [plain, with] {
        let base = rill::runtime::active_memory();
        rill::runtime::reset_peak_memory();
        let (v, g) = rill::value_and_grad(move |x| f(x), &[0]).call(std::slice::from_ref(&x)).unwrap();
        rill::eval(&[v.clone(), g[0].clone()]).unwrap();
        peaks.push(rill::runtime::peak_memory() - base);
        grads.push(g[0].to_vec::<f32>().unwrap());
    }
    println!("peak above the input: plain {} MiB, checkpointed {} MiB", peaks[0] >> 20, peaks[1] >> 20);
    assert_eq!(grads[0], grads[1], "the checkpointed gradient differs");
    // Checkpointed: the six segments' outputs, and one segment recomputed at a time with
    // its cotangents (a recomputation run before its cotangent exists pushes it past).
    let mib = 1usize << 20;
    assert!(
        peaks[1] <= (6 + 5) * 4 * mib && (peaks[1] as f64) < 0.6 * peaks[0] as f64,
        "checkpointing should lower the peak: plain {} bytes, checkpointed {} bytes",
        peaks[0],
        peaks[1]
    );
}

/// `rope` and `slice_update` against finite differences: both layouts, partial rotation,
/// 0-d and per-row positions; starts 0-d and per row, in range and clamped (negative, past
/// the end), along inner and outer axes, on strided inputs.
#[test]
fn decode_rules_match_finite_differences() {
    use rill::{RopeLayout, RopeOptions};
    let mut rng = Rng::new(24);
    for (case, layout) in [RopeLayout::Interleaved, RopeLayout::Halves].into_iter().enumerate() {
        for per_row in [false, true] {
            let (b, h, t, d) = (2usize, 2usize, 3usize, 6usize);
            let dims = if case == 0 { 6 } else { 4 };
            let opts = RopeOptions { dims, base: 100.0, scale: 0.5 + case as f64, layout };
            let off: Vec<i32> = if per_row { vec![3, 11] } else { vec![7] };
            let f = fun(move |x| {
                let o = if per_row { Array::from_slice(&off, &[2])? } else { Array::from_slice(&off, &[])? };
                Ok(vec![x[0].rope(&o, opts)?])
            });
            let name = format!("rope {layout:?} dims {dims} per_row {per_row}");
            check(&name, f, vec![rand_input(&mut rng, &[b, h, t, d], -1.0, 1.0)], &mut rng);
        }
    }
    // (x shape, update length, axis, starts): 0-d or one per leading row, some clamped.
    let cases: [(&[usize], usize, isize, &[i64]); 6] = [
        (&[5, 3], 2, 0, &[1]),
        (&[5, 3], 2, 0, &[9]),
        (&[2, 3, 6, 2], 3, 2, &[-4]),
        (&[2, 3, 6, 2], 3, 2, &[0, 5]),
        (&[3, 4, 2], 2, -2, &[2, 1, -1]),
        (&[2, 5], 1, 1, &[4, 0]),
    ];
    for (shape, len, axis, starts) in cases {
        let mut ushape = shape.to_vec();
        let ax = if axis < 0 { (shape.len() as isize + axis) as usize } else { axis as usize };
        ushape[ax] = len;
        let starts = starts.to_vec();
        let f = fun(move |x| {
            let s = if starts.len() == 1 {
                Array::from_slice(&starts, &[])?
            } else {
                Array::from_slice(&starts, &[starts.len()])?
            };
            Ok(vec![x[0].slice_update(&x[1], &s, axis)?.sin()?])
        });
        let ins = vec![rand_input(&mut rng, shape, -1.0, 1.0), rand_input(&mut rng, &ushape, -1.0, 1.0)];
        check(&format!("slice_update {shape:?} axis {axis}"), f, ins, &mut rng);
    }
}
