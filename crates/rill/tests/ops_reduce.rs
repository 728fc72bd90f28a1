//! Reductions, arg-reductions and cumsum against float64 references.

mod common;

use common::{Rng, array_of, assert_close, devices, on, tol};
use rill::{Array, DType};

const SHAPES: &[&[usize]] = &[&[], &[7], &[3, 4], &[2, 3, 4], &[2, 1, 5, 3], &[0, 3], &[4, 0, 2]];
const FLOATS: [DType; 4] = [DType::F32, DType::F64, DType::F16, DType::BF16];

/// Axis sets to try for a rank (empty = all), including negative and multiple axes.
fn axis_sets(nd: usize) -> Vec<Vec<isize>> {
    let mut v: Vec<Vec<isize>> = vec![vec![]];
    let n = nd as isize;
    for a in 0..n {
        v.push(vec![a]);
    }
    if nd >= 1 {
        v.push(vec![-1]);
    }
    if nd >= 2 {
        v.push(vec![0, -1]);
    }
    if nd >= 3 {
        v.push(vec![-2, 0]);
        v.push(vec![0, 2]);
        v.push(vec![1, 2]);
        v.push(vec![-1, 1, 0]);
    }
    v
}

fn norm_axes(axes: &[isize], nd: usize) -> Vec<usize> {
    if axes.is_empty() {
        return (0..nd).collect();
    }
    let mut v: Vec<usize> = axes.iter().map(|&a| if a < 0 { (a + nd as isize) as usize } else { a as usize }).collect();
    v.sort();
    v
}

fn out_shape(shape: &[usize], axes: &[usize], keep: bool) -> Vec<usize> {
    let mut o = Vec::new();
    for (i, &d) in shape.iter().enumerate() {
        if !axes.contains(&i) {
            o.push(d);
        } else if keep {
            o.push(1);
        }
    }
    o
}

/// Groups the elements of a row-major `shape` by output position (reduced axes removed).
fn groups(vals: &[f64], shape: &[usize], axes: &[usize]) -> Vec<Vec<f64>> {
    let kept = out_shape(shape, axes, false);
    let mut g = vec![Vec::new(); kept.iter().product()];
    for (flat, &v) in vals.iter().enumerate() {
        let mut r = flat;
        let mut idx = vec![0; shape.len()];
        for i in (0..shape.len()).rev() {
            idx[i] = r % shape[i];
            r /= shape[i];
        }
        let mut o = 0;
        for i in 0..shape.len() {
            if !axes.contains(&i) {
                o = o * shape[i] + idx[i];
            }
        }
        g[o].push(v);
    }
    g
}

fn ref_max(g: &[f64]) -> f64 {
    g.iter().fold(f64::NEG_INFINITY, |a, &b| if a.is_nan() || b.is_nan() { f64::NAN } else { a.max(b) })
}
fn ref_min(g: &[f64]) -> f64 {
    g.iter().fold(f64::INFINITY, |a, &b| if a.is_nan() || b.is_nan() { f64::NAN } else { a.min(b) })
}

