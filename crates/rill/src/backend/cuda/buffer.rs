//! Device buffers: stream-ordered allocations, counted, freed on their own stream after
//! every other stream that used them is done (a GPU-side wait), leaked during shutdown.

use std::mem::ManuallyDrop;
use std::panic::{AssertUnwindSafe, catch_unwind};

use cudarc::driver::{CudaSlice, CudaStream, DevicePtr};

use crate::backend::cpu::{CpuBuffer, movement};
use crate::backend::{Buffer, Storage};
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::runtime::{lifecycle, memory};
use crate::shape::Layout;
use crate::sync::OnceLock;
use crate::sync::{Arc, Mutex};

use super::cache::{self, BufferCache, Cached};
use super::driver::{Driver, GpuStream};
use super::handles::{CudaStreamHandle, Ev};

/// Device memory of one array (or of several views of it).
pub(crate) struct CudaBuffer {
    slice: ManuallyDrop<Option<CudaSlice<u8>>>,
    ptr: u64,
    bytes: usize,
    pub ordinal: usize,
    /// The rill id of the stream that allocated (and will free) the buffer. The CUDA
    /// stream itself is the one the memory (`slice`) belongs to.
    pub alloc_stream_id: u64,
    /// The event recorded after the batch that produced the contents, and the rill id
    /// of that batch's stream (one `OnceLock`: set once per buffer on the batch's path).
    pub produced: OnceLock<(Arc<Ev>, u64)>,
    /// The last use on each other stream: `(stream id, event)`.
    users: Mutex<Vec<(u64, Arc<Ev>)>>,
    /// Complete when created and never written again (the scalar slab): readers need no
    /// producer event and the buffer records no users.
    pub constant: bool,
    /// The allocating stream's cache and the size class, when the memory goes back there
    /// instead of being freed (see `cache.rs`).
    cache: Option<(Arc<BufferCache>, usize)>,
}

/// What [`CudaBuffer::get`] found: a buffer made now, or a whole cached one (already in its
/// reference count, ready to be a storage's buffer).
enum Got {
    New(CudaBuffer),
    Whole(Arc<Buffer>),
}

impl CudaBuffer {
    /// Allocates `bytes` (unspecified contents) in stream order on `cs`.
    pub fn alloc(cs: &GpuStream<'_>, bytes: usize) -> Result<CudaBuffer> {
        match CudaBuffer::get(cs, bytes)? {
            Got::New(b) => Ok(b),
            Got::Whole(arc) => match Arc::try_unwrap(arc) {
                Ok(Buffer::Cuda(b)) => Ok(b),
                // Not reached: a cached whole buffer is a unique CUDA buffer.
                _ => Err(super::backend_err("alloc", "a cached buffer was shared")),
            },
        }
    }
    /// A buffer of `bytes` on `cs`: from the stream's cache (whole, when a storage gave it
    /// back) or from the driver's pool.
    fn get(cs: &GpuStream<'_>, bytes: usize) -> Result<Got> {
        let oom = || Error::OutOfMemory { device: format!("gpu:{}", cs.dev.ordinal), bytes };
        let class = cache::class(bytes);
        let fresh = |n: usize| {
            // SAFETY: the contents are written by the kernel that receives the buffer.
            // Not `stream()`: an allocation need not wait for recorded launches.
            let r = unsafe { cs.raw_stream().alloc::<u8>(n) };
            r.or_else(|_| {
                // Out of memory: return this stream's cached buffers and try once more.
                cs.cache.trim();
                // SAFETY: as above.
                unsafe { cs.raw_stream().alloc::<u8>(n) }
            })
            .map_err(|_| oom())
        };
        let address = |s: CudaSlice<u8>| {
            let p = s.device_ptr(cs.raw_stream()).0;
            (Some(s), p)
        };
        // A cached buffer comes with its address (no driver-side bookkeeping per reuse).
        let (slice, ptr) = match class {
            _ if bytes == 0 => (None, 0),
            Some(c) => match cs.cache.take(c) {
                Some((_, Cached::Whole(mut arc))) => {
                    if let Some(Buffer::Cuda(b)) = Arc::get_mut(&mut arc) {
                        b.bytes = bytes;
                    }
                    memory::on_alloc(bytes);
                    return Ok(Got::Whole(arc));
                }
                Some((p, Cached::Slice(s))) => (Some(s), p),
                None => address(fresh(c)?),
            },
            None => address(fresh(bytes)?),
        };
        memory::on_alloc(bytes);
        Ok(Got::New(CudaBuffer {
            slice: ManuallyDrop::new(slice),
            ptr,
            bytes,
            ordinal: cs.dev.ordinal,
            alloc_stream_id: cs.id,
            produced: OnceLock::new(),
            users: Mutex::new(Vec::new()),
            constant: false,
            cache: class.map(|c| (cs.cache.clone(), c)),
        }))
    }
    /// Leaves the cache: the buffer's drop then frees its memory (used when a cache frees
    /// a whole buffer it kept).
    pub(super) fn forget_cache(&mut self) {
        self.cache = None;
    }
    /// The device address of byte 0.
    pub fn ptr(&self) -> u64 {
        self.ptr
    }
    /// The event after the batch that produced the contents (none for constants and for
    /// buffers whose batch has not ended).
    pub fn event(&self) -> Option<&Arc<Ev>> {
        self.produced.get().map(|(ev, _)| ev)
    }
    /// Records that stream `stream_id` (not the allocating one) used the buffer in work
    /// that ends at `ev`; the free will wait for it.
    pub fn add_user(&self, stream_id: u64, ev: &Arc<Ev>) {
        if stream_id == self.alloc_stream_id || self.constant {
            return;
        }
        let mut g = self.users.lock();
        match g.iter_mut().find(|(id, _)| *id == stream_id) {
            Some(slot) => slot.1 = ev.clone(),
            None => g.push((stream_id, ev.clone())),
        }
    }
}

