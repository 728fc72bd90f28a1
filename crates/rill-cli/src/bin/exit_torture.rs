//! Exit torture: a process that ends abruptly, in one of several ways, while threads and
//! tokio tasks are doing rill work, and a driver that runs it many times and checks every
//! run's exit status and stderr.
//!
//! ```text
//! exit_torture drive --runs N [--seed S] [--device cpu|gpu] [--jobs J] [--scenario NAME] [--ending NAME]
//! exit_torture child --seed S --ending E [--scenario NAME] [--device cpu|gpu] [--late-libs]
//! exit_torture compile-exit [--device cpu|gpu|auto] [--ops N]
//! ```
//!
//! Scenarios (what the child is doing when it ends; chosen per run by the driver, round
//! robin over every scenario x ending pair, or fixed with `--scenario`):
//!
//! - `mixed`: 0-5 threads submitting elementwise graphs (eval, submit, dropped
//!   `async_eval`, `to_vec`), a thread blocked in a long eval, 0-7 tokio tasks awaiting
//!   `async_eval` (some in `stream.scope`); main ends 0-20 ms after it started them.
//! - `first-use`: the first use of a backend library at a random moment just before exit:
//!   the process's first matrix product (f32 or bf16, batched or not: cuBLAS/cuBLASLt on a
//!   GPU), its first compiled-function call (a fused kernel: NVRTC on a GPU), and, with
//!   `--device gpu`, the first `Device::gpu(0)` itself; each started by a spawned thread
//!   or a tokio task while main ends 0-30 ms later.
//! - `submitters`: 2-8 threads keep submitting f32/bf16 matmul chains, elementwise graphs
//!   and calls of a shared compiled function, finished by eval, submit, `to_vec`, or an
//!   `async_eval` future that is dropped unpolled, dropped after one poll, or awaited;
//!   main sleeps 20-1000 ms and ends.
//! - `tokio`: a multi-thread tokio runtime with 16-64 tasks that hop threads (`yield_now`,
//!   `tokio::spawn`), build inside `stream.scope(fut)` across `.await` (checking that the
//!   override holds after each `.await`) and await `rill::async_eval`; the runtime is
//!   dropped, leaked (`mem::forget`), or left running on a thread of its own when the
//!   process ends.
//! - `thread-locals`: arrays, streams and compiled functions in `thread_local!` slots on
//!   several threads (and on main, and on the thread that calls `exit`) and in statics
//!   dropped by `atexit` handlers registered before and after rill initialised, whose
//!   destructors evaluate work (`eval`, a compiled call, a matmul); some threads end on
//!   their own while main ends, some never end.
//! - `shutdown-race`: `rill::shutdown()` or `runtime::shutdown_timeout(0-50 ms)` called
//!   from a random thread (a thread of its own, a submitting thread, a tokio blocking
//!   task, or main) while other threads and tasks submit; afterwards the caller checks that
//!   `stats().backend_calls_after_shutdown == 0` and that a new op returns
//!   `Error::ShutDown`; then the process ends.
//!
//! With `--device gpu` a quarter of the runs also take `--late-libs` with
//! `RILL_CUDA_PRELOAD=0`: the child runs CPU work before main opens the GPU, so the
//! backend libraries are loaded after the runtime registered its exit hook.
//!
//! Endings: `return` (exit 0), `exit` (std::process::exit(3) from a non-main thread),
//! `panic` (panic on the main thread: exit 101), `sigterm` / `sigint` (sent by the driver
//! 0-20 ms after the child reports it is about to end: killed by that signal),
//! `drop-runtime` (the child's tokio runtime, made for the purpose if the scenario has
//! none, is dropped with tasks still running, then main returns: exit 0).
//!
//! The child checks every rill `Result` it gets: `Ok` or `Err(Error::ShutDown)` is fine,
//! anything else is printed on stderr as `exit_torture: unexpected error: ...`. An
//! `atexit` handler registered before rill initialises (so it runs after rill's exit hook)
//! checks that `stats().backend_calls_after_shutdown` is 0.
//! The driver fails a run that dies of a signal other than its ending's, hangs, exits with
//! another status, or prints anything on stderr other than the intended panic (and the
//! documented `rill shutdown:` lines when `RILL_DEBUG_SHUTDOWN` is set). It prints a table
//! of runs and failures per scenario and ending, the seed, and up to 10 failures.
//!
//! `compile-exit` is one targeted case: main returns while a pool thread is compiling a
//! large fused kernel (on the GPU: inside NVRTC, a library loaded after rill's exit hook
//! was first registered). It prints the device it used on stdout and must exit with 0
//! and an empty stderr.
//!
//! `RILL_TORTURE_TRACE=1` makes a crashing child print the signal, the faulting library and
//! a backtrace; `RILL_TORTURE_STATS=1` makes it print `rill::runtime::stats()` on stdout in
//! its last exit handler; `RILL_TORTURE_HANG_S` is the hang bound (60 s).

#![allow(clippy::disallowed_types)] // a user of rill, not its runtime: std's primitives (clippy.toml)

use std::cell::RefCell;
use std::future::Future;
use std::io::{BufRead, BufReader, Read, Write};
use std::panic::AssertUnwindSafe;
use std::pin::pin;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::SeqCst};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Wake, Waker};
use std::time::{Duration, Instant};

use rill::{Array, Compiled, DType, Device, Error, Stream};

const ENDINGS: [&str; 6] = ["return", "exit", "panic", "sigterm", "sigint", "drop-runtime"];
const SCENARIOS: [&str; 6] = ["mixed", "first-use", "submitters", "tokio", "thread-locals", "shutdown-race"];

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
    /// A value in `lo..=hi`.
    fn range(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.below(hi - lo + 1)
    }
    fn pick<T: Copy>(&mut self, v: &[T]) -> T {
        v[self.below(v.len() as u64) as usize]
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
                "usage: exit_torture drive --runs N [--seed S] [--device cpu|gpu] [--jobs J] [--scenario NAME] [--ending NAME] \
                 | child --seed S --ending E [--scenario NAME] [--device cpu|gpu] | compile-exit [--device cpu|gpu|auto] [--ops N]\n\
                 scenarios: {}\nendings: {}",
                SCENARIOS.join(" "),
                ENDINGS.join(" ")
            );
            std::process::exit(2);
        }
    }
}

// ---------------------------------------------------------------- checking results

/// Unexpected errors the child reported.
static UNEXPECTED: AtomicU64 = AtomicU64::new(0);
/// Results checked: `Ok`, `Error::ShutDown`; destructors that evaluated (for
/// `RILL_TORTURE_STATS`).
static OKS: AtomicU64 = AtomicU64::new(0);
static SHUT_DOWNS: AtomicU64 = AtomicU64::new(0);
static DESTRUCTORS: AtomicU64 = AtomicU64::new(0);

