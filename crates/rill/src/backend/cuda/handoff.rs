//! The job handoff between the threads that finish a GPU batch and the device's
//! completion worker (`device.rs`), apart from what a job is (there: a batch's event and
//! fence) and from the driver.
//!
//! Protocol (every field below is read and written under `state`'s lock, except `poke`,
//! which is also read without it):
//! - `push` queues the job and sets `poke`; it signals the condition variable only when
//!   the worker is asleep on it (`sleeping`), since a signal is a system call and the
//!   worker is usually lingering, not asleep. Once the worker is told to stop, `push` gives
//!   the job back (the caller then waits for it itself).
//! - `next`, the worker's: takes the head job. Without one it first *lingers*: lets go of
//!   the lock and polls `poke` (never the lock, so a pusher never contends with it) for a
//!   short while, then takes the lock again and, still without a job, sets `sleeping` and
//!   waits on the condition variable. Taking the last job clears `poke` (unless stopped).
//!   Returns `None` once stopped and empty: jobs queued before the stop are still served.
//! - `stop` sets `stop` and `poke` and signals; the worker's last act is `exited`, which
//!   `wait_exited` waits for, with a bound.
//!
//! Invariants: a queued job is always taken (the worker never sleeps with a job queued:
//! `sleeping` is set under the lock that `push` reads it under, and the wait releases the
//! lock atomically); `poke` is set whenever a job is queued or the worker is stopped, so a
//! lingering worker never misses one. The loom model in
//! `crates/rill-loom/src/loom_handoff.rs` checks exactly this file.

use std::collections::VecDeque;

use crate::sync::atomic::{AtomicBool, Ordering::SeqCst};
use crate::sync::{Condvar, Deadline, Mutex};

struct State<J> {
    jobs: VecDeque<J>,
    stop: bool,
    exited: bool,
    /// The worker sleeps on the condition variable (a new job must signal it).
    sleeping: bool,
}

/// See the module docs.
pub(crate) struct Handoff<J> {
    state: Mutex<State<J>>,
    cv: Condvar,
    /// Set under the lock when a job is pushed or the worker is told to stop; cleared under
    /// it when the worker takes the last job. The lingering worker polls this flag.
    poke: AtomicBool,
}

impl<J> Handoff<J> {
    pub fn new() -> Self {
        Handoff {
            state: Mutex::new(State { jobs: VecDeque::new(), stop: false, exited: false, sleeping: false }),
            cv: Condvar::new(),
            poke: AtomicBool::new(false),
        }
    }

    /// Hands `job` to the worker; `Err(job)` once the worker is stopped.
    pub fn push(&self, job: J) -> Result<(), J> {
        let mut g = self.state.lock();
        if g.stop {
            return Err(job);
        }
        g.jobs.push_back(job);
        self.poke.store(true, SeqCst);
        // A lingering worker sees the job without a signal (a system call).
        let sleeping = g.sleeping;
        drop(g);
        if sleeping {
            self.cv.notify_all();
        }
        Ok(())
    }

    /// True when a job was pushed (or the worker stopped) since the worker took its last
    /// job: what a lingering worker polls.
    pub fn poked(&self) -> bool {
        self.poke.load(SeqCst)
    }

    /// The worker's next job, waiting for one: first `linger(self)` without the lock (it
    /// should poll [`Handoff::poked`] for a while), then asleep. `None` once stopped with
    /// no job left.
    pub fn next(&self, linger: impl FnOnce(&Self)) -> Option<J> {
        let mut g = self.state.lock();
        if g.jobs.is_empty() && !g.stop {
            drop(g);
            linger(self);
            g = self.state.lock();
        }
        loop {
            if let Some(j) = g.jobs.pop_front() {
                if g.jobs.is_empty() && !g.stop {
                    self.poke.store(false, SeqCst);
                }
                return Some(j);
            }
            if g.stop {
                return None;
            }
            g.sleeping = true;
            g = self.cv.wait(g);
            g.sleeping = false;
        }
    }

    /// Tells the worker to stop once the jobs queued now are served; later pushes are
    /// refused.
    pub fn stop(&self) {
        let mut g = self.state.lock();
        g.stop = true;
        self.poke.store(true, SeqCst);
        drop(g);
        self.cv.notify_all();
    }

    /// The worker's last act, after `next` returned `None`.
    pub fn exited(&self) {
        self.state.lock().exited = true;
        self.cv.notify_all();
    }

    /// Waits until the worker has called [`Handoff::exited`], at most until `deadline`;
    /// true when it has.
    pub fn wait_exited(&self, deadline: &Deadline) -> bool {
        let mut g = self.state.lock();
        while !g.exited {
            let Some(left) = deadline.left() else { return false };
            g = self.cv.wait_timeout(g, left).0;
        }
        true
    }

    /// Checks, under the lock, that `poke` is set whenever a job is queued or the worker is
    /// stopped (for the model check).
    #[cfg(loom)]
    pub fn check_poke(&self) {
        let g = self.state.lock();
        if !g.jobs.is_empty() || g.stop {
            assert!(self.poke.load(SeqCst), "a job is queued (or the worker stopped) without `poke` set");
        }
    }
}
