//! Tape simplification: common-subexpression elimination (which also merges identical
//! `Full` constants) and dead-node removal.

use std::collections::HashMap;
use std::sync::Arc;

use crate::compile::trace::{Ref, Tape, TapeNode};
use crate::dtype::DType;
use crate::primitives::Primitive;

/// True when two primitives compute the same function of the same inputs (parameters
/// compared structurally, floats by bits). Host callbacks and constants are never
/// merged. The match on `a` names every primitive, so a new one is not merged (or
/// merged) by accident: it does not compile until it is given a rule here.
pub fn same_op(a: &Primitive, b: &Primitive) -> bool {
    use Primitive::*;
    match a {
        // Constants are data, not a function of inputs; host callbacks may have effects.
        Constant | Host { .. } => false,
        Full { value: x } => matches!(b, Full { value: y } if x.to_bits() == y.to_bits()),
        Arange { start: s1, step: t1 } => {
            matches!(b, Arange { start: s2, step: t2 } if s1.to_bits() == s2.to_bits() && t1.to_bits() == t2.to_bits())
        }
        Eye { k: x } => matches!(b, Eye { k: y } if x == y),
        Random { key: k1, dist: d1 } => matches!(b, Random { key: k2, dist: d2 } if k1 == k2 && d1 == d2),
        Cast => matches!(b, Cast),
        Where => matches!(b, Where),
        Matmul => matches!(b, Matmul),
        Attention { scale: s1, mask: m1 } => matches!(
            b,
            Attention { scale: s2, mask: m2 } if s1.map(f64::to_bits) == s2.map(f64::to_bits) && m1 == m2
        ),
        AttentionGrad { scale: s1, causal: c1, part: p1 } => matches!(
            b,
            AttentionGrad { scale: s2, causal: c2, part: p2 } if s1.to_bits() == s2.to_bits() && c1 == c2 && p1 == p2
        ),
        QuantMatmul { format: f } => matches!(b, QuantMatmul { format: g } if f == g),
        Dequantize { format: f } => matches!(b, Dequantize { format: g } if f == g),
        Rope { dims: d1, base: b1, scale: s1, layout: l1 } => matches!(
            b,
            Rope { dims: d2, base: b2, scale: s2, layout: l2 }
                if d1 == d2 && b1.to_bits() == b2.to_bits() && s1.to_bits() == s2.to_bits() && l1 == l2
        ),
        SliceUpdate { axis: a1 } => matches!(b, SliceUpdate { axis: a2 } if a1 == a2),
        Reshape => matches!(b, Reshape),
        BroadcastTo => matches!(b, BroadcastTo),
        Contiguous => matches!(b, Contiguous),
        StopGradient => matches!(b, StopGradient),
        Depend => matches!(b, Depend),
        Checkpoint { body: f, output: k } => {
            matches!(b, Checkpoint { body: g, output: j } if f.same_function(g) && k == j)
        }
        ToDevice => matches!(b, ToDevice),
        Unary(x) => matches!(b, Unary(y) if x == y),
        Binary(x) => matches!(b, Binary(y) if x == y),
        Reduce { op: o1, axes: a1 } => matches!(b, Reduce { op: o2, axes: a2 } if o1 == o2 && a1 == a2),
        ArgReduce { op: o1, axis: a1 } => matches!(b, ArgReduce { op: o2, axis: a2 } if o1 == o2 && a1 == a2),
        Softmax { axis: a1, log: l1 } => matches!(b, Softmax { axis: a2, log: l2 } if a1 == a2 && l1 == l2),
        LayerNorm { eps: e1, has_weight: w1, has_bias: b1 } => matches!(
            b,
            LayerNorm { eps: e2, has_weight: w2, has_bias: b2 } if e1.to_bits() == e2.to_bits() && w1 == w2 && b1 == b2
        ),
        RmsNorm { eps: e1, has_weight: w1 } => {
            matches!(b, RmsNorm { eps: e2, has_weight: w2 } if e1.to_bits() == e2.to_bits() && w1 == w2)
        }
        Cumsum { axis: a1, reverse: r1, exclusive: x1 } => {
            matches!(b, Cumsum { axis: a2, reverse: r2, exclusive: x2 } if a1 == a2 && r1 == r2 && x1 == x2)
        }
        Sort(x) => matches!(b, Sort(y) if x == y),
        Permute(p) => matches!(b, Permute(q) if p == q),
        Slice { start: s1, step: t1 } => matches!(b, Slice { start: s2, step: t2 } if s1 == s2 && t1 == t2),
        Take { axis: a1 } => matches!(b, Take { axis: a2 } if a1 == a2),
        ScatterAdd { axis: a1 } => matches!(b, ScatterAdd { axis: a2 } if a1 == a2),
        TakeAlongAxis { axis: a1 } => matches!(b, TakeAlongAxis { axis: a2 } if a1 == a2),
        PutAlongAxis { axis: a1, accumulate: c1 } => {
            matches!(b, PutAlongAxis { axis: a2, accumulate: c2 } if a1 == a2 && c1 == c2)
        }
        Concatenate { axis: a1 } => matches!(b, Concatenate { axis: a2 } if a1 == a2),
        Pad { widths: w1, value: v1 } => {
            matches!(b, Pad { widths: w2, value: v2 } if w1 == w2 && v1.to_bits() == v2.to_bits())
        }
        Placeholder { index: i } => matches!(b, Placeholder { index: j } if i == j),
        Fused(p) => matches!(b, Fused(q) if Arc::ptr_eq(p, q) || **p == **q),
        FusedReduce { program: p, op: o1, axes: a1 } => matches!(
            b,
            FusedReduce { program: q, op: o2, axes: a2 } if (Arc::ptr_eq(p, q) || **p == **q) && o1 == o2 && a1 == a2
        ),
        Block(p) => matches!(b, Block(q) if Arc::ptr_eq(p, q) || **p == **q),
    }
}

