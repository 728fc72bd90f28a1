//! `compile`: trace a function of arrays once, simplify and fuse its graph, and replay it.
//!
//! ```
//! use rill::{Array, compile};
//! let f = compile(|x: &[Array]| Ok(vec![x[0].mul(&x[1])?.add(1.0)?.tanh()?]));
//! let a = Array::from_slice(&[1.0f32, 2.0], &[2])?;
//! let b = Array::from_slice(&[0.5f32, -0.5], &[2])?;
//! let y = f.call(&[a.clone(), b.clone()])?; // traced now, replayed on later calls
//! assert_eq!(y[0].to_vec::<f32>()?, a.mul(&b)?.add(1.0)?.tanh()?.to_vec::<f32>()?);
//! # Ok::<(), rill::Error>(())
//! ```
//!
//! **Tracing.** The first call with a given key runs `f` once on *placeholder* arrays
//! (nodes of [`Primitive::Placeholder`](crate::primitives::Primitive::Placeholder) on the
//! call's stream, never evaluated) inside a stream scope of that stream, and records the
//! graph reachable from the outputs back to the placeholders as a *tape*: the nodes in
//! topological order, each with its primitive, input references, shape, dtype and stream.
//! Arrays `f` captures from outside (and any array that does not depend on an input) are
//! kept as captured constants and shared by every replay; 0-d fills (`Full`, what Rust
//! scalar operands become) are kept as tape nodes so fusion can inline them. If `f`
//! returns an error or panics, the call returns the error (a panic as
//! [`Error::Panic`]) and no entry is cached: the next call traces
//! again. If `f` evaluates an array that depends on its inputs, the placeholder's kernel
//! fails at once and the call returns an error (tracing must stay lazy).
//!
//! **Replay.** Later calls with the same key record one lazy node per tape node on the
//! call's stream (nodes `f` put on another stream explicitly keep that stream); outputs
//! are lazy like those of any op. Replay is generic: every primitive works in a traced
//! graph.
//!
//! **Cache key.** A unique id minted by [`compile`] (an atomic counter, never a function
//! address), the input shapes (ranks in shapeless mode) and dtypes, the static
//! arguments (see [`compile_with_static`]), and the id of the target stream (the one
//! `crate::ops::target_stream` resolves for the inputs: the innermost stream scope, else
//! the default stream of the first input's device). Inputs on another device than that
//! stream's are moved with a `ToDevice` node, as ops do.
//!
//! **Lifetime.** The cache lives inside the [`Compiled`]'s shared state: its entries
//! (tapes, fused programs, captured constants) are freed when the last clone is dropped,
//! on whatever thread. [`live_entries`] counts entries alive in the process. Concurrent
//! first calls with the same key trace once: the others wait for that trace (a call of
//! the same compiled function with the same key from inside its own trace is an error,
//! not a deadlock). Calling creates no stream and no thread.
//!
//! **Simplification.** Common-subexpression elimination merges nodes with the same
//! primitive and parameters (`simplify::same_op`: structural, floats by bits;
//! host callbacks never merge), inputs, shape, dtype and stream, which also merges equal
//! `Full` scalars; nodes no output needs are dropped.
//!
//! **Fusion.** Elementwise nodes (`Primitive::is_elementwise`) with f16, bf16, f32, f64
//! or bool outputs join their consumer's group when they have exactly one consumer, are
//! not an output and run on the same stream; a group of two or more ops becomes one
//! [`Primitive::Fused`](crate::primitives::Primitive::Fused) node running a
//! [`FusedProgram`] (registers; load, constant, unary, binary, where, cast), whose inputs
//! are the group's external inputs broadcast to the output shape. 0-d `Full` inputs
//! become constants; a `BroadcastTo` input is read through its source. Every register
//! is rounded to its dtype after each instruction, exactly where the unfused kernels
//! round (f16/bf16 compute in f32), so compiled and uncompiled results are equal on
//! the CPU. Integer-valued ops are not fused. The CPU interprets programs; the CUDA
//! backend generates one kernel per program and launch plan (`backend/cuda/fused_src.rs`): a linear
//! loop with 16-byte vector loads when every input is contiguous with the output or a
//! scalar, row or column broadcast, else a strided loop over merged axes. Additions and
//! multiplications are explicitly rounded there (never contracted into an FMA) and the
//! math functions are those of the unfused kernels, so fused and unfused GPU results
//! agree up to the compiler's treatment of each op's own expression.
//!
//! **Trailing reductions.** A group (or a single elementwise node) whose only consumer is
//! a `Reduce` (sum, prod, max, min; `mean` is a sum and a scale) on the same stream, and
//! which is not an output, becomes one
//! [`Primitive::FusedReduce`](crate::primitives::Primitive::FusedReduce) node. On the CPU
//! the reduction asks for the pieces of its input it needs (about 32K elements, whole
//! rows for trailing axes) and the program computes each piece on demand, so the group's
//! values are never stored whole; the pieces and the order of combination are those of
//! the unfused reduction, so the result has the same bits. Reductions over separated
//! axes and empty shapes store the values first. On the GPU, when the reduced axes are
//! last and every input is contiguous or broadcast along them (`sum(axis=-1)`, full
//! reductions), the node is one generated kernel: the reduction kernels' source with each
//! element read by calling the program on its inputs (`fused_src::reduce_read`), in each
//! of the reduction's launch shapes (its elements are combined in another order than the
//! unfused reduction's, so sums may differ from it in the last bits); other layouts run
//! the fused kernel, store the values, and reduce them with the reduction kernels.
//! `runtime::stats().fused_reduce_kernels` counts the nodes that ran as one kernel.
//!
//! **Fused blocks** (`CompileOptions::blocks`, on by default; `blocks.rs`). After
//! elementwise fusion, three patterns become one
//! [`Primitive::Block`](crate::primitives::Primitive::Block) node each, on values nothing
//! else reads: a `matmul` and the elementwise program after it (bias, activation,
//! residual), which a GPU runs as one cuBLASLt call with an epilogue when the program is
//! `act(c * x @ w + bias + residual)` with ReLU or the tanh GELU (`c` a constant) (else the product and one
//! generated kernel); `layer_norm(x + r)` / `rms_norm(x + r)`, the sum also stored when
//! something else reads it, as one kernel; elementwise nodes of one shape that read one
//! another (shared intermediates, several returned values) as one program storing each
//! value read outside; and one elementwise program applied to many tensors (an
//! optimizer step over every parameter, see [`crate::optim`]) as one kernel over all of
//! them. On the CPU each block gives the bits of the ops it replaces; on a
//! GPU a cuBLASLt epilogue computes on the f32 accumulator, so f16/bf16 results may
//! differ from the ops' in the last bit. Some outputs are then views of the block's one
//! buffer (each member of a multi-tensor block, a kept sum). Before fusion, attention
//! written as ops, `softmax(q @ swapaxes(k) * c + mask, -1) @ v`, becomes one
//! `scaled_dot_product_attention` node when the intermediates are read by nothing else
//! (its kernels accumulate in f32 and never store the scores, so half-precision results
//! may differ from the ops' in the last bits).
//!
//! **Per call.** A replay looks the key up (one map lookup under a lock), records one
//! node per tape node, and at evaluation the fused kernel's function is found in a memo
//! inside its program (no source generation, no formatted key); nothing is traced or
//! compiled again.
//!
//! **Shapeless mode** ([`compile_shapeless`]): the key has ranks instead of shapes; the
//! tape traced for the first shapes is replayed for other shapes of the same ranks by
//! re-deriving every node's shape from its inputs' (broadcasting, reductions, matmul,
//! permutes, unary ops, ...). What ops compute from shapes while they build the graph
//! is recomputed too, never kept from the trace: the counts `mean` and `var` divide by,
//! the axes that reductions without `keepdims`, `squeeze`, `expand_dims` and 1-D
//! matmuls remove or insert, and matmul's broadcast of its operands to their batch
//! shape (a captured operand included): during a shapeless trace those ops note how
//! each such node follows from shapes (`rules`), and each replay evaluates the notes
//! for its shapes. New shapes the ops would reject (shapes that do not broadcast, a
//! shape too large) give the op's error; shapes for which the ops would have built
//! another graph (a matmul operand that needed no broadcast when traced, a maximum or
//! an argmax over an axis that is now empty) are traced for those exact shapes instead.
//! Tapes with an op whose shape is not a function of its inputs' shapes (reshape,
//! broadcast_to, slice, pad, take, concatenate, arange, eye, random, fills of a shape,
//! host callbacks), and tapes holding nodes replayed by a compiled function the traced
//! function called (they hold numbers of that function's own trace), cannot be replayed
//! that way: for those, calls fall back to tracing once per exact shape. As in MLX and
//! JAX, the function's own Rust code runs only when tracing: a function that branches
//! on input shapes or computes numbers from them is replayed with the branch taken and
//! the numbers computed at tracing time, an op whose result the function does not
//! return is not replayed (nor its shape errors), and captured constants keep their
//! shapes (new shapes must still broadcast with them, or the call returns the broadcast
//! error).

