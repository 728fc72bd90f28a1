//! `eval` and `async_eval`: turning a graph into batches on streams, and running them.
//!
//! Submission (any user thread or task):
//! 1. `Plan::build` walks the graph iteratively from the outputs and lists, in
//!    topological order, the nodes still `Pending` (`claim::pending_order`); fusion at
//!    eval then joins elementwise chains nobody else holds into fused nodes (`fusion.rs`).
//! 2. `Plan::advance` cuts that list into batches (consecutive nodes on one stream). For
//!    each batch it waits for room in the stream's queue (backpressure) and, when memory
//!    is over the limit, for in-flight work to finish; then, under the stream's queue
//!    lock, it claims each node (`Pending → Scheduled`; nodes claimed by another thread
//!    are skipped and become dependencies; `claim::claim`) and pushes the batch.
//!    Blocking callers wait on condition variables; `async_eval` futures register wakers
//!    instead and never block.
//!
//! Execution (the CPU worker pool, `pool.rs`): a stream with queued batches has one job on
//! the pool. The job looks at the head batch: if a dependency on another stream is not
//! done, the stream parks and the dependency's completion reschedules it; otherwise the
//! batch runs node by node, each result (or error, or caught panic) is stored in its node,
//! and the node's waiters (threads and wakers) are woken.
//!
//! Deadlock freedom: a batch's dependencies were all pushed before it (topological order
//! plus claiming at push time), so the earliest unfinished batch is always runnable.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, Waker};
use std::time::Instant;

use crate::array::Array;
use crate::backend;
use crate::error::{Error, Result};
use crate::runtime::claim;
use crate::runtime::serial::Take;
use crate::runtime::stream::{Batch, MAX_BATCH_NODES, MAX_GPU_BATCH_NODES, MAX_QUEUED_NODES, Stream};
use crate::runtime::{lifecycle, memory, pool, stats};
use crate::sync::atomic::{AtomicBool, AtomicUsize, Ordering::SeqCst};
use crate::sync::{Arc, Condvar, Mutex};

// ---- completion notifications (memory-limit waits and the shutdown drain) ----

static COMPLETION_WAITERS: AtomicUsize = AtomicUsize::new(0);
static COMPLETION: Mutex<(u64, Vec<Waker>)> = Mutex::new((0, Vec::new()));
static COMPLETION_CV: Condvar = Condvar::new();

fn notify_completion() {
    if COMPLETION_WAITERS.load(SeqCst) > 0 {
        wake_completion_waiters();
    }
}

/// Bumps the completion epoch and wakes every thread and future waiting for it.
fn wake_completion_waiters() {
    let wakers = {
        let mut g = COMPLETION.lock();
        g.0 += 1;
        std::mem::take(&mut g.1)
    };
    COMPLETION_CV.notify_all();
    for w in wakers {
        w.wake();
    }
}

enum Mode<'a> {
    Block,
    Poll(&'a Waker),
}

/// Waits (or registers a waker) until `cond` is false or something completes.
/// Returns `Poll::Pending` only in poll mode.
fn wait_completion(mode: &Mode<'_>, cond: impl Fn() -> bool) -> Poll<()> {
    COMPLETION_WAITERS.fetch_add(1, SeqCst);
    let r = {
        let mut g = COMPLETION.lock();
        let epoch = g.0;
        if !cond() {
            Poll::Ready(())
        } else {
            match mode {
                Mode::Block => {
                    while g.0 == epoch && cond() {
                        g = COMPLETION_CV.wait(g);
                    }
                    Poll::Ready(())
                }
                Mode::Poll(w) => {
                    g.1.push((*w).clone());
                    Poll::Pending
                }
            }
        }
    };
    COMPLETION_WAITERS.fetch_sub(1, SeqCst);
    r
}

// ---- submission ----

/// The nodes one `eval` must submit, in topological order.
pub(crate) struct Plan {
    order: Vec<Array>,
    pos: usize,
    /// Which idle streams a blocking `eval` runs itself (`Runner::Caller`).
    inline: Inline,
    /// The GPU stream whose run this plan's caller owns: pushed to while idle, its job not
    /// spawned; the caller runs its batches after submitting (`Runner::Caller`).
    owned: Option<Stream>,
}

