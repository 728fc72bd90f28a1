//! Model checks of the one-shot completion used by every node and device fence
//! (`crates/rill/src/runtime/completion.rs`): no lost wake-up, callbacks run exactly once,
//! the first value wins, blocked waiters always return.

use std::task::{Wake, Waker};

use crate::runtime::completion::Completion;
use loom::sync::Arc;
use loom::sync::atomic::{AtomicUsize, Ordering};
use loom::thread;

struct CountWaker(AtomicUsize);
impl Wake for CountWaker {
    fn wake(self: std::sync::Arc<Self>) {
        self.0.fetch_add(1, Ordering::SeqCst);
    }
}

#[test]
fn waiter_always_sees_the_value() {
    loom::model(|| {
        let c = Arc::new(Completion::<u32>::new());
        let c2 = c.clone();
        let t = thread::spawn(move || c2.wait());
        assert!(c.complete(7));
        assert_eq!(t.join().unwrap(), 7);
        assert!(c.is_done());
    });
}

#[test]
fn waker_registered_concurrently_is_never_lost() {
    loom::model(|| {
        let c = Arc::new(Completion::<u32>::new());
        let w = std::sync::Arc::new(CountWaker(AtomicUsize::new(0)));
        let waker = Waker::from(w.clone());
        let c2 = c.clone();
        let t = thread::spawn(move || {
            c2.complete(1);
        });
        let registered = c.register_waker(&waker);
        t.join().unwrap();
        // Either the value was already there (nothing to wake) or the waker was woken once.
        let wakes = w.0.load(Ordering::SeqCst);
        if registered {
            assert_eq!(wakes, 1, "a registered waker must be woken exactly once");
        } else {
            assert_eq!(wakes, 0);
            assert!(c.is_done());
        }
    });
}

#[test]
fn callbacks_run_exactly_once_and_first_value_wins() {
    loom::model(|| {
        let c = Arc::new(Completion::<u32>::new());
        let ran = Arc::new(AtomicUsize::new(0));
        let (c1, c2) = (c.clone(), c.clone());
        let r1 = ran.clone();
        let t1 = thread::spawn(move || c1.complete(1));
        let t2 = thread::spawn(move || c2.complete(2));
        c.on_done(Box::new(move || {
            r1.fetch_add(1, Ordering::SeqCst);
        }));
        let (a, b) = (t1.join().unwrap(), t2.join().unwrap());
        assert!(a ^ b, "exactly one complete call wins");
        let v = c.get().unwrap();
        assert_eq!(v, if a { 1 } else { 2 });
        assert_eq!(ran.load(Ordering::SeqCst), 1);
    });
}
