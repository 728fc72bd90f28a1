//! Elementwise ops: casts, unary functions, binary functions with broadcasting, `where`.
//!
//! Dtype rules (see `docs/DTYPES.md`): binary ops promote their operands with
//! [`promote`]/[`promote_scalar`]; transcendental unary ops and `div` compute in a float
//! dtype (integers become f32); comparisons and logical ops return bool; on bool
//! operands `add`/`maximum` are logical or and `mul`/`minimum` logical and.

use crate::array::Array;
use crate::backend::cpu::CpuBuffer;
use crate::backend::{Buffer, Storage};
use crate::dtype::{DType, Scalar, promote, promote_scalar};
use crate::error::{Error, Result};
use crate::ops::{IntoOperand, Operand, on_device, prepare, scalar_on, target_stream};
use crate::primitives::{BinaryOp, Primitive, UnaryOp};
use crate::runtime::device::Device;
use crate::runtime::stream::Stream;
use crate::shape::{Dims, broadcast_shapes, checked_size};
use smallvec::smallvec;

/// A weakly typed Rust scalar as a 0-d operand of `dtype` on `stream`.
///
/// Integer scalars wrap into integer dtypes (`u8` array + 300 adds 44), as integer
/// arithmetic wraps; a `Full` node would saturate them instead. `Full` holds an f64, so an
/// i64 scalar beyond 2^53 is recorded as an exact host constant.
fn weak_scalar(s: Scalar, dtype: DType, stream: &Stream) -> Result<Array> {
    let Scalar::Int(i) = s else {
        return Ok(scalar_on(s, dtype, stream));
    };
    let wrapped = match dtype {
        DType::U8 => i as u8 as f64,
        DType::U32 => i as u32 as f64,
        DType::I32 => i as i32 as f64,
        DType::I64 if i.unsigned_abs() > 1u64 << 53 => {
            let buf = CpuBuffer::from_slice(&[i])?;
            let host = Array::from_storage(
                Storage::contiguous(Buffer::Cpu(buf), DType::I64, &[]),
                Device::cpu().default_stream()?,
            );
            return Ok(on_device(&host, stream));
        }
        _ => return Ok(scalar_on(s, dtype, stream)),
    };
    Ok(scalar_on(Scalar::Float(wrapped), dtype, stream))
}

fn unary(x: &Array, op: UnaryOp) -> Result<Array> {
    let stream = target_stream(&[x])?;
    let dtype = if op == UnaryOp::LogicalNot {
        DType::Bool
    } else if op.needs_float() {
        x.dtype().to_float()
    } else if x.dtype() == DType::Bool && !op.keeps_bool() {
        // neg/sign/floor/ceil/round of bool: computed as i32, as NumPy does for neg.
        DType::I32
    } else {
        x.dtype()
    };
    checked_size(op.name(), x.shape(), dtype)?;
    let input = if op == UnaryOp::LogicalNot { prepare(x, x.dtype(), &stream) } else { prepare(x, dtype, &stream) };
    Ok(Array::from_op(Primitive::Unary(op), smallvec![input], Dims::from_slice(x.shape()), dtype, stream))
}

