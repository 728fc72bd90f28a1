//! Element types, the promotion lattice, and Rust scalars.
//!
//! Promotion follows NumPy/JAX for array-array pairs and JAX's "weak type" rule for Rust
//! scalars: a scalar never widens an array's dtype (see `docs/DTYPES.md` for the table).

use std::fmt;

use half::{bf16, f16};

/// The element type of an array.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum DType {
    /// Boolean, stored as one byte (0 or 1).
    Bool,
    /// 8-bit unsigned integer.
    U8,
    /// 32-bit unsigned integer.
    U32,
    /// 32-bit signed integer.
    I32,
    /// 64-bit signed integer.
    I64,
    /// IEEE half precision.
    F16,
    /// bfloat16.
    BF16,
    /// IEEE single precision.
    F32,
    /// IEEE double precision.
    F64,
}

/// Every dtype, in promotion order.
pub const ALL_DTYPES: [DType; 9] =
    [DType::Bool, DType::U8, DType::U32, DType::I32, DType::I64, DType::F16, DType::BF16, DType::F32, DType::F64];

impl DType {
    /// The C type the generated CUDA kernels store this dtype as (f16/bf16 as raw bits,
    /// bool as a byte); the type names of the CUDA prelude.
    pub(crate) fn c_type(self) -> &'static str {
        match self {
            DType::Bool | DType::U8 => "u8",
            DType::U32 => "u32",
            DType::I32 => "i32",
            DType::I64 => "i64",
            DType::F16 | DType::BF16 => "u16",
            DType::F32 => "float",
            DType::F64 => "double",
        }
    }
    /// Size of one element in bytes.
    pub fn size(self) -> usize {
        match self {
            DType::Bool | DType::U8 => 1,
            DType::F16 | DType::BF16 => 2,
            DType::U32 | DType::I32 | DType::F32 => 4,
            DType::I64 | DType::F64 => 8,
        }
    }
    /// True for f16, bf16, f32 and f64.
    pub fn is_float(self) -> bool {
        matches!(self, DType::F16 | DType::BF16 | DType::F32 | DType::F64)
    }
    /// True for the integer dtypes (not bool).
    pub fn is_int(self) -> bool {
        matches!(self, DType::U8 | DType::U32 | DType::I32 | DType::I64)
    }
    /// True for signed integers.
    pub fn is_signed_int(self) -> bool {
        matches!(self, DType::I32 | DType::I64)
    }
    /// The name used in messages and files (`f32`, `bf16`, ...).
    pub fn name(self) -> &'static str {
        match self {
            DType::Bool => "bool",
            DType::U8 => "u8",
            DType::U32 => "u32",
            DType::I32 => "i32",
            DType::I64 => "i64",
            DType::F16 => "f16",
            DType::BF16 => "bf16",
            DType::F32 => "f32",
            DType::F64 => "f64",
        }
    }
    /// The dtype a transcendental op (exp, sin, ...) computes in: floats keep their
    /// dtype; bool and integers become f32, as in JAX.
    pub fn to_float(self) -> DType {
        if self.is_float() { self } else { DType::F32 }
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Promotes two array dtypes (NumPy/JAX rules, without JAX's 64-bit opt-out).
///
/// bool < u8 < u32, i32 < i64 < f16/bf16 < f32 < f64; u8 with i32 gives i32; u32 with
/// i32 or i64 gives i64; f16 with bf16 gives f32; an integer with a float gives the float.
pub fn promote(a: DType, b: DType) -> DType {
    use DType::*;
    if a == b {
        return a;
    }
    let (lo, hi) = if a < b { (a, b) } else { (b, a) };
    match (lo, hi) {
        (Bool, x) => x,
        (U8, x) => x,
        (U32, I32) | (U32, I64) => I64,
        (I32, I64) => I64,
        (F16, BF16) => F32,
        (x, y) if !x.is_float() && y.is_float() => y,
        (_, y) => y,
    }
}

/// Kind of a Rust scalar operand, for weak-type promotion.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Scalar {
    /// `true` or `false`.
    Bool(bool),
    /// Any Rust integer.
    Int(i64),
    /// Any Rust float.
    Float(f64),
}

impl Scalar {
    /// The value as f64.
    pub fn as_f64(self) -> f64 {
        match self {
            Scalar::Bool(b) => b as u8 as f64,
            Scalar::Int(i) => i as f64,
            Scalar::Float(f) => f,
        }
    }
    /// The dtype the scalar has on its own (as `Array::scalar` makes it).
    pub fn default_dtype(self) -> DType {
        match self {
            Scalar::Bool(_) => DType::Bool,
            Scalar::Int(_) => DType::I32,
            Scalar::Float(_) => DType::F32,
        }
    }
}

/// Promotes an array dtype with a weakly typed Rust scalar: the scalar never widens the
/// array, except that a float scalar makes an integer or bool array f32 and an integer
/// scalar makes a bool array i32.
pub fn promote_scalar(a: DType, s: Scalar) -> DType {
    match s {
        Scalar::Bool(_) => a,
        Scalar::Int(_) => {
            if a == DType::Bool {
                DType::I32
            } else {
                a
            }
        }
        Scalar::Float(_) => {
            if a.is_float() {
                a
            } else {
                DType::F32
            }
        }
    }
}

macro_rules! scalar_from {
    ($($t:ty => $v:ident as $c:ty),*) => {$(
        impl From<$t> for Scalar { fn from(x: $t) -> Self { Scalar::$v(x as $c) } }
    )*};
}
scalar_from!(i8 => Int as i64, i16 => Int as i64, i32 => Int as i64, i64 => Int as i64,
             u8 => Int as i64, u16 => Int as i64, u32 => Int as i64, usize => Int as i64,
             f32 => Float as f64, f64 => Float as f64);
impl From<bool> for Scalar {
    fn from(x: bool) -> Self {
        Scalar::Bool(x)
    }
}
impl From<f16> for Scalar {
    fn from(x: f16) -> Self {
        Scalar::Float(x.to_f64())
    }
}
impl From<bf16> for Scalar {
    fn from(x: bf16) -> Self {
        Scalar::Float(x.to_f64())
    }
}

/// A Rust type that is the storage of one rill dtype (`bool` arrays are read as `u8`
/// through [`Element`] too; [`crate::Array::to_vec`] also accepts `bool`).
pub trait Element: bytemuck::Pod + Copy + Send + Sync + PartialOrd + fmt::Debug + 'static {
    /// The dtype this type stores.
    const DTYPE: DType;
    /// Converts to f64 (exact for every type but i64 beyond 2^53).
    fn to_f64(self) -> f64;
    /// Converts from f64 with Rust `as` semantics (saturating for integers).
    fn from_f64(v: f64) -> Self;
    /// Converts to f32.
    fn to_f32(self) -> f32;
    /// Converts from f32.
    fn from_f32(v: f32) -> Self;
    /// Converts to i64 with Rust `as` semantics (wrapping between integers).
    fn to_i64(self) -> i64;
    /// Converts from i64 with Rust `as` semantics (wrapping between integers).
    fn from_i64(v: i64) -> Self;
    /// Zero.
    fn zero() -> Self;
    /// One.
    fn one() -> Self;
}

