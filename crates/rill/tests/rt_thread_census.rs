//! Thread census: every OS thread of the process (read from `/proc/self/task`) is
//! accounted for before any rill use, after building ops without evaluating them, after
//! evaluating work of many kinds from user threads and tokio tasks, and after shutdown.
//!
//! A thread is accounted for when it was there before rill was used (the harness's), or
//! when it is one of rill's threads (`rill-cpu-N` of the worker pool, `rill-cuda-N`
//! completion workers), each name once, as many as `stats().threads_live` says and no
//! more than the pool's bound, or, on a GPU, a thread the CUDA driver starts for itself
//! (named in [`CUDA_DRIVER_THREADS`]). Anything else (rayon's global pool, a library's
//! own workers, a thread rill forgot to name) fails the census. The test's own user
//! threads and tokio workers are joined before each count.
//!
//! Each scenario runs in a child process (this binary run again with `RILL_CENSUS` set to
//! the test's name and only that test selected), so no other test's threads are counted.

use std::collections::BTreeMap;
use std::process::Command;
use std::time::{Duration, Instant};

use rill::{Array, DType, Device, Stream};

const CHILD: &str = "RILL_CENSUS";

/// Threads the CUDA driver starts for itself when a context is made (on the H200 host,
/// driver 580: `cuda-EvtHandlr` and `cuda00001400006`). They live as long as the driver,
/// which rill does not tear down, so they outlive shutdown.
const CUDA_DRIVER_THREADS: &[&str] = &["cuda-EvtHandlr", "cuda0"];

/// Runs the test named `name` in a child process with `env` set (`None` removes the
/// variable) and fails when the child does.
fn in_child(name: &str, env: &[(&str, Option<&str>)]) {
    let mut cmd = Command::new(std::env::current_exe().unwrap());
    cmd.args([name, "--exact", "--test-threads=1", "--nocapture"]).env(CHILD, name);
    for (k, v) in env {
        match v {
            Some(v) => cmd.env(k, v),
            None => cmd.env_remove(k),
        };
    }
    let out = cmd.output().unwrap();
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    print!("{stdout}");
    eprint!("{stderr}");
    assert!(out.status.success(), "census child {name} failed: {}", out.status);
    assert!(stdout.contains("1 passed"), "census child {name} ran no test");
}

fn is_child(name: &str) -> bool {
    std::env::var(CHILD).as_deref() == Ok(name)
}

/// Every thread of this process: id and name (`comm`).
fn threads() -> BTreeMap<u32, String> {
    let mut out = BTreeMap::new();
    for e in std::fs::read_dir("/proc/self/task").unwrap() {
        let e = e.unwrap();
        let Ok(tid) = e.file_name().to_string_lossy().parse::<u32>() else { continue };
        // A thread that exits between the listing and this read is not counted.
        if let Ok(name) = std::fs::read_to_string(e.path().join("comm")) {
            out.insert(tid, name.trim_end().to_string());
        }
    }
    out
}

/// What a census is allowed to find besides the threads of `base`.
#[derive(Clone, Copy)]
struct Allowed {
    /// `rill-cpu-N` threads: exactly this many (0: none).
    pool: usize,
    /// `rill-cuda-N` completion workers: exactly this many.
    cuda_workers: usize,
    /// The CUDA driver's own threads.
    driver: bool,
}

/// Counts the threads beyond `base` and checks each against `allowed`; an error names
/// every thread that is not accounted for.
fn check(base: &BTreeMap<u32, String>, allowed: Allowed) -> Result<(), String> {
    let now = threads();
    let mut pool = Vec::new();
    let mut workers = Vec::new();
    let mut bad = Vec::new();
    for (tid, name) in &now {
        if base.contains_key(tid) {
            continue;
        }
        if let Some(i) = name.strip_prefix("rill-cpu-").and_then(|i| i.parse::<usize>().ok()) {
            pool.push(i);
        } else if let Some(i) = name.strip_prefix("rill-cuda-").and_then(|i| i.parse::<usize>().ok()) {
            workers.push(i);
        } else if !(allowed.driver && CUDA_DRIVER_THREADS.iter().any(|p| name.starts_with(p))) {
            bad.push(format!("{tid} {name:?}"));
        }
    }
    pool.sort_unstable();
    workers.sort_unstable();
    // An unnamed thread takes its creator's name, so a name seen twice is a stranger too.
    let expect_pool: Vec<usize> = (0..allowed.pool).collect();
    let expect_workers: Vec<usize> = (0..allowed.cuda_workers).collect();
    if !bad.is_empty() || pool != expect_pool || workers != expect_workers {
        return Err(format!(
            "threads not accounted for: {bad:?}; pool threads {pool:?} (want {expect_pool:?}); \
             completion workers {workers:?} (want {expect_workers:?}); all threads: {now:?}"
        ));
    }
    Ok(())
}

