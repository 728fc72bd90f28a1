//! CUDA events, streams and cuBLAS handles wrapped so that their `Drop` never panics and
//! never calls the driver once shutdown has begun (they are leaked on purpose then).

use std::mem::ManuallyDrop;
use std::panic::{AssertUnwindSafe, catch_unwind};

use cudarc::driver::{CudaContext, CudaStream, DriverError, sys};

use crate::error::Result;
use crate::runtime::lifecycle;
use crate::sync::OnceLock;
use crate::sync::atomic::{AtomicU64, Ordering::Relaxed};
use crate::sync::{Arc, Mutex};

use super::device::{self, DeviceState};
use super::driver::Driver;

static NEXT_ID: AtomicU64 = AtomicU64::new(1);

/// A CUDA event (see [`EVENT_FLAGS`]), owned by rill. Its handle comes from the
/// device's [`EventPool`] and goes back there when the last reference is dropped.
pub(crate) struct Ev {
    ev: sys::CUevent,
    /// The pool the handle returns to (it holds the device's context).
    pool: Arc<EventPool>,
}

/// Idle event handles of one device, for reuse.
///
/// Every batch records one event; creating and destroying one per batch would add two
/// driver calls to every batch besides the record. An [`Ev`] is dropped only when
/// nothing can wait on it any more (the completion worker, the buffers it orders and the
/// batch hold references), so its handle can be recorded again at once: a GPU-side wait
/// already enqueued on it waits for the record it saw, not for later ones. At most
/// [`EVENT_POOL`] handles are kept; during shutdown they are leaked, like every handle.
pub(crate) struct EventPool {
    free: Mutex<Vec<sys::CUevent>>,
    ctx: Arc<CudaContext>,
}
// SAFETY: event handles may be used from any thread; the list is behind a mutex.
unsafe impl Send for EventPool {}
// SAFETY: as above.
unsafe impl Sync for EventPool {}

/// Idle event handles a device keeps.
const EVENT_POOL: usize = 256;

impl EventPool {
    pub fn new(ctx: Arc<CudaContext>) -> EventPool {
        EventPool { free: Mutex::new(Vec::new()), ctx }
    }
}

impl Drop for EventPool {
    fn drop(&mut self) {
        let free = std::mem::take(self.free.get_mut());
        let Some(pass) = lifecycle::release_pass() else { return }; // leaked on purpose
        let d = pass.driver();
        let _ = catch_unwind(AssertUnwindSafe(|| {
            let _ = self.ctx.bind_to_thread();
            for ev in free {
                // SAFETY: an idle handle of this context, destroyed exactly once, here.
                unsafe { d.event_destroy(ev) };
            }
        }));
    }
}
// SAFETY: CUDA events may be used from any thread.
unsafe impl Send for Ev {}
// SAFETY: as above; every use goes through the driver, which is thread safe.
unsafe impl Sync for Ev {}

/// Events record no timing and are not blocking-sync. A blocking-sync event lets
/// `cuEventSynchronize` sleep until the GPU's interrupt; rill never needs that (waits
/// poll, then nap between queries: [`Ev::wait_low_latency`]), and without the flag a small
/// `eval` was faster in same-call comparisons (`rill bench overhead`).
const EVENT_FLAGS: u32 = sys::CUevent_flags::CU_EVENT_DISABLE_TIMING as u32;

/// The longest nap between two queries of a long wait, and the first one.
const NAP_MAX: std::time::Duration = std::time::Duration::from_micros(50);
const NAP_MIN: std::time::Duration = std::time::Duration::from_micros(5);