/// Reports an unexpected outcome on stderr (the driver fails the run). Never panics: it
/// runs in destructors and exit handlers too.
fn unexpected(what: &str, detail: impl std::fmt::Display) {
    // Bound the noise of a thread that keeps failing.
    if UNEXPECTED.fetch_add(1, SeqCst) < 20 {
        let thread = std::thread::current().name().map(str::to_owned).unwrap_or_else(|| "?".into());
        let _ = writeln!(std::io::stderr(), "exit_torture: unexpected error: {what} (thread '{thread}'): {detail}");
    }
}

/// `Some` for `Ok`, `None` for `Error::ShutDown` (expected at any moment of an ending) and
/// for any other error, which is reported.
fn ok<T>(what: &str, r: rill::Result<T>) -> Option<T> {
    match r {
        Ok(v) => {
            OKS.fetch_add(1, SeqCst);
            Some(v)
        }
        Err(Error::ShutDown) => {
            SHUT_DOWNS.fetch_add(1, SeqCst);
            None
        }
        Err(e) => {
            unexpected(what, format!("{e} ({e:?})"));
            None
        }
    }
}

/// Runs `f` with `stream` (or `device`'s default stream) as the target of the ops it builds.
fn on<R>(device: Device, stream: Option<&Stream>, f: impl FnOnce() -> rill::Result<R>) -> rill::Result<R> {
    match stream {
        Some(s) => rill::with_stream(s, f),
        None => {
            let s = device.default_stream()?;
            rill::with_stream(&s, f)
        }
    }
}

/// Blocks the calling thread on a future (woken by unparking it).
fn block_on<F: Future>(fut: F) -> F::Output {
    struct Unpark(std::thread::Thread);
    impl Wake for Unpark {
        fn wake(self: Arc<Self>) {
            self.0.unpark();
        }
    }
    let waker = Waker::from(Arc::new(Unpark(std::thread::current())));
    let mut cx = Context::from_waker(&waker);
    let mut fut = pin!(fut);
    loop {
        match fut.as_mut().poll(&mut cx) {
            Poll::Ready(v) => return v,
            Poll::Pending => std::thread::park_timeout(Duration::from_millis(50)),
        }
    }
}

// ---------------------------------------------------------------- work

/// An elementwise graph on 64-4159 elements (the torture's original graph).
fn elementwise(seed: u64) -> rill::Result<Array> {
    let n = 64 + (seed % 4096) as usize;
    let x = Array::full(&[n], (seed % 7) as f64, DType::F32)?;
    let y = x.mul(1.5)?.add(&x)?.tanh()?.sqrt()?;
    y.mul(&x)?.add(1.0)
}

/// A chain of matrix products.
#[derive(Clone, Copy, Debug)]
struct Mm {
    dtype: DType,
    /// 0: plain matrices; else the batch size.
    batch: usize,
    /// The weight is batched too (else broadcast over the batch).
    batched_weight: bool,
    n: usize,
    depth: usize,
}

impl Mm {
    fn random(r: &mut Rng, device: Device, dtype: DType, batch: Option<bool>) -> Mm {
        let batched = batch.unwrap_or(r.below(2) == 0);
        let n = match (device.is_gpu(), batched) {
            (true, false) => r.pick(&[64, 128, 256, 512, 1024]),
            (true, true) => r.pick(&[64, 128, 256, 512]),
            _ => r.pick(&[8, 16, 32, 48, 64, 96]),
        };
        let batch = if batched { r.range(2, if device.is_gpu() { 8 } else { 4 }) as usize } else { 0 };
        Mm { dtype, batch, batched_weight: r.below(2) == 0, n, depth: r.range(1, 4) as usize }
    }
}

fn matmul_chain(m: Mm) -> rill::Result<Array> {
    let shape: Vec<usize> = if m.batch > 0 { vec![m.batch, m.n, m.n] } else { vec![m.n, m.n] };
    let w_shape: Vec<usize> = if m.batch > 0 && m.batched_weight { shape.clone() } else { vec![m.n, m.n] };
    let mut y = Array::full(&shape, 0.5, m.dtype)?;
    let w = Array::full(&w_shape, 1.0 / m.n as f64, m.dtype)?;
    for _ in 0..m.depth {
        y = y.matmul(&w)?.tanh()?.add(0.25)?;
    }
    Ok(y)
}

/// The compiled function the threads of a scenario share: a fused elementwise chain.
fn make_compiled() -> Compiled {
    rill::compile(|x: &[Array]| {
        let y = x[0].mul(1.0001)?.add(0.5)?.sin()?.mul(&x[0])?.tanh()?;
        Ok(vec![y.add(1.0)?])
    })
}

/// A call of `f` on an input of one of a few sizes and dtypes (so a few traces and kernels).
fn compiled_call(f: &Compiled, seed: u64) -> rill::Result<Array> {
    let n = [256usize, 1024, 4096, 1 << 14][(seed % 4) as usize];
    let dtype = if (seed >> 2).is_multiple_of(4) { DType::BF16 } else { DType::F32 };
    let x = Array::full(&[n], (seed % 5) as f64 * 0.1, dtype)?;
    let mut out = f.call(&[x])?;
    Ok(out.swap_remove(0))
}

/// What a piece of work is made of.
#[derive(Clone, Copy, Debug)]
enum Build {
    Elementwise,
    Matmul(Mm),
    Compiled,
}

fn build(b: Build, f: &Compiled, seed: u64) -> rill::Result<Array> {
    match b {
        Build::Elementwise => elementwise(seed),
        Build::Matmul(m) => matmul_chain(m),
        Build::Compiled => compiled_call(f, seed),
    }
}

fn random_build(r: &mut Rng, device: Device) -> Build {
    match r.below(5) {
        0 => Build::Matmul(Mm::random(r, device, DType::F32, None)),
        1 => Build::Matmul(Mm::random(r, device, DType::BF16, None)),
        2 | 3 => Build::Compiled,
        _ => Build::Elementwise,
    }
}

/// Consumes `a` in one of the ways a program does: returns false once the runtime is
/// shut down (or on an unexpected error, reported).
fn consume(a: &Array, how: u64, what: &str) -> bool {
    let one = std::slice::from_ref(a);
    match how % 7 {
        0 => ok(what, a.eval()).is_some(),
        1 => ok(what, rill::submit(one)).is_some(),
        2 => ok(what, a.astype(DType::F32).and_then(|b| b.to_vec::<f32>())).is_some(),
        3 => {
            // An async_eval future dropped without being polled.
            drop(rill::async_eval(one));
            true
        }
        4 => {
            // Dropped after one poll.
            let mut fut = pin!(rill::async_eval(one));
            match fut.as_mut().poll(&mut Context::from_waker(Waker::noop())) {
                Poll::Ready(r) => ok(what, r).is_some(),
                Poll::Pending => true,
            }
        }
        _ => ok(what, block_on(rill::async_eval(one))).is_some(),
    }
}

