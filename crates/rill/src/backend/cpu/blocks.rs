//! Fused blocks on the CPU (`compile/blocks.rs` makes them). Each computes exactly what
//! the ops it replaces compute, with the same kernels, so compiled and eager results
//! have the same bits: a matmul block is the product and then its program (the fused
//! interpreter); a residual norm is the add kernel and then the norm kernel, writing
//! the sum and the norm into one buffer when both are kept; a multi-tensor block runs
//! its program over each member into its piece of the output; a quantized product block
//! computes its `x` (program or RMS norm), the product, then its post program.

use crate::backend::cpu::{CpuBuffer, elementwise, fused, matmul, nn, quant};
use crate::backend::{Buffer, Storage};
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::primitives::BinaryOp;
use crate::primitives::fused::{BlockKind, FusedBlock, QInput};
use crate::runtime::stats::{MATMUL_EPILOGUE_KERNELS, MULTI_TENSOR_LAUNCHES, MULTI_TENSOR_MEMBERS, RESIDUAL_NORMS};
use crate::shape::numel;
use crate::sync::atomic::Ordering::Relaxed;

fn shapes_of<'a>(ins: &[&'a Storage]) -> Vec<&'a [usize]> {
    ins.iter().map(|s| &s.layout.shape[..]).collect()
}

/// Computes a fused block.
pub(crate) fn eval_block(b: &FusedBlock, inputs: &[&Storage], shape: &[usize], dtype: DType) -> Result<Storage> {
    match &b.kind {
        BlockKind::Matmul { program, .. } => {
            let (x, w) = operands(b, inputs, 2)?;
            // The product in its own dtype (the program may cast it: `(x @ w).astype(..)`).
            let pd = program.input_dtypes.first().copied().unwrap_or(dtype);
            let product = matmul::matmul(x, w, shape, pd)?;
            let mut ins: Vec<&Storage> = vec![&product];
            ins.extend_from_slice(&inputs[2..]);
            MATMUL_EPILOGUE_KERNELS.fetch_add(1, Relaxed);
            fused::eval_fused(program, &ins, shape, dtype)
        }
        BlockKind::ResidualNorm { eps, rms, has_weight, has_bias, keep_sum } => {
            let (x, r) = operands(b, inputs, 2 + *has_weight as usize + *has_bias as usize)?;
            let sum = elementwise::binary(BinaryOp::Add, x, r, &x.layout.shape, dtype)?;
            let mut ins: Vec<&Storage> = vec![&sum];
            ins.extend_from_slice(&inputs[2..]);
            RESIDUAL_NORMS.fetch_add(1, Relaxed);
            let norm = if *rms {
                nn::rms_norm(&ins, *eps, *has_weight)?
            } else {
                nn::layer_norm(&ins, *eps, *has_weight, *has_bias)?
            };
            if !keep_sum {
                return Ok(norm);
            }
            let n = numel(&sum.layout.shape);
            let mut buf = CpuBuffer::alloc(dtype, 2 * n)?;
            crate::with_dtype!(dtype, T => {
                let out = buf.typed_mut::<T>();
                out[..n].copy_from_slice(sum_values::<T>(&sum));
                out[n..].copy_from_slice(sum_values::<T>(&norm));
            });
            Ok(Storage::contiguous(Buffer::Cpu(buf), dtype, shape))
        }
        BlockKind::QMatmul { format, input, post, .. } => {
            let nx = input.arity();
            if inputs.len() < nx + 1 {
                return Err(Error::invalid(b.name(), format!("{} inputs, expected at least {}", inputs.len(), nx + 1)));
            }
            let x = match input {
                QInput::Plain => inputs[0].clone(),
                QInput::Program(p) => {
                    let xd = p.output_dtype();
                    let xs = crate::shape::broadcast_all(b.name(), &shapes_of(&inputs[..nx]))?;
                    fused::eval_fused(p, &inputs[..nx], &xs, xd)?
                }
                QInput::RmsNorm { eps, has_weight } => nn::rms_norm(&inputs[..nx], *eps, *has_weight)?,
            };
            let w = inputs[nx];
            let mut pshape = x.layout.shape.to_vec();
            pshape.pop();
            pshape.push(w.layout.shape.first().copied().unwrap_or(0));
            let product = quant::qmatmul(&x, w, *format, &pshape, x.dtype)?;
            let Some(p) = post else { return Ok(product) };
            let mut ins: Vec<&Storage> = vec![&product];
            ins.extend_from_slice(&inputs[nx + 1..]);
            fused::eval_fused(p, &ins, shape, dtype)
        }
        BlockKind::Multi { program, sizes, scalar } => {
            let k = scalar.len();
            if inputs.len() != k * sizes.len() {
                return Err(Error::invalid(
                    b.name(),
                    format!("{} inputs for {} members of {k}", inputs.len(), sizes.len()),
                ));
            }
            let total: usize = sizes.iter().sum();
            // Several outputs: the program once per output (the interpreter stores one);
            // a single-output program runs as it is, without a copy per call.
            let split: Vec<_> = if program.more.is_empty() {
                Vec::new()
            } else {
                program.outputs().map(|r| program.with_output(r)).collect()
            };
            let programs: Vec<&_> = if split.is_empty() { vec![program] } else { split.iter().collect() };
            if numel(shape) != total * programs.len() {
                return Err(Error::invalid(b.name(), format!("shape {shape:?} for {total} elements per output")));
            }
            let mut buf = CpuBuffer::alloc(dtype, total * programs.len())?;
            crate::with_dtype!(dtype, T => {
                let out = buf.typed_mut::<T>();
                let mut off = 0;
                for (t, &size) in sizes.iter().enumerate() {
                    // Each member's inputs read as 1-D (scalars as 0-d).
                    let flat: Vec<Storage> = inputs[t * k..(t + 1) * k]
                        .iter()
                        .zip(scalar)
                        .map(|(s, &one)| crate::backend::cpu::movement::reshape(s, if one { &[] } else { std::slice::from_ref(&size) }))
                        .collect::<Result<_>>()?;
                    let refs: Vec<&Storage> = flat.iter().collect();
                    for &p in &programs {
                        fused::eval_fused_into(p, &refs, &[size], dtype, &mut out[off..off + size])?;
                        off += size;
                    }
                }
                Ok::<(), Error>(())
            })?;
            MULTI_TENSOR_LAUNCHES.fetch_add(1, Relaxed);
            MULTI_TENSOR_MEMBERS.fetch_add(sizes.len() as u64, Relaxed);
            Ok(Storage::contiguous(Buffer::Cpu(buf), dtype, shape))
        }
    }
}

/// The first two inputs, after checking the count.
fn operands<'a>(b: &FusedBlock, inputs: &[&'a Storage], at_least: usize) -> Result<(&'a Storage, &'a Storage)> {
    match inputs {
        [x, y, ..] if inputs.len() >= at_least => Ok((x, y)),
        _ => Err(Error::invalid(b.name(), format!("{} inputs, expected {at_least}", inputs.len()))),
    }
}

/// The elements of a contiguous host storage made by a kernel here.
fn sum_values<T: crate::dtype::Element>(s: &Storage) -> &[T] {
    let Buffer::Cpu(b) = &**s.buffer else { return &[] };
    &b.typed::<T>()[s.layout.offset..s.layout.offset + numel(&s.layout.shape)]
}
