//! `Rope` and `SliceUpdate` on the CPU (see `ops/decode.rs` for what they compute).
//!
//! Rope builds a table of `(cos, sin)` per distinct position and pair (in f64) once, then
//! rotates every head's rows from it, in f64, rounding once on the store. SliceUpdate
//! copies `x` into a new buffer and writes the update over it, or, when `x` was donated
//! (`slice_update_into`), writes only the update into `x`'s own buffer.

use crate::backend::cpu::{CpuBuffer, PAR_CHUNK, par, strided, to_f64_vec};
use crate::backend::{Buffer, Storage};
use crate::dtype::Element;
use crate::error::{Error, Result};
use crate::primitives::RopeLayout;
use crate::runtime::stats;
use crate::sync::atomic::Ordering::Relaxed;

/// The per-row offsets (or starts) of an index input, as `i64`: one value, or one per
/// leading row.
pub(crate) fn index_values(s: &Storage) -> Vec<i64> {
    to_f64_vec(s).into_iter().map(|v| v as i64).collect()
}

/// The angle of pair `i` of `dims` at position `p`.
pub(crate) fn rope_angle(p: f64, i: usize, dims: usize, base: f64, scale: f64) -> f64 {
    p * scale * base.powf(-(2.0 * i as f64) / dims as f64)
}

/// Rotary embedding of `x [..., T, D]` (inputs `x, offset`).
pub(crate) fn rope(inputs: &[&Storage], dims: usize, base: f64, scale: f64, layout: RopeLayout) -> Result<Storage> {
    let (x, offset) = (inputs[0], inputs[1]);
    let shape = x.layout.shape.to_vec();
    let r = shape.len();
    let (t, d) = (shape[r - 2], shape[r - 1]);
    let n: usize = shape.iter().product();
    let rows = n.checked_div(t * d).unwrap_or(0);
    let offsets = index_values(offset);
    // Heads (and any other axes) between the leading axis and `T`.
    let per_offset = if offsets.len() > 1 { rows / shape[0].max(1) } else { rows.max(1) };
    let half = dims / 2;
    // table[(o * T + t) * half + i] = (sin, cos) for offset `o`, row `t`, pair `i`.
    let mut table = Vec::with_capacity(offsets.len() * t * half);
    for &o in &offsets {
        for tt in 0..t {
            let p = (o + tt as i64) as f64;
            table.extend((0..half).map(|i| rope_angle(p, i, dims, base, scale).sin_cos()));
        }
    }
    let dtype = x.dtype;
    let mut buf = CpuBuffer::alloc(dtype, n)?;
    crate::with_dtype!(dtype, T => {
        let src = strided::contiguous::<T>(x);
        let out = buf.typed_mut::<T>();
        // One piece per row of `D` features.
        par::chunks_min(out, d.max(1), (PAR_CHUNK / d.max(1)).max(1), |j, o| {
            let (row, tt) = (j / t, j % t);
            let oi = if offsets.len() > 1 { row / per_offset.max(1) } else { 0 };
            let tab = &table[(oi * t + tt) * half..(oi * t + tt + 1) * half];
            let s = &src[j * d..(j + 1) * d];
            o.copy_from_slice(s);
            for (i, &(sn, c)) in tab.iter().enumerate() {
                let (ia, ib) = match layout {
                    RopeLayout::Interleaved => (2 * i, 2 * i + 1),
                    RopeLayout::Halves => (i, i + half),
                };
                let (a, b) = (s[ia].to_f64(), s[ib].to_f64());
                o[ia] = T::from_f64(a * c - b * sn);
                o[ib] = T::from_f64(a * sn + b * c);
            }
        });
    });
    Ok(Storage::contiguous(Buffer::Cpu(buf), dtype, &shape))
}

/// A start clamped so `len` elements fit in `dim` (see `ops::decode::slice_update`).
pub(crate) fn clamp_start(start: i64, len: usize, dim: usize) -> usize {
    start.clamp(0, (dim - len) as i64) as usize
}

/// `x` with `update` written along `axis` (inputs `x, update, start`), in a new buffer.
pub(crate) fn slice_update(inputs: &[&Storage], axis: usize) -> Result<Storage> {
    let (x, update, start) = (inputs[0], inputs[1], inputs[2]);
    let shape = x.layout.shape.to_vec();
    let dtype = same_dtype(x, update)?;
    let mut buf = CpuBuffer::alloc(dtype, shape.iter().product())?;
    crate::with_dtype!(dtype, T => {
        let out = buf.typed_mut::<T>();
        out.copy_from_slice(&strided::contiguous::<T>(x));
        write_update::<T>(out, &shape, update, start, axis);
    });
    Ok(Storage::contiguous(Buffer::Cpu(buf), dtype, &shape))
}

/// [`slice_update`] with `x` donated (no array holds it any more): the update is written
/// into `x`'s own buffer when this storage is its only holder and lays it out
/// contiguously, so only the update's elements move; otherwise into a new buffer.
pub(crate) fn slice_update_into(mut x: Storage, rest: &[&Storage], axis: usize) -> Result<Storage> {
    let (update, start) = (rest[0], rest[1]);
    let dtype = same_dtype(&x, update)?;
    let shape = x.layout.shape.to_vec();
    let (at, n) = (x.layout.offset, x.layout.numel());
    let contiguous = x.layout.is_contiguous();
    match std::sync::Arc::get_mut(&mut x.buffer) {
        Some(Buffer::Cpu(buf)) if contiguous => {
            crate::with_dtype!(dtype, T => {
                write_update::<T>(&mut buf.typed_mut::<T>()[at..at + n], &shape, update, start, axis);
            });
            stats::BUFFERS_DONATED.fetch_add(1, Relaxed);
            x.fence = None;
            Ok(x)
        }
        _ => slice_update(&[&x, update, start], axis),
    }
}

fn same_dtype(x: &Storage, update: &Storage) -> Result<crate::dtype::DType> {
    if update.dtype != x.dtype {
        return Err(Error::dtype("slice_update", update.dtype, format!("the update must be {}", x.dtype)));
    }
    Ok(x.dtype)
}

/// Writes `update` over `out` (the contiguous elements of an array of `shape`) along
/// `axis`, from each row's clamped start.
fn write_update<T: Element>(out: &mut [T], shape: &[usize], update: &Storage, start: &Storage, axis: usize) {
    let starts = index_values(start);
    let (dim, len) = (shape[axis], update.layout.shape[axis]);
    // Elements after `axis` (a contiguous run) and the count of runs before it.
    let inner: usize = shape[axis + 1..].iter().product();
    let outer: usize = shape[..axis].iter().product();
    let per_row = if shape.is_empty() || shape[0] == 0 { 1 } else { outer / shape[0] };
    let up = strided::contiguous::<T>(update);
    let run = len * inner;
    if run == 0 {
        return;
    }
    for o in 0..outer {
        let s = if starts.len() > 1 { starts[o / per_row.max(1)] } else { starts[0] };
        let s = clamp_start(s, len, dim);
        let at = (o * dim + s) * inner;
        out[at..at + run].copy_from_slice(&up[o * run..(o + 1) * run]);
    }
}
