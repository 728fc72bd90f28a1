//! Model check of a stream's run-state machine (`crates/rill/src/runtime/serial.rs`) with
//! the real `Completion` as the cross-stream dependency: a submitter queues two batches
//! (the first waits for a dependency), another thread completes the dependency, a pool
//! worker runs the jobs that the state machine asks for. In every interleaving each batch
//! runs exactly once, in order, never two at once, and the queue ends idle: no lost
//! wake-up between parking and the dependency's completion.

use loom::sync::atomic::{AtomicUsize, Ordering};
use loom::sync::{Arc, Mutex};
use loom::thread;

use crate::runtime::completion::Completion;
use crate::runtime::serial::{Run, Serial, Take};

struct Model {
    q: Mutex<Serial<u32>>,
    dep: Completion<()>,
    pending_jobs: AtomicUsize,
    running: AtomicUsize,
    ran: Mutex<Vec<u32>>,
}

fn spawn_job(m: &Model) {
    m.pending_jobs.fetch_add(1, Ordering::SeqCst);
}

fn job(m: &Arc<Model>) {
    let t = m.q.lock().unwrap().take(|b| if *b == 0 && !m.dep.is_done() { Some(()) } else { None });
    match t {
        Take::Idle => {}
        Take::Park(()) => {
            let m2 = m.clone();
            m.dep.on_done(Box::new(move || {
                if m2.q.lock().unwrap().unpark() {
                    spawn_job(&m2);
                }
            }));
        }
        Take::Run(b) => {
            assert_eq!(m.running.fetch_add(1, Ordering::SeqCst), 0, "two batches of one stream ran at once");
            if b == 0 {
                assert!(m.dep.is_done(), "batch 0 ran before its dependency completed");
            }
            m.ran.lock().unwrap().push(b);
            m.running.fetch_sub(1, Ordering::SeqCst);
            if m.q.lock().unwrap().finish() {
                spawn_job(m);
            }
        }
    }
}

#[test]
fn parked_streams_are_always_rescheduled_and_run_in_order() {
    crate::model_bounded(3, || {
        let m = Arc::new(Model {
            q: Mutex::new(Serial::new()),
            dep: Completion::new(),
            pending_jobs: AtomicUsize::new(0),
            running: AtomicUsize::new(0),
            ran: Mutex::new(Vec::new()),
        });
        let ms = m.clone();
        let submitter = thread::spawn(move || {
            for b in 0..2 {
                if ms.q.lock().unwrap().push(b) {
                    spawn_job(&ms);
                }
            }
        });
        let mc = m.clone();
        let completer = thread::spawn(move || {
            mc.dep.complete(());
        });
        let mw = m.clone();
        let worker = thread::spawn(move || {
            loop {
                let n = mw.pending_jobs.load(Ordering::SeqCst);
                if n > 0 {
                    if mw.pending_jobs.compare_exchange(n, n - 1, Ordering::SeqCst, Ordering::SeqCst).is_ok() {
                        job(&mw);
                    }
                } else if mw.ran.lock().unwrap().len() == 2 {
                    return;
                } else {
                    thread::yield_now();
                }
            }
        });
        submitter.join().unwrap();
        completer.join().unwrap();
        worker.join().unwrap();
        assert_eq!(*m.ran.lock().unwrap(), vec![0, 1]);
        let q = m.q.lock().unwrap();
        assert_eq!(q.run, Run::Idle);
        assert!(q.batches.is_empty());
    });
}
