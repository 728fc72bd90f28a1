//! The matrix product's shape and dtype rule, NumPy's `matmul`.
//!
//! `[.., M, K] @ [.., K, N] -> [.., M, N]`: a 1-D left operand `[K]` is `[1, K]` and a
//! 1-D right operand `[K]` is `[K, 1]` (the added axis is removed from the result), batch
//! axes broadcast, and the `Matmul` primitive sees both operands broadcast to the batch
//! shape. [`matmul`] gives every shape the op records; `compile/shapes.rs` applies it to
//! the shapes of a replay (the broadcasts of the operands and the `Matmul` node).

use crate::dtype::{DType, promote};
use crate::error::{Error, Result};
use crate::primitives::movement::{expand, squeeze};
use crate::shape::broadcast_shapes;

/// The shapes of the nodes `matmul` records for operands of two shapes.
pub(crate) struct Matmul {
    /// The left operand as a matrix (a 1-D operand with an axis inserted at 0).
    pub a: Vec<usize>,
    /// The right operand as a matrix (a 1-D operand with an axis inserted at 1).
    pub b: Vec<usize>,
    /// The operands broadcast to the batch shape: the `Matmul` primitive's inputs.
    pub a_full: Vec<usize>,
    /// See `a_full`.
    pub b_full: Vec<usize>,
    /// The `Matmul` primitive's output, `[batch.., M, N]`.
    pub out: Vec<usize>,
    /// The axes of `out` the 1-D operands added (removed from the result).
    pub gone: Vec<usize>,
    /// The result: `out` without `gone`.
    pub result: Vec<usize>,
}

/// The product's dtype: the promotion of the operands', with bool multiplied as i32.
pub(crate) fn dtype(a: DType, b: DType) -> DType {
    match promote(a, b) {
        DType::Bool => DType::I32,
        d => d,
    }
}

/// The shapes of `sa @ sb` (see the module docs); errors name both shapes. Element
/// counts are checked by the callers for the product's dtype.
pub(crate) fn matmul(sa: &[usize], sb: &[usize]) -> Result<Matmul> {
    let (ra, rb) = (sa.len(), sb.len());
    if ra == 0 || rb == 0 {
        return Err(Error::shape("matmul", format!("operands need at least one axis, got shapes {sa:?} and {sb:?}")));
    }
    let a = if ra == 1 { expand(sa, &[0])? } else { sa.to_vec() };
    let b = if rb == 1 { expand(sb, &[1])? } else { sb.to_vec() };
    let (na, nb) = (a.len(), b.len());
    let (m, k) = (a[na - 2], a[na - 1]);
    let (k2, n) = (b[nb - 2], b[nb - 1]);
    if k != k2 {
        return Err(Error::shape(
            "matmul",
            format!(
                "inner dimensions differ: shapes {sa:?} and {sb:?} ({k} vs {k2}); \
                 the last axis of the first must equal the second-to-last of the second"
            ),
        ));
    }
    let batch = broadcast_shapes("matmul", &a[..na - 2], &b[..nb - 2]).map_err(|e| match e {
        // Batch axes that do not broadcast, or whose broadcast is too large.
        Error::Shape { msg, .. } => {
            Error::shape("matmul", format!("batch dimensions of shapes {sa:?} and {sb:?}: {msg}"))
        }
        e => e,
    })?;
    let with = |mat: [usize; 2]| [batch.as_slice(), &mat].concat();
    let (a_full, b_full, out) = (with([m, k]), with([k, n]), with([m, n]));
    let nb = batch.len();
    let gone: Vec<usize> = [(ra == 1).then_some(nb), (rb == 1).then_some(nb + 1)].into_iter().flatten().collect();
    let result = squeeze(&out, &gone)?;
    Ok(Matmul { a, b, a_full, b_full, out, gone, result })
}

// ---- gradient rules (see `grad.rs`) ----

use super::Primitive;
use super::grad::{Jvp, Vjp, add_opt, no_rule};
use crate::array::Array;