#[test]
fn sum_prod_max_min_mean_match_reference() {
    for dev in devices() {
        on(dev, || {
            let mut rng = Rng::new(1);
            let dtypes = [FLOATS.as_slice(), &[DType::I32, DType::I64, DType::U8, DType::U32, DType::Bool]].concat();
            for shape in SHAPES {
                let n: usize = shape.iter().product();
                for &dt in &dtypes {
                    let raw: Vec<f64> = if dt.is_float() {
                        rng.vec(n, -2.0, 2.0)
                    } else if dt == DType::Bool {
                        rng.vec(n, 0.0, 2.0).iter().map(|v| v.floor()).collect()
                    } else if dt == DType::U8 || dt == DType::U32 {
                        rng.vec(n, 0.0, 3.0).iter().map(|v| v.floor()).collect()
                    } else {
                        rng.vec(n, -2.0, 3.0).iter().map(|v| v.floor()).collect()
                    };
                    let (x, xv) = array_of(&raw, shape, dt);
                    for axes in axis_sets(shape.len()) {
                        let ax = norm_axes(&axes, shape.len());
                        let gs = groups(&xv, shape, &ax);
                        let empty = ax.iter().any(|&a| shape[a] == 0);
                        for keep in [false, true] {
                            let what = format!("{dt} {shape:?} axes {axes:?} keep {keep}");
                            let want_shape = out_shape(shape, &ax, keep);
                            let sum_dt = match dt {
                                DType::Bool => DType::I32,
                                DType::U8 => DType::U32,
                                d => d,
                            };
                            let s = x.sum(&axes, keep).unwrap();
                            assert_eq!((s.shape(), s.dtype()), (want_shape.as_slice(), sum_dt), "sum {what}");
                            let want: Vec<f64> = gs.iter().map(|g| g.iter().sum()).collect();
                            assert_close(&s.to_f64_vec().unwrap(), &want, tol(dt), &format!("sum {what}"));

                            let p = x.prod(&axes, keep).unwrap();
                            assert_eq!(p.dtype(), sum_dt);
                            let want: Vec<f64> = gs.iter().map(|g| g.iter().product()).collect();
                            assert_close(&p.to_f64_vec().unwrap(), &want, 4.0 * tol(dt), &format!("prod {what}"));

                            let m = x.mean(&axes, keep).unwrap();
                            assert_eq!(m.dtype(), dt.to_float(), "mean {what}");
                            let want: Vec<f64> = gs.iter().map(|g| g.iter().sum::<f64>() / g.len() as f64).collect();
                            let t = if dt.is_float() { tol(dt) } else { tol(DType::F32) };
                            assert_close(&m.to_f64_vec().unwrap(), &want, t, &format!("mean {what}"));

                            if empty {
                                let e = x.max(&axes, keep).unwrap_err().to_string();
                                assert!(e.contains(&format!("{shape:?}")) && e.contains("max"), "{e}");
                                assert!(x.min(&axes, keep).is_err());
                                continue;
                            }
                            let mx = x.max(&axes, keep).unwrap();
                            assert_eq!((mx.shape(), mx.dtype()), (want_shape.as_slice(), dt));
                            let want: Vec<f64> = gs.iter().map(|g| ref_max(g)).collect();
                            assert_close(&mx.to_f64_vec().unwrap(), &want, 0.0, &format!("max {what}"));
                            let mn = x.min(&axes, keep).unwrap();
                            let want: Vec<f64> = gs.iter().map(|g| ref_min(g)).collect();
                            assert_close(&mn.to_f64_vec().unwrap(), &want, 0.0, &format!("min {what}"));
                        }
                    }
                }
            }
        });
    }
}