/// Merges nodes that compute the same op of the same inputs on the same stream (this
/// deduplicates equal `Full` scalars too), then drops nodes no output needs.
pub(crate) fn simplify(tape: &mut Tape) {
    cse(tape);
    dce(tape);
}

type Key = (&'static str, Vec<Ref>, Vec<usize>, DType);

fn cse(tape: &mut Tape) {
    let mut remap: Vec<Ref> = Vec::with_capacity(tape.nodes.len());
    let mut buckets: HashMap<Key, Vec<usize>> = HashMap::new();
    let fix = |r: Ref, remap: &[Ref]| match r {
        Ref::Node(i) => remap[i],
        r => r,
    };
    for i in 0..tape.nodes.len() {
        let inputs: Vec<Ref> = tape.nodes[i].inputs.iter().map(|&r| fix(r, &remap)).collect();
        tape.nodes[i].inputs = inputs.clone();
        if let Some(rule) = &mut tape.nodes[i].rule {
            rule.map_refs(|r| fix(r, &remap));
        }
        let n = &tape.nodes[i];
        let key = (n.prim.name(), inputs, n.shape.clone(), n.dtype);
        let bucket = buckets.entry(key).or_default();
        // A count fill is not the literal of the same value: only one is recomputed.
        let same = |m: &TapeNode| same_op(&m.prim, &n.prim) && m.stream == n.stream && m.rule == n.rule;
        match bucket.iter().find(|&&j| same(&tape.nodes[j])) {
            Some(&j) => remap.push(Ref::Node(j)),
            None => {
                bucket.push(i);
                remap.push(Ref::Node(i));
            }
        }
    }
    for o in tape.outputs.iter_mut() {
        *o = fix(*o, &remap);
    }
}

/// Which nodes and captured constants an output reaches (through inputs and the refs of
/// shape rules): (nodes, constants).
pub(crate) fn live(tape: &Tape) -> (Vec<bool>, Vec<bool>) {
    let mut live = vec![false; tape.nodes.len()];
    let mut live_const = vec![false; tape.consts.len()];
    let mark = |r: &Ref, live: &mut Vec<bool>, live_const: &mut Vec<bool>| match *r {
        Ref::Node(i) => live[i] = true,
        Ref::Const(i) => live_const[i] = true,
        Ref::Input(_) => {}
    };
    for o in &tape.outputs {
        mark(o, &mut live, &mut live_const);
    }
    for i in (0..tape.nodes.len()).rev() {
        if live[i] {
            let node = &tape.nodes[i];
            for r in node.inputs.iter().copied().chain(node.rule.iter().flat_map(|r| r.refs())) {
                mark(&r, &mut live, &mut live_const);
            }
        }
    }
    (live, live_const)
}

/// Removes nodes no output reaches, and captured constants nothing reads. A node whose
/// shape a live node's rule reads stays.
pub(crate) fn dce(tape: &mut Tape) {
    let n = tape.nodes.len();
    let (live, live_const) = live(tape);
    let mut node_map = vec![usize::MAX; n];
    let mut const_map = vec![usize::MAX; tape.consts.len()];
    let mut consts = Vec::new();
    for (i, c) in std::mem::take(&mut tape.consts).into_iter().enumerate() {
        if live_const[i] {
            const_map[i] = consts.len();
            consts.push(c);
        }
    }
    let fix = |r: Ref, node_map: &[usize]| match r {
        Ref::Node(i) => Ref::Node(node_map[i]),
        Ref::Const(i) => Ref::Const(const_map[i]),
        r => r,
    };
    let mut nodes = Vec::with_capacity(n);
    for (i, mut node) in std::mem::take(&mut tape.nodes).into_iter().enumerate() {
        if live[i] {
            node.inputs = node.inputs.iter().map(|&r| fix(r, &node_map)).collect();
            if let Some(rule) = &mut node.rule {
                rule.map_refs(|r| fix(r, &node_map));
            }
            node_map[i] = nodes.len();
            nodes.push(node);
        }
    }
    tape.nodes = nodes;
    tape.consts = consts;
    tape.outputs = tape.outputs.iter().map(|&r| fix(r, &node_map)).collect();
}
