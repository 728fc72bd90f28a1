//! The pool's job queue, shared by the harnesses that model worker threads: jobs wait in
//! a FIFO under one lock, and each worker takes the next one or sleeps on a condition
//! variable until one is pushed or the queue is stopped.

use std::collections::VecDeque;

use crate::sync::{Condvar, Mutex};

struct State<J> {
    ready: VecDeque<J>,
    stopped: bool,
}

pub(crate) struct JobQueue<J> {
    state: Mutex<State<J>>,
    cv: Condvar,
}

impl<J> JobQueue<J> {
    pub(crate) fn new() -> Self {
        JobQueue { state: Mutex::new(State { ready: VecDeque::new(), stopped: false }), cv: Condvar::new() }
    }

    /// Queues `job` and wakes the workers, stopped or not.
    pub(crate) fn push(&self, job: J) {
        self.state.lock().ready.push_back(job);
        self.cv.notify_all();
    }

    /// Queues `job` and wakes the workers; drops it once the queue is stopped (as
    /// `pool::spawn` does).
    pub(crate) fn push_unless_stopped(&self, job: J) {
        let mut g = self.state.lock();
        if g.stopped {
            return;
        }
        g.ready.push_back(job);
        drop(g);
        self.cv.notify_all();
    }

    /// Stops the queue: each worker returns once no job is left queued.
    pub(crate) fn stop(&self) {
        self.state.lock().stopped = true;
        self.cv.notify_all();
    }

    /// A worker thread's loop: runs the queued jobs in order until the queue is stopped
    /// and empty.
    pub(crate) fn work(&self, mut run: impl FnMut(J)) {
        loop {
            let job = {
                let mut g = self.state.lock();
                loop {
                    if let Some(job) = g.ready.pop_front() {
                        break job;
                    }
                    if g.stopped {
                        return;
                    }
                    g = self.cv.wait(g);
                }
            };
            run(job);
        }
    }
}
