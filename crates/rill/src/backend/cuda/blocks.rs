//! Fused blocks on a GPU (`compile/blocks.rs` makes them).
//!
//! - A matmul block whose program is a cuBLASLt epilogue (`act(c * a @ b + residual +
//!   bias)` with ReLU or the tanh GELU, `c` a constant passed as alpha) is one `cublasLtMatmul` with `CUBLASLT_EPILOGUE_BIAS`,
//!   `RELU_BIAS`, `GELU_BIAS` (or their forms without a bias) and the residual as the C
//!   matrix with beta = 1 (`matmul::matmul_epilogue`): the epilogue works on the f32
//!   accumulator, so f16/bf16 results round once where the unfused ops round after each
//!   op. Other programs (the erf GELU, a residual added after the activation, scales),
//!   batched products, and operands cuBLASLt does not take run the product and then the
//!   program's generated kernel.
//! - A residual norm is the normalisation kernel reading `x + r` (rounded as the add
//!   kernel stores it) and, when the sum is kept, storing it in the same pass
//!   (`norm::residual_norm`).
//! - A multi-tensor block is one generated kernel for up to [`MAX_MEMBERS`] tensors per
//!   launch: the program as `fused_op` (the fused kernels' own source), a table of each
//!   member's pointers and element count passed by value, `blockIdx.y` picking the
//!   member and a grid-stride loop over its elements. A program of several outputs
//!   stores each through a reference, `n` elements after the one before.
//! - A quantized product block is `qfused.rs`'s.

use cudarc::driver::LaunchConfig;

use crate::backend::Storage;
use crate::backend::cuda::fused_src::{FUSED_BLOCK, c_type, op_function};
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::primitives::fused::{BlockKind, FusedBlock, FusedProgram};
use crate::runtime::stats;
use crate::shape::numel;
use crate::sync::atomic::Ordering::Relaxed;

use super::buffer::new_storage;
use super::driver::GpuStream;
use super::launch::Launch;
use super::norm::elem_ptr;
use super::source::PRELUDE;
use super::{fused, matmul, norm, nvrtc};

/// Most members one multi-tensor launch takes (its table must fit the 4 KiB of kernel
/// parameters).
pub(crate) const MAX_MEMBERS: usize = 64;

/// Bytes of kernel parameters the member table may use.
const TABLE_BYTES: usize = 4000;

/// Computes a fused block on `cs`.
pub(crate) fn block(
    cs: &GpuStream<'_>,
    b: &FusedBlock,
    inputs: &[Storage],
    shape: &[usize],
    dtype: DType,
) -> Result<Storage> {
    match &b.kind {
        BlockKind::Matmul { program, lt } => {
            let [a, w, extra @ ..] = inputs else {
                return Err(Error::invalid(b.name(), format!("{} inputs, expected at least 2", inputs.len())));
            };
            if let Some(lt) = lt {
                // Program input k is node input k + 1.
                let operand = |k: Option<usize>| k.and_then(|k| inputs.get(k + 1));
                let out = matmul::matmul_epilogue(
                    cs,
                    a,
                    w,
                    (operand(lt.bias), operand(lt.residual)),
                    lt.act,
                    f32::from_bits(lt.alpha),
                    shape,
                    dtype,
                )?;
                if let Some(out) = out {
                    stats::MATMUL_EPILOGUES_LT.fetch_add(1, Relaxed);
                    return Ok(out);
                }
            }
            // The product in its own dtype (the program may cast it: `(x @ w).astype(..)`).
            let pd = program.input_dtypes.first().copied().unwrap_or(dtype);
            let product = matmul::matmul(cs, a, w, shape, pd)?;
            let mut ins = vec![product];
            ins.extend(extra.iter().cloned());
            stats::MATMUL_EPILOGUE_KERNELS.fetch_add(1, Relaxed);
            fused::fused(cs, program, &ins, shape, dtype)
        }
        BlockKind::ResidualNorm { eps, rms, has_weight, has_bias, keep_sum } => {
            let need = 2 + *has_weight as usize + *has_bias as usize;
            if inputs.len() != need || inputs[0].layout.shape != inputs[1].layout.shape {
                return Err(Error::invalid(b.name(), "inputs do not fit the block"));
            }
            let out = norm::residual_norm(cs, inputs, *eps, (*has_weight, *has_bias, *rms), *keep_sum)?;
            stats::RESIDUAL_NORMS.fetch_add(1, Relaxed);
            Ok(out)
        }
        BlockKind::Multi { program, sizes, scalar } => multi(cs, b, program, sizes, scalar, inputs, shape, dtype),
        BlockKind::QMatmul { format, input, post, kernels } => {
            super::qfused::qmatmul_block(cs, *format, input, post.as_ref(), kernels, inputs, shape, dtype)
        }
    }
}