/// What the submitting threads of a scenario share.
struct Shared {
    device: Device,
    f: Compiled,
    streams: Vec<Stream>,
}

impl Shared {
    fn new(device: Device, streams: usize) -> Arc<Shared> {
        let streams = (0..streams).filter_map(|_| ok("Stream::new", Stream::new(&device))).collect();
        Arc::new(Shared { device, f: make_compiled(), streams })
    }
}

static KEEP: Mutex<Vec<Array>> = Mutex::new(Vec::new());
static KEEP_STREAMS: Mutex<Vec<Stream>> = Mutex::new(Vec::new());
thread_local! {
    static TLS_KEEP: RefCell<Option<(Stream, Array)>> = const { RefCell::new(None) };
}

/// Keeps `a` (and `s`) alive in a static (never dropped) and a thread-local (dropped when
/// the thread ends).
fn stash(a: &Array, s: Option<&Stream>) {
    if let Some(s) = s {
        let _ = TLS_KEEP.try_with(|k| *k.borrow_mut() = Some((s.clone(), a.clone())));
    }
    if let Ok(mut k) = KEEP.lock()
        && k.len() < 64
    {
        k.push(a.clone());
    }
}

/// A thread that keeps submitting work of every kind until the runtime shuts down, or
/// for `iterations` pieces of work. Calls `at(i)` before piece `i` (the shutdown race uses
/// it); stops when it returns false.
/// The stream of a submitter's next graph: its own, a shared one, or none (the default).
/// Its own is replaced by a fresh stream now and then (twice at most: a GPU stream's cuBLAS
/// workspace is 32 MiB), so a stream's first matmul makes its cuBLAS handles and workspace
/// at a random moment, maybe just before exit.
fn pick_stream(sh: &Shared, r: &mut Rng, own: &mut Option<Stream>, fresh: &mut u32) -> Option<Stream> {
    if own.is_some() && *fresh < 2 && r.below(64) == 0 {
        *fresh += 1;
        *own = ok("Stream::new", Stream::new(&sh.device));
    }
    match r.below(3) {
        0 => own.clone(),
        1 if !sh.streams.is_empty() => Some(sh.streams[r.below(sh.streams.len() as u64) as usize].clone()),
        _ => None,
    }
}

fn submitter(sh: &Shared, seed: u64, iterations: Option<u64>, mut at: impl FnMut(u64) -> bool) {
    let mut r = Rng(seed);
    let mut own = if r.below(3) == 0 { ok("Stream::new", Stream::new(&sh.device)) } else { None };
    let (mut i, mut fresh) = (0, 0);
    while iterations.is_none_or(|n| i < n) {
        if !at(i) {
            return;
        }
        i += 1;
        let stream = pick_stream(sh, &mut r, &mut own, &mut fresh);
        let b = random_build(&mut r, sh.device);
        let seed = r.next();
        let Some(a) = ok("submitter: build", on(sh.device, stream.as_ref(), || build(b, &sh.f, seed))) else {
            return;
        };
        if !consume(&a, r.next(), "submitter: evaluate") {
            return;
        }
        if r.below(16) == 0 {
            stash(&a, stream.as_ref());
        }
    }
}

// ---------------------------------------------------------------- thread-locals and statics

/// Holds rill objects and evaluates work with them when dropped (from a thread-local's
/// destructor, an exit handler, or a static's).
struct EvalOnDrop {
    what: &'static str,
    device: Device,
    stream: Option<Stream>,
    arrays: Vec<Array>,
    f: Option<Compiled>,
    mm: Option<Mm>,
    read_back: bool,
}

impl EvalOnDrop {
    fn new(what: &'static str, sh: &Shared, r: &mut Rng) -> Option<EvalOnDrop> {
        let stream = match r.below(3) {
            0 => ok("Stream::new", Stream::new(&sh.device)),
            1 if !sh.streams.is_empty() => Some(sh.streams[r.below(sh.streams.len() as u64) as usize].clone()),
            _ => None,
        };
        let seeds: Vec<u64> = (0..r.range(1, 3)).map(|_| r.next()).collect();
        let arrays = ok(
            "thread-local: build",
            on(sh.device, stream.as_ref(), || seeds.iter().map(|&s| elementwise(s)).collect::<rill::Result<Vec<_>>>()),
        )?;
        let f = match r.below(3) {
            0 => Some(make_compiled()),
            1 => Some(sh.f.clone()),
            _ => None,
        };
        let mm = if r.below(2) == 0 {
            let dtype = if r.below(2) == 0 { DType::F32 } else { DType::BF16 };
            Some(Mm::random(r, sh.device, dtype, None))
        } else {
            None
        };
        Some(EvalOnDrop { what, device: sh.device, stream, arrays, f, mm, read_back: r.below(2) == 0 })
    }

    fn run(&self) {
        let what = self.what;
        let Some(stream) = self.stream.clone().or_else(|| ok(what, self.device.default_stream())) else { return };
        let _g = stream.enter();
        for a in &self.arrays {
            let Some(y) = ok(what, a.mul(2.0).and_then(|y| y.add(1.0))) else { return };
            if ok(what, y.eval()).is_none() {
                return;
            }
            if self.read_back && ok(what, y.to_vec::<f32>()).is_none() {
                return;
            }
        }
        if let (Some(f), Some(x)) = (&self.f, self.arrays.first()) {
            let Some(out) = ok(what, f.call(std::slice::from_ref(x))) else { return };
            if ok(what, rill::eval(&out)).is_none() {
                return;
            }
        }
        if let Some(m) = self.mm {
            let _ = ok(what, matmul_chain(m).and_then(|y| y.eval()));
        }
    }
}

impl Drop for EvalOnDrop {
    fn drop(&mut self) {
        DESTRUCTORS.fetch_add(1, SeqCst);
        if std::panic::catch_unwind(AssertUnwindSafe(|| self.run())).is_err() {
            unexpected(self.what, "a panic while evaluating in a destructor");
        }
    }
}

thread_local! {
    static TLS_EVAL: RefCell<Vec<EvalOnDrop>> = const { RefCell::new(Vec::new()) };
    static TLS_COMPILED: RefCell<Option<Compiled>> = const { RefCell::new(None) };
    static TLS_STREAM: RefCell<Option<Stream>> = const { RefCell::new(None) };
}

/// Fills this thread's thread-local slots.
fn fill_thread_locals(sh: &Shared, r: &mut Rng, what: &'static str) {
    for _ in 0..r.range(1, 3) {
        if let Some(e) = EvalOnDrop::new(what, sh, r) {
            let _ = TLS_EVAL.try_with(|v| v.borrow_mut().push(e));
        }
    }
    if r.below(2) == 0 {
        let _ = TLS_COMPILED.try_with(|c| *c.borrow_mut() = Some(make_compiled()));
    }
    if r.below(2) == 0
        && let Some(s) = ok("Stream::new", Stream::new(&sh.device))
    {
        let _ = TLS_STREAM.try_with(|c| *c.borrow_mut() = Some(s));
    }
}