#[test]
fn var_and_logsumexp_match_reference() {
    for dev in devices() {
        on(dev, || {
            let mut rng = Rng::new(2);
            for shape in SHAPES {
                let n: usize = shape.iter().product();
                for dt in [FLOATS.as_slice(), &[DType::I32]].concat() {
                    let raw: Vec<f64> = if dt.is_float() {
                        rng.vec(n, -3.0, 3.0)
                    } else {
                        rng.vec(n, -5.0, 5.0).iter().map(|v| v.floor()).collect()
                    };
                    let (x, xv) = array_of(&raw, shape, dt);
                    let t = if dt.is_float() { tol(dt) } else { tol(DType::F32) };
                    for axes in axis_sets(shape.len()) {
                        let ax = norm_axes(&axes, shape.len());
                        let gs = groups(&xv, shape, &ax);
                        for keep in [false, true] {
                            let what = format!("{dt} {shape:?} axes {axes:?} keep {keep}");
                            for ddof in [0usize, 1] {
                                let v = x.var(&axes, keep, ddof).unwrap();
                                assert_eq!(v.shape(), out_shape(shape, &ax, keep).as_slice());
                                assert_eq!(v.dtype(), dt.to_float());
                                let want: Vec<f64> = gs
                                    .iter()
                                    .map(|g| {
                                        let m = g.iter().sum::<f64>() / g.len() as f64;
                                        let ss: f64 = g.iter().map(|x| (x - m) * (x - m)).sum();
                                        ss / (g.len() as f64 - ddof as f64).max(0.0)
                                    })
                                    .collect();
                                assert_close(&v.to_f64_vec().unwrap(), &want, 4.0 * t, &format!("var{ddof} {what}"));
                            }
                            let l = x.logsumexp(&axes, keep).unwrap();
                            assert_eq!(l.shape(), out_shape(shape, &ax, keep).as_slice());
                            let want: Vec<f64> = gs
                                .iter()
                                .map(|g| {
                                    if g.is_empty() {
                                        return f64::NEG_INFINITY;
                                    }
                                    let m = ref_max(g);
                                    m + g.iter().map(|x| (x - m).exp()).sum::<f64>().ln()
                                })
                                .collect();
                            assert_close(&l.to_f64_vec().unwrap(), &want, t, &format!("logsumexp {what}"));
                        }
                    }
                }
            }
        });
    }
}

#[test]
fn logsumexp_is_stable_and_handles_infinities() {
    for dev in devices() {
        on(dev, || {
            let inf = f64::INFINITY;
            let raw = [1000.0, 1001.0, 999.0, -inf, -inf, -inf, 3.0, inf, 0.0, -1000.0, -1001.0, -inf];
            let (x, xv) = array_of(&raw, &[4, 3], DType::F32);
            let got = x.logsumexp(&[-1], false).unwrap().to_f64_vec().unwrap();
            let want: Vec<f64> = xv
                .chunks(3)
                .map(|g| {
                    let m = ref_max(g);
                    if m.is_infinite() {
                        return m;
                    }
                    m + g.iter().map(|x| (x - m).exp()).sum::<f64>().ln()
                })
                .collect();
            assert_close(&got, &want, tol(DType::F32), "logsumexp with infinities");
            let (y, _) = array_of(&[f64::NAN, 1.0], &[2], DType::F64);
            assert!(y.logsumexp(&[], false).unwrap().item_f64().unwrap().is_nan());
        });
    }
}

#[test]
fn max_min_propagate_nan() {
    for dev in devices() {
        on(dev, || {
            for dt in FLOATS {
                let raw: Vec<f64> = (0..40).map(|i| if i == 17 || i == 3 { f64::NAN } else { i as f64 }).collect();
                let (x, xv) = array_of(&raw, &[4, 10], dt);
                for axes in [vec![], vec![0], vec![1]] {
                    let ax = norm_axes(&axes, 2);
                    let gs = groups(&xv, &[4, 10], &ax);
                    let want: Vec<f64> = gs.iter().map(|g| ref_max(g)).collect();
                    assert_close(&x.max(&axes, false).unwrap().to_f64_vec().unwrap(), &want, 0.0, "max nan");
                    let want: Vec<f64> = gs.iter().map(|g| ref_min(g)).collect();
                    assert_close(&x.min(&axes, false).unwrap().to_f64_vec().unwrap(), &want, 0.0, "min nan");
                }
            }
        });
    }
}

#[test]
fn large_reductions_use_parallel_paths() {
    for dev in devices() {
        on(dev, || {
            let mut rng = Rng::new(3);
            for shape in [&[300usize, 500][..], &[3, 40000], &[40000, 3], &[2, 30000, 2], &[150001]] {
                let n: usize = shape.iter().product();
                let raw = rng.vec(n, -1.0, 1.0);
                for dt in [DType::F64, DType::F32] {
                    let (x, xv) = array_of(&raw, shape, dt);
                    for axes in axis_sets(shape.len()) {
                        let ax = norm_axes(&axes, shape.len());
                        let gs = groups(&xv, shape, &ax);
                        let want: Vec<f64> = gs.iter().map(|g| g.iter().sum()).collect();
                        let t = if dt == DType::F32 { 1e-4 } else { 1e-9 };
                        let what = format!("{dt} {shape:?} {axes:?}");
                        assert_close(&x.sum(&axes, false).unwrap().to_f64_vec().unwrap(), &want, t, &what);
                        let want: Vec<f64> = gs.iter().map(|g| ref_max(g)).collect();
                        assert_close(&x.max(&axes, false).unwrap().to_f64_vec().unwrap(), &want, 0.0, &what);
                    }
                }
            }
        });
    }
}

