//! Process-wide counters, so that tests and users can prove what the runtime did.
//!
//! | counter | written by | meaning |
//! |---|---|---|
//! | `streams_created` | `Stream::new`, default streams | streams ever made |
//! | `streams_live` | stream creation and its last handle's drop | streams alive now |
//! | `threads_live` | the worker pool's start/exit hooks, device workers | runtime threads alive now |
//! | `threads_started` | same | runtime threads ever started |
//! | `in_flight` | the scheduler (claim +1, completion -1) | nodes submitted and not finished |
//! | `nodes_computed` | the executor | nodes whose kernel ran |
//! | `backend_calls_after_shutdown` | the CUDA backend's driver tokens taken from nested passes (`lifecycle::note_backend_call`; a token from a gate pass is proven by its type) | calls made without a pass of the closed gate: must stay 0 (a refused call is not counted) |
//! | `threads_in_backend` | the backend gate (`gate.rs`) | threads inside a backend library now; 0 after shutdown |
//! | `memory_waits`, `queue_waits` | the scheduler | times a submitter waited (memory limit, full queue) |
//! | `graphs_built`, `graph_launches` | the CUDA backend's launcher | CUDA graphs instantiated; batches sent as one graph launch |
//! | `graph_node_updates` | the CUDA backend's launcher | kernel nodes of a replayed graph whose arguments were rewritten |
//! | `events_created` | the CUDA backend's event pool | CUDA events created (idle ones are recorded again) |
//! | `fused_reduce_kernels` | the CUDA backend | `FusedReduce` nodes computed by one generated kernel |
//! | `linger_handoffs` | the scheduler | GPU batches started by a lingering pool job |
//! | `inline_batches` | the scheduler | batches a blocking `eval` ran on its own thread |
//! | `eval_fused_groups`, `eval_fused_ops` | fusion at eval (`fusion.rs`) | fused nodes made by evaluations; the ops they replaced |
//! | `matmul_epilogues_lt`, `matmul_epilogue_kernels` | the backends' fused-block kernels | `compile`'s matmul blocks computed by one cuBLASLt call with an epilogue (GPU); by the product and then the program |
//! | `residual_norms` | the backends' fused-block kernels | `compile`'s residual-norm blocks computed (one kernel each) |
//! | `multi_tensor_launches`, `multi_tensor_members` | the backends' fused-block kernels | launches of `compile`'s multi-tensor blocks (one per block on the CPU); the tensors they covered |
//! | `buffers_donated` | the backends' `slice_update` kernels | results written into the buffer of a donated input (one nothing else held) instead of a new one |
//! | `kernels_compiled`, `kernels_compiled_on_user_threads` | the CUDA backend's NVRTC cache | kernels compiled; of them, on a thread not the runtime's (must stay 0) |

use crate::sync::atomic::{AtomicU64, AtomicUsize, Ordering::Relaxed};
pub(crate) static STREAMS_CREATED: AtomicU64 = AtomicU64::new(0);
pub(crate) static STREAMS_LIVE: AtomicUsize = AtomicUsize::new(0);
pub(crate) static THREADS_LIVE: AtomicUsize = AtomicUsize::new(0);
pub(crate) static THREADS_STARTED: AtomicU64 = AtomicU64::new(0);
pub(crate) static IN_FLIGHT: AtomicUsize = AtomicUsize::new(0);
pub(crate) static NODES_COMPUTED: AtomicU64 = AtomicU64::new(0);
pub(crate) static BACKEND_CALLS_AFTER_SHUTDOWN: AtomicU64 = AtomicU64::new(0);
pub(crate) static MEMORY_WAITS: AtomicU64 = AtomicU64::new(0);
pub(crate) static QUEUE_WAITS: AtomicU64 = AtomicU64::new(0);
pub(crate) static GRAPHS_BUILT: AtomicU64 = AtomicU64::new(0);
pub(crate) static GRAPH_LAUNCHES: AtomicU64 = AtomicU64::new(0);
pub(crate) static GRAPH_NODE_UPDATES: AtomicU64 = AtomicU64::new(0);
pub(crate) static EVENTS_CREATED: AtomicU64 = AtomicU64::new(0);
pub(crate) static FUSED_REDUCE_KERNELS: AtomicU64 = AtomicU64::new(0);
pub(crate) static LINGER_HANDOFFS: AtomicU64 = AtomicU64::new(0);
pub(crate) static INLINE_BATCHES: AtomicU64 = AtomicU64::new(0);
pub(crate) static HOST_ROUND_TRIPS: AtomicU64 = AtomicU64::new(0);
pub(crate) static EVAL_FUSED_GROUPS: AtomicU64 = AtomicU64::new(0);
pub(crate) static EVAL_FUSED_OPS: AtomicU64 = AtomicU64::new(0);
pub(crate) static MATMUL_EPILOGUES_LT: AtomicU64 = AtomicU64::new(0);
pub(crate) static MATMUL_EPILOGUE_KERNELS: AtomicU64 = AtomicU64::new(0);
pub(crate) static RESIDUAL_NORMS: AtomicU64 = AtomicU64::new(0);
pub(crate) static MULTI_TENSOR_LAUNCHES: AtomicU64 = AtomicU64::new(0);
pub(crate) static MULTI_TENSOR_MEMBERS: AtomicU64 = AtomicU64::new(0);
pub(crate) static KERNELS_COMPILED: AtomicU64 = AtomicU64::new(0);
pub(crate) static KERNELS_COMPILED_ON_USER_THREADS: AtomicU64 = AtomicU64::new(0);
pub(crate) static BUFFERS_DONATED: AtomicU64 = AtomicU64::new(0);

