//! Backends: where evaluated arrays live and how primitives run.
//!
//! A [`Storage`] is the value of an evaluated node: a reference-counted [`Buffer`] and a
//! strided [`Layout`] over it (views share buffers). Each backend implements one function,
//! `eval(primitive, inputs) -> Storage`, as an exhaustive `match` over [`Primitive`].
//! Allocation, streams and launches stay here; shape inference stays in `ops`.

pub(crate) mod cpu;
#[cfg(feature = "cuda")]
pub(crate) mod cuda;

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
    pub buffer: Arc<Buffer>,
    pub dtype: DType,
    pub layout: Layout,
    pub fence: Option<Arc<Fence>>,
}

/// Polls `done` for up to 50 µs before a caller blocks: work that finishes within that
/// time then costs no sleep and wake-up of the waiting thread (tens of microseconds).
pub(crate) fn spin_until(done: impl Fn() -> bool) {
    let start = std::time::Instant::now();
    let mut polls = 0u32;
    while !done() {
        polls += 1;
        if polls % 64 == 0 && start.elapsed() > std::time::Duration::from_micros(50) {
            return;
        }
        std::hint::spin_loop();
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
    /// Blocks until signalled. Polls briefly first: device work that ends within a few
    /// microseconds then costs no sleep and wake-up of this thread.
    pub fn wait(&self) -> crate::error::Result<()> {
        spin_until(|| self.0.is_done());
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
        Storage { buffer: Arc::new(buffer), dtype, layout: Layout::contiguous(shape), fence: None }
    }
    /// The same buffer seen through another layout.
    pub fn with_layout(&self, layout: Layout) -> Storage {
        Storage { buffer: self.buffer.clone(), dtype: self.dtype, layout, fence: self.fence.clone() }
    }
    pub fn cpu(&self) -> Option<&cpu::CpuBuffer> {
        self.buffer.as_cpu()
    }
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
