//! `compile` fuses a reduction that follows an elementwise group (`FusedReduce`): results
//! against a float64 reference, equal to the uncompiled graph (bit for bit on the CPU),
//! on every reduction layout, and not fused where the group's values are needed elsewhere.
//! On a GPU, the layouts that read as rows (reduced axes last, every input contiguous or
//! broadcast along them) must run as one kernel (`stats().fused_reduce_kernels`).

mod common;

use common::{Rng, array_of, assert_close, devices, on, tol};
use rill::{Array, DType, Device, compile};

#[derive(Clone, Copy, Debug)]
enum Op {
    Sum,
    Max,
    Min,
    Prod,
}

fn reduce(x: &Array, op: Op, axes: &[isize]) -> rill::Result<Array> {
    match op {
        Op::Sum => x.sum(axes, false),
        Op::Max => x.max(axes, false),
        Op::Min => x.min(axes, false),
        Op::Prod => x.prod(axes, false),
    }
}

/// The traced function: an elementwise group (with `b` broadcast along the last axis)
/// followed by a reduction.
fn body(x: &[Array], op: Op, axes: &[isize]) -> rill::Result<Array> {
    let y = x[0].mul(&x[1])?.add(0.5)?.tanh()?.mul(&x[0])?;
    reduce(&y, op, axes)
}

fn elem_ref(a: f64, b: f64) -> f64 {
    (a * b + 0.5).tanh() * a
}

/// Float64 reference: the elementwise values, reduced over `axes` (kept dims dropped).
fn reference(a: &[f64], b: &[f64], shape: &[usize], axes: &[usize], op: Op) -> Vec<f64> {
    let last = *shape.last().unwrap_or(&1);
    let out_dims: Vec<usize> = (0..shape.len()).filter(|d| !axes.contains(d)).collect();
    let n_out: usize = out_dims.iter().map(|&d| shape[d]).product();
    let init = match op {
        Op::Sum => 0.0,
        Op::Prod => 1.0,
        Op::Max => f64::NEG_INFINITY,
        Op::Min => f64::INFINITY,
    };
    let mut out = vec![init; n_out];
    for (i, &av) in a.iter().enumerate() {
        let v = elem_ref(av, b[if last == 0 { 0 } else { i % last }]);
        // Multi-index of element i, then the flat index among the kept axes.
        let (mut rem, mut idx) = (i, vec![0usize; shape.len()]);
        for d in (0..shape.len()).rev() {
            idx[d] = rem % shape[d];
            rem /= shape[d];
        }
        let o = out_dims.iter().fold(0, |acc, &d| acc * shape[d] + idx[d]);
        out[o] = match op {
            Op::Sum => out[o] + v,
            Op::Prod => out[o] * v,
            Op::Max => out[o].max(v),
            Op::Min => out[o].min(v),
        };
    }
    out
}

/// True when the graph of `a` holds a node named `name`.
fn graph_has(a: &Array, name: &str) -> bool {
    let mut stack = vec![a.clone()];
    let mut seen = std::collections::HashSet::new();
    while let Some(x) = stack.pop() {
        if !seen.insert(x.id()) {
            continue;
        }
        if x.primitive().name() == name {
            return true;
        }
        stack.extend(x.inputs());
    }
    false
}

/// Every layout the CPU reduction distinguishes: trailing rows (short and long), one long
/// row split into blocks, leading and middle blocks with few or many slabs, every axis,
/// separated axes (the stored fallback) and empty shapes; then the GPU's launch shapes for
/// trailing rows (a warp per short row above, a block per long row, a few long rows split
/// over blocks).
const CASES: &[(&[usize], &[usize])] = &[
    (&[64, 33], &[1]),
    (&[3, 70_000], &[1]),
    (&[140_000], &[0]),
    (&[300, 200], &[0]),
    (&[5, 4000, 7], &[1]),
    (&[2, 40_000, 3], &[1]),
    (&[40, 900, 5], &[1]),
    (&[50, 60], &[0, 1]),
    (&[4, 5, 6], &[0, 2]),
    (&[0, 5], &[1]),
    (&[5, 0], &[1]),
    (&[300, 1500], &[1]),
    (&[4, 20_000], &[1]),
];

/// True when the GPU computes `body` reduced over `axes` with one kernel: the reduced
/// axes are last, and `b` (broadcast along the leading axes) merges with them, which it
/// does only when a single reduced axis is longer than 1.
fn single_kernel_on_gpu(shape: &[usize], axes: &[usize]) -> bool {
    let nd = shape.len();
    let trailing = axes.iter().enumerate().all(|(i, &a)| a == nd - axes.len() + i);
    let long_axes = axes.iter().filter(|&&a| shape[a] > 1).count();
    shape.iter().all(|&d| d > 0) && trailing && long_axes == 1
}

/// Runs `f` and, on a GPU, asserts that it ran a fused reduction as one kernel when
/// `single` (other tests may run fused reductions at the same time, so a fallback cannot
/// be told apart by the counter; only the single kernel is checked).
fn expect_single<R>(device: Device, single: bool, what: &str, f: impl FnOnce() -> R) -> R {
    let before = rill::runtime::stats().fused_reduce_kernels;
    let r = f();
    if device.is_gpu() && single {
        let after = rill::runtime::stats().fused_reduce_kernels;
        assert!(after > before, "{what}: the fused reduction did not run as one kernel");
    }
    r
}

