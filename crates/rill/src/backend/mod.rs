//! Backends: where evaluated arrays live and how primitives run.
//!
//! A [`Storage`] is the value of an evaluated node: a reference-counted [`Buffer`] and a
//! strided [`Layout`] over it (views share buffers). Each backend computes a primitive
//! from its inputs' storages with one exhaustive `match` over [`Primitive`]
//! (`cpu::eval`, `cuda/exec.rs`). Allocation, streams and launches stay here; shape and
//! dtype rules stay in `primitives`.
//!
//! The runtime reaches the backends only through the contract at the end of this file:
//! [`StreamBackend`] (a stream's backend part), [`BatchRun`] (a batch, one node at a
//! time) and the device functions (`open_gpu`, `gpu_count`, `libraries`, `clear_caches`,
//! `stop_workers`), so that nothing above `backend/` depends on the `cuda` feature.

pub(crate) mod cpu;
#[cfg(feature = "cuda")]
pub(crate) mod cuda;

use std::mem::ManuallyDrop;
use std::sync::Arc;

use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::primitives::Primitive;
use crate::runtime::device::Device;
use crate::shape::Layout;

/// Device memory of some backend.
pub(crate) enum Buffer {
    /// Host memory.
    Cpu(cpu::CpuBuffer),
    /// Device memory of a CUDA GPU.
    #[cfg(feature = "cuda")]
    Cuda(cuda::CudaBuffer),
}

impl Buffer {
    pub(crate) fn as_cpu(&self) -> Option<&cpu::CpuBuffer> {
        match self {
            Buffer::Cpu(b) => Some(b),
            #[cfg(feature = "cuda")]
            _ => None,
        }
    }
}

/// The value of an evaluated array: a buffer, the dtype, and where the elements lie.
///
/// On a GPU a storage exists as soon as its kernel is *enqueued*: work on the same
/// stream is ordered after it, work on other streams waits on the buffer's event (a GPU
/// wait). `fence` tells the host when the kernel has *finished*; it is signalled by the
/// device's completion worker. CPU storages have no fence (they are finished when made).
#[derive(Clone)]
pub(crate) struct Storage {
    /// Taken exactly once, in `Drop` (a GPU buffer of a cached size whose last reference
    /// this is goes back to its stream's cache whole: see `cuda::recycle`).
    pub buffer: ManuallyDrop<Arc<Buffer>>,
    pub dtype: DType,
    pub layout: Layout,
    pub fence: Option<Arc<Fence>>,
}

impl Drop for Storage {
    fn drop(&mut self) {
        // SAFETY: the field is taken exactly once, here, and never used again.
        let buffer = unsafe { ManuallyDrop::take(&mut self.buffer) };
        #[cfg(feature = "cuda")]
        if matches!(&*buffer, Buffer::Cuda(_)) && Arc::strong_count(&buffer) == 1 {
            cuda::recycle(buffer);
            return;
        }
        drop(buffer);
    }
}

/// How long a thread that waits for device work polls before it sleeps. A sleeping thread
/// is woken tens of microseconds after the signal, which is what a GPU op of a few hundred
/// microseconds would otherwise pay on every `eval` (wake-ups were most of a small
/// `eval`'s cost before waits polled).
pub(crate) const WAIT_YIELD: std::time::Duration = std::time::Duration::from_millis(2);

/// Polls `done` until it returns true (then true) or `until` has passed since the call
/// (then false: the caller may sleep). Every 16th poll yields the CPU, so that the thread
/// that will make `done` true gets to run even when the scheduler placed it on this CPU.
pub(crate) fn poll_until(mut done: impl FnMut() -> bool, until: std::time::Duration) -> bool {
    let start = std::time::Instant::now();
    let mut polls = 0u32;
    loop {
        if done() {
            return true;
        }
        polls = polls.wrapping_add(1);
        if polls.is_multiple_of(16) {
            if start.elapsed() > until {
                return false;
            }
            std::thread::yield_now();
        } else {
            std::hint::spin_loop();
        }
    }
}

/// A host-visible completion flag for device work, waitable by threads and wakers.
#[derive(Default)]
pub(crate) struct Fence(crate::runtime::completion::Completion<crate::error::Result<()>>, bool);

