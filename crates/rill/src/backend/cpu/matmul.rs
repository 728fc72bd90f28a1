//! Matrix multiplication through the `gemm` crate.
//!
//! Inputs are `[.., M, K]` and `[.., K, N]` with equal batch shapes (the op broadcasts
//! them with views). Each batch's matrices are handed to `gemm` with their own row and
//! column strides, so transposed views need no copy; inputs with zero or negative strides
//! inside a matrix are made contiguous first. f32 and f64 use `gemm` directly; bf16 and
//! f16 convert to f32 and back (f32 accumulation, one rounding); integers use a plain loop
//! with wrapping i64 accumulation.
//! Many small matrices run one per task; a large one is split by `gemm` across the pool's
//! threads (`par::gemm_parallelism`: on a pool thread only).

use half::{bf16, f16};

use crate::backend::cpu::{CpuBuffer, movement, par, strided};
use crate::backend::{Buffer, Storage};
use crate::dtype::{DType, Element};
use crate::error::Result;
use crate::shape::{Layout, numel};

/// Where one operand's matrices are: batch offsets, row stride, column stride.
struct Operand {
    offsets: Vec<usize>,
    rs: isize,
    cs: isize,
}

/// Element offsets of every batch matrix of `l` (all axes but the last two), row-major.
pub(crate) fn batch_offsets(l: &Layout) -> Vec<usize> {
    let nb = l.shape.len() - 2;
    let count = numel(&l.shape[..nb]);
    let mut offs = Vec::with_capacity(count);
    if count == 0 {
        return offs;
    }
    let mut idx = vec![0usize; nb];
    for _ in 0..count {
        let mut o = l.offset as isize;
        for i in 0..nb {
            o += idx[i] as isize * l.strides[i];
        }
        offs.push(o as usize);
        for i in (0..nb).rev() {
            idx[i] += 1;
            if idx[i] < l.shape[i] {
                break;
            }
            idx[i] = 0;
        }
    }
    offs
}

/// `s` itself when its matrices are addressable by positive strides, else a contiguous copy.
fn usable(s: &Storage) -> Result<Storage> {
    let nd = s.layout.shape.len();
    let ok = (nd - 2..nd).all(|i| s.layout.strides[i] > 0 || s.layout.shape[i] <= 1);
    if ok { Ok(s.clone()) } else { movement::make_contiguous(s) }
}

fn operand(s: &Storage) -> Operand {
    let l = &s.layout;
    let nd = l.shape.len();
    let fix = |i: usize| if l.shape[i] <= 1 { 1 } else { l.strides[i] };
    Operand { offsets: batch_offsets(l), rs: fix(nd - 2), cs: fix(nd - 1) }
}

/// `a @ b` into a new contiguous storage of `shape` (`[.., M, N]`) and `dtype`.
pub(crate) fn matmul(a: &Storage, b: &Storage, shape: &[usize], dtype: DType) -> Result<Storage> {
    let nd = shape.len();
    let (m, n) = (shape[nd - 2], shape[nd - 1]);
    let k = a.layout.shape[nd - 1];
    let mut buf = CpuBuffer::alloc(dtype, numel(shape))?;
    if numel(shape) > 0 {
        let (a, b) = (usable(a)?, usable(b)?);
        let dims = Dims { m, n, k };
        match dtype {
            DType::F32 => gemm_batches::<f32>(&a, &b, dims, buf.typed_mut::<f32>(), 0.0, 1.0),
            DType::F64 => gemm_batches::<f64>(&a, &b, dims, buf.typed_mut::<f64>(), 0.0, 1.0),
            // gemm's own f16 kernel does not accumulate in f32 throughout; like bf16,
            // f16 is widened to f32 and rounded once at the end.
            DType::F16 => {
                let (a32, b32) = (widen::<f16>(&a, f16::to_f32)?, widen::<f16>(&b, f16::to_f32)?);
                let mut tmp = vec![0f32; numel(shape)];
                gemm_batches::<f32>(&a32, &b32, dims, &mut tmp, 0.0, 1.0);
                for (o, v) in buf.typed_mut::<f16>().iter_mut().zip(tmp) {
                    *o = f16::from_f32(v);
                }
            }
            DType::BF16 => {
                let (a32, b32) = (widen::<bf16>(&a, bf16::to_f32)?, widen::<bf16>(&b, bf16::to_f32)?);
                let mut tmp = vec![0f32; numel(shape)];
                gemm_batches::<f32>(&a32, &b32, dims, &mut tmp, 0.0, 1.0);
                for (o, v) in buf.typed_mut::<bf16>().iter_mut().zip(tmp) {
                    *o = bf16::from_f32(v);
                }
            }
            _ => crate::with_dtype!(dtype, T => int_batches::<T>(&a, &b, dims, buf.typed_mut::<T>())),
        }
    }
    Ok(Storage::contiguous(Buffer::Cpu(buf), dtype, shape))
}