fn check(device: Device, dtype: DType, op: Op, shape: &[usize], axes: &[usize], rng: &mut Rng) {
    let n: usize = shape.iter().product();
    let last = *shape.last().unwrap_or(&1);
    // Positive values keep sums well conditioned; products stay near 1.
    let (lo, hi) = if matches!(op, Op::Prod) { (0.9, 1.1) } else { (0.2, 1.5) };
    let (a, a64) = array_of(&rng.vec(n, lo, hi), shape, dtype);
    let (b, b64) = array_of(&rng.vec(last, 0.5, 1.0), &[last], dtype);
    let iaxes: Vec<isize> = axes.iter().map(|&d| d as isize).collect();
    let what = format!("{device} {dtype} {op:?} {shape:?} over {axes:?}");
    on(device, || {
        let ax = iaxes.clone();
        let f = compile(move |x: &[Array]| Ok(vec![body(x, op, &ax)?]));
        let out = f.call(&[a.clone(), b.clone()]).unwrap().remove(0);
        assert!(graph_has(&out, "fused_reduce"), "{what}: no fused_reduce node in the compiled graph");
        let got = expect_single(device, single_kernel_on_gpu(shape, axes), &what, || out.to_f64_vec().unwrap());
        let plain = body(&[a.clone(), b.clone()], op, &iaxes).unwrap().to_f64_vec().unwrap();
        if device == Device::cpu() {
            // Same values, same combination order: the same bits.
            let (g, p): (Vec<u64>, Vec<u64>) =
                (got.iter().map(|v| v.to_bits()).collect(), plain.iter().map(|v| v.to_bits()).collect());
            assert_eq!(g, p, "{what}: compiled differs from uncompiled");
        } else {
            assert_close(&got, &plain, tol(dtype), &format!("{what} (vs uncompiled)"));
        }
        let want = reference(&a64, &b64, shape, axes, op);
        // A sum of k terms rounds k times; the reference does not round at all.
        let red: usize = axes.iter().map(|&d| shape[d]).product();
        let t = tol(dtype) * if matches!(op, Op::Sum | Op::Prod) { 1.0 + (red as f64).sqrt() } else { 1.0 };
        assert_close(&got, &want, t, &what);
    });
}

#[test]
fn fused_reductions_match_reference_and_uncompiled() {
    let mut rng = Rng::new(41);
    for device in devices() {
        for &(shape, axes) in CASES {
            // max and min of nothing are errors (no identity): only sums reduce [5, 0].
            let empty = axes.iter().any(|&d| shape[d] == 0);
            for op in [Op::Sum, Op::Max, Op::Min] {
                if !(empty && matches!(op, Op::Max | Op::Min)) {
                    check(device, DType::F32, op, shape, axes, &mut rng);
                }
            }
        }
        for (shape, axes) in [(&[6usize, 12][..], &[1usize][..]), (&[7, 5, 3], &[1])] {
            check(device, DType::F32, Op::Prod, shape, axes, &mut rng);
        }
        for dtype in [DType::F64, DType::F16, DType::BF16] {
            // Sums stay below f16's largest value (65504).
            for &(shape, axes) in [CASES[0], CASES[3], CASES[5], CASES[11], CASES[12]].iter() {
                check(device, dtype, Op::Sum, shape, axes, &mut rng);
                check(device, dtype, Op::Max, shape, axes, &mut rng);
            }
        }
    }
}

