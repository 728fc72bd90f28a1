//! `rill::quant` on arrays, on the CPU: `qmatmul` against dequantize-then-matmul in
//! float64 for every format on generated shapes (M from 1, odd N, K = 32 · odd, batch
//! axes, f32/bf16/f16 and strided x), under `compile` and `compile_shapeless`; the
//! `Dequantize` kernel and `QMatrix::quantize` against the host block math; `from_gguf`
//! on a written GGUF file and on the default language model (a Q4_1 weight and the Q8_0
//! token embedding; skipped, saying so, when the model cannot be fetched); the errors.

mod common;
mod quant_ref;

use common::Rng;
use quant_ref::{Case, check, real_model_products, reference, run_case};
use rill::io::gguf::{self, GgmlType, Gguf};
use rill::quant::{self, BLOCK, QMatrix, QuantFormat, qmatmul};
use rill::{Array, DType, Device, Error};

fn cpu() -> rill::Stream {
    Device::cpu().default_stream().unwrap()
}

#[test]
fn qmatmul_matches_dequantize_then_matmul_in_f64() {
    let s = cpu();
    let mut rng = Rng::new(27);
    for f in QuantFormat::ALL {
        for i in 0..40 {
            let case = Case::random(&mut rng, f, 17, 45);
            run_case(&case, &mut rng, &s, &format!("case {i}"));
        }
    }
}

/// Prefill-sized products (several pieces of output rows, the weight walked in tiles;
/// from 160 rows dequantized panels and `gemm`), decode of a long row, and empty dot
/// products (K = 0: zeros).
#[test]
fn prefill_and_long_rows_match() {
    let s = cpu();
    let mut rng = Rng::new(5);
    for (f, m, n, k) in [
        (QuantFormat::Q4_1, 67, 95, 160),
        (QuantFormat::Q8_0, 130, 33, 96),
        (QuantFormat::Q4_0, 171, 45, 224),
        (QuantFormat::Q4_1, 260, 19, 1568),
        (QuantFormat::Q4_0, 1, 37, 1568),
        (QuantFormat::Q8_0, 2, 130, 544),
    ] {
        for dtype in [DType::F32, DType::BF16] {
            let case = Case { format: f, batch: vec![], m, n, k, dtype, strided: false };
            run_case(&case, &mut rng, &s, "prefill");
        }
    }
    for (f, m) in [(QuantFormat::Q4_1, 40), (QuantFormat::Q4_0, 3)] {
        let w = QMatrix::from_bytes(f, 5, 0, &[], &s).unwrap();
        let y = qmatmul(&Array::zeros(&[m, 0], DType::F32).unwrap(), &w).unwrap();
        assert_eq!(y.shape(), &[m, 5]);
        assert!(y.to_f64_vec().unwrap().iter().all(|&v| v == 0.0));
    }
}

#[test]
fn dequantize_and_quantize_equal_the_host_block_math() {
    let s = cpu();
    let mut rng = Rng::new(11);
    for f in QuantFormat::ALL {
        let case = Case::random(&mut rng, f, 4, 31);
        let (w, bytes) = case.weight(&mut rng);
        let q = case.matrix(&bytes, &s);
        assert_eq!(q.shape(), [case.n, case.k]);
        assert_eq!(q.data().shape(), [case.n, case.k / BLOCK * f.block_bytes()]);
        let mut host = vec![0f32; case.n * case.k];
        quant::dequantize(f, &bytes, &mut host).unwrap();
        assert_eq!(q.dequantize(DType::F32).unwrap().to_vec::<f32>().unwrap(), host, "{f:?}");
        for d in [DType::BF16, DType::F16] {
            let want = Array::from_slice(&host, &[case.n, case.k]).unwrap().astype(d).unwrap().to_f64_vec().unwrap();
            assert_eq!(q.dequantize(d).unwrap().to_f64_vec().unwrap(), want, "{f:?} {d}");
        }
        // Quantizing an array gives the host's bytes, from f32 and from bf16 alike.
        let wa = Array::from_slice(&w, &[case.n, case.k]).unwrap();
        assert_eq!(QMatrix::quantize(&wa, f).unwrap().data().to_vec::<u8>().unwrap(), bytes, "{f:?}");
        let wb = wa.astype(DType::BF16).unwrap();
        let wb_vals: Vec<f32> = wb.astype(DType::F32).unwrap().to_vec().unwrap();
        let qb = QMatrix::quantize(&wb, f).unwrap();
        assert_eq!(qb.data().to_vec::<u8>().unwrap(), quant::quantize(f, &wb_vals).unwrap(), "{f:?} bf16");
        // Rows picked by index: an embedding lookup reads only those rows.
        let ids = [case.n - 1, 0, case.n / 2];
        let idx = Array::from_slice(&ids.map(|i| i as i64), &[3]).unwrap();
        let got = q.rows_of(&idx, DType::F32).unwrap();
        assert_eq!(got.shape(), [3, case.k]);
        let want: Vec<f32> = ids.iter().flat_map(|&i| host[i * case.k..(i + 1) * case.k].to_vec()).collect();
        assert_eq!(got.to_vec::<f32>().unwrap(), want, "{f:?} rows_of");
    }
}

