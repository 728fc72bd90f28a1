//! Benchmarks behind `rill bench`; their figures go to docs/PERFORMANCE.md beside the
//! peers measured by `bench/numpy_bench.py` (CPU) and `bench/torch_bench.py` (GPU).
//!
//! Each benchmark warms up, then reports the median of its timed repetitions. Inputs are
//! evaluated before timing; each repetition builds the op's graph and evaluates it.

use std::time::Instant;

use rill::{Array, DType, Device, Result};

pub(crate) fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

/// Times `f`: `warm` calls first, then the median seconds of `reps` calls
/// (`RILL_BENCH_REPS` raises the count, for profiling one figure).
pub(crate) fn time(warm: usize, reps: usize, mut f: impl FnMut() -> Result<()>) -> Result<f64> {
    median_of(warm, reps, || {
        let t = Instant::now();
        f()?;
        Ok(t.elapsed().as_secs_f64())
    })
}

/// [`time`] for a figure `f` measures itself (seconds of part of each call): `warm` calls
/// first, then the median of `reps` (`RILL_BENCH_REPS` raises the count).
pub(crate) fn median_of<E>(
    warm: usize,
    reps: usize,
    mut f: impl FnMut() -> std::result::Result<f64, E>,
) -> std::result::Result<f64, E> {
    let reps = std::env::var("RILL_BENCH_REPS").ok().and_then(|v| v.parse().ok()).unwrap_or(0).max(reps).max(1);
    for _ in 0..warm {
        f()?;
    }
    let v = (0..reps).map(|_| f()).collect::<std::result::Result<Vec<f64>, E>>()?;
    Ok(median(v))
}

pub(crate) fn filled(shape: &[usize], dtype: DType, seed: u64) -> Result<Array> {
    let a = rill::random::uniform(rill::random::Key::new(seed), shape, -1.0, 1.0, DType::F32)?.astype(dtype)?;
    a.eval()?;
    Ok(a)
}

/// The process's threads as Linux reports them: (thread id, name, CPU it last ran on,
/// voluntary and involuntary context switches). Empty elsewhere. `RILL_BENCH_THREADS=1`
/// prints the switches each thread made during `overhead` (a thread that sleeps and is
/// woken once per eval shows about 210 voluntary switches).
struct ThreadStats(Vec<(u32, String, i64, u64, u64)>);

impl ThreadStats {
    fn read() -> ThreadStats {
        let mut v = Vec::new();
        let Ok(dir) = std::fs::read_dir("/proc/self/task") else { return ThreadStats(v) };
        for e in dir.flatten() {
            let Some(tid) = e.file_name().to_str().and_then(|t| t.parse::<u32>().ok()) else { continue };
            let file = |f: &str| std::fs::read_to_string(e.path().join(f)).unwrap_or_default();
            let name = file("comm").trim().to_string();
            let status = file("status");
            let field = |key: &str| {
                status.lines().find_map(|l| l.strip_prefix(key)).and_then(|x| x.trim().parse::<u64>().ok()).unwrap_or(0)
            };
            // Field 39 of `stat` (the CPU), counted after the parenthesised name.
            let stat = file("stat");
            let cpu = stat
                .rsplit_once(')')
                .and_then(|(_, rest)| rest.split_whitespace().nth(36))
                .and_then(|x| x.parse().ok())
                .unwrap_or(-1);
            v.push((tid, name, cpu, field("voluntary_ctxt_switches:"), field("nonvoluntary_ctxt_switches:")));
        }
        v.sort();
        ThreadStats(v)
    }
    fn print_since(&self, before: &ThreadStats) {
        for (tid, name, cpu, vol, inv) in &self.0 {
            let (v0, i0) = before.0.iter().find(|b| b.0 == *tid).map(|b| (b.3, b.4)).unwrap_or((0, 0));
            if vol - v0 + (inv - i0) > 0 {
                println!("  thread {tid} {name}: cpu {cpu}, switches {} voluntary, {} involuntary", vol - v0, inv - i0);
            }
        }
    }
}

