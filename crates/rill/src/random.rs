//! Counter-based random numbers, JAX style: explicit [`Key`]s, no hidden state in the
//! draws themselves.
//!
//! A key is two 32-bit words. Drawing never changes a key: the same key always gives the
//! same values, so derive fresh keys with [`Key::split`] or [`Key::fold_in`] (a key that
//! was split should not also be used to draw). For quick scripts, [`next_key`] hands out
//! keys from one process-wide generator reset by [`seed`].
//!
//! Bits come from threefry-2x32 with 20 rounds (Salmon et al., SC 2011; the same
//! function as JAX's `threefry2x32`) keyed by the key and applied to 64-bit counters:
//!
//! * element `i` of a draw uses counter `i`, as the words `[i as u32, (i >> 32) as u32]`
//!   (a normal draw uses counters `2i` and `2i + 1`); results therefore do not depend on
//!   how the work is split, and a GPU kernel reproduces them bit for bit;
//! * `split(n)` gives key `j` = `threefry(key, [j, 0xFFFF_FFFE])`;
//! * `fold_in(d)` gives `threefry(key, [d, 0xFFFF_FFFF])`.
//!
//! The high counter words used for key derivation are never reached by a draw smaller
//! than 2^63 elements, so derived keys are independent of drawn values.
//!
//! Bits become values as follows (`u24(w) = (w >> 8) · 2^-24`,
//! `u53([x0, x1]) = (((x0 << 32) | x1) >> 11) · 2^-53`, both in `[0, 1)`):
//!
//! * [`uniform`]: `u = u53(bits)` for f64 and `u24(bits[0])` for f32, f16, bf16; with the
//!   bounds rounded to the dtype, `lo + (hi - lo) · u` is computed in f64 and rounded to
//!   nearest; a result that rounds up to `hi` becomes the largest value below `hi`.
//! * [`normal`]: Box-Muller in f64, `sqrt(-2 ln(1 - u1)) · cos(2π u2)` with
//!   `u1 = u53(bits(2i))`, `u2 = u53(bits(2i + 1))`, then `mean + std · z` rounded.
//! * [`bernoulli`]: `u53(bits) < p`.
//!
//! Uniform and Bernoulli values are exact functions of the bits; normal values depend on
//! `ln`/`cos`, so another backend matches them up to the last bit of those functions.

use crate::array::Array;
use crate::backend::cpu::random::{round_to, threefry2x32};
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::ops::target_stream;
use crate::primitives::{Distribution, Primitive, creation};
use crate::sync::Mutex;

/// A random key: the state a draw is a pure function of.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Key([u32; 2]);

impl Key {
    /// The key of a seed: `[seed >> 32, seed & 0xFFFF_FFFF]` (as JAX's `PRNGKey`).
    pub fn new(seed: u64) -> Key {
        Key([(seed >> 32) as u32, seed as u32])
    }
    /// A key from its two words.
    pub fn from_words(words: [u32; 2]) -> Key {
        Key(words)
    }
    /// The two words of the key.
    pub fn words(&self) -> [u32; 2] {
        self.0
    }
    /// `n` new keys derived from this one (see the module docs for the derivation).
    pub fn split(&self, n: usize) -> Vec<Key> {
        (0..n).map(|j| Key(threefry2x32(self.0, [j as u32, 0xFFFF_FFFE ^ ((j >> 32) as u32)]))).collect()
    }
    /// A new key derived from this one and `data` (for example a step or layer number).
    pub fn fold_in(&self, data: u32) -> Key {
        Key(threefry2x32(self.0, [data, 0xFFFF_FFFF]))
    }
}

/// The process-wide generator: its seed and how many keys it has handed out.
static GLOBAL: Mutex<(u64, u64)> = Mutex::new((0, 0));

/// Resets the process-wide generator used by [`next_key`] (its seed is 0 until this is
/// called).
pub fn seed(seed: u64) {
    *GLOBAL.lock() = (seed, 0);
}

/// The next key of the process-wide generator: the `c`-th call after `seed(s)` returns
/// `Key::new(s).fold_in(c as u32).fold_in((c >> 32) as u32)`. Shared by all threads.
pub fn next_key() -> Key {
    let (s, c) = {
        let mut g = GLOBAL.lock();
        let c = g.1;
        g.1 = c.wrapping_add(1);
        (g.0, c)
    };
    Key::new(s).fold_in(c as u32).fold_in((c >> 32) as u32)
}

fn draw(op: &'static str, key: Key, shape: &[usize], dist: Distribution, dtype: DType) -> Result<Array> {
    let shape = creation::random(op, shape, dtype)?;
    let stream = target_stream(&[])?;
    Ok(Array::from_op(Primitive::Random { key: key.0, dist }, Vec::new(), shape, dtype, stream))
}

fn check_float(op: &'static str, dtype: DType) -> Result<()> {
    if dtype.is_float() { Ok(()) } else { Err(Error::dtype(op, dtype, "random values need a float dtype")) }
}

