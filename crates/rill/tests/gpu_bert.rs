//! The sentence embedder on GPU 0 against sentence-transformers
//! (`fixtures/embed_fixture.json`): token ids, cosine >= 0.99999 in f32 and >= 0.999 in
//! f16 and bf16; one shared GPU embedder used from 16 threads at once gives the serial
//! results and creates no stream or thread. Prints "skipped: no GPU" without one (a
//! failure with `RILL_REQUIRE_GPU=1`) and "skipped: no model" without the model (a
//! failure with `RILL_REQUIRE_MODEL=1`; `RILL_CACHE` may point at a cache holding it).

mod common;

use std::path::{Path, PathBuf};

use rill::DType;
use rill::models::bert::Embedder;
use serde_json::Value;

fn model() -> Option<PathBuf> {
    common::cached(rill::io::cache::default_model)
}

fn fixture() -> (Vec<String>, Vec<Vec<u32>>, Vec<Vec<f32>>) {
    let path = Path::new(&std::env::var("CARGO_MANIFEST_DIR").unwrap()).join("tests/fixtures/embed_fixture.json");
    let v: Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    let list = |k: &str| v[k].as_array().unwrap().clone();
    let sentences = list("sentences").iter().map(|s| s.as_str().unwrap().to_string()).collect();
    let ids = list("input_ids")
        .iter()
        .map(|r| r.as_array().unwrap().iter().map(|x| x.as_u64().unwrap() as u32).collect())
        .collect();
    let emb = list("embeddings")
        .iter()
        .map(|r| r.as_array().unwrap().iter().map(|x| x.as_f64().unwrap() as f32).collect())
        .collect();
    (sentences, ids, emb)
}

fn cosine(a: &[f32], b: &[f32]) -> f64 {
    let dot: f64 = a.iter().zip(b).map(|(&x, &y)| x as f64 * y as f64).sum();
    let n = |v: &[f32]| v.iter().map(|&x| (x as f64).powi(2)).sum::<f64>().sqrt();
    dot / (n(a) * n(b))
}

#[test]
fn gpu_parity_with_sentence_transformers_and_sharing() {
    let Some(gpu) = common::gpu() else { return };
    let Some(dir) = model() else { return };
    let (sentences, ids, want) = fixture();
    for (dt, min) in [(DType::F32, 0.99999), (DType::F16, 0.999), (DType::BF16, 0.999)] {
        let e = Embedder::load(&dir, gpu, dt).unwrap().with_batch_size(16).unwrap();
        if dt == DType::F32 {
            for (i, s) in sentences.iter().enumerate() {
                assert_eq!(e.token_ids(s).unwrap(), ids[i], "token ids of sentence {i}");
            }
        }
        let got = e.embed(&sentences).unwrap();
        let mut worst = 1.0f64;
        for (i, (g, w)) in got.iter().zip(&want).enumerate() {
            let c = cosine(g, w);
            assert!(c >= min, "gpu {dt}: sentence {i} ({:?}) has cosine {c} < {min}", sentences[i]);
            worst = worst.min(c);
        }
        eprintln!("gpu {dt}: worst cosine {worst}");
    }

    let e = Embedder::load(&dir, gpu, DType::BF16).unwrap().with_batch_size(8).unwrap();
    let job =
        |k: usize| -> Vec<&str> { (0..12).map(|j| sentences[(k * 7 + j * 5) % sentences.len()].as_str()).collect() };
    let serial: Vec<Vec<Vec<f32>>> = (0..16).map(|k| e.embed(&job(k)).unwrap()).collect();
    let before = rill::runtime::stats();
    common::on_threads(16, |k| {
        let got = e.embed(&job(k as usize)).unwrap();
        assert_eq!(got, serial[k as usize], "thread {k}");
    });
    let after = rill::runtime::stats();
    assert_eq!(after.streams_created, before.streams_created, "no stream created");
    assert_eq!(after.threads_started, before.threads_started, "no thread started");
}
