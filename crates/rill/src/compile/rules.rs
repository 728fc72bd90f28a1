//! Shape rules: how a node's shape or value follows from other nodes' shapes, so that a
//! shapeless replay recomputes it instead of keeping the traced number.
//!
//! Some ops turn shapes into numbers while they build the graph: `mean` and `var` divide by
//! the number of elements they reduce, reductions without `keepdims` and `matmul` of 1-D
//! operands remove or insert axes of size 1, and `matmul` broadcasts its operands to their
//! common batch shape. In the graph these are plain 0-d fills, reshapes and broadcasts
//! holding the traced numbers. So while a shapeless trace runs, those ops [`note`] how each
//! such node follows from shapes, and the recorder turns the notes into [`Rule`]s on tape
//! nodes, which `shapes::plan` evaluates for each replay's shapes. A node with neither a
//! rule nor a shape that follows from its inputs' makes its tape shape-specific (one trace
//! per shape), and so do a note the recorder cannot resolve and a node replayed by a
//! compiled function the traced function called.
//!
//! Notes live in one process-wide table, and only while a shapeless trace runs somewhere
//! (so ops the traced function builds on other threads are noted too); the table is
//! emptied when the last trace ends. Outside tracing, noting costs one atomic load.

use std::collections::BTreeMap;

use crate::array::Array;
use crate::compile::trace::Ref;
use crate::sync::Mutex;
use crate::sync::atomic::{AtomicUsize, Ordering};

/// How an op computed a node from shapes, by node ids (see the module docs).
#[derive(Clone, Debug)]
pub(crate) enum Note {
    /// A 0-d fill holding the number of elements the `Reduce` node `reduce` combines, less
    /// `ddof` (at least 0).
    Count {
        /// Id of the reduction.
        reduce: u64,
        /// Subtracted from the count.
        ddof: usize,
    },
    /// A reshape removing these axes (of size 1) of its input.
    Squeeze(Vec<usize>),
    /// A reshape inserting axes of size 1 at these positions of its output (ascending).
    Expand(Vec<usize>),
    /// A broadcast of a matmul operand to the batch shape it shares with the other
    /// operand (node `other`, of shape `shape` when traced); the last two axes are kept.
    Batch {
        /// Id of the other operand, as the matmul saw it before broadcasting.
        other: u64,
        /// Its shape.
        shape: Vec<usize>,
        /// The broadcast operand is the left one (the rule and its errors name the
        /// operands in order).
        left: bool,
    },
    /// A node a compiled function's replay made: it may hold numbers of that function's
    /// own trace (counts, shapes, constants fused into a kernel), or one an op chose from
    /// the traced shapes alone (`logsumexp`'s fill for a reduction of no elements); a tape
    /// that records it is shape-specific.
    Opaque,
}

/// Where a rule reads a shape: a tape node or input, or a fixed shape (an array that does
/// not depend on the inputs).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum ShapeOf {
    Ref(Ref),
    Fixed(Vec<usize>),
}

/// A note resolved against a tape (see [`Note`] for each rule's meaning).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Rule {
    Count { reduce: Ref, ddof: usize },
    Squeeze(Vec<usize>),
    Expand(Vec<usize>),
    Batch { other: ShapeOf, left: bool },
}

impl Rule {
    /// The tape refs whose shapes the rule reads.
    pub fn refs(&self) -> impl Iterator<Item = Ref> + '_ {
        let r = match self {
            Rule::Count { reduce, .. } => Some(*reduce),
            Rule::Batch { other: ShapeOf::Ref(r), .. } => Some(*r),
            _ => None,
        };
        r.into_iter()
    }
    /// The rule with its refs mapped by `f` (when a pass renumbers the tape).
    pub fn map_refs(&mut self, mut f: impl FnMut(Ref) -> Ref) {
        match self {
            Rule::Count { reduce, .. } => *reduce = f(*reduce),
            Rule::Batch { other: ShapeOf::Ref(r), .. } => *r = f(*r),
            _ => {}
        }
    }
}

/// Shapeless traces running in the process.
static ACTIVE: AtomicUsize = AtomicUsize::new(0);
/// Notes by node id, while a trace runs.
static NOTES: Mutex<BTreeMap<u64, Note>> = Mutex::new(BTreeMap::new());

/// True while a shapeless trace runs somewhere in the process.
pub(crate) fn tracing() -> bool {
    ACTIVE.load(Ordering::SeqCst) > 0
}

/// Records how `a` was computed from shapes, when a shapeless trace runs.
pub(crate) fn note(a: &Array, note: Note) {
    if !tracing() {
        return;
    }
    let mut g = NOTES.lock();
    // Checked again under the lock: the last trace empties the table under it.
    if tracing() {
        g.insert(a.id(), note);
    }
}

/// The note of node `id`, if an op left one.
pub(crate) fn noted(id: u64) -> Option<Note> {
    NOTES.lock().get(&id).cloned()
}

/// Marks a shapeless trace as running while it lives.
pub(crate) struct Tracing(());

impl Tracing {
    pub fn begin() -> Tracing {
        ACTIVE.fetch_add(1, Ordering::SeqCst);
        Tracing(())
    }
}

impl Drop for Tracing {
    fn drop(&mut self) {
        let mut g = NOTES.lock();
        if ACTIVE.fetch_sub(1, Ordering::SeqCst) == 1 {
            g.clear();
        }
    }
}
