//! Streams, scoped overrides, cross-stream dependencies and failure isolation.

#![allow(clippy::disallowed_types)] // a test uses rill as a user does, with std's primitives (clippy.toml)

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use rill::{Array, DType, Device, Error, Stream};

#[test]
fn streams_are_send_sync_and_usable_from_any_thread() {
    fn assert_send_sync<T: Send + Sync>() {}
    assert_send_sync::<Stream>();
    assert_send_sync::<Array>();
    assert_send_sync::<rill::EvalFuture>();
    // Made on one thread, used and evaluated on another.
    let s = Stream::new(&Device::cpu()).unwrap();
    let a = rill::with_stream(&s, || Array::from_slice(&[1.0f32, 2.0], &[2]).unwrap().mul(3.0).unwrap());
    assert_eq!(a.stream(), s);
    let h = std::thread::spawn(move || {
        let b = rill::with_stream(&s, || a.add(1.0).unwrap());
        assert_eq!(b.stream(), s);
        b.to_vec::<f32>().unwrap()
    });
    assert_eq!(h.join().unwrap(), vec![4.0, 7.0]);
}

#[test]
fn sync_scopes_nest_and_restore_exactly() {
    let s1 = Stream::new(&Device::cpu()).unwrap();
    let s2 = Stream::new(&Device::cpu()).unwrap();
    let before = rill::current_stream_override();
    {
        let _g1 = s1.enter();
        assert_eq!(rill::current_stream_override(), Some(s1.clone()));
        {
            let _g2 = s2.enter();
            let x = Array::full(&[2], 1.0, DType::F32).unwrap();
            assert_eq!(x.stream(), s2);
        }
        let y = Array::full(&[2], 1.0, DType::F32).unwrap();
        assert_eq!(y.stream(), s1);
    }
    assert_eq!(rill::current_stream_override(), before);
    // Without an override, ops go to the default stream of their input's device.
    let z = Array::full(&[2], 1.0, DType::F32).unwrap();
    assert_eq!(z.stream(), Device::cpu().default_stream().unwrap());
}

#[test]
fn scoped_override_holds_across_await_on_multithread_runtime() {
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(4).enable_all().build().unwrap();
    let moved = Arc::new(AtomicUsize::new(0));
    rt.block_on(async {
        let mut tasks = Vec::new();
        for t in 0..64u32 {
            let moved = moved.clone();
            tasks.push(tokio::spawn(async move {
                let s = Stream::new(&Device::cpu()).unwrap();
                let s2 = s.clone();
                s.scope(async move {
                    let mut x = Array::from_slice(&[t as f32; 8], &[8]).unwrap();
                    let mut last_thread = std::thread::current().id();
                    for i in 0..25 {
                        x = x.add(1.0).unwrap();
                        assert_eq!(x.stream(), s2, "task {t} step {i}: op landed on {:?}", x.stream());
                        assert_eq!(rill::current_stream_override(), Some(s2.clone()));
                        rill::async_eval(&[x.clone()]).await.unwrap();
                        tokio::task::yield_now().await;
                        let now = std::thread::current().id();
                        if now != last_thread {
                            moved.fetch_add(1, Ordering::Relaxed);
                            last_thread = now;
                        }
                    }
                    assert_eq!(x.to_vec::<f32>().unwrap(), vec![t as f32 + 25.0; 8]);
                })
                .await;
                // The override does not leak out of the scope.
                assert_eq!(rill::current_stream_override(), None);
            }));
        }
        for t in tasks {
            t.await.unwrap();
        }
    });
    // Not an assertion of scheduling (tokio decides), only a report that tasks moved.
    eprintln!("tasks resumed on another thread {} times", moved.load(Ordering::Relaxed));
}

#[test]
fn cross_stream_dependencies_are_ordered() {
    let s1 = Stream::new(&Device::cpu()).unwrap();
    let s2 = Stream::new(&Device::cpu()).unwrap();
    let a = rill::with_stream(&s1, || Array::arange_f32_for_test(1000));
    let b = rill::with_stream(&s2, || a.mul(2.0).unwrap());
    let c = rill::with_stream(&s1, || b.add(&a).unwrap());
    let d = rill::with_stream(&s2, || c.sub(&b).unwrap());
    let got = d.to_vec::<f32>().unwrap();
    let want: Vec<f32> = (0..1000).map(|i| i as f32).collect();
    assert_eq!(got, want);
    rill::synchronize(&s1).unwrap();
    rill::synchronize_all().unwrap();
}

