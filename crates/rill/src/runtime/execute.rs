//! The one node-execution loop: runs a batch (consecutive nodes of one stream, in
//! topological order) through that stream's backend, for the CPU and every GPU alike.
//!
//! For each node it gathers the inputs' storages, refuses to start once shutdown has
//! cancelled work, calls the backend (`backend::BatchRun::run`) with panics caught, and
//! records the outcome; errors and panics fail only the node and its dependants. The
//! backend never sees an `Array` or a node, only primitives and storages.
//!
//! A backend either makes each result final as it returns it (the CPU: the node is
//! completed at once, so its waiters wake and an intermediate nobody holds is freed as
//! soon as its last reader ran), or finishes the batch's work later (a GPU stream, whose
//! kernels are enqueued). Then the loop keeps the results, reads inputs made earlier in the
//! batch from there, and at the end asks the backend to send what it held back and to seal
//! the results (events, fences) before completing every node in batch order.
//!
//! An input that a node may write its result into (a KV cache that `slice_update`
//! updates) and that nothing else holds is *donated* ([`donate_first_input`]): the backend
//! gets its storage by value and may compute into its buffer.
//!
//! The counters (`nodes_computed`, the in-flight count a shutdown drain waits on) are kept
//! here and nowhere else.

use std::panic::{AssertUnwindSafe, catch_unwind};

use rustc_hash::FxHashMap as HashMap;
use smallvec::SmallVec;

use crate::array::{Array, Node};
use crate::backend::{BatchRun, Op, Storage};
use crate::error::{Error, Result};
use crate::runtime::stream::Stream;
use crate::runtime::{lifecycle, stats};
use crate::sync::atomic::Ordering::SeqCst;

/// Runs one batch of `stream`'s nodes in order and completes every one of them. A backend
/// that makes each result final lets go of each node as soon as it is complete (`nodes`
/// is emptied), so an intermediate's memory is freed once its last reader ran rather than
/// at the end of the batch; a deferring backend keeps `nodes` until the batch is sealed.
pub(crate) fn run_batch(stream: &Stream, nodes: &mut Vec<Array>) {
    let backend = &stream.inner.backend;
    // A batch that calls a backend library runs inside the backend gate: shutdown waits
    // for it to finish before the process may tear the library down.
    let pass = if backend.calls_libraries() {
        match lifecycle::enter_backend() {
            Some(p) => Some(p),
            None => return fail_all(nodes, Error::ShutDown),
        }
    } else {
        None
    };
    let mut run = match BatchRun::begin(backend, pass.as_ref(), nodes.len()) {
        Ok(r) => r,
        Err(e) => return fail_all(nodes, e),
    };
    if run.defers_completion() {
        run_deferred(run, nodes);
    } else {
        for a in std::mem::take(nodes) {
            let node = &a.node;
            let result = match input_storages(node) {
                Err(e) => Err(e),
                Ok(mut inputs) => {
                    let donor = donate_first_input(node).then(|| inputs.remove(0));
                    let refs: SmallVec<[&Storage; 4]> = inputs.iter().collect();
                    run_node(&mut run, node, &refs, donor)
                }
            };
            stats::NODES_COMPUTED.fetch_add(1, SeqCst);
            stats::IN_FLIGHT.fetch_sub(1, SeqCst);
            node.complete(result);
        }
        run.close();
    }
    drop(pass);
}

/// One node through the backend: refused once shutdown cancelled what has not started,
/// a panic turned into `Error::Panic` of this node. With a `donor` (the node's first
/// input, donated), `inputs` are the others.
fn run_node(run: &mut BatchRun<'_>, node: &Node, inputs: &[&Storage], donor: Option<Storage>) -> Result<Storage> {
    if lifecycle::is_cancelled() {
        return Err(Error::ShutDown);
    }
    let op = Op { id: node.id, prim: node.prim(), shape: &node.shape, dtype: node.dtype };
    catch_unwind(AssertUnwindSafe(|| match donor {
        Some(d) => run.run_donated(&op, d, inputs),
        None => run.run(&op, inputs),
    }))
    .unwrap_or_else(|p| Err(Error::Panic { op: node.prim().name(), msg: crate::error::panic_message(&*p).into() }))
}

/// Donation. When `node`'s primitive [writes into its first
/// input](crate::primitives::Primitive::writes_into_first_input) and that input is
/// evaluated and held by nothing but this node (one strong reference, read under the
/// node's lock, which is also what `Array::inputs` takes to hand out a handle), the input
/// leaves the graph: a stub whose reads fail takes its place in the node's input list and
/// the input's node is dropped, so the storage the loop already gathered is left as the
/// only holder of its buffer and the backend may write the result into it. Returns
/// whether it did. Weak handles do not count: they only wait for a node (a stream's last
/// node) or hold 0-d scalars, which nothing writes into.
fn donate_first_input(node: &Node) -> bool {
    if !node.prim().writes_into_first_input() {
        return false;
    }
    let taken = {
        let mut g = node.state.lock();
        match g.inputs.first() {
            Some(first) if crate::sync::Arc::strong_count(&first.node) == 1 && first.is_evaluated() => {
                let stub = first.donated_stub(node.prim().name());
                std::mem::replace(&mut g.inputs[0], stub)
            }
            _ => return false,
        }
    };
    drop(taken);
    true
}

