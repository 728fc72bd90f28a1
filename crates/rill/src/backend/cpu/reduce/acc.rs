//! Accumulator types shared by the reduction and normalisation kernels.
//!
//! Every storage type reads into an accumulator type ([`Reducible::A`]): f16, bf16 and
//! f32 accumulate in f32, f64 in f64, and the integer types in i64 with wrapping
//! arithmetic (sums and products modulo 2^n commute with the final narrowing, so the
//! result equals wrapping arithmetic in the element type).

use half::{bf16, f16};

use crate::dtype::Element;

/// Arithmetic of an accumulator.
pub(crate) trait Acc: Copy + Send + Sync + PartialOrd + 'static {
    const ZERO: Self;
    const ONE: Self;
    /// The identity of `max` (-inf for floats).
    const LOWEST: Self;
    /// The identity of `min` (+inf for floats).
    const HIGHEST: Self;
    fn add(self, o: Self) -> Self;
    fn mul(self, o: Self) -> Self;
    fn is_nan(self) -> bool;
}

/// The float accumulators: IEEE arithmetic, with the infinities as the identities of `max`
/// and `min`.
macro_rules! float_acc {
    ($($t:ident),*) => {$(
        impl Acc for $t {
            const ZERO: Self = 0.0;
            const ONE: Self = 1.0;
            const LOWEST: Self = $t::NEG_INFINITY;
            const HIGHEST: Self = $t::INFINITY;
            #[inline(always)]
            fn add(self, o: Self) -> Self {
                self + o
            }
            #[inline(always)]
            fn mul(self, o: Self) -> Self {
                self * o
            }
            #[inline(always)]
            fn is_nan(self) -> bool {
                $t::is_nan(self)
            }
        }
    )*};
}
float_acc!(f32, f64);

impl Acc for i64 {
    const ZERO: Self = 0;
    const ONE: Self = 1;
    const LOWEST: Self = i64::MIN;
    const HIGHEST: Self = i64::MAX;
    #[inline(always)]
    fn add(self, o: Self) -> Self {
        self.wrapping_add(o)
    }
    #[inline(always)]
    fn mul(self, o: Self) -> Self {
        self.wrapping_mul(o)
    }
    #[inline(always)]
    fn is_nan(self) -> bool {
        false
    }
}

/// A storage type with its accumulator.
pub(crate) trait Reducible: Element {
    type A: Acc;
    fn up(self) -> Self::A;
    fn down(a: Self::A) -> Self;
}

macro_rules! reducible {
    ($($t:ty => $a:ty, $up:expr, $down:expr);* $(;)?) => {$(
        impl Reducible for $t {
            type A = $a;
            #[inline(always)]
            fn up(self) -> $a { $up(self) }
            #[inline(always)]
            fn down(a: $a) -> Self { $down(a) }
        }
    )*};
}
reducible! {
    f32 => f32, |x| x, |a| a;
    f64 => f64, |x| x, |a| a;
    f16 => f32, f16::to_f32, f16::from_f32;
    bf16 => f32, bf16::to_f32, bf16::from_f32;
    i32 => i64, |x: i32| x as i64, |a: i64| a as i32;
    i64 => i64, |x| x, |a| a;
    u32 => i64, |x: u32| x as i64, |a: i64| a as u32;
    u8 => i64, |x: u8| x as i64, |a: i64| a as u8;
}

/// A binary reduction with its identity.
pub(crate) trait Combine<A: Acc>: Send + Sync + 'static {
    fn init() -> A;
    fn f(a: A, b: A) -> A;
}

/// Sum.
pub(crate) struct SumOp;
/// Product.
pub(crate) struct ProdOp;
/// Maximum; NaN propagates.
pub(crate) struct MaxOp;
/// Minimum; NaN propagates.
pub(crate) struct MinOp;

/// Each reduction's identity (an [`Acc`] constant) and combining function.
macro_rules! combine {
    ($($op:ident: $init:ident, |$a:ident, $b:ident| $f:expr;)*) => {$(
        impl<A: Acc> Combine<A> for $op {
            #[inline(always)]
            fn init() -> A {
                A::$init
            }
            #[inline(always)]
            fn f($a: A, $b: A) -> A {
                $f
            }
        }
    )*};
}
combine! {
    SumOp: ZERO, |a, b| a.add(b);
    ProdOp: ONE, |a, b| a.mul(b);
    MaxOp: LOWEST, |a, b| if b > a || b.is_nan() { b } else { a };
    MinOp: HIGHEST, |a, b| if b < a || b.is_nan() { b } else { a };
}

/// Lanes of the multi-accumulator row loops (enough independent chains to vectorise).
const LANES: usize = 16;

/// Reduces one contiguous run with `LANES` independent accumulators.
#[inline(always)]
pub(crate) fn reduce_row<T: Reducible, C: Combine<T::A>>(row: &[T]) -> T::A {
    let mut lanes = [C::init(); LANES];
    let mut it = row.chunks_exact(LANES);
    for c in &mut it {
        for i in 0..LANES {
            lanes[i] = C::f(lanes[i], c[i].up());
        }
    }
    let mut acc = C::init();
    for &x in it.remainder() {
        acc = C::f(acc, x.up());
    }
    for l in lanes {
        acc = C::f(acc, l);
    }
    acc
}

/// Folds consecutive rows of length `acc.len()` of `x` into `acc` (vectorises across the row).
#[inline(always)]
pub(crate) fn accumulate_rows<T: Reducible, C: Combine<T::A>>(x: &[T], acc: &mut [T::A]) {
    let k = acc.len();
    if k == 0 {
        return;
    }
    for row in x.chunks_exact(k) {
        for (a, &v) in acc.iter_mut().zip(row) {
            *a = C::f(*a, v.up());
        }
    }
}
