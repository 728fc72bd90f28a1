//! Sort, argsort, top-k, categorical draws and the sampler on a GPU: the CPU test cases
//! (`sort_cases/`) run on the GPU against the same host references, vocabulary-sized rows
//! through every kernel path, and the GPU's results equal to the CPU's (the same order,
//! the same draws for a key). Skipped without a GPU; `RILL_REQUIRE_GPU=1` makes a missing
//! GPU a failure.

mod common;
mod sort_cases;

use common::{Rng, gpu, on};
use rill::random::{Key, categorical};
use rill::sample::{Sampler, SamplerConfig};
use rill::{Array, DType, Device};
use sort_cases::*;

#[test]
fn gpu_sort_argsort_topk_match_the_reference() {
    let Some(g) = gpu() else { return };
    sort_cases(g, 2, 80, &[4097, 49_152, 65_537, 262_144]);
}

#[test]
fn gpu_topk_paths_of_vocabulary_rows() {
    let Some(g) = gpu() else { return };
    for dtype in [DType::F32, DType::BF16, DType::F16, DType::I64, DType::F64] {
        topk_long_rows(g, 49_152, &[1, 2, 50, 1000, 1024, 2048, 4096, 49_152], dtype);
    }
    topk_long_rows(g, 256_000, &[1, 40, 1024, 5000], DType::F32);
}

/// The GPU sorts, draws and samples exactly as the CPU.
#[test]
fn gpu_equals_cpu() {
    let Some(g) = gpu() else { return };
    let mut rng = Rng::new(77);
    for (rows, n) in [(3usize, 49_152usize), (1, 262_144), (64, 4096), (5, 100_003), (130, 300)] {
        let vals = gen_values(&mut rng, rows * n, DType::F32);
        for dtype in [DType::F32, DType::BF16] {
            let run = |d: Device| {
                on(d, || {
                    let x = make(&vals, &[rows, n], dtype, false);
                    let (tv, ti) = x.topk(n.min(1000), -1).unwrap();
                    (
                        x.argsort(-1, true).unwrap().to_vec::<i64>().unwrap(),
                        x.argsort(0, false).unwrap().to_vec::<i64>().unwrap(),
                        tv.to_f64_vec().unwrap(),
                        ti.to_vec::<i64>().unwrap(),
                    )
                })
            };
            let (c, gg) = (run(Device::cpu()), run(g));
            assert_eq!(c.0, gg.0, "{dtype} [{rows}, {n}] argsort descending");
            assert_eq!(c.1, gg.1, "{dtype} [{rows}, {n}] argsort along axis 0");
            assert_eq!(c.3, gg.3, "{dtype} [{rows}, {n}] topk indices");
            assert!(c.2.iter().zip(&gg.2).all(|(a, b)| a == b || (a.is_nan() && b.is_nan())));
        }
    }
    let logits: Vec<f64> = (0..4 * 49_152).map(|_| rng.uniform(-8.0, 8.0)).collect();
    let draw = |d: Device| {
        on(d, || {
            let l = Array::from_slice(&logits, &[4, 49_152]).unwrap().astype(DType::BF16).unwrap();
            let c = categorical(Key::new(5), &l, -1).unwrap().to_vec::<i64>().unwrap();
            let config = SamplerConfig {
                temperature: 0.7,
                top_k: Some(50),
                top_p: Some(0.9),
                min_p: Some(0.02),
                repetition_penalty: Some(1.1),
                seed: 3,
            };
            let h = Array::from_slice(&[1i64, 2, 3, 4, 5, 6, 7, 8], &[4, 2]).unwrap();
            let s = Sampler::new(config.clone()).unwrap();
            let a =
                (0..8).map(|step| s.sample(&l, Some(&h), step).unwrap().to_vec::<i64>().unwrap()).collect::<Vec<_>>();
            let p = Sampler::new(SamplerConfig { top_k: None, ..config }).unwrap();
            let b =
                (0..4).map(|step| p.sample(&l, Some(&h), step).unwrap().to_vec::<i64>().unwrap()).collect::<Vec<_>>();
            (c, a, b)
        })
    };
    assert_eq!(draw(Device::cpu()), draw(g), "categorical and sampler draws, CPU vs GPU");
}

#[test]
fn gpu_categorical_follows_softmax() {
    let Some(g) = gpu() else { return };
    categorical_distribution(g);
}

#[test]
fn gpu_sampler_filters_match_transformers() {
    let Some(g) = gpu() else { return };
    filters_match_reference(g, 6, 60);
    sampler_draws(g);
    compiled_step_matches_eager(g);
}