/// `check`, retried for a few seconds while it fails: a thread that was joined or told to
/// exit may still be listed for a moment.
fn settle(base: &BTreeMap<u32, String>, allowed: Allowed, what: &str) {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        match check(base, allowed) {
            Ok(()) => {
                let names: Vec<String> = threads().into_values().collect();
                println!("census {what}: {} threads {names:?}", names.len());
                return;
            }
            Err(e) if Instant::now() > deadline => panic!("census {what}: {e}"),
            Err(_) => std::thread::sleep(Duration::from_millis(20)),
        }
    }
}

/// Builds graphs of every kind of op on `device`'s default stream without evaluating.
fn build(device: Device) -> Vec<Array> {
    let s = device.default_stream().unwrap();
    rill::with_stream(&s, || {
        let x = Array::from_slice(&[1.0f32, 2.0, 3.0, 4.0], &[2, 2]).unwrap();
        let f = rill::compile(|x: &[Array]| Ok(vec![x[0].mul(2.0)?.add(1.0)?.tanh()?]));
        vec![
            x.mul(2.0).unwrap(),
            x.add(0.5).unwrap().exp().unwrap().sum(&[], false).unwrap(),
            x.matmul(&x).unwrap().softmax(-1).unwrap(),
            Array::full(&[1 << 20], 3.0, DType::F32).unwrap().sqrt().unwrap(),
            Array::arange(0.0, 100000.0, 1.0, DType::F32).unwrap().cumsum(0).unwrap(),
            rill::random::normal(rill::random::Key::new(1), &[1 << 18], 0.0, 1.0, DType::F32).unwrap(),
            f.call(std::slice::from_ref(&x)).unwrap().remove(0),
        ]
    })
}

/// Work of every kind on `s`, large enough that kernels split across threads: elementwise
/// chains, reductions (one long row, many rows, a long axis), matmul (one large product,
/// many small ones, integers), random draws, a compiled function, scalars, movement,
/// softmax and norms. Returns a checksum, compared across threads.
fn workload(s: &Stream, k: u64, f: &rill::Compiled) -> f64 {
    rill::with_stream(s, || {
        let n = 1 << 20;
        let key = rill::random::Key::new(k);
        let u = rill::random::uniform(key, &[n], -1.0, 1.0, DType::F32).unwrap();
        let g = rill::random::normal(key, &[512, 512], 0.0, 1.0, DType::F32).unwrap();
        let chain = u.mul(2.0).unwrap().add(1.0).unwrap().tanh().unwrap().mul(&u).unwrap();
        let a = Array::arange(0.0, (256 * 256) as f64, 1.0, DType::F32).unwrap().reshape(&[256, 256]).unwrap();
        let a = a.div(65536.0).unwrap();
        let mm = a.matmul(&a.transpose(&[1, 0]).unwrap()).unwrap();
        let small = Array::full(&[512, 8, 8], 0.5, DType::F32).unwrap();
        let bmm = small.matmul(&small).unwrap();
        let ints = Array::arange(0.0, 64.0 * 64.0, 1.0, DType::I32).unwrap().reshape(&[64, 64]).unwrap();
        let imm = ints.matmul(&ints).unwrap().astype(DType::F64).unwrap();
        let fused = f.call(&[u.clone(), chain.clone()]).unwrap().remove(0);
        let moved = rill::concatenate(&[&g, &g.transpose(&[1, 0]).unwrap()], 0).unwrap();
        let idx = Array::arange(0.0, 512.0, 3.0, DType::I64).unwrap();
        let outs = [
            chain.sum(&[], false).unwrap(),
            g.sum(&[1], false).unwrap().sum(&[], false).unwrap(),
            g.sum(&[0], false).unwrap().sum(&[], false).unwrap(),
            mm.sum(&[], false).unwrap(),
            bmm.sum(&[], false).unwrap(),
            imm.sum(&[], false).unwrap().astype(DType::F32).unwrap(),
            fused.mean(&[], false).unwrap(),
            moved.softmax(-1).unwrap().sum(&[], false).unwrap(),
            moved.layer_norm(None, None, 1e-5).unwrap().max(&[], false).unwrap(),
            moved.take(&idx, 0).unwrap().pad(&[(1, 1)], 0.0).unwrap().sum(&[], false).unwrap(),
            u.cumsum(0).unwrap().argmax(0, false).unwrap().astype(DType::F32).unwrap(),
            Array::full(&[n], k as f64, DType::F32).unwrap().add(0.25).unwrap().sum(&[], false).unwrap(),
        ];
        rill::eval(&outs).unwrap();
        outs.iter().map(|o| o.item_f64().unwrap()).filter(|v| v.is_finite()).sum()
    })
}

