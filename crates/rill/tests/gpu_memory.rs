//! How much device memory a long GPU evaluation holds. A GPU stream's job keeps the node
//! handles of batches it ran (letting go of them later saves the launches behind them the
//! time), but only up to a bound on their outputs' bytes (`runtime/scheduler.rs`,
//! `Finished`), so a long chain of large ops holds about one batch of intermediates at a
//! time, as when every batch let go of its nodes at once. One test per binary: the memory
//! counters are process-wide. Skipped without a GPU (`RILL_REQUIRE_GPU=1` makes a missing
//! GPU a failure).

mod common;

use common::{Rng, assert_close, gpu};
use rill::{Array, DType};

#[test]
fn a_long_chain_of_large_ops_holds_a_bounded_set_of_intermediates() {
    let Some(g) = gpu() else { return };
    let stream = rill::Stream::new(&g).unwrap();
    let n = 1usize << 18; // 1 MiB of f32 per intermediate
    let steps = 1000;
    let v = Rng::new(5).vec(n, -1.0, 1.0);
    let got = rill::with_stream(&stream, || {
        let x = Array::from_slice(&v, &[n]).unwrap().astype(DType::F32).unwrap();
        x.eval().unwrap();
        // Compile the kernel first, so the measured evaluation only runs it.
        x.mul(1.0001).unwrap().eval().unwrap();
        let base = rill::runtime::active_memory();
        rill::runtime::reset_peak_memory();
        let mut y = x.clone();
        for _ in 0..steps {
            y = y.mul(1.0001).unwrap();
        }
        y.eval().unwrap();
        let held = rill::runtime::peak_memory() - base;
        // One batch of 128 intermediates, plus the bound on kept outputs (16 MiB), plus a
        // few buffers in between; keeping every batch of the chain would be 1000 MiB.
        let most = (128 + 16 + 8) << 20;
        assert!(held <= most, "the chain held {} MiB at its peak (at most {} MiB)", held >> 20, most >> 20);
        y.to_f64_vec().unwrap()
    });
    let k = 1.0001f64.powi(steps);
    let want: Vec<f64> = v.iter().map(|&x| (x as f32) as f64 * k).collect();
    assert_close(&got, &want, 1e-3, "x * 1.0001^1000");
}