fn binary(a: &Array, b: Operand, op: BinaryOp) -> Result<Array> {
    let name = op.name();
    let (b_arr, dtype) = match &b {
        Operand::Array(b) => (Some(b), promote(a.dtype(), b.dtype())),
        Operand::Scalar(s) => (None, promote_scalar(a.dtype(), *s)),
    };
    let shape = match b_arr {
        Some(b) if b.shape() != a.shape() => Dims::from_vec(broadcast_shapes(name, a.shape(), b.shape())?),
        _ => Dims::from_slice(a.shape()),
    };
    let stream = match b_arr {
        Some(b) => target_stream(&[a, b])?,
        None => target_stream(&[a])?,
    };
    // Compute dtype of the kernel and the op actually recorded.
    let (op, compute) = match op {
        BinaryOp::LogicalAnd | BinaryOp::LogicalOr => (op, DType::Bool),
        BinaryOp::Add | BinaryOp::Maximum if dtype == DType::Bool => (BinaryOp::LogicalOr, DType::Bool),
        BinaryOp::Mul | BinaryOp::Minimum if dtype == DType::Bool => (BinaryOp::LogicalAnd, DType::Bool),
        BinaryOp::Sub | BinaryOp::Div | BinaryOp::Pow if dtype == DType::Bool => {
            return Err(Error::dtype(name, dtype, "arithmetic on two bool operands; cast one to a number first"));
        }
        BinaryOp::Div if !dtype.is_float() => (op, DType::F32),
        BinaryOp::Add
        | BinaryOp::Sub
        | BinaryOp::Mul
        | BinaryOp::Div
        | BinaryOp::Pow
        | BinaryOp::Maximum
        | BinaryOp::Minimum
        | BinaryOp::Equal
        | BinaryOp::NotEqual
        | BinaryOp::Less
        | BinaryOp::LessEqual
        | BinaryOp::Greater
        | BinaryOp::GreaterEqual => (op, dtype),
    };
    let out_dtype = if op.is_predicate() { DType::Bool } else { compute };
    // The output, and the operands converted to the compute dtype (wider than a bool output).
    checked_size(name, &shape, out_dtype)?;
    checked_size(name, a.shape(), compute)?;
    if let Some(b) = b_arr {
        checked_size(name, b.shape(), compute)?;
    }
    let lhs = prepare(a, compute, &stream);
    let rhs = match b {
        Operand::Array(b) => prepare(&b, compute, &stream),
        Operand::Scalar(s) => weak_scalar(s, compute, &stream)?,
    };
    Ok(Array::from_op(Primitive::Binary(op), smallvec![lhs, rhs], shape, out_dtype, stream))
}

