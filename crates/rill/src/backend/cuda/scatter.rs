//! `ScatterAdd`, `TakeAlongAxis` and `PutAlongAxis` on a GPU (see `ops/scatter.rs` for
//! what they compute): one module per (value dtype, index dtype) with five grid-stride
//! kernels. Indices are checked inside the kernels through a check slot, as `take`'s are
//! (`check.rs`, `take.rs`): a bad one is skipped (a gather writes 0) and fails the node
//! with `Error::Index` when the batch completes.
//!
//! - `k_init` copies `x` into the new output (and zeroes a put's claim words).
//! - `k_add` sums each update into its target with an atomic add: `atomicAdd` for f32,
//!   f64, i32, u32 and i64 (wrapping, as `add`); a compare-and-swap loop on the aligned
//!   32-bit word around the element for u8, f16 and bf16 (f16 and bf16 add in float and
//!   round once, as the CPU does); a plain store of 1 for bool (logical or). Every add
//!   is rounded as on the CPU, but the order of the adds to one element is not fixed, so
//!   float sums over duplicate indices may differ from the CPU's and between runs in the
//!   last bits. The output is allocated in whole words for the compare-and-swap.
//! - A put assigns in two passes so that the last index position in row-major order wins,
//!   as on the CPU: `k_claim` keeps the largest position + 1 naming each element
//!   (`atomicMax` on a u64 per output element), then `k_assign` writes the value of that
//!   position only.
//! - `k_gather` reads one element per index (`take_along_axis`).

use cudarc::driver::LaunchConfig;

use crate::backend::{Buffer, Storage};
use crate::dtype::DType;
use crate::error::Result;

use super::buffer::CudaBuffer;
use super::check::{self, Slot};
use super::driver::GpuStream;
use super::launch::Launch;
use super::norm::elem_ptr;
use super::nvrtc::{self, BLOCK};
use super::source::{PRELUDE, ctype, load, store_float};
use super::take::{check_now, contiguous};

/// `rill_add(p, v)`: `*p += v` atomically for values of `d` (see the module's notes).
fn add_source(d: DType) -> String {
    let t = ctype(d);
    let sub_word = |bits: u32, sum: &str| {
        format!(
            r#"
__device__ __forceinline__ void rill_add({t}* p, {t} v) {{
    u32* w = (u32*)((u64)p & ~3ull);
    u32 sh = (u32)((u64)p & 3ull) * 8u;
    u32 mask = ((1u << {bits}) - 1u) << sh;
    u32 old = *w, seen;
    do {{
        seen = old;
        {t} cur = ({t})((seen & mask) >> sh);
        {t} sum = {sum};
        old = atomicCAS(w, seen, (seen & ~mask) | (((u32)sum << sh) & mask));
    }} while (old != seen);
}}
"#
        )
    };
    let half = |d: DType| {
        let sum = store_float(d, &format!("__fadd_rn({}, {})", load(d, "cur"), load(d, "v")), false);
        sub_word(16, &sum)
    };
    match d {
        DType::F32 | DType::F64 | DType::I32 | DType::U32 => {
            format!("__device__ __forceinline__ void rill_add({t}* p, {t} v) {{ atomicAdd(p, v); }}\n")
        }
        DType::I64 => {
            format!("__device__ __forceinline__ void rill_add({t}* p, {t} v) {{ atomicAdd((u64*)p, (u64)v); }}\n")
        }
        DType::Bool => format!("__device__ __forceinline__ void rill_add({t}* p, {t} v) {{ if (v) *p = 1; }}\n"),
        DType::U8 => sub_word(8, "(u8)(cur + v)"),
        DType::F16 | DType::BF16 => half(d),
    }
}

