//! `rill::compile`: results against float64 references, caching, simplification, fusion,
//! failing traces, and concurrent callers.

#![allow(clippy::disallowed_types)] // a test uses rill as a user does, with std's primitives (clippy.toml)

mod common;

use common::chain;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use common::{Rng, array_of, assert_close, devices, on, tol};
use rill::primitives::Primitive;
use rill::{Array, DType, compile, compile_shapeless};

fn chain_ref(a: f64, b: f64) -> f64 {
    let y = a * b + 1.0;
    let y = y.tanh() * 0.5 + a;
    let y = y * y - b;
    1.0 / (1.0 + (-y).exp())
}

fn bcast_index(i: usize, out: &[usize], shape: &[usize]) -> usize {
    let (mut rem, mut idx, mut stride) = (i, 0, 1);
    for ax in (0..out.len()).rev() {
        let c = rem % out[ax];
        rem /= out[ax];
        let k = ax as isize - (out.len() - shape.len()) as isize;
        if k >= 0 {
            let d = shape[k as usize];
            if d != 1 {
                idx += c * stride;
            }
            stride *= d;
        }
    }
    idx
}

#[test]
fn chain_matches_float64_reference() {
    let mut rng = Rng::new(7);
    let f = compile(chain);
    let cases: &[(&[usize], &[usize])] =
        &[(&[5, 7], &[5, 7]), (&[3, 1, 4], &[2, 4]), (&[], &[6]), (&[0, 3], &[3]), (&[], &[]), (&[40, 70], &[70])];
    for dev in devices() {
        for dtype in [DType::F32, DType::F64, DType::F16, DType::BF16] {
            for (sa, sb) in cases {
                on(dev, || {
                    let na: usize = sa.iter().product();
                    let nb: usize = sb.iter().product();
                    let (a, ra) = array_of(&rng.vec(na, -2.0, 2.0), sa, dtype);
                    let (b, rb) = array_of(&rng.vec(nb, -2.0, 2.0), sb, dtype);
                    let out = &f.call(&[a.clone(), b.clone()]).unwrap()[0];
                    let plain = &chain(&[a, b]).unwrap()[0];
                    assert_eq!(out.shape(), plain.shape());
                    assert_eq!(out.dtype(), dtype);
                    let shape = out.shape().to_vec();
                    let want: Vec<f64> = (0..out.size())
                        .map(|i| chain_ref(ra[bcast_index(i, &shape, sa)], rb[bcast_index(i, &shape, sb)]))
                        .collect();
                    let got = out.to_f64_vec().unwrap();
                    // Rounding at each op boundary in f16/bf16 compounds over the chain.
                    assert_close(&got, &want, tol(dtype) * 8.0, &format!("{dtype} {sa:?} {sb:?}"));
                    // Compiled and uncompiled agree exactly on the CPU.
                    if !dev.is_gpu() {
                        assert_eq!(got, plain.to_f64_vec().unwrap(), "{dtype} {sa:?} {sb:?}");
                    }
                });
            }
        }
    }
}

#[test]
fn chain_is_one_fused_node() {
    let f = compile(chain);
    let a = Array::from_slice(&[0.5f32, -1.0, 2.0], &[3]).unwrap();
    let b = Array::from_slice(&[1.5f32], &[1]).unwrap();
    let out = f.call(&[a.clone(), b.clone()]).unwrap();
    match out[0].primitive() {
        Primitive::Fused(p) => {
            // mul add tanh mul add mul sub sigmoid
            assert_eq!(p.op_count(), 8, "{p}");
            assert_eq!(p.input_dtypes(), &[DType::F32, DType::F32]);
        }
        p => panic!("expected a fused node, got {p:?}"),
    }
    assert_eq!(out[0].inputs().len(), 2);
    assert_eq!(f.fused_node_count(&[a, b]).unwrap(), 1);
}

#[test]
fn cache_hits_and_retraces_on_new_shapes() {
    let f = compile(chain);
    let mk = |n: usize| Array::from_vec((0..n).map(|i| i as f32 * 0.1).collect::<Vec<_>>(), &[n]).unwrap();
    let (a, b) = (mk(4), mk(4));
    f.call(&[a.clone(), b.clone()]).unwrap()[0].eval().unwrap();
    assert_eq!(f.trace_count(), 1);
    f.call(&[mk(4), mk(4)]).unwrap()[0].eval().unwrap();
    assert_eq!(f.trace_count(), 1, "same shapes hit the cache");
    f.call(&[mk(5), mk(5)]).unwrap()[0].eval().unwrap();
    assert_eq!(f.trace_count(), 2, "new shapes retrace");
    f.call(&[a.astype(DType::F64).unwrap(), b.astype(DType::F64).unwrap()]).unwrap()[0].eval().unwrap();
    assert_eq!(f.trace_count(), 3, "new dtypes retrace");
    assert_eq!(f.cache_len(), 3);
    // Another stream is another key.
    let s = rill::Stream::new(&rill::Device::cpu()).unwrap();
    rill::with_stream(&s, || f.call(&[mk(4), mk(4)]).unwrap()[0].eval().unwrap());
    assert_eq!(f.trace_count(), 4, "a new target stream retraces");
}

