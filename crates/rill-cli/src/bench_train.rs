//! `rill bench train`: forward plus backward (the loss and the gradient of every
//! parameter, by `rill::value_and_grad`) of two training workloads, eager and compiled,
//! beside `bench/torch_train.py` (PyTorch autograd eager and under `torch.compile`), which
//! builds the same functions, sizes and dtypes:
//!
//! - `mlp`: 4 layers `x = gelu_tanh(x @ w + b)` (the last without the GELU), loss
//!   `mean(x²)`; on a GPU batch 8192, width 4096, bf16 (the case) and f32.
//! - `encoder`: one post-norm transformer encoder layer (fused q/k/v projection, 12 heads
//!   through `scaled_dot_product_attention`, output projection, residual and layer norm,
//!   a 4x GELU feed-forward, residual and layer norm), loss `mean(y²)`; on a GPU batch
//!   32, 512 tokens, width 768, bf16 and f32.
//!
//! The CPU runs the same workloads at sizes a 2-core machine finishes in seconds. Each
//! figure is the median of 5 timed steps after 2 warm-up steps; a step evaluates the loss
//! and every gradient.

use rill::{Array, DType, Device, Result};

use crate::bench::{filled, time};

/// One workload's case: its name, dtype and sizes.
pub(crate) struct Case {
    pub workload: &'static str,
    pub dtype: DType,
    /// mlp: batch, width, layers. encoder: batch, tokens, width, heads.
    pub dims: Vec<usize>,
}

/// The cases, generated from the workload sizes (the PyTorch peer's `cases` is the same).
pub(crate) fn cases(gpu: bool) -> Vec<Case> {
    let mlp: &[usize] = if gpu { &[8192, 4096, 4] } else { &[256, 256, 4] };
    let enc: &[usize] = if gpu { &[32, 512, 768, 12] } else { &[2, 64, 128, 4] };
    let mut v = Vec::new();
    for dtype in [DType::BF16, DType::F32] {
        v.push(Case { workload: "mlp", dtype, dims: mlp.to_vec() });
        v.push(Case { workload: "encoder", dtype, dims: enc.to_vec() });
    }
    v
}

/// A uniform array on `[-scale, scale)`, evaluated.
fn param(shape: &[usize], dtype: DType, scale: f64, seed: u64) -> Result<Array> {
    let a = filled(shape, dtype, seed)?.mul(scale)?;
    a.eval()?;
    Ok(a)
}

/// The MLP's loss: inputs `[w0, b0, .., w{L-1}, b{L-1}, x]`.
fn mlp_loss(a: &[Array]) -> Result<Vec<Array>> {
    let (params, x) = a.split_at(a.len() - 1);
    let layers = params.len() / 2;
    let mut h = x[0].clone();
    for l in 0..layers {
        h = h.matmul(&params[2 * l])?.add(&params[2 * l + 1])?;
        if l + 1 < layers {
            h = h.gelu_tanh()?;
        }
    }
    Ok(vec![h.astype(DType::F32)?.square()?.mean(&[], false)?])
}

/// The encoder layer's loss: inputs `[wqkv, bqkv, wo, bo, g1, b1, w1, bf1, w2, bf2, g2,
/// b2, x]` with `x` `[B, T, D]`, split into `heads` heads.
fn encoder_loss(a: &[Array], heads: usize) -> Result<Vec<Array>> {
    let [wqkv, bqkv, wo, bo, g1, b1, w1, bf1, w2, bf2, g2, b2, x] = a else {
        return Err(rill::Error::InvalidArgument { op: "bench train", msg: "the encoder takes 13 inputs".into() });
    };
    let (b, t, d) = (x.shape()[0] as isize, x.shape()[1] as isize, x.shape()[2] as isize);
    let (h, dh) = (heads as isize, d / heads as isize);
    let qkv = x.matmul(wqkv)?.add(bqkv)?.reshape(&[b, t, 3, h, dh])?.transpose(&[2, 0, 3, 1, 4])?;
    let part = |i: isize| qkv.slice_axis(0, Some(i), Some(i + 1), 1)?.reshape(&[b, h, t, dh]);
    let o = rill::scaled_dot_product_attention(&part(0)?, &part(1)?, &part(2)?, rill::AttentionMask::None, None)?;
    let o = o.transpose(&[0, 2, 1, 3])?.reshape(&[b, t, d])?;
    let y = x.add(&o.matmul(wo)?.add(bo)?)?.layer_norm(Some(g1), Some(b1), 1e-5)?;
    let f = y.matmul(w1)?.add(bf1)?.gelu_tanh()?.matmul(w2)?.add(bf2)?;
    let z = y.add(&f)?.layer_norm(Some(g2), Some(b2), 1e-5)?;
    Ok(vec![z.astype(DType::F32)?.square()?.mean(&[], false)?])
}

