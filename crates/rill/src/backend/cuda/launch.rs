//! Kernel launches, and the CUDA graphs that replay the launches of a batch.
//!
//! Every kernel of the backend is launched through [`Launch`], which copies its arguments.
//! Outside a batch (and for other streams) a launch goes straight to `cuLaunchKernel`.
//! While a batch runs on a stream (`cuda::BatchRun`) it holds a [`Recording`]: launches
//! on that stream are kept in order instead, and sent when the batch ends or when anything
//! else is about to use the stream (a copy, cuBLAS, a synchronisation, an event: every
//! such use goes through [`CudaStreamHandle::stream`], which flushes first). A buffer of
//! the stream whose last reference goes while launches are recorded (a kernel's
//! temporary, an intermediate array) is kept by the recording ([`keep_until_sent`], up to
//! [`KEEP_BYTES`]) and released after the launches are sent, so that its free or reuse
//! is ordered after the kernels that read it without cutting the batch's graph; past
//! that size, or when it cannot be kept, its release flushes first.
//! Allocations do not flush: a stream-ordered allocation enqueued before the kernels that
//! use it is what they need anyway.
//!
//! A flush of at least [`GRAPH_MIN`] launches becomes one CUDA graph launch. Graphs are
//! cached per stream, keyed by the sequence of (function, grid, block, shared memory,
//! argument size): the second time a sequence is seen it is instantiated. A sequence keeps
//! up to [`PER_SEQUENCE`] graphs for different arguments (the batches of a long chain
//! repeat one sequence, each with its own buffers, and with the stream's buffer cache the
//! same buffers in the next evaluation): a replay launches the graph whose arguments are
//! already the batch's, instantiates another when the batch's arguments were seen before,
//! or else updates the arguments of the kernels whose arguments changed
//! (`cuGraphExecKernelNodeSetParams`) in the sequence's least recently used graph.
//! Shorter flushes, sequences seen once, and any graph call that fails fall back to direct
//! launches, so graphs never change results, only the cost per kernel.
//! `RILL_CUDA_GRAPHS=0` turns them off.
//!
//! On sm_90 and later a graph's kernels are chained by programmatic edges (programmatic
//! dependent launch): a kernel is started once every block of the previous one has
//! started, and waits in its first statement (`rill_grid_wait()`, which the NVRTC front end
//! puts at the top of every rill kernel) until the previous kernel's writes are visible.
//! A kernel marked `RILL_OWN_WAIT` waits itself, after prefetching into L2 what it will
//! read (the quantized products' weight rows, `k_qmvf`): the prefetch overlaps the
//! previous kernel, and L2 is coherent, so nothing stale is read after the wait.
//! Each kernel's start then overlaps the previous one's tail, which shortens a chain of
//! dependent kernels when the device, not the host, sets the pace (`rill bench
//! chain_wide`). `RILL_CUDA_PDL=0` makes the edges plain ones.
//!
//! A launch that fails is charged to the node that made it ([`Recording::finish`] returns
//! those nodes; the batch fails them and their dependants), as when launches were direct.
//!
//! The recorder is a thread-local, and the backend's only one. It is not ambient state
//! and owns no backend resource: it exists only while a batch runs, synchronously
//! (no `.await`), on the thread running the batch (a pool thread, or the thread of a
//! blocking `eval` running an idle GPU stream's batches itself); its guard clears it when
//! the batch returns or unwinds; it holds plain data (function handles of modules that
//! stay loaded, argument bytes, and a pointer to the stream handle the batch borrows).
//! Launches for any other stream, and launches on threads that are not running a batch,
//! go out directly.

use std::cell::RefCell;
use std::panic::{AssertUnwindSafe, catch_unwind};

use cudarc::driver::{CudaFunction, DriverError, LaunchConfig, sys};
use smallvec::SmallVec;

use crate::backend::Buffer;
use crate::runtime::{lifecycle, stats};
use crate::sync::atomic::Ordering::Relaxed;
use crate::sync::{Arc, OnceLock};

use super::driver::{Driver, GpuStream};
use super::handles::CudaStreamHandle;

/// Flushes with fewer launches than this go out one by one.
pub(crate) const GRAPH_MIN: usize = 8;
/// Graphs kept per stream (least recently used evicted).
const GRAPHS_PER_STREAM: usize = 32;
/// Graphs kept per launch sequence, each for other arguments.
const PER_SEQUENCE: usize = 8;
/// Sequences remembered as "seen once" per stream.
const SEEN: usize = 128;
/// Bytes of released buffers a recording keeps until its launches are sent (more flush).
pub(crate) const KEEP_BYTES: usize = 64 << 20;

