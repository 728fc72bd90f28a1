//! Process lifecycle: the one shutdown path, explicit or at exit.
//!
//! Any thread may call [`shutdown`]; there is no main thread. The same path runs from
//! the exit hook that the runtime registers with `atexit` right after a backend (the CPU
//! pool, a CUDA device) first initialises, so it runs before that backend's own teardown.
//!
//! Steps (idempotent; a second call returns at once):
//! 1. *Stop intake*: the state becomes `ShuttingDown`; every new op, eval or stream
//!    returns `Error::ShutDown`, and no Drop calls a backend any more (they leak instead).
//! 2. *Drain with a bound*: wait until nothing is in flight, at most `drain`.
//! 3. *Cancel*: queued batches that did not start fail with `Error::ShutDown`, which wakes
//!    every blocked `eval` and every pending `async_eval` future.
//! 4. *Close the backend gate* ([`crate::runtime::gate`]): no thread may enter a backend
//!    library (CUDA driver, NVRTC, cuBLAS) any more, and shutdown waits, with a bound,
//!    until every thread already inside (a readback, a free, a launch, a compile) is out.
//!    This is what makes the process's teardown of the driver after the exit hook safe.
//! 5. *Stop workers*: the device completion workers and the CPU pool are stopped and
//!    joined, each with a bound; a worker stuck past it is left behind, never waited on
//!    forever.
//! 6. The state becomes `Down`.
//!
//! The state, the gate and the order of the steps are `phase.rs`'s (model-checked with
//! loom); this file supplies what each step does, and the exit hook.

use std::time::{Duration, Instant};

use crate::error::{Error, Result};
use crate::runtime::gate::{Gate, Pass};
use crate::runtime::phase::{Phase, Steps};
use crate::sync::atomic::{AtomicBool, Ordering::SeqCst};

use crate::runtime::{pool, scheduler, stats, stream};

/// The process state and the backend gate: every backend-library call happens while
/// holding a pass of `PHASE.gate()`.
static PHASE: Phase = Phase::new();
static HOOK: AtomicBool = AtomicBool::new(false);

/// A held pass of the backend gate (see [`enter_backend`]); this thread counts as inside a
/// backend library until it is dropped. The CUDA backend's calls need the token it gives
/// (`backend::cuda::driver`), so a call without a pass does not compile. Not `Send`: the
/// thread-local count below is this thread's.
#[must_use]
pub(crate) struct BackendPass {
    /// The gate's pass; `None` for a pass nested in one this thread already holds
    /// ([`backend_pass`]), which the gate does not count again.
    pass: Option<Pass<'static>>,
    _thread: std::marker::PhantomData<*const ()>,
}

thread_local! {
    /// Gate passes this thread holds (nested ones are not counted). A `Cell` of a plain
    /// integer has no destructor, so it can be read in every thread-local destructor too.
    static PASSES_HELD: std::cell::Cell<u32> = const { std::cell::Cell::new(0) };
}

impl Drop for BackendPass {
    fn drop(&mut self) {
        if self.pass.is_some() {
            PASSES_HELD.with(|n| n.set(n.get().saturating_sub(1)));
        }
    }
}

impl BackendPass {
    /// True for a pass of the gate itself, false for one nested in a pass this thread
    /// held when it was taken (which the types cannot tie to that outer pass).
    #[allow(dead_code)] // for backends that call libraries outside a batch; a CPU-only build has none
    pub(crate) fn is_own(&self) -> bool {
        self.pass.is_some()
    }
}

/// A pass into the backend libraries, or `None` once shutdown has closed the gate (the
/// caller then skips the call: returns `Error::ShutDown`, or leaks in a `Drop`). Hold it
/// across the whole call, including any blocking wait inside the driver.
pub(crate) fn enter_backend() -> Option<BackendPass> {
    let pass = PHASE.gate().enter()?;
    PASSES_HELD.with(|n| n.set(n.get() + 1));
    Some(BackendPass { pass: Some(pass), _thread: std::marker::PhantomData })
}

/// A pass for releasing a backend resource (a `Drop`, a cache trim): `None` once shutdown
/// has begun, when the caller leaks the resource on purpose instead of calling the
/// backend (the process is ending; the driver reclaims it).
#[allow(dead_code)] // for backends that call libraries outside a batch; a CPU-only build has none
pub(crate) fn release_pass() -> Option<BackendPass> {
    if is_shutting_down() { None } else { enter_backend() }
}

/// A pass for a backend call that may be reached outside any held pass (a kernel compiled
/// on a pool thread): a nested pass when this thread already holds one (the gate, which
/// may be closed by now, already waits for this thread), else a new one, or
/// `Err(Error::ShutDown)` once the gate is closed (the caller then makes no call).
#[allow(dead_code)] // for backends that call libraries outside a batch; a CPU-only build has none
pub(crate) fn backend_pass() -> Result<BackendPass> {
    if PASSES_HELD.with(std::cell::Cell::get) > 0 {
        return Ok(BackendPass { pass: None, _thread: std::marker::PhantomData });
    }
    enter_backend().ok_or(Error::ShutDown)
}

