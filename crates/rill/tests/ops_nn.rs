//! softmax, log_softmax, layer_norm and rms_norm against float64 references.

mod common;

use common::{Rng, array_of, assert_close, devices, on, tol};
use rill::{Array, DType};

const FLOATS: [DType; 4] = [DType::F32, DType::F64, DType::F16, DType::BF16];

/// Calls `f(indices of one lane)` for every lane along `axis` of a row-major `shape`.
fn lanes(shape: &[usize], axis: usize, mut f: impl FnMut(Vec<usize>)) {
    let len = shape[axis];
    let inner: usize = shape[axis + 1..].iter().product();
    let outer: usize = shape[..axis].iter().product();
    for o in 0..outer {
        for j in 0..inner {
            f((0..len).map(|r| o * len * inner + r * inner + j).collect());
        }
    }
}

fn ref_softmax(x: &[f64], shape: &[usize], axis: usize, log: bool) -> Vec<f64> {
    let mut out = vec![0.0; x.len()];
    lanes(shape, axis, |idx| {
        let m = idx.iter().map(|&i| x[i]).fold(f64::NEG_INFINITY, f64::max);
        let s: f64 = idx.iter().map(|&i| (x[i] - m).exp()).sum();
        for &i in &idx {
            out[i] = if log { x[i] - m - s.ln() } else { (x[i] - m).exp() / s };
        }
    });
    out
}

#[test]
fn softmax_and_log_softmax_match_reference() {
    for dev in devices() {
        on(dev, || {
            let mut rng = Rng::new(10);
            for shape in [&[5usize][..], &[3, 7], &[2, 3, 4], &[2, 1, 6, 3], &[0, 4], &[3, 0], &[64, 1100]] {
                let n: usize = shape.iter().product();
                let nd = shape.len() as isize;
                for dt in FLOATS {
                    let (x, xv) = array_of(&rng.vec(n, -4.0, 4.0), shape, dt);
                    for axis in -nd..nd {
                        let a = if axis < 0 { (axis + nd) as usize } else { axis as usize };
                        for log in [false, true] {
                            let y = if log { x.log_softmax(axis) } else { x.softmax(axis) }.unwrap();
                            assert_eq!((y.shape(), y.dtype()), (shape, dt));
                            let what = format!("softmax log={log} {dt} {shape:?} axis {axis}");
                            let want = ref_softmax(&xv, shape, a, log);
                            assert_close(&y.to_f64_vec().unwrap(), &want, 2.0 * tol(dt), &what);
                        }
                    }
                }
            }
            // Large magnitudes are stable; integers compute in f32.
            let (x, xv) = array_of(&[1000.0, 1001.0, 1002.0, -1000.0, -1001.0, -1003.0], &[2, 3], DType::F32);
            let want = ref_softmax(&xv, &[2, 3], 1, false);
            assert_close(&x.softmax(-1).unwrap().to_f64_vec().unwrap(), &want, tol(DType::F32), "stable");
            let (i, iv) = array_of(&[1.0, 2.0, 3.0, 4.0], &[2, 2], DType::I32);
            let y = i.log_softmax(0).unwrap();
            assert_eq!(y.dtype(), DType::F32);
            assert_close(&y.to_f64_vec().unwrap(), &ref_softmax(&iv, &[2, 2], 0, true), tol(DType::F32), "int");
        });
    }
}

fn ref_norm(x: &[f64], d: usize, w: Option<&[f64]>, b: Option<&[f64]>, eps: f64, rms: bool) -> Vec<f64> {
    let mut out = vec![0.0; x.len()];
    if d == 0 {
        return out;
    }
    for (r, row) in x.chunks(d).enumerate() {
        let n = d as f64;
        let (mean, denom) = if rms {
            (0.0, (row.iter().map(|v| v * v).sum::<f64>() / n + eps).sqrt())
        } else {
            let m = row.iter().sum::<f64>() / n;
            (m, (row.iter().map(|v| (v - m) * (v - m)).sum::<f64>() / n + eps).sqrt())
        };
        for j in 0..d {
            let mut y = (row[j] - mean) / denom;
            if let Some(w) = w {
                y *= w[j];
            }
            if let Some(b) = b {
                y += b[j];
            }
            out[r * d + j] = y;
        }
    }
    out
}

