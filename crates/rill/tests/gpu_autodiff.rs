//! The autodiff transforms on a GPU in f32: gradients (eager, compiled, of a compiled
//! function) and forward-mode products of functions covering every rule family, against
//! the same transforms in float64 on the CPU (skipped without a GPU; `RILL_REQUIRE_GPU=1`
//! makes a missing GPU a failure).

mod common;

use common::{Rng, assert_close, gpu};
use rill::{Array, AttentionMask, DType, Device, Result, SliceArg};

type F = fn(&[Array]) -> Result<Vec<Array>>;

fn mlp(x: &[Array]) -> Result<Vec<Array>> {
    let h = x[2].matmul(&x[0])?.add(&x[1])?.gelu_tanh()?;
    let h = h.add(&x[3])?.layer_norm(None, None, 1e-5)?.rms_norm(Some(&x[1]), 1e-5)?;
    Ok(vec![common::chain(&[h.clone(), h.mul(0.5)?])?.remove(0).mean(&[], false)?])
}

fn mixed(x: &[Array]) -> Result<Vec<Array>> {
    let idx = Array::from_slice(&[2i64, 0, -1, 2], &[4])?;
    let s = x[0].softmax(-1)?.take(&idx, 1)?.slice(&[SliceArg::full(), SliceArg::new(None, None, -2)])?;
    let p = x[0].log_softmax(0)?.prod(&[0], false)?.maximum(&x[1].max(&[0], false)?)?;
    let c = x[0].cumsum_with(1, true, false)?.pad(&[(1, 0), (0, 2)], 3.0)?.var(&[-1], true, 1)?;
    Ok(vec![s.sum_all()?.add(&p.sum_all()?)?.add(&c.sum_all()?)?.add(&x[1].logsumexp(&[], false)?)?])
}

fn attention(x: &[Array]) -> Result<Vec<Array>> {
    let o = rill::scaled_dot_product_attention(&x[0], &x[1], &x[2], AttentionMask::Causal, None)?;
    Ok(vec![o.square()?.sum_all()?])
}

fn inputs(case: usize, rng: &mut Rng) -> Vec<(Vec<f64>, Vec<usize>)> {
    let shapes: Vec<Vec<usize>> = match case {
        0 => vec![vec![6, 8], vec![8], vec![5, 6], vec![5, 8]],
        1 => vec![vec![4, 3], vec![4, 3]],
        _ => vec![vec![1, 4, 3, 8], vec![1, 2, 5, 8], vec![1, 2, 5, 4]],
    };
    shapes.into_iter().map(|s| (rng.vec(s.iter().product(), -1.0, 1.0), s)).collect()
}

/// The gradients of `f` at `vals` on `device` in `dtype`, by `mode`: 0 eager, 1
/// `compile(grad(f))`, 2 `grad(compile(f))`, 3 the forward-mode products along ones.
fn grads(f: F, vals: &[(Vec<f64>, Vec<usize>)], device: Device, dtype: DType, mode: usize) -> Vec<Vec<f64>> {
    common::on(device, || {
        let xs: Vec<Array> =
            vals.iter().map(|(v, s)| Array::from_slice(v, s).unwrap().astype(dtype).unwrap()).collect();
        let all: Vec<usize> = (0..xs.len()).collect();
        let out = match mode {
            0 => rill::grad(f, &all).call(&xs).unwrap(),
            1 => {
                let g = rill::grad(f, &all);
                rill::compile(move |x| g.call(x)).call(&xs).unwrap()
            }
            2 => {
                let c = rill::compile(f);
                rill::grad(move |x| c.call(x), &all).call(&xs).unwrap()
            }
            _ => {
                let ones: Vec<Array> = xs.iter().map(|x| x.ones_like().unwrap()).collect();
                rill::jvp(f, &xs, &ones).unwrap().1
            }
        };
        out.iter().map(|a| a.to_f64_vec().unwrap()).collect()
    })
}

#[test]
fn gpu_gradients_match_cpu_f64() {
    let Some(g) = gpu() else { return };
    let mut rng = Rng::new(1);
    let fs: [(&str, F); 3] = [("mlp", mlp), ("mixed", mixed), ("attention", attention)];
    for (case, (name, f)) in fs.iter().enumerate() {
        let vals = inputs(case, &mut rng);
        for mode in 0..4 {
            let want = grads(*f, &vals, Device::cpu(), DType::F64, mode);
            let got = grads(*f, &vals, g, DType::F32, mode);
            for (i, (a, b)) in got.iter().zip(&want).enumerate() {
                assert_close(a, b, 2e-3, &format!("{name} mode {mode} result {i}"));
            }
        }
    }
}