#[derive(Clone, Copy)]
struct Dims {
    m: usize,
    n: usize,
    k: usize,
}

/// A contiguous f32 copy of a half-precision storage.
fn widen<T: Element>(s: &Storage, to_f32: fn(T) -> f32) -> Result<Storage> {
    let v = strided::contiguous::<T>(s);
    let mut buf = CpuBuffer::alloc(DType::F32, v.len())?;
    for (o, &x) in buf.typed_mut::<f32>().iter_mut().zip(v.iter()) {
        *o = to_f32(x);
    }
    Ok(Storage::contiguous(Buffer::Cpu(buf), DType::F32, &s.layout.shape))
}

fn gemm_batches<T: Element>(a: &Storage, b: &Storage, d: Dims, out: &mut [T], zero: T, one: T) {
    let (oa, ob) = (operand(a), operand(b));
    let (sa, sb) = (strided::buffer::<T>(a), strided::buffer::<T>(b));
    let mn = d.m * d.n;
    if d.k == 0 {
        out.fill(zero);
        return;
    }
    let small = d.m * d.n * d.k < 48 * 48 * 48;
    let one_batch = |i: usize, o: &mut [T], par: gemm::Parallelism| {
        // SAFETY: `o` holds the m x n output with row stride n; the operand offsets and
        // strides address elements of `sa`/`sb` inside their layouts' spans (the layouts
        // come from valid storages of shapes [.., m, k] and [.., k, n]).
        unsafe {
            gemm::gemm(
                d.m,
                d.n,
                d.k,
                o.as_mut_ptr(),
                1,
                d.n as isize,
                false,
                sa.as_ptr().add(oa.offsets[i]),
                oa.cs,
                oa.rs,
                sb.as_ptr().add(ob.offsets[i]),
                ob.cs,
                ob.rs,
                zero,
                one,
                false,
                false,
                false,
                par,
            );
        }
    };
    if small && oa.offsets.len() > 1 {
        par::chunks(out, mn, |i, o| one_batch(i, o, gemm::Parallelism::None));
    } else {
        let threads = par::gemm_parallelism(!small);
        for (i, o) in out.chunks_mut(mn).enumerate() {
            one_batch(i, o, threads);
        }
    }
}

