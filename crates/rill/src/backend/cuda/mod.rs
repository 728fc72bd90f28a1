//! The CUDA backend: devices, non-blocking streams, stream-ordered buffers, NVRTC kernels
//! and cuBLAS matrix products.
//!
//! | piece | file | owns |
//! |---|---|---|
//! | when the driver, NVRTC, cuBLAS and cuBLASLt are loaded and first initialised | `libs.rs` | the libraries' loaded state (never unloaded) |
//! | driver probe, per-device state, completion workers, shutdown | `device.rs` | one context and one worker thread per device |
//! | the driver token: the only way to call the backend libraries, while holding a gate pass | `driver.rs` | nothing |
//! | events, streams, cuBLAS handles (Drop never panics) | `handles.rs` | CUDA events, streams, cuBLAS handles |
//! | device buffers, host↔device copies, the scalar slab | `buffer.rs` | device allocations |
//! | small buffers kept for reuse by their stream | `cache.rs` | cached device memory, per stream |
//! | kernel launches; a batch's launches recorded and replayed as CUDA graphs | `launch.rs` | CUDA graphs, per stream |
//! | a batch's nodes (the CUDA side of `backend::BatchRun`): waits, launches, events, fences | `exec.rs` | nothing |
//! | NVRTC compilation and the kernel cache | `nvrtc.rs` | loaded modules |
//! | CUDA C prelude (dtypes, conversions) | `source.rs` | nothing |
//! | elementwise kernels, copies and sources | `elementwise.rs`, `map.rs` | nothing |
//! | reductions, softmax | `reduce.rs` | nothing |
//! | softmax over an axis that is not last, read in place by columns | `softmax_cols.rs` | nothing |
//! | layer/RMS norm | `norm.rs` | nothing |
//! | argmax/argmin, cumsum | `scan.rs` | nothing |
//! | take: one gather kernel that checks its own indices | `take.rs` | nothing |
//! | scatter_add, take_along_axis, put_along_axis (atomic adds, a two-pass put), indices checked as take's | `scatter.rs` | nothing |
//! | index checks reported at batch completion (no host wait): check slots, check fences | `check.rs` | one slab of check slots per device (device and host-mapped memory, kept for the process) |
//! | concatenate (one kernel per 16 inputs), pad, tiled transposes making views contiguous | `copy.rs` | nothing |
//! | threefry random arrays (the CPU's values) | `random.rs` | nothing |
//! | matmul | `matmul.rs` | nothing |
//! | scaled dot-product attention (flash-attention style; tensor cores for f16/bf16) | `attention.rs` | nothing |
//! | block-quantized matmul from the packed blocks, dequantization | `quant.rs` | nothing |
//! | fused elementwise programs and fused reductions (`rill::compile`) | `fused.rs` | nothing |
//!
//! Synchronisation model: a storage exists once its kernel is enqueued. Work on the same
//! stream is ordered by the stream; another stream that reads a buffer first makes its
//! CUDA stream wait (`cuStreamWaitEvent`, a GPU-side wait) on the buffer's producer event.
//! Kernels launched while a batch runs are recorded and sent when the batch ends (as one
//! CUDA graph launch when the sequence repeats) or before anything else uses the stream
//! or frees memory allocated on it (`launch.rs`), so the stream order is unchanged.
//! The host learns of completion through the batch's [`crate::backend::Fence`], signalled
//! by the device's one completion worker thread. A buffer is freed on the stream that
//! allocated it, after that stream waited for the last use on every other stream.
//!
//! Nothing here panics across the API: the driver library is probed inside
//! `catch_unwind`, and every handle whose cudarc `Drop` could panic is destroyed by hand,
//! only while the runtime is running, and leaked on purpose during shutdown.

mod attention;
mod attention_gemm;
mod attention_grad;
mod blocks;
mod buffer;
mod cache;
mod check;
mod copy;
mod decode;
mod device;
#[allow(clippy::disallowed_methods)] // the one file that calls the backend libraries
mod driver;
mod elementwise;
mod exec;
mod fused;
pub(crate) mod fused_src;
mod handles;
mod handoff;
mod launch;
pub(crate) mod libs;
mod map;
mod matmul;
mod norm;
mod nvrtc;
mod qfused;
mod quant;
mod random;
mod reduce;
mod scan;
mod scatter;
mod softmax_cols;
mod sort;
mod source;
mod take;

pub(crate) use buffer::{CudaBuffer, ready_scalar, recycle};
pub(crate) use device::{clear_cache, device, device_count, shutdown};
pub(crate) use exec::{BatchRun, to_host};
pub(crate) use handles::{CudaStreamHandle, new_stream};
pub use matmul::set_allow_tf32;

use crate::error::Error;

/// Turns a driver/cuBLAS/NVRTC error into a rill backend error for `op`.
pub(crate) fn backend_err(op: &'static str, e: impl std::fmt::Debug) -> Error {
    Error::Backend { op, msg: format!("{e:?}").into() }
}

/// The `Unsupported` error of this backend.
pub(crate) fn unsupported(op: &'static str, msg: impl Into<String>) -> Error {
    Error::Unsupported { op, backend: "cuda", msg: msg.into() }
}