impl Drop for CudaBuffer {
    fn drop(&mut self) {
        memory::on_free(self.bytes);
        // After shutdown began the memory (and the stream reference) are leaked on purpose.
        let Some(pass) = lifecycle::release_pass() else { return };
        let d = pass.driver();
        let users = std::mem::take(self.users.get_mut());
        let _ = catch_unwind(AssertUnwindSafe(|| {
            // Kernels this thread recorded on the allocating stream (a temporary's) are
            // sent first, so that the free is ordered after them.
            super::launch::flush_stream(d, self.alloc_stream_id);
            // SAFETY: the slice is taken exactly once, here.
            let mut slice = unsafe { ManuallyDrop::take(&mut self.slice) };
            // No memory (an empty buffer): nothing to free, nothing to wait for.
            if let Some(s) = &slice {
                for (_, ev) in &users {
                    let _ = ev.wait_on(d, s.stream());
                }
            }
            // The free (or the reuse, on the same stream) is ordered on the allocating
            // stream after the waits above.
            // (The slice leaves `slice` only when there is a cache to offer it to.)
            if let Some((cache, class)) = &self.cache
                && let Some(s) = slice.take()
            {
                slice = match cache.give(*class, self.ptr, Cached::Slice(s)) {
                    Some(Cached::Slice(s)) => Some(s),
                    Some(other) => {
                        drop(other);
                        None
                    }
                    None => None,
                };
            }
            if let Some(s) = slice {
                d.free(s);
            }
        }));
    }
}

/// Called by a storage that holds the last reference to a CUDA buffer: a buffer of a cached
/// size, read by no other stream, goes back to its stream's cache whole (its memory, its
/// host allocation and its reference to the cache), so that the stream's next allocation
/// of the size class allocates nothing on the host either. Any other buffer is dropped as
/// usual. As for a free, launches this thread recorded on the buffer's stream are sent
/// first; reuse is on that stream only, so its order keeps the next kernels after them.
pub(crate) fn recycle(arc: Arc<Buffer>) {
    // While this thread records launches for the buffer's stream, the recording keeps it
    // and calls this again once they are sent (`launch::keep_until_sent`).
    let (stream_id, bytes) = match &*arc {
        Buffer::Cuda(b) if !b.constant => (b.alloc_stream_id, b.bytes),
        _ => return,
    };
    let Some(mut arc) = super::launch::keep_until_sent(arc, stream_id, bytes) else { return };
    let Some(Buffer::Cuda(b)) = Arc::get_mut(&mut arc) else { return };
    if b.constant || b.slice.is_none() || !b.users.get_mut().is_empty() {
        return;
    }
    let Some((cache, class)) = b.cache.clone() else { return };
    // After shutdown began the buffer's own drop leaks it.
    let Some(pass) = lifecycle::release_pass() else { return };
    let d = pass.driver();
    let stream_id = b.alloc_stream_id;
    if catch_unwind(AssertUnwindSafe(|| super::launch::flush_stream(d, stream_id))).is_err() {
        return;
    }
    let (ptr, bytes) = (b.ptr, b.bytes);
    b.produced = OnceLock::new();
    b.bytes = 0;
    match cache.give(class, ptr, Cached::Whole(arc)) {
        None => memory::on_free(bytes),
        Some(Cached::Whole(mut back)) => {
            // Not kept (the cache is full or closed): freed as usual, counted once.
            if let Some(Buffer::Cuda(b)) = Arc::get_mut(&mut back) {
                b.bytes = bytes;
            }
            drop(back);
        }
        Some(other) => drop(other),
    }
}