#[test]
fn layer_norm_and_rms_norm_match_reference() {
    for dev in devices() {
        on(dev, || {
            let mut rng = Rng::new(11);
            for shape in [&[6usize][..], &[3, 8], &[2, 3, 5], &[4, 1], &[0, 4], &[3, 0], &[200, 400]] {
                let n: usize = shape.iter().product();
                let d = *shape.last().unwrap();
                for dt in FLOATS {
                    // A large offset checks the variance is computed without cancellation.
                    let (x, xv) = array_of(&rng.vec(n, 2.0, 6.0), shape, dt);
                    let (w, wv) = array_of(&rng.vec(d, 0.5, 1.5), &[d], dt);
                    let (b, bv) = array_of(&rng.vec(d, -1.0, 1.0), &[d], dt);
                    for eps in [1e-5, 0.1] {
                        let what = format!("{dt} {shape:?} eps {eps}");
                        let cases: [(Option<&Array>, Option<&Array>); 4] =
                            [(None, None), (Some(&w), None), (None, Some(&b)), (Some(&w), Some(&b))];
                        for (wo, bo) in cases {
                            let y = x.layer_norm(wo, bo, eps).unwrap();
                            assert_eq!((y.shape(), y.dtype()), (shape, dt));
                            let want =
                                ref_norm(&xv, d, wo.map(|_| wv.as_slice()), bo.map(|_| bv.as_slice()), eps, false);
                            let t = if dt == DType::F32 { 1e-4 } else { 4.0 * tol(dt) };
                            assert_close(&y.to_f64_vec().unwrap(), &want, t, &format!("layer_norm {what}"));
                        }
                        for wo in [None, Some(&w)] {
                            let y = x.rms_norm(wo, eps).unwrap();
                            let want = ref_norm(&xv, d, wo.map(|_| wv.as_slice()), None, eps, true);
                            assert_close(&y.to_f64_vec().unwrap(), &want, 2.0 * tol(dt), &format!("rms_norm {what}"));
                        }
                    }
                }
            }
            // Integer input is normalised in f32; f32 weight with f16 input is converted.
            let (x, xv) = array_of(&[1.0, 2.0, 4.0, 8.0], &[2, 2], DType::I32);
            let y = x.layer_norm(None, None, 1e-5).unwrap();
            assert_eq!(y.dtype(), DType::F32);
            assert_close(&y.to_f64_vec().unwrap(), &ref_norm(&xv, 2, None, None, 1e-5, false), 1e-4, "int");
        });
    }
}

/// Rows of every length class of the register-cached kernels (1 to past the 32768 that
/// fit registers, odd lengths that are not whole 16-byte vectors), for f16/bf16 (and f32):
/// layer_norm with each of weight and bias, rms_norm, log_softmax and softmax of the last
/// axis, also of a view that starts one element into its buffer (unaligned rows).
#[test]
fn norms_and_softmax_of_long_rows_match_reference() {
    for dev in devices() {
        on(dev, || {
            let mut rng = Rng::new(12);
            let lens = [1usize, 2, 7, 8, 9, 33, 255, 1000, 1024, 4096, 4097, 8191, 8192, 8200, 32768, 32769, 40000];
            for d in lens {
                let rows = (20_000 / d).clamp(2, 17);
                let n = rows * d;
                for dt in [DType::F16, DType::BF16, DType::F32] {
                    // One extra leading element: `unaligned` reads the rows from element 1.
                    let (base, bv) = array_of(&rng.vec(n + 1, 2.0, 6.0), &[n + 1], dt);
                    let (w, wv) = array_of(&rng.vec(d, 0.5, 1.5), &[d], dt);
                    let (b, bias) = array_of(&rng.vec(d, -1.0, 1.0), &[d], dt);
                    let aligned = base
                        .slice_axis(0, Some(0), Some(n as isize), 1)
                        .unwrap()
                        .reshape(&[rows as isize, d as isize])
                        .unwrap();
                    let unaligned =
                        base.slice_axis(0, Some(1), None, 1).unwrap().reshape(&[rows as isize, d as isize]).unwrap();
                    for (x, xv, at) in [(&aligned, &bv[..n], "aligned"), (&unaligned, &bv[1..], "unaligned")] {
                        let what = format!("{dt} [{rows}, {d}] {at}");
                        let t = if dt == DType::F32 { 1e-4 } else { 4.0 * tol(dt) };
                        let cases: [(Option<&Array>, Option<&Array>); 4] =
                            [(None, None), (Some(&w), None), (None, Some(&b)), (Some(&w), Some(&b))];
                        for (wo, bo) in cases {
                            let y = x.layer_norm(wo, bo, 1e-5).unwrap();
                            let want =
                                ref_norm(xv, d, wo.map(|_| wv.as_slice()), bo.map(|_| bias.as_slice()), 1e-5, false);
                            let label = format!("layer_norm w={} b={} {what}", wo.is_some(), bo.is_some());
                            assert_close(&y.to_f64_vec().unwrap(), &want, t, &label);
                        }
                        for wo in [None, Some(&w)] {
                            let y = x.rms_norm(wo, 1e-5).unwrap();
                            let want = ref_norm(xv, d, wo.map(|_| wv.as_slice()), None, 1e-5, true);
                            let label = format!("rms_norm w={} {what}", wo.is_some());
                            assert_close(&y.to_f64_vec().unwrap(), &want, 2.0 * tol(dt), &label);
                        }
                        for log in [false, true] {
                            let y = if log { x.log_softmax(-1) } else { x.softmax(-1) }.unwrap();
                            let want = ref_softmax(xv, &[rows, d], 1, log);
                            let label = format!("softmax log={log} {what}");
                            assert_close(&y.to_f64_vec().unwrap(), &want, 2.0 * tol(dt), &label);
                        }
                    }
                }
            }
        });
    }
}