/// The inputs of a case: the parameters, then the data.
fn inputs(c: &Case) -> Result<Vec<Array>> {
    let dt = c.dtype;
    let mut v = Vec::new();
    match c.workload {
        "mlp" => {
            let (batch, w, layers) = (c.dims[0], c.dims[1], c.dims[2]);
            for l in 0..layers as u64 {
                v.push(param(&[w, w], dt, 1.0 / (w as f64).sqrt(), 10 + l)?);
                v.push(param(&[w], dt, 0.1, 50 + l)?);
            }
            v.push(param(&[batch, w], dt, 1.0, 99)?);
        }
        _ => {
            let (batch, t, d) = (c.dims[0], c.dims[1], c.dims[2]);
            let s = 1.0 / (d as f64).sqrt();
            v.push(param(&[d, 3 * d], dt, s, 1)?);
            v.push(param(&[3 * d], dt, 0.1, 2)?);
            v.push(param(&[d, d], dt, s, 3)?);
            v.push(param(&[d], dt, 0.1, 4)?);
            v.push(Array::ones(&[d], dt)?);
            v.push(Array::zeros(&[d], dt)?);
            v.push(param(&[d, 4 * d], dt, s, 5)?);
            v.push(param(&[4 * d], dt, 0.1, 6)?);
            v.push(param(&[4 * d, d], dt, 0.5 * s, 7)?);
            v.push(param(&[d], dt, 0.1, 8)?);
            v.push(Array::ones(&[d], dt)?);
            v.push(Array::zeros(&[d], dt)?);
            v.push(param(&[batch, t, d], dt, 1.0, 9)?);
        }
    }
    rill::eval(&v)?;
    Ok(v)
}

/// Multiply-adds of the forward pass (the backward pass does about twice as many).
fn forward_flops(c: &Case) -> f64 {
    match c.workload {
        "mlp" => 2.0 * (c.dims[0] * c.dims[1] * c.dims[1] * c.dims[2]) as f64,
        _ => {
            let (b, t, d) = (c.dims[0] as f64, c.dims[1] as f64, c.dims[2] as f64);
            // q/k/v, output and the two feed-forward products, then scores and P·V.
            2.0 * b * t * d * d * (3.0 + 1.0 + 8.0) + 4.0 * b * t * t * d
        }
    }
}

/// Runs the cases that `filters` select: each is what follows `train` in a benchmark
/// name, empty for every case or `:WORKLOAD[:DTYPE]` for those that match.
pub fn run(device: Device, filters: &[&str]) -> Result<()> {
    let selected = |c: &Case| {
        let dt = c.dtype.to_string();
        filters.iter().any(|f| {
            let mut parts = f.split(':').skip(1);
            parts.next().is_none_or(|w| w == c.workload) && parts.next().is_none_or(|d| d == dt)
        })
    };
    let chosen: Vec<Case> = cases(device.is_gpu()).into_iter().filter(selected).collect();
    if chosen.is_empty() {
        let msg = format!("no case matches {filters:?} (workloads mlp and encoder, dtypes bf16 and f32)");
        return Err(rill::Error::InvalidArgument { op: "bench train", msg });
    }
    for c in chosen {
        let ins = inputs(&c)?;
        let params: Vec<usize> = (0..ins.len() - 1).collect();
        let heads = c.dims.get(3).copied().unwrap_or(1);
        let workload = c.workload;
        let f = move |a: &[Array]| if workload == "mlp" { mlp_loss(a) } else { encoder_loss(a, heads) };
        let vg = rill::value_and_grad(f, &params);
        let step = |outs: (Array, Vec<Array>)| {
            let mut all = outs.1;
            all.push(outs.0);
            rill::eval(&all)
        };
        let eager = time(2, 5, || step(vg.call(&ins)?))?;
        let vg2 = rill::value_and_grad(f, &params);
        let compiled = rill::compile(move |a: &[Array]| {
            let (l, mut g) = vg2.call(a)?;
            g.push(l);
            Ok(g)
        });
        let comp = time(2, 5, || rill::eval(&compiled.call(&ins)?))?;
        let dims: Vec<String> = c.dims.iter().map(|d| d.to_string()).collect();
        let tflops = 3.0 * forward_flops(&c) / comp / 1e12;
        println!(
            "train {workload} {} {}: eager {:9.3} ms, compiled {:9.3} ms ({tflops:6.2} TFLOP/s compiled, forward x3)",
            c.dtype,
            dims.join("x"),
            eager * 1e3,
            comp * 1e3
        );
    }
    Ok(())
}
