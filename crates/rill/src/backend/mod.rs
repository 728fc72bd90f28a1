//! Backends: where evaluated arrays live and how primitives run.
//!
//! A [`Storage`] is the value of an evaluated node: a reference-counted [`Buffer`] and a
//! strided [`Layout`] over it (views share buffers). Each backend implements one function,
//! `eval(primitive, inputs) -> Storage`, as an exhaustive `match` over [`Primitive`].
//! Allocation, streams and launches stay here; shape inference stays in `ops`.

pub(crate) mod cpu;
#[cfg(feature = "cuda")]
pub(crate) mod cuda;

use std::mem::ManuallyDrop;
use std::sync::Arc;

use crate::dtype::DType;
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
        if polls % 16 == 0 {
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
pub(crate) struct Fence(crate::runtime::completion::Completion<crate::error::Result<()>>);

#[allow(dead_code)]
impl Fence {
    pub fn new() -> Arc<Fence> {
        Arc::new(Fence::default())
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
    if stream.device().is_gpu() {
        #[cfg(feature = "cuda")]
        return stream.inner.cuda.as_ref().and_then(|cs| cuda::ready_scalar(cs, dtype, value));
        #[cfg(not(feature = "cuda"))]
        return None;
    }
    let key = (dtype, value.to_bits());
    // One lock for the lookup and the insertion: two threads asking for a new value at
    // once make it once.
    let mut cache = HOST_SCALAR_CACHE.lock();
    if let Some((_, s)) = cache.iter().find(|(k, _)| *k == key) {
        return Some(s.clone());
    }
    let s = cpu::eval(&crate::primitives::Primitive::Full { value }, &[], dtype, &[]).ok()?;
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

/// Runs one batch of nodes (all on `stream`) in order. Called by the stream's pool job.
pub(crate) fn execute_batch(stream: &crate::runtime::stream::Stream, nodes: &[crate::array::Array]) {
    use crate::runtime::scheduler::execute_node;
    if stream.device().is_gpu() {
        #[cfg(feature = "cuda")]
        {
            cuda::execute_batch(stream, nodes);
            return;
        }
    }
    for a in nodes {
        execute_node(&a.node, |node, inputs| cpu::eval(&node.prim, &node.shape, node.dtype, inputs));
    }
}
