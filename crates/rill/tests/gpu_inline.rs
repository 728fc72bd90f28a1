//! A blocking `eval` that finds a GPU stream idle runs that stream's batches on the calling
//! thread (it would otherwise only wait); `submit` and `async_eval` never do, and kernels
//! are compiled on the runtime's pool even when a batch runs on a user thread. The threads
//! are told apart by a host node (`rill::custom`) that records where it ran.
//! Skipped without a GPU (`RILL_REQUIRE_GPU=1` makes a missing GPU a failure).

#![allow(clippy::disallowed_types)] // a test uses rill as a user does, with std's primitives (clippy.toml)

mod common;

use std::sync::{Arc, Mutex};
use std::thread::ThreadId;

use common::gpu;
use rill::{Array, DType, Stream};

type Seen = Arc<Mutex<Vec<ThreadId>>>;

/// A node that records the thread it ran on and passes its input through.
fn traced(x: &Array, seen: &Seen) -> Array {
    let seen = seen.clone();
    rill::custom("traced", &[x], x.shape(), x.dtype(), move |ins| {
        seen.lock().unwrap().push(std::thread::current().id());
        Ok(ins[0].clone())
    })
    .unwrap()
}

/// `n` steps of `y = y * 0.999 + 0.5` (a contraction: rounding errors do not grow with `n`).
fn steps(y: Array, n: usize) -> Array {
    (0..n).fold(y, |y, _| y.mul(0.999).unwrap().add(0.5).unwrap())
}

fn want(start: &[f32], n: usize) -> Vec<f64> {
    start.iter().map(|&v| (0..n).fold(v as f64, |y, _| y * 0.999 + 0.5)).collect()
}

fn check(got: &Array, want: &[f64], what: &str) {
    let v = got.to_f64_vec().unwrap();
    assert_eq!(v.len(), want.len(), "{what}");
    for (i, (g, w)) in v.iter().zip(want).enumerate() {
        assert!((g - w).abs() <= 1e-4 * w.abs().max(1.0), "{what}, element {i}: {g} against {w}");
    }
}

#[test]
fn a_blocking_eval_runs_an_idle_gpu_streams_batches_on_the_calling_thread() {
    let Some(g) = gpu() else { return };
    // Counts batches of one node per op: no fusion at eval.
    rill::runtime::set_eval_fusion(false);
    let s = Stream::new(&g).unwrap();
    let start = [1.0f32, -2.0, 3.5, 40.0];
    // 600 nodes: several batches of at most 128 run on the caller in a row.
    let n = 300;
    let me = std::thread::current().id();

    let seen: Seen = Arc::default();
    let y = rill::with_stream(&s, || traced(&steps(Array::from_slice(&start, &[4]).unwrap(), n), &seen));
    let before = rill::runtime::stats();
    rill::eval(std::slice::from_ref(&y)).unwrap();
    let after = rill::runtime::stats();
    check(&y, &want(&start, n), "eval");
    assert_eq!(*seen.lock().unwrap(), vec![me], "a blocking eval's batches ran elsewhere");
    assert!(after.inline_batches - before.inline_batches >= 5, "{before:?}\n{after:?}");

    // `submit` returns without waiting: its batches run on the pool.
    let seen: Seen = Arc::default();
    let y = rill::with_stream(&s, || traced(&steps(Array::from_slice(&start, &[4]).unwrap(), n), &seen));
    rill::submit(std::slice::from_ref(&y)).unwrap();
    check(&y, &want(&start, n), "submit");
    assert_eq!(seen.lock().unwrap().len(), 1);
    assert_ne!(seen.lock().unwrap()[0], me, "submit ran a batch on the caller");

    // `async_eval` never blocks its executor's thread with the stream's work.
    let seen: Seen = Arc::default();
    let y = rill::with_stream(&s, || traced(&steps(Array::from_slice(&start, &[4]).unwrap(), n), &seen));
    let rt = tokio::runtime::Builder::new_current_thread().build().unwrap();
    rt.block_on(rill::async_eval(std::slice::from_ref(&y))).unwrap();
    check(&y, &want(&start, n), "async_eval");
    assert_eq!(seen.lock().unwrap().len(), 1);
    assert_ne!(seen.lock().unwrap()[0], me, "async_eval ran a batch on the executor's thread");
}