/// Objects dropped (evaluating) by an exit handler registered before rill initialised,
/// which runs after rill's exit hook.
static AT_EXIT_EARLY: Mutex<Vec<EvalOnDrop>> = Mutex::new(Vec::new());
/// The same, registered after rill initialised: it runs before rill's hook (unless rill
/// registered its hook again since, as it does after loading a GPU library).
static AT_EXIT_LATE: Mutex<Vec<EvalOnDrop>> = Mutex::new(Vec::new());

fn drop_static(m: &Mutex<Vec<EvalOnDrop>>) {
    let taken = match m.try_lock() {
        Ok(mut g) => std::mem::take(&mut *g),
        Err(_) => Vec::new(),
    };
    if std::panic::catch_unwind(AssertUnwindSafe(move || drop(taken))).is_err() {
        unexpected("exit handler", "a panic while dropping a static");
    }
}

extern "C" fn drop_early_statics() {
    drop_static(&AT_EXIT_EARLY);
}

extern "C" fn drop_late_statics() {
    drop_static(&AT_EXIT_LATE);
}

/// Registered first, so it runs after every other exit handler, rill's hook included.
extern "C" fn final_check() {
    let r = std::panic::catch_unwind(|| {
        let s = rill::runtime::stats();
        if std::env::var_os("RILL_TORTURE_STATS").is_some() {
            println!(
                "exit_torture: at exit: results ok {}, shut down {}, unexpected {}; evaluating destructors {}; \
                 rill shutting down {}; {s:?}",
                OKS.load(SeqCst),
                SHUT_DOWNS.load(SeqCst),
                UNEXPECTED.load(SeqCst),
                DESTRUCTORS.load(SeqCst),
                rill::runtime::is_shutting_down()
            );
        }
        if s.backend_calls_after_shutdown != 0 {
            unexpected(
                "at exit, after rill's exit hook",
                format!("stats().backend_calls_after_shutdown == {}", s.backend_calls_after_shutdown),
            );
        }
    });
    if r.is_err() {
        unexpected("at exit", "a panic in the final check");
    }
}

fn at_exit(f: extern "C" fn()) {
    // SAFETY: `f` is a plain function that catches every panic.
    if unsafe { libc::atexit(f) } != 0 {
        unexpected("atexit", "registration failed");
    }
}

// ---------------------------------------------------------------- the child

/// What happens to the child's tokio runtime at an ending other than `drop-runtime`.
#[derive(Clone, Copy, Debug)]
enum Fate {
    /// `mem::forget`: its threads keep running, nothing drops it.
    Forget,
    /// Dropped with tasks in flight, just before the ending.
    Drop,
    /// Moved to a thread that blocks on it: still running when the process ends.
    Running,
}

/// What the child's main thread holds until its ending.
struct Child {
    /// `None` only in `first-use` when the first `Device::gpu(0)` is left to a spawned
    /// thread (main does not touch rill then).
    device: Option<Device>,
    gpu: bool,
    rng: Rng,
    rt: Option<tokio::runtime::Runtime>,
    fate: Fate,
    /// `thread-locals`: the thread that calls `exit` fills its own thread-locals first, so
    /// their destructors run inside `exit`.
    exit_tls: Option<Arc<Shared>>,
}

impl Child {
    fn device(&self) -> Device {
        self.device.unwrap_or(Device::cpu())
    }
    fn apply_fate(&mut self) {
        if let Some(rt) = self.rt.take() {
            match self.fate {
                Fate::Forget => std::mem::forget(rt),
                Fate::Drop => drop(rt),
                Fate::Running => {
                    std::thread::spawn(move || rt.block_on(std::future::pending::<()>()));
                }
            }
        }
    }
}

fn build_rt(workers: usize) -> tokio::runtime::Runtime {
    match tokio::runtime::Builder::new_multi_thread().worker_threads(workers).enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            unexpected("tokio runtime", e);
            std::process::exit(70)
        }
    }
}

fn open_device(gpu: bool) -> Device {
    if gpu {
        Device::gpu(0).unwrap_or_else(|e| {
            eprintln!("exit_torture: no GPU: {e}");
            std::process::exit(77)
        })
    } else {
        Device::cpu()
    }
}

fn child(args: &[String]) {
    trace_fatal_signals();
    // Before rill initialises, so these run after its exit hook.
    at_exit(final_check);
    at_exit(drop_early_statics);
    let seed: u64 = arg(args, "--seed").and_then(|s| s.parse().ok()).unwrap_or(1);
    let ending = arg(args, "--ending").unwrap_or_else(|| "return".into());
    let scenario =
        arg(args, "--scenario").unwrap_or_else(|| SCENARIOS[(seed % SCENARIOS.len() as u64) as usize].into());
    if !ENDINGS.contains(&ending.as_str()) || !SCENARIOS.contains(&scenario.as_str()) {
        eprintln!("exit_torture: unknown ending {ending} or scenario {scenario}");
        std::process::exit(2);
    }
    let gpu = arg(args, "--device").as_deref() == Some("gpu");
    let mut rng = Rng(seed);
    // first-use: in a quarter of the runs main leaves the first device use to the threads.
    let first_device = scenario == "first-use" && rng.below(4) == 0;
    // --late-libs (with RILL_CUDA_PRELOAD=0 from the driver): CPU work starts the runtime
    // before the first GPU probe loads the backend libraries, so the exit hook must be
    // registered again after them. The device is opened by main (an exit during that
    // first probe is the window docs/RUNTIME.md describes).
    let late_libs = args.iter().any(|a| a == "--late-libs");
    if late_libs {
        let _ =
            ok("late libraries: CPU work first", on(Device::cpu(), None, || elementwise(seed)).and_then(|a| a.eval()));
    }
    let device = if first_device && !late_libs { None } else { Some(open_device(gpu)) };
    if let Some(d) = device {
        rill::set_default_device(d);
    }
    let mut c = Child { device, gpu, rng, rt: None, fate: Fate::Forget, exit_tls: None };
    let after_busy = match scenario.as_str() {
        "mixed" => mixed(&mut c),
        "first-use" => first_use(&mut c),
        "submitters" => submitters(&mut c),
        "tokio" => tokio_scenario(&mut c),
        "thread-locals" => thread_locals(&mut c),
        _ => shutdown_race(&mut c),
    };
    end(c, &ending, after_busy);
}

