//! `Array`: a cheap handle to a node of the lazy graph.
//!
//! A node holds its shape, dtype, primitive, target stream and inputs. Ops only build
//! nodes; `eval` computes them. Once computed, a node holds its [`Storage`] and drops its
//! inputs, so memory of intermediate results is released as soon as nobody needs it.
//!
//! Node state (`NodeState`, behind `Node::state`):
//!
//! | status | set by | meaning |
//! |---|---|---|
//! | `Pending` | construction | not submitted |
//! | `Scheduled` | the submitting `eval`, under its stream's queue lock | in a stream's queue |
//! | `Done` | `Node::complete` (the executor, or cancellation at shutdown) | outcome set in `Node::result` (storage or error shared by dependants); inputs dropped |
//!
//! The claim `Pending → Scheduled` happens under the stream's queue lock together with the
//! push of the batch, so every node is computed exactly once however many threads
//! evaluate overlapping graphs, and a queued batch never waits for a node queued after it.
//! The protocol lives in `runtime/claim.rs` (model-checked with loom in `crates/rill-loom`).

mod create;
mod readback;

use std::fmt;
use std::task::Waker;

use crate::backend::Storage;
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::primitives::Primitive;
use crate::runtime::claim::{self, Claimable};
use crate::runtime::completion::Completion;
use crate::runtime::device::Device;
use crate::runtime::stream::Stream;
use crate::shape::Dims;
use crate::sync::atomic::{AtomicU64, Ordering};
use crate::sync::{Arc, Mutex};

static NEXT_NODE_ID: AtomicU64 = AtomicU64::new(1);

pub(crate) use crate::runtime::claim::Status;
pub(crate) use crate::runtime::completion::Callback;

/// A node's status and inputs (see `runtime/claim.rs`).
pub(crate) type NodeState = crate::runtime::claim::NodeState<Array>;
/// A node's inputs (inline up to four).
pub(crate) type Inputs = crate::runtime::claim::Inputs<Array>;

pub(crate) struct Node {
    pub id: u64,
    /// Inline up to five axes (see `claim::Inputs` for why a node allocates once).
    pub shape: Dims,
    pub dtype: DType,
    pub prim: Primitive,
    /// Set (once, under the state lock, while the node is `Pending`) when fusion at eval
    /// makes this node compute a fused group: the primitive that runs instead of `prim`,
    /// over the inputs the state then holds (`runtime/fusion.rs`).
    pub fused: crate::sync::OnceLock<Primitive>,
    pub stream: Stream,
    pub state: Mutex<NodeState>,
    /// The outcome: computed storage or the error shared by dependants.
    pub result: Completion<Result<Storage>>,
}

/// A lazily evaluated n-dimensional array.
///
/// Cloning is cheap (one reference count). `Array` is `Send + Sync`: build it on one
/// thread, evaluate it on another, await it in any task.
#[derive(Clone)]
pub struct Array {
    pub(crate) node: Arc<Node>,
}

impl Node {
    /// The primitive this node computes: its fused group's once fusion at eval chose one.
    pub fn prim(&self) -> &Primitive {
        self.fused.get().unwrap_or(&self.prim)
    }
    /// True once the node is computed or failed (on a GPU: its kernel is enqueued).
    pub fn is_done(&self) -> bool {
        self.result.is_done()
    }
    /// Blocks until the node is computed (on a GPU: until its kernel has finished);
    /// returns its error if it failed.
    pub fn wait(&self) -> Result<()> {
        if self.stream.device().is_gpu() {
            // GPU batches only enqueue kernels: they are usually done within microseconds.
            use crate::backend::{WAIT_YIELD, poll_until};
            poll_until(|| self.result.is_done(), WAIT_YIELD);
        }
        match self.result.wait() {
            Ok(s) => match &s.fence {
                Some(f) => f.wait(),
                None => Ok(()),
            },
            Err(e) => Err(e),
        }
    }
    /// The device-completion fence of a ready GPU node, if any.
    pub fn fence(&self) -> Option<std::sync::Arc<crate::backend::Fence>> {
        match self.result.get() {
            Some(Ok(mut s)) => s.fence.take(),
            _ => None,
        }
    }
    /// The outcome of a done node (including its device fence when signalled).
    pub fn outcome(&self) -> Result<()> {
        match self.result.get() {
            Some(Err(e)) => Err(e),
            Some(Ok(s)) => match &s.fence {
                Some(f) if f.is_signalled() => f.result(),
                _ => Ok(()),
            },
            None => Ok(()),
        }
    }
    /// Registers `cb` to run once the node is done (at once when it already is).
    pub fn on_done(&self, cb: Callback) {
        self.result.on_done(cb)
    }
    /// Registers a waker; returns false when the node is already done.
    pub fn register_waker(&self, w: &Waker) -> bool {
        self.result.register_waker(w)
    }
    /// Records the outcome, wakes everything waiting, and drops the inputs.
    pub fn complete(&self, result: Result<Storage>) {
        claim::complete(&self.state, &self.result, result);
    }
    /// The storage of a computed node.
    pub fn storage(&self) -> Result<Storage> {
        self.result.get().unwrap_or_else(|| Err(Error::invalid("storage", "array is not evaluated")))
    }
}

