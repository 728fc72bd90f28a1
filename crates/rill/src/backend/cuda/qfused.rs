//! The quantized product block (`BlockKind::QMatmul`, made by `compile/blocks.rs`) on a
//! GPU: `post(x @ wᵀ, extra..)` where `x` is read as it is, computed by an elementwise
//! program of the block's inputs, or RMS-normalised.
//!
//! Where the product takes the matrix-vector kernel (up to
//! [`MV_CHUNKED_ROWS`](super::quant::MV_CHUNKED_ROWS) rows of
//! `x`, not the tensor-core rows), `k_qmvf` is the matrix-vector kernel of every quantized
//! product ([`plain_source`]) with the `x` side and the post program inside: each `x` value it loads is the program's value (rounded to `x`'s dtype
//! as the program's kernel stores it) or the RMS norm's (each warp first sums its rows'
//! squares over the whole row, then scales each value and rounds it as the norm kernel
//! stores it), and each output is the post program of the rounded product. A decode step's
//! norm, gated activation and residual add then cost no kernels of their own. Every
//! operand is read through a row stride and a column stride (views of a joined
//! projection's output need no copy); one whose leading axes do not merge into one stride
//! is copied first. Every warp computes the `x` side for all its rows (with
//! `RILL_QMV_SHARED_X=1`, the block's threads compute it once into shared memory where the
//! rows fit, [`x_shared`]), so the program or
//! norm is computed inside only for up to [`PROLOGUE_MAX_ROWS`] rows of `x` (decode);
//! with more, its own kernel computes `x` once and `k_qmvf` reads it plainly, still with the
//! post program inside. Rows the matrix-vector kernel does not take run the ops one after
//! the other (program or norm kernel, the product's kernel, the post program's kernel), as
//! unfused. `RILL_QMV_FUSED=0` runs every block that way. A decode product is bound by
//! latency, not bandwidth: each warp prefetches its weight row into L2 before waiting for
//! the previous kernel (`RILL_OWN_WAIT`, see `launch.rs`).

use cudarc::driver::{CudaFunction, LaunchConfig};

use crate::backend::Storage;
use crate::backend::cuda::fused_src::{c_type, op_function};
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::primitives::fused::{FusedProgram, KernelMemo, QInput};
use crate::quant::QuantFormat;
use crate::shape::{broadcast_all, numel};

use super::buffer::new_storage;
use super::driver::GpuStream;
use super::launch::Launch;
use super::norm::elem_ptr;
use super::quant::{MV_MAX_ROWS, MV_WARPS, head, mv_applies};
use super::source::PRELUDE;
use super::{fused, norm, nvrtc};

const NAME: &str = "fused_qmatmul";

/// The memo form of `k_qmm_sum_post` (`k_qmvf`'s forms are 0 and 1).
const SUM_POST_FORM: u8 = 2;

/// Most output rows for which `k_qmvf` computes an RMS norm inside.
const NORM_INSIDE_MAX_N: usize = 16384;

/// Most rows of `x` for which `k_qmvf` computes the `x` side (program or norm) inside:
/// each of its `n` warps recomputes it, which at 64 rows of f32 cost more than the
/// product (`rill bench generate`, batch 64).
const PROLOGUE_MAX_ROWS: usize = 4;

/// Most shared memory `k_qmvf` takes for the `x` side it computes once per block
/// ([`x_shared`]).
const X_SHARED_BYTES: usize = 32 << 10;

/// Whether `k_qmvf` runs (`RILL_QMV_FUSED=0`: the block's ops one after the other, for
/// comparison).
fn enabled() -> bool {
    static ON: crate::sync::OnceLock<bool> = crate::sync::OnceLock::new();
    *ON.get_or_init(|| std::env::var("RILL_QMV_FUSED").as_deref() != Ok("0"))
}