/// The module of values of `d` and indices of `it`.
pub(crate) fn scatter_source(d: DType, it: DType) -> String {
    let (t, i) = (ctype(d), ctype(it));
    let report = check::report_source(i);
    let add = add_source(d);
    format!(
        r#"{PRELUDE}{report}{add}
#define RILL_NONE 0xffffffffffffffffull
#define RILL_STEP ((i64)blockDim.x * gridDim.x)
#define RILL_FIRST ((i64)blockIdx.x * blockDim.x + threadIdx.x)
// Work item `i` of updates or indices `[outer, m, inner]` targets element `*t` of an
// `[outer, size, inner]` array through index position `*k` (`i` itself when `along`,
// else the one index of its row `i / inner % m`); false when that index is out of range.
__device__ __forceinline__ bool rill_target(const {i}* idx, i64 i, i64 m, i64 size, i64 inner, int along,
                                            i64* k, i64* t) {{
    i64 c = i % inner, r = i / inner;
    *k = along ? i : r % m;
    i64 j = (i64)idx[*k];
    if (j < 0) j += size;
    *t = ((r / m) * size + j) * inner + c;
    return j >= 0 && j < size;
}}

extern "C" __global__ void __launch_bounds__({BLOCK}) k_init({t}* out, const {t}* x, u64* claims, i64 n) {{
    for (i64 e = RILL_FIRST; e < n; e += RILL_STEP) {{
        out[e] = x[e];
        if (claims) claims[e] = 0;
    }}
}}

// `n` updates summed into `out`; with no update (`n` 0) the `nidx` indices are still checked.
extern "C" __global__ void __launch_bounds__({BLOCK}) k_add({t}* out, const {t}* src, const {i}* idx,
        u64* words, u64* host, i64 n, i64 m, i64 size, i64 inner, int along, i64 nidx) {{
    u64 bad = RILL_NONE;
    if (n == 0) {{
        for (i64 k = RILL_FIRST; k < nidx; k += RILL_STEP) {{
            i64 j = (i64)idx[k];
            if (j < 0) j += size;
            if ((j < 0 || j >= size) && (u64)k < bad) bad = (u64)k;
        }}
    }}
    for (i64 e = RILL_FIRST; e < n; e += RILL_STEP) {{
        i64 k, t;
        if (rill_target(idx, e, m, size, inner, along, &k, &t)) rill_add(out + t, src[e]);
        else if ((u64)k < bad) bad = (u64)k;
    }}
    rill_report(bad, words, host, idx);
}}

extern "C" __global__ void __launch_bounds__({BLOCK}) k_claim(u64* claims, const {i}* idx, u64* words, u64* host,
        i64 n, i64 m, i64 size, i64 inner) {{
    u64 bad = RILL_NONE;
    for (i64 e = RILL_FIRST; e < n; e += RILL_STEP) {{
        i64 k, t;
        if (rill_target(idx, e, m, size, inner, 1, &k, &t)) atomicMax(claims + t, (u64)e + 1ull);
        else if ((u64)k < bad) bad = (u64)k;
    }}
    rill_report(bad, words, host, idx);
}}

extern "C" __global__ void __launch_bounds__({BLOCK}) k_assign({t}* out, const {t}* src, const u64* claims,
        const {i}* idx, i64 n, i64 m, i64 size, i64 inner) {{
    for (i64 e = RILL_FIRST; e < n; e += RILL_STEP) {{
        i64 k, t;
        if (rill_target(idx, e, m, size, inner, 1, &k, &t) && claims[t] == (u64)e + 1ull) out[t] = src[e];
    }}
}}

extern "C" __global__ void __launch_bounds__({BLOCK}) k_gather({t}* out, const {t}* x, const {i}* idx,
        u64* words, u64* host, i64 n, i64 m, i64 size, i64 inner) {{
    u64 bad = RILL_NONE;
    for (i64 e = RILL_FIRST; e < n; e += RILL_STEP) {{
        i64 k, t;
        {t} v = ({t})0;
        if (rill_target(idx, e, m, size, inner, 1, &k, &t)) v = x[t];
        else if ((u64)k < bad) bad = (u64)k;
        out[e] = v;
    }}
    rill_report(bad, words, host, idx);
}}
"#
    )
}

/// A grid-stride launch over `items` (at least one block: every block reports).
fn config(cs: &GpuStream<'_>, items: usize) -> LaunchConfig {
    let blocks = items.div_ceil(BLOCK as usize).clamp(1, cs.dev.sms.max(1) as usize * 32);
    LaunchConfig { grid_dim: (blocks as u32, 1, 1), block_dim: (BLOCK, 1, 1), shared_mem_bytes: 0 }
}

/// The launches of one node: its module, index storage (contiguous) and check slot.
struct Node<'a, 'c> {
    cs: &'a GpuStream<'c>,
    d: DType,
    idx: Storage,
    slot: Option<Slot>,
    op: &'static str,
}

impl<'a, 'c> Node<'a, 'c> {
    /// Checks the indices with a host wait first when no check slot is free.
    fn new(cs: &'a GpuStream<'c>, d: DType, idx: &Storage, op: &'static str, axis: usize, size: usize) -> Result<Self> {
        let idx = contiguous(cs, idx)?;
        let slot = Slot::get(cs)?;
        if slot.is_none() {
            check_now(cs, &idx, op, axis, size)?;
        }
        Ok(Node { cs, d, idx, slot, op })
    }

