//! Reductions and arg-reductions over any axes, in every dtype and on views, against a
//! float64 reference computed here (on the CPU, and on GPU 0 when there is one; a missing
//! GPU prints "skipped: no GPU", and is a failure with `RILL_REQUIRE_GPU=1`). Cases are
//! generated: ranks 1-5, odd sizes and size-1 axes, first/middle/last/several/all and
//! negative axes, keepdims, transposed and sliced (misaligned, stepped) views, ties and
//! NaNs for the arg-reductions, and a run-to-run bit-identity check.

mod common;

use common::{Rng, devices, on};
use rill::{Array, DType, Device};

const FLOATS: [DType; 4] = [DType::F32, DType::F16, DType::BF16, DType::F64];
const INTS: [DType; 4] = [DType::I32, DType::I64, DType::U8, DType::U32];

#[derive(Debug, Clone, Copy, PartialEq)]
enum Op {
    Sum,
    Prod,
    Max,
    Min,
    ArgMax,
    ArgMin,
    Mean,
}

/// How the reduced array is made from its base.
#[derive(Debug, Clone)]
enum View {
    Plain,
    /// `base.transpose(perm)`.
    Transposed(Vec<usize>),
    /// Axis `axis` of the base is `2 * len + 1` long (step 2) or `len + 1` (step 1), read
    /// from element 1.
    Sliced {
        axis: usize,
        step: isize,
    },
}

#[derive(Debug, Clone)]
struct Case {
    /// The logical shape of the reduced array.
    shape: Vec<usize>,
    view: View,
    dtype: DType,
    op: Op,
    /// As given to the op (may be negative; empty = all for the reductions).
    axes: Vec<isize>,
    keepdims: bool,
    /// Values drawn from a few integers (ties), with some NaNs for floats.
    ties: bool,
    nans: bool,
}

fn norm(axes: &[isize], nd: usize) -> Vec<usize> {
    if axes.is_empty() {
        return (0..nd).collect();
    }
    let mut v: Vec<usize> = axes.iter().map(|&a| if a < 0 { (a + nd as isize) as usize } else { a as usize }).collect();
    v.sort();
    v.dedup();
    v
}

/// Machine epsilon of a dtype's rounding (0 for integers).
fn eps(d: DType) -> f64 {
    match d {
        DType::F64 => f64::EPSILON,
        DType::F32 => f32::EPSILON as f64,
        DType::F16 => 2f64.powi(-10),
        DType::BF16 => 2f64.powi(-7),
        _ => 0.0,
    }
}

/// Values for the base array of a case (rounded to the dtype by the array).
fn values(c: &Case, n: usize, rng: &mut Rng) -> Vec<f64> {
    let int = !c.dtype.is_float();
    let unsigned = matches!(c.dtype, DType::U8 | DType::U32);
    (0..n)
        .map(|_| {
            if c.nans && rng.uniform(0.0, 1.0) < 0.05 {
                return f64::NAN;
            }
            match c.op {
                // Near 1 so long products stay finite; integers from {1, 1, 2} or {-1, 1}.
                Op::Prod if int => {
                    if unsigned {
                        [1.0, 1.0, 2.0][(rng.next_u64() % 3) as usize]
                    } else {
                        [1.0, -1.0, 1.0][(rng.next_u64() % 3) as usize]
                    }
                }
                Op::Prod => rng.uniform(0.95, 1.05),
                _ if c.ties || int => {
                    let k = (rng.next_u64() % 7) as f64;
                    if unsigned { k } else { k - 3.0 }
                }
                _ => rng.uniform(-2.0, 2.0),
            }
        })
        .collect()
}

/// The reduced array of a case on the current device, from the base values.
fn build(c: &Case, base_shape: &[usize], vals: &[f64]) -> Array {
    let base = Array::from_slice(vals, base_shape).unwrap().astype(c.dtype).unwrap();
    match &c.view {
        View::Plain => base,
        View::Transposed(p) => base.transpose(p).unwrap(),
        View::Sliced { axis, step } => base.slice_axis(*axis as isize, Some(1), None, *step).unwrap(),
    }
}