#[allow(dead_code)]
impl Fence {
    pub fn new() -> Arc<Fence> {
        Arc::new(Fence::default())
    }
    /// A fence that carries the verdict of device-side index checks (`cuda/check.rs`):
    /// readers of its storage inherit it while it is unsignalled.
    pub fn new_check() -> Arc<Fence> {
        Arc::new(Fence(Default::default(), true))
    }
    /// Whether this is a check fence not yet signalled.
    pub fn is_open_check(&self) -> bool {
        self.1 && !self.0.is_done()
    }
    pub fn is_signalled(&self) -> bool {
        self.0.is_done()
    }
    /// Marks the device work finished (or failed) and wakes every waiter.
    pub fn signal(&self, result: crate::error::Result<()>) {
        self.0.complete(result);
    }
    /// Blocks until signalled. Polls first (see [`WAIT_YIELD`]): device work that ends
    /// within that time then costs no sleep and wake-up of this thread.
    pub fn wait(&self) -> crate::error::Result<()> {
        poll_until(|| self.0.is_done(), WAIT_YIELD);
        self.0.wait()
    }
    /// Registers a waker; returns false when already signalled.
    pub fn register_waker(&self, w: &std::task::Waker) -> bool {
        self.0.register_waker(w)
    }
    /// The outcome once signalled (`Ok` before).
    pub fn result(&self) -> crate::error::Result<()> {
        self.0.get().unwrap_or(Ok(()))
    }
    /// Runs `cb` once signalled: at once when already signalled, else on the signalling
    /// thread. It must not block.
    pub fn on_done(&self, cb: crate::runtime::completion::Callback) {
        self.0.on_done(cb);
    }
}

impl Storage {
    /// A storage over a whole new contiguous buffer.
    pub fn contiguous(buffer: Buffer, dtype: DType, shape: &[usize]) -> Storage {
        Storage::from_arc(Arc::new(buffer), dtype, Layout::contiguous(shape))
    }
    /// A storage over `buffer` (no fence).
    pub fn from_arc(buffer: Arc<Buffer>, dtype: DType, layout: Layout) -> Storage {
        Storage { buffer: ManuallyDrop::new(buffer), dtype, layout, fence: None }
    }
    /// The same buffer seen through another layout.
    pub fn with_layout(&self, layout: Layout) -> Storage {
        Storage { buffer: self.buffer.clone(), dtype: self.dtype, layout, fence: self.fence.clone() }
    }
    pub fn cpu(&self) -> Option<&cpu::CpuBuffer> {
        self.buffer.as_cpu()
    }
}

/// The value of a 0-d `Full` node of `value` on `stream` when it can be had at once,
/// without a kernel, a copy or any driver call: on the CPU a one-element buffer (shared
/// by the last [`HOST_SCALARS`] values asked for), on a GPU the device's scalar slab when
/// it already holds the value (`x * 0.5` after the first time). The op layer records such
/// a scalar as already evaluated, so a chain of ops with scalar operands plans, claims and
/// runs one node per op, not two.
pub(crate) fn ready_scalar(stream: &crate::runtime::stream::Stream, dtype: DType, value: f64) -> Option<Storage> {
    match &stream.inner.backend {
        StreamBackend::Host => {}
        #[cfg(feature = "cuda")]
        StreamBackend::Cuda(cs) => return cuda::ready_scalar(cs, dtype, value),
    }
    let key = (dtype, value.to_bits());
    // One lock for the lookup and the insertion: two threads asking for a new value at
    // once make it once.
    let mut cache = HOST_SCALAR_CACHE.lock();
    if let Some((_, s)) = cache.iter().find(|(k, _)| *k == key) {
        return Some(s.clone());
    }
    let s = cpu::eval(&Primitive::Full { value }, &[], dtype, &[]).ok()?;
    if cache.len() >= HOST_SCALARS {
        cache.remove(0);
    }
    cache.push((key, s.clone()));
    Some(s)
}

/// Host scalars kept for reuse (storages are never written after they are made, so the
/// nodes of `x * 0.5` and `y * 0.5` may share one buffer); the oldest goes first.
const HOST_SCALARS: usize = 32;
type ScalarKey = (DType, u64);
static HOST_SCALAR_CACHE: crate::sync::Mutex<Vec<(ScalarKey, Storage)>> = crate::sync::Mutex::new(Vec::new());

/// Lets go of the kept host scalars (`clear_cache`).
pub(crate) fn forget_host_scalars() {
    let kept = std::mem::take(&mut *HOST_SCALAR_CACHE.lock());
    drop(kept);
}