macro_rules! unary_methods {
    ($($(#[$doc:meta])* $name:ident => $op:ident;)*) => {
        impl Array {$(
            $(#[$doc])*
            pub fn $name(&self) -> Result<Array> { unary(self, UnaryOp::$op) }
        )*}
    };
}
unary_methods! {
    /// `-x`.
    neg => Neg;
    /// `|x|`.
    abs => Abs;
    /// -1, 0 or 1 (NaN stays NaN).
    sign => Sign;
    /// `e^x`.
    exp => Exp;
    /// Natural logarithm.
    log => Log;
    /// `ln(1 + x)`, accurate near 0.
    log1p => Log1p;
    /// Square root.
    sqrt => Sqrt;
    /// `1 / sqrt(x)`.
    rsqrt => Rsqrt;
    /// `x * x`.
    square => Square;
    /// `1 / x`.
    reciprocal => Reciprocal;
    /// Sine.
    sin => Sin;
    /// Cosine.
    cos => Cos;
    /// Hyperbolic tangent.
    tanh => Tanh;
    /// `1 / (1 + e^-x)`.
    sigmoid => Sigmoid;
    /// `max(x, 0)`.
    relu => Relu;
    /// Exact GELU, `x * Φ(x)`.
    gelu => Gelu;
    /// GELU with the tanh approximation.
    gelu_tanh => GeluTanh;
    /// `x * sigmoid(x)`.
    silu => Silu;
    /// The derivative of [`gelu`](Array::gelu), `Φ(x) + x φ(x)`, as one op (gradients
    /// use it).
    gelu_grad => GeluGrad;
    /// The derivative of [`gelu_tanh`](Array::gelu_tanh), as one op.
    gelu_tanh_grad => GeluTanhGrad;
    /// The derivative of [`silu`](Array::silu), `s (1 + x (1 - s))` with `s =
    /// sigmoid(x)`, as one op.
    silu_grad => SiluGrad;
    /// The error function.
    erf => Erf;
    /// Largest integer not above x.
    floor => Floor;
    /// Smallest integer not below x.
    ceil => Ceil;
    /// Round half to even.
    round => Round;
    /// Logical not (true where x is zero); bool output.
    logical_not => LogicalNot;
}

macro_rules! binary_methods {
    ($($(#[$doc:meta])* $name:ident => $op:ident;)*) => {
        impl Array {$(
            $(#[$doc])*
            pub fn $name(&self, rhs: impl IntoOperand) -> Result<Array> { binary(self, rhs.into_operand(), BinaryOp::$op) }
        )*}
    };
}
binary_methods! {
    /// `self + rhs` with broadcasting.
    add => Add;
    /// `self - rhs` with broadcasting.
    sub => Sub;
    /// `self * rhs` with broadcasting.
    mul => Mul;
    /// `self / rhs` (true division: integers give f32).
    div => Div;
    /// `self ^ rhs`.
    pow => Pow;
    /// Elementwise maximum (NaN propagates).
    maximum => Maximum;
    /// Elementwise minimum (NaN propagates).
    minimum => Minimum;
    /// `self == rhs`; bool output.
    eq => Equal;
    /// `self != rhs`; bool output.
    ne => NotEqual;
    /// `self < rhs`; bool output.
    lt => Less;
    /// `self <= rhs`; bool output.
    le => LessEqual;
    /// `self > rhs`; bool output.
    gt => Greater;
    /// `self >= rhs`; bool output.
    ge => GreaterEqual;
    /// Logical and of the truth values; bool output.
    logical_and => LogicalAnd;
    /// Logical or of the truth values; bool output.
    logical_or => LogicalOr;
}

impl Array {
    /// The unary op `op` (the same as its named method: `x.unary(UnaryOp::Exp)` is
    /// `x.exp()`), for code that picks ops from `UnaryOp::ALL`.
    pub fn unary(&self, op: UnaryOp) -> Result<Array> {
        unary(self, op)
    }

    /// The binary op `op` with broadcasting (the same as its named method:
    /// `a.binary(&b, BinaryOp::Add)` is `a.add(&b)`), for code that picks ops from
    /// `BinaryOp::ALL`.
    pub fn binary(&self, rhs: impl IntoOperand, op: BinaryOp) -> Result<Array> {
        binary(self, rhs.into_operand(), op)
    }

    /// Converts to `dtype` (floats to integers truncate toward zero and saturate; any
    /// nonzero value becomes `true`).
    pub fn astype(&self, dtype: DType) -> Result<Array> {
        checked_size("astype", self.shape(), dtype)?;
        let stream = target_stream(&[self])?;
        let x = crate::ops::on_device(self, &stream);
        Ok(Array::from_op(Primitive::Cast, smallvec![x], Dims::from_slice(self.shape()), dtype, stream))
    }

    /// `self` when it already has `dtype`, else [`Array::astype`]: no copy is recorded for
    /// a conversion to the same dtype.
    pub(crate) fn to_dtype(&self, dtype: DType) -> Result<Array> {
        if self.dtype() == dtype { Ok(self.clone()) } else { self.astype(dtype) }
    }
}

/// `where(cond, x, y)`: elements of `x` where `cond` is true, else of `y`, with
/// broadcasting of all three. `x` and `y` promote like a binary op.
pub fn where_(cond: &Array, x: impl IntoOperand, y: impl IntoOperand) -> Result<Array> {
    let (x, y) = (x.into_operand(), y.into_operand());
    let dtype = match (&x, &y) {
        (Operand::Array(a), Operand::Array(b)) => promote(a.dtype(), b.dtype()),
        (Operand::Array(a), Operand::Scalar(s)) | (Operand::Scalar(s), Operand::Array(a)) => {
            promote_scalar(a.dtype(), *s)
        }
        (Operand::Scalar(a), Operand::Scalar(b)) => promote(a.default_dtype(), b.default_dtype()),
    };
    let mut shape = cond.shape().to_vec();
    for o in [&x, &y] {
        if let Operand::Array(a) = o {
            shape = broadcast_shapes("where", &shape, a.shape())?;
        }
    }
    // The operands' conversions are no larger than the output.
    checked_size("where", &shape, dtype)?;
    let stream = target_stream(&[cond])?;
    let c = prepare(cond, DType::Bool, &stream);
    let conv = |o: Operand| match o {
        Operand::Array(a) => Ok(prepare(&a, dtype, &stream)),
        Operand::Scalar(s) => weak_scalar(s, dtype, &stream),
    };
    let (xa, ya) = (conv(x)?, conv(y)?);
    Ok(Array::from_op(Primitive::Where, vec![c, xa, ya], shape, dtype, stream))
}
