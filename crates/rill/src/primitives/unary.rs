//! Unary elementwise ops, each with everything that defines it: its name, its dtype
//! rules ([`UnaryOp::needs_float`], [`UnaryOp::keeps_bool`]), its scalar semantics
//! ([`UnaryOp::float`], [`UnaryOp::int`]: the CPU kernels and the CPU fused interpreter
//! call them), its CUDA formula ([`UnaryOp::cuda`]: the eager and the fused CUDA kernels
//! both use it; see [`super::cuda`] for the rules a formula follows) and its gradient
//! rules ([`UnaryOp::vjp`], [`UnaryOp::jvp`]).
//!
//! Adding an op: a variant here (with its name) and an answer in each of those
//! functions, and an `Array` method in `ops/elementwise.rs`. Every match on the enum is
//! exhaustive, so the compiler lists what else needs a decision.

#![cfg_attr(not(feature = "cuda"), allow(dead_code))]

use crate::array::Array;
use crate::dtype::DType;
use crate::error::Result;

use super::cuda::utype;
use super::grad::{Jvp, Vjp};
use super::scalar::{Float, IntOps};
use crate::ops::elementwise::where_;

op_enum! {
    $ each_unary;
    /// Elementwise functions of one array.
    enum UnaryOp ("unary") {
        Neg => "neg",
        Abs => "abs",
        Sign => "sign",
        Exp => "exp",
        Log => "log",
        Log1p => "log1p",
        Sqrt => "sqrt",
        Rsqrt => "rsqrt",
        Square => "square",
        Reciprocal => "reciprocal",
        Sin => "sin",
        Cos => "cos",
        Tanh => "tanh",
        Sigmoid => "sigmoid",
        Relu => "relu",
        /// Exact GELU, `x * Φ(x)`.
        Gelu => "gelu",
        /// GELU with the tanh approximation.
        GeluTanh => "gelu_tanh",
        Silu => "silu",
        /// The derivative of `gelu`, `Φ(x) + x φ(x)`.
        GeluGrad => "gelu_grad",
        /// The derivative of `gelu_tanh`.
        GeluTanhGrad => "gelu_tanh_grad",
        /// The derivative of `silu`, `s (1 + x (1 - s))` with `s = sigmoid(x)`.
        SiluGrad => "silu_grad",
        Erf => "erf",
        Floor => "floor",
        Ceil => "ceil",
        /// Round half to even, as NumPy.
        Round => "round",
        LogicalNot => "logical_not",
    }
}

impl UnaryOp {
    /// True when integer inputs are first converted to a float dtype.
    pub fn needs_float(self) -> bool {
        use UnaryOp::*;
        match self {
            Neg | Abs | Sign | Square | Relu | Floor | Ceil | Round | LogicalNot => false,
            Exp | Log | Log1p | Sqrt | Rsqrt | Reciprocal | Sin | Cos | Tanh | Sigmoid | Gelu | GeluTanh | Silu
            | Erf | GeluGrad | GeluTanhGrad | SiluGrad => true,
        }
    }

    /// True for the ops whose value on a bool is a bool: `abs`, `relu` and `square` (the
    /// identity on 0 and 1) and `logical_not`. The op computes the others of a bool in
    /// i32 (`neg`, `sign` and the roundings, as NumPy does `neg`) or in a float dtype.
    pub(crate) fn keeps_bool(self) -> bool {
        use UnaryOp::*;
        match self {
            Abs | Relu | Square | LogicalNot => true,
            Neg | Sign | Exp | Log | Log1p | Sqrt | Rsqrt | Reciprocal | Sin | Cos | Tanh | Sigmoid | Gelu
            | GeluTanh | Silu | Erf | Floor | Ceil | Round | GeluGrad | GeluTanhGrad | SiluGrad => false,
        }
    }

