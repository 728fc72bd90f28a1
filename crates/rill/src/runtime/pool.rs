//! The CPU worker pool: a fixed number of OS threads shared by every stream.
//!
//! Owner: the runtime (this module's `POOL`). Threads: `RILL_CPU_THREADS` or the number of
//! cores, started once with the first job (the first evaluation, or a GPU's
//! initialisation), never more; building ops and making streams start none. Stream
//! batches are jobs on this pool, and large kernels split their work across the same
//! threads (`backend/cpu/par.rs`, the one other module allowed to use rayon), so the
//! thread count never grows with the number of streams, user threads or tasks, and no
//! other pool is ever started.
//!
//! Shutdown (`stop`): 1. take the pool out of `POOL` so no new job is spawned; 2. drop it,
//! which tells idle workers to exit; 3. wait, with a bound, until the live count is zero.
//! A worker stuck in a long kernel past the bound is left to finish on its own.
//!
//! The three items that name rayon's pool types (`POOL`, `ensure_started`, `handle`)
//! allow clippy's `disallowed_types` (`clippy.toml`); the rest of the file is checked
//! like any other, for std's synchronisation types too.

use std::cell::Cell;
use std::time::{Duration, Instant};

use crate::runtime::stats;
use crate::sync::atomic::{AtomicBool, AtomicUsize, Ordering::Relaxed};
use crate::sync::{Arc, Condvar, Mutex};

#[allow(clippy::disallowed_types)] // the pool
static POOL: Mutex<Option<Arc<rayon::ThreadPool>>> = Mutex::new(None);
static STARTED: AtomicBool = AtomicBool::new(false);
static EXITED: Mutex<usize> = Mutex::new(0);
static BOOTED: Mutex<usize> = Mutex::new(0);
static BOOTED_CV: Condvar = Condvar::new();
static EXITED_CV: Condvar = Condvar::new();
static SIZE: AtomicUsize = AtomicUsize::new(0);

thread_local! {
    /// Set on the pool's own threads when they start. Rayon's `current_thread_index` is
    /// set on the threads of every rayon pool, a user's own included, which are not rill's.
    static ON_POOL: Cell<bool> = const { Cell::new(false) };
}

/// Number of worker threads the pool has (or will have).
pub fn num_threads() -> usize {
    let n = SIZE.load(Relaxed);
    if n > 0 {
        return n;
    }
    std::env::var("RILL_CPU_THREADS")
        .ok()
        .and_then(|v| v.parse::<usize>().ok())
        .filter(|&n| n > 0)
        .unwrap_or_else(|| std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1))
        .min(256)
}

/// Starts the pool if it is not running (once per process; never after shutdown).
#[allow(clippy::disallowed_types)] // builds the pool
pub(crate) fn ensure_started() {
    if STARTED.load(Relaxed) {
        return;
    }
    let mut g = POOL.lock();
    if STARTED.load(Relaxed) || crate::runtime::lifecycle::is_shutting_down() {
        return;
    }
    let n = num_threads();
    let built = rayon::ThreadPoolBuilder::new()
        .num_threads(n)
        .thread_name(|i| format!("rill-cpu-{i}"))
        .start_handler(|_| {
            ON_POOL.set(true);
            stats::THREADS_LIVE.fetch_add(1, Relaxed);
            stats::THREADS_STARTED.fetch_add(1, Relaxed);
            *BOOTED.lock() += 1;
            BOOTED_CV.notify_all();
        })
        .exit_handler(|_| {
            stats::THREADS_LIVE.fetch_sub(1, Relaxed);
            *EXITED.lock() += 1;
            EXITED_CV.notify_all();
        })
        .build();
    match built {
        Ok(p) => {
            SIZE.store(n, Relaxed);
            *g = Some(Arc::new(p));
            STARTED.store(true, Relaxed);
            drop(g);
            // Wait (bounded) until every worker runs, so the thread count is exact from
            // here on and never changes while the pool lives.
            let deadline = Instant::now() + Duration::from_secs(5);
            let mut b = BOOTED.lock();
            while *b < n && Instant::now() < deadline {
                b = BOOTED_CV.wait_timeout(b, Duration::from_millis(100)).0;
            }
            drop(b);
            crate::runtime::lifecycle::register_exit_hook();
        }
        Err(e) => tracing::error!("rill: could not start the CPU worker pool: {e}"),
    }
}

/// Runs `job` on the pool (started by the first job). Returns false (and drops the job)
/// when the pool is stopped.
pub(crate) fn spawn(job: impl FnOnce() + Send + 'static) -> bool {
    ensure_started();
    let g = POOL.lock();
    match g.as_ref() {
        Some(p) => {
            p.spawn(job);
            true
        }
        None => false,
    }
}

/// Runs `f` inside the pool, so that its parallel loops (`backend/cpu/par.rs`) split
/// across the pool's threads. Runs `f` on the calling thread when the pool is stopped.
#[allow(dead_code)]
pub(crate) fn install<R: Send>(f: impl FnOnce() -> R + Send) -> R {
    if on_pool_thread() {
        return f();
    }
    match handle() {
        Some(p) => p.install(f),
        None => f(),
    }
}

/// Runs `f` on one of the pool's threads and returns its result, blocking the calling
/// thread meanwhile (on a pool thread: runs it there). `None` when the pool is stopped
/// (shutdown) or cannot start: `f` is then not run at all.
#[allow(dead_code)] // kernel compiles of the GPU backend; a CPU-only build makes none
pub(crate) fn run_on_pool<R: Send>(f: impl FnOnce() -> R + Send) -> Option<R> {
    if on_pool_thread() {
        return Some(f());
    }
    ensure_started();
    handle().map(|p| p.install(f))
}

/// The pool, cloned out of its lock (never hold the lock while a job runs: jobs that the
/// job starts need it to spawn).
#[allow(clippy::disallowed_types)]
fn handle() -> Option<Arc<rayon::ThreadPool>> {
    POOL.lock().clone()
}

/// True on one of the pool's threads.
pub(crate) fn on_pool_thread() -> bool {
    ON_POOL.try_with(Cell::get).unwrap_or(false)
}

/// Stops the pool and waits up to `bound` for its threads to exit. Returns true when
/// every thread exited in time.
pub(crate) fn stop(bound: Duration) -> bool {
    let pool = POOL.lock().take();
    let Some(pool) = pool else { return true };
    let n = SIZE.load(Relaxed);
    drop(pool);
    // Called from a pool thread (a user callback calling shutdown): that thread cannot
    // exit before we return.
    let own = usize::from(on_pool_thread());
    let deadline = Instant::now() + bound;
    let mut g = EXITED.lock();
    while *g + own < n {
        let now = Instant::now();
        if now >= deadline {
            return false;
        }
        g = EXITED_CV.wait_timeout(g, deadline - now).0;
    }
    true
}