#[test]
fn shapeless_replays_on_new_shapes() {
    let f = compile_shapeless(chain);
    let mut rng = Rng::new(3);
    for (i, (sa, sb)) in [(vec![4, 3], vec![3]), (vec![2, 5], vec![5]), (vec![7, 1], vec![6]), (vec![0, 2], vec![2])]
        .into_iter()
        .enumerate()
    {
        let na: usize = sa.iter().product();
        let nb: usize = sb.iter().product();
        let (a, ra) = array_of(&rng.vec(na, -1.0, 1.0), &sa, DType::F32);
        let (b, rb) = array_of(&rng.vec(nb, -1.0, 1.0), &sb, DType::F32);
        let out = &f.call(&[a, b]).unwrap()[0];
        let shape = out.shape().to_vec();
        let want: Vec<f64> = (0..out.size())
            .map(|i| chain_ref(ra[bcast_index(i, &shape, &sa)], rb[bcast_index(i, &shape, &sb)]))
            .collect();
        assert_close(&out.to_f64_vec().unwrap(), &want, tol(DType::F32) * 4.0, &format!("case {i}"));
        assert_eq!(f.trace_count(), 1, "shapeless mode traces once per ranks");
    }
    // Shapes that do not broadcast: the error names them.
    let a = Array::zeros(&[2, 3], DType::F32).unwrap();
    let b = Array::zeros(&[4], DType::F32).unwrap();
    let e = f.call(&[a, b]).unwrap_err().to_string();
    assert!(e.contains("[2, 3]") && e.contains("[4]"), "{e}");
    // New ranks retrace.
    f.call(&[Array::zeros(&[3], DType::F32).unwrap(), Array::zeros(&[3], DType::F32).unwrap()]).unwrap();
    assert_eq!(f.trace_count(), 2);
}

#[test]
fn shapeless_falls_back_to_retracing_for_shape_specific_ops() {
    // A fill of the input's shape is not shape-polymorphic: one trace per shape.
    let f = compile_shapeless(|x: &[Array]| {
        let ones = Array::ones(x[0].shape(), x[0].dtype())?;
        Ok(vec![x[0].add(&ones)?.exp()?])
    });
    for n in [2usize, 3, 4] {
        let a = Array::from_vec(vec![0.5f32; n], &[n]).unwrap();
        let out = f.call(&[a]).unwrap()[0].to_vec::<f32>().unwrap();
        assert_eq!(out, vec![1.5f32.exp(); n]);
    }
    assert_eq!(f.trace_count(), 3, "first trace per ranks, then one per new shape");
}

#[test]
fn cse_merges_equal_subexpressions_and_scalars() {
    let f = compile(|x: &[Array]| {
        let a = &x[0];
        let p = a.mul(2.0)?.exp()?;
        let q = a.mul(2.0)?.exp()?;
        Ok(vec![p.clone(), q, p.add(a.mul(2.0)?)?])
    });
    let a = Array::from_slice(&[0.25f32, -0.5], &[2]).unwrap();
    let out = f.call(std::slice::from_ref(&a)).unwrap();
    assert_eq!(out[0].id(), out[1].id(), "equal expressions are one node");
    let want: Vec<f32> = [0.25f32, -0.5].iter().map(|&v| (v * 2.0).exp() + v * 2.0).collect();
    assert_eq!(out[2].to_vec::<f32>().unwrap(), want);
    // Host callbacks are never merged.
    let calls = Arc::new(AtomicUsize::new(0));
    let c2 = calls.clone();
    let g = compile(move |x: &[Array]| {
        let mk = || {
            let c = c2.clone();
            rill::custom("count", &[&x[0]], x[0].shape(), DType::F32, move |v| {
                c.fetch_add(1, Ordering::SeqCst);
                Ok(v[0].clone())
            })
        };
        Ok(vec![mk()?.add(&mk()?)?])
    });
    let out = g.call(&[a]).unwrap();
    assert_eq!(out[0].to_vec::<f32>().unwrap(), vec![0.5, -1.0]);
    assert_eq!(calls.load(Ordering::SeqCst), 2);
}