impl Plan {
    pub(crate) fn build(outputs: &[Array]) -> Plan {
        let mut order = claim::pending_order(outputs);
        crate::runtime::fusion::fuse_pending(&mut order);
        Plan { order, pos: 0, inline: Inline::Never, owned: None }
    }

    /// Before the caller blocks (queue room, memory): a run it owns goes to the pool, since
    /// what the caller waits for may need that stream's batches to run.
    fn release_owned(&mut self) {
        if let Some(s) = self.owned.take() {
            spawn_stream(s);
        }
    }

    fn is_done(&self) -> bool {
        self.pos >= self.order.len()
    }

    fn advance(&mut self, mode: Mode<'_>) -> Poll<Result<()>> {
        while self.pos < self.order.len() {
            lifecycle::check_running()?;
            let stream = self.order[self.pos].node.stream.clone();
            let most = if stream.device().is_gpu() { MAX_GPU_BATCH_NODES } else { MAX_BATCH_NODES };
            let mut end = self.pos + 1;
            while end < self.order.len() && end - self.pos < most && self.order[end].node.stream == stream {
                end += 1;
            }
            // Memory limit: let completions free memory before adding more work.
            if memory::over_limit() && stats::IN_FLIGHT.load(SeqCst) > 0 {
                self.release_owned();
                stats::MEMORY_WAITS.fetch_add(1, SeqCst);
                if wait_completion(&mode, || memory::over_limit() && stats::IN_FLIGHT.load(SeqCst) > 0).is_pending() {
                    return Poll::Pending;
                }
            }
            let inner = &stream.inner;
            let mut q = inner.queue.lock();
            // Backpressure: bounded queued work per stream.
            while q.queued_nodes >= MAX_QUEUED_NODES {
                lifecycle::check_running()?;
                stats::QUEUE_WAITS.fetch_add(1, SeqCst);
                match &mode {
                    Mode::Block => {
                        if self.owned.is_some() {
                            drop(q);
                            self.release_owned();
                            q = inner.queue.lock();
                            continue;
                        }
                        q.space_sleepers += 1;
                        q = inner.space.wait(q);
                        q.space_sleepers -= 1;
                    }
                    Mode::Poll(w) => {
                        q.space_wakers.push((*w).clone());
                        return Poll::Pending;
                    }
                }
            }
            lifecycle::check_running()?;
            let claim::Claimed { nodes, deps } = claim::claim(&q, &self.order[self.pos..end]);
            self.pos = end;
            if nodes.is_empty() {
                continue;
            }
            stats::IN_FLIGHT.fetch_add(nodes.len(), SeqCst);
            q.queued_nodes += nodes.len();
            q.last = nodes.last().map(|a| Arc::downgrade(&a.node));
            let spawn = q.serial.push(Batch { nodes, deps });
            if let Some(flag) = &q.linger {
                flag.store(true, SeqCst);
            }
            drop(q);
            // A blocking `eval` that finds the stream idle runs its batches itself once
            // everything is queued (`Runner::Caller`); any other submitter spawns the
            // stream's job on the pool.
            if spawn {
                if self.owned.is_none() && self.inline.allows(&stream) {
                    self.owned = Some(stream);
                } else {
                    spawn_stream(stream);
                }
            }
        }
        // Everything is queued: the batches hold the nodes now. Letting go of them here
        // means the last reference to a node of a long graph is usually its batch's, so
        // its memory is released by the runtime thread that ran it, not by the caller
        // waiting for the outputs (freeing a long graph would otherwise sit on the
        // caller's path before `eval` returns).
        self.order = Vec::new();
        Poll::Ready(Ok(()))
    }
}

/// A plan whose caller still owns a stream's run (a panic between pushing and running
/// it) hands it to the pool, so the stream's queue never waits for a job nobody runs.
impl Drop for Plan {
    fn drop(&mut self) {
        self.release_owned();
    }
}