#[test]
fn argmax_argmin_match_reference() {
    for dev in devices() {
        on(dev, || {
            let mut rng = Rng::new(4);
            for shape in [&[7usize][..], &[3, 4], &[2, 3, 4], &[2, 1, 5, 3], &[0, 3]] {
                let n: usize = shape.iter().product();
                for dt in [FLOATS.as_slice(), &[DType::I32, DType::U8, DType::I64, DType::Bool]].concat() {
                    // Few distinct values so ties happen.
                    let raw: Vec<f64> = rng.vec(n, 0.0, 4.0).iter().map(|v| v.floor()).collect();
                    let raw: Vec<f64> = if dt == DType::Bool { raw.iter().map(|v| v % 2.0).collect() } else { raw };
                    let (x, xv) = array_of(&raw, shape, dt);
                    for axis in -(shape.len() as isize)..shape.len() as isize {
                        let a = if axis < 0 { (axis + shape.len() as isize) as usize } else { axis as usize };
                        if shape[a] == 0 {
                            let e = x.argmax(axis, false).unwrap_err().to_string();
                            assert!(e.contains(&format!("{shape:?}")), "{e}");
                            continue;
                        }
                        let gs = groups(&xv, shape, &[a]);
                        for keep in [false, true] {
                            let am = x.argmax(axis, keep).unwrap();
                            assert_eq!(am.dtype(), DType::I64);
                            assert_eq!(am.shape(), out_shape(shape, &[a], keep).as_slice());
                            let want: Vec<f64> = gs
                                .iter()
                                .map(|g| (0..g.len()).fold(0, |b, i| if g[i] > g[b] { i } else { b }) as f64)
                                .collect();
                            assert_eq!(am.to_f64_vec().unwrap(), want, "argmax {dt} {shape:?} {axis}");
                            let want: Vec<f64> = gs
                                .iter()
                                .map(|g| (0..g.len()).fold(0, |b, i| if g[i] < g[b] { i } else { b }) as f64)
                                .collect();
                            let got = x.argmin(axis, keep).unwrap().to_f64_vec().unwrap();
                            assert_eq!(got, want, "argmin {dt} {shape:?} {axis}");
                        }
                    }
                }
            }
            // The first NaN wins, as in NumPy.
            let (x, _) = array_of(&[1.0, f64::NAN, 5.0, f64::NAN], &[4], DType::F32);
            assert_eq!(x.argmax(0, false).unwrap().to_vec::<i64>().unwrap(), vec![1]);
            assert_eq!(x.argmin(0, false).unwrap().to_vec::<i64>().unwrap(), vec![1]);
        });
    }
}