macro_rules! element_prim {
    ($($t:ty => $d:ident),*) => {$(
        impl Element for $t {
            const DTYPE: DType = DType::$d;
            #[inline(always)] fn to_f64(self) -> f64 { self as f64 }
            #[inline(always)] fn from_f64(v: f64) -> Self { v as $t }
            #[inline(always)] fn to_f32(self) -> f32 { self as f32 }
            #[inline(always)] fn from_f32(v: f32) -> Self { v as $t }
            #[inline(always)] fn to_i64(self) -> i64 { self as i64 }
            #[inline(always)] fn from_i64(v: i64) -> Self { v as $t }
            #[inline(always)] fn zero() -> Self { 0 as $t }
            #[inline(always)] fn one() -> Self { 1 as $t }
        }
    )*};
}
element_prim!(f32 => F32, f64 => F64, i32 => I32, i64 => I64, u32 => U32, u8 => U8);

/// f64 to bf16 rounded once to nearest even. `bf16::from_f64` goes through f32 with two
/// round-to-nearest steps, which is wrong just above a bf16 midpoint (56960.003 gives
/// 56832, not 57088). Rounding to f32 *to odd* first keeps the sticky information, so the
/// second rounding is exact (f32 has more than 8 + 2 significant bits).
fn bf16_from_f64(v: f64) -> bf16 {
    bf16::from_f32(f32_to_odd(v))
}