/// Which streams a blocking `eval` that finds one idle runs on its own thread.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum Inline {
    /// None: every batch runs on the pool (`submit`, `async_eval`).
    Never,
    /// GPU streams (`eval`): the caller only records launches and waits. CPU streams stay
    /// on the pool, whose threads take part in their kernels' parallel work: a user thread
    /// could only hand those parts to the pool and wait, which made wide chains slower.
    Gpu,
    /// Every stream (the scheduler's own tests, which exercise this path without a GPU).
    #[cfg_attr(not(test), allow(dead_code))]
    Any,
}

impl Inline {
    fn allows(self, stream: &Stream) -> bool {
        match self {
            Inline::Never => false,
            Inline::Gpu => stream.device().is_gpu(),
            Inline::Any => true,
        }
    }
}

/// Evaluates `arrays` (and everything they need) and blocks until they are computed.
/// Returns the first error among them. Creates no stream and no thread.
///
/// A GPU stream that is idle when its first batch is pushed has its batches run by the
/// calling thread (kernel launches recorded and sent, inside the backend gate; kernels
/// are compiled on the pool), since it would otherwise only wait for them.
pub fn eval(arrays: &[Array]) -> Result<()> {
    eval_with(arrays, Inline::Gpu)
}

pub(crate) fn eval_with(arrays: &[Array], inline: Inline) -> Result<()> {
    let mut plan = Plan::build(arrays);
    plan.inline = inline;
    if !plan.is_done() {
        let r = plan.advance(Mode::Block);
        if let Some(s) = plan.owned.take() {
            run_stream(s, Runner::Caller(arrays));
        }
        match r {
            Poll::Ready(r) => r?,
            Poll::Pending => unreachable!("blocking submission never returns Pending"),
        }
    }
    let mut first = Ok(());
    for a in arrays {
        if let Err(e) = a.node.wait()
            && first.is_ok()
        {
            first = Err(e);
        }
    }
    first
}

/// Submits `arrays` (and everything they need) for evaluation and returns without
/// waiting for them to be computed. It blocks only while a stream's queue is full or
/// memory is over the limit (see `runtime::set_memory_limit`), which is what keeps a
/// producer from running ahead of the device. In async code use [`async_eval`], which
/// never blocks.
pub fn submit(arrays: &[Array]) -> Result<()> {
    let mut plan = Plan::build(arrays);
    match plan.advance(Mode::Block) {
        Poll::Ready(r) => r,
        Poll::Pending => unreachable!("blocking submission never returns Pending"),
    }
}

/// Starts evaluating `arrays` and returns a future that completes when they are
/// computed. The future is woken by the runtime (never polled in a loop) and never blocks
/// the executor thread: submission that would wait for queue room or memory continues in
/// later polls. Dropping the future does not cancel the work already submitted.
pub fn async_eval(arrays: &[Array]) -> EvalFuture {
    let mut plan = Plan::build(arrays);
    let mut error = None;
    if !plan.is_done() {
        let noop = Waker::noop();
        if let Poll::Ready(Err(e)) = plan.advance(Mode::Poll(noop)) {
            error = Some(e);
        }
    }
    EvalFuture { plan, outputs: arrays.to_vec(), error }
}

/// The future returned by [`async_eval`].
#[must_use = "the arrays are computed either way, but only awaiting reports their errors"]
pub struct EvalFuture {
    plan: Plan,
    outputs: Vec<Array>,
    error: Option<Error>,
}

impl Future for EvalFuture {
    type Output = Result<()>;
    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Result<()>> {
        let this = &mut *self;
        if let Some(e) = this.error.take() {
            return Poll::Ready(Err(e));
        }
        if !this.plan.is_done() {
            match this.plan.advance(Mode::Poll(cx.waker())) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
                Poll::Ready(Ok(())) => {}
            }
        }
        for a in &this.outputs {
            if !a.node.is_done() && a.node.register_waker(cx.waker()) {
                return Poll::Pending;
            }
            if let Some(f) = a.node.fence()
                && !f.is_signalled()
                && f.register_waker(cx.waker())
            {
                return Poll::Pending;
            }
        }
        for a in &this.outputs {
            a.node.outcome()?;
        }
        Poll::Ready(Ok(()))
    }
}

// ---- execution ----

