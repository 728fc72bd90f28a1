//! Shape re-derivation for shapeless replay.
//!
//! [`derive`] recomputes a node's shape from its inputs' shapes for the primitives whose
//! output shape is a function of their input shapes and parameters. The others (fills of
//! a fixed shape other than 0-d, `arange`, `eye`, random, reshapes, broadcasts, slices,
//! pads, gathers, concatenations, host callbacks, and primitives added later) make a
//! tape shape-specific: `compile_shapeless` then falls back to tracing per shape.

use crate::compile::trace::{Ref, Tape};
use crate::error::{Error, Result};
use crate::primitives::Primitive;
use crate::shape::broadcast_shapes;

/// The output shape of `prim` for these input shapes; `None` when the primitive's shape
/// is not a function of its input shapes.
fn derive(prim: &Primitive, ins: &[&[usize]], traced: &[usize]) -> Option<Result<Vec<usize>>> {
    use Primitive::*;
    let first = || ins.first().map(|s| s.to_vec()).unwrap_or_default();
    Some(match prim {
        Full { .. } if traced.is_empty() => Ok(Vec::new()),
        Constant => Ok(traced.to_vec()),
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
        FusedReduce { axes, .. } => broadcast_all(prim.name(), ins).map(|mut s| {
            for &a in axes {
                if let Some(d) = s.get_mut(a) {
                    *d = 1;
                }
            }
            s
        }),
        Reduce { axes, .. } => {
            let mut s = first();
            for &a in axes {
                if let Some(d) = s.get_mut(a) {
                    *d = 1;
                }
            }
            Ok(s)
        }
        ArgReduce { axis, .. } => {
            let mut s = first();
            if let Some(d) = s.get_mut(*axis) {
                *d = 1;
            }
            Ok(s)
        }
        Permute(p) => {
            let x = first();
            Ok(p.iter().map(|&i| x.get(i).copied().unwrap_or(1)).collect())
        }
        Matmul => {
            let (a, b) = (ins[0], ins[1]);
            let (ra, rb) = (a.len(), b.len());
            if ra < 2 || rb < 2 || a[..ra - 2] != b[..rb - 2] || a[ra - 1] != b[rb - 2] {
                Err(Error::shape("matmul", format!("shapes {a:?} and {b:?} do not multiply")))
            } else {
                let mut s = a[..ra - 1].to_vec();
                s.push(b[rb - 1]);
                Ok(s)
            }
        }
        _ => return None,
    })
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

/// True when every node's shape re-derives from the traced input shapes to its traced
/// shape (so the tape can be replayed on other shapes of the same ranks).
pub(crate) fn is_polymorphic(tape: &Tape) -> bool {
    let mut shapes: Vec<Vec<usize>> = Vec::with_capacity(tape.nodes.len());
    for n in &tape.nodes {
        let ins: Vec<&[usize]> = n.inputs.iter().map(|&r| ref_shape(tape, &tape.input_shapes, &shapes, r)).collect();
        match derive(&n.prim, &ins, &n.shape) {
            Some(Ok(s)) if s == n.shape => {}
            _ => return false,
        }
        shapes.push(n.shape.clone());
    }
    true
}

/// Every node's shape for new input shapes (the tape must be polymorphic); errors when
/// the new shapes do not fit (for example shapes that do not broadcast).
pub(crate) fn node_shapes(tape: &Tape, inputs: &[Vec<usize>]) -> Result<Vec<Vec<usize>>> {
    let mut shapes: Vec<Vec<usize>> = Vec::with_capacity(tape.nodes.len());
    for n in &tape.nodes {
        let ins: Vec<&[usize]> = n.inputs.iter().map(|&r| ref_shape(tape, inputs, &shapes, r)).collect();
        let s = match derive(&n.prim, &ins, &n.shape) {
            Some(r) => r?,
            None => {
                return Err(Error::invalid("compile", format!("{} cannot be replayed on new shapes", n.prim.name())));
            }
        };
        shapes.push(s);
    }
    Ok(shapes)
}