/// f64 to f16 rounded once to nearest even. `f16::from_f64` rounds through f32 twice on
/// x86 with F16C (and the software path drops the low mantissa bits before rounding), so
/// a value just above an f16 midpoint came out one ulp low; f32 rounded to odd keeps the
/// sticky bit (f32 has more than 11 + 2 significant bits, also for f16 subnormals).
fn f16_from_f64(v: f64) -> f16 {
    f16::from_f32(f32_to_odd(v))
}

/// `v` rounded to f32 towards zero, with the last bit set when inexact (round to odd).
fn f32_to_odd(v: f64) -> f32 {
    let a = v.abs();
    let mut t = a as f32;
    if t.is_finite() && t as f64 != a && t.to_bits() & 1 == 0 {
        t = f32::from_bits(if t as f64 > a { t.to_bits() - 1 } else { t.to_bits() + 1 });
    }
    if v.is_sign_negative() { -t } else { t }
}

macro_rules! element_half {
    ($($t:ty => $d:ident, $from_f64:path),*) => {$(
        impl Element for $t {
            const DTYPE: DType = DType::$d;
            #[inline(always)] fn to_f64(self) -> f64 { <$t>::to_f64(self) }
            #[inline(always)] fn from_f64(v: f64) -> Self { $from_f64(v) }
            #[inline(always)] fn to_f32(self) -> f32 { <$t>::to_f32(self) }
            #[inline(always)] fn from_f32(v: f32) -> Self { <$t>::from_f32(v) }
            #[inline(always)] fn to_i64(self) -> i64 { <$t>::to_f64(self) as i64 }
            #[inline(always)] fn from_i64(v: i64) -> Self { $from_f64(v as f64) }
            #[inline(always)] fn zero() -> Self { <$t>::ZERO }
            #[inline(always)] fn one() -> Self { <$t>::ONE }
        }
    )*};
}
element_half!(f16 => F16, f16_from_f64, bf16 => BF16, bf16_from_f64);

/// Runs `$body` with `$T` bound to the storage type of `$dtype` (bool is `u8`).
#[macro_export]
#[doc(hidden)]
macro_rules! with_dtype {
    ($dtype:expr, $T:ident => $body:expr) => {{
        use $crate::DType as __D;
        match $dtype {
            __D::Bool | __D::U8 => {
                type $T = u8;
                $body
            }
            __D::U32 => {
                type $T = u32;
                $body
            }
            __D::I32 => {
                type $T = i32;
                $body
            }
            __D::I64 => {
                type $T = i64;
                $body
            }
            __D::F16 => {
                type $T = half::f16;
                $body
            }
            __D::BF16 => {
                type $T = half::bf16;
                $body
            }
            __D::F32 => {
                type $T = f32;
                $body
            }
            __D::F64 => {
                type $T = f64;
                $body
            }
        }
    }};
}

