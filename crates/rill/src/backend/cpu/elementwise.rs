//! Elementwise kernels: cast, unary, binary (with broadcasting) and where.
//!
//! Every kernel writes a new contiguous output. Inputs are read through their layouts
//! broadcast to the output shape; when every input is contiguous the loop is a plain zip
//! over slices (vectorised by the compiler) split across the worker pool in chunks.
//! f16 and bf16 compute in f32; the other dtypes compute in their own type.

use half::{bf16, f16};

use crate::backend::cpu::{CpuBuffer, PAR_CHUNK, par, strided};
use crate::backend::{Buffer, Storage};
use crate::dtype::{DType, Element};
use crate::error::{Error, Result};
use crate::primitives::scalar::{Float, IntOps};
use crate::primitives::{BinaryOp, UnaryOp, each_binary, each_unary};
use crate::shape::{Layout, numel};

// ---- generic strided maps ----

/// Splits `out` (row-major over `shape`) into parallel pieces along axis 0 and calls
/// `body(out_piece, row_start, rows)` for each.
fn par_rows<O: Send>(out: &mut [O], shape: &[usize], body: impl Fn(&mut [O], usize, usize) + Sync) {
    let n = out.len();
    if shape.is_empty() || n < 2 * PAR_CHUNK || shape[0] < 2 {
        let rows = shape.first().copied().unwrap_or(1);
        body(out, 0, rows);
        return;
    }
    let row = n / shape[0];
    let rows_per = PAR_CHUNK.div_ceil(row).max(1);
    par::chunks(out, rows_per * row, |i, chunk| body(chunk, i * rows_per, chunk.len() / row));
}

/// The sub-layout of rows `[r0, r0 + rows)` along axis 0 of `l`; a scalar layout (the one
/// piece `par_rows` makes of an empty shape) is returned whole.
fn rows_of(l: &Layout, r0: usize, rows: usize) -> Layout {
    if l.shape.is_empty() {
        return l.clone();
    }
    let mut shape = l.shape.clone();
    shape[0] = rows;
    Layout { shape, strides: l.strides.clone(), offset: (l.offset as isize + r0 as isize * l.strides[0]) as usize }
}

pub(crate) fn map1<A: Element, O: Element, F: Fn(A) -> O + Sync>(
    a: &Storage,
    shape: &[usize],
    out_dtype: DType,
    f: F,
) -> Result<Storage> {
    let n = numel(shape);
    let mut buf = CpuBuffer::alloc(out_dtype, n)?;
    let la = a.layout.broadcast_to(shape);
    let src = strided::buffer::<A>(a);
    let out = buf.typed_mut::<O>();
    if la.is_contiguous() {
        let src = &src[la.offset..la.offset + n];
        par::zip(out, PAR_CHUNK, src, PAR_CHUNK, |o, s| {
            for (o, &x) in o.iter_mut().zip(s) {
                *o = f(x);
            }
        });
    } else {
        par_rows(out, shape, |out, r0, rows| {
            let l = rows_of(&la, r0, rows);
            let mut k = 0;
            strided::walk(&l.shape, [&l.strides], [l.offset], |[b], len, [s]| {
                for i in 0..len {
                    out[k + i] = f(src[(b as isize + i as isize * s) as usize]);
                }
                k += len;
            });
        });
    }
    Ok(Storage::contiguous(Buffer::Cpu(buf), out_dtype, shape))
}

