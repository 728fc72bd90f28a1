//! Generated cases of `scaled_dot_product_attention` and their float64 reference
//! (`softmax(q kᵀ · scale + mask) v` written out plainly), shared by `ops_attention.rs`
//! (CPU) and `gpu_attention.rs` (GPU).
#![allow(dead_code)]

use crate::common::{Rng, assert_close};
use rill::{Array, AttentionMask, DType};

/// The mask of a case.
#[derive(Clone, Debug)]
pub enum MaskCase {
    None,
    Causal,
    /// A bool mask of this shape (some rows all false).
    Bool(Vec<usize>),
    /// An additive mask of this shape and dtype (some entries and rows -inf).
    Add(Vec<usize>, DType),
}

/// `[q, k, v]`, their values, and the mask with its additive values.
pub type Inputs = (Vec<Array>, Vec<Vec<f64>>, Option<(Array, Vec<f64>)>);

/// One attention call.
#[derive(Clone, Debug)]
pub struct Case {
    pub batch: Vec<usize>,
    pub hq: usize,
    pub hkv: usize,
    pub tq: usize,
    pub tk: usize,
    pub d: usize,
    pub dv: usize,
    pub dtype: DType,
    pub mask: MaskCase,
    pub scale: Option<f64>,
    /// q, k, v built as `[..., T, H, D]` and transposed to `[..., H, T, D]` (strided views).
    pub transposed: bool,
}

fn pick<T: Copy>(rng: &mut Rng, xs: &[T]) -> T {
    xs[(rng.next_u64() % xs.len() as u64) as usize]
}

/// A broadcastable mask shape for the scores `[batch..., hq, tq, tk]`: some axes 1, some
/// leading axes dropped (always including the padding shape `[B, 1, 1, Tk]` style).
fn mask_shape(rng: &mut Rng, scores: &[usize]) -> Vec<usize> {
    let drop = (rng.next_u64() % (scores.len() as u64 - 1)) as usize;
    scores[drop..].iter().map(|&s| if rng.next_u64().is_multiple_of(3) { 1 } else { s }).collect()
}

/// For a mask of `n` values in rows of `tk` keys, how many leading keys each row attends
/// when it is shaped like a cache's (the written positions).
fn prefix_lens(rng: &mut Rng, n: usize, tk: usize) -> Vec<usize> {
    (0..n / tk.max(1)).map(|_| (rng.next_u64() % (tk as u64 + 1)) as usize).collect()
}

/// One of the four mask kinds for these scores (an additive mask in f32 or `dtype`).
fn random_mask(rng: &mut Rng, scores: &[usize], dtype: DType) -> MaskCase {
    match rng.next_u64() % 4 {
        0 => MaskCase::None,
        1 => MaskCase::Causal,
        2 => MaskCase::Bool(mask_shape(rng, scores)),
        _ => MaskCase::Add(mask_shape(rng, scores), pick(rng, &[DType::F32, dtype])),
    }
}

impl Case {
    /// A random case; `big` picks the sizes of the GPU's fast paths (D 64/128, several
    /// key tiles).
    pub fn random(rng: &mut Rng, dtypes: &[DType], big: bool) -> Case {
        let nb = (rng.next_u64() % 3) as usize;
        let batch: Vec<usize> = (0..nb).map(|_| 1 + (rng.next_u64() % 2) as usize).collect();
        let hkv = 1 + (rng.next_u64() % 2) as usize;
        let hq = hkv * pick(rng, &[1, 2, 3]);
        let (d, dv, tq, tk) = if big {
            let d = pick(rng, &[64, 128, 64, 128, 80, 16, 8]);
            let dv = if rng.next_u64().is_multiple_of(4) { pick(rng, &[16, 64, 32]) } else { d };
            let tk = 1 + (rng.next_u64() % 300) as usize;
            let tq = if rng.next_u64().is_multiple_of(3) {
                1 + (rng.next_u64() % 8) as usize
            } else {
                1 + (rng.next_u64() % 200) as usize
            };
            (d, dv, tq, tk)
        } else {
            let d = pick(rng, &[1, 8, 64, 80, 128]);
            let dv = if rng.next_u64().is_multiple_of(4) { pick(rng, &[1, 8, 24]) } else { d };
            (d, dv, 1 + (rng.next_u64() % 40) as usize, 1 + (rng.next_u64() % 150) as usize)
        };
        let dtype = pick(rng, dtypes);
        let scores: Vec<usize> = batch.iter().copied().chain([hq, tq, tk]).collect();
        let mask = random_mask(rng, &scores, dtype);
        let scale = if rng.next_u64().is_multiple_of(4) { Some(0.3) } else { None };
        Case { batch, hq, hkv, tq, tk, d, dv, dtype, mask, scale, transposed: rng.next_u64().is_multiple_of(3) }
    }

