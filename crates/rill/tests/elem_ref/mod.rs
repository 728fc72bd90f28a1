//! Float64 references, input generators and checks shared by the elementwise tests.
//!
//! Everything here is an independent model of the documented semantics (docs/DTYPES.md):
//! integer wrapping, round half to even, the promotion lattice, and IEEE rounding to a
//! narrower float, computed with plain f64/i128 arithmetic.
#![allow(dead_code)]

use rill::{Array, DType};

use crate::common::{self, Rng};

/// The nine dtypes.
pub const ALL: [DType; 9] =
    [DType::F32, DType::F64, DType::F16, DType::BF16, DType::I32, DType::I64, DType::U32, DType::U8, DType::Bool];

/// Shapes every unary test runs on: 0-d, 1-D, 3-D and empty.
pub const SHAPES: [&[usize]; 5] = [&[], &[7], &[2, 3, 4], &[0, 3], &[0]];

/// Operand shape pairs every binary test runs on (broadcasting included).
pub const PAIRS: [(&[usize], &[usize]); 8] = [
    (&[], &[]),
    (&[7], &[7]),
    (&[2, 3, 4], &[2, 3, 4]),
    (&[3, 1, 4], &[5, 4]),
    (&[5, 4], &[3, 1, 4]),
    (&[], &[2, 3]),
    (&[2, 3], &[]),
    (&[0, 3], &[3]),
];

/// Number of elements of a shape.
pub fn numel(shape: &[usize]) -> usize {
    shape.iter().product()
}

/// The NumPy broadcast of two shapes (the test's own model).
pub fn bshape(a: &[usize], b: &[usize]) -> Vec<usize> {
    let n = a.len().max(b.len());
    (0..n)
        .map(|i| {
            let da = if i + a.len() >= n { a[i + a.len() - n] } else { 1 };
            let db = if i + b.len() >= n { b[i + b.len() - n] } else { 1 };
            if da == 1 { db } else { da }
        })
        .collect()
}

/// The flat index into an operand of shape `inp` read at flat output index `flat` of `out`.
pub fn bindex(out: &[usize], inp: &[usize], mut flat: usize) -> usize {
    let mut idx = vec![0; out.len()];
    for i in (0..out.len()).rev() {
        idx[i] = flat % out[i];
        flat /= out[i];
    }
    let k = out.len() - inp.len();
    let mut r = 0;
    for (j, &d) in inp.iter().enumerate() {
        r = r * d + if d == 1 { 0 } else { idx[k + j] };
    }
    r
}

/// Value range of integer test inputs for an integer-native op, wide enough to wrap.
pub fn int_range(d: DType) -> (f64, f64) {
    match d {
        DType::Bool => (0.0, 2.0),
        DType::U8 => (0.0, 256.0),
        DType::U32 => (0.0, 1e5),
        DType::I32 => (-1e5, 1e5),
        DType::I64 => (-1e9, 1e9),
        _ => (-4.0, 4.0),
    }
}

/// `n` random inputs in `[lo, hi)` suited to `d`: integers are floored and clipped to
/// the dtype's range, bool is 0/1.
pub fn draw(rng: &mut Rng, n: usize, lo: f64, hi: f64, d: DType) -> Vec<f64> {
    if d.is_float() {
        return rng.vec(n, lo, hi);
    }
    let (lo, hi) = match d {
        DType::Bool => (0.0, 2.0),
        DType::U8 => (lo.max(0.0), hi.min(256.0)),
        DType::U32 => (lo.max(0.0), hi),
        _ => (lo, hi),
    };
    (0..n).map(|_| rng.uniform(lo, hi).floor().min(hi - 1.0).max(lo)).collect()
}

/// Number of value bits of an integer dtype and whether it is signed.
fn bits(d: DType) -> (u32, bool) {
    match d {
        DType::Bool => (1, false),
        DType::U8 => (8, false),
        DType::U32 => (32, false),
        DType::I32 => (32, true),
        DType::I64 => (64, true),
        _ => unreachable!("not an integer dtype: {d}"),
    }
}

/// Wraps an exact integer into an integer dtype (two's complement); bool is `v != 0`.
pub fn wrap(v: i128, d: DType) -> i128 {
    if d == DType::Bool {
        return (v != 0) as i128;
    }
    let (b, signed) = bits(d);
    let m = 1i128 << b;
    let r = v.rem_euclid(m);
    if signed && r >= m / 2 { r - m } else { r }
}