/// The base shape whose view has the case's shape.
fn base_shape(c: &Case) -> Vec<usize> {
    match &c.view {
        View::Plain => c.shape.clone(),
        View::Transposed(p) => {
            // transpose(p) gives shape[i] = base[p[i]].
            let mut b = vec![0; p.len()];
            for (i, &pi) in p.iter().enumerate() {
                b[pi] = c.shape[i];
            }
            b
        }
        View::Sliced { axis, step } => {
            let mut b = c.shape.clone();
            b[*axis] = if *step == 2 { 2 * c.shape[*axis] + 1 } else { c.shape[*axis] + 1 };
            b
        }
    }
}

fn apply(c: &Case, x: &Array) -> Array {
    let a = &c.axes;
    match c.op {
        Op::Sum => x.sum(a, c.keepdims),
        Op::Prod => x.prod(a, c.keepdims),
        Op::Max => x.max(a, c.keepdims),
        Op::Min => x.min(a, c.keepdims),
        Op::ArgMax => x.argmax(a[0], c.keepdims),
        Op::ArgMin => x.argmin(a[0], c.keepdims),
        Op::Mean => x.mean(a, c.keepdims),
    }
    .unwrap()
}

/// The float64 reference of a case over the view's row-major values `x`: (shape, values,
/// tolerance of each value).
fn reference(c: &Case, x: &[f64]) -> (Vec<usize>, Vec<f64>, Vec<f64>) {
    let nd = c.shape.len();
    let axes = norm(&c.axes, nd);
    let kept: Vec<usize> = (0..nd).map(|i| if axes.contains(&i) { 1 } else { c.shape[i] }).collect();
    let n_out: usize = kept.iter().product();
    let red: usize = axes.iter().map(|&a| c.shape[a]).product();
    let mut groups: Vec<Vec<f64>> = vec![Vec::with_capacity(red); n_out];
    let mut idx = vec![0usize; nd];
    for &v in x {
        let o = (0..nd).fold(0, |o, i| o * kept[i] + if axes.contains(&i) { 0 } else { idx[i] });
        groups[o].push(v);
        for i in (0..nd).rev() {
            idx[i] += 1;
            if idx[i] < c.shape[i] {
                break;
            }
            idx[i] = 0;
        }
    }
    let out_shape: Vec<usize> =
        if c.keepdims { kept.clone() } else { (0..nd).filter(|i| !axes.contains(i)).map(|i| c.shape[i]).collect() };
    let acc_eps = if c.dtype == DType::F64 { f64::EPSILON } else { f32::EPSILON as f64 };
    let out_eps = eps(c.dtype);
    let mut want = Vec::with_capacity(n_out);
    let mut tol = Vec::with_capacity(n_out);
    let nan = |g: &[f64]| g.iter().any(|v| v.is_nan());
    for g in &groups {
        let n = g.len() as f64;
        let steps = 4.0 + 2.0 * n.max(1.0).log2();
        match c.op {
            Op::Sum => {
                let s: f64 = g.iter().sum();
                let abs: f64 = g.iter().map(|v| v.abs()).sum();
                want.push(s);
                tol.push(acc_eps * abs * steps + out_eps * s.abs());
            }
            Op::Mean => {
                // An f32 sum divided in f32, then rounded to the dtype.
                let m = g.iter().sum::<f64>() / n;
                let abs: f64 = g.iter().map(|v| v.abs()).sum();
                want.push(if g.is_empty() { f64::NAN } else { m });
                tol.push(acc_eps * abs * steps / n.max(1.0) + (acc_eps + out_eps) * m.abs());
            }
            Op::Prod => {
                let p: f64 = g.iter().product();
                want.push(p);
                tol.push(p.abs() * (acc_eps * (n + 2.0) * 2.0 + out_eps));
            }
            Op::Max | Op::Min => {
                let m = if nan(g) {
                    f64::NAN
                } else if c.op == Op::Max {
                    g.iter().cloned().fold(f64::NEG_INFINITY, f64::max)
                } else {
                    g.iter().cloned().fold(f64::INFINITY, f64::min)
                };
                want.push(m);
                tol.push(0.0);
            }
            Op::ArgMax | Op::ArgMin => {
                let i = g.iter().position(|v| v.is_nan()).unwrap_or_else(|| {
                    let mut bi = 0;
                    for (i, &v) in g.iter().enumerate() {
                        if (c.op == Op::ArgMax && v > g[bi]) || (c.op == Op::ArgMin && v < g[bi]) {
                            bi = i;
                        }
                    }
                    bi
                });
                want.push(i as f64);
                tol.push(0.0);
            }
        }
    }
    (out_shape, want, tol)
}

