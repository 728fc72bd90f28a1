//! Exit torture: a process that ends abruptly, in one of several ways, while threads and
//! tokio tasks are submitting rill work, and a driver that runs it many times and checks
//! every run's exit status and stderr.
//!
//! ```text
//! exit_torture drive --runs N [--seed S] [--device cpu|gpu] [--jobs J]
//! exit_torture child --seed S --ending E [--device cpu|gpu]
//! exit_torture compile-exit [--device cpu|gpu|auto] [--ops N]
//! ```
//!
//! Endings: `return` (exit 0), `exit` (std::process::exit(3) from a non-main thread),
//! `panic` (panic on the main thread: exit 101), `sigterm` / `sigint` (sent by the driver
//! once the child reports it is busy: killed by that signal), `drop-runtime` (the tokio
//! runtime is dropped with tasks still running, then main returns: exit 0).
//! The driver fails a run whose status differs from its ending's, or whose stderr shows a
//! panic other than the intended one, an abort, or any line from rill.
//!
//! `compile-exit` is one targeted case: main returns while a pool thread is compiling a
//! large fused kernel (on the GPU: inside NVRTC, a library loaded after rill's exit hook
//! was first registered). It prints the device it used on stdout and must exit with 0
//! and an empty stderr.

use std::cell::RefCell;
use std::io::{BufRead, BufReader, Read, Write};
use std::process::{Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use rill::{Array, DType, Device, Stream};

const ENDINGS: [&str; 6] = ["return", "exit", "panic", "sigterm", "sigint", "drop-runtime"];

struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E3779B97F4A7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58476D1CE4E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D049BB133111EB);
        z ^ (z >> 31)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
}

fn arg(args: &[String], name: &str) -> Option<String> {
    args.iter().position(|a| a == name).and_then(|i| args.get(i + 1).cloned())
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.first().map(String::as_str) {
        Some("drive") => std::process::exit(drive(&args)),
        Some("child") => child(&args),
        Some("compile-exit") => compile_exit(&args),
        _ => {
            eprintln!(
                "usage: exit_torture drive --runs N [--seed S] [--device cpu|gpu] [--jobs J] | child --seed S --ending E | compile-exit [--device cpu|gpu|auto] [--ops N]"
            );
            std::process::exit(2);
        }
    }
}

// ---------------------------------------------------------------- the child

static KEEP: Mutex<Vec<Array>> = Mutex::new(Vec::new());
static KEEP_STREAMS: Mutex<Vec<Stream>> = Mutex::new(Vec::new());
thread_local! {
    static TLS_KEEP: RefCell<Option<(Stream, Array)>> = const { RefCell::new(None) };
}

/// A graph of a few ops; errors (the runtime shutting down) end the caller's loop.
fn work(device: Device, rng_seed: u64, own_stream: Option<&Stream>) -> rill::Result<Array> {
    let _g = own_stream.map(|s| s.enter());
    let _d = match own_stream {
        Some(_) => None,
        None => Some(device.default_stream()?.enter()),
    };
    let n = 64 + (rng_seed % 4096) as usize;
    let x = Array::full(&[n], (rng_seed % 7) as f64, DType::F32)?;
    let y = x.mul(1.5)?.add(&x)?.tanh()?.sqrt()?;
    y.mul(&x)?.add(1.0)
}

fn busy_thread(device: Device, seed: u64, mode: u64) {
    let mut rng = Rng(seed);
    let own = if mode % 2 == 0 { Stream::new(&device).ok() } else { None };
    loop {
        let Ok(a) = work(device, rng.next(), own.as_ref()) else { return };
        let r = match rng.below(4) {
            0 => a.eval(),
            1 => rill::submit(std::slice::from_ref(&a)),
            2 => {
                // An async_eval that is never awaited.
                drop(rill::async_eval(std::slice::from_ref(&a)));
                Ok(())
            }
            _ => a.to_vec::<f32>().map(|_| ()),
        };
        if rng.below(16) == 0 {
            if let Some(s) = own.clone() {
                let _ = TLS_KEEP.try_with(|k| *k.borrow_mut() = Some((s, a.clone())));
            }
            if let Ok(mut k) = KEEP.lock() {
                if k.len() < 64 {
                    k.push(a.clone());
                }
            }
        }
        if r.is_err() {
            return;
        }
    }
}

