//! A batch on a GPU stream (the CUDA side of `backend::BatchRun`), and copies to the host.
//!
//! The runtime's loop (`runtime/execute.rs`) hands over the batch's nodes one at a time.
//! For each, the CUDA stream first waits (on the GPU) for the producer events of inputs
//! made on other streams, host inputs are uploaded, and the node's kernels are recorded
//! (`launch.rs`: sent at the end of the batch, as one CUDA graph launch when the launch
//! sequence repeats, or earlier when anything else uses the stream). One-element `Full`
//! nodes are slots of the scalar slab. At the end of the batch the recorded launches are
//! sent (`send`: what failed then is reported by node), one event is recorded (`seal`); it
//! becomes the producer event of every buffer the batch made and the last-use event of
//! buffers of other streams it read, and one fence is attached to every output. After the
//! runtime completed the nodes, (event, fence) go to the device's completion worker
//! (`close`).

use std::panic::{AssertUnwindSafe, catch_unwind};

use crate::backend::{Buffer, Fence, Op, Storage};
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::primitives::Primitive;
use crate::runtime::lifecycle;
use crate::sync::Arc;

use super::buffer::{cuda_of, download, scalar_on_device, slab_scalar, upload};
use super::driver::{Driver, GpuStream};
use super::handles::{CudaStreamHandle, Ev};
use super::{
    attention, attention_grad, blocks, check, copy, decode, elementwise as ew, fused, launch, matmul, norm, quant,
    random, reduce, scan, scatter, sort, take,
};
use smallvec::SmallVec;

/// One batch on a GPU stream, from its first node to the hand-over of its fence.
pub(crate) struct BatchRun<'a> {
    cs: GpuStream<'a>,
    /// Kernel launches recorded while the batch runs (`None`: launched directly).
    rec: Option<launch::Recording<'a>>,
    /// Event handles already waited for in this batch (see [`prepare_inputs`]).
    waited: Vec<usize>,
    /// Every storage of another stream's buffer read by the batch, kept alive until its
    /// last-use event is set (this stream's own buffers need no last use: their free is
    /// ordered on this stream after the batch's kernels).
    read: Vec<Storage>,
    any_ok: bool,
    /// Index checks still pending on the device (`check.rs`), and what depends on them.
    checks: check::Batch,
    fence: Arc<Fence>,
    ev: Option<Arc<Ev>>,
}