fn graphs_enabled() -> bool {
    static ON: OnceLock<bool> = OnceLock::new();
    *ON.get_or_init(|| std::env::var("RILL_CUDA_GRAPHS").as_deref() != Ok("0"))
}

/// Whether a graph's kernels are chained by programmatic edges on `cs`'s device: sm_90
/// and later, unless `RILL_CUDA_PDL=0`.
fn programmatic_edges(cs: &CudaStreamHandle) -> bool {
    static ON: OnceLock<bool> = OnceLock::new();
    let on = *ON.get_or_init(|| std::env::var("RILL_CUDA_PDL").as_deref() != Ok("0"));
    on && cs.dev.arch.trim_start_matches("sm_").parse::<u32>().is_ok_and(|a| a >= 90)
}

/// One kernel launch: the function and a copy of its arguments. The function is a plain
/// handle: its module stays loaded for the life of the process (the NVRTC cache never
/// unloads one), so a recorded launch or a graph owns no driver resource through it.
pub(crate) struct Launch {
    func: sys::CUfunction,
    /// The arguments, each starting on an 8-byte boundary (inline up to [`INLINE_WORDS`]
    /// words: recording a small kernel's launch allocates nothing).
    words: Words,
    /// Where each argument starts in `words`.
    starts: SmallVec<[u32; INLINE_WORDS]>,
}

/// Argument words (and arguments) a launch keeps inline.
const INLINE_WORDS: usize = 12;
type Words = SmallVec<[u64; INLINE_WORDS]>;
type Params = SmallVec<[*mut std::ffi::c_void; INLINE_WORDS]>;

impl Launch {
    pub fn new(func: &CudaFunction) -> Launch {
        Launch::raw(func.cu_function())
    }
    /// A launch of a raw function handle of a module that stays loaded (see above).
    pub fn raw(func: sys::CUfunction) -> Launch {
        Launch { func, words: Words::new(), starts: SmallVec::new() }
    }
    /// Adds one argument: the bytes of `v`.
    pub fn arg<T: Copy>(&mut self, v: &T) -> &mut Launch {
        if std::mem::size_of::<T>() == 8 {
            // Pointers and 64-bit counts, most arguments: one word, no zero-fill first.
            // SAFETY: `T` is 8 bytes of plain data (`Copy`), read without alignment needs.
            let w = unsafe { std::ptr::read_unaligned((v as *const T).cast::<u64>()) };
            self.starts.push(self.words.len() as u32);
            self.words.push(w);
            return self;
        }
        self.arg_slice(std::slice::from_ref(v))
    }
    /// Adds one argument made of the bytes of every element of `v` (a parameter struct
    /// laid out as an array).
    pub fn arg_slice<T: Copy>(&mut self, v: &[T]) -> &mut Launch {
        debug_assert!(std::mem::align_of::<T>() <= 8);
        let bytes = std::mem::size_of_val(v);
        let start = self.words.len();
        self.words.resize(start + bytes.div_ceil(8).max(1), 0);
        // SAFETY: `words` has room for `bytes` bytes from `start`; `T: Copy` is plain data.
        unsafe {
            std::ptr::copy_nonoverlapping(
                v.as_ptr().cast::<u8>(),
                self.words.as_mut_ptr().add(start).cast::<u8>(),
                bytes,
            )
        };
        self.starts.push(start as u32);
        self
    }
    /// Launches on `cs` (or records the launch while `cs` runs a batch on this thread).
    ///
    /// # Safety
    /// The arguments must match the kernel's signature and every address it touches must
    /// stay valid until the kernel has run (buffers are freed in stream order after it).
    pub unsafe fn launch(self, cs: &GpuStream<'_>, cfg: LaunchConfig) -> Result<(), DriverError> {
        let mut p = Some(Pending { launch: self, cfg, node: 0 });
        // The recorder is gone while this thread's thread-locals are destroyed (a
        // thread-local's destructor evaluating GPU work): no batch can be recording then
        // (`Recording::begin` fails the same way), so the launch goes out directly.
        let _ = REC.try_with(|r| {
            // The launch is taken out of `p` only once a recorder is there to keep or
            // give it back: without one it must stay in `p` and go out directly below.
            if let Ok(mut g) = r.try_borrow_mut()
                && let Some(rec) = g.as_mut()
                && let Some(pending) = p.take()
            {
                p = rec.push(cs.id, pending);
            }
        });
        let Some(p) = p else { return Ok(()) }; // recorded
        cs.bind()?;
        // SAFETY: forwarded from the caller.
        unsafe { p.send(cs.driver(), cs.raw_stream().cu_stream()) }
    }
}

