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
use crate::primitives::{BinaryOp, UnaryOp};
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

macro_rules! float_unary {
    ($op:expr, $x:ident : $F:ty, $sqrt2pi:expr, $erf:path, $exp:path) => {{
        use UnaryOp::*;
        let x = $x;
        match $op {
            Neg => -x,
            Abs => x.abs(),
            Sign => {
                if x > 0.0 {
                    1.0
                } else if x < 0.0 {
                    -1.0
                } else {
                    x
                }
            }
            Exp => $exp(x),
            Log => x.ln(),
            Log1p => x.ln_1p(),
            Sqrt => x.sqrt(),
            Rsqrt => 1.0 / x.sqrt(),
            Square => x * x,
            Reciprocal => 1.0 / x,
            Sin => x.sin(),
            Cos => x.cos(),
            Tanh => x.tanh(),
            Sigmoid => 1.0 / (1.0 + $exp(-x)),
            Relu => {
                if x > 0.0 {
                    x
                } else if x.is_nan() {
                    x
                } else {
                    0.0
                }
            }
            Gelu => 0.5 * x * (1.0 + $erf(x * std::f64::consts::FRAC_1_SQRT_2 as $F)),
            GeluTanh => 0.5 * x * (1.0 + ($sqrt2pi * (x + 0.044715 * x * x * x)).tanh()),
            Silu => x / (1.0 + $exp(-x)),
            Erf => $erf(x),
            Floor => x.floor(),
            Ceil => x.ceil(),
            Round => x.round_ties_even(),
            LogicalNot => (x == 0.0) as u8 as $F,
        }
    }};
}

/// Expands `$e` once per unary op, with `$k` a constant naming that op, and matches `$op`
/// to pick one: code calling [`unary_f32`]/[`unary_f64`] with `$k` gets a loop per op
/// (the op's own expression, which the compiler can vectorise) instead of a match per
/// element. Adding an op to `UnaryOp` without adding it here does not compile.
macro_rules! each_unary {
    ($op:expr, $k:ident => $e:expr) => {
        $crate::backend::cpu::elementwise::each_unary!(@ $op, $k, $e; Neg, Abs, Sign, Exp, Log, Log1p, Sqrt,
            Rsqrt, Square, Reciprocal, Sin, Cos, Tanh, Sigmoid, Relu, Gelu, GeluTanh, Silu, Erf, Floor, Ceil,
            Round, LogicalNot)
    };
    (@ $op:expr, $k:ident, $e:expr; $($name:ident),*) => {
        match $op {
            $($crate::primitives::UnaryOp::$name => {
                const $k: $crate::primitives::UnaryOp = $crate::primitives::UnaryOp::$name;
                $e
            })*
        }
    };
}
pub(crate) use each_unary;

#[inline(always)]
pub(crate) fn unary_f32(op: UnaryOp, x: f32) -> f32 {
    // exp without a library call (see `vexp`): loops over one op vectorise.
    float_unary!(op, x: f32, 0.797_884_6_f32, libm::erff, crate::backend::cpu::vexp::exp_f32)
}
#[inline(always)]
pub(crate) fn unary_f64(op: UnaryOp, x: f64) -> f64 {
    float_unary!(op, x: f64, 0.797_884_560_802_865_4_f64, libm::erf, f64::exp)
}

fn int_unary<T: Element + IntOps>(op: UnaryOp, x: &Storage, dtype: DType) -> Result<Storage> {
    use UnaryOp::*;
    let shape = x.layout.shape.clone();
    match op {
        Neg => map1::<T, T, _>(x, &shape, dtype, |v| T::wneg(v)),
        Abs => map1::<T, T, _>(x, &shape, dtype, |v| T::wabs(v)),
        Sign => map1::<T, T, _>(x, &shape, dtype, |v| T::sign(v)),
        Square => map1::<T, T, _>(x, &shape, dtype, |v| T::wmul(v, v)),
        Relu => map1::<T, T, _>(x, &shape, dtype, |v| if v > T::zero() { v } else { T::zero() }),
        Floor | Ceil | Round => map1::<T, T, _>(x, &shape, dtype, |v| v),
        LogicalNot => map1::<T, u8, _>(x, &shape, DType::Bool, |v| (v == T::zero()) as u8),
        Exp | Log | Log1p | Sqrt | Rsqrt | Reciprocal | Sin | Cos | Tanh | Sigmoid | Gelu | GeluTanh | Silu | Erf => {
            Err(Error::dtype(op.name(), dtype, "integer inputs are converted to float by the op"))
        }
    }
}

