//! A one-shot completion: a value set once, then seen by blocked threads (condition
//! variable), async tasks (wakers) and callbacks.
//!
//! Nodes use it for "computed or failed", device fences for "kernel finished". The
//! protocol, model-checked with loom in `crates/rill-loom`:
//!
//! | field | written by | under |
//! |---|---|---|
//! | `value` | `complete` (once) | `state` lock |
//! | `wakers`, `callbacks` | `register_waker` / `on_done` (push), `complete` (take) | `state` lock |
//! | `done` | `complete`, after `value` is set, before waking | release store; acquire load |
//! | `sleepers` | `wait` (+1 before sleeping, -1 after) | `state` lock |
//!
//! Whoever registers under the lock either sees the value (and does not wait) or is in
//! the lists that `complete` takes under the same lock, so no wake-up is ever lost. A
//! blocked `wait` counts itself in `sleepers` under the lock before it sleeps, so
//! `complete`, which reads the count under the same lock, signals the condition variable
//! only when someone sleeps on it (a signal is a system call; most completions have no
//! blocked waiter).
//! Wakers and callbacks run after the lock is released.

use std::task::Waker;

use crate::sync::atomic::{AtomicBool, Ordering};
use crate::sync::{Condvar, Mutex};

/// A callback run once the value is set.
pub(crate) type Callback = Box<dyn FnOnce() + Send>;

struct State<T> {
    value: Option<T>,
    wakers: Vec<Waker>,
    callbacks: Vec<Callback>,
    sleepers: usize,
}

/// See the module docs.
pub(crate) struct Completion<T> {
    state: Mutex<State<T>>,
    cv: Condvar,
    done: AtomicBool,
}

impl<T: Clone> Completion<T> {
    pub fn new() -> Self {
        Completion::with(None)
    }
    /// A completion whose value is already set (nobody can be waiting for it yet).
    pub fn done(v: T) -> Self {
        Completion::with(Some(v))
    }
    fn with(value: Option<T>) -> Self {
        let done = AtomicBool::new(value.is_some());
        let state = State { value, wakers: Vec::new(), callbacks: Vec::new(), sleepers: 0 };
        Completion { state: Mutex::new(state), cv: Condvar::new(), done }
    }
    /// True once the value is set (lock-free).
    pub fn is_done(&self) -> bool {
        self.done.load(Ordering::Acquire)
    }
    /// Sets the value and wakes everyone; returns false (and drops `v`) if it was
    /// already set.
    pub fn complete(&self, v: T) -> bool {
        let (wakers, callbacks, sleepers) = {
            let mut g = self.state.lock();
            if g.value.is_some() {
                return false;
            }
            g.value = Some(v);
            self.done.store(true, Ordering::Release);
            (std::mem::take(&mut g.wakers), std::mem::take(&mut g.callbacks), g.sleepers)
        };
        if sleepers > 0 {
            self.cv.notify_all();
        }
        for w in wakers {
            w.wake();
        }
        for cb in callbacks {
            cb();
        }
        true
    }
    /// The value, if set.
    pub fn get(&self) -> Option<T> {
        self.state.lock().value.clone()
    }
    /// Blocks until the value is set and returns it.
    pub fn wait(&self) -> T {
        let mut g = self.state.lock();
        loop {
            if let Some(v) = &g.value {
                return v.clone();
            }
            g.sleepers += 1;
            g = self.cv.wait(g);
            g.sleepers -= 1;
        }
    }
    /// Registers a waker to be woken when the value is set; returns false (registering
    /// nothing) when it is already set.
    pub fn register_waker(&self, w: &Waker) -> bool {
        let mut g = self.state.lock();
        if g.value.is_some() {
            return false;
        }
        if !g.wakers.iter().any(|x| x.will_wake(w)) {
            g.wakers.push(w.clone());
        }
        true
    }
    /// Runs `cb` once the value is set: at once (on this thread) if it already is,
    /// otherwise on the thread that sets it.
    pub fn on_done(&self, cb: Callback) {
        {
            let mut g = self.state.lock();
            if g.value.is_none() {
                g.callbacks.push(cb);
                return;
            }
        }
        cb();
    }
}

impl<T: Clone> Default for Completion<T> {
    fn default() -> Self {
        Completion::new()
    }
}
