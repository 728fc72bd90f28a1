//! Model checks of stream registration and submission racing shutdown (contract:
//! "stream registration and shutdown").
//!
//! The harness drives rill's own code: the stream `Registry` (`registry.rs`), the stream
//! queue state machine (`serial.rs`) and a `Completion` (`completion.rs`) per batch as its
//! outcome. The process state is a loom `AtomicU8` with the states of `phase.rs`.
//! Around them it does what the runtime does:
//! - `Stream::new`: check the state is `RUNNING`, create the stream, register it;
//! - `Plan::advance`: take the stream's queue lock, check the state under it, push the
//!   batch, spawn a job for the stream when `push` asks;
//! - `shutdown_timeout`: `RUNNING → DRAINING`, drain (its bound expires at once, the case
//!   that leaves work queued), store `CANCELLED`, snapshot the registry, cancel the queued
//!   batches of every stream in it under its queue lock (failing them), stop the pool;
//! - the pool: one worker taking stream jobs; a job spawned after the pool stopped is
//!   dropped (as `pool::spawn` does); queued jobs still run before the worker exits.
//!
//! Every model checks, in every interleaving: every batch that was pushed is either run
//! or cancelled (the submitter's wait for it returns; loom reports a deadlock otherwise),
//! the stream's queue ends idle and empty, and a refused submission saw a state other
//! than `RUNNING`.
//!
//! Shown to fail (seeded by hand, not committed): checking the state before taking the
//! queue lock instead of under it lets the submitter see `RUNNING`, then shutdown store
//! `CANCELLED`, snapshot, cancel the (still empty) queue and stop the pool, and then the
//! submitter push its batch: nothing runs or cancels it and loom reports a deadlock (the
//! submitter waits forever). Taking the snapshot before storing `DRAINING` fails the same
//! way: a stream created and registered after the snapshot, by a thread that saw
//! `RUNNING`, accepts a batch that the cancel pass never sees. (A snapshot taken between
//! `DRAINING` and `CANCELLED` passes: a submission is refused as soon as the state is not
//! `RUNNING`, so what matters is that the snapshot follows the end of intake.)

use std::sync::Arc;

use loom::thread;

use crate::jobs::JobQueue;
use crate::runtime::completion::Completion;
use crate::runtime::phase::{CANCELLED, DOWN, DRAINING, RUNNING};
use crate::runtime::registry::Registry;
use crate::runtime::serial::{Run, Serial, Take};
use crate::sync::Mutex;
use crate::sync::atomic::{AtomicU8, Ordering::SeqCst};

/// A batch; its completion is `true` when a worker ran it, `false` when it was cancelled.
struct Batch {
    done: Arc<Completion<bool>>,
}

/// A stream, like `StreamInner`.
struct StreamInner {
    queue: Mutex<Serial<Batch>>,
}

/// The process: its state, the stream registry and the pool's job queue.
struct Rt {
    state: AtomicU8,
    registry: Registry<StreamInner>,
    jobs: JobQueue<Arc<StreamInner>>,
}

fn runtime() -> Arc<Rt> {
    Arc::new(Rt { state: AtomicU8::new(RUNNING), registry: Registry::new(), jobs: JobQueue::new() })
}

/// `Stream::new`.
fn new_stream(rt: &Rt) -> Option<Arc<StreamInner>> {
    if rt.state.load(SeqCst) != RUNNING {
        return None;
    }
    let s = Arc::new(StreamInner { queue: Mutex::new(Serial::new()) });
    rt.registry.register(&s);
    Some(s)
}

/// `pool::spawn` of the stream's job: dropped once the pool is stopped.
fn spawn_stream(rt: &Rt, s: &Arc<StreamInner>) {
    rt.jobs.push_unless_stopped(s.clone());
}

/// The submission of one batch in `Plan::advance`: the state is checked under the
/// stream's queue lock. `None` when refused.
fn submit(rt: &Rt, s: &Arc<StreamInner>) -> Option<Arc<Completion<bool>>> {
    let mut q = s.queue.lock();
    let state = rt.state.load(SeqCst);
    if state != RUNNING {
        assert!(state >= DRAINING);
        return None;
    }
    let done = Arc::new(Completion::new());
    let spawn = q.push(Batch { done: done.clone() });
    drop(q);
    if spawn {
        spawn_stream(rt, s);
    }
    Some(done)
}

/// A stream's pool job, as `run_stream` does it (batches here have no dependencies).
fn run_stream(rt: &Rt, s: &Arc<StreamInner>) {
    let taken = s.queue.lock().take(|_| None::<()>);
    match taken {
        Take::Idle => {}
        Take::Park(()) => unreachable!("batches without dependencies never park"),
        Take::Run(batch) => {
            assert!(batch.done.complete(true), "a batch completed twice");
            if s.queue.lock().finish() {
                spawn_stream(rt, s);
            }
        }
    }
}

/// `shutdown_timeout` with a drain bound that expires at once.
fn shutdown(rt: &Rt) {
    if rt.state.compare_exchange(RUNNING, DRAINING, SeqCst, SeqCst).is_err() {
        return;
    }
    rt.state.store(CANCELLED, SeqCst);
    for s in rt.registry.snapshot() {
        let batches = s.queue.lock().cancel();
        for b in batches {
            assert!(b.done.complete(false), "a batch completed twice");
        }
    }
    rt.jobs.stop();
    rt.state.store(DOWN, SeqCst);
}

/// Creates a stream and submits `batches` batches to it, then waits for each accepted
/// one. Returns the stream (if created) and the outcome of each accepted batch.
fn submitter(rt: Arc<Rt>, batches: usize) -> (Option<Arc<StreamInner>>, Vec<bool>) {
    let Some(s) = new_stream(&rt) else { return (None, Vec::new()) };
    let mut accepted = Vec::new();
    for _ in 0..batches {
        match submit(&rt, &s) {
            Some(done) => accepted.push(done),
            None => break,
        }
    }
    let outcomes = accepted.iter().map(|d| d.wait()).collect();
    (Some(s), outcomes)
}

/// One submitter thread, shutdown on the main thread, one pool worker.
fn race(batches: usize) {
    let rt = runtime();
    let pool = {
        let rt = rt.clone();
        thread::spawn(move || rt.jobs.work(|s| run_stream(&rt, &s)))
    };
    let sub = {
        let rt = rt.clone();
        thread::spawn(move || submitter(rt, batches))
    };
    shutdown(&rt);
    let (stream, outcomes) = sub.join().unwrap();
    pool.join().unwrap();
    assert_eq!(rt.state.load(SeqCst), DOWN);
    // Batches of one stream run in order: once one is cancelled, no later one ran.
    if let Some(i) = outcomes.iter().position(|ran| !ran) {
        assert!(outcomes[i..].iter().all(|ran| !ran), "a batch ran after an earlier one was cancelled");
    }
    if let Some(s) = stream {
        let q = s.queue.lock();
        assert!(q.batches.is_empty(), "a batch was left queued");
        assert_eq!(q.run, Run::Idle);
    }
}

/// (a) A thread creates a stream and submits one batch while another runs shutdown.
#[test]
fn register_and_submit_race_shutdown() {
    crate::model_bounded(3, || race(1));
}

/// (b) As (a) with two batches on the new stream, so shutdown may also find one batch
/// running and the next queued, or accept the first and refuse the second.
#[test]
fn two_batches_race_shutdown() {
    crate::model_bounded(3, || race(2));
}