fn blocked_waiter(device: Device) {
    // A long dependent chain: this thread sits in a blocking wait while the process ends.
    let Ok(s) = device.default_stream() else { return };
    let _g = s.enter();
    let Ok(mut x) = Array::full(&[1 << 16], 1.0, DType::F32) else { return };
    for _ in 0..2000 {
        match x.mul(1.0001).and_then(|y| y.sqrt()) {
            Ok(y) => x = y,
            Err(_) => return,
        }
    }
    let _ = x.eval();
}

/// See the module docs: returns from main while a pool thread compiles a large kernel.
fn compile_exit(args: &[String]) {
    trace_fatal_signals();
    let device = match arg(args, "--device").as_deref() {
        Some("gpu") => Device::gpu(0).unwrap_or_else(|e| {
            eprintln!("exit_torture: no GPU: {e}");
            std::process::exit(77)
        }),
        Some("auto") => Device::gpu(0).unwrap_or(Device::cpu()),
        _ => Device::cpu(),
    };
    let ops: usize = arg(args, "--ops").and_then(|s| s.parse().ok()).unwrap_or(100);
    let run = || -> rill::Result<()> {
        let stream = device.default_stream()?;
        let _g = stream.enter();
        // A first op loads the backend and its kernel compiler.
        Array::full(&[1024], 1.0, DType::F32)?.add(1.0)?.eval()?;
        let f = rill::compile(move |x: &[Array]| {
            let mut y = x[0].clone();
            for i in 0..ops {
                y = y.mul(1.0001)?.add(1e-3 * i as f64)?.sin()?;
            }
            Ok(vec![y])
        });
        let x = Array::full(&[1 << 16], 0.5, DType::F32)?;
        let s2 = stream.clone();
        std::thread::spawn(move || {
            let _g = s2.enter();
            if let Ok(out) = f.call(&[x]) {
                let _ = out[0].eval();
            }
        });
        // Return once the fused kernel's batch is submitted: its compile runs on a pool
        // thread while `exit` runs.
        while rill::runtime::stats().in_flight == 0 {
            std::thread::yield_now();
        }
        Ok(())
    };
    match run() {
        Ok(()) => println!("compile-exit on {device}"),
        Err(e) => {
            eprintln!("exit_torture: compile-exit failed: {e}");
            std::process::exit(70)
        }
    }
}

/// Diagnostics for a crashing child (`RILL_TORTURE_TRACE=1`): prints the signal, the
/// thread, the faulting instruction's library and symbol (a backtrace cannot unwind through
/// a library without unwind tables), and a backtrace, then dies of the same signal. Not
/// async-signal-safe; used only to find where a crash happens.
extern "C" fn on_fatal_signal(sig: libc::c_int, info: *mut libc::siginfo_t, ctx: *mut libc::c_void) {
    let name = std::thread::current().name().map(str::to_owned).unwrap_or_else(|| "?".into());
    eprintln!("exit_torture: fatal signal {sig} on thread '{name}' {}", where_from(info, ctx));
    let bt = std::backtrace::Backtrace::force_capture();
    eprintln!("{bt}");
    // SAFETY: restores the default action and re-raises, so the status shows the signal.
    unsafe {
        libc::signal(sig, libc::SIG_DFL);
        libc::raise(sig);
    }
}

/// The faulting address and the library/symbol holding the interrupted instruction.
#[cfg(all(target_os = "linux", target_arch = "x86_64"))]
fn where_from(info: *mut libc::siginfo_t, ctx: *mut libc::c_void) -> String {
    // SAFETY: the kernel passes a valid siginfo and ucontext to an SA_SIGINFO handler.
    unsafe {
        let addr = if info.is_null() { std::ptr::null_mut() } else { (*info).si_addr() };
        let uc = ctx as *const libc::ucontext_t;
        let pc = if uc.is_null() { 0 } else { (*uc).uc_mcontext.gregs[libc::REG_RIP as usize] as usize };
        let mut dl: libc::Dl_info = std::mem::zeroed();
        let (lib, sym) = if pc != 0 && libc::dladdr(pc as *const libc::c_void, &mut dl) != 0 {
            let s = |p: *const libc::c_char| {
                if p.is_null() { "?".to_string() } else { std::ffi::CStr::from_ptr(p).to_string_lossy().into_owned() }
            };
            (s(dl.dli_fname), format!("{}+{:#x}", s(dl.dli_sname), pc.wrapping_sub(dl.dli_saddr as usize)))
        } else {
            ("?".into(), "?".into())
        };
        format!("(fault address {addr:?}, pc {pc:#x} in {lib} at {sym})")
    }
}

