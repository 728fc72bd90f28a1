//! Shape re-derivation for shapeless replay.
//!
//! [`derive`] recomputes a node's shape from its inputs' shapes, for the primitives whose
//! output shape is a function of their input shapes and parameters and for the nodes
//! with a shape rule (see `rules`: count fills, reshapes that remove or insert axes of
//! size 1, matmul broadcasts). The others (fills of a fixed shape other than 0-d,
//! `arange`, `eye`, random, other reshapes and broadcasts, slices, pads, gathers,
//! concatenations, host callbacks) make a tape shape-specific: `compile_shapeless` then
//! falls back to tracing per shape. The match names every primitive, so a new one does
//! not compile until it is given a rule here.
//!
//! For new shapes, [`plan`] gives every node's shape and every count fill's value, the
//! error the ops would return for those shapes (shapes that do not broadcast, a shape too
//! large), or `None` where the tape does not describe what the ops would build for them
//! (a branch an op took on the traced shapes: a matmul operand that needed no broadcast,
//! a maximum over an axis that was not empty); the call then traces those shapes.

use crate::compile::rules::{Rule, ShapeOf};
use crate::compile::trace::{Ref, Tape, TapeNode};
use crate::error::{Error, Result};
use crate::primitives::{Primitive, ReduceOp};
use crate::shape::{broadcast_shapes, checked_size};

/// Every node's shape, and the value of each count fill, for one set of input shapes.
pub(crate) struct Plan {
    pub shapes: Vec<Vec<usize>>,
    pub values: Vec<Option<f64>>,
}

/// The output shape of `node` for these input shapes (`read` gives the shape a rule
/// reads); `None` when the node's shape is not a function of them, or the tape does not
/// describe the op for them.
fn derive(node: &TapeNode, ins: &[&[usize]], read: &dyn Fn(&ShapeOf) -> Vec<usize>) -> Option<Result<Vec<usize>>> {
    use Primitive::*;
    let first = || ins.first().map(|s| s.to_vec()).unwrap_or_default();
    let prim = &node.prim;
    if let Some(rule) = &node.rule {
        return derive_ruled(prim, rule, first(), read);
    }
    Some(match prim {
        Full { .. } if node.shape.is_empty() => Ok(Vec::new()),
        Constant => Ok(node.shape.clone()),
        Cast | Unary(_) | Contiguous | ToDevice | Softmax { .. } | Cumsum { .. } => Ok(first()),
        LayerNorm { .. } | RmsNorm { .. } => {
            let x = first();
            let last = x.last().copied().unwrap_or(1);
            match ins[1..].iter().find(|w| **w != [last]) {
                Some(w) => Err(Error::shape(
                    prim.name(),
                    format!("weight/bias of shape {w:?} does not match the last axis of input shape {x:?}"),
                )),
                None => Ok(x),
            }
        }
        Binary(_) | Where | Fused(_) => broadcast_all(prim.name(), ins),
        FusedReduce { op, axes, .. } => match broadcast_all(prim.name(), ins) {
            Ok(s) if empty_extremum(*op, &s, axes) => return None,
            s => s.map(|s| keep_reduced(s, axes)),
        },
        Reduce { op, axes } => {
            let x = first();
            if empty_extremum(*op, &x, axes) {
                // `max`/`min` of no elements is an error and `logsumexp` a fill: not this tape.
                return None;
            }
            Ok(keep_reduced(x, axes))
        }
        ArgReduce { axis, .. } => {
            let x = first();
            if x.get(*axis) == Some(&0) {
                return None;
            }
            Ok(keep_reduced(x, &[*axis]))
        }
        Permute(p) => {
            let x = first();
            Ok(p.iter().map(|&i| x.get(i).copied().unwrap_or(1)).collect())
        }
        Matmul => {
            let (a, b) = (ins[0], ins[1]);
            let (ra, rb) = (a.len(), b.len());
            if ra < 2 || rb < 2 || a[..ra - 2] != b[..rb - 2] {
                // Batch shapes the matmul op would have broadcast with a view this tape lacks.
                return None;
            }
            if a[ra - 1] != b[rb - 2] {
                Err(Error::shape("matmul", format!("shapes {a:?} and {b:?} do not multiply")))
            } else {
                let mut s = a[..ra - 1].to_vec();
                s.push(b[rb - 1]);
                Ok(s)
            }
        }
        // Shapes the trace fixed: fills other than 0-d, ranges, eyes, random draws,
        // reshapes and broadcasts without a rule; and shapes made with traced parameters
        // (slices, gathers, concatenations, pads) or by a callback. The tape is
        // shape-specific.
        Full { .. }
        | Arange { .. }
        | Eye { .. }
        | Random { .. }
        | Reshape
        | BroadcastTo
        | Slice { .. }
        | Take { .. }
        | Concatenate { .. }
        | Pad { .. }
        | Host { .. }
        | Placeholder { .. } => return None,
    })
}

