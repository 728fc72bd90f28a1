//! Fused blocks on the CPU (`compile/blocks.rs` makes them). Each computes exactly what
//! the ops it replaces compute, with the same kernels, so compiled and eager results
//! have the same bits: a matmul block is the product and then its program (the fused
//! interpreter); a residual norm is the add kernel and then the norm kernel, writing
//! the sum and the norm into one buffer when both are kept; a multi-tensor block runs
//! its program over each member into its piece of the output.

use crate::backend::cpu::{CpuBuffer, elementwise, fused, matmul, nn};
use crate::backend::{Buffer, Storage};
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::primitives::BinaryOp;
use crate::primitives::fused::{BlockKind, FusedBlock};
use crate::runtime::stats::{MATMUL_EPILOGUE_KERNELS, MULTI_TENSOR_LAUNCHES, MULTI_TENSOR_MEMBERS, RESIDUAL_NORMS};
use crate::shape::numel;
use crate::sync::atomic::Ordering::Relaxed;

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
