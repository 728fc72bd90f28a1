//! The CUDA kernels of norms, arg-reductions, cumsum, take/concatenate/pad, random
//! arrays and fused (compiled) programs, against the CPU on the same inputs (skipped
//! without a GPU; `RILL_REQUIRE_GPU=1` makes a missing GPU a failure).

mod common;

use common::{Rng, assert_close, gpu, tol};
use rill::random::Key;
use rill::{Array, DType, Device};

const FLOATS: [DType; 4] = [DType::F32, DType::F16, DType::BF16, DType::F64];

/// Runs `f` on the CPU and on `g` with the same f64 input values; returns (cpu, gpu).
fn both<R>(g: Device, f: impl Fn() -> R) -> (R, R) {
    (common::on(Device::cpu(), &f), common::on(g, &f))
}

/// `x` of `dtype` built from `vals`; when `transposed`, built as the transpose of the
/// reversed shape so the array is a non-contiguous view.
fn input(vals: &[f64], shape: &[usize], dtype: DType, transposed: bool) -> Array {
    if !transposed || shape.len() < 2 {
        return Array::from_slice(vals, shape).unwrap().astype(dtype).unwrap();
    }
    let rev: Vec<usize> = shape.iter().rev().copied().collect();
    Array::from_slice(vals, &rev).unwrap().astype(dtype).unwrap().transpose(&[]).unwrap()
}

#[test]
fn gpu_norms_match_cpu() {
    let Some(g) = gpu() else { return };
    let mut rng = Rng::new(11);
    for dt in FLOATS {
        for shape in [&[5usize, 7][..], &[3, 4, 300], &[2, 1500], &[1, 1], &[0, 4], &[6]] {
            for tr in [false, true] {
                let n: usize = shape.iter().product();
                let d = *shape.last().unwrap();
                let (xv, wv, bv) = (rng.vec(n, -3.0, 3.0), rng.vec(d, 0.5, 1.5), rng.vec(d, -1.0, 1.0));
                let (c, gg) = both(g, || {
                    let x = input(&xv, shape, dt, tr);
                    let w = Array::from_slice(&wv, &[d]).unwrap().astype(dt).unwrap();
                    let b = Array::from_slice(&bv, &[d]).unwrap().astype(dt).unwrap();
                    [
                        x.layer_norm(Some(&w), Some(&b), 1e-5).unwrap(),
                        x.layer_norm(None, None, 1e-3).unwrap(),
                        x.layer_norm(Some(&w), None, 1e-5).unwrap(),
                        x.rms_norm(Some(&w), 1e-6).unwrap(),
                        x.rms_norm(None, 1e-6).unwrap(),
                    ]
                    .map(|a| a.to_f64_vec().unwrap())
                });
                for (k, (cv, gv)) in c.iter().zip(&gg).enumerate() {
                    assert_close(gv, cv, tol(dt) * 8.0, &format!("norm #{k} {dt} {shape:?} transposed={tr}"));
                }
            }
        }
    }
}

#[test]
fn gpu_argreduce_and_cumsum_match_cpu() {
    let Some(g) = gpu() else { return };
    let mut rng = Rng::new(12);
    let dtypes = [DType::F32, DType::F16, DType::BF16, DType::F64, DType::I32, DType::I64, DType::U8, DType::U32];
    for dt in dtypes {
        for shape in [&[5usize, 7][..], &[3, 4, 600], &[9], &[2, 0, 3], &[4, 3, 2]] {
            for tr in [false, true] {
                let n: usize = shape.iter().product();
                // Few distinct values so ties occur; a NaN in float inputs.
                let mut xv: Vec<f64> = rng.vec(n, 0.0, 6.0).into_iter().map(f64::floor).collect();
                if dt.is_float() && n > 3 {
                    xv[n / 2] = f64::NAN;
                }
                for axis in 0..shape.len() as isize {
                    let (c, gg) = both(g, || {
                        let x = input(&xv, shape, dt, tr);
                        // Arg-reductions over an empty axis are errors (checked by the op).
                        let mut v = if shape[axis as usize] > 0 {
                            vec![
                                x.argmax(axis, false).unwrap().to_f64_vec().unwrap(),
                                x.argmin(axis, true).unwrap().to_f64_vec().unwrap(),
                            ]
                        } else {
                            vec![vec![], vec![]]
                        };
                        for (rev, ex) in [(false, false), (true, false), (false, true), (true, true)] {
                            v.push(x.cumsum_with(axis, rev, ex).unwrap().to_f64_vec().unwrap());
                        }
                        v
                    });
                    for (k, (cv, gv)) in c.iter().zip(&gg).enumerate() {
                        let t = if k < 2 || !dt.is_float() { 0.0 } else { tol(dt) * 8.0 };
                        assert_close(gv, cv, t, &format!("#{k} {dt} {shape:?} axis {axis} transposed={tr}"));
                    }
                }
            }
        }
    }
}

