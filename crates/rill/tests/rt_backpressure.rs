//! Backpressure and the memory limit. One test per concern, run in sequence in one
//! test function because the memory limit is process-wide.

#![allow(clippy::disallowed_types)] // a test uses rill as a user does, with std's primitives (clippy.toml)

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};

use rill::{Array, DType, Device, Stream, runtime};

/// A gate: a host op that blocks its stream until opened.
struct Gate(Mutex<bool>, Condvar);
impl Gate {
    fn new() -> Arc<Gate> {
        Arc::new(Gate(Mutex::new(false), Condvar::new()))
    }
    fn open(&self) {
        *self.0.lock().unwrap() = true;
        self.1.notify_all();
    }
    fn wait(&self) {
        let mut g = self.0.lock().unwrap();
        while !*g {
            g = self.1.wait(g).unwrap();
        }
    }
    fn node(self: &Arc<Self>) -> Array {
        let gate = self.clone();
        rill::custom("gate", &[], &[1], DType::F32, move |_| {
            gate.wait();
            Ok(vec![0.0])
        })
        .unwrap()
    }
}

fn wait_until(what: &str, cond: impl Fn() -> bool) {
    // Spin with yields (no sleeps): the condition is driven by other threads.
    let start = std::time::Instant::now();
    while !cond() {
        std::thread::yield_now();
        assert!(start.elapsed().as_secs() < 60, "timed out waiting for {what}");
    }
}

#[test]
fn queue_and_memory_bounds() {
    // The bounds count queued nodes: each op of the chains below must stay one.
    runtime::set_eval_fusion(false);
    // ---- bounded queued work per stream ----
    let s = Stream::new(&Device::cpu()).unwrap();
    let gate = Gate::new();
    let blocker = rill::with_stream(&s, || gate.node());
    rill::submit(std::slice::from_ref(&blocker)).unwrap();
    let waits_before = runtime::stats().queue_waits;
    let done = Arc::new(AtomicBool::new(false));
    let producer = {
        let s = s.clone();
        let done = done.clone();
        std::thread::spawn(move || {
            let _g = s.enter();
            let mut x = Array::full(&[4], 0.0, DType::F32).unwrap();
            for _ in 0..3 * Stream::MAX_QUEUED_NODES {
                x = x.add(1.0).unwrap();
            }
            x.eval().unwrap();
            done.store(true, Ordering::SeqCst);
            x.to_vec::<f32>().unwrap()
        })
    };
    wait_until("the producer to hit the queue bound", || runtime::stats().queue_waits > waits_before);
    assert!(!done.load(Ordering::SeqCst));
    let queued = s.queued_nodes();
    assert!(queued <= Stream::MAX_QUEUED_NODES + 512, "queued {queued} nodes");
    gate.open();
    let v = producer.join().unwrap();
    assert_eq!(v, vec![(3 * Stream::MAX_QUEUED_NODES) as f32; 4]);

    // ---- memory limit: submitters wait for completions before running further ahead ----
    let s = Stream::new(&Device::cpu()).unwrap();
    let gate = Gate::new();
    let blocker = rill::with_stream(&s, || gate.node());
    rill::submit(std::slice::from_ref(&blocker)).unwrap();
    const MB: usize = 1 << 20;
    let limit = 16 * MB;
    let base = runtime::active_memory();
    let prev = runtime::set_memory_limit(base + limit);
    let mem_waits_before = runtime::stats().memory_waits;
    let producer = {
        let s = s.clone();
        std::thread::spawn(move || {
            let _g = s.enter();
            let mut sums = Vec::new();
            for i in 0..40 {
                // Each constant holds 4 MiB of host memory until its queued op has run.
                let c = Array::from_slice(&vec![i as f32; MB], &[MB]).unwrap();
                let y = c.mul(2.0).unwrap();
                rill::submit(std::slice::from_ref(&y)).unwrap();
                sums.push(y);
            }
            sums
        })
    };
    wait_until("the producer to wait for memory", || runtime::stats().memory_waits > mem_waits_before);
    let held = runtime::active_memory().saturating_sub(base);
    assert!(held <= limit + 8 * MB, "memory ran ahead of the limit: {} MiB held", held / MB);
    gate.open();
    let ys = producer.join().unwrap();
    for (i, y) in ys.iter().enumerate() {
        assert_eq!(y.to_vec::<f32>().unwrap()[MB - 1], 2.0 * i as f32);
    }
    runtime::set_memory_limit(prev);

    // ---- a batch frees each intermediate once its last reader ran, not at its end ----
    let s = Stream::new(&Device::cpu()).unwrap();
    let _g = s.enter();
    let x = Array::from_slice(&vec![1.0f32; MB], &[MB]).unwrap();
    x.eval().unwrap();
    let base = runtime::active_memory();
    runtime::reset_peak_memory();
    // 64 unfused ops of 4 MiB each: one batch, of which only the last is held.
    let mut y = x.clone();
    for _ in 0..64 {
        y = y.mul(1.5).unwrap();
    }
    y.eval().unwrap();
    let peak = runtime::peak_memory() - base;
    assert!(peak <= 4 * 4 * MB, "a chain of 64 ops held {} MiB at its peak", peak / MB);
    assert_eq!(y.to_vec::<f32>().unwrap()[MB - 1], (0..64).fold(1.0f32, |v, _| v * 1.5));
}