/// A snapshot of the runtime's counters (see the module docs for each one).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Stats {
    /// Streams ever created (user streams and default streams).
    pub streams_created: u64,
    /// Streams alive now.
    pub streams_live: usize,
    /// Runtime-owned OS threads alive now (CPU worker pool and device workers).
    pub threads_live: usize,
    /// Runtime-owned OS threads ever started.
    pub threads_started: u64,
    /// Nodes submitted for evaluation that have not finished.
    pub in_flight: usize,
    /// Nodes whose kernel has run.
    pub nodes_computed: u64,
    /// Bytes allocated for arrays now.
    pub bytes_active: usize,
    /// High-water mark of `bytes_active`.
    pub bytes_peak: usize,
    /// Bytes held in allocator caches.
    pub bytes_cached: usize,
    /// Calls into a backend library made after shutdown closed the backend gate by a
    /// thread holding no pass of it (always 0 unless rill has a bug). Work that shutdown
    /// refuses or cancels makes no call and is not counted.
    pub backend_calls_after_shutdown: u64,
    /// Threads inside a backend library (CUDA driver, NVRTC, cuBLAS) right now; after a
    /// shutdown whose report says `threads_joined`, always 0.
    pub threads_in_backend: usize,
    /// Times a submitter waited because memory was over the limit.
    pub memory_waits: u64,
    /// Times a submitter waited because a stream's queue was full (backpressure).
    pub queue_waits: u64,
    /// CUDA graphs instantiated from a batch's kernel launches (a launch sequence seen
    /// twice on a stream).
    pub graphs_built: u64,
    /// GPU batches (or parts of one) sent as one CUDA graph launch instead of one launch
    /// per kernel.
    pub graph_launches: u64,
    /// Kernel nodes of replayed CUDA graphs whose arguments had to be rewritten (a batch
    /// replayed a graph made for other buffers).
    pub graph_node_updates: u64,
    /// CUDA events created. Each GPU batch records one event; an idle one is recorded
    /// again, so a sequence of evaluations creates only a few.
    pub events_created: u64,
    /// `rill::compile` reductions (`FusedReduce` nodes) that a GPU computed with one
    /// generated kernel, the reduced values never stored; the others store the values
    /// first (see the CUDA backend's `fused.rs`). The CPU never counts here.
    pub fused_reduce_kernels: u64,
    /// GPU batches started by their stream's pool job while it waited for them after the
    /// stream's previous batch (no pool thread was woken; see the scheduler's `linger`).
    pub linger_handoffs: u64,
    /// Batches a blocking `eval` ran on its own thread (it found the stream idle; see the
    /// scheduler's `Runner::Caller`) instead of on the pool.
    pub inline_batches: u64,
    /// GPU nodes computed on the host: the stream waits for the inputs, they are copied
    /// to the host, computed there and the result uploaded. These are integer (and bool)
    /// matmuls (cuBLAS has no integer product), `custom` host callbacks on a GPU stream,
    /// and copies between two GPUs (through the host). Every other GPU node runs a GPU
    /// kernel; none falls back to the host silently.
    pub host_round_trips: u64,
    /// Kernels compiled with NVRTC (each distinct kernel once per process, unless two
    /// threads needed it at the same moment; the small kernel compiled while a GPU
    /// initialises is not counted).
    pub kernels_compiled: u64,
    /// Of `kernels_compiled`, those compiled on a thread that is not the runtime's (always
    /// 0: a compile needed by a blocking `eval` on the calling thread runs on the pool).
    pub kernels_compiled_on_user_threads: u64,
    /// Results written into the buffer of a donated input (an evaluated input that
    /// nothing but the consuming node held: a KV cache updated by `slice_update`) instead
    /// of a new buffer.
    pub buffers_donated: u64,
    /// `Fused` and `FusedReduce` nodes that fusion at eval made: each is one kernel where
    /// the graph had a chain of elementwise ops (see `rill::runtime::set_eval_fusion`).
    pub eval_fused_groups: u64,
    /// The elementwise ops (and reductions) those nodes compute in place of separate kernels.
    pub eval_fused_ops: u64,
    /// `rill::compile` matmul blocks (a product and its elementwise epilogue) that a GPU
    /// computed with one cuBLASLt call and its epilogue (bias, ReLU/tanh GELU, residual).
    pub matmul_epilogues_lt: u64,
    /// Matmul blocks computed as the product and then the epilogue's program in one
    /// generated kernel (every backend; on a GPU where cuBLASLt cannot apply it).
    pub matmul_epilogue_kernels: u64,
    /// `rill::compile` residual-norm blocks (`norm(x + r)`, the sum kept or not) computed.
    pub residual_norms: u64,
    /// Launches of `rill::compile` multi-tensor blocks (one program over many tensors; a
    /// launch covers up to 64 of them on a GPU, all of them on the CPU).
    pub multi_tensor_launches: u64,
    /// The tensors those launches covered.
    pub multi_tensor_members: u64,
}

