//! The BERT encoder and sentence embedder (`rill::models::bert`) against
//! sentence-transformers, on the CPU: token ids and embeddings of
//! `fixtures/embed_fixture.json` (made by `fixtures/make_embed_fixture.py`), f32 and
//! bf16; one shared embedder used from 16 threads and 64 tokio tasks at once; batch
//! composition and order; weight names with and without a prefix, and the errors for a
//! missing or misshaped tensor or an unsupported module (on a small random model beside
//! the real one's tokenizer). GPU parity is in `gpu_bert.rs`.
//!
//! The real model comes from rill's model cache (fetched on first use with pip);
//! without it the tests print "skipped: no model" (a failure with `RILL_REQUIRE_MODEL=1`).

mod common;

use std::path::{Path, PathBuf};

use rill::models::bert::Embedder;
use rill::{Array, DType, Device};
use serde_json::Value;

fn model() -> Option<PathBuf> {
    common::cached(rill::io::cache::default_model)
}

struct Fixture {
    sentences: Vec<String>,
    ids: Vec<Vec<u32>>,
    embeddings: Vec<Vec<f32>>,
}

fn fixture() -> Fixture {
    let path = Path::new(&std::env::var("CARGO_MANIFEST_DIR").unwrap()).join("tests/fixtures/embed_fixture.json");
    let v: Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    let strs = |v: &Value| v.as_array().unwrap().iter().map(|s| s.as_str().unwrap().to_string()).collect::<Vec<_>>();
    let rows = |v: &Value| -> Vec<Vec<f64>> {
        v.as_array()
            .unwrap()
            .iter()
            .map(|r| r.as_array().unwrap().iter().map(|x| x.as_f64().unwrap()).collect())
            .collect()
    };
    let f = Fixture {
        sentences: strs(&v["sentences"]),
        ids: rows(&v["input_ids"]).into_iter().map(|r| r.into_iter().map(|x| x as u32).collect()).collect(),
        embeddings: rows(&v["embeddings"]).into_iter().map(|r| r.into_iter().map(|x| x as f32).collect()).collect(),
    };
    assert!(f.sentences.len() >= 64);
    assert_eq!(f.ids.len(), f.sentences.len());
    assert_eq!(f.embeddings.len(), f.sentences.len());
    f
}

/// Cosine similarity in f64.
fn cosine(a: &[f32], b: &[f32]) -> f64 {
    assert_eq!(a.len(), b.len());
    let dot: f64 = a.iter().zip(b).map(|(&x, &y)| x as f64 * y as f64).sum();
    let na: f64 = a.iter().map(|&x| (x as f64).powi(2)).sum::<f64>().sqrt();
    let nb: f64 = b.iter().map(|&x| (x as f64).powi(2)).sum::<f64>().sqrt();
    dot / (na * nb)
}

/// Every embedding's cosine to the fixture's is at least `min`; returns the worst.
fn check_parity(e: &Embedder, f: &Fixture, min: f64, what: &str) -> f64 {
    let got = e.embed(&f.sentences).unwrap();
    assert_eq!(got.len(), f.sentences.len());
    let mut worst = 1.0f64;
    for (i, (g, want)) in got.iter().zip(&f.embeddings).enumerate() {
        assert_eq!(g.len(), want.len(), "{what}: sentence {i}");
        let c = cosine(g, want);
        assert!(c >= min, "{what}: sentence {i} ({:?}) has cosine {c} < {min}", f.sentences[i]);
        worst = worst.min(c);
    }
    eprintln!("{what}: worst cosine {worst}");
    worst
}

#[test]
fn cpu_parity_with_sentence_transformers() {
    let Some(dir) = model() else { return };
    let f = fixture();
    let e = Embedder::load(&dir, Device::cpu(), DType::F32).unwrap().with_batch_size(16).unwrap();
    assert!(e.normalizes());
    for (i, s) in f.sentences.iter().enumerate() {
        assert_eq!(e.token_ids(s).unwrap(), f.ids[i], "token ids of sentence {i} ({s:?})");
    }
    check_parity(&e, &f, 0.99999, "cpu f32");
    let e = Embedder::load(&dir, Device::cpu(), DType::BF16).unwrap().with_batch_size(16).unwrap();
    check_parity(&e, &f, 0.999, "cpu bf16");
}

