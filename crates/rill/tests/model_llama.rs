//! The llama decoder and generation (`rill::models::llama`) on the CPU, and the two ops
//! it adds:
//!
//! - `rope` and `slice_update` on generated cases (ranks, pair layouts, partial
//!   rotation, per-row offsets, strided inputs, clamped starts, every float dtype) against
//!   float64 references; under `compile`, new positions replay the one trace; the errors.
//! - The default model (SmolLM2-135M-Instruct, Q4_1/Q8_0 GGUF) against Hugging Face
//!   transformers on the same file in float32 (`fixtures/llama_fixture.json`, made by
//!   `fixtures/make_llama_fixture.py`): the prompt's token ids, the logits of every prompt
//!   position (decoded one token at a time through the cache) and of the prefill's last
//!   position, and the greedy 64-token continuation.
//! - 32 tokio tasks generating at once from one model give their serial results and
//!   create no stream or thread; a batch of prompts of different lengths decodes each row
//!   as it decodes alone; steps built before the previous ids are read (overlap) give
//!   the tokens of steps that wait; stop strings and the token budget.
//!
//! The model comes from rill's model cache (fetched on first use with pip); without it
//! the model tests print "skipped: no model" (a failure with `RILL_REQUIRE_MODEL=1`).
#![allow(clippy::disallowed_types)] // a test uses rill as a user does, with std's primitives (clippy.toml)

mod common;
mod decode_ref;

use std::path::Path;
use std::sync::OnceLock;

use common::{Rng, assert_close};
use decode_ref::{RopeCase, UpdateCase, rope_tolerance};
use rill::models::llama::{FinishReason, GenerateOptions, Llama, LoadOptions, Temperature};
use rill::{Array, DType, Device, Error, RopeOptions};
use serde_json::Value;

const FLOATS: [DType; 4] = [DType::F32, DType::F16, DType::BF16, DType::F64];

#[test]
fn rope_matches_the_float64_reference() {
    let mut rng = Rng::new(27);
    common::on(Device::cpu(), || {
        for n in 0..150 {
            let case = RopeCase::random(&mut rng, &FLOATS);
            let (x, vals, off) = case.inputs(&mut rng);
            let got = rill::rope(&x, &off, case.options()).unwrap();
            assert_eq!(got.dtype(), case.dtype);
            assert_eq!(got.shape(), case.shape.as_slice());
            let want = case.reference(&vals);
            assert_close(&got.to_f64_vec().unwrap(), &want, rope_tolerance(case.dtype), &format!("case {n}: {case:?}"));
        }
    });
}

#[test]
fn slice_update_matches_the_reference_and_leaves_its_input_alone() {
    let mut rng = Rng::new(28);
    let dtypes = [DType::F32, DType::BF16, DType::F64, DType::I32, DType::U8, DType::I64];
    common::on(Device::cpu(), || {
        for n in 0..200 {
            let case = UpdateCase::random(&mut rng, &dtypes);
            let (x, u, s, xv, uv) = case.inputs(&mut rng);
            let got = x.slice_update(&u, &s, case.axis as isize).unwrap();
            assert_eq!(got.shape(), case.shape.as_slice());
            assert_eq!(got.dtype(), case.dtype);
            let want = case.reference(&xv, &uv);
            assert_eq!(got.to_f64_vec().unwrap(), want, "case {n}: {case:?}");
            assert_eq!(x.to_f64_vec().unwrap(), xv, "case {n}: x itself is unchanged");
        }
    });
}

/// A compiled function of (x, offset) and (cache, update, start) traces once and gives
/// the eager results for every position it is called with.
#[test]
fn compiled_positions_replay_one_trace() {
    let mut rng = Rng::new(29);
    let opts = RopeOptions::new(16, 10000.0);
    let f = rill::compile(move |a: &[Array]| {
        let q = a[0].rope(&a[1], opts)?;
        let c = a[2].slice_update(&q, &a[1], 2)?;
        Ok(vec![q, c])
    });
    let x = Array::from_slice(&rng.vec(2 * 3 * 16, -1.0, 1.0), &[1, 2, 3, 16]).unwrap().astype(DType::F32).unwrap();
    let cache = Array::zeros(&[1, 2, 40, 16], DType::F32).unwrap();
    for p in [0i32, 5, 17, 37] {
        let pos = Array::from_slice(&[p], &[]).unwrap();
        let got = f.call(&[x.clone(), pos.clone(), cache.clone()]).unwrap();
        let q = x.rope(&pos, opts).unwrap();
        let c = cache.slice_update(&q, &pos, 2).unwrap();
        assert_eq!(got[0].to_vec::<f32>().unwrap(), q.to_vec::<f32>().unwrap(), "position {p}");
        assert_eq!(got[1].to_vec::<f32>().unwrap(), c.to_vec::<f32>().unwrap(), "position {p}");
    }
    assert_eq!(f.trace_count(), 1, "one trace for every position");
}