    /// A random decode case (one query row against a cache): grouped-query ratios up to
    /// 16 query heads a key/value head, caches of 1 to about 3000 keys, head sizes up to
    /// 256, every mask kind, strided inputs, and many batch rows at once.
    pub fn decode(rng: &mut Rng, dtypes: &[DType]) -> Case {
        let many = rng.next_u64().is_multiple_of(5);
        let batch: Vec<usize> = if many {
            vec![pick(rng, &[64, 33])]
        } else {
            let nb = (rng.next_u64() % 3) as usize;
            (0..nb).map(|_| 1 + (rng.next_u64() % 3) as usize).collect()
        };
        let hkv = pick(rng, &[1, 1, 2, 3]);
        let hq = hkv * pick(rng, &[1, 2, 3, 4, 8, 9, 12, 16]);
        let d = pick(rng, &[64, 128, 64, 80, 32, 256, 8]);
        let dv = if rng.next_u64().is_multiple_of(4) { pick(rng, &[8, 64, 40, 256]) } else { d };
        // Log-uniform lengths, so short caches and several key splits both come up.
        let top: f64 = if many { 120.0 } else { 3000.0 };
        let tk = top.powf(rng.uniform(0.0, 1.0)).round().max(1.0) as usize;
        let dtype = pick(rng, dtypes);
        let scores: Vec<usize> = batch.iter().copied().chain([hq, 1, tk]).collect();
        let mask = random_mask(rng, &scores, dtype);
        let scale = if rng.next_u64().is_multiple_of(4) { Some(0.3) } else { None };
        Case { batch, hq, hkv, tq: 1, tk, d, dv, dtype, mask, scale, transposed: rng.next_u64().is_multiple_of(3) }
    }

    fn shape(&self, h: usize, t: usize, d: usize) -> Vec<usize> {
        self.batch.iter().copied().chain([h, t, d]).collect()
    }

