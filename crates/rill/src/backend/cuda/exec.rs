//! Running batches on a GPU stream, and copies to the host.
//!
//! `execute_batch` walks the batch's nodes in order. Each node's inputs come from the
//! batch itself (a local map: those nodes are completed only at the end) or from nodes
//! completed earlier; the CUDA stream first waits (on the GPU) for the producer events of
//! inputs made on other streams, host inputs are uploaded, and the node's kernels are
//! recorded (`launch.rs`: sent at the end of the batch, as one CUDA graph launch when the
//! launch sequence repeats, or earlier when anything else uses the stream). Errors and
//! panics poison only the node and its dependants; so does a recorded launch that fails
//! when it is sent. One-element `Full` nodes are slots of the scalar slab. After the batch
//! one event is recorded; it becomes the producer event of every buffer the batch made
//! and the last-use event of buffers of other streams it read; one fence is attached to
//! every output, the nodes are completed, and (event, fence) go to the device's
//! completion worker.

use std::panic::{AssertUnwindSafe, catch_unwind};

use crate::array::Array;
use crate::backend::{Buffer, Fence, Storage};
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::primitives::Primitive;
use crate::runtime::stream::Stream;
use crate::runtime::{lifecycle, stats};
use crate::sync::Arc;
use crate::sync::atomic::Ordering::SeqCst;

use super::buffer::{cuda_of, download, scalar_on_device, slab_scalar, upload};
use super::driver::GpuStream;
use super::handles::Ev;
use super::{copy, elementwise as ew, fused, launch, matmul, norm, random, reduce, scan};
use cudarc::driver::DriverError;
use rustc_hash::FxHashMap as HashMap;
use smallvec::SmallVec;

/// Runs one batch of nodes (all on the GPU stream `stream`) in order.
pub(crate) fn execute_batch(stream: &Stream, nodes: &[Array]) {
    let Some(handle) = stream.inner.cuda.as_ref() else {
        return fail_all(nodes, Error::backend("cuda", "a GPU stream without a CUDA stream"));
    };
    // The whole batch runs inside the backend gate: shutdown waits for it to finish
    // before the process may tear the driver down.
    let Some(pass) = lifecycle::enter_backend() else {
        return fail_all(nodes, Error::ShutDown);
    };
    let cs = &GpuStream::new(pass.driver(), handle);
    // The batch's results, in batch order, and where each node id's value is: a position
    // in `results` (a node of this batch, completed only at the end) or in `outside` (an
    // input made before the batch: read from its node once per batch, not once per use).
    let mut results: Vec<Result<Storage>> = Vec::with_capacity(nodes.len());
    let mut outside: Vec<Result<Storage>> = Vec::new();
    let mut at: HashMap<u64, Slot> = HashMap::default();
    at.reserve(nodes.len() + 4);
    let mut waited: Vec<usize> = Vec::new();
    // Every storage of another stream's buffer read by the batch, kept alive until its
    // last-use event is set (this stream's own buffers need no last use: their free is
    // ordered on this stream after the batch's kernels).
    let mut read: Vec<Storage> = Vec::new();
    let mut any_ok = false;
    // Kernel launches are recorded and sent at the end (as one CUDA graph when the
    // sequence repeats), or earlier when something else needs the stream (`launch.rs`).
    let rec = launch::Recording::begin(*cs, nodes.len());
    for a in nodes {
        let node = &a.node;
        if let Some(r) = &rec {
            r.node(node.id);
        }
        // Where each input's value is: a node of this batch (in `results`) or one made
        // before it (read from its node into `outside` once per batch).
        let mut slots: SmallVec<[Slot; 4]> = SmallVec::new();
        for i in node.state.lock().inputs.iter() {
            let slot = *at.entry(i.node.id).or_insert_with(|| {
                outside.push(i.node.storage());
                Slot::Outside(outside.len() as u32 - 1)
            });
            slots.push(slot);
        }
        // The inputs are borrowed from there, not cloned (no reference counts per use).
        let inputs = slots.iter().map(|slot| match *slot {
            Slot::Batch(k) => results[k as usize].as_ref().map_err(Error::clone),
            Slot::Outside(k) => outside[k as usize].as_ref().map_err(Error::clone),
        });
        let result = match inputs.collect::<Result<SmallVec<[&Storage; 4]>>>() {
            Err(e) => Err(e),
            // Shutdown's drain ended while this batch ran: stop early, the closer waits.
            Ok(_) if lifecycle::is_cancelled() => Err(Error::ShutDown),
            Ok(inputs) => catch_unwind(AssertUnwindSafe(|| {
                prepare_inputs(cs, &inputs, &mut waited)?;
                eval(cs, &node.prim, &node.shape, node.dtype, &inputs, &mut read)
            }))
            .unwrap_or_else(|p| {
                Err(Error::Panic { op: node.prim.name(), msg: crate::error::panic_message(&*p).into() })
            }),
        };
        any_ok |= result.is_ok();
        at.insert(node.id, Slot::Batch(results.len() as u32));
        results.push(result);
    }
    if let Some(r) = rec {
        let failed = r.finish();
        if !failed.is_empty() {
            fail_launched(nodes, &mut results, &failed);
        }
    }
    let fence = Fence::new();
    let ev = if any_ok {
        match Ev::record(cs.driver(), cs.stream(), &cs.dev.events) {
            Ok(ev) => Some(Arc::new(ev)),
            Err(e) => {
                let err = super::backend_err("cuda", format!("recording the batch event: {e:?}"));
                for r in results.iter_mut() {
                    if r.is_ok() {
                        *r = Err(err.clone());
                    }
                }
                None
            }
        }
    } else {
        None
    };
    if let Some(ev) = &ev {
        for s in &read {
            if let Some(b) = cuda_of(s) {
                b.add_user(cs.id, ev);
            }
        }
    }
    drop(read);
    stats::NODES_COMPUTED.fetch_add(nodes.len() as u64, SeqCst);
    // In the batch's (topological) order: a buffer's event is set before the first node
    // that holds it is published, so another stream that reads it waits for this batch.
    for (a, mut r) in nodes.iter().zip(results) {
        if let Ok(s) = &mut r {
            if let (Some(ev), Some(b)) = (&ev, cuda_of(s)) {
                if !b.constant && b.produced.get().is_none() {
                    let _ = b.produced.set((ev.clone(), cs.id));
                }
            }
            s.fence = Some(fence.clone());
        }
        a.node.complete(r);
    }
    // Once, after every node of the batch is complete (a shutdown drain waits for zero).
    stats::IN_FLIGHT.fetch_sub(nodes.len(), SeqCst);
    match ev {
        Some(ev) => cs.dev.complete_later(cs.driver(), ev, fence),
        None => fence.signal(Ok(())),
    }
}

