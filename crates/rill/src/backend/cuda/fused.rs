//! `Fused` nodes: the kernel source comes from [`crate::compile::cuda_src::cuda_source`]
//! for the launch [`Plan`] that the operands' layouts allow (linear with 16-byte vectors,
//! linear with row/column/scalar broadcasts, or strided over merged axes), behind the
//! backend's prelude. Each source is compiled once per device (the NVRTC cache is keyed
//! by the full source, which names every C type, register dtype and access), and the
//! loaded function is memoised in the program itself under (device, plan), so a replayed
//! call generates no source and formats no key: it merges axes, picks the plan, finds
//! the function and launches.

use cudarc::driver::{CudaFunction, LaunchConfig};

use crate::backend::Storage;
use crate::compile::FusedProgram;
use crate::compile::cuda_src::{CUDA_MAX_DIMS, FUSED_BLOCK, Operand, Plan, cuda_source, plan};
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::shape::{Layout, broadcast_shapes};

use super::buffer::{cuda_of, new_storage};
use super::device::DeviceState;
use super::handles::CudaStreamHandle;
use super::launch::Launch;
use super::map::merge_dims;
use super::nvrtc;
use super::source::PRELUDE;

/// The kernel's name in every generated module.
const KERNEL: &str = "rill_fused";

/// Blocks per SM at most; the kernels loop with a grid stride beyond that.
const BLOCKS_PER_SM: usize = 32;

/// A 1-D launch of `units` work items (one per thread, looping past the cap).
fn grid(dev: &DeviceState, units: usize) -> LaunchConfig {
    let cap = (dev.sms.max(1) as usize) * BLOCKS_PER_SM;
    let blocks = units.div_ceil(FUSED_BLOCK as usize).clamp(1, cap);
    LaunchConfig { grid_dim: (blocks as u32, 1, 1), block_dim: (FUSED_BLOCK, 1, 1), shared_mem_bytes: 0 }
}

/// The full source of `p`'s kernel for `plan` (prelude included).
fn source(p: &FusedProgram, plan: &Plan) -> String {
    format!("{PRELUDE}\n{}", cuda_source(p, plan, KERNEL))
}

/// The compiled kernel of `p` for `plan` on this stream's device: memoised in `p`.
fn kernel(cs: &CudaStreamHandle, p: &FusedProgram, plan: &Plan) -> Result<CudaFunction> {
    let mut key = Vec::with_capacity(8 + p.input_dtypes().len());
    key.extend((cs.dev.ordinal as u32).to_le_bytes());
    plan.key_bytes(&mut key);
    p.kernels.get_or_try_insert(&key, || {
        let src = source(p, plan);
        nvrtc::function(&cs.dev, &format!("fused:{src}"), KERNEL, || src)
    })
}