struct Pending {
    launch: Launch,
    cfg: LaunchConfig,
    /// The batch node that made the launch.
    node: u64,
}

impl Pending {
    /// The argument pointers (into `launch.words`, valid while `self` is).
    fn params(&mut self) -> Params {
        let base = self.launch.words.as_mut_ptr();
        // SAFETY: every start lies inside `words`.
        self.launch.starts.iter().map(|&s| unsafe { base.add(s as usize) }.cast()).collect()
    }
    unsafe fn send(mut self, d: Driver<'_>, stream: sys::CUstream) -> Result<(), DriverError> {
        let mut params = self.params();
        let c = self.cfg;
        // SAFETY: forwarded from `Launch::launch`.
        unsafe { d.launch_kernel(self.launch.func, c.grid_dim, c.block_dim, c.shared_mem_bytes, stream, &mut params) }
    }
    fn key(&self) -> Key {
        let c = &self.cfg;
        (self.launch.func as usize, c.grid_dim, c.block_dim, c.shared_mem_bytes, self.launch.words.len())
    }
    fn node_params(&self, params: &mut [*mut std::ffi::c_void]) -> sys::CUDA_KERNEL_NODE_PARAMS {
        let c = &self.cfg;
        sys::CUDA_KERNEL_NODE_PARAMS {
            func: self.launch.func,
            gridDimX: c.grid_dim.0,
            gridDimY: c.grid_dim.1,
            gridDimZ: c.grid_dim.2,
            blockDimX: c.block_dim.0,
            blockDimY: c.block_dim.1,
            blockDimZ: c.block_dim.2,
            sharedMemBytes: c.shared_mem_bytes,
            kernelParams: params.as_mut_ptr(),
            extra: std::ptr::null_mut(),
            kern: std::ptr::null_mut(),
            ctx: std::ptr::null_mut(),
        }
    }
}

type Key = (usize, (u32, u32, u32), (u32, u32, u32), u32, usize);

/// The launches recorded on this thread for one stream's batch.
struct Recorder {
    stream_id: u64,
    /// The stream handle of the batch; valid while the [`Recording`] guard lives (it
    /// clears the recorder when dropped).
    cs: *const CudaStreamHandle,
    pending: Vec<Pending>,
    node: u64,
    failed: Vec<(u64, DriverError)>,
    /// Buffers of the stream released while their kernels were recorded, and their bytes.
    keep: Vec<Arc<Buffer>>,
    kept_bytes: usize,
}

impl Recorder {
    /// Keeps `p` when it is for this recorder's stream; gives it back otherwise.
    fn push(&mut self, stream_id: u64, mut p: Pending) -> Option<Pending> {
        if stream_id != self.stream_id {
            return Some(p);
        }
        p.node = self.node;
        self.pending.push(p);
        None
    }
}

thread_local! {
    static REC: RefCell<Option<Recorder>> = const { RefCell::new(None) };
}

/// Records the kernel launches of one batch on `cs` (see the module docs).
pub(crate) struct Recording<'a> {
    cs: GpuStream<'a>,
}

impl<'a> Recording<'a> {
    /// Starts recording on this thread, with room for `launches` launches (a batch's node
    /// count: most nodes launch one kernel); `None` when graphs are off or this thread
    /// already records (a nested batch launches directly).
    pub fn begin(cs: GpuStream<'a>, launches: usize) -> Option<Recording<'a>> {
        if !graphs_enabled() {
            return None;
        }
        REC.try_with(|r| {
            let mut r = r.try_borrow_mut().ok()?;
            if r.is_some() {
                return None;
            }
            let pending = Vec::with_capacity(launches);
            *r = Some(Recorder {
                stream_id: cs.id,
                cs: cs.handle(),
                pending,
                node: 0,
                failed: Vec::new(),
                keep: Vec::new(),
                kept_bytes: 0,
            });
            Some(Recording { cs })
        })
        .ok()
        .flatten()
    }
    /// The node whose launches follow.
    pub fn node(&self, id: u64) {
        let _ = REC.try_with(|r| {
            if let Ok(mut r) = r.try_borrow_mut()
                && let Some(r) = r.as_mut()
            {
                r.node = id;
            }
        });
    }
    /// Sends what is recorded and stops recording; returns the nodes whose launches
    /// failed, with the error.
    pub fn finish(self) -> Vec<(u64, DriverError)> {
        flush(self.cs.driver(), &self.cs);
        let failed = REC
            .try_with(|r| r.try_borrow_mut().ok().and_then(|mut r| r.take()).map(|r| r.failed).unwrap_or_default())
            .unwrap_or_default();
        std::mem::forget(self);
        failed
    }
}

impl Drop for Recording<'_> {
    fn drop(&mut self) {
        // Reached only when `finish` was not (a panic unwinding through the batch).
        flush(self.cs.driver(), &self.cs);
        let _ = REC.try_with(|r| r.try_borrow_mut().map(|mut r| r.take()));
    }
}