#[test]
fn a_kernel_needed_by_an_inline_eval_is_compiled_on_the_pool() {
    let Some(g) = gpu() else { return };
    let s = Stream::new(&g).unwrap();
    // `sin` over f16 is used by no other test of this file: its kernel is compiled here,
    // during an eval whose batch runs on this thread.
    let x: Vec<f64> = (0..256).map(|i| (i as f64) * 0.0123 - 1.5).collect();
    let before = rill::runtime::stats();
    let y = rill::with_stream(&s, || {
        Array::from_slice(&x.iter().map(|&v| v as f32).collect::<Vec<_>>(), &[256])
            .unwrap()
            .astype(DType::F16)
            .unwrap()
            .sin()
            .unwrap()
    });
    rill::eval(std::slice::from_ref(&y)).unwrap();
    let after = rill::runtime::stats();
    assert!(after.inline_batches > before.inline_batches, "the eval did not run inline: {after:?}");
    assert!(after.kernels_compiled > before.kernels_compiled, "nothing was compiled: {after:?}");
    assert_eq!(after.kernels_compiled_on_user_threads, 0, "a kernel was compiled on a user thread: {after:?}");
    let got = y.to_f64_vec().unwrap();
    for (i, (g, v)) in got.iter().zip(&x).enumerate() {
        // f16 input and output: two roundings of at most 2^-11 relative each.
        let w = (half::f16::from_f64(*v).to_f64()).sin();
        assert!((g - w).abs() <= 2e-3 * w.abs().max(0.05), "element {i}: {g} against {w}");
    }
}

#[test]
fn threads_sharing_gpu_streams_with_cross_stream_inputs_get_their_own_results() {
    let Some(g) = gpu() else { return };
    let (s1, s2) = (Stream::new(&g).unwrap(), Stream::new(&g).unwrap());
    // Warm up (kernels, pool) before counting threads.
    let w = rill::with_stream(&s1, || steps(Array::from_slice(&[1.0f32], &[1]).unwrap(), 2));
    check(&w, &want(&[1.0], 2), "warm-up");
    let before = rill::runtime::stats();
    // Each thread: a chain on one stream, continued on the other (the second stream waits
    // on the GPU for the first one's event), evaluated with a blocking eval, so that every
    // combination of a caller owning a stream, a pool job owning it and a handoff to the
    // pool happens while other threads submit to the same streams.
    std::thread::scope(|sc| {
        for t in 0..8usize {
            let (s1, s2) = (s1.clone(), s2.clone());
            sc.spawn(move || {
                for round in 0..25usize {
                    let start = [t as f32, round as f32, -(t as f32) * 3.0];
                    let (n1, n2) = (40 + 31 * ((t + round) % 7), 20 + 17 * (round % 5));
                    let (a, b) = if (t + round) % 2 == 0 { (&s1, &s2) } else { (&s2, &s1) };
                    let y = rill::with_stream(a, || steps(Array::from_slice(&start, &[3]).unwrap(), n1));
                    let z = rill::with_stream(b, || steps(y.clone(), n2));
                    rill::eval(&[z.clone(), y.clone()]).unwrap();
                    check(&y, &want(&start, n1), "first stream");
                    check(&z, &want(&start, n1 + n2), "second stream");
                }
            });
        }
    });
    let after = rill::runtime::stats();
    assert_eq!(after.threads_started, before.threads_started, "a thread was started");
    assert!(after.inline_batches > before.inline_batches, "no batch ran inline: {after:?}");
    assert_eq!(after.kernels_compiled_on_user_threads, 0, "{after:?}");
}