    /// Launches kernel `name` over `items` with the arguments `args` adds.
    fn launch(&self, name: &str, items: usize, args: impl FnOnce(&mut Launch)) -> Result<()> {
        let (d, it) = (self.d, self.idx.dtype);
        let key = format!("scatter:{}:{}", d.name(), it.name());
        let f = nvrtc::function(self.cs.driver(), &self.cs.dev, &key, name, || scatter_source(d, it))?;
        let _ = self.cs.bind();
        let mut lb = Launch::new(&f);
        args(&mut lb);
        // SAFETY: each caller passes its kernel's arguments in the kernel's order: device
        // pointers of contiguous buffers holding the counts it passes (the output in
        // whole words), an index array whose out-of-range entries are never followed,
        // and this node's check slot (or nulls), its own until the verdict is read.
        unsafe { lb.launch(self.cs, config(self.cs, items)) }.map_err(|e| super::backend_err("launch", e))
    }

    /// The check slot's (device, host) words, or nulls.
    fn words(&self) -> (u64, u64) {
        self.slot.as_ref().map(|s| (s.dev(), s.host())).unwrap_or((0, 0))
    }

    /// Registers the check with the batch: `out` fails if an index was bad.
    fn finish(self, out: &Storage, checks: &mut check::Batch, axis: usize, size: usize) {
        if let Some(s) = self.slot {
            checks.watch(out, s, self.op, axis, size);
        }
    }
}

/// A new contiguous output of `shape` in whole 4-byte words (the compare-and-swap of a
/// u8, f16 or bf16 add reads and writes the word around its element), holding `x`
/// (contiguous) and, for a put, zeroed claim words at `claims`; `k_init` comes from the
/// module of index dtype `it`, which holds the node's other kernels.
fn output(cs: &GpuStream<'_>, x: &Storage, it: DType, claims: u64) -> Result<Storage> {
    let (d, shape) = (x.dtype, &x.layout.shape);
    let n = x.layout.numel();
    let out = Storage::contiguous(Buffer::Cuda(CudaBuffer::alloc(cs, (n * d.size()).next_multiple_of(4))?), d, shape);
    if n > 0 {
        let xs = contiguous(cs, x)?;
        let key = format!("scatter:{}:{}", d.name(), it.name());
        let f = nvrtc::function(cs.driver(), &cs.dev, &key, "k_init", || scatter_source(d, it))?;
        let (po, px, n64) = (elem_ptr(&out), elem_ptr(&xs), n as i64);
        let _ = cs.bind();
        let mut lb = Launch::new(&f);
        lb.arg(&po).arg(&px).arg(&claims).arg(&n64);
        // SAFETY: `out` and `xs` hold `n` contiguous elements, `claims` (when not null)
        // `n` u64 words.
        unsafe { lb.launch(cs, config(cs, n)) }.map_err(|e| super::backend_err("launch", e))?;
    }
    Ok(out)
}

/// `x` with `updates` summed into the rows `idx` names along `axis` (inputs `x, idx,
/// updates`, the updates of `take(x, idx, axis)`'s shape).
pub(crate) fn scatter_add(
    cs: &GpuStream<'_>,
    inputs: &[&Storage],
    axis: usize,
    checks: &mut check::Batch,
) -> Result<Storage> {
    let (x, idx, updates) = (inputs[0], inputs[1], inputs[2]);
    let shape = &x.layout.shape;
    let (size, inner) = (shape[axis], shape[axis + 1..].iter().product::<usize>());
    let out = output(cs, x, idx.dtype, 0)?;
    let nidx = idx.layout.numel();
    if nidx == 0 {
        return Ok(out); // no index: nothing to add or check
    }
    let node = Node::new(cs, x.dtype, idx, "scatter_add", axis, size)?;
    let n = updates.layout.numel();
    let us = if n > 0 { contiguous(cs, updates)? } else { updates.clone() };
    let (po, pu, pi) = (elem_ptr(&out), elem_ptr(&us), elem_ptr(&node.idx));
    let (pw, ph) = node.words();
    let a = [n as i64, nidx as i64, size as i64, inner as i64];
    let (along, all) = (0i32, nidx as i64);
    node.launch("k_add", n.max(nidx), |lb| {
        lb.arg(&po).arg(&pu).arg(&pi).arg(&pw).arg(&ph).arg(&a[0]).arg(&a[1]).arg(&a[2]).arg(&a[3]);
        lb.arg(&along).arg(&all);
    })?;
    node.finish(&out, checks, axis, size);
    Ok(out)
}

