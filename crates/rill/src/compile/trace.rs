//! Tracing: run the function once on placeholder arrays and record the graph it built
//! as a tape, then replay the tape on real inputs.
//!
//! A shapeless trace also records the shape rules the ops noted (see `rules`): a node
//! computed from shapes keeps its rule, and an array that does not depend on the inputs but
//! whose shape follows from one that does (a captured matmul operand broadcast to the
//! inputs' batch shape) becomes a tape node instead of a captured constant.

use std::collections::HashMap;
use std::panic::{AssertUnwindSafe, catch_unwind};

use crate::array::{Array, Status};
use crate::compile::rules::{self, Note, Rule, ShapeOf};
use crate::compile::shapes::Plan;
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
    /// How the node follows from shapes, for shapeless replay (shapeless traces only).
    pub rule: Option<Rule>,
}

/// A traced function: its ops in topological order.
#[derive(Clone)]
pub(crate) struct Tape {
    pub input_shapes: Vec<Vec<usize>>,
    pub input_dtypes: Vec<DType>,
    pub nodes: Vec<TapeNode>,
    pub consts: Vec<Array>,
    pub outputs: Vec<Ref>,
    /// A shape rule could not be resolved: the tape is replayed on its traced shapes only.
    pub shape_specific: bool,
}

/// The function type every compiled function is stored as.
pub(crate) type TraceFn = dyn Fn(&[Array], &[i64]) -> Result<Vec<Array>> + Send + Sync;
/// [`TraceFn`] borrowed for `'a` (the autodiff transforms trace functions that are not
/// `'static`).
pub(crate) type TraceFnOf<'a> = dyn Fn(&[Array], &[i64]) -> Result<Vec<Array>> + Send + Sync + 'a;

/// Runs `f` on placeholders shaped like `inputs`, with every op it records targeting
/// `stream`, and records the result; `shapeless` also records shape rules.
pub(crate) fn trace(
    f: &TraceFnOf<'_>,
    shapes: &[Vec<usize>],
    dtypes: &[DType],
    statics: &[i64],
    stream: &Stream,
    shapeless: bool,
) -> Result<Tape> {
    // Ops note shape rules while this lives (until the graph is recorded).
    let _tracing = shapeless.then(rules::Tracing::begin);
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
        rules: shapeless,
        notes: Vec::new(),
        opaque: false,
    };
    let mut out_refs = Vec::with_capacity(outputs.len());
    for o in &outputs {
        out_refs.push(rec.record(o)?);
    }
    let shape_specific = rec.resolve_rules();
    let mut tape = Tape {
        input_shapes: shapes.to_vec(),
        input_dtypes: dtypes.to_vec(),
        nodes: rec.nodes,
        consts: rec.consts,
        outputs: out_refs,
        shape_specific,
    };
    order_reads(&mut tape);
    Ok(tape)
}

/// Reorders the nodes so that a node comes after every node whose shape its rule reads,
/// as it comes after its inputs (a matmul operand's broadcast reads the other operand,
/// which the walk may record later).
pub(crate) fn order_reads(tape: &mut Tape) {
    let before = |i: usize| -> Vec<usize> {
        let n = &tape.nodes[i];
        let reads = n.inputs.iter().copied().chain(n.rule.iter().flat_map(|r| r.refs()));
        reads.filter_map(|r| if let Ref::Node(j) = r { Some(j) } else { None }).collect()
    };
    if !(0..tape.nodes.len()).any(|i| before(i).iter().any(|&j| j > i)) {
        return;
    }
    // Iterative depth-first post-order over inputs and rule reads.
    let n = tape.nodes.len();
    let (mut placed, mut order) = (vec![false; n], Vec::with_capacity(n));
    for root in 0..n {
        let mut stack = vec![(root, false)];
        while let Some((i, expanded)) = stack.pop() {
            if placed[i] {
                continue;
            }
            if expanded {
                placed[i] = true;
                order.push(i);
            } else {
                stack.push((i, true));
                stack.extend(before(i).into_iter().filter(|&j| !placed[j]).map(|j| (j, false)));
            }
        }
    }
    let mut new_index = vec![0; n];
    for (k, &i) in order.iter().enumerate() {
        new_index[i] = k;
    }
    let fix = |r: Ref| if let Ref::Node(i) = r { Ref::Node(new_index[i]) } else { r };
    let mut old: Vec<Option<TapeNode>> = std::mem::take(&mut tape.nodes).into_iter().map(Some).collect();
    for &i in &order {
        let mut node = old[i].take().expect("each node is placed once");
        node.inputs = node.inputs.iter().map(|&r| fix(r)).collect();
        if let Some(rule) = &mut node.rule {
            rule.map_refs(fix);
        }
        tape.nodes.push(node);
    }
    tape.outputs = tape.outputs.iter().map(|&r| fix(r)).collect();
}