#[test]
fn cumsum_matches_reference() {
    for dev in devices() {
        on(dev, || {
            let mut rng = Rng::new(5);
            for shape in [&[7usize][..], &[3, 4], &[2, 3, 4], &[2, 1, 5, 3], &[0, 3], &[3, 0]] {
                let n: usize = shape.iter().product();
                for dt in [FLOATS.as_slice(), &[DType::I32, DType::I64, DType::U8, DType::Bool]].concat() {
                    let raw: Vec<f64> = if dt.is_float() {
                        rng.vec(n, -2.0, 2.0)
                    } else {
                        rng.vec(n, 0.0, 2.0).iter().map(|v| v.floor()).collect()
                    };
                    let (x, xv) = array_of(&raw, shape, dt);
                    let nd = shape.len();
                    for axis in -(nd as isize)..nd as isize {
                        let a = if axis < 0 { (axis + nd as isize) as usize } else { axis as usize };
                        let inner: usize = shape[a + 1..].iter().product();
                        let len = shape[a];
                        for (reverse, exclusive) in [(false, false), (true, false), (false, true), (true, true)] {
                            let c = x.cumsum_with(axis, reverse, exclusive).unwrap();
                            assert_eq!(c.shape(), shape);
                            let want_dt = match dt {
                                DType::Bool => DType::I32,
                                DType::U8 => DType::U32,
                                d => d,
                            };
                            assert_eq!(c.dtype(), want_dt);
                            let mut want = vec![0.0; n];
                            for o in 0..n / (len * inner).max(1) {
                                for j in 0..inner {
                                    let mut acc = 0.0;
                                    for s in 0..len {
                                        let r = if reverse { len - 1 - s } else { s };
                                        let i = o * len * inner + r * inner + j;
                                        if exclusive {
                                            want[i] = acc;
                                            acc += xv[i];
                                        } else {
                                            acc += xv[i];
                                            want[i] = acc;
                                        }
                                    }
                                }
                            }
                            let what = format!("cumsum {dt} {shape:?} axis {axis} rev {reverse} excl {exclusive}");
                            assert_close(&c.to_f64_vec().unwrap(), &want, 2.0 * tol(dt), &what);
                        }
                    }
                    if nd > 0 {
                        let plain = x.cumsum(-1).unwrap().to_f64_vec().unwrap();
                        let opts = x.cumsum_with(-1, false, false).unwrap().to_f64_vec().unwrap();
                        assert_eq!(plain, opts);
                    }
                }
            }
        });
    }
}

#[test]
fn empty_reductions_and_scalars() {
    for dev in devices() {
        on(dev, || {
            let x = Array::zeros(&[0, 3], DType::F32).unwrap();
            assert_eq!(x.sum(&[0], false).unwrap().to_vec::<f32>().unwrap(), vec![0.0; 3]);
            assert_eq!(x.prod(&[0], false).unwrap().to_vec::<f32>().unwrap(), vec![1.0; 3]);
            assert!(x.mean(&[0], false).unwrap().to_vec::<f32>().unwrap().iter().all(|v| v.is_nan()));
            assert_eq!(x.logsumexp(&[0], true).unwrap().to_vec::<f32>().unwrap(), vec![f32::NEG_INFINITY; 3]);
            assert_eq!(x.sum(&[1], false).unwrap().shape(), &[0]);
            assert_eq!(x.max(&[1], false).unwrap().shape(), &[0]);
            let e = x.max(&[], false).unwrap_err().to_string();
            assert!(e.contains("[0, 3]") && e.contains("[0, 1]"), "{e}");
            let e = x.min(&[0], true).unwrap_err().to_string();
            assert!(e.contains("[0, 3]") && e.contains("[0]"), "{e}");

            let s = Array::scalar(2.5f32).unwrap();
            for r in [s.sum(&[], false), s.max(&[], true), s.min(&[], false), s.mean(&[], false), s.prod(&[], false)] {
                let r = r.unwrap();
                assert_eq!(r.shape(), &[] as &[usize]);
                assert_eq!(r.item::<f32>().unwrap(), 2.5);
            }
            assert_eq!(s.var(&[], false, 0).unwrap().item::<f32>().unwrap(), 0.0);
            assert!((s.logsumexp(&[], false).unwrap().item::<f32>().unwrap() - 2.5).abs() < 1e-6);
            assert_eq!(s.sum_all().unwrap().item::<f32>().unwrap(), 2.5);
            let b = Array::from_bools(&[true, false, true, true], &[4]).unwrap();
            assert_eq!(b.sum_all().unwrap().to_vec::<i32>().unwrap(), vec![3]);
            assert_eq!(b.max(&[], false).unwrap().to_bool_vec().unwrap(), vec![true]);
        });
    }
}

