//! Automatic differentiation: [`vjp`] (reverse mode), [`jvp`] (forward mode), [`grad`] and
//! [`value_and_grad`] (reverse mode of a scalar function, as a callable),
//! [`stop_gradient`] and [`checkpoint`] (recompute instead of keep). See
//! `docs/AUTODIFF.md`.
//!
//! **How.** A transform traces the function once on placeholders with `compile`'s tracer
//! (evaluated nodes drop their inputs, so the graph of arrays the caller holds cannot be
//! walked; a trace also rejects functions that evaluate while traced), replays the tape
//! on the real primals keeping every node's value, then walks it: backwards for `vjp`,
//! summing each node's contributions to its inputs' cotangents (`None`: a structural
//! zero), or forwards for `jvp`. Each primitive's rule (`primitives/grad.rs` and the family
//! files) builds its result with ops, so results are lazy arrays on the primals' stream,
//! and the transforms compose: a rule's graph is itself differentiable (`grad` of `grad`)
//! and traceable (`compile` of `grad`). Fused nodes that a compiled function's replay
//! makes are differentiated through the ops they replace (`grad` of `compile`).
//!
//! Only float arrays are differentiated: integer and bool primals are an error of the
//! public transforms, and inside a function integer and bool values carry no gradient.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;

use crate::array::Array;
use crate::compile::rules::{self, Note};
use crate::compile::trace::{self, Ref, Tape};
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::ops::movement::copies::concatenate;
use crate::ops::{on_device, target_stream};
use crate::primitives::Primitive;
use crate::primitives::grad::{Jvp, Vjp, record};
use crate::runtime::scope::with_stream;
use crate::runtime::stream::Stream;

/// The functions the transforms take: arrays in, arrays out (as `compile`'s).
type Func<'a> = dyn Fn(&[Array]) -> Result<Vec<Array>> + Send + Sync + 'a;

/// A function traced on placeholders and replayed on real inputs, each node's value kept.
struct Traced {
    tape: Tape,
    /// The inputs, on the trace's stream.
    inputs: Vec<Array>,
    /// The value of each tape node (lazy, on the trace's stream).
    vals: Vec<Array>,
    /// Node `i` depends on an input (only those carry derivatives).
    depends: Vec<bool>,
}

impl Traced {
    fn new(op: &'static str, f: &Func<'_>, primals: &[Array], stream: &Stream) -> Result<Traced> {
        let inputs: Vec<Array> = primals.iter().map(|a| on_device(a, stream)).collect();
        let shapes: Vec<Vec<usize>> = inputs.iter().map(|a| a.shape().to_vec()).collect();
        let dtypes: Vec<DType> = inputs.iter().map(|a| a.dtype()).collect();
        let g = |x: &[Array], _: &[i64]| f(x);
        let tape = trace::trace(&g, &shapes, &dtypes, &[], stream, false).map_err(|e| rename(e, op))?;
        // Called inside a shapeless trace: the nodes hold numbers of this trace's shapes.
        let opaque = rules::tracing();
        let mut vals: Vec<Array> = Vec::with_capacity(tape.nodes.len());
        let mut depends = Vec::with_capacity(tape.nodes.len());
        for n in &tape.nodes {
            let ins: Vec<Array> = n.inputs.iter().map(|r| get(&tape, &inputs, &vals, r)).collect();
            let s = n.stream.clone().unwrap_or_else(|| stream.clone());
            let a = Array::from_op(n.prim.clone(), ins, n.shape.clone(), n.dtype, s);
            if opaque {
                rules::note(&a, Note::Opaque);
            }
            vals.push(a);
            depends.push(n.inputs.iter().any(|r| match *r {
                Ref::Input(_) => true,
                Ref::Node(j) => depends[j],
                Ref::Const(_) => false,
            }));
        }
        Ok(Traced { tape, inputs, vals, depends })
    }

    fn get(&self, r: &Ref) -> Array {
        get(&self.tape, &self.inputs, &self.vals, r)
    }

