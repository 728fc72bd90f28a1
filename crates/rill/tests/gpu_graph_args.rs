//! CUDA graphs for batches that repeat one launch sequence with other arguments
//! (`backend/cuda/launch.rs`: up to eight graphs per sequence). Its own test binary: the
//! graph counters it reads are process-wide, and no other test may replay graphs
//! meanwhile. Skipped without a GPU (`RILL_REQUIRE_GPU=1` makes a missing GPU a failure).

mod common;

use common::{Rng, assert_close, gpu};
use rill::{Array, DType, Device};

/// A chain long enough for several batches of one launch sequence (128 kernels each on a
/// GPU stream), evaluated again and again on the same input: each batch has its own
/// buffers, and the stream's buffer cache hands every evaluation the same ones in the
/// same order. After a few rounds each batch must replay a graph made for its own
/// arguments, rewriting none (one graph per sequence would have its arguments rewritten
/// by every batch). Every round is checked against float64 on the CPU.
#[test]
fn batches_of_one_sequence_replay_graphs_of_their_own_arguments() {
    // Counts graphs and cached buffers of one kernel per op: no fusion at eval.
    rill::runtime::set_eval_fusion(false);
    let Some(g) = gpu() else { return };
    if std::env::var("RILL_CUDA_GRAPHS").as_deref() == Ok("0") {
        return;
    }
    let mut rng = Rng::new(31);
    let v = rng.vec(16, -1.0, 1.0);
    // Its own stream: its own graph cache and buffer cache, untouched by other tests.
    let s = rill::Stream::new(&g).unwrap();
    let x = rill::with_stream(&s, || {
        let x = Array::from_slice(&v, &[16]).unwrap().astype(DType::F32).unwrap();
        x.eval().unwrap();
        x
    });
    let chain = |x: &Array| -> Array {
        let mut y = x.clone();
        for _ in 0..512 {
            y = y.mul(1.0001).unwrap();
        }
        y
    };
    let want = common::on(Device::cpu(), || chain(&x.astype(DType::F64).unwrap()).to_f64_vec().unwrap());
    let mut updates = Vec::new();
    let mut launches = Vec::new();
    for round in 0..8 {
        let before = rill::runtime::stats();
        let got = rill::with_stream(&s, || {
            let y = chain(&x);
            y.eval().unwrap();
            y.to_f64_vec().unwrap()
        });
        let after = rill::runtime::stats();
        assert_close(&got, &want, 1e-4, &format!("round {round}"));
        updates.push(after.graph_node_updates - before.graph_node_updates);
        launches.push(after.graph_launches - before.graph_launches);
    }
    // Round 0 launches the first batch directly and builds one graph; rounds 1-2 build a
    // graph for each batch's arguments; from round 3 every batch finds its own.
    assert!(launches[3..].iter().all(|&l| l == 4), "batches were not replayed as graphs: {launches:?}");
    assert!(updates[3..].iter().all(|&u| u == 0), "replays rewrote graph arguments: {updates:?}");
}