/// The storages of `node`'s inputs, or the first error. The inputs are read under the
/// node's lock, not kept: the node is being run (`Scheduled`), so nothing else changes
/// them, and each input's own lock is taken inside (never the other way round). Up to four
/// inline: the hot path of a long chain of small ops allocates nothing here.
fn input_storages(node: &Node) -> Result<SmallVec<[Storage; 4]>> {
    node.state.lock().inputs.iter().map(|i| i.node.storage()).collect()
}

/// Where the deferred loop keeps the value of a node id it has seen.
#[derive(Clone, Copy)]
enum Slot {
    /// The node at this position of the batch.
    Batch(u32),
    /// An input made before the batch, at this position of the batch's list of them.
    Outside(u32),
}

/// The loop for a backend that finishes the batch's work after the last node: results
/// stay here until the batch is sealed; inputs are borrowed from them, or read from their
/// node once per batch when made before it (no reference counts per use).
fn run_deferred(mut run: BatchRun<'_>, nodes: &[Array]) {
    let mut results: Vec<Result<Storage>> = Vec::with_capacity(nodes.len());
    let mut outside: Vec<Result<Storage>> = Vec::new();
    let mut at: HashMap<u64, Slot> = HashMap::default();
    at.reserve(nodes.len() + 4);
    for a in nodes {
        let node = &a.node;
        let mut slots: SmallVec<[Slot; 4]> = SmallVec::new();
        for i in node.state.lock().inputs.iter() {
            let slot = *at.entry(i.node.id).or_insert_with(|| {
                outside.push(i.node.storage());
                Slot::Outside(outside.len() as u32 - 1)
            });
            slots.push(slot);
        }
        // Only an input made before the batch: one made in it is still held by the batch.
        let donor = match slots.first() {
            Some(&Slot::Outside(k)) if outside[k as usize].is_ok() && donate_first_input(node) => {
                let stub = Err(Error::invalid(node.prim().name(), "a donated input"));
                std::mem::replace(&mut outside[k as usize], stub).ok()
            }
            _ => None,
        };
        let rest = &slots[donor.is_some() as usize..];
        let inputs = rest.iter().map(|slot| match *slot {
            Slot::Batch(k) => results[k as usize].as_ref().map_err(Error::clone),
            Slot::Outside(k) => outside[k as usize].as_ref().map_err(Error::clone),
        });
        let result = match inputs.collect::<Result<SmallVec<[&Storage; 4]>>>() {
            Err(e) => Err(e),
            Ok(inputs) => run_node(&mut run, node, &inputs, donor),
        };
        at.insert(node.id, Slot::Batch(results.len() as u32));
        results.push(result);
    }
    drop(outside);
    let failed = run.send();
    if !failed.is_empty() {
        fail_sent(nodes, &mut results, &failed);
    }
    run.seal(&mut results);
    stats::NODES_COMPUTED.fetch_add(nodes.len() as u64, SeqCst);
    // In the batch's (topological) order: a sealed result is usable by other streams
    // before the first node that holds it is published.
    for (a, r) in nodes.iter().zip(results) {
        a.node.complete(r);
    }
    // Once, after every node of the batch is complete (a shutdown drain waits for zero).
    stats::IN_FLIGHT.fetch_sub(nodes.len(), SeqCst);
    run.close();
}

/// Completes every node of a batch that cannot run with `err`.
fn fail_all(nodes: &[Array], err: Error) {
    for a in nodes {
        stats::NODES_COMPUTED.fetch_add(1, SeqCst);
        a.node.complete(Err(err.clone()));
        stats::IN_FLIGHT.fetch_sub(1, SeqCst);
    }
}

/// Fails the nodes whose work failed when it was sent (`None`: every node), and every
/// node of the batch that depends on one of them (the batch is in dependency order).
fn fail_sent(nodes: &[Array], results: &mut [Result<Storage>], failed: &[(Option<u64>, Error)]) {
    let everyone = failed.iter().find(|(n, _)| n.is_none()).map(|(_, e)| e.clone());
    let mut bad: Vec<u64> = Vec::new();
    for (a, r) in nodes.iter().zip(results.iter_mut()) {
        let id = a.node.id;
        let own = failed.iter().find(|(n, _)| *n == Some(id)).map(|(_, e)| e.clone());
        let upstream = || a.node.state.lock().inputs.iter().any(|i| bad.contains(&i.node.id));
        let err = match own.or_else(|| everyone.clone()) {
            Some(e) => Some(e),
            None if upstream() => Some(Error::backend("cuda", "an input's kernel failed to launch")),
            None => None,
        };
        if let Some(e) = err {
            bad.push(id);
            if r.is_ok() {
                *r = Err(e);
            }
        }
    }
}