pub(crate) mod blocks;
pub(crate) mod fuse;
pub(crate) mod rules;
pub(crate) mod shapes;
pub(crate) mod simplify;
pub(crate) mod trace;

pub use crate::primitives::fused::{FusedBlock, FusedProgram};
pub use simplify::same_op;

use std::collections::HashMap;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::thread::ThreadId;

use crate::array::Array;
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::ops::{on_device, target_stream};
use crate::runtime::device::Device;
use crate::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use crate::sync::{Arc, Condvar, Mutex};
use trace::{Tape, TraceFn};

static NEXT_ID: AtomicU64 = AtomicU64::new(1);
static LIVE_ENTRIES: AtomicUsize = AtomicUsize::new(0);

/// Number of compiled-function cache entries alive in the process (all [`Compiled`]s).
pub fn live_entries() -> usize {
    LIVE_ENTRIES.load(Ordering::SeqCst)
}

/// True when `device`'s backend can run `Fused` nodes.
pub(crate) fn fused_supported(device: Device) -> bool {
    // The CPU interprets programs; the CUDA backend compiles them with NVRTC.
    !device.is_gpu() || cfg!(feature = "cuda")
}

/// How [`compile_with_options`] compiles.
#[derive(Clone, Debug)]
pub struct CompileOptions {
    /// Trace once per ranks instead of once per shapes (see the module docs).
    pub shapeless: bool,
    /// Fuse elementwise ops (default true).
    pub fuse: bool,
    /// With `fuse`, also make fused blocks: matmul epilogues, residual norms,
    /// multi-tensor apply and attention (default true; see the module docs).
    pub blocks: bool,
}