/// Runs a case on `dev` and checks it against the reference; returns the result's values.
fn check(dev: Device, c: &Case, rng_seed: u64) -> Vec<f64> {
    let bs = base_shape(c);
    let n: usize = bs.iter().product();
    let mut rng = Rng::new(rng_seed);
    let vals = values(c, n, &mut rng);
    // The view's values, row-major, read through a copy (no reduction involved).
    let xv = on(Device::cpu(), || build(c, &bs, &vals).to_f64_vec().unwrap());
    let (shape, want, tol) = reference(c, &xv);
    let got = on(dev, || {
        let x = build(c, &bs, &vals);
        let y = apply(c, &x);
        assert_eq!(y.shape(), &shape[..], "{c:?} on {dev:?}: shape");
        y.to_f64_vec().unwrap()
    });
    assert_eq!(got.len(), want.len(), "{c:?}");
    for (i, ((g, w), t)) in got.iter().zip(&want).zip(&tol).enumerate() {
        let ok = if w.is_nan() {
            g.is_nan()
        } else if w.is_infinite() || *t == 0.0 {
            g == w
        } else {
            (g - w).abs() <= *t + 1e-300
        };
        assert!(ok, "{c:?} on {dev:?}: output {i}: got {g}, want {w} (tol {t:e})");
    }
    got
}

/// A random shape of rank `nd` with at most about `cap` elements: odd sizes, ones, and
/// now and then one long axis.
fn gen_shape(rng: &mut Rng, nd: usize, cap: usize) -> Vec<usize> {
    const SIZES: [usize; 12] = [1, 1, 2, 3, 5, 7, 8, 16, 17, 33, 64, 127];
    let mut s: Vec<usize> = (0..nd).map(|_| SIZES[(rng.next_u64() % SIZES.len() as u64) as usize]).collect();
    if rng.next_u64().is_multiple_of(3) {
        let a = (rng.next_u64() % nd as u64) as usize;
        let rest: usize = s.iter().enumerate().filter(|&(i, _)| i != a).map(|(_, &d)| d).product();
        s[a] = (cap / rest.max(1)).clamp(1, 5000).saturating_sub((rng.next_u64() % 3) as usize).max(1);
    }
    while s.iter().product::<usize>() > cap {
        let a = s.iter().enumerate().max_by_key(|&(_, &d)| d).map(|(i, _)| i).unwrap();
        s[a] = s[a].div_ceil(2);
    }
    s
}

fn gen_view(rng: &mut Rng, nd: usize) -> View {
    match rng.next_u64() % 4 {
        0 | 1 => View::Plain,
        2 => {
            let mut p: Vec<usize> = (0..nd).collect();
            for i in (1..nd).rev() {
                p.swap(i, (rng.next_u64() % (i as u64 + 1)) as usize);
            }
            View::Transposed(p)
        }
        _ => View::Sliced { axis: (rng.next_u64() % nd as u64) as usize, step: 1 + (rng.next_u64() % 2) as isize },
    }
}

fn gen_cases(seed: u64, count: usize, cap: usize) -> Vec<Case> {
    let mut rng = Rng::new(seed);
    let mut cases = Vec::new();
    let ops = [Op::Sum, Op::Prod, Op::Max, Op::Min, Op::ArgMax, Op::ArgMin];
    while cases.len() < count {
        let nd = 1 + (rng.next_u64() % 5) as usize;
        let shape = gen_shape(&mut rng, nd, cap);
        let op = ops[(rng.next_u64() % ops.len() as u64) as usize];
        let dtype = if rng.next_u64().is_multiple_of(4) {
            INTS[(rng.next_u64() % 4) as usize]
        } else {
            FLOATS[(rng.next_u64() % 4) as usize]
        };
        let arg = matches!(op, Op::ArgMax | Op::ArgMin);
        let axes: Vec<isize> = if arg {
            let a = (rng.next_u64() % nd as u64) as isize;
            vec![if rng.next_u64().is_multiple_of(2) { a } else { a - nd as isize }]
        } else {
            match rng.next_u64() % 6 {
                0 => vec![],
                1 => vec![0],
                2 => vec![-1],
                3 => vec![(nd / 2) as isize],
                _ => {
                    let mask = 1 + rng.next_u64() % ((1u64 << nd) - 1);
                    (0..nd as isize)
                        .filter(|i| mask & (1 << i) != 0)
                        .map(|i| if rng.next_u64().is_multiple_of(2) { i } else { i - nd as isize })
                        .collect()
                }
            }
        };
        let red: usize = norm(&axes, nd).iter().map(|&a| shape[a]).product();
        // Integer products stay exact (and within i32) over short axes only.
        if op == Op::Prod && !dtype.is_float() && red > 20 {
            continue;
        }
        let view = gen_view(&mut rng, nd);
        let ties = arg && rng.next_u64().is_multiple_of(2);
        let nans = dtype.is_float() && op != Op::Sum && op != Op::Prod && rng.next_u64().is_multiple_of(3);
        cases.push(Case { shape, view, dtype, op, axes, keepdims: rng.next_u64().is_multiple_of(2), ties, nans });
    }
    cases
}