/// Members per launch for a program of `k` inputs.
fn members_per_launch(k: usize) -> usize {
    (TABLE_BYTES / (8 * (k + 2))).clamp(1, MAX_MEMBERS)
}

/// The multi-tensor kernel of `p` for `t` members per launch; `scalar[k]`: input `k` is
/// one element.
pub(crate) fn multi_source(p: &FusedProgram, scalar: &[bool], t: usize) -> String {
    use std::fmt::Write;
    let mut s = format!("{PRELUDE}\n{}", op_function(p));
    let out_t = c_type(p.output_dtype());
    let _ = write!(s, "struct rill_multi_p {{ {out_t}* out[{t}]; ");
    for (k, &d) in p.input_dtypes().iter().enumerate() {
        let _ = write!(s, "const {}* in{k}[{t}]; ", c_type(d));
    }
    let _ = writeln!(s, "unsigned long long n[{t}]; }};");
    let _ = writeln!(s, "extern \"C\" __global__ void __launch_bounds__({FUSED_BLOCK}) rill_multi(rill_multi_p p) {{");
    let _ = writeln!(s, "  const unsigned m = blockIdx.y;");
    let _ = writeln!(s, "  const unsigned long long n = p.n[m];");
    let _ = writeln!(s, "  {out_t}* __restrict__ out = p.out[m];");
    let mut args = Vec::new();
    for (k, &d) in p.input_dtypes().iter().enumerate() {
        let ct = c_type(d);
        let _ = writeln!(s, "  const {ct}* __restrict__ in{k} = p.in{k}[m];");
        if scalar[k] {
            let _ = writeln!(s, "  const {ct} s{k} = in{k}[0];");
            args.push(format!("s{k}"));
        } else {
            args.push(format!("in{k}[i]"));
        }
    }
    let _ = writeln!(s, "  const unsigned long long step = (unsigned long long)gridDim.x * blockDim.x;");
    let _ = writeln!(
        s,
        "  for (unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += step)"
    );
    if p.more.is_empty() {
        let _ = writeln!(s, "    out[i] = fused_op({});", args.join(", "));
    } else {
        // A member's outputs one after the other, `n` elements each.
        args.extend(
            (0..p.output_count()).map(|j| if j == 0 { "out[i]".to_string() } else { format!("out[{j} * n + i]") }),
        );
        let _ = writeln!(s, "    fused_op({});", args.join(", "));
    }
    let _ = writeln!(s, "}}");
    s
}

