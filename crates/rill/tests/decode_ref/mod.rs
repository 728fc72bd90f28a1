//! Float64 references and generated cases for `rope` and `slice_update`, shared by
//! `model_llama.rs` (CPU) and `gpu_llama.rs`.
#![allow(dead_code)]

use crate::common::{Rng, array_of};
use rill::{Array, DType, RopeLayout, RopeOptions};

/// One generated rope case.
#[derive(Debug, Clone)]
pub struct RopeCase {
    pub shape: Vec<usize>,
    pub dims: usize,
    pub base: f64,
    pub scale: f64,
    pub layout: RopeLayout,
    pub dtype: DType,
    pub offset_dtype: DType,
    /// One offset, or one per leading row.
    pub offsets: Vec<i64>,
    pub per_row: bool,
    /// The input is a transposed (strided) view.
    pub transposed: bool,
}

impl RopeCase {
    pub fn random(rng: &mut Rng, dtypes: &[DType]) -> RopeCase {
        let pick = |rng: &mut Rng, n: usize| (rng.next_u64() % n as u64) as usize;
        let rank = 2 + pick(rng, 3);
        let d = 2 * (1 + pick(rng, 40));
        let mut shape: Vec<usize> = (0..rank - 2).map(|_| 1 + pick(rng, 4)).collect();
        shape.push(1 + pick(rng, 9));
        shape.push(d);
        let dims = if rng.uniform(0.0, 1.0) < 0.7 { d } else { 2 * (1 + pick(rng, d / 2)) };
        let per_row = rank >= 3 && rng.uniform(0.0, 1.0) < 0.5;
        let n_off = if per_row { shape[0] } else { 1 };
        let offsets = (0..n_off).map(|_| pick(rng, 9000) as i64).collect();
        RopeCase {
            shape,
            dims,
            base: [10000.0, 100000.0, 500000.0][pick(rng, 3)],
            scale: if rng.uniform(0.0, 1.0) < 0.8 { 1.0 } else { 0.25 },
            layout: if pick(rng, 2) == 0 { RopeLayout::Interleaved } else { RopeLayout::Halves },
            dtype: dtypes[pick(rng, dtypes.len())],
            offset_dtype: [DType::I32, DType::I64, DType::U32][pick(rng, 3)],
            offsets,
            per_row,
            transposed: rank >= 3 && rng.uniform(0.0, 1.0) < 0.3,
        }
    }

    pub fn options(&self) -> RopeOptions {
        RopeOptions { dims: self.dims, base: self.base, scale: self.scale, layout: self.layout }
    }

    /// The input (of `dtype`), its values as the reference sees them, and the offset.
    pub fn inputs(&self, rng: &mut Rng) -> (Array, Vec<f64>, Array) {
        let n: usize = self.shape.iter().product();
        let vals = rng.vec(n, -2.0, 2.0);
        let (x, exact) = if self.transposed {
            // Built as [s1, s0, ...] and swapped: same logical values, strided layout.
            let mut sw = self.shape.clone();
            sw.swap(0, 1);
            let (a, _) = array_of(&vals, &sw, self.dtype);
            let x = a.swapaxes(0, 1).unwrap();
            let e = x.to_f64_vec().unwrap();
            (x, e)
        } else {
            array_of(&vals, &self.shape, self.dtype)
        };
        let off_shape: Vec<usize> = if self.per_row { vec![self.shape[0]] } else { vec![] };
        let off = Array::from_slice(&self.offsets, &off_shape).unwrap().astype(self.offset_dtype).unwrap();
        (x, exact, off)
    }

