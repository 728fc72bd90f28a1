//! Calling eval and async_eval from many new threads creates no stream and no thread.
//! (One test in this binary, so the process-wide counters are not disturbed.)

#![allow(clippy::disallowed_types)] // a test uses rill as a user does, with std's primitives (clippy.toml)

use rill::{Array, DType, runtime};

#[test]
fn eval_from_new_threads_creates_no_streams_or_threads() {
    // Warm up: the default CPU stream and the worker pool exist after the first eval.
    Array::full(&[4], 1.0, DType::F32).unwrap().add(1.0).unwrap().eval().unwrap();
    let before = runtime::stats();
    let shared = Array::full(&[64], 2.0, DType::F32).unwrap().exp().unwrap();
    let handles: Vec<_> = (0..48)
        .map(|i| {
            let shared = shared.clone();
            std::thread::spawn(move || {
                let x = Array::full(&[64], i as f64, DType::F32).unwrap();
                let y = x.mul(2.0).unwrap().add(&shared).unwrap();
                y.eval().unwrap();
                // async_eval driven by a minimal executor on this thread (no runtime threads).
                let z = y.sqrt().unwrap();
                let fut = rill::async_eval(std::slice::from_ref(&z));
                block_on(fut).unwrap();
                z.to_vec::<f32>().unwrap()[0]
            })
        })
        .collect();
    for (i, h) in handles.into_iter().enumerate() {
        let v = h.join().unwrap();
        let want = ((i as f32) * 2.0 + 2f32.exp()).sqrt();
        assert!((v - want).abs() < 1e-4, "thread {i}: {v} vs {want}");
    }
    let after = runtime::stats();
    assert_eq!(after.streams_created, before.streams_created, "streams were created: {before:?} -> {after:?}");
    assert_eq!(after.threads_started, before.threads_started, "threads were started: {before:?} -> {after:?}");
    assert_eq!(after.threads_live, before.threads_live);
    assert!(after.threads_live <= runtime::cpu_threads());
}

fn block_on<F: std::future::Future>(fut: F) -> F::Output {
    use std::sync::{Arc, Condvar, Mutex};
    use std::task::{Context, Poll, Wake, Waker};
    struct W(Mutex<bool>, Condvar);
    impl Wake for W {
        fn wake(self: Arc<Self>) {
            *self.0.lock().unwrap() = true;
            self.1.notify_one();
        }
    }
    let w = Arc::new(W(Mutex::new(false), Condvar::new()));
    let waker = Waker::from(w.clone());
    let mut fut = std::pin::pin!(fut);
    loop {
        if let Poll::Ready(v) = fut.as_mut().poll(&mut Context::from_waker(&waker)) {
            return v;
        }
        let mut g = w.0.lock().unwrap();
        while !*g {
            g = w.1.wait(g).unwrap();
        }
        *g = false;
    }
}