    /// The inputs (on the ambient stream's device) and their values as the reference sees
    /// them: `[q, k, v]` and the mask (as additive f64 values of its own shape).
    pub fn inputs(&self, rng: &mut Rng) -> Inputs {
        let specs = [(self.hq, self.tq, self.d), (self.hkv, self.tk, self.d), (self.hkv, self.tk, self.dv)];
        let mut arrays = Vec::new();
        let mut values = Vec::new();
        for (h, t, d) in specs {
            let shape = self.shape(h, t, d);
            let n: usize = shape.iter().product();
            let vals = rng.vec(n, -1.0, 1.0);
            let a = if self.transposed {
                let nb = self.batch.len();
                let mut built = shape.clone();
                built.swap(nb, nb + 1);
                let mut perm: Vec<usize> = (0..shape.len()).collect();
                perm.swap(nb, nb + 1);
                Array::from_slice(&vals, &built).unwrap().astype(self.dtype).unwrap().transpose(&perm).unwrap()
            } else {
                Array::from_slice(&vals, &shape).unwrap().astype(self.dtype).unwrap()
            };
            values.push(a.to_f64_vec().unwrap());
            arrays.push(a);
        }
        let mask = match &self.mask {
            MaskCase::None | MaskCase::Causal => None,
            MaskCase::Bool(shape) => {
                let n: usize = shape.iter().product();
                let tk = *shape.last().unwrap();
                let mut b: Vec<bool> = if rng.next_u64().is_multiple_of(3) {
                    // A cache's mask: each row attends a prefix of the keys (the written
                    // positions), so whole runs of keys at its end are masked out.
                    let lens = prefix_lens(rng, n, tk);
                    (0..n).map(|i| i % tk < lens[i / tk]).collect()
                } else {
                    (0..n).map(|_| rng.next_u64() % 10 < 7).collect()
                };
                // One row with every key masked out.
                if n > 0 && rng.next_u64().is_multiple_of(2) {
                    b[..tk].iter_mut().for_each(|x| *x = false);
                }
                let ones: Vec<f64> = b.iter().map(|&x| x as u8 as f64).collect();
                let a = Array::from_slice(&ones, shape).unwrap().astype(DType::Bool).unwrap();
                let add = b.iter().map(|&x| if x { 0.0 } else { f64::NEG_INFINITY }).collect();
                Some((a, add))
            }
            MaskCase::Add(shape, dt) => {
                let n: usize = shape.iter().product();
                let tk = *shape.last().unwrap();
                let prefix = rng.next_u64().is_multiple_of(3);
                let lens = prefix_lens(rng, n, tk);
                let mut v: Vec<f64> = (0..n)
                    .map(|i| {
                        let out = if prefix { i % tk >= lens[i / tk] } else { rng.next_u64().is_multiple_of(8) };
                        if out { f64::NEG_INFINITY } else { rng.uniform(-2.0, 2.0) }
                    })
                    .collect();
                if n > tk && rng.next_u64().is_multiple_of(2) {
                    v[tk..2 * tk].iter_mut().for_each(|x| *x = f64::NEG_INFINITY);
                }
                let a = Array::from_slice(&v, shape).unwrap().astype(*dt).unwrap();
                let exact = a.to_f64_vec().unwrap();
                Some((a, exact))
            }
        };
        (arrays, values, mask)
    }

    /// The rill call on these inputs.
    pub fn call(&self, x: &[Array], mask: Option<&Array>) -> rill::Result<Array> {
        let m = match (&self.mask, mask) {
            (MaskCase::Causal, _) => AttentionMask::Causal,
            (_, Some(m)) => AttentionMask::Array(m),
            (_, None) => AttentionMask::None,
        };
        rill::scaled_dot_product_attention(&x[0], &x[1], &x[2], m, self.scale)
    }

    /// The float64 reference: `softmax(q kᵀ · scale + mask) v`; a row with every key
    /// masked out is 0.
    pub fn reference(&self, v: &[Vec<f64>], mask: Option<&[f64]>) -> Vec<f64> {
        let planes: usize = self.batch.iter().product::<usize>() * self.hq;
        (0..planes)
            .flat_map(|p| (0..self.tq).map(move |i| (p, i)))
            .flat_map(|(p, i)| self.reference_row(v, mask, p, i))
            .collect()
    }