#[allow(clippy::too_many_arguments)]
fn multi(
    cs: &GpuStream<'_>,
    b: &FusedBlock,
    p: &FusedProgram,
    sizes: &[usize],
    scalar: &[bool],
    inputs: &[Storage],
    shape: &[usize],
    dtype: DType,
) -> Result<Storage> {
    let k = scalar.len();
    let total: usize = sizes.iter().sum();
    let outs = p.output_count();
    if inputs.len() != k * sizes.len()
        || p.input_dtypes().len() != k
        || shape != [total * outs]
        || dtype != p.output_dtype()
    {
        return Err(Error::invalid(b.name(), "inputs do not fit the block"));
    }
    for (i, s) in inputs.iter().enumerate() {
        let want = if scalar[i % k] { 1 } else { sizes[i / k] };
        if numel(&s.layout.shape) != want || s.dtype != p.input_dtypes()[i % k] {
            return Err(Error::invalid(b.name(), format!("input {i} does not fit the block")));
        }
    }
    let out = new_storage(cs, dtype, shape)?;
    if total == 0 {
        return Ok(out);
    }
    // Full inputs are read as contiguous runs.
    let flat: Vec<Storage> =
        inputs
            .iter()
            .enumerate()
            .map(|(i, s)| {
                if scalar[i % k] || s.layout.is_contiguous() { Ok(s.clone()) } else { super::elementwise::copy(cs, s) }
            })
            .collect::<Result<_>>()?;
    let t = members_per_launch(k);
    let mut key = vec![b'm', cs.dev.ordinal as u8, t as u8];
    key.extend(scalar.iter().map(|&s| s as u8));
    let f = p.kernels.get_or_try_insert(&key, || {
        let src = multi_source(p, scalar, t);
        nvrtc::function(cs.driver(), &cs.dev, &format!("multi:{src}"), "rill_multi", || src)
    })?;
    let size = dtype.size() as u64;
    let base = elem_ptr(&out);
    let mut offsets = Vec::with_capacity(sizes.len());
    let mut off = 0u64;
    for &n in sizes {
        offsets.push(off);
        off += (n * outs) as u64;
    }
    let _ = cs.bind();
    for start in (0..sizes.len()).step_by(t) {
        let end = (start + t).min(sizes.len());
        // The table: out[t], in0[t], .., in{k-1}[t], n[t] (unused entries zero).
        let mut table = vec![0u64; t * (k + 2)];
        for (j, m) in (start..end).enumerate() {
            table[j] = base + offsets[m] * size;
            for kk in 0..k {
                table[t * (1 + kk) + j] = elem_ptr(&flat[m * k + kk]);
            }
            table[t * (k + 1) + j] = sizes[m] as u64;
        }
        let longest = sizes[start..end].iter().copied().max().unwrap_or(1);
        let gx = longest.div_ceil(FUSED_BLOCK as usize * 4).clamp(1, 65535) as u32;
        let cfg = LaunchConfig {
            grid_dim: (gx, (end - start) as u32, 1),
            block_dim: (FUSED_BLOCK, 1, 1),
            shared_mem_bytes: 0,
        };
        let mut l = Launch::new(&f);
        l.arg_slice(&table);
        // SAFETY: the table matches the kernel's parameter struct (8-byte fields in
        // declaration order); each member's pointers cover its `n` elements (one for
        // scalar inputs) and its piece of `out`; the grid's y extent is the members listed.
        unsafe { l.launch(cs, cfg) }.map_err(|e| super::backend_err("launch", e))?;
        stats::MULTI_TENSOR_LAUNCHES.fetch_add(1, Relaxed);
        stats::MULTI_TENSOR_MEMBERS.fetch_add((end - start) as u64, Relaxed);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::cuda::nvrtc::check_compiles;
    use crate::primitives::BinaryOp;
    use crate::primitives::fused::{Builder, Inst};

    /// An Adam-like update `p - lr * m / (sqrt(v) + eps)` of dtype `d` with scalar `lr`.
    fn update(d: DType) -> FusedProgram {
        let mut b = Builder::default();
        let (p, lr, m, v) = (b.load(0, d), b.load(1, d), b.load(2, d), b.load(3, d));
        let s = b.push(Inst::Unary(crate::primitives::UnaryOp::Sqrt, v), d);
        let e = b.constant(1e-8, d);
        let den = b.push(Inst::Binary(BinaryOp::Add, s, e), d);
        let q = b.push(Inst::Binary(BinaryOp::Div, m, den), d);
        let step = b.push(Inst::Binary(BinaryOp::Mul, lr, q), d);
        let out = b.push(Inst::Binary(BinaryOp::Sub, p, step), d);
        b.finish(out)
    }

    #[test]
    fn multi_tensor_kernels_compile_for_sm90() {
        for d in [DType::F32, DType::F16, DType::BF16, DType::F64] {
            let p = update(d);
            let t = members_per_launch(4);
            if !check_compiles(&format!("test:multi:{}", d.name()), &multi_source(&p, &[false, true, false, false], t))
            {
                return;
            }
        }
    }

    /// The update of `update` that also stores `sqrt(v) + eps` and `m / den`: a program
    /// of three outputs, each stored `n` elements after the one before.
    #[test]
    fn multi_output_kernels_store_every_output() {
        for d in [DType::F32, DType::F16, DType::BF16, DType::F64] {
            let one = update(d);
            // Registers of `update`: p, lr, m, v, sqrt, eps, den, q, step, out.
            let p = FusedProgram { more: vec![6, 7], ..one };
            let src = multi_source(&p, &[false, true, false, false], members_per_launch(4));
            assert!(
                src.contains("fused_op(in0[i], s1, in2[i], in3[i], out[i], out[1 * n + i], out[2 * n + i]);"),
                "{src}"
            );
            assert!(src.contains("o2 = "), "{src}");
            if !check_compiles(&format!("test:multi3:{}", d.name()), &src) {
                return;
            }
        }
    }

    #[test]
    fn a_member_table_fits_the_kernel_parameters() {
        for k in 0..40 {
            let t = members_per_launch(k);
            assert!(t >= 1 && t * (k + 2) * 8 <= TABLE_BYTES.max(8 * (k + 2)), "k = {k}: {t} members");
        }
    }
}