/// `s` broadcast to `shape` as rows of its last axis: (first element's address, row
/// stride, column stride) in elements, or `None` when its leading axes do not merge.
fn rows_view(s: &Storage, shape: &[usize]) -> Option<(u64, i64, i64)> {
    let l = s.layout.broadcast_to(shape);
    let r = shape.len();
    let ptr = super::buffer::cuda_of(s).map(|b| b.ptr()).unwrap_or(0) + (l.offset * s.dtype.size()) as u64;
    if r == 0 {
        return Some((ptr, 0, 0));
    }
    let cs = if shape[r - 1] <= 1 { 0 } else { l.strides[r - 1] as i64 };
    let (mut rs, mut span): (Option<i64>, i64) = (None, 0);
    for a in (0..r - 1).rev() {
        if shape[a] <= 1 {
            continue;
        }
        let st = l.strides[a] as i64;
        match rs {
            None => {
                rs = Some(st);
                span = shape[a] as i64;
            }
            Some(row) => {
                if st != row * span {
                    return None;
                }
                span *= shape[a] as i64;
            }
        }
    }
    Some((ptr, rs.unwrap_or(0), cs))
}

/// The post program's operands as rows of the output `shape` ([`rows_of`]): the storages
/// to keep alive through the launch, and each one's (address, row stride, column stride).
#[allow(clippy::type_complexity)]
fn post_rows(cs: &GpuStream<'_>, extra: &[Storage], shape: &[usize]) -> Result<(Vec<Storage>, Vec<(u64, i64, i64)>)> {
    extra.iter().map(|s| rows_of(cs, s, shape)).collect::<Result<Vec<_>>>().map(|v| v.into_iter().unzip())
}

/// `s`, or its contiguous copy when it cannot be read as rows of `shape`.
fn rows_of(cs: &GpuStream<'_>, s: &Storage, shape: &[usize]) -> Result<(Storage, (u64, i64, i64))> {
    if let Some(v) = rows_view(s, shape) {
        return Ok((s.clone(), v));
    }
    let c = super::elementwise::copy(cs, s)?;
    let v = rows_view(&c, shape).ok_or_else(|| Error::invalid(NAME, "a contiguous copy has no row view"))?;
    Ok((c, v))
}

/// The plain `k_qmvf` (`x` read as it is, no post program): the matrix-vector kernel of
/// every quantized product (`quant::qmatmul`).
pub(crate) fn plain_source(f: QuantFormat, d: DType, mr: usize) -> String {
    source(f, d, mr, &QInput::Plain, None, d, false)
}

/// Whether `k_qmvf` computes a computed `x` side (program or norm) of `mr` rows of `k`
/// values once per block into shared memory, rather than in every warp. Only with
/// `RILL_QMV_SHARED_X=1` until this form has run on a GPU.
fn x_shared(input: &QInput, mr: usize, k: usize) -> bool {
    static ON: crate::sync::OnceLock<bool> = crate::sync::OnceLock::new();
    let on = *ON.get_or_init(|| std::env::var("RILL_QMV_SHARED_X").as_deref() == Ok("1"));
    on && !matches!(input, QInput::Plain) && mr * k * 4 <= X_SHARED_BYTES
}

