//! `take`: one gather kernel that checks each index itself. An index outside
//! `[-size, size)` writes zeros (nothing out of bounds is read) and is reported through
//! a check slot (`check.rs`): the first bad position reaches the user as `Error::Index`
//! when the batch is complete, with no host wait. Only when every slot of the device is
//! in use (or the device has no unified addressing) does a take check with a host wait
//! first, as a take always did before.
//!
//! Rows of the gather are copied as the widest vectors (up to 16 bytes) that the inner
//! extent and the two addresses allow; positions are 32-bit when everything fits. A take
//! along the last axis (single elements: `x[o, idx[k]]`) runs `k_take_cols`: a block keeps
//! up to [`COL_SPAN`] resolved indices in registers and gathers them from whole rows of
//! `x` in turn, so a row's random reads hit the block's L1 and no position is divided.

use cudarc::driver::LaunchConfig;

use crate::backend::Storage;
use crate::dtype::DType;
use crate::error::{Error, Result};

use super::buffer::{CudaBuffer, new_storage};
use super::check::{self, Slot};
use super::driver::GpuStream;
use super::launch::Launch;
use super::norm::elem_ptr;
use super::nvrtc::{self, BLOCK, grid_for};
use super::source::{PRELUDE, ctype};

/// The C type of a `v`-byte vector of bits.
pub(crate) fn vec_type(v: usize) -> &'static str {
    match v {
        1 => "u8",
        2 => "u16",
        4 => "u32",
        8 => "u64",
        _ => "v16",
    }
}

/// What both gather kernels start with: the prelude, the index check's report for index
/// C type `it`, the 16-byte vector type and the position type `ix` (u64 when `wide`).
fn gather_head(it: &str, wide: bool) -> String {
    let ix = if wide { "u64" } else { "u32" };
    let report = check::report_source(it);
    format!("{PRELUDE}{report}\nstruct __attribute__((aligned(16))) v16 {{ u64 a, b; }};\ntypedef {ix} ix;")
}

/// Indices a thread of `k_take_cols` holds, and the indices a block covers per row.
const COL_UNROLL: usize = 16;
pub(crate) const COL_SPAN: usize = COL_UNROLL * BLOCK as usize;

/// The column gather `k_take_cols` for `v`-byte elements, index C type `it`, positions of
/// type `u32` (`wide` false) or `u64`: `out[o][k] = x[o][idx[k]]`. Work items are
/// (chunk of `COL_SPAN` indices, row), chunk-major, spread over the grid; a block resolves
/// and checks a chunk's indices once and reuses them for every row it takes.
pub(crate) fn take_cols_source(v: usize, it: &str, wide: bool) -> String {
    let vt = vec_type(v);
    let head = gather_head(it, wide);
    format!(
        r#"{head}
#define UNR {COL_UNROLL}
extern "C" __global__ void __launch_bounds__({BLOCK}) k_take_cols({vt}* out, const {vt}* x, const {it}* idx,
        u64* words, u64* host, ix outer, ix nidx, ix size) {{
    const u64 NONE = 0xffffffffffffffffull;
    u64 bad = NONE;
    const ix span = (ix){BLOCK} * UNR;
    const ix items = (nidx + span - 1) / span * outer;
    i64 jj[UNR];
    ix cur = ~(ix)0;
    for (ix item = blockIdx.x; item < items; item += gridDim.x) {{
        const ix ch = item / outer, o = item - ch * outer;
        const ix k0 = ch * span + threadIdx.x;
        if (ch != cur) {{
            cur = ch;
#pragma unroll
            for (int u = 0; u < UNR; ++u) {{
                const ix k = k0 + (ix)u * {BLOCK};
                i64 j = -1;
                if (k < nidx) {{
                    j = (i64)idx[k];
                    if (j < 0) j += (i64)size;
                    if (j < 0 || j >= (i64)size) {{
                        if ((u64)k < bad) bad = (u64)k;
                        j = -1;
                    }}
                }}
                jj[u] = j;
            }}
        }}
        {vt} val[UNR];
#pragma unroll
        for (int u = 0; u < UNR; ++u) val[u] = jj[u] >= 0 ? x[o * size + (ix)jj[u]] : {vt}{{}};
#pragma unroll
        for (int u = 0; u < UNR; ++u) {{
            const ix k = k0 + (ix)u * {BLOCK};
            if (k < nidx) out[o * nidx + k] = val[u];
        }}
    }}
    rill_report(bad, words, host, idx);
}}
"#
    )
}

