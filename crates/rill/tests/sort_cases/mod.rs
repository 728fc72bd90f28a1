//! Cases of `ops_sort_sample.rs` (CPU) and `gpu_sort_sample.rs` (CUDA), each run on a
//! given device against float64 / exact host references: sort, argsort and top-k over
//! generated shapes, categorical's distribution, and the sampler's filters against a
//! float64 transcription of Hugging Face transformers' logits processors.
#![allow(dead_code)]

use crate::common::{Rng, on};
use rill::random::{Key, categorical};
use rill::sample::{Sampler, SamplerConfig, add_to_presence, presence_mask};
use rill::{Array, DType, Device};

pub const SORT_DTYPES: [DType; 9] =
    [DType::F32, DType::F16, DType::BF16, DType::F64, DType::I32, DType::I64, DType::U32, DType::U8, DType::Bool];

/// A host value of the reference: floats as f64 (exact for every float dtype), integers
/// as i64 (exact for every integer dtype).
#[derive(Clone, Copy, Debug)]
pub enum V {
    F(f64),
    I(i64),
}

/// The documented order: NaNs equal and above everything, -0 == 0.
fn cmp(a: V, b: V) -> std::cmp::Ordering {
    use std::cmp::Ordering::*;
    match (a, b) {
        (V::I(x), V::I(y)) => x.cmp(&y),
        (V::F(x), V::F(y)) => match (x.is_nan(), y.is_nan()) {
            (true, true) => Equal,
            (true, false) => Greater,
            (false, true) => Less,
            _ => x.partial_cmp(&y).unwrap(),
        },
        _ => unreachable!(),
    }
}

pub fn host_values(a: &Array) -> Vec<V> {
    if a.dtype().is_float() {
        a.to_f64_vec().unwrap().into_iter().map(V::F).collect()
    } else {
        a.astype(DType::I64).unwrap().to_vec::<i64>().unwrap().into_iter().map(V::I).collect()
    }
}

fn same(a: V, b: V) -> bool {
    match (a, b) {
        (V::F(x), V::F(y)) => x.to_bits() == y.to_bits() || (x.is_nan() && y.is_nan()),
        (V::I(x), V::I(y)) => x == y,
        _ => false,
    }
}

/// Values of a generated case: few distinct values (ties), some NaNs and signed zeros for
/// floats, extremes for integers.
pub fn gen_values(rng: &mut Rng, n: usize, dtype: DType) -> Vec<f64> {
    let distinct = 1 + (rng.next_u64() % 12) as usize;
    (0..n)
        .map(|_| {
            let r = rng.next_u64() % 100;
            if dtype.is_float() {
                match r {
                    0..=3 => f64::NAN,
                    4 => -0.0,
                    5 => 0.0,
                    6 => f64::INFINITY,
                    7 => f64::NEG_INFINITY,
                    8..=50 => (rng.next_u64() % distinct as u64) as f64 - 5.0,
                    _ => rng.uniform(-100.0, 100.0),
                }
            } else {
                let (lo, hi) = match dtype {
                    DType::Bool => (0.0, 1.0),
                    DType::U8 => (0.0, 255.0),
                    DType::U32 => (0.0, 4294967295.0),
                    DType::I32 => (-2147483648.0, 2147483647.0),
                    _ => (-9.0e15, 9.0e15),
                };
                match r {
                    0..=4 => lo,
                    5..=9 => hi,
                    10..=60 => (lo + (rng.next_u64() % distinct as u64) as f64).min(hi),
                    _ => rng.uniform(lo, hi).floor(),
                }
            }
        })
        .collect()
}

/// An array of `dtype` with these values and `shape`; a non-contiguous view (the
/// transpose of an array of the reversed shape) when `strided`.
pub fn make(vals: &[f64], shape: &[usize], dtype: DType, strided: bool) -> Array {
    let to = |a: Array| if dtype == DType::Bool { a.ne(0.0).unwrap() } else { a.astype(dtype).unwrap() };
    if !strided || shape.len() < 2 {
        return to(Array::from_slice(vals, shape).unwrap());
    }
    let rev: Vec<usize> = shape.iter().rev().copied().collect();
    // Element (i0, .., ik) of the result is element (ik, .., i0) of the base.
    let n: usize = shape.iter().product();
    let mut base = vec![0.0; n];
    let mut idx = vec![0usize; shape.len()];
    for v in vals.iter() {
        let mut off = 0;
        for (a, &i) in idx.iter().rev().enumerate() {
            off = off * rev[a] + i;
        }
        base[off] = *v;
        for a in (0..shape.len()).rev() {
            idx[a] += 1;
            if idx[a] < shape[a] {
                break;
            }
            idx[a] = 0;
        }
    }
    to(Array::from_slice(&base, &rev).unwrap()).transpose(&[]).unwrap()
}