    /// The reference's output row of query `i` in the (batch, query head) plane `p`.
    pub fn reference_row(&self, v: &[Vec<f64>], mask: Option<&[f64]>, p: usize, i: usize) -> Vec<f64> {
        let (q, k, vv) = (&v[0], &v[1], &v[2]);
        let (hq, hkv, tq, tk, d, dv) = (self.hq, self.hkv, self.tq, self.tk, self.d, self.dv);
        let scale = self.scale.unwrap_or(1.0 / (d as f64).sqrt());
        let scores: Vec<usize> = self.batch.iter().copied().chain([hq, tq, tk]).collect();
        let mshape = match &self.mask {
            MaskCase::Bool(s) | MaskCase::Add(s, _) => s.clone(),
            MaskCase::None | MaskCase::Causal => Vec::new(),
        };
        // The mask element of the scores' element at multi-index `idx` (right-aligned broadcast).
        let mask_at = |idx: &[usize]| -> f64 {
            let Some(m) = mask else { return 0.0 };
            let off = idx.len() - mshape.len();
            let mut flat = 0;
            for (a, &s) in mshape.iter().enumerate() {
                flat = flat * s + if s == 1 { 0 } else { idx[off + a] };
            }
            m[flat]
        };
        let (b, h) = (p / hq, p % hq);
        let kvp = b * hkv + h / (hq / hkv);
        let mut idx: Vec<usize> = Vec::with_capacity(scores.len());
        let mut rem = p;
        for &n in scores[..scores.len() - 2].iter().rev() {
            idx.push(rem % n);
            rem /= n;
        }
        idx.reverse();
        idx.extend([i, 0]);
        let last = idx.len() - 1;
        let s: Vec<f64> = (0..tk)
            .map(|j| {
                idx[last] = j;
                let dot: f64 = (0..d).map(|c| q[(p * tq + i) * d + c] * k[(kvp * tk + j) * d + c]).sum();
                let causal_out = matches!(self.mask, MaskCase::Causal) && (j + tq > i + tk);
                if causal_out { f64::NEG_INFINITY } else { dot * scale + mask_at(&idx) }
            })
            .collect();
        let m = s.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        if m == f64::NEG_INFINITY {
            return vec![0.0; dv]; // every key masked out: the row is 0
        }
        let e: Vec<f64> = s.iter().map(|&x| (x - m).exp()).collect();
        let sum: f64 = e.iter().sum();
        (0..dv).map(|c| (0..tk).map(|j| e[j] * vv[(kvp * tk + j) * dv + c]).sum::<f64>() / sum).collect()
    }
}

/// The tolerance of a dtype's result against the reference (absolute, relative to 1 +
/// |value|; outputs are averages of values in [-1, 1]).
pub fn tolerance(d: DType) -> f64 {
    match d {
        DType::F64 => 1e-11,
        DType::F32 => 3e-5,
        DType::F16 => 3e-3,
        _ => 2e-2,
    }
}

/// Runs `case` on the ambient device and checks it against [`Case::reference`].
pub fn check(case: &Case, rng: &mut Rng, what: &str) {
    let (x, vals, mask) = case.inputs(rng);
    let got = case.call(&x, mask.as_ref().map(|m| &m.0)).unwrap();
    assert_eq!(got.dtype(), case.dtype);
    let want = case.reference(&vals, mask.as_ref().map(|m| m.1.as_slice()));
    assert_close(&got.to_f64_vec().unwrap(), &want, tolerance(case.dtype), &format!("{what}: {case:?}"));
}

/// Runs `case` on the ambient device and checks `samples` random output rows (and the
/// first and last) against [`Case::reference_row`]: for cases too large for the whole
/// float64 reference.
pub fn check_rows(case: &Case, rng: &mut Rng, samples: usize, what: &str) {
    let (x, vals, mask) = case.inputs(rng);
    let got = case.call(&x, mask.as_ref().map(|m| &m.0)).unwrap().to_f64_vec().unwrap();
    let (planes, tq) = (case.batch.iter().product::<usize>() * case.hq, case.tq);
    let mut rows = vec![(0, 0), (planes - 1, tq - 1)];
    rows.extend(
        (0..samples).map(|_| ((rng.next_u64() % planes as u64) as usize, (rng.next_u64() % tq as u64) as usize)),
    );
    for (p, i) in rows {
        let want = case.reference_row(&vals, mask.as_ref().map(|m| m.1.as_slice()), p, i);
        let at = (p * tq + i) * case.dv;
        assert_close(
            &got[at..at + case.dv],
            &want,
            tolerance(case.dtype),
            &format!("{what}: plane {p} row {i}: {case:?}"),
        );
    }
}