    /// The float64 reference, written in the two textbook forms: explicit pairs for the
    /// interleaved layout, `x * cos + rotate_half(x) * sin` for halves.
    pub fn reference(&self, x: &[f64]) -> Vec<f64> {
        let r = self.shape.len();
        let (t, d) = (self.shape[r - 2], self.shape[r - 1]);
        let rows = x.len() / (t * d);
        let per = rows / self.shape[0];
        let half = self.dims / 2;
        let mut out = x.to_vec();
        for row in 0..rows {
            let off = if self.per_row { self.offsets[row / per] } else { self.offsets[0] };
            for tt in 0..t {
                let p = (off + tt as i64) as f64 * self.scale;
                let base = (row * t + tt) * d;
                let v = &x[base..base + d];
                for i in 0..half {
                    let inv_freq = 1.0 / self.base.powf((2 * i) as f64 / self.dims as f64);
                    let (s, c) = (p * inv_freq).sin_cos();
                    match self.layout {
                        RopeLayout::Interleaved => {
                            out[base + 2 * i] = v[2 * i] * c - v[2 * i + 1] * s;
                            out[base + 2 * i + 1] = v[2 * i] * s + v[2 * i + 1] * c;
                        }
                        RopeLayout::Halves => {
                            // rotate_half(x) = [-x2, x1]
                            out[base + i] = v[i] * c + (-v[i + half]) * s;
                            out[base + i + half] = v[i + half] * c + v[i] * s;
                        }
                    }
                }
            }
        }
        out
    }
}

/// Tolerance of a rope result: one rounding of the dtype on values of magnitude <= ~3
/// (f64: angles up to ~9000 radians computed in another order).
pub fn rope_tolerance(d: DType) -> f64 {
    match d {
        DType::F64 => 1e-10,
        DType::F32 => 1e-6,
        DType::F16 => 1e-3,
        _ => 8e-3,
    }
}

/// One generated slice_update case.
#[derive(Debug, Clone)]
pub struct UpdateCase {
    pub shape: Vec<usize>,
    pub axis: usize,
    pub len: usize,
    pub starts: Vec<i64>,
    pub per_row: bool,
    pub dtype: DType,
    pub start_dtype: DType,
}

impl UpdateCase {
    pub fn random(rng: &mut Rng, dtypes: &[DType]) -> UpdateCase {
        let pick = |rng: &mut Rng, n: usize| (rng.next_u64() % n as u64) as usize;
        let rank = 1 + pick(rng, 4);
        let shape: Vec<usize> = (0..rank).map(|_| 1 + pick(rng, 7)).collect();
        let axis = pick(rng, rank);
        let len = pick(rng, shape[axis] + 1);
        let per_row = axis >= 1 && rng.uniform(0.0, 1.0) < 0.5;
        let n = if per_row { shape[0] } else { 1 };
        // Some starts out of range on purpose: they are clamped.
        let starts = (0..n).map(|_| pick(rng, shape[axis] + 4) as i64 - 2).collect();
        UpdateCase {
            shape,
            axis,
            len,
            starts,
            per_row,
            dtype: dtypes[pick(rng, dtypes.len())],
            start_dtype: [DType::I32, DType::I64][pick(rng, 2)],
        }
    }

    pub fn update_shape(&self) -> Vec<usize> {
        let mut u = self.shape.clone();
        u[self.axis] = self.len;
        u
    }

    /// x, update, start arrays and the values of x and update.
    pub fn inputs(&self, rng: &mut Rng) -> (Array, Array, Array, Vec<f64>, Vec<f64>) {
        let n: usize = self.shape.iter().product();
        let us = self.update_shape();
        let m: usize = us.iter().product();
        let round = |v: Vec<f64>| v.into_iter().map(|x| (x * 8.0).round()).collect::<Vec<_>>();
        let (x, xv) = array_of(&round(rng.vec(n, -10.0, 10.0)), &self.shape, self.dtype);
        let (u, uv) = array_of(&round(rng.vec(m, -10.0, 10.0)), &us, self.dtype);
        let sshape: Vec<usize> = if self.per_row { vec![self.shape[0]] } else { vec![] };
        let s = Array::from_slice(&self.starts, &sshape).unwrap().astype(self.start_dtype).unwrap();
        (x, u, s, xv, uv)
    }

    pub fn reference(&self, x: &[f64], u: &[f64]) -> Vec<f64> {
        let mut out = x.to_vec();
        let dim = self.shape[self.axis];
        let inner: usize = self.shape[self.axis + 1..].iter().product();
        let outer: usize = self.shape[..self.axis].iter().product();
        let per = if self.per_row { outer / self.shape[0] } else { outer.max(1) };
        for o in 0..outer {
            let s = if self.per_row { self.starts[o / per] } else { self.starts[0] };
            let s = s.clamp(0, (dim - self.len) as i64) as usize;
            for j in 0..self.len {
                for c in 0..inner {
                    out[(o * dim + s + j) * inner + c] = u[(o * self.len + j) * inner + c];
                }
            }
        }
        out
    }
}
