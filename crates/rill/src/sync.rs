//! Synchronisation primitives used by the runtime.
//!
//! Everything in rill takes its locks, condition variables, atomics and one-time cells
//! from here, and this is the one file that names std's (clippy's `disallowed-types`, in
//! `clippy.toml`, refuses them anywhere else). Under `--cfg loom` the same names come from
//! loom, so the runtime protocols compiled into `crates/rill-loom` are model-checked
//! against the code that runs.
//!
//! `Mutex` ignores poisoning: a panic in user code or a kernel is caught and turned into
//! an error for the arrays it produced, and must not turn every later lock into a second
//! panic. The atomics are thin wrappers (so that clippy can tell them from std's) with
//! std's methods and `Ordering`.
//!
//! What loom cannot model, and how rill stays inside what it can:
//! - `static`s. Loom's primitives have no `const` constructor and exist within one model
//!   execution, so a `static` holds these types only in the real build. Process-wide
//!   counters and flags (`stats.rs`, `memory.rs`, the ids) are such statics; the files
//!   that declare them are not compiled into a model. A protocol that is model-checked
//!   keeps its state in a struct (`Gate`, `Phase`, `Registry`, `Handoff`) that the real
//!   build puts in a `static` or an `Arc` and a model creates per execution.
//! - One-time initialisation ([`OnceLock`], [`Once`]: the driver probe, environment
//!   switches, per-buffer events). These are std's and exist only without loom: no
//!   model-checked file uses them, and one that did would fail to compile under loom
//!   instead of blocking loom's scheduler on a std primitive.
//! - Time. Under loom no time passes: [`Deadline`] never expires and
//!   `Condvar::wait_timeout` waits until notified, so a lost wake-up is reported as a
//!   deadlock instead of being papered over by a timeout.

// The one place that names std's (and loom's) primitives; see the module docs.
#![allow(clippy::disallowed_types)]

use std::time::Duration;

// Reference counting is not modelled: handles are plain `Arc`s in every build.
#[allow(unused_imports)]
pub(crate) use std::sync::{Arc, Weak};

#[cfg(loom)]
use loom::sync::Condvar as StdCondvar;
#[cfg(not(loom))]
use std::sync::Condvar as StdCondvar;

#[cfg(loom)]
use loom::sync::{Mutex as StdMutex, MutexGuard as StdGuard};
#[cfg(not(loom))]
use std::sync::{Mutex as StdMutex, MutexGuard as StdGuard};

/// Atomics: std's, or loom's under `--cfg loom`, behind wrappers with the same methods.
pub(crate) mod atomic {
    #[cfg(loom)]
    use loom::sync::atomic as imp;
    #[cfg(not(loom))]
    use std::sync::atomic as imp;

    /// Loom uses std's `Ordering` too.
    pub(crate) use std::sync::atomic::Ordering;

