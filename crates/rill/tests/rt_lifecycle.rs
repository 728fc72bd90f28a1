//! Lifecycle calls from any thread (no main thread), and shutdown while other threads
//! submit. One test in this binary: shutdown is permanent for the process.

#![allow(clippy::disallowed_types)] // a test uses rill as a user does, with std's primitives (clippy.toml)

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use rill::{Array, DType, Device, Error, Stream, runtime};

#[test]
fn lifecycle_from_any_thread_then_shutdown_under_load() {
    // The main thread uses rill, then never again until the end.
    let made_on_main = Array::full(&[1000], 4.0, DType::F32).unwrap().sqrt().unwrap();
    made_on_main.eval().unwrap();
    let kept_stream = Stream::new(&Device::cpu()).unwrap();
    let pending_before = Array::full(&[8], 1.0, DType::F32).unwrap().exp().unwrap();

    // No main thread: every lifecycle call from a spawned thread.
    let a = made_on_main.clone();
    std::thread::spawn(move || {
        let s = Stream::new(&Device::cpu()).unwrap();
        let x = rill::with_stream(&s, || a.mul(2.0).unwrap());
        rill::submit(std::slice::from_ref(&x)).unwrap();
        rill::synchronize(&s).unwrap();
        assert!(x.is_evaluated(), "synchronize returned before the stream's work finished");
        rill::synchronize_all().unwrap();
        assert_eq!(x.to_vec::<f32>().unwrap(), vec![4.0; 1000]);
        drop(x);
        // The worker that ran the batch may release its reference just after the waiter
        // woke: wait (spinning, bounded) for the 4000-byte buffer to reach the cache.
        let start = std::time::Instant::now();
        while runtime::cached_memory() < 4000 {
            std::thread::yield_now();
            assert!(start.elapsed().as_secs() < 60, "freed buffer never reached the cache");
        }
        rill::clear_cache();
        assert!(runtime::cached_memory() < 4000, "clear_cache left {} bytes", runtime::cached_memory());
        let st = runtime::stats();
        assert!(st.streams_live >= 2 && st.threads_live == runtime::cpu_threads(), "{st:?}");
    })
    .join()
    .unwrap();

    // Shutdown from one thread while eight others submit.
    let started = Arc::new(AtomicUsize::new(0));
    let submitters: Vec<_> = (0..8)
        .map(|t| {
            let started = started.clone();
            std::thread::spawn(move || -> Result<usize, String> {
                let own = if t % 2 == 0 { Stream::new(&Device::cpu()).ok() } else { None };
                let _g = own.as_ref().map(|s| s.enter());
                let mut n = 0usize;
                loop {
                    let r = Array::full(&[4096], t as f64, DType::F32)
                        .and_then(|x| x.mul(2.0))
                        .and_then(|y| y.tanh())
                        .and_then(|y| if n.is_multiple_of(2) { y.eval() } else { rill::submit(&[y]) });
                    match r {
                        Ok(()) => {
                            if n == 0 {
                                started.fetch_add(1, Ordering::SeqCst);
                            }
                            n += 1;
                        }
                        Err(Error::ShutDown) => return Ok(n),
                        Err(e) => return Err(format!("thread {t}: unexpected error {e}")),
                    }
                }
            })
        })
        .collect();
    while started.load(Ordering::SeqCst) < 8 {
        std::thread::yield_now();
    }
    let report = std::thread::spawn(rill::shutdown).join().unwrap();
    assert!(report.performed, "{report:?}");
    assert!(report.threads_joined, "{report:?}");
    assert_eq!(report.abandoned, 0, "{report:?}");
    for h in submitters {
        let n = h.join().unwrap().unwrap();
        assert!(n >= 1);
    }

    // Afterwards: new work is refused with ShutDown, from any thread.
    assert!(matches!(Array::full(&[2], 1.0, DType::F32), Err(Error::ShutDown)));
    assert!(matches!(Stream::new(&Device::cpu()), Err(Error::ShutDown)));
    assert!(matches!(pending_before.eval(), Err(Error::ShutDown)));
    assert!(matches!(made_on_main.add(1.0), Err(Error::ShutDown)));
    let e = std::thread::spawn(|| Array::from_slice(&[1.0f32], &[1]).map(|_| ())).join().unwrap();
    assert!(matches!(e, Err(Error::ShutDown)));
    // Values computed before shutdown stay readable on the host.
    assert_eq!(made_on_main.to_vec::<f32>().unwrap()[0], 2.0);
    // A second shutdown does nothing.
    assert!(!rill::shutdown().performed);
    assert!(runtime::is_down());
    // Everything dropped afterwards is silent and calls no backend.
    drop(made_on_main);
    drop(kept_stream);
    drop(pending_before);
    let st = runtime::stats();
    assert_eq!(st.backend_calls_after_shutdown, 0, "{st:?}");
    assert_eq!(st.threads_live, 0, "{st:?}");
    assert_eq!(st.threads_in_backend, 0, "{st:?}");
    assert_eq!(st.in_flight, 0, "{st:?}");
}