    fn outputs(&self) -> Vec<Array> {
        self.tape.outputs.iter().map(|r| self.get(r)).collect()
    }

    /// Whether a value read through `r` depends on an input.
    fn varies(&self, r: &Ref) -> bool {
        match *r {
            Ref::Input(_) => true,
            Ref::Node(j) => self.depends[j],
            Ref::Const(_) => false,
        }
    }

    /// The cotangent of each input (`None`: zero) from those of the outputs.
    fn backward(&self, out_cts: &[Option<Array>]) -> Result<Vec<Option<Array>>> {
        // Each node's and input's cotangent terms, summed when the node is reached.
        let mut node_ct: Vec<Vec<Array>> = vec![Vec::new(); self.vals.len()];
        let mut in_ct: Vec<Vec<Array>> = vec![Vec::new(); self.inputs.len()];
        let mut add = |node_ct: &mut Vec<Vec<Array>>, r: Ref, c: Array| -> Result<()> {
            match r {
                Ref::Input(k) => in_ct[k].push(c),
                Ref::Node(j) => node_ct[j].push(c),
                Ref::Const(_) => {}
            }
            Ok(())
        };
        for (r, ct) in self.tape.outputs.iter().zip(out_cts) {
            if let Some(ct) = ct
                && self.varies(r)
                && self.get(r).dtype().is_float()
            {
                add(&mut node_ct, *r, ct.clone())?;
            }
        }
        for i in (0..self.vals.len()).rev() {
            let Some(ct) = sum_terms(std::mem::take(&mut node_ct[i]))? else { continue };
            let n = &self.tape.nodes[i];
            if !self.depends[i] || !n.dtype.is_float() {
                continue;
            }
            let ins: Vec<Array> = n.inputs.iter().map(|r| self.get(r)).collect();
            let cts = n.prim.vjp(&Vjp { inputs: &ins, output: &self.vals[i], cotangent: &ct })?;
            if cts.len() != ins.len() {
                return Err(Error::invalid(
                    "vjp",
                    format!("the rule of {} gave {} cotangents for {} inputs", n.prim.name(), cts.len(), ins.len()),
                ));
            }
            for ((r, a), c) in n.inputs.iter().zip(&ins).zip(cts) {
                if let Some(c) = c
                    && self.varies(r)
                    && a.dtype().is_float()
                {
                    add(&mut node_ct, *r, fit(c, a, &n.prim, "vjp")?)?;
                }
            }
        }
        in_ct.into_iter().map(sum_terms).collect()
    }

    /// The tangent of each output (`None`: zero) from those of the inputs.
    fn forward(&self, in_t: &[Option<Array>]) -> Result<Vec<Option<Array>>> {
        let mut node_t: Vec<Option<Array>> = Vec::with_capacity(self.vals.len());
        let tangent = |node_t: &Vec<Option<Array>>, r: &Ref| match *r {
            Ref::Input(k) => in_t[k].clone(),
            Ref::Node(j) => node_t[j].clone(),
            Ref::Const(_) => None,
        };
        for (i, n) in self.tape.nodes.iter().enumerate() {
            let ins: Vec<Array> = n.inputs.iter().map(|r| self.get(r)).collect();
            let ts: Vec<Option<Array>> = n
                .inputs
                .iter()
                .zip(&ins)
                .map(|(r, a)| if a.dtype().is_float() { tangent(&node_t, r) } else { None })
                .collect();
            let t = if !n.dtype.is_float() || ts.iter().all(Option::is_none) {
                None
            } else {
                match n.prim.jvp(&Jvp { inputs: &ins, tangents: &ts, output: &self.vals[i] })? {
                    Some(t) => Some(fit(t, &self.vals[i], &n.prim, "jvp")?),
                    None => None,
                }
            };
            node_t.push(t);
        }
        Ok(self.tape.outputs.iter().map(|r| tangent(&node_t, r)).collect())
    }
}

