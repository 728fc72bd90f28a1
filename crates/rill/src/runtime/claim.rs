//! Claiming: which nodes of a graph an evaluation enqueues, and each node's submission
//! status. Generic over the node handle ([`Claimable`]) so that the same code is
//! model-checked with loom in `crates/rill-loom` on tiny graphs.
//!
//! | status | set by | under |
//! |---|---|---|
//! | `Pending` | construction | — |
//! | `Scheduled` | [`claim`], by the evaluation that will push the node's batch | the node's stream's queue lock, then the node's state lock |
//! | `Done` | [`complete`] (the executor, or cancellation at shutdown), before the outcome is published | the node's state lock |
//!
//! An evaluation lists the `Pending` nodes below its outputs in topological order
//! ([`pending_order`]), cuts the list into batches of one stream each, and for each batch,
//! holding that stream's queue lock, claims the nodes still `Pending` ([`claim`]) and
//! pushes them before releasing the lock. Hence:
//!
//! - every node is claimed, so computed, exactly once: all claims of a node are
//!   serialised by its stream's queue lock (the node's own lock keeps the readers of its
//!   state, the graph walks and the executor, consistent);
//! - a node seen claimed (not `Pending`) is already in its stream's queue, because its
//!   claimer pushed it before releasing the lock that this claim now holds; so every
//!   dependency of a batch was queued before the batch, and the earliest unfinished batch
//!   can always run (no deadlock);
//! - an input counts as a dependency until its outcome is published (not merely marked
//!   `Done`), so a batch never runs before the values it reads exist.

use std::collections::HashSet;

use crate::runtime::completion::Completion;
use crate::sync::{Mutex, MutexGuard};

/// Submission status of a node; the outcome itself lives in the node's completion.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Status {
    Pending,
    Scheduled,
    Done,
}

/// The mutable part of a node: its status and, until it is done, its inputs.
pub(crate) struct NodeState<H> {
    pub status: Status,
    pub inputs: Inputs<H>,
}

/// A node's inputs, inline up to four: with its inline shape, recording a node makes one
/// allocation (the node). Nodes are usually freed on a runtime thread, not the one that
/// made them; with glibc such frees go back through the allocating thread's arena lock,
/// so every extra allocation per node makes the recording thread contend for that lock.
pub(crate) type Inputs<H> = smallvec::SmallVec<[H; 4]>;

/// A cheap handle to a graph node, as the claim protocol sees it.
pub(crate) trait Claimable: Clone {
    /// A process-unique id of the node.
    fn id(&self) -> u64;
    /// The node's status and inputs.
    fn state(&self) -> &Mutex<NodeState<Self>>;
    /// True once the node's outcome is published (lock-free).
    fn is_done(&self) -> bool;
}

/// Hashes node ids (process-unique integers) with one multiplication: the sets below are
/// on every evaluation's path, where SipHash showed in profiles.
#[derive(Default, Clone, Copy)]
pub(crate) struct IdHasher(u64);

impl std::hash::Hasher for IdHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0.rotate_left(8) ^ b as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        }
    }
    fn write_u64(&mut self, v: u64) {
        self.0 = (self.0 ^ v).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    }
}

/// Ids within this distance below a walk's newest node are bits of [`IdSet`]'s bitmap
/// (8 KiB at most); older ones are hashed.
const WINDOW: u64 = 1 << 16;

/// A set of node ids for one walk, from below its newest node `top`. Ids are given out in
/// creation order and a node's inputs exist before it, so every node below a set of
/// outputs has an id at most the largest of theirs; most of what an evaluation walks was
/// recorded just before it. Those ids are bits of a bitmap indexed by `top - id` (no
/// hashing, no rehashing as a long graph grows the set); the rest go to a hash set.
pub(crate) struct IdSet {
    top: u64,
    bits: Vec<u64>,
    far: HashSet<u64, std::hash::BuildHasherDefault<IdHasher>>,
}

impl IdSet {
    pub(crate) fn new(top: u64) -> IdSet {
        IdSet { top, bits: Vec::new(), far: HashSet::default() }
    }
    /// Adds `id`; true when it was not in the set.
    pub(crate) fn insert(&mut self, id: u64) -> bool {
        match self.top.checked_sub(id) {
            Some(d) if d < WINDOW => {
                let (word, bit) = ((d / 64) as usize, 1u64 << (d % 64));
                if word >= self.bits.len() {
                    self.bits.resize((word + 1).next_power_of_two(), 0);
                }
                let fresh = self.bits[word] & bit == 0;
                self.bits[word] |= bit;
                fresh
            }
            _ => self.far.insert(id),
        }
    }
}