/// Called when the driver token is taken from a nested pass (`backend::cuda::driver`),
/// the one case the types do not prove: counts it in `stats().backend_calls_after_shutdown`
/// when the calling thread holds no gate pass any more and the gate is closed, that is, a
/// call shutdown did not wait for and the driver's teardown may run under (the outer pass
/// was dropped before the nested one). A token from a pass of the gate needs no check.
/// The count stays 0 unless rill has a bug.
#[allow(dead_code)] // for backends that call libraries outside a batch; a CPU-only build has none
pub(crate) fn note_backend_call() {
    if unpassed_call(PHASE.gate(), PASSES_HELD.with(std::cell::Cell::get)) {
        stats::BACKEND_CALLS_AFTER_SHUTDOWN.fetch_add(1, SeqCst);
    }
}

/// A backend call made with `held` passes while `gate` is closed, without one.
fn unpassed_call(gate: &Gate, held: u32) -> bool {
    held == 0 && gate.is_closed()
}

/// Threads inside a backend library right now.
pub(crate) fn threads_in_backend() -> usize {
    PHASE.gate().inside()
}

/// True once the runtime is fully shut down (workers stopped).
pub fn is_down() -> bool {
    PHASE.is_down()
}

/// True once shutdown has begun (explicitly or at exit).
pub fn is_shutting_down() -> bool {
    !PHASE.is_running()
}

/// `Err(Error::ShutDown)` once shutdown has begun.
pub(crate) fn check_running() -> Result<()> {
    if is_shutting_down() { Err(Error::ShutDown) } else { Ok(()) }
}

/// True once the drain is over: queued work is cancelled and the backend gate is closed
/// (or about to be). A node not yet started is refused then, not run.
pub(crate) fn is_cancelled() -> bool {
    PHASE.is_cancelled()
}

/// What a shutdown did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ShutdownReport {
    /// False when this call found shutdown already begun (and did nothing).
    pub performed: bool,
    /// Nodes still in flight when the drain bound expired (0 when everything finished).
    pub abandoned: usize,
    /// True when every runtime thread exited within its bound and no thread was left
    /// inside a backend library when the gate's bound expired.
    pub threads_joined: bool,
    /// Threads still inside a backend library (a kernel compile, a driver call) when the
    /// bound expired: 0 unless the machine is badly overloaded or the GPU hangs.
    pub threads_in_backend: usize,
}

/// Shuts the runtime down from any thread, draining in-flight work for at most 10 s.
/// See the module docs for the steps. Afterwards every op returns `Error::ShutDown`.
pub fn shutdown() -> ShutdownReport {
    shutdown_timeout(Duration::from_secs(10))
}

/// [`shutdown`] with an explicit bound for draining in-flight work.
pub fn shutdown_timeout(drain: Duration) -> ShutdownReport {
    let mut steps = RuntimeSteps {
        drain,
        t0: Instant::now(),
        t_drain: Duration::ZERO,
        t_gate: Duration::ZERO,
        t_workers: Duration::ZERO,
    };
    let Some(done) = PHASE.shutdown(&mut steps) else {
        return ShutdownReport { performed: false, abandoned: 0, threads_joined: true, threads_in_backend: 0 };
    };
    let joined = done.gate_clear && done.workers_joined;
    if std::env::var_os("RILL_DEBUG_SHUTDOWN").is_some() {
        let RuntimeSteps { t0, t_drain, t_gate, t_workers, .. } = steps;
        eprintln!(
            "rill shutdown: drained at {t_drain:?} (abandoned {}), gate clear at {t_gate:?} ({}), \
             workers stopped at {t_workers:?}, pool stopped at {:?} (joined {joined}), in flight {}",
            done.abandoned,
            done.gate_clear,
            t0.elapsed(),
            stats::IN_FLIGHT.load(SeqCst)
        );
    }
    ShutdownReport {
        performed: true,
        abandoned: done.abandoned,
        threads_joined: joined,
        threads_in_backend: PHASE.gate().inside(),
    }
}

/// What each step of the shutdown sequence does in the runtime, and when it ended (for
/// `RILL_DEBUG_SHUTDOWN`).
struct RuntimeSteps {
    drain: Duration,
    t0: Instant,
    t_drain: Duration,
    t_gate: Duration,
    t_workers: Duration,
}

impl Steps for RuntimeSteps {
    fn drain(&mut self) -> usize {
        let abandoned = scheduler::drain_until(self.t0 + self.drain);
        self.t_drain = self.t0.elapsed();
        abandoned
    }

    fn cancel_queued(&mut self) {
        scheduler::cancel_queued(&stream::live_streams());
    }

    /// The drain bound again (at least 1 s): a thread stuck in the driver longer than that
    /// is left behind, and reported as not joined.
    fn gate_bound(&self) -> Duration {
        self.drain.max(Duration::from_secs(1))
    }

    fn stop_workers(&mut self) -> bool {
        self.t_gate = self.t0.elapsed();
        drop(stream::forget_defaults());
        let mut joined = true;
        joined &= crate::backend::stop_workers(Duration::from_secs(2));
        self.t_workers = self.t0.elapsed();
        joined &= pool::stop(Duration::from_secs(2));
        crate::backend::cpu::clear_cache();
        joined
    }
}