fn int_batches<T: Element>(a: &Storage, b: &Storage, d: Dims, out: &mut [T]) {
    let (oa, ob) = (operand(a), operand(b));
    let (sa, sb) = (strided::buffer::<T>(a), strided::buffer::<T>(b));
    let at =
        |base: usize, i: usize, j: usize, o: &Operand| (base as isize + i as isize * o.rs + j as isize * o.cs) as usize;
    par::chunks(out, d.n.max(1), |row, o| {
        let (batch, i) = (row / d.m, row % d.m);
        let mut acc = vec![0i64; d.n];
        for p in 0..d.k {
            let x = sa[at(oa.offsets[batch], i, p, &oa)].to_i64();
            for (j, a) in acc.iter_mut().enumerate() {
                *a = a.wrapping_add(x.wrapping_mul(sb[at(ob.offsets[batch], p, j, &ob)].to_i64()));
            }
        }
        for (o, a) in o.iter_mut().zip(acc) {
            *o = T::from_i64(a);
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    fn storage<T: Element>(vals: &[T], layout: Layout) -> Storage {
        let buf = CpuBuffer::from_slice(vals).unwrap();
        Storage::from_arc(std::sync::Arc::new(Buffer::Cpu(buf)), T::DTYPE, layout)
    }

    fn reference(a: &[f64], la: &Layout, b: &[f64], lb: &Layout) -> Vec<f64> {
        let nd = la.shape.len();
        let (m, k, n) = (la.shape[nd - 2], la.shape[nd - 1], lb.shape[nd - 1]);
        let batch: usize = la.shape[..nd - 2].iter().product();
        let mut out = Vec::new();
        for bi in 0..batch {
            let mut idx = vec![0; nd - 2];
            let mut r = bi;
            for i in (0..nd - 2).rev() {
                idx[i] = r % la.shape[i];
                r /= la.shape[i];
            }
            for i in 0..m {
                for j in 0..n {
                    let mut s = 0.0;
                    for p in 0..k {
                        let ia: Vec<usize> = idx.iter().copied().chain([i, p]).collect();
                        let ib: Vec<usize> = idx.iter().copied().chain([p, j]).collect();
                        s += a[la.offset_of(&ia)] * b[lb.offset_of(&ib)];
                    }
                    out.push(s);
                }
            }
        }
        out
    }

    #[test]
    fn strided_operands_need_no_copy_and_match() {
        let av: Vec<f64> = (0..60).map(|i| ((i * 7) % 13) as f64 - 6.0).collect();
        let bv: Vec<f64> = (0..60).map(|i| ((i * 5) % 11) as f64 - 5.0).collect();
        let cases = [
            // a transposed [2, 5, 6] -> [2, 6, 5]; b plain [2, 5, 3]
            (Layout::contiguous(&[2, 5, 6]).permute(&[0, 2, 1]), Layout::contiguous(&[2, 5, 3])),
            // b transposed per batch, batch axis swapped with rows
            (Layout::contiguous(&[3, 4, 5]), Layout::contiguous(&[5, 3, 4]).permute(&[1, 0, 2])),
            // a broadcast over batch and rows (zero strides), b with a negative row stride
            (
                Layout::contiguous(&[4]).broadcast_to(&[2, 3, 4]),
                Layout { shape: [2, 4, 5][..].into(), strides: [20, -5, 1][..].into(), offset: 15 },
            ),
        ];
        for (la, lb) in cases {
            let nd = la.shape.len();
            let mut shape = la.shape[..nd - 1].to_vec();
            shape.push(lb.shape[nd - 1]);
            let want = reference(&av, &la, &bv, &lb);
            let a64 = storage(&av, la.clone());
            let b64 = storage(&bv, lb.clone());
            let got = crate::backend::cpu::to_f64_vec(&matmul(&a64, &b64, &shape, DType::F64).unwrap());
            assert_eq!(got, want, "f64 {la:?} {lb:?}");
            let a32: Vec<f32> = av.iter().map(|&v| v as f32).collect();
            let b32: Vec<f32> = bv.iter().map(|&v| v as f32).collect();
            let (a32, b32) = (storage(&a32, la.clone()), storage(&b32, lb.clone()));
            let got = crate::backend::cpu::to_f64_vec(&matmul(&a32, &b32, &shape, DType::F32).unwrap());
            assert_eq!(got, want, "f32 {la:?} {lb:?}");
            let ai: Vec<i32> = av.iter().map(|&v| v as i32).collect();
            let bi: Vec<i32> = bv.iter().map(|&v| v as i32).collect();
            let (ai, bi) = (storage(&ai, la.clone()), storage(&bi, lb.clone()));
            let got = crate::backend::cpu::to_f64_vec(&matmul(&ai, &bi, &shape, DType::I32).unwrap());
            assert_eq!(got, want, "i32 {la:?} {lb:?}");
        }
    }
}
