//! Memory counters and the memory limit.
//!
//! Every backend allocation adds its size to `ACTIVE` and every free subtracts it; `PEAK`
//! is the high-water mark and `CACHED` the bytes held by allocator caches for reuse.
//! `set_memory_limit` bounds how far evaluation runs ahead: the scheduler waits for
//! in-flight work to complete (and free memory) before submitting more past the limit.

use crate::sync::atomic::{AtomicUsize, Ordering::Relaxed};

static ACTIVE: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);
static CACHED: AtomicUsize = AtomicUsize::new(0);
static LIMIT: AtomicUsize = AtomicUsize::new(usize::MAX);

pub(crate) fn on_alloc(bytes: usize) {
    let now = ACTIVE.fetch_add(bytes, Relaxed) + bytes;
    // Read first: most allocations do not raise the peak, and a plain load is cheaper
    // than the read-modify-write loop of `fetch_max`.
    if now > PEAK.load(Relaxed) {
        PEAK.fetch_max(now, Relaxed);
    }
}
pub(crate) fn on_free(bytes: usize) {
    ACTIVE.fetch_sub(bytes, Relaxed);
}
pub(crate) fn on_cache(delta: isize) {
    if delta >= 0 {
        CACHED.fetch_add(delta as usize, Relaxed);
    } else {
        CACHED.fetch_sub((-delta) as usize, Relaxed);
    }
}

/// Bytes currently allocated for arrays on every device (cached bytes excluded).
pub fn active_memory() -> usize {
    ACTIVE.load(Relaxed)
}
/// Highest value `active_memory` has reached since the start or the last `reset_peak_memory`.
pub fn peak_memory() -> usize {
    PEAK.load(Relaxed)
}
/// Resets the peak to the current active bytes.
pub fn reset_peak_memory() {
    PEAK.store(ACTIVE.load(Relaxed), Relaxed);
}
/// Bytes held by allocator caches for reuse; `clear_cache` returns them.
pub fn cached_memory() -> usize {
    CACHED.load(Relaxed)
}
/// Sets the memory limit in bytes and returns the previous one. When active memory is
/// above it, evaluation waits for in-flight work to finish before submitting more. A
/// single operation larger than the limit still runs (nothing else can free memory).
pub fn set_memory_limit(bytes: usize) -> usize {
    LIMIT.swap(bytes, Relaxed)
}
/// The current memory limit (`usize::MAX` when unset).
pub fn memory_limit() -> usize {
    LIMIT.load(Relaxed)
}
pub(crate) fn over_limit() -> bool {
    ACTIVE.load(Relaxed) > LIMIT.load(Relaxed)
}