#[test]
fn compiled_and_shapeless_replays_match_eager() {
    let s = cpu();
    let mut rng = Rng::new(3);
    for f in QuantFormat::ALL {
        let case = Case { format: f, batch: vec![], m: 3, n: 21, k: 96, dtype: DType::F32, strided: false };
        let (_, bytes) = case.weight(&mut rng);
        let w = case.matrix(&bytes, &s);
        let (w1, w2) = (w.clone(), w.clone());
        let traced = rill::compile(move |x: &[Array]| Ok(vec![qmatmul(&x[0], &w1)?.mul(2.0)?.add(1.0)?]));
        let shapeless = rill::compile_shapeless(move |x: &[Array]| Ok(vec![qmatmul(&x[0], &w2)?.tanh()?]));
        for m in [3, 1, 9] {
            let c = Case { m, ..case.clone() };
            let (x, xv) = c.x(&mut rng);
            let (want, mag) = reference(f, &xv, &bytes, c.n, c.k);
            let got = traced.call(std::slice::from_ref(&x)).unwrap().remove(0).to_f64_vec().unwrap();
            let back: Vec<f64> = got.iter().map(|v| (v - 1.0) / 2.0).collect();
            check(&back, &want, &mag, DType::F32, &format!("compile {f:?} m={m}"));
            let eager = qmatmul(&x, &w).unwrap().tanh().unwrap().to_f64_vec().unwrap();
            let sl = shapeless.call(std::slice::from_ref(&x)).unwrap().remove(0).to_f64_vec().unwrap();
            assert!(common::same_values(&sl, &eager), "shapeless {f:?} m={m}");
        }
    }
}

/// A GGUF file written with a quantized 2-D weight and an F32 vector.
fn small_gguf(rng: &mut Rng) -> (Gguf, Vec<u8>, usize, usize) {
    let (n, k) = (13, 96);
    let case = Case { format: QuantFormat::Q4_0, batch: vec![], m: 1, n, k, dtype: DType::F32, strided: false };
    let (_, bytes) = case.weight(rng);
    let bias: Vec<u8> = (0..n).flat_map(|i| (i as f32).to_le_bytes()).collect();
    let (wshape, bshape) = ([n, k], [n]);
    let file = gguf::to_bytes(
        &[("general.architecture", gguf::Value::String("llama".into()))],
        &[
            ("w", &wshape[..], GgmlType::Quant(QuantFormat::Q4_0), &bytes[..]),
            ("b", &bshape[..], GgmlType::F32, &bias[..]),
        ],
    )
    .unwrap();
    (Gguf::from_bytes(file, "small.gguf").unwrap(), bytes, n, k)
}