#[test]
fn decode_op_errors() {
    let x = Array::zeros(&[2, 3, 4, 8], DType::F32).unwrap();
    let p = Array::from_slice(&[1i32], &[]).unwrap();
    let bad = |r: rill::Result<Array>, what: &str| match r {
        Err(Error::Shape { .. } | Error::DType { .. } | Error::InvalidArgument { .. } | Error::Axis { .. }) => {}
        other => panic!("{what}: {other:?}"),
    };
    bad(x.rope(&p, RopeOptions::new(7, 1e4)), "odd dims");
    bad(x.rope(&p, RopeOptions::new(10, 1e4)), "dims past D");
    bad(x.rope(&p, RopeOptions::new(0, 1e4)), "zero dims");
    bad(x.rope(&p, RopeOptions::new(8, f64::NAN)), "NaN base");
    bad(x.rope(&Array::from_slice(&[1.0f32], &[]).unwrap(), RopeOptions::new(8, 1e4)), "float offset");
    bad(x.rope(&Array::from_slice(&[1i32, 2, 3], &[3]).unwrap(), RopeOptions::new(8, 1e4)), "offsets not [B]");
    bad(Array::zeros(&[8], DType::F32).unwrap().rope(&p, RopeOptions::new(8, 1e4)), "rank 1");
    bad(Array::zeros(&[3, 8], DType::I32).unwrap().rope(&p, RopeOptions::new(8, 1e4)), "integer x");
    let u = Array::zeros(&[2, 3, 1, 8], DType::F32).unwrap();
    bad(x.slice_update(&Array::zeros(&[2, 3, 5, 8], DType::F32).unwrap(), &p, 2), "update too long");
    bad(x.slice_update(&Array::zeros(&[2, 2, 1, 8], DType::F32).unwrap(), &p, 2), "other axes differ");
    bad(x.slice_update(&u, &p, 4), "axis out of range");
    bad(x.slice_update(&u, &Array::from_slice(&[1.0f32], &[]).unwrap(), 2), "float start");
    bad(x.slice_update(&u, &Array::from_slice(&[1i32, 2], &[2]).unwrap(), 0), "per-row start on axis 0");
    bad(x.slice_update(&u, &Array::from_slice(&[1i32, 2, 3], &[3]).unwrap(), 2), "starts not [B]");
}

// ---- the model ----

fn model() -> Option<&'static Llama> {
    static MODEL: OnceLock<Option<Llama>> = OnceLock::new();
    MODEL
        .get_or_init(|| {
            let path = match rill::io::cache::default_llm() {
                Ok(p) => p,
                Err(e) => {
                    assert!(std::env::var("RILL_REQUIRE_MODEL").as_deref() != Ok("1"), "RILL_REQUIRE_MODEL=1 but: {e}");
                    eprintln!("skipped: no model ({e})");
                    return None;
                }
            };
            Some(Llama::load(path, Device::cpu(), LoadOptions::default()).unwrap())
        })
        .as_ref()
}

struct Fixture {
    prompt: String,
    prompt_ids: Vec<u32>,
    probe_ids: Vec<usize>,
    probe_logits: Vec<Vec<f64>>,
    top_ids: Vec<usize>,
    top_logits: Vec<f64>,
    mean: f64,
    std: f64,
    max: f64,
    greedy: Vec<u32>,
}