/// The exit hook's work: the shutdown, once (a later call finds it done). Returns true
/// when a thread is still inside a backend library after the bounds, which the C
/// runtime's teardown of that library would crash.
fn exit_shutdown() -> bool {
    let ms = std::env::var("RILL_EXIT_DRAIN_MS").ok().and_then(|v| v.parse().ok()).unwrap_or(2000u64);
    // Never unwind across the C boundary.
    let _ = std::panic::catch_unwind(|| shutdown_timeout(Duration::from_millis(ms)));
    threads_in_backend() > 0
}

/// Run by `exit` before each teardown entry a backend library registered after rill
/// redirected its registrations (`teardown.rs`), whatever the order of the entries: the
/// exit shutdown, if no earlier entry or hook ran it, then whether the library may be
/// torn down (false while a thread is still inside a backend library; the entry is then
/// skipped and rill's own hook ends the process with `_exit`). Before any backend
/// initialised there is nothing to shut down.
pub(crate) fn before_library_teardown() -> bool {
    if !HOOK.load(SeqCst) {
        return true;
    }
    !exit_shutdown()
}

/// On glibc the hook learns the exit status. If a thread is still inside a backend
/// library when the bounds expire (an NVRTC compile on a starved machine, a driver call
/// waiting for a hung GPU), letting `exit` go on would tear that library down under it
/// and crash the process. Instead rill flushes C stdio and ends the process at once with
/// the same status (`_exit`): the exit handlers registered before rill initialised and
/// the libraries' own destructors are skipped, which is what a crash would skip too.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
extern "C" fn at_exit(status: libc::c_int, _arg: *mut libc::c_void) {
    if exit_shutdown() {
        // SAFETY: flushing every C stream and ending the process are always allowed here.
        unsafe {
            libc::fflush(std::ptr::null_mut());
            libc::_exit(status);
        }
    }
}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
extern "C" fn at_exit() {
    let _ = exit_shutdown();
}

#[cfg(all(target_os = "linux", target_env = "gnu"))]
unsafe extern "C" {
    fn on_exit(f: extern "C" fn(libc::c_int, *mut libc::c_void), arg: *mut libc::c_void) -> libc::c_int;
}

fn register_hook() -> libc::c_int {
    // SAFETY: `at_exit` is a plain `extern "C"` function that catches every panic.
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    unsafe {
        on_exit(at_exit, std::ptr::null_mut())
    }
    // SAFETY: as above.
    #[cfg(not(all(target_os = "linux", target_env = "gnu")))]
    unsafe {
        libc::atexit(at_exit)
    }
}

/// Registers the exit hook (again). Called in two places only: when the runtime starts
/// (the CPU pool's start, which every device's initialisation goes through), and, where a
/// library's teardown is not guarded (`teardown.rs`), after each call that may have
/// constructed one of its statics (`libs::after_first_use`).
///
/// `exit` runs the handlers of `atexit`/`on_exit`/`__cxa_atexit` in reverse order of
/// registration, so registering again puts the hook ahead of every teardown registered
/// so far; the hook is idempotent (only its first call shuts down).
pub(crate) fn register_exit_hook() {
    HOOK.store(true, SeqCst);
    let rc = register_hook();
    if rc != 0 {
        tracing::warn!("rill: could not register the exit hook (atexit returned {rc})");
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn only_a_call_without_a_pass_after_the_gate_closed_counts() {
        let g = Gate::new();
        assert!(!unpassed_call(&g, 0), "an open gate: every call is allowed");
        let p = g.enter().unwrap();
        assert!(!g.close_and_wait(Duration::from_millis(1)));
        assert!(!unpassed_call(&g, 1), "a pass taken before the close is waited for");
        drop(p);
        assert!(unpassed_call(&g, 0), "a call without a pass after the close is the bug counted");
    }

    #[test]
    fn a_nested_pass_is_not_counted_again() {
        std::thread::spawn(|| {
            let held = || PASSES_HELD.with(std::cell::Cell::get);
            let outer = backend_pass().unwrap();
            assert!(outer.is_own(), "the first pass of a thread is the gate's");
            let inner = backend_pass().unwrap();
            assert!(!inner.is_own(), "a pass taken inside another is nested");
            assert_eq!(held(), 1);
            drop(inner);
            assert_eq!(held(), 1, "dropping a nested pass leaves the outer one held");
            drop(outer);
            assert_eq!(held(), 0);
        })
        .join()
        .unwrap();
    }

    #[test]
    fn passes_held_follow_the_thread() {
        std::thread::spawn(|| {
            let held = || PASSES_HELD.with(std::cell::Cell::get);
            let a = enter_backend().unwrap();
            let b = enter_backend().unwrap();
            assert_eq!(held(), 2);
            drop(a);
            assert_eq!(held(), 1);
            drop(b);
            assert_eq!(held(), 0);
        })
        .join()
        .unwrap();
    }
}