#[test]
fn from_gguf_keeps_the_file_bytes() {
    let s = cpu();
    let mut rng = Rng::new(8);
    let (g, bytes, n, k) = small_gguf(&mut rng);
    let w = QMatrix::from_gguf(&g, "w", &s).unwrap();
    assert_eq!((w.format(), w.rows(), w.cols()), (QuantFormat::Q4_0, n, k));
    assert_eq!(w.data().to_vec::<u8>().unwrap(), bytes);
    let case = Case { format: QuantFormat::Q4_0, batch: vec![2], m: 2, n, k, dtype: DType::F16, strided: true };
    let (x, xv) = case.x(&mut rng);
    let (want, mag) = reference(QuantFormat::Q4_0, &xv, &bytes, n, k);
    check(&qmatmul(&x, &w).unwrap().to_f64_vec().unwrap(), &want, &mag, DType::F16, "gguf");
    let e = QMatrix::from_gguf(&g, "b", &s).unwrap_err();
    assert!(matches!(&e, Error::InvalidArgument { .. }) && e.to_string().contains("F32"), "{e}");
    assert!(QMatrix::from_gguf(&g, "missing", &s).is_err());
}

#[test]
fn bad_inputs_are_errors() {
    let s = cpu();
    let f = QuantFormat::Q4_1;
    // K not whole blocks; byte counts that do not match.
    assert!(matches!(QMatrix::from_bytes(f, 2, 48, &[0; 60], &s), Err(Error::Shape { .. })));
    assert!(matches!(QMatrix::from_bytes(f, 2, 64, &[0; 79], &s), Err(Error::InvalidArgument { .. })));
    assert!(matches!(QMatrix::from_bytes(f, 2, 64, &[0; 81], &s), Err(Error::InvalidArgument { .. })));
    let w = QMatrix::from_bytes(f, 2, 64, &[0; 80], &s).unwrap();
    // x whose width is not K, 0-d x, integer x.
    let x = Array::zeros(&[3, 32], DType::F32).unwrap();
    assert!(matches!(qmatmul(&x, &w), Err(Error::Shape { .. })));
    assert!(matches!(qmatmul(&Array::scalar(1.0f32).unwrap(), &w), Err(Error::Shape { .. })));
    let xi = Array::zeros(&[3, 64], DType::I32).unwrap();
    assert!(matches!(qmatmul(&xi, &w), Err(Error::DType { .. })));
    assert!(matches!(qmatmul(&Array::zeros(&[3, 64], DType::F64).unwrap(), &w), Err(Error::DType { .. })));
    // Quantize: not 2-D, K not whole blocks, not a float weight.
    assert!(QMatrix::quantize(&Array::zeros(&[64], DType::F32).unwrap(), f).is_err());
    assert!(matches!(QMatrix::quantize(&Array::zeros(&[2, 40], DType::F32).unwrap(), f), Err(Error::Shape { .. })));
    assert!(matches!(QMatrix::quantize(&xi, f), Err(Error::DType { .. })));
    // Packed data: not u8, not 2-D, rows not whole blocks; dequantize to an integer dtype.
    assert!(matches!(QMatrix::from_packed(f, &x), Err(Error::DType { .. })));
    let b = Array::zeros(&[2, 81], DType::U8).unwrap();
    assert!(matches!(QMatrix::from_packed(f, &b), Err(Error::Shape { .. })));
    assert!(QMatrix::from_packed(f, &Array::zeros(&[80], DType::U8).unwrap()).is_err());
    assert!(matches!(w.dequantize(DType::I32), Err(Error::DType { .. })));
    assert!(matches!(quant::dequantize_packed(&b, f, DType::F32), Err(Error::Shape { .. })));
    // A 1-D x is one row.
    let y = qmatmul(&Array::zeros(&[64], DType::F32).unwrap(), &w).unwrap();
    assert_eq!(y.shape(), [2]);
}

/// The default language model's file, like `io_formats.rs`: `None` (saying so) when it
/// cannot be had.
fn llm() -> Option<std::path::PathBuf> {
    common::cached(rill::io::cache::default_llm)
}

/// A Q4_1 weight and the Q8_0 token embedding of the real model: the product against the
/// float64 product of the file's dequantized values, and embedding rows.
#[test]
fn real_model_tensors_match_their_dequantized_values() {
    let Some(path) = llm() else { return };
    let g = Gguf::open(&path).unwrap();
    real_model_products(&g, &cpu(), &mut Rng::new(135), &[(1, DType::F32), (5, DType::BF16)]);
}