/// Inputs broadcast along the reduced axis (a column and a 0-d input, read once per row
/// on the GPU) and a full reduction of a large 3-d array (split over many blocks).
#[test]
fn broadcast_inputs_and_full_reductions() {
    let mut rng = Rng::new(11);
    let (rows, cols) = (300, 1500);
    for device in devices() {
        for dtype in [DType::F32, DType::F64, DType::BF16] {
            let (x, x64) = array_of(&rng.vec(rows * cols, -1.0, 1.0), &[rows, cols], dtype);
            let (c, c64) = array_of(&rng.vec(rows, -0.5, 0.5), &[rows, 1], dtype);
            let (s, s64) = array_of(&[0.75], &[], dtype);
            let what = format!("{device} {dtype} ((x - c) * s)^2 row sums and maxima");
            on(device, || {
                // Two functions: in one, the shared `(x - c) * s` would be computed once.
                let fs = compile(|x: &[Array]| Ok(vec![x[0].sub(&x[1])?.mul(&x[2])?.square()?.sum(&[-1], false)?]));
                let fm = compile(|x: &[Array]| Ok(vec![x[0].sub(&x[1])?.mul(&x[2])?.max(&[1], true)?]));
                let args = [x.clone(), c.clone(), s.clone()];
                let outs = [fs.call(&args).unwrap().remove(0), fm.call(&args).unwrap().remove(0)];
                assert!(graph_has(&outs[0], "fused_reduce") && graph_has(&outs[1], "fused_reduce"), "{what}");
                assert_eq!(outs[1].shape(), &[rows, 1]);
                let (sum, max) = expect_single(device, true, &what, || {
                    (outs[0].to_f64_vec().unwrap(), outs[1].to_f64_vec().unwrap())
                });
                let v = |r: usize, j: usize| (x64[r * cols + j] - c64[r]) * s64[0];
                let want_sum: Vec<f64> = (0..rows).map(|r| (0..cols).map(|j| v(r, j) * v(r, j)).sum()).collect();
                let want_max: Vec<f64> =
                    (0..rows).map(|r| (0..cols).map(|j| v(r, j)).fold(f64::NEG_INFINITY, f64::max)).collect();
                // bf16 rounds the difference, the product and the square before summing.
                let t = if dtype == DType::BF16 { 3.0 * tol(dtype) } else { tol(dtype) * 40.0 };
                assert_close(&sum, &want_sum, t, &what);
                assert_close(&max, &want_max, 2.0 * tol(dtype), &what);
            });
        }
        let shape = [16, 256, 256];
        let n: usize = shape.iter().product();
        let (x, x64) = array_of(&rng.vec(n, -1.0, 1.0), &shape, DType::F32);
        let what = format!("{device} full sum of squares of {shape:?}");
        on(device, || {
            let f = compile(|x: &[Array]| Ok(vec![x[0].square()?.sum(&[0, 1, 2], false)?]));
            let out = f.call(std::slice::from_ref(&x)).unwrap().remove(0);
            assert!(graph_has(&out, "fused_reduce"), "{what}");
            let got = expect_single(device, true, &what, || out.to_f64_vec().unwrap());
            let want: f64 = x64.iter().map(|v| v * v).sum();
            assert_close(&got, &[want], 1e-4, &what);
        });
    }
}

/// `mean` (a sum then a scale) and a softmax-style `exp(x - c)` sum also fuse.
#[test]
fn mean_and_exp_sums_fuse() {
    let mut rng = Rng::new(7);
    for device in devices() {
        let (x, x64) = array_of(&rng.vec(8 * 3000, -2.0, 2.0), &[8, 3000], DType::F32);
        on(device, || {
            let f = compile(|x: &[Array]| Ok(vec![x[0].sub(1.0)?.exp()?.mean(&[-1], true)?]));
            let out = f.call(std::slice::from_ref(&x)).unwrap().remove(0);
            assert!(graph_has(&out, "fused_reduce"), "{device}: mean of exp did not fuse");
            assert_eq!(out.shape(), &[8, 1]);
            let want: Vec<f64> =
                x64.chunks(3000).map(|r| r.iter().map(|v| (v - 1.0).exp()).sum::<f64>() / 3000.0).collect();
            assert_close(&out.to_f64_vec().unwrap(), &want, 1e-4, &format!("{device} mean(exp)"));
        });
    }
}

/// The group's values are not fused into the reduction when something else needs them:
/// when they are an output too, or feed another op.
#[test]
fn values_needed_elsewhere_are_not_fused_into_the_reduction() {
    let mut rng = Rng::new(3);
    for device in devices() {
        let (a, a64) = array_of(&rng.vec(4 * 50, 0.2, 1.5), &[4, 50], DType::F32);
        let (b, b64) = array_of(&rng.vec(50, 0.5, 1.0), &[50], DType::F32);
        on(device, || {
            let both = compile(|x: &[Array]| {
                let y = x[0].mul(&x[1])?.add(0.5)?.tanh()?.mul(&x[0])?;
                Ok(vec![y.sum(&[1], false)?, y])
            });
            let outs = both.call(&[a.clone(), b.clone()]).unwrap();
            assert!(!graph_has(&outs[0], "fused_reduce"), "{device}: an output was fused away");
            let want = reference(&a64, &b64, &[4, 50], &[1], Op::Sum);
            assert_close(&outs[0].to_f64_vec().unwrap(), &want, 1e-4, &format!("{device} sum with values out"));
            let vals: Vec<f64> = a64.iter().enumerate().map(|(i, &v)| elem_ref(v, b64[i % 50])).collect();
            assert_close(&outs[1].to_f64_vec().unwrap(), &vals, tol(DType::F32), &format!("{device} values"));

            let shared = compile(|x: &[Array]| {
                let y = x[0].mul(&x[1])?.add(0.5)?.tanh()?.mul(&x[0])?;
                Ok(vec![y.sum(&[1], false)?.add(&y.max(&[1], false)?)?])
            });
            let out = shared.call(&[a.clone(), b.clone()]).unwrap().remove(0);
            assert!(!graph_has(&out, "fused_reduce"), "{device}: values used twice were fused into one reduction");
            let s = reference(&a64, &b64, &[4, 50], &[1], Op::Sum);
            let m = reference(&a64, &b64, &[4, 50], &[1], Op::Max);
            let want: Vec<f64> = s.iter().zip(&m).map(|(s, m)| s + m).collect();
            assert_close(&out.to_f64_vec().unwrap(), &want, 1e-4, &format!("{device} sum + max"));
        });
    }
}