pub(crate) fn map2<A: Element, B: Element, O: Element, F: Fn(A, B) -> O + Sync>(
    a: &Storage,
    b: &Storage,
    shape: &[usize],
    out_dtype: DType,
    f: F,
) -> Result<Storage> {
    let n = numel(shape);
    let mut buf = CpuBuffer::alloc(out_dtype, n)?;
    let la = a.layout.broadcast_to(shape);
    let lb = b.layout.broadcast_to(shape);
    let (sa, sb) = (strided::buffer::<A>(a), strided::buffer::<B>(b));
    let out = buf.typed_mut::<O>();
    if la.is_contiguous() && lb.is_contiguous() {
        let sa = &sa[la.offset..la.offset + n];
        let sb = &sb[lb.offset..lb.offset + n];
        par::chunks(out, PAR_CHUNK, |c, o| {
            let start = c * PAR_CHUNK;
            let (xa, xb) = (&sa[start..start + o.len()], &sb[start..start + o.len()]);
            for i in 0..o.len() {
                o[i] = f(xa[i], xb[i]);
            }
        });
    } else {
        par_rows(out, shape, |out, r0, rows| {
            let (l1, l2) = (rows_of(&la, r0, rows), rows_of(&lb, r0, rows));
            let mut k = 0;
            strided::walk(&l1.shape, [&l1.strides, &l2.strides], [l1.offset, l2.offset], |[ba, bb], len, [s1, s2]| {
                let o = &mut out[k..k + len];
                match (s1, s2) {
                    (1, 1) => {
                        let (xa, xb) = (&sa[ba..ba + len], &sb[bb..bb + len]);
                        for i in 0..len {
                            o[i] = f(xa[i], xb[i]);
                        }
                    }
                    (1, 0) => {
                        let (xa, y) = (&sa[ba..ba + len], sb[bb]);
                        for i in 0..len {
                            o[i] = f(xa[i], y);
                        }
                    }
                    (0, 1) => {
                        let (x, xb) = (sa[ba], &sb[bb..bb + len]);
                        for i in 0..len {
                            o[i] = f(x, xb[i]);
                        }
                    }
                    _ => {
                        for i in 0..len {
                            let x = sa[(ba as isize + i as isize * s1) as usize];
                            let y = sb[(bb as isize + i as isize * s2) as usize];
                            o[i] = f(x, y);
                        }
                    }
                }
                k += len;
            });
        });
    }
    Ok(Storage::contiguous(Buffer::Cpu(buf), out_dtype, shape))
}

fn map3<A: Element, B: Element, C: Element, O: Element, F: Fn(A, B, C) -> O + Sync>(
    a: &Storage,
    b: &Storage,
    c: &Storage,
    shape: &[usize],
    out_dtype: DType,
    f: F,
) -> Result<Storage> {
    let n = numel(shape);
    let mut buf = CpuBuffer::alloc(out_dtype, n)?;
    let (la, lb, lc) = (a.layout.broadcast_to(shape), b.layout.broadcast_to(shape), c.layout.broadcast_to(shape));
    let (sa, sb, sc) = (strided::buffer::<A>(a), strided::buffer::<B>(b), strided::buffer::<C>(c));
    let out = buf.typed_mut::<O>();
    par_rows(out, shape, |out, r0, rows| {
        let (l1, l2, l3) = (rows_of(&la, r0, rows), rows_of(&lb, r0, rows), rows_of(&lc, r0, rows));
        let mut k = 0;
        strided::walk(
            &l1.shape,
            [&l1.strides, &l2.strides, &l3.strides],
            [l1.offset, l2.offset, l3.offset],
            |[b1, b2, b3], len, [s1, s2, s3]| {
                for i in 0..len {
                    let i = i as isize;
                    out[k + i as usize] = f(
                        sa[(b1 as isize + i * s1) as usize],
                        sb[(b2 as isize + i * s2) as usize],
                        sc[(b3 as isize + i * s3) as usize],
                    );
                }
                k += len;
            },
        );
    });
    Ok(Storage::contiguous(Buffer::Cpu(buf), out_dtype, shape))
}

// ---- cast ----

pub(crate) fn cast(x: &Storage, to: DType) -> Result<Storage> {
    let shape = x.layout.shape.clone();
    let from = x.dtype;
    // f32 holds every value of the other sources exactly; u32/i32/i64 going to f16/bf16
    // take the f64 path, which is exact for them, so that they are rounded only once.
    let via_f32 = from != DType::F64
        && to != DType::F64
        && (to == DType::F32 || !matches!(from, DType::U32 | DType::I32 | DType::I64));
    crate::with_dtype!(from, A => crate::with_dtype!(to, B => {
        if to == DType::Bool {
            map1::<A, B, _>(x, &shape, to, |v: A| B::from_i64((v.to_f64() != 0.0) as i64))
        } else if !from.is_float() && !to.is_float() {
            map1::<A, B, _>(x, &shape, to, |v: A| B::from_i64(v.to_i64()))
        } else if via_f32 {
            map1::<A, B, _>(x, &shape, to, |v: A| B::from_f32(v.to_f32()))
        } else {
            // `Element::from_f64`, not the inherent `bf16::from_f64`, which rounds twice.
            map1::<A, B, _>(x, &shape, to, |v: A| <B as Element>::from_f64(v.to_f64()))
        }
    }))
}

