//! Tracing: run the function once on placeholder arrays and record the graph it built
//! as a tape, then replay the tape on real inputs.

use std::collections::HashMap;
use std::panic::{AssertUnwindSafe, catch_unwind};

use crate::array::{Array, Status};
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::primitives::Primitive;
use crate::runtime::scope::with_stream;
use crate::runtime::stream::Stream;

/// Where a tape node reads one input from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum Ref {
    /// Input `i` of the compiled function.
    Input(usize),
    /// An earlier tape node.
    Node(usize),
    /// A captured array (`Tape::consts[i]`).
    Const(usize),
}

/// One recorded op.
#[derive(Clone)]
pub(crate) struct TapeNode {
    pub prim: Primitive,
    pub inputs: Vec<Ref>,
    pub shape: Vec<usize>,
    pub dtype: DType,
    /// `None`: the stream the call resolves (the one traced on); `Some`: a fixed stream
    /// the function chose explicitly.
    pub stream: Option<Stream>,
}

/// A traced function: its ops in topological order.
#[derive(Clone)]
pub(crate) struct Tape {
    pub input_shapes: Vec<Vec<usize>>,
    pub input_dtypes: Vec<DType>,
    pub nodes: Vec<TapeNode>,
    pub consts: Vec<Array>,
    pub outputs: Vec<Ref>,
}

/// The function type every compiled function is stored as.
pub(crate) type TraceFn = dyn Fn(&[Array], &[i64]) -> Result<Vec<Array>> + Send + Sync;

/// Runs `f` on placeholders shaped like `inputs`, with every op it records targeting
/// `stream`, and records the result.
pub(crate) fn trace(
    f: &TraceFn,
    shapes: &[Vec<usize>],
    dtypes: &[DType],
    statics: &[i64],
    stream: &Stream,
) -> Result<Tape> {
    let placeholders: Vec<Array> = shapes
        .iter()
        .zip(dtypes)
        .enumerate()
        .map(|(index, (s, &d))| {
            Array::from_op(Primitive::Placeholder { index }, Vec::new(), s.clone(), d, stream.clone())
        })
        .collect();
    let outputs = match with_stream(stream, || catch_unwind(AssertUnwindSafe(|| f(&placeholders, statics)))) {
        Ok(Ok(outs)) => outs,
        Ok(Err(e)) => return Err(e),
        Err(p) => return Err(Error::Panic { op: "compile", msg: crate::error::panic_message(&*p).into() }),
    };
    let ids: HashMap<u64, usize> = placeholders.iter().enumerate().map(|(i, p)| (p.id(), i)).collect();
    let mut rec = Recorder {
        placeholders: ids,
        stream,
        seen: HashMap::new(),
        tape_full: HashMap::new(),
        nodes: vec![],
        consts: vec![],
        const_ids: HashMap::new(),
    };
    let mut out_refs = Vec::with_capacity(outputs.len());
    for o in &outputs {
        out_refs.push(rec.record(o)?);
    }
    Ok(Tape {
        input_shapes: shapes.to_vec(),
        input_dtypes: dtypes.to_vec(),
        nodes: rec.nodes,
        consts: rec.consts,
        outputs: out_refs,
    })
}

struct Recorder<'a> {
    placeholders: HashMap<u64, usize>,
    stream: &'a Stream,
    /// Node id → its ref when it depends on a placeholder, `None` when it does not.
    seen: HashMap<u64, Option<Ref>>,
    tape_full: HashMap<u64, usize>,
    nodes: Vec<TapeNode>,
    consts: Vec<Array>,
    const_ids: HashMap<u64, usize>,
}

