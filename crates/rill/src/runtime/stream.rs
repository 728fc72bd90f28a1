//! Streams: ordered queues of work on one device, owned by the process.
//!
//! A [`Stream`] is a cheap handle (`Arc`) that any thread or task may use; it never owns a
//! thread. Work arrives as *batches* (consecutive nodes of one evaluation on this stream)
//! and runs in FIFO order: at most one batch of a stream runs at a time, on the runtime's
//! bounded worker pool (`pool.rs`). A batch whose dependencies on other streams are not
//! complete *parks* the stream (no thread blocks); the completing dependency reschedules it.
//!
//! Queue state (`Queue`, behind `StreamInner::queue`):
//!
//! | field | written by | under |
//! |---|---|---|
//! | `serial` (batches + run state, see `serial.rs`) | submitters (`push`), the stream's job (`take`, `finish`), dependency callbacks (`unpark`), shutdown (`cancel`) | queue lock |
//! | `queued_nodes` | submitters (+), the stream's job (−) | queue lock |
//! | `last` | submitters | queue lock |
//!
//! Lock order: a node's state lock may be taken while holding a queue lock, never the
//! reverse.

use std::fmt;
use std::task::Waker;

use crate::array::{Array, Node};
use crate::error::{Error, Result};
use crate::runtime::device::Device;
use crate::runtime::registry::Registry;
use crate::runtime::serial::Serial;
use crate::runtime::{lifecycle, stats};
use crate::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed, Ordering::SeqCst};
use crate::sync::{Arc, Condvar, Mutex, Weak};

/// Most nodes a stream may hold queued before submitters wait (backpressure).
pub(crate) const MAX_QUEUED_NODES: usize = 4096;
/// Most nodes in one batch.
pub(crate) const MAX_BATCH_NODES: usize = 512;
/// Most nodes in one batch of a GPU stream. A GPU batch's kernels start when the batch
/// has been recorded, so shorter batches let the device start on a long graph sooner, and
/// less of it runs after the last batch is sent; 128 was the fastest of the sizes tried
/// on a chain of tiny ops.
pub(crate) const MAX_GPU_BATCH_NODES: usize = 128;

static NEXT_STREAM_ID: AtomicU64 = AtomicU64::new(1);

pub(crate) struct Batch {
    pub nodes: Vec<Array>,
    pub deps: Vec<Array>,
}

pub(crate) struct Queue {
    /// The batches and the run state (see `serial.rs`).
    pub serial: Serial<Batch>,
    pub queued_nodes: usize,
    /// The last node pushed, to let `synchronize` wait for everything before it.
    pub last: Option<std::sync::Weak<Node>>,
    pub space_wakers: Vec<Waker>,
    /// Submitters blocked on [`StreamInner::space`] now (counted under this lock, so the
    /// job signals the condition variable, a system call, only when someone sleeps on it).
    pub space_sleepers: usize,
    /// Set while the stream's pool job lingers after its last batch (GPU streams, see
    /// `scheduler::linger`): a submitter raises the flag with each new batch.
    pub linger: Option<Arc<AtomicBool>>,
}

pub(crate) struct StreamInner {
    pub id: u64,
    pub device: Device,
    pub queue: Mutex<Queue>,
    /// Notified when queued work shrinks, for submitters blocked by backpressure.
    pub space: Condvar,
    /// The last evaluated scalar operands made for this stream (see [`StreamInner::scalar`]).
    scalars: Mutex<ScalarNodes>,
    /// The backend's part of the stream (a CUDA stream on a GPU).
    pub backend: crate::backend::StreamBackend,
}

/// Scalar operand nodes kept for reuse, by (dtype, bits of the value).
type ScalarNodes = [Option<((crate::dtype::DType, u64), Weak<Node>)>; SCALAR_NODES];

/// Scalar operand nodes a stream remembers.
const SCALAR_NODES: usize = 4;

impl StreamInner {
    /// A live evaluated scalar operand of `key` (dtype, bits of the value) made earlier for
    /// this stream, if one is still held by some node: `y * 0.5` in a loop then shares one
    /// `0.5` node instead of making (and later freeing) one per op. The entries are weak:
    /// they keep no node, storage or stream alive.
    pub(crate) fn scalar(&self, key: (crate::dtype::DType, u64)) -> Option<Arc<Node>> {
        let g = self.scalars.lock();
        g.iter().flatten().find(|(k, _)| *k == key).and_then(|(_, w)| w.upgrade())
    }
    /// Remembers `node` (evaluated, immutable) as the scalar operand of `key`, in place of
    /// the entry for the same key, a dead one or the oldest.
    pub(crate) fn keep_scalar(&self, key: (crate::dtype::DType, u64), node: &Arc<Node>) {
        let mut g = self.scalars.lock();
        let at = g
            .iter()
            .position(|e| e.as_ref().is_none_or(|(k, w)| *k == key || w.strong_count() == 0))
            .unwrap_or(SCALAR_NODES - 1);
        // Oldest last: shift the others down and put the new entry first.
        g[..=at].rotate_right(1);
        g[0] = Some((key, Arc::downgrade(node)));
    }
}

