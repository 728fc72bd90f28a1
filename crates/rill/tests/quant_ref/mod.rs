//! Generated cases of `rill::quant::qmatmul` and their float64 reference, shared by
//! `quant_matmul.rs` (CPU) and `gpu_quant.rs` (GPU): the weight is quantized on the host
//! (`rill::quant::quantize`), the reference dequantizes those bytes on the host
//! (`rill::quant::dequantize`) and multiplies in f64, so a kernel that reads the blocks
//! wrongly cannot agree with it.
#![allow(dead_code)]

use crate::common::Rng;
use rill::io::gguf::{GgmlType, Gguf};
use rill::quant::{self, BLOCK, QMatrix, QuantFormat};
use rill::{Array, DType, Stream};

/// One product: `x [batch.., M, K] @ wᵀ` with `w [N, K]` in `format`.
#[derive(Clone, Debug)]
pub struct Case {
    pub format: QuantFormat,
    pub batch: Vec<usize>,
    pub m: usize,
    pub n: usize,
    pub k: usize,
    pub dtype: DType,
    /// `x` made as its transpose and viewed back (a strided operand).
    pub strided: bool,
}

impl Case {
    /// A random case: `M` in `1..=max_m`, `N` up to `max_n` (often odd), `K` 32 times an
    /// odd number, up to two batch axes.
    pub fn random(rng: &mut Rng, format: QuantFormat, max_m: usize, max_n: usize) -> Case {
        let pick = |rng: &mut Rng, n: usize| (rng.next_u64() % n as u64) as usize;
        let nb = pick(rng, 3);
        let batch: Vec<usize> = (0..nb).map(|_| 1 + pick(rng, 3)).collect();
        let m = 1 + pick(rng, max_m);
        let n = (1 + pick(rng, max_n)) | 1;
        let k = BLOCK * (2 * pick(rng, 5) + 1);
        let dtype = [DType::F32, DType::BF16, DType::F16][pick(rng, 3)];
        Case { format, batch, m, n, k, dtype, strided: pick(rng, 3) == 0 }
    }

    pub fn x_shape(&self) -> Vec<usize> {
        self.batch.iter().copied().chain([self.m, self.k]).collect()
    }

    /// The weight's f32 values `[N, K]` (blocks of varied scale and offset) and their
    /// packed bytes.
    pub fn weight(&self, rng: &mut Rng) -> (Vec<f32>, Vec<u8>) {
        let mut w = Vec::with_capacity(self.n * self.k);
        for _ in 0..self.n * self.k / BLOCK {
            let (scale, shift) = (rng.uniform(0.05, 2.0), rng.uniform(-0.5, 0.5));
            w.extend((0..BLOCK).map(|_| (rng.uniform(-1.0, 1.0) * scale + shift) as f32));
        }
        let bytes = quant::quantize(self.format, &w).unwrap();
        (w, bytes)
    }

    /// `x` (on the ambient device) and its values as the kernel sees them, row-major.
    pub fn x(&self, rng: &mut Rng) -> (Array, Vec<f64>) {
        let shape = self.x_shape();
        let n: usize = shape.iter().product();
        let vals = rng.vec(n, -1.0, 1.0);
        let x = if self.strided {
            // The same values laid out with the last two axes swapped, then viewed back.
            let r = shape.len();
            let mut tshape = shape.clone();
            tshape.swap(r - 1, r - 2);
            let mut t = vec![0.0; n];
            let (m, k) = (self.m, self.k);
            for (i, v) in vals.iter().enumerate() {
                let (b, mi, ki) = (i / (m * k), (i / k) % m, i % k);
                t[b * m * k + ki * m + mi] = *v;
            }
            let mut perm: Vec<usize> = (0..r).collect();
            perm.swap(r - 1, r - 2);
            Array::from_slice(&t, &tshape).unwrap().astype(self.dtype).unwrap().transpose(&perm).unwrap()
        } else {
            Array::from_slice(&vals, &shape).unwrap().astype(self.dtype).unwrap()
        };
        let exact = x.to_f64_vec().unwrap();
        (x, exact)
    }

    pub fn matrix(&self, bytes: &[u8], stream: &Stream) -> QMatrix {
        QMatrix::from_bytes(self.format, self.n, self.k, bytes, stream).unwrap()
    }
}