fn fixture() -> Fixture {
    let path = Path::new(&std::env::var("CARGO_MANIFEST_DIR").unwrap()).join("tests/fixtures/llama_fixture.json");
    let v: Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    let nums = |v: &Value| v.as_array().unwrap().iter().map(|x| x.as_f64().unwrap()).collect::<Vec<f64>>();
    Fixture {
        prompt: v["prompt"].as_str().unwrap().to_string(),
        prompt_ids: nums(&v["prompt_ids"]).into_iter().map(|x| x as u32).collect(),
        probe_ids: nums(&v["probe_ids"]).into_iter().map(|x| x as usize).collect(),
        probe_logits: v["probe_logits"].as_array().unwrap().iter().map(nums).collect(),
        top_ids: nums(&v["last_top_ids"]).into_iter().map(|x| x as usize).collect(),
        top_logits: nums(&v["last_top_logits"]),
        mean: v["last_mean"].as_f64().unwrap(),
        std: v["last_std"].as_f64().unwrap(),
        max: v["last_max"].as_f64().unwrap(),
        greedy: nums(&v["greedy_ids"]).into_iter().map(|x| x as u32).collect(),
    }
}

/// Logits differ from transformers' float32 ones by the rounding of a different order
/// of float32 sums over 30 layers (observed: 1.3e-4 on logits of magnitude 10-20).
const LOGIT_TOL: f64 = 2e-3;

/// bf16 rounds every weight and activation to 8 bits of mantissa: observed differences
/// of about 0.2 on the top logits (magnitude 15-20).
const BF16_TOL: f64 = 0.75;

/// The largest difference between `got` (a full row of logits) and the fixture's values
/// at `ids`.
fn max_diff(got: &[f32], ids: &[usize], want: &[f64]) -> f64 {
    ids.iter().zip(want).map(|(&i, &w)| (got[i] as f64 - w).abs()).fold(0.0, f64::max)
}

/// Checks a model against the fixture: logits at every position decoded one token at a
/// time, the prefill's last position, and the greedy continuation. Returns the largest
/// logit difference seen.
fn check_against_fixture(m: &Llama, tol: f64, greedy_tokens: usize, what: &str) -> f64 {
    let f = fixture();
    assert_eq!(m.tokenizer().encode(&f.prompt, false).unwrap(), f.prompt_ids, "{what}: prompt token ids");
    let vocab = m.config().vocab;
    let mut worst = 0.0f64;
    // One token at a time: the decode step at every position.
    let mut cache = m.new_cache(1, 256).unwrap();
    for (t, &id) in f.prompt_ids.iter().enumerate() {
        let logits = m.forward(&[&[id]], &mut cache).unwrap();
        assert_eq!(logits.shape(), [1, vocab]);
        let row = logits.to_vec::<f32>().unwrap();
        let d = max_diff(&row, &f.probe_ids, &f.probe_logits[t]);
        assert!(d <= tol, "{what}: position {t}: logits differ by {d} > {tol}");
        worst = worst.max(d);
    }
    // The whole prompt in one prefill (padded to its bucket).
    let mut cache = m.new_cache(1, 256).unwrap();
    let row = m.forward(&[&f.prompt_ids], &mut cache).unwrap().to_vec::<f32>().unwrap();
    let d = max_diff(&row, &f.top_ids, &f.top_logits);
    assert!(d <= tol, "{what}: prefill's last position: top logits differ by {d} > {tol}");
    worst = worst.max(d);
    let n = row.len() as f64;
    let mean = row.iter().map(|&x| x as f64).sum::<f64>() / n;
    let std = (row.iter().map(|&x| (x as f64 - mean).powi(2)).sum::<f64>() / n).sqrt();
    let max = row.iter().map(|&x| x as f64).fold(f64::MIN, f64::max);
    for (name, g, w) in [("mean", mean, f.mean), ("std", std, f.std), ("max", max, f.max)] {
        assert!((g - w).abs() <= tol, "{what}: full-vocabulary {name} {g} vs {w}");
    }
    // Greedy continuation, EOS ignored (as the fixture's).
    let opts = GenerateOptions { max_tokens: greedy_tokens, stop_at_eos: false, ..Default::default() };
    let mut g = m.generate(&f.prompt_ids, opts).unwrap();
    let mut ids = Vec::new();
    while let Some(t) = g.next_token().unwrap() {
        ids.push(t.id);
    }
    assert_eq!(g.finish_reason(0), Some(FinishReason::MaxTokens));
    assert_eq!(ids, f.greedy[..greedy_tokens], "{what}: greedy tokens");
    eprintln!("{what}: largest logit difference {worst:e}");
    worst
}