/// The sum of a node's cotangent terms, added in the order they came (`None`: no term).
/// Terms that are all zero paddings of disjoint runs of one axis (the cotangents of
/// slices that split an array: a fused q/k/v projection's three parts) become one
/// concatenation, padded once, instead of full-size zero arrays added together.
fn sum_terms(terms: Vec<Array>) -> Result<Option<Array>> {
    if terms.len() > 1
        && let Some(joined) = join_pads(&terms)?
    {
        return Ok(Some(joined));
    }
    let mut it = terms.into_iter();
    let Some(mut sum) = it.next() else { return Ok(None) };
    for t in it {
        sum = sum.add(&t)?;
    }
    Ok(Some(sum))
}

/// [`sum_terms`] of zero paddings (not yet evaluated, one shape and dtype) whose widths
/// agree but on one axis, where their runs do not overlap: the runs in order with zeros
/// in the gaps, concatenated and padded. `None` for any other terms.
fn join_pads(terms: &[Array]) -> Result<Option<Array>> {
    let mut pads = Vec::with_capacity(terms.len());
    for t in terms {
        if t.is_evaluated() || t.shape() != terms[0].shape() || t.dtype() != terms[0].dtype() {
            return Ok(None);
        }
        let (Primitive::Pad { widths, value }, mut ins) = t.primitive_and_inputs() else { return Ok(None) };
        match (ins.pop(), ins.is_empty()) {
            (Some(inner), true) if value == 0.0 => pads.push((widths, inner)),
            _ => return Ok(None),
        }
    }
    let w0 = pads[0].0.clone();
    let differ: Vec<usize> = (0..w0.len()).filter(|&a| pads.iter().any(|(w, _)| w[a] != w0[a])).collect();
    let [axis] = differ[..] else { return Ok(None) };
    pads.sort_by_key(|(w, _)| w[axis].0);
    let full = terms[0].shape()[axis];
    let mut parts: Vec<Array> = Vec::new();
    let mut at = pads[0].0[axis].0;
    for (w, inner) in &pads {
        let (lo, len) = (w[axis].0, inner.shape()[axis]);
        if lo < at {
            return Ok(None); // overlapping runs
        }
        if lo > at {
            let mut gap = inner.shape().to_vec();
            gap[axis] = lo - at;
            parts.push(Array::zeros(&gap, inner.dtype())?);
        }
        parts.push(inner.clone());
        at = lo + len;
    }
    // At least two terms without overlap: at least two parts.
    let joined = concatenate(&parts.iter().collect::<Vec<_>>(), axis as isize)?;
    let mut widths = w0;
    widths[axis] = (pads[0].0[axis].0, full - at);
    if widths.iter().all(|&(a, b)| a == 0 && b == 0) {
        return Ok(Some(joined));
    }
    Ok(Some(joined.pad(&widths, 0.0)?))
}

fn get(tape: &Tape, inputs: &[Array], vals: &[Array], r: &Ref) -> Array {
    match *r {
        Ref::Input(i) => inputs[i].clone(),
        Ref::Node(i) => vals[i].clone(),
        Ref::Const(i) => tape.consts[i].clone(),
    }
}

/// A rule's result for `like` (an input's cotangent, an output's tangent): its dtype,
/// and its shape or an error naming the rule (a rule with a bug, never user input).
fn fit(c: Array, like: &Array, prim: &Primitive, mode: &'static str) -> Result<Array> {
    if c.shape() != like.shape() {
        return Err(Error::shape(
            mode,
            format!(
                "the {mode} rule of {} gave shape {:?} where {:?} was expected",
                prim.name(),
                c.shape(),
                like.shape()
            ),
        ));
    }
    if c.dtype() != like.dtype() { c.astype(like.dtype()) } else { Ok(c) }
}

/// The tracer's errors, named after the transform.
fn rename(e: Error, op: &'static str) -> Error {
    match e {
        Error::InvalidArgument { op: "compile", msg } => Error::InvalidArgument { op, msg },
        Error::Panic { op: "compile", msg } => Error::Panic { op, msg },
        e => e,
    }
}

