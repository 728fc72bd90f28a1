//! Whole buffers going back to their stream's cache (`backend/cuda/buffer.rs`, `recycle`):
//! when a storage holds the last reference to a small GPU buffer, the buffer (its device
//! memory and its host allocation) is kept by the stream for its next allocation. Such a
//! buffer refers to the cache that keeps it, so the cache must be emptied when its
//! stream's handle goes, not when its last reference does: dropping a stream returns every
//! byte it cached. Results stay correct while buffers are reused (float64 reference), and
//! active memory is counted once per buffer. One test per binary: the counters are
//! process-wide. Skipped without a GPU (`RILL_REQUIRE_GPU=1` makes a missing GPU a failure).

mod common;

use std::time::{Duration, Instant};

use common::{Rng, assert_close, gpu};
use rill::{Array, DType};

fn reference(v: &[f64], k: usize) -> Vec<f64> {
    v.iter().map(|&x| (0..k).fold(x, |y, _| y * 0.75 + x)).collect()
}

#[test]
fn a_dropped_stream_returns_the_buffers_it_kept() {
    // Counts graphs and cached buffers of one kernel per op: no fusion at eval.
    rill::runtime::set_eval_fusion(false);
    let Some(g) = gpu() else { return };
    let mut rng = Rng::new(11);
    let base = rill::runtime::stats();
    let stream = rill::Stream::new(&g).unwrap();
    for round in 0..5 {
        let v = rng.vec(4096, -1.0, 1.0);
        let x = Array::from_slice(&v, &[4096]).unwrap();
        let got = rill::with_stream(&stream, || {
            let x = x.astype(DType::F32).unwrap();
            let mut y = x.clone();
            // 300 dependent ops: several batches, each reusing the buffers the ones before
            // it gave back.
            for _ in 0..150 {
                y = y.mul(0.75).unwrap().add(&x).unwrap();
            }
            y.to_f64_vec().unwrap()
        });
        assert_close(&got, &reference(&v, 150), 1e-4, &format!("round {round}"));
        let s = rill::runtime::stats();
        assert!(s.bytes_cached > base.bytes_cached, "round {round}: nothing cached ({s:?})");
        assert!(
            s.bytes_active <= base.bytes_active + (256 << 10),
            "round {round}: active memory grew from {} to {} (counted twice or never freed)",
            base.bytes_active,
            s.bytes_active
        );
    }
    // The stream kept megabytes (300 buffers of 16 KiB a round); the host backend's own
    // cache (the readbacks' buffers) holds a few tens of KiB, hence the margin below.
    let kept = rill::runtime::stats().bytes_cached - base.bytes_cached;
    assert!(kept >= 1 << 20, "the stream cached only {kept} bytes: the check below would prove nothing");
    let margin = 256 << 10;
    drop(stream);
    // The stream's last reference may be let go by a runtime thread just after this one:
    // wait for its cached bytes to come back (bounded; no `clear_cache`).
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut now = rill::runtime::stats();
    while now.bytes_cached > base.bytes_cached + margin && Instant::now() < deadline {
        std::thread::yield_now();
        now = rill::runtime::stats();
    }
    assert!(
        now.bytes_cached <= base.bytes_cached + margin,
        "the dropped stream's cache kept its buffers ({} bytes cached before the stream, {kept} more with it, {} after dropping it)",
        base.bytes_cached,
        now.bytes_cached
    );
    assert!(now.bytes_active <= base.bytes_active + (64 << 10), "active memory did not come back: {now:?}");
    // The device still works.
    let one = common::on(g, || {
        Array::from_slice(&[2.0f32], &[1]).unwrap().astype(DType::F32).unwrap().mul(3.0).unwrap().to_f64_vec().unwrap()
    });
    assert_eq!(one, vec![6.0]);
}
