//! A GPU stream's pool job waits briefly for the stream's next batch after running one
//! (the scheduler's `linger`); a submitter that finds it waiting hands the batch over with
//! a flag instead of spawning a job. These tests submit with host gaps on both sides of
//! the waiting limits (no gap, tens of microseconds, a few milliseconds), from one thread
//! and from several threads sharing a stream, and check that every batch runs exactly
//! once with the right result and that no thread was started. How many batches were
//! handed over is printed, not asserted: it depends on the host's speed (under
//! compute-sanitizer a round trip takes longer than the job waits, and none are); `rill
//! bench overhead` reports it beside the latency it buys.
//! Skipped without a GPU (`RILL_REQUIRE_GPU=1` makes a missing GPU a failure).

mod common;

use std::time::{Duration, Instant};

use common::gpu;
use rill::{Array, Stream};

/// Busy-waits for `d` on the host: a gap between submissions, never a synchronisation.
fn gap(d: Duration) {
    let t = Instant::now();
    while t.elapsed() < d {
        std::hint::spin_loop();
    }
}

const GAPS: [Duration; 5] = [
    Duration::ZERO,
    Duration::from_micros(20),
    Duration::from_micros(150),
    Duration::from_micros(400),
    Duration::from_millis(3),
];

/// `k`-th step: `x * k + k` for `x = [0, 1, .., 63]`, evaluated on the current stream.
fn step(k: usize) -> Vec<f32> {
    let x: Vec<f32> = (0..64).map(|i| i as f32).collect();
    let y = Array::from_slice(&x, &[64]).unwrap().mul(k as f64).unwrap().add(k as f64).unwrap();
    y.to_vec::<f32>().unwrap()
}

fn check(k: usize, got: &[f32]) {
    for (i, v) in got.iter().enumerate() {
        let want = (i as f64) * k as f64 + k as f64;
        assert_eq!(*v as f64, want, "step {k}, element {i}");
    }
}

#[test]
fn batches_submitted_around_the_waiting_limits_run_once_with_the_right_result() {
    let Some(g) = gpu() else { return };
    let s = Stream::new(&g).unwrap();
    // Warm up: device, kernels, pool.
    rill::with_stream(&s, || check(1, &step(1)));
    let before = rill::runtime::stats();
    for k in 0..400 {
        rill::with_stream(&s, || check(k, &step(k)));
        gap(GAPS[k % GAPS.len()]);
    }
    // Several threads on one stream: a batch may arrive while the job waits, runs, or
    // gives up waiting.
    std::thread::scope(|sc| {
        for t in 0..4usize {
            let s = s.clone();
            sc.spawn(move || {
                for j in 0..100usize {
                    let k = 1000 + t * 100 + j;
                    rill::with_stream(&s, || check(k, &step(k)));
                    gap(GAPS[(j + t) % GAPS.len()]);
                }
            });
        }
    });
    let after = rill::runtime::stats();
    eprintln!("batches handed to a waiting job: {}", after.linger_handoffs - before.linger_handoffs);
    assert_eq!(after.threads_started, before.threads_started, "a thread was started");
    // Every evaluation above finished, so nothing is left in flight.
    assert_eq!(after.in_flight, 0, "{after:?}");
}