impl<'a> BatchRun<'a> {
    /// Starts a batch of `len` nodes on `handle`, under the pass that gave `d`.
    pub(crate) fn begin(d: Driver<'a>, handle: &'a CudaStreamHandle, len: usize) -> BatchRun<'a> {
        let cs = GpuStream::new(d, handle);
        let rec = launch::Recording::begin(cs, len);
        let fence = Fence::new();
        let checks = check::Batch::new(fence.clone());
        BatchRun { cs, rec, waited: Vec::new(), read: Vec::new(), any_ok: false, checks, fence, ev: None }
    }

    /// Enqueues one node's work.
    pub(crate) fn run(&mut self, op: &Op<'_>, inputs: &[&Storage]) -> Result<Storage> {
        let conds = self.begin_node(op, inputs)?;
        let r = eval(&self.cs, op.prim, op.shape, op.dtype, inputs, &mut self.read, &mut self.checks);
        self.finish_node(r, &conds)
    }

    /// [`BatchRun::run`] with the first input donated (`backend::BatchRun::run_donated`):
    /// a `SliceUpdate` whose inputs are all on this device writes into it.
    pub(crate) fn run_donated(&mut self, op: &Op<'_>, donor: Storage, rest: &[&Storage]) -> Result<Storage> {
        let cs = self.cs;
        let here = |s: &Storage| cuda_of(s).is_some_and(|b| b.ordinal == cs.dev.ordinal);
        let all: SmallVec<[&Storage; 4]> = std::iter::once(&donor).chain(rest.iter().copied()).collect();
        let axis = match op.prim {
            Primitive::SliceUpdate { axis } if all.len() == 3 && all.iter().all(|s| here(s)) => *axis,
            _ => return self.run(op, &all),
        };
        let conds = self.begin_node(op, &all)?;
        for s in &all {
            keep_read(&cs, s, &mut self.read);
        }
        drop(all);
        let r = decode::slice_update_into(&cs, donor, rest[0], rest[1], axis);
        self.finish_node(r, &conds)
    }

    /// What every node does before its kernels: names it to the recording, makes the
    /// stream wait for inputs of other streams, and returns the inputs' pending index
    /// checks, which the result inherits (an input whose check already failed fails the
    /// node here).
    fn begin_node(&mut self, op: &Op<'_>, inputs: &[&Storage]) -> Result<check::Conds> {
        if let Some(r) = &self.rec {
            r.node(op.id);
        }
        prepare_inputs(&self.cs, inputs, &mut self.waited)?;
        self.checks.inputs(inputs)
    }

    /// What every node does with its result: the inherited checks, and the batch's count.
    fn finish_node(&mut self, r: Result<Storage>, conds: &check::Conds) -> Result<Storage> {
        if let Ok(s) = &r {
            self.checks.taint(s, conds);
        }
        self.any_ok |= r.is_ok();
        r
    }

    /// Sends the recorded launches; returns the nodes whose launches failed (`None`: a
    /// failure that cannot be charged to one node, the sender panicked).
    pub(crate) fn send(&mut self) -> Vec<(Option<u64>, Error)> {
        let Some(r) = self.rec.take() else { return Vec::new() };
        r.finish().into_iter().map(|(n, e)| ((n != 0).then_some(n), super::backend_err("launch", e))).collect()
    }

    /// Records the batch's event and attaches it and the fence to the results.
    pub(crate) fn seal(&mut self, results: &mut [Result<Storage>]) {
        let cs = self.cs;
        if self.any_ok {
            match Ev::record(cs.driver(), cs.stream(), &cs.dev.events) {
                Ok(ev) => self.ev = Some(Arc::new(ev)),
                Err(e) => {
                    let err = super::backend_err("cuda", format!("recording the batch event: {e:?}"));
                    for r in results.iter_mut() {
                        if r.is_ok() {
                            *r = Err(err.clone());
                        }
                    }
                }
            }
        }
        if let Some(ev) = &self.ev {
            for s in &self.read {
                if let Some(b) = cuda_of(s) {
                    b.add_user(cs.id, ev);
                }
            }
        }
        self.read.clear();
        // In the batch's (topological) order: a buffer's event is set before the first
        // node that holds it is published, so another stream that reads it waits for it.
        for s in results.iter_mut().flatten() {
            if let (Some(ev), Some(b)) = (&self.ev, cuda_of(s))
                && !b.constant
                && b.produced.get().is_none()
            {
                let _ = b.produced.set((ev.clone(), cs.id));
            }
            // The batch's fence, or one that also waits for the result's index checks.
            s.fence = Some(self.checks.fence_for(s));
        }
    }

    /// Hands (event, fence) to the device's completion worker (or signals the fence when
    /// the batch enqueued nothing).
    pub(crate) fn close(mut self) {
        // The runtime sends before it seals; a recording left here is sent by its `Drop`.
        drop(self.rec.take());
        match self.ev.take() {
            Some(ev) => self.cs.dev.complete_later(self.cs.driver(), ev, self.fence.clone()),
            None => {
                // Work may still run unobserved: check slots are then not reused.
                self.checks.abandon();
                self.fence.signal(Ok(()))
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

/// Adds `s` to `read` when its buffer belongs to another stream (its last use on `cs` is
/// then set when the batch is sealed; constants of the scalar slab record no users).
fn keep_read(cs: &GpuStream<'_>, s: &Storage, read: &mut Vec<Storage>) {
    if cuda_of(s).is_some_and(|b| b.alloc_stream_id != cs.id && !b.constant) {
        read.push(s.clone());
    }
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
    checks: &mut check::Batch,
) -> Result<Storage> {
    use Primitive::*;
    let mut keep = |s: &Storage| keep_read(cs, s, read);
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
        let out = crate::backend::cpu::eval(prim, shape, dtype, &host.iter().collect::<Vec<_>>())?;
        return upload(cs, &out);
    }
    if let Host { f, name } = prim {
        // The inputs may be produced earlier in this batch: finish the stream first.
        crate::runtime::stats::HOST_ROUND_TRIPS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        cs.synchronize()?;
        let host: Vec<Storage> = raw.iter().map(|s| host_copy(s)).collect::<Result<_>>()?;
        let out =
            crate::backend::cpu::eval(&Host { f: f.clone(), name }, shape, dtype, &host.iter().collect::<Vec<_>>())?;
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
        Sort(spec) => sort::sort(cs, x(), spec, shape),
        Softmax { axis, log } => reduce::softmax(cs, x(), *axis, *log),
        LayerNorm { eps, has_weight, has_bias } => norm::layer_norm(cs, &owned(), *eps, *has_weight, *has_bias),
        RmsNorm { eps, has_weight } => norm::rms_norm(cs, &owned(), *eps, *has_weight),
        Matmul => matmul::matmul(cs, x(), inputs[1], shape, dtype),
        Attention { scale, mask } => attention::attention(cs, inputs, *scale, *mask, shape, dtype),
        AttentionGrad { scale, causal, part } => {
            attention_grad::attention_grad(cs, inputs, *scale, *causal, *part, shape, dtype)
        }
        QuantMatmul { format } => quant::qmatmul(cs, x(), inputs[1], *format, shape, dtype),
        Dequantize { format } => quant::dequantize(cs, x(), *format, shape, dtype),
        Rope { dims, base, scale, layout } => decode::rope(cs, inputs, *dims, *base, *scale, *layout),
        SliceUpdate { axis } => decode::slice_update(cs, inputs, *axis),
        Reshape => match x().layout.reshape(shape) {
            Some(l) => Ok(x().with_layout(l)),
            None => Ok(copy::make_contiguous(cs, x())?.with_layout(crate::shape::Layout::contiguous(shape))),
        },
        Permute(perm) => Ok(x().with_layout(x().layout.permute(perm))),
        BroadcastTo => Ok(x().with_layout(x().layout.broadcast_to(shape))),
        Slice { start, step } => Ok(crate::backend::cpu::movement::slice_view(x(), start, step, shape)),
        Contiguous => copy::make_contiguous(cs, x()),
        StopGradient | Depend => Ok(x().with_layout(x().layout.clone())),
        Checkpoint { .. } => match inputs.last() {
            Some(x) => Ok(x.with_layout(x.layout.clone())),
            None => Err(Error::invalid("checkpoint", "a checkpoint node has no inputs")),
        },
        Take { axis } => take::take(cs, x(), inputs[1], *axis, shape, checks),
        ScatterAdd { axis } => scatter::scatter_add(cs, inputs, *axis, checks),
        TakeAlongAxis { axis } => scatter::take_along_axis(cs, x(), inputs[1], *axis, shape, checks),
        PutAlongAxis { axis, accumulate } => scatter::put_along_axis(cs, inputs, *axis, *accumulate, checks),
        Concatenate { axis } => copy::concatenate(cs, &owned(), *axis, shape),
        Pad { widths, value } => copy::pad(cs, x(), widths, *value, shape),
        Placeholder { .. } => Err(Error::invalid("placeholder", "a compile placeholder cannot be evaluated")),
        Fused(p) => fused::fused(cs, p, &owned(), shape, dtype),
        FusedReduce { program, op, axes } => fused::fused_reduce(cs, program, *op, axes, &owned(), shape, dtype),
        Block(b) => blocks::block(cs, b, &owned(), shape, dtype),
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
    if s.fence.is_none()
        && let Some(ev) = b.event()
    {
        ev.synchronize(d).map_err(|e| super::backend_err("to_host", e))?;
    }
    let dev = super::device::device(b.ordinal)?;
    catch_unwind(AssertUnwindSafe(|| download(d, dev.transfer(d), s)))
        .unwrap_or_else(|p| Err(Error::Panic { op: "to_host", msg: crate::error::panic_message(&*p).into() }))
}