impl Default for CompileOptions {
    fn default() -> Self {
        CompileOptions { shapeless: false, fuse: true, blocks: true }
    }
}

#[derive(Clone, PartialEq, Eq, Hash)]
enum ShapeKey {
    Exact(Vec<Vec<usize>>),
    Ranks(Vec<usize>),
}

#[derive(Clone, PartialEq, Eq, Hash)]
struct Key {
    id: u64,
    shapes: ShapeKey,
    dtypes: Vec<DType>,
    statics: Vec<i64>,
    stream: u64,
}

/// A traced, simplified and fused function for one key.
struct Entry {
    tape: Tape,
    /// The tape replays on other shapes of the same ranks (shapeless mode only).
    polymorphic: bool,
}

impl Entry {
    fn new(tape: Tape, polymorphic: bool) -> Entry {
        LIVE_ENTRIES.fetch_add(1, Ordering::SeqCst);
        Entry { tape, polymorphic }
    }
}

impl Drop for Entry {
    fn drop(&mut self) {
        LIVE_ENTRIES.fetch_sub(1, Ordering::SeqCst);
    }
}

#[derive(Default)]
struct SlotState {
    entry: Option<Arc<Entry>>,
    tracer: Option<ThreadId>,
}

/// One key's cache slot: empty until a trace succeeds; one trace at a time.
#[derive(Default)]
struct Slot {
    state: Mutex<SlotState>,
    cv: Condvar,
}

struct Inner {
    id: u64,
    f: Box<TraceFn>,
    options: CompileOptions,
    cache: Mutex<HashMap<Key, Arc<Slot>>>,
    traces: AtomicUsize,
}

/// A compiled function (see the module docs). Cheap to clone; `Send + Sync`; callable
/// from any thread or task at once.
#[derive(Clone)]
pub struct Compiled {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for Compiled {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Compiled(id={}, traces={}, entries={})", self.id(), self.trace_count(), self.cache_len())
    }
}

