//! CUDA graphs (`backend/cuda/launch.rs`): a batch's kernel launches are recorded and
//! sent as one graph launch once the same launch sequence is seen again on a stream, with
//! each replay's new buffer addresses written into the graph's kernel nodes.
//!
//! Each test evaluates the same graph shape several times with new inputs (so the first
//! round launches directly, the second builds a graph, later rounds replay it with new
//! arguments) and compares every round with a float64 evaluation on the CPU. The mixed
//! batch also makes the recorder flush mid-batch: a split reduction frees a temporary,
//! `take` reads an error flag back, matmul calls cuBLAS. Skipped without a GPU
//! (`RILL_REQUIRE_GPU=1` makes a missing GPU a failure).

#![allow(clippy::disallowed_types)] // a test uses rill as a user does, with std's primitives (clippy.toml)

mod common;

use std::sync::{Mutex, MutexGuard};

use common::{Rng, assert_close, gpu};
use rill::{Array, DType, Device, Result};

/// The tests of this file one at a time: they count graph launches, which are global.
fn serial() -> MutexGuard<'static, ()> {
    static LOCK: Mutex<()> = Mutex::new(());
    LOCK.lock().unwrap_or_else(|e| e.into_inner())
}

/// A long chain of dependent tiny ops with scalar operands (the launch-bound case).
fn tiny_chain(x: &Array, n: usize) -> Result<Array> {
    let mut y = x.clone();
    for i in 0..n {
        y = match i % 3 {
            0 => y.mul(1.001)?,
            1 => y.add(x)?,
            _ => y.tanh()?,
        };
    }
    Ok(y)
}

/// Elementwise ops, a broadcast, a split full reduction, row sums, softmax, take, a
/// transposed cumsum, a matmul and a tiny chain, all in one batch.
fn mixed(x: &[Array]) -> Result<Vec<Array>> {
    let (a, b, idx, m1, m2, t) = (&x[0], &x[1], &x[2], &x[3], &x[4], &x[5]);
    let y = a.mul(1.0001)?.add(0.5)?.tanh()?.mul(b)?;
    let total = y.sum(&[], false)?;
    let rows = y.sum(&[1], false)?;
    let sm = y.softmax(-1)?;
    let picked = y.take(idx, 0)?.mul(2.0)?;
    let cum = y.transpose(&[1, 0])?.cumsum(1)?;
    let mm = m1.mul(0.5)?.matmul(m2)?.add(1.0)?;
    let chain = tiny_chain(t, 30)?;
    Ok(vec![total, rows, sm, picked, cum, mm, chain])
}

/// Inputs of `mixed` in `dtype` (indices stay i32) from a seeded generator.
fn inputs(rng: &mut Rng, dtype: DType) -> Vec<Array> {
    let f = |v: Vec<f64>, shape: &[usize]| Array::from_slice(&v, shape).unwrap().astype(dtype).unwrap();
    let idx: Vec<i32> = (0..32).map(|_| (rng.next_u64() % 256) as i32).collect();
    vec![
        f(rng.vec(256 * 1024, -1.0, 1.0), &[256, 1024]),
        f(rng.vec(1024, 0.5, 1.5), &[1024]),
        Array::from_slice(&idx, &[32]).unwrap(),
        f(rng.vec(64 * 128, -1.0, 1.0), &[64, 128]),
        f(rng.vec(128 * 32, -1.0, 1.0), &[128, 32]),
        f(rng.vec(16, -1.0, 1.0), &[16]),
    ]
}

/// Evaluates `mixed` on `device` in one `eval` (inputs first, separately) and reads back.
fn run(device: Device, x: &[Array]) -> Vec<Vec<f64>> {
    common::on(device, || {
        // A cast to the same dtype inside the scope: a copy on `device`.
        let x: Vec<Array> = x.iter().map(|a| a.astype(a.dtype()).unwrap()).collect();
        rill::eval(&x).unwrap();
        let out = mixed(&x).unwrap();
        rill::eval(&out).unwrap();
        out.iter().map(|o| o.to_f64_vec().unwrap()).collect()
    })
}

