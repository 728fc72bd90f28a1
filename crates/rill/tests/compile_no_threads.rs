//! Calling a compiled function creates no stream and no thread. Its own binary, so that
//! no other test moves the process-wide counters.

use rill::{Array, compile};

#[test]
fn calls_create_no_stream_and_no_thread() {
    let f = compile(|x: &[Array]| Ok(vec![x[0].mul(&x[1])?.add(1.0)?.tanh()?]));
    let a = Array::from_slice(&[1.0f32, 2.0, 3.0], &[3]).unwrap();
    let b = Array::from_slice(&[0.5f32, 0.25, -1.0], &[3]).unwrap();
    // Warm-up: default stream and worker pool exist, the first shape is traced.
    f.call(&[a.clone(), b.clone()]).unwrap()[0].eval().unwrap();
    let before = rill::runtime::stats();
    for n in 1..20usize {
        let x = Array::from_vec(vec![0.5f32; n], &[n]).unwrap();
        let y = Array::from_vec(vec![2.0f32; n], &[n]).unwrap();
        let out = f.call(&[x, y]).unwrap();
        assert_eq!(out[0].to_vec::<f32>().unwrap(), vec![2f32.tanh(); n]);
        f.call(&[a.clone(), b.clone()]).unwrap()[0].eval().unwrap();
    }
    let after = rill::runtime::stats();
    assert_eq!(after.streams_created, before.streams_created);
    assert_eq!(after.threads_started, before.threads_started);
}
