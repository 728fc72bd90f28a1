//! `eval` and `async_eval`: turning a graph into batches on streams, and running them.
//!
//! Submission (any user thread or task):
//! 1. `Plan::build` walks the graph iteratively from the outputs and lists, in
//!    topological order, the nodes still `Pending` (`claim::pending_order`).
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
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
use std::task::{Context, Poll, Waker};
use std::time::Instant;

use crate::array::{Array, Node};
use crate::backend;
use crate::error::{Error, Result};
use crate::runtime::claim;
use crate::runtime::serial::Take;
use crate::runtime::stream::{Batch, MAX_BATCH_NODES, MAX_GPU_BATCH_NODES, MAX_QUEUED_NODES, Stream};
use crate::runtime::{lifecycle, memory, pool, stats};
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
}

impl Plan {
    pub(crate) fn build(outputs: &[Array]) -> Plan {
        Plan { order: claim::pending_order(outputs), pos: 0 }
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
            // Batches always run on the runtime's pool, never inline on the caller: a
            // kernel compile (NVRTC) or driver call on a user thread could still be
            // running when that thread or the process exits (measured: running GPU
            // batches inline in `eval` made the GPU exit torture crash inside NVRTC).
            if spawn {
                spawn_stream(stream);
            }
        }
        // Everything is queued: the batches hold the nodes now. Letting go of them here
        // means the last reference to a node of a long graph is usually its batch's, so
        // its memory is released by the runtime thread that ran it, not by the caller
        // waiting for the outputs (profiled on the GPU: releasing a 1000-op chain's 2000
        // nodes was about a tenth of the calling thread's samples in its `eval`).
        self.order = Vec::new();
        Poll::Ready(Ok(()))
    }
}

/// Evaluates `arrays` (and everything they need) and blocks until they are computed.
/// Returns the first error among them. Creates no stream and no thread.
pub fn eval(arrays: &[Array]) -> Result<()> {
    let mut plan = Plan::build(arrays);
    if !plan.is_done() {
        match plan.advance(Mode::Block) {
            Poll::Ready(r) => r?,
            Poll::Pending => unreachable!("blocking submission never returns Pending"),
        }
    }
    let mut first = Ok(());
    for a in arrays {
        if let Err(e) = a.node.wait() {
            if first.is_ok() {
                first = Err(e);
            }
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
            if let Some(f) = a.node.fence() {
                if !f.is_signalled() && f.register_waker(cx.waker()) {
                    return Poll::Pending;
                }
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
    if !pool::spawn(move || run_stream(s2)) {
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

fn run_stream(mut stream: Stream) {
    let mut ran = 0usize;
    loop {
        let batch = {
            let mut q = stream.inner.queue.lock();
            match q.serial.take(|head| head.deps.iter().find(|d| !d.node.is_done()).cloned()) {
                Take::Idle => return,
                Take::Park(dep) => {
                    drop(q);
                    let s = stream.clone();
                    dep.node.on_done(Box::new(move || reschedule(s)));
                    return;
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
                    b
                }
            }
        };
        backend::execute_batch(&stream, &batch.nodes);
        let gpu = stream.device().is_gpu();
        // The last node, for its fence should the job linger (read only then).
        let mut last = if gpu { batch.nodes.last().cloned() } else { None };
        drop(batch);
        notify_completion();
        let mut q = stream.inner.queue.lock();
        if gpu && q.serial.batches.is_empty() {
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
        if spawn && gpu && ran < GPU_BATCHES_PER_JOB {
            // The next batch is queued: run it here. A new pool job would wake another
            // pool thread, which may take it (on another core, with the nodes' memory in
            // this core's cache), and costs a wake-up per batch.
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
/// and back; the gain measured on the H200 was within the spread, docs/PERFORMANCE.md).
fn linger(stream: Stream, fence: Option<&backend::Fence>) -> Linger {
    let most = (pool::num_threads() / 4).max(1);
    if LINGERING.fetch_add(1, SeqCst) >= most {
        LINGERING.fetch_sub(1, SeqCst);
        return Linger::Idle(stream);
    }
    let flag = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
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
        if polls % 16 == 0 {
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

// ---- node execution ----

/// The storages of `node`'s inputs, or the first error. The inputs are read under the
/// node's lock, not cloned: the node is being run (`Scheduled`), so nothing else changes
/// them, and each input's own lock is taken inside (never the other way round). Up to four
/// inline: the hot path of a long chain of small ops allocates nothing here. (The CUDA
/// batch runner borrows its inputs from the batch instead: `cuda/exec.rs`.)
fn input_storages(node: &Node) -> Result<smallvec::SmallVec<[crate::backend::Storage; 4]>> {
    node.state.lock().inputs.iter().map(|i| i.node.storage()).collect()
}

/// Runs one node's kernel and records the outcome. Used by the backends' batch runners.
pub(crate) fn execute_node(
    node: &Node,
    run: impl FnOnce(&Node, &[crate::backend::Storage]) -> Result<crate::backend::Storage>,
) {
    let result = match input_storages(node) {
        Err(e) => Err(e),
        Ok(_) if lifecycle::backend_call_forbidden() => Err(Error::ShutDown),
        Ok(storages) => catch_unwind(AssertUnwindSafe(|| run(node, &storages))).unwrap_or_else(|p| {
            Err(Error::Panic { op: node.prim.name(), msg: crate::error::panic_message(&*p).into() })
        }),
    };
    stats::NODES_COMPUTED.fetch_add(1, SeqCst);
    stats::IN_FLIGHT.fetch_sub(1, SeqCst);
    node.complete(result);
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
