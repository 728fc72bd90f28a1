//! The gradient slot of every primitive: [`Primitive::vjp`] and [`Primitive::jvp`]
//! dispatch to the rule in the primitive's family file (`unary.rs`, `binary.rs`,
//! `reduce.rs`, `nn.rs`, `linalg.rs`, `movement.rs`, `creation.rs`, `fused.rs`), so each
//! primitive's gradient sits beside its shape rule and its kernels' formulas. A rule sees
//! the node's inputs and output as arrays of a traced graph and builds its result with
//! ops. A primitive without a rule returns `Error::Unsupported` naming it (never a zero).
//! `None` stands for a cotangent or tangent that is structurally zero (an integer input,
//! an index, a source).

// The autodiff transforms (`vjp`, `jvp`, `grad`) call these and their rules read the
// fields; until they land only the tests call them.
#![allow(dead_code)]

use crate::array::Array;
use crate::error::{Error, Result};

use super::{Primitive, creation, fused, linalg, movement, nn, reduce};

/// What a reverse-mode rule is given: the node's inputs, its output, and the cotangent of
/// the output (same shape and dtype as `output`).
pub(crate) struct Vjp<'a> {
    pub(crate) inputs: &'a [Array],
    pub(crate) output: &'a Array,
    pub(crate) cotangent: &'a Array,
}

/// What a forward-mode rule is given: the node's inputs, the tangent of each input, and
/// the node's output.
pub(crate) struct Jvp<'a> {
    pub(crate) inputs: &'a [Array],
    pub(crate) tangents: &'a [Option<Array>],
    pub(crate) output: &'a Array,
}

/// The error of a primitive whose `transform` (`"vjp"` or `"jvp"`) rule is not written.
pub(crate) fn no_rule(op: &'static str, transform: &str) -> Error {
    Error::Unsupported { op, backend: "autodiff", msg: format!("no {transform} rule for this primitive") }
}

impl Primitive {
    /// The cotangent of each input (`None`: structurally zero), from the cotangent of the
    /// output.
    pub(crate) fn vjp(&self, g: &Vjp<'_>) -> Result<Vec<Option<Array>>> {
        use Primitive::*;
        match self {
            Constant | Full { .. } | Arange { .. } | Eye { .. } | Random { .. } => creation::vjp(self, g),
            Unary(op) => Ok(vec![op.vjp(g)?]),
            Binary(op) => Ok(op.vjp(g)?.into()),
            Cast | Where => Err(no_rule(self.name(), "vjp")),
            Reduce { .. } | ArgReduce { .. } | Cumsum { .. } => reduce::vjp(self, g),
            Softmax { .. } | LayerNorm { .. } | RmsNorm { .. } => nn::vjp(self, g),
            Matmul => linalg::vjp(self, g),
            Reshape
            | Permute(_)
            | BroadcastTo
            | Slice { .. }
            | Contiguous
            | Take { .. }
            | Concatenate { .. }
            | Pad { .. }
            | ToDevice => movement::vjp(self, g),
            Host { name, .. } => Err(Error::Unsupported {
                op: name,
                backend: "autodiff",
                msg: "a host callback has no derivative".into(),
            }),
            // A traced input has no inputs of its own.
            Placeholder { .. } => Ok(Vec::new()),
            Fused(_) | FusedReduce { .. } => fused::vjp(self, g),
        }
    }

    /// The tangent of the output (`None`: structurally zero), from the tangents of the
    /// inputs.
    pub(crate) fn jvp(&self, g: &Jvp<'_>) -> Result<Option<Array>> {
        use Primitive::*;
        match self {
            Constant | Full { .. } | Arange { .. } | Eye { .. } | Random { .. } => creation::jvp(self, g),
            Unary(op) => op.jvp(g),
            Binary(op) => op.jvp(g),
            Cast | Where => Err(no_rule(self.name(), "jvp")),
            Reduce { .. } | ArgReduce { .. } | Cumsum { .. } => reduce::jvp(self, g),
            Softmax { .. } | LayerNorm { .. } | RmsNorm { .. } => nn::jvp(self, g),
            Matmul => linalg::jvp(self, g),
            Reshape
            | Permute(_)
            | BroadcastTo
            | Slice { .. }
            | Contiguous
            | Take { .. }
            | Concatenate { .. }
            | Pad { .. }
            | ToDevice => movement::jvp(self, g),
            Host { name, .. } => Err(Error::Unsupported {
                op: name,
                backend: "autodiff",
                msg: "a host callback has no derivative".into(),
            }),
            // The tangent of a traced input is given, not derived.
            Placeholder { .. } => Ok(None),
            Fused(_) | FusedReduce { .. } => fused::jvp(self, g),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::primitives::{BinaryOp, ReduceOp, UnaryOp};

    /// Until a rule is written, each primitive refuses by name in both modes; sources and
    /// traced inputs have nothing to differentiate.
    #[test]
    fn every_primitive_has_a_slot_that_names_it() {
        let x = Array::from_slice(&[1.0f32, 2.0], &[2]).unwrap();
        let inputs = [x.clone(), x.clone()];
        let vjp = Vjp { inputs: &inputs, output: &x, cotangent: &x };
        let jvp = Jvp { inputs: &inputs, tangents: &[Some(x.clone()), None], output: &x };
        let mut refused: Vec<Primitive> = UnaryOp::ALL.iter().map(|&op| Primitive::Unary(op)).collect();
        refused.extend(BinaryOp::ALL.iter().map(|&op| Primitive::Binary(op)));
        refused.extend([
            Primitive::Cast,
            Primitive::Where,
            Primitive::Reduce { op: ReduceOp::Sum, axes: vec![0] },
            Primitive::Softmax { axis: 0, log: false },
            Primitive::Matmul,
            Primitive::Reshape,
            Primitive::Take { axis: 0 },
            Primitive::Host { name: "my_callback", f: std::sync::Arc::new(|v: &[Vec<f64>]| Ok(v[0].clone())) },
        ]);
        for p in &refused {
            for r in [p.vjp(&vjp).map(|_| ()), p.jvp(&jvp).map(|_| ())] {
                match r {
                    Err(Error::Unsupported { op, backend: "autodiff", .. }) => assert_eq!(op, p.name()),
                    other => panic!("{}: {other:?}", p.name()),
                }
            }
        }
        for p in [Primitive::Full { value: 1.0 }, Primitive::Placeholder { index: 0 }] {
            assert!(p.vjp(&vjp).unwrap().is_empty(), "{}", p.name());
            assert!(p.jvp(&jvp).unwrap().is_none(), "{}", p.name());
        }
    }
}
