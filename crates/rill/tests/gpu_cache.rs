//! The CUDA backend's per-stream cache of small buffers (`backend/cuda/cache.rs`): memory
//! freed on a stream is kept (counted in `bytes_cached`, not in `bytes_active`), reused by
//! that stream's next allocations with correct results, and returned by `clear_cache`.
//! One test per binary: the counters are process-wide. Skipped without a GPU
//! (`RILL_REQUIRE_GPU=1` makes a missing GPU a failure).

mod common;

use common::{Rng, assert_close, gpu};
use rill::{Array, DType};

fn reference(v: &[f64], k: usize) -> Vec<f64> {
    v.iter().map(|&x| (0..k).fold(x, |y, _| (y * 1.5 + x).tanh())).collect()
}

#[test]
fn small_buffers_are_reused_counted_and_returned() {
    let Some(g) = gpu() else { return };
    let mut rng = Rng::new(3);
    let stream = rill::Stream::new(&g).unwrap();
    let base = rill::runtime::stats();
    for round in 0..6 {
        let v = rng.vec(1000, -1.0, 1.0);
        let x = Array::from_slice(&v, &[1000]).unwrap();
        let got = rill::with_stream(&stream, || {
            let x = x.astype(DType::F32).unwrap();
            let mut y = x.clone();
            for _ in 0..20 {
                y = y.mul(1.5).unwrap().add(&x).unwrap().tanh().unwrap();
            }
            y.to_f64_vec().unwrap()
        });
        assert_close(&got, &reference(&v, 20), 1e-5, &format!("round {round}"));
        // Every intermediate of the round is dropped by now: its memory is cached.
        let s = rill::runtime::stats();
        assert!(s.bytes_cached > 0, "round {round}: nothing cached ({s:?})");
    }
    drop(stream);
    let mid = rill::runtime::stats();
    assert!(
        mid.bytes_active <= base.bytes_active + (64 << 10),
        "active memory did not come back: {} -> {}",
        base.bytes_active,
        mid.bytes_active
    );
    rill::clear_cache();
    let end = rill::runtime::stats();
    assert_eq!(end.bytes_cached, 0, "clear_cache left cached memory: {end:?}");
    // The device still works after its caches were emptied.
    let one = common::on(g, || {
        Array::from_slice(&[2.0f32], &[1]).unwrap().astype(DType::F32).unwrap().mul(3.0).unwrap().to_f64_vec().unwrap()
    });
    assert_eq!(one, vec![6.0]);
}
