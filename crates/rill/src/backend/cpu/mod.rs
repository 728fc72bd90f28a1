//! The CPU backend: one kernel per primitive, dispatched by an exhaustive `match`.
//!
//! Kernels run on the runtime's worker pool (see `runtime/pool.rs`); large ones split
//! their work across the same pool through `par.rs`, never on threads of their own. Outputs are
//! always new contiguous buffers, except for views, which share their input's buffer.
//! Kernels receive inputs already converted by the ops layer: elementwise inputs share
//! the output dtype (predicates output bool), reductions keep their input dtype.

pub(crate) mod attention;
mod attention_grad;
mod blocks;
mod buffer;
pub(crate) mod creation;
pub(crate) mod decode;
pub(crate) mod elementwise;
pub(crate) mod fused;
pub(crate) mod matmul;
pub(crate) mod movement;
pub(crate) mod nn;
pub(crate) mod par;
pub(crate) mod qdot;
pub(crate) mod quant;
pub(crate) mod random;
pub(crate) mod reduce;
pub(crate) mod scatter;
pub(crate) mod simd;
pub(crate) mod sort;
pub(crate) mod strided;

pub(crate) use buffer::{CpuBuffer, clear_cache};

use crate::backend::{Buffer, Storage};
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::primitives::Primitive;

/// Elements per parallel chunk: below this, kernels run on one thread.
pub(crate) const PAR_CHUNK: usize = 1 << 15;

/// [`eval`] with the first input given by value, donated (see
/// `BatchRun::run_donated`): a primitive that can write into it does.
pub(crate) fn eval_donated(
    prim: &Primitive,
    shape: &[usize],
    dtype: DType,
    donor: Storage,
    rest: &[&Storage],
) -> Result<Storage> {
    match prim {
        Primitive::SliceUpdate { axis } => decode::slice_update_into(donor, rest, *axis),
        _ => {
            let all: Vec<&Storage> = std::iter::once(&donor).chain(rest.iter().copied()).collect();
            eval(prim, shape, dtype, &all)
        }
    }
}