#[test]
fn generated_reductions_match_f64() {
    for dev in devices() {
        for (k, c) in gen_cases(11, 700, 1 << 14).iter().enumerate() {
            check(dev, c, 1000 + k as u64);
        }
    }
}

#[test]
fn generated_large_reductions_match_f64() {
    for dev in devices() {
        for (k, c) in gen_cases(12, 60, 1 << 20).iter().enumerate() {
            check(dev, c, 2000 + k as u64);
        }
    }
}

/// Cases that pick each launch shape: one huge row, few long rows, a short tall column
/// block (the reduced axis split over the grid), wide columns, a middle axis, and views.
fn shaped_cases() -> Vec<Case> {
    let mut v = Vec::new();
    let plain = |shape: &[usize], dtype, op, axes: &[isize]| Case {
        shape: shape.to_vec(),
        view: View::Plain,
        dtype,
        op,
        axes: axes.to_vec(),
        keepdims: false,
        ties: false,
        nans: false,
    };
    for d in FLOATS.into_iter().chain([DType::I32, DType::I64]) {
        for op in [Op::Sum, Op::Max, Op::ArgMax, Op::ArgMin] {
            let ax0: &[isize] = &[0];
            v.push(plain(&[(1 << 22) + 3], d, op, ax0));
            v.push(plain(&[3, 300_001], d, op, &[1]));
            v.push(plain(&[1 << 20, 3], d, op, ax0));
            v.push(plain(&[200_000, 8], d, op, ax0));
            v.push(plain(&[4099, 1000], d, op, ax0));
            v.push(plain(&[17, 1025, 33], d, op, &[1]));
            v.push(plain(&[65536, 24], d, op, &[-1]));
            v.push(plain(&[4, 500, 1500], d, op, &[-1]));
            // Rows past a warp's short-row length, enough of them for a warp each (at 132
            // SMs), aligned and not.
            v.push(plain(&[4300, 1100], d, op, &[-1]));
            let mut s = plain(&[4300, 1100], d, op, &[-1]);
            s.view = View::Sliced { axis: 1, step: 1 };
            v.push(s);
            let mut t = plain(&[2048, 1000], d, op, ax0);
            t.view = View::Transposed(vec![1, 0]);
            v.push(t.clone());
            t.axes = vec![1];
            v.push(t);
            let mut s = plain(&[1 << 16, 17], d, op, ax0);
            s.view = View::Sliced { axis: 1, step: 1 };
            v.push(s);
        }
    }
    // Empty inputs: the sum of nothing, and nothing to sum.
    for (shape, axes) in [(&[0usize, 5][..], &[0isize][..]), (&[4, 0, 3], &[1]), (&[4, 0, 3], &[0]), (&[0], &[])] {
        for d in [DType::F32, DType::F16, DType::I32] {
            v.push(plain(shape, d, Op::Sum, axes));
        }
    }
    for c in &mut v {
        if matches!(c.op, Op::ArgMax | Op::ArgMin) {
            c.ties = true;
            c.nans = c.dtype.is_float() && c.shape.len() == 2;
        }
    }
    v
}

#[test]
fn launch_shapes_match_f64() {
    for dev in devices() {
        for (k, c) in shaped_cases().iter().enumerate() {
            check(dev, c, 3000 + k as u64);
        }
    }
}