impl Recorder<'_> {
    /// The inputs of a node still in the graph; errors for nodes that evaluating a
    /// placeholder has failed.
    fn inputs_of(&self, a: &Array) -> Result<Vec<Array>> {
        if self.placeholders.contains_key(&a.id()) {
            return Ok(Vec::new());
        }
        if a.primitive().is_placeholder() {
            return Err(Error::invalid(
                "compile",
                "the traced function used a placeholder of another trace (an array captured from a \
                 different compiled call's tracing)",
            ));
        }
        if let Some(Err(Error::InvalidArgument { op: "placeholder", .. })) = a.node.result.get() {
            return Err(Error::invalid(
                "compile",
                format!(
                    "the traced function evaluated an array ({}, shape {:?}) that depends on its inputs; \
                     compiled functions must stay lazy while tracing",
                    a.primitive().name(),
                    a.shape()
                ),
            ));
        }
        let g = a.node.state.lock();
        match g.status {
            Status::Done => Ok(Vec::new()),
            Status::Pending | Status::Scheduled => Ok(g.inputs.to_vec()),
        }
    }

    /// The ref of an array that does not depend on any placeholder: a tape `Full` node
    /// for lazy fills and for 0-d fills even when evaluated (so fusion can inline them;
    /// the op layer records scalar operands evaluated when that costs nothing), else a
    /// captured constant.
    fn capture(&mut self, a: &Array) -> Ref {
        if let Primitive::Full { .. } = a.primitive() {
            if !a.is_evaluated() || a.shape().is_empty() {
                if let Some(&i) = self.tape_full.get(&a.id()) {
                    return Ref::Node(i);
                }
                self.nodes.push(self.node_of(a, Vec::new()));
                self.tape_full.insert(a.id(), self.nodes.len() - 1);
                return Ref::Node(self.nodes.len() - 1);
            }
        }
        let n = self.consts.len();
        let i = *self.const_ids.entry(a.id()).or_insert(n);
        if i == n {
            self.consts.push(a.clone());
        }
        Ref::Const(i)
    }

    fn node_of(&self, a: &Array, inputs: Vec<Ref>) -> TapeNode {
        let s = a.stream();
        TapeNode {
            prim: a.primitive().clone(),
            inputs,
            shape: a.shape().to_vec(),
            dtype: a.dtype(),
            stream: if &s == self.stream { None } else { Some(s) },
        }
    }

    /// Records `out` and everything it needs (iterative post-order walk).
    fn record(&mut self, out: &Array) -> Result<Ref> {
        let mut stack: Vec<(Array, Vec<Array>, usize)> = Vec::new();
        if !self.seen.contains_key(&out.id()) {
            let ins = self.inputs_of(out)?;
            stack.push((out.clone(), ins, 0));
        }
        while let Some(top) = stack.last_mut() {
            if top.2 < top.1.len() {
                let child = top.1[top.2].clone();
                top.2 += 1;
                if !self.seen.contains_key(&child.id()) {
                    let ins = self.inputs_of(&child)?;
                    stack.push((child, ins, 0));
                }
                continue;
            }
            let Some((a, ins, _)) = stack.pop() else { break };
            let r = if let Some(&i) = self.placeholders.get(&a.id()) {
                Some(Ref::Input(i))
            } else if ins.iter().any(|c| matches!(self.seen.get(&c.id()), Some(Some(_)))) {
                let mut refs = Vec::with_capacity(ins.len());
                for c in &ins {
                    let r = match self.seen.get(&c.id()).copied().flatten() {
                        Some(r) => r,
                        None => self.capture(c),
                    };
                    refs.push(r);
                }
                self.nodes.push(self.node_of(&a, refs));
                Some(Ref::Node(self.nodes.len() - 1))
            } else {
                None
            };
            self.seen.insert(a.id(), r);
        }
        Ok(match self.seen.get(&out.id()).copied().flatten() {
            Some(r) => r,
            None => self.capture(out),
        })
    }
}

/// Replays a tape on `inputs` (already on `stream`'s device, with the traced dtypes),
/// recording one lazy node per tape node on `stream`. `shapes` gives each node's shape
/// (the traced ones, or re-derived ones in shapeless mode).
pub(crate) fn replay(tape: &Tape, inputs: &[Array], shapes: Option<&[Vec<usize>]>, stream: &Stream) -> Vec<Array> {
    let mut vals: Vec<Array> = Vec::with_capacity(tape.nodes.len());
    let get = |vals: &Vec<Array>, r: &Ref| match *r {
        Ref::Input(i) => inputs[i].clone(),
        Ref::Node(i) => vals[i].clone(),
        Ref::Const(i) => tape.consts[i].clone(),
    };
    for (i, n) in tape.nodes.iter().enumerate() {
        let ins: Vec<Array> = n.inputs.iter().map(|r| get(&vals, r)).collect();
        let shape = shapes.map(|s| s[i].clone()).unwrap_or_else(|| n.shape.clone());
        let s = n.stream.clone().unwrap_or_else(|| stream.clone());
        vals.push(Array::from_op(n.prim.clone(), ins, shape, n.dtype, s));
    }
    tape.outputs.iter().map(|r| get(&vals, r)).collect()
}