/// bf16 attention gradients through the fused backward kernels (64-row tiles on both
/// sides, so lengths below, at and past 64; grouped heads; causal with more or fewer
/// queries than keys; q, k, v as strided `[B, T, H, D]` views as a projection gives them),
/// eager and compiled, against float64 on the CPU from the same rounded inputs. The CPU's
/// bf16 gradient (the same fused nodes) is checked too, so this runs without a GPU.
#[test]
fn gpu_bf16_attention_gradients_match_cpu_f64() {
    let devices: Vec<Device> = [Device::cpu()].into_iter().chain(gpu()).collect();
    let mut rng = Rng::new(21);
    for case in 0..12 {
        let d = [16, 32, 64, 128, 48, 64][case % 6];
        let causal = case % 2 == 0;
        let (hkv, group) = (1 + case % 2, [1, 2, 3][case % 3]);
        let hq = hkv * group;
        let tq = 1 + (rng.next_u64() % 150) as usize;
        let tk = if case % 4 == 3 { tq } else { 1 + (rng.next_u64() % 150) as usize };
        let b = 1 + case % 2;
        // Strided: stored [B, T, H, D] and read through a swap of T and H.
        let strided = case % 3 != 1;
        let shape = |h: usize, t: usize| if strided { vec![b, t, h, d] } else { vec![b, h, t, d] };
        let shapes = [shape(hq, tq), shape(hkv, tk), shape(hkv, tk), vec![b, hq, tq, d]];
        // bf16-rounded values, so the float64 reference starts from the same inputs.
        let bf = |v: Vec<f64>, s: &[usize]| Array::from_slice(&v, s).unwrap().astype(DType::BF16).unwrap();
        let vals: Vec<(Vec<f64>, Vec<usize>)> = shapes
            .iter()
            .map(|s| (bf(rng.vec(s.iter().product(), -1.0, 1.0), s).to_f64_vec().unwrap(), s.clone()))
            .collect();
        let f = move |x: &[Array]| -> Result<Vec<Array>> {
            let view = |a: &Array| if strided { a.swapaxes(1, 2) } else { Ok(a.clone()) };
            let mask = if causal { AttentionMask::Causal } else { AttentionMask::None };
            let o = rill::scaled_dot_product_attention(&view(&x[0])?, &view(&x[1])?, &view(&x[2])?, mask, None)?;
            Ok(vec![o.mul(&x[3])?.astype(DType::F32)?.sum_all()?])
        };
        let run = |device: Device, dtype: DType, compiled: bool| -> Vec<Vec<f64>> {
            common::on(device, || {
                let xs: Vec<Array> =
                    vals.iter().map(|(v, s)| Array::from_slice(v, s).unwrap().astype(dtype).unwrap()).collect();
                let gr = rill::grad(f, &[0, 1, 2]);
                let out = if compiled {
                    let c = rill::compile(move |x| gr.call(x));
                    if device != Device::cpu() {
                        let counts = c.primitive_counts(&xs).unwrap();
                        assert_eq!(
                            counts.get("scaled_dot_product_attention_grad"),
                            Some(&3),
                            "case {case}: {counts:?}"
                        );
                    }
                    c.call(&xs).unwrap()
                } else {
                    gr.call(&xs).unwrap()
                };
                out.iter().map(|a| a.to_f64_vec().unwrap()).collect()
            })
        };
        let want = run(Device::cpu(), DType::F64, false);
        for (device, compiled) in devices.iter().flat_map(|&d| [(d, false), (d, true)]) {
            let got = run(device, DType::BF16, compiled);
            for (i, (a, w)) in got.iter().zip(&want).enumerate() {
                // bf16 rounds P and dS before their products: a bound relative to the largest entry.
                let top = w.iter().fold(0f64, |m, x| m.max(x.abs()));
                let err = a.iter().zip(w).fold(0f64, |m, (x, y)| m.max((x - y).abs()));
                assert!(
                    err <= 0.03 * top + 1e-3,
                    "case {case} (d {d}, hq {hq}, hkv {hkv}, tq {tq}, tk {tk}, causal {causal}, strided {strided}, {device:?}, compiled {compiled}): input {i}: max error {err} against max {top}"
                );
            }
        }
    }
}