pub(crate) fn unary(op: UnaryOp, x: &Storage, dtype: DType) -> Result<Storage> {
    let shape = x.layout.shape.clone();
    if op == UnaryOp::LogicalNot {
        return crate::with_dtype!(x.dtype, A => map1::<A, u8, _>(x, &shape, DType::Bool, |v: A| (v.to_f64() == 0.0) as u8));
    }
    match x.dtype {
        DType::F32 => each_unary!(op, K => map1::<f32, f32, _>(x, &shape, dtype, |v| unary_f32(K, v))),
        DType::F64 => each_unary!(op, K => map1::<f64, f64, _>(x, &shape, dtype, |v| unary_f64(K, v))),
        DType::F16 => map1::<f16, f16, _>(x, &shape, dtype, |v| f16::from_f32(unary_f32(op, v.to_f32()))),
        DType::BF16 => map1::<bf16, bf16, _>(x, &shape, dtype, |v| bf16::from_f32(unary_f32(op, v.to_f32()))),
        DType::I32 => int_unary::<i32>(op, x, dtype),
        DType::I64 => int_unary::<i64>(op, x, dtype),
        DType::U32 => int_unary::<u32>(op, x, dtype),
        DType::U8 | DType::Bool => int_unary::<u8>(op, x, dtype),
    }
}

// ---- binary ----

/// Wrapping integer arithmetic shared by the integer kernels.
pub(crate) trait IntOps: Element {
    fn wadd(a: Self, b: Self) -> Self;
    fn wsub(a: Self, b: Self) -> Self;
    fn wmul(a: Self, b: Self) -> Self;
    fn wneg(a: Self) -> Self;
    fn wabs(a: Self) -> Self;
    fn sign(a: Self) -> Self;
    fn ipow(a: Self, b: Self) -> Self;
    fn idiv(a: Self, b: Self) -> Self;
}
macro_rules! int_ops {
    ($($t:ty, $signed:expr);*) => {$(
        impl IntOps for $t {
            #[inline(always)] fn wadd(a: Self, b: Self) -> Self { a.wrapping_add(b) }
            #[inline(always)] fn wsub(a: Self, b: Self) -> Self { a.wrapping_sub(b) }
            #[inline(always)] fn wmul(a: Self, b: Self) -> Self { a.wrapping_mul(b) }
            #[inline(always)] fn wneg(a: Self) -> Self { (0 as $t).wrapping_sub(a) }
            #[inline(always)] fn wabs(a: Self) -> Self { if $signed && a < (0 as $t) { (0 as $t).wrapping_sub(a) } else { a } }
            #[inline(always)] fn sign(a: Self) -> Self { if a > (0 as $t) { 1 as $t } else if a == (0 as $t) { 0 as $t } else { (0 as $t).wrapping_sub(1) } }
            #[inline(always)] fn ipow(a: Self, b: Self) -> Self {
                if $signed && b < (0 as $t) {
                    // Integer powers with negative exponents: only ±1 survive.
                    if a == (1 as $t) { 1 as $t } else if $signed && a == (0 as $t).wrapping_sub(1) { if b.to_i64() % 2 == 0 { 1 as $t } else { a } } else { 0 as $t }
                } else {
                    a.wrapping_pow(b.to_i64().min(u32::MAX as i64) as u32)
                }
            }
            #[inline(always)] fn idiv(a: Self, b: Self) -> Self { if b == (0 as $t) { 0 as $t } else { a.wrapping_div(b) } }
        }
    )*};
}
int_ops!(i32, true; i64, true; u32, false; u8, false);

