//! f32 and f64 attention over more than one query row through cuBLAS: the scores of a
//! chunk of (batch, key/value head) planes are one batched product `S = Q Kᵀ` (the query
//! heads of a group are consecutive rows of one plane), `k_attn_rows` turns each row of
//! `S` into probabilities in place (scale, causal or array mask, softmax; a row with no
//! key left is 0), and a second batched product `O = P V` writes the output where it
//! belongs. The scores of at most [`SCORE_BYTES`] live at once: planes are taken in
//! chunks, or the rows of one plane when it alone is larger.
//!
//! The tensor-core kernel (`k_attn_tc`) covers f16/bf16, whose products run on tensor
//! cores; for f32 and f64 cuBLAS's products are much faster than the SIMT kernel's lane
//! per key, and the `[Tq, Tk]` scores cost only memory traffic. `RILL_ATTN_GEMM=0` turns
//! this path off (the SIMT kernel then runs), for comparison.

use cudarc::driver::LaunchConfig;

use crate::backend::Storage;
use crate::dtype::DType;
use crate::error::Result;
use crate::primitives::AttentionMaskKind;
use crate::shape::{Dims, Layout, Strides};
use crate::sync::OnceLock;

use super::attention::{PARAMS_SRC, attn_params, mask_src};
use super::buffer::new_storage;
use super::copy::make_contiguous;
use super::driver::GpuStream;
use super::launch::Launch;
use super::matmul::matmul_into;
use super::norm::elem_ptr;
use super::nvrtc;
use super::source::{PRELUDE, ctype, ftype};

/// Most bytes of scores held at once.
const SCORE_BYTES: usize = 512 << 20;
/// Threads of a `k_attn_rows` block (one block a row).
const ROW_THREADS: usize = 128;

fn enabled() -> bool {
    static ON: OnceLock<bool> = OnceLock::new();
    *ON.get_or_init(|| std::env::var("RILL_ATTN_GEMM").as_deref() != Ok("0"))
}

/// Whether attention of `dtype` over `tq` query rows, `tk` keys and head dimensions
/// `dk`/`dv` takes this path: f32 or f64 inputs (all of q, k and v), nonempty products,
/// and more than one query row (one row is the decode kernel's).
pub(crate) fn applies(inputs: &[&Storage], dtype: DType, tq: usize, tk: usize, dk: usize, dv: usize) -> bool {
    matches!(dtype, DType::F32 | DType::F64)
        && inputs[..3].iter().all(|s| s.dtype == dtype)
        && tq > 1
        && tk > 0
        && dk > 0
        && dv > 0
        && enabled()
}