/// The reference order of each lane along `axis`: positions, stable, ascending or
/// descending values (ties by position either way). Returns (lanes of positions, the
/// flat offsets of each lane's elements).
pub fn ref_order(vals: &[V], shape: &[usize], axis: usize, descending: bool) -> Vec<(Vec<usize>, Vec<usize>)> {
    let n = shape[axis];
    let inner: usize = shape[axis + 1..].iter().product();
    let outer: usize = shape[..axis].iter().product();
    let mut lanes = Vec::new();
    for o in 0..outer {
        for i in 0..inner {
            let offs: Vec<usize> = (0..n).map(|j| (o * n + j) * inner + i).collect();
            let mut pos: Vec<usize> = (0..n).collect();
            pos.sort_by(|&a, &b| {
                let c = cmp(vals[offs[a]], vals[offs[b]]);
                if descending { c.reverse() } else { c }
            });
            lanes.push((pos, offs));
        }
    }
    lanes
}

/// Sort, argsort and top-k of generated cases on `device` against the reference: exact
/// positions, values equal to the reference's. `big` adds long rows.
pub fn sort_cases(device: Device, seed: u64, cases: usize, big: &[usize]) {
    let mut rng = Rng::new(seed);
    let dims = [1usize, 2, 3, 5, 8, 17, 64, 300, 1000];
    let mut shapes: Vec<Vec<usize>> = Vec::new();
    for _ in 0..cases {
        let nd = 1 + (rng.next_u64() % 3) as usize;
        shapes.push((0..nd).map(|_| dims[(rng.next_u64() % dims.len() as u64) as usize]).collect());
    }
    shapes.push(vec![1]);
    shapes.push(vec![4, 1]);
    for &n in big {
        shapes.push(vec![2, n]);
    }
    for (c, shape) in shapes.iter().enumerate() {
        let dtype = SORT_DTYPES[c % SORT_DTYPES.len()];
        let axis = (rng.next_u64() % shape.len() as u64) as usize;
        let strided = rng.next_u64().is_multiple_of(2);
        let descending = rng.next_u64().is_multiple_of(2);
        let n = shape[axis];
        let k = if rng.next_u64().is_multiple_of(3) { n } else { 1 + (rng.next_u64() % n as u64) as usize };
        let numel: usize = shape.iter().product();
        let vals = gen_values(&mut rng, numel, dtype);
        let what = format!("case {c}: {dtype} {shape:?} axis {axis} desc {descending} strided {strided} k {k}");
        let (sorted, order, tv, ti) = on(device, || {
            let x = make(&vals, shape, dtype, strided);
            let ax = axis as isize - shape.len() as isize; // negative axes too
            let s = x.sort(ax, descending).unwrap();
            let o = x.argsort(axis as isize, descending).unwrap();
            let (tv, ti) = x.topk(k, axis as isize).unwrap();
            (s, o, tv, ti)
        });
        let x = make(&vals, shape, dtype, strided);
        let hv = host_values(&x);
        assert_eq!(sorted.dtype(), dtype, "{what}");
        assert_eq!(order.dtype(), DType::I64, "{what}");
        let (sv, ov) = (host_values(&sorted), order.to_vec::<i64>().unwrap());
        let mut kshape = shape.clone();
        kshape[axis] = k;
        assert_eq!(tv.shape(), kshape, "{what}");
        assert_eq!(ti.shape(), kshape, "{what}");
        let (tvv, tiv) = (host_values(&tv), ti.to_vec::<i64>().unwrap());
        let inner: usize = shape[axis + 1..].iter().product();
        for (l, (pos, offs)) in ref_order(&hv, shape, axis, descending).iter().enumerate() {
            for (j, &p) in pos.iter().enumerate() {
                let at = offs[j];
                assert_eq!(ov[at], p as i64, "{what}: argsort lane {l} position {j}");
                assert!(
                    same(sv[at], hv[offs[p]]),
                    "{what}: sort lane {l} position {j}: {:?} vs {:?}",
                    sv[at],
                    hv[offs[p]]
                );
            }
        }
        for (l, (pos, offs)) in ref_order(&hv, shape, axis, true).iter().enumerate() {
            let (o, i) = (l / inner, l % inner);
            for (j, &p) in pos.iter().take(k).enumerate() {
                let at = (o * k + j) * inner + i;
                assert_eq!(tiv[at], p as i64, "{what}: topk lane {l} position {j}");
                assert!(same(tvv[at], hv[offs[p]]), "{what}: topk value lane {l} position {j}");
            }
        }
    }
}