/// The source of `k_qmvf` for `mr` rows of `x` per block; with `shared` ([`x_shared`])
/// the block's threads compute the `x` side together into shared memory first (the
/// norm's sum of squares summed across the block) and the warps read it from there.
fn source(
    f: QuantFormat,
    xd: DType,
    mr: usize,
    input: &QInput,
    post: Option<&FusedProgram>,
    out: DType,
    shared: bool,
) -> String {
    let mut s = head(f, xd);
    let mut params = vec![format!("{}* out", c_type(out)), "const u8* w".into(), "i64 n, i64 k, i64 m".into()];
    // XV(R, J): x's value at row r0 + R (R: the block's row), column J, as a float.
    let (xv, pre) = match input {
        QInput::Plain => {
            params.push("const XT* x0, i64 xr0, i64 xc0".into());
            ("LDX(x0[(r0 + (R)) * xr0 + (J) * xc0])".to_string(), String::new())
        }
        QInput::Program(p) => {
            s += &op_function(p).replace("fused_op(", "pre_op(");
            let mut args = Vec::new();
            for (i, &d) in p.input_dtypes().iter().enumerate() {
                params.push(format!("const {}* x{i}, i64 xr{i}, i64 xc{i}", c_type(d)));
                args.push(format!("x{i}[(r0 + (R)) * xr{i} + (J) * xc{i}]"));
            }
            (format!("LDX(pre_op({}))", args.join(", ")), String::new())
        }
        QInput::RmsNorm { has_weight, .. } => {
            params.push("const XT* x0, i64 xr0, i64 xc0, const XT* nw, i64 nwc, double eps_d".into());
            let wv = if *has_weight { " * LDX(nw[(J) * nwc])" } else { "" };
            // The norm kernel's value: (v - 0) * scale [* w], stored in x's dtype.
            let xv = format!("LDX(STO((LDX(x0[(r0 + (R)) * xr0 + (J) * xc0]) * inv[R]){wv}))");
            // Each row's sum of squares: a warp's lanes over the whole row, or with `shared`
            // the block's threads, whose four warps' sums meet in shared memory.
            let (first, step, warp_sum) = if shared {
                ("threadIdx.x", 128, "if (lane == 0) red[r][threadIdx.x >> 5] = s2;")
            } else {
                ("lane", 32, "inv[r] = 1.f / sqrtf(s2 / (float)k + (float)eps_d);")
            };
            let (head, tail) = if shared {
                (
                    "\n    __shared__ float red[MR][4];",
                    "    __syncthreads();\n    #pragma unroll\n    for (int r = 0; r < MR; r++) inv[r] = 1.f / sqrtf((red[r][0] + red[r][1] + red[r][2] + red[r][3]) / (float)k + (float)eps_d);\n",
                )
            } else {
                ("", "")
            };
            let pre = format!(
                r#"{head}
    float inv[MR];
    #pragma unroll
    for (int r = 0; r < MR; r++) {{
        if (r >= rows) break;
        float s2 = 0.f;
        for (i64 j = {first}; j < k; j += {step}) {{ const float u = LDX(x0[(r0 + r) * xr0 + j * xc0]); s2 += u * u; }}
        for (int o = 16; o > 0; o >>= 1) s2 += __shfl_xor_sync(0xffffffffu, s2, o);
        {warp_sum}
    }}
{tail}"#
            );
            (xv, pre)
        }
    };
    // ST(V, R): the output of row r0 + R at the warp's column from the product's float V.
    // The post program's other operands are loaded first (`fetch`), so that they are in
    // flight with the weights rather than after the product.
    let mut fetch = String::new();
    let st = match post {
        None => "STO(V)".to_string(),
        Some(p) => {
            s += &op_function(p).replace("fused_op(", "post_op(");
            let mut args = vec!["STO(V)".to_string()];
            for (i, &d) in p.input_dtypes().iter().enumerate().skip(1) {
                let ct = c_type(d);
                params.push(format!("const {ct}* e{i}, i64 er{i}, i64 ec{i}"));
                fetch += &format!(
                    "    {ct} pe{i}[MR];\n    #pragma unroll\n    for (int r = 0; r < MR; r++) if (r < rows && row < n) pe{i}[r] = e{i}[(r0 + r) * er{i} + row * ec{i}];\n"
                );
                args.push(format!("pe{i}[R]"));
            }
            format!("post_op({})", args.join(", "))
        }
    };
    // With `shared`, XV reads what the block computed (XS, the value the warp would).
    let (xv, shx) = if shared {
        let fill = r#"
    extern __shared__ float xsh[];
    #pragma unroll
    for (int r = 0; r < MR; r++) {
        if (r >= rows) break;
        for (i64 j = threadIdx.x; j < k; j += 128) xsh[r * k + j] = XS(r, j);
    }
    __syncthreads();
"#;
        ("xsh[(R) * k + (J)]".to_string(), format!("#define XS(R, J) ({xv})\n{fill}"))
    } else {
        (xv, String::new())
    };
    let body = r#"
#define MR $MR
#define XV(R, J) ($XV)
#define ST(V, R) ($ST)
extern "C" __global__ void __launch_bounds__(128) k_qmvf($PARAMS) { RILL_OWN_WAIT
    const int lane = threadIdx.x & 31, p = lane & 3;
    const i64 r0 = (i64)blockIdx.y * MR;
    const int rows = (int)(m - r0 < MR ? m - r0 : MR);
    const i64 row = (i64)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    // The warp's weight row goes to L2 while the previous kernel still runs (a decode
    // product is bound by this latency, not by bandwidth); every other read waits.
    {
        const i64 bytes = row < n ? (k >> 5) * BB : 0;
        const u8* wp = w + row * bytes;
        if (bytes > 0) for (i64 o = lane * 128; o < bytes + 127; o += 32 * 128) rill_prefetch_l2(wp + (o < bytes ? o : bytes - 1));
    }
    rill_grid_wait();
$FETCH$PRE$SHARED
    if (row >= n) return;
    const i64 nb = k >> 5;
    const u8* wr = w + row * nb * BB;
    float acc[MR];
    #pragma unroll
    for (int r = 0; r < MR; r++) acc[r] = 0.f;
    // Several blocks' loads in flight at once: a decode product is a few blocks a lane.
    #pragma unroll 4
    for (i64 b = lane >> 2; b < nb; b += 8) {
        const u8* blk = wr + b * BB;
        const float d = qscale(blk), mn = qmin(blk);
        float q[8];
        part_codes(blk, p, q);
        #pragma unroll
        for (int r = 0; r < MR; r++) {
            if (r >= rows) break;
            float s = 0.f, sx = 0.f;
            #pragma unroll
            for (int i = 0; i < 8; i++) {
                const float xv = XV(r, b * 32 + part_idx(p, i));
                s += q[i] * xv;
                sx += xv;
            }
#if QFMT == 0
            acc[r] += d * (s - 8.f * sx);
            (void)mn;
#elif QFMT == 1
            acc[r] += d * s + mn * sx;
#else
            acc[r] += d * s;
            (void)sx; (void)mn;
#endif
        }
    }
    #pragma unroll
    for (int r = 0; r < MR; r++) {
        if (r >= rows) break;
        float v = acc[r];
        for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
        if (lane == 0) out[(r0 + r) * n + row] = ST(v, r);
    }
}
"#;
    s + &body
        .replace("$MR", &mr.to_string())
        .replace("$XV", &xv)
        .replace("$ST", &st)
        .replace("$PARAMS", &params.join(", "))
        .replace("$FETCH", &fetch)
        .replace("$SHARED", &shx)
        .replace("$PRE", &pre)
}

