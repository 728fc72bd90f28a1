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
#[derive(Clone)]
pub(crate) struct Storage {
    pub buffer: Arc<Buffer>,
    pub dtype: DType,
    pub layout: Layout,
}

impl Storage {
    /// A storage over a whole new contiguous buffer.
    pub fn contiguous(buffer: Buffer, dtype: DType, shape: &[usize]) -> Storage {
        Storage { buffer: Arc::new(buffer), dtype, layout: Layout::contiguous(shape) }
    }
    /// The same buffer seen through another layout.
    pub fn with_layout(&self, layout: Layout) -> Storage {
        Storage { buffer: self.buffer.clone(), dtype: self.dtype, layout }
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
