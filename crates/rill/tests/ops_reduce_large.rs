//! Reductions and softmax at sizes that take the GPU's split, block-per-row, warp-per-row
//! and register-cached paths (and the CPU's parallel ones), against float64 references.

mod common;

use common::{Rng, array_of, assert_close, devices, on, tol};
use rill::{Array, DType};

const FLOATS: [DType; 4] = [DType::F32, DType::F64, DType::F16, DType::BF16];

/// Sum tolerance for `n`-element sums: accumulation error grows with the length.
fn sum_tol(dt: DType) -> f64 {
    match dt {
        DType::F64 => 1e-9,
        DType::F32 => 1e-4,
        d => 2.0 * tol(d),
    }
}

fn rows_of(v: &[f64], cols: usize) -> Vec<&[f64]> {
    if cols == 0 { Vec::new() } else { v.chunks(cols).collect() }
}

fn ref_max(g: &[f64]) -> f64 {
    g.iter().fold(f64::NEG_INFINITY, |a, &b| if a.is_nan() || b.is_nan() { f64::NAN } else { a.max(b) })
}
fn ref_min(g: &[f64]) -> f64 {
    g.iter().fold(f64::INFINITY, |a, &b| if a.is_nan() || b.is_nan() { f64::NAN } else { a.min(b) })
}

/// The first `off + numel` values of `raw` as a flat array, viewed from element `off` with `shape` (an offset
/// view, unaligned for 16-byte vectors when `off` is odd).
fn offset_view(raw: &[f64], off: usize, shape: &[usize], dt: DType) -> (Array, Vec<f64>) {
    let raw = &raw[..off + shape.iter().product::<usize>()];
    let (a, v) = array_of(raw, &[raw.len()], dt);
    let ishape: Vec<isize> = shape.iter().map(|&d| d as isize).collect();
    let s = a.slice_axis(0, Some(off as isize), None, 1).unwrap().reshape(&ishape).unwrap();
    (s, v[off..].to_vec())
}

#[test]
fn full_reductions_of_many_elements() {
    for dev in devices() {
        on(dev, || {
            let mut rng = Rng::new(11);
            let n = (1usize << 20) + 37;
            let raw = rng.vec(n + 3, -1.0, 1.0);
            for dt in FLOATS {
                for off in [0usize, 3] {
                    let (x, xv) = offset_view(&raw, off, &[n], dt);
                    let what = format!("{dt} n={n} offset {off}");
                    let s = x.sum(&[], false).unwrap().to_f64_vec().unwrap();
                    assert_close(&s, &[xv.iter().sum()], sum_tol(dt), &format!("sum {what}"));
                    let m = x.max(&[], false).unwrap().to_f64_vec().unwrap();
                    assert_close(&m, &[ref_max(&xv)], 0.0, &format!("max {what}"));
                    let m = x.min(&[], false).unwrap().to_f64_vec().unwrap();
                    assert_close(&m, &[ref_min(&xv)], 0.0, &format!("min {what}"));
                }
                // A product of values near 1.
                let near: Vec<f64> = rng.vec(n, -1e-4, 1e-4).iter().map(|v| 1.0 + v).collect();
                let (x, xv) = array_of(&near, &[n], dt);
                let p = x.prod(&[], false).unwrap().to_f64_vec().unwrap();
                // f32 rounding after each of 2^20 products drifts by up to about 1e-2.
                let t = match dt {
                    DType::F64 => 1e-9,
                    DType::F32 => 1e-2,
                    d => 4.0 * tol(d) + 1e-2,
                };
                assert_close(&p, &[xv.iter().product()], t, &format!("prod {dt}"));
                // One NaN in the middle wins.
                let mut with_nan = raw[..n].to_vec();
                with_nan[n / 2 + 5] = f64::NAN;
                let (x, _) = array_of(&with_nan, &[n], dt);
                assert!(x.max(&[], false).unwrap().item_f64().unwrap().is_nan(), "max NaN {dt}");
                assert!(x.min(&[], false).unwrap().item_f64().unwrap().is_nan(), "min NaN {dt}");
            }
            // Integer sums wrap around in their own type.
            let big: Vec<f64> = rng.vec(n, 0.0, (1u64 << 30) as f64).iter().map(|v| v.floor()).collect();
            let (x, xv) = array_of(&big, &[n], DType::I32);
            let want = xv.iter().fold(0i32, |a, &b| a.wrapping_add(b as i32));
            assert_eq!(x.sum(&[], false).unwrap().to_vec::<i32>().unwrap(), vec![want], "i32 wrapping sum");
            let (x, xv) = array_of(&big, &[n], DType::U32);
            let want = xv.iter().fold(0u32, |a, &b| a.wrapping_add(b as u32));
            assert_eq!(x.sum(&[], false).unwrap().to_vec::<u32>().unwrap(), vec![want], "u32 wrapping sum");
            let mx = xv.iter().fold(0u32, |a, &b| a.max(b as u32));
            assert_eq!(x.max(&[], false).unwrap().to_vec::<u32>().unwrap(), vec![mx], "u32 max");
            let small: Vec<f64> = rng.vec(n, -3.0, 3.0).iter().map(|v| v.floor()).collect();
            let (x, xv) = array_of(&small, &[n], DType::I64);
            let want: i64 = xv.iter().map(|&v| v as i64).sum();
            assert_eq!(x.sum(&[], false).unwrap().to_vec::<i64>().unwrap(), vec![want], "i64 sum");
            let mn = xv.iter().fold(i64::MAX, |a, &b| a.min(b as i64));
            assert_eq!(x.min(&[], false).unwrap().to_vec::<i64>().unwrap(), vec![mn], "i64 min");
        });
    }
}