/// Sends the launches recorded for `cs` on this thread, if any, then releases the
/// buffers the recording kept.
pub(crate) fn flush(d: Driver<'_>, cs: &CudaStreamHandle) {
    let (pending, keep) = REC
        .try_with(|r| match r.try_borrow_mut() {
            Ok(mut r) => match r.as_mut() {
                Some(r) if r.stream_id == cs.id => {
                    r.kept_bytes = 0;
                    (std::mem::take(&mut r.pending), std::mem::take(&mut r.keep))
                }
                _ => (Vec::new(), Vec::new()),
            },
            Err(_) => (Vec::new(), Vec::new()),
        })
        .unwrap_or_default();
    let failed = if pending.is_empty() {
        Vec::new()
    } else {
        catch_unwind(AssertUnwindSafe(|| send_all(&GpuStream::new(d, cs), pending)))
            .unwrap_or_else(|_| vec![(0, DriverError(sys::CUresult::CUDA_ERROR_UNKNOWN))])
    };
    // After the sends: each release is ordered after the kernels that read the buffer.
    for b in keep {
        super::buffer::recycle(b);
    }
    if !failed.is_empty() {
        let _ = REC.try_with(|r| {
            if let Ok(mut r) = r.try_borrow_mut()
                && let Some(r) = r.as_mut()
            {
                r.failed.extend(failed);
            }
        });
    }
}

/// Keeps `buffer` (a CUDA buffer whose last reference this is, allocated by the stream
/// `stream_id`) until the launches this thread records for that stream are sent, when it
/// records some and the recording keeps fewer than [`KEEP_BYTES`] with it; gives it back
/// otherwise (the caller flushes, then releases it).
pub(crate) fn keep_until_sent(buffer: Arc<Buffer>, stream_id: u64, bytes: usize) -> Option<Arc<Buffer>> {
    let mut buffer = Some(buffer);
    let _ = REC.try_with(|r| {
        if let Ok(mut r) = r.try_borrow_mut()
            && let Some(r) = r.as_mut()
            && r.stream_id == stream_id
            && !r.pending.is_empty()
            && r.kept_bytes + bytes <= KEEP_BYTES
            && let Some(b) = buffer.take()
        {
            r.kept_bytes += bytes;
            r.keep.push(b);
        }
    });
    buffer
}

/// Flushes the recording of the stream `stream_id` on this thread, if it is recording:
/// called before memory allocated on that stream is freed.
pub(crate) fn flush_stream(d: Driver<'_>, stream_id: u64) {
    let cs = REC
        .try_with(|r| match r.try_borrow() {
            Ok(r) => r.as_ref().filter(|r| r.stream_id == stream_id && !r.pending.is_empty()).map(|r| r.cs),
            Err(_) => None,
        })
        .ok()
        .flatten();
    if let Some(cs) = cs {
        // SAFETY: the recorder (and so this pointer) exists only while its `Recording`
        // guard, which borrows the stream handle, is alive on this thread.
        flush(d, unsafe { &*cs });
    }
}

/// Sends `pending` in order: as a graph when it qualifies, else one by one. Returns the
/// failed launches' nodes.
fn send_all(cs: &GpuStream<'_>, mut pending: Vec<Pending>) -> Vec<(u64, DriverError)> {
    let d = cs.driver();
    if let Err(e) = cs.bind() {
        return pending.iter().map(|p| (p.node, e)).collect();
    }
    let stream = cs.raw_stream().cu_stream();
    if pending.len() >= GRAPH_MIN && cs.graphs.lock().replay(d, stream, &mut pending, programmatic_edges(cs)) {
        stats::GRAPH_LAUNCHES.fetch_add(1, Relaxed);
        return Vec::new();
    }
    let mut failed = Vec::new();
    for p in pending {
        let node = p.node;
        // SAFETY: recorded by `Launch::launch`, whose caller vouched for the arguments.
        if let Err(e) = unsafe { p.send(d, stream) } {
            failed.push((node, e));
        }
    }
    failed
}