#[test]
fn nn_errors_name_shapes_and_axes() {
    for dev in devices() {
        on(dev, || {
            let x = Array::zeros(&[2, 3], DType::F32).unwrap();
            let w = Array::ones(&[4], DType::F32).unwrap();
            let e = x.layer_norm(Some(&w), None, 1e-5).unwrap_err().to_string();
            assert!(e.contains("[4]") && e.contains("[2, 3]") && e.contains("weight"), "{e}");
            let e = x.layer_norm(None, Some(&w), 1e-5).unwrap_err().to_string();
            assert!(e.contains("[4]") && e.contains("[2, 3]") && e.contains("bias"), "{e}");
            let w2 = Array::ones(&[1, 3], DType::F32).unwrap();
            let e = x.rms_norm(Some(&w2), 1e-5).unwrap_err().to_string();
            assert!(e.contains("[1, 3]") && e.contains("[2, 3]"), "{e}");
            let s = Array::scalar(1.0f32).unwrap();
            let e = s.layer_norm(None, None, 1e-5).unwrap_err().to_string();
            assert!(e.contains("[]"), "{e}");
            assert!(s.rms_norm(None, 1e-5).is_err());
            let e = x.softmax(2).unwrap_err().to_string();
            assert!(e.contains('2') && e.contains("rank 2"), "{e}");
            let e = x.log_softmax(-3).unwrap_err().to_string();
            assert!(e.contains("-3") && e.contains("rank 2"), "{e}");
            assert!(s.softmax(0).is_err());
        });
    }
}

/// Rows with NaN and infinite entries, with lengths that are and are not a multiple of
/// the CPU kernel's lane count: NaN anywhere makes the row NaN, -inf entries give 0 (and
/// -inf in log_softmax), a row of only -inf is NaN, like the float64 reference. CPU only:
/// these cases pin the CPU kernel's lane-wise max and sum.
#[test]
fn softmax_nan_and_infinite_entries_on_the_cpu() {
    let (ni, nan) = (f64::NEG_INFINITY, f64::NAN);
    let rows: [&[f64]; 5] = [
        &[1.0, nan, 2.0],
        &[0.0, ni, 1.0, ni, 2.0, 3.0, 4.0, 5.0, 6.0],
        &[ni, ni, ni, ni, ni, ni, ni, ni],
        &[3.0, 1.0, 4.0, 1.0, 5.0, 9.0, 2.0, 6.0, 5.0, 3.0, 5.0, 8.0, 9.0, 7.0, 9.0, 3.0, nan],
        &[-80.0, 0.0, -85.0, -90.0, -200.0, 10.0, 20.0, 30.0, 40.0, 50.0, 60.0, 70.0, 80.0],
    ];
    for row in rows {
        for dt in [DType::F32, DType::F64] {
            let (x, xv) = array_of(row, &[1, row.len()], dt);
            for log in [false, true] {
                let y = if log { x.log_softmax(-1) } else { x.softmax(-1) }.unwrap();
                let what = format!("softmax log={log} {dt} {row:?}");
                assert_close(&y.to_f64_vec().unwrap(), &ref_softmax(&xv, &[1, row.len()], 1, log), tol(dt), &what);
            }
        }
    }
}