    /// The op on a float value, in its compute type (f16 and bf16 compute in f32): the
    /// reference semantics of every CPU kernel of the op.
    #[inline(always)]
    pub(crate) fn float<F: Float>(self, x: F) -> F {
        use UnaryOp::*;
        match self {
            Neg => -x,
            Abs => x.abs(),
            Sign => {
                if x > F::ZERO {
                    F::ONE
                } else if x < F::ZERO {
                    -F::ONE
                } else {
                    x
                }
            }
            Exp => x.exp(),
            Log => x.ln(),
            Log1p => x.ln_1p(),
            Sqrt => x.sqrt(),
            Rsqrt => F::ONE / x.sqrt(),
            Square => x * x,
            Reciprocal => F::ONE / x,
            Sin => x.sin(),
            Cos => x.cos(),
            Tanh => x.tanh(),
            Sigmoid => F::ONE / (F::ONE + (-x).exp()),
            Relu => {
                if x > F::ZERO || x.is_nan() {
                    x
                } else {
                    F::ZERO
                }
            }
            Gelu => F::HALF * x * (F::ONE + (x * F::FRAC_1_SQRT_2).erf()),
            GeluTanh => F::HALF * x * (F::ONE + (F::SQRT_2_OVER_PI * (x + F::GELU_CUBIC * x * x * x)).tanh()),
            Silu => x / (F::ONE + (-x).exp()),
            // (1 + erf(x / sqrt 2)) / 2 + x * (e^(-x * x / 2) / sqrt(2 pi)).
            GeluGrad => {
                let cdf = F::HALF * (F::ONE + (x * F::FRAC_1_SQRT_2).erf());
                cdf + x * ((-(F::HALF * x * x)).exp() * F::FRAC_1_SQRT_2PI)
            }
            // (1 + t) / 2 + (x / 2) (1 - t^2) c (1 + 3 a x^2), t = tanh(c (x + a x^3)).
            GeluTanhGrad => {
                let x2 = x * x;
                let t = (F::SQRT_2_OVER_PI * (x + F::GELU_CUBIC * x * x2)).tanh();
                let du = F::SQRT_2_OVER_PI * (F::ONE + F::GELU_CUBIC_3 * x2);
                F::HALF * (F::ONE + t) + F::HALF * x * (F::ONE - t * t) * du
            }
            SiluGrad => {
                let s = F::ONE / (F::ONE + (-x).exp());
                s * (F::ONE + x * (F::ONE - s))
            }
            Erf => x.erf(),
            Floor => x.floor(),
            Ceil => x.ceil(),
            Round => x.round_ties_even(),
            LogicalNot => {
                if x == F::ZERO {
                    F::ONE
                } else {
                    F::ZERO
                }
            }
        }
    }

    /// The op on an integer (or bool, held in u8) value, in its own type: arithmetic
    /// wraps, and `logical_not` gives 0 or 1. `None` for the ops that integer inputs do
    /// not reach (the op converts them to a float dtype first: see
    /// [`UnaryOp::needs_float`]).
    #[inline(always)]
    pub(crate) fn int<T: IntOps>(self, x: T) -> Option<T> {
        use UnaryOp::*;
        Some(match self {
            Neg => T::wneg(x),
            Abs => T::wabs(x),
            Sign => T::sign(x),
            Square => T::wmul(x, x),
            Relu => {
                if x > T::zero() {
                    x
                } else {
                    T::zero()
                }
            }
            Floor | Ceil | Round => x,
            LogicalNot => {
                if x == T::zero() {
                    T::one()
                } else {
                    T::zero()
                }
            }
            Exp | Log | Log1p | Sqrt | Rsqrt | Reciprocal | Sin | Cos | Tanh | Sigmoid | Gelu | GeluTanh | Silu
            | Erf | GeluGrad | GeluTanhGrad | SiluGrad => return None,
        })
    }

    /// The CUDA C expression of the op applied to `x`, an identifier holding a value of
    /// `d` in [`compute_type`](super::cuda::compute_type)`(d)`; its value has that type too,
    /// except for `LogicalNot`, whose value is a C truth value (0 or 1) and whose operand
    /// may be of any dtype and held in any C type. `None` for the ops that integer inputs
    /// do not reach (the op converts them to a float dtype first: see
    /// [`UnaryOp::needs_float`]).
    ///
    /// bool values are 0 or 1, so `abs`, `relu` and `square` of a bool (the ops besides
    /// `logical_not` that [keep a bool](UnaryOp::keeps_bool)) are the identity, written so
    /// (which holds in any C type the bool is held in).
    pub(crate) fn cuda(self, d: DType, x: &str) -> Option<String> {
        if self == UnaryOp::LogicalNot {
            return Some(format!("({x} == 0)"));
        }
        if d.is_float() {
            return Some(self.cuda_float(d == DType::F64, x));
        }
        if d == DType::Bool && self.keeps_bool() {
            return Some(x.to_string());
        }
        self.cuda_int(d, x)
    }

