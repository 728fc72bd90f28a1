//! `rill bench embed`: sentence embeddings end to end, strings in, normalised vectors out
//! (tokenization, batching, the encoder, pooling and the copy back to the host), beside
//! `bench/st_embed_bench.py` (sentence-transformers, the same sentences and batch size).
//!
//! Two figures per dtype (f32, f16 and bf16 on a GPU; f32 on the CPU): sentences per
//! second for batches of 128 sentences of about 100 tokens, and the latency of one short
//! sentence; and once, the time the tokenizer takes for one batch on one thread. Each is the median of repeated runs after a warm-up run (which traces the
//! batch shapes).

use std::path::Path;

use rill::models::bert::Embedder;
use rill::{DType, Device};

pub const BENCHMARKS: &[(&str, &str)] =
    &[("embed", "sentence embeddings, batch 128 x ~100 tokens and one short sentence (--model DIR)")];

/// Words that are one token each in a BERT uncased vocabulary.
const WORDS: [&str; 64] = [
    "the", "of", "and", "to", "in", "is", "was", "for", "on", "that", "with", "as", "by", "at", "from", "his", "her",
    "an", "they", "which", "this", "are", "were", "be", "has", "had", "it", "not", "or", "but", "one", "all", "new",
    "more", "also", "after", "first", "two", "time", "would", "some", "other", "there", "people", "year", "world",
    "city", "state", "into", "about", "over", "its", "only", "most", "like", "during", "between", "many", "made",
    "such", "under", "three", "where", "school",
];

/// `n` sentences of `words` words and a full stop, from a fixed generator (the Python
/// peer makes the same ones).
pub fn sentences(n: usize, words: usize) -> Vec<String> {
    let mut x: u64 = 42;
    (0..n)
        .map(|_| {
            let mut s: Vec<&str> = Vec::with_capacity(words);
            for _ in 0..words {
                x = x.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                s.push(WORDS[((x >> 33) % WORDS.len() as u64) as usize]);
            }
            s.join(" ") + "."
        })
        .collect()
}

/// The sentence of the latency figure.
pub const SHORT: &str = "A short sentence.";

pub fn run(device: Device, model: Option<&Path>) -> Result<(), String> {
    let dir = match model {
        Some(d) => d.to_path_buf(),
        None => rill::io::cache::default_model().map_err(|e| format!("cannot get the default model: {e}"))?,
    };
    let gpu = device.is_gpu();
    let dtypes: &[DType] = if gpu { &[DType::F32, DType::F16, DType::BF16] } else { &[DType::F32] };
    // 97 words and a full stop: 100 tokens with [CLS] and [SEP].
    let batches = if gpu { 16 } else { 2 };
    let batch = 128;
    let texts = sentences(batch * batches, 97);
    println!("rill bench embed on {device}: {}", dir.display());
    for &dt in dtypes {
        let e = Embedder::load(&dir, device, dt).and_then(|e| e.with_batch_size(batch)).map_err(|e| e.to_string())?;
        let tokens: usize = texts
            .iter()
            .map(|s| e.token_ids(s).map(|t| t.len()))
            .sum::<rill::Result<usize>>()
            .map_err(|e| e.to_string())?;
        let mean_tokens = tokens as f64 / texts.len() as f64;
        if dt == dtypes[0] {
            // The share of the batch figure the tokenizer takes on one thread (`embed`
            // itself tokenizes large inputs in parallel on the runtime's pool).
            let t = crate::bench::time(0, 3, || texts[..batch].iter().try_for_each(|s| e.token_ids(s).map(|_| ())))
                .map_err(|e| e.to_string())?;
            println!("tokenize {batch} sentences on one thread: {:8.3} ms", t * 1e3);
        }
        let reps = if gpu { 10 } else { 3 };
        let t = crate::bench::time(1, reps, || e.embed(&texts).map(|_| ())).map_err(|e| e.to_string())?;
        println!(
            "embed    {dt} batch {batch} x {mean_tokens:.0} tokens: {:9.1} sentences/s  ({:8.3} ms per batch)",
            texts.len() as f64 / t,
            t / batches as f64 * 1e3
        );
        let reps = if gpu { 200 } else { 20 };
        let t = crate::bench::time(3, reps, || e.embed(&[SHORT]).map(|_| ())).map_err(|e| e.to_string())?;
        println!("embed    {dt} one short sentence: {:8.3} ms", t * 1e3);
    }
    Ok(())
}