/// Compiles `f` (traced per input shapes, dtypes and target stream).
pub fn compile<F>(f: F) -> Compiled
where
    F: Fn(&[Array]) -> Result<Vec<Array>> + Send + Sync + 'static,
{
    compile_with_options(move |x: &[Array], _: &[i64]| f(x), CompileOptions::default())
}

/// Compiles `f` in shapeless mode: traced per input ranks and dtypes, replayed for new
/// shapes (see the module docs for its limits).
pub fn compile_shapeless<F>(f: F) -> Compiled
where
    F: Fn(&[Array]) -> Result<Vec<Array>> + Send + Sync + 'static,
{
    compile_with_options(
        move |x: &[Array], _: &[i64]| f(x),
        CompileOptions { shapeless: true, fuse: true, blocks: true },
    )
}

/// Compiles a function of arrays and static integer arguments: the statics given to
/// [`Compiled::call_with_static`] are part of the cache key (a new value traces again),
/// so `f` may use them as plain Rust values (axes, sizes, flags).
pub fn compile_with_static<F>(f: F) -> Compiled
where
    F: Fn(&[Array], &[i64]) -> Result<Vec<Array>> + Send + Sync + 'static,
{
    compile_with_options(f, CompileOptions::default())
}

/// Compiles a function of arrays and static arguments with explicit options.
pub fn compile_with_options<F>(f: F, options: CompileOptions) -> Compiled
where
    F: Fn(&[Array], &[i64]) -> Result<Vec<Array>> + Send + Sync + 'static,
{
    Compiled {
        inner: Arc::new(Inner {
            id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
            f: Box::new(f),
            options,
            cache: Mutex::new(HashMap::new()),
            traces: AtomicUsize::new(0),
        }),
    }
}

impl Compiled {
    /// The unique id of this compiled function (shared by its clones).
    pub fn id(&self) -> u64 {
        self.inner.id
    }
    /// How many times `f` has been traced (successfully or not).
    pub fn trace_count(&self) -> usize {
        self.inner.traces.load(Ordering::SeqCst)
    }
    /// Number of cached entries (successful traces kept).
    pub fn cache_len(&self) -> usize {
        self.inner.cache.lock().values().filter(|s| s.state.lock().entry.is_some()).count()
    }
    /// Calls the function: traces on the first call for these shapes, dtypes and stream,
    /// replays afterwards. The outputs are lazy.
    pub fn call(&self, inputs: &[Array]) -> Result<Vec<Array>> {
        self.call_with_static(inputs, &[])
    }
    /// Calls the function with static arguments (part of the cache key).
    pub fn call_with_static(&self, inputs: &[Array], statics: &[i64]) -> Result<Vec<Array>> {
        let refs: Vec<&Array> = inputs.iter().collect();
        let stream = target_stream(&refs)?;
        let inputs: Vec<Array> = inputs.iter().map(|a| on_device(a, &stream)).collect();
        let shapes: Vec<Vec<usize>> = inputs.iter().map(|a| a.shape().to_vec()).collect();
        let dtypes: Vec<DType> = inputs.iter().map(|a| a.dtype()).collect();
        let key = |shapes: ShapeKey| Key {
            id: self.inner.id,
            shapes,
            dtypes: dtypes.clone(),
            statics: statics.to_vec(),
            stream: stream.id(),
        };
        if self.inner.options.shapeless {
            let ranks = shapes.iter().map(|s| s.len()).collect();
            let e = self.entry(&key(ShapeKey::Ranks(ranks)), &shapes, &dtypes, statics, &stream)?;
            if e.tape.input_shapes == shapes {
                return Ok(trace::replay(&e.tape, &inputs, None, &stream));
            }
            if e.polymorphic {
                // `None`: the tape does not describe these shapes; they are traced below.
                if let Some(plan) = shapes::plan(&e.tape, &shapes)? {
                    return Ok(trace::replay(&e.tape, &inputs, Some(&plan), &stream));
                }
            }
        }
        let key = key(ShapeKey::Exact(shapes));
        let shapes: &[Vec<usize>] = match &key.shapes {
            ShapeKey::Exact(s) => s,
            ShapeKey::Ranks(_) => &[],
        };
        let e = self.entry(&key, shapes, &dtypes, statics, &stream)?;
        Ok(trace::replay(&e.tape, &inputs, None, &stream))
    }

