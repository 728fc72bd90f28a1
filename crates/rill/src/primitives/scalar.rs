//! The scalar arithmetic that the elementwise ops' reference semantics are written in:
//! [`Float`] for the float compute types (f32, which also computes f16 and bf16, and
//! f64) and [`IntOps`] for wrapping integer arithmetic. The CPU kernels and the CPU
//! fused interpreter call the ops' scalar functions (`UnaryOp::float`, `BinaryOp::int`,
//! ...) with these types; everything is `#[inline(always)]` so that a loop over one op
//! compiles to that op's own loop.

use std::ops::{Add, Div, Mul, Neg, Sub};

use crate::dtype::Element;

/// A float compute type: f32 or f64.
pub(crate) trait Float:
    Copy
    + PartialOrd
    + Add<Output = Self>
    + Sub<Output = Self>
    + Mul<Output = Self>
    + Div<Output = Self>
    + Neg<Output = Self>
{
    const ZERO: Self;
    const ONE: Self;
    const HALF: Self;
    /// `1 / sqrt(2)`, rounded to this type.
    const FRAC_1_SQRT_2: Self;
    /// `sqrt(2 / pi)`, rounded to this type.
    const SQRT_2_OVER_PI: Self;
    /// The cubic coefficient of GELU's tanh approximation, 0.044715.
    const GELU_CUBIC: Self;
    /// Three times it, 0.134145 (the derivative's coefficient).
    const GELU_CUBIC_3: Self;
    /// `1 / sqrt(2 pi)`, the standard normal density at 0.
    const FRAC_1_SQRT_2PI: Self;
    fn exp(self) -> Self;
    fn erf(self) -> Self;
    fn ln(self) -> Self;
    fn ln_1p(self) -> Self;
    fn sqrt(self) -> Self;
    fn sin(self) -> Self;
    fn cos(self) -> Self;
    fn tanh(self) -> Self;
    fn abs(self) -> Self;
    fn floor(self) -> Self;
    fn ceil(self) -> Self;
    fn round_ties_even(self) -> Self;
    fn powf(self, e: Self) -> Self;
    fn is_nan(self) -> bool;
}

macro_rules! float_impl {
    ($t:ty, $sqrt_2_over_pi:expr, $exp:path, $tanh:path, $erf:path) => {
        impl Float for $t {
            const ZERO: Self = 0.0;
            const ONE: Self = 1.0;
            const HALF: Self = 0.5;
            const FRAC_1_SQRT_2: Self = std::f64::consts::FRAC_1_SQRT_2 as $t;
            const SQRT_2_OVER_PI: Self = $sqrt_2_over_pi;
            const GELU_CUBIC: Self = 0.044715;
            const GELU_CUBIC_3: Self = 0.134145;
            #[allow(clippy::excessive_precision)]
            const FRAC_1_SQRT_2PI: Self = 0.398_942_280_401_432_677_9 as $t;
            #[inline(always)]
            fn exp(self) -> Self {
                $exp(self)
            }
            #[inline(always)]
            fn erf(self) -> Self {
                $erf(self)
            }
            #[inline(always)]
            fn ln(self) -> Self {
                <$t>::ln(self)
            }
            #[inline(always)]
            fn ln_1p(self) -> Self {
                <$t>::ln_1p(self)
            }
            #[inline(always)]
            fn sqrt(self) -> Self {
                <$t>::sqrt(self)
            }
            #[inline(always)]
            fn sin(self) -> Self {
                <$t>::sin(self)
            }
            #[inline(always)]
            fn cos(self) -> Self {
                <$t>::cos(self)
            }
            #[inline(always)]
            fn tanh(self) -> Self {
                $tanh(self)
            }
            #[inline(always)]
            fn abs(self) -> Self {
                <$t>::abs(self)
            }
            #[inline(always)]
            fn floor(self) -> Self {
                <$t>::floor(self)
            }
            #[inline(always)]
            fn ceil(self) -> Self {
                <$t>::ceil(self)
            }
            #[inline(always)]
            fn round_ties_even(self) -> Self {
                <$t>::round_ties_even(self)
            }
            #[inline(always)]
            fn powf(self, e: Self) -> Self {
                <$t>::powf(self, e)
            }
            #[inline(always)]
            fn is_nan(self) -> bool {
                <$t>::is_nan(self)
            }
        }
    };
}
// f32's exp, tanh and erf are the branch-free ones of `vexp`, so that loops over one op
// vectorise.
float_impl!(f32, 0.797_884_6, super::vexp::exp_f32, super::vexp::tanh_f32, super::vexp::erf_f32);
float_impl!(f64, 0.797_884_560_802_865_4, f64::exp, f64::tanh, libm::erf);

/// Wrapping integer arithmetic (the integer dtypes and bool, held in u8).
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