/// Top-k of long rows at several k (the select and multi-pass paths on a GPU).
pub fn topk_long_rows(device: Device, n: usize, ks: &[usize], dtype: DType) {
    let mut rng = Rng::new(n as u64);
    let vals = gen_values(&mut rng, 2 * n, dtype);
    for &k in ks {
        let (tv, ti) = on(device, || make(&vals, &[2, n], dtype, false).topk(k, -1).unwrap());
        let x = make(&vals, &[2, n], dtype, false);
        let hv = host_values(&x);
        let (tvv, tiv) = (host_values(&tv), ti.to_vec::<i64>().unwrap());
        for (l, (pos, offs)) in ref_order(&hv, &[2, n], 1, true).iter().enumerate() {
            for j in 0..k {
                assert_eq!(tiv[l * k + j], pos[j] as i64, "{dtype} n {n} k {k}: row {l} position {j}");
                assert!(same(tvv[l * k + j], hv[offs[pos[j]]]), "{dtype} n {n} k {k}: value {j}");
            }
        }
    }
}

/// Softmax of a row in f64.
pub fn softmax(x: &[f64]) -> Vec<f64> {
    let m = x.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
    let e: Vec<f64> = x.iter().map(|v| if *v == f64::NEG_INFINITY { 0.0 } else { (v - m).exp() }).collect();
    let s: f64 = e.iter().sum();
    e.iter().map(|v| v / s).collect()
}

/// Pearson's chi-square of counts against probabilities (cells of expected count >= 5;
/// a count in a zero-probability cell fails at once). Returns (statistic, degrees).
pub fn chi_square(counts: &[usize], probs: &[f64]) -> (f64, usize) {
    let n: usize = counts.iter().sum();
    let mut stat = 0.0;
    let mut cells = 0usize;
    for (c, p) in counts.iter().zip(probs) {
        if *p == 0.0 {
            assert_eq!(*c, 0, "a token of probability 0 was drawn");
            continue;
        }
        let e = p * n as f64;
        if e >= 5.0 {
            stat += (*c as f64 - e).powi(2) / e;
            cells += 1;
        }
    }
    (stat, cells.saturating_sub(1))
}

/// An upper bound of chi-square with `df` degrees that a correct sampler exceeds with
/// probability about 1e-6 (Wilson-Hilferty with z = 4.75).
pub fn chi_bound(df: usize) -> f64 {
    let d = df as f64;
    let z = 4.75;
    d * (1.0 - 2.0 / (9.0 * d) + z * (2.0 / (9.0 * d)).sqrt()).powi(3)
}

/// Categorical draws of many rows of the same logits: the empirical distribution within
/// a chi-square bound of the softmax; `-inf` logits never drawn; the same key gives the
/// same draws, another key other draws.
pub fn categorical_distribution(device: Device) {
    let logits = [0.5f64, -1.0, 2.0, 0.0, f64::NEG_INFINITY, 1.25, -0.5, 3.0, -2.0, 1.0];
    let v = logits.len();
    let rows = 20_000;
    for dtype in [DType::F32, DType::BF16, DType::F16] {
        let draw = |key: u64| {
            on(device, || {
                let l = Array::from_slice(&logits, &[1, v]).unwrap().astype(dtype).unwrap();
                let l = l.broadcast_to(&[rows, v]).unwrap();
                categorical(Key::new(key), &l, -1).unwrap().to_vec::<i64>().unwrap()
            })
        };
        let d = draw(3);
        let rounded = Array::from_slice(&logits, &[v]).unwrap().astype(dtype).unwrap().to_f64_vec().unwrap();
        let p = softmax(&rounded);
        let mut counts = vec![0usize; v];
        for &t in &d {
            counts[t as usize] += 1;
        }
        let (stat, df) = chi_square(&counts, &p);
        assert!(stat < chi_bound(df), "{dtype}: chi-square {stat} over {df} degrees (bound {})", chi_bound(df));
        assert_eq!(d, draw(3), "{dtype}: same key, other draws");
        assert_ne!(d, draw(4), "{dtype}: another key, same draws");
    }
    // Along a leading axis: the draws of the transposed logits.
    let (a, b) = on(device, || {
        let l = Array::from_slice(&[0.0f32, 1.0, 2.0, 3.0, 4.0, 5.0], &[2, 3]).unwrap();
        let a = categorical(Key::new(9), &l.t().unwrap().contiguous().unwrap(), 0).unwrap();
        let b = categorical(Key::new(9), &l.t().unwrap(), 0).unwrap();
        (a.to_vec::<i64>().unwrap(), b.to_vec::<i64>().unwrap())
    });
    assert_eq!(a.len(), 2);
    assert_eq!(a, b);
}

