//! The inner loop of the CPU quantized product: a tile of packed weight rows times up to
//! [`MR`] rows of `x`, with each block dequantized once into vector registers and then
//! multiplied into every `x` row (so the decode cost is shared by the rows, and memory
//! traffic is the packed bytes).
//!
//! Three builds of the same arithmetic, chosen at run time ([`level`]): AVX-512F (16
//! lanes), AVX2 with FMA (8 lanes), and portable code. A block's 32 weights are
//! `d · q + m` (Q4_1), `d · q − 8d` (Q4_0) or `d · q` (Q8_0), each multiplied into f32
//! accumulators; several accumulators per row keep the fused multiply-adds independent,
//! and they are summed in a fixed order, so a result depends only on the level.

use crate::quant::{BLOCK, QuantFormat, dequantize_block};

/// Rows of `x` per call of a tile kernel.
pub(crate) const MR: usize = 8;

pub(crate) use super::simd::{Level, level};

/// `out[r * m + i] = w_r · x_i` for the `rows` packed weight rows in `w` (each
/// `k / 32` blocks of `format`) and the `m = x.len() / k` rows of `x` (`1 ≤ m ≤ MR`).
/// `level` is this CPU's or a lower one.
pub(crate) fn tile(level: Level, format: QuantFormat, w: &[u8], rows: usize, x: &[f32], k: usize, out: &mut [f32]) {
    let row_bytes = k / BLOCK * format.block_bytes();
    let m = x.len().checked_div(k).unwrap_or(0);
    assert!(
        (1..=MR).contains(&m)
            && k.is_multiple_of(BLOCK)
            && x.len() == m * k
            && w.len() >= rows * row_bytes
            && out.len() >= rows * m,
        "qdot::tile: extents"
    );
    #[cfg(target_arch = "x86_64")]
    match level {
        // SAFETY: the level was detected on this CPU (its features are enabled), and the
        // extents were checked above: each kernel reads `rows * row_bytes` bytes of `w`,
        // `m * k` values of `x` and writes `rows * m` values of `out`.
        Level::Avx512 => return unsafe { x86::tile512(format, w, rows, x, m, k, out) },
        Level::Avx2 => return unsafe { x86::tile256(format, w, rows, x, m, k, out) },
        Level::Portable => {}
    }
    let _ = level;
    portable(format, w, rows, x, m, k, out);
}