/// Independent ops evaluated together by `batched`.
const BATCH: usize = 8;

/// Median seconds per op when `BATCH` independent copies of `op` are evaluated by one
/// `rill::eval`: the kernel's own speed, with the fixed cost of an eval shared.
fn batched(op: impl Fn() -> Result<Array>) -> Result<f64> {
    let t = time(1, 5, || {
        let outs: Vec<Array> = (0..BATCH).map(|_| op()).collect::<Result<_>>()?;
        rill::eval(&outs)
    })?;
    Ok(t / BATCH as f64)
}

/// The benchmarks `run` knows, with what each times (`rill bench --list`).
pub const BENCHMARKS: &[(&str, &str)] = &[
    ("add", "elementwise add of two f32 vectors (GB/s)"),
    ("sum", "sum of an f32 vector (GB/s)"),
    ("unary", "square and exp of an f32 vector (GB/s)"),
    ("softmax", "softmax over the rows of an f32 matrix (GB/s)"),
    ("matmul", "square matrix product (GFLOP/s)"),
    ("fused", "an 8-op elementwise chain, compiled and not"),
    ("fused_reduce", "a reduction after an elementwise chain, compiled and not"),
    ("overhead", "the fixed cost of one eval of one small op"),
    ("record", "recording one lazy op"),
    ("chain", "dependent tiny ops"),
    ("chain_wide", "dependent ops on 2^20 elements"),
    ("ffn", "FFN blocks (matmul, bias, GELU, matmul, bias, residual, layer norm), eager and compiled; only when named"),
    ("attention", "attention as matmul-scale-softmax-matmul, eager and compiled; only when named"),
    ("adam", "compiled Adam and AdamW steps over many parameters; only when named"),
    ("sdpa", "scaled_dot_product_attention over a grid of shapes, dtypes and masks; only when named"),
    ("qmatmul", "quantized matmul (Q4_0/Q4_1/Q8_0) over SmolLM2's weight shapes, decode and prefill; only when named"),
    (
        "train",
        "forward plus backward of a 4-layer MLP and a transformer encoder layer, eager and compiled; only when named \
         (train:mlp, train:encoder:bf16 and so on run one workload or case)",
    ),
];
/// The FFN block cases, generated (the PyTorch peer's `ffn_cases` makes the same list):
/// (dtype, model width, rows); the hidden width is 4x. bf16 over every width and row
/// count, f32 over every width at the middle row count (the f32 products dominate the
/// run time).
pub(crate) fn ffn_cases(gpu: bool) -> Vec<(DType, usize, usize)> {
    let (widths, rows): (&[usize], &[usize]) =
        if gpu { (&[512, 1024, 2048, 4096], &[1024, 4096, 16384]) } else { (&[128, 256], &[64, 256]) };
    let mut v = Vec::new();
    for &w in widths {
        for &r in rows {
            v.push((DType::BF16, w, r));
        }
    }
    for &w in widths {
        v.push((DType::F32, w, rows[rows.len() / 2]));
    }
    v
}

/// The attention cases: (batch x heads, tokens, head dim), bf16.
pub(crate) fn attention_cases(gpu: bool) -> Vec<(usize, usize, usize)> {
    let (bh, tokens): (&[usize], &[usize]) = if gpu { (&[16, 64, 512], &[128, 512, 2048]) } else { (&[4], &[64, 128]) };
    let mut v = Vec::new();
    for &b in bh {
        for &t in tokens {
            for d in [64, 128] {
                v.push((b, t, d));
            }
        }
    }
    v
}

/// The optimizer cases: (name, element counts of the parameters).
pub(crate) fn adam_cases(gpu: bool) -> Vec<(String, Vec<usize>)> {
    let (counts, exps): (&[usize], &[u32]) = if gpu { (&[16, 64], &[16, 19, 22]) } else { (&[8], &[10, 14]) };
    let mut v = Vec::new();
    for &c in counts {
        for &e in exps {
            v.push((format!("{c}x2^{e}"), vec![1usize << e; c]));
        }
    }
    // Dozens of parameters of mixed sizes, as a model has.
    let (lo, hi) = (exps[0], exps[exps.len() - 1]);
    let mixed: Vec<usize> = (0..48).map(|i| 1usize << (lo + i as u32 % (hi - lo + 1))).collect();
    v.push(("48mixed".into(), mixed));
    v
}

