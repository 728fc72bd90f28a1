//! A bounded shutdown under load, on the CPU and GPU 0 at once (its own test binary: it
//! shuts the process's runtime down). Threads keep submitting long chains on their own
//! streams while `shutdown_timeout` gives them 1 ms: running batches are cut short and
//! their next nodes refused. A refusal is not a backend call:
//! `backend_calls_after_shutdown` counts only calls made without a pass of the closed
//! backend gate, and must stay 0 (it once counted each refused node).

#![allow(clippy::disallowed_types)] // a test uses rill as a user does, with std's primitives (clippy.toml)

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::SeqCst};
use std::time::Duration;

use rill::{Array, DType, Error, Stream};

mod common;

#[test]
fn a_bounded_shutdown_under_load_makes_no_backend_call_after_it() {
    let devices = common::devices();
    let stop = AtomicBool::new(false);
    let started = AtomicUsize::new(0);
    let shut_down_seen = AtomicUsize::new(0);
    std::thread::scope(|sc| {
        for (t, &d) in devices.iter().cycle().take(4 * devices.len()).enumerate() {
            let (stop, started, seen) = (&stop, &started, &shut_down_seen);
            sc.spawn(move || {
                let Ok(s) = Stream::new(&d) else { return };
                let _g = s.enter();
                let mut first = true;
                while !stop.load(SeqCst) {
                    let r = (|| {
                        let mut x = Array::full(&[4096 + t], 1.0, DType::F32)?;
                        for _ in 0..400 {
                            x = x.mul(1.0001)?.add(1e-4)?;
                        }
                        rill::submit(std::slice::from_ref(&x))?;
                        if first {
                            started.fetch_add(1, SeqCst);
                            first = false;
                        }
                        x.eval()
                    })();
                    match r {
                        Ok(()) => {}
                        Err(Error::ShutDown) => {
                            seen.fetch_add(1, SeqCst);
                            return;
                        }
                        Err(e) => panic!("{d}: unexpected error {e}"),
                    }
                }
            });
        }
        // Shut down once every thread has work in flight.
        while started.load(SeqCst) < 4 * devices.len() {
            std::thread::yield_now();
        }
        let report = rill::runtime::shutdown_timeout(Duration::from_millis(1));
        assert!(report.performed);
        stop.store(true, SeqCst);
    });
    let st = rill::runtime::stats();
    assert!(shut_down_seen.load(SeqCst) > 0, "no thread saw the shutdown: {st:?}");
    assert_eq!(st.backend_calls_after_shutdown, 0, "{st:?}");
    assert_eq!(st.threads_in_backend, 0, "{st:?}");
}