/// True when work on `cs` may write into `s`'s buffer in place: a CUDA buffer of `cs`'s
/// device that this storage alone holds (no array, no view), allocated by `cs` (so its
/// free is ordered after this stream's kernels), not a constant, read by no other stream,
/// and laid out contiguously. Its producer event is then cleared: the batch that writes
/// it sets the new one when it is sealed.
pub(crate) fn own_for_writing(cs: &GpuStream<'_>, s: &mut Storage) -> bool {
    if !s.layout.is_contiguous() {
        return false;
    }
    let Some(Buffer::Cuda(b)) = Arc::get_mut(&mut s.buffer) else { return false };
    if b.ordinal != cs.dev.ordinal
        || b.alloc_stream_id != cs.id
        || b.constant
        || b.slice.is_none()
        || !b.users.get_mut().is_empty()
    {
        return false;
    }
    b.produced = OnceLock::new();
    true
}

/// The CUDA buffer of a storage (None for host storages).
pub(crate) fn cuda_of(s: &Storage) -> Option<&CudaBuffer> {
    match &**s.buffer {
        Buffer::Cuda(b) => Some(b),
        Buffer::Cpu(_) => None,
    }
}

/// Slots (8 bytes each) of a device's scalar slab.
const SCALAR_SLOTS: usize = 4096;

/// One-element host values (the `0.5` of `x * 0.5`) copied once per device into a slab of
/// 8-byte slots, keyed by (dtype, bits): a chain of ops with scalar operands then makes no
/// host-to-device copy per op. The slab lives as long as the device state (never freed,
/// leaked at exit like every buffer then).
#[derive(Default)]
pub(crate) struct ScalarCache {
    slab: Option<Storage>,
    slots: rustc_hash::FxHashMap<(DType, u64), usize>,
}

/// The device copy of a one-element host storage from the device's scalar slab, or `None`
/// when `s` is not one element or the slab is full (the caller uploads as usual).
pub(crate) fn scalar_on_device(cs: &GpuStream<'_>, s: &Storage) -> Result<Option<Storage>> {
    let Some(cpu) = s.cpu() else { return Ok(None) };
    if s.layout.numel() != 1 || s.dtype.size() > 8 {
        return Ok(None);
    }
    let size = s.dtype.size();
    let start = s.layout.offset * size;
    let mut bits = [0u8; 8];
    bits[..size].copy_from_slice(&cpu.bytes()[start..start + size]);
    slab_scalar(cs, s.dtype, u64::from_le_bytes(bits), &s.layout.shape)
}

/// A one-element storage of `shape` holding the value whose little-endian bits are `bits`
/// (`dtype` at most 8 bytes), as a view of the device's scalar slab; `None` when the slab
/// is full. The view is complete when returned (readers need no event) and must never be
/// written: the slab's buffer is marked [`CudaBuffer::constant`].
pub(crate) fn slab_scalar(cs: &GpuStream<'_>, dtype: DType, bits: u64, shape: &[usize]) -> Result<Option<Storage>> {
    let size = dtype.size();
    if size > 8 || shape.iter().product::<usize>() != 1 {
        return Ok(None);
    }
    let key = (dtype, bits);
    let bits = bits.to_le_bytes();
    let mut g = cs.dev.scalars.lock();
    if let Some(s) = g.view(dtype, key.1, shape) {
        return Ok(Some(s));
    }
    if g.slots.len() >= SCALAR_SLOTS {
        return Ok(None);
    }
    let _ = cs.bind();
    if g.slab.is_none() {
        let mut buf = CudaBuffer::alloc(cs, SCALAR_SLOTS * 8)?;
        buf.constant = true;
        // The allocation is ordered on `cs`; the copies below run on the transfer stream.
        cs.stream().synchronize().map_err(|e| super::backend_err("to_device", e))?;
        g.slab = Some(Storage::contiguous(Buffer::Cuda(buf), DType::U8, &[SCALAR_SLOTS * 8]));
    }
    let slot = g.slots.len();
    let slab = g.slab.clone().ok_or_else(|| Error::invalid("to_device", "scalar slab missing"))?;
    let ptr = cuda_of(&slab).map(|b| b.ptr()).unwrap_or(0) + (slot * 8) as u64;
    let t = cs.dev.transfer(cs.driver());
    // SAFETY: the slot lies inside the slab; the copy has finished when `synchronize`
    // returns (so every stream may read it without an event), while `bits` is alive.
    unsafe { cs.driver().memcpy_htod_async(ptr, &bits[..], t.cu_stream()) }
        .map_err(|e| super::backend_err("to_device", e))?;
    t.synchronize().map_err(|e| super::backend_err("to_device", e))?;
    g.slots.insert(key, slot);
    Ok(g.view(key.0, key.1, shape))
}