#[cfg(not(all(target_os = "linux", target_arch = "x86_64")))]
fn where_from(_info: *mut libc::siginfo_t, _ctx: *mut libc::c_void) -> String {
    String::new()
}

fn trace_fatal_signals() {
    if std::env::var("RILL_TORTURE_TRACE").as_deref() != Ok("1") {
        return;
    }
    for sig in [libc::SIGSEGV, libc::SIGBUS, libc::SIGABRT, libc::SIGILL] {
        // SAFETY: installs a plain SA_SIGINFO handler function.
        unsafe {
            let mut sa: libc::sigaction = std::mem::zeroed();
            sa.sa_sigaction = on_fatal_signal as *const () as libc::sighandler_t;
            sa.sa_flags = libc::SA_SIGINFO;
            libc::sigemptyset(&mut sa.sa_mask);
            libc::sigaction(sig, &sa, std::ptr::null_mut());
        }
    }
}

fn child(args: &[String]) {
    trace_fatal_signals();
    let seed: u64 = arg(args, "--seed").and_then(|s| s.parse().ok()).unwrap_or(1);
    let ending = arg(args, "--ending").unwrap_or_else(|| "return".into());
    let device = match arg(args, "--device").as_deref() {
        Some("gpu") => Device::gpu(0).unwrap_or_else(|e| {
            eprintln!("exit_torture: no GPU: {e}");
            std::process::exit(77)
        }),
        _ => Device::cpu(),
    };
    let mut rng = Rng(seed);

    // Statics holding a stream and arrays, never dropped.
    if let Ok(s) = Stream::new(&device) {
        if let Ok(mut k) = KEEP_STREAMS.lock() {
            k.push(s);
        }
    }
    let threads = rng.below(6) as usize;
    for t in 0..threads {
        let s = rng.next();
        std::thread::spawn(move || busy_thread(device, s, t as u64));
    }
    if rng.below(2) == 0 {
        std::thread::spawn(move || blocked_waiter(device));
    }
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build();
    let Ok(rt) = rt else { std::process::exit(70) };
    let tasks = rng.below(8);
    for t in 0..tasks {
        let s = rng.next();
        rt.spawn(async move {
            let mut r = Rng(s);
            let stream = if t % 2 == 0 { Stream::new(&device).ok() } else { None };
            loop {
                let Ok(a) = work(device, r.next(), stream.as_ref()) else { return };
                let fut = match &stream {
                    Some(st) => {
                        let a2 = a.clone();
                        let st = st.clone();
                        tokio::spawn(st.scope(async move { rill::async_eval(&[a2]).await }))
                    }
                    None => tokio::spawn(rill::async_eval(&[a])),
                };
                match fut.await {
                    Ok(Ok(())) => {}
                    _ => return,
                }
                tokio::task::yield_now().await;
            }
        });
    }
    // Work is running: tell the driver (it may now send a signal), then end at a random moment.
    println!("busy");
    let _ = std::io::stdout().flush();
    std::thread::sleep(Duration::from_micros(rng.below(20_000)));
    match ending.as_str() {
        "return" => {
            std::mem::forget(rt);
        }
        "exit" => {
            std::mem::forget(rt);
            let h = std::thread::spawn(|| std::process::exit(3));
            let _ = h.join();
            loop {
                std::thread::park();
            }
        }
        "panic" => {
            std::mem::forget(rt);
            panic!("exit_torture: intended panic on the main thread");
        }
        "sigterm" | "sigint" => {
            std::mem::forget(rt);
            // Wait for the signal while work continues.
            loop {
                std::thread::park();
            }
        }
        "drop-runtime" => drop(rt),
        other => {
            eprintln!("exit_torture: unknown ending {other}");
            std::process::exit(2);
        }
    }
}

