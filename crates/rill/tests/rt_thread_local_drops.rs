//! rill objects held in `thread_local!` slots whose destructors evaluate work when their
//! thread ends (on the CPU and GPU 0). A thread's thread-locals are destroyed in reverse
//! order of first use, so the backend's own per-thread state (the CUDA launch recorder,
//! first used by the thread's first GPU batch) is gone before a slot filled earlier is
//! dropped. Such a destructor must still get the right values (it once got a fabricated
//! `CUDA_ERROR_NOT_PERMITTED` from the launcher), also with many threads ending at once.

use std::cell::RefCell;
use std::sync::mpsc;

use rill::{Array, Compiled, DType, Device};

mod common;

struct EvalOnDrop {
    x: Option<Array>,
    f: Compiled,
    tx: mpsc::Sender<rill::Result<Vec<f32>>>,
}

impl Drop for EvalOnDrop {
    fn drop(&mut self) {
        let Some(x) = self.x.take() else { return };
        let r = (|| {
            // A compiled call and an eager op: fused and plain kernels, launched directly.
            let y = self.f.call(std::slice::from_ref(&x))?;
            let z = y[0].add(&x)?.mul(0.5)?;
            z.to_vec::<f32>()
        })();
        let _ = self.tx.send(r);
    }
}

thread_local! {
    static SLOT: RefCell<Option<EvalOnDrop>> = const { RefCell::new(None) };
}

fn f() -> Compiled {
    rill::compile(|x: &[Array]| Ok(vec![x[0].mul(3.0)?.add(1.0)?.sqrt()?]))
}

/// Fills the slot first, then evaluates on the thread (its backend state is made after the
/// slot, so it is destroyed before it), then ends the thread.
fn thread_body(device: Device, k: usize, f: Compiled, tx: mpsc::Sender<rill::Result<Vec<f32>>>) {
    let s = device.default_stream().expect("default stream");
    let _g = s.enter();
    let n = 1000 + 37 * k;
    let x = Array::full(&[n], k as f64, DType::F32).expect("full");
    SLOT.with(|slot| *slot.borrow_mut() = Some(EvalOnDrop { x: Some(x.clone()), f: f.clone(), tx }));
    let warm = f.call(&[x]).expect("call")[0].add(1.0).expect("add");
    warm.eval().expect("eval on the thread");
}

fn expect(k: usize) -> (usize, f32) {
    let k = k as f64;
    (1000 + 37 * k as usize, (((3.0 * k + 1.0).sqrt() + k) * 0.5) as f32)
}

fn check(device: Device, threads: usize) {
    let f = f();
    let (tx, rx) = mpsc::channel();
    let hs: Vec<_> = (0..threads)
        .map(|k| {
            let (f, tx) = (f.clone(), tx.clone());
            std::thread::spawn(move || thread_body(device, k, f, tx))
        })
        .collect();
    drop(tx);
    for h in hs {
        h.join().expect("thread");
    }
    let mut got: Vec<Vec<f32>> = rx.iter().map(|r| r.unwrap_or_else(|e| panic!("{device}: {e}"))).collect();
    assert_eq!(got.len(), threads, "{device}: every destructor reported");
    got.sort_by_key(Vec::len);
    for (k, v) in got.iter().enumerate() {
        let (n, want) = expect(k);
        assert_eq!(v.len(), n, "{device}: thread {k}");
        for (i, &g) in v.iter().enumerate() {
            assert!((g - want).abs() <= 1e-5 * want.abs().max(1.0), "{device}: thread {k} [{i}] = {g}, want {want}");
        }
    }
}

#[test]
fn a_thread_local_destructor_evaluates_when_its_thread_ends() {
    for d in common::devices() {
        check(d, 1);
    }
}

#[test]
fn many_threads_end_at_once_each_evaluating_in_a_destructor() {
    for d in common::devices() {
        check(d, 16);
    }
}
