//! Cache entries are freed when the last clone of a compiled function is dropped, on
//! any thread. Its own binary: `live_entries` is process-wide.

use rill::{Array, compile};

#[test]
fn dropping_the_last_clone_frees_entries() {
    let base = rill::compile::live_entries();
    let f = compile(|x: &[Array]| Ok(vec![x[0].exp()?.mul(2.0)?]));
    for n in [1usize, 2, 3] {
        let a = Array::from_vec(vec![0.0f32; n], &[n]).unwrap();
        assert_eq!(f.call(&[a]).unwrap()[0].to_vec::<f32>().unwrap(), vec![2.0; n]);
    }
    assert_eq!(rill::compile::live_entries(), base + 3);
    let g = f.clone();
    drop(f);
    assert_eq!(rill::compile::live_entries(), base + 3, "a clone keeps the cache");
    // The outputs of a call do not keep the entry alive.
    let out = g.call(&[Array::from_vec(vec![1.0f32; 4], &[4]).unwrap()]).unwrap();
    assert_eq!(rill::compile::live_entries(), base + 4);
    std::thread::spawn(move || drop(g)).join().unwrap();
    assert_eq!(rill::compile::live_entries(), base);
    assert_eq!(out[0].to_vec::<f32>().unwrap(), vec![2.0 * 1f32.exp(); 4]);
}

#[test]
fn failed_traces_leave_no_entry() {
    // Run after the other test's counts in the same binary cannot interfere: both
    // restore the count they started from, and this one only checks it is unchanged.
    let f = compile(|_: &[Array]| Err(rill::Error::InvalidArgument { op: "t", msg: "no".into() }));
    let a = Array::from_slice(&[1.0f32], &[1]).unwrap();
    for _ in 0..3 {
        assert!(f.call(std::slice::from_ref(&a)).is_err());
    }
    assert_eq!(f.cache_len(), 0);
    assert_eq!(f.trace_count(), 3);
}
