//! Shutdown with GPU work in flight (its own test binary, so it owns its process).

use rill::{Array, Device, Stream};

#[test]
fn gpu_shutdown_with_work_in_flight() {
    let g = match Device::gpu(0) {
        Ok(g) => g,
        Err(e) => {
            assert!(std::env::var("RILL_REQUIRE_GPU").as_deref() != Ok("1"), "RILL_REQUIRE_GPU=1 but no GPU: {e}");
            eprintln!("skipped: no GPU ({e})");
            return;
        }
    };
    let s = Stream::new(&g).unwrap();
    let outs: Vec<Array> = rill::with_stream(&s, || {
        (0..8)
            .map(|i| {
                let mut x = Array::full(&[1 << 20], i as f32, rill::DType::F32).unwrap();
                for _ in 0..100 {
                    x = x.mul(1.0001).unwrap().add(0.5).unwrap();
                }
                x
            })
            .collect()
    });
    let fut = rill::async_eval(&outs);
    drop(fut);
    let report = rill::shutdown();
    assert!(report.performed);
    assert!(report.threads_joined, "{report:?}");
    // Everything is either computed or failed with ShutDown; nothing hangs or panics.
    for o in &outs {
        let _ = o.eval();
    }
    assert!(Array::from_slice(&[1.0f32], &[1]).is_err());
    assert_eq!(rill::runtime::stats().backend_calls_after_shutdown, 0);
    drop(outs);
    drop(s);
}
