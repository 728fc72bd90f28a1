//! The GPU with CUDA graphs off (`RILL_CUDA_GRAPHS=0`): every kernel then goes out
//! directly instead of through a batch's recording, a path the rest of the suite (graphs
//! on) reaches only for short batches. Generated cases of every kernel family against the
//! CPU on the same inputs: elementwise and broadcasting, casts, reductions over any axes,
//! norms and softmax, matmul, movement copies, take/scatter, compiled (fused) programs,
//! attention, quantized products, rope and slice updates, sort. Skipped without a GPU
//! (`RILL_REQUIRE_GPU=1` makes that a failure).
//!
//! This binary holds one test: it sets the variable before anything touches the GPU
//! (the backend reads it once), with no other test thread running.

mod common;

use common::{Rng, assert_close, gpu};
use rill::quant::{QMatrix, QuantFormat, qmatmul};
use rill::{Array, AttentionMask, DType, Device, RopeOptions};

/// Runs `f` on the CPU and on `g`; returns both results as f64 values.
fn both(g: Device, f: impl Fn() -> Array) -> (Vec<f64>, Vec<f64>) {
    let run = |d: Device| common::on(d, || f().astype(DType::F64).unwrap().to_vec::<f64>().unwrap());
    (run(Device::cpu()), run(g))
}

fn shape(rng: &mut Rng, rank: usize) -> Vec<usize> {
    (0..rank).map(|_| 1 + (rng.next_u64() % 9) as usize).collect()
}