/// Ends the child: reports `busy` (the driver may now send its signal), waits
/// `after_busy`, and ends the way `ending` says.
fn end(mut c: Child, ending: &str, after_busy: Duration) {
    if ending == "drop-runtime" && c.rt.is_none() {
        // A runtime with tasks in flight, to be dropped.
        let rt = build_rt(2);
        let sh = Shared::new(c.device(), 1);
        for _ in 0..4 {
            rt.spawn(task_loop(sh.clone(), c.rng.next()));
        }
        c.rt = Some(rt);
    }
    println!("busy");
    let _ = std::io::stdout().flush();
    std::thread::sleep(after_busy);
    match ending {
        "return" => c.apply_fate(),
        "exit" => {
            c.apply_fate();
            let tls = c.exit_tls.take();
            let seed = c.rng.next();
            let h = std::thread::spawn(move || {
                if let Some(sh) = tls {
                    fill_thread_locals(&sh, &mut Rng(seed), "the exiting thread's thread-local destructor");
                }
                std::process::exit(3)
            });
            let _ = h.join();
            loop {
                std::thread::park();
            }
        }
        "panic" => {
            c.apply_fate();
            panic!("exit_torture: intended panic on the main thread");
        }
        "sigterm" | "sigint" => {
            c.apply_fate();
            // Wait for the signal while work continues.
            loop {
                std::thread::park();
            }
        }
        _ => drop(c.rt.take()),
    }
}

// ---- mixed: the original torture

fn busy_thread(device: Device, seed: u64, mode: u64) {
    let mut rng = Rng(seed);
    let own = if mode.is_multiple_of(2) { ok("Stream::new", Stream::new(&device)) } else { None };
    loop {
        let s = rng.next();
        let Some(a) = ok("busy thread: build", on(device, own.as_ref(), || elementwise(s))) else { return };
        // eval, submit, to_vec, or an async_eval that is never awaited.
        if !consume(&a, rng.below(4), "busy thread: evaluate") {
            return;
        }
        if rng.below(16) == 0 {
            stash(&a, own.as_ref());
        }
    }
}

fn blocked_waiter(device: Device) {
    // A long dependent chain: this thread sits in a blocking wait while the process ends.
    let chain = || -> rill::Result<Array> {
        let mut x = Array::full(&[1 << 16], 1.0, DType::F32)?;
        for _ in 0..2000 {
            x = x.mul(1.0001)?.sqrt()?;
        }
        Ok(x)
    };
    if let Some(x) = ok("blocked waiter: build", on(device, None, chain)) {
        let _ = ok("blocked waiter: eval", x.eval());
    }
}

fn mixed(c: &mut Child) -> Duration {
    let device = c.device();
    let r = &mut c.rng;
    // A static holding a stream, never dropped.
    if let Some(s) = ok("Stream::new", Stream::new(&device))
        && let Ok(mut k) = KEEP_STREAMS.lock()
    {
        k.push(s);
    }
    for t in 0..r.below(6) {
        let s = r.next();
        std::thread::spawn(move || busy_thread(device, s, t));
    }
    if r.below(2) == 0 {
        std::thread::spawn(move || blocked_waiter(device));
    }
    let rt = build_rt(2);
    for t in 0..r.below(8) {
        let s = r.next();
        rt.spawn(async move {
            let mut r = Rng(s);
            let stream = if t % 2 == 0 { ok("Stream::new", Stream::new(&device)) } else { None };
            loop {
                let s = r.next();
                let Some(a) = ok("task: build", on(device, stream.as_ref(), || elementwise(s))) else { return };
                let fut = match &stream {
                    Some(st) => tokio::spawn(st.scope(async move { rill::async_eval(&[a]).await })),
                    None => tokio::spawn(rill::async_eval(&[a])),
                };
                let done = fut.await.map(|res| ok("task: async_eval", res).is_some());
                if !matches!(done, Ok(true)) {
                    return;
                }
                tokio::task::yield_now().await;
            }
        });
    }
    c.rt = Some(rt);
    Duration::from_micros(r.below(20_000))
}

// ---- first-use: a backend library's first use just before exit

#[derive(Clone, Copy, Debug)]
enum First {
    /// The process's first matrix product of this dtype, batched or not.
    Matmul(DType, bool),
    /// The first call of a compiled function (a fused kernel).
    Compile,
    /// The first use of the device (`Device::gpu(0)` on a GPU; the first op on the CPU).
    Device,
}

/// The device for a first-use thread: main's, or opened here (the process's first).
fn resolve(device: Option<Device>, gpu: bool) -> Option<Device> {
    match device {
        Some(d) => Some(d),
        None if gpu => ok("first use: Device::gpu(0) on a spawned thread", Device::gpu(0)),
        None => Some(Device::cpu()),
    }
}

fn first_build(k: First, device: Device, r: &mut Rng) -> rill::Result<Array> {
    match k {
        First::Matmul(dtype, batch) => {
            let m = Mm { depth: 1, ..Mm::random(r, device, dtype, Some(batch)) };
            on(device, None, || matmul_chain(m))
        }
        First::Compile => {
            let f = make_compiled();
            let s = r.next();
            on(device, None, || compiled_call(&f, s))
        }
        First::Device => {
            let s = r.next();
            on(device, None, || elementwise(s))
        }
    }
}

fn first_use(c: &mut Child) -> Duration {
    let (device, gpu) = (c.device, c.gpu);
    let r = &mut c.rng;
    let rt = build_rt(2);
    let mut kinds = Vec::new();
    if device.is_none() {
        kinds.push(First::Device);
    }
    let all = [
        First::Matmul(DType::F32, false),
        First::Matmul(DType::F32, true),
        First::Matmul(DType::BF16, false),
        First::Matmul(DType::BF16, true),
        First::Compile,
    ];
    for _ in 0..r.range(if device.is_none() { 0 } else { 1 }, 3) {
        kinds.push(r.pick(&all));
    }
    if let Some(d) = device
        && r.below(2) == 0
    {
        // The device is up and has run a kernel; the library under test is not loaded.
        let _ = ok("first use: warm-up", on(d, None, || elementwise(1)).and_then(|a| a.eval()));
    }
    for k in kinds {
        let delay = Duration::from_micros(r.below(3000));
        let seed = r.next();
        if r.below(3) == 0 {
            rt.spawn(async move {
                tokio::time::sleep(delay).await;
                let Some(device) = resolve(device, gpu) else { return };
                let mut r = Rng(seed);
                let Some(a) = ok("first use in a task: build", first_build(k, device, &mut r)) else { return };
                let _ = ok("first use in a task: async_eval", rill::async_eval(&[a]).await);
            });
        } else {
            std::thread::spawn(move || {
                std::thread::sleep(delay);
                let Some(device) = resolve(device, gpu) else { return };
                let mut r = Rng(seed);
                let Some(a) = ok("first use: build", first_build(k, device, &mut r)) else { return };
                consume(&a, r.next(), "first use: evaluate");
            });
        }
    }
    c.rt = Some(rt);
    Duration::from_micros(r.below(30_000))
}

