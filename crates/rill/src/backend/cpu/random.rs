//! Counter-based random numbers: threefry-2x32 with 20 rounds (Salmon et al., "Parallel
//! random numbers: as easy as 1, 2, 3", SC 2011), and the exact mapping from bits to values.
//!
//! Element `i` of a random array depends only on the key and `i`, so the result is the
//! same however the work is split, and another backend can reproduce it bit for bit.
//! The mapping (documented for other backends; see also `rill::random`):
//!
//! * `block(i) = threefry2x32(key, [i as u32, (i >> 32) as u32]) = [x0, x1]`.
//! * `u24(w) = (w >> 8) * 2^-24` and `u53([x0, x1]) = (((x0 << 32) | x1) >> 11) * 2^-53`, both
//!   in `[0, 1)`.
//! * Uniform: `u = u53(block(i))` for f64, `u24(block(i)[0])` for f32, f16 and bf16. With
//!   `lo`, `hi` the bounds rounded to the dtype, `v = dtype(lo + (hi - lo) * u)` (computed in
//!   f64, rounded to nearest); if `v >= hi` it is replaced by the largest value of the dtype
//!   below `hi`, so values lie in `[lo, hi)`.
//! * Normal (Box-Muller, cosine branch, in f64 for every dtype):
//!   `u1 = u53(block(2i))`, `u2 = u53(block(2i + 1))`,
//!   `z = sqrt(-2 ln(1 - u1)) * cos(2π u2)`, value `dtype(mean + std * z)`.
//! * Bernoulli: `u53(block(i)) < p`.

use crate::backend::cpu::{CpuBuffer, PAR_CHUNK, par};
use crate::backend::{Buffer, Storage};
use crate::dtype::{DType, Element};
use crate::error::{Error, Result};
use crate::primitives::Distribution;
use crate::shape::numel;

/// Rotation constants of threefry-2x32, in the order the rounds use them.
const ROTATIONS: [u32; 8] = [13, 15, 26, 6, 17, 29, 16, 24];
/// The key-schedule parity constant of Threefish.
const PARITY: u32 = 0x1BD1_1BDA;

/// Threefry-2x32 with 20 rounds: encrypts the counter `ctr` under `key`.
pub(crate) fn threefry2x32(key: [u32; 2], ctr: [u32; 2]) -> [u32; 2] {
    let ks = [key[0], key[1], key[0] ^ key[1] ^ PARITY];
    let mut x0 = ctr[0].wrapping_add(ks[0]);
    let mut x1 = ctr[1].wrapping_add(ks[1]);
    for group in 0..5u32 {
        for r in 0..4 {
            let rot = ROTATIONS[(group as usize % 2) * 4 + r];
            x0 = x0.wrapping_add(x1);
            x1 = x1.rotate_left(rot) ^ x0;
        }
        // Key injection after every four rounds.
        let s = group + 1;
        x0 = x0.wrapping_add(ks[s as usize % 3]);
        x1 = x1.wrapping_add(ks[(s as usize + 1) % 3]).wrapping_add(s);
    }
    [x0, x1]
}

/// The 64 bits for counter `i`.
#[inline(always)]
fn block(key: [u32; 2], i: u64) -> [u32; 2] {
    threefry2x32(key, [i as u32, (i >> 32) as u32])
}

#[inline(always)]
fn u24(w: u32) -> f64 {
    (w >> 8) as f64 * (1.0 / (1u64 << 24) as f64)
}

#[inline(always)]
fn u53(b: [u32; 2]) -> f64 {
    (((((b[0] as u64) << 32) | b[1] as u64) >> 11) as f64) * (1.0 / (1u64 << 53) as f64)
}

/// `v` rounded to a float dtype and back.
pub(crate) fn round_to(dtype: DType, v: f64) -> f64 {
    crate::with_dtype!(dtype, T => T::from_f64(v).to_f64())
}

