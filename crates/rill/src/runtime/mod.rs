//! The stream runtime: devices, streams, scheduling, memory, lifecycle and counters.
//!
//! | piece | file | owns |
//! |---|---|---|
//! | devices, default device | `device.rs` | nothing (plain values) |
//! | streams, default streams | `stream.rs` | per-stream FIFO queues |
//! | the registry of live streams | `registry.rs` | weak entries |
//! | eval / async_eval, batches on streams | `scheduler.rs` | nothing (borrows the pool) |
//! | the node-execution loop of every backend | `execute.rs` | nothing |
//! | fusion at eval: elementwise chains nobody else holds become one node | `fusion.rs` | the table of programs by structure |
//! | claiming nodes, node status | `claim.rs` | nothing (used under the queue locks) |
//! | CPU worker pool | `pool.rs` | the runtime's CPU threads |
//! | scoped stream override | `scope.rs` | a `Weak` per thread, set by guards |
//! | memory counters and limit | `memory.rs` | counters |
//! | shutdown and exit hook | `lifecycle.rs` | nothing (runs `phase.rs`'s sequence) |
//! | the process state, the order of the shutdown steps | `phase.rs` | the state and the gate |
//! | the door into backend libraries that shutdown closes | `gate.rs` | a counter of threads inside |
//! | counters | `stats.rs` | counters |
//! | backend libraries' teardown entries, wrapped to run the exit shutdown first | `teardown.rs` | the wrapped entries |

pub(crate) mod claim;
pub(crate) mod completion;
pub(crate) mod device;
pub(crate) mod execute;
pub(crate) mod fusion;
pub(crate) mod gate;
pub(crate) mod lifecycle;
pub(crate) mod memory;
pub(crate) mod phase;
pub(crate) mod pool;
pub(crate) mod registry;
pub(crate) mod scheduler;
pub(crate) mod scope;
pub(crate) mod serial;
pub(crate) mod stats;
pub(crate) mod stream;
pub(crate) mod teardown;

pub use fusion::{eval_fusion, set_eval_fusion};
pub use lifecycle::{ShutdownReport, is_down, is_shutting_down, shutdown, shutdown_timeout};
pub use memory::{active_memory, cached_memory, memory_limit, peak_memory, reset_peak_memory, set_memory_limit};
pub use pool::num_threads as cpu_threads;
pub use stats::{Stats, stats};

/// A backend library rill may call (see [`backend_libraries`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BackendLibrary {
    /// `"CUDA driver"`, `"NVRTC"`, `"cuBLAS"` or `"cuBLASLt"`.
    pub name: &'static str,
    /// Whether and when it was loaded.
    pub state: LibraryState,
    /// How long looking for it and opening it took, in microseconds.
    pub open_micros: u64,
    /// True when every teardown entry the library registers after it was opened (the
    /// destructors of statics it constructs later) runs rill's exit shutdown first, so that
    /// the library is never torn down under a thread still inside it (Linux with glibc;
    /// docs/RUNTIME.md, "Process exit").
    pub teardown_guarded: bool,
}

/// When a backend library was loaded (docs/RUNTIME.md, "Process exit").
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LibraryState {
    /// Nobody has needed it yet (no GPU probed, and it was not loaded at start).
    NotLoaded,
    /// Loaded before `main`, by rill's constructor (Linux, unless `RILL_CUDA_PRELOAD=0`).
    LoadedAtStart,
    /// Loaded when the first GPU was probed.
    LoadedAtProbe,
    /// Looked for and not found.
    Missing,
}

/// The backend libraries rill calls and when each was loaded; empty without the `cuda`
/// feature. None of them is ever loaded once shutdown has begun.
pub fn backend_libraries() -> Vec<BackendLibrary> {
    crate::backend::libraries()
}

/// Frees every cached allocation on every device. Callable from any thread.
pub fn clear_cache() {
    crate::backend::clear_caches();
}
