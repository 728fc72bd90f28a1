//! The run-state machine of one stream: a FIFO of batches that at most one pool job runs
//! at a time, parking (instead of blocking a thread) while its head batch waits for a
//! dependency. Pure data, always used under the stream's queue lock; the lock, the pool
//! and the dependency callbacks live in `stream.rs`/`scheduler.rs`. Model-checked with
//! loom in `crates/rill-loom` (with the real `Completion` as the dependency).
//!
//! | from | event | to | caller then |
//! |---|---|---|---|
//! | Idle | `push` | Scheduled | spawns a job |
//! | Scheduled/Running/Parked | `push` | unchanged | nothing |
//! | Scheduled | `take`: empty | Idle | returns |
//! | Scheduled | `take`: head blocked on `d` | Parked | registers "unpark" on `d`'s completion |
//! | Scheduled | `take`: head ready | Running | runs the batch, then `finish` |
//! | Running | `finish`: more queued | Scheduled | spawns a job |
//! | Running | `finish`: empty | Idle | returns |
//! | Parked | `unpark` | Scheduled | spawns a job |
//! | any | `cancel` | Idle (Running stays) | fails the returned batches |

use std::collections::VecDeque;

/// Where a stream's queue is in its life (see the module table).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Run {
    /// No batch queued or running.
    Idle,
    /// A pool job will look at the head batch.
    Scheduled,
    /// A batch is running.
    Running,
    /// The head batch waits for a dependency, whose completion calls `unpark`.
    Parked,
}

/// What a job found at the head of the queue.
pub(crate) enum Take<B, D> {
    /// Nothing queued: the queue is idle.
    Idle,
    /// The head batch waits for `D`: the queue is parked.
    Park(D),
    /// Run this batch.
    Run(B),
}

/// A FIFO of batches with its run state.
pub(crate) struct Serial<B> {
    pub batches: VecDeque<B>,
    pub run: Run,
}

impl<B> Serial<B> {
    pub fn new() -> Self {
        Serial { batches: VecDeque::new(), run: Run::Idle }
    }
    /// Queues a batch; true when the caller must spawn a job for this queue.
    #[must_use]
    pub fn push(&mut self, b: B) -> bool {
        self.batches.push_back(b);
        if self.run == Run::Idle {
            self.run = Run::Scheduled;
            true
        } else {
            false
        }
    }
    /// Called by the queue's job: the head batch to run, or why there is none.
    /// `blocked_on` returns the first unfinished dependency of a batch.
    pub fn take<D>(&mut self, blocked_on: impl FnOnce(&B) -> Option<D>) -> Take<B, D> {
        let Some(head) = self.batches.front() else {
            self.run = Run::Idle;
            return Take::Idle;
        };
        if let Some(d) = blocked_on(head) {
            self.run = Run::Parked;
            return Take::Park(d);
        }
        match self.batches.pop_front() {
            Some(b) => {
                self.run = Run::Running;
                Take::Run(b)
            }
            None => {
                self.run = Run::Idle;
                Take::Idle
            }
        }
    }
    /// After running a batch; true when the caller must spawn a job for the rest.
    #[must_use]
    pub fn finish(&mut self) -> bool {
        if self.batches.is_empty() {
            self.run = Run::Idle;
            false
        } else {
            self.run = Run::Scheduled;
            true
        }
    }
    /// A dependency of a parked queue completed; true when the caller must spawn a job.
    #[must_use]
    pub fn unpark(&mut self) -> bool {
        if self.run == Run::Parked {
            self.run = Run::Scheduled;
            true
        } else {
            false
        }
    }
    /// Removes every queued batch (shutdown); a running batch finishes on its own.
    pub fn cancel(&mut self) -> VecDeque<B> {
        if self.run != Run::Running {
            self.run = Run::Idle;
        }
        std::mem::take(&mut self.batches)
    }
}
