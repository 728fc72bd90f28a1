//! Shape re-derivation for shapeless replay.
//!
//! [`derive`](fn@derive) recomputes a node's shape from its inputs' shapes, for the primitives whose
//! output shape is a function of their input shapes and parameters and for the nodes
//! with a shape rule (see `rules`: count fills, reshapes that remove or insert axes of
//! size 1, matmul broadcasts). The others (fills of a fixed shape other than 0-d,
//! `arange`, `eye`, random, other reshapes and broadcasts, slices, pads, gathers,
//! concatenations, host callbacks) make a tape shape-specific: `compile_shapeless` then
//! falls back to tracing per shape. The match names every primitive, so a new one does
//! not compile until it is given a rule here.
//!
//! Each derivation calls the primitive's own shape rule (`primitives/{reduce,movement,
//! linalg,nn}.rs`), the one the op called when it recorded the node, so a replay gets the
//! op's shape, or the op's error, for the new shapes.
//!
//! For new shapes, [`plan`] gives every node's shape and every count fill's value, the
//! error the ops would return for those shapes (shapes that do not broadcast, a shape too
//! large), or `None` where the tape does not describe what the ops would build for them
//! (a branch an op took on the traced shapes: a matmul operand that needed no broadcast,
//! a maximum over an axis that was not empty); the call then traces those shapes.