/// The gather kernel `k_take` for `v`-byte vectors, index C type `it`, positions of type
/// `u32` (`wide` false) or `u64`.
pub(crate) fn take_source(v: usize, it: &str, wide: bool) -> String {
    let vt = vec_type(v);
    let head = gather_head(it, wide);
    format!(
        r#"{head}
// out[o][k][c] = x[o][idx[k]][c] over vectors; `words` (two device words, zero on entry
// and on exit) and `host` (position, value) are a check slot, or null: no report.
extern "C" __global__ void __launch_bounds__({BLOCK}) k_take({vt}* out, const {vt}* x, const {it}* idx,
        u64* words, u64* host, ix n, ix nidx, ix size, ix inner, int check_only) {{
    const u64 NONE = 0xffffffffffffffffull;
    u64 bad = NONE;
    const ix step = (ix)blockDim.x * gridDim.x;
    const ix first = (ix)blockIdx.x * blockDim.x + threadIdx.x;
    if (check_only) {{
        for (ix k = first; k < nidx; k += step) {{
            i64 j = (i64)idx[k];
            if (j < 0) j += (i64)size;
            if ((j < 0 || j >= (i64)size) && (u64)k < bad) bad = (u64)k;
        }}
    }} else {{
        for (ix i = first; i < n; i += step) {{
            ix c = i % inner, r = i / inner;
            ix k = r % nidx, o = r / nidx;
            i64 j = (i64)idx[k];
            if (j < 0) j += (i64)size;
            {vt} val = {vt}{{}};
            if (j < 0 || j >= (i64)size) {{
                if ((u64)k < bad) bad = (u64)k;
            }} else {{
                val = x[(o * size + (ix)j) * inner + c];
            }}
            out[i] = val;
        }}
    }}
    rill_report(bad, words, host, idx);
}}
"#
    )
}

/// The synchronous index check used when no check slot is free: a kernel records the
/// first bad position of `idx` (contiguous) for an axis of `size`, the host waits for the
/// stream and reads it back, as `Error::Index` of `op`.
pub(crate) fn check_now(cs: &GpuStream<'_>, idx: &Storage, op: &'static str, axis: usize, size: usize) -> Result<()> {
    let nidx = idx.layout.numel();
    let it = ctype(idx.dtype);
    let launch_err = |e| super::backend_err("launch", e);
    let flag = CudaBuffer::alloc(cs, 8)?;
    let key = format!("take_check:{}", idx.dtype.name());
    let f = nvrtc::function(cs.driver(), &cs.dev, &key, "k_check", || check_source(it))?;
    let (pf, pi, n64, s64) = (flag.ptr(), elem_ptr(idx), nidx as i64, size as i64);
    let _ = cs.bind();
    // `cs.stream()` each time: it sends the launches recorded before.
    let raw = || cs.stream().cu_stream();
    // SAFETY: `flag` holds 8 bytes.
    unsafe { cs.driver().memset_d8_async(pf, 0xff, 8, raw()) }.map_err(launch_err)?;
    let mut lb = Launch::new(&f);
    lb.arg(&pf).arg(&pi).arg(&n64).arg(&s64);
    // SAFETY: `idx` holds `nidx` contiguous elements; `flag` one u64.
    unsafe { lb.launch(cs, grid_for(nidx)) }.map_err(launch_err)?;
    let mut first = [0u64; 1];
    // SAFETY: 8 bytes into `first`, finished by the synchronisation below.
    unsafe { cs.driver().memcpy_dtoh_async(&mut first, pf, raw()) }.map_err(launch_err)?;
    cs.synchronize()?;
    if first[0] == u64::MAX {
        return Ok(());
    }
    let k = first[0] as usize;
    let mut bytes = [0u8; 8];
    let sz = idx.dtype.size();
    // SAFETY: element `k` of `idx` lies inside its buffer (k < nidx).
    unsafe { cs.driver().memcpy_dtoh_async(&mut bytes[..sz], pi + (k * sz) as u64, raw()) }.map_err(launch_err)?;
    cs.synchronize()?;
    let index = match idx.dtype {
        DType::I32 => i32::from_le_bytes([bytes[0], bytes[1], bytes[2], bytes[3]]) as i64,
        DType::I64 => i64::from_le_bytes(bytes),
        DType::U32 => u32::from_le_bytes([bytes[0], bytes[1], bytes[2], bytes[3]]) as i64,
        _ => bytes[0] as i64,
    };
    Err(Error::Index { op, index, axis, size })
}