fn spawn_stream(stream: Stream) {
    let s2 = stream.clone();
    if !pool::spawn(move || run_stream(s2, Runner::Pool)) {
        // The pool is stopped (shutdown): fail what is queued instead of running it.
        cancel_queued(std::slice::from_ref(&stream));
    }
}

fn reschedule(stream: Stream) {
    let spawn = stream.inner.queue.lock().serial.unpark();
    if spawn {
        spawn_stream(stream);
    }
}

/// Batches a GPU stream's job runs back to back before it hands the stream to a new pool
/// job (which lets other queued jobs of the pool run first).
const GPU_BATCHES_PER_JOB: usize = 64;

/// The head batch of `stream`'s queue, which its job (the caller) now runs; `None` when
/// the queue is empty (now idle) or the head waits for another stream's node (the queue
/// is parked and that node's completion spawns a job for it).
fn take_batch(stream: &Stream) -> Option<Batch> {
    let mut q = stream.inner.queue.lock();
    match q.serial.take(|head| head.deps.iter().find(|d| !d.node.is_done()).cloned()) {
        Take::Idle => None,
        Take::Park(dep) => {
            drop(q);
            let s = stream.clone();
            dep.node.on_done(Box::new(move || reschedule(s)));
            None
        }
        Take::Run(b) => {
            q.queued_nodes -= b.nodes.len();
            for w in q.space_wakers.drain(..) {
                w.wake();
            }
            let sleepers = q.space_sleepers > 0;
            drop(q);
            if sleepers {
                stream.inner.space.notify_all();
            }
            Some(b)
        }
    }
}

/// Who runs a stream's job.
#[derive(Clone, Copy)]
enum Runner<'a> {
    /// A pool job.
    Pool,
    /// A blocking `eval` that pushed the stream's first batch while the stream was idle
    /// (see `Plan::advance`), on its own thread, which would otherwise only wait: no pool
    /// thread is woken, and the nodes the caller has just recorded are read and released by
    /// the thread whose cache holds them. Holds the caller's outputs: once they are done,
    /// batches other threads queued behind them go to a pool job (the caller does not
    /// serve others' work). Kernels are compiled on the pool even from here
    /// (`cuda/nvrtc.rs`); every backend call is inside the backend gate, as on the pool.
    Caller(&'a [Array]),
}

/// A stream's job: runs the queue's batches in order until it is empty or its head waits
/// for another stream (the stream parks); on the pool it lingers after a GPU batch for the
/// stream's next one.
fn run_stream(mut stream: Stream, runner: Runner<'_>) {
    let on_pool = matches!(runner, Runner::Pool);
    let mut ran = 0usize;
    loop {
        let Some(mut batch) = take_batch(&stream) else { return };
        // Every dependency is done (`take_batch` checked): let go of them, so that an input
        // held only by the batch's nodes can be donated (`execute::donate_first_input`).
        batch.deps.clear();
        if !on_pool {
            stats::INLINE_BATCHES.fetch_add(1, SeqCst);
        }
        let gpu = stream.device().is_gpu();
        // The last node, for its fence should the job linger (read only then).
        let mut last = if gpu && on_pool { batch.nodes.last().cloned() } else { None };
        crate::runtime::execute::run_batch(&stream, &mut batch.nodes);
        drop(batch);
        notify_completion();
        let mut q = stream.inner.queue.lock();
        if gpu && on_pool && q.serial.batches.is_empty() {
            drop(q);
            let fence = last.take().and_then(|a| a.node.fence());
            match linger(stream, fence.as_deref()) {
                Linger::More(s) => {
                    stream = s;
                    continue;
                }
                Linger::Gone => return,
                Linger::Idle(s) => stream = s,
            }
            q = stream.inner.queue.lock();
        }
        let spawn = q.serial.finish();
        drop(q);
        ran += 1;
        let stay = match runner {
            // The next batch is queued: run it here. A new pool job would wake another
            // pool thread, which may take it (on another core, with the nodes' memory in
            // this core's cache), and costs a wake-up per batch.
            Runner::Pool => gpu && ran < GPU_BATCHES_PER_JOB,
            Runner::Caller(outputs) => !outputs.iter().all(|a| a.node.is_done()),
        };
        if spawn && stay {
            continue;
        }
        if spawn {
            spawn_stream(stream);
        }
        return;
    }
}