/// Runs the fused program `p` over `inputs` (broadcast to `shape`) into a new contiguous
/// storage of `dtype`.
pub(crate) fn fused(
    cs: &CudaStreamHandle,
    p: &FusedProgram,
    inputs: &[Storage],
    shape: &[usize],
    dtype: DType,
) -> Result<Storage> {
    if inputs.len() != p.input_dtypes().len() || dtype != p.output_dtype() {
        return Err(Error::invalid(
            "fused",
            format!(
                "program expects {} inputs and outputs {}; got {} inputs and output {dtype}",
                p.input_dtypes().len(),
                p.output_dtype(),
                inputs.len()
            ),
        ));
    }
    for (k, (s, &d)) in inputs.iter().zip(p.input_dtypes()).enumerate() {
        if s.dtype != d
            || (s.layout.shape.as_slice() != shape && broadcast_shapes("fused", &s.layout.shape, shape)? != shape)
        {
            return Err(Error::invalid(
                "fused",
                format!("input {k} ({}, shape {:?}) does not fit ({d}, shape {shape:?})", s.dtype, s.layout.shape),
            ));
        }
    }
    let out = new_storage(cs, dtype, shape)?;
    let n: usize = shape.iter().product();
    if n == 0 {
        return Ok(out);
    }
    // Merge axes over the output (contiguous) and every input's broadcast strides.
    let lays: Vec<Layout> = inputs.iter().map(|s| s.layout.broadcast_to(shape)).collect();
    let mut strides: Vec<Vec<isize>> = Vec::with_capacity(1 + inputs.len());
    strides.push(Layout::contiguous(shape).strides);
    strides.extend(lays.iter().map(|l| l.strides.clone()));
    let (dims, mst) = merge_dims(shape, &strides);
    let out_ptr = cuda_of(&out).map(|b| b.ptr()).unwrap_or(0);
    let ptrs: Vec<u64> = inputs
        .iter()
        .zip(&lays)
        .map(|(s, l)| cuda_of(s).map(|b| b.ptr()).unwrap_or(0) + (l.offset * s.dtype.size()) as u64)
        .collect();
    let ops: Vec<Operand<'_>> = (0..inputs.len())
        .map(|k| Operand { strides: &mst[1 + k], addr: ptrs[k], size: inputs[k].dtype.size() })
        .collect();
    let plan = plan(&dims, &ops, out_ptr, dtype.size(), n);
    if let Plan::Strided { ndim, .. } = plan {
        if ndim > CUDA_MAX_DIMS {
            return Err(super::unsupported(
                "fused",
                format!("inputs of rank {ndim} after merging axes (at most {CUDA_MAX_DIMS})"),
            ));
        }
    }
    let f = kernel(cs, p, &plan)?;
    let cfg = grid(&cs.dev, plan.units(n));
    let (n32, n64) = (n as u32, n as u64);
    let cols = if dims.len() == 2 { dims[1] } else { 1 };
    let (cols32, cols64) = (cols as u32, cols as u64);
    // Strided parameters: `{ I shape[D]; S strides[K1][D]; }` flattened (one width).
    let (p64, p32) = match plan {
        Plan::Strided { ndim, wide } => {
            let k1 = inputs.len().max(1);
            let mut v = vec![0i64; ndim * (1 + k1)];
            for (d, &s) in dims.iter().enumerate() {
                v[d] = s as i64;
                for k in 0..inputs.len() {
                    v[ndim * (1 + k) + d] = mst[1 + k][d] as i64;
                }
            }
            // The plan checked that every value fits 32 bits when not wide.
            let v32: Vec<i32> = if wide { Vec::new() } else { v.iter().map(|&x| x as i32).collect() };
            (v, v32)
        }
        Plan::Linear { .. } => (Vec::new(), Vec::new()),
    };
    let _ = cs.dev.ctx.bind_to_thread();
    let mut b = Launch::new(&f);
    b.arg(&out_ptr);
    for ptr in &ptrs {
        b.arg(ptr);
    }
    match plan {
        Plan::Linear { wide: true, .. } => b.arg(&n64).arg(&cols64),
        Plan::Linear { wide: false, .. } => b.arg(&n32).arg(&cols32),
        // The driver copies as many bytes as the kernel's parameter struct declares from
        // the address of the first element.
        Plan::Strided { wide: true, .. } => b.arg(&n64).arg_slice(&p64),
        Plan::Strided { wide: false, .. } => b.arg(&n32).arg_slice(&p32),
    };
    // SAFETY: the arguments match the generated signature for `plan` (pointers, n, then
    // cols or the parameter struct laid out in `p32`/`p64`, alive until the launch
    // returns); every offset the plan produces lies inside its input (views are checked
    // by the op layer), and vector plans were chosen only for aligned pointers.
    unsafe { b.launch(cs, cfg) }.map_err(|e| super::backend_err("launch", e))?;
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::compile::cuda_src::Access;
    use crate::compile::cuda_src::tests::f16_program;
    use crate::compile::ir::{Builder, Inst};
    use crate::primitives::{BinaryOp, UnaryOp};

    /// The chain, `sigmoid((tanh(a*b + 1)*0.5 + a)^2 - b)`, in `d`.
    fn chain(d: DType) -> FusedProgram {
        let mut b = Builder::default();
        let x = b.load(0, d);
        let y = b.load(1, d);
        let m = b.push(Inst::Binary(BinaryOp::Mul, x, y), d);
        let one = b.constant(1.0, d);
        let s = b.push(Inst::Binary(BinaryOp::Add, m, one), d);
        let t = b.push(Inst::Unary(UnaryOp::Tanh, s), d);
        let half = b.constant(0.5, d);
        let h = b.push(Inst::Binary(BinaryOp::Mul, t, half), d);
        let z = b.push(Inst::Binary(BinaryOp::Add, h, x), d);
        let q = b.push(Inst::Binary(BinaryOp::Mul, z, z), d);
        let w = b.push(Inst::Binary(BinaryOp::Sub, q, y), d);
        let o = b.push(Inst::Unary(UnaryOp::Sigmoid, w), d);
        b.finish(o)
    }

    /// `gelu(h + bias) + res` in `d`.
    fn bias_gelu(d: DType) -> FusedProgram {
        let mut b = Builder::default();
        let h = b.load(0, d);
        let bias = b.load(1, d);
        let s = b.push(Inst::Binary(BinaryOp::Add, h, bias), d);
        let g = b.push(Inst::Unary(UnaryOp::Gelu, s), d);
        let r = b.load(2, d);
        let o = b.push(Inst::Binary(BinaryOp::Add, g, r), d);
        b.finish(o)
    }

    /// Integer and bool inputs: `where(i < j, cast(i) * x, x) >= 0` (bool output).
    fn mixed() -> FusedProgram {
        let mut b = Builder::default();
        let i = b.load(0, DType::I32);
        let j = b.load(1, DType::I32);
        let x = b.load(2, DType::F32);
        let c = b.push(Inst::Binary(BinaryOp::Less, i, j), DType::Bool);
        let f = b.push(Inst::Cast(i), DType::F32);
        let m = b.push(Inst::Binary(BinaryOp::Mul, f, x), DType::F32);
        let w = b.push(Inst::Where(c, m, x), DType::F32);
        let z = b.constant(0.0, DType::F32);
        let o = b.push(Inst::Binary(BinaryOp::GreaterEqual, w, z), DType::Bool);
        let u = b.load(3, DType::U8);
        let nu = b.push(Inst::Unary(UnaryOp::LogicalNot, u), DType::Bool);
        let a = b.push(Inst::Binary(BinaryOp::LogicalAnd, o, nu), DType::Bool);
        b.finish(a)
    }

    /// The plans worth compiling for a program with `k` inputs: vector and scalar linear
    /// loops with every access, 32- and 64-bit, and strided ones.
    fn plans(p: &FusedProgram) -> Vec<Plan> {
        use Access::*;
        let k = p.input_dtypes().len();
        let widest = p.input_dtypes().iter().chain([&p.output_dtype()]).map(|d| d.size()).max().unwrap_or(1);
        let mut mixed = vec![Contig; k];
        mixed[k - 1] = Row;
        mixed[0] = Scalar;
        if k > 2 {
            mixed[1] = Col;
        }
        vec![
            Plan::Linear { access: vec![Contig; k], vec: 1, wide: false },
            Plan::Linear { access: vec![Contig; k], vec: 16 / widest, wide: false },
            Plan::Linear { access: mixed.clone(), vec: 16 / widest, wide: true },
            Plan::Linear { access: mixed, vec: 1, wide: false },
            Plan::Strided { ndim: 3, wide: false },
            Plan::Strided { ndim: CUDA_MAX_DIMS, wide: true },
        ]
    }

    #[test]
    fn generated_kernels_compile_for_sm90() {
        let mut progs: Vec<(String, FusedProgram)> = Vec::new();
        for d in [DType::F32, DType::F16, DType::BF16, DType::F64] {
            progs.push((format!("chain_{d}"), chain(d)));
            progs.push((format!("bias_gelu_{d}"), bias_gelu(d)));
        }
        progs.push(("f16_mixed".into(), f16_program()));
        progs.push(("int_bool".into(), mixed()));
        // Every unary and binary op, each in f32 and f64, in one program per dtype.
        for d in [DType::F32, DType::F64, DType::BF16] {
            let mut b = Builder::default();
            let x = b.load(0, d);
            let y = b.load(1, d);
            let mut acc = x;
            for op in UnaryOp::ALL.into_iter().filter(|&o| o != UnaryOp::LogicalNot) {
                let u = b.push(Inst::Unary(op, acc), d);
                acc = b.push(Inst::Binary(BinaryOp::Add, u, y), d);
            }
            for op in BinaryOp::ALL {
                let o = if op.is_predicate() { DType::Bool } else { d };
                let r = b.push(Inst::Binary(op, acc, y), o);
                acc = if o == DType::Bool { b.push(Inst::Where(r, acc, y), d) } else { r };
            }
            let c = b.push(Inst::Cast(acc), DType::F64);
            let e = b.push(Inst::Cast(c), d);
            progs.push((format!("all_ops_{d}"), b.finish(e)));
        }
        for (name, prog) in &progs {
            for plan in plans(prog) {
                let src = source(prog, &plan);
                if !nvrtc::check_compiles(&format!("fused_{name}_{plan:?}"), &src) {
                    return;
                }
            }
        }
    }

    #[test]
    fn memo_is_keyed_and_not_part_of_the_value() {
        let p = chain(DType::F32);
        let a: std::result::Result<u32, ()> = p.kernels.get_or_try_insert(b"one", || Ok(1));
        let b: std::result::Result<u32, ()> = p.kernels.get_or_try_insert(b"one", || Ok(2));
        let c: std::result::Result<u32, ()> = p.kernels.get_or_try_insert(b"two", || Err(()));
        assert_eq!((a, b, c), (Ok(1), Ok(1), Err(())));
        assert_eq!(p.kernels.len(), 1);
        let q = p.clone();
        assert_eq!(q.kernels.len(), 0);
        assert_eq!(p, q);
    }
}