/// Rows of every kernel's length range (the register kernel, the generic kernel past
/// 32768 elements) holding special entries, on every device and float dtype: a +inf makes
/// the row NaN, a row of only -inf is NaN, a -inf entry gives 0, like the float64
/// reference. Each row is also read along the first axis of its transpose (the column
/// kernels).
#[test]
fn long_rows_with_special_entries_match_reference() {
    let (pi, ni, nan) = (f64::INFINITY, f64::NEG_INFINITY, f64::NAN);
    for dev in devices() {
        on(dev, || {
            let mut rng = Rng::new(13);
            for d in [9usize, 1000, 20_000, 40_000] {
                let finite = rng.vec(d, -3.0, 3.0);
                let mut rows: Vec<Vec<f64>> = Vec::new();
                let mut one_inf = vec![ni; d];
                one_inf[d / 3] = pi;
                rows.push(one_inf);
                let mut inf_in_finite = finite.clone();
                inf_in_finite[d - 1] = pi;
                rows.push(inf_in_finite);
                let mut two_inf = finite.clone();
                two_inf[0] = pi;
                two_inf[d / 2] = pi;
                rows.push(two_inf);
                rows.push(vec![ni; d]);
                let mut nan_in_finite = finite.clone();
                nan_in_finite[d / 2] = nan;
                rows.push(nan_in_finite);
                let mut minus_inf = finite.clone();
                minus_inf[1] = ni;
                minus_inf[d - 2] = ni;
                rows.push(minus_inf);
                let r = rows.len();
                let flat: Vec<f64> = rows.concat();
                for dt in FLOATS {
                    let (x, xv) = array_of(&flat, &[r, d], dt);
                    let xt = x.transpose(&[1, 0]).unwrap();
                    for log in [false, true] {
                        let want = ref_softmax(&xv, &[r, d], 1, log);
                        let y = if log { x.log_softmax(-1) } else { x.softmax(-1) }.unwrap();
                        let what = format!("softmax log={log} {dt} [{r}, {d}] rows");
                        assert_close(&y.to_f64_vec().unwrap(), &want, 2.0 * tol(dt), &what);
                        let yt = if log { xt.log_softmax(0) } else { xt.softmax(0) }.unwrap();
                        let back = yt.transpose(&[1, 0]).unwrap();
                        let what = format!("softmax log={log} {dt} [{d}, {r}] columns");
                        assert_close(&back.to_f64_vec().unwrap(), &want, 2.0 * tol(dt), &what);
                    }
                }
            }
        });
    }
}

/// `x` of `shape` holding the values `v` (row-major in `shape`) laid out as view kind
/// `view`: 0 contiguous, 1 a transpose of a contiguous array (a random permutation), 2 a
/// slice of one random axis of a larger array (from element 1, step 1 or 2; the elements
/// left out are random). Returns the array and its values rounded to `dt`, row-major.
fn view_of(rng: &mut Rng, v: &[f64], shape: &[usize], dt: DType, view: usize) -> (Array, Vec<f64>) {
    let nd = shape.len();
    if view == 0 {
        return array_of(v, shape, dt);
    }
    // The view of the base is `base.transpose(q)` (view 1) or a slice of axis `a` (view 2):
    // its element `i` is the base's element `j` with `j[q[k]] = i[k]`, `j[a] = 1 + step * i[a]`.
    let mut q: Vec<usize> = (0..nd).collect();
    let (a, step) = (rng.next_u64() as usize % nd, 1 + rng.next_u64() as usize % 2);
    let mut base_shape = shape.to_vec();
    if view == 1 {
        for i in (1..nd).rev() {
            q.swap(i, rng.next_u64() as usize % (i + 1));
        }
        for k in 0..nd {
            base_shape[q[k]] = shape[k];
        }
    } else {
        base_shape[a] = 2 + step * shape[a];
    }
    let mut base = rng.vec(base_shape.iter().product(), -4.0, 4.0);
    for (flat, &value) in v.iter().enumerate() {
        let (mut i, mut r) = (vec![0; nd], flat);
        for k in (0..nd).rev() {
            i[k] = r % shape[k];
            r /= shape[k];
        }
        let mut j = vec![0; nd];
        for k in 0..nd {
            j[q[k]] = i[k];
        }
        if view == 2 {
            j[a] = 1 + step * i[a];
        }
        base[(0..nd).fold(0, |o, k| o * base_shape[k] + j[k])] = value;
    }
    let (b, _) = array_of(&base, &base_shape, dt);
    let x = if view == 1 {
        b.transpose(&q).unwrap()
    } else {
        b.slice_axis(a as isize, Some(1), Some((1 + step * shape[a]) as isize), step as isize).unwrap()
    };
    assert_eq!(x.shape(), shape);
    let xv = x.to_f64_vec().unwrap();
    // The view holds `v` (rounded): the special entries are where they were put.
    let (_, want) = array_of(v, shape, dt);
    assert!(xv.iter().zip(&want).all(|(g, w)| g == w || (g.is_nan() && w.is_nan())));
    (x, xv)
}

