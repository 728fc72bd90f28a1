//! Elementwise kernels: cast, unary, binary (with broadcasting) and where.
//!
//! Every kernel writes a new contiguous output. Inputs are read through their layouts
//! broadcast to the output shape; when every input is contiguous the loop is a plain zip
//! over slices (vectorised by the compiler) split across the worker pool in chunks.
//! f16 and bf16 compute in f32; the other dtypes compute in their own type.

use half::{bf16, f16};

use crate::backend::cpu::simd::{self, F32Lanes};
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

/// `x` broadcast to `shape`, with a view that is strided without being a broadcast (a
/// transposed or sliced input) first gathered into a contiguous buffer, so that the
/// kernels' walks read it in runs of stride 1 (a broadcast keeps its stride-0 runs).
fn dense(x: &Storage, shape: &[usize]) -> Result<Storage> {
    let l = x.layout.broadcast_to(shape);
    if l.is_contiguous() || l.strides.contains(&0) || numel(shape) < 2 * strided::TILE * strided::TILE {
        return Ok(x.with_layout(l));
    }
    let mut buf = CpuBuffer::alloc(x.dtype, numel(shape))?;
    crate::with_dtype!(x.dtype, T => strided::gather(strided::buffer::<T>(x), &l, buf.typed_mut::<T>()));
    Ok(Storage::contiguous(Buffer::Cpu(buf), x.dtype, shape))
}

pub(crate) fn map1<A: Element, O: Element, F: Fn(A) -> O + Sync>(
    a: &Storage,
    shape: &[usize],
    out_dtype: DType,
    f: F,
) -> Result<Storage> {
    let n = numel(shape);
    let mut buf = CpuBuffer::alloc(out_dtype, n)?;
    // A strided input is gathered first (tiled when transposed), so the map is one
    // parallel pass over contiguous values.
    let a = if a.layout.shape.as_slice() == shape { a.clone() } else { a.with_layout(a.layout.broadcast_to(shape)) };
    let src = strided::contiguous::<A>(&a);
    par::zip(buf.typed_mut::<O>(), PAR_CHUNK, &src, PAR_CHUNK, |o, s| {
        for (o, &x) in o.iter_mut().zip(s) {
            *o = f(x);
        }
    });
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
    let (a, b) = (&dense(a, shape)?, &dense(b, shape)?);
    let (la, lb) = (&a.layout, &b.layout);
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
            let (l1, l2) = (rows_of(la, r0, rows), rows_of(lb, r0, rows));
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
    let (a, b, c) = (&dense(a, shape)?, &dense(b, shape)?, &dense(c, shape)?);
    let (la, lb, lc) = (&a.layout, &b.layout, &c.layout);
    let (sa, sb, sc) = (strided::buffer::<A>(a), strided::buffer::<B>(b), strided::buffer::<C>(c));
    let out = buf.typed_mut::<O>();
    par_rows(out, shape, |out, r0, rows| {
        let (l1, l2, l3) = (rows_of(la, r0, rows), rows_of(lb, r0, rows), rows_of(lc, r0, rows));
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
        } else if via_f32 && [from, to].iter().any(|d| matches!(d, DType::F16 | DType::BF16)) {
            cast_via_f32::<A, B>(x, to)
        } else if from == DType::F32 && to.is_int() {
            cast_f32_to_int(x, to)
        } else if via_f32 {
            map1::<A, B, _>(x, &shape, to, |v: A| B::from_f32(v.to_f32()))
        } else {
            // `Element::from_f64`, not the inherent `bf16::from_f64`, which rounds twice.
            map1::<A, B, _>(x, &shape, to, |v: A| <B as Element>::from_f64(v.to_f64()))
        }
    }))
}