/// The FFN block: `layer_norm(x + (gelu_tanh(x @ w1 + b1) @ w2 + b2))`.
fn ffn(x: &[Array]) -> Result<Vec<Array>> {
    let (inp, w1, b1, w2, b2, g, b) = (&x[0], &x[1], &x[2], &x[3], &x[4], &x[5], &x[6]);
    let h = inp.matmul(w1)?.add(b1)?.gelu_tanh()?;
    let y = h.matmul(w2)?.add(b2)?.add(inp)?;
    Ok(vec![y.layer_norm(Some(g), Some(b), 1e-5)?])
}

/// Attention as ops: `softmax(q @ kᵀ * d^-1/2) @ v` over `[batch x heads, tokens, d]`.
fn attention(x: &[Array]) -> Result<Vec<Array>> {
    let d = x[0].shape()[2] as f64;
    let s = x[0].matmul(&x[1].transpose(&[0, 2, 1])?)?.mul(1.0 / d.sqrt())?;
    Ok(vec![s.softmax(-1)?.matmul(&x[2])?])
}

/// The fused-block benchmarks (`ffn`, `attention`, `adam`): run only when named.
fn blocks(device: Device, names: &[String]) -> Result<()> {
    let gpu = device.is_gpu();
    let named = |n: &str| names.iter().any(|x| x == n);
    if named("ffn") {
        for (dt, w, r) in ffn_cases(gpu) {
            let ins = vec![
                filled(&[r, w], dt, 21)?,
                filled(&[w, 4 * w], dt, 22)?.mul(0.05)?,
                filled(&[4 * w], dt, 23)?,
                filled(&[4 * w, w], dt, 24)?.mul(0.05)?,
                filled(&[w], dt, 25)?,
                filled(&[w], dt, 26)?,
                filled(&[w], dt, 27)?,
            ];
            rill::eval(&ins)?;
            let eager = time(2, 5, || ffn(&ins)?[0].eval())?;
            let compiled = rill::compile(ffn);
            let t = time(2, 5, || compiled.call(&ins)?[0].eval())?;
            let flops = 2.0 * 2.0 * (r * w * 4 * w) as f64;
            println!(
                "ffn {dt} w={w} rows={r}: eager {:8.3} ms, compiled {:8.3} ms ({:6.1} TFLOP/s)",
                eager * 1e3,
                t * 1e3,
                flops / t / 1e12
            );
        }
    }
    if named("attention") {
        for (bh, t_, d) in attention_cases(gpu) {
            let dt = DType::BF16;
            let ins = vec![filled(&[bh, t_, d], dt, 31)?, filled(&[bh, t_, d], dt, 32)?, filled(&[bh, t_, d], dt, 33)?];
            let eager = time(2, 5, || attention(&ins)?[0].eval())?;
            let compiled = rill::compile(attention);
            let t = time(2, 5, || compiled.call(&ins)?[0].eval())?;
            println!("attention bf16 bh={bh} t={t_} d={d}: eager {:8.3} ms, compiled {:8.3} ms", eager * 1e3, t * 1e3);
        }
    }
    if named("adam") {
        for (name, sizes) in adam_cases(gpu) {
            for adamw in [false, true] {
                let opt = if adamw { rill::optim::Adam::adamw(1e-3, 0.01) } else { rill::optim::Adam::new(1e-3) };
                let mut params: Vec<Array> = sizes
                    .iter()
                    .enumerate()
                    .map(|(i, &n)| filled(&[n], DType::F32, 100 + i as u64))
                    .collect::<Result<_>>()?;
                let grads: Vec<Array> = sizes
                    .iter()
                    .enumerate()
                    .map(|(i, &n)| filled(&[n], DType::F32, 500 + i as u64))
                    .collect::<Result<_>>()?;
                let mut state = rill::optim::AdamState::new(opt, &params)?;
                let t = time(3, 20, || {
                    params = state.step(&params, &grads)?;
                    let (m, v) = state.moments();
                    let all: Vec<Array> = params.iter().chain(m).chain(v).cloned().collect();
                    rill::eval(&all)
                })?;
                let elems: usize = sizes.iter().sum();
                // Read p, g, m, v; write p, m, v.
                let gbs = 7.0 * 4.0 * elems as f64 / t / 1e9;
                let which = if adamw { "adamw" } else { "adam" };
                println!("{which} f32 {name}: compiled {:8.3} ms ({gbs:6.1} GB/s)", t * 1e3);
            }
        }
    }
    Ok(())
}

