//! GPU batch events are pooled: a sequence of evaluations records its batches' events
//! into a few reused handles instead of creating (and destroying) one per batch. Alone in
//! its test binary, so no other test's batches move the counter.

mod common;

use common::gpu;

use rill::{Array, DType};

#[test]
fn a_sequence_of_evals_reuses_a_few_events() {
    let Some(g) = gpu() else { return };
    let rounds = 64;
    let (got, made) = common::on(g, || {
        let x = Array::from_slice(&[0.5f32; 64], &[64]).unwrap().astype(DType::F32).unwrap();
        x.eval().unwrap();
        // Warm up: the kernels are compiled and the first events created.
        let mut y = x.add(1.0).unwrap();
        y.eval().unwrap();
        let before = rill::runtime::stats().events_created;
        for _ in 0..rounds {
            y = y.add(1.0).unwrap();
            y.eval().unwrap(); // one batch, one event, waited for
        }
        let made = rill::runtime::stats().events_created - before;
        (y.to_vec::<f32>().unwrap(), made)
    });
    let want = 0.5 + 1.0 + rounds as f64;
    assert!(got.iter().all(|&v| v as f64 == want), "values {:?} (want {want})", &got[..4]);
    // Without reuse every round creates one; with it a handle comes back once the event's
    // batch is done and its buffer has been replaced, so a handful cover every round.
    assert!(made <= 8, "{made} events created for {rounds} evaluations");
}