#[test]
fn gpu_take_concatenate_pad_match_cpu() {
    let Some(g) = gpu() else { return };
    let mut rng = Rng::new(13);
    for dt in [DType::F32, DType::F16, DType::BF16, DType::F64, DType::I64, DType::U8, DType::Bool] {
        for tr in [false, true] {
            let shape = [4usize, 5, 3];
            let xv = rng.vec(60, -4.0, 4.0);
            let yv = rng.vec(4 * 2 * 3, -4.0, 4.0);
            let (c, gg) = both(g, || {
                let x = input(&xv, &shape, dt, tr);
                let y = Array::from_slice(&yv, &[4, 2, 3]).unwrap().astype(dt).unwrap();
                let mut v = Vec::new();
                for it in [DType::I32, DType::I64] {
                    let idx =
                        Array::from_slice(&[2.0f64, -1.0, 0.0, 4.0, -5.0, 1.0], &[2, 3]).unwrap().astype(it).unwrap();
                    v.push(x.take(&idx, 1).unwrap().to_f64_vec().unwrap());
                }
                for it in [DType::U32, DType::U8] {
                    let idx = Array::from_slice(&[3.0f64, 0.0, 3.0], &[3]).unwrap().astype(it).unwrap();
                    v.push(x.take(&idx, 0).unwrap().to_f64_vec().unwrap());
                }
                v.push(rill::concatenate(&[&x, &y, &x], 1).unwrap().to_f64_vec().unwrap());
                v.push(rill::concatenate(&[&x, &x], 0).unwrap().to_f64_vec().unwrap());
                v.push(x.pad(&[(1, 0), (0, 2), (3, 1)], 7.0).unwrap().to_f64_vec().unwrap());
                v.push(x.pad(&[(0, 0), (0, 0), (0, 0)], 0.0).unwrap().to_f64_vec().unwrap());
                v
            });
            for (k, (cv, gv)) in c.iter().zip(&gg).enumerate() {
                assert_close(gv, cv, 0.0, &format!("#{k} {dt} transposed={tr}"));
            }
        }
    }
    // An out-of-range index is an error naming it, on the GPU as on the CPU.
    common::on(g, || {
        let x = Array::from_slice(&[1.0f32, 2.0, 3.0], &[3]).unwrap();
        let idx = Array::from_slice(&[0i64, 5, 1], &[3]).unwrap();
        let e = x.take(&idx, 0).and_then(|a| a.to_f64_vec()).unwrap_err().to_string();
        assert!(e.contains('5'), "{e}");
    });
}

#[test]
fn gpu_random_equals_cpu() {
    let Some(g) = gpu() else { return };
    for (i, shape) in [&[1000usize][..], &[7, 33], &[], &[0, 5]].into_iter().enumerate() {
        let key = Key::new(100 + i as u64);
        for dt in FLOATS {
            let (c, gg) = both(g, || {
                [
                    rill::random::uniform(key, shape, -2.0, 3.0, dt).unwrap(),
                    rill::random::uniform(key, shape, 0.0, 1.0, dt).unwrap(),
                    rill::random::normal(key, shape, 0.5, 2.0, dt).unwrap(),
                ]
                .map(|a| a.to_f64_vec().unwrap())
            });
            assert_eq!(c[0], gg[0], "uniform {dt} {shape:?}");
            assert_eq!(c[1], gg[1], "uniform01 {dt} {shape:?}");
            assert_close(&gg[2], &c[2], tol(dt), &format!("normal {dt} {shape:?}"));
        }
        let (c, gg) = both(g, || rill::random::bernoulli(key, 0.3, shape).unwrap().to_f64_vec().unwrap());
        assert_eq!(c, gg, "bernoulli {shape:?}");
    }
}

#[test]
fn gpu_compiled_function_equals_cpu() {
    let Some(g) = gpu() else { return };
    let f = rill::compile(|x: &[Array]| {
        let y = x[0].mul(&x[1])?.add(&Array::scalar(1.0f32)?.astype(x[0].dtype())?)?.tanh()?;
        let z = y.sigmoid()?.mul(&x[0])?.sub(&x[1])?;
        Ok(vec![z.exp()?.astype(DType::F32)?])
    });
    let mut rng = Rng::new(14);
    for dt in FLOATS {
        for (sa, sb) in [(&[5usize, 7][..], &[5usize, 7][..]), (&[3, 1, 40], &[2, 40]), (&[], &[6]), (&[0, 3], &[3])] {
            for tr in [false, true] {
                let na: usize = sa.iter().product();
                let nb: usize = sb.iter().product();
                let (av, bv) = (rng.vec(na, -2.0, 2.0), rng.vec(nb, -2.0, 2.0));
                let (c, gg) = both(g, || {
                    let a = input(&av, sa, dt, tr);
                    let b = Array::from_slice(&bv, sb).unwrap().astype(dt).unwrap();
                    f.call(&[a, b]).unwrap()[0].to_f64_vec().unwrap()
                });
                assert_close(&gg, &c, tol(dt) * 8.0, &format!("compiled {dt} {sa:?} {sb:?} transposed={tr}"));
            }
        }
        // The GPU graph really holds a fused node.
        common::on(g, || {
            let a = Array::from_slice(&rng.vec(12, -1.0, 1.0), &[3, 4]).unwrap().astype(dt).unwrap();
            assert!(f.fused_node_count(&[a.clone(), a]).unwrap() > 0);
        });
    }
}