pub fn run(device: Device, names: &[String]) -> Result<()> {
    let s = device.default_stream()?;
    let _g = s.enter();
    let gpu = device.is_gpu();
    let want = |n: &str| names.is_empty() || names.iter().any(|x| x == n);
    println!("rill bench on {device}");
    blocks(device, names)?;
    // The attention grid takes about a minute on a GPU: only when named.
    if names.iter().any(|x| x == "sdpa") {
        crate::sdpa_bench::run()?;
    }
    if names.iter().any(|x| x == "qmatmul") {
        crate::qmatmul_bench::run()?;
    }
    let train: Vec<&str> = names.iter().filter_map(|x| x.strip_prefix("train")).collect();
    if !train.is_empty() {
        crate::bench_train::run(device, &train)?;
    }
    if want("add") {
        let n = if gpu { 1usize << 28 } else { 1 << 24 };
        let (a, b) = (filled(&[n], DType::F32, 1)?, filled(&[n], DType::F32, 2)?);
        let t = time(3, 20, || a.add(&b)?.eval())?;
        println!("add      f32 n=2^{}: {:8.3} ms  {:7.1} GB/s", n.trailing_zeros(), t * 1e3, 12.0 * n as f64 / t / 1e9);
        if gpu {
            let t = batched(|| a.add(&b))?;
            println!("  batched x{BATCH}: {:8.3} ms  {:7.1} GB/s per op", t * 1e3, 12.0 * n as f64 / t / 1e9);
        }
    }
    if want("sum") {
        let n = if gpu { 1usize << 28 } else { 1 << 24 };
        let a = filled(&[n], DType::F32, 3)?;
        let t = time(3, 20, || a.sum(&[], false)?.eval())?;
        println!("sum      f32 n=2^{}: {:8.3} ms  {:7.1} GB/s", n.trailing_zeros(), t * 1e3, 4.0 * n as f64 / t / 1e9);
        if gpu {
            let t = batched(|| a.sum(&[], false))?;
            println!("  batched x{BATCH}: {:8.3} ms  {:7.1} GB/s per op", t * 1e3, 4.0 * n as f64 / t / 1e9);
        }
    }
    if want("unary") {
        let n = if gpu { 1usize << 28 } else { 1 << 24 };
        let a = filled(&[n], DType::F32, 18)?;
        let t_sq = time(3, 20, || a.square()?.eval())?;
        let t_exp = time(3, 20, || a.exp()?.eval())?;
        println!(
            "unary    f32 n=2^{}: square {:8.3} ms ({:6.1} GB/s), exp {:8.3} ms ({:6.1} GB/s)",
            n.trailing_zeros(),
            t_sq * 1e3,
            8.0 * n as f64 / t_sq / 1e9,
            t_exp * 1e3,
            8.0 * n as f64 / t_exp / 1e9
        );
    }
    if want("softmax") {
        let (r, c) = if gpu { (65536, 4096) } else { (4096, 4096) };
        let a = filled(&[r, c], DType::F32, 4)?;
        let t = time(3, 20, || a.softmax(-1)?.eval())?;
        println!("softmax  f32 {r}x{c}: {:8.3} ms  {:7.1} GB/s", t * 1e3, 8.0 * (r * c) as f64 / t / 1e9);
        if gpu {
            let t = batched(|| a.softmax(-1))?;
            println!("  batched x{BATCH}: {:8.3} ms  {:7.1} GB/s per op", t * 1e3, 8.0 * (r * c) as f64 / t / 1e9);
        }
    }
    if want("matmul") {
        let (n, dt) = if gpu { (8192, DType::BF16) } else { (1024, DType::F32) };
        let (a, b) = (filled(&[n, n], dt, 5)?, filled(&[n, n], dt, 6)?);
        let t = time(2, 10, || a.matmul(&b)?.eval())?;
        println!("matmul   {dt} {n}^3: {:8.3} ms  {:7.1} GFLOP/s", t * 1e3, 2.0 * (n as f64).powi(3) / t / 1e9);
    }
    if want("fused") {
        // The 8-op chain, compiled (one fused kernel) and not compiled.
        let n = if gpu { 1usize << 28 } else { 1 << 24 };
        let (a, b) = (filled(&[n], DType::F32, 9)?, filled(&[n], DType::F32, 10)?);
        let chain = |x: &[Array]| -> Result<Vec<Array>> {
            let (a, b) = (&x[0], &x[1]);
            let y = a.mul(b)?.add(1.0)?;
            let y = y.tanh()?.mul(0.5)?.add(a)?;
            let y = y.mul(&y)?.sub(b)?;
            Ok(vec![y.sigmoid()?])
        };
        let eager = time(2, 10, || chain(&[a.clone(), b.clone()])?[0].eval())?;
        let compiled = rill::compile(chain);
        let t = time(2, 10, || compiled.call(&[a.clone(), b.clone()])?[0].eval())?;
        println!(
            "chain8   f32 n=2^{}: eager {:8.3} ms, compiled {:8.3} ms ({:6.1} GB/s)",
            n.trailing_zeros(),
            eager * 1e3,
            t * 1e3,
            12.0 * n as f64 / t / 1e9
        );
        // Calls in flight: `k` calls recorded, then evaluated together, so each call's
        // latency (allocation, launch, completion) overlaps the others' kernels.
        let k = 8;
        let t = time(1, 5, || {
            let ys =
                (0..k).map(|_| Ok(compiled.call(&[a.clone(), b.clone()])?.remove(0))).collect::<Result<Vec<_>>>()?;
            rill::eval(&ys)
        })? / k as f64;
        println!(
            "chain8   compiled, {k} calls in flight: {:8.3} ms/call ({:6.1} GB/s)",
            t * 1e3,
            12.0 * n as f64 / t / 1e9
        );
        let (r, c) = if gpu { (8192, 4096) } else { (1024, 4096) };
        let (h, bias, res) =
            (filled(&[r, c], DType::F32, 11)?, filled(&[c], DType::F32, 12)?, filled(&[r, c], DType::F32, 13)?);
        let block = rill::compile(|x: &[Array]| Ok(vec![x[0].add(&x[1])?.gelu()?.add(&x[2])?]));
        let t = time(2, 10, || block.call(&[h.clone(), bias.clone(), res.clone()])?[0].eval())?;
        println!("bias_gelu_residual compiled {r}x{c}: {:8.3} ms", t * 1e3);
        let t = time(1, 5, || {
            let ys = (0..k)
                .map(|_| Ok(block.call(&[h.clone(), bias.clone(), res.clone()])?.remove(0)))
                .collect::<Result<Vec<_>>>()?;
            rill::eval(&ys)
        })? / k as f64;
        println!("bias_gelu_residual compiled, {k} calls in flight: {:8.3} ms/call", t * 1e3);
    }
    if want("fused_reduce") {
        // A reduction after an elementwise chain (row-wise squared distances, sum((a-b)^2)):
        // compiled with the reduction fused (the values are never stored) against the
        // chain compiled alone followed by the same sum (the values stored, then read).
        let (r, c) = if gpu { (16384, 16384) } else { (4096, 4096) };
        let (a, b) = (filled(&[r, c], DType::F32, 16)?, filled(&[c], DType::F32, 17)?);
        let elem = |x: &[Array]| x[0].sub(&x[1])?.square();
        let fused = rill::compile(move |x: &[Array]| Ok(vec![elem(x)?.sum(&[-1], false)?]));
        let values = rill::compile(move |x: &[Array]| Ok(vec![elem(x)?]));
        let t_fused = time(2, 10, || fused.call(&[a.clone(), b.clone()])?[0].eval())?;
        let t_stored = time(2, 10, || values.call(&[a.clone(), b.clone()])?[0].sum(&[-1], false)?.eval())?;
        let eager = time(2, 10, || elem(&[a.clone(), b.clone()])?.sum(&[-1], false)?.eval())?;
        println!(
            "fused_reduce f32 {r}x{c} row sums: fused {:8.3} ms ({:6.1} GB/s), chain then sum {:8.3} ms, eager {:8.3} ms",
            t_fused * 1e3,
            4.0 * (r * c) as f64 / t_fused / 1e9,
            t_stored * 1e3,
            eager * 1e3
        );
    }
    if want("overhead") {
        // The fixed cost of one `eval` of one small op: recording, scheduling, launch and
        // the completion signal.
        let (a, b) = (filled(&[1024], DType::F32, 14)?, filled(&[1024], DType::F32, 15)?);
        let before = rill::runtime::stats().linger_handoffs;
        let threads = ThreadStats::read();
        let t = time(10, 200, || a.add(&b)?.eval())?;
        let handed = rill::runtime::stats().linger_handoffs - before;
        println!(
            "overhead add f32 n=2^10, one eval: {:8.2} us ({handed} of 210 batches handed to a waiting job)",
            t * 1e6
        );
        if std::env::var("RILL_BENCH_THREADS").as_deref() == Ok("1") {
            ThreadStats::read().print_since(&threads);
        }
    }
    if want("record") {
        let x = filled(&[4], DType::F32, 7)?;
        let n = 100_000;
        let t = time(1, 5, || {
            let mut y = x.clone();
            for _ in 0..n {
                y = y.add(&x)?;
            }
            std::hint::black_box(&y);
            Ok(())
        })?;
        println!("record   one lazy op (add of two arrays): {:6.3} us", t / n as f64 * 1e6);
    }
    // `n` dependent `y * 1.0001` from `x`, then one eval: seconds per call.
    let chain = |x: &Array, n: usize| {
        time(2, 10, || {
            let mut y = x.clone();
            for _ in 0..n {
                y = y.mul(1.0001)?;
            }
            y.eval()
        })
    };
    if want("chain") {
        let n = 1000;
        let x = filled(&[16], DType::F32, 8)?;
        let s0 = rill::runtime::stats();
        let t = chain(&x, n)?;
        let s1 = rill::runtime::stats();
        println!("chain    {n} dependent tiny ops: {:8.3} ms  {:6.2} us/op", t * 1e3, t / n as f64 * 1e6);
        // What the runs above cost the GPU graphs: a replay that rewrites arguments or a new
        // graph is work the host does per batch.
        println!(
            "chain    graphs built {}, graph launches {}, graph node updates {}, device memory peak {} KiB",
            s1.graphs_built - s0.graphs_built,
            s1.graph_launches - s0.graph_launches,
            s1.graph_node_updates - s0.graph_node_updates,
            s1.bytes_peak / 1024
        );
    }
    if want("chain_wide") {
        // The same chain on 2^20 elements (4 MiB): on a GPU each kernel then takes longer than the
        // host needs to record it, so the figure is the device's time per dependent kernel.
        let n = 1000;
        let t = chain(&filled(&[1 << 20], DType::F32, 9)?, n)?;
        println!("chain_wide {n} dependent ops on 2^20 f32: {:8.3} ms  {:6.2} us/op", t * 1e3, t / n as f64 * 1e6);
    }
    Ok(())
}