/// Values uniform on `[low, high)` of a float `dtype` (bounds rounded to the dtype first).
///
/// Errors on a non-float dtype, non-finite bounds, or `low >= high` after rounding.
pub fn uniform(key: Key, shape: &[usize], low: f64, high: f64, dtype: DType) -> Result<Array> {
    check_float("uniform", dtype)?;
    let (lo, hi) = (round_to(dtype, low), round_to(dtype, high));
    if !(lo.is_finite() && hi.is_finite() && (hi - lo).is_finite()) || lo >= hi {
        return Err(Error::invalid(
            "uniform",
            format!("bounds [{low}, {high}) are not a finite non-empty range in {dtype} (rounded: [{lo}, {hi}))"),
        ));
    }
    draw("uniform", key, shape, Distribution::Uniform { low, high }, dtype)
}

/// Normal values with `mean` and standard deviation `std` of a float `dtype`.
///
/// Errors on a non-float dtype, a non-finite `mean` or `std`, or a negative `std`.
pub fn normal(key: Key, shape: &[usize], mean: f64, std: f64, dtype: DType) -> Result<Array> {
    check_float("normal", dtype)?;
    if !(mean.is_finite() && std.is_finite()) || std < 0.0 {
        return Err(Error::invalid("normal", format!("mean {mean} and std {std} must be finite with std >= 0")));
    }
    draw("normal", key, shape, Distribution::Normal { mean, std }, dtype)
}

/// Bool values, `true` with probability `p` (in `[0, 1]`, else an error).
pub fn bernoulli(key: Key, p: f64, shape: &[usize]) -> Result<Array> {
    if !(0.0..=1.0).contains(&p) {
        return Err(Error::invalid("bernoulli", format!("probability {p} is not in [0, 1]")));
    }
    draw("bernoulli", key, shape, Distribution::Bernoulli { p }, DType::Bool)
}

/// Uniform f32 values on `[0, 1)` of `shape` drawn with `key` on `stream` (the f32
/// uniform draw of [`uniform`], recorded on a given stream).
pub(crate) fn uniform_on(key: Key, shape: &[usize], stream: &crate::runtime::stream::Stream) -> Result<Array> {
    let shape = creation::random("uniform", shape, DType::F32)?;
    let dist = Distribution::Uniform { low: 0.0, high: 1.0 };
    Ok(Array::from_op(Primitive::Random { key: key.0, dist }, Vec::new(), shape, DType::F32, stream.clone()))
}

/// Gumbel noise `-ln(-ln(u))` of uniforms `u` in `[0, 1)` (`u = 0` gives `-inf`), computed
/// in f64 and rounded to `dtype` so that backends whose `ln` differ in the last f64 bit
/// still round to the same value (all but never otherwise).
pub(crate) fn gumbel(u: &Array, dtype: DType) -> Result<Array> {
    u.astype(DType::F64)?.log()?.neg()?.log()?.neg()?.astype(dtype)
}

/// One draw per row from the distribution `softmax(logits)` along `axis`: the positions
/// (i64) with `axis` removed.
///
/// The draw is `argmax(logits + g)` with Gumbel noise `g = -ln(-ln(u))` (the Gumbel-max
/// trick, an exact draw from the softmax), `u` the f32 [`uniform`] draw of `key` over the
/// shape of `logits`, on the device of `logits`. Logits of a row that are `-inf` are never
/// drawn; f16/bf16/f32 logits add the noise in f32, f64 logits in f64. The same key gives
/// the same draws on the CPU and a GPU: the uniforms are bit-identical, the noise is
/// computed in f64 and rounded, and the sum and argmax are exact, so the results differ
/// only if an f64 `ln` of the two backends rounds to different sides of an f32 value.
///
/// ```
/// # use rill::{Array, random::{Key, categorical}};
/// let logits = Array::from_slice(&[0.0f32, 2.0, -1.0, 1.0, f32::NEG_INFINITY, 0.5], &[2, 3])?;
/// let draws = categorical(Key::new(7), &logits, -1)?;
/// assert_eq!(draws.shape(), [2]);
/// let d = draws.to_vec::<i64>()?;
/// assert!(d[0] < 3 && (d[1] == 0 || d[1] == 2));
/// # Ok::<(), rill::Error>(())
/// ```
pub fn categorical(key: Key, logits: &Array, axis: isize) -> Result<Array> {
    let ax = crate::shape::normalize_axis("categorical", axis, logits.ndim())?;
    if logits.shape()[ax] == 0 {
        return Err(Error::shape("categorical", format!("axis {axis} of shape {:?} is empty", logits.shape())));
    }
    let dtype = if logits.dtype() == DType::F64 { DType::F64 } else { DType::F32 };
    let stream = target_stream(&[logits])?;
    let u = uniform_on(key, logits.shape(), &stream)?;
    logits.astype(dtype)?.add(&gumbel(&u, dtype)?)?.argmax(ax as isize, false)
}