    macro_rules! wrapper {
        ($(#[$doc:meta])* $name:ident, $t:ty, { $($more:tt)* }) => {
            $(#[$doc])*
            #[derive(Debug, Default)]
            #[repr(transparent)]
            pub(crate) struct $name(imp::$name);

            // Not every width uses every operation.
            #[allow(dead_code)]
            impl $name {
                #[cfg(not(loom))]
                #[inline]
                pub const fn new(v: $t) -> Self {
                    $name(imp::$name::new(v))
                }
                #[cfg(loom)]
                #[track_caller]
                pub fn new(v: $t) -> Self {
                    $name(imp::$name::new(v))
                }
                #[inline]
                #[cfg_attr(loom, track_caller)]
                pub fn load(&self, order: Ordering) -> $t {
                    self.0.load(order)
                }
                #[inline]
                #[cfg_attr(loom, track_caller)]
                pub fn store(&self, v: $t, order: Ordering) {
                    self.0.store(v, order)
                }
                #[inline]
                #[cfg_attr(loom, track_caller)]
                pub fn swap(&self, v: $t, order: Ordering) -> $t {
                    self.0.swap(v, order)
                }
                #[inline]
                #[cfg_attr(loom, track_caller)]
                pub fn compare_exchange(&self, current: $t, new: $t, success: Ordering, failure: Ordering) -> Result<$t, $t> {
                    self.0.compare_exchange(current, new, success, failure)
                }
                #[inline]
                #[cfg_attr(loom, track_caller)]
                pub fn fetch_or(&self, v: $t, order: Ordering) -> $t {
                    self.0.fetch_or(v, order)
                }
                #[inline]
                #[cfg_attr(loom, track_caller)]
                pub fn into_inner(self) -> $t {
                    self.0.into_inner()
                }
                $($more)*
            }
        };
    }

    macro_rules! integer {
        ($name:ident, $t:ty) => {
            wrapper!(
                #[doc = concat!("`std::sync::atomic::", stringify!($name), "` (loom's under `--cfg loom`).")]
                $name,
                $t,
                {
                    #[inline]
                    #[cfg_attr(loom, track_caller)]
                    pub fn fetch_add(&self, v: $t, order: Ordering) -> $t {
                        self.0.fetch_add(v, order)
                    }
                    #[inline]
                    #[cfg_attr(loom, track_caller)]
                    pub fn fetch_sub(&self, v: $t, order: Ordering) -> $t {
                        self.0.fetch_sub(v, order)
                    }
                    #[inline]
                    #[cfg_attr(loom, track_caller)]
                    pub fn fetch_max(&self, v: $t, order: Ordering) -> $t {
                        self.0.fetch_max(v, order)
                    }
                }
            );
        };
    }

    wrapper!(
        /// `std::sync::atomic::AtomicBool` (loom's under `--cfg loom`).
        AtomicBool, bool, {}
    );
    integer!(AtomicU8, u8);
    integer!(AtomicU64, u64);
    integer!(AtomicUsize, usize);
}

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
    #[track_caller]
    pub fn new(v: T) -> Self {
        Mutex(StdMutex::new(v))
    }
    pub fn get_mut(&mut self) -> &mut T {
        match self.0.get_mut() {
            Ok(v) => v,
            Err(p) => p.into_inner(),
        }
    }
    #[cfg_attr(loom, track_caller)]
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

/// A time bound for a wait (unbounded under loom, where time does not pass and a lost
/// wake-up must show up as a deadlock).
pub(crate) struct Deadline(#[cfg(not(loom))] std::time::Instant);

impl Deadline {
    /// `d` from now.
    #[cfg(not(loom))]
    pub fn after(d: Duration) -> Deadline {
        Deadline(std::time::Instant::now() + d)
    }
    #[cfg(loom)]
    pub fn after(_d: Duration) -> Deadline {
        Deadline()
    }
    /// The time left, or `None` once the deadline has passed.
    #[cfg(not(loom))]
    pub fn left(&self) -> Option<Duration> {
        let now = std::time::Instant::now();
        (now < self.0).then(|| self.0 - now)
    }
    #[cfg(loom)]
    pub fn left(&self) -> Option<Duration> {
        Some(Duration::from_secs(1))
    }
}

/// `std::sync::OnceLock`, for one-time initialisation outside the modelled protocols (not
/// available under loom; see the module docs).
#[cfg(not(loom))]
#[derive(Debug, Default)]
#[allow(dead_code)] // only the `cuda` feature uses it
pub(crate) struct OnceLock<T>(std::sync::OnceLock<T>);

#[cfg(not(loom))]
#[allow(dead_code)]
impl<T> OnceLock<T> {
    pub const fn new() -> Self {
        OnceLock(std::sync::OnceLock::new())
    }
    #[inline]
    pub fn get(&self) -> Option<&T> {
        self.0.get()
    }
    #[inline]
    pub fn get_or_init(&self, f: impl FnOnce() -> T) -> &T {
        self.0.get_or_init(f)
    }
    /// Stores `v` unless a value is there already, which is then kept (`Err(v)`).
    #[inline]
    pub fn set(&self, v: T) -> Result<(), T> {
        self.0.set(v)
    }
}

/// `std::sync::Once`, for one-time initialisation outside the modelled protocols (not
/// available under loom; see the module docs).
#[cfg(not(loom))]
#[derive(Debug)]
#[allow(dead_code)] // only the `cuda` feature uses it
pub(crate) struct Once(std::sync::Once);

#[cfg(not(loom))]
#[allow(dead_code)]
impl Once {
    pub const fn new() -> Self {
        Once(std::sync::Once::new())
    }
    pub fn call_once(&self, f: impl FnOnce()) {
        self.0.call_once(f)
    }
}