// ---- the contract the runtime calls ----
//
// The runtime sees a backend only through what follows: a stream's backend part, a
// batch run (one node at a time, then the batch's end), and the device functions. It owns
// the node-execution loop itself (`runtime/execute.rs`); backends see primitives,
// storages and their stream, never an `Array` or a node.

/// A stream's backend part: nothing on the host, a CUDA stream on a GPU.
#[allow(clippy::large_enum_variant)] // one per stream, inside the stream's `Arc`
pub(crate) enum StreamBackend {
    /// A CPU stream: its batches run on the worker pool.
    Host,
    /// A non-blocking CUDA stream of one device.
    #[cfg(feature = "cuda")]
    Cuda(cuda::CudaStreamHandle),
}

impl StreamBackend {
    /// The backend part of a new stream on `device` (already validated by `open_gpu`).
    pub(crate) fn new(device: &Device) -> Result<StreamBackend> {
        if !device.is_gpu() {
            return Ok(StreamBackend::Host);
        }
        #[cfg(feature = "cuda")]
        return Ok(StreamBackend::Cuda(cuda::new_stream(device.ordinal())?));
        #[cfg(not(feature = "cuda"))]
        return Err(no_cuda(device.ordinal()));
    }
    /// Blocks until the device work enqueued on the stream so far has finished.
    pub(crate) fn synchronize(&self) -> Result<()> {
        match self {
            StreamBackend::Host => Ok(()),
            #[cfg(feature = "cuda")]
            StreamBackend::Cuda(cs) => cs.synchronize(),
        }
    }
    /// Whether a batch on this stream calls a backend library, and so runs holding a pass
    /// of the backend gate (which process exit waits for).
    pub(crate) fn calls_libraries(&self) -> bool {
        match self {
            StreamBackend::Host => false,
            #[cfg(feature = "cuda")]
            StreamBackend::Cuda(_) => true,
        }
    }
}

#[cfg(not(feature = "cuda"))]
fn no_cuda(ordinal: usize) -> Error {
    Error::DeviceUnavailable {
        device: format!("gpu:{ordinal}"),
        reason: "rill was built without the `cuda` feature".into(),
    }
}

/// Checks that GPU `ordinal` is usable, initialising its backend on the first call.
pub(crate) fn open_gpu(ordinal: usize) -> Result<()> {
    #[cfg(feature = "cuda")]
    return cuda::device(ordinal).map(drop);
    #[cfg(not(feature = "cuda"))]
    return Err(no_cuda(ordinal));
}

/// Number of usable GPUs (0 without a driver or without the `cuda` feature).
pub(crate) fn gpu_count() -> usize {
    #[cfg(feature = "cuda")]
    return cuda::device_count();
    #[cfg(not(feature = "cuda"))]
    return 0;
}

/// The backend libraries and when each was loaded (none without the `cuda` feature).
pub(crate) fn libraries() -> Vec<crate::runtime::BackendLibrary> {
    #[cfg(feature = "cuda")]
    return cuda::libs::report();
    #[cfg(not(feature = "cuda"))]
    return Vec::new();
}

/// Frees every cached allocation of every backend.
pub(crate) fn clear_caches() {
    forget_host_scalars();
    cpu::clear_cache();
    #[cfg(feature = "cuda")]
    cuda::clear_cache();
}

/// At shutdown, after the gate closed: stops the backends' own threads (a GPU's
/// completion worker), each within `bound`; true when every one was joined.
pub(crate) fn stop_workers(bound: std::time::Duration) -> bool {
    #[cfg(feature = "cuda")]
    return cuda::shutdown(bound);
    #[cfg(not(feature = "cuda"))]
    {
        let _ = bound;
        true
    }
}

/// The handle of a backend library rill has loaded, named as in
/// `runtime::backend_libraries` (`"nvrtc"`, ...); `None` when it is not loaded.
#[cfg_attr(not(test), allow(dead_code))]
pub(crate) fn library_handle(name: &str) -> Option<*mut std::ffi::c_void> {
    #[cfg(feature = "cuda")]
    return cuda::libs::loaded_handle(name);
    #[cfg(not(feature = "cuda"))]
    {
        let _ = name;
        None
    }
}

/// One node as a backend sees it.
pub(crate) struct Op<'a> {
    /// The node's process-unique id (names the node in launch failures).
    #[cfg_attr(not(feature = "cuda"), allow(dead_code))]
    pub id: u64,
    pub prim: &'a Primitive,
    pub shape: &'a [usize],
    pub dtype: DType,
}