/// How long a GPU stream's pool job waits for the stream's next batch after running one:
/// while the batch's device work runs (at most `LINGER_BUSY`), then `LINGER_IDLE` more.
/// A thread that waits for its results usually submits its next batch within that time
/// (the GPU finishing, the waiter seeing it, and it recording and submitting more), and the
/// batch then starts without a wake-up of a sleeping pool thread (tens of microseconds).
const LINGER_BUSY: std::time::Duration = std::time::Duration::from_millis(2);
const LINGER_IDLE: std::time::Duration = std::time::Duration::from_micros(100);

/// Pool jobs lingering now; at most a quarter of the pool (at least one) lingers.
static LINGERING: AtomicUsize = AtomicUsize::new(0);

enum Linger {
    /// A batch arrived: run it in this job.
    More(Stream),
    /// Nothing arrived in time (or lingering is not allowed now).
    Idle(Stream),
    /// Every handle of the stream was dropped meanwhile (so nothing can arrive).
    Gone,
}

/// Polls for the stream's next batch (see [`LINGER_BUSY`]). The job's run state stays
/// `Running`, so a submitter does not spawn a job but raises the stream's linger flag.
/// While polling the job holds only a weak reference: dropping the stream's last handle
/// drops the stream as it would without lingering, and the stream's drop raises the flag.
/// The loop reads only the flag, the fence and the shutdown state: not the stream's
/// reference count, which the thread recording the next evaluation's ops changes once per
/// op (a read here between two of those changes moves the count's cache line to this core
/// and back; the gain was within the benchmarks' noise).
fn linger(stream: Stream, fence: Option<&backend::Fence>) -> Linger {
    let most = (pool::num_threads() / 4).max(1);
    if LINGERING.fetch_add(1, SeqCst) >= most {
        LINGERING.fetch_sub(1, SeqCst);
        return Linger::Idle(stream);
    }
    let flag = Arc::new(AtomicBool::new(false));
    {
        let mut q = stream.inner.queue.lock();
        if !q.serial.batches.is_empty() {
            LINGERING.fetch_sub(1, SeqCst);
            return Linger::More(stream.clone());
        }
        q.linger = Some(flag.clone());
    }
    let weak = stream.downgrade();
    drop(stream);
    let start = Instant::now();
    let mut idle_from: Option<Instant> = None;
    let mut polls = 0u32;
    let arrived = loop {
        if flag.load(SeqCst) {
            break true;
        }
        polls = polls.wrapping_add(1);
        if polls.is_multiple_of(16) {
            if lifecycle::is_shutting_down() {
                break false;
            }
            let now = Instant::now();
            let running = fence.is_some_and(|f| !f.is_signalled());
            if running {
                if now - start > LINGER_BUSY {
                    break false;
                }
            } else if now - *idle_from.get_or_insert(now) > LINGER_IDLE {
                break false;
            }
            std::thread::yield_now();
        } else {
            std::hint::spin_loop();
        }
    };
    LINGERING.fetch_sub(1, SeqCst);
    let Some(inner) = weak.upgrade() else { return Linger::Gone };
    // A batch pushed from here on finds no flag; the job sees it (`take` or `finish`).
    inner.queue.lock().linger = None;
    let s = Stream::from_inner(inner);
    if arrived {
        stats::LINGER_HANDOFFS.fetch_add(1, SeqCst);
        Linger::More(s)
    } else {
        Linger::Idle(s)
    }
}

// ---- shutdown support ----

/// Waits until nothing is in flight or `deadline` passes; returns what is left.
pub(crate) fn drain_until(deadline: Instant) -> usize {
    loop {
        let left = stats::IN_FLIGHT.load(SeqCst);
        if left == 0 {
            return 0;
        }
        let now = Instant::now();
        if now >= deadline {
            return left;
        }
        COMPLETION_WAITERS.fetch_add(1, SeqCst);
        {
            let g = COMPLETION.lock();
            if stats::IN_FLIGHT.load(SeqCst) > 0 {
                let _ = COMPLETION_CV.wait_timeout(g, (deadline - now).min(std::time::Duration::from_millis(50)));
            }
        }
        COMPLETION_WAITERS.fetch_sub(1, SeqCst);
    }
}