// ---------------------------------------------------------------- the driver

struct Outcome {
    ok: bool,
    detail: String,
}

fn expected(ending: &str) -> (Option<i32>, Option<i32>) {
    match ending {
        "return" | "drop-runtime" => (Some(0), None),
        "exit" => (Some(3), None),
        "panic" => (Some(101), None),
        "sigterm" => (None, Some(libc_sig::SIGTERM)),
        "sigint" => (None, Some(libc_sig::SIGINT)),
        _ => (None, None),
    }
}

mod libc_sig {
    pub const SIGINT: i32 = 2;
    pub const SIGTERM: i32 = 15;
}

fn stderr_ok(ending: &str, err: &str) -> Result<(), String> {
    for line in err.lines() {
        let l = line.to_lowercase();
        let intended = ending == "panic"
            && (line.contains("intended panic")
                || line.starts_with("note: run with")
                || (line.starts_with("thread 'main'")
                    && line.contains("panicked at")
                    && line.contains("exit_torture.rs")));
        if intended {
            continue;
        }
        if l.contains("panic")
            || l.contains("abort")
            || l.contains("rill")
            || l.contains("error")
            || l.contains("fault")
        {
            return Err(format!("unexpected stderr line: {line}"));
        }
    }
    if ending == "panic" && !err.contains("intended panic") {
        return Err("the intended panic message is missing".into());
    }
    Ok(())
}

fn run_one(exe: &std::path::Path, seed: u64, ending: &str, device: &str) -> Outcome {
    use std::os::unix::process::ExitStatusExt;
    let mut child = match Command::new(exe)
        .args(["child", "--seed", &seed.to_string(), "--ending", ending, "--device", device])
        .env("RUST_BACKTRACE", "0")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
    {
        Ok(c) => c,
        Err(e) => return Outcome { ok: false, detail: format!("spawn failed: {e}") },
    };
    let mut stderr = child.stderr.take().expect("piped stderr");
    let err_reader = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = stderr.read_to_string(&mut s);
        s
    });
    let stdout = child.stdout.take().expect("piped stdout");
    // stdout is read on its own thread (a hung child must not hang the driver).
    let (busy_tx, busy_rx) = std::sync::mpsc::channel();
    let out_reader = std::thread::spawn(move || {
        let mut lines = BufReader::new(stdout).lines();
        let _ = busy_tx.send(matches!(lines.next(), Some(Ok(l)) if l == "busy"));
        // Drain stdout so the child never blocks on a full pipe.
        for _ in lines {}
    });
    let busy = busy_rx.recv_timeout(Duration::from_secs(60)).unwrap_or(false);
    if busy && (ending == "sigterm" || ending == "sigint") {
        let mut r = Rng(seed ^ 0x5eed);
        std::thread::sleep(Duration::from_micros(r.below(20_000)));
        let sig = if ending == "sigterm" { "-TERM" } else { "-INT" };
        let _ = Command::new("kill").args([sig, &child.id().to_string()]).status();
    }
    let hang =
        Duration::from_secs(std::env::var("RILL_TORTURE_HANG_S").ok().and_then(|v| v.parse().ok()).unwrap_or(60));
    let deadline = Instant::now() + hang;
    let mut threads_at_hang = String::new();
    let status = loop {
        match child.try_wait() {
            Ok(Some(s)) => break Some(s),
            Ok(None) if Instant::now() > deadline => {
                threads_at_hang = thread_states(child.id());
                let _ = child.kill();
                break None;
            }
            Ok(None) => std::thread::sleep(Duration::from_millis(2)),
            Err(_) => break None,
        }
    };
    let err = err_reader.join().unwrap_or_default();
    let _ = out_reader.join();
    let Some(status) = status else {
        return Outcome {
            ok: false,
            detail: format!("hung for {hang:?}; threads (name state wchan): {threads_at_hang}; stderr: {err}"),
        };
    };
    if status.code() == Some(77) {
        return Outcome { ok: false, detail: format!("no GPU: {err}") };
    }
    let (code, signal) = expected(ending);
    let status_ok = status.code() == code && status.signal() == signal;
    let mut detail = format!("status {status:?} (expected code {code:?} signal {signal:?})");
    let err_ok = match stderr_ok(ending, &err) {
        Ok(()) => true,
        Err(e) => {
            detail.push_str(&format!("; {e}; full stderr:\n{err}"));
            false
        }
    };
    if !busy {
        detail.push_str("; the child never reported busy");
    }
    Outcome { ok: status_ok && err_ok && busy, detail }
}