// ---- unary ----

// Each kernel is one loop per op (`each_unary!`, `each_binary!`) over the op's scalar
// function in `primitives/`, which the compiler can vectorise.

fn int_unary<T: IntOps>(op: UnaryOp, x: &Storage, dtype: DType) -> Result<Storage> {
    let shape = x.layout.shape.clone();
    if op.needs_float() {
        return Err(Error::dtype(op.name(), dtype, "integer inputs are converted to float by the op"));
    }
    each_unary!(op, K => map1::<T, T, _>(x, &shape, dtype, |v| K.int(v).unwrap_or(v)))
}

pub(crate) fn unary(op: UnaryOp, x: &Storage, dtype: DType) -> Result<Storage> {
    let shape = x.layout.shape.clone();
    if op == UnaryOp::LogicalNot {
        return crate::with_dtype!(x.dtype, A => map1::<A, u8, _>(x, &shape, DType::Bool, |v: A| (v.to_f64() == 0.0) as u8));
    }
    match x.dtype {
        DType::F32 => each_unary!(op, K => map1::<f32, f32, _>(x, &shape, dtype, |v| K.float(v))),
        DType::F64 => each_unary!(op, K => map1::<f64, f64, _>(x, &shape, dtype, |v| K.float(v))),
        DType::F16 => map1::<f16, f16, _>(x, &shape, dtype, |v| f16::from_f32(op.float(v.to_f32()))),
        DType::BF16 => map1::<bf16, bf16, _>(x, &shape, dtype, |v| bf16::from_f32(op.float(v.to_f32()))),
        DType::I32 => int_unary::<i32>(op, x, dtype),
        DType::I64 => int_unary::<i64>(op, x, dtype),
        DType::U32 => int_unary::<u32>(op, x, dtype),
        DType::U8 | DType::Bool => int_unary::<u8>(op, x, dtype),
    }
}

// ---- binary ----

/// A float binary op on storage type `T`, computed in `C` (`to` and `from` convert; as
/// closures, not `fn` pointers, so that they inline and the loops vectorise).
fn float_binary<T: Element, C: Float>(
    op: BinaryOp,
    a: &Storage,
    b: &Storage,
    shape: &[usize],
    dtype: DType,
    to: impl Fn(T) -> C + Copy + Sync,
    from: impl Fn(C) -> T + Copy + Sync,
) -> Result<Storage> {
    // Comparisons read the storage type directly (no conversion of f16 or bf16).
    each_binary!(op, K => {
        const PREDICATE: bool = K.is_predicate();
        const SELECTION: bool = K.is_selection();
        if PREDICATE {
            map2::<T, T, u8, _>(a, b, shape, DType::Bool, |x, y| K.test(x, y, T::zero()) as u8)
        } else if SELECTION {
            map2::<T, T, T, _>(a, b, shape, dtype, |x, y| K.pick(x, y))
        } else {
            map2::<T, T, T, _>(a, b, shape, dtype, |x, y| from(K.float(to(x), to(y))))
        }
    })
}

fn int_binary<T: IntOps>(op: BinaryOp, a: &Storage, b: &Storage, shape: &[usize], dtype: DType) -> Result<Storage> {
    each_binary!(op, K => {
        const PREDICATE: bool = K.is_predicate();
        if PREDICATE {
            map2::<T, T, u8, _>(a, b, shape, DType::Bool, |x, y| (K.int(x, y) != T::zero()) as u8)
        } else {
            map2::<T, T, T, _>(a, b, shape, dtype, |x, y| K.int(x, y))
        }
    })
}

