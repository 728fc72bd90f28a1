//! Shape rules of the primitives of autoregressive decoding: `Rope` (rotary position
//! embedding) and `SliceUpdate` (writing new keys and values into a preallocated cache).
//!
//! Both take their positions as an integer array input, not a parameter, so a compiled
//! decode step replays for every position without tracing again. Used by
//! `ops/decode.rs` when it records the node and by `compile/shapes.rs` when a shapeless
//! replay re-derives it.

use crate::error::{Error, Result};
use crate::shape::normalize_axis;

/// How the rotated pairs of a head's features are laid out.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum RopeLayout {
    /// Pairs `(x[2i], x[2i+1])` (GPT-J, ggml's rope mode 0: llama weights in GGUF files,
    /// whose q/k projections llama.cpp's converter permuted for it).
    Interleaved,
    /// Pairs `(x[i], x[i + dims/2])` (GPT-NeoX, Hugging Face's `rotate_half`).
    Halves,
}

/// `Rope` of `x [..., T, D]` at offsets of shape `[]` or `[x.shape[0]]` (one per leading
/// row, for rank >= 3) rotating the first `dims` features (even, at most `D`): the
/// shape of `x`.
pub(crate) fn rope(name: &'static str, x: &[usize], offset: &[usize], dims: usize) -> Result<Vec<usize>> {
    let r = x.len();
    if r < 2 {
        return Err(Error::shape(name, format!("x must be [..., T, D] (rank >= 2), got {x:?}")));
    }
    let d = x[r - 1];
    if dims % 2 != 0 || dims > d || dims == 0 {
        return Err(Error::invalid(
            name,
            format!("dims must be even, positive and at most the feature size {d}, got {dims}"),
        ));
    }
    let ok = offset.is_empty() || (r >= 3 && offset == [x[0]]);
    if !ok {
        return Err(Error::shape(
            name,
            format!("the offset must be 0-d or one per leading row ([{}]) of x {x:?}, got shape {offset:?}", x[0]),
        ));
    }
    Ok(x.to_vec())
}

/// `SliceUpdate` of `x` with `update` along `axis` at start offsets of shape `[]` or
/// `[x.shape[0]]` (one per leading row, for `axis >= 1`): the axis resolved, and the
/// shape of `x`. `update` has `x`'s rank and shape except along `axis`, where it is at
/// most as long.
pub(crate) fn slice_update(
    name: &'static str,
    x: &[usize],
    update: &[usize],
    start: &[usize],
    axis: isize,
) -> Result<(usize, Vec<usize>)> {
    let ax = normalize_axis(name, axis, x.len())?;
    let fits = update.len() == x.len()
        && x.iter().zip(update).enumerate().all(|(i, (&a, &b))| if i == ax { b <= a } else { a == b });
    if !fits {
        return Err(Error::shape(
            name,
            format!("update of shape {update:?} does not fit in {x:?} along axis {ax} (same shape elsewhere)"),
        ));
    }
    let ok = start.is_empty() || (ax >= 1 && start == [x[0]]);
    if !ok {
        return Err(Error::shape(
            name,
            format!("the start must be 0-d or, for axis >= 1, one per leading row ([{}]), got shape {start:?}", x[0]),
        ));
    }
    Ok((ax, x.to_vec()))
}
