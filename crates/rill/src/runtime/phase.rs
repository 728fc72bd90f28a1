//! The runtime's lifecycle state and the order of the shutdown sequence, apart from what
//! each step does: `lifecycle.rs` runs [`Phase::shutdown`] with the runtime's steps (the
//! scheduler's drain and cancel, the device workers, the CPU pool); the loom model in
//! `crates/rill-loom/src/loom_shutdown.rs` runs exactly this file with its own.
//!
//! | state | entered by | means |
//! |---|---|---|
//! | `RUNNING` | start | work is accepted |
//! | `DRAINING` | `shutdown` (the one compare-exchange that starts it) | intake stopped: no new op, eval or stream; no `Drop` calls a backend |
//! | `CANCELLED` | `shutdown`, after the drain | a batch that has not started is refused, not run |
//! | `DOWN` | `shutdown`, at its end | workers stopped |
//!
//! The sequence, and why in this order:
//! 1. `RUNNING → DRAINING` stops intake. Submitters check [`Phase::is_running`] under
//!    their stream's queue lock, so a batch either was pushed before this or is refused.
//! 2. [`Steps::drain`]: in-flight work gets a bounded time to finish.
//! 3. `CANCELLED` is stored, *then* [`Steps::cancel_queued`] fails the batches still
//!    queued. A stream's job that takes a batch after the store refuses it (the batch
//!    runners check [`Phase::is_cancelled`]), so no batch still queued when the cancel
//!    begins ever runs.
//! 4. The backend [`Gate`] closes and shutdown waits for every pass taken before
//!    ([`Gate::close_and_wait`], bounded by [`Steps::gate_bound`]): from here no thread is
//!    inside, or may enter, a backend library.
//! 5. [`Steps::stop_workers`]: only now, with nobody inside the driver, are the workers
//!    stopped and joined (a completion worker holds a pass while it waits for an event).
//! 6. `DOWN`.

use std::time::Duration;

use crate::runtime::gate::Gate;
use crate::sync::atomic::{AtomicU8, Ordering::SeqCst};

pub(crate) const RUNNING: u8 = 0;
/// Intake stopped; in-flight work is draining.
pub(crate) const DRAINING: u8 = 1;
/// Drain over: queued work is cancelled and no backend call may happen any more.
pub(crate) const CANCELLED: u8 = 2;
pub(crate) const DOWN: u8 = 3;

/// What each step of the shutdown sequence does (see the module docs for the order).
pub(crate) trait Steps {
    /// Step 2: waits, with a bound, until nothing is in flight; returns what is left.
    fn drain(&mut self) -> usize;
    /// Step 3: fails every queued batch that has not started (state `CANCELLED`).
    fn cancel_queued(&mut self);
    /// The bound of step 4's wait for the threads inside the backend gate.
    fn gate_bound(&self) -> Duration;
    /// Step 5: stops and joins the workers, each with a bound; true when all exited.
    fn stop_workers(&mut self) -> bool;
}

/// What [`Phase::shutdown`] found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Outcome {
    /// What [`Steps::drain`] left in flight.
    pub abandoned: usize,
    /// True when nobody was inside the gate any more within its bound.
    pub gate_clear: bool,
    /// What [`Steps::stop_workers`] returned.
    pub workers_joined: bool,
}

/// The lifecycle state and the backend gate (see the module docs).
pub(crate) struct Phase {
    state: AtomicU8,
    gate: Gate,
}

impl Phase {
    #[cfg(not(loom))]
    pub const fn new() -> Phase {
        Phase { state: AtomicU8::new(RUNNING), gate: Gate::new() }
    }
    #[cfg(loom)]
    pub fn new() -> Phase {
        Phase { state: AtomicU8::new(RUNNING), gate: Gate::new() }
    }

    /// The door every backend-library call goes through.
    pub fn gate(&self) -> &Gate {
        &self.gate
    }

    /// True until shutdown begins.
    pub fn is_running(&self) -> bool {
        self.state.load(SeqCst) == RUNNING
    }

    /// True once the drain is over: a batch not yet started is refused.
    pub fn is_cancelled(&self) -> bool {
        self.state.load(SeqCst) >= CANCELLED
    }

    /// True once the sequence has finished.
    pub fn is_down(&self) -> bool {
        self.state.load(SeqCst) == DOWN
    }

    /// Runs the shutdown sequence with `steps`; `None` (and nothing done) when shutdown had
    /// begun already.
    pub fn shutdown(&self, steps: &mut impl Steps) -> Option<Outcome> {
        self.state.compare_exchange(RUNNING, DRAINING, SeqCst, SeqCst).ok()?;
        let abandoned = steps.drain();
        self.state.store(CANCELLED, SeqCst);
        steps.cancel_queued();
        let gate_clear = self.gate.close_and_wait(steps.gate_bound());
        let workers_joined = steps.stop_workers();
        self.state.store(DOWN, SeqCst);
        Some(Outcome { abandoned, gate_clear, workers_joined })
    }
}