/// Runs `body` on `stream` (the override every op of the rules targets), turning a panic
/// into an error.
fn guarded<R>(op: &'static str, stream: &Stream, body: impl FnOnce() -> Result<R>) -> Result<R> {
    match with_stream(stream, || catch_unwind(AssertUnwindSafe(body))) {
        Ok(r) => r,
        Err(p) => Err(Error::Panic { op, msg: crate::error::panic_message(&*p).into() }),
    }
}

fn stream_of(primals: &[Array]) -> Result<Stream> {
    let refs: Vec<&Array> = primals.iter().collect();
    target_stream(&refs)
}

fn check_float(op: &'static str, what: &str, i: usize, a: &Array) -> Result<()> {
    if a.dtype().is_float() {
        return Ok(());
    }
    Err(Error::dtype(op, a.dtype(), format!("{what} {i} is not a float array: only float arrays are differentiated")))
}

/// `like`'s cotangent `c` checked against it (shape and dtype).
fn check_like(op: &'static str, what: &str, i: usize, c: &Array, like: &Array) -> Result<()> {
    if c.shape() != like.shape() {
        return Err(Error::shape(
            op,
            format!("{what} {i} has shape {:?}, but it must have the shape {:?} of its value", c.shape(), like.shape()),
        ));
    }
    if c.dtype() != like.dtype() {
        return Err(Error::dtype(
            op,
            c.dtype(),
            format!("{what} {i} must have the dtype {} of its value", like.dtype()),
        ));
    }
    Ok(())
}

/// The result for `like` (an input on its own stream): `c`, or zeros for `None`, moved to
/// `like`'s device when the trace ran on another.
fn materialise(c: Option<Array>, like: &Array) -> Result<Array> {
    let c = match c {
        Some(c) => c,
        None => Array::zeros(like.shape(), like.dtype())?,
    };
    Ok(if c.device() == like.device() { c } else { on_device(&c, &like.stream()) })
}

/// Reverse mode: `f(primals)` and the vector-Jacobian products of the `cotangents` (one
/// per output, of its shape and dtype) with respect to every primal.
///
/// Every primal and output must be a float array. The results are lazy arrays on the
/// primals' stream (as an op of them would be). Errors: integer or bool primals or
/// outputs, a count, shape or dtype of cotangents that does not match the outputs, an
/// error of `f`, a primitive of `f` without a rule (`Error::Unsupported` naming it).
pub fn vjp<F>(f: F, primals: &[Array], cotangents: &[Array]) -> Result<(Vec<Array>, Vec<Array>)>
where
    F: Fn(&[Array]) -> Result<Vec<Array>> + Send + Sync,
{
    const OP: &str = "vjp";
    for (i, p) in primals.iter().enumerate() {
        check_float(OP, "primal", i, p)?;
    }
    let stream = stream_of(primals)?;
    guarded(OP, &stream, || {
        let t = Traced::new(OP, &f, primals, &stream)?;
        let outs = t.outputs();
        if outs.len() != cotangents.len() {
            return Err(Error::invalid(
                OP,
                format!("{} cotangents given for a function with {} outputs", cotangents.len(), outs.len()),
            ));
        }
        for (i, (o, c)) in outs.iter().zip(cotangents).enumerate() {
            check_float(OP, "output", i, o)?;
            check_like(OP, "cotangent", i, c, o)?;
        }
        let cts: Vec<Option<Array>> = cotangents.iter().map(|c| Some(on_device(c, &stream))).collect();
        let in_ct = t.backward(&cts)?;
        let grads = in_ct.into_iter().zip(primals).map(|(c, p)| materialise(c, p)).collect::<Result<_>>()?;
        Ok((outs, grads))
    })
}