fn float_binary<T>(
    op: BinaryOp,
    a: &Storage,
    b: &Storage,
    shape: &[usize],
    dtype: DType,
    to: fn(T) -> f64,
    from: fn(f64) -> T,
) -> Result<Storage>
where
    T: Element,
{
    use BinaryOp::*;
    let _ = (to, from);
    macro_rules! m {
        ($f:expr) => {
            map2::<T, T, T, _>(a, b, shape, dtype, $f)
        };
    }
    macro_rules! p {
        ($f:expr) => {
            map2::<T, T, u8, _>(a, b, shape, DType::Bool, $f)
        };
    }
    match op {
        Equal => p!(|x: T, y: T| (x == y) as u8),
        NotEqual => p!(|x: T, y: T| (x != y) as u8),
        Less => p!(|x: T, y: T| (x < y) as u8),
        LessEqual => p!(|x: T, y: T| (x <= y) as u8),
        Greater => p!(|x: T, y: T| (x > y) as u8),
        GreaterEqual => p!(|x: T, y: T| (x >= y) as u8),
        LogicalAnd => p!(|x: T, y: T| (x != T::zero() && y != T::zero()) as u8),
        LogicalOr => p!(|x: T, y: T| (x != T::zero() || y != T::zero()) as u8),
        Maximum => m!(|x: T, y: T| if x.to_f64().is_nan() || x > y { x } else { y }),
        Minimum => m!(|x: T, y: T| if x.to_f64().is_nan() || x < y { x } else { y }),
        Add | Sub | Mul | Div | Pow => unreachable!("arithmetic is computed per type (`arith!`, `int_binary`)"),
    }
}

macro_rules! arith {
    ($T:ty, $C:ty, $op:expr, $a:expr, $b:expr, $shape:expr, $dtype:expr, $to:expr, $from:expr) => {{
        use BinaryOp::*;
        let (to, from) = ($to, $from);
        match $op {
            Add => map2::<$T, $T, $T, _>($a, $b, $shape, $dtype, |x, y| from(to(x) + to(y))),
            Sub => map2::<$T, $T, $T, _>($a, $b, $shape, $dtype, |x, y| from(to(x) - to(y))),
            Mul => map2::<$T, $T, $T, _>($a, $b, $shape, $dtype, |x, y| from(to(x) * to(y))),
            Div => map2::<$T, $T, $T, _>($a, $b, $shape, $dtype, |x, y| from(to(x) / to(y))),
            Pow => map2::<$T, $T, $T, _>($a, $b, $shape, $dtype, |x, y| from(<$C>::powf(to(x), to(y)))),
            Maximum | Minimum | Equal | NotEqual | Less | LessEqual | Greater | GreaterEqual | LogicalAnd
            | LogicalOr => float_binary::<$T>($op, $a, $b, $shape, $dtype, |v| v.to_f64(), <$T as Element>::from_f64),
        }
    }};
}

fn int_binary<T: IntOps>(op: BinaryOp, a: &Storage, b: &Storage, shape: &[usize], dtype: DType) -> Result<Storage> {
    use BinaryOp::*;
    match op {
        Add => map2::<T, T, T, _>(a, b, shape, dtype, T::wadd),
        Sub => map2::<T, T, T, _>(a, b, shape, dtype, T::wsub),
        Mul => map2::<T, T, T, _>(a, b, shape, dtype, T::wmul),
        Div => map2::<T, T, T, _>(a, b, shape, dtype, T::idiv),
        Pow => map2::<T, T, T, _>(a, b, shape, dtype, T::ipow),
        Maximum | Minimum | Equal | NotEqual | Less | LessEqual | Greater | GreaterEqual | LogicalAnd | LogicalOr => {
            float_binary::<T>(op, a, b, shape, dtype, |v| v.to_f64(), T::from_f64)
        }
    }
}

pub(crate) fn binary(op: BinaryOp, a: &Storage, b: &Storage, shape: &[usize], dtype: DType) -> Result<Storage> {
    debug_assert_eq!(a.dtype, b.dtype);
    let dtype = if op.is_predicate() { a.dtype } else { dtype };
    match a.dtype {
        DType::F32 => arith!(f32, f32, op, a, b, shape, dtype, |v: f32| v, |v: f32| v),
        DType::F64 => arith!(f64, f64, op, a, b, shape, dtype, |v: f64| v, |v: f64| v),
        DType::F16 => arith!(f16, f32, op, a, b, shape, dtype, |v: f16| v.to_f32(), f16::from_f32),
        DType::BF16 => arith!(bf16, f32, op, a, b, shape, dtype, |v: bf16| v.to_f32(), bf16::from_f32),
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
