//! The backend gate: the one door through which every thread enters a backend library
//! (the CUDA driver, NVRTC, cuBLAS), and which shutdown closes and then waits on.
//!
//! Why: at process exit the exit hook runs on the exiting thread while every other thread
//! keeps running; once the hook returns, the C runtime tears the driver libraries down.
//! A thread still inside the driver at that moment (a readback, a buffer free from a
//! thread-local destructor, a kernel launch, an NVRTC compile) then crashes the process.
//! A plain "is shutdown under way?" check before each call is not enough: the check can
//! pass just before shutdown begins and the call then runs during teardown.
//!
//! Protocol: one atomic word holds a `CLOSED` bit and the number of passes held, so
//! that every step is a read-modify-write of the same variable and they are totally
//! ordered (no reasoning about two variables needed):
//! - `enter` adds one; if the value it replaced had `CLOSED`, it leaves again and refuses.
//! - `close_and_wait` sets `CLOSED`, then waits under `lock` until the count is 0.
//! - Leaving subtracts one; if the value it replaced was `CLOSED | 1` (closed, and this
//!   was the last pass), it takes `lock` and notifies.
//!
//! An entrant whose add comes before the close is counted by the closer, which waits for
//! its pass; one whose add comes after sees `CLOSED` and refuses. A leaver whose subtract
//! comes before the close needs to wake nobody (the closer reads the smaller count); one
//! after it notifies while holding `lock`, so a closer that saw a non-zero count under the
//! lock is already waiting. The loom model in `crates/rill-loom/src/loom_gate.rs` checks
//! exactly this file.

use std::time::Duration;

use crate::sync::atomic::{AtomicUsize, Ordering::SeqCst};
use crate::sync::{Condvar, Deadline, Mutex};

/// See the module docs.
pub(crate) struct Gate {
    /// `CLOSED` bit | passes held.
    word: AtomicUsize,
    lock: Mutex<()>,
    cv: Condvar,
}

/// Proof of being inside the gate; the closer waits until every pass is dropped.
#[must_use]
#[allow(dead_code)] // only the CUDA backend enters (unused without the `cuda` feature)
pub(crate) struct Pass<'a>(&'a Gate);

impl Drop for Pass<'_> {
    fn drop(&mut self) {
        self.0.leave();
    }
}

const CLOSED: usize = 1 << (usize::BITS - 1);

impl Gate {
    #[cfg(not(loom))]
    pub const fn new() -> Gate {
        Gate { word: AtomicUsize::new(0), lock: Mutex::new(()), cv: Condvar::new() }
    }
    #[cfg(loom)]
    pub fn new() -> Gate {
        Gate { word: AtomicUsize::new(0), lock: Mutex::new(()), cv: Condvar::new() }
    }

    /// A pass while the gate is open; `None` once it has been closed.
    #[allow(dead_code)] // see `Pass`
    pub fn enter(&self) -> Option<Pass<'_>> {
        if self.word.fetch_add(1, SeqCst) & CLOSED != 0 {
            self.leave();
            return None;
        }
        Some(Pass(self))
    }

    #[allow(dead_code)] // see `Pass`
    fn leave(&self) {
        if self.word.fetch_sub(1, SeqCst) == CLOSED | 1 {
            let _g = self.lock.lock();
            self.cv.notify_all();
        }
    }

    /// True once [`Gate::close_and_wait`] has begun.
    #[cfg_attr(not(test), allow(dead_code))]
    pub fn is_closed(&self) -> bool {
        self.word.load(SeqCst) & CLOSED != 0
    }

    /// Passes currently held (for statistics).
    pub fn inside(&self) -> usize {
        self.word.load(SeqCst) & !CLOSED
    }

    /// Closes the gate (no new pass is given), then waits until every held pass is
    /// dropped, at most `bound`. Returns true when nobody is inside any more.
    pub fn close_and_wait(&self, bound: Duration) -> bool {
        self.word.fetch_or(CLOSED, SeqCst);
        let deadline = Deadline::after(bound);
        let mut g = self.lock.lock();
        while self.word.load(SeqCst) & !CLOSED > 0 {
            let Some(left) = deadline.left() else { return false };
            g = self.cv.wait_timeout(g, left).0;
        }
        true
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::sync::mpsc;

    #[test]
    fn refuses_after_close_and_waits_for_holders() {
        let g = Arc::new(Gate::new());
        let p = g.enter().expect("open gate gives a pass");
        assert_eq!(g.inside(), 1);
        let (tx, rx) = mpsc::channel();
        let g2 = g.clone();
        let closer = std::thread::spawn(move || {
            let r = g2.close_and_wait(Duration::from_secs(60));
            tx.send(()).unwrap();
            r
        });
        // The closer cannot finish while the pass is held; wait until it has closed.
        while !g.is_closed() {
            std::thread::yield_now();
        }
        assert!(g.enter().is_none(), "a closed gate gives no pass");
        assert!(rx.try_recv().is_err(), "close_and_wait returned while a pass was held");
        drop(p);
        rx.recv().unwrap();
        assert!(closer.join().unwrap());
        assert_eq!(g.inside(), 0);
    }

    #[test]
    fn bounded_wait_reports_a_stuck_holder() {
        let g = Gate::new();
        let _p = g.enter().unwrap();
        assert!(!g.close_and_wait(Duration::from_millis(1)));
    }
}