/// The inputs of a node that is still `Pending` that are not published yet, last first
/// (the walk pops them, so they are visited in their order); `None` once the node is
/// claimed or done. Only those inputs are cloned: most operands of a long chain (its
/// scalars and constants, the evaluated inputs) are not walked, and each walked one is
/// moved, not cloned again, onto the walk's stack.
fn pending_inputs<H: Claimable>(h: &H) -> Option<Inputs<H>> {
    let g = h.state().lock();
    (g.status == Status::Pending).then(|| g.inputs.iter().rev().filter(|i| !i.is_done()).cloned().collect())
}

/// The `Pending` nodes below `outputs` (included), each once, in topological order (inputs
/// first). Iterative, so graphs of any depth work. The walk does not descend below a node
/// that is claimed or done: whatever that node needs is its claimer's business.
pub(crate) fn pending_order<H: Claimable>(outputs: &[H]) -> Vec<H> {
    // Sized for a small graph: a long one grows them a few times, not from zero.
    let mut order = Vec::with_capacity(64);
    let mut seen = IdSet::new(outputs.iter().map(|o| o.id()).max().unwrap_or(0));
    // Each entry: a node and its inputs still to visit (see `pending_inputs`).
    let mut stack: Vec<(H, Inputs<H>)> = Vec::new();
    for out in outputs {
        if !seen.insert(out.id()) {
            continue;
        }
        if let Some(ins) = pending_inputs(out) {
            stack.push((out.clone(), ins));
        }
        while let Some(top) = stack.last_mut() {
            match top.1.pop() {
                Some(child) => {
                    if seen.insert(child.id())
                        && let Some(ins) = pending_inputs(&child)
                    {
                        stack.push((child, ins));
                    }
                }
                None => {
                    if let Some((h, _)) = stack.pop() {
                        order.push(h);
                    }
                }
            }
        }
    }
    order
}

/// What one batch claimed: the nodes to run, and the inputs outside the batch that are
/// not done yet (each once).
pub(crate) struct Claimed<H> {
    pub nodes: Vec<H>,
    pub deps: Vec<H>,
}

/// Claims (`Pending → Scheduled`) the nodes of `candidates` that are still `Pending`;
/// nodes claimed by another evaluation are skipped (and become dependencies of the nodes
/// that need them). `candidates` are consecutive entries of a [`pending_order`] list, all
/// on one stream; `_queue` is the guard of that stream's queue, which the caller holds
/// until it has pushed the returned nodes.
pub(crate) fn claim<H: Claimable, Q>(_queue: &MutexGuard<'_, Q>, candidates: &[H]) -> Claimed<H> {
    let mut nodes: Vec<H> = Vec::with_capacity(candidates.len());
    let mut deps: Vec<H> = Vec::new();
    // Ids of `nodes` and `deps` (a linear search of `nodes` made long batches quadratic).
    let mut known = IdSet::new(candidates.iter().map(|h| h.id()).max().unwrap_or(0));
    for h in candidates {
        let mut g = h.state().lock();
        if g.status != Status::Pending {
            continue;
        }
        g.status = Status::Scheduled;
        for input in &g.inputs {
            if !input.is_done() && known.insert(input.id()) {
                deps.push(input.clone());
            }
        }
        drop(g);
        known.insert(h.id());
        nodes.push(h.clone());
    }
    Claimed { nodes, deps }
}

/// `Scheduled → Done`: records the outcome of a node, wakes everything waiting for it and
/// drops its inputs. Returns false (recording nothing) if the outcome was already set.
pub(crate) fn complete<H, T: Clone>(state: &Mutex<NodeState<H>>, result: &Completion<T>, value: T) -> bool {
    // Inputs go first, so that whoever wakes up sees an evaluated node without them.
    let inputs = {
        let mut g = state.lock();
        g.status = Status::Done;
        std::mem::take(&mut g.inputs)
    };
    let first = result.complete(value);
    drop(inputs);
    first
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    /// The bitmap and the hash set together behave as one set, for ids just below the top,
    /// at the edge of the window, far below it and above it.
    #[test]
    fn id_set_matches_a_hash_set() {
        let top = 5 * WINDOW;
        let mut set = IdSet::new(top);
        let mut want = std::collections::HashSet::new();
        let mut x = 0x9E37_79B9_7F4A_7C15u64;
        for i in 0..20_000u64 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let id = match i % 5 {
                0 => top - x % 200,                       // a recent graph
                1 => top - WINDOW + 1 - x % 3,            // both sides of the window's edge
                2 => top - (x % (4 * WINDOW)),            // anywhere below
                3 => top + 1 + x % 50,                    // newer than the top
                _ => top - x % (2 * WINDOW) - WINDOW / 2, // older ones again
            };
            assert_eq!(set.insert(id), want.insert(id), "id {id}");
        }
        for &id in want.iter().take(1000) {
            assert!(!set.insert(id), "id {id} lost");
        }
    }
}