impl Drop for Node {
    /// Drops long chains of unevaluated inputs iteratively, never recursively, so a graph
    /// of any depth can be dropped on any thread without overflowing its stack.
    fn drop(&mut self) {
        // The inputs are the stack: it allocates only when a long chain is freed.
        let mut stack = std::mem::take(&mut self.state.get_mut().inputs);
        while let Some(mut a) = stack.pop() {
            // The last handle of a node: take its inputs in place (no move of the node
            // out of its allocation), then drop it with none left to recurse into.
            if let Some(node) = Arc::get_mut(&mut a.node) {
                stack.extend(node.state.get_mut().inputs.drain(..));
            } else if let Some(mut node) = Arc::into_inner(a.node) {
                // Unique but for weak handles (a stream's last-node link).
                stack.extend(node.state.get_mut().inputs.drain(..));
            }
        }
    }
}

impl Array {
    /// Records a node (used by ops after validation).
    pub(crate) fn from_op(
        prim: Primitive,
        inputs: impl Into<Inputs>,
        shape: impl Into<Dims>,
        dtype: DType,
        stream: Stream,
    ) -> Array {
        let state = NodeState { status: Status::Pending, inputs: inputs.into() };
        Array::new_node(prim, shape.into(), dtype, stream, state, Completion::new())
    }
    /// A node with a fresh id (the one place nodes are made).
    fn new_node(
        prim: Primitive,
        shape: Dims,
        dtype: DType,
        stream: Stream,
        state: NodeState,
        result: Completion<Result<Storage>>,
    ) -> Array {
        let id = NEXT_NODE_ID.fetch_add(1, Ordering::Relaxed);
        let fused = crate::sync::OnceLock::new();
        Array { node: Arc::new(Node { id, shape, dtype, prim, fused, stream, state: Mutex::new(state), result }) }
    }
    /// Creates an evaluated node around a storage.
    pub(crate) fn from_storage(storage: Storage, stream: Stream) -> Array {
        let shape = storage.layout.shape.clone();
        Array::evaluated(Primitive::Constant, shape, storage, stream)
    }
    /// A node of `prim` born evaluated with `storage` (its dtype): no inputs, already
    /// `Done`, so no lock is taken and nobody is woken.
    pub(crate) fn evaluated(prim: Primitive, shape: impl Into<Dims>, storage: Storage, stream: Stream) -> Array {
        let (dtype, state) = (storage.dtype, NodeState { status: Status::Done, inputs: Inputs::new() });
        Array::new_node(prim, shape.into(), dtype, stream, state, Completion::done(Ok(storage)))
    }
    /// What takes the place of an input that the node `op` consumed (donated: its buffer
    /// now holds the node's result, see `runtime/execute.rs`) in that node's input list:
    /// an evaluated array of the same shape, dtype and stream whose reads fail.
    pub(crate) fn donated_stub(&self, op: &'static str) -> Array {
        let state = NodeState { status: Status::Done, inputs: Inputs::new() };
        let err = Error::invalid(op, "this input was donated: its buffer now holds the result of the op that read it");
        let result = Completion::done(Err(err));
        Array::new_node(Primitive::Constant, self.node.shape.clone(), self.node.dtype, self.stream(), state, result)
    }
    /// A process-unique id of this node (never reused).
    pub fn id(&self) -> u64 {
        self.node.id
    }
    /// The shape.
    pub fn shape(&self) -> &[usize] {
        &self.node.shape
    }
    /// The number of axes.
    pub fn ndim(&self) -> usize {
        self.node.shape.len()
    }
    /// The number of elements.
    pub fn size(&self) -> usize {
        self.node.shape.iter().product()
    }
    /// The dtype.
    pub fn dtype(&self) -> DType {
        self.node.dtype
    }
    /// The stream this array is (or will be) computed on.
    pub fn stream(&self) -> Stream {
        self.node.stream.clone()
    }
    /// The device this array lives on.
    pub fn device(&self) -> Device {
        self.node.stream.device()
    }
    /// The primitive that produces this array. Once an evaluation has fused this node
    /// with unevaluated inputs nobody else held (fusion at eval), it is the `Fused` (or
    /// `FusedReduce`) program of the group, and [`Array::inputs`] are the group's inputs.
    pub fn primitive(&self) -> &Primitive {
        self.node.prim()
    }
    /// True once computed (or failed).
    pub fn is_evaluated(&self) -> bool {
        self.node.is_done()
    }
    /// Computes this array (and what it needs) and blocks until done.
    pub fn eval(&self) -> Result<()> {
        crate::runtime::scheduler::eval(std::slice::from_ref(self))
    }
    /// The inputs of a node not yet evaluated (empty once evaluated). While the node
    /// runs, an input it was given to write into (donated, see [`crate::slice_update`])
    /// reads as an error.
    pub fn inputs(&self) -> Vec<Array> {
        self.node.state.lock().inputs.to_vec()
    }
    /// The primitive and the inputs read together, under the node's lock: fusion at eval
    /// on another thread rewrites both under it, so separate reads could pair the fused
    /// primitive with the members' inputs.
    pub(crate) fn primitive_and_inputs(&self) -> (Primitive, Vec<Array>) {
        let g = self.node.state.lock();
        (self.node.prim().clone(), g.inputs.to_vec())
    }
}

impl Claimable for Array {
    fn id(&self) -> u64 {
        self.node.id
    }
    fn state(&self) -> &Mutex<NodeState> {
        &self.node.state
    }
    fn is_done(&self) -> bool {
        self.node.is_done()
    }
}

impl fmt::Debug for Array {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "Array(id={}, shape={:?}, dtype={}, op={}, stream={:?}, evaluated={})",
            self.node.id,
            self.node.shape,
            self.node.dtype,
            self.node.prim().name(),
            self.node.stream,
            self.is_evaluated()
        )
    }
}
