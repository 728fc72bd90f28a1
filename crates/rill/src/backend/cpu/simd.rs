//! The CPU's vector instruction sets, chosen at run time, and the elementwise loops built
//! for each.
//!
//! The crate is built for baseline x86-64 (SSE2), where `f32::floor` is a library call
//! and an f16 conversion is one scalar instruction behind a feature check. A loop defined
//! with [`multiversion!`] is built three times, for AVX-512F, for AVX2 with FMA and F16C,
//! and portably, and [`level`] picks one per call. Nothing is reassociated or contracted,
//! so every build gives the same bits.

use half::slice::HalfFloatSliceExt;
use half::{bf16, f16};

use crate::primitives::{BinaryOp, UnaryOp, each_binary, each_unary};
use crate::sync::OnceLock;

/// The instruction sets the kernels are built for, lowest first.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Level {
    Portable,
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
    Avx2,
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
    Avx512,
}

#[cfg(test)]
impl Level {
    /// Every level this CPU runs, lowest first.
    pub(crate) fn available() -> Vec<Level> {
        let top = detect();
        [Level::Portable, Level::Avx2, Level::Avx512].into_iter().filter(|l| *l <= top).collect()
    }
}

/// The best level of this CPU, capped by `RILL_CPU_SIMD` (`avx512`, `avx2` or `portable`;
/// read once). An unknown value is ignored.
pub(crate) fn level() -> Level {
    static LEVEL: OnceLock<Level> = OnceLock::new();
    *LEVEL.get_or_init(|| {
        let top = detect();
        let cap = match std::env::var("RILL_CPU_SIMD").as_deref() {
            Ok("portable") => Level::Portable,
            Ok("avx2") => Level::Avx2,
            _ => Level::Avx512,
        };
        top.min(cap)
    })
}

fn detect() -> Level {
    #[cfg(target_arch = "x86_64")]
    {
        let avx2 =
            is_x86_feature_detected!("f16c") && is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma");
        if avx2 && is_x86_feature_detected!("avx512f") {
            return Level::Avx512;
        }
        if avx2 {
            return Level::Avx2;
        }
    }
    Level::Portable
}