/// An instantiated graph of a launch sequence.
struct Graph {
    key: Vec<Key>,
    hash: u64,
    graph: sys::CUgraph,
    exec: sys::CUgraphExec,
    nodes: Vec<sys::CUgraphNode>,
    /// Each node's arguments as last set, and their hash ([`hash_args`]).
    args: Vec<Words>,
    args_hash: u64,
    used: u64,
}

/// The graphs of one stream.
#[derive(Default)]
pub(crate) struct GraphCache {
    graphs: Vec<Graph>,
    seen: Vec<u64>,
    clock: u64,
}
// SAFETY: graph handles may be used from any thread; the cache is behind the stream's mutex.
unsafe impl Send for GraphCache {}

/// A hash of the arguments of every launch of `pending`.
fn hash_args(pending: &[Pending]) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = rustc_hash::FxHasher::default();
    for p in pending {
        p.launch.words.hash(&mut h);
    }
    h.finish()
}

fn hash_keys(keys: &[Key]) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = rustc_hash::FxHasher::default();
    keys.hash(&mut h);
    h.finish()
}

impl GraphCache {
    /// Launches `pending` as a cached graph; false (nothing launched) when the sequence has
    /// no graph yet and is seen for the first time, or a graph call fails.
    ///
    /// A stream often repeats one launch sequence with different arguments in the same
    /// evaluation (the batches of a long chain of one op), each batch with the same
    /// arguments as in the previous evaluation. A sequence may therefore have up to
    /// [`PER_SEQUENCE`] graphs: a replay takes the one whose arguments are already those
    /// of `pending`; otherwise, when these arguments were seen before (they repeat), it
    /// instantiates a graph for them; otherwise it updates the arguments of the sequence's
    /// least recently used graph.
    fn replay(&mut self, d: Driver<'_>, stream: sys::CUstream, pending: &mut [Pending], programmatic: bool) -> bool {
        let keys: Vec<Key> = pending.iter().map(Pending::key).collect();
        let hash = hash_keys(&keys);
        let args = hash_args(pending);
        self.clock += 1;
        let clock = self.clock;
        let same = |g: &Graph| g.hash == hash && g.key == keys;
        let exact = self.graphs.iter().position(|g| {
            same(g) && g.args_hash == args && g.args.iter().zip(pending.iter()).all(|(a, p)| *a == p.launch.words)
        });
        let i = match exact {
            Some(i) => i,
            None => {
                let count = self.graphs.iter().filter(|g| same(g)).count();
                let repeats = self.seen.contains(&(hash ^ args));
                if count == 0 || (count < PER_SEQUENCE && repeats) {
                    if count == 0 && !self.seen.contains(&hash) {
                        self.remember(hash);
                        return false;
                    }
                    return self.instantiate(d, stream, pending, keys, hash, args, clock, programmatic);
                }
                if !repeats {
                    self.remember(hash ^ args);
                }
                let lru = self.graphs.iter().enumerate().filter(|(_, g)| same(g)).min_by_key(|(_, g)| g.used);
                match lru {
                    Some((i, _)) => i,
                    None => return false,
                }
            }
        };
        let g = &mut self.graphs[i];
        g.used = clock;
        g.args_hash = args;
        // An exact graph already has every argument; another gets the ones that changed.
        let ok = exact.is_some()
            || pending.iter_mut().zip(g.nodes.iter().zip(&mut g.args)).all(|(p, (&node, last))| {
                if p.launch.words == *last {
                    return true; // the same arguments as the last launch (reused buffers)
                }
                let mut params = p.params();
                let np = p.node_params(&mut params);
                stats::GRAPH_NODE_UPDATES.fetch_add(1, Relaxed);
                // SAFETY: `node` belongs to the graph `exec` was made from, with the same
                // function and argument size; the arguments are copied by the call.
                let ok = unsafe { d.graph_exec_set_kernel(g.exec, node, &np) }.is_ok();
                // A copy, not a swap: on failure `pending` is sent directly, as recorded.
                last.clone_from(&p.launch.words);
                ok
            });
        // SAFETY: a live executable graph and stream of the current context.
        if ok && unsafe { d.graph_launch(g.exec, stream) }.is_ok() {
            return true;
        }
        self.graphs.swap_remove(i); // partly updated or unusable: rebuilt next time
        false
    }
    /// Instantiates a graph of `pending`, launches it and keeps it (evicting the least
    /// recently used graph when full); false when a graph call fails.
    #[allow(clippy::too_many_arguments)]
    fn instantiate(
        &mut self,
        d: Driver<'_>,
        stream: sys::CUstream,
        pending: &mut [Pending],
        keys: Vec<Key>,
        hash: u64,
        args: u64,
        clock: u64,
        programmatic: bool,
    ) -> bool {
        let Some(g) = build(d, pending, keys, hash, args, clock, programmatic) else { return false };
        // SAFETY: a live executable graph and stream of the current context.
        if unsafe { d.graph_launch(g.exec, stream) }.is_err() {
            return false;
        }
        stats::GRAPHS_BUILT.fetch_add(1, Relaxed);
        if self.graphs.len() >= GRAPHS_PER_STREAM
            && let Some(old) = self.graphs.iter().enumerate().min_by_key(|(_, g)| g.used).map(|(i, _)| i)
        {
            self.graphs.swap_remove(old);
        }
        self.graphs.push(g);
        true
    }
    /// Notes a sequence (its hash), or a sequence with its arguments (the two hashes
    /// combined), as seen once. A collision of two entries only changes when a graph is
    /// instantiated, never what runs.
    fn remember(&mut self, h: u64) {
        if self.seen.len() >= SEEN {
            self.seen.remove(0);
        }
        self.seen.push(h);
    }
}