/// Fails every queued (not started) batch of `streams` with `Error::ShutDown` and wakes
/// every submitter waiting for queue room.
pub(crate) fn cancel_queued(streams: &[Stream]) {
    for s in streams {
        let batches = {
            let mut q = s.inner.queue.lock();
            q.queued_nodes = 0;
            for w in q.space_wakers.drain(..) {
                w.wake();
            }
            q.serial.cancel()
        };
        s.inner.space.notify_all();
        for b in batches {
            for n in &b.nodes {
                stats::IN_FLIGHT.fetch_sub(1, SeqCst);
                n.node.complete(Err(Error::ShutDown));
            }
        }
    }
    wake_completion_waiters();
}

#[cfg(test)]
mod tests {
    //! The inline path of a blocking `eval` (`Runner::Caller`), exercised on CPU streams with
    //! `Inline::Any` so that it runs without a GPU; `tests/gpu_inline.rs` checks the real
    //! policy on a GPU.
    use super::*;
    use crate::{DType, Device, custom, with_stream};
    use std::thread::ThreadId;

    /// A node that records the thread it ran on and passes its input through.
    fn traced(x: &Array, seen: &Arc<Mutex<Vec<ThreadId>>>) -> Array {
        let seen = seen.clone();
        custom("traced", &[x], x.shape(), x.dtype(), move |ins| {
            seen.lock().push(std::thread::current().id());
            Ok(ins[0].clone())
        })
        .unwrap()
    }

    /// `n` steps of `y = y * 0.999 + 0.5` from `start` (a contraction: rounding errors do
    /// not grow with `n`), then a traced node. Every step's value is also returned, so
    /// that the caller holds them: fusion at eval then keeps each step a node of its own.
    fn chain(start: &[f32], n: usize, seen: &Arc<Mutex<Vec<ThreadId>>>) -> (Array, Vec<Array>) {
        let mut y = Array::from_slice(start, &[start.len()]).unwrap();
        let mut steps = Vec::with_capacity(n);
        for _ in 0..n {
            y = y.mul(0.999).unwrap().add(0.5).unwrap();
            steps.push(y.clone());
        }
        (traced(&y, seen), steps)
    }

    fn want(start: &[f32], n: usize) -> Vec<f64> {
        start
            .iter()
            .map(|&v| {
                let mut y = v as f64;
                for _ in 0..n {
                    y = y * 0.999 + 0.5;
                }
                y
            })
            .collect()
    }

    fn check(got: &Array, want: &[f64]) {
        let v = got.to_vec::<f32>().unwrap();
        for (i, (g, w)) in v.iter().zip(want).enumerate() {
            assert!(((*g as f64) - w).abs() <= 1e-4 * w.abs().max(1.0), "element {i}: {g} against {w}");
        }
    }

    #[test]
    fn an_idle_streams_batches_run_on_the_calling_thread_only_when_allowed() {
        let s = Stream::new(&Device::cpu()).unwrap();
        let start = [1.0f32, -2.0, 3.5];
        // More nodes than one batch holds, so the caller runs several batches in a row.
        let n = MAX_BATCH_NODES;
        for (policy, on_caller) in [(Inline::Any, true), (Inline::Gpu, false), (Inline::Never, false)] {
            let seen = Arc::new(Mutex::new(Vec::new()));
            let (y, _steps) = with_stream(&s, || chain(&start, n, &seen));
            let before = stats::INLINE_BATCHES.load(SeqCst);
            eval_with(std::slice::from_ref(&y), policy).unwrap();
            let ran = stats::INLINE_BATCHES.load(SeqCst) - before;
            check(&y, &want(&start, n));
            let seen = seen.lock().clone();
            assert_eq!(seen.len(), 1, "{policy:?}");
            assert_eq!(seen[0] == std::thread::current().id(), on_caller, "{policy:?}: ran on {:?}", seen[0]);
            if on_caller {
                assert!(ran >= 2, "{policy:?}: {ran} batches inline");
            }
        }
    }