/// The row kernel: `s[row, j] = softmax_j(s[row, j] * scale + mask)` in place, with keys
/// past the causal limit and rows with no key left written as 0. The row's maximum and
/// sum are each thread's running pair over its keys, combined across the block in a
/// fixed order.
pub(crate) fn rows_source(d: DType, kind: AttentionMaskKind, md: Option<DType>) -> String {
    let (t, f) = (ctype(d), ftype(d));
    let (exp, fmax) = if d == DType::F64 { ("exp", "fmax") } else { ("expf", "fmaxf") };
    let (mt, mexpr) = mask_src(kind, md, false, "om + i * p.mq + j * p.mk");
    let causal = (kind == AttentionMaskKind::Causal) as i32;
    let array = (kind == AttentionMaskKind::Array) as i32;
    let warps = ROW_THREADS / 32;
    format!(
        r#"{PRELUDE}
{PARAMS_SRC}
#define CAUSAL {causal}
#define ARRAY {array}
#define WARPS {warps}
// Merges the running (maximum, sum) pair (mo, lo) into (m, l).
__device__ __forceinline__ void merge({f}& m, {f}& l, {f} mo, {f} lo) {{
    const {f} n = {fmax}(m, mo);
    if (n == NEG_INF) return;
    l = (m == NEG_INF ? ({f})0 : l * {exp}(m - n)) + (mo == NEG_INF ? ({f})0 : lo * {exp}(mo - n));
    m = n;
}}
// Block `lr` takes row r0 + lr % nr of plane p0 + lr / nr of the scores `s` ([nr, Tk]
// rows a plane); the plane's rows are the `group` query heads of one key/value head.
extern "C" __global__ void __launch_bounds__({ROW_THREADS}) k_attn_rows({t}* s, const {mt}* mask, AttnP p, i64 nr, i64 r0, i64 p0, i64 group) {{
    __shared__ {f} sm[WARPS], sl[WARPS];
    const i64 lr = blockIdx.x;
    const i64 prow = r0 + lr % nr;
    const i64 i = prow % p.tq;
    {t}* row = s + lr * p.tk;
    i64 kend = p.tk;
    if (CAUSAL) {{ const i64 lim = i + p.tk - p.tq + 1; kend = lim < 0 ? 0 : (lim < kend ? lim : kend); }}
    i64 om = 0;
    if (ARRAY) {{
        const i64 pl = p0 + lr / nr;
        const i64 bh = (pl / p.hkv) * p.hq + (pl % p.hkv) * group + prow / p.tq;
        i64 a, b, c, e;
        attn_offsets(p, bh, a, b, c, om, e);
    }}
    const {f} scale = ({f})p.scale;
    {f} m = NEG_INF, l = 0;
    for (i64 j = threadIdx.x; j < kend; j += {ROW_THREADS}) {{
        {f} x = row[j] * scale;
        if (ARRAY) {mexpr}
        if (x > m) {{ l = (m == NEG_INF ? ({f})0 : l * {exp}(m - x)) + ({f})1; m = x; }}
        else if (x != NEG_INF) l += {exp}(x - m);
    }}
    for (int o = 16; o > 0; o >>= 1) merge(m, l, __shfl_xor_sync(0xffffffffu, m, o), __shfl_xor_sync(0xffffffffu, l, o));
    const int warp = threadIdx.x >> 5;
    if ((threadIdx.x & 31) == 0) {{ sm[warp] = m; sl[warp] = l; }}
    __syncthreads();
    m = sm[0]; l = sl[0];
    for (int w = 1; w < WARPS; ++w) merge(m, l, sm[w], sl[w]);
    for (i64 j = threadIdx.x; j < p.tk; j += {ROW_THREADS}) {{
        {f} x = row[j] * scale;
        if (ARRAY) {mexpr}
        row[j] = (j < kend && l > 0) ? {exp}(x - m) / l : ({f})0;
    }}
}}
"#
    )
}

/// A view of `s` at `off` elements past its offset, of `shape` and `strides`.
fn view(s: &Storage, off: usize, shape: [usize; 3], strides: [usize; 3]) -> Storage {
    s.with_layout(Layout {
        shape: Dims::from_slice(&shape),
        strides: strides.iter().map(|&x| x as isize).collect::<Strides>(),
        offset: s.layout.offset + off,
    })
}