/// A batch being run on one stream's backend, by the runtime's loop
/// (`runtime/execute.rs`): [`BatchRun::run`] for each node in order, then, where the
/// backend [defers completion](BatchRun::defers_completion), [`BatchRun::send`],
/// [`BatchRun::seal`] and, after the nodes are completed, [`BatchRun::close`].
pub(crate) enum BatchRun<'a> {
    /// Host kernels: each result is final when `run` returns.
    Host(std::marker::PhantomData<&'a ()>),
    /// Kernels enqueued on a CUDA stream, finished when the batch's fence is signalled.
    #[cfg(feature = "cuda")]
    Cuda(cuda::BatchRun<'a>),
}

impl<'a> BatchRun<'a> {
    /// Starts a batch of `len` nodes on `stream`. `pass` is the gate pass the runtime took
    /// when the stream [calls libraries](StreamBackend::calls_libraries).
    pub(crate) fn begin(
        stream: &'a StreamBackend,
        pass: Option<&'a crate::runtime::lifecycle::BackendPass>,
        len: usize,
    ) -> Result<BatchRun<'a>> {
        match stream {
            StreamBackend::Host => {
                let _ = (pass, len);
                Ok(BatchRun::Host(std::marker::PhantomData))
            }
            #[cfg(feature = "cuda")]
            StreamBackend::Cuda(cs) => {
                let pass = pass.ok_or_else(|| Error::backend("cuda", "a GPU batch without a gate pass"))?;
                Ok(BatchRun::Cuda(cuda::BatchRun::begin(pass.driver(), cs, len)))
            }
        }
    }
    /// True when results become usable only at the batch's end ([`BatchRun::seal`]): the
    /// runtime then keeps them and completes the nodes after `seal`. False when each
    /// result is final as `run` returns it: the runtime completes each node at once, so
    /// an intermediate nobody holds is freed as soon as its last reader ran.
    pub(crate) fn defers_completion(&self) -> bool {
        match self {
            BatchRun::Host(_) => false,
            #[cfg(feature = "cuda")]
            BatchRun::Cuda(_) => true,
        }
    }
    /// Computes one node from its inputs' storages (in the node's input order).
    pub(crate) fn run(&mut self, op: &Op<'_>, inputs: &[&Storage]) -> Result<Storage> {
        match self {
            BatchRun::Host(_) => cpu::eval(op.prim, op.shape, op.dtype, inputs),
            #[cfg(feature = "cuda")]
            BatchRun::Cuda(b) => b.run(op, inputs),
        }
    }
    /// [`BatchRun::run`] for a primitive that [writes into its first
    /// input](Primitive::writes_into_first_input), given that input's storage by value
    /// (`donor`, which no array holds any more) and the other inputs (`rest`). The result
    /// is written into `donor`'s buffer when the backend can own it (no other storage
    /// shares it, a contiguous layout, and on a GPU a buffer of this stream that no other
    /// stream has read); otherwise it is computed as `run` would.
    pub(crate) fn run_donated(&mut self, op: &Op<'_>, donor: Storage, rest: &[&Storage]) -> Result<Storage> {
        match self {
            BatchRun::Host(_) => cpu::eval_donated(op.prim, op.shape, op.dtype, donor, rest),
            #[cfg(feature = "cuda")]
            BatchRun::Cuda(b) => b.run_donated(op, donor, rest),
        }
    }
    /// After the last `run`: sends work still held back; returns what failed then, by
    /// node id (`None`: the whole batch). The runtime also fails their dependants.
    pub(crate) fn send(&mut self) -> Vec<(Option<u64>, Error)> {
        match self {
            BatchRun::Host(_) => Vec::new(),
            #[cfg(feature = "cuda")]
            BatchRun::Cuda(b) => b.send(),
        }
    }
    /// Makes the batch's results usable by other streams and the host (events, fences);
    /// may turn results into errors when that fails.
    pub(crate) fn seal(&mut self, results: &mut [Result<Storage>]) {
        match self {
            BatchRun::Host(_) => {
                let _ = results;
            }
            #[cfg(feature = "cuda")]
            BatchRun::Cuda(b) => b.seal(results),
        }
    }
    /// After the runtime completed the batch's nodes: hands the batch's fence to whoever
    /// signals it when the device work is done.
    pub(crate) fn close(self) {
        match self {
            BatchRun::Host(_) => {}
            #[cfg(feature = "cuda")]
            BatchRun::Cuda(b) => b.close(),
        }
    }
}