// ---- submitters: threads submitting everything while main sleeps

fn submitters(c: &mut Child) -> Duration {
    let r = &mut c.rng;
    let sh = Shared::new(c.device.unwrap_or(Device::cpu()), r.range(0, 2) as usize);
    for _ in 0..r.range(2, 8) {
        let (sh, s) = (sh.clone(), r.next());
        std::thread::spawn(move || submitter(&sh, s, None, |_| true));
    }
    std::thread::sleep(Duration::from_millis(r.range(20, 1000)));
    Duration::ZERO
}

// ---- tokio: tasks hopping threads with scoped streams

/// One task's step: builds work (inside `stream.scope` when `scoped`), awaits it in one
/// of several ways and checks that the scope still holds after each `.await`. False once
/// the runtime is shut down.
async fn task_step(sh: Arc<Shared>, seed: u64, scoped: Option<Stream>) -> bool {
    let mut r = Rng(seed);
    let b = random_build(&mut r, sh.device);
    let bs = r.next();
    let built = match &scoped {
        Some(_) => build(b, &sh.f, bs),
        None => on(sh.device, None, || build(b, &sh.f, bs)),
    };
    let Some(a) = ok("task: build", built) else { return false };
    if r.below(2) == 0 {
        tokio::task::yield_now().await;
    }
    if !scope_holds(&scoped, &a, "task: before awaiting") {
        return false;
    }
    let go = match r.below(5) {
        0 => {
            drop(rill::async_eval(std::slice::from_ref(&a)));
            true
        }
        1 => {
            // Polled once, then dropped.
            let mut fut = pin!(rill::async_eval(std::slice::from_ref(&a)));
            match std::future::poll_fn(|cx| Poll::Ready(fut.as_mut().poll(cx))).await {
                Poll::Ready(res) => ok("task: async_eval polled once", res).is_some(),
                Poll::Pending => true,
            }
        }
        2 => {
            let a2 = a.clone();
            match tokio::spawn(async move { rill::async_eval(&[a2]).await }).await {
                Ok(res) => ok("task: spawned async_eval", res).is_some(),
                Err(_) => false,
            }
        }
        _ => ok("task: async_eval", rill::async_eval(std::slice::from_ref(&a)).await).is_some(),
    };
    if !go {
        return false;
    }
    if r.below(2) == 0 {
        tokio::task::yield_now().await;
    }
    // Built after the awaits: still on the scope's stream, whichever thread resumed us.
    let Some(y) = ok("task: build after .await", a.sqrt()) else { return false };
    scope_holds(&scoped, &y, "task: after .await")
}

/// Inside `stream.scope`, the override is that stream and `a` was built on it.
fn scope_holds(scoped: &Option<Stream>, a: &Array, what: &str) -> bool {
    let Some(s) = scoped else { return true };
    let cur = rill::current_stream_override().map(|o| o.id());
    if cur != Some(s.id()) || a.stream().id() != s.id() {
        unexpected(
            what,
            format!(
                "stream.scope lost: override {cur:?}, array on stream {}, scope's stream {}",
                a.stream().id(),
                s.id()
            ),
        );
        return false;
    }
    true
}

async fn task_loop(sh: Arc<Shared>, seed: u64) {
    let mut r = Rng(seed);
    let mut own = if r.below(4) == 0 { ok("Stream::new", Stream::new(&sh.device)) } else { None };
    let mut fresh = 0;
    loop {
        let stream = pick_stream(&sh, &mut r, &mut own, &mut fresh);
        let step = task_step(sh.clone(), r.next(), stream.clone());
        let go = match stream {
            Some(s) => s.scope(step).await,
            None => step.await,
        };
        if !go {
            return;
        }
        match r.below(3) {
            0 => tokio::task::yield_now().await,
            1 => {
                // Hop: continue after a spawned task, maybe on another worker.
                let _ = tokio::spawn(async {}).await;
            }
            _ => {}
        }
    }
}

fn tokio_scenario(c: &mut Child) -> Duration {
    let r = &mut c.rng;
    let rt = build_rt(r.range(2, 4) as usize);
    let sh = Shared::new(c.device.unwrap_or(Device::cpu()), r.range(1, 3) as usize);
    for _ in 0..r.range(16, 64) {
        rt.spawn(task_loop(sh.clone(), r.next()));
    }
    c.fate = r.pick(&[Fate::Drop, Fate::Forget, Fate::Running]);
    c.rt = Some(rt);
    std::thread::sleep(Duration::from_millis(r.range(5, 100)));
    Duration::from_micros(r.below(20_000))
}

// ---- thread-locals: destructors that evaluate

fn thread_locals(c: &mut Child) -> Duration {
    let device = c.device();
    let r = &mut c.rng;
    let sh = Shared::new(device, r.range(1, 2) as usize);
    let _ = ok("thread-locals: warm-up", on(device, None, || elementwise(3)).and_then(|a| a.eval()));
    // rill has initialised: this handler runs before its exit hook.
    at_exit(drop_late_statics);
    for (m, what) in [
        (&AT_EXIT_EARLY, "a static dropped by an exit handler registered before rill"),
        (&AT_EXIT_LATE, "a static dropped by an exit handler registered after rill"),
    ] {
        for _ in 0..r.range(0, 2) {
            if let Some(e) = EvalOnDrop::new(what, &sh, r)
                && let Ok(mut v) = m.lock()
            {
                v.push(e);
            }
        }
    }
    for _ in 0..r.range(2, 6) {
        let (sh, s, mode) = (sh.clone(), r.next(), r.below(3));
        std::thread::spawn(move || {
            let mut r = Rng(s);
            fill_thread_locals(&sh, &mut r, "a thread-local destructor");
            match mode {
                // Submits until the runtime shuts down (its thread-locals are dropped then,
                // or never, if the process ends first).
                0 => submitter(&sh, r.next(), None, |_| true),
                // Ends on its own 0-40 ms from now, while main ends.
                1 => {
                    let until = Instant::now() + Duration::from_millis(r.below(40));
                    submitter(&sh, r.next(), None, |_| Instant::now() < until)
                }
                // Ends at once.
                _ => {}
            }
        });
    }
    if r.below(2) == 0 {
        // Dropped inside `exit`, before the exit handlers.
        fill_thread_locals(&sh, r, "main's thread-local destructor");
    }
    if r.below(2) == 0 {
        c.exit_tls = Some(sh.clone());
    }
    std::thread::sleep(Duration::from_millis(r.below(20)));
    Duration::from_micros(r.below(40_000))
}

// ---- shutdown-race: an explicit shutdown racing submissions