/// Attention of `q, k, v` (inputs of [`applies`]) into a new contiguous `shape`, with the
/// array `mask` of a `kind` that has one; `ml` is the mask's layout broadcast to the
/// scores' shape.
#[allow(clippy::too_many_arguments)]
pub(crate) fn attention(
    cs: &GpuStream<'_>,
    inputs: &[&Storage],
    kind: AttentionMaskKind,
    mask: Option<&Storage>,
    ml: &Layout,
    scale: f64,
    shape: &[usize],
    dtype: DType,
) -> Result<Storage> {
    const NAME: &str = "scaled_dot_product_attention";
    let qs = &inputs[0].layout.shape;
    let nb = qs.len() - 3;
    let (hq, tq, dk) = (qs[nb], qs[nb + 1], qs[nb + 2]);
    let (hkv, tk) = (inputs[1].layout.shape[nb], inputs[1].layout.shape[nb + 1]);
    let dv = inputs[2].layout.shape[nb + 2];
    // Contiguous q, k, v: a plane's rows and keys are then one matrix each, planes one
    // stride apart.
    let dense = |s: &Storage| if s.layout.is_contiguous() { Ok(s.clone()) } else { make_contiguous(cs, s) };
    let (q, k, v) = (dense(inputs[0])?, dense(inputs[1])?, dense(inputs[2])?);
    let md = mask.map(|m| m.dtype);
    let out = new_storage(cs, dtype, shape)?;
    let ol = Layout::contiguous(shape);
    let p = attn_params(&qs[..nb], [&q.layout, &k.layout, &v.layout, ml, &ol], [hq, hkv, tq, tk], scale);
    let group = hq / hkv;
    let planes = qs[..nb].iter().product::<usize>() * hkv;
    let rows = group * tq;
    let row_bytes = tk * dtype.size();
    let (pc, rc) = if rows * row_bytes <= SCORE_BYTES {
        ((SCORE_BYTES / (rows * row_bytes)).min(planes), rows)
    } else {
        (1, (SCORE_BYTES / row_bytes).clamp(1, rows))
    };
    let scores = new_storage(cs, dtype, &[pc * rc * tk])?;
    let mname = md.map_or("none", |d| d.name());
    let key = format!("attn_rows:{}:{kind:?}:{mname}", dtype.name());
    let f = nvrtc::function(cs.driver(), &cs.dev, &key, "k_attn_rows", || rows_source(dtype, kind, md))?;
    let (ps, pm, g64) = (elem_ptr(&scores), mask.map_or(0, elem_ptr), group as i64);
    for p0 in (0..planes).step_by(pc) {
        let np = pc.min(planes - p0);
        for r0 in (0..rows).step_by(rc) {
            let nr = rc.min(rows - r0);
            let qv = view(&q, (p0 * rows + r0) * dk, [np, nr, dk], [rows * dk, dk, 1]);
            let kt = view(&k, p0 * tk * dk, [np, dk, tk], [tk * dk, 1, dk]);
            let sv = view(&scores, 0, [np, nr, tk], [nr * tk, tk, 1]);
            matmul_into(cs, &qv, &kt, &sv)?;
            let blocks = np * nr;
            if blocks > i32::MAX as usize {
                return Err(super::unsupported(NAME, format!("{blocks} thread blocks (at most 2^31 - 1)")));
            }
            let (nr64, r064, p064) = (nr as i64, r0 as i64, p0 as i64);
            let cfg = LaunchConfig {
                grid_dim: (blocks as u32, 1, 1),
                block_dim: (ROW_THREADS as u32, 1, 1),
                shared_mem_bytes: 0,
            };
            let _ = cs.bind();
            let mut lb = Launch::new(&f);
            lb.arg(&ps).arg(&pm).arg_slice(&p).arg(&nr64).arg(&r064).arg(&p064).arg(&g64);
            // SAFETY: the scores hold `np * nr` rows of `tk` elements; the mask is read
            // through its broadcast strides in `p`, within its storage.
            unsafe { lb.launch(cs, cfg) }.map_err(|e| super::backend_err("launch", e))?;
            let vv = view(&v, p0 * tk * dv, [np, tk, dv], [tk * dv, dv, 1]);
            let ov = view(&out, (p0 * rows + r0) * dv, [np, nr, dv], [rows * dv, dv, 1]);
            matmul_into(cs, &sv, &vv, &ov)?;
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::cuda::nvrtc::check_compiles;

    #[test]
    fn attention_row_kernels_compile() {
        for d in [DType::F32, DType::F64] {
            for (kind, md) in [
                (AttentionMaskKind::None, None),
                (AttentionMaskKind::Causal, None),
                (AttentionMaskKind::Array, Some(DType::Bool)),
                (AttentionMaskKind::Array, Some(DType::F16)),
                (AttentionMaskKind::Array, Some(d)),
            ] {
                if !check_compiles(&format!("test:attn_rows:{d}:{kind:?}:{md:?}"), &rows_source(d, kind, md)) {
                    return;
                }
            }
        }
    }
}