#[cfg(test)]
mod tests {
    use super::*;
    #[test]
    fn promotion_is_symmetric_and_idempotent() {
        for a in ALL_DTYPES {
            assert_eq!(promote(a, a), a);
            for b in ALL_DTYPES {
                assert_eq!(promote(a, b), promote(b, a), "{a} {b}");
            }
        }
        assert_eq!(promote(DType::U32, DType::I32), DType::I64);
        assert_eq!(promote(DType::U8, DType::I32), DType::I32);
        assert_eq!(promote(DType::F16, DType::BF16), DType::F32);
        assert_eq!(promote(DType::I64, DType::F16), DType::F16);
        assert_eq!(promote(DType::Bool, DType::U8), DType::U8);
    }
    /// `fixed`, then `n` values `(u - 0.5) * 2^e` of a seeded LCG, `e` uniform in `exps`.
    fn sweep(seed: u64, fixed: &[f64], n: usize, exps: std::ops::Range<i32>) -> Vec<f64> {
        let mut x = seed;
        let mut values = fixed.to_vec();
        for _ in 0..n {
            x = x.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            let u = (x >> 11) as f64 / (1u64 << 53) as f64;
            values.push((u - 0.5) * 2f64.powi((x % exps.len() as u64) as i32 + exps.start));
        }
        values
    }
    /// No neighbour of the 16-bit float `bits` (value `val(bits)`) is nearer to `v`, and a
    /// tie went to the even one.
    fn assert_nearest_even(v: f64, bits: u16, val: impl Fn(u16) -> f64) {
        let g = val(bits);
        for n in [bits.wrapping_add(1), bits.wrapping_sub(1)] {
            let nv = val(n);
            let (dg, dn) = ((g - v).abs(), (nv - v).abs());
            assert!(dg < dn || (dg == dn && bits & 1 == 0) || nv.is_nan(), "{v:e}: got {g:e}, {nv:e} is nearer");
        }
    }
    #[test]
    fn bf16_from_f64_rounds_once_to_nearest_even() {
        let fixed = [56960.002790807746, 1_077_936_129.0, -1_077_936_129.0, 1e-40, 3.3e38];
        for v in sweep(0x1234_5678_9abc_def0, &fixed, 200_000, -32..32) {
            let b = <bf16 as Element>::from_f64(v);
            assert_nearest_even(v, b.to_bits(), |b| bf16::from_bits(b).to_f64());
        }
        assert_eq!(<bf16 as Element>::from_f64(-3.5e38), bf16::NEG_INFINITY);
        assert!(<bf16 as Element>::from_f64(f64::NAN).is_nan());
    }
    #[test]
    fn f16_from_f64_rounds_once_to_nearest_even() {
        // Just above a midpoint (rounding through f32 to nearest lands on it), a midpoint,
        // f16 subnormals, the overflow edge and values f32 cannot hold.
        let above = 1.0 + 2f64.powi(-11) + 2f64.powi(-40);
        let fixed = [above, -above, 1.0 + 2f64.powi(-11), 3e-8, 6e-8, 65519.999, 65520.0, 1e300, 1e-300];
        for v in sweep(0x0fed_cba9_8765_4321, &fixed, 200_000, -30..18) {
            let h = <f16 as Element>::from_f64(v);
            // IEEE overflow: from 65520 (the midpoint past the largest f16) up, infinity.
            assert_eq!(h.to_f64().is_infinite(), v.abs() >= 65520.0, "{v:e}: got {h}");
            if !h.is_infinite() {
                assert_nearest_even(v, h.to_bits(), |b| f16::from_bits(b).to_f64());
            }
        }
        assert_eq!(<f16 as Element>::from_f64(above).to_f64(), 1.0 + 2f64.powi(-10));
        assert_eq!(<f16 as Element>::from_f64(-7e4), f16::NEG_INFINITY);
        assert!(<f16 as Element>::from_f64(f64::NAN).is_nan());
    }
    #[test]
    fn scalars_do_not_widen() {
        assert_eq!(promote_scalar(DType::F16, Scalar::Float(1.0)), DType::F16);
        assert_eq!(promote_scalar(DType::U8, Scalar::Int(1000)), DType::U8);
        assert_eq!(promote_scalar(DType::I32, Scalar::Float(0.5)), DType::F32);
        assert_eq!(promote_scalar(DType::Bool, Scalar::Int(2)), DType::I32);
    }
}