/// Computes one primitive on the CPU.
pub(crate) fn eval(prim: &Primitive, shape: &[usize], dtype: DType, inputs: &[&Storage]) -> Result<Storage> {
    use Primitive::*;
    match prim {
        Constant => Err(Error::invalid("constant", "a constant has no kernel")),
        Full { value } => creation::full(shape, dtype, *value),
        Arange { start, step } => creation::arange(shape, dtype, *start, *step),
        Eye { k } => creation::eye(shape, dtype, *k),
        Random { key, dist } => random::random(shape, dtype, *key, *dist),
        Cast => elementwise::cast(inputs[0], dtype),
        Unary(op) => elementwise::unary(*op, inputs[0], dtype),
        Binary(op) => elementwise::binary(*op, inputs[0], inputs[1], shape, dtype),
        Where => elementwise::where_(inputs[0], inputs[1], inputs[2], shape, dtype),
        Reduce { op, axes } => reduce::reduce(*op, inputs[0], axes, shape, dtype),
        ArgReduce { op, axis } => reduce::arg_reduce(*op, inputs[0], *axis, shape),
        Cumsum { axis, reverse, exclusive } => reduce::cumsum(inputs[0], *axis, *reverse, *exclusive),
        Sort(spec) => sort::sort(inputs[0], spec, shape),
        Softmax { axis, log } => nn::softmax(inputs[0], *axis, *log),
        LayerNorm { eps, has_weight, has_bias } => nn::layer_norm(inputs, *eps, *has_weight, *has_bias),
        RmsNorm { eps, has_weight } => nn::rms_norm(inputs, *eps, *has_weight),
        Matmul => matmul::matmul(inputs[0], inputs[1], shape, dtype),
        Attention { scale, mask } => attention::attention(inputs, *scale, *mask, shape, dtype),
        AttentionGrad { scale, causal, part } => {
            attention_grad::attention_grad(inputs, *scale, *causal, *part, shape, dtype)
        }
        QuantMatmul { format } => quant::qmatmul(inputs[0], inputs[1], *format, shape, dtype),
        Dequantize { format } => quant::dequantize(inputs[0], *format, shape, dtype),
        Rope { dims, base, scale, layout } => decode::rope(inputs, *dims, *base, *scale, *layout),
        SliceUpdate { axis } => decode::slice_update(inputs, *axis),
        Reshape => movement::reshape(inputs[0], shape),
        Permute(perm) => Ok(inputs[0].with_layout(inputs[0].layout.permute(perm))),
        BroadcastTo => Ok(inputs[0].with_layout(inputs[0].layout.broadcast_to(shape))),
        Slice { start, step } => Ok(movement::slice_view(inputs[0], start, step, shape)),
        Contiguous => movement::make_contiguous(inputs[0]),
        StopGradient | Depend => Ok(inputs[0].with_layout(inputs[0].layout.clone())),
        Checkpoint { .. } => match inputs.last() {
            Some(x) => Ok(x.with_layout(x.layout.clone())),
            None => Err(Error::invalid("checkpoint", "a checkpoint node has no inputs")),
        },
        Take { axis } => movement::take(inputs[0], inputs[1], *axis, shape),
        ScatterAdd { axis } => scatter::scatter_add(inputs, *axis),
        TakeAlongAxis { axis } => scatter::take_along_axis(inputs[0], inputs[1], *axis, shape),
        PutAlongAxis { axis, accumulate } => scatter::put_along_axis(inputs, *axis, *accumulate),
        Concatenate { axis } => movement::concatenate(inputs, *axis, shape),
        Pad { widths, value } => movement::pad(inputs[0], widths, *value, shape),
        ToDevice => to_host(inputs[0]),
        Host { f, name } => host_call(name, f, inputs, shape, dtype),
        Placeholder { index } => Err(Error::invalid(
            "placeholder",
            format!("input {index} of a compiled function is a placeholder while tracing; it cannot be evaluated"),
        )),
        Fused(p) => fused::eval_fused(p, inputs, shape, dtype),
        FusedReduce { program, op, axes } => fused::eval_fused_reduce(program, *op, axes, inputs, shape, dtype),
        Block(b) => blocks::eval_block(b, inputs, shape, dtype),
    }
}

/// Copies a storage of any device into a contiguous host storage.
pub(crate) fn to_host(s: &Storage) -> Result<Storage> {
    match &**s.buffer {
        Buffer::Cpu(_) => movement::make_contiguous(s),
        #[cfg(feature = "cuda")]
        Buffer::Cuda(_) => crate::backend::cuda::to_host(s),
    }
}

/// Reads a CPU storage as f64 values in row-major order.
pub(crate) fn to_f64_vec(s: &Storage) -> Vec<f64> {
    crate::with_dtype!(s.dtype, T => {
        strided::contiguous::<T>(s).iter().map(|v| crate::dtype::Element::to_f64(*v)).collect()
    })
}

/// A contiguous CPU storage made from f64 values converted to `dtype`.
pub(crate) fn from_f64_slice(values: &[f64], dtype: DType, shape: &[usize]) -> Result<Storage> {
    let mut buf = CpuBuffer::alloc(dtype, values.len())?;
    crate::with_dtype!(dtype, T => {
        let out = buf.typed_mut::<T>();
        if dtype == DType::Bool {
            for (o, v) in out.iter_mut().zip(values) { *o = crate::dtype::Element::from_f64((*v != 0.0) as u8 as f64); }
        } else {
            for (o, v) in out.iter_mut().zip(values) { *o = crate::dtype::Element::from_f64(*v); }
        }
    });
    Ok(Storage::contiguous(Buffer::Cpu(buf), dtype, shape))
}

fn host_call(
    name: &'static str,
    f: &crate::primitives::HostFn,
    inputs: &[&Storage],
    shape: &[usize],
    dtype: DType,
) -> Result<Storage> {
    let args: Vec<Vec<f64>> = inputs.iter().map(|s| to_f64_vec(s)).collect();
    let out = f(&args)?;
    let n: usize = shape.iter().product();
    if out.len() != n {
        return Err(Error::shape(name, format!("host function returned {} values for shape {shape:?}", out.len())));
    }
    from_f64_slice(&out, dtype, shape)
}
