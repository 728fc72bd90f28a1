//! Shape rules of the fused neural-network primitives: `Softmax`, `LayerNorm`, `RmsNorm`.
//!
//! Each keeps its input's shape; the rules resolve the axis or check the per-column
//! arrays. Used by `ops/nn.rs` when it records the node and by `compile/shapes.rs` when
//! a shapeless replay re-derives it. They compute in `x.dtype().to_float()`.

use crate::error::{Error, Result};
use crate::shape::normalize_axis;

/// `Softmax` of `x` along `axis` (negative counts from the end; `name` is `softmax` or
/// `log_softmax`): the axis resolved, and the shape of `x`.
pub(crate) fn softmax(name: &'static str, x: &[usize], axis: isize) -> Result<(usize, Vec<usize>)> {
    Ok((normalize_axis(name, axis, x.len())?, x.to_vec()))
}

/// `LayerNorm` or `RmsNorm` (`name`) of `x` over its last axis, with optional `weight`
/// and `bias` of shape `[last dimension]`: the shape of `x`.
pub(crate) fn norm(
    name: &'static str,
    x: &[usize],
    weight: Option<&[usize]>,
    bias: Option<&[usize]>,
) -> Result<Vec<usize>> {
    let Some(&d) = x.last() else {
        return Err(Error::shape(name, format!("needs an input with at least one axis, got shape {x:?}")));
    };
    for (what, c) in [("weight", weight), ("bias", bias)] {
        if let Some(c) = c {
            if c != [d] {
                return Err(Error::shape(
                    name,
                    format!(
                        "{what} of shape {c:?} does not match the last dimension of input shape {x:?} (expected [{d}])"
                    ),
                ));
            }
        }
    }
    Ok(x.to_vec())
}

// This family has no gradient rules: each slot returns `Unsupported` (see `grad.rs`).
super::grad::no_rules!();