    /// The formula on a float (`double` when `double`) operand.
    fn cuda_float(self, double: bool, x: &str) -> String {
        use UnaryOp::*;
        // Function suffix, literal suffix, and the explicitly rounded + and *.
        let (f, l) = if double { ("", "") } else { ("f", "f") };
        let r = if double { "__d" } else { "__f" };
        let add = |a: &str, b: &str| format!("{r}add_rn({a}, {b})");
        let mul = |a: &str, b: &str| format!("{r}mul_rn({a}, {b})");
        let one = format!("1.0{l}");
        match self {
            // IEEE 754's negate and abs change only the sign bit, as on the CPU, also of a
            // NaN; PTX's `neg` and `abs` may return another NaN.
            Neg if double => {
                format!("__longlong_as_double(__double_as_longlong({x}) ^ (long long)0x8000000000000000ull)")
            }
            Neg => format!("__int_as_float(__float_as_int({x}) ^ (int)0x80000000u)"),
            Abs if double => format!("__longlong_as_double(__double_as_longlong({x}) & 0x7fffffffffffffffll)"),
            Abs => format!("__int_as_float(__float_as_int({x}) & 0x7fffffff)"),
            Sign => format!("({x} > 0 ? 1.0{l} : ({x} < 0 ? -1.0{l} : {x}))"),
            Exp => format!("exp{f}({x})"),
            Log => format!("log{f}({x})"),
            Log1p => format!("log1p{f}({x})"),
            Sqrt => format!("sqrt{f}({x})"),
            Rsqrt => format!("(1.0{l} / sqrt{f}({x}))"),
            Square => mul(x, x),
            Reciprocal => format!("(1.0{l} / {x})"),
            Sin => format!("sin{f}({x})"),
            Cos => format!("cos{f}({x})"),
            Tanh => format!("tanh{f}({x})"),
            Sigmoid => format!("(1.0{l} / {})", add(&one, &format!("exp{f}(-{x})"))),
            Relu => format!("(({x} > 0 || isnan({x})) ? {x} : 0.0{l})"),
            // 0.5 * x * (1 + erf(x * (1 / sqrt 2))), left to right.
            Gelu => {
                let e = format!("erf{f}({})", mul(x, &format!("0.7071067811865476{l}")));
                mul(&mul(&format!("0.5{l}"), x), &add(&one, &e))
            }
            // 0.5 * x * (1 + tanh(sqrt(2 / pi) * (x + 0.044715 * x * x * x))), left to right.
            GeluTanh => {
                let cube = mul(&mul(&mul(&format!("0.044715{l}"), x), x), x);
                let t = format!("tanh{f}({})", mul(&format!("0.7978845608028654{l}"), &add(x, &cube)));
                mul(&mul(&format!("0.5{l}"), x), &add(&one, &t))
            }
            Silu => format!("({x} / {})", add(&one, &format!("exp{f}(-{x})"))),
            // The formulas of `float`, in its order, as the prelude's templates (one body
            // for float and double; they hold the repeated subexpressions).
            GeluGrad => format!("gelu_grad_t({x})"),
            GeluTanhGrad => format!("gelu_tanh_grad_t({x})"),
            SiluGrad => format!("silu_grad_t({x})"),
            Erf => format!("erf{f}({x})"),
            Floor => format!("floor{f}({x})"),
            Ceil => format!("ceil{f}({x})"),
            Round => format!("rint{f}({x})"),
            LogicalNot => format!("({x} == 0)"),
        }
    }

    /// The formula on an integer (or bool) operand, in its own C type: arithmetic wraps.
    fn cuda_int(self, d: DType, x: &str) -> Option<String> {
        use UnaryOp::*;
        let (t, u) = (d.c_type(), utype(d));
        let signed = d.is_signed_int();
        Some(match self {
            Neg => format!("({t})(({u})0 - ({u}){x})"),
            Abs if signed => format!("({x} < 0 ? ({t})(({u})0 - ({u}){x}) : {x})"),
            Abs => x.to_string(),
            Sign if signed => format!("({x} > 0 ? ({t})1 : ({x} == 0 ? ({t})0 : ({t})-1))"),
            Sign => format!("({x} > 0 ? ({t})1 : ({t})0)"),
            Square => format!("({t})(({u}){x} * ({u}){x})"),
            Relu => format!("({x} > 0 ? {x} : ({t})0)"),
            Floor | Ceil | Round => x.to_string(),
            LogicalNot => format!("({x} == 0)"),
            Exp | Log | Log1p | Sqrt | Rsqrt | Reciprocal | Sin | Cos | Tanh | Sigmoid | Gelu | GeluTanh | Silu
            | Erf | GeluGrad | GeluTanhGrad | SiluGrad => return None,
        })
    }

