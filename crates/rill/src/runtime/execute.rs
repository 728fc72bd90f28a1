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
                Ok(inputs) => {
                    let refs: SmallVec<[&Storage; 4]> = inputs.iter().collect();
                    run_node(&mut run, node, &refs)
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
/// a panic turned into `Error::Panic` of this node.
fn run_node(run: &mut BatchRun<'_>, node: &Node, inputs: &[&Storage]) -> Result<Storage> {
    if lifecycle::is_cancelled() {
        return Err(Error::ShutDown);
    }
    let op = Op { id: node.id, prim: node.prim(), shape: &node.shape, dtype: node.dtype };
    catch_unwind(AssertUnwindSafe(|| run.run(&op, inputs)))
        .unwrap_or_else(|p| Err(Error::Panic { op: node.prim().name(), msg: crate::error::panic_message(&*p).into() }))
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
        let inputs = slots.iter().map(|slot| match *slot {
            Slot::Batch(k) => results[k as usize].as_ref().map_err(Error::clone),
            Slot::Outside(k) => outside[k as usize].as_ref().map_err(Error::clone),
        });
        let result = match inputs.collect::<Result<SmallVec<[&Storage; 4]>>>() {
            Err(e) => Err(e),
            Ok(inputs) => run_node(&mut run, node, &inputs),
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
