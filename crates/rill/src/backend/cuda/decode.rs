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
    // Below f64 the angle is reduced to [-pi, pi] in double and its sine and cosine taken
    // in float, which is exact to the output's precision and several times faster.
    let trig = if d == DType::F64 {
        "sincos(th, &s, &c);"
    } else {
        "const double rr = th - rint(th * 0.15915494309189535) * 6.283185307179586; float sf, cf; sincosf((float)rr, &sf, &cf); s = sf; c = cf;"
    };
    format!(
        r#"{PRELUDE}
// out[j][e] for rows j of `d` features, `t` rows per sequence position run; `per` rows
// share one offset when `noff` > 1 (else offset[0] for every row).
extern "C" __global__ void k_rope({t}* out, const {t}* x, const {it}* offset, i64 n, i64 t, i64 d, i64 dims,
                                  i64 per, i64 noff, double lbase, double scale) {{
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
    double th = p * exp2(-(2.0 * (double)i) / (double)dims * lbase);
    double s, c;
    {trig}
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
    let lbase = base.log2();
    lb.arg(&lbase).arg(&scale);
    // SAFETY: `x` and `out` hold `n` contiguous elements, `offset` `noff` (1, or one per
    // leading row: `r / per < noff`); the arguments match the kernel's signature.
    unsafe { lb.launch(cs, grid_for(n)) }.map_err(|e| super::backend_err("launch", e))?;
    Ok(out)
}

/// The slice-update kernels for `v`-byte elements and starts of `sd`: `k_slice_update`,
/// one thread per element of `out` (`x` with the update written in), or with `write`
/// `k_slice_write`, one per element of the update, written into `out`, which is `x`'s
/// own buffer (`x` is then not read).
pub(crate) fn slice_source(v: usize, sd: DType, write: bool) -> String {
    let (vt, it) = (vec_type(v), ctype(sd));
    let (name, split, store) = if write {
        ("k_slice_write", "q % len, o = q / len", "out[(o * dim + s + a) * inner + c] = up[k]")
    } else {
        (
            "k_slice_update",
            "q % dim, o = q / dim",
            "out[k] = (a >= s && a < s + len) ? up[(o * len + (a - s)) * inner + c] : x[k]",
        )
    };
    format!(
        r#"{PRELUDE}
struct __attribute__((aligned(16))) v16 {{ u64 a, b; }};
// Along an axis of `dim` from a clamped start: `inner` elements after the axis, `per`
// runs (outer indices) per start when `nstart` > 1; `a` indexes the axis of out (or of up).
extern "C" __global__ void {name}({vt}* out, const {vt}* x, const {vt}* up, const {it}* start, i64 n,
                                  i64 dim, i64 len, i64 inner, i64 per, i64 nstart) {{
    i64 k = (i64)blockIdx.x * blockDim.x + threadIdx.x;
    if (k >= n) return;
    i64 c = k % inner, q = k / inner;
    i64 a = {split};
    i64 s = (i64)start[nstart > 1 ? o / per : 0];
    i64 hi = dim - len;
    s = s < 0 ? 0 : (s > hi ? hi : s);
    {store};
}}
"#
    )
}

/// Launches `k_slice_update` (`out` a new buffer, `x` read) or with `write` `k_slice_write`
/// (`out` is `x`'s own buffer): `x`/`out` of `[outer, dim, inner]` elements of `size`
/// bytes, `up` of `[outer, len, inner]`, all contiguous, `start` `nstart` integers of `sd`.
#[allow(clippy::too_many_arguments)]
fn launch_slice(
    cs: &GpuStream<'_>,
    write: bool,
    [po, px, pu, ps]: [u64; 4],
    size: usize,
    [outer, dim, len, inner]: [usize; 4],
    nstart: usize,
    sd: DType,
) -> Result<()> {
    let n = outer * if write { len } else { dim } * inner;
    if n == 0 {
        return Ok(());
    }
    let per = if nstart > 1 { outer / nstart } else { outer };
    // The run after the axis moves whole: when it is a whole number of 16-byte vectors
    // (and every address is aligned to them) a thread copies a vector, not an element.
    let wide = (inner * size).is_multiple_of(16) && [po, px, pu].iter().all(|p| p % 16 == 0);
    let (v, unit) = if wide { (16, 16 / size) } else { (size, 1) };
    let kname = if write { "k_slice_write" } else { "k_slice_update" };
    let key = format!("{kname}:{v}:{}", sd.name());
    let func = nvrtc::function(cs.driver(), &cs.dev, &key, kname, move || slice_source(v, sd, write))?;
    let (n64, dim64, len64, in64, per64, ns64) =
        ((n / unit) as i64, dim as i64, len as i64, (inner / unit) as i64, per.max(1) as i64, nstart as i64);
    let _ = cs.bind();
    let mut lb = Launch::new(&func);
    lb.arg(&po).arg(&px).arg(&pu).arg(&ps).arg(&n64).arg(&dim64).arg(&len64).arg(&in64).arg(&per64).arg(&ns64);
    // SAFETY: `out` (and `x`, when read) hold `outer * dim * inner` contiguous elements,
    // `up` `outer * len * inner` (in `unit`s of `v` bytes, aligned to them), `start`
    // `nstart`; starts are clamped so every index stays inside; `write`'s `out` is a buffer
    // this stream owns alone (`buffer::own_for_writing`); the arguments match the kernel's
    // signature.
    unsafe { lb.launch(cs, grid_for(n / unit)) }.map_err(|e| super::backend_err("launch", e))
}

/// The axis sizes `[outer, dim, len, inner]` of a slice update of `x` by `update`.
fn slice_dims(x: &Storage, update: &Storage, axis: usize) -> [usize; 4] {
    let shape = &x.layout.shape;
    [shape[..axis].iter().product(), shape[axis], update.layout.shape[axis], shape[axis + 1..].iter().product()]
}

/// `x` with `update` written along `axis` (inputs `x, update, start`), in a new buffer.
pub(crate) fn slice_update(cs: &GpuStream<'_>, inputs: &[&Storage], axis: usize) -> Result<Storage> {
    let (x, update, start) = (inputs[0], inputs[1], inputs[2]);
    let out = new_storage(cs, x.dtype, &x.layout.shape)?;
    if x.layout.numel() == 0 {
        return Ok(out);
    }
    let (xs, us, ss) = (contiguous(cs, x)?, contiguous(cs, update)?, contiguous(cs, start)?);
    let ptrs = [elem_ptr(&out), elem_ptr(&xs), elem_ptr(&us), elem_ptr(&ss)];
    let nstart = start.layout.numel();
    launch_slice(cs, false, ptrs, x.dtype.size(), slice_dims(x, update, axis), nstart, start.dtype)?;
    Ok(out)
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
    let (us, ss) = (contiguous(cs, update)?, contiguous(cs, start)?);
    let px = elem_ptr(&x);
    let ptrs = [px, px, elem_ptr(&us), elem_ptr(&ss)];
    let nstart = start.layout.numel();
    launch_slice(cs, true, ptrs, x.dtype.size(), slice_dims(&x, update, axis), nstart, start.dtype)?;
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
                for write in [false, true] {
                    if !check_compiles(&format!("test:slice:{v}:{}:{write}", sd.name()), &slice_source(v, sd, write)) {
                        return;
                    }
                }
            }
        }
    }
}
