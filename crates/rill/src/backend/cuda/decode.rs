//! `Rope` and `SliceUpdate` on a GPU (see `ops/decode.rs` for what they compute), one
//! thread per output element each. The position offsets and start indices are read on
//! the device, so a CUDA graph of a decode step replays for every position.
//!
//! Rope computes each pair's angle, sine, cosine and rotation in double and rounds once
//! on the store, as the CPU does (`backend/cpu/decode.rs`). SliceUpdate writes every
//! element of a new buffer, from the update inside the written range and from `x`
//! elsewhere (one kernel, no separate copy; a thread per 16 bytes when the run after the
//! axis is whole 16-byte vectors, as a head's keys are); starts are clamped as on the CPU.

use crate::backend::Storage;
use crate::dtype::DType;
use crate::error::Result;
use crate::primitives::RopeLayout;

use super::buffer::new_storage;
use super::driver::GpuStream;
use super::launch::Launch;
use super::norm::elem_ptr;
use super::nvrtc::{self, grid_for};
use super::source::{PRELUDE, ctype, load, store_float};
use super::take::vec_type;

/// A contiguous device copy of `s` (itself when already contiguous).
fn contiguous(cs: &GpuStream<'_>, s: &Storage) -> Result<Storage> {
    if s.layout.is_contiguous() { Ok(s.clone()) } else { super::elementwise::copy(cs, s) }
}

/// The rope kernel `k_rope` for values of `d` and offsets of `od`.
pub(crate) fn rope_source(d: DType, od: DType, layout: RopeLayout) -> String {
    let (t, it) = (ctype(d), ctype(od));
    let ld = |e: &str| format!("(double){}", load(d, e));
    let pair = match layout {
        RopeLayout::Interleaved => "i = e >> 1; ia = 2 * i; ib = ia + 1; first = (e & 1) == 0;",
        RopeLayout::Halves => "i = e < half ? e : e - half; ia = i; ib = i + half; first = e < half;",
    };
    let st = store_float(d, "y", true);
    let (xa, xb) = (ld("row[ia]"), ld("row[ib]"));
    format!(
        r#"{PRELUDE}
// out[j][e] for rows j of `d` features, `t` rows per sequence position run; `per` rows
// share one offset when `noff` > 1 (else offset[0] for every row).
extern "C" __global__ void k_rope({t}* out, const {t}* x, const {it}* offset, i64 n, i64 t, i64 d, i64 dims,
                                  i64 per, i64 noff, double base, double scale) {{
    i64 k = (i64)blockIdx.x * blockDim.x + threadIdx.x;
    if (k >= n) return;
    i64 e = k % d, j = k / d;
    const {t}* row = x + j * d;
    if (e >= dims) {{ out[k] = row[e]; return; }}
    i64 tt = j % t, r = j / t;
    i64 oi = noff > 1 ? r / per : 0;
    double p = ((double)((i64)offset[oi]) + (double)tt) * scale;
    i64 half = dims >> 1, i, ia, ib;
    bool first;
    {pair}
    double th = p * pow(base, -(2.0 * (double)i) / (double)dims);
    double s, c;
    sincos(th, &s, &c);
    double a = {xa}, b = {xb};
    double y = first ? a * c - b * s : a * s + b * c;
    out[k] = {st};
}}
"#
    )
}

/// Rotary embedding of `x [..., T, D]` (inputs `x, offset`).
pub(crate) fn rope(
    cs: &GpuStream<'_>,
    inputs: &[&Storage],
    dims: usize,
    base: f64,
    scale: f64,
    layout: RopeLayout,
) -> Result<Storage> {
    let (x, offset) = (inputs[0], inputs[1]);
    let shape = x.layout.shape.to_vec();
    let d = x.dtype;
    let out = new_storage(cs, d, &shape)?;
    let n: usize = shape.iter().product();
    if n == 0 {
        return Ok(out);
    }
    let r = shape.len();
    let (t, f) = (shape[r - 2], shape[r - 1]);
    let rows = n / (t * f);
    let noff = offset.layout.numel();
    let per = if noff > 1 { rows / shape[0] } else { rows };
    let xs = contiguous(cs, x)?;
    let os = contiguous(cs, offset)?;
    let od = offset.dtype;
    let key = format!("rope:{layout:?}:{}:{}", d.name(), od.name());
    let func = nvrtc::function(cs.driver(), &cs.dev, &key, "k_rope", move || rope_source(d, od, layout))?;
    let (po, px, pf) = (elem_ptr(&out), elem_ptr(&xs), elem_ptr(&os));
    let (n64, t64, d64, dims64, per64, noff64) = (n as i64, t as i64, f as i64, dims as i64, per as i64, noff as i64);
    let _ = cs.bind();
    let mut lb = Launch::new(&func);
    lb.arg(&po).arg(&px).arg(&pf).arg(&n64).arg(&t64).arg(&d64).arg(&dims64).arg(&per64).arg(&noff64);
    lb.arg(&base).arg(&scale);
    // SAFETY: `x` and `out` hold `n` contiguous elements, `offset` `noff` (1, or one per
    // leading row: `r / per < noff`); the arguments match the kernel's signature.
    unsafe { lb.launch(cs, grid_for(n)) }.map_err(|e| super::backend_err("launch", e))?;
    Ok(out)
}

