//! Synchronisation primitives used by the runtime.
//!
//! Everything in rill takes its locks from here. `Mutex` ignores poisoning: a panic in
//! user code or a kernel is caught and turned into an error for the arrays it produced,
//! and must not turn every later lock into a second panic. Under `--cfg loom` the same
//! names come from loom, so the runtime protocols can be model-checked.

// Reference counting is not modelled: handles are plain `Arc`s in every build.
#[allow(unused_imports)]
pub(crate) use std::sync::{Arc, Weak};

#[cfg(loom)]
pub(crate) use loom::sync::atomic;
#[cfg(not(loom))]
pub(crate) use std::sync::atomic;

#[cfg(loom)]
use loom::sync::Condvar as StdCondvar;
#[cfg(not(loom))]
use std::sync::Condvar as StdCondvar;

#[cfg(loom)]
use loom::sync::{Mutex as StdMutex, MutexGuard as StdGuard};
#[cfg(not(loom))]
use std::sync::{Mutex as StdMutex, MutexGuard as StdGuard};

use std::time::Duration;

/// A mutex whose `lock` never fails: poisoning is ignored.
#[derive(Debug, Default)]
pub(crate) struct Mutex<T>(StdMutex<T>);

/// The guard of [`Mutex`].
pub(crate) type MutexGuard<'a, T> = StdGuard<'a, T>;

impl<T> Mutex<T> {
    #[cfg(not(loom))]
    pub const fn new(v: T) -> Self {
        Mutex(StdMutex::new(v))
    }
    #[cfg(loom)]
    pub fn new(v: T) -> Self {
        Mutex(StdMutex::new(v))
    }
    pub fn get_mut(&mut self) -> &mut T {
        match self.0.get_mut() {
            Ok(v) => v,
            Err(p) => p.into_inner(),
        }
    }
    pub fn lock(&self) -> MutexGuard<'_, T> {
        match self.0.lock() {
            Ok(g) => g,
            Err(p) => p.into_inner(),
        }
    }
}

/// A condition variable for [`Mutex`], ignoring poisoning.
#[derive(Debug, Default)]
pub(crate) struct Condvar(StdCondvar);

impl Condvar {
    #[cfg(not(loom))]
    pub const fn new() -> Self {
        Condvar(StdCondvar::new())
    }
    #[cfg(loom)]
    pub fn new() -> Self {
        Condvar(StdCondvar::new())
    }
    pub fn wait<'a, T>(&self, g: MutexGuard<'a, T>) -> MutexGuard<'a, T> {
        match self.0.wait(g) {
            Ok(g) => g,
            Err(p) => p.into_inner(),
        }
    }
    /// Waits at most `d`; returns the guard and whether the wait timed out.
    #[cfg(not(loom))]
    pub fn wait_timeout<'a, T>(&self, g: MutexGuard<'a, T>, d: Duration) -> (MutexGuard<'a, T>, bool) {
        match self.0.wait_timeout(g, d) {
            Ok((g, t)) => (g, t.timed_out()),
            Err(p) => {
                let (g, t) = p.into_inner();
                (g, t.timed_out())
            }
        }
    }
    #[cfg(loom)]
    pub fn wait_timeout<'a, T>(&self, g: MutexGuard<'a, T>, _d: Duration) -> (MutexGuard<'a, T>, bool) {
        (self.wait(g), false)
    }
    pub fn notify_all(&self) {
        self.0.notify_all()
    }
}
