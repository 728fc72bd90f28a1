//! Shutdown while other threads are inside the CUDA driver: readbacks, buffer frees,
//! stream creation and launches racing `shutdown()` (its own test binary, so it owns its
//! process). Shutdown must close the backend gate and wait for every thread inside it,
//! so that after it returns no thread is in the driver (the property that keeps the
//! process's teardown of the driver at exit from crashing).

mod common;

use std::sync::mpsc;

use rill::{Array, DType, Error, Stream};

#[test]
fn shutdown_waits_for_threads_inside_the_driver() {
    let Some(g) = common::gpu() else { return };
    const THREADS: usize = 6;
    let (ready_tx, ready_rx) = mpsc::channel::<()>();
    let mut workers = Vec::new();
    for t in 0..THREADS {
        let ready = ready_tx.clone();
        workers.push(std::thread::spawn(move || -> (usize, Error) {
            let mut rounds = 0usize;
            let err = loop {
                let step = || -> rill::Result<()> {
                    // A new stream per round on some threads: creation and destruction of
                    // CUDA streams race the shutdown too.
                    let s = if t % 2 == 0 { Stream::new(&g)? } else { g.default_stream()? };
                    let _guard = s.enter();
                    let x = Array::full(&[4096 + t], t as f32, DType::F32)?;
                    let y = x.mul(2.0)?.add(1.0)?;
                    let v = y.to_vec::<f32>()?; // a readback on this thread
                    assert_eq!(v[0], 2.0 * t as f32 + 1.0);
                    drop(y); // a device free on this thread
                    Ok(())
                };
                match step() {
                    Ok(()) => {}
                    Err(e) => break e,
                }
                rounds += 1;
                if rounds == 3 {
                    let _ = ready.send(());
                }
            };
            (rounds, err)
        }));
    }
    drop(ready_tx);
    for _ in 0..THREADS {
        ready_rx.recv().expect("every worker ran a few rounds");
    }
    let report = rill::shutdown();
    assert!(report.performed);
    assert!(report.threads_joined, "{report:?}");
    // The gate is closed and empty: nobody is inside the driver now, and nobody can enter.
    let st = rill::runtime::stats();
    assert_eq!(st.threads_in_backend, 0, "{st:?}");
    for w in workers {
        let (rounds, err) = w.join().expect("a worker panicked");
        assert!(rounds >= 3);
        assert!(matches!(err, Error::ShutDown), "worker ended with {err:?}, expected ShutDown");
    }
    let st = rill::runtime::stats();
    assert_eq!(st.threads_in_backend, 0, "{st:?}");
    assert_eq!(st.backend_calls_after_shutdown, 0, "{st:?}");
    assert_eq!(st.threads_live, 0, "{st:?}");
}