/// The shape of a node with a rule, from its input's shape `x`.
fn derive_ruled(
    prim: &Primitive,
    rule: &Rule,
    x: Vec<usize>,
    read: &dyn Fn(&ShapeOf) -> Vec<usize>,
) -> Option<Result<Vec<usize>>> {
    // Each rule is noted for one primitive only; any other pairing is not this tape.
    Some(match rule {
        Rule::Count { .. } => {
            let Primitive::Full { .. } = prim else { return None };
            Ok(Vec::new())
        }
        Rule::Squeeze(axes) => {
            let Primitive::Reshape = prim else { return None };
            match axes.iter().find(|&&a| x.get(a) != Some(&1)) {
                Some(&a) if a < x.len() => {
                    Err(Error::shape("squeeze", format!("cannot squeeze axis {a} of size {} in shape {x:?}", x[a])))
                }
                Some(_) => return None,
                None => Ok(x.iter().enumerate().filter(|(i, _)| !axes.contains(i)).map(|(_, &d)| d).collect()),
            }
        }
        Rule::Expand(axes) => {
            let Primitive::Reshape = prim else { return None };
            let rank = x.len() + axes.len();
            if axes.iter().any(|&a| a >= rank) {
                return None;
            }
            let mut dims = x.into_iter();
            Ok((0..rank).map(|i| if axes.contains(&i) { 1 } else { dims.next().unwrap_or(1) }).collect())
        }
        Rule::Batch { other } => {
            let Primitive::BroadcastTo = prim else { return None };
            let o = read(other);
            let (rx, ro) = (x.len(), o.len());
            if rx < 2 || ro < 2 {
                return None;
            }
            broadcast_shapes("matmul", &x[..rx - 2], &o[..ro - 2]).map(|mut s| {
                s.extend_from_slice(&x[rx - 2..]);
                s
            })
        }
    })
}

/// True for a maximum or minimum over no elements.
fn empty_extremum(op: ReduceOp, shape: &[usize], axes: &[usize]) -> bool {
    let extremum = match op {
        ReduceOp::Max | ReduceOp::Min => true,
        ReduceOp::Sum | ReduceOp::Prod => false,
    };
    extremum && axes.iter().any(|&a| shape.get(a) == Some(&0))
}

/// `shape` with `axes` set to 1.
fn keep_reduced(mut shape: Vec<usize>, axes: &[usize]) -> Vec<usize> {
    for &a in axes {
        if let Some(d) = shape.get_mut(a) {
            *d = 1;
        }
    }
    shape
}

/// The broadcast of all `ins` (`[]` for none).
pub(crate) fn broadcast_all(name: &'static str, ins: &[&[usize]]) -> Result<Vec<usize>> {
    let mut s: Vec<usize> = Vec::new();
    for i in ins {
        s = broadcast_shapes(name, &s, i)?;
    }
    Ok(s)
}

fn ref_shape<'a>(tape: &'a Tape, inputs: &'a [Vec<usize>], shapes: &'a [Vec<usize>], r: Ref) -> &'a [usize] {
    match r {
        Ref::Input(i) => &inputs[i],
        Ref::Node(i) => &shapes[i],
        Ref::Const(i) => tape.consts[i].shape(),
    }
}

