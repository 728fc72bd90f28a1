//! Small device buffers kept for reuse by the stream that allocated them.
//!
//! A stream-ordered allocation from the driver's memory pool costs about 2 µs and its free
//! about 1 µs (measured on an H200), more than a small kernel's launch. A buffer of at most
//! [`MAX_CACHED`] bytes is therefore not freed when its last view is dropped: once its
//! allocating stream has been made to wait for every other stream's last use (the same
//! GPU-side waits a free needs), its memory goes back to that stream's cache, and the
//! stream's next allocation of the same size class takes it. Reuse is on the allocating
//! stream only, so the stream's order is what keeps the new kernels after the old ones.
//!
//! Each size class hands out its free buffer of lowest device address first. What a
//! stream gets then depends only on which buffers are free, not on the order they were
//! freed: an evaluation that repeats (the same allocations and frees, in the same order)
//! gets the same buffer at every step, so its replayed CUDA graphs keep their kernels'
//! arguments (`launch.rs`). A first-in-first-out list did not: a long chain reuses within
//! one evaluation the buffers its earlier batches freed, and the order rotated from one
//! evaluation to the next (every batch's graph had its arguments rewritten).
//!
//! Size classes are powers of two from 256 bytes. A stream keeps at most [`MAX_STREAM`]
//! bytes; beyond that buffers are freed as before. `rill::clear_cache` frees every cache
//! (the devices keep a weak list); an allocation that fails for memory frees its stream's
//! cache and tries again. During shutdown cached memory is leaked, like every buffer.

use std::cmp::Ordering;
use std::collections::BinaryHeap;
use std::panic::{AssertUnwindSafe, catch_unwind};

use cudarc::driver::CudaSlice;

use crate::runtime::{lifecycle, memory};
use crate::sync::Mutex;

/// Largest buffer kept for reuse.
pub(crate) const MAX_CACHED: usize = 1 << 20;
/// Bytes a stream keeps at most.
const MAX_STREAM: usize = 64 << 20;
/// Smallest size class.
const MIN_CLASS: usize = 256;
/// Number of size classes (powers of two from `MIN_CLASS` to `MAX_CACHED`).
const CLASSES: usize = (MAX_CACHED.trailing_zeros() - MIN_CLASS.trailing_zeros() + 1) as usize;

/// The list index of size class `class`.
fn slot(class: usize) -> usize {
    (class.trailing_zeros() - MIN_CLASS.trailing_zeros()) as usize
}

/// The size class of a request of `bytes` (`None`: not cached).
pub(crate) fn class(bytes: usize) -> Option<usize> {
    (bytes > 0 && bytes <= MAX_CACHED).then(|| bytes.next_power_of_two().max(MIN_CLASS))
}

/// A cached buffer and its device address, ordered so that a `BinaryHeap` (a max-heap)
/// has the lowest address on top.
struct Free(u64, CudaSlice<u8>);

impl PartialEq for Free {
    fn eq(&self, other: &Free) -> bool {
        self.0 == other.0
    }
}
impl Eq for Free {}
impl PartialOrd for Free {
    fn partial_cmp(&self, other: &Free) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Free {
    fn cmp(&self, other: &Free) -> Ordering {
        other.0.cmp(&self.0)
    }
}

/// One stream's cached buffers, by size class.
#[derive(Default)]
pub(crate) struct BufferCache {
    inner: Mutex<Lists>,
}

#[derive(Default)]
struct Lists {
    /// One heap per size class (indexed by [`slot`]; no hashing on the path of every
    /// small allocation and free), lowest address on top (see the module docs).
    free: [BinaryHeap<Free>; CLASSES],
    bytes: usize,
}

impl BufferCache {
    /// The free cached buffer of size class `class` with the lowest address, if any.
    pub fn take(&self, class: usize) -> Option<CudaSlice<u8>> {
        let mut g = self.inner.lock();
        let Free(_, s) = g.free.get_mut(slot(class))?.pop()?;
        g.bytes -= class;
        memory::on_cache(-(class as isize));
        Some(s)
    }
    /// Keeps `slice` (of size class `class`, at device address `ptr`) for reuse; gives it
    /// back when the cache is full.
    pub fn give(&self, class: usize, ptr: u64, slice: CudaSlice<u8>) -> Option<CudaSlice<u8>> {
        let mut g = self.inner.lock();
        if g.bytes + class > MAX_STREAM {
            return Some(slice);
        }
        let Some(heap) = g.free.get_mut(slot(class)) else { return Some(slice) };
        heap.push(Free(ptr, slice));
        g.bytes += class;
        memory::on_cache(class as isize);
        None
    }
    /// Frees every cached buffer (stream-ordered frees on the owning stream); leaks them
    /// once shutdown has begun.
    pub fn trim(&self) {
        let lists = std::mem::take(&mut *self.inner.lock());
        memory::on_cache(-(lists.bytes as isize));
        match lifecycle::release_pass() {
            Some(_pass) => {
                let _ = catch_unwind(AssertUnwindSafe(|| drop(lists.free)));
            }
            None => std::mem::forget(lists.free), // leaked on purpose during shutdown
        }
    }
}

impl Drop for BufferCache {
    fn drop(&mut self) {
        self.trim();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn size_classes() {
        assert_eq!(class(0), None);
        assert_eq!(class(1), Some(256));
        assert_eq!(class(256), Some(256));
        assert_eq!(class(257), Some(512));
        assert_eq!(class(MAX_CACHED), Some(MAX_CACHED));
        assert_eq!(class(MAX_CACHED + 1), None);
        assert_eq!(slot(MIN_CLASS), 0);
        assert_eq!(slot(MAX_CACHED), CLASSES - 1);
    }
}