use crate::compile::rules::{Rule, ShapeOf};
use crate::compile::trace::{Ref, Tape, TapeNode};
use crate::error::{Error, Result};
use crate::primitives::{Primitive, attention, decode, linalg, movement, nn, quant, reduce, scatter, sort};
use crate::shape::{broadcast_all, checked_size};

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
        Cast | Unary(_) | Contiguous | ToDevice | StopGradient | Depend => Ok(first()),
        Checkpoint { .. } => Ok(ins.last().map(|s| s.to_vec()).unwrap_or_default()),
        Softmax { axis, .. } => nn::softmax(prim.name(), &first(), *axis as isize).map(|(_, s)| s),
        Cumsum { axis, .. } => reduce::cumsum(&first(), *axis as isize).map(|(_, s)| s),
        Sort(spec) => sort::shape(spec, &first()),
        LayerNorm { has_weight, has_bias, .. } => {
            // The inputs are `x[, weight][, bias]`.
            let mut cols = ins.iter().skip(1).copied();
            let weight = if *has_weight { cols.next() } else { None };
            let bias = if *has_bias { cols.next() } else { None };
            nn::norm(prim.name(), &first(), weight, bias)
        }
        RmsNorm { has_weight, .. } => {
            let weight = if *has_weight { ins.get(1).copied() } else { None };
            nn::norm(prim.name(), &first(), weight, None)
        }
        Binary(_) | Where | Fused(_) => broadcast_all(prim.name(), ins),
        // `max`/`min` of no elements is an error and `logsumexp` a fill: a reduction the
        // rule rejects is not this tape.
        FusedReduce { op, axes, .. } => match broadcast_all(prim.name(), ins) {
            Ok(s) => Ok(reduce::reduce(*op, &s, axes).ok()?),
            Err(e) => Err(e),
        },
        Reduce { op, axes } => Ok(reduce::reduce(*op, &first(), axes).ok()?),
        Block(b) => return block_shape(b, ins),
        // `argmax` of an empty axis is an error; tracing these shapes gives the op's own.
        ArgReduce { axis, .. } => Ok(reduce::arg_reduce(prim.name(), &first(), *axis as isize).ok()?.1),
        Permute(p) => movement::permute(&first(), p),
        Matmul => {
            let [a, b] = ins else { return None };
            let (ra, rb) = (a.len(), b.len());
            if ra < 2 || rb < 2 || a[..ra - 2] != b[..rb - 2] {
                // Batch shapes the matmul op would have broadcast with a view this tape lacks.
                return None;
            }
            linalg::matmul(a, b).map(|m| m.out)
        }
        Attention { .. } => {
            let [q, k, v, mask @ ..] = ins else { return None };
            attention::attention(prim.name(), q, k, v, mask.first().copied())
        }
        AttentionGrad { part, .. } => attention::attention_grad(prim.name(), *part, ins),
        QuantMatmul { format } => {
            let [x, w] = ins else { return None };
            quant::qmatmul(prim.name(), *format, x, w)
        }
        Dequantize { format } => quant::dequantize(prim.name(), *format, &first()),
        Rope { dims, .. } => {
            let [x, offset] = ins else { return None };
            decode::rope(prim.name(), x, offset, *dims)
        }
        SliceUpdate { axis } => {
            let [x, update, start] = ins else { return None };
            decode::slice_update(prim.name(), x, update, start, *axis as isize).map(|(_, s)| s)
        }
        ScatterAdd { axis } => {
            let [x, idx, updates] = ins else { return None };
            scatter::scatter_add(x, idx, updates, *axis)
        }
        // The ops broadcast x and the indices with views this tape would lack for shapes
        // that need them: those shapes trace again.
        TakeAlongAxis { axis } => {
            let [x, idx] = ins else { return None };
            match scatter::along(prim.name(), x, idx, *axis, true) {
                Ok((xs, is)) if xs != *x || is != *idx => return None,
                Ok(_) => scatter::take_along_axis(x, idx, *axis, node.dtype),
                Err(e) => Err(e),
            }
        }
        PutAlongAxis { axis, .. } => {
            let [x, idx, values] = ins else { return None };
            match scatter::along(prim.name(), x, idx, *axis, false) {
                Ok((_, is)) if is != *idx || values != idx => return None,
                Ok(_) => scatter::put_along_axis(prim.name(), x, idx, values, *axis),
                Err(e) => Err(e),
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

/// The output shape of a fused block for these input shapes (see [`derive`](fn@derive)).
fn block_shape(b: &crate::primitives::fused::FusedBlock, ins: &[&[usize]]) -> Option<Result<Vec<usize>>> {
    use crate::primitives::fused::{BlockKind, QInput};
    Some(match &b.kind {
        BlockKind::Matmul { .. } => {
            let (a, m) = (ins.first()?, ins.get(1)?);
            let (ra, rb) = (a.len(), m.len());
            if ra < 2 || rb < 2 || a[..ra - 2] != m[..rb - 2] {
                return None;
            }
            let out = match linalg::matmul(a, m) {
                Ok(x) => x.out,
                Err(e) => return Some(Err(e)),
            };
            // The epilogue's operands broadcast to the product, never past it.
            let mut all: Vec<&[usize]> = vec![&out];
            all.extend(ins[2..].iter().copied());
            match broadcast_all(b.name(), &all) {
                Ok(s) if s == out => Ok(s),
                Ok(_) => return None,
                Err(e) => Err(e),
            }
        }
        BlockKind::ResidualNorm { has_weight, has_bias, keep_sum: false, .. } => {
            let (x, r) = (ins.first()?, ins.get(1)?);
            if x != r {
                return None;
            }
            let mut cols = ins.iter().skip(2).copied();
            let weight = if *has_weight { cols.next() } else { None };
            let bias = if *has_bias { cols.next() } else { None };
            nn::norm(b.name(), x, weight, bias).map(|_| x.to_vec())
        }
        BlockKind::QMatmul { format, input, .. } => {
            let nx = input.arity();
            let w = ins.get(nx)?;
            let x = match input {
                QInput::Plain => ins[0].to_vec(),
                QInput::Program(_) => match broadcast_all(b.name(), &ins[..nx]) {
                    Ok(s) => s,
                    Err(e) => return Some(Err(e)),
                },
                QInput::RmsNorm { has_weight, .. } => {
                    if let Err(e) = nn::norm(b.name(), ins[0], has_weight.then(|| ins[1]), None) {
                        return Some(Err(e));
                    }
                    ins[0].to_vec()
                }
            };
            let out = match quant::qmatmul(b.name(), *format, &x, w) {
                Ok(s) => s,
                Err(e) => return Some(Err(e)),
            };
            // The post program's operands broadcast to the product, never past it.
            let mut all: Vec<&[usize]> = vec![&out];
            all.extend(ins[nx + 1..].iter().copied());
            match broadcast_all(b.name(), &all) {
                Ok(s) if s == out => Ok(s),
                Ok(_) => return None,
                Err(e) => Err(e),
            }
        }
        // Views of these fix the traced shapes: made only for tapes replayed on them.
        BlockKind::ResidualNorm { keep_sum: true, .. } | BlockKind::Multi { .. } => return None,
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
        // An axis out of range was not noted for these ranks: not this tape.
        Rule::Squeeze(axes) => {
            let Primitive::Reshape = prim else { return None };
            match movement::squeeze(&x, axes) {
                Err(Error::Axis { .. }) => return None,
                r => r,
            }
        }
        Rule::Expand(axes) => {
            let Primitive::Reshape = prim else { return None };
            Ok(movement::expand(&x, axes).ok()?)
        }
        Rule::Batch { other, left } => {
            let Primitive::BroadcastTo = prim else { return None };
            let o = read(other);
            if x.len() < 2 || o.len() < 2 {
                return None;
            }
            // The operands as the matmul op saw them (1-D ones already matrices).
            let (a, b) = if *left { (&x, &o) } else { (&o, &x) };
            linalg::matmul(a, b).map(|m| if *left { m.a_full } else { m.b_full })
        }
    })
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
        | Primitive::Sort(_)
        | Primitive::Matmul
        | Primitive::Attention { .. }
        | Primitive::AttentionGrad { .. }
        | Primitive::QuantMatmul { .. }
        | Primitive::Dequantize { .. }
        | Primitive::Rope { .. }
        | Primitive::SliceUpdate { .. }
        | Primitive::Reshape
        | Primitive::Permute(_)
        | Primitive::BroadcastTo
        | Primitive::Slice { .. }
        | Primitive::Contiguous
        | Primitive::StopGradient
        | Primitive::Depend
        | Primitive::Checkpoint { .. }
        | Primitive::Take { .. }
        | Primitive::ScatterAdd { .. }
        | Primitive::TakeAlongAxis { .. }
        | Primitive::PutAlongAxis { .. }
        | Primitive::Concatenate { .. }
        | Primitive::Pad { .. }
        | Primitive::ToDevice
        | Primitive::Host { .. }
        | Primitive::Placeholder { .. }
        | Primitive::Fused(_)
        | Primitive::Block(_) => return None,
    };
    Some(reduce::count_fill(reduce::count(red.prim.name(), &whole, axes).ok()?, ddof))
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
                if let (Some(v), Primitive::Full { value }) = (v, &n.prim)
                    && v.to_bits() != value.to_bits()
                {
                    return false;
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
