//! The driver probe, per-device state and the device completion workers.
//!
//! Owner: the process-wide `DEVICES` table (one `DeviceState` per ordinal, made lazily on
//! first use and never dropped). Each device has one completion worker thread, owned by
//! the runtime and counted in `stats::THREADS_LIVE/THREADS_STARTED`: it waits (host side,
//! polling the event, then querying it between short naps) for each batch's event in
//! order and signals the batch's fence. `shutdown` stops and joins the workers within a bound.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::time::Duration;

use cudarc::driver::{CudaContext, CudaStream, sys};

use crate::backend::Fence;
use crate::error::{Error, Result};
use crate::runtime::{lifecycle, pool, stats};
use crate::sync::OnceLock;
use crate::sync::atomic::Ordering::SeqCst;
use crate::sync::{Arc, Deadline, Mutex, Weak};

use super::driver::Driver;
use super::handles::Ev;
use super::handoff::Handoff;

/// One initialised GPU.
pub(crate) struct DeviceState {
    pub ordinal: usize,
    /// The primary context (reached through [`Self::ctx`], under a pass).
    ctx: Arc<CudaContext>,
    /// `sm_XY` for NVRTC.
    pub arch: String,
    /// Number of streaming multiprocessors (for grid sizes).
    pub sms: u32,
    /// A stream for host↔device copies made outside of batches (`to_host`; reached
    /// through [`Self::transfer`], under a pass).
    transfer: Arc<CudaStream>,
    /// Device copies of one-element host values (see `buffer::scalar_on_device`).
    pub scalars: Mutex<super::buffer::ScalarCache>,
    /// Elementwise kernels already loaded, by what they compute (see `map::map`).
    pub map_fns: Mutex<super::map::MapFns>,
    /// Idle event handles (see `handles::EventPool`).
    pub events: Arc<super::handles::EventPool>,
    /// The buffer caches of this device's streams, for `clear_cache`.
    caches: Mutex<Vec<Weak<super::cache::BufferCache>>>,
    worker: Worker,
}

impl DeviceState {
    /// The device's primary context (borrowed for no longer than the token's pass).
    pub fn ctx<'s>(&'s self, _d: Driver<'s>) -> &'s Arc<CudaContext> {
        &self.ctx
    }
    /// The stream for host↔device copies made outside of batches.
    pub fn transfer<'s>(&'s self, _d: Driver<'s>) -> &'s Arc<CudaStream> {
        &self.transfer
    }
    /// Lists a stream's buffer cache so that `clear_cache` can empty it.
    pub fn register_cache(&self, cache: &Arc<super::cache::BufferCache>) {
        let mut g = self.caches.lock();
        g.retain(|w| w.strong_count() > 0);
        g.push(Arc::downgrade(cache));
    }
}

/// The completion worker's queue, shared with the threads that hand it jobs (the
/// protocol is `handoff.rs`'s, model-checked with loom).
type WorkerShared = Handoff<(Arc<Ev>, Arc<Fence>)>;

struct Worker {
    q: Arc<WorkerShared>,
    handle: Mutex<Option<std::thread::JoinHandle<()>>>,
}

static PROBE: OnceLock<std::result::Result<usize, String>> = OnceLock::new();
static DEVICES: Mutex<Vec<Option<Arc<DeviceState>>>> = Mutex::new(Vec::new());
/// Held while a device initialises.
static INIT: Mutex<()> = Mutex::new(());

/// Loads the driver once and counts the devices; never panics.
fn probe() -> std::result::Result<usize, String> {
    super::libs::keep_preload();
    PROBE
        .get_or_init(|| {
            let Some(pass) = lifecycle::enter_backend() else {
                return Err("the rill runtime is shut down".to_string());
            };
            let d = pass.driver();
            let r = catch_unwind(|| {
                if !super::libs::load(super::libs::Lib::Driver) {
                    return Err("the CUDA driver library (libcuda) was not found".to_string());
                }
                // NVRTC, cuBLAS and cuBLASLt too, unless loaded before `main` (`libs.rs`).
                super::libs::load_all();
                d.init().map_err(|e| format!("cuInit failed: {e:?}"))?;
                let n = d.device_count().map_err(|e| format!("cuDeviceGetCount failed: {e:?}"))?;
                Ok(n.max(0) as usize)
            });
            match r {
                Ok(r) => r,
                Err(p) => Err(format!("the CUDA driver could not be loaded: {}", crate::error::panic_message(&*p))),
            }
        })
        .clone()
}