pub(crate) fn binary(op: BinaryOp, a: &Storage, b: &Storage, shape: &[usize], dtype: DType) -> Result<Storage> {
    debug_assert_eq!(a.dtype, b.dtype);
    let dtype = if op.is_predicate() { a.dtype } else { dtype };
    match a.dtype {
        DType::F32 => float_binary::<f32, f32>(op, a, b, shape, dtype, |v: f32| v, |v: f32| v),
        DType::F64 => float_binary::<f64, f64>(op, a, b, shape, dtype, |v: f64| v, |v: f64| v),
        DType::F16 => float_binary::<f16, f32>(op, a, b, shape, dtype, |v: f16| v.to_f32(), f16::from_f32),
        DType::BF16 => float_binary::<bf16, f32>(op, a, b, shape, dtype, |v: bf16| v.to_f32(), bf16::from_f32),
        DType::I32 => int_binary::<i32>(op, a, b, shape, dtype),
        DType::I64 => int_binary::<i64>(op, a, b, shape, dtype),
        DType::U32 => int_binary::<u32>(op, a, b, shape, dtype),
        DType::U8 | DType::Bool => int_binary::<u8>(op, a, b, shape, dtype),
    }
}

pub(crate) fn where_(c: &Storage, x: &Storage, y: &Storage, shape: &[usize], dtype: DType) -> Result<Storage> {
    crate::with_dtype!(dtype, T => map3::<u8, T, T, T, _>(c, x, y, shape, dtype, |c, x, y| if c != 0 { x } else { y }))
}

#[cfg(test)]
mod tests {
    //! Strided kernels on permuted, reversed and broadcast layouts, against references
    //! indexed by hand (the op layer cannot make such inputs yet).
    use super::*;
    use crate::backend::cpu::to_f64_vec;

    fn storage(v: &[f32], shape: &[usize]) -> Storage {
        Storage::contiguous(Buffer::Cpu(CpuBuffer::from_slice(v).unwrap()), DType::F32, shape)
    }

    /// Values of a [d0, d1] row-major array read transposed, as a [d1, d0] array.
    fn transposed(v: &[f32], d0: usize, d1: usize) -> Vec<f64> {
        (0..d1).flat_map(|j| (0..d0).map(move |i| v[i * d1 + j] as f64)).collect()
    }

    fn values(n: usize) -> Vec<f32> {
        (0..n).map(|k| ((k * 7919) % 1000) as f32 / 100.0 - 5.0).collect()
    }

    #[test]
    fn map1_and_unary_read_permuted_layouts() {
        // small (single-threaded) and large enough for the parallel strided path
        for (d0, d1) in [(3, 5), (300, 257)] {
            let v = values(d0 * d1);
            let s = storage(&v, &[d0, d1]);
            let t = s.with_layout(s.layout.permute(&[1, 0]));
            assert!(!t.layout.is_contiguous());
            let want = transposed(&v, d0, d1);
            let out = map1::<f32, f32, _>(&t, &[d1, d0], DType::F32, |x| 2.0 * x + 1.0).unwrap();
            let got = to_f64_vec(&out);
            assert!(got.iter().zip(&want).all(|(g, w)| *g == 2.0 * w + 1.0));
            let out = unary(UnaryOp::Exp, &t, DType::F32).unwrap();
            for (g, w) in to_f64_vec(&out).iter().zip(&want) {
                assert!((g - w.exp()).abs() <= 1e-6 * w.exp(), "{g} vs {}", w.exp());
            }
            let out = cast(&t, DType::I32).unwrap();
            assert_eq!(out.dtype, DType::I32);
            assert!(to_f64_vec(&out).iter().zip(&want).all(|(g, w)| *g == w.trunc()));
        }
    }