/// The block `post(x @ wᵀ, extra..)`: `xins` are the `x` side's inputs (`input`), `extra`
/// the post program's inputs after the product; the result has `shape` and `dtype`.
#[allow(clippy::too_many_arguments)]
pub(crate) fn qmatmul_block(
    cs: &GpuStream<'_>,
    format: QuantFormat,
    input: &QInput,
    post: Option<&FusedProgram>,
    memo: &KernelMemo,
    inputs: &[Storage],
    shape: &[usize],
    dtype: DType,
) -> Result<Storage> {
    let nx = input.arity();
    if inputs.len() < nx + 1 {
        return Err(Error::invalid(NAME, format!("{} inputs, expected at least {}", inputs.len(), nx + 1)));
    }
    let (xins, w, extra) = (&inputs[..nx], &inputs[nx], &inputs[nx + 1..]);
    let (xd, xshape) = match input {
        QInput::Program(p) => {
            let shapes: Vec<&[usize]> = xins.iter().map(|s| &s.layout.shape[..]).collect();
            (p.output_dtype(), broadcast_all(NAME, &shapes)?)
        }
        QInput::Plain | QInput::RmsNorm { .. } => (xins[0].dtype, xins[0].layout.shape.to_vec()),
    };
    let k = xshape.last().copied().unwrap_or(0);
    let n = w.layout.shape.first().copied().unwrap_or(0);
    let mut pshape = xshape.clone();
    pshape.pop();
    pshape.push(n);
    let m = numel(&pshape).checked_div(n).unwrap_or(0);
    let post_ok = post.is_none_or(|p| p.input_dtypes().first() == Some(&xd) && p.output_dtype() == dtype);
    let fused_kernel = enabled()
        && post_ok
        && pshape == shape
        && k > 0
        && m > 0
        && mv_applies(xd, k, m)
        && w.layout.is_contiguous()
        && elem_ptr(w).is_multiple_of(4);
    if !fused_kernel {
        // The ops one after the other, as unfused; a tiled product split over K adds its
        // partial sums in the post program's kernel.
        let x = x_alone(cs, input, xins, &xshape, xd)?;
        let add = post
            .filter(|_| enabled() && post_ok && pshape == shape)
            .map(|p| move |part: &Storage, splits: usize| sum_post(cs, p, memo, part, splits, xd, extra, shape, dtype));
        let add = add.as_ref().map(|f| f as super::quant::AddSplits<'_>);
        let (product, posted) = super::quant::qmatmul_with(cs, &x, w, format, &pshape, xd, add)?;
        return match post {
            _ if posted => Ok(product),
            None => Ok(product),
            Some(p) => {
                let mut ins = vec![product];
                ins.extend(extra.iter().cloned());
                fused::fused(cs, p, &ins, shape, dtype)
            }
        };
    }
    // Every warp computes the x side of its rows: with more rows of x, or (a norm, which
    // sums whole rows) many output rows (an output head), the op's own kernel, once, costs
    // less. The plain kernel is memoised under its own form.
    let outside = match input {
        QInput::Plain => false,
        _ if m > PROLOGUE_MAX_ROWS => true,
        QInput::RmsNorm { .. } => n > NORM_INSIDE_MAX_N,
        QInput::Program(_) => false,
    };
    if outside {
        let x = x_alone(cs, input, xins, &xshape, xd)?;
        return qmvf(cs, format, &QInput::Plain, post, (memo, 1), &[x], &xshape, xd, w, extra, shape, dtype);
    }
    qmvf(cs, format, input, post, (memo, 0), xins, &xshape, xd, w, extra, shape, dtype)
}

/// The source of `k_qmm_sum_post`: each output is the post program of the splits'
/// partial sums added in split order and rounded to `xd` (the product's value, as
/// `k_qmm_sum` stores it), with the program's other operands read as rows.
fn sum_post_source(xd: DType, post: &FusedProgram, out: DType) -> String {
    let mut s = format!(
        "{PRELUDE}\ntypedef {} XT;\n#define STO(v) ({})\n",
        c_type(xd),
        super::source::store_float(xd, "v", false)
    );
    s += &op_function(post).replace("fused_op(", "post_op(");
    let mut params = vec![format!("{}* out", c_type(out)), "const float* part, i64 total, i64 splits, i64 n".into()];
    let mut args = vec!["STO(v)".to_string()];
    for (i, &d) in post.input_dtypes().iter().enumerate().skip(1) {
        params.push(format!("const {}* e{i}, i64 er{i}, i64 ec{i}", c_type(d)));
        args.push(format!("e{i}[r * er{i} + c * ec{i}]"));
    }
    s + &format!(
        r#"
extern "C" __global__ void k_qmm_sum_post({}) {{
    const i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= total) return;
    const i64 r = i / n, c = i % n;
    float v = part[i];
    for (i64 t = 1; t < splits; t++) v += part[t * total + i];
    out[i] = post_op({});
}}
"#,
        params.join(", "),
        args.join(", ")
    )
}