/// `B::from_f32(a.to_f32())` for each value, a block at a time: the float types convert
/// a slice at a time ([`F32Lanes`], which vectorises f16 and bf16), the others one value
/// at a time.
fn cast_via_f32<A: Element, B: Element>(x: &Storage, to: DType) -> Result<Storage> {
    let shape = x.layout.shape.clone();
    let mut buf = CpuBuffer::alloc(to, numel(&shape))?;
    let src = strided::contiguous::<A>(x);
    par::zip(buf.typed_mut::<B>(), PAR_CHUNK, &src, PAR_CHUNK, |o, s| {
        let mut t = [0f32; BLOCK];
        for (o, s) in o.chunks_mut(BLOCK).zip(s.chunks(BLOCK)) {
            let t = &mut t[..o.len()];
            match A::DTYPE {
                DType::F16 => f16::to_f32s(bytemuck::cast_slice(s), t),
                DType::BF16 => bf16::to_f32s(bytemuck::cast_slice(s), t),
                DType::F32 => t.copy_from_slice(bytemuck::cast_slice(s)),
                _ => t.iter_mut().zip(s).for_each(|(t, &v)| *t = v.to_f32()),
            }
            match B::DTYPE {
                DType::F16 => f16::from_f32s(t, bytemuck::cast_slice_mut(o)),
                DType::BF16 => bf16::from_f32s(t, bytemuck::cast_slice_mut(o)),
                DType::F32 => bytemuck::cast_slice_mut(o).copy_from_slice(t),
                _ => o.iter_mut().zip(t.iter()).for_each(|(o, &v)| *o = B::from_f32(v)),
            }
        }
    });
    Ok(Storage::contiguous(Buffer::Cpu(buf), to, &shape))
}

/// f32 to an integer type, `as` (saturating, NaN to 0), in loops built for the CPU's
/// vectors (baseline x86-64 converts and clamps one value at a time).
fn cast_f32_to_int(x: &Storage, to: DType) -> Result<Storage> {
    let shape = x.layout.shape.clone();
    let mut buf = CpuBuffer::alloc(to, numel(&shape))?;
    let src = strided::contiguous::<f32>(x);
    macro_rules! each {
        ($($d:ident => $t:ty, $f:ident;)*) => {
            match to {
                $(DType::$d => {
                    simd::multiversion! {
                        fn $f(s: &[f32], o: &mut [$t]) {
                            for (o, &v) in o.iter_mut().zip(s) {
                                *o = v as $t;
                            }
                        }
                    }
                    par::zip(buf.typed_mut::<$t>(), PAR_CHUNK, &src, PAR_CHUNK, |o, s| $f(s, o));
                })*
                _ => return Err(Error::dtype("astype", to, "an integer dtype was expected")),
            }
        };
    }
    each! {
        U8 => u8, to_u8;
        I32 => i32, to_i32;
        U32 => u32, to_u32;
        I64 => i64, to_i64;
    }
    Ok(Storage::contiguous(Buffer::Cpu(buf), to, &shape))
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
        DType::F32 => float_unary::<f32>(op, x, dtype),
        DType::F64 => each_unary!(op, K => map1::<f64, f64, _>(x, &shape, dtype, |v| K.float(v))),
        DType::F16 => float_unary::<f16>(op, x, dtype),
        DType::BF16 => float_unary::<bf16>(op, x, dtype),
        DType::I32 => int_unary::<i32>(op, x, dtype),
        DType::I64 => int_unary::<i64>(op, x, dtype),
        DType::U32 => int_unary::<u32>(op, x, dtype),
        DType::U8 | DType::Bool => int_unary::<u8>(op, x, dtype),
    }
}

/// Values converted to f32 per block of this many (on the stack).
const BLOCK: usize = 1024;