/// Reads every counter.
pub fn stats() -> Stats {
    Stats {
        streams_created: STREAMS_CREATED.load(Relaxed),
        streams_live: STREAMS_LIVE.load(Relaxed),
        threads_live: THREADS_LIVE.load(Relaxed),
        threads_started: THREADS_STARTED.load(Relaxed),
        in_flight: IN_FLIGHT.load(Relaxed),
        nodes_computed: NODES_COMPUTED.load(Relaxed),
        bytes_active: super::memory::active_memory(),
        bytes_peak: super::memory::peak_memory(),
        bytes_cached: super::memory::cached_memory(),
        backend_calls_after_shutdown: BACKEND_CALLS_AFTER_SHUTDOWN.load(Relaxed),
        threads_in_backend: super::lifecycle::threads_in_backend(),
        memory_waits: MEMORY_WAITS.load(Relaxed),
        queue_waits: QUEUE_WAITS.load(Relaxed),
        graphs_built: GRAPHS_BUILT.load(Relaxed),
        graph_launches: GRAPH_LAUNCHES.load(Relaxed),
        graph_node_updates: GRAPH_NODE_UPDATES.load(Relaxed),
        events_created: EVENTS_CREATED.load(Relaxed),
        fused_reduce_kernels: FUSED_REDUCE_KERNELS.load(Relaxed),
        linger_handoffs: LINGER_HANDOFFS.load(Relaxed),
        inline_batches: INLINE_BATCHES.load(Relaxed),
        host_round_trips: HOST_ROUND_TRIPS.load(Relaxed),
        kernels_compiled: KERNELS_COMPILED.load(Relaxed),
        kernels_compiled_on_user_threads: KERNELS_COMPILED_ON_USER_THREADS.load(Relaxed),
        buffers_donated: BUFFERS_DONATED.load(Relaxed),
        eval_fused_groups: EVAL_FUSED_GROUPS.load(Relaxed),
        eval_fused_ops: EVAL_FUSED_OPS.load(Relaxed),
        matmul_epilogues_lt: MATMUL_EPILOGUES_LT.load(Relaxed),
        matmul_epilogue_kernels: MATMUL_EPILOGUE_KERNELS.load(Relaxed),
        residual_norms: RESIDUAL_NORMS.load(Relaxed),
        multi_tensor_launches: MULTI_TENSOR_LAUNCHES.load(Relaxed),
        multi_tensor_members: MULTI_TENSOR_MEMBERS.load(Relaxed),
    }
}
