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

use crate::array::Array;
use crate::dtype::{DType, promote};
use crate::error::{Error, Result};
use crate::ops::reduce::reshape_node;
use crate::ops::{prepare, target_stream};
use crate::primitives::Primitive;
use crate::shape::{broadcast_shapes, checked_size};

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
        for s in [with([m, k]), with([k, n]), with([m, n])] {
            checked_size("matmul", &s, dtype)?;
        }
        let fit = |x: &Array, shape: Vec<usize>, mat: [usize; 2]| {
            let x = reshape_node(prepare(x, dtype, &stream), shape, &stream);
            let mut full = batch.clone();
            full.extend_from_slice(&mat);
            if x.shape() == full.as_slice() {
                x
            } else {
                Array::from_op(Primitive::BroadcastTo, vec![x], full, dtype, stream.clone())
            }
        };
        let a = fit(self, a_shape, [m, k]);
        let b = fit(other, b_shape, [k, n]);
        let mut out_shape = batch.clone();
        out_shape.extend_from_slice(&[m, n]);
        let r = Array::from_op(Primitive::Matmul, vec![a, b], out_shape, dtype, stream.clone());
        let mut final_shape = batch;
        if sa.len() > 1 {
            final_shape.push(m);
        }
        if sb.len() > 1 {
            final_shape.push(n);
        }
        Ok(reshape_node(r, final_shape, &stream))
    }
}