#[test]
fn captured_arrays_are_constants() {
    let w = Array::from_slice(&[1.0f32, 2.0, 3.0], &[3]).unwrap();
    let lazy = w.mul(10.0).unwrap(); // captured unevaluated, not depending on inputs
    let (w2, l2) = (w.clone(), lazy.clone());
    let f = compile(move |x: &[Array]| Ok(vec![x[0].mul(&w2)?.add(&l2)?, l2.clone(), x[0].clone()]));
    let a = Array::from_slice(&[1.0f32, 1.0, 1.0], &[3]).unwrap();
    for _ in 0..2 {
        let out = f.call(std::slice::from_ref(&a)).unwrap();
        assert_eq!(out[0].to_vec::<f32>().unwrap(), vec![11.0, 22.0, 33.0]);
        assert_eq!(out[1].id(), lazy.id(), "a captured array is returned as is");
        assert_eq!(out[2].id(), a.id(), "an input returned as is");
    }
}

#[test]
fn failing_traces_do_not_poison_the_cache() {
    let fail = Arc::new(AtomicBool::new(true));
    let panic = Arc::new(AtomicBool::new(false));
    let (f2, p2) = (fail.clone(), panic.clone());
    let f = compile(move |x: &[Array]| {
        if p2.load(Ordering::SeqCst) {
            panic!("traced function panicked");
        }
        if f2.load(Ordering::SeqCst) {
            return Err(rill::Error::InvalidArgument { op: "test", msg: "refused".into() });
        }
        Ok(vec![x[0].exp()?.add(1.0)?])
    });
    let a = Array::from_slice(&[0.0f32, 1.0], &[2]).unwrap();
    let e = f.call(std::slice::from_ref(&a)).unwrap_err().to_string();
    assert!(e.contains("refused"), "{e}");
    assert_eq!(f.cache_len(), 0);
    fail.store(false, Ordering::SeqCst);
    panic.store(true, Ordering::SeqCst);
    let e = f.call(std::slice::from_ref(&a)).unwrap_err().to_string();
    assert!(e.contains("traced function panicked"), "{e}");
    assert_eq!(f.cache_len(), 0);
    panic.store(false, Ordering::SeqCst);
    let out = f.call(std::slice::from_ref(&a)).unwrap();
    assert_eq!(out[0].to_vec::<f32>().unwrap(), vec![2.0, 1.0f32.exp() + 1.0]);
    assert_eq!(f.trace_count(), 3);
    assert_eq!(f.cache_len(), 1);
    // Once cached, the flags no longer matter (no retrace).
    fail.store(true, Ordering::SeqCst);
    assert!(f.call(std::slice::from_ref(&a)).is_ok());
    assert_eq!(f.trace_count(), 3);
}

#[test]
fn evaluating_an_input_while_tracing_is_an_error() {
    let f = compile(|x: &[Array]| {
        let y = x[0].exp()?;
        let v = y.to_vec::<f32>()?; // evaluates a placeholder: must fail, not hang
        Ok(vec![y.add(v[0])?])
    });
    let a = Array::from_slice(&[1.0f32], &[1]).unwrap();
    let e = f.call(std::slice::from_ref(&a)).unwrap_err().to_string();
    assert!(e.contains("placeholder"), "{e}");
    // Swallowing the error does not produce a broken tape either.
    let g = compile(|x: &[Array]| {
        let y = x[0].exp()?;
        let _ = y.eval();
        Ok(vec![y.add(1.0)?])
    });
    let e = g.call(&[a]).unwrap_err().to_string();
    assert!(e.contains("lazy"), "{e}");
}

#[test]
fn static_arguments_are_part_of_the_key() {
    let f = rill::compile::compile_with_static(|x: &[Array], s: &[i64]| Ok(vec![x[0].mul(s[0] as f64)?.add(1.0)?]));
    let a = Array::from_slice(&[1.0f32, 2.0], &[2]).unwrap();
    for k in [2i64, 3, 2, 3] {
        let out = f.call_with_static(std::slice::from_ref(&a), &[k]).unwrap();
        assert_eq!(out[0].to_vec::<f32>().unwrap(), vec![k as f32 + 1.0, 2.0 * k as f32 + 1.0]);
    }
    assert_eq!(f.trace_count(), 2);
}

#[test]
fn non_elementwise_ops_replay_generically() {
    // A host callback between fused chains: replayed as is, fused around.
    let f = compile(|x: &[Array]| {
        let y = x[0].mul(2.0)?.add(1.0)?;
        let z = rill::custom("double", &[&y], y.shape(), DType::F32, |v| Ok(v[0].iter().map(|t| t * 2.0).collect()))?;
        Ok(vec![z.sub(1.0)?.abs()?])
    });
    let a = Array::from_slice(&[1.0f32, -2.0, 0.25], &[3]).unwrap();
    for _ in 0..3 {
        let out = f.call(std::slice::from_ref(&a)).unwrap()[0].to_vec::<f32>().unwrap();
        assert_eq!(out, vec![5.0, 7.0, 2.0]);
    }
    assert_eq!(f.trace_count(), 1);
    assert_eq!(f.fused_node_count(&[a]).unwrap(), 2);
}