/// The slice-update kernel `k_slice_update` for `v`-byte elements and starts of `sd`.
pub(crate) fn slice_update_source(v: usize, sd: DType) -> String {
    let (vt, it) = (vec_type(v), ctype(sd));
    format!(
        r#"{PRELUDE}
struct __attribute__((aligned(16))) v16 {{ u64 a, b; }};
// out = x with up written along an axis of `dim` from a clamped start: `inner` elements
// after the axis, `per` runs (outer indices) per start when `nstart` > 1.
extern "C" __global__ void k_slice_update({vt}* out, const {vt}* x, const {vt}* up, const {it}* start, i64 n,
                                          i64 dim, i64 len, i64 inner, i64 per, i64 nstart) {{
    i64 k = (i64)blockIdx.x * blockDim.x + threadIdx.x;
    if (k >= n) return;
    i64 c = k % inner, q = k / inner;
    i64 a = q % dim, o = q / dim;
    i64 s = (i64)start[nstart > 1 ? o / per : 0];
    i64 hi = dim - len;
    s = s < 0 ? 0 : (s > hi ? hi : s);
    out[k] = (a >= s && a < s + len) ? up[(o * len + (a - s)) * inner + c] : x[k];
}}
"#
    )
}

/// `x` with `update` written along `axis` (inputs `x, update, start`).
pub(crate) fn slice_update(cs: &GpuStream<'_>, inputs: &[&Storage], axis: usize) -> Result<Storage> {
    let (x, update, start) = (inputs[0], inputs[1], inputs[2]);
    let shape = x.layout.shape.to_vec();
    let d = x.dtype;
    let out = new_storage(cs, d, &shape)?;
    let n: usize = shape.iter().product();
    if n == 0 {
        return Ok(out);
    }
    let (dim, len) = (shape[axis], update.layout.shape[axis]);
    let inner: usize = shape[axis + 1..].iter().product();
    let outer: usize = shape[..axis].iter().product();
    let nstart = start.layout.numel();
    let per = if nstart > 1 { outer / shape[0] } else { outer };
    let xs = contiguous(cs, x)?;
    let us = contiguous(cs, update)?;
    let ss = contiguous(cs, start)?;
    let (po, px, pu, ps) = (elem_ptr(&out), elem_ptr(&xs), elem_ptr(&us), elem_ptr(&ss));
    // The run after the axis moves whole: when it is a whole number of 16-byte vectors
    // (and every address is aligned to them) a thread copies a vector, not an element.
    let size = d.size();
    let wide = (inner * size).is_multiple_of(16) && [po, px, pu].iter().all(|p| p % 16 == 0);
    let (v, unit) = if wide { (16, 16 / size) } else { (size, 1) };
    let sd = start.dtype;
    let key = format!("slice_update:{v}:{}", sd.name());
    let func = nvrtc::function(cs.driver(), &cs.dev, &key, "k_slice_update", move || slice_update_source(v, sd))?;
    let (n64, dim64, len64, in64, per64, ns64) =
        ((n / unit) as i64, dim as i64, len as i64, (inner / unit) as i64, per.max(1) as i64, nstart as i64);
    let _ = cs.bind();
    let mut lb = Launch::new(&func);
    lb.arg(&po).arg(&px).arg(&pu).arg(&ps).arg(&n64).arg(&dim64).arg(&len64).arg(&in64).arg(&per64).arg(&ns64);
    // SAFETY: `x` and `out` hold `n` contiguous elements (`n / unit` units of `v` bytes,
    // aligned to them), `update` `outer * len * inner` (read only inside the clamped
    // range), `start` `nstart`; the arguments match the kernel's signature.
    unsafe { lb.launch(cs, grid_for(n / unit)) }.map_err(|e| super::backend_err("launch", e))?;
    Ok(out)
}

