//! Host buffers: 8-byte aligned, counted, and recycled through a size-keyed cache.
//!
//! Allocation never aborts the process: a failed reservation is `Error::OutOfMemory`.
//! A dropped buffer goes back to the cache (unless the runtime is shutting down or the
//! cache is full); `clear_cache` empties it. The cache is process-wide, behind one
//! non-poisoning lock that is never held while running user code.

use std::collections::HashMap;

use crate::dtype::{DType, Element};
use crate::error::{Error, Result};
use crate::runtime::memory;
use crate::sync::Mutex;

/// At most this many bytes are kept for reuse.
const CACHE_LIMIT: usize = 1 << 30;

struct Cache {
    bytes: usize,
    free: HashMap<usize, Vec<Vec<u64>>>,
}

static CACHE: Mutex<Option<Cache>> = Mutex::new(None);

/// A host allocation of `len` elements of `dtype`.
pub(crate) struct CpuBuffer {
    words: Vec<u64>,
    bytes: usize,
    dtype: DType,
}

impl CpuBuffer {
    /// A buffer for `len` elements whose contents are unspecified (kernels overwrite them).
    pub fn alloc(dtype: DType, len: usize) -> Result<CpuBuffer> {
        let bytes =
            len.checked_mul(dtype.size()).ok_or(Error::OutOfMemory { device: "cpu".into(), bytes: usize::MAX })?;
        let n = bytes.div_ceil(8);
        let reused = {
            let mut g = CACHE.lock();
            g.as_mut().and_then(|c| {
                let v = c.free.get_mut(&n)?.pop()?;
                c.bytes -= n * 8;
                Some(v)
            })
        };
        let words = match reused {
            Some(v) => {
                memory::on_cache(-((n * 8) as isize));
                v
            }
            None => {
                let mut v: Vec<u64> = Vec::new();
                v.try_reserve_exact(n).map_err(|_| Error::OutOfMemory { device: "cpu".into(), bytes })?;
                v.resize(n, 0);
                v
            }
        };
        memory::on_alloc(n * 8);
        Ok(CpuBuffer { words, bytes, dtype })
    }
    /// A buffer holding a copy of `data`.
    pub fn from_slice<T: Element>(data: &[T]) -> Result<CpuBuffer> {
        let mut b = CpuBuffer::alloc(T::DTYPE, data.len())?;
        b.typed_mut::<T>().copy_from_slice(data);
        Ok(b)
    }
    /// A zero-filled buffer.
    #[allow(dead_code)]
    pub fn zeros(dtype: DType, len: usize) -> Result<CpuBuffer> {
        let mut b = CpuBuffer::alloc(dtype, len)?;
        b.words.iter_mut().for_each(|w| *w = 0);
        Ok(b)
    }
    #[allow(dead_code)]
    pub fn dtype(&self) -> DType {
        self.dtype
    }
    /// Number of elements.
    #[allow(dead_code)]
    pub fn len(&self) -> usize {
        self.bytes / self.dtype.size()
    }
    /// The raw bytes.
    pub fn bytes(&self) -> &[u8] {
        &bytemuck::cast_slice(&self.words)[..self.bytes]
    }
    /// The raw bytes, writable.
    pub fn bytes_mut(&mut self) -> &mut [u8] {
        &mut bytemuck::cast_slice_mut(&mut self.words)[..self.bytes]
    }
    /// The elements as `T` (`T`'s size must match the dtype; bool is read as u8).
    pub fn typed<T: Element>(&self) -> &[T] {
        debug_assert_eq!(std::mem::size_of::<T>(), self.dtype.size());
        bytemuck::cast_slice(self.bytes())
    }
    /// The elements as `T`, writable.
    pub fn typed_mut<T: Element>(&mut self) -> &mut [T] {
        debug_assert_eq!(std::mem::size_of::<T>(), self.dtype.size());
        bytemuck::cast_slice_mut(self.bytes_mut())
    }
}

impl Drop for CpuBuffer {
    fn drop(&mut self) {
        let n = self.words.len();
        memory::on_free(n * 8);
        if n == 0 || crate::runtime::lifecycle::is_shutting_down() {
            return;
        }
        let words = std::mem::take(&mut self.words);
        let mut g = CACHE.lock();
        let c = g.get_or_insert_with(|| Cache { bytes: 0, free: HashMap::new() });
        if c.bytes + n * 8 <= CACHE_LIMIT {
            c.bytes += n * 8;
            c.free.entry(n).or_default().push(words);
            drop(g);
            memory::on_cache((n * 8) as isize);
        }
    }
}

/// Frees every cached host buffer.
pub(crate) fn clear_cache() {
    let taken = CACHE.lock().take();
    if let Some(c) = taken {
        memory::on_cache(-(c.bytes as isize));
    }
}