/// A float unary op on storage type `T`, computed in f32: the input (gathered first when
/// strided) is converted a block at a time, the op's loop runs on the block built for
/// the CPU's vectors ([`simd::unary_f32`]), and the block is rounded back once.
fn float_unary<T: Element + F32Lanes>(op: UnaryOp, x: &Storage, dtype: DType) -> Result<Storage> {
    let shape = x.layout.shape.clone();
    let n = numel(&shape);
    let mut buf = CpuBuffer::alloc(dtype, n)?;
    let src = strided::contiguous::<T>(x);
    par::zip(buf.typed_mut::<T>(), PAR_CHUNK, &src, PAR_CHUNK, |o, s| {
        if let (Some(o), Some(s)) = (T::as_f32_mut(o), T::as_f32(s)) {
            return simd::unary_f32(op, s, o);
        }
        let mut t = [0f32; BLOCK];
        for (o, s) in o.chunks_mut(BLOCK).zip(s.chunks(BLOCK)) {
            let t = &mut t[..o.len()];
            T::to_f32s(s, t);
            simd::unary_f32_in_place(op, t);
            T::from_f32s(t, o);
        }
    });
    Ok(Storage::contiguous(Buffer::Cpu(buf), dtype, &shape))
}

// ---- binary ----

/// A half-precision arithmetic op or comparison through f32 blocks: each inner run of the
/// broadcast walk is converted a block at a time (a run of stride 0 is one value
/// repeated), the f32 loop runs on the blocks, and arithmetic results are rounded back
/// once, as `T::from_f32(op(a.to_f32(), b.to_f32()))` would give.
fn half_binary<T: Element + F32Lanes, O: Element>(
    op: BinaryOp,
    a: &Storage,
    b: &Storage,
    shape: &[usize],
    dtype: DType,
    store: impl Fn(BinaryOp, &[f32], &[f32], &mut [O]) + Sync,
) -> Result<Storage> {
    let n = numel(shape);
    let mut buf = CpuBuffer::alloc(dtype, n)?;
    let (a, b) = (&dense(a, shape)?, &dense(b, shape)?);
    let (la, lb) = (&a.layout, &b.layout);
    let (sa, sb) = (strided::buffer::<T>(a), strided::buffer::<T>(b));
    par_rows(buf.typed_mut::<O>(), shape, |out, r0, rows| {
        let (l1, l2) = (rows_of(la, r0, rows), rows_of(lb, r0, rows));
        let (mut fa, mut fb) = ([0f32; BLOCK], [0f32; BLOCK]);
        let mut k = 0;
        strided::walk(&l1.shape, [&l1.strides, &l2.strides], [l1.offset, l2.offset], |[ba, bb], len, [s1, s2]| {
            for i0 in (0..len).step_by(BLOCK) {
                let m = BLOCK.min(len - i0);
                load_f32(sa, ba as isize + i0 as isize * s1, s1, &mut fa[..m]);
                load_f32(sb, bb as isize + i0 as isize * s2, s2, &mut fb[..m]);
                store(op, &fa[..m], &fb[..m], &mut out[k + i0..k + i0 + m]);
            }
            k += len;
        });
    });
    Ok(Storage::contiguous(Buffer::Cpu(buf), dtype, shape))
}