/// Generated cases for the column softmax (an axis that is not last, read in place on the
/// GPU: vector and single-column kernels, the axis split over many threads of a block) and
/// the row path beside it: seeded 2-4-axis shapes with odd, size-1 and vector-width inner
/// extents, a few larger ones, every axis, contiguous, transposed and sliced inputs, all
/// float dtypes, softmax and log_softmax, against the float64 reference. Some cases hold
/// NaN, +inf and -inf entries and a lane of only -inf (NaN, like the reference).
#[test]
fn softmax_of_generated_shapes_axes_and_views_matches_reference() {
    for dev in devices() {
        on(dev, || {
            let mut rng = Rng::new(14);
            let sizes = [1usize, 2, 3, 5, 8, 16, 17, 24, 33, 40, 64];
            let mut shapes: Vec<Vec<usize>> =
                vec![vec![3, 700, 40], vec![2, 129, 64], vec![700, 3, 16], vec![2, 6, 16]];
            while shapes.len() < 28 {
                let nd = 2 + rng.next_u64() as usize % 3;
                let s: Vec<usize> = (0..nd).map(|_| sizes[rng.next_u64() as usize % sizes.len()]).collect();
                if s.iter().product::<usize>() <= 4096 {
                    shapes.push(s);
                }
            }
            for (case, shape) in shapes.iter().enumerate() {
                let nd = shape.len();
                let n: usize = shape.iter().product();
                let mut v = rng.vec(n, -4.0, 4.0);
                if shape == &[2, 6, 16] {
                    // Lanes of [0, :, c] (axis 1): c = 0 all -inf, 1 with a NaN, 2 with +inf,
                    // 3 with two +inf, 4 with two -inf; [:, 0, 0] (axis 0) is all -inf, and
                    // lanes along axis 2 hold each kind of entry too.
                    for r in 0..6 {
                        v[r * 16] = f64::NEG_INFINITY;
                    }
                    v[96] = f64::NEG_INFINITY;
                    v[2 * 16 + 1] = f64::NAN;
                    v[3 * 16 + 2] = f64::INFINITY;
                    v[16 + 3] = f64::INFINITY;
                    v[5 * 16 + 3] = f64::INFINITY;
                    v[4] = f64::NEG_INFINITY;
                    v[5 * 16 + 4] = f64::NEG_INFINITY;
                } else if case % 5 == 4 {
                    for _ in 0..3 {
                        let i = rng.next_u64() as usize % n;
                        v[i] = [f64::NAN, f64::INFINITY, f64::NEG_INFINITY][rng.next_u64() as usize % 3];
                    }
                }
                for dt in FLOATS {
                    for view in 0..3 {
                        let (x, xv) = view_of(&mut rng, &v, shape, dt, view);
                        for axis in 0..nd {
                            for log in [false, true] {
                                let y =
                                    if log { x.log_softmax(axis as isize) } else { x.softmax(axis as isize) }.unwrap();
                                assert_eq!((y.shape(), y.dtype()), (&shape[..], dt));
                                let what = format!("softmax log={log} {dt} {shape:?} view {view} axis {axis}");
                                let want = ref_softmax(&xv, shape, axis, log);
                                assert_close(&y.to_f64_vec().unwrap(), &want, 2.0 * tol(dt), &what);
                            }
                        }
                    }
                }
            }
        });
    }
}