    #[test]
    fn a_plan_longer_than_the_queue_hands_its_stream_to_the_pool_before_waiting_for_room() {
        // More queued nodes than a stream may hold: the caller must stop owning the run
        // before it sleeps for room, or it would wait for itself.
        let s = Stream::new(&Device::cpu()).unwrap();
        let start = [0.25f32, 4.0];
        let n = MAX_QUEUED_NODES; // two nodes per step: twice the queue's bound
        let seen = Arc::new(Mutex::new(Vec::new()));
        let (y, _steps) = with_stream(&s, || chain(&start, n, &seen));
        // On another thread, so that a caller waiting for itself fails the test (after a
        // generous bound) instead of hanging it.
        let (tx, rx) = std::sync::mpsc::channel();
        let y2 = y.clone();
        std::thread::spawn(move || {
            let _ = tx.send(eval_with(std::slice::from_ref(&y2), Inline::Any));
        });
        let r = rx.recv_timeout(std::time::Duration::from_secs(120)).expect("the caller waited for its own stream");
        r.unwrap();
        check(&y, &want(&start, n));
        assert_eq!(seen.lock().len(), 1);
    }

    #[test]
    fn a_batch_waiting_for_another_stream_parks_and_finishes_on_the_pool() {
        // The first stream's batch takes a while on the pool (submitted, not inline); the
        // caller owns the second stream, whose head batch needs the first one's result.
        let (s1, s2) = (Stream::new(&Device::cpu()).unwrap(), Stream::new(&Device::cpu()).unwrap());
        let gate = Arc::new((Mutex::new(false), crate::sync::Condvar::new()));
        let g2 = gate.clone();
        let x = with_stream(&s1, || Array::from_slice(&[2.0f32, 3.0], &[2]).unwrap());
        let slow = with_stream(&s1, || {
            custom("slow", &[&x], &[2], DType::F32, move |ins| {
                let mut open = g2.0.lock();
                while !*open {
                    open = g2.1.wait(open);
                }
                Ok(ins[0].iter().map(|v| v * 10.0).collect())
            })
            .unwrap()
        });
        submit(std::slice::from_ref(&slow)).unwrap();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let y = with_stream(&s2, || traced(&slow.add(1.0).unwrap(), &seen));
        let parked = std::thread::scope(|sc| {
            let opener = sc.spawn(|| {
                // Opens the first stream's node once the caller's stream has parked on
                // it (or after a bound, so that a missing park fails the test below
                // instead of hanging it).
                let t = Instant::now();
                let mut parked = false;
                while t.elapsed() < std::time::Duration::from_secs(10) {
                    if s2.inner.queue.lock().serial.run == crate::runtime::serial::Run::Parked {
                        parked = true;
                        break;
                    }
                    std::thread::yield_now();
                }
                *gate.0.lock() = true;
                gate.1.notify_all();
                parked
            });
            eval_with(std::slice::from_ref(&y), Inline::Any).unwrap();
            opener.join().unwrap()
        });
        assert!(parked, "the caller's stream never parked on the other stream's node");
        assert_eq!(y.to_vec::<f32>().unwrap(), vec![21.0, 31.0]);
        assert_eq!(seen.lock().len(), 1);
    }

    #[test]
    fn threads_sharing_a_stream_get_their_own_results_and_none_waits_forever() {
        // One thread owns the run; the others' batches queue behind it. The owner hands
        // what is left to the pool once its own outputs are done.
        let s = Stream::new(&Device::cpu()).unwrap();
        std::thread::scope(|sc| {
            for t in 0..6usize {
                let s = s.clone();
                sc.spawn(move || {
                    for round in 0..20usize {
                        let start = [t as f32, round as f32];
                        let n = 50 + 37 * ((t + round) % 5);
                        let seen = Arc::new(Mutex::new(Vec::new()));
                        let (y, _steps) = with_stream(&s, || chain(&start, n, &seen));
                        eval_with(std::slice::from_ref(&y), Inline::Any).unwrap();
                        check(&y, &want(&start, n));
                        assert_eq!(seen.lock().len(), 1);
                    }
                });
            }
        });
    }
}