#[test]
fn logits_and_greedy_tokens_match_transformers() {
    let Some(m) = model() else { return };
    check_against_fixture(m, LOGIT_TOL, 64, "cpu f32");
    // Decoding ~80 positions traced once: the tests of this binary (sharing the model)
    // use at most 4 shapes, batch 1 or 4 by length 1 or one 16-token bucket.
    assert!(m.traced_shapes() <= 4, "decode traced per position? {} traces", m.traced_shapes());
}

/// The decode step's products take the norm before them, the gated activation and the
/// residual adds into their blocks (`compile`'s quantized product blocks): four a layer
/// and the output head, with no norm or product node left on its own.
#[test]
fn a_decode_step_fuses_norms_activations_and_residuals_into_its_products() {
    if model().is_none() {
        return;
    }
    // Its own instance: the shared model's trace count is checked above.
    let m = Llama::load(rill::io::cache::default_llm().unwrap(), Device::cpu(), LoadOptions::default()).unwrap();
    let counts = m.decode_primitive_counts(1, 64).unwrap();
    let layers = m.config().layers;
    assert_eq!(counts.get("fused_qmatmul").copied(), Some(4 * layers + 1), "{counts:?}");
    for p in ["qmatmul", "rms_norm", "fused_add_rms_norm"] {
        assert_eq!(counts.get(p).copied(), None, "{p} in {counts:?}");
    }
}

/// Short prompts of the fixture's text, each a different length.
fn prompts() -> Vec<Vec<u32>> {
    let m = model().unwrap();
    let words = fixture().prompt;
    let w: Vec<&str> = words.split(' ').collect();
    (0..8).map(|k| m.tokenizer().encode(&w[..2 + k].join(" "), false).unwrap()).collect()
}

fn serial(m: &Llama, prompt: &[u32], tokens: usize, seed: u64) -> Vec<u32> {
    let opts = GenerateOptions {
        max_tokens: tokens,
        seed,
        sampler: std::sync::Arc::new(Temperature(0.8)),
        stop_at_eos: false,
        ..Default::default()
    };
    let mut g = m.generate(prompt, opts).unwrap();
    let mut v = Vec::new();
    while let Some(t) = g.next_token().unwrap() {
        v.push(t.id);
    }
    v
}

#[test]
fn tokio_tasks_share_one_model_and_give_the_serial_results() {
    let Some(m) = model() else { return };
    let ps = prompts();
    const TOKENS: usize = 3;
    let want: Vec<Vec<u32>> = (0..8).map(|k| serial(m, &ps[k], TOKENS, k as u64)).collect();
    let before = rill::runtime::stats();
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(4).enable_all().build().unwrap();
    let got: Vec<(usize, Vec<u32>, String)> = rt.block_on(async {
        let mut handles = Vec::new();
        for task in 0..32usize {
            let (m, p) = (m.clone(), ps[task % 8].clone());
            handles.push(tokio::spawn(async move {
                let opts = GenerateOptions {
                    max_tokens: TOKENS,
                    seed: (task % 8) as u64,
                    sampler: std::sync::Arc::new(Temperature(0.8)),
                    stop_at_eos: false,
                    ..Default::default()
                };
                let mut s = m.generate(&p, opts).unwrap().into_stream();
                let (mut ids, mut text) = (Vec::new(), String::new());
                while let Some(t) = s.next().await {
                    let t = t.unwrap();
                    ids.push(t.id);
                    text.push_str(&t.text);
                }
                (task, ids, text)
            }));
        }
        let mut out = Vec::new();
        for h in handles {
            out.push(h.await.unwrap());
        }
        out
    });
    drop(rt);
    for (task, ids, text) in &got {
        assert_eq!(ids, &want[task % 8], "task {task}");
        assert_eq!(text, &m.tokenizer().decode(ids, true).unwrap(), "task {task}: streamed text");
    }
    let after = rill::runtime::stats();
    assert_eq!(after.streams_created, before.streams_created, "no stream created");
    assert_eq!(after.threads_started, before.threads_started, "no thread started");
}