impl Ev {
    /// Records the current end of `stream` (of `pool`'s device) into an event: an idle one
    /// of `pool`, else a new one.
    pub fn record(d: Driver<'_>, stream: &CudaStream, pool: &Arc<EventPool>) -> std::result::Result<Ev, DriverError> {
        pool.ctx.bind_to_thread()?;
        let idle = pool.free.lock().pop();
        let ev = match idle {
            Some(ev) => ev,
            None => {
                // Valid flags, a live context bound to this thread.
                let ev = d.event_create(EVENT_FLAGS)?;
                crate::runtime::stats::EVENTS_CREATED.fetch_add(1, Relaxed);
                ev
            }
        };
        // From here the handle is owned by `e`: a failed record returns it to the pool.
        let e = Ev { ev, pool: pool.clone() };
        // SAFETY: both handles are live, of the bound context.
        unsafe { d.event_record(e.ev, stream.cu_stream())? };
        Ok(e)
    }
    /// Blocks the calling thread until the recorded work has finished (polling first,
    /// as [`Ev::wait_low_latency`] with [`crate::backend::WAIT_YIELD`]).
    pub fn synchronize(&self, d: Driver<'_>) -> std::result::Result<(), DriverError> {
        self.wait_low_latency(d, crate::backend::WAIT_YIELD)
    }
    /// Waits for the recorded work with low latency: polls (yielding the CPU between
    /// rounds of polls) until `until`, then queries with naps in between (growing from
    /// [`NAP_MIN`] to [`NAP_MAX`]), so a long wait costs the CPU almost nothing and ends at
    /// most one nap (plus the thread's timer slack) after the work.
    ///
    /// The context is bound once and the loop reads only a copy of the handle: the `Ev`
    /// shares its cache line with its `Arc`'s count, which the stream job changes once per
    /// buffer while it publishes and frees a batch, often the one being waited for here
    /// (a poll that read the line could pull it away from the job each time).
    pub fn wait_low_latency(&self, d: Driver<'_>, until: std::time::Duration) -> std::result::Result<(), DriverError> {
        self.pool.ctx.bind_to_thread()?;
        let raw = self.ev;
        let mut err = None;
        let query = || match query_raw(d, raw) {
            Ok(done) => done,
            Err(e) => {
                err = Some(e);
                true
            }
        };
        if crate::backend::poll_until(query, until) {
            return err.map_or(Ok(()), Err);
        }
        let mut nap = NAP_MIN;
        while !query_raw(d, raw)? {
            std::thread::sleep(nap);
            nap = (nap * 2).min(NAP_MAX);
        }
        Ok(())
    }
    /// Makes `stream` wait (on the GPU) for the recorded work.
    pub fn wait_on(&self, d: Driver<'_>, stream: &CudaStream) -> std::result::Result<(), DriverError> {
        self.pool.ctx.bind_to_thread()?;
        // SAFETY: live handles of the same context, bound to this thread.
        unsafe { d.stream_wait_event(stream.cu_stream(), self.ev) }
    }
    /// The raw handle (identity only).
    pub fn raw(&self) -> usize {
        self.ev as usize
    }
}

impl Drop for Ev {
    fn drop(&mut self) {
        let Some(pass) = lifecycle::release_pass() else { return }; // leaked on purpose
        let d = pass.driver();
        {
            let mut free = self.pool.free.lock();
            if free.len() < EVENT_POOL {
                free.push(self.ev); // recorded again by a later batch (see `EventPool`)
                return;
            }
        }
        let _ = catch_unwind(AssertUnwindSafe(|| {
            let _ = self.pool.ctx.bind_to_thread();
            // SAFETY: destroyed exactly once, here.
            unsafe { d.event_destroy(self.ev) };
        }));
    }
}

/// Queries a live event of the context bound to this thread.
fn query_raw(d: Driver<'_>, ev: sys::CUevent) -> std::result::Result<bool, DriverError> {
    // SAFETY: the caller's event is live (its `Ev` is borrowed) and its context is bound.
    unsafe { d.event_query(ev) }
}

/// A cuBLAS handle bound to one stream, with its own workspace, destroyed by hand (the
/// workspace is a raw allocation that is leaked, like the handle, during shutdown).
pub(crate) struct Blas {
    pub handle: cudarc::cublas::sys::cublasHandle_t,
    pub workspace: ManuallyDrop<Option<cudarc::driver::CudaSlice<u8>>>,
    /// The workspace's device address (0 without one).
    pub ws_ptr: u64,
    /// The stream's cuBLASLt handle and plans (`matmul.rs`).
    pub lt: super::matmul::LtState,
}
// SAFETY: a cuBLAS handle may be used from any thread, one at a time (guarded by a mutex).
unsafe impl Send for Blas {}