// ---- the float64 reference of transformers' processors ----

/// What a reference decided for each token: eligible, and whether a f32 computation
/// could decide either way (the value is within rounding of the boundary, or equal to
/// that of a token decided the other way).
pub struct Decision {
    pub keep: Vec<bool>,
    pub either: Vec<bool>,
}

/// transformers' pipeline for one row, in f64: repetition penalty over `history`, then
/// (unless greedy) temperature, top-k, top-p, min-p; returns the final logits (-inf:
/// removed) and the decision per token.
pub fn reference_row(logits: &[f64], history: &[i64], c: &SamplerConfig) -> (Vec<f64>, Decision) {
    let v = logits.len();
    let mut x = logits.to_vec();
    let mut either = vec![false; v];
    if let Some(r) = c.repetition_penalty {
        let r = r as f64;
        let mut seen = vec![false; v];
        for &t in history {
            if t >= 0 && !seen[t as usize] {
                seen[t as usize] = true;
                let s = x[t as usize];
                x[t as usize] = if s < 0.0 { s * r } else { s / r };
            }
        }
    }
    if c.temperature == 0.0 {
        return (x, Decision { keep: vec![true; v], either });
    }
    let t = c.temperature as f64;
    for s in x.iter_mut() {
        *s /= t;
    }
    let ninf = f64::NEG_INFINITY;
    if let Some(k) = c.top_k {
        let k = k.min(v);
        let mut sorted = x.clone();
        sorted.sort_by(|a, b| b.partial_cmp(a).unwrap());
        let thr = sorted[k - 1];
        let vals = x.clone();
        remove_below(&mut x, &vals, thr, 1e-6, &mut either);
    }
    if let Some(p) = c.top_p.filter(|&p| p < 1.0) {
        let p = p as f64;
        // transformers: ascending sort, softmax, cumsum; remove cumulative <= 1 - p, keep the last.
        let mut idx: Vec<usize> = (0..v).collect();
        idx.sort_by(|&a, &b| x[a].partial_cmp(&x[b]).unwrap());
        let sorted: Vec<f64> = idx.iter().map(|&i| x[i]).collect();
        let probs = softmax(&sorted);
        let mut cum = 0.0;
        let mut removed = vec![false; v];
        for (j, &i) in idx.iter().enumerate() {
            cum += probs[j];
            if cum <= 1.0 - p && j + 1 < v {
                removed[i] = true;
            }
            if (cum - (1.0 - p)).abs() < 1e-5 {
                either[i] = true;
            }
        }
        for i in 0..v {
            if removed[i] {
                x[i] = ninf;
            }
        }
    }
    if let Some(m) = c.min_p.filter(|&m| m > 0.0) {
        let probs = softmax(&x);
        let top = probs.iter().cloned().fold(0.0, f64::max);
        remove_below(&mut x, &probs, m as f64 * top, 1e-5, &mut either);
    }
    let keep: Vec<bool> = x.iter().map(|&s| s != ninf).collect();
    // Ties with a token decided the other way could go either way too.
    for i in 0..v {
        if (0..v).any(|j| keep[j] != keep[i] && logits[j] == logits[i]) {
            either[i] = true;
        }
    }
    (x, Decision { keep, either })
}

/// A removal by a strict comparison `vals[i] < thr`, with values within `tol` of the
/// threshold marked as either.
fn remove_below(x: &mut [f64], vals: &[f64], thr: f64, tol: f64, either: &mut [bool]) {
    for i in 0..x.len() {
        if x[i] == f64::NEG_INFINITY {
            continue;
        }
        if (vals[i] - thr).abs() <= tol * (1.0 + thr.abs()) {
            either[i] = true;
        }
        if vals[i] < thr {
            x[i] = f64::NEG_INFINITY;
        }
    }
}

