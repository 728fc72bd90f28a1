//! Linear algebra: `matmul` with NumPy semantics.
//!
//! - Both operands need at least one axis. A 1-D left operand `[K]` is treated as
//!   `[1, K]` and a 1-D right operand `[K]` as `[K, 1]`; the added axis is removed from
//!   the result.
//! - Batch dimensions (all but the last two) broadcast; the operands are broadcast with
//!   views, so the `Matmul` primitive sees equal batch shapes.
//! - The inner dimensions must agree.
//! - The dtype is `promote(a, b)`; bool operands are multiplied as i32 (the result is
//!   i32, counting the true products), integers wrap on overflow.
//!
//! The reshapes of 1-D operands and the broadcasts to the batch shape are computed from
//! the operands' shapes: during a shapeless trace they are noted (`compile::rules`), so a
//! replay on other shapes recomputes them (a captured operand included).

use crate::array::Array;
use crate::compile::rules::{self, Note};
use crate::error::Result;
use crate::ops::reduce::reshape_node;
use crate::ops::{prepare, target_stream};
use crate::primitives::{Primitive, linalg as rule};
use crate::runtime::stream::Stream;
use crate::shape::checked_size;

/// A reshape of `x` to `shape` noted with `note` (when it is a new node).
fn reshape_noted(x: Array, shape: Vec<usize>, note: Note, stream: &Stream) -> Array {
    let id = x.id();
    let y = reshape_node(x, shape, stream);
    if y.id() != id {
        rules::note(&y, note);
    }
    y
}

impl Array {
    /// Matrix product `self @ other` with NumPy semantics (see the module docs):
    /// `[.., M, K] @ [.., K, N] -> [.., M, N]`, 1-D operands promoted to matrices, batch
    /// dimensions broadcast. Bool operands give an i32 result.
    pub fn matmul(&self, other: &Array) -> Result<Array> {
        let shapes = rule::matmul(self.shape(), other.shape())?;
        let stream = target_stream(&[self, other])?;
        let dtype = rule::dtype(self.dtype(), other.dtype());
        let rule::Matmul { a: a_shape, b: b_shape, a_full, b_full, out, gone, result } = shapes;
        for s in [&a_full, &b_full, &out] {
            checked_size("matmul", s, dtype)?;
        }
        // 1-D operands become matrices: `[K]` is `[1, K]` on the left, `[K, 1]` on the right.
        let a = reshape_noted(prepare(self, dtype, &stream), a_shape, Note::Expand(vec![0]), &stream);
        let b = reshape_noted(prepare(other, dtype, &stream), b_shape, Note::Expand(vec![1]), &stream);
        let fit = |x: &Array, full: Vec<usize>, other: &Array, left: bool| {
            if x.shape() == full.as_slice() {
                return x.clone();
            }
            let y = Array::from_op(Primitive::BroadcastTo, vec![x.clone()], full, dtype, stream.clone());
            rules::note(&y, Note::Batch { other: other.id(), shape: other.shape().to_vec(), left });
            y
        };
        let (a2, b2) = (fit(&a, a_full, &b, true), fit(&b, b_full, &a, false));
        let r = Array::from_op(Primitive::Matmul, vec![a2, b2], out, dtype, stream.clone());
        // The axes the 1-D operands added are removed from the result.
        Ok(reshape_noted(r, result, Note::Squeeze(gone), &stream))
    }
}