/// Number of usable GPUs (0 without a driver).
pub(crate) fn device_count() -> usize {
    probe().unwrap_or(0)
}

fn unavailable(ordinal: usize, reason: impl Into<String>) -> Error {
    Error::DeviceUnavailable { device: format!("gpu:{ordinal}"), reason: reason.into() }
}

/// The state of GPU `ordinal`, initialising it (context, worker) on first use.
pub(crate) fn device(ordinal: usize) -> Result<Arc<DeviceState>> {
    let count = probe().map_err(|r| unavailable(ordinal, r))?;
    if ordinal >= count {
        return Err(unavailable(ordinal, format!("{count} CUDA device(s) found")));
    }
    if let Some(d) = initialised(ordinal) {
        return Ok(d);
    }
    // One initialisation at a time; the table's own lock is only held briefly (shutdown
    // and `clear_cache` take it).
    let _init = INIT.lock();
    if let Some(d) = initialised(ordinal) {
        return Ok(d);
    }
    lifecycle::check_running()?;
    let pass = lifecycle::enter_backend().ok_or(Error::ShutDown)?;
    let drv = pass.driver();
    let d = catch_unwind(AssertUnwindSafe(|| init(drv, ordinal))).unwrap_or_else(|p| {
        Err(unavailable(ordinal, format!("initialisation panicked: {}", crate::error::panic_message(&*p))))
    })?;
    pool::ensure_started();
    // The first calls of NVRTC, cuBLAS and cuBLASLt happen here, on this thread, before the
    // device is handed out (the pool's start above registered the exit hook; where a
    // library's teardown is not guarded, these calls register it again after the statics
    // they constructed: `libs::after_first_use`).
    super::nvrtc::warm_up(&d.arch);
    super::matmul::warm_up(drv, &d);
    let mut table = DEVICES.lock();
    if table.len() <= ordinal {
        table.resize_with(ordinal + 1, || None);
    }
    table[ordinal] = Some(d.clone());
    Ok(d)
}

/// GPU `ordinal`'s state once it is initialised.
fn initialised(ordinal: usize) -> Option<Arc<DeviceState>> {
    DEVICES.lock().get(ordinal).cloned().flatten()
}

fn init(d: Driver<'_>, ordinal: usize) -> Result<Arc<DeviceState>> {
    let err = |what: &str, e: cudarc::driver::DriverError| unavailable(ordinal, format!("{what}: {e:?}"));
    let ctx = d.primary_context(ordinal).map_err(|e| err("cannot retain the primary context", e))?;
    // rill orders streams itself (events per buffer); cudarc's per-slice tracking is off.
    // SAFETY: no slice exists yet in this context.
    unsafe { ctx.disable_event_tracking() };
    let (major, minor) = ctx.compute_capability().map_err(|e| err("compute capability", e))?;
    let sms = ctx
        .attribute(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)
        .map_err(|e| err("multiprocessor count", e))?
        .max(1) as u32;
    // Stream-ordered allocations are cheap when the default pool keeps freed memory for
    // reuse; `clear_cache` trims it. Failures only disable the caching.
    d.keep_freed_memory(ctx.cu_device());
    let transfer = ctx.new_stream().map_err(|e| err("cannot create a stream", e))?;
    let q = Arc::new(WorkerShared::new());
    let q2 = q.clone();
    let c2 = ctx.clone();
    let handle = std::thread::Builder::new()
        .name(format!("rill-cuda-{ordinal}"))
        .spawn(move || worker_main(c2, q2))
        .map_err(|e| unavailable(ordinal, format!("cannot start the completion worker: {e}")))?;
    let events = Arc::new(super::handles::EventPool::new(ctx.clone()));
    Ok(Arc::new(DeviceState {
        ordinal,
        ctx,
        arch: format!("sm_{major}{minor}"),
        sms,
        transfer,
        scalars: Mutex::new(super::buffer::ScalarCache::default()),
        map_fns: Mutex::new(Default::default()),
        events,
        caches: Mutex::new(Vec::new()),
        worker: Worker { q, handle: Mutex::new(Some(handle)) },
    }))
}