/// Shutdowns that performed the shutdown (at most one may).
static PERFORMED: AtomicU64 = AtomicU64::new(0);
static RACE_DONE: AtomicBool = AtomicBool::new(false);

fn race(bound: Option<Duration>, done: &std::sync::mpsc::Sender<()>) {
    let rep = match bound {
        Some(b) => rill::runtime::shutdown_timeout(b),
        None => rill::shutdown(),
    };
    if rep.performed {
        PERFORMED.fetch_add(1, SeqCst);
    }
    let calls = rill::runtime::stats().backend_calls_after_shutdown;
    if calls != 0 {
        unexpected(
            "after shutdown returned",
            format!("stats().backend_calls_after_shutdown == {calls} (shutdown bound {bound:?}: {rep:?})"),
        );
    }
    match Array::full(&[4], 1.0, DType::F32) {
        Err(Error::ShutDown) => {}
        Ok(_) => unexpected("an op after shutdown returned", "Ok (expected Error::ShutDown)"),
        Err(e) => unexpected("an op after shutdown returned", format!("{e} (expected Error::ShutDown)")),
    }
    RACE_DONE.store(true, SeqCst);
    let _ = done.send(());
}

fn shutdown_race(c: &mut Child) -> Duration {
    let r = &mut c.rng;
    let sh = Shared::new(c.device.unwrap_or(Device::cpu()), r.range(0, 2) as usize);
    let (tx, rx) = std::sync::mpsc::channel::<()>();
    let bound = |r: &mut Rng| if r.below(2) == 0 { None } else { Some(Duration::from_millis(r.below(51))) };
    // Where the (first) shutdown is called from.
    let place = r.below(4);
    let n = r.range(2, 6);
    let racing_submitter = if place == 1 { r.below(n) } else { u64::MAX };
    if place == 2 || r.below(2) == 0 {
        let rt = build_rt(2);
        for _ in 0..r.range(4, 16) {
            rt.spawn(task_loop(sh.clone(), r.next()));
        }
        c.rt = Some(rt);
    }
    for t in 0..n {
        let (sh, s) = (sh.clone(), r.next());
        let (k, b) = (r.below(50), bound(r));
        let tx = (t == racing_submitter).then(|| tx.clone());
        std::thread::spawn(move || {
            submitter(&sh, s, None, |i| {
                if i == k
                    && let Some(tx) = &tx
                {
                    race(b, tx);
                }
                true
            })
        });
    }
    let (delay, b) = (Duration::from_millis(r.below(100)), bound(r));
    let mut racers = 1;
    match place {
        0 => {
            let tx = tx.clone();
            std::thread::spawn(move || {
                std::thread::sleep(delay);
                race(b, &tx)
            });
        }
        2 => {
            let (tx, blocking) = (tx.clone(), r.below(2) == 0);
            if let Some(rt) = &c.rt {
                rt.spawn(async move {
                    tokio::time::sleep(delay).await;
                    if blocking {
                        let _ = tokio::task::spawn_blocking(move || race(b, &tx)).await;
                    } else {
                        // On a worker thread itself.
                        race(b, &tx)
                    }
                });
            }
        }
        _ => {}
    }
    if r.below(3) == 0 {
        // A second, concurrent shutdown from another thread.
        racers += 1;
        let (tx, delay, b) = (tx.clone(), Duration::from_millis(r.below(100)), bound(r));
        std::thread::spawn(move || {
            std::thread::sleep(delay);
            race(b, &tx)
        });
    }
    if place == 3 {
        std::thread::sleep(delay);
        race(b, &tx);
    }
    drop(tx);
    for _ in 0..racers {
        match rx.recv_timeout(Duration::from_secs(30)) {
            Ok(()) => {}
            Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => break,
            Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {
                unexpected("shutdown-race", "a shutdown did not return within 30 s");
                break;
            }
        }
    }
    if PERFORMED.load(SeqCst) > 1 {
        unexpected("shutdown-race", format!("{} shutdown calls reported performed", PERFORMED.load(SeqCst)));
    }
    if RACE_DONE.load(SeqCst) && PERFORMED.load(SeqCst) == 0 {
        unexpected("shutdown-race", "no shutdown call reported performed");
    }
    Duration::from_micros(c.rng.below(10_000))
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
        "sigterm" => (None, Some(libc::SIGTERM)),
        "sigint" => (None, Some(libc::SIGINT)),
        _ => (None, None),
    }
}

/// Every stderr line must be the intended panic's (ending `panic`) or a documented line of
/// rill (`rill shutdown: ...`, only when `RILL_DEBUG_SHUTDOWN` is set).
fn stderr_ok(ending: &str, err: &str) -> Result<(), String> {
    let debug_shutdown = std::env::var_os("RILL_DEBUG_SHUTDOWN").is_some();
    let debug_compile = std::env::var_os("RILL_DEBUG_COMPILE").is_some();
    for line in err.lines() {
        let intended = ending == "panic"
            && (line.is_empty()
                || line == "exit_torture: intended panic on the main thread"
                || line.starts_with("note: run with `RUST_BACKTRACE=1`")
                || (line.starts_with("thread 'main'")
                    && line.contains("panicked at")
                    && line.contains("exit_torture.rs")));
        let documented = (debug_shutdown && line.starts_with("rill shutdown:"))
            || (debug_compile && line.starts_with("rill compile:"));
        if !intended && !documented {
            return Err(format!("unexpected stderr line: {line}"));
        }
    }
    if ending == "panic" && !err.contains("intended panic") {
        return Err("the intended panic message is missing".into());
    }
    Ok(())
}