    #[test]
    fn reversed_and_offset_layouts() {
        let v = values(10);
        let s = storage(&v, &[10]);
        // elements 8, 6, 4, 2: offset 8, stride -2
        let r = s.with_layout(Layout { shape: [4][..].into(), strides: [-2][..].into(), offset: 8 });
        let out = unary(UnaryOp::Neg, &r, DType::F32).unwrap();
        let want: Vec<f64> = [8, 6, 4, 2].iter().map(|&k| -(v[k] as f64)).collect();
        assert_eq!(to_f64_vec(&out), want);
        let out = binary(BinaryOp::Sub, &r, &s.with_layout(Layout::contiguous(&[4])), &[4], DType::F32).unwrap();
        let want: Vec<f64> = [8, 6, 4, 2].iter().enumerate().map(|(i, &k)| v[k] as f64 - v[i] as f64).collect();
        assert_eq!(to_f64_vec(&out), want);
    }

    #[test]
    fn binary_and_where_mix_permuted_and_broadcast() {
        for (d0, d1) in [(4, 6), (260, 300)] {
            let v = values(d0 * d1);
            let s = storage(&v, &[d0, d1]);
            let t = s.with_layout(s.layout.permute(&[1, 0])); // [d1, d0], strides [1, d1]
            let c = storage(&values(d0 * d1), &[d1, d0]); // contiguous
            let row = storage(&values(d0), &[d0]); // broadcast along axis 0
            let tv = transposed(&v, d0, d1);
            let cv: Vec<f64> = values(d0 * d1).iter().map(|&x| x as f64).collect();
            let rv: Vec<f64> = values(d0).iter().map(|&x| x as f64).collect();
            let shape = [d1, d0];
            let out = binary(BinaryOp::Mul, &t, &c, &shape, DType::F32).unwrap();
            let want: Vec<f64> = tv.iter().zip(&cv).map(|(a, b)| ((a * b) as f32) as f64).collect();
            assert_eq!(to_f64_vec(&out), want);
            let out = binary(BinaryOp::Maximum, &row, &t, &shape, DType::F32).unwrap();
            let want: Vec<f64> = (0..d0 * d1).map(|k| rv[k % d0].max(tv[k])).collect();
            assert_eq!(to_f64_vec(&out), want);
            let out = binary(BinaryOp::Less, &t, &row, &shape, DType::Bool).unwrap();
            assert_eq!(out.dtype, DType::Bool);
            let want: Vec<f64> = (0..d0 * d1).map(|k| (tv[k] < rv[k % d0]) as u8 as f64).collect();
            assert_eq!(to_f64_vec(&out), want);
            // inner runs with strides (1, 0), (0, 1) and (1, 1) against a broadcast column/row
            let col = storage(&values(d1), &[d1, 1]);
            let colv: Vec<f64> = values(d1).iter().map(|&x| x as f64).collect();
            let out = binary(BinaryOp::Sub, &c, &col, &shape, DType::F32).unwrap();
            let want: Vec<f64> = (0..d0 * d1).map(|k| ((cv[k] - colv[k / d0]) as f32) as f64).collect();
            assert_eq!(to_f64_vec(&out), want);
            let out = binary(BinaryOp::Sub, &col, &c, &shape, DType::F32).unwrap();
            let want: Vec<f64> = (0..d0 * d1).map(|k| ((colv[k / d0] - cv[k]) as f32) as f64).collect();
            assert_eq!(to_f64_vec(&out), want);
            let out = binary(BinaryOp::Sub, &row, &c, &shape, DType::F32).unwrap();
            let want: Vec<f64> = (0..d0 * d1).map(|k| ((rv[k % d0] - cv[k]) as f32) as f64).collect();
            assert_eq!(to_f64_vec(&out), want);
            let cond = cast(&t, DType::Bool).unwrap();
            let out = where_(&cond, &row, &c, &shape, DType::F32).unwrap();
            let want: Vec<f64> = (0..d0 * d1).map(|k| if tv[k] != 0.0 { rv[k % d0] } else { cv[k] }).collect();
            assert_eq!(to_f64_vec(&out), want);
            // a permuted condition too
            let cs = cast(&s, DType::Bool).unwrap();
            let ct = cs.with_layout(cs.layout.permute(&[1, 0]));
            let out = where_(&ct, &t, &row, &shape, DType::F32).unwrap();
            let want: Vec<f64> = (0..d0 * d1).map(|k| if tv[k] != 0.0 { tv[k] } else { rv[k % d0] }).collect();
            assert_eq!(to_f64_vec(&out), want);
        }
    }
}