    /// The entry for `key`, tracing it when missing (one tracer per key at a time).
    fn entry(
        &self,
        key: &Key,
        shapes: &[Vec<usize>],
        dtypes: &[DType],
        statics: &[i64],
        stream: &crate::runtime::stream::Stream,
    ) -> Result<Arc<Entry>> {
        let polymorphic_key = matches!(key.shapes, ShapeKey::Ranks(_));
        let slot = {
            let mut cache = self.inner.cache.lock();
            match cache.get(key) {
                Some(s) => s.clone(),
                None => cache.entry(key.clone()).or_default().clone(),
            }
        };
        let me = std::thread::current().id();
        {
            let mut g = slot.state.lock();
            loop {
                if let Some(e) = &g.entry {
                    return Ok(e.clone());
                }
                match g.tracer {
                    None => {
                        g.tracer = Some(me);
                        break;
                    }
                    Some(t) if t == me => {
                        return Err(Error::invalid(
                            "compile",
                            "a compiled function called itself with the same inputs while being traced",
                        ));
                    }
                    Some(_) => g = slot.cv.wait(g),
                }
            }
        }
        self.inner.traces.fetch_add(1, Ordering::SeqCst);
        let built = catch_unwind(AssertUnwindSafe(|| self.build(shapes, dtypes, statics, stream, polymorphic_key)))
            .unwrap_or_else(|_| Err(Error::Panic { op: "compile", msg: "compile pass panicked".into() }));
        let mut g = slot.state.lock();
        g.tracer = None;
        let out = built.map(|e| {
            let e = Arc::new(e);
            g.entry = Some(e.clone());
            e
        });
        drop(g);
        slot.cv.notify_all();
        out
    }

    /// Traces, simplifies and fuses.
    fn build(
        &self,
        shapes: &[Vec<usize>],
        dtypes: &[DType],
        statics: &[i64],
        stream: &crate::runtime::stream::Stream,
        shapeless: bool,
    ) -> Result<Entry> {
        let mut tape = trace::trace(&*self.inner.f, shapes, dtypes, statics, stream, shapeless)?;
        simplify::simplify(&mut tape);
        let polymorphic = shapeless && shapes::is_polymorphic(&tape);
        if !polymorphic {
            // Replayed on the traced shapes only: count fills may be inlined as constants.
            tape.nodes.iter_mut().for_each(|n| n.rule = None);
        }
        if self.inner.options.fuse && fused_supported(stream.device()) {
            if self.inner.options.blocks {
                // Before fusion, which would take the scale and the mask into programs.
                blocks::attention(&mut tape);
            }
            fuse::fuse(&mut tape, !polymorphic);
            if self.inner.options.blocks {
                blocks::blocks(&mut tape, !polymorphic);
            }
        }
        Ok(Entry::new(tape, polymorphic))
    }

    /// Calls the function and counts the `Fused` nodes in the (unevaluated) graph of its
    /// outputs; for tests and diagnostics.
    pub fn fused_node_count(&self, inputs: &[Array]) -> Result<usize> {
        let outs = self.call(inputs)?;
        let mut seen = std::collections::HashSet::new();
        let mut stack: Vec<Array> = outs;
        let mut n = 0;
        while let Some(a) = stack.pop() {
            if !seen.insert(a.id()) {
                continue;
            }
            let (prim, inputs) = a.primitive_and_inputs();
            if prim.is_fused() {
                n += 1;
            }
            stack.extend(inputs);
        }
        Ok(n)
    }

    /// Calls the function and counts the nodes of each primitive (by name: `"matmul"`,
    /// `"fused"`, `"fused_matmul"`, ...) in the (unevaluated) graph of its outputs, down to
    /// evaluated arrays; for tests and diagnostics.
    pub fn primitive_counts(&self, inputs: &[Array]) -> Result<std::collections::BTreeMap<&'static str, usize>> {
        let outs = self.call(inputs)?;
        let mut seen = std::collections::HashSet::new();
        let mut stack: Vec<Array> = outs;
        let mut counts = std::collections::BTreeMap::new();
        while let Some(a) = stack.pop() {
            if !seen.insert(a.id()) || a.is_evaluated() {
                continue;
            }
            let (prim, inputs) = a.primitive_and_inputs();
            *counts.entry(prim.name()).or_insert(0) += 1;
            stack.extend(inputs);
        }
        Ok(counts)
    }
}