/// `Matmul` (operands of equal batch shapes): `ct @ bᵀ` and `aᵀ @ ct`. Batch
/// broadcasting happened in `BroadcastTo` nodes before it, whose rule sums it back.
pub(crate) fn vjp(p: &Primitive, g: &Vjp<'_>) -> crate::error::Result<Vec<Option<Array>>> {
    match p {
        Primitive::Matmul => {
            let (a, b, ct) = (&g.inputs[0], &g.inputs[1], g.cotangent);
            Ok(vec![Some(ct.matmul(&b.swapaxes(-1, -2)?)?), Some(a.swapaxes(-1, -2)?.matmul(ct)?)])
        }
        other => Err(no_rule(other.name(), "vjp")),
    }
}

/// `ct`, a batched product not yet computed, summed over every batch axis into `shape`
/// (the matrix axes kept): one product over the folded contraction, `[K, B·M] @ [B·M,
/// N]`, instead of `B` products stored and then summed. This is the cotangent of an
/// operand broadcast over a batch (a weight applied to every row of `[B, T, D]`): one
/// large GEMM that accumulates the whole sum in f32, where the batched form rounds each
/// batch's product to the dtype before the sum. `None` when `ct` is not such a product.
pub(crate) fn batch_summed(ct: &Array, shape: &[usize]) -> Result<Option<Array>> {
    let r = ct.ndim();
    if r < 3 || shape.len() < 2 || shape[shape.len() - 2..] != ct.shape()[r - 2..] || ct.is_evaluated() {
        return Ok(None);
    }
    let lead = r - shape.len();
    if (lead..r - 2).any(|i| shape[i - lead] != 1) {
        return Ok(None);
    }
    let (prim, ins) = ct.primitive_and_inputs();
    if !matches!(prim, Primitive::Matmul) || ins.len() != 2 {
        return Ok(None);
    }
    let (x, y) = (&ins[0], &ins[1]);
    // A stretched operand would be copied B times to be folded.
    let stretched = |a: &Array| !a.is_evaluated() && matches!(a.primitive(), Primitive::BroadcastTo);
    if stretched(x) || stretched(y) {
        return Ok(None);
    }
    let (k, m, n) = (x.shape()[r - 2], x.shape()[r - 1], y.shape()[r - 1]);
    let rows = (ct.shape()[..r - 2].iter().product::<usize>() * m) as isize;
    // `x` is `[B.., K, M]`; the left factor is `[K, B·M]`. When `x` is the transpose of a
    // `[B.., M, K]` array, that array folded and transposed is a view.
    // The primitive and its input read together (fusion at eval may rewrite both).
    let swapped: Vec<usize> = (0..r - 2).chain([r - 1, r - 2]).collect();
    let (xp, xs) = x.primitive_and_inputs();
    let left = match (xp, xs.first()) {
        (Primitive::Permute(p), Some(src)) if !x.is_evaluated() && p == swapped => {
            src.reshape(&[rows, k as isize])?.swapaxes(0, 1)?
        }
        _ => {
            let front: Vec<usize> = [r - 2].into_iter().chain(0..r - 2).chain([r - 1]).collect();
            x.transpose(&front)?.reshape(&[k as isize, rows])?
        }
    };
    let spec: Vec<isize> = shape.iter().map(|&d| d as isize).collect();
    Ok(Some(left.matmul(&y.reshape(&[rows, n as isize])?)?.reshape(&spec)?))
}

/// `Matmul`: `ta @ b + a @ tb`.
pub(crate) fn jvp(p: &Primitive, g: &Jvp<'_>) -> crate::error::Result<Option<Array>> {
    match p {
        Primitive::Matmul => {
            let (a, b) = (&g.inputs[0], &g.inputs[1]);
            let ta = g.tangents[0].as_ref().map(|t| t.matmul(b)).transpose()?;
            let tb = g.tangents[1].as_ref().map(|t| a.matmul(t)).transpose()?;
            add_opt(ta, tb)
        }
        other => Err(no_rule(other.name(), "jvp")),
    }
}