/// The CUDA side of a GPU [`crate::Stream`]: a non-blocking CUDA stream of one device.
pub(crate) struct CudaStreamHandle {
    pub id: u64,
    pub dev: Arc<DeviceState>,
    stream: ManuallyDrop<Arc<CudaStream>>,
    /// Created on the first matmul on this stream (reached through [`Self::blas`]).
    blas: Mutex<Option<Blas>>,
    /// The CUDA graphs of this stream's batches (see `launch.rs`).
    pub graphs: Mutex<super::launch::GraphCache>,
    /// Small buffers freed on this stream, kept for its next allocations (`cache.rs`).
    pub cache: Arc<super::cache::BufferCache>,
    /// The row counters of split reductions (`reduce.rs`), made on first use.
    pub reduce_counters: OnceLock<super::buffer::CudaBuffer>,
}

/// Creates a non-blocking CUDA stream on GPU `ordinal` (never the legacy default stream).
pub(crate) fn new_stream(ordinal: usize) -> Result<CudaStreamHandle> {
    new_stream_on(device::device(ordinal)?)
}

/// [`new_stream`] on an initialised device (also one being initialised: `matmul::warm_up`).
pub(crate) fn new_stream_on(dev: Arc<DeviceState>) -> Result<CudaStreamHandle> {
    let pass = lifecycle::enter_backend().ok_or(crate::error::Error::ShutDown)?;
    let s = dev.ctx(pass.driver()).new_stream().map_err(|e| super::backend_err("new_stream", e))?;
    let cache = Arc::new(super::cache::BufferCache::default());
    dev.register_cache(&cache);
    Ok(CudaStreamHandle {
        id: NEXT_ID.fetch_add(1, Relaxed),
        dev,
        stream: ManuallyDrop::new(s),
        blas: Mutex::new(None),
        graphs: Mutex::new(Default::default()),
        cache,
        reduce_counters: OnceLock::new(),
    })
}

/// The accessors below borrow the result for no longer than the token's pass as well as
/// the handle: a raw handle cannot be kept past the pass without an explicit clone.
impl CudaStreamHandle {
    /// The cudarc stream, for any use other than a kernel launch or an allocation: the
    /// kernel launches this thread has recorded for the stream are sent first, so that
    /// the use is ordered after them (see `launch.rs`).
    pub fn stream<'s>(&'s self, d: Driver<'s>) -> &'s Arc<CudaStream> {
        super::launch::flush(d, self);
        &self.stream
    }
    /// The cudarc stream without sending recorded launches: for allocations (ordered
    /// before the kernels that will use them) and the launcher itself.
    pub fn raw_stream<'s>(&'s self, _d: Driver<'s>) -> &'s Arc<CudaStream> {
        &self.stream
    }
    /// The stream's cuBLAS state (its handles hold cuBLAS objects: under a pass only).
    pub fn blas<'s>(&'s self, _d: Driver<'s>) -> &'s Mutex<Option<Blas>> {
        &self.blas
    }
    /// Blocks until all work enqueued on this stream has finished.
    pub fn synchronize(&self) -> Result<()> {
        // After shutdown every batch has finished or been cancelled: nothing to wait for.
        let Some(pass) = lifecycle::enter_backend() else { return Ok(()) };
        self.stream(pass.driver()).synchronize().map_err(|e| super::backend_err("synchronize", e))
    }
}

impl Drop for CudaStreamHandle {
    fn drop(&mut self) {
        let blas = self.blas.get_mut().take();
        let graphs = std::mem::take(self.graphs.get_mut());
        // After shutdown began the stream and the cuBLAS handle are leaked on purpose.
        let Some(pass) = lifecycle::release_pass() else { return };
        let d = pass.driver();
        let _ = catch_unwind(AssertUnwindSafe(|| {
            if let Some(mut b) = blas {
                let _ = self.dev.ctx(d).bind_to_thread();
                // SAFETY: the handle was created by us and is destroyed once; then its
                // workspace is freed (in stream order, after the handle's last use).
                unsafe {
                    b.lt.destroy(d);
                    d.cublas_destroy_handle(b.handle);
                    ManuallyDrop::drop(&mut b.workspace);
                }
            }
            drop(graphs);
            // Cached whole buffers refer to the cache: it is emptied and closed here, not
            // when its last reference goes.
            self.cache.close();
            // SAFETY: dropped exactly once, here. Buffers allocated on this stream keep
            // their own reference, so the CUDA stream lives until the last one is freed.
            unsafe { ManuallyDrop::drop(&mut self.stream) };
        }));
    }
}