/// `fn name(args) -> ret { body }` whose body is built for each [`Level`] and run at this
/// CPU's (the body is one `#[inline(always)]` function inlined into each build, so a loop
/// in it is vectorised for that build's instruction set).
macro_rules! multiversion {
    ($(#[$m:meta])* $vis:vis fn $name:ident($($a:ident: $t:ty),* $(,)?) $(-> $r:ty)? $body:block) => {
        $(#[$m])*
        $vis fn $name($($a: $t),*) $(-> $r)? {
            #[inline(always)]
            fn any($($a: $t),*) $(-> $r)? $body
            #[cfg(target_arch = "x86_64")]
            {
                #[target_feature(enable = "avx512f,avx2,fma,f16c")]
                fn avx512($($a: $t),*) $(-> $r)? { any($($a),*) }
                #[target_feature(enable = "avx2,fma,f16c")]
                fn avx2($($a: $t),*) $(-> $r)? { any($($a),*) }
                use $crate::backend::cpu::simd::{Level, level};
                match level() {
                    // SAFETY: `level` reports only instruction sets this CPU has.
                    Level::Avx512 => return unsafe { avx512($($a),*) },
                    Level::Avx2 => return unsafe { avx2($($a),*) },
                    Level::Portable => {}
                }
            }
            any($($a),*)
        }
    };
}
pub(crate) use multiversion;

multiversion! {
    /// `o[i] = op(x[i])` in f32 (`x` at least as long as `o`).
    pub(crate) fn unary_f32(op: UnaryOp, x: &[f32], o: &mut [f32]) {
        // One loop per op over the op's scalar function, written out here (not an
        // iterator adapter's own function) so that it is built with this build's vectors.
        let x = &x[..o.len()];
        each_unary!(op, K => {
            for i in 0..o.len() {
                o[i] = K.float(x[i]);
            }
        });
    }
}

multiversion! {
    /// `x[i] = op(x[i])` in f32.
    pub(crate) fn unary_f32_in_place(op: UnaryOp, x: &mut [f32]) {
        each_unary!(op, K => {
            for v in x.iter_mut() {
                *v = K.float(*v);
            }
        });
    }
}

multiversion! {
    /// `o[i] = op(a[i], b[i])` in f32 for an arithmetic op (not a comparison or a
    /// selection); `a` and `b` at least as long as `o`.
    pub(crate) fn binary_f32(op: BinaryOp, a: &[f32], b: &[f32], o: &mut [f32]) {
        let (a, b) = (&a[..o.len()], &b[..o.len()]);
        each_binary!(op, K => {
            for i in 0..o.len() {
                o[i] = K.float(a[i], b[i]);
            }
        });
    }
}

multiversion! {
    /// `o[i] = op(a[i], b[i])` for a comparison, as 0 or 1.
    pub(crate) fn test_f32(op: BinaryOp, a: &[f32], b: &[f32], o: &mut [u8]) {
        let (a, b) = (&a[..o.len()], &b[..o.len()]);
        each_binary!(op, K => {
            for i in 0..o.len() {
                o[i] = K.test(a[i], b[i], 0.0) as u8;
            }
        });
    }
}

multiversion! {
    fn bf16_to_f32_bits(x: &[u16], o: &mut [f32]) {
        let x = &x[..o.len()];
        for i in 0..o.len() {
            o[i] = f32::from_bits((x[i] as u32) << 16);
        }
    }
}

multiversion! {
    /// Rounds to nearest, ties to even, and keeps NaNs NaN (quieted), as
    /// `half::bf16::from_f32`; as integer steps, so that it vectorises.
    fn f32_to_bf16_bits(x: &[f32], o: &mut [u16]) {
        let x = &x[..o.len()];
        for i in 0..o.len() {
            let b = x[i].to_bits();
            let nan = b & 0x7fff_ffff > 0x7f80_0000;
            let rounded = (b.wrapping_add(0x7fff + ((b >> 16) & 1)) >> 16) as u16;
            o[i] = if nan { (b >> 16) as u16 | 0x0040 } else { rounded };
        }
    }
}

/// A storage type whose values convert to f32 and back a slice at a time.
pub(crate) trait F32Lanes: Copy + Send + Sync + 'static {
    /// `o[i] = x[i]` as f32 (`x` at least as long as `o`).
    fn to_f32s(x: &[Self], o: &mut [f32]);
    /// `o[i] = x[i]` rounded to this type (`x` at least as long as `o`).
    fn from_f32s(x: &[f32], o: &mut [Self]);
    /// `x` itself when this type is f32.
    fn as_f32(_x: &[Self]) -> Option<&[f32]> {
        None
    }
    /// `x` itself when this type is f32.
    fn as_f32_mut(_x: &mut [Self]) -> Option<&mut [f32]> {
        None
    }
}

impl F32Lanes for f32 {
    fn to_f32s(x: &[f32], o: &mut [f32]) {
        o.copy_from_slice(&x[..o.len()]);
    }
    fn from_f32s(x: &[f32], o: &mut [f32]) {
        o.copy_from_slice(&x[..o.len()]);
    }
    fn as_f32(x: &[f32]) -> Option<&[f32]> {
        Some(x)
    }
    fn as_f32_mut(x: &mut [f32]) -> Option<&mut [f32]> {
        Some(x)
    }
}

impl F32Lanes for f16 {
    fn to_f32s(x: &[f16], o: &mut [f32]) {
        x[..o.len()].convert_to_f32_slice(o);
    }
    fn from_f32s(x: &[f32], o: &mut [f16]) {
        o.convert_from_f32_slice(&x[..o.len()]);
    }
}

impl F32Lanes for bf16 {
    fn to_f32s(x: &[bf16], o: &mut [f32]) {
        bf16_to_f32_bits(bytemuck::cast_slice(&x[..o.len()]), o);
    }
    fn from_f32s(x: &[f32], o: &mut [bf16]) {
        f32_to_bf16_bits(x, bytemuck::cast_slice_mut(o));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Bit patterns over the whole f32 range: a stride through all 2^32, the patterns
    /// next to every rounding boundary of bf16, and the special values.
    fn patterns() -> Vec<f32> {
        let mut v: Vec<u32> = (0..=u32::MAX).step_by(65_537).collect();
        for hi in (0..=0xffffu32).step_by(97) {
            for lo in [0, 1, 0x7fff, 0x8000, 0x8001, 0xffff] {
                v.push(hi << 16 | lo);
            }
        }
        v.extend([0x7f80_0000, 0xff80_0000, 0x7fc0_0000, 0x7f80_0001, 0xffbf_ffff, 0x7f7f_ffff, 0x8000_0000, 1]);
        v.into_iter().map(f32::from_bits).collect()
    }

    #[test]
    fn conversions_match_half_bit_for_bit() {
        let x = patterns();
        let mut b = vec![bf16::ZERO; x.len()];
        let mut h = vec![f16::ZERO; x.len()];
        let mut back = vec![0f32; x.len()];
        bf16::from_f32s(&x, &mut b);
        for (i, (&v, &got)) in x.iter().zip(&b).enumerate() {
            assert_eq!(got.to_bits(), bf16::from_f32(v).to_bits(), "bf16 of {:#x} (pattern {i})", v.to_bits());
        }
        bf16::to_f32s(&b, &mut back);
        for (&got, &w) in back.iter().zip(&b) {
            assert_eq!(got.to_bits(), w.to_f32().to_bits());
        }
        f16::from_f32s(&x, &mut h);
        for (&v, &got) in x.iter().zip(&h) {
            assert_eq!(got.to_bits(), f16::from_f32(v).to_bits(), "f16 of {:#x}", v.to_bits());
        }
        f16::to_f32s(&h, &mut back);
        for (&got, &w) in back.iter().zip(&h) {
            assert_eq!(got.to_bits(), w.to_f32().to_bits());
        }
    }

    #[test]
    fn the_dispatched_loops_give_the_scalar_bits() {
        // This CPU's build (`RILL_CPU_SIMD` picks another) against the op's scalar function.
        let x: Vec<f32> = (0..1003).map(|i| (i as f32 - 501.5) * 0.0173).collect();
        let y: Vec<f32> = x.iter().map(|v| v * 0.5 + 1.25).collect();
        for op in UnaryOp::ALL {
            let mut o = vec![0f32; x.len()];
            unary_f32(op, &x, &mut o);
            for (i, (&got, &v)) in o.iter().zip(&x).enumerate() {
                let want = op.float(v);
                assert!(got.to_bits() == want.to_bits() || (got.is_nan() && want.is_nan()), "{op:?} at {i}");
            }
        }
        for op in BinaryOp::ALL.into_iter().filter(|o| !o.is_predicate() && !o.is_selection()) {
            let mut o = vec![0f32; x.len()];
            binary_f32(op, &x, &y, &mut o);
            for (i, ((&got, &a), &b)) in o.iter().zip(&x).zip(&y).enumerate() {
                let want = op.float(a, b);
                assert!(got.to_bits() == want.to_bits() || (got.is_nan() && want.is_nan()), "{op:?} at {i}");
            }
        }
    }
}
