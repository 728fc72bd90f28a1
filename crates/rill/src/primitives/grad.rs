//! The gradient slot of every primitive: [`Primitive::vjp`] and [`Primitive::jvp`]
//! dispatch to the rule in the primitive's family file (`unary.rs`, `binary.rs`,
//! `reduce.rs`, `nn.rs`, `linalg.rs`, `attention.rs`, `movement.rs`, `creation.rs`, `fused.rs`), so each
//! primitive's gradient sits beside its shape rule and its kernels' formulas. A rule sees
//! the node's inputs and output as arrays of a traced graph and builds its result with
//! ops. A primitive without a rule returns `Error::Unsupported` naming it (never a zero).
//! `None` stands for a cotangent or tangent that is structurally zero (an integer input,
//! an index, a source).

// No transform calls these and no rule reads the fields: only the tests use them.
#![allow(dead_code)]

use crate::array::Array;
use crate::error::{Error, Result};

use super::{
    BinaryOp, Primitive, UnaryOp, attention, creation, decode, fused, linalg, movement, nn, quant, reduce, sort,
};

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

/// The slot of a family without gradient rules: `vjp` and `jvp` that return the
/// `Unsupported` error naming the primitive.
macro_rules! no_rules {
    () => {
        /// This family's reverse-mode rules (see `grad.rs`).
        pub(crate) fn vjp(
            p: &super::Primitive,
            _: &super::grad::Vjp<'_>,
        ) -> crate::error::Result<Vec<Option<crate::Array>>> {
            Err(super::grad::no_rule(p.name(), "vjp"))
        }

        /// This family's forward-mode rules (see `grad.rs`).
        pub(crate) fn jvp(
            p: &super::Primitive,
            _: &super::grad::Jvp<'_>,
        ) -> crate::error::Result<Option<crate::Array>> {
            Err(super::grad::no_rule(p.name(), "jvp"))
        }
    };
}
pub(crate) use no_rules;

/// Where a primitive's gradient rules live: the one table from primitives to rule files.
enum Owner {
    Creation,
    Unary(UnaryOp),
    Binary(BinaryOp),
    /// `Cast` and `Where`, whose rules go here.
    Elementwise,
    Reduce,
    Sort,
    Nn,
    Linalg,
    Attention,
    Quant,
    /// `Rope` and `SliceUpdate` (`decode.rs`).
    Decode,
    Movement,
    /// A host callback: no derivative.
    Host(&'static str),
    /// A traced input: no inputs of its own, and a given tangent.
    Placeholder,
    Fused,
}

impl Primitive {
    fn grad_owner(&self) -> Owner {
        use Primitive::*;
        match self {
            Constant | Full { .. } | Arange { .. } | Eye { .. } | Random { .. } => Owner::Creation,
            Unary(op) => Owner::Unary(*op),
            Binary(op) => Owner::Binary(*op),
            Cast | Where => Owner::Elementwise,
            Reduce { .. } | ArgReduce { .. } | Cumsum { .. } => Owner::Reduce,
            Sort(_) => Owner::Sort,
            Softmax { .. } | LayerNorm { .. } | RmsNorm { .. } => Owner::Nn,
            Matmul => Owner::Linalg,
            Attention { .. } => Owner::Attention,
            QuantMatmul { .. } | Dequantize { .. } => Owner::Quant,
            Rope { .. } | SliceUpdate { .. } => Owner::Decode,
            Reshape
            | Permute(_)
            | BroadcastTo
            | Slice { .. }
            | Contiguous
            | Take { .. }
            | Concatenate { .. }
            | Pad { .. }
            | ToDevice => Owner::Movement,
            Host { name, .. } => Owner::Host(name),
            Placeholder { .. } => Owner::Placeholder,
            Fused(_) | FusedReduce { .. } | Block(_) => Owner::Fused,
        }
    }

    /// The cotangent of each input (`None`: structurally zero), from the cotangent of the
    /// output.
    pub(crate) fn vjp(&self, g: &Vjp<'_>) -> Result<Vec<Option<Array>>> {
        match self.grad_owner() {
            Owner::Creation => creation::vjp(self, g),
            Owner::Unary(op) => Ok(vec![op.vjp(g)?]),
            Owner::Binary(op) => Ok(op.vjp(g)?.into()),
            Owner::Elementwise => Err(no_rule(self.name(), "vjp")),
            Owner::Reduce => reduce::vjp(self, g),
            Owner::Sort => sort::vjp(self, g),
            Owner::Nn => nn::vjp(self, g),
            Owner::Linalg => linalg::vjp(self, g),
            Owner::Attention => attention::vjp(self, g),
            Owner::Quant => quant::vjp(self, g),
            Owner::Decode => decode::vjp(self, g),
            Owner::Movement => movement::vjp(self, g),
            Owner::Host(name) => Err(no_derivative(name)),
            Owner::Placeholder => Ok(Vec::new()),
            Owner::Fused => fused::vjp(self, g),
        }
    }

    /// The tangent of the output (`None`: structurally zero), from the tangents of the
    /// inputs.
    pub(crate) fn jvp(&self, g: &Jvp<'_>) -> Result<Option<Array>> {
        match self.grad_owner() {
            Owner::Creation => creation::jvp(self, g),
            Owner::Unary(op) => op.jvp(g),
            Owner::Binary(op) => op.jvp(g),
            Owner::Elementwise => Err(no_rule(self.name(), "jvp")),
            Owner::Reduce => reduce::jvp(self, g),
            Owner::Sort => sort::jvp(self, g),
            Owner::Nn => nn::jvp(self, g),
            Owner::Linalg => linalg::jvp(self, g),
            Owner::Attention => attention::jvp(self, g),
            Owner::Quant => quant::jvp(self, g),
            Owner::Decode => decode::jvp(self, g),
            Owner::Movement => movement::jvp(self, g),
            Owner::Host(name) => Err(no_derivative(name)),
            Owner::Placeholder => Ok(None),
            Owner::Fused => fused::jvp(self, g),
        }
    }
}

fn no_derivative(op: &'static str) -> Error {
    Error::Unsupported { op, backend: "autodiff", msg: "a host callback has no derivative".into() }
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
            Primitive::Attention { scale: None, mask: crate::primitives::AttentionMaskKind::Causal },
            Primitive::QuantMatmul { format: crate::quant::QuantFormat::Q4_0 },
            Primitive::Dequantize { format: crate::quant::QuantFormat::Q8_0 },
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