pub(crate) fn check_source(it: &str) -> String {
    format!(
        r#"{PRELUDE}
extern "C" __global__ void k_check(u64* flag, const {it}* idx, i64 n, i64 size) {{
    for (i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (i64)blockDim.x * gridDim.x) {{
        i64 j = (i64)idx[i];
        if (j < 0) j += size;
        if (j < 0 || j >= size) atomicMin(flag, (u64)i);
    }}
}}
"#
    )
}

/// `s` as a contiguous device storage (itself when it already is).
pub(crate) fn contiguous(cs: &GpuStream<'_>, s: &Storage) -> Result<Storage> {
    if s.layout.is_contiguous() { Ok(s.clone()) } else { super::elementwise::copy(cs, s) }
}

/// The widest vector (bytes, at most 16) that divides `row` bytes and both addresses.
pub(crate) fn vector_width(elem: usize, row: usize, ptrs: &[u64]) -> usize {
    let mut v = 16;
    while v > elem && (!row.is_multiple_of(v) || ptrs.iter().any(|&p| p % v as u64 != 0)) {
        v /= 2;
    }
    v.max(elem)
}

/// Gathers along `axis` of `x` at the indices `idx` (u8/u32/i32/i64; negative ones
/// count from the end) into a new contiguous storage of `shape`; the check of the
/// indices is registered with `checks` (or done at once when no slot is free).
pub(crate) fn take(
    cs: &GpuStream<'_>,
    x: &Storage,
    idx: &Storage,
    axis: usize,
    shape: &[usize],
    checks: &mut check::Batch,
) -> Result<Storage> {
    let size = x.layout.shape[axis];
    let nidx = idx.layout.numel();
    let n: usize = shape.iter().product();
    let out = new_storage(cs, x.dtype, shape)?;
    if nidx == 0 {
        return Ok(out); // no index, nothing to check or copy (n == 0 too)
    }
    let idx = contiguous(cs, idx)?;
    let slot = Slot::get(cs)?;
    if slot.is_none() {
        check_now(cs, &idx, "take", axis, size)?;
    }
    let xs = if n > 0 { contiguous(cs, x)? } else { x.clone() };
    let es = x.dtype.size();
    let inner: usize = x.layout.shape[axis + 1..].iter().product();
    let (po, px, pi) = (elem_ptr(&out), elem_ptr(&xs), elem_ptr(&idx));
    let v = vector_width(es, inner * es, &[po, px]);
    let (inner_v, n_v) = (inner * es / v, n * es / v);
    let x_v = xs.layout.numel() * es / v;
    let wide = n_v.max(x_v).max(nidx).max(size) >= (1usize << 31);
    let check_only = n == 0;
    let it = ctype(idx.dtype);
    let (pw, ph) = slot.as_ref().map(|s| (s.dev(), s.host())).unwrap_or((0, 0));
    let sms = cs.dev.sms.max(1) as usize;
    let bits = if wide { 64 } else { 32 };
    if inner == 1 && !check_only {
        let outer = n / nidx;
        let key = format!("take_cols:{es}:{}:{bits}", idx.dtype.name());
        let f = nvrtc::function(cs.driver(), &cs.dev, &key, "k_take_cols", || take_cols_source(es, it, wide))?;
        let items = nidx.div_ceil(COL_SPAN) * outer;
        let blocks = items.clamp(1, sms * 16);
        let cfg = LaunchConfig { grid_dim: (blocks as u32, 1, 1), block_dim: (BLOCK, 1, 1), shared_mem_bytes: 0 };
        let _ = cs.bind();
        let mut lb = Launch::new(&f);
        lb.arg(&po).arg(&px).arg(&pi).arg(&pw).arg(&ph);
        if wide {
            let a = [outer as u64, nidx as u64, size as u64];
            lb.arg(&a[0]).arg(&a[1]).arg(&a[2]);
        } else {
            let a = [outer as u32, nidx as u32, size as u32];
            lb.arg(&a[0]).arg(&a[1]).arg(&a[2]);
        }
        // SAFETY: `out` holds outer * nidx elements and `x` (contiguous) outer * size; `idx`
        // holds nidx contiguous elements; a position outside `[0, size)` is never read; the
        // slot (or nulls) is this take's alone until its verdict is read.
        unsafe { lb.launch(cs, cfg) }.map_err(|e| super::backend_err("launch", e))?;
        if let Some(s) = slot {
            checks.watch(&out, s, "take", axis, size);
        }
        return Ok(out);
    }
    let key = format!("take:{v}:{}:{bits}", idx.dtype.name());
    let f = nvrtc::function(cs.driver(), &cs.dev, &key, "k_take", || take_source(v, it, wide))?;
    let items = if check_only { nidx } else { n_v };
    let blocks = items.div_ceil(BLOCK as usize).clamp(1, sms * 32);
    let cfg = LaunchConfig { grid_dim: (blocks as u32, 1, 1), block_dim: (BLOCK, 1, 1), shared_mem_bytes: 0 };
    let co = check_only as i32;
    let _ = cs.bind();
    let mut lb = Launch::new(&f);
    lb.arg(&po).arg(&px).arg(&pi).arg(&pw).arg(&ph);
    if wide {
        let a = [n_v as u64, nidx as u64, size as u64, inner_v as u64];
        lb.arg(&a[0]).arg(&a[1]).arg(&a[2]).arg(&a[3]);
    } else {
        let a = [n_v as u32, nidx as u32, size as u32, inner_v as u32];
        lb.arg(&a[0]).arg(&a[1]).arg(&a[2]).arg(&a[3]);
    }
    lb.arg(&co);
    // SAFETY: `out` holds n elements and `x` (contiguous) outer*size*inner, both
    // `v`-aligned with rows a multiple of `v` bytes; `idx` holds nidx contiguous
    // elements; a position outside `[0, size)` is never read; the slot (or nulls) is
    // this take's alone until its verdict is read.
    unsafe { lb.launch(cs, cfg) }.map_err(|e| super::backend_err("launch", e))?;
    if let Some(s) = slot {
        checks.watch(&out, s, "take", axis, size);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::cuda::nvrtc::check_compiles;

    #[test]
    fn take_kernels_compile_for_every_width_and_index_dtype() {
        for it in [DType::U8, DType::U32, DType::I32, DType::I64] {
            for v in [1, 2, 4, 8, 16] {
                for wide in [false, true] {
                    if !check_compiles(&format!("test:take:{v}:{it}:{wide}"), &take_source(v, ctype(it), wide)) {
                        return;
                    }
                    if v <= 8
                        && !check_compiles(
                            &format!("test:take_cols:{v}:{it}:{wide}"),
                            &take_cols_source(v, ctype(it), wide),
                        )
                    {
                        return;
                    }
                }
            }
            check_compiles(&format!("test:take_check:{it}"), &check_source(ctype(it)));
        }
    }

    #[test]
    fn vector_width_respects_rows_and_alignment() {
        assert_eq!(vector_width(4, 64, &[0, 256]), 16);
        assert_eq!(vector_width(4, 12, &[0, 256]), 4);
        assert_eq!(vector_width(2, 8, &[0, 2]), 2);
        assert_eq!(vector_width(2, 8, &[0, 8]), 8);
        assert_eq!(vector_width(8, 8, &[0, 8]), 8);
        assert_eq!(vector_width(1, 3, &[0, 1]), 1);
        assert_eq!(vector_width(8, 24, &[16, 32]), 8);
    }
}
