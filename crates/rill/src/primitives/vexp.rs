//! An `exp` for f32 without branches or calls, so that loops over slices vectorise (the
//! library `expf` is a call per element).
//!
//! Range reduction `x = n ln 2 + r` with `|r| <= ln 2 / 2` (ln 2 split in two parts so that
//! `n ln 2` is exact), a degree-6 polynomial for `e^r` (the coefficients of the Cephes
//! `expf`), and `2^n` built from its exponent bits. Maximum error about 1 ulp over the
//! normal range (checked against f64 in the tests below). Inputs above 88.72 give +inf,
//! below -87.33 give 0 (the library returns subnormals down to -103.97; the difference is
//! below 1.2e-38 in absolute value), NaN stays NaN.

/// `e^x` in f32 (see the module docs).
#[inline(always)]
pub(crate) fn exp_f32(x: f32) -> f32 {
    const LOG2E: f32 = std::f32::consts::LOG2_E;
    const LN2_HI: f32 = 0.693_359_4;
    const LN2_LO: f32 = -2.121_944_4e-4;
    const HI: f32 = 88.722_83;
    const LO: f32 = -87.336_55;
    let xc = x.clamp(LO, HI);
    // Round to nearest by adding and subtracting 1.5 * 2^23 (`f32::round` is a call on
    // x86-64 without SSE4.1, which would stop the loop from vectorising).
    const SHIFT: f32 = 12_582_912.0;
    let t = xc * LOG2E + SHIFT;
    let n = t - SHIFT;
    // The same integer read from the low bits of `t` (no float-to-int conversion, whose
    // saturating semantics cost extra instructions per lane).
    let ni = t.to_bits() as i32 - 0x4B40_0000;
    let r = xc - n * LN2_HI - n * LN2_LO;
    let mut p = 1.987_569_1e-4_f32;
    p = p * r + 1.398_199_9e-3;
    p = p * r + 8.333_452e-3;
    p = p * r + 4.166_579_6e-2;
    p = p * r + 1.666_666_5e-1;
    p = p * r + 0.5;
    let e = p * r * r + r + 1.0;
    // 2^n for n in [-126, 128]: n = 128 only when x rounds up to HI, where e < 1; split it.
    let n = ni;
    let half = n >> 1;
    let s1 = f32::from_bits(((half + 127) as u32) << 23);
    let s2 = f32::from_bits(((n - half + 127) as u32) << 23);
    let y = e * s1 * s2;
    let y = if x > HI { f32::INFINITY } else { y };
    let y = if x < LO { 0.0 } else { y };
    if x.is_nan() { x } else { y }
}

/// `tanh(x)` in f32 without branches or calls (the library `tanhf` is a call per
/// element): below 0.625 in magnitude an odd polynomial in `x` (the coefficients of the
/// Cephes `tanhf`), above it `1 − 2 / (e^{2|x|} + 1)` through [`exp_f32`], with the sign
/// put back. Within a few ulp of the f64 value (the tests below); NaN stays NaN.
#[inline(always)]
pub(crate) fn tanh_f32(x: f32) -> f32 {
    let a = x.abs();
    let z = x * x;
    let mut p = -5.704_988_7e-3_f32;
    p = p * z + 2.063_909e-2;
    p = p * z - 5.373_971_6e-2;
    p = p * z + 1.333_144_2e-1;
    p = p * z - 3.333_328e-1;
    let small = p * z * x + x;
    let e = exp_f32(2.0 * a);
    let large = (1.0 - 2.0 / (e + 1.0)).copysign(x);
    let y = if a < 0.625 { small } else { large };
    if x.is_nan() { x } else { y }
}