/// The in-place slice-update kernel `k_slice_write` for `v`-byte elements and starts of
/// `sd`: writes only the update's elements into the array's own buffer.
pub(crate) fn slice_write_source(v: usize, sd: DType) -> String {
    let (vt, it) = (vec_type(v), ctype(sd));
    format!(
        r#"{PRELUDE}
struct __attribute__((aligned(16))) v16 {{ u64 a, b; }};
// out[o, s + a, c] = up[o, a, c] for the n elements of up ([outer, len, inner]), from
// each outer index's clamped start (`per` outer indices per start when `nstart` > 1).
extern "C" __global__ void k_slice_write({vt}* out, const {vt}* up, const {it}* start, i64 n,
                                         i64 dim, i64 len, i64 inner, i64 per, i64 nstart) {{
    i64 k = (i64)blockIdx.x * blockDim.x + threadIdx.x;
    if (k >= n) return;
    i64 c = k % inner, q = k / inner;
    i64 a = q % len, o = q / len;
    i64 s = (i64)start[nstart > 1 ? o / per : 0];
    i64 hi = dim - len;
    s = s < 0 ? 0 : (s > hi ? hi : s);
    out[(o * dim + s + a) * inner + c] = up[k];
}}
"#
    )
}

/// [`slice_update`] with `x` donated (no array holds it any more): the update is written
/// into `x`'s own buffer when the stream may own it (`buffer::own_for_writing`), so only
/// the update's elements move; otherwise into a new buffer.
pub(crate) fn slice_update_into(
    cs: &GpuStream<'_>,
    mut x: Storage,
    update: &Storage,
    start: &Storage,
    axis: usize,
) -> Result<Storage> {
    if !super::buffer::own_for_writing(cs, &mut x) {
        return slice_update(cs, &[&x, update, start], axis);
    }
    let shape = &x.layout.shape;
    let (dim, len) = (shape[axis], update.layout.shape[axis]);
    let inner: usize = shape[axis + 1..].iter().product();
    let outer: usize = shape[..axis].iter().product();
    let n = outer * len * inner;
    if n > 0 {
        let nstart = start.layout.numel();
        let per = if nstart > 1 { outer / shape[0] } else { outer };
        let us = contiguous(cs, update)?;
        let ss = contiguous(cs, start)?;
        let (po, pu, ps) = (elem_ptr(&x), elem_ptr(&us), elem_ptr(&ss));
        // Whole 16-byte vectors per thread when the run after the axis is made of them.
        let size = x.dtype.size();
        let wide = (inner * size).is_multiple_of(16) && po % 16 == 0 && pu % 16 == 0;
        let (v, unit) = if wide { (16, 16 / size) } else { (size, 1) };
        let sd = start.dtype;
        let key = format!("slice_write:{v}:{}", sd.name());
        let func = nvrtc::function(cs.driver(), &cs.dev, &key, "k_slice_write", move || slice_write_source(v, sd))?;
        let (n64, dim64, len64, in64, per64, ns64) =
            ((n / unit) as i64, dim as i64, len as i64, (inner / unit) as i64, per.max(1) as i64, nstart as i64);
        let _ = cs.bind();
        let mut lb = Launch::new(&func);
        lb.arg(&po).arg(&pu).arg(&ps).arg(&n64).arg(&dim64).arg(&len64).arg(&in64).arg(&per64).arg(&ns64);
        // SAFETY: `x` holds `outer * dim * inner` contiguous elements in a buffer this
        // stream owns alone (`own_for_writing`), `update` `n` (`n / unit` units of `v`
        // bytes, aligned to them), `start` `nstart`; the written range stays inside `x`
        // (starts are clamped); the arguments match the kernel's signature.
        unsafe { lb.launch(cs, grid_for(n / unit)) }.map_err(|e| super::backend_err("launch", e))?;
    }
    crate::runtime::stats::BUFFERS_DONATED.fetch_add(1, crate::sync::atomic::Ordering::Relaxed);
    x.fence = None;
    Ok(x)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::cuda::nvrtc::check_compiles;

    #[test]
    fn decode_kernels_compile_for_sm90() {
        for d in [DType::F32, DType::F16, DType::BF16, DType::F64] {
            for od in [DType::I32, DType::I64, DType::U32, DType::U8] {
                for layout in [RopeLayout::Interleaved, RopeLayout::Halves] {
                    let key = format!("test:rope:{layout:?}:{}:{}", d.name(), od.name());
                    if !check_compiles(&key, &rope_source(d, od, layout)) {
                        return;
                    }
                }
            }
        }
        for v in [1, 2, 4, 8, 16] {
            for sd in [DType::I32, DType::I64, DType::U32, DType::U8] {
                if !check_compiles(&format!("test:slice_update:{v}:{}", sd.name()), &slice_update_source(v, sd)) {
                    return;
                }
                if !check_compiles(&format!("test:slice_write:{v}:{}", sd.name()), &slice_write_source(v, sd)) {
                    return;
                }
            }
        }
    }
}