#[test]
fn gpu_kernels_launched_directly_match_cpu() {
    // SAFETY: the only test of this binary, run before it starts any thread of its own.
    unsafe { std::env::set_var("RILL_CUDA_GRAPHS", "0") };
    let Some(g) = gpu() else { return };
    let mut rng = Rng::new(2027);
    let mut checked = 0;
    let mut check = |what: String, (c, gg): (Vec<f64>, Vec<f64>), tol: f64| {
        assert_eq!(c.len(), gg.len(), "{what}: lengths");
        assert_close(&gg, &c, tol, &what);
        checked += 1;
    };
    for case in 0..24 {
        let dt = [DType::F32, DType::BF16, DType::F16, DType::F64][case % 4];
        let tol = match dt {
            DType::F32 | DType::F64 => 1e-4,
            _ => 5e-2,
        };
        let rank = 1 + case % 4;
        let s = shape(&mut rng, rank);
        let n: usize = s.iter().product();
        let (xv, yv) = (rng.vec(n, -2.0, 2.0), rng.vec(n, -2.0, 2.0));
        let x = || Array::from_slice(&xv, &s).unwrap().astype(dt).unwrap();
        let y = || Array::from_slice(&yv, &s).unwrap().astype(dt).unwrap();
        let what = |op: &str| format!("case {case}: {op} {dt:?} {s:?}");
        check(what("exp"), both(g, || x().exp().unwrap()), tol);
        check(what("tanh+mul"), both(g, || x().tanh().unwrap().mul(y()).unwrap()), tol);
        check(
            what("row broadcast add"),
            both(g, || x().add(y().slice_axis(0, Some(0), Some(1), 1).unwrap()).unwrap()),
            tol,
        );
        check(what("where"), both(g, || rill::where_(&x().gt(y()).unwrap(), x(), y()).unwrap()), tol);
        check(what("cast to i32"), both(g, || x().mul(3.0).unwrap().astype(DType::I32).unwrap()), 0.0);
        let axis = (case % rank) as isize;
        check(what("sum over an axis"), both(g, || x().sum(&[axis], false).unwrap()), tol * 4.0);
        let all: Vec<isize> = (0..rank as isize).collect();
        check(what("max over all"), both(g, || x().max(&all, false).unwrap()), tol);
        check(what("softmax"), both(g, || x().softmax(-1).unwrap()), tol);
        check(what("rms_norm"), both(g, || x().rms_norm(None, 1e-5).unwrap()), tol);
        check(what("transpose copy"), both(g, || x().transpose(&[]).unwrap().contiguous().unwrap()), 0.0);
        check(what("concatenate"), both(g, || rill::concatenate(&[&x(), &y()], -1).unwrap()), 0.0);
        check(what("cumsum"), both(g, || x().cumsum(-1).unwrap()), tol * 4.0);
        let idx: Vec<i32> = (0..5).map(|_| (rng.next_u64() % s[0] as u64) as i32).collect();
        check(what("take"), both(g, || x().take(&Array::from_slice(&idx, &[5]).unwrap(), 0).unwrap()), 0.0);
        check(what("sort"), both(g, || x().sort(-1, false).unwrap()), 0.0);
        let f = rill::compile(|a: &[Array]| Ok(vec![a[0].mul(&a[1])?.add(1.0)?.sigmoid()?.sum(&[-1], false)?]));
        check(what("compiled chain"), both(g, || f.call(&[x(), y()]).unwrap().remove(0)), tol * 4.0);
    }
    for case in 0..6 {
        let dt = [DType::F32, DType::BF16][case % 2];
        let tol = if dt == DType::F32 { 1e-3 } else { 5e-2 };
        let (m, k, nn) = (1 + (rng.next_u64() % 40) as usize, 32 * (1 + case), 1 + (rng.next_u64() % 50) as usize);
        let (av, bv) = (rng.vec(m * k, -1.0, 1.0), rng.vec(k * nn, -1.0, 1.0));
        let a = || Array::from_slice(&av, &[m, k]).unwrap().astype(dt).unwrap();
        let b = || Array::from_slice(&bv, &[k, nn]).unwrap().astype(dt).unwrap();
        check(format!("matmul {dt:?} {m}x{k}x{nn}"), both(g, || a().matmul(&b()).unwrap()), tol * k as f64);
        let w: Vec<f32> = rng.vec(nn * k, -1.0, 1.0).into_iter().map(|v| v as f32).collect();
        for f in QuantFormat::ALL {
            let wq =
                |d: Device| common::on(d, || QMatrix::quantize(&Array::from_slice(&w, &[nn, k]).unwrap(), f).unwrap());
            let (wc, wg) = (wq(Device::cpu()), wq(g));
            let c = common::on(Device::cpu(), || {
                qmatmul(&a(), &wc).unwrap().astype(DType::F64).unwrap().to_vec::<f64>().unwrap()
            });
            let gg = common::on(g, || qmatmul(&a(), &wg).unwrap().astype(DType::F64).unwrap().to_vec::<f64>().unwrap());
            check(format!("qmatmul {f:?} {dt:?} {m}x{k}x{nn}"), (c, gg), tol * k as f64);
        }
        let (hq, hkv, tq, tk, d) = (4, 2, 1 + case, 3 + 2 * case, 64);
        let (qv, kv, vv) =
            (rng.vec(hq * tq * d, -1.0, 1.0), rng.vec(hkv * tk * d, -1.0, 1.0), rng.vec(hkv * tk * d, -1.0, 1.0));
        let q = || Array::from_slice(&qv, &[1, hq, tq, d]).unwrap().astype(dt).unwrap();
        let kk = || Array::from_slice(&kv, &[1, hkv, tk, d]).unwrap().astype(dt).unwrap();
        let v = || Array::from_slice(&vv, &[1, hkv, tk, d]).unwrap().astype(dt).unwrap();
        let att = || rill::scaled_dot_product_attention(&q(), &kk(), &v(), AttentionMask::Causal, None).unwrap();
        check(format!("attention {dt:?} {tq}x{tk}"), both(g, att), tol);
        let pos = Array::from_slice(&[case as i32 * 3], &[1]).unwrap();
        check(format!("rope {dt:?}"), both(g, || q().rope(&pos, RopeOptions::new(d, 10000.0)).unwrap()), tol);
        let cache = || Array::zeros(&[1, hkv, tk + tq, d], dt).unwrap();
        let start = Array::from_slice(&[case as i32], &[1]).unwrap();
        let upd = || q().slice_axis(1, Some(0), Some(hkv as isize), 1).unwrap();
        check(format!("slice_update {dt:?}"), both(g, || cache().slice_update(&upd(), &start, 2).unwrap()), 0.0);
    }
    assert_eq!(checked, 24 * 15 + 6 * 7);
}