/// How long the completion worker polls a batch's event (yielding the CPU every 16 polls,
/// see `poll_until`) before it naps between queries (`Ev::wait_low_latency`): a sleeping
/// thread wakes tens of microseconds late, which is most of the cost of a short
/// evaluation. The worker only polls while a batch it was handed is still running.
const UNTIL: Duration = Duration::from_micros(2100);
/// How long the worker keeps polling its queue after its last job before it sleeps: the
/// next `eval` of a thread that was waiting for that job usually hands over its batch
/// within this time, and then needs no wake-up of the worker.
const LINGER: Duration = Duration::from_micros(200);

fn worker_main(ctx: Arc<CudaContext>, q: Arc<WorkerShared>) {
    stats::THREADS_LIVE.fetch_add(1, SeqCst);
    stats::THREADS_STARTED.fetch_add(1, SeqCst);
    // Naps of a long wait end on time (Linux lets a sleep overrun by the thread's timer
    // slack, 50 µs by default, as much as the longest nap).
    #[cfg(target_os = "linux")]
    // SAFETY: sets an attribute of the calling thread only.
    unsafe {
        libc::prctl(libc::PR_SET_TIMERSLACK, 5_000 as libc::c_ulong);
    }
    // The context current on this thread for its whole life (each wait binds it again).
    if let Some(_pass) = lifecycle::enter_backend() {
        let _ = ctx.bind_to_thread();
    }
    // Without a job: linger (polling the flag, not the lock), then sleep.
    let linger = |q: &WorkerShared| {
        crate::backend::poll_until(|| q.poked(), LINGER);
    };
    while let Some((ev, fence)) = q.next(linger) {
        // Once shutdown has closed the backend gate, pending batches report ShutDown.
        let r = match lifecycle::enter_backend() {
            None => Err(Error::ShutDown),
            Some(pass) => match catch_unwind(AssertUnwindSafe(|| ev.wait_low_latency(pass.driver(), UNTIL))) {
                Ok(Ok(())) => Ok(()),
                Ok(Err(e)) => Err(Error::backend("cuda", format!("device work failed: {e:?}"))),
                Err(p) => Err(Error::Panic { op: "cuda", msg: crate::error::panic_message(&*p).into() }),
            },
        };
        fence.signal(r);
        drop(ev);
    }
    stats::THREADS_LIVE.fetch_sub(1, SeqCst);
    q.exited();
}

impl DeviceState {
    /// Hands a batch's event and fence to the completion worker. When the worker is
    /// stopped (shutdown), waits for the event here instead.
    pub(crate) fn complete_later(&self, d: Driver<'_>, ev: Arc<Ev>, fence: Arc<Fence>) {
        let Err((ev, fence)) = self.worker.q.push((ev, fence)) else { return };
        let r = ev.synchronize(d).map_err(|e| Error::backend("cuda", format!("device work failed: {e:?}")));
        fence.signal(r);
    }
}

/// Stops the completion workers and joins them within `bound`; true when all exited.
pub(crate) fn shutdown(bound: Duration) -> bool {
    let devices: Vec<Arc<DeviceState>> = DEVICES.lock().iter().flatten().cloned().collect();
    for d in &devices {
        d.worker.q.stop();
    }
    let deadline = Deadline::after(bound);
    let mut all = true;
    for d in &devices {
        if d.worker.q.wait_exited(&deadline) {
            if let Some(h) = d.worker.handle.lock().take() {
                let _ = h.join();
            }
        } else {
            // Left behind: it finishes on its own once the GPU answers.
            all = false;
        }
    }
    all
}

/// Returns the memory cached by every device's memory pool to the driver.
pub(crate) fn clear_cache() {
    let Some(pass) = lifecycle::release_pass() else { return };
    let drv = pass.driver();
    let devices: Vec<Arc<DeviceState>> = DEVICES.lock().iter().flatten().cloned().collect();
    for d in devices {
        let caches: Vec<_> = d.caches.lock().iter().filter_map(Weak::upgrade).collect();
        for c in caches {
            c.trim();
        }
        let _ = catch_unwind(AssertUnwindSafe(|| {
            let _ = d.ctx(drv).bind_to_thread();
            let _ = d.transfer(drv).synchronize();
            drv.trim_freed_memory(d.ctx(drv).cu_device());
        }));
    }
}
