//! `rill bench sdpa`: scaled dot-product attention over a generated grid (batch·heads in
//! {16, 128, 512}, T in {128, .., 4096}, D in {64, 128}, bf16 and f16, no mask, causal,
//! and a `[B, 1, 1, T]` padding mask hiding the last quarter of the keys of every other
//! batch), one JSON object a line: `{"id", "impl": "rill", "seconds", "tflops"}`. The
//! PyTorch peer (`bench/torch_bench.py sdpa`) prints the same ids with
//! `F.scaled_dot_product_attention`. A figure is the median of 5 repetitions (after one
//! warm-up) of 8 calls on the same inputs evaluated together, divided by 8. FLOPs count
//! `4 · bh · Tq · Tk · D`, halved for causal. `RILL_SDPA_FILTER=a,b` times only the ids
//! containing every one of the comma-separated pieces (the peer reads it too).
//!
//! Decode rows follow ([`decode_grid`]): one query row of 9 query heads against 3
//! key/value heads (grouped-query attention, SmolLM2's heads), head dim 64, bf16, batch 1
//! and 64, over a cache of `cap` positions whose first `len` are attended (a bool
//! `[B, 1, 1, cap]` mask, as a generation step's): ids
//! `sdpa:decode:b<B>:cap<cap>:len<len>:d64:bf16`; FLOPs count `4 · B · 9 · len · D`.

use std::time::Instant;

use rill::random::{Key, uniform};
use rill::{Array, AttentionMask, DType, Result};

/// Heads per batch entry (bh = B · 16).
const HEADS: usize = 16;
/// Calls evaluated together per repetition.
const CALLS: usize = 8;

/// The decode rows: (batch, cache positions, attended positions).
pub(crate) fn decode_grid() -> Vec<(usize, usize, usize)> {
    let mut v = Vec::new();
    for b in [1, 64] {
        for cap in [256, 1024, 4096] {
            for len in [cap / 16 * 5, cap] {
                v.push((b, cap, len));
            }
        }
    }
    v
}

/// Query and key/value heads and head dim of the decode rows.
const DEC_HEADS: (usize, usize, usize) = (9, 3, 64);

/// The grid: (bh, T, D, dtype, mask).
pub(crate) fn grid() -> Vec<(usize, usize, usize, DType, &'static str)> {
    let mut v = Vec::new();
    for bh in [16, 128, 512] {
        for t in [128, 512, 1024, 2048, 4096] {
            for d in [64, 128] {
                for dt in [DType::BF16, DType::F16] {
                    for m in ["none", "causal", "padding"] {
                        v.push((bh, t, d, dt, m));
                    }
                }
            }
        }
    }
    v
}

fn filled(shape: &[usize], dtype: DType, seed: u64) -> Result<Array> {
    let a = uniform(Key::new(seed), shape, -1.0, 1.0, DType::F32)?.astype(dtype)?;
    a.eval()?;
    Ok(a)
}

/// The median of 5 repetitions (after one warm-up) of [`CALLS`] attentions evaluated
/// together, divided by [`CALLS`].
fn median_seconds(q: &Array, k: &Array, v: &Array, mask: AttentionMask<'_>) -> Result<f64> {
    let rep = || -> Result<f64> {
        let t0 = Instant::now();
        let outs: Vec<Array> =
            (0..CALLS).map(|_| rill::scaled_dot_product_attention(q, k, v, mask, None)).collect::<Result<_>>()?;
        rill::eval(&outs)?;
        Ok(t0.elapsed().as_secs_f64() / CALLS as f64)
    };
    rep()?;
    let mut ts: Vec<f64> = (0..5).map(|_| rep()).collect::<Result<_>>()?;
    ts.sort_by(|a, b| a.total_cmp(b));
    Ok(ts[ts.len() / 2])
}

/// The inputs of one shape: (batch×heads, tokens, head dim, dtype), q/k/v, the padding mask.
type Inputs = ((usize, usize, usize, DType), [Array; 3], Array);

/// Times the grid on the ambient stream's device.
pub(crate) fn run() -> Result<()> {
    let filter = std::env::var("RILL_SDPA_FILTER").unwrap_or_default();
    let mut inputs: Option<Inputs> = None;
    for (bh, t, d, dt, m) in grid() {
        let id = format!("sdpa:bh{bh}:t{t}:d{d}:{}:{m}", dt.name());
        if !filter.split(',').filter(|f| !f.is_empty()).all(|f| id.contains(f)) {
            continue;
        }
        let key = (bh, t, d, dt);
        if inputs.as_ref().map(|i| i.0) != Some(key) {
            drop(inputs.take()); // free the previous inputs first
            let shape = [bh / HEADS, HEADS, t, d];
            let qkv = [filled(&shape, dt, 1)?, filled(&shape, dt, 2)?, filled(&shape, dt, 3)?];
            // Padding: the last quarter of the keys hidden in every other batch entry.
            let b = bh / HEADS;
            let keep: Vec<f32> = (0..b * t).map(|i| ((i / t) % 2 == 0 || i % t < t - t / 4) as u8 as f32).collect();
            let pad = Array::from_slice(&keep, &[b, 1, 1, t])?.astype(DType::Bool)?;
            pad.eval()?;
            inputs = Some((key, qkv, pad));
        }
        let Some((_, [q, k, v], pad)) = &inputs else { unreachable!("inputs were just made") };
        let mask = match m {
            "causal" => AttentionMask::Causal,
            "padding" => AttentionMask::Array(pad),
            _ => AttentionMask::None,
        };
        let s = median_seconds(q, k, v, mask)?;
        let flops = 4.0 * (bh * t * t * d) as f64 * if m == "causal" { 0.5 } else { 1.0 };
        println!("{{\"id\": \"{id}\", \"impl\": \"rill\", \"seconds\": {s:.9}, \"tflops\": {:.2}}}", flops / s / 1e12);
    }
    drop(inputs);
    let (hq, hkv, d) = DEC_HEADS;
    for (b, cap, len) in decode_grid() {
        let id = format!("sdpa:decode:b{b}:cap{cap}:len{len}:d{d}:bf16");
        if !filter.split(',').filter(|f| !f.is_empty()).all(|f| id.contains(f)) {
            continue;
        }
        let q = filled(&[b, hq, 1, d], DType::BF16, 1)?;
        let k = filled(&[b, hkv, cap, d], DType::BF16, 2)?;
        let v = filled(&[b, hkv, cap, d], DType::BF16, 3)?;
        let keep: Vec<f32> = (0..b * cap).map(|i| ((i % cap) < len) as u8 as f32).collect();
        let mask = Array::from_slice(&keep, &[b, 1, 1, cap])?.astype(DType::Bool)?;
        mask.eval()?;
        let s = median_seconds(&q, &k, &v, AttentionMask::Array(&mask))?;
        let flops = 4.0 * (b * hq * len * d) as f64;
        println!("{{\"id\": \"{id}\", \"impl\": \"rill\", \"seconds\": {s:.9}, \"tflops\": {:.3}}}", flops / s / 1e12);
    }
    Ok(())
}