impl ScalarCache {
    /// The slab's slot holding `bits` as a one-element storage of `shape`, if there is one.
    fn view(&self, dtype: DType, bits: u64, shape: &[usize]) -> Option<Storage> {
        let (slab, &slot) = (self.slab.as_ref()?, self.slots.get(&(dtype, bits))?);
        Some(Storage {
            buffer: slab.buffer.clone(),
            dtype,
            layout: Layout { offset: slot * 8 / dtype.size(), ..Layout::contiguous(shape) },
            fence: None,
        })
    }
}

/// A 0-d storage of `value` from the device's scalar slab when the slab already holds it
/// (no driver call: a lookup under the slab's lock), else `None`.
pub(crate) fn ready_scalar(cs: &CudaStreamHandle, dtype: DType, value: f64) -> Option<Storage> {
    if dtype.size() > 8 {
        return None;
    }
    cs.dev.scalars.lock().view(dtype, super::source::host_bits(dtype, value), &[])
}

/// Copies a host storage to a new contiguous device storage on `cs`.
pub(crate) fn upload(cs: &GpuStream<'_>, s: &Storage) -> Result<Storage> {
    let host;
    let s = if s.layout.is_contiguous() {
        s
    } else {
        host = movement::make_contiguous(s)?;
        &host
    };
    let cpu = s.cpu().ok_or_else(|| Error::invalid("to_device", "upload of a non-host storage"))?;
    let size = s.dtype.size();
    let n = s.layout.numel();
    let start = s.layout.offset * size;
    let src = &cpu.bytes()[start..start + n * size];
    let buf = CudaBuffer::alloc(cs, n * size)?;
    if n > 0 {
        let _ = cs.bind();
        // SAFETY: `buf` holds `src.len()` bytes; a pageable source is staged by the driver
        // before this call returns, so `src` may be freed afterwards.
        unsafe { cs.driver().memcpy_htod_async(buf.ptr(), src, cs.stream().cu_stream()) }
            .map_err(|e| super::backend_err("to_device", e))?;
    }
    Ok(Storage::contiguous(Buffer::Cuda(buf), s.dtype, &s.layout.shape))
}

/// Copies the elements of a device storage to the host (the data must be complete, or
/// produced earlier on `stream`), returning a contiguous host storage.
pub(crate) fn download(d: Driver<'_>, stream: &CudaStream, s: &Storage) -> Result<Storage> {
    let b = cuda_of(s).ok_or_else(|| Error::invalid("to_host", "download of a host storage"))?;
    let size = s.dtype.size();
    let (lo, hi) = s.layout.span();
    let n = s.layout.numel();
    let mut host = CpuBuffer::alloc(s.dtype, hi - lo)?;
    if n > 0 {
        let _ = stream.context().bind_to_thread();
        let dst = host.bytes_mut();
        // SAFETY: the span lies inside the buffer; the copy finishes before `synchronize`
        // returns, while `dst` is alive.
        unsafe {
            d.memcpy_dtoh_async(dst, b.ptr() + (lo * size) as u64, stream.cu_stream())
                .map_err(|e| super::backend_err("to_host", e))?;
        }
        stream.synchronize().map_err(|e| super::backend_err("to_host", e))?;
    }
    let span = Storage::contiguous(Buffer::Cpu(host), s.dtype, &[hi - lo]);
    let layout =
        Layout { shape: s.layout.shape.clone(), strides: s.layout.strides.clone(), offset: s.layout.offset - lo };
    if layout.is_contiguous() && layout.offset == 0 && hi - lo == n {
        return Ok(span.with_layout(layout));
    }
    movement::make_contiguous(&span.with_layout(layout))
}

/// A storage of `dtype`/`shape` over a new contiguous device buffer.
pub(crate) fn new_storage(cs: &GpuStream<'_>, dtype: DType, shape: &[usize]) -> Result<Storage> {
    let n: usize = shape.iter().product();
    let buffer = match CudaBuffer::get(cs, n * dtype.size())? {
        Got::New(b) => Arc::new(Buffer::Cuda(b)),
        Got::Whole(arc) => arc,
    };
    Ok(Storage::from_arc(buffer, dtype, Layout::contiguous(shape)))
}