/// `post(product, extra..)` from a split product's f32 partial sums (`splits` of `shape`),
/// in one kernel.
#[allow(clippy::too_many_arguments)]
fn sum_post(
    cs: &GpuStream<'_>,
    post: &FusedProgram,
    memo: &KernelMemo,
    part: &Storage,
    splits: usize,
    xd: DType,
    extra: &[Storage],
    shape: &[usize],
    dtype: DType,
) -> Result<Storage> {
    let total = numel(shape);
    let n = shape.last().copied().unwrap_or(1).max(1);
    let out = new_storage(cs, dtype, shape)?;
    let mut key = Vec::with_capacity(8);
    key.extend((cs.dev.ordinal as u32).to_le_bytes());
    key.extend(0u32.to_le_bytes());
    key.push(SUM_POST_FORM);
    let func: CudaFunction = memo.get_or_try_insert(&key, || {
        let src = sum_post_source(xd, post, dtype);
        nvrtc::function(cs.driver(), &cs.dev, &format!("qmm_sum_post:{src}"), "k_qmm_sum_post", || src)
    })?;
    let (keep, views) = post_rows(cs, extra, shape)?;
    let (po, pp) = (elem_ptr(&out), elem_ptr(part));
    let (t64, s64, n64) = (total as i64, splits as i64, n as i64);
    let _ = cs.bind();
    let mut lb = Launch::new(&func);
    lb.arg(&po).arg(&pp).arg(&t64).arg(&s64).arg(&n64);
    for (p, r, c) in &views {
        lb.arg(p).arg(r).arg(c);
    }
    // SAFETY: `part` holds splits·total f32, `out` total contiguous elements of `dtype`;
    // each post operand addresses rows of `shape` at the strides passed beside it, inside
    // its buffer; a thread per output; the arguments follow `sum_post_source`'s list.
    unsafe { lb.launch(cs, nvrtc::grid_for(total)) }.map_err(|e| super::backend_err("launch", e))?;
    drop(keep);
    Ok(out)
}