/// Builds and instantiates the chain of kernel nodes of `pending`. With `programmatic`,
/// each edge lets the next kernel start once every block of the previous one has started
/// (programmatic dependent launch): the next kernel's blocks are resident when the
/// previous one ends, and wait in `rill_grid_wait()` (the first statement of every rill
/// kernel, see `nvrtc::with_grid_waits`) until its writes are visible. That saves most of
/// the gap between dependent kernels; an edge the driver refuses is added as a plain one.
fn build(
    d: Driver<'_>,
    pending: &mut [Pending],
    key: Vec<Key>,
    hash: u64,
    args_hash: u64,
    used: u64,
    programmatic: bool,
) -> Option<Graph> {
    let graph = d.graph_create().ok()?;
    let nodes = Vec::with_capacity(pending.len());
    let args = pending.iter().map(|p| p.launch.words.clone()).collect();
    let mut g = Graph { key, hash, graph, exec: std::ptr::null_mut(), nodes, args, args_hash, used };
    for p in pending.iter_mut() {
        let mut params = p.params();
        let np = p.node_params(&mut params);
        let prev = g.nodes.last().copied();
        let deps = match (&prev, programmatic) {
            (Some(prev), false) => std::slice::from_ref(prev),
            _ => &[],
        };
        // SAFETY: a live graph, at most one dependency from it; the arguments are copied.
        let node = unsafe { d.graph_add_kernel_node(g.graph, deps, &np) }.ok()?;
        if let (Some(prev), true) = (prev, programmatic) {
            let edge = sys::CUgraphEdgeData {
                from_port: sys::CU_GRAPH_KERNEL_NODE_PORT_LAUNCH_ORDER as u8,
                to_port: 0,
                type_: sys::CUgraphDependencyType::CU_GRAPH_DEPENDENCY_TYPE_PROGRAMMATIC as u8,
                reserved: [0; 5],
            };
            // SAFETY: two kernel nodes of this graph; the edge data is read by the call.
            let ok = unsafe { d.graph_add_dependency(g.graph, prev, node, Some(&edge)) }.is_ok();
            if !ok {
                // SAFETY: as above; no edge data: a plain edge.
                unsafe { d.graph_add_dependency(g.graph, prev, node, None) }.ok()?;
            }
        }
        g.nodes.push(node);
    }
    // SAFETY: a complete graph; dropped with `g` on failure.
    g.exec = unsafe { d.graph_instantiate(g.graph) }.ok()?;
    Some(g)
}

impl Drop for Graph {
    fn drop(&mut self) {
        // Leaked on purpose once shutdown began (like every CUDA handle).
        let Some(pass) = lifecycle::release_pass() else { return };
        let d = pass.driver();
        let _ = catch_unwind(AssertUnwindSafe(|| {
            // SAFETY: destroyed once, here; an executable graph still running is freed by
            // the driver when it completes.
            unsafe {
                if !self.exec.is_null() {
                    d.graph_exec_destroy(self.exec);
                }
                d.graph_destroy(self.graph);
            }
        }));
    }
}
