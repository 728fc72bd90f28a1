//! Creation ops (arange, linspace, eye, full_like) against float64 references computed
//! with plain loops.

mod common;

use common::{devices, on};
use rill::{Array, DType};

const NUMERIC: [DType; 8] =
    [DType::F32, DType::F64, DType::F16, DType::BF16, DType::I32, DType::I64, DType::U32, DType::U8];

/// `v` as stored in `dtype` (through the library's own cast of an f64 array).
fn rounded(v: &[f64], dtype: DType) -> Vec<f64> {
    Array::from_slice(v, &[v.len()]).unwrap().astype(dtype).unwrap().to_f64_vec().unwrap()
}

#[test]
fn arange_lengths_and_values() {
    let cases: [(f64, f64, f64); 9] = [
        (0.0, 10.0, 1.0),
        (0.0, 10.0, 3.0),
        (2.0, 40.0, 7.5),
        (10.0, 0.0, -2.0),
        (10.0, 1.0, -3.0),
        (0.0, 1.0, 0.1),
        (5.0, 5.0, 1.0),
        (5.0, 0.0, 1.0),
        (0.0, 100000.0, 1.0),
    ];
    for dev in devices() {
        on(dev, || {
            for dtype in NUMERIC {
                for (start, stop, step) in cases {
                    let mut want = Vec::new();
                    let mut i = 0usize;
                    loop {
                        let v = start + i as f64 * step;
                        if (step > 0.0 && v >= stop) || (step < 0.0 && v <= stop) {
                            break;
                        }
                        want.push(v);
                        i += 1;
                    }
                    let a = Array::arange(start, stop, step, dtype).unwrap();
                    assert_eq!(a.shape(), &[want.len()], "{dtype} arange({start}, {stop}, {step})");
                    assert_eq!(a.dtype(), dtype);
                    assert_eq!(
                        a.to_f64_vec().unwrap(),
                        rounded(&want, dtype),
                        "{dtype} arange({start}, {stop}, {step})"
                    );
                }
            }
            // Integer arguments.
            assert_eq!(Array::arange(0, 5, 1, DType::I32).unwrap().to_vec::<i32>().unwrap(), vec![0, 1, 2, 3, 4]);
            assert_eq!(Array::arange(-3, 3, 2, DType::I64).unwrap().to_vec::<i64>().unwrap(), vec![-3, -1, 1]);
        });
    }
}

#[test]
fn linspace_endpoints_and_values() {
    for dev in devices() {
        on(dev, || {
            for dtype in [DType::F32, DType::F64, DType::F16, DType::BF16, DType::I32, DType::I64] {
                for (start, stop, num) in
                    [(0.0, 1.0, 5usize), (-2.0, 3.0, 11), (1.0, -1.0, 4), (0.1, 0.7, 7), (3.0, 9.0, 2)]
                {
                    let step = (stop - start) / (num - 1) as f64;
                    let mut want: Vec<f64> = (0..num).map(|i| start + i as f64 * step).collect();
                    want[num - 1] = stop;
                    let a = Array::linspace(start, stop, num, dtype).unwrap();
                    assert_eq!(a.shape(), &[num]);
                    let got = a.to_f64_vec().unwrap();
                    assert_eq!(got, rounded(&want, dtype), "{dtype} linspace({start}, {stop}, {num})");
                    assert_eq!(got[0], rounded(&[start], dtype)[0]);
                    assert_eq!(got[num - 1], rounded(&[stop], dtype)[0], "endpoint is exact");
                }
                assert_eq!(Array::linspace(2.0, 5.0, 1, dtype).unwrap().to_f64_vec().unwrap(), vec![2.0]);
                assert_eq!(Array::linspace(2.0, 5.0, 0, dtype).unwrap().shape(), &[0]);
            }
            // Large: the f64 values match NumPy's start + i * step with an exact endpoint.
            let a = Array::linspace(0.0, 1.0, 100001, DType::F64).unwrap().to_vec::<f64>().unwrap();
            for (i, v) in a.iter().enumerate() {
                let want = if i == 100000 { 1.0 } else { i as f64 * (1.0 / 100000.0) };
                assert_eq!(*v, want, "element {i}");
            }
        });
    }
}

#[test]
fn eye_and_identity() {
    for dev in devices() {
        on(dev, || {
            for dtype in [DType::F32, DType::F64, DType::F16, DType::BF16, DType::I32, DType::U8, DType::Bool] {
                for (n, m, k) in [
                    (3usize, None, 0isize),
                    (3, Some(5), 1),
                    (4, Some(2), -1),
                    (3, None, 3),
                    (3, Some(4), -5),
                    (0, Some(3), 0),
                    (2, None, -1),
                ] {
                    let cols = m.unwrap_or(n);
                    let mut want = vec![0.0; n * cols];
                    for i in 0..n {
                        for j in 0..cols {
                            if j as isize - i as isize == k {
                                want[i * cols + j] = 1.0;
                            }
                        }
                    }
                    let e = Array::eye(n, m, k, dtype).unwrap();
                    assert_eq!(e.shape(), &[n, cols]);
                    assert_eq!(e.dtype(), dtype);
                    assert_eq!(e.to_f64_vec().unwrap(), want, "{dtype} eye({n}, {m:?}, {k})");
                }
            }
            let i = Array::identity(3, DType::F32).unwrap();
            assert_eq!(i.to_vec::<f32>().unwrap(), vec![1.0, 0.0, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0, 1.0]);
            assert_eq!(Array::eye(2, None, isize::MAX, DType::F32).unwrap().to_vec::<f32>().unwrap(), vec![0.0; 4]);
        });
    }
}

#[test]
fn full_like_keeps_shape_and_dtype() {
    for dev in devices() {
        on(dev, || {
            for dtype in NUMERIC.into_iter().chain([DType::Bool]) {
                for shape in [&[][..], &[3], &[2, 0], &[2, 3]] {
                    let a = Array::zeros(shape, dtype).unwrap();
                    let f = a.full_like(3).unwrap();
                    assert_eq!(f.shape(), shape);
                    assert_eq!(f.dtype(), dtype);
                    let v = if dtype == DType::Bool { 1.0 } else { 3.0 };
                    assert_eq!(f.to_f64_vec().unwrap(), vec![v; shape.iter().product()]);
                }
            }
        });
    }
}

#[test]
fn creation_errors_name_their_inputs() {
    let m = Array::arange(0, 10, 0, DType::F32).unwrap_err().to_string();
    assert!(m.contains("arange") && m.contains("step"), "{m}");
    let m = Array::arange(0, 3, 1, DType::Bool).unwrap_err().to_string();
    assert!(m.contains("bool"), "{m}");
    let m = Array::arange(0.0, f64::INFINITY, 1.0, DType::F32).unwrap_err().to_string();
    assert!(m.contains("inf"), "{m}");
    assert!(Array::arange(0.0, f64::NAN, 1.0, DType::F64).is_err());
    assert!(Array::arange(0.0, 1e300, 1.0, DType::F64).unwrap_err().to_string().contains("too long"));
    let m = Array::linspace(0.0, f64::NAN, 3, DType::F32).unwrap_err().to_string();
    assert!(m.contains("linspace") && m.contains("NaN"), "{m}");
    let m = Array::eye(usize::MAX, Some(3), 0, DType::F32).unwrap_err().to_string();
    assert!(m.contains("eye") && m.contains(&usize::MAX.to_string()), "{m}");
    let m = Array::full(&[usize::MAX, 2], 0.0, DType::F32).unwrap_err().to_string();
    assert!(m.contains("too many elements"), "{m}");
}