#[test]
fn repeated_batches_replay_as_graphs_with_new_inputs() {
    let _serial = serial();
    // Counts graphs and cached buffers of one kernel per op: no fusion at eval.
    rill::runtime::set_eval_fusion(false);
    let Some(g) = gpu() else { return };
    let before = rill::runtime::stats();
    let mut rng = Rng::new(7);
    let names = ["total", "rows", "softmax", "take", "cumsum", "matmul", "chain"];
    for round in 0..4 {
        let x = inputs(&mut rng, DType::F32);
        let got = run(g, &x);
        let x64: Vec<Array> =
            x.iter().map(|a| if a.dtype() == DType::I32 { a.clone() } else { a.astype(DType::F64).unwrap() }).collect();
        let want = run(Device::cpu(), &x64);
        for ((name, g), w) in names.iter().zip(&got).zip(&want) {
            // f32 sums of 2^18 terms round that often; the rest are a few ops deep.
            let tol = if *name == "total" || *name == "cumsum" { 1e-3 } else { 1e-4 };
            assert_close(g, w, tol, &format!("round {round}: {name}"));
        }
    }
    let after = rill::runtime::stats();
    if std::env::var("RILL_CUDA_GRAPHS").as_deref() != Ok("0") {
        assert!(after.graphs_built > before.graphs_built, "no graph was built: {before:?} -> {after:?}");
        assert!(after.graph_launches >= before.graph_launches + 2, "graphs were not replayed: {before:?} -> {after:?}");
    }
}

#[test]
fn tiny_chains_on_several_streams_replay_their_own_graphs() {
    let _serial = serial();
    // Counts graphs and cached buffers of one kernel per op: no fusion at eval.
    rill::runtime::set_eval_fusion(false);
    let Some(g) = gpu() else { return };
    common::on_threads(4, |k| {
        let s = rill::Stream::new(&g).unwrap();
        let mut rng = Rng::new(100 + k);
        for round in 0..5 {
            let v = rng.vec(16, -1.0, 1.0);
            let x = Array::from_slice(&v, &[16]).unwrap();
            let got = rill::with_stream(&s, || {
                let xg = x.astype(DType::F32).unwrap();
                xg.eval().unwrap();
                let y = tiny_chain(&xg, 300 + k as usize).unwrap();
                y.to_f64_vec().unwrap()
            });
            let want = common::on(Device::cpu(), || {
                tiny_chain(&x.astype(DType::F64).unwrap(), 300 + k as usize).unwrap().to_f64_vec().unwrap()
            });
            assert_close(&got, &want, 1e-4, &format!("stream {k}, round {round}"));
        }
    });
}

/// The same launch sequence with other arguments every round (the input is a view at a
/// new offset each time): after the first rounds the stream replays the sequence's graph
/// with the first kernel's arguments updated every time. Every round is compared with
/// float64 on the CPU.
#[test]
fn new_arguments_every_round_build_then_update_graphs() {
    let _serial = serial();
    // Counts graphs and cached buffers of one kernel per op: no fusion at eval.
    rill::runtime::set_eval_fusion(false);
    let Some(g) = gpu() else { return };
    let rounds = 48usize;
    let mut rng = Rng::new(11);
    let v = rng.vec(16 * (rounds + 1), -1.0, 1.0);
    // Its own stream: its own graph cache, untouched by the other tests.
    let s = rill::Stream::new(&g).unwrap();
    let big = rill::with_stream(&s, || {
        let b = Array::from_slice(&v, &[16 * (rounds + 1)]).unwrap().astype(DType::F32).unwrap();
        b.eval().unwrap();
        b
    });
    let before = rill::runtime::stats();
    for r in 0..rounds {
        // Offsets of 16 floats keep every view 16-byte aligned: the same kernels each round.
        let (lo, hi) = ((16 * r) as isize, (16 * r + 16) as isize);
        let got = rill::with_stream(&s, || {
            let x = big.slice_axis(0, Some(lo), Some(hi), 1).unwrap();
            tiny_chain(&x, 150).unwrap().to_f64_vec().unwrap()
        });
        let want = common::on(Device::cpu(), || {
            let x = Array::from_slice(&v[16 * r..16 * r + 16], &[16]).unwrap();
            let x = x.astype(DType::F32).unwrap().astype(DType::F64).unwrap();
            tiny_chain(&x, 150).unwrap().to_f64_vec().unwrap()
        });
        assert_close(&got, &want, 1e-4, &format!("round {r}"));
    }
    let after = rill::runtime::stats();
    if std::env::var("RILL_CUDA_GRAPHS").as_deref() != Ok("0") {
        // The first round launches directly (a sequence seen once), the second builds the
        // graph, every later round replays it.
        let launches = after.graph_launches - before.graph_launches;
        assert!(launches + 1 >= rounds as u64, "graphs were not replayed every round: {before:?} -> {after:?}");
    }
}