#[test]
fn bad_axes_are_errors() {
    for dev in devices() {
        on(dev, || {
            let x = Array::zeros(&[2, 3], DType::F32).unwrap();
            let check = |r: rill::Result<Array>, axis: &str| {
                let e = r.unwrap_err().to_string();
                assert!(e.contains(axis) && e.contains('2'), "{e}");
                assert!(e.contains("rank 2"), "{e}");
            };
            check(x.sum(&[2], false), "2");
            check(x.mean(&[-3], false), "-3");
            check(x.max(&[0, 5], true), "5");
            check(x.sum(&[1, -1], false), "-1");
            check(x.var(&[0, 0], false, 0), "0");
            check(x.logsumexp(&[7], false), "7");
            check(x.argmax(2, false), "2");
            check(x.argmin(-3, false), "-3");
            check(x.cumsum(4), "4");
            let s = Array::scalar(1.0f32).unwrap();
            assert!(s.argmax(0, false).is_err());
            assert!(s.cumsum(0).is_err());
            assert!(s.sum(&[0], false).is_err());
        });
    }
}

/// `mean` is one reduction whose store divides: the sum in f32 (f64 for f64, halves
/// widened exactly), divided by the count in that type, rounded to the dtype once. Bit
/// for bit those three ops written out, on every device, for generated shapes and axes
/// whose counts a half cannot hold exactly (so a division in the half, or a product by
/// the reciprocal, shows). The values are multiples of 1/64 in [-2, 3], exact in every
/// float dtype, so each sum is exact in f32 in any order: the reference's sum and the
/// mean's agree whatever order each kernel adds in, and only the division and the
/// rounding are compared.
#[test]
fn mean_is_the_wide_sum_divided_once() {
    for dev in devices() {
        on(dev, || {
            let mut rng = Rng::new(78);
            let dims = [1usize, 3, 7, 33, 1000, 4099];
            for case in 0..32 {
                let nd = 1 + (rng.next_u64() % 3) as usize;
                let mut shape: Vec<usize> =
                    (0..nd).map(|_| dims[(rng.next_u64() % dims.len() as u64) as usize]).collect();
                while shape.iter().product::<usize>() > 60_000 {
                    let i = shape.iter().position(|&d| d > 7).unwrap_or(0);
                    shape[i] = 7;
                }
                let axes: Vec<isize> = (0..nd as isize).filter(|_| rng.next_u64().is_multiple_of(2)).collect();
                let n: usize = shape.iter().product();
                for dt in [DType::F32, DType::F64, DType::F16, DType::BF16] {
                    let v: Vec<f64> = rng.vec(n, -2.0, 3.0).iter().map(|v| (v * 64.0).round() / 64.0).collect();
                    let (x, _) = array_of(&v, &shape, dt);
                    let wide = if dt == DType::F64 { DType::F64 } else { DType::F32 };
                    let all: Vec<usize> =
                        if axes.is_empty() { (0..nd).collect() } else { axes.iter().map(|&a| a as usize).collect() };
                    let count: usize = all.iter().map(|&a| shape[a]).product();
                    let want = x
                        .astype(wide)
                        .unwrap()
                        .sum(&axes, false)
                        .unwrap()
                        .div(count as f64)
                        .unwrap()
                        .astype(dt)
                        .unwrap();
                    let got = x.mean(&axes, false).unwrap();
                    let what = format!("case {case}: mean {dt} {shape:?} over {axes:?}");
                    assert_eq!((got.shape(), got.dtype()), (want.shape(), dt), "{what}");
                    let (g, w) = (got.to_f64_vec().unwrap(), want.to_f64_vec().unwrap());
                    for (i, (a, b)) in g.iter().zip(&w).enumerate() {
                        assert!(a.to_bits() == b.to_bits(), "{what}: element {i}: {a} against {b}");
                    }
                }
            }
        });
    }
}