/// `x` with `values` (the shape of `idx`) assigned, or summed when `accumulate`, at one
/// index per value along `axis` (inputs `x, idx, values`).
pub(crate) fn put_along_axis(
    cs: &GpuStream<'_>,
    inputs: &[&Storage],
    axis: usize,
    accumulate: bool,
    checks: &mut check::Batch,
) -> Result<Storage> {
    let (x, idx, values) = (inputs[0], inputs[1], inputs[2]);
    let op = if accumulate { "scatter_add_along_axis" } else { "put_along_axis" };
    let shape = &x.layout.shape;
    let (size, inner) = (shape[axis], shape[axis + 1..].iter().product::<usize>());
    let n = idx.layout.numel();
    let m = idx.layout.shape[axis];
    // One claim word per output element, for an assignment with something to assign.
    let claims = if accumulate || n == 0 { None } else { Some(CudaBuffer::alloc(cs, x.layout.numel() * 8)?) };
    let pc = claims.as_ref().map_or(0, |c| c.ptr());
    let out = output(cs, x, idx.dtype, pc)?;
    if n == 0 {
        return Ok(out);
    }
    let node = Node::new(cs, x.dtype, idx, op, axis, size)?;
    let vs = contiguous(cs, values)?;
    let (po, pv, pi) = (elem_ptr(&out), elem_ptr(&vs), elem_ptr(&node.idx));
    let (pw, ph) = node.words();
    let a = [n as i64, m as i64, size as i64, inner as i64];
    if accumulate {
        let (along, all) = (1i32, n as i64);
        node.launch("k_add", n, |lb| {
            lb.arg(&po).arg(&pv).arg(&pi).arg(&pw).arg(&ph).arg(&a[0]).arg(&a[1]).arg(&a[2]).arg(&a[3]);
            lb.arg(&along).arg(&all);
        })?;
    } else {
        node.launch("k_claim", n, |lb| {
            lb.arg(&pc).arg(&pi).arg(&pw).arg(&ph).arg(&a[0]).arg(&a[1]).arg(&a[2]).arg(&a[3]);
        })?;
        node.launch("k_assign", n, |lb| {
            lb.arg(&po).arg(&pv).arg(&pc).arg(&pi).arg(&a[0]).arg(&a[1]).arg(&a[2]).arg(&a[3]);
        })?;
    }
    node.finish(&out, checks, axis, size);
    Ok(out)
}

/// One element of `x` per index along `axis`; `x` and `idx` agree on every other axis and
/// the output has `idx`'s shape.
pub(crate) fn take_along_axis(
    cs: &GpuStream<'_>,
    x: &Storage,
    idx: &Storage,
    axis: usize,
    shape: &[usize],
    checks: &mut check::Batch,
) -> Result<Storage> {
    let size = x.layout.shape[axis];
    let (m, inner) = (shape[axis], shape[axis + 1..].iter().product::<usize>());
    let n: usize = shape.iter().product();
    let out = super::buffer::new_storage(cs, x.dtype, shape)?;
    if n == 0 {
        return Ok(out);
    }
    let node = Node::new(cs, x.dtype, idx, "take_along_axis", axis, size)?;
    let xs = contiguous(cs, x)?;
    let (po, px, pi) = (elem_ptr(&out), elem_ptr(&xs), elem_ptr(&node.idx));
    let (pw, ph) = node.words();
    let a = [n as i64, m as i64, size as i64, inner as i64];
    node.launch("k_gather", n, |lb| {
        lb.arg(&po).arg(&px).arg(&pi).arg(&pw).arg(&ph).arg(&a[0]).arg(&a[1]).arg(&a[2]).arg(&a[3]);
    })?;
    node.finish(&out, checks, axis, size);
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::cuda::nvrtc::check_compiles;

    #[test]
    fn scatter_kernels_compile_for_every_dtype_and_index_dtype() {
        let values = [
            DType::Bool,
            DType::U8,
            DType::U32,
            DType::I32,
            DType::I64,
            DType::F16,
            DType::BF16,
            DType::F32,
            DType::F64,
        ];
        for d in values {
            for it in [DType::U8, DType::U32, DType::I32, DType::I64] {
                if !check_compiles(&format!("test:scatter:{}:{}", d.name(), it.name()), &scatter_source(d, it)) {
                    return;
                }
            }
        }
    }
}
