//! Model checks of the job handoff to a device's completion worker
//! (`crates/rill/src/backend/cuda/handoff.rs`, the protocol `device.rs` runs with a batch's
//! event and fence as the job).
//!
//! The harness is the worker loop of `device.rs` with the driver taken out: the worker
//! takes jobs with `next` (its linger polls `poked` once, where the real one polls for
//! 200 µs) and completes each, then calls `exited`; pushers hand jobs over with `push` and
//! wait for them, serving a job themselves when `push` gives it back (as `complete_later`
//! synchronises the event itself); shutdown calls `stop` and `wait_exited`. Each job is a
//! `Completion` (`runtime/completion.rs`) recording who served it.
//!
//! Checked in every interleaving: no job is lost (every job handed over is served, exactly
//! once; a pusher waiting for a job the worker never takes, because it went to sleep with
//! the job queued, is reported by loom as a deadlock), a job accepted before the stop is
//! still served by the worker, `wait_exited` returns, and `poke` is set under the lock
//! whenever a job is queued or the worker is stopped (`Handoff::check_poke`, called by the
//! pushers and the lingering worker), so a lingering worker never misses a job.
//!
//! Shown to fail (seeded by hand, not committed):
//! - deleting `g.sleeping = true;` before the wait in `next`: a pusher that finds the
//!   worker asleep does not signal it, and loom reports a deadlock (the pusher waits for a
//!   job the sleeping worker never takes) in `no_job_is_lost_and_the_worker_never_sleeps_on_one`;
//! - clearing `poke` whenever a job is taken (dropping the `g.jobs.is_empty()` test in
//!   `next`): `check_poke` fails ("a job is queued ... without `poke` set") in both models,
//!   once the worker takes the first of two queued jobs.

use std::sync::Arc;
use std::time::Duration;

use loom::thread;

use crate::backend::cuda::handoff::Handoff;
use crate::runtime::completion::Completion;
use crate::sync::Deadline;

/// Who served a job.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum By {
    Worker,
    /// The pusher itself, after `push` gave the job back (the worker was stopped).
    Pusher,
}

type Job = Arc<Completion<By>>;

/// The worker loop of `device.rs`'s `worker_main`.
fn worker(h: &Handoff<Job>) {
    let linger = |h: &Handoff<Job>| {
        h.check_poke();
        let _ = h.poked();
    };
    while let Some(job) = h.next(linger) {
        assert!(job.complete(By::Worker), "a job was served twice");
    }
    h.exited();
}

/// Hands `n` jobs over, as `complete_later` does, and waits for each; returns who served
/// each one and whether `push` accepted it.
fn pusher(h: &Handoff<Job>, n: usize) -> Vec<(bool, By)> {
    let mut jobs = Vec::new();
    for _ in 0..n {
        let job: Job = Arc::new(Completion::new());
        let accepted = match h.push(job.clone()) {
            Ok(()) => true,
            Err(back) => {
                assert!(back.complete(By::Pusher), "a job given back was served already");
                false
            }
        };
        h.check_poke();
        jobs.push((accepted, job));
    }
    jobs.into_iter().map(|(accepted, job)| (accepted, job.wait())).collect()
}

/// Pushers hand over jobs to a running worker and wait for them; only then is the worker
/// stopped. Every job must be served by the worker: a lost wake-up leaves a pusher
/// waiting forever (a deadlock).
#[test]
fn no_job_is_lost_and_the_worker_never_sleeps_on_one() {
    crate::model_bounded(3, || {
        let h = Arc::new(Handoff::<Job>::new());
        let w = {
            let h = h.clone();
            thread::spawn(move || worker(&h))
        };
        let pushers: Vec<_> = [2, 1]
            .into_iter()
            .map(|n| {
                let h = h.clone();
                thread::spawn(move || pusher(&h, n))
            })
            .collect();
        for p in pushers {
            for (accepted, by) in p.join().unwrap() {
                assert!(accepted, "a running worker refused a job");
                assert_eq!(by, By::Worker);
            }
        }
        h.stop();
        assert!(h.wait_exited(&Deadline::after(Duration::from_secs(1))));
        w.join().unwrap();
    });
}

/// Shutdown stops the worker while a pusher hands over two jobs: each is served exactly
/// once, by the worker when `push` accepted it (jobs queued before the stop are still
/// served), by the pusher otherwise; the worker exits and `wait_exited` sees it.
#[test]
fn stop_racing_pushes_serves_every_job_once() {
    crate::model_bounded(3, || {
        let h = Arc::new(Handoff::<Job>::new());
        let w = {
            let h = h.clone();
            thread::spawn(move || worker(&h))
        };
        let p = {
            let h = h.clone();
            thread::spawn(move || pusher(&h, 2))
        };
        h.stop();
        h.check_poke();
        assert!(h.wait_exited(&Deadline::after(Duration::from_secs(1))), "the stopped worker did not exit");
        let served = p.join().unwrap();
        w.join().unwrap();
        for (accepted, by) in &served {
            assert_eq!(*by, if *accepted { By::Worker } else { By::Pusher });
        }
        // Once one push is refused, every later one is.
        if let Some(i) = served.iter().position(|(accepted, _)| !accepted) {
            assert!(served[i..].iter().all(|(accepted, _)| !accepted), "a push was accepted after a refused one");
        }
        assert!(h.push(Arc::new(Completion::new())).is_err(), "a stopped worker accepted a job");
    });
}