/// Saturating, truncating float to integer conversion (NaN gives 0).
pub fn sat(v: f64, d: DType) -> i128 {
    if v.is_nan() {
        return 0;
    }
    let (b, signed) = bits(d);
    let (lo, hi) = if signed { (-(1i128 << (b - 1)), (1i128 << (b - 1)) - 1) } else { (0, (1i128 << b) - 1) };
    let t = v.trunc();
    if t <= lo as f64 {
        lo
    } else if t >= hi as f64 {
        hi
    } else {
        t as i128
    }
}

/// Round half to even, from `floor` and a comparison only.
pub fn round_half_even(x: f64) -> f64 {
    if !x.is_finite() {
        return x;
    }
    let f = x.floor();
    let d = x - f;
    if d < 0.5 {
        f
    } else if d > 0.5 {
        f + 1.0
    } else if f % 2.0 == 0.0 {
        f
    } else {
        f + 1.0
    }
}

/// Rounds an f64 to the nearest value of a float dtype (ties to even, overflow to
/// infinity, subnormals kept), from the format's parameters alone.
pub fn round_to(v: f64, d: DType) -> f64 {
    let (p, emin, max) = match d {
        DType::F64 => return v,
        DType::F32 => (24, -126, f32::MAX as f64),
        DType::F16 => (11, -14, 65504.0),
        DType::BF16 => (8, -126, 3.389_531_389_251_535_5e38),
        _ => unreachable!("not a float dtype: {d}"),
    };
    if !v.is_finite() || v == 0.0 {
        return v;
    }
    let e = (((v.to_bits() >> 52) & 0x7ff) as i32 - 1023).max(emin);
    let q = 2f64.powi(e - (p - 1));
    let r = round_half_even(v / q) * q;
    if r.abs() > max { f64::INFINITY.copysign(v) } else { r }
}

/// The test's own promotion model: bool < integers < floats; mixed signedness takes the
/// smallest signed type that holds both; f16 with bf16 gives f32.
pub fn spec_promote(a: DType, b: DType) -> DType {
    use DType::*;
    if a == b {
        return a;
    }
    if a == Bool {
        return b;
    }
    if b == Bool {
        return a;
    }
    let rank = |d: DType| match d {
        U8 => 1,
        U32 => 3,
        I32 => 3,
        I64 => 4,
        F16 | BF16 => 5,
        F32 => 6,
        F64 => 7,
        Bool => 0,
    };
    match (a.is_float(), b.is_float()) {
        (true, false) => a,
        (false, true) => b,
        (true, true) => {
            if rank(a) == rank(b) {
                F32
            } else if rank(a) > rank(b) {
                a
            } else {
                b
            }
        }
        (false, false) => {
            let (sa, sb) = (a.is_signed_int(), b.is_signed_int());
            if sa == sb {
                if rank(a) > rank(b) { a } else { b }
            } else {
                let (u, s) = if sa { (b, a) } else { (a, b) };
                if u == U8 { s } else { I64 }
            }
        }
    }
}

/// Tolerance for results of dtype `d` (0 for exact integer and bool results).
pub fn tol_of(d: DType) -> f64 {
    if d.is_float() { common::tol(d) } else { 0.0 }
}

/// Asserts dtype, shape and values of `got` against a float64 reference.
pub fn check(got: &Array, want: &[f64], dtype: DType, shape: &[usize], what: &str) {
    assert_eq!(got.dtype(), dtype, "{what}: dtype");
    assert_eq!(got.shape(), shape, "{what}: shape");
    let g = got.to_f64_vec().unwrap_or_else(|e| panic!("{what}: {e}"));
    common::assert_close(&g, want, tol_of(dtype), what);
}

/// Like [`check`] for integer results given exactly (i64 read back as i64).
pub fn check_int(got: &Array, want: &[i128], dtype: DType, shape: &[usize], what: &str) {
    assert_eq!(got.dtype(), dtype, "{what}: dtype");
    assert_eq!(got.shape(), shape, "{what}: shape");
    let g: Vec<i128> = if dtype == DType::I64 {
        got.to_vec::<i64>().unwrap().into_iter().map(i128::from).collect()
    } else {
        got.to_f64_vec().unwrap().into_iter().map(|v| v as i128).collect()
    };
    assert_eq!(g.len(), want.len(), "{what}: length");
    for (i, (g, w)) in g.iter().zip(want).enumerate() {
        assert_eq!(g, w, "{what}: element {i}");
    }
}

/// The exact values of an integer or bool array (i64 read back as i64).
pub fn exact_ints(a: &Array) -> Vec<i128> {
    if a.dtype() == DType::I64 {
        a.to_vec::<i64>().unwrap().into_iter().map(i128::from).collect()
    } else {
        a.to_f64_vec().unwrap().into_iter().map(|v| v as i128).collect()
    }
}