    /// `v * op'(x)` for the input `x` and output `y` (`v` of their shape): the
    /// cotangent in reverse mode, the tangent in forward mode. `None`: zero, for the ops
    /// whose derivative is zero wherever it exists (`sign`, `floor`, `ceil`, `round`,
    /// `logical_not`). At the kinks: `abs'(0) = 0`, `relu'(0) = 0`.
    fn times_derivative(self, v: &Array, x: &Array, y: &Array) -> Result<Option<Array>> {
        use UnaryOp::*;
        use std::f64::consts::{FRAC_2_SQRT_PI, PI};
        Ok(Some(match self {
            Neg => v.neg()?,
            Abs => v.mul(&x.sign()?)?,
            Exp => v.mul(y)?,
            Log => v.div(x)?,
            Log1p => v.div(&x.add(1.0)?)?,
            Sqrt => v.mul(0.5)?.div(y)?,
            // d/dx x^-1/2 = -1/2 x^-3/2 = -y^3 / 2.
            Rsqrt => v.mul(&y.mul(y)?.mul(y)?.mul(-0.5)?)?,
            Square => v.mul(&x.mul(2.0)?)?,
            Reciprocal => v.mul(&y.square()?.neg()?)?,
            Sin => v.mul(&x.cos()?)?,
            Cos => v.mul(&x.sin()?.neg()?)?,
            Tanh => v.mul(&y.square()?.neg()?.add(1.0)?)?,
            Sigmoid => v.mul(&y.mul(&y.neg()?.add(1.0)?)?)?,
            Relu => where_(&x.gt(0.0)?, v, 0.0)?,
            // Each derivative is one op, computed in f32 for f16/bf16 and rounded once.
            Gelu => v.mul(&x.gelu_grad()?)?,
            GeluTanh => v.mul(&x.gelu_tanh_grad()?)?,
            Silu => v.mul(&x.silu_grad()?)?,
            // φ(x) (2 - x^2).
            GeluGrad => {
                let pdf = x.square()?.mul(-0.5)?.exp()?.mul(1.0 / (2.0 * PI).sqrt())?;
                v.mul(&pdf.mul(&x.square()?.neg()?.add(2.0)?)?)?
            }
            // With t = tanh u, u = c (x + a x^3), u' = c (1 + 3 a x^2):
            // (1 - t^2) (u' + 3 a c x^2 - x t u'^2).
            GeluTanhGrad => {
                let (c, a) = ((2.0 / PI).sqrt(), 0.044715);
                let x2 = x.square()?;
                let t = x.mul(&x2.mul(a)?.add(1.0)?)?.mul(c)?.tanh()?;
                let du = x2.mul(3.0 * a)?.add(1.0)?.mul(c)?;
                let inner = du.add(&x2.mul(3.0 * a * c)?)?.sub(&x.mul(&t)?.mul(&du.square()?)?)?;
                v.mul(&t.square()?.neg()?.add(1.0)?.mul(&inner)?)?
            }
            // s (1 - s) (2 + x (1 - 2 s)).
            SiluGrad => {
                let s = x.sigmoid()?;
                let ds = s.mul(&s.neg()?.add(1.0)?)?;
                v.mul(&ds.mul(&x.mul(&s.mul(-2.0)?.add(1.0)?)?.add(2.0)?)?)?
            }
            Erf => v.mul(&x.square()?.neg()?.exp()?.mul(FRAC_2_SQRT_PI)?)?,
            Sign | Floor | Ceil | Round | LogicalNot => return Ok(None),
        }))
    }

    /// The op's reverse-mode rule: the cotangent of its input (see `grad.rs`).
    pub(crate) fn vjp(self, g: &Vjp<'_>) -> Result<Option<Array>> {
        let x = &g.inputs[0];
        if !x.dtype().is_float() || !g.output.dtype().is_float() {
            return Ok(None);
        }
        self.times_derivative(g.cotangent, x, g.output)
    }

    /// The op's forward-mode rule: the tangent of its output (see `grad.rs`).
    pub(crate) fn jvp(self, g: &Jvp<'_>) -> Result<Option<Array>> {
        match &g.tangents[0] {
            Some(t) if g.output.dtype().is_float() => self.times_derivative(t, &g.inputs[0], g.output),
            _ => Ok(None),
        }
    }
}