/// Rows of different lengths decoded together: each row's tokens are those it gets
/// alone (greedy).
#[test]
fn a_batch_of_prompts_decodes_each_row_as_alone() {
    let Some(m) = model() else { return };
    let ps: Vec<Vec<u32>> = prompts().into_iter().step_by(2).collect();
    const TOKENS: usize = 6;
    let opts = || GenerateOptions { max_tokens: TOKENS, stop_at_eos: false, ..Default::default() };
    let mut g = m.generate_batch(&ps, opts()).unwrap();
    let mut rows = vec![Vec::new(); ps.len()];
    while let Some(step) = g.next_tokens().unwrap() {
        for (r, t) in rows.iter_mut().zip(step) {
            r.extend(t.map(|t| t.id));
        }
    }
    for (k, p) in ps.iter().enumerate() {
        let mut alone = m.generate(p, opts()).unwrap();
        let mut want = Vec::new();
        while let Some(t) = alone.next_token().unwrap() {
            want.push(t.id);
        }
        assert_eq!(rows[k], want, "row {k} (prompt of {} tokens)", p.len());
        assert_eq!(g.generated(k), want.as_slice());
    }
}

/// A sampler that reads the history sees, at every step, each row's prompt followed by
/// exactly the tokens generated so far (rows of different lengths, one batch).
#[test]
fn a_history_reading_sampler_sees_each_rows_prompt_and_tokens() {
    let Some(m) = model() else { return };
    // Four rows, as the other batch tests (the model traces one shape per batch size).
    let ps: Vec<Vec<u32>> = prompts().into_iter().skip(1).step_by(2).collect();
    const TOKENS: usize = 5;
    let seen: std::sync::Arc<std::sync::Mutex<Vec<Vec<Vec<u32>>>>> = Default::default();
    let log = seen.clone();
    let sampler = move |logits: &Array, ctx: &rill::models::llama::SampleContext<'_>| {
        log.lock().unwrap().push(ctx.history.iter().map(|h| h.to_vec()).collect());
        logits.argmax(-1, false)
    };
    let opts = GenerateOptions {
        max_tokens: TOKENS,
        stop_at_eos: false,
        sampler: std::sync::Arc::new(sampler),
        ..Default::default()
    };
    let rows = run_rows(m, &ps, opts);
    let seen = seen.lock().unwrap();
    assert_eq!(seen.len(), TOKENS, "one sampler call a step");
    for (step, hist) in seen.iter().enumerate() {
        for (r, p) in ps.iter().enumerate() {
            let want: Vec<u32> = p.iter().chain(&rows[r].0[..step]).copied().collect();
            assert_eq!(hist[r], want, "step {step}, row {r}");
        }
    }
}

/// Every row's ids, texts and finish reasons, step by step.
fn run_rows(m: &Llama, prompts: &[Vec<u32>], opts: GenerateOptions) -> Vec<(Vec<u32>, String, Option<FinishReason>)> {
    let mut g = m.generate_batch(prompts, opts).unwrap();
    let mut rows = vec![(Vec::new(), String::new(), None); prompts.len()];
    while let Some(step) = g.next_tokens().unwrap() {
        for (r, t) in rows.iter_mut().zip(step) {
            if let Some(t) = t {
                r.0.push(t.id);
                r.1.push_str(&t.text);
                r.2 = t.finish;
            }
        }
    }
    assert!(g.next_tokens().unwrap().is_none(), "nothing after the last step");
    rows
}

/// Steps built from the previous step's ids on the device (overlap, the default) give
/// the tokens of steps that wait for them, with rows stopping at different steps: one
/// by a stop string, the others at the budget; with a seeded temperature sampler (each
/// step's key) and greedy.
#[test]
fn overlapped_steps_give_the_tokens_of_waiting_ones() {
    let Some(m) = model() else { return };
    let f = fixture();
    let full = m.tokenizer().decode(&f.greedy[..8], true).unwrap();
    let cut = full.char_indices().nth(full.chars().count() / 2).unwrap().0;
    let stop: String = full[cut..].chars().take(3).collect();
    let mut ps: Vec<Vec<u32>> = prompts().into_iter().step_by(3).collect();
    ps.insert(1, f.prompt_ids.clone());
    let samplers: [std::sync::Arc<dyn rill::models::llama::Sampler>; 2] =
        [std::sync::Arc::new(Temperature(0.8)), std::sync::Arc::new(rill::models::llama::Greedy)];
    for sampler in samplers {
        let opts = |overlap| GenerateOptions {
            max_tokens: 10,
            stop_at_eos: false,
            stop: vec![stop.clone()],
            seed: 11,
            sampler: sampler.clone(),
            overlap,
            ..Default::default()
        };
        let waiting = run_rows(m, &ps, opts(false));
        let overlapped = run_rows(m, &ps, opts(true));
        assert_eq!(overlapped, waiting);
        assert!(waiting.iter().any(|r| r.2 == Some(FinishReason::MaxTokens)), "{waiting:?}");
    }
    let greedy = run_rows(m, &ps, opts_greedy(&stop));
    assert_eq!(greedy[1].2, Some(FinishReason::Stop), "the fixture's prompt stops at {stop:?}");
}