/// Generated configurations, logits and histories: the sampler's filtered logits on
/// `device` keep the tokens the reference keeps (up to `either` tokens) and have the
/// reference's values; every drawn token is eligible; greedy rows give the first maximum.
pub fn filters_match_reference(device: Device, seed: u64, cases: usize) {
    let mut rng = Rng::new(seed);
    for case in 0..cases {
        let dtype = [DType::F32, DType::BF16, DType::F16][case % 3];
        let batch = 1 + (rng.next_u64() % 4) as usize;
        let vocab = [7usize, 50, 300, 1000][(rng.next_u64() % 4) as usize];
        let hist_len = (rng.next_u64() % 12) as usize;
        let configs: Vec<SamplerConfig> = (0..batch).map(|_| random_config(&mut rng, vocab)).collect();
        let scale = rng.uniform(0.5, 6.0);
        let vals: Vec<f64> = (0..batch * vocab).map(|_| rng.uniform(-scale, scale)).collect();
        let hist: Vec<i64> = (0..batch * hist_len).map(|_| (rng.next_u64() % (vocab as u64 + 3)) as i64 - 3).collect();
        let per_row = rng.next_u64().is_multiple_of(2) || batch == 1;
        let sampler = if per_row {
            Sampler::per_row(configs.clone()).unwrap()
        } else {
            Sampler::new(configs[0].clone()).unwrap()
        };
        let configs = if per_row { configs } else { vec![configs[0].clone(); batch] };
        let (filtered, tokens) = on(device, || {
            let l = Array::from_slice(&vals, &[batch, vocab]).unwrap().astype(dtype).unwrap();
            let h = Array::from_slice(&hist, &[batch, hist_len]).unwrap();
            let f = sampler.filtered_logits(&l, Some(&h)).unwrap().to_f64_vec().unwrap();
            let t = sampler.sample(&l, Some(&h), case as u64).unwrap();
            assert_eq!(t.dtype(), DType::I64);
            (f, t.to_vec::<i64>().unwrap())
        });
        let rounded = Array::from_slice(&vals, &[batch, vocab]).unwrap().astype(dtype).unwrap().to_f64_vec().unwrap();
        for r in 0..batch {
            let c = &configs[r];
            let what = format!("case {case} row {r}: {dtype} vocab {vocab} {c:?}");
            let row = &rounded[r * vocab..(r + 1) * vocab];
            let (want, d) = reference_row(row, &hist[r * hist_len..(r + 1) * hist_len], c);
            let got = &filtered[r * vocab..(r + 1) * vocab];
            for i in 0..vocab {
                let kept = got[i] != f64::NEG_INFINITY;
                if !d.either[i] {
                    assert_eq!(kept, d.keep[i], "{what}: token {i} ({} vs reference {})", got[i], want[i]);
                }
                if kept && d.keep[i] {
                    let e = (got[i] - want[i]).abs();
                    assert!(e <= 1e-5 * (1.0 + want[i].abs()), "{what}: token {i}: {} vs {}", got[i], want[i]);
                }
            }
            let t = tokens[r] as usize;
            if c.temperature == 0.0 {
                let first_max = (0..vocab).fold(0, |b, i| if want[i] > want[b] { i } else { b });
                assert_eq!(t, first_max, "{what}: greedy token");
            } else {
                assert!(d.keep[t] || d.either[t], "{what}: drew ineligible token {t}");
            }
        }
    }
}

/// A configuration with each filter on or off at random (greedy about one row in six).
pub fn random_config(rng: &mut Rng, vocab: usize) -> SamplerConfig {
    let mut on = |p: u64| rng.next_u64() % 100 < p;
    let (g, k, p, m, r) = (on(16), on(50), on(50), on(40), on(50));
    let temperature = if g { 0.0 } else { rng.uniform(0.3, 1.8) as f32 };
    let top_k = if k { Some(1 + (rng.next_u64() % (vocab as u64 + 5)) as usize) } else { None };
    let top_p = if p { Some(rng.uniform(0.05, 1.0) as f32) } else { None };
    let min_p = if m { Some(rng.uniform(0.0, 0.3) as f32) } else { None };
    let repetition_penalty = if r { Some(rng.uniform(0.5, 2.0) as f32) } else { None };
    SamplerConfig { temperature, top_k, top_p, min_p, repetition_penalty, seed: rng.next_u64() }
}