/// The portable build: each block dequantized into 32 floats, then 8 lanes per row.
fn portable(format: QuantFormat, w: &[u8], rows: usize, x: &[f32], m: usize, k: usize, out: &mut [f32]) {
    let bb = format.block_bytes();
    let row_bytes = k / BLOCK * bb;
    let mut wv = [0f32; BLOCK];
    for r in 0..rows {
        let mut acc = [[0f32; 8]; MR];
        for (b, blk) in w[r * row_bytes..(r + 1) * row_bytes].chunks_exact(bb).enumerate() {
            dequantize_block(format, blk, &mut wv);
            for (i, a) in acc.iter_mut().enumerate().take(m) {
                let xb = &x[i * k + b * BLOCK..i * k + (b + 1) * BLOCK];
                for (wc, xc) in wv.chunks_exact(8).zip(xb.chunks_exact(8)) {
                    for l in 0..8 {
                        a[l] += wc[l] * xc[l];
                    }
                }
            }
        }
        for (i, a) in acc.iter().enumerate().take(m) {
            out[r * m + i] = a.iter().sum();
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    use super::MR;
    use crate::quant::{BLOCK, QuantFormat};

    const Q4_0: u8 = 0;
    const Q4_1: u8 = 1;
    const Q8_0: u8 = 2;

    fn code(f: QuantFormat) -> u8 {
        match f {
            QuantFormat::Q4_0 => Q4_0,
            QuantFormat::Q4_1 => Q4_1,
            QuantFormat::Q8_0 => Q8_0,
        }
    }

    /// Calls `$k::<FMT, M, A>` for the constant format `$fmt` and the runtime `$m`, where
    /// `A` (accumulators per row) keeps about eight multiply-add chains in flight.
    macro_rules! by_m {
        ($k:ident, $fmt:expr, $m:expr, ($($arg:expr),*)) => {
            match $m {
                1 => $k::<{ $fmt }, 1, 4>($($arg),*),
                2 => $k::<{ $fmt }, 2, 4>($($arg),*),
                3 => $k::<{ $fmt }, 3, 2>($($arg),*),
                4 => $k::<{ $fmt }, 4, 2>($($arg),*),
                5 => $k::<{ $fmt }, 5, 1>($($arg),*),
                6 => $k::<{ $fmt }, 6, 1>($($arg),*),
                7 => $k::<{ $fmt }, 7, 1>($($arg),*),
                _ => $k::<{ $fmt }, 8, 1>($($arg),*),
            }
        };
    }

    /// [`by_m`] for the runtime format `$f`.
    macro_rules! dispatch {
        ($k:ident, $f:expr, $m:expr, $args:tt) => {
            match code($f) {
                Q4_0 => by_m!($k, Q4_0, $m, $args),
                Q4_1 => by_m!($k, Q4_1, $m, $args),
                _ => by_m!($k, Q8_0, $m, $args),
            }
        };
    }

    /// The block's scale (and, for Q4_1, its minimum) as f32: lanes 0 and 1.
    #[inline]
    #[target_feature(enable = "f16c")]
    unsafe fn scales(p: *const u8) -> __m128 {
        // Four bytes are always inside the block (every block holds at least 18).
        let bits = unsafe { p.cast::<i32>().read_unaligned() };
        _mm_cvtph_ps(_mm_cvtsi32_si128(bits))
    }

    // ---- AVX-512F: a block is two vectors of 16 weights ----

    #[target_feature(enable = "avx512f,f16c")]
    pub(super) unsafe fn tile512(
        f: QuantFormat,
        w: &[u8],
        rows: usize,
        x: &[f32],
        m: usize,
        k: usize,
        out: &mut [f32],
    ) {
        let (wp, xp, op) = (w.as_ptr(), x.as_ptr(), out.as_mut_ptr());
        // SAFETY: the caller checked the extents and the CPU's features.
        unsafe { dispatch!(k512, f, m, (wp, rows, xp, k, op)) }
    }

    /// Block `p`'s 32 weights as two vectors (elements 0–15 and 16–31).
    #[inline]
    #[target_feature(enable = "avx512f,f16c")]
    unsafe fn block512<const FMT: u8>(p: *const u8) -> (__m512, __m512) {
        let s = unsafe { scales(p) };
        let d = _mm512_broadcastss_ps(s);
        match FMT {
            Q8_0 => unsafe {
                let lo = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(p.add(2).cast())));
                let hi = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(p.add(18).cast())));
                (_mm512_mul_ps(lo, d), _mm512_mul_ps(hi, d))
            },
            _ => {
                let at = if FMT == Q4_1 { 4 } else { 2 };
                let q = unsafe { _mm_loadu_si128(p.add(at).cast()) };
                let nib = _mm_set1_epi8(0x0f);
                let lo = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_and_si128(q, nib)));
                let hi = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_and_si128(_mm_srli_epi16(q, 4), nib)));
                let c = if FMT == Q4_1 {
                    _mm512_broadcastss_ps(_mm_movehdup_ps(s))
                } else {
                    _mm512_mul_ps(d, _mm512_set1_ps(-8.0))
                };
                (_mm512_fmadd_ps(lo, d, c), _mm512_fmadd_ps(hi, d, c))
            }
        }
    }

    #[inline]
    #[target_feature(enable = "avx512f,f16c")]
    unsafe fn k512<const FMT: u8, const M: usize, const A: usize>(
        w: *const u8,
        rows: usize,
        x: *const f32,
        k: usize,
        out: *mut f32,
    ) {
        let bb = match FMT {
            Q4_0 => 18,
            Q4_1 => 20,
            _ => 34,
        };
        let nb = k / BLOCK;
        for r in 0..rows {
            let row = unsafe { w.add(r * nb * bb) };
            let mut acc = [[_mm512_setzero_ps(); A]; M];
            let mut b = 0;
            // Two blocks per step: four weight vectors, the j-th into accumulator j % A.
            while b + 2 <= nb {
                let (w0, w1) = unsafe { block512::<FMT>(row.add(b * bb)) };
                let (w2, w3) = unsafe { block512::<FMT>(row.add((b + 1) * bb)) };
                let ws = [w0, w1, w2, w3];
                for (i, a) in acc.iter_mut().enumerate() {
                    let xb = unsafe { x.add(i * k + b * BLOCK) };
                    for (j, wj) in ws.iter().enumerate() {
                        let xv = unsafe { _mm512_loadu_ps(xb.add(16 * j)) };
                        a[j % A] = _mm512_fmadd_ps(*wj, xv, a[j % A]);
                    }
                }
                b += 2;
            }
            if b < nb {
                let (w0, w1) = unsafe { block512::<FMT>(row.add(b * bb)) };
                for (i, a) in acc.iter_mut().enumerate() {
                    let xb = unsafe { x.add(i * k + b * BLOCK) };
                    a[0] = _mm512_fmadd_ps(w0, unsafe { _mm512_loadu_ps(xb) }, a[0]);
                    a[1 % A] = _mm512_fmadd_ps(w1, unsafe { _mm512_loadu_ps(xb.add(16)) }, a[1 % A]);
                }
            }
            for (i, a) in acc.iter().enumerate() {
                let mut s = a[0];
                for v in &a[1..] {
                    s = _mm512_add_ps(s, *v);
                }
                unsafe { *out.add(r * M + i) = _mm512_reduce_add_ps(s) };
            }
        }
    }

    // ---- AVX2 with FMA: a block is four vectors of 8 weights ----

    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn tile256(
        f: QuantFormat,
        w: &[u8],
        rows: usize,
        x: &[f32],
        m: usize,
        k: usize,
        out: &mut [f32],
    ) {
        let (wp, xp, op) = (w.as_ptr(), x.as_ptr(), out.as_mut_ptr());
        // SAFETY: the caller checked the extents and the CPU's features.
        unsafe { dispatch!(k256, f, m, (wp, rows, xp, k, op)) }
    }

    /// Block `p`'s 32 weights as four vectors of 8.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn block256<const FMT: u8>(p: *const u8) -> [__m256; 4] {
        let s = unsafe { scales(p) };
        let d = _mm256_broadcastss_ps(s);
        let w8 = |v: __m128i| _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(v));
        let u8w = |v: __m128i| _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(v));
        match FMT {
            Q8_0 => unsafe {
                let a = _mm_loadu_si128(p.add(2).cast());
                let b = _mm_loadu_si128(p.add(18).cast());
                [
                    _mm256_mul_ps(w8(a), d),
                    _mm256_mul_ps(w8(_mm_srli_si128(a, 8)), d),
                    _mm256_mul_ps(w8(b), d),
                    _mm256_mul_ps(w8(_mm_srli_si128(b, 8)), d),
                ]
            },
            _ => {
                let at = if FMT == Q4_1 { 4 } else { 2 };
                let q = unsafe { _mm_loadu_si128(p.add(at).cast()) };
                let nib = _mm_set1_epi8(0x0f);
                let lo = _mm_and_si128(q, nib);
                let hi = _mm_and_si128(_mm_srli_epi16(q, 4), nib);
                let c = if FMT == Q4_1 {
                    _mm256_broadcastss_ps(_mm_movehdup_ps(s))
                } else {
                    _mm256_mul_ps(d, _mm256_set1_ps(-8.0))
                };
                [
                    _mm256_fmadd_ps(u8w(lo), d, c),
                    _mm256_fmadd_ps(u8w(_mm_srli_si128(lo, 8)), d, c),
                    _mm256_fmadd_ps(u8w(hi), d, c),
                    _mm256_fmadd_ps(u8w(_mm_srli_si128(hi, 8)), d, c),
                ]
            }
        }
    }

    #[inline]
    #[target_feature(enable = "avx")]
    fn hsum256(v: __m256) -> f32 {
        let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
        let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
        let s = _mm_add_ss(s, _mm_movehdup_ps(s));
        _mm_cvtss_f32(s)
    }

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn k256<const FMT: u8, const M: usize, const A: usize>(
        w: *const u8,
        rows: usize,
        x: *const f32,
        k: usize,
        out: *mut f32,
    ) {
        let bb = match FMT {
            Q4_0 => 18,
            Q4_1 => 20,
            _ => 34,
        };
        let nb = k / BLOCK;
        debug_assert!(M <= MR);
        for r in 0..rows {
            let row = unsafe { w.add(r * nb * bb) };
            let mut acc = [[_mm256_setzero_ps(); A]; M];
            for b in 0..nb {
                let ws = unsafe { block256::<FMT>(row.add(b * bb)) };
                for (i, a) in acc.iter_mut().enumerate() {
                    let xb = unsafe { x.add(i * k + b * BLOCK) };
                    for (j, wj) in ws.iter().enumerate() {
                        let xv = unsafe { _mm256_loadu_ps(xb.add(8 * j)) };
                        a[j % A] = _mm256_fmadd_ps(*wj, xv, a[j % A]);
                    }
                }
            }
            for (i, a) in acc.iter().enumerate() {
                let mut s = a[0];
                for v in &a[1..] {
                    s = _mm256_add_ps(s, *v);
                }
                unsafe { *out.add(r * M + i) = hsum256(s) };
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quant::quantize;

    /// A small deterministic generator (no dependency on the crate's random ops).
    fn values(n: usize, seed: u64) -> Vec<f32> {
        let mut s = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        (0..n)
            .map(|_| {
                s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                ((s >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
            })
            .collect()
    }

    /// Every level, format, row count 1..=MR and odd block counts against the
    /// dequantized weights times `x` summed in f64.
    #[test]
    fn tiles_match_f64_reference_at_every_level() {
        for level in Level::available() {
            for format in QuantFormat::ALL {
                for (seed, nb) in [1usize, 2, 3, 5, 18].into_iter().enumerate() {
                    let (rows, k) = (3, nb * BLOCK);
                    let wf = values(rows * k, seed as u64 + 7);
                    let w = quantize(format, &wf).unwrap();
                    let mut deq = vec![0f32; rows * k];
                    crate::quant::dequantize(format, &w, &mut deq).unwrap();
                    for m in 1..=MR {
                        let x = values(m * k, seed as u64 * 31 + m as u64);
                        let mut out = vec![f32::NAN; rows * m];
                        tile(level, format, &w, rows, &x, k, &mut out);
                        for r in 0..rows {
                            for i in 0..m {
                                let want: f64 = (0..k).map(|j| deq[r * k + j] as f64 * x[i * k + j] as f64).sum();
                                let got = out[r * m + i] as f64;
                                assert!(
                                    (got - want).abs() <= 1e-5 * (1.0 + want.abs()) * (k as f64).sqrt(),
                                    "{level:?} {format:?} k={k} m={m} r={r} i={i}: {got} vs {want}"
                                );
                            }
                        }
                    }
                }
            }
        }
    }
}
