//! `rill bench generate`: the language model's prefill and decode, beside
//! `bench/hf_generate_bench.py` (Hugging Face transformers on the same GGUF file, the same
//! token ids, greedy, end of sequence ignored). The model flags are `rill generate`'s
//! (`--model`, `--device`, `--dtype`, `--dequantize`).
//!
//! One JSON object a line:
//! - `{"id": "generate:prefill:p<P>", "impl": "rill", "dtype", "seconds"}`: one forward
//!   pass over a prompt of `P` tokens into an empty cache, logits evaluated;
//! - `{"id": "generate:decode:b<B>:n<N>", "impl": "rill", "dtype", "seconds",
//!   "tokens_per_s"}`: `B` prompts of 16 tokens, `N` new tokens each; `seconds` is the time
//!   of the `N - 1` decode steps after the first token (the first comes out of the
//!   prefill) and `tokens_per_s` is `B * (N - 1) / seconds` (the id ends in `:no-overlap`
//!   with `--no-overlap`), with the runtime counters of a step: `nodes_per_step`,
//!   `graph_launches_per_step`, `graph_node_updates_per_step` and `donated_per_step`
//!   (caches written in place; `rill::runtime::stats`).
//!
//! Token ids come from a fixed generator that the peer shares. Each figure is the median
//! of repeated runs after a warm-up run, which traces the shapes.

use std::time::Instant;

use clap::Args;
use rill::models::llama::GenerateOptions;

use crate::bench::median_of;
use crate::generate::ModelArgs;

#[derive(Args)]
pub struct GenerateBenchArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    /// Prompt lengths of the prefill figure (comma-separated)
    #[arg(long, value_delimiter = ',', default_value = "512")]
    pub prefill: Vec<usize>,
    /// Batch sizes of the decode figure (comma-separated; default 1 on the CPU, 1,64 on a GPU)
    #[arg(long, value_delimiter = ',')]
    pub batch: Vec<usize>,
    /// New tokens per row of the decode figure
    #[arg(long, default_value_t = 128)]
    pub new_tokens: usize,
    /// Timed runs per figure (the median is printed)
    #[arg(long, default_value_t = 3)]
    pub reps: usize,
    /// Decode with each step waiting for the previous step's ids on the host (overlap
    /// off), for comparison
    #[arg(long)]
    pub no_overlap: bool,
}

/// The prompt length of the decode figure.
const DECODE_PROMPT: usize = 16;

/// `n` token ids in `[100, vocab)` from the generator `bench/hf_generate_bench.py` shares,
/// continuing from `state`.
pub fn token_ids(state: &mut u64, n: usize, vocab: usize) -> Vec<u32> {
    let span = vocab.saturating_sub(100).max(1) as u64;
    (0..n)
        .map(|_| {
            *state = state.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            (100 + (*state >> 33) % span) as u32
        })
        .collect()
}

pub fn run(args: &GenerateBenchArgs) -> Result<(), String> {
    let n = args.new_tokens;
    if n < 2 {
        return Err("--new-tokens must be at least 2 (the first token comes out of the prefill)".into());
    }
    if args.prefill.contains(&0) || args.batch.contains(&0) {
        return Err("--prefill lengths and --batch sizes must be at least 1".into());
    }
    let model = args.model.load()?;
    let device = model.stream().device();
    let dtype = model.dtype();
    let vocab = model.config().vocab;
    let err = |e: rill::Error| e.to_string();
    let dname = dtype.name();
    for &p in &args.prefill {
        let ids = token_ids(&mut 42, p, vocab);
        let s = median_of(1, args.reps, || -> Result<f64, String> {
            let mut cache = model.new_cache(1, p).map_err(err)?;
            let t = Instant::now();
            model.forward(&[&ids], &mut cache).map_err(err)?.eval().map_err(err)?;
            Ok(t.elapsed().as_secs_f64())
        })?;
        println!(
            "{{\"id\": \"generate:prefill:p{p}\", \"impl\": \"rill\", \"dtype\": \"{dname}\", \"seconds\": {s:.6}}}"
        );
    }
    let batches =
        if args.batch.is_empty() { if device.is_gpu() { vec![1, 64] } else { vec![1] } } else { args.batch.clone() };
    for &b in &batches {
        let mut state = 7;
        let prompts: Vec<Vec<u32>> = (0..b).map(|_| token_ids(&mut state, DECODE_PROMPT, vocab)).collect();
        let mut per_step = (0.0, 0.0, 0.0, 0.0);
        let s = median_of(1, args.reps, || -> Result<f64, String> {
            let opts =
                GenerateOptions { max_tokens: n, stop_at_eos: false, overlap: !args.no_overlap, ..Default::default() };
            let mut g = model.generate_batch(&prompts, opts).map_err(err)?;
            g.next_tokens().map_err(err)?;
            let s0 = rill::runtime::stats();
            let t = Instant::now();
            let mut steps = 0;
            while g.next_tokens().map_err(err)?.is_some() {
                steps += 1;
            }
            let took = t.elapsed().as_secs_f64();
            if steps != n - 1 {
                return Err(format!("{steps} decode steps, expected {}", n - 1));
            }
            let s1 = rill::runtime::stats();
            let per = |a: u64, b: u64| (b - a) as f64 / steps as f64;
            per_step = (
                per(s0.nodes_computed, s1.nodes_computed),
                per(s0.graph_launches, s1.graph_launches),
                per(s0.graph_node_updates, s1.graph_node_updates),
                per(s0.buffers_donated, s1.buffers_donated),
            );
            Ok(took)
        })?;
        let rate = (b * (n - 1)) as f64 / s;
        let mode = if args.no_overlap { ":no-overlap" } else { "" };
        println!(
            "{{\"id\": \"generate:decode:b{b}:n{n}{mode}\", \"impl\": \"rill\", \"dtype\": \"{dname}\", \"seconds\": {s:.6}, \"tokens_per_s\": {rate:.1}, \"nodes_per_step\": {:.1}, \"graph_launches_per_step\": {:.2}, \"graph_node_updates_per_step\": {:.1}, \"donated_per_step\": {:.1}}}",
            per_step.0, per_step.1, per_step.2, per_step.3
        );
    }
    Ok(())
}