/// Runs `workload` from four user threads (two on a shared new stream, two on the default
/// stream) and from 16 tasks on a tokio runtime of three workers that await `async_eval`
/// and hop threads, then joins the threads and shuts the runtime down.
fn evaluate_everywhere(device: Device) {
    let f = rill::compile(|x: &[Array]| Ok(vec![x[0].mul(&x[1])?.add(0.5)?.sigmoid()?.mul(3.0)?]));
    let shared = Stream::new(&device).unwrap();
    let default = device.default_stream().unwrap();
    std::thread::scope(|sc| {
        for k in 0..4u64 {
            let (f, s) = (&f, if k % 2 == 0 { &shared } else { &default });
            std::thread::Builder::new()
                .name(format!("census-user-{k}"))
                .spawn_scoped(sc, move || workload(s, k, f))
                .unwrap();
        }
    });
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(3)
        .thread_name("census-tokio")
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let mut tasks = Vec::new();
        for k in 0..16u64 {
            let (f, s) = (f.clone(), if k % 2 == 0 { shared.clone() } else { default.clone() });
            tasks.push(tokio::spawn(s.clone().scope(async move {
                let x = Array::full(&[1 << 18], k as f64, DType::F32).unwrap().mul(0.5).unwrap();
                let y = f.call(&[x.clone(), x]).unwrap().remove(0).sum(&[], false).unwrap();
                tokio::task::yield_now().await;
                rill::async_eval(std::slice::from_ref(&y)).await.unwrap();
                tokio::task::yield_now().await;
                let z = y.mul(2.0).unwrap();
                rill::async_eval(std::slice::from_ref(&z)).await.unwrap();
                z.item_f64().unwrap()
            })));
        }
        for t in tasks {
            t.await.unwrap();
        }
    });
    rt.shutdown_timeout(Duration::from_secs(10));
}

/// The census of one process on the CPU, or on GPU 0 when `gpu`, with `pool` the number
/// of worker threads the pool must have.
fn census(gpu: bool, pool: usize) {
    let base = threads();
    let none = Allowed { pool: 0, cuda_workers: 0, driver: false };
    // A GPU's initialisation starts its completion worker (and the driver its threads).
    let (device, after_init) = if gpu {
        match Device::gpu(0) {
            Ok(d) => (d, Allowed { pool: 0, cuda_workers: 1, driver: true }),
            Err(e) => {
                assert!(std::env::var("RILL_REQUIRE_GPU").as_deref() != Ok("1"), "RILL_REQUIRE_GPU=1 but no GPU: {e}");
                eprintln!("skipped: no GPU ({e})");
                return;
            }
        }
    } else {
        (Device::cpu(), none)
    };
    let mut init = base.clone();
    if device.is_gpu() {
        // The initialisation may have started the pool too (it compiles on the pool).
        let p = rill::runtime::stats().threads_live - 1;
        assert!(p == 0 || p == pool, "{p} pool threads after GPU initialisation");
        check(&base, Allowed { pool: p, ..after_init }).unwrap();
        init = threads();
    }
    let started = rill::runtime::stats().threads_started;

    // Building ops evaluates nothing and starts no thread at all.
    let built = build(device);
    settle(&init, none, "after building ops");
    assert_eq!(rill::runtime::stats().threads_started, started, "building ops started a runtime thread");

    // Evaluating everything: the pool and nothing else.
    rill::eval(&built).unwrap();
    evaluate_everywhere(device);
    drop(built);
    let st = rill::runtime::stats();
    let live = Allowed { pool, ..after_init };
    settle(&base, live, "after evaluating");
    assert_eq!(st.threads_live, pool + live.cuda_workers, "stats().threads_live does not match the census: {st:?}");
    assert_eq!(rill::runtime::cpu_threads(), pool);

    // After shutdown no rill thread remains.
    let report = rill::shutdown();
    assert!(report.performed && report.threads_joined, "{report:?}");
    settle(&base, Allowed { pool: 0, cuda_workers: 0, driver: device.is_gpu() }, "after shutdown");
    assert_eq!(rill::runtime::stats().threads_live, 0);
}

#[test]
fn cpu_census_with_a_bounded_pool() {
    const NAME: &str = "cpu_census_with_a_bounded_pool";
    if !is_child(NAME) {
        // RAYON_NUM_THREADS would size rayon's global pool, were it ever started.
        return in_child(NAME, &[("RILL_CPU_THREADS", Some("3")), ("RAYON_NUM_THREADS", Some("5"))]);
    }
    census(false, 3);
}

#[test]
fn cpu_census_with_the_default_pool() {
    const NAME: &str = "cpu_census_with_the_default_pool";
    if !is_child(NAME) {
        return in_child(NAME, &[("RILL_CPU_THREADS", None), ("RAYON_NUM_THREADS", None)]);
    }
    let cores = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1).min(256);
    census(false, cores);
}

#[test]
fn gpu_census() {
    const NAME: &str = "gpu_census";
    if !is_child(NAME) {
        // The child probes the GPU itself: a probe here would start driver threads.
        return in_child(NAME, &[("RILL_CPU_THREADS", Some("4")), ("RAYON_NUM_THREADS", Some("5"))]);
    }
    census(true, 4);
}