/// A full sum long enough that each thread of the split kernel reads eight vectors at a
/// time (the GPU gives each of about 500 blocks more than 8 x 512 vectors), with an
/// unaligned start and a tail.
#[test]
fn full_sums_long_enough_for_eight_vectors_per_thread() {
    for dev in devices() {
        on(dev, || {
            let mut rng = Rng::new(13);
            let n = 9_000_011usize;
            let raw = rng.vec(n + 1, -1.0, 1.0);
            for dt in [DType::F32, DType::BF16] {
                let (x, xv) = offset_view(&raw, 1, &[n], dt);
                let got = x.sum(&[], false).unwrap().to_f64_vec().unwrap();
                assert_close(&got, &[xv.iter().sum()], sum_tol(dt), &format!("sum {dt} n={n}"));
                let got = x.max(&[], false).unwrap().to_f64_vec().unwrap();
                assert_close(&got, &[ref_max(&xv)], 0.0, &format!("max {dt} n={n}"));
            }
        });
    }
}

#[test]
fn row_reductions_few_long_and_many_short_rows() {
    for dev in devices() {
        on(dev, || {
            let mut rng = Rng::new(12);
            // (rows, cols, offset): few long rows (split), many long rows (block per row),
            // many short rows (warp per row), odd lengths and unaligned starts.
            let cases = [
                (3usize, 300_001usize, 0usize),
                (2, 1 << 19, 1),
                (5, 2000, 0),
                (600, 1031, 1),
                // Block per row with rows long enough for eight vectors in flight per thread.
                (300, 20_005, 1),
                (1 << 15, 5, 0),
                (20_000, 33, 3),
                (4, 1, 0),
                (7, 0, 0),
            ];
            for (rows, cols, off) in cases {
                let raw = rng.vec(rows * cols + off, -1.0, 1.0);
                for dt in [DType::F32, DType::F16, DType::BF16, DType::F64] {
                    let (x, xv) = offset_view(&raw, off, &[rows, cols], dt);
                    let what = format!("{dt} {rows}x{cols} offset {off}");
                    let want: Vec<f64> = if cols == 0 {
                        vec![0.0; rows]
                    } else {
                        rows_of(&xv, cols).iter().map(|g| g.iter().sum()).collect()
                    };
                    let got = x.sum(&[-1], false).unwrap().to_f64_vec().unwrap();
                    assert_close(&got, &want, sum_tol(dt), &format!("sum {what}"));
                    if cols > 0 {
                        let want: Vec<f64> = rows_of(&xv, cols).iter().map(|g| ref_max(g)).collect();
                        assert_close(&x.max(&[-1], false).unwrap().to_f64_vec().unwrap(), &want, 0.0, &what);
                    }
                }
                let ints: Vec<f64> = raw.iter().map(|v| (v * 100.0).floor()).collect();
                let (x, xv) = offset_view(&ints, off, &[rows, cols], DType::I32);
                let want: Vec<f64> = if cols == 0 {
                    vec![0.0; rows]
                } else {
                    rows_of(&xv, cols).iter().map(|g| g.iter().sum()).collect()
                };
                assert_close(&x.sum(&[-1], false).unwrap().to_f64_vec().unwrap(), &want, 0.0, "i32 rows");
                // The first axis of the transposed problem (a copy, then rows of `rows`).
                if cols > 0 && rows > 1 {
                    let (x, xv) = array_of(&raw[..rows * cols], &[rows, cols], DType::F32);
                    let want: Vec<f64> = (0..cols).map(|c| (0..rows).map(|r| xv[r * cols + c]).sum()).collect();
                    assert_close(&x.sum(&[0], false).unwrap().to_f64_vec().unwrap(), &want, 1e-4, "axis 0");
                }
            }
        });
    }
}

