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
use crate::dtype::{DType, promote};
use crate::error::{Error, Result};
use crate::ops::reduce::reshape_node;
use crate::ops::{prepare, target_stream};
use crate::primitives::Primitive;
use crate::runtime::stream::Stream;
use crate::shape::{broadcast_shapes, checked_size};

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
        let (sa, sb) = (self.shape(), other.shape());
        if sa.is_empty() || sb.is_empty() {
            return Err(Error::shape(
                "matmul",
                format!("operands need at least one axis, got shapes {sa:?} and {sb:?}"),
            ));
        }
        let a_shape: Vec<usize> = if sa.len() == 1 { vec![1, sa[0]] } else { sa.to_vec() };
        let b_shape: Vec<usize> = if sb.len() == 1 { vec![sb[0], 1] } else { sb.to_vec() };
        let (na, nb) = (a_shape.len(), b_shape.len());
        let (m, k) = (a_shape[na - 2], a_shape[na - 1]);
        let (k2, n) = (b_shape[nb - 2], b_shape[nb - 1]);
        if k != k2 {
            return Err(Error::shape(
                "matmul",
                format!(
                    "inner dimensions differ: shapes {sa:?} and {sb:?} ({k} vs {k2}); \
                     the last axis of the first must equal the second-to-last of the second"
                ),
            ));
        }
        let batch = broadcast_shapes("matmul", &a_shape[..na - 2], &b_shape[..nb - 2]).map_err(|e| match e {
            // Batch axes that do not broadcast, or whose broadcast is too large.
            Error::Shape { msg, .. } => {
                Error::shape("matmul", format!("batch dimensions of shapes {sa:?} and {sb:?}: {msg}"))
            }
            e => e,
        })?;
        let stream = target_stream(&[self, other])?;
        let dtype = match promote(self.dtype(), other.dtype()) {
            DType::Bool => DType::I32,
            d => d,
        };
        let with = |mat: [usize; 2]| [batch.as_slice(), &mat].concat();
        let (a_full, b_full, out_shape) = (with([m, k]), with([k, n]), with([m, n]));
        for s in [&a_full, &b_full, &out_shape] {
            checked_size("matmul", s, dtype)?;
        }
        // 1-D operands become matrices: `[K]` is `[1, K]` on the left, `[K, 1]` on the right.
        let a = reshape_noted(prepare(self, dtype, &stream), a_shape, Note::Expand(vec![0]), &stream);
        let b = reshape_noted(prepare(other, dtype, &stream), b_shape, Note::Expand(vec![1]), &stream);
        let fit = |x: &Array, full: Vec<usize>, other: &Array| {
            if x.shape() == full.as_slice() {
                return x.clone();
            }
            let y = Array::from_op(Primitive::BroadcastTo, vec![x.clone()], full, dtype, stream.clone());
            rules::note(&y, Note::Batch { other: other.id(), shape: other.shape().to_vec() });
            y
        };
        let (a2, b2) = (fit(&a, a_full, &b), fit(&b, b_full, &a));
        let r = Array::from_op(Primitive::Matmul, vec![a2, b2], out_shape, dtype, stream.clone());
        // The axes the 1-D operands added are removed from the result.
        let (nb, mut gone) = (batch.len(), Vec::new());
        if sa.len() == 1 {
            gone.push(nb);
        }
        if sb.len() == 1 {
            gone.push(nb + 1);
        }
        let final_shape = r.shape().iter().enumerate().filter(|(i, _)| !gone.contains(i)).map(|(_, &d)| d).collect();
        Ok(reshape_noted(r, final_shape, Note::Squeeze(gone), &stream))
    }
}