/// The block's `x` computed by its op's own kernel (the program's or the norm's).
fn x_alone(cs: &GpuStream<'_>, input: &QInput, xins: &[Storage], xshape: &[usize], xd: DType) -> Result<Storage> {
    match input {
        QInput::Plain => Ok(xins[0].clone()),
        QInput::Program(p) => fused::fused(cs, p, xins, xshape, xd),
        QInput::RmsNorm { eps, has_weight } => norm::rms_norm(cs, xins, *eps, *has_weight),
    }
}

/// Launches `k_qmvf` (`memo.1` tells the kernel's form apart in the block's memo).
#[allow(clippy::too_many_arguments)]
fn qmvf(
    cs: &GpuStream<'_>,
    format: QuantFormat,
    input: &QInput,
    post: Option<&FusedProgram>,
    (memo, form): (&KernelMemo, u8),
    xins: &[Storage],
    xshape: &[usize],
    xd: DType,
    w: &Storage,
    extra: &[Storage],
    shape: &[usize],
    dtype: DType,
) -> Result<Storage> {
    let k = xshape.last().copied().unwrap_or(0);
    let n = w.layout.shape.first().copied().unwrap_or(0);
    let m = numel(shape) / n.max(1);
    let out = new_storage(cs, dtype, shape)?;
    let mr = m.min(MV_MAX_ROWS);
    let shared = x_shared(input, mr, k);
    let mut key = Vec::with_capacity(8);
    key.extend((cs.dev.ordinal as u32).to_le_bytes());
    key.extend((mr as u32).to_le_bytes());
    key.push(form);
    key.push(shared as u8);
    let func: CudaFunction = memo.get_or_try_insert(&key, || {
        let src = source(format, xd, mr, input, post, dtype, shared);
        nvrtc::function(cs.driver(), &cs.dev, &format!("qmvf:{src}"), "k_qmvf", || src)
    })?;
    // Operands as rows: the x side over x's shape, the post's over the output's.
    let mut keep: Vec<Storage> = Vec::new();
    let mut views: Vec<(u64, i64, i64)> = Vec::new();
    for s in xins {
        let at = match input {
            QInput::RmsNorm { .. } if views.len() == 1 => vec![k],
            _ => xshape.to_vec(),
        };
        let (c, v) = rows_of(cs, s, &at)?;
        keep.push(c);
        views.push(v);
    }
    let (post_keep, post_views) = post_rows(cs, extra, shape)?;
    keep.extend(post_keep);
    let (po, pw) = (elem_ptr(&out), elem_ptr(w));
    let (n64, k64, m64) = (n as i64, k as i64, m as i64);
    let grid = n.div_ceil(MV_WARPS as usize).clamp(1, 1 << 30) as u32;
    let chunks = m.div_ceil(mr) as u32;
    let smem = if shared { (mr * k * 4) as u32 } else { 0 };
    let cfg = LaunchConfig { grid_dim: (grid, chunks, 1), block_dim: (32 * MV_WARPS, 1, 1), shared_mem_bytes: smem };
    let _ = cs.bind();
    let mut lb = Launch::new(&func);
    lb.arg(&po).arg(&pw).arg(&n64).arg(&k64).arg(&m64);
    match input {
        QInput::RmsNorm { eps, .. } => {
            let (p0, r0, c0) = views[0];
            let (pn, _, cn) = views.get(1).copied().unwrap_or((0, 0, 0));
            lb.arg(&p0).arg(&r0).arg(&c0).arg(&pn).arg(&cn).arg(eps);
        }
        QInput::Plain | QInput::Program(_) => {
            for (p, r, c) in &views {
                lb.arg(p).arg(r).arg(c);
            }
        }
    }
    for (p, r, c) in &post_views {
        lb.arg(p).arg(r).arg(c);
    }
    // SAFETY: each operand pointer addresses a view of `m` rows (x side: `k` columns;
    // post side: `n`) at the row and column strides passed beside it, inside its buffer
    // (broadcast axes have stride 0); `w` holds n rows of k/32 blocks from a 4-byte aligned
    // first byte; `out` m*n contiguous elements of the output dtype; the grid covers the n
    // rows (a warp each, the rest return) and the m rows in chunks of `mr`; the arguments
    // follow `k_qmvf`'s parameter list as `source` wrote it.
    unsafe { lb.launch(cs, cfg) }.map_err(|e| super::backend_err("launch", e))?;
    drop(keep);
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::cuda::nvrtc::check_compiles;
    use crate::primitives::BinaryOp;
    use crate::primitives::UnaryOp;
    use crate::primitives::fused::Builder;

    /// `silu(a) * b` in `d`.
    fn gated(d: DType) -> FusedProgram {
        let mut b = Builder::default();
        let (x, y) = (b.load(0, d), b.load(1, d));
        let s = b.push(crate::primitives::fused::Inst::Unary(UnaryOp::Silu, x), d);
        let o = b.push(crate::primitives::fused::Inst::Binary(BinaryOp::Mul, s, y), d);
        b.finish(o)
    }

    /// `p + r` in `d`.
    fn residual(d: DType) -> FusedProgram {
        let mut b = Builder::default();
        let (x, y) = (b.load(0, d), b.load(1, d));
        let o = b.push(crate::primitives::fused::Inst::Binary(BinaryOp::Add, x, y), d);
        b.finish(o)
    }

    #[test]
    fn fused_qmv_kernels_compile_for_sm90() {
        for f in [QuantFormat::Q4_0, QuantFormat::Q4_1, QuantFormat::Q8_0] {
            for d in [DType::F32, DType::BF16, DType::F16] {
                let inputs = [
                    QInput::Plain,
                    QInput::Program(gated(d)),
                    QInput::RmsNorm { eps: 1e-5, has_weight: true },
                    QInput::RmsNorm { eps: 1e-5, has_weight: false },
                ];
                for (i, input) in inputs.iter().enumerate() {
                    for post in [None, Some(residual(d))] {
                        for (mr, shared) in [(1, false), (8, false), (1, true), (4, true)] {
                            if shared && matches!(input, QInput::Plain) {
                                continue;
                            }
                            let key =
                                format!("test:qmvf:{}:{}:{i}:{}:{mr}:{shared}", f.name(), d.name(), post.is_some());
                            if !check_compiles(&key, &source(f, d, mr, input, post.as_ref(), d, shared)) {
                                return;
                            }
                        }
                    }
                }
            }
        }
        for d in [DType::BF16, DType::F16, DType::F32] {
            if !check_compiles(&format!("test:qmm_sum_post:{}", d.name()), &sum_post_source(d, &residual(d), d)) {
                return;
            }
        }
    }

    #[test]
    fn row_views_merge_leading_axes() {
        use crate::backend::Storage;
        use crate::shape::Layout;
        let view = |shape: &[usize], strides: &[isize]| {
            let mut s = Storage::contiguous(
                crate::backend::Buffer::Cpu(crate::backend::cpu::CpuBuffer::alloc(DType::F32, 4096).unwrap()),
                DType::F32,
                &[4096],
            );
            s.layout = Layout { shape: shape.into(), strides: strides.into(), offset: 0 };
            s
        };
        // A slice of a joined projection's output: rows of 3072, the first 1536 columns.
        assert_eq!(
            rows_view(&view(&[1, 2, 1536], &[6144, 3072, 1]), &[1, 2, 1536]).map(|v| (v.1, v.2)),
            Some((3072, 1))
        );
        // Leading axes that merge, and ones that do not.
        assert_eq!(rows_view(&view(&[2, 3, 8], &[24, 8, 1]), &[2, 3, 8]).map(|v| (v.1, v.2)), Some((8, 1)));
        assert!(rows_view(&view(&[2, 3, 8], &[48, 8, 1]), &[2, 3, 8]).is_none());
        // A row broadcast along the rows, and a column per row.
        assert_eq!(rows_view(&view(&[8], &[1]), &[4, 8]).map(|v| (v.1, v.2)), Some((0, 1)));
        assert_eq!(rows_view(&view(&[4, 1], &[1, 1]), &[4, 8]).map(|v| (v.1, v.2)), Some((1, 0)));
    }
}