fn opts_greedy(stop: &str) -> GenerateOptions {
    GenerateOptions { max_tokens: 10, stop_at_eos: false, stop: vec![stop.to_string()], ..Default::default() }
}

/// A stop string ends the text before it (never emitting it); the budget ends the rest.
#[test]
fn stop_strings_and_the_token_budget() {
    let Some(m) = model() else { return };
    let f = fixture();
    let full = m.tokenizer().decode(&f.greedy[..12], true).unwrap();
    // A stop string from the middle of the greedy continuation.
    let cut = full.char_indices().nth(full.chars().count() / 2).unwrap().0;
    let stop: String = full[cut..].chars().take(4).collect();
    let at = full.find(&stop).unwrap();
    let opts = GenerateOptions { max_tokens: 12, stop_at_eos: false, stop: vec![stop.clone()], ..Default::default() };
    let mut g = m.generate(&f.prompt_ids, opts).unwrap();
    let mut text = String::new();
    while let Some(t) = g.next_token().unwrap() {
        text.push_str(&t.text);
    }
    assert_eq!(g.finish_reason(0), Some(FinishReason::Stop));
    assert_eq!(text, full[..at], "text up to the stop string {stop:?}");
    assert!(g.next_token().unwrap().is_none(), "nothing after the last token");
    // Bad input is an error, not a panic.
    assert!(m.generate(&[], GenerateOptions::default()).is_err());
    let mut c = m.new_cache(1, 4).unwrap();
    assert!(m.forward(&[&[1, 2, 3, 4, 5]], &mut c).is_err(), "past the capacity");
    assert!(m.forward(&[&[u32::MAX]], &mut c).is_err(), "past the vocabulary");
}

/// bf16 weights and activations: the prefill's top logits within bf16's rounding over 30
/// layers, and the same most likely next token.
#[test]
fn bf16_logits_stay_close() {
    if model().is_none() {
        return;
    }
    let f = fixture();
    let path = rill::io::cache::default_llm().unwrap();
    let m = Llama::load(path, Device::cpu(), LoadOptions { dtype: DType::BF16, ..LoadOptions::default() }).unwrap();
    let mut cache = m.new_cache(1, 64).unwrap();
    let row = m.forward(&[&f.prompt_ids], &mut cache).unwrap().to_vec::<f32>().unwrap();
    let d = max_diff(&row, &f.top_ids, &f.top_logits);
    eprintln!("cpu bf16: largest top-logit difference {d}");
    assert!(d <= BF16_TOL, "bf16 top logits differ by {d} > {BF16_TOL}");
    let best = (0..row.len()).max_by(|&a, &b| row[a].total_cmp(&row[b])).unwrap();
    assert_eq!(best, f.top_ids[0], "the most likely next token");
}