/// `erf(x)` in f32 without branches or calls (the library `erff` is a call per element,
/// and exact GELU spends most of its time there): below 1 in magnitude `x P(x²)`, from 1
/// to 4 `1 − e^{−x²} R(1/x)` through [`exp_f32`], 1 beyond, the sign put back. `P` and
/// `R` are least-squares fits made by `tools/fit_erf.py`. Within a few ulp of the f64
/// value (the tests below); NaN stays NaN.
#[inline(always)]
pub(crate) fn erf_f32(x: f32) -> f32 {
    const SMALL: [f32; 7] = [
        std::f32::consts::FRAC_2_SQRT_PI,
        -0.376_126_3,
        0.112_836_26,
        -0.026_855_4,
        0.005_191_218_6,
        -0.000_803_484_64,
        7.933_494e-5,
    ];
    const LARGE: [f32; 10] = [
        0.000_133_511_83,
        0.561_541,
        0.022_321_135,
        -0.383_800_5,
        0.252_399_12,
        0.198_848_66,
        -0.491_022_3,
        0.404_802,
        -0.165_862_22,
        0.028_223_218,
    ];
    let a = x.abs().min(4.0);
    let z = a * a;
    let mut p = SMALL[6];
    for &c in SMALL[..6].iter().rev() {
        p = p * z + c;
    }
    let u = 1.0 / a;
    let mut r = LARGE[9];
    for &c in LARGE[..9].iter().rev() {
        r = r * u + c;
    }
    let y = if a < 1.0 { a * p } else { 1.0 - exp_f32(-z) * r };
    if x.is_nan() { x } else { y.copysign(x) }
}

#[cfg(test)]
mod tests {
    use super::{erf_f32, exp_f32, tanh_f32};

    fn ulps(got: f32, want: f64) -> f64 {
        let w = want as f32;
        let ulp = (f32::from_bits(w.to_bits() + 1) - w).abs() as f64;
        (got as f64 - want).abs() / ulp
    }

    #[test]
    fn within_two_ulp_over_the_normal_range() {
        let (mut worst, mut at) = (0.0f64, 0.0f32);
        let mut x = -87.3f32;
        while x < 88.7 {
            let u = ulps(exp_f32(x), (x as f64).exp());
            if u > worst {
                (worst, at) = (u, x);
            }
            x += 0.000_731;
        }
        assert!(worst <= 2.0, "{worst} ulp at x = {at}");
    }

    #[test]
    fn special_values() {
        assert_eq!(exp_f32(0.0), 1.0);
        assert_eq!(exp_f32(f32::INFINITY), f32::INFINITY);
        assert_eq!(exp_f32(f32::NEG_INFINITY), 0.0);
        assert_eq!(exp_f32(89.0), f32::INFINITY);
        assert_eq!(exp_f32(-200.0), 0.0);
        assert!(exp_f32(f32::NAN).is_nan());
        let top = exp_f32(88.72);
        assert!(top.is_finite() && ulps(top, 88.72f32 as f64).is_finite());
        assert!(ulps(top, (88.72f32 as f64).exp()) <= 2.0);
    }

    #[test]
    fn tanh_within_four_ulp() {
        let (mut worst, mut at) = (0.0f64, 0.0f32);
        let mut x = -12.0f32;
        while x < 12.0 {
            for v in [x, x * 1e-3, x * 1e-6] {
                let u = ulps(tanh_f32(v), (v as f64).tanh());
                if u > worst {
                    (worst, at) = (u, v);
                }
            }
            x += 0.000_613;
        }
        assert!(worst <= 4.0, "{worst} ulp at x = {at}");
        assert_eq!(tanh_f32(0.0), 0.0);
        assert_eq!(tanh_f32(f32::INFINITY), 1.0);
        assert_eq!(tanh_f32(f32::NEG_INFINITY), -1.0);
        assert_eq!(tanh_f32(-100.0), -1.0);
        assert!(tanh_f32(f32::NAN).is_nan());
    }

    #[test]
    fn erf_within_four_ulp() {
        let (mut worst, mut at) = (0.0f64, 0.0f32);
        let mut x = -5.0f32;
        while x < 5.0 {
            for v in [x, x * 1e-3, x * 1e-7] {
                let u = ulps(erf_f32(v), libm::erf(v as f64));
                if u > worst {
                    (worst, at) = (u, v);
                }
            }
            x += 0.000_397;
        }
        assert!(worst <= 4.0, "{worst} ulp at x = {at}");
        assert_eq!(erf_f32(0.0).to_bits(), 0.0f32.to_bits());
        assert_eq!(erf_f32(-0.0).to_bits(), (-0.0f32).to_bits());
        assert_eq!(erf_f32(f32::INFINITY), 1.0);
        assert_eq!(erf_f32(f32::NEG_INFINITY), -1.0);
        assert!((erf_f32(1e-40) as f64 - libm::erf(1e-40f32 as f64)).abs() <= 2e-45);
        assert!(erf_f32(f32::NAN).is_nan());
    }
}