/// Forward mode: `f(primals)` and the Jacobian-vector products of the `tangents` (one per
/// primal, of its shape and dtype), one per output.
///
/// Every primal and output must be a float array; the results are lazy arrays on the
/// primals' stream. Errors as [`vjp`]'s, with tangents in place of cotangents.
pub fn jvp<F>(f: F, primals: &[Array], tangents: &[Array]) -> Result<(Vec<Array>, Vec<Array>)>
where
    F: Fn(&[Array]) -> Result<Vec<Array>> + Send + Sync,
{
    const OP: &str = "jvp";
    if primals.len() != tangents.len() {
        return Err(Error::invalid(OP, format!("{} tangents given for {} primals", tangents.len(), primals.len())));
    }
    for (i, (p, t)) in primals.iter().zip(tangents).enumerate() {
        check_float(OP, "primal", i, p)?;
        check_like(OP, "tangent", i, t, p)?;
    }
    let stream = stream_of(primals)?;
    guarded(OP, &stream, || {
        let t = Traced::new(OP, &f, primals, &stream)?;
        let outs = t.outputs();
        for (i, o) in outs.iter().enumerate() {
            check_float(OP, "output", i, o)?;
        }
        let ts: Vec<Option<Array>> = tangents.iter().map(|t| Some(on_device(t, &stream))).collect();
        let out_t = t.forward(&ts)?;
        let jvps = out_t.into_iter().zip(&outs).map(|(t, o)| materialise(t, o)).collect::<Result<_>>()?;
        Ok((outs, jvps))
    })
}

/// The cotangents of `inputs` (integer ones `None`) for the function `f` of one output
/// and its cotangent `ct`: the rule of a primitive defined through other ops (fused
/// programs, attention).
pub(crate) fn vjp_of(f: &Func<'_>, inputs: &[Array], ct: &Array) -> Result<Vec<Option<Array>>> {
    let stream = stream_of(inputs)?;
    with_stream(&stream, || {
        let t = Traced::new("vjp", f, inputs, &stream)?;
        t.backward(&[Some(ct.clone())])
    })
}

/// The tangent of the one output of `f` (`None`: zero) from the tangents of `inputs`: the
/// forward rule of a primitive defined through other ops.
pub(crate) fn jvp_of(f: &Func<'_>, inputs: &[Array], tangents: &[Option<Array>]) -> Result<Option<Array>> {
    let stream = stream_of(inputs)?;
    with_stream(&stream, || {
        let t = Traced::new("jvp", f, inputs, &stream)?;
        Ok(t.forward(tangents)?.into_iter().next().flatten())
    })
}

struct GradInner {
    f: Box<Func<'static>>,
    argnums: Vec<usize>,
}

impl GradInner {
    /// The value of `f(inputs)` (a 0-d float array) and its gradients with respect to the
    /// inputs `argnums` names.
    fn run(&self, op: &'static str, inputs: &[Array]) -> Result<(Array, Vec<Array>)> {
        if self.argnums.is_empty() {
            return Err(Error::invalid(op, "argnums must name at least one input"));
        }
        for (k, &a) in self.argnums.iter().enumerate() {
            if a >= inputs.len() {
                return Err(Error::invalid(
                    op,
                    format!("argnums names input {a}, but the function was called with {} inputs", inputs.len()),
                ));
            }
            if self.argnums[..k].contains(&a) {
                return Err(Error::invalid(op, format!("argnums names input {a} twice")));
            }
            check_float(op, "input", a, &inputs[a])?;
        }
        let stream = stream_of(inputs)?;
        guarded(op, &stream, || {
            let t = Traced::new(op, &*self.f, inputs, &stream)?;
            let outs = t.outputs();
            let [out] = outs.as_slice() else {
                return Err(Error::invalid(
                    op,
                    format!("the function must return one 0-d array, it returned {} arrays", outs.len()),
                ));
            };
            check_float(op, "output", 0, out)?;
            if out.ndim() != 0 {
                return Err(Error::shape(
                    op,
                    format!(
                        "the function must return a 0-d (scalar) array, it returned shape {:?}; reduce it \
                         (sum_all, mean) or use vjp",
                        out.shape()
                    ),
                ));
            }
            let one = Array::ones(&[], out.dtype())?;
            let mut in_ct = t.backward(&[Some(one)])?;
            let grads =
                self.argnums.iter().map(|&a| materialise(in_ct[a].take(), &inputs[a])).collect::<Result<Vec<_>>>()?;
            Ok((out.clone(), grads))
        })
    }
}

