//! The demo: a small MLP forward pass evaluated from threads and tasks on their own streams.

use std::time::Instant;

use rill::random::{Key, normal};
use rill::{Array, DType, Device, Result, Stream};

/// One forward pass of a two-layer MLP with softmax output, returning the class
/// probabilities' row sums (each should be 1) and the first row's argmax.
fn forward(x: &Array, w1: &Array, w2: &Array) -> Result<(Array, Array)> {
    let h = x.matmul(w1)?.gelu()?;
    let h = h.layer_norm(None, None, 1e-5)?;
    let p = h.matmul(w2)?.softmax(-1)?;
    Ok((p.sum(&[-1], false)?, p.argmax(-1, false)?))
}

fn weights(device: Device, seed: u64, batch: usize) -> Result<(Array, Array, Array)> {
    let s = device.default_stream()?;
    rill::with_stream(&s, || {
        let keys = Key::new(seed).split(3);
        let x = normal(keys[0], &[batch, 256], 0.0, 1.0, DType::F32)?;
        let w1 = normal(keys[1], &[256, 512], 0.0, 0.0625, DType::F32)?;
        let w2 = normal(keys[2], &[512, 10], 0.0, 0.044, DType::F32)?;
        Ok((x, w1, w2))
    })
}

pub fn run(device: Device, threads: usize, tasks: usize) -> Result<()> {
    println!("rill demo on {device} ({} CPU worker threads)", rill::runtime::cpu_threads());
    let (x, w1, w2) = weights(device, 0, 64)?;
    rill::eval(&[x.clone(), w1.clone(), w2.clone()])?;

    // OS threads: each makes its own stream and evaluates the shared weights' graph.
    let t0 = Instant::now();
    let handles: Vec<_> = (0..threads)
        .map(|i| {
            let (x, w1, w2) = (x.clone(), w1.clone(), w2.clone());
            std::thread::spawn(move || -> Result<(f64, f64, f64)> {
                let s = Stream::new(&device)?;
                let _g = s.enter();
                let start = Instant::now();
                let xi = x.mul(1.0 + i as f64 * 0.1)?;
                let (sums, arg) = forward(&xi, &w1, &w2)?;
                rill::eval(&[sums.clone(), arg.clone()])?;
                let ms = start.elapsed().as_secs_f64() * 1e3;
                Ok((sums.mean(&[], false)?.item_f64()?, arg.to_f64_vec()?[0], ms))
            })
        })
        .collect();
    for (i, h) in handles.into_iter().enumerate() {
        let (mean_sum, arg0, ms) = h.join().map_err(|_| rill::Error::ShutDown)??;
        println!("  thread {i}: mean row sum {mean_sum:.6}, argmax[0] {arg0}, {ms:.2} ms");
    }
    println!("{threads} threads: {:.2} ms", t0.elapsed().as_secs_f64() * 1e3);

    // Tokio tasks on a multi-threaded runtime: each on its own stream through the
    // scoped override, which follows the task across `.await`.
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(4)
        .enable_all()
        .build()
        .map_err(|e| rill::Error::InvalidArgument { op: "demo", msg: format!("could not start tokio: {e}") })?;
    let t0 = Instant::now();
    let results: Vec<Result<(u64, f64)>> = rt.block_on(async {
        let mut joins = Vec::new();
        for t in 0..tasks {
            let (x, w1, w2) = (x.clone(), w1.clone(), w2.clone());
            joins.push(tokio::spawn(async move {
                let s = Stream::new(&device)?;
                let id = s.id();
                s.scope(async move {
                    let mut total = 0.0;
                    for step in 0..4 {
                        let xi = x.add(0.01 * (t * 4 + step) as f64)?;
                        let (sums, _) = forward(&xi, &w1, &w2)?;
                        rill::async_eval(std::slice::from_ref(&sums)).await?;
                        total += sums.sum(&[], false)?.item_f64()?;
                        tokio::task::yield_now().await;
                    }
                    Ok((id, total))
                })
                .await
            }));
        }
        let mut out = Vec::new();
        for j in joins {
            out.push(j.await.unwrap_or(Err(rill::Error::ShutDown)));
        }
        out
    });
    for (t, r) in results.into_iter().enumerate() {
        let (stream, total) = r?;
        println!("  task {t} on stream {stream}: sum of row sums over 4 steps {total:.3}");
    }
    println!("{tasks} tasks: {:.2} ms", t0.elapsed().as_secs_f64() * 1e3);
    drop(rt);

    let st = rill::runtime::stats();
    println!(
        "runtime: {} streams created, {} runtime threads, {} nodes computed, peak {:.1} MiB",
        st.streams_created,
        st.threads_live,
        st.nodes_computed,
        st.bytes_peak as f64 / (1 << 20) as f64
    );
    Ok(())
}
