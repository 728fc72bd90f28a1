//! Model check of the backend gate (`crates/rill/src/runtime/gate.rs`), the step of the
//! shutdown sequence that makes exit safe: once `close_and_wait` has returned, no thread
//! is inside a backend library and none can enter, and `close_and_wait` always returns
//! (no lost wake-up between the last pass leaving and the closer waiting).
//!
//! Two entrants each take a pass, "call the driver" (a marked critical section), and drop
//! the pass; a closer closes the gate, waits, then "tears the driver down". In every
//! interleaving no critical section overlaps the teardown, and a closed gate refuses.
//! Seeding a bug shows the model can fail: checking `CLOSED` with a load before adding in
//! `enter` lets an entrant slip in after the closer saw a count of 0 (assertion failure),
//! and notifying without taking the lock in `leave` loses the wake-up (loom reports a
//! deadlock).

use std::time::Duration;

use loom::sync::Arc;
use loom::sync::atomic::{AtomicBool, AtomicUsize, Ordering::SeqCst};
use loom::thread;

use crate::runtime::gate::Gate;

struct Model {
    gate: Gate,
    torn_down: AtomicBool,
    calls: AtomicUsize,
}

fn entrant(m: &Model) {
    if let Some(_pass) = m.gate.enter() {
        assert!(!m.torn_down.load(SeqCst), "a thread entered the driver after teardown");
        m.calls.fetch_add(1, SeqCst);
        assert!(!m.torn_down.load(SeqCst), "the driver was torn down under a thread inside it");
    }
}

#[test]
fn closed_gate_has_nobody_inside() {
    crate::model_bounded(3, || {
        let m = Arc::new(Model { gate: Gate::new(), torn_down: AtomicBool::new(false), calls: AtomicUsize::new(0) });
        let workers: Vec<_> = (0..2)
            .map(|_| {
                let m = m.clone();
                thread::spawn(move || entrant(&m))
            })
            .collect();
        assert!(m.gate.close_and_wait(Duration::from_secs(1)), "close_and_wait gave up");
        m.torn_down.store(true, SeqCst);
        assert!(m.gate.enter().is_none(), "a closed gate gave a pass");
        for w in workers {
            w.join().unwrap();
        }
        assert_eq!(m.gate.inside(), 0);
    });
}

#[test]
fn a_pass_held_across_a_blocking_call_delays_the_closer() {
    loom::model(|| {
        let m = Arc::new(Model { gate: Gate::new(), torn_down: AtomicBool::new(false), calls: AtomicUsize::new(0) });
        let pass = m.gate.enter().expect("open gate");
        let m2 = m.clone();
        let closer = thread::spawn(move || {
            assert!(m2.gate.close_and_wait(Duration::from_secs(1)));
            m2.torn_down.store(true, SeqCst);
        });
        // Inside the "driver" while the closer runs: teardown must wait for us.
        m.calls.fetch_add(1, SeqCst);
        assert!(!m.torn_down.load(SeqCst));
        drop(pass);
        closer.join().unwrap();
        assert!(m.torn_down.load(SeqCst));
    });
}
