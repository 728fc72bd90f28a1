//! The process-wide list of live streams: weak entries, so the registry never keeps a
//! stream alive. `Stream::new` registers each stream after checking that the runtime is
//! running; shutdown takes a snapshot after the state became `Cancelled` and cancels the
//! queued batches of every stream in it. Model-checked with loom, racing stream
//! creation and submission against that shutdown sequence, in `crates/rill-loom`.
//!
//! | field | written by | under |
//! |---|---|---|
//! | `entries` | `register` (push, drops dead entries) | its lock |

use crate::sync::{Arc, Mutex, Weak};

/// Weak references to every registered item still alive.
pub(crate) struct Registry<T> {
    entries: Mutex<Vec<Weak<T>>>,
}

impl<T> Registry<T> {
    #[cfg(not(loom))]
    pub const fn new() -> Self {
        Registry { entries: Mutex::new(Vec::new()) }
    }
    #[cfg(loom)]
    pub fn new() -> Self {
        Registry { entries: Mutex::new(Vec::new()) }
    }
    /// Adds `item`, dropping the entries of items that no longer exist.
    pub fn register(&self, item: &Arc<T>) {
        let mut entries = self.entries.lock();
        entries.retain(|w| w.strong_count() > 0);
        entries.push(Arc::downgrade(item));
    }
    /// Every registered item alive now, in registration order.
    pub fn snapshot(&self) -> Vec<Arc<T>> {
        self.entries.lock().iter().filter_map(Weak::upgrade).collect()
    }
}
