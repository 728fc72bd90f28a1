//! `rill::quant` on the GPU: the matrix-vector kernel (up to 63 rows of f16/bf16 x, 64 of
//! f32, in chunks of 8) and the tiled kernels (more rows, partial tiles; tensor cores for
//! f16/bf16) against dequantize-then-matmul in
//! float64 for every format on generated shapes (odd N, K = 32 · odd, batch axes,
//! f32/bf16/f16 and strided x); the `Dequantize` kernel bit for bit against the host;
//! compile; a weight on another stream; the device mismatch error; the default language
//! model's Q4_1 weight and Q8_0 embedding. Skipped without a GPU; `RILL_REQUIRE_GPU=1`
//! makes a missing GPU a failure.

mod common;
mod quant_ref;

use common::{Rng, gpu};
use quant_ref::{Case, check, real_model_products, reference, run_case};
use rill::io::gguf::Gguf;
use rill::quant::{self, QuantFormat, qmatmul};
use rill::{Array, DType, Error, Stream};

#[test]
fn gpu_decode_rows_match_the_float64_reference() {
    let Some(g) = gpu() else { return };
    let s = g.default_stream().unwrap();
    let mut rng = Rng::new(27);
    common::on(g, || {
        for f in QuantFormat::ALL {
            for i in 0..40 {
                let case = Case::random(&mut rng, f, 17, 45);
                run_case(&case, &mut rng, &s, &format!("case {i}"));
            }
        }
    });
}

#[test]
fn gpu_prefill_tiles_match_the_float64_reference() {
    let Some(g) = gpu() else { return };
    let s = g.default_stream().unwrap();
    let mut rng = Rng::new(28);
    common::on(g, || {
        for f in QuantFormat::ALL {
            for i in 0..12 {
                let mut case = Case::random(&mut rng, f, 200, 150);
                case.m += 8; // past the matrix-vector kernel
                run_case(&case, &mut rng, &s, &format!("prefill {i}"));
            }
            for (m, n, k) in [(512, 576, 576), (129, 65, 1568), (64, 64, 32)] {
                for dtype in [DType::BF16, DType::F16, DType::F32] {
                    let case = Case { format: f, batch: vec![], m, n, k, dtype, strided: false };
                    run_case(&case, &mut rng, &s, "prefill fixed");
                }
            }
        }
    });
}

#[test]
fn gpu_dequantize_equals_the_host_and_compile_replays() {
    let Some(g) = gpu() else { return };
    let s = g.default_stream().unwrap();
    let mut rng = Rng::new(29);
    common::on(g, || {
        for f in QuantFormat::ALL {
            let case = Case { format: f, batch: vec![], m: 3, n: 37, k: 160, dtype: DType::BF16, strided: false };
            let (_, bytes) = case.weight(&mut rng);
            let w = case.matrix(&bytes, &s);
            assert!(w.device().is_gpu());
            let mut host = vec![0f32; case.n * case.k];
            quant::dequantize(f, &bytes, &mut host).unwrap();
            assert_eq!(w.dequantize(DType::F32).unwrap().to_vec::<f32>().unwrap(), host, "{f:?}");
            let ids = Array::from_slice(&[36i64, 0, 5], &[3]).unwrap();
            let rows = w.rows_of(&ids, DType::F32).unwrap().to_vec::<f32>().unwrap();
            let want: Vec<f32> = [36, 0, 5].iter().flat_map(|&i| host[i * 160..(i + 1) * 160].to_vec()).collect();
            assert_eq!(rows, want, "{f:?} rows_of");
            let w1 = w.clone();
            let c = rill::compile(move |x: &[Array]| Ok(vec![qmatmul(&x[0], &w1)?.mul(2.0)?]));
            for m in [3, 1, 40] {
                let cm = Case { m, ..case.clone() };
                let (x, xv) = cm.x(&mut rng);
                let (want, mag) = reference(f, &xv, &bytes, cm.n, cm.k);
                let got = c.call(std::slice::from_ref(&x)).unwrap().remove(0).to_f64_vec().unwrap();
                let half: Vec<f64> = got.iter().map(|v| v / 2.0).collect();
                check(&half, &want, &mag, DType::BF16, &format!("compiled {f:?} m={m}"));
            }
        }
    });
}

/// A weight uploaded on a user stream, read by ops on another stream (a GPU-side wait);
/// a weight on the CPU read by an op told to run on the GPU is an error.
#[test]
fn gpu_weights_cross_streams_and_devices_are_checked() {
    let Some(g) = gpu() else { return };
    let mut rng = Rng::new(30);
    let side = Stream::new(&g).unwrap();
    let case =
        Case { format: QuantFormat::Q4_1, batch: vec![2], m: 2, n: 19, k: 96, dtype: DType::F32, strided: false };
    let (_, bytes) = case.weight(&mut rng);
    let w = case.matrix(&bytes, &side);
    let (x, xv) = common::on(g, || case.x(&mut rng));
    let y = common::on(g, || qmatmul(&x, &w).unwrap());
    let (want, mag) = reference(case.format, &xv, &bytes, case.n, case.k);
    check(&y.to_f64_vec().unwrap(), &want, &mag, DType::F32, "cross-stream");
    let cpu = rill::Device::cpu().default_stream().unwrap();
    let wc = case.matrix(&bytes, &cpu);
    let e = common::on(g, || qmatmul(&x, &wc)).unwrap_err();
    assert!(matches!(&e, Error::InvalidArgument { .. }) && e.to_string().contains("to_stream"), "{e}");
    // Moved once, it works there.
    let wg = wc.to_stream(&g.default_stream().unwrap()).unwrap();
    let y = common::on(g, || qmatmul(&x, &wg).unwrap());
    check(&y.to_f64_vec().unwrap(), &want, &mag, DType::F32, "moved");
}

#[test]
fn gpu_real_model_tensors_match_their_dequantized_values() {
    let Some(g) = gpu() else { return };
    let Some(path) = common::cached(rill::io::cache::default_llm) else { return };
    let file = Gguf::open(&path).unwrap();
    let s = g.default_stream().unwrap();
    let products = [(1, DType::BF16), (4, DType::F32), (12, DType::BF16)];
    common::on(g, || real_model_products(&file, &s, &mut Rng::new(31), &products));
}