/// The value of a count fill: the number of elements its reduction combines, less `ddof`;
/// `None` when the rule does not name a reduction.
fn count(tape: &Tape, inputs: &[Vec<usize>], shapes: &[Vec<usize>], rule: &Rule) -> Option<f64> {
    let Rule::Count { reduce: Ref::Node(j), ddof } = *rule else { return None };
    let red = &tape.nodes[j];
    let ins: Vec<&[usize]> = red.inputs.iter().map(|&r| ref_shape(tape, inputs, shapes, r)).collect();
    // The reduced shape: the input of a `Reduce`, the broadcast of a `FusedReduce`'s inputs.
    let (whole, axes) = match &red.prim {
        Primitive::Reduce { axes, .. } => (ins.first()?.to_vec(), axes),
        Primitive::FusedReduce { axes, .. } => (broadcast_all("fused_reduce", &ins).ok()?, axes),
        // A count rule names a reduction; anything else is not this tape.
        Primitive::Constant
        | Primitive::Full { .. }
        | Primitive::Arange { .. }
        | Primitive::Eye { .. }
        | Primitive::Random { .. }
        | Primitive::Cast
        | Primitive::Unary(_)
        | Primitive::Binary(_)
        | Primitive::Where
        | Primitive::ArgReduce { .. }
        | Primitive::Softmax { .. }
        | Primitive::LayerNorm { .. }
        | Primitive::RmsNorm { .. }
        | Primitive::Cumsum { .. }
        | Primitive::Matmul
        | Primitive::Reshape
        | Primitive::Permute(_)
        | Primitive::BroadcastTo
        | Primitive::Slice { .. }
        | Primitive::Contiguous
        | Primitive::Take { .. }
        | Primitive::Concatenate { .. }
        | Primitive::Pad { .. }
        | Primitive::ToDevice
        | Primitive::Host { .. }
        | Primitive::Placeholder { .. }
        | Primitive::Fused(_) => return None,
    };
    let n = axes.iter().try_fold(1usize, |n, &a| n.checked_mul(*whole.get(a)?))?;
    Some(n.saturating_sub(ddof) as f64)
}

/// Node `i`'s shape and count value given every earlier node's shape.
fn node_plan(
    tape: &Tape,
    inputs: &[Vec<usize>],
    shapes: &[Vec<usize>],
    n: &TapeNode,
) -> Option<Result<(Vec<usize>, Option<f64>)>> {
    let ins: Vec<&[usize]> = n.inputs.iter().map(|&r| ref_shape(tape, inputs, shapes, r)).collect();
    let read = |s: &ShapeOf| match s {
        ShapeOf::Ref(r) => ref_shape(tape, inputs, shapes, *r).to_vec(),
        ShapeOf::Fixed(s) => s.clone(),
    };
    let shape = match derive(n, &ins, &read)? {
        Ok(s) => s,
        Err(e) => return Some(Err(e)),
    };
    let value = match &n.rule {
        Some(r @ Rule::Count { .. }) => Some(count(tape, inputs, shapes, r)?),
        _ => None,
    };
    Some(Ok((shape, value)))
}

/// True when every node's shape (and count value) re-derives from the traced input
/// shapes to its traced one, so the tape can be replayed on other shapes of the same ranks.
pub(crate) fn is_polymorphic(tape: &Tape) -> bool {
    if tape.shape_specific {
        return false;
    }
    let mut shapes: Vec<Vec<usize>> = Vec::with_capacity(tape.nodes.len());
    for n in &tape.nodes {
        match node_plan(tape, &tape.input_shapes, &shapes, n) {
            Some(Ok((s, v))) if s == n.shape => {
                if let (Some(v), Primitive::Full { value }) = (v, &n.prim) {
                    if v.to_bits() != value.to_bits() {
                        return false;
                    }
                }
            }
            _ => return false,
        }
        shapes.push(n.shape.clone());
    }
    true
}

/// The plan for new input shapes (the tape must be polymorphic): an error when the ops
/// would reject the shapes, `None` when the tape does not describe them (see the module
/// docs).
pub(crate) fn plan(tape: &Tape, inputs: &[Vec<usize>]) -> Result<Option<Plan>> {
    let mut plan = Plan { shapes: Vec::with_capacity(tape.nodes.len()), values: Vec::with_capacity(tape.nodes.len()) };
    for n in &tape.nodes {
        let Some(r) = node_plan(tape, inputs, &plan.shapes, n) else { return Ok(None) };
        let (shape, value) = r?;
        checked_size(n.prim.name(), &shape, n.dtype)?;
        plan.shapes.push(shape);
        plan.values.push(value);
    }
    Ok(Some(plan))
}