/// `mean` of f16/bf16 (read by the reduction itself, into f32) and f32 over first, middle,
/// last, several and all axes, odd sizes, misaligned and transposed views, and the launch
/// shapes of rows (a warp, a block, a row split over blocks) and columns (vectors or
/// not, the reduced axis split over the grid).
fn mean_cases() -> Vec<Case> {
    let mut v = Vec::new();
    let shapes: [(&[usize], &[isize]); 14] = [
        (&[64, 33, 40], &[0]),
        (&[64, 33, 40], &[1]),
        (&[64, 33, 40], &[2]),
        (&[64, 33, 40], &[]),
        (&[64, 33, 40], &[0, 2]),
        (&[7, 9, 11], &[1]),
        (&[3, 300_001], &[1]),
        (&[(1 << 20) + 5], &[0]),
        (&[20_000, 16], &[0]),
        (&[4099, 1001], &[0]),
        (&[1 << 16, 24], &[-1]),
        (&[5, 2000, 1030], &[-2]),
        (&[1, 7], &[0]),
        (&[4, 0, 3], &[1]),
    ];
    for d in [DType::F16, DType::BF16, DType::F32] {
        for (shape, axes) in shapes {
            for (k, view) in
                [View::Plain, View::Sliced { axis: 0, step: 1 }, View::Transposed((0..shape.len()).rev().collect())]
                    .into_iter()
                    .enumerate()
            {
                // Views of the small shapes only (the large ones pick launch shapes).
                if k > 0 && shape.iter().product::<usize>() > 1 << 17 {
                    continue;
                }
                let view = match view {
                    View::Sliced { .. } if shape[0] == 0 => continue,
                    View::Transposed(_) => {
                        let mut s = shape.to_vec();
                        s.reverse();
                        v.push(Case {
                            shape: s,
                            view,
                            dtype: d,
                            op: Op::Mean,
                            axes: axes.to_vec(),
                            keepdims: true,
                            ties: false,
                            nans: false,
                        });
                        continue;
                    }
                    other => other,
                };
                v.push(Case {
                    shape: shape.to_vec(),
                    view,
                    dtype: d,
                    op: Op::Mean,
                    axes: axes.to_vec(),
                    keepdims: k == 0,
                    ties: false,
                    nans: false,
                });
            }
        }
    }
    v
}

#[test]
fn means_match_f64() {
    for dev in devices() {
        for (k, c) in mean_cases().iter().enumerate() {
            check(dev, c, 4000 + k as u64);
        }
    }
}

/// Arg-reductions of f16/bf16/u8/i32 with ties and NaNs along rows of odd lengths (a
/// misaligned head and a tail around the 16-byte vectors) and along columns whose rows
/// hold whole vectors (or not), plain and sliced.
fn arg_cases() -> Vec<Case> {
    let mut v = Vec::new();
    let shapes: [(&[usize], isize); 12] = [
        (&[300, 7], 1),
        (&[300, 9], 1),
        (&[100, 17], -1),
        (&[64, 1023], 1),
        (&[64, 1025], 1),
        (&[40, 4097], 1),
        (&[2, 200_003], 1),
        (&[5001, 64], 0),
        (&[3001, 40], 0),
        (&[2999, 33], 0),
        (&[20_000, 512], 0),
        (&[9, 31, 24], 1),
    ];
    for d in [DType::F16, DType::BF16, DType::U8, DType::I32, DType::F32] {
        for op in [Op::ArgMax, Op::ArgMin] {
            for (shape, axis) in shapes {
                for view in [View::Plain, View::Sliced { axis: 0, step: 1 }, View::Sliced { axis: 1, step: 1 }] {
                    v.push(Case {
                        shape: shape.to_vec(),
                        view,
                        dtype: d,
                        op,
                        axes: vec![axis],
                        keepdims: false,
                        ties: true,
                        nans: d.is_float(),
                    });
                }
            }
        }
    }
    v
}

#[test]
fn arg_reductions_with_ties_and_nans_match_f64() {
    for dev in devices() {
        for (k, c) in arg_cases().iter().enumerate() {
            check(dev, c, 5000 + k as u64);
        }
    }
}

/// The same reduction twice gives the same bits (no order that depends on timing).
#[test]
fn results_are_bit_identical_run_to_run() {
    let Some(g) = common::gpu() else { return };
    for c in shaped_cases().iter().filter(|c| c.dtype == DType::F32 || c.dtype == DType::BF16) {
        let a = check(g, c, 77);
        let b = check(g, c, 77);
        let bits = |v: &[f64]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(&a), bits(&b), "{c:?}");
    }
}