/// The sampler's draws over many steps follow the softmax of its filtered logits (a
/// chi-square bound); the same seed and step give the same tokens; a row of a batch
/// draws as the same request alone.
pub fn sampler_draws(device: Device) {
    let vocab = 12;
    let logits: Vec<f64> = (0..vocab).map(|i| ((i * 7) % 5) as f64 * 0.4 - (i as f64) * 0.05).collect();
    let config = SamplerConfig { temperature: 0.8, top_k: Some(8), top_p: Some(0.9), ..SamplerConfig::default() };
    let rows = 400;
    let sampler = Sampler::new(config.clone()).unwrap();
    let (probs, counts, again) = on(device, || {
        let l = Array::from_slice(&logits, &[1, vocab]).unwrap().broadcast_to(&[rows, vocab]).unwrap();
        let f = sampler.filtered_logits(&l, None).unwrap().to_f64_vec().unwrap();
        let mut counts = vec![0usize; vocab];
        let mut first = Vec::new();
        for step in 0..5 {
            let t = sampler.sample(&l, None, step).unwrap().to_vec::<i64>().unwrap();
            for &x in &t {
                counts[x as usize] += 1;
            }
            if step == 0 {
                first = t;
            }
        }
        let again = sampler.sample(&l, None, 0).unwrap().to_vec::<i64>().unwrap();
        assert_eq!(first, again, "same seed and step, other tokens");
        (softmax(&f[..vocab]), counts, first)
    });
    let (stat, df) = chi_square(&counts, &probs);
    assert!(stat < chi_bound(df), "chi-square {stat} over {df} degrees");
    // Row r of the batch (seed + r) is the request alone with that seed.
    for r in [0usize, 1, 17, 399] {
        let alone = Sampler::new(SamplerConfig { seed: config.seed + r as u64, ..config.clone() }).unwrap();
        let t = on(device, || {
            let l = Array::from_slice(&logits, &[1, vocab]).unwrap();
            alone.sample(&l, None, 0).unwrap().to_vec::<i64>().unwrap()
        });
        assert_eq!(t[0], again[r], "row {r}");
    }
    // Presence masks: from ids, and one step on.
    let (m, m2) = on(device, || {
        let h = Array::from_slice(&[3i64, 3, -1, 0, 5, 2], &[2, 3]).unwrap();
        let m = presence_mask(&h, 6).unwrap();
        let m2 = add_to_presence(&m, &Array::from_slice(&[1i64, 2], &[2]).unwrap()).unwrap();
        (m.to_bool_vec().unwrap(), m2.to_bool_vec().unwrap())
    });
    let want = [false, false, false, true, false, false, true, false, true, false, false, true];
    assert_eq!(m, want);
    let mut want2 = want;
    want2[1] = true;
    want2[8] = true;
    assert_eq!(m2, want2);
}

/// A compiled decode step taking the step's uniforms as an input gives the eager
/// sampler's tokens at every step (the draws change with the step, not with the trace).
pub fn compiled_step_matches_eager(device: Device) {
    let (batch, vocab) = (3, 500);
    let mut rng = Rng::new(21);
    let logits: Vec<f64> = (0..batch * vocab).map(|_| rng.uniform(-4.0, 4.0)).collect();
    let configs = vec![
        SamplerConfig { temperature: 0.9, top_k: Some(40), top_p: Some(0.8), seed: 1, ..SamplerConfig::default() },
        SamplerConfig { temperature: 1.2, top_p: Some(0.95), min_p: Some(0.05), seed: 2, ..SamplerConfig::default() },
        SamplerConfig::greedy(),
    ];
    let sampler = Sampler::per_row(configs).unwrap();
    let traced = sampler.clone();
    let step = rill::compile(move |x: &[Array]| Ok(vec![traced.sample_with(&x[0], None, &x[1])?]));
    on(device, || {
        let l = Array::from_slice(&logits, &[batch, vocab]).unwrap().astype(DType::BF16).unwrap();
        let mut seen = std::collections::HashSet::new();
        for s in 0..6 {
            let u = sampler.uniforms(&device, batch, vocab, s).unwrap();
            let got = step.call(&[l.clone(), u]).unwrap()[0].to_vec::<i64>().unwrap();
            let want = sampler.sample(&l, None, s).unwrap().to_vec::<i64>().unwrap();
            assert_eq!(got, want, "step {s}");
            seen.insert(got[..2].to_vec());
        }
        assert!(seen.len() > 1, "every step drew the same tokens");
    });
}