/// `x @ wᵀ` in f64 from the host's dequantization of `bytes`, and for each output the sum
/// of `|x·w|` (the scale of its rounding error).
pub fn reference(format: QuantFormat, x: &[f64], bytes: &[u8], n: usize, k: usize) -> (Vec<f64>, Vec<f64>) {
    let mut w = vec![0f32; n * k];
    quant::dequantize(format, bytes, &mut w).unwrap();
    let rows = x.len() / k.max(1);
    let (mut out, mut mag) = (vec![0.0; rows * n], vec![0.0; rows * n]);
    for r in 0..rows {
        let xr = &x[r * k..(r + 1) * k];
        for j in 0..n {
            let wr = &w[j * k..(j + 1) * k];
            let (mut s, mut a) = (0.0, 0.0);
            for (xv, wv) in xr.iter().zip(wr) {
                s += xv * *wv as f64;
                a += (xv * *wv as f64).abs();
            }
            out[r * n + j] = s;
            mag[r * n + j] = a;
        }
    }
    (out, mag)
}

/// Relative error allowed against the sum of `|x·w|`: f32 accumulation, then the output's
/// rounding to its dtype.
pub fn tolerance(d: DType) -> f64 {
    match d {
        DType::F32 => 2e-5,
        DType::F16 => 1.5e-3,
        DType::BF16 => 1e-2,
        _ => 0.0,
    }
}

/// Asserts `got` within tolerance of `want` (scaled by `mag`, with a floor).
pub fn check(got: &[f64], want: &[f64], mag: &[f64], d: DType, what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    let tol = tolerance(d);
    for (i, ((g, w), a)) in got.iter().zip(want).zip(mag).enumerate() {
        let err = (g - w).abs();
        assert!(err <= tol * (a + 1e-3), "{what}: element {i}: got {g}, want {w} (err {err:e}, |x||w| {a:e})");
    }
}

/// Runs one case on the ambient stream and checks it.
pub fn run_case(case: &Case, rng: &mut Rng, stream: &Stream, what: &str) {
    let (_, bytes) = case.weight(rng);
    let w = case.matrix(&bytes, stream);
    let (x, xv) = case.x(rng);
    let y = quant::qmatmul(&x, &w).unwrap();
    let mut want_shape = case.x_shape();
    *want_shape.last_mut().unwrap() = case.n;
    assert_eq!(y.shape(), want_shape.as_slice(), "{what}: {case:?}");
    assert_eq!(y.dtype(), case.dtype, "{what}: {case:?}");
    let (want, mag) = reference(case.format, &xv, &bytes, case.n, case.k);
    check(&y.to_f64_vec().unwrap(), &want, &mag, case.dtype, &format!("{what}: {case:?}"));
}

/// The real model's first Q4_1 matrix and its Q8_0 token embedding, each loaded on
/// `stream` and multiplied by random `x` of each `(rows, dtype)` in `products` (on the
/// ambient device), against the float64 product of the file's own dequantized values;
/// then rows of each through `rows_of`.
pub fn real_model_products(file: &Gguf, stream: &Stream, rng: &mut Rng, products: &[(usize, DType)]) {
    let q41 = file
        .tensors()
        .iter()
        .find(|t| t.ggml_type() == GgmlType::Quant(QuantFormat::Q4_1) && t.shape().len() == 2)
        .expect("a Q4_1 matrix")
        .name()
        .to_string();
    for name in [q41.as_str(), "token_embd.weight"] {
        let w = QMatrix::from_gguf(file, name, stream).unwrap();
        let t = file.tensor(name).unwrap();
        assert_eq!(w.shape(), [t.shape()[0], t.shape()[1]], "{name}");
        assert_eq!(w.nbytes(), t.nbytes(), "{name}");
        let (n, k) = (w.rows(), w.cols());
        let host = file.to_f32(name).unwrap();
        assert_eq!(w.dequantize(DType::F32).unwrap().to_vec::<f32>().unwrap(), host, "{name}");
        for &(m, d) in products {
            let vals = rng.vec(m * k, -1.0, 1.0);
            let x = Array::from_slice(&vals, &[m, k]).unwrap().astype(d).unwrap();
            let xv = x.to_f64_vec().unwrap();
            let got = quant::qmatmul(&x, &w).unwrap().to_f64_vec().unwrap();
            let (mut want, mut mag) = (vec![0.0; m * n], vec![0.0; m * n]);
            for r in 0..m {
                for j in 0..n {
                    let (mut acc, mut a) = (0.0, 0.0);
                    for c in 0..k {
                        let p = xv[r * k + c] * host[j * k + c] as f64;
                        acc += p;
                        a += p.abs();
                    }
                    want[r * n + j] = acc;
                    mag[r * n + j] = a;
                }
            }
            check(&got, &want, &mag, d, &format!("{name} m={m}"));
        }
        let ids = [0usize, n / 3, n - 1];
        let idx = Array::from_slice(&ids.map(|i| i as i32), &[3]).unwrap();
        let rows = w.rows_of(&idx, DType::F32).unwrap().to_vec::<f32>().unwrap();
        let want: Vec<f32> = ids.iter().flat_map(|&i| host[i * k..(i + 1) * k].to_vec()).collect();
        assert_eq!(rows, want, "{name} rows");
    }
}