/// The name, state and kernel wait channel of every thread of process `pid` (Linux), to
/// show where a hung child sits.
fn thread_states(pid: u32) -> String {
    let Ok(dir) = std::fs::read_dir(format!("/proc/{pid}/task")) else { return "?".into() };
    let mut v = Vec::new();
    for t in dir.flatten() {
        let p = t.path();
        let read = |f: &str| std::fs::read_to_string(p.join(f)).unwrap_or_default().trim().to_string();
        let stat = read("stat");
        let state = stat.rsplit(')').next().and_then(|r| r.split_whitespace().next()).unwrap_or("?").to_string();
        v.push(format!("[{} {} {}]", read("comm"), state, read("wchan")));
    }
    v.join(" ")
}

fn drive(args: &[String]) -> i32 {
    let runs: u64 = arg(args, "--runs").and_then(|s| s.parse().ok()).unwrap_or(100);
    let seed: u64 = arg(args, "--seed").and_then(|s| s.parse().ok()).unwrap_or_else(|| {
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_nanos() as u64).unwrap_or(1)
    });
    let jobs: u64 = arg(args, "--jobs").and_then(|s| s.parse().ok()).unwrap_or(2).max(1);
    let device = arg(args, "--device").unwrap_or_else(|| "cpu".into());
    let exe = match std::env::current_exe() {
        Ok(e) => e,
        Err(e) => {
            eprintln!("exit_torture: cannot find own executable: {e}");
            return 2;
        }
    };
    println!("exit_torture: {runs} runs, seed {seed}, device {device}, {jobs} at a time");
    let start = Instant::now();
    let failures = Mutex::new(Vec::new());
    let counts = Mutex::new([0u64; 6]);
    let next = std::sync::atomic::AtomicU64::new(0);
    let slowest = Mutex::new((0.0f64, String::new()));
    std::thread::scope(|sc| {
        for _ in 0..jobs {
            sc.spawn(|| {
                loop {
                    let i = next.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                    if i >= runs {
                        return;
                    }
                    let run_seed = Rng(seed ^ i.wrapping_mul(0x9E37)).next();
                    let e = (run_seed % ENDINGS.len() as u64) as usize;
                    let t = Instant::now();
                    let out = run_one(&exe, run_seed, ENDINGS[e], &device);
                    let took = t.elapsed().as_secs_f64();
                    if let Ok(mut s) = slowest.lock() {
                        if took > s.0 {
                            *s = (took, format!("run {i} (child seed {run_seed}, ending {})", ENDINGS[e]));
                        }
                    }
                    if let Ok(mut c) = counts.lock() {
                        c[e] += 1;
                    }
                    if !out.ok {
                        if let Ok(mut f) = failures.lock() {
                            f.push(format!("run {i} (child seed {run_seed}, ending {}): {}", ENDINGS[e], out.detail));
                        }
                    }
                }
            });
        }
    });
    let failures = failures.into_inner().unwrap_or_default();
    let counts = counts.into_inner().unwrap_or_default();
    let per: Vec<String> = ENDINGS.iter().zip(counts).map(|(e, c)| format!("{e}={c}")).collect();
    println!(
        "exit_torture: {} runs in {:.1} s, {} failed (seed {seed}; endings {})",
        runs,
        start.elapsed().as_secs_f64(),
        failures.len(),
        per.join(" ")
    );
    if let Ok(s) = slowest.lock() {
        println!("exit_torture: slowest run took {:.2} s: {}", s.0, s.1);
    }
    for f in failures.iter().take(10) {
        println!("FAILED {f}");
    }
    if failures.is_empty() { 0 } else { 1 }
}