/// The largest value of float `dtype` below `x` (`x` finite and representable); the
/// CUDA generator uses it too, so both devices draw from the same half-open interval.
pub(crate) fn next_down(dtype: DType, x: f64) -> f64 {
    fn bits_down(b: u64, sign: u64) -> u64 {
        if b & !sign == 0 {
            sign | 1
        } else if b & sign == 0 {
            b - 1
        } else {
            b + 1
        }
    }
    match dtype {
        DType::F64 => f64::from_bits(bits_down(x.to_bits(), 1 << 63)),
        DType::F32 => f32::from_bits(bits_down((x as f32).to_bits() as u64, 1 << 31) as u32) as f64,
        // Through `Element::from_f64`: one rounding, as the CUDA side converts.
        DType::F16 => {
            half::f16::from_bits(bits_down(<half::f16 as Element>::from_f64(x).to_bits() as u64, 1 << 15) as u16)
                .to_f64()
        }
        DType::BF16 => {
            half::bf16::from_bits(bits_down(<half::bf16 as Element>::from_f64(x).to_bits() as u64, 1 << 15) as u16)
                .to_f64()
        }
        _ => x,
    }
}

/// Fills `out` with `f(i)` for every element index `i`, in parallel chunks.
fn fill<T: Element>(out: &mut [T], f: impl Fn(u64) -> T + Sync) {
    par::chunks(out, PAR_CHUNK, |c, o| {
        let base = (c * PAR_CHUNK) as u64;
        for (j, v) in o.iter_mut().enumerate() {
            *v = f(base + j as u64);
        }
    });
}

pub(crate) fn random(shape: &[usize], dtype: DType, key: [u32; 2], dist: Distribution) -> Result<Storage> {
    let n = numel(shape);
    let mut buf = CpuBuffer::alloc(dtype, n)?;
    match dist {
        Distribution::Uniform { low, high } => {
            if !dtype.is_float() {
                return Err(Error::dtype("uniform", dtype, "random uniform values need a float dtype"));
            }
            let (lo, hi) = (round_to(dtype, low), round_to(dtype, high));
            let below = next_down(dtype, hi);
            let wide = dtype == DType::F64;
            crate::with_dtype!(dtype, T => fill(buf.typed_mut::<T>(), |i| {
                let b = block(key, i);
                let u = if wide { u53(b) } else { u24(b[0]) };
                let v = T::from_f64(lo + (hi - lo) * u);
                if v.to_f64() >= hi { T::from_f64(below) } else { v }
            }));
        }
        Distribution::Normal { mean, std } => {
            if !dtype.is_float() {
                return Err(Error::dtype("normal", dtype, "random normal values need a float dtype"));
            }
            crate::with_dtype!(dtype, T => fill(buf.typed_mut::<T>(), |i| {
                let u1 = u53(block(key, 2 * i));
                let u2 = u53(block(key, 2 * i + 1));
                let z = (-2.0 * (1.0 - u1).ln()).sqrt() * (std::f64::consts::TAU * u2).cos();
                T::from_f64(mean + std * z)
            }));
        }
        Distribution::Bernoulli { p } => {
            if dtype != DType::Bool {
                return Err(Error::dtype("bernoulli", dtype, "bernoulli values are bool"));
            }
            fill(buf.typed_mut::<u8>(), |i| (u53(block(key, i)) < p) as u8);
        }
    }
    Ok(Storage::contiguous(Buffer::Cpu(buf), dtype, shape))
}

#[cfg(test)]
mod tests {
    use super::*;
    /// Known-answer vectors of the Random123 distribution (`kat_vectors`, threefry2x32_20).
    #[test]
    fn threefry_known_answers() {
        assert_eq!(threefry2x32([0, 0], [0, 0]), [0x6b20_0159, 0x99ba_4efe]);
        assert_eq!(threefry2x32([u32::MAX, u32::MAX], [u32::MAX, u32::MAX]), [0x1cb9_96fc, 0xbb00_2be7]);
        assert_eq!(threefry2x32([0x1319_8a2e, 0x0370_7344], [0x243f_6a88, 0x85a3_08d3]), [0xc492_3a9c, 0x483d_f7a0]);
    }
    #[test]
    fn next_down_is_below() {
        for d in [DType::F16, DType::BF16, DType::F32, DType::F64] {
            for x in [1.0, -1.0, 0.0, 3.5] {
                let y = next_down(d, x);
                assert!(y < x && round_to(d, y) == y, "{d} {x} {y}");
            }
        }
    }
}