#[test]
fn mixed_dtypes_casts_predicates_and_where() {
    let f = compile(|x: &[Array]| {
        let (a, i) = (&x[0], &x[1]);
        let m = a.gt(&i.astype(DType::F16)?)?;
        let w = rill::where_(&m, &a.exp()?, &a.neg()?)?;
        let c = w.astype(DType::F32)?.add(&i.astype(DType::F32)?)?.logical_not()?;
        Ok(vec![w.astype(DType::F64)?.mul(0.1)?, c])
    });
    let mut rng = Rng::new(11);
    let (a, _) = array_of(&rng.vec(24, -3.0, 3.0), &[4, 6], DType::F16);
    let i = Array::from_vec((0..6).map(|k| k - 3).collect::<Vec<i32>>(), &[6]).unwrap();
    let got = f.call(&[a.clone(), i.clone()]).unwrap();
    let want = {
        let m = a.gt(i.astype(DType::F16).unwrap()).unwrap();
        let w = rill::where_(&m, a.exp().unwrap(), a.neg().unwrap()).unwrap();
        let c = w.astype(DType::F32).unwrap().add(i.astype(DType::F32).unwrap()).unwrap().logical_not().unwrap();
        vec![w.astype(DType::F64).unwrap().mul(0.1).unwrap(), c]
    };
    assert_eq!(got[0].to_vec::<f64>().unwrap(), want[0].to_vec::<f64>().unwrap());
    assert_eq!(got[1].to_bool_vec().unwrap(), want[1].to_bool_vec().unwrap());
    assert!(matches!(got[0].primitive(), Primitive::Fused(_)));
}

#[test]
fn concurrent_threads_trace_once_per_shape() {
    let f = compile(chain);
    let threads: Vec<_> = (0..16)
        .map(|t| {
            let f = f.clone();
            std::thread::spawn(move || {
                let n = 3 + t % 2; // two shapes
                for r in 0..20 {
                    let av: Vec<f32> = (0..n).map(|i| (i + t + r) as f32 * 0.01).collect();
                    let bv: Vec<f32> = (0..n).map(|i| 0.5 - i as f32 * 0.1).collect();
                    let a = Array::from_slice(&av, &[n]).unwrap();
                    let b = Array::from_slice(&bv, &[n]).unwrap();
                    let got = f.call(&[a, b]).unwrap()[0].to_vec::<f32>().unwrap();
                    for i in 0..n {
                        let w = chain_ref(av[i] as f64, bv[i] as f64);
                        assert!((got[i] as f64 - w).abs() < 1e-5, "thread {t}: {} vs {w}", got[i]);
                    }
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    assert_eq!(f.trace_count(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_tasks_trace_once_per_shape() {
    let f = compile(chain);
    let mut tasks = Vec::new();
    for t in 0..32usize {
        let f = f.clone();
        tasks.push(tokio::spawn(async move {
            let n = 5 + t % 2;
            let av: Vec<f32> = (0..n).map(|i| (i * t) as f32 * 0.01).collect();
            let bv: Vec<f32> = (0..n).map(|i| i as f32 * -0.2).collect();
            let a = Array::from_slice(&av, &[n]).unwrap();
            let b = Array::from_slice(&bv, &[n]).unwrap();
            let out = f.call(&[a, b]).unwrap();
            rill::async_eval(&out).await.unwrap();
            let got = out[0].to_vec::<f32>().unwrap();
            for i in 0..n {
                let w = chain_ref(av[i] as f64, bv[i] as f64);
                assert!((got[i] as f64 - w).abs() < 1e-5, "task {t}: {} vs {w}", got[i]);
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    assert_eq!(f.trace_count(), 2);
}

#[test]
fn compiled_functions_never_mix_results() {
    let a = Array::from_slice(&[1.0f32, 2.0], &[2]).unwrap();
    for i in 0..1000 {
        let (c1, c2) = (i as f32, -(i as f32) - 0.5);
        let k1 = Array::scalar(c1).unwrap();
        let f = compile(move |x: &[Array]| Ok(vec![x[0].mul(2.0)?.add(&k1)?]));
        let g = compile(move |x: &[Array]| Ok(vec![x[0].mul(2.0)?.add(c2)?]));
        let (fo, go) = (f.call(std::slice::from_ref(&a)).unwrap(), g.call(std::slice::from_ref(&a)).unwrap());
        assert_eq!(fo[0].to_vec::<f32>().unwrap(), vec![2.0 + c1, 4.0 + c1], "iteration {i}");
        assert_eq!(go[0].to_vec::<f32>().unwrap(), vec![2.0 + c2, 4.0 + c2], "iteration {i}");
        assert_ne!(f.id(), g.id());
        drop((f, g));
    }
}