/// Where `execute_batch` keeps the value of a node id it has seen.
#[derive(Clone, Copy)]
enum Slot {
    /// The node at this position of the batch.
    Batch(u32),
    /// An input made before the batch, at this position of the batch's list of them.
    Outside(u32),
}

/// Completes every node of a batch that cannot run with `err`.
fn fail_all(nodes: &[Array], err: Error) {
    for a in nodes {
        stats::NODES_COMPUTED.fetch_add(1, SeqCst);
        a.node.complete(Err(err.clone()));
        stats::IN_FLIGHT.fetch_sub(1, SeqCst);
    }
}

/// Fails the nodes whose recorded launches failed when they were sent, and every node of
/// the batch that depends on one of them (the batch is in dependency order).
fn fail_launched(nodes: &[Array], results: &mut [Result<Storage>], failed: &[(u64, DriverError)]) {
    let mut bad: Vec<u64> = Vec::new();
    // Node 0: a failure that cannot be charged to one node (the sender panicked).
    let everyone = failed.iter().find(|(n, _)| *n == 0).map(|(_, e)| super::backend_err("launch", e));
    for (a, r) in nodes.iter().zip(results.iter_mut()) {
        let id = a.node.id;
        let own = failed.iter().find(|(n, _)| *n == id).map(|(_, e)| super::backend_err("launch", e));
        let own = own.or_else(|| everyone.clone());
        let upstream = || a.node.state.lock().inputs.iter().any(|i| bad.contains(&i.node.id));
        let err = match own {
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

/// Makes `cs` wait (on the GPU) for inputs produced on other streams. `waited` lists the
/// event handles already waited for in this batch; a handle cannot be reused for another
/// event meanwhile (pooled handles return only when the event is dropped, and the batch
/// keeps every other stream's input storage, and with it the event, until it ends).
fn prepare_inputs(cs: &GpuStream<'_>, inputs: &[&Storage], waited: &mut Vec<usize>) -> Result<()> {
    for &s in inputs {
        let Some(b) = cuda_of(s) else { continue };
        if b.ordinal != cs.dev.ordinal {
            continue; // only ToDevice reads another device's buffer (through the host)
        }
        let Some((ev, producer)) = b.produced.get() else { continue }; // made earlier in this batch
        if *producer == cs.id || waited.contains(&ev.raw()) {
            continue;
        }
        ev.wait_on(cs.driver(), cs.stream()).map_err(|e| super::backend_err("cuda", e))?;
        waited.push(ev.raw());
    }
    Ok(())
}

/// A device copy of an input that is not on `cs`'s device (uploaded from the host, or
/// through the host from another device); `None` when it already is.
fn copy_to_gpu(cs: &GpuStream<'_>, s: &Storage) -> Result<Option<Storage>> {
    match &**s.buffer {
        Buffer::Cpu(_) => match scalar_on_device(cs, s)? {
            Some(d) => Ok(Some(d)),
            None => upload(cs, s).map(Some),
        },
        Buffer::Cuda(b) if b.ordinal != cs.dev.ordinal => {
            crate::runtime::stats::HOST_ROUND_TRIPS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            upload(cs, &to_host(s)?).map(Some)
        }
        Buffer::Cuda(_) => Ok(None),
    }
}

/// Computes one primitive on the GPU stream `cs` (inputs converted by the ops layer).
/// Inputs that are not on this device are copied here first. Every input buffer of
/// another stream that the kernels read is added to `read` (kept until the batch's event
/// is its last use; constants of the scalar slab record no users).
fn eval(
    cs: &GpuStream<'_>,
    prim: &Primitive,
    shape: &[usize],
    dtype: DType,
    raw: &[&Storage],
    read: &mut Vec<Storage>,
) -> Result<Storage> {
    use Primitive::*;
    let mut keep = |s: &Storage| {
        if cuda_of(s).is_some_and(|b| b.alloc_stream_id != cs.id && !b.constant) {
            read.push(s.clone());
        }
    };
    if let ToDevice = prim {
        keep(raw[0]);
        return Ok(copy_to_gpu(cs, raw[0])?.unwrap_or_else(|| raw[0].clone()));
    }
    if matches!(prim, Matmul) && !dtype.is_float() {
        // cuBLAS has no integer GEMM here: integer (and bool-as-i32) matmul runs on the
        // host, after the stream has produced its inputs (a host wait, counted).
        crate::runtime::stats::HOST_ROUND_TRIPS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        cs.synchronize()?;
        let host: Vec<Storage> = raw.iter().map(|s| host_copy(s)).collect::<Result<_>>()?;
        let out = crate::backend::cpu::eval(prim, shape, dtype, &host)?;
        return upload(cs, &out);
    }
    if let Host { f, name } = prim {
        // The inputs may be produced earlier in this batch: finish the stream first.
        crate::runtime::stats::HOST_ROUND_TRIPS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        cs.synchronize()?;
        let host: Vec<Storage> = raw.iter().map(|s| host_copy(s)).collect::<Result<_>>()?;
        let out = crate::backend::cpu::eval(&Host { f: f.clone(), name }, shape, dtype, &host)?;
        return upload(cs, &out);
    }
    // Inputs of another device or the host get device copies, made on this stream (the
    // usual case, every input already here, builds nothing).
    let here = |s: &Storage| cuda_of(s).is_some_and(|b| b.ordinal == cs.dev.ordinal);
    let (copies, copied): (SmallVec<[Storage; 4]>, SmallVec<[&Storage; 4]>);
    let inputs: &[&Storage] = if raw.iter().all(|s| here(s)) {
        raw
    } else {
        copies = raw.iter().map(|s| Ok(copy_to_gpu(cs, s)?.unwrap_or_else(|| (*s).clone()))).collect::<Result<_>>()?;
        copied = copies.iter().collect();
        &copied
    };
    for s in inputs {
        keep(s);
    }
    // Ops that take their inputs as one slice of storages (none is on the path of a long
    // chain of small ops).
    let owned = || inputs.iter().map(|s| (*s).clone()).collect::<SmallVec<[Storage; 4]>>();
    let x = || inputs[0];
    match prim {
        Constant => Err(Error::invalid("constant", "a constant has no kernel")),
        // One element (the `2.0` of `x * 2.0`): a slot of the scalar slab, no kernel.
        Full { value } => match slab_scalar(cs, dtype, super::source::host_bits(dtype, *value), shape)? {
            Some(s) => Ok(s),
            None => ew::full(cs, shape, dtype, *value),
        },
        Arange { start, step } => ew::arange(cs, shape, dtype, *start, *step),
        Eye { k } => ew::eye(cs, shape, dtype, *k),
        Random { key, dist } => random::random(cs, shape, dtype, *key, *dist),
        Cast => ew::cast(cs, x(), dtype),
        Unary(op) => ew::unary(cs, *op, x(), dtype),
        Binary(op) => ew::binary(cs, *op, x(), inputs[1], shape, dtype),
        Where => ew::where_(cs, x(), inputs[1], inputs[2], shape, dtype),
        Reduce { op, axes } => reduce::reduce(cs, *op, x(), axes, shape),
        ArgReduce { op, axis } => scan::arg_reduce(cs, *op, x(), *axis, shape),
        Cumsum { axis, reverse, exclusive } => scan::cumsum(cs, x(), *axis, *reverse, *exclusive),
        Softmax { axis, log } => reduce::softmax(cs, x(), *axis, *log),
        LayerNorm { eps, has_weight, has_bias } => norm::layer_norm(cs, &owned(), *eps, *has_weight, *has_bias),
        RmsNorm { eps, has_weight } => norm::rms_norm(cs, &owned(), *eps, *has_weight),
        Matmul => matmul::matmul(cs, x(), inputs[1], shape, dtype),
        Reshape => match x().layout.reshape(shape) {
            Some(l) => Ok(x().with_layout(l)),
            None => Ok(ew::copy(cs, x())?.with_layout(crate::shape::Layout::contiguous(shape))),
        },
        Permute(perm) => Ok(x().with_layout(x().layout.permute(perm))),
        BroadcastTo => Ok(x().with_layout(x().layout.broadcast_to(shape))),
        Slice { start, step } => Ok(crate::backend::cpu::movement::slice_view(x(), start, step, shape)),
        Contiguous => ew::copy(cs, x()),
        Take { axis } => copy::take(cs, x(), inputs[1], *axis, shape),
        Concatenate { axis } => copy::concatenate(cs, &owned(), *axis, shape),
        Pad { widths, value } => copy::pad(cs, x(), widths, *value, shape),
        Placeholder { .. } => Err(Error::invalid("placeholder", "a compile placeholder cannot be evaluated")),
        Fused(p) => fused::fused(cs, p, &owned(), shape, dtype),
        FusedReduce { program, op, axes } => fused::fused_reduce(cs, program, *op, axes, &owned(), shape, dtype),
        ToDevice | Host { .. } => Err(Error::invalid(prim.name(), "handled above")),
    }
}

/// A host copy of a storage (device storages are waited for and downloaded).
fn host_copy(s: &Storage) -> Result<Storage> {
    match &**s.buffer {
        Buffer::Cpu(_) => Ok(s.clone()),
        Buffer::Cuda(_) => to_host(s),
    }
}

/// Waits until a device storage's data is complete and copies it into a contiguous host
/// storage of the same shape and dtype.
pub(crate) fn to_host(s: &Storage) -> Result<Storage> {
    let Some(b) = cuda_of(s) else { return crate::backend::cpu::movement::make_contiguous(s) };
    if let Some(f) = &s.fence {
        f.wait()?; // signalled by the completion worker; not a driver call
    }
    // The wait and the copy run inside the backend gate (after shutdown: Error::ShutDown).
    let pass = lifecycle::enter_backend().ok_or(Error::ShutDown)?;
    let d = pass.driver();
    if s.fence.is_none() {
        if let Some(ev) = b.event() {
            ev.synchronize(d).map_err(|e| super::backend_err("to_host", e))?;
        }
    }
    let dev = super::device::device(b.ordinal)?;
    catch_unwind(AssertUnwindSafe(|| download(d, dev.transfer(d), s)))
        .unwrap_or_else(|p| Err(Error::Panic { op: "to_host", msg: crate::error::panic_message(&*p).into() }))
}