/// The first token's logits from an eager forward written with rill's public ops (at
/// position 0 attention returns each head's value row, so q, k and rope drop out),
/// independent of the model's compiled step. With `perturb`, every feature of the
/// token's embedding first moves by -1, 0 or +1 bf16 rounding steps (seeded).
fn first_token_logits(dtype: DType, id: u32, perturb: Option<u64>) -> Vec<f32> {
    use rill::io::gguf::Gguf;
    use rill::models::llama::LlamaConfig;
    use rill::quant::{QMatrix, qmatmul};
    let g = Gguf::open(rill::io::cache::default_llm().unwrap()).unwrap();
    let c = LlamaConfig::from_gguf(&g).unwrap();
    let s = Device::cpu().default_stream().unwrap();
    let dense = |n: &str| g.get_on(n, &s).unwrap().astype(dtype).unwrap();
    let lin = |x: &Array, n: &str| qmatmul(x, &QMatrix::from_gguf(&g, n, &s).unwrap()).unwrap();
    let mut h = dense("token_embd.weight").take(&Array::from_slice(&[id as i32], &[1]).unwrap(), 0).unwrap();
    if let Some(seed) = perturb {
        let mut rng = Rng::new(seed);
        let v: Vec<f64> = h.astype(DType::F64).unwrap().to_vec::<f64>().unwrap();
        let v: Vec<f64> = v.iter().map(|&x| x + ((rng.next_u64() % 3) as f64 - 1.0) * x.abs() / 256.0).collect();
        h = Array::from_slice(&v, &[1, c.hidden]).unwrap().astype(dtype).unwrap();
    }
    let (kv, group, hd) = (c.kv_heads, c.heads / c.kv_heads, c.head_dim);
    for i in 0..c.layers {
        let b = format!("blk.{i}");
        let a = h.rms_norm(Some(&dense(&format!("{b}.attn_norm.weight"))), c.rms_eps).unwrap();
        let v = lin(&a, &format!("{b}.attn_v.weight")).reshape(&[kv as isize, 1, hd as isize]).unwrap();
        let o = v.broadcast_to(&[kv, group, hd]).unwrap().reshape(&[1, (kv * group * hd) as isize]).unwrap();
        h = h.add(lin(&o, &format!("{b}.attn_output.weight"))).unwrap();
        let f = h.rms_norm(Some(&dense(&format!("{b}.ffn_norm.weight"))), c.rms_eps).unwrap();
        let gate = lin(&f, &format!("{b}.ffn_gate.weight")).silu().unwrap();
        let gu = gate.mul(lin(&f, &format!("{b}.ffn_up.weight"))).unwrap();
        h = h.add(lin(&gu, &format!("{b}.ffn_down.weight"))).unwrap();
    }
    let h = h.rms_norm(Some(&dense("output_norm.weight")), c.rms_eps).unwrap();
    lin(&h, "token_embd.weight").astype(DType::F32).unwrap().to_vec::<f32>().unwrap()
}

/// Largest bf16 logit difference from transformers' float32 ones at the first position
/// that tests on any device accept (tests/gpu_llama.rs). The first token carries this
/// model's outsized activations (features past 20,000 from layer 11, cancelled at layer
/// 28): in bf16 their rounding decides several tenths of a logit, so equally valid orders
/// of rounding land anywhere in about 0.3 to 1.4 (`first_position_bf16_is_ill_conditioned`).
const BF16_FIRST_TOL: f64 = 2.0;

/// The premise of [`BF16_FIRST_TOL`]: perturbations of the first token's embedding within
/// one bf16 rounding step move its float32 logits by hundredths but its bf16 logits by
/// up to more than 1.0. The eager forward itself matches the fixture in float32.
#[test]
fn first_position_bf16_is_ill_conditioned() {
    if model().is_none() {
        return;
    }
    let f = fixture();
    let (id, want) = (f.prompt_ids[0], &f.probe_logits[0]);
    let diff = |row: &[f32]| max_diff(row, &f.probe_ids, want);
    assert!(diff(&first_token_logits(DType::F32, id, None)) <= LOGIT_TOL, "the eager float32 forward");
    let (mut f32_worst, mut bf16_worst) = (0.0f64, 0.0f64);
    for seed in 1..=10 {
        f32_worst = f32_worst.max(diff(&first_token_logits(DType::F32, id, Some(seed))));
        bf16_worst = bf16_worst.max(diff(&first_token_logits(DType::BF16, id, Some(seed))));
    }
    eprintln!("first position under perturbations: f32 {f32_worst:.3}, bf16 {bf16_worst:.3}");
    assert!(f32_worst <= 0.1, "float32 moves by {f32_worst}: the perturbation is not small");
    assert!(bf16_worst > 1.0, "bf16 moves by only {bf16_worst}: BF16_FIRST_TOL could be tightened");
    assert!(bf16_worst <= BF16_FIRST_TOL, "bf16 moves by {bf16_worst} > {BF16_FIRST_TOL}");
}
