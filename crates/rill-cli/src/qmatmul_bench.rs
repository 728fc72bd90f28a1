//! `rill bench qmatmul`: `rill::quant::qmatmul` (x bf16, the weight packed) over the
//! weight shapes of SmolLM2-135M ((N, K) = 576x576 attention, 1536x576 feed-forward up,
//! 576x1536 down, 49152x576 the tied embedding as the output head), every format, at
//! decode rows M = 1, 4, 16, 64 and prefill M = 512; one JSON object a line:
//! `{"id": "qmatmul:<fmt>:m<M>:n<N>:k<K>", "impl": "rill", "seconds", "gbs", "tflops"}`.
//! `gbs` counts the bytes a product must move (packed weight, x and the output once);
//! `tflops` counts `2·M·N·K`. A figure is the median of 7 repetitions (after two
//! warm-ups) of 8 products on the same inputs evaluated together, divided by 8, so an
//! eval's fixed cost is shared. The PyTorch peer (`bench/torch_qmatmul.py`) times the
//! same ids as dense bf16 matmuls (PyTorch has no Q4_0/Q4_1/Q8_0 kernels).
//! `RILL_QMATMUL_FILTER=a,b` times only the ids containing every piece.

use std::time::Instant;

use rill::quant::{QMatrix, QuantFormat, qmatmul};
use rill::random::{Key, uniform};
use rill::{Array, DType, Result};

/// Products evaluated together per repetition.
const CALLS: usize = 8;

/// The weight shapes (N, K).
pub(crate) const SHAPES: [(usize, usize); 4] = [(576, 576), (1536, 576), (576, 1536), (49152, 576)];
/// The rows of `x`.
pub(crate) const ROWS: [usize; 5] = [1, 4, 16, 64, 512];

pub(crate) fn run() -> Result<()> {
    let filter = std::env::var("RILL_QMATMUL_FILTER").unwrap_or_default();
    let stream = rill::current_stream_override().map(Ok).unwrap_or_else(|| rill::default_device().default_stream())?;
    for (n, k) in SHAPES {
        for f in QuantFormat::ALL {
            let ids: Vec<(usize, String)> = ROWS
                .iter()
                .map(|&m| (m, format!("qmatmul:{}:m{m}:n{n}:k{k}", f.name())))
                .filter(|(_, id)| filter.split(',').filter(|p| !p.is_empty()).all(|p| id.contains(p)))
                .collect();
            if ids.is_empty() {
                continue;
            }
            let w32 = uniform(Key::new(7), &[n, k], -1.0, 1.0, DType::F32)?;
            let w = QMatrix::quantize(&w32, f)?.to_stream(&stream)?;
            drop(w32);
            for (m, id) in ids {
                let x = uniform(Key::new(m as u64), &[m, k], -1.0, 1.0, DType::F32)?.astype(DType::BF16)?;
                x.eval()?;
                let rep = || -> Result<f64> {
                    let t0 = Instant::now();
                    let outs: Vec<Array> = (0..CALLS).map(|_| qmatmul(&x, &w)).collect::<Result<_>>()?;
                    rill::eval(&outs)?;
                    Ok(t0.elapsed().as_secs_f64() / CALLS as f64)
                };
                rep()?;
                rep()?;
                let s = crate::bench::median((0..7).map(|_| rep()).collect::<Result<_>>()?);
                let bytes = w.nbytes() + 2 * m * k + 2 * m * n;
                let flops = 2.0 * (m * n * k) as f64;
                println!(
                    "{{\"id\": \"{id}\", \"impl\": \"rill\", \"seconds\": {s:.9}, \"gbs\": {:.1}, \"tflops\": {:.3}}}",
                    bytes as f64 / s / 1e9,
                    flops / s / 1e12
                );
            }
        }
    }
    Ok(())
}