fn run_one(exe: &std::path::Path, seed: u64, scenario: &str, ending: &str, device: &str) -> Outcome {
    use std::os::unix::process::ExitStatusExt;
    let mut args =
        ["child", "--seed", &seed.to_string(), "--scenario", scenario, "--ending", ending, "--device", device]
            .map(String::from)
            .to_vec();
    // A quarter of the GPU runs load the backend libraries late (see `child`).
    let late_libs = device == "gpu" && Rng(seed ^ 0x1a7e).below(4) == 0;
    if late_libs {
        args.push("--late-libs".into());
    }
    let preload = if late_libs { "0" } else { "1" };
    let repro = format!("`RILL_CUDA_PRELOAD={preload} exit_torture {}`", args.join(" "));
    let mut child = match Command::new(exe)
        .args(&args)
        .env("RUST_BACKTRACE", "0")
        .env("RILL_CUDA_PRELOAD", preload)
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
    let hang =
        Duration::from_secs(std::env::var("RILL_TORTURE_HANG_S").ok().and_then(|v| v.parse().ok()).unwrap_or(60));
    let busy = busy_rx.recv_timeout(hang).unwrap_or(false);
    if busy && (ending == "sigterm" || ending == "sigint") {
        let mut r = Rng(seed ^ 0x5eed);
        std::thread::sleep(Duration::from_micros(r.below(20_000)));
        let sig = if ending == "sigterm" { libc::SIGTERM } else { libc::SIGINT };
        // SAFETY: sends a signal to our own child, which has not been reaped yet.
        unsafe {
            libc::kill(child.id() as libc::pid_t, sig);
        }
    }
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
            detail: format!("{repro}: hung for {hang:?}; threads (name state wchan): {threads_at_hang}; stderr: {err}"),
        };
    };
    if status.code() == Some(77) {
        return Outcome { ok: false, detail: format!("{repro}: no GPU: {err}") };
    }
    let (code, signal) = expected(ending);
    let status_ok = status.code() == code && status.signal() == signal;
    let mut detail = format!("{repro}: status {status:?} (expected code {code:?} signal {signal:?})");
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
    if !status_ok && err_ok && !err.is_empty() {
        detail.push_str(&format!("; stderr:\n{err}"));
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

/// Runs and failures of one scenario x ending pair.
#[derive(Clone, Copy, Default)]
struct Cell {
    runs: u64,
    failed: u64,
}

fn drive(args: &[String]) -> i32 {
    let runs: u64 = arg(args, "--runs").and_then(|s| s.parse().ok()).unwrap_or(100);
    let seed: u64 = arg(args, "--seed").and_then(|s| s.parse().ok()).unwrap_or_else(|| {
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_nanos() as u64).unwrap_or(1)
    });
    let jobs: u64 = arg(args, "--jobs").and_then(|s| s.parse().ok()).unwrap_or(2).max(1);
    let device = arg(args, "--device").unwrap_or_else(|| "cpu".into());
    let only = |name: &str, all: &[&'static str]| -> Result<Vec<usize>, String> {
        match arg(args, name) {
            None => Ok((0..all.len()).collect()),
            Some(v) => match all.iter().position(|s| *s == v) {
                Some(i) => Ok(vec![i]),
                None => Err(format!("unknown {} {v} (one of: {})", &name[2..], all.join(" "))),
            },
        }
    };
    let (scenarios, endings) = match (only("--scenario", &SCENARIOS), only("--ending", &ENDINGS)) {
        (Ok(s), Ok(e)) => (s, e),
        (Err(e), _) | (_, Err(e)) => {
            eprintln!("exit_torture: {e}");
            return 2;
        }
    };
    // Every run takes the next scenario x ending pair (from a seeded offset), so a few
    // hundred runs cover each pair several times.
    let pairs: Vec<(usize, usize)> = scenarios.iter().flat_map(|&s| endings.iter().map(move |&e| (s, e))).collect();
    let offset = Rng(seed).below(pairs.len() as u64);
    let exe = match std::env::current_exe() {
        Ok(e) => e,
        Err(e) => {
            eprintln!("exit_torture: cannot find own executable: {e}");
            return 2;
        }
    };
    println!(
        "exit_torture: {runs} runs, seed {seed}, device {device}, {jobs} at a time, {} scenario x ending pairs",
        pairs.len()
    );
    let start = Instant::now();
    let failures = Mutex::new(Vec::new());
    let cells = Mutex::new([[Cell::default(); ENDINGS.len()]; SCENARIOS.len()]);
    // Per scenario: total and longest run time (s).
    let times = Mutex::new([(0.0f64, 0.0f64); SCENARIOS.len()]);
    let next = AtomicU64::new(0);
    let slowest = Mutex::new((0.0f64, String::new()));
    std::thread::scope(|sc| {
        for _ in 0..jobs {
            sc.spawn(|| {
                loop {
                    let i = next.fetch_add(1, SeqCst);
                    if i >= runs {
                        return;
                    }
                    let run_seed = Rng(seed ^ i.wrapping_mul(0x9E37)).next();
                    let (s, e) = pairs[((offset + i) % pairs.len() as u64) as usize];
                    let t = Instant::now();
                    let out = run_one(&exe, run_seed, SCENARIOS[s], ENDINGS[e], &device);
                    let took = t.elapsed().as_secs_f64();
                    if let Ok(mut sl) = slowest.lock()
                        && took > sl.0
                    {
                        *sl = (took, format!("run {i} ({} / {}, child seed {run_seed})", SCENARIOS[s], ENDINGS[e]));
                    }
                    if let Ok(mut tm) = times.lock() {
                        tm[s].0 += took;
                        tm[s].1 = tm[s].1.max(took);
                    }
                    if let Ok(mut c) = cells.lock() {
                        c[s][e].runs += 1;
                        c[s][e].failed += u64::from(!out.ok);
                    }
                    if !out.ok
                        && let Ok(mut f) = failures.lock()
                    {
                        f.push(format!("run {i} ({} / {}): {}", SCENARIOS[s], ENDINGS[e], out.detail));
                    }
                }
            });
        }
    });
    let failures = failures.into_inner().unwrap_or_default();
    let cells = cells.into_inner().unwrap_or_default();
    let times = times.into_inner().unwrap_or_default();
    println!(
        "exit_torture: {} runs in {:.1} s, {} failed (seed {seed}, device {device})",
        runs,
        start.elapsed().as_secs_f64(),
        failures.len()
    );
    // The table: runs/failed per scenario x ending.
    let mut header = format!("{:<14}", "runs/failed");
    for e in ENDINGS {
        header.push_str(&format!(" {e:>12}"));
    }
    header.push_str(&format!(" {:>12} {:>7} {:>7}", "total", "mean s", "max s"));
    println!("{header}");
    let mut col = [Cell::default(); ENDINGS.len()];
    for (s, name) in SCENARIOS.iter().enumerate() {
        let mut row = format!("{name:<14}");
        let mut tot = Cell::default();
        for e in 0..ENDINGS.len() {
            let c = cells[s][e];
            row.push_str(&format!(" {:>12}", format!("{}/{}", c.runs, c.failed)));
            tot.runs += c.runs;
            tot.failed += c.failed;
            col[e].runs += c.runs;
            col[e].failed += c.failed;
        }
        let mean = if tot.runs > 0 { times[s].0 / tot.runs as f64 } else { 0.0 };
        row.push_str(&format!(" {:>12} {mean:>7.2} {:>7.2}", format!("{}/{}", tot.runs, tot.failed), times[s].1));
        println!("{row}");
    }
    let mut row = format!("{:<14}", "total");
    for c in col {
        row.push_str(&format!(" {:>12}", format!("{}/{}", c.runs, c.failed)));
    }
    row.push_str(&format!(" {:>12}", format!("{}/{}", runs, failures.len())));
    println!("{row}");
    if let Ok(s) = slowest.lock() {
        println!("exit_torture: slowest run took {:.2} s: {}", s.0, s.1);
    }
    for f in failures.iter().take(10) {
        println!("FAILED {f}");
    }
    if failures.is_empty() { 0 } else { 1 }
}