/// The gradient of a function with a 0-d output, made by [`grad`]. Cheap to clone;
/// `Send + Sync`; callable from any thread or task at once.
#[derive(Clone)]
pub struct Grad {
    inner: Arc<GradInner>,
}

/// The value and gradient of a function with a 0-d output, made by [`value_and_grad`].
/// Cheap to clone; `Send + Sync`; callable from any thread or task at once.
#[derive(Clone)]
pub struct ValueAndGrad {
    inner: Arc<GradInner>,
}

impl std::fmt::Debug for Grad {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Grad(argnums={:?})", self.inner.argnums)
    }
}

impl std::fmt::Debug for ValueAndGrad {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "ValueAndGrad(argnums={:?})", self.inner.argnums)
    }
}

/// The gradient of `f` with respect to its inputs `argnums`: `f` must return one 0-d
/// float array. `grad(f, &[0]).call(&[x, y])` gives `[df/dx]`, each of its input's
/// shape and dtype, lazy on the inputs' stream.
///
/// Errors (at the call): `argnums` empty, repeated or out of range, a differentiated
/// input that is not a float array, an output that is not one 0-d float array, or what
/// [`vjp`] returns. The function is traced at every call (compose with
/// [`compile`](crate::compile()) to trace once: `compile(move |x| g.call(x))`).
pub fn grad<F>(f: F, argnums: &[usize]) -> Grad
where
    F: Fn(&[Array]) -> Result<Vec<Array>> + Send + Sync + 'static,
{
    Grad { inner: Arc::new(GradInner { f: Box::new(f), argnums: argnums.to_vec() }) }
}

/// [`grad`] that also returns the value of `f`.
pub fn value_and_grad<F>(f: F, argnums: &[usize]) -> ValueAndGrad
where
    F: Fn(&[Array]) -> Result<Vec<Array>> + Send + Sync + 'static,
{
    ValueAndGrad { inner: Arc::new(GradInner { f: Box::new(f), argnums: argnums.to_vec() }) }
}

impl Grad {
    /// The gradients with respect to the inputs `argnums` names, in its order.
    pub fn call(&self, inputs: &[Array]) -> Result<Vec<Array>> {
        Ok(self.inner.run("grad", inputs)?.1)
    }
}

impl ValueAndGrad {
    /// The value of the function (0-d) and its gradients with respect to the inputs
    /// `argnums` names.
    pub fn call(&self, inputs: &[Array]) -> Result<(Array, Vec<Array>)> {
        self.inner.run("value_and_grad", inputs)
    }
}

/// `x` unchanged, but a constant for the transforms: no derivative flows through it
/// (a zero-copy view).
pub fn stop_gradient(x: &Array) -> Result<Array> {
    let stream = target_stream(&[x])?;
    let input = on_device(x, &stream);
    Ok(Array::from_op(Primitive::StopGradient, vec![input], x.shape().to_vec(), x.dtype(), stream))
}

/// A function whose intermediate values the backward pass recomputes instead of keeping,
/// made by [`checkpoint`]. Cheap to clone; `Send + Sync`; callable from any thread or task
/// at once.
#[derive(Clone)]
pub struct Checkpoint {
    f: Arc<Func<'static>>,
}

impl std::fmt::Debug for Checkpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Checkpoint({:p})", Arc::as_ptr(&self.f))
    }
}