trait TestArange {
    fn arange_f32_for_test(n: usize) -> Array;
}
impl TestArange for Array {
    fn arange_f32_for_test(n: usize) -> Array {
        let v: Vec<f32> = (0..n).map(|i| i as f32).collect();
        Array::from_slice(&v, &[n]).unwrap()
    }
}

#[test]
fn failures_poison_only_their_dependants() {
    let s = Stream::new(&Device::cpu()).unwrap();
    let _g = s.enter();
    let x = Array::from_slice(&[1.0f32, 2.0, 3.0], &[3]).unwrap();
    let bad = rill::custom("explodes", &[&x], &[3], DType::F32, |_| panic!("user callback failed")).unwrap();
    let err = rill::custom("refuses", &[&x], &[3], DType::F32, |_| {
        Err(Error::InvalidArgument { op: "refuses", msg: "no".into() })
    })
    .unwrap();
    let downstream = bad.add(1.0).unwrap();
    let fine = x.mul(2.0).unwrap();
    let e = downstream.eval().unwrap_err();
    assert!(matches!(e, Error::Panic { .. }), "{e}");
    assert!(e.to_string().contains("user callback failed"), "{e}");
    assert!(err.eval().unwrap_err().to_string().contains("refuses"));
    assert_eq!(fine.to_vec::<f32>().unwrap(), vec![2.0, 4.0, 6.0]);
    // The stream keeps working after the failures.
    let again = x.add(&fine).unwrap();
    assert_eq!(again.to_vec::<f32>().unwrap(), vec![3.0, 6.0, 9.0]);
    // An eval of several arrays reports the first error but computes the others.
    let ok2 = x.sub(1.0).unwrap();
    assert!(rill::eval(&[ok2.clone(), downstream.clone()]).is_err());
    assert_eq!(ok2.to_vec::<f32>().unwrap(), vec![0.0, 1.0, 2.0]);
}

#[test]
fn evaluated_nodes_drop_their_inputs() {
    let x = Array::from_slice(&[1.0f32; 16], &[16]).unwrap();
    let y = x.add(1.0).unwrap().mul(2.0).unwrap();
    assert_eq!(y.inputs().len(), 2);
    y.eval().unwrap();
    assert!(y.inputs().is_empty());
    assert!(y.is_evaluated());
}

#[test]
fn async_eval_is_woken_not_polled() {
    // A future polled by a waker that counts wake-ups: after submission, the future must
    // only be polled again when woken, and must complete.
    use std::future::Future;
    use std::pin::pin;
    use std::sync::{Condvar, Mutex};
    use std::task::{Context, Poll, Wake, Waker};
    struct Flag(Mutex<bool>, Condvar, AtomicUsize);
    impl Wake for Flag {
        fn wake(self: Arc<Self>) {
            self.2.fetch_add(1, Ordering::SeqCst);
            *self.0.lock().unwrap() = true;
            self.1.notify_all();
        }
    }
    let flag = Arc::new(Flag(Mutex::new(false), Condvar::new(), AtomicUsize::new(0)));
    let waker = Waker::from(flag.clone());
    let mut x = Array::from_slice(&[0.0f64; 1024], &[1024]).unwrap();
    for _ in 0..200 {
        x = x.add(1.0).unwrap().sqrt().unwrap().mul(3.0).unwrap();
    }
    let mut fut = pin!(rill::async_eval(&[x.clone()]));
    let mut polls = 0;
    loop {
        polls += 1;
        match fut.as_mut().poll(&mut Context::from_waker(&waker)) {
            Poll::Ready(r) => {
                r.unwrap();
                break;
            }
            Poll::Pending => {
                let mut g = flag.0.lock().unwrap();
                while !*g {
                    g = flag.1.wait(g).unwrap();
                }
                *g = false;
            }
        }
    }
    assert!(
        polls <= 1 + flag.2.load(Ordering::SeqCst),
        "polled {polls} times for {} wakes",
        flag.2.load(Ordering::SeqCst)
    );
    assert!(x.is_evaluated());
}