impl Drop for StreamInner {
    fn drop(&mut self) {
        stats::STREAMS_LIVE.fetch_sub(1, Relaxed);
        // A job lingering for this stream's next batch holds only a weak handle: raising
        // its flag ends the wait now (it then finds the stream gone).
        if let Some(flag) = self.queue.get_mut().linger.take() {
            flag.store(true, SeqCst);
        }
    }
}

/// An ordered queue of work on one device. Cheap to clone; `Send + Sync`; usable from any
/// thread or task. Work on one stream runs in submission order; work on different streams
/// may overlap, with cross-stream dependencies ordered by events.
#[derive(Clone)]
pub struct Stream {
    pub(crate) inner: Arc<StreamInner>,
}

static REGISTRY: Registry<StreamInner> = Registry::new();
static DEFAULTS: Mutex<Vec<Stream>> = Mutex::new(Vec::new());

impl Stream {
    /// Creates a new stream on `device`. This is the only way (besides the one default
    /// stream per device) that a stream comes to exist.
    pub fn new(device: &Device) -> Result<Stream> {
        lifecycle::check_running()?;
        if device.is_gpu() {
            // Validates the ordinal and initialises the backend once.
            Device::gpu(device.ordinal())?;
        }
        // A CPU stream starts no thread: the pool starts with the first job (`pool::spawn`).
        let backend = crate::backend::StreamBackend::new(device)?;
        let inner = Arc::new(StreamInner {
            id: NEXT_STREAM_ID.fetch_add(1, Relaxed),
            device: *device,
            queue: Mutex::new(Queue {
                serial: Serial::new(),
                queued_nodes: 0,
                last: None,
                space_wakers: Vec::new(),
                space_sleepers: 0,
                linger: None,
            }),
            space: Condvar::new(),
            scalars: Mutex::new(Default::default()),
            backend,
        });
        stats::STREAMS_CREATED.fetch_add(1, Relaxed);
        stats::STREAMS_LIVE.fetch_add(1, Relaxed);
        REGISTRY.register(&inner);
        Ok(Stream { inner })
    }
    /// A process-unique id (never reused).
    pub fn id(&self) -> u64 {
        self.inner.id
    }
    /// The device this stream runs on.
    pub fn device(&self) -> Device {
        self.inner.device
    }
    /// Nodes queued on this stream and not yet started (bounded by backpressure).
    pub fn queued_nodes(&self) -> usize {
        self.inner.queue.lock().queued_nodes
    }
    /// The most nodes a stream holds queued before submitters wait.
    pub const MAX_QUEUED_NODES: usize = MAX_QUEUED_NODES;
    /// Blocks until all work submitted to this stream so far has completed.
    pub fn synchronize(&self) -> Result<()> {
        synchronize(self)
    }
    pub(crate) fn downgrade(&self) -> Weak<StreamInner> {
        Arc::downgrade(&self.inner)
    }
    pub(crate) fn from_inner(inner: Arc<StreamInner>) -> Stream {
        Stream { inner }
    }
}

impl PartialEq for Stream {
    fn eq(&self, other: &Self) -> bool {
        self.inner.id == other.inner.id
    }
}
impl Eq for Stream {}

impl fmt::Debug for Stream {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Stream({}, {})", self.inner.device, self.inner.id)
    }
}

/// The one process-wide default stream of `device`, created on first use.
pub(crate) fn default_stream(device: Device) -> Result<Stream> {
    {
        let d = DEFAULTS.lock();
        if let Some(s) = d.iter().find(|s| s.device() == device) {
            return Ok(s.clone());
        }
    }
    let s = Stream::new(&device)?;
    let mut d = DEFAULTS.lock();
    // Another thread may have won the race; keep exactly one per device.
    if let Some(existing) = d.iter().find(|s| s.device() == device) {
        return Ok(existing.clone());
    }
    d.push(s.clone());
    Ok(s)
}

/// Every stream alive now.
pub(crate) fn live_streams() -> Vec<Stream> {
    REGISTRY.snapshot().into_iter().map(Stream::from_inner).collect()
}

/// Drops the default streams (at shutdown).
pub(crate) fn forget_defaults() -> Vec<Stream> {
    std::mem::take(&mut *DEFAULTS.lock())
}

/// Blocks until all work submitted to `stream` so far has completed. Callable from any
/// thread; returns `Error::ShutDown` if the runtime stopped before that work ran.
pub fn synchronize(stream: &Stream) -> Result<()> {
    let last = stream.inner.queue.lock().last.clone();
    if let Some(node) = last.and_then(|w| w.upgrade()) {
        let r = node.wait();
        if matches!(r, Err(Error::ShutDown)) {
            return r;
        }
    }
    stream.inner.backend.synchronize()?;
    Ok(())
}

/// Blocks until all work submitted to every stream so far has completed.
pub fn synchronize_all() -> Result<()> {
    for s in live_streams() {
        synchronize(&s)?;
    }
    Ok(())
}