/// `f` as a checkpointed function: called inside a function that [`vjp`], [`grad`] or
/// [`value_and_grad`] differentiates, its outputs are computed as usual, but the reverse
/// pass keeps none of its intermediate values. It keeps the inputs and recomputes `f` from
/// them when the cotangent of an output reaches it: memory traded for a second forward
/// pass over `f`. The recomputation waits for that cotangent, so it does not run
/// alongside the forward pass. Outside the transforms, `call` is `f` (each float output
/// is passed through a zero-copy view). Forward mode ([`jvp`]) keeps no intermediate
/// values anyway and does not recompute.
///
/// Each float output recomputes `f` on its own when its cotangent arrives; a function
/// with several outputs that all get cotangents is run once per output in the backward
/// pass. Integer and bool outputs pass through unchanged. `f` must be a pure function of
/// its inputs (the same inputs give the same outputs), as with [`compile`](crate::compile()).
pub fn checkpoint<F>(f: F) -> Checkpoint
where
    F: Fn(&[Array]) -> Result<Vec<Array>> + Send + Sync + 'static,
{
    Checkpoint { f: Arc::new(f) }
}

impl Checkpoint {
    /// `f(inputs)`, marked so that the reverse pass recomputes `f` instead of keeping its
    /// intermediate values. Errors: those of `f`.
    pub fn call(&self, inputs: &[Array]) -> Result<Vec<Array>> {
        let outs = (self.f)(inputs)?;
        outs.into_iter()
            .enumerate()
            .map(|(k, o)| {
                if !o.dtype().is_float() {
                    return Ok(o);
                }
                let mut ins = inputs.to_vec();
                let (shape, dtype) = (o.shape().to_vec(), o.dtype());
                ins.push(o);
                record(Primitive::Checkpoint { body: self.clone(), output: k }, ins, &shape, dtype)
            })
            .collect()
    }

    /// Whether two checkpoints wrap the same function (one `checkpoint` call and its clones).
    pub(crate) fn same_function(&self, other: &Checkpoint) -> bool {
        Arc::ptr_eq(&self.f, &other.f)
    }
}

/// The reverse rules of `Depend` (the cotangent goes to input 0 only) and `Checkpoint`:
/// the function recomputed from its inputs, each made to wait for the cotangent, and
/// differentiated there; the forward pass's value of the output gets no cotangent, so
/// nothing of the forward graph inside the checkpoint is read by the reverse pass.
pub(crate) fn checkpoint_vjp(p: &Primitive, g: &Vjp<'_>) -> Result<Vec<Option<Array>>> {
    let ct = g.cotangent;
    match p {
        Primitive::Depend => {
            let mut out = vec![None; g.inputs.len()];
            out[0] = Some(ct.clone());
            Ok(out)
        }
        Primitive::Checkpoint { body, output } => {
            let n = g.inputs.len() - 1;
            let gated = g.inputs[..n]
                .iter()
                .map(|x| record(Primitive::Depend, vec![x.clone(), ct.clone()], x.shape(), x.dtype()))
                .collect::<Result<Vec<_>>>()?;
            let (body, k) = (body.clone(), *output);
            let one = move |x: &[Array]| -> Result<Vec<Array>> {
                let o = (body.f)(x)?.into_iter().nth(k).ok_or_else(|| {
                    Error::invalid("checkpoint", format!("the recomputed function has no output {k}"))
                })?;
                Ok(vec![o])
            };
            let mut cts = vjp_of(&one, &gated, ct)?;
            cts.push(None);
            Ok(cts)
        }
        other => Err(crate::primitives::grad::no_rule(other.name(), "vjp")),
    }
}

/// The forward rules of `Depend` and `Checkpoint`: the tangent of input 0, and of the
/// forward pass's output (its graph is in the traced function, so forward mode already
/// carried a tangent through it).
pub(crate) fn checkpoint_jvp(p: &Primitive, g: &Jvp<'_>) -> Result<Option<Array>> {
    match p {
        Primitive::Depend => Ok(g.tangents[0].clone()),
        Primitive::Checkpoint { .. } => Ok(g.tangents.last().cloned().flatten()),
        other => Err(crate::primitives::grad::no_rule(other.name(), "jvp")),
    }
}