/// A simple seeded generator (the test needs no statistical quality).
struct Lcg(u64);
impl Lcg {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        self.0 >> 33
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

#[test]
fn batch_composition_and_order_do_not_change_the_vectors() {
    let Some(dir) = model() else { return };
    let f = fixture();
    let base = Embedder::load(&dir, Device::cpu(), DType::F32).unwrap().with_batch_size(64).unwrap();
    let all = base.embed(&f.sentences).unwrap();
    let mut rng = Lcg(7);
    for round in 0..4 {
        let bs = 1 + rng.below(16);
        let e = Embedder::load(&dir, Device::cpu(), DType::F32).unwrap().with_batch_size(bs).unwrap();
        // A random subset in a random order, some sentences repeated.
        let n = 1 + rng.below(24);
        let pick: Vec<usize> = (0..n).map(|_| rng.below(f.sentences.len())).collect();
        let texts: Vec<&str> = pick.iter().map(|&i| f.sentences[i].as_str()).collect();
        let got = e.embed(&texts).unwrap();
        assert_eq!(got.len(), n);
        for (k, &i) in pick.iter().enumerate() {
            let diff = got[k].iter().zip(&all[i]).map(|(a, b)| (a - b).abs()).fold(0.0f32, f32::max);
            assert!(diff <= 2e-5, "round {round} batch {bs}: sentence {i} differs by {diff}");
        }
    }
    assert!(base.embed(&[] as &[&str]).unwrap().is_empty());
}

#[test]
fn one_embedder_shared_by_threads_and_tasks_gives_the_serial_results() {
    let Some(dir) = model() else { return };
    let f = fixture();
    let e = std::sync::Arc::new(Embedder::load(&dir, Device::cpu(), DType::F32).unwrap().with_batch_size(4).unwrap());
    // Job k embeds 6 sentences starting at a k-dependent offset (each job's batches are
    // the same whoever runs it, so results must be equal bit for bit).
    let job = |k: usize| -> Vec<&str> {
        (0..6).map(|j| f.sentences[(k * 5 + j * 11) % f.sentences.len()].as_str()).collect()
    };
    let jobs = 16 + 64;
    let serial: Vec<Vec<Vec<f32>>> = (0..jobs).map(|k| e.embed(&job(k)).unwrap()).collect();
    let before = rill::runtime::stats();
    common::on_threads(16, |k| {
        let got = e.embed(&job(k as usize)).unwrap();
        assert_eq!(got, serial[k as usize], "thread {k}");
    });
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(4).enable_all().build().unwrap();
    rt.block_on(async {
        let mut handles = Vec::new();
        for t in 0..64 {
            let e = e.clone();
            let texts: Vec<String> = job(16 + t).into_iter().map(str::to_string).collect();
            handles.push(tokio::spawn(async move { (t, e.embed_async(&texts).await.unwrap()) }));
        }
        for h in handles {
            let (t, got) = h.await.unwrap();
            assert_eq!(got, serial[16 + t], "task {t}");
        }
    });
    let after = rill::runtime::stats();
    assert_eq!(after.streams_created, before.streams_created, "no stream created");
    assert_eq!(after.threads_started, before.threads_started, "no thread started");
    assert_eq!(after.threads_live, before.threads_live);
}

// ------------------------------------------------- a small random model, for the loader

/// The real model's tokenizer files with a random 1-layer encoder (hidden 16, 2 heads),
/// its tensors named with `prefix`.
fn tiny_model(real: &Path, dir: &Path, prefix: &str, skip: Option<&str>, reshape: Option<&str>) {
    std::fs::create_dir_all(dir.join("1_Pooling")).unwrap();
    for f in ["tokenizer.json", "sentence_bert_config.json", "modules.json"] {
        std::fs::copy(real.join(f), dir.join(f)).unwrap();
    }
    let real_cfg: Value = serde_json::from_str(&std::fs::read_to_string(real.join("config.json")).unwrap()).unwrap();
    let vocab = real_cfg["vocab_size"].as_u64().unwrap() as usize;
    let (h, inter, pos) = (16usize, 32usize, 512usize);
    let cfg = serde_json::json!({
        "hidden_size": h, "num_hidden_layers": 1, "num_attention_heads": 2, "intermediate_size": inter,
        "max_position_embeddings": pos, "vocab_size": vocab, "hidden_act": "gelu", "layer_norm_eps": 1e-12,
    });
    std::fs::write(dir.join("config.json"), cfg.to_string()).unwrap();
    let pooling = serde_json::json!({"word_embedding_dimension": h, "pooling_mode_mean_tokens": true});
    std::fs::write(dir.join("1_Pooling/config.json"), pooling.to_string()).unwrap();
    let mut shapes: Vec<(String, Vec<usize>)> = vec![
        ("embeddings.word_embeddings.weight".into(), vec![vocab, h]),
        ("embeddings.position_embeddings.weight".into(), vec![pos, h]),
        ("embeddings.token_type_embeddings.weight".into(), vec![2, h]),
        ("embeddings.LayerNorm.weight".into(), vec![h]),
        ("embeddings.LayerNorm.bias".into(), vec![h]),
    ];
    let l = "encoder.layer.0";
    for (name, out, inp) in [
        ("attention.self.query", h, h),
        ("attention.self.key", h, h),
        ("attention.self.value", h, h),
        ("attention.output.dense", h, h),
        ("intermediate.dense", inter, h),
        ("output.dense", h, inter),
    ] {
        shapes.push((format!("{l}.{name}.weight"), vec![out, inp]));
        shapes.push((format!("{l}.{name}.bias"), vec![out]));
    }
    for n in ["attention.output.LayerNorm", "output.LayerNorm"] {
        shapes.push((format!("{l}.{n}.weight"), vec![h]));
        shapes.push((format!("{l}.{n}.bias"), vec![h]));
    }
    let key = rill::random::Key::new(3);
    let keys = key.split(shapes.len());
    let arrays: Vec<(String, Array)> = shapes
        .into_iter()
        .zip(keys)
        .filter(|((n, _), _)| Some(n.as_str()) != skip)
        .map(|((n, mut s), k)| {
            if Some(n.as_str()) == reshape {
                s[0] += 1;
            }
            let a = rill::random::normal(k, &s, 0.0, 0.5, DType::F32).unwrap();
            (format!("{prefix}{n}"), a)
        })
        .collect();
    let refs: Vec<(&str, &Array)> = arrays.iter().map(|(n, a)| (n.as_str(), a)).collect();
    rill::io::safetensors::save(dir.join("model.safetensors"), &refs).unwrap();
}

fn err_of(dir: &Path) -> String {
    Embedder::load(dir, Device::cpu(), DType::F32).expect_err("load must fail").to_string()
}

#[test]
fn weight_names_prefixes_and_loader_errors() {
    let Some(real) = model() else { return };
    let tmp = tempfile::tempdir().unwrap();
    let (plain, prefixed) = (tmp.path().join("plain"), tmp.path().join("prefixed"));
    tiny_model(&real, &plain, "", None, None);
    tiny_model(&real, &prefixed, "bert.", None, None);
    let texts = ["hello world", "", "a somewhat longer sentence with more tokens in it"];
    let a = Embedder::load(&plain, Device::cpu(), DType::F32).unwrap().embed(&texts).unwrap();
    let b = Embedder::load(&prefixed, Device::cpu(), DType::F32).unwrap().embed(&texts).unwrap();
    assert_eq!(a, b, "the same weights under a prefix give the same vectors");
    for v in &a {
        assert_eq!(v.len(), 16);
        let n: f32 = v.iter().map(|x| x * x).sum::<f32>().sqrt();
        assert!((n - 1.0).abs() < 1e-5, "normalised: {n}");
    }

    let missing = tmp.path().join("missing");
    tiny_model(&real, &missing, "bert.", Some("encoder.layer.0.attention.self.key.weight"), None);
    let e = err_of(&missing);
    assert!(e.contains("bert.encoder.layer.0.attention.self.key.weight") && e.contains("missing"), "{e}");

    let misshaped = tmp.path().join("misshaped");
    tiny_model(&real, &misshaped, "", None, Some("encoder.layer.0.intermediate.dense.weight"));
    let e = err_of(&misshaped);
    assert!(e.contains("encoder.layer.0.intermediate.dense.weight") && e.contains("[33, 16]"), "{e}");

    // A module rill does not run is an error, not a silently different embedding.
    let modules = serde_json::json!([
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
        {"idx": 2, "name": "2", "path": "2_Dense", "type": "sentence_transformers.models.Dense"},
    ]);
    std::fs::write(plain.join("modules.json"), modules.to_string()).unwrap();
    assert!(err_of(&plain).contains("Dense"));
    // Without modules.json: no normalisation.
    std::fs::remove_file(plain.join("modules.json")).unwrap();
    let e = Embedder::load(&plain, Device::cpu(), DType::F32).unwrap();
    assert!(!e.normalizes());
    let v = e.embed(&texts).unwrap();
    for (x, y) in v.iter().zip(&a) {
        assert!(cosine(x, y) > 0.999999);
    }

    assert!(err_of(&tmp.path().join("nothing here")).contains("not a directory"));
    std::fs::write(prefixed.join("config.json"), "{\"hidden_size\": 16}").unwrap();
    assert!(err_of(&prefixed).contains("config.json"));
    assert!(Embedder::load(&plain, Device::cpu(), DType::I32).is_err());
    assert!(Embedder::load(&plain, Device::cpu(), DType::F32).unwrap().with_batch_size(0).is_err());
}