fn ref_softmax_rows(x: &[f64], cols: usize, log: bool) -> Vec<f64> {
    let mut out = Vec::with_capacity(x.len());
    for g in rows_of(x, cols) {
        let m = ref_max(g);
        let s: f64 = g.iter().map(|&v| (v - m).exp()).sum();
        out.extend(g.iter().map(|&v| if log { v - m - s.ln() } else { (v - m).exp() / s }));
    }
    out
}

#[test]
fn softmax_rows_of_many_lengths() {
    for dev in devices() {
        on(dev, || {
            let mut rng = Rng::new(13);
            // 4096 (the register path, aligned), odd lengths, one unaligned start, and
            // rows longer than the register path holds for some dtypes.
            let cases = [
                (64usize, 4096usize, 0usize),
                (33, 4097, 0),
                (40, 1000, 1),
                (300, 17, 0),
                (3, 20000, 0),
                (2, 40000, 1),
            ];
            for (rows, cols, off) in cases {
                let raw = rng.vec(rows * cols + off, -4.0, 4.0);
                for dt in FLOATS {
                    let (x, xv) = offset_view(&raw, off, &[rows, cols], dt);
                    for log in [false, true] {
                        let y = if log { x.log_softmax(-1) } else { x.softmax(-1) }.unwrap();
                        assert_eq!((y.shape(), y.dtype()), (&[rows, cols][..], dt));
                        let what = format!("softmax log={log} {dt} {rows}x{cols} offset {off}");
                        assert_close(&y.to_f64_vec().unwrap(), &ref_softmax_rows(&xv, cols, log), tol(dt), &what);
                    }
                }
            }
        });
    }
}

#[test]
fn softmax_rows_with_nan_and_infinities() {
    for dev in devices() {
        on(dev, || {
            let cols = 4096;
            let mut rng = Rng::new(14);
            let mut raw = rng.vec(4 * cols, -2.0, 2.0);
            raw[cols + 100] = f64::NAN; // row 1: all NaN
            for v in &mut raw[2 * cols..2 * cols + 50] {
                *v = f64::NEG_INFINITY; // row 2: some -inf give 0
            }
            for v in &mut raw[3 * cols..] {
                *v = f64::NEG_INFINITY; // row 3: all -inf give NaN
            }
            for dt in FLOATS {
                let (x, xv) = array_of(&raw, &[4, cols], dt);
                for log in [false, true] {
                    let got = if log { x.log_softmax(-1) } else { x.softmax(-1) }.unwrap().to_f64_vec().unwrap();
                    let what = format!("softmax log={log} {dt}");
                    let want = ref_softmax_rows(&xv[..cols], cols, log);
                    assert_close(&got[..cols], &want, tol(dt), &what);
                    assert!(got[cols..2 * cols].iter().all(|v| v.is_nan()), "{what}: NaN row");
                    let want = ref_softmax_rows(&xv[2 * cols..3 * cols], cols, log);
                    assert_close(&got[2 * cols..3 * cols], &want, tol(dt), &what);
                    assert!(got[3 * cols..].iter().all(|v| v.is_nan()), "{what}: -inf row");
                }
            }
        });
    }
}
