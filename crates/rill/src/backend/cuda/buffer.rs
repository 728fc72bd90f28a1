//! Device buffers: stream-ordered allocations, counted, freed on their own stream after
//! every other stream that used them is done (a GPU-side wait), leaked during shutdown.

use std::mem::ManuallyDrop;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::OnceLock;

use cudarc::driver::{CudaSlice, CudaStream, DevicePtr};

use crate::backend::cpu::{CpuBuffer, movement};
use crate::backend::{Buffer, Storage};
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::runtime::{lifecycle, memory};
use crate::shape::Layout;
use crate::sync::{Arc, Mutex};

use super::cache::{self, BufferCache};
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

impl CudaBuffer {
    /// Allocates `bytes` (unspecified contents) in stream order on `cs`.
    pub fn alloc(cs: &CudaStreamHandle, bytes: usize) -> Result<CudaBuffer> {
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
        let slice = match class {
            _ if bytes == 0 => None,
            Some(c) => Some(match cs.cache.take(c) {
                Some(s) => s,
                None => fresh(c)?,
            }),
            None => Some(fresh(bytes)?),
        };
        let ptr = match &slice {
            Some(s) => {
                let (p, _sync) = s.device_ptr(cs.raw_stream());
                p
            }
            None => 0,
        };
        memory::on_alloc(bytes);
        Ok(CudaBuffer {
            slice: ManuallyDrop::new(slice),
            ptr,
            bytes,
            ordinal: cs.dev.ordinal,
            alloc_stream_id: cs.id,
            produced: OnceLock::new(),
            users: Mutex::new(Vec::new()),
            constant: false,
            cache: class.map(|c| (cs.cache.clone(), c)),
        })
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
        let Some(_pass) = lifecycle::release_pass() else { return };
        let users = std::mem::take(self.users.get_mut());
        let _ = catch_unwind(AssertUnwindSafe(|| {
            // Kernels this thread recorded on the allocating stream (a temporary's) are
            // sent first, so that the free is ordered after them.
            super::launch::flush_stream(self.alloc_stream_id);
            // SAFETY: the slice is taken exactly once, here.
            let mut slice = unsafe { ManuallyDrop::take(&mut self.slice) };
            // No memory (an empty buffer): nothing to free, nothing to wait for.
            if let Some(s) = &slice {
                for (_, ev) in &users {
                    let _ = ev.wait_on(s.stream());
                }
            }
            // The free (or the reuse, on the same stream) is ordered on the allocating
            // stream after the waits above.
            if let (Some((cache, class)), Some(s)) = (&self.cache, slice.take()) {
                slice = cache.give(*class, self.ptr, s);
            }
            drop(slice);
        }));
    }
}

/// The CUDA buffer of a storage (None for host storages).
pub(crate) fn cuda_of(s: &Storage) -> Option<&CudaBuffer> {
    match &*s.buffer {
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
pub(crate) fn scalar_on_device(cs: &CudaStreamHandle, s: &Storage) -> Result<Option<Storage>> {
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
pub(crate) fn slab_scalar(cs: &CudaStreamHandle, dtype: DType, bits: u64, shape: &[usize]) -> Result<Option<Storage>> {
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
    let _ = cs.dev.ctx.bind_to_thread();
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
    let t = &cs.dev.transfer;
    // SAFETY: the slot lies inside the slab; the copy has finished when `synchronize`
    // returns (so every stream may read it without an event), while `bits` is alive.
    unsafe { cudarc::driver::result::memcpy_htod_async(ptr, &bits[..], t.cu_stream()) }
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
pub(crate) fn upload(cs: &CudaStreamHandle, s: &Storage) -> Result<Storage> {
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
        let _ = cs.dev.ctx.bind_to_thread();
        // SAFETY: `buf` holds `src.len()` bytes; a pageable source is staged by the driver
        // before this call returns, so `src` may be freed afterwards.
        unsafe { cudarc::driver::result::memcpy_htod_async(buf.ptr(), src, cs.stream().cu_stream()) }
            .map_err(|e| super::backend_err("to_device", e))?;
    }
    Ok(Storage::contiguous(Buffer::Cuda(buf), s.dtype, &s.layout.shape))
}

/// Copies the elements of a device storage to the host (the data must be complete, or
/// produced earlier on `stream`), returning a contiguous host storage.
pub(crate) fn download(stream: &CudaStream, s: &Storage) -> Result<Storage> {
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
            cudarc::driver::result::memcpy_dtoh_async(dst, b.ptr() + (lo * size) as u64, stream.cu_stream())
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
pub(crate) fn new_storage(cs: &CudaStreamHandle, dtype: DType, shape: &[usize]) -> Result<Storage> {
    let n: usize = shape.iter().product();
    let buf = CudaBuffer::alloc(cs, n * dtype.size())?;
    Ok(Storage::contiguous(Buffer::Cuda(buf), dtype, shape))
}