/// Dependent kernels of many blocks each, replayed as a graph: on sm_90 and later a
/// graph's kernels are chained by programmatic edges (each starts while the previous one
/// runs and waits for its writes in its first statement), so a kernel reading its input
/// too early would show here as values of an earlier step. Every round has new inputs and
/// is checked against float64 on the CPU.
#[test]
fn wide_dependent_kernels_in_graphs_read_their_inputs_complete() {
    let _serial = serial();
    // Counts graphs and cached buffers of one kernel per op: no fusion at eval.
    rill::runtime::set_eval_fusion(false);
    let Some(g) = gpu() else { return };
    let mut rng = Rng::new(2024);
    let before = rill::runtime::stats();
    for round in 0..4 {
        let v = rng.vec(1 << 16, -1.0, 1.0);
        let x = Array::from_slice(&v, &[1 << 16]).unwrap();
        let got = common::on(g, || {
            let xg = x.astype(DType::F32).unwrap();
            xg.eval().unwrap();
            let y = tiny_chain(&xg, 60).unwrap();
            let total = y.sum(&[], false).unwrap();
            rill::eval(&[y.clone(), total.clone()]).unwrap();
            (y.to_f64_vec().unwrap(), total.to_f64_vec().unwrap())
        });
        let want = common::on(Device::cpu(), || {
            let y = tiny_chain(&x.astype(DType::F64).unwrap(), 60).unwrap();
            (y.to_f64_vec().unwrap(), y.sum(&[], false).unwrap().to_f64_vec().unwrap())
        });
        assert_close(&got.0, &want.0, 1e-4, &format!("round {round}: chain"));
        assert_close(&got.1, &want.1, 1e-3, &format!("round {round}: sum"));
    }
    let after = rill::runtime::stats();
    if std::env::var("RILL_CUDA_GRAPHS").as_deref() != Ok("0") {
        assert!(after.graph_launches > before.graph_launches, "no graph was replayed: {before:?} -> {after:?}");
    }
}

/// Layers of one-row attention over a long cache (the decode kernel splits the keys and
/// merges the splits through a temporary it frees at once) and a chain of tiny ops: the
/// temporaries' releases wait for the batch's launches, so a replayed batch is one graph
/// launch, not one per attention call; every round matches float64 on the CPU.
#[test]
fn temporaries_freed_mid_batch_do_not_cut_its_graph() {
    let _serial = serial();
    rill::runtime::set_eval_fusion(false);
    let Some(g) = gpu() else { return };
    let (heads, tk, d, layers) = (4usize, 2048usize, 64usize, 4usize);
    let step = |x: &[Array]| -> Result<Array> {
        let (mut q, k, v) = (x[0].clone(), &x[1], &x[2]);
        for _ in 0..layers {
            let o = rill::scaled_dot_product_attention(&q, k, v, rill::AttentionMask::None, None)?;
            q = tiny_chain(&o, 12)?.mul(0.5)?;
        }
        Ok(q)
    };
    let s = rill::Stream::new(&g).unwrap();
    let mut rng = Rng::new(29);
    for round in 0..4 {
        let host = [
            Array::from_slice(&rng.vec(heads * d, -1.0, 1.0), &[1, heads, 1, d]).unwrap(),
            Array::from_slice(&rng.vec(heads * tk * d, -1.0, 1.0), &[1, heads, tk, d]).unwrap(),
            Array::from_slice(&rng.vec(heads * tk * d, -1.0, 1.0), &[1, heads, tk, d]).unwrap(),
        ];
        let (got, launches) = rill::with_stream(&s, || {
            let x: Vec<Array> = host.iter().map(|a| a.astype(DType::F32).unwrap()).collect();
            rill::eval(&x).unwrap();
            let before = rill::runtime::stats().graph_launches;
            let y = step(&x).unwrap();
            y.eval().unwrap();
            (y.to_f64_vec().unwrap(), rill::runtime::stats().graph_launches - before)
        });
        let want = common::on(Device::cpu(), || {
            let x: Vec<Array> = host.iter().map(|a| a.astype(DType::F64).unwrap()).collect();
            step(&x).unwrap().to_f64_vec().unwrap()
        });
        assert_close(&got, &want, 1e-4, &format!("round {round}"));
        if round >= 2 && std::env::var("RILL_CUDA_GRAPHS").as_deref() != Ok("0") {
            // One graph launch for the batch, where a cut batch launches one per
            // attention call.
            assert_eq!(launches, 1, "round {round}: graph launches for one batch");
        }
    }
}