/// `o.len()` values of `src` from `base` by `stride`, as f32.
fn load_f32<T: Element + F32Lanes>(src: &[T], base: isize, stride: isize, o: &mut [f32]) {
    let m = o.len();
    match stride {
        1 => T::to_f32s(&src[base as usize..base as usize + m], o),
        0 => {
            let mut v = [0f32];
            T::to_f32s(&src[base as usize..base as usize + 1], &mut v);
            o.fill(v[0]);
        }
        _ => {
            let mut g = [T::zero(); BLOCK];
            for (i, g) in g[..m].iter_mut().enumerate() {
                *g = src[(base + i as isize * stride) as usize];
            }
            T::to_f32s(&g[..m], o);
        }
    }
}

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
        DType::F16 if op.is_predicate() => half_binary::<f16, u8>(op, a, b, shape, DType::Bool, simd::test_f32),
        DType::BF16 if op.is_predicate() => half_binary::<bf16, u8>(op, a, b, shape, DType::Bool, simd::test_f32),
        DType::F16 if !op.is_selection() => half_binary::<f16, f16>(op, a, b, shape, dtype, |op, x, y, o| {
            let mut t = [0f32; BLOCK];
            simd::binary_f32(op, x, y, &mut t[..o.len()]);
            f16::from_f32s(&t[..o.len()], o);
        }),
        DType::BF16 if !op.is_selection() => half_binary::<bf16, bf16>(op, a, b, shape, dtype, |op, x, y, o| {
            let mut t = [0f32; BLOCK];
            simd::binary_f32(op, x, y, &mut t[..o.len()]);
            bf16::from_f32s(&t[..o.len()], o);
        }),
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

    /// The f16 and bf16 kernels (blocks through f32) against the per-element formula, for
    /// every op and the broadcast patterns of a `[d0, d1]` output: same shape, row,
    /// column, scalar, outer, transposed and reversed, with offsets, over several blocks.
    #[test]
    fn half_kernels_give_the_per_element_bits() {
        fn check<T: Element + F32Lanes>(d: DType, to: fn(T) -> f32, from: fn(f32) -> T) {
            let (d0, d1) = (37, 1100);
            let v: Vec<T> = values(2 * d0 * d1 + 3).into_iter().map(from).collect();
            let s = Storage::contiguous(Buffer::Cpu(CpuBuffer::from_slice(&v).unwrap()), d, &[v.len()]);
            let lay = |shape: [usize; 2], strides: [isize; 2], offset: usize| {
                s.with_layout(Layout { shape: shape[..].into(), strides: strides[..].into(), offset })
            };
            let operands = [
                lay([d0, d1], [d1 as isize, 1], 3),
                lay([1, d1], [0, 1], 5),
                lay([d0, 1], [1, 0], 7),
                lay([1, 1], [0, 0], 11),
                lay([d0, d1], [1, d0 as isize], 2),
                lay([d0, d1], [-(d1 as isize), -1], d0 * d1 + 1),
            ];
            let read = |x: &Storage, i: usize, j: usize| {
                let l = x.layout.broadcast_to(&[d0, d1]);
                to(v[(l.offset as isize + i as isize * l.strides[0] + j as isize * l.strides[1]) as usize])
            };
            for a in &operands {
                for b in &operands[..4] {
                    for (x, y) in [(a, b), (b, a)] {
                        for op in UnaryOp::ALL.into_iter().filter(|&o| o != UnaryOp::LogicalNot) {
                            let Ok(out) = unary(op, &x.with_layout(x.layout.broadcast_to(&[d0, d1])), d) else {
                                continue;
                            };
                            let got = out.cpu().unwrap().typed::<T>();
                            for (k, g) in got.iter().enumerate() {
                                let want = from(op.float(read(x, k / d1, k % d1)));
                                let same = bytemuck::bytes_of(g) == bytemuck::bytes_of(&want);
                                assert!(same || (to(*g).is_nan() && to(want).is_nan()), "{d} {op:?} at {k}");
                            }
                        }
                        for op in BinaryOp::ALL {
                            let out = to_f64_vec(&binary(op, x, y, &[d0, d1], d).unwrap());
                            for (k, &got) in out.iter().enumerate() {
                                let (p, q) = (read(x, k / d1, k % d1), read(y, k / d1, k % d1));
                                let want = if op.is_predicate() {
                                    op.test(p, q, 0.0) as u8 as f64
                                } else if op.is_selection() {
                                    to(op.pick(from(p), from(q))) as f64
                                } else {
                                    to(from(op.float(p, q))) as f64
                                };
                                assert!(
                                    got == want || (got.is_nan() && want.is_nan()),
                                    "{d} {op:?} at {k}: {got} vs {want}"
                                );
                            }
                        }
                    }
                }
            }
        }
        check::<f16>(DType::F16, f16::to_f32, f16::from_f32);
        check::<bf16>(DType::BF16, bf16::to_f32, bf16::from_f32);
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
