//! Small device buffers kept for reuse by the stream that allocated them.
//!
//! A stream-ordered allocation from the driver's memory pool, and its free, each cost more
//! host time than a small kernel's launch. A buffer of at most
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
//! When the last reference to a buffer is a storage's, the buffer comes back whole (its
//! memory, the host allocation around it and its reference to this cache: see
//! `buffer::recycle`), so that reusing it allocates and frees nothing on the host. A whole
//! buffer refers to the cache that keeps it: the cache is therefore emptied and closed
//! when its stream's handle is dropped ([`BufferCache::close`]), not when its last
//! reference goes.
//!
//! Size classes are powers of two from 256 bytes. A stream keeps at most [`MAX_STREAM`]
//! bytes; beyond that buffers are freed as before. `rill::clear_cache` frees every cache
//! (the devices keep a weak list); an allocation that fails for memory frees its stream's
//! cache and tries again. During shutdown cached memory is leaked, like every buffer.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::panic::{AssertUnwindSafe, catch_unwind};

use cudarc::driver::CudaSlice;

use crate::backend::Buffer;
use crate::runtime::{lifecycle, memory};
use crate::sync::{Arc, Mutex};

use super::driver::Driver;

/// A free buffer kept by a cache: the device memory alone (from a buffer freed the usual
/// way), or the whole reference-counted buffer around it (from a storage that held its
/// last reference: taking it back allocates nothing on the host; see `buffer::recycle`).
pub(crate) enum Cached {
    Slice(CudaSlice<u8>),
    /// Unique; its `bytes` is 0 and its producer event cleared while it is cached.
    Whole(Arc<Buffer>),
}

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

/// The free buffers of one size class: a heap of (address, place) with the lowest address
/// on top, the buffers themselves in `places` (a heap of small entries: sifting moves 16
/// bytes, not a whole `CudaSlice`).
struct Class<T = Cached> {
    heap: BinaryHeap<Reverse<(u64, u32)>>,
    places: Vec<Option<T>>,
    vacant: Vec<u32>,
}

impl<T> Default for Class<T> {
    fn default() -> Self {
        Class { heap: BinaryHeap::new(), places: Vec::new(), vacant: Vec::new() }
    }
}

impl<T> Class<T> {
    /// The free buffer of lowest address, with its address.
    fn pop(&mut self) -> Option<(u64, T)> {
        let Reverse((ptr, at)) = self.heap.pop()?;
        self.vacant.push(at);
        Some((ptr, self.places.get_mut(at as usize)?.take()?))
    }
    fn push(&mut self, ptr: u64, slice: T) {
        let at = match self.vacant.pop() {
            Some(at) => at,
            None => {
                self.places.push(None);
                (self.places.len() - 1) as u32
            }
        };
        self.places[at as usize] = Some(slice);
        self.heap.push(Reverse((ptr, at)));
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
    free: [Class; CLASSES],
    bytes: usize,
    /// Set when the stream's handle is dropped: nothing is kept any more. (A whole buffer
    /// refers to its cache, so a cache holding whole buffers is freed by `close`, not by
    /// the last reference going away.)
    closed: bool,
}

impl BufferCache {
    /// The free cached buffer of size class `class` with the lowest address, if any, and
    /// that address.
    pub fn take(&self, class: usize) -> Option<(u64, Cached)> {
        let mut g = self.inner.lock();
        let s = g.free.get_mut(slot(class))?.pop()?;
        g.bytes -= class;
        memory::on_cache(-(class as isize));
        Some(s)
    }
    /// Keeps `slice` (of size class `class`, at device address `ptr`) for reuse; gives it
    /// back when the cache is full or closed.
    pub fn give(&self, class: usize, ptr: u64, slice: Cached) -> Option<Cached> {
        let mut g = self.inner.lock();
        if g.closed || g.bytes + class > MAX_STREAM {
            return Some(slice);
        }
        let Some(list) = g.free.get_mut(slot(class)) else { return Some(slice) };
        list.push(ptr, slice);
        g.bytes += class;
        memory::on_cache(class as isize);
        None
    }
    /// Frees every cached buffer (stream-ordered frees on the owning stream); leaks them
    /// once shutdown has begun.
    pub fn trim(&self) {
        let lists = {
            let mut g = self.inner.lock();
            let closed = g.closed;
            std::mem::replace(&mut *g, Lists { closed, ..Lists::default() })
        };
        memory::on_cache(-(lists.bytes as isize));
        match lifecycle::release_pass() {
            Some(pass) => {
                let d = pass.driver();
                let _ = catch_unwind(AssertUnwindSafe(|| {
                    for class in lists.free {
                        for entry in class.places.into_iter().flatten() {
                            free_entry(d, entry);
                        }
                    }
                }));
            }
            None => std::mem::forget(lists.free), // leaked on purpose during shutdown
        }
    }
    /// Frees what is cached and keeps nothing from now on (the stream's handle is gone).
    pub fn close(&self) {
        self.inner.lock().closed = true;
        self.trim();
    }
}

/// Frees a cached buffer (in stream order on its stream): a whole buffer forgets its cache
/// first, so that its own drop frees the memory instead of giving it back.
fn free_entry(d: Driver<'_>, entry: Cached) {
    match entry {
        Cached::Slice(s) => d.free(s),
        Cached::Whole(mut b) => {
            if let Some(Buffer::Cuda(c)) = Arc::get_mut(&mut b) {
                c.forget_cache();
            }
            drop(b);
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

    /// Lowest address first, whatever the order of the frees; places are reused.
    #[test]
    fn a_class_hands_out_its_lowest_address_first() {
        let mut c: Class<u64> = Class::default();
        for p in [700u64, 100, 900, 300, 500] {
            c.push(p, p * 10);
        }
        assert_eq!(c.pop(), Some((100, 1000)));
        assert_eq!(c.pop(), Some((300, 3000)));
        c.push(200, 2000);
        c.push(50, 500);
        let got: Vec<u64> = std::iter::from_fn(|| c.pop().map(|(_, v)| v)).collect();
        assert_eq!(got, [500, 2000, 5000, 7000, 9000]);
        assert_eq!(c.places.len(), 5, "freed places are reused");
        assert_eq!(c.pop(), None);
    }
}