struct Recorder<'a> {
    placeholders: HashMap<u64, usize>,
    stream: &'a Stream,
    /// Node id → its ref when it depends on a placeholder, `None` when it does not.
    seen: HashMap<u64, Option<Ref>>,
    /// Arrays not depending on a placeholder that became tape nodes (fills, and views whose
    /// shape rule reads a node that does), by id.
    tape_full: HashMap<u64, usize>,
    nodes: Vec<TapeNode>,
    consts: Vec<Array>,
    const_ids: HashMap<u64, usize>,
    /// Record shape rules (a shapeless trace).
    rules: bool,
    /// Tape nodes with a note, resolved into rules once every node is recorded (a note may
    /// name a node recorded after it).
    notes: Vec<(usize, Note)>,
    /// The graph holds a node a compiled function's replay made (see `Note::Opaque`).
    opaque: bool,
}

impl Recorder<'_> {
    /// The primitive and inputs of a node still in the graph, read together under its
    /// lock (fusion at eval on another thread rewrites both under it); errors for nodes
    /// that evaluating a placeholder has failed.
    fn inputs_of(&self, a: &Array) -> Result<(Primitive, Vec<Array>)> {
        if self.placeholders.contains_key(&a.id()) {
            return Ok((a.primitive().clone(), Vec::new()));
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
        let prim = a.primitive().clone();
        match g.status {
            Status::Done => Ok((prim, Vec::new())),
            Status::Pending | Status::Scheduled => Ok((prim, g.inputs.to_vec())),
        }
    }

    /// The ref of an array that does not depend on any placeholder: a tape `Full` node
    /// for lazy fills and for 0-d fills even when evaluated (so fusion can inline them;
    /// the op layer records scalar operands evaluated when that costs nothing), else a
    /// captured constant.
    fn capture(&mut self, a: &Array) -> Ref {
        if let Some(&i) = self.tape_full.get(&a.id()) {
            return Ref::Node(i);
        }
        if self.rules && matches!(rules::noted(a.id()), Some(Note::Opaque)) {
            // A replayed fill may be a count of the inner trace's shapes.
            self.opaque = true;
        }
        if let Some(r) = self.capture_ruled(a) {
            return r;
        }
        if let Primitive::Full { .. } = a.primitive()
            && (!a.is_evaluated() || a.shape().is_empty())
        {
            // A fill is never rewritten by fusion: its primitive is its own.
            self.nodes.push(self.node_of(a, a.primitive().clone(), Vec::new()));
            self.tape_full.insert(a.id(), self.nodes.len() - 1);
            return Ref::Node(self.nodes.len() - 1);
        }
        let n = self.consts.len();
        let i = *self.const_ids.entry(a.id()).or_insert(n);
        if i == n {
            self.consts.push(a.clone());
        }
        Ref::Const(i)
    }

    /// A tape node for an array that does not depend on a placeholder but has a note
    /// reading the shape of one that does (a count of a reduction of the inputs, a captured
    /// matmul operand broadcast to the inputs' batch shape); `None` for other arrays.
    fn capture_ruled(&mut self, a: &Array) -> Option<Ref> {
        if !self.rules {
            return None;
        }
        let note = rules::noted(a.id())?;
        let reads = match &note {
            Note::Count { reduce, .. } => *reduce,
            Note::Batch { other, .. } => *other,
            Note::Squeeze(_) | Note::Expand(_) | Note::Opaque => return None,
        };
        if !matches!(self.seen.get(&reads), Some(Some(_))) {
            return None;
        }
        let (prim, ins) = if a.primitive().is_source() {
            (a.primitive().clone(), Vec::new())
        } else {
            // An evaluated view has dropped its input: it stays a constant of its traced
            // shape, which the matmul's own shape rule then only accepts unchanged.
            let (prim, ins) = self.inputs_of(a).ok()?;
            if ins.is_empty() {
                return None;
            }
            (prim, ins)
        };
        let refs: Vec<Ref> = ins.iter().map(|c| self.capture(c)).collect();
        let node = self.node_of(a, prim, refs);
        self.nodes.push(node);
        let i = self.nodes.len() - 1;
        self.tape_full.insert(a.id(), i);
        self.notes.push((i, note));
        Some(Ref::Node(i))
    }

    fn node_of(&self, a: &Array, prim: Primitive, inputs: Vec<Ref>) -> TapeNode {
        let s = a.stream();
        TapeNode {
            prim,
            inputs,
            shape: a.shape().to_vec(),
            dtype: a.dtype(),
            stream: if &s == self.stream { None } else { Some(s) },
            rule: None,
        }
    }

    /// Turns the notes of recorded nodes into rules (refs or fixed shapes); returns true
    /// when one cannot be resolved (the tape is then shape-specific).
    fn resolve_rules(&mut self) -> bool {
        let mut unresolved = self.opaque;
        for (i, note) in std::mem::take(&mut self.notes) {
            let seen = |id: u64| self.seen.get(&id).cloned();
            let rule = match note {
                Note::Count { reduce, ddof } => match seen(reduce) {
                    Some(Some(r)) => Some(Rule::Count { reduce: r, ddof }),
                    _ => None,
                },
                Note::Squeeze(axes) => Some(Rule::Squeeze(axes)),
                Note::Expand(axes) => Some(Rule::Expand(axes)),
                Note::Batch { other, shape, left } => match seen(other) {
                    Some(Some(r)) => Some(Rule::Batch { other: ShapeOf::Ref(r), left }),
                    Some(None) => Some(Rule::Batch { other: ShapeOf::Fixed(shape), left }),
                    None => None,
                },
                Note::Opaque => None,
            };
            unresolved |= rule.is_none();
            self.nodes[i].rule = rule;
        }
        unresolved
    }

    /// Records `out` and everything it needs (iterative post-order walk).
    fn record(&mut self, out: &Array) -> Result<Ref> {
        let mut stack: Vec<(Array, Primitive, Vec<Array>, usize)> = Vec::new();
        if !self.seen.contains_key(&out.id()) {
            let (prim, ins) = self.inputs_of(out)?;
            stack.push((out.clone(), prim, ins, 0));
        }
        while let Some(top) = stack.last_mut() {
            if top.3 < top.2.len() {
                let child = top.2[top.3].clone();
                top.3 += 1;
                if !self.seen.contains_key(&child.id()) {
                    let (prim, ins) = self.inputs_of(&child)?;
                    stack.push((child, prim, ins, 0));
                }
                continue;
            }
            let Some((a, prim, ins, _)) = stack.pop() else { break };
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
                self.nodes.push(self.node_of(&a, prim, refs));
                let i = self.nodes.len() - 1;
                match self.rules.then(|| rules::noted(a.id())).flatten() {
                    Some(Note::Opaque) => self.opaque = true,
                    Some(note) => self.notes.push((i, note)),
                    None => {}
                }
                Some(Ref::Node(i))
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
/// recording one lazy node per tape node on `stream`. `plan` gives each node's shape and
/// the values of count fills re-derived for new shapes (shapeless mode); without it the
/// traced ones are used.
pub(crate) fn replay(tape: &Tape, inputs: &[Array], plan: Option<&Plan>, stream: &Stream) -> Vec<Array> {
    let mut vals: Vec<Array> = Vec::with_capacity(tape.nodes.len());
    // Called from a function being traced shapeless: its tape must not replay these nodes.
    let opaque = rules::tracing();
    let get = |vals: &Vec<Array>, r: &Ref| match *r {
        Ref::Input(i) => inputs[i].clone(),
        Ref::Node(i) => vals[i].clone(),
        Ref::Const(i) => tape.consts[i].clone(),
    };
    for (i, n) in tape.nodes.iter().enumerate() {
        let ins: Vec<Array> = n.inputs.iter().map(|r| get(&vals, r)).collect();
        let shape = plan.map(|p| p.shapes[i].clone()).unwrap_or_else(|| n.shape.clone());
        let prim = match plan.and_then(|p| p.values[i]) {
            Some(value) => Primitive::Full { value },
            None => n.prim.clone(),
        };
        let s = n.stream.clone().unwrap_or_else(|| stream.clone());
        let a = Array::from_op(prim, ins, shape, n.dtype, s);
        if opaque {
            rules::note(&a, Note::Opaque);
        }
        vals.push(a);
    }
    tape.outputs.iter().map(|r| get(&vals, r)).collect()
}
