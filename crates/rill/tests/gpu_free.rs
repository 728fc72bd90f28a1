//! A GPU buffer freed from another thread after its stream was dropped. In its own test
//! binary, because it checks the process-wide memory counter.

mod common;

use common::gpu;

use rill::{Array, DType, Stream};

#[test]
fn gpu_buffer_freed_on_another_thread_after_its_stream_is_dropped() {
    let Some(g) = gpu() else { return };
    let before = rill::runtime::active_memory();
    let x = {
        let s = Stream::new(&g).unwrap();
        let x = rill::with_stream(&s, || Array::ones(&[1024, 256], DType::F32).unwrap().mul(3.0).unwrap());
        x.eval().unwrap();
        x
    }; // the stream handle is gone; the buffer keeps the CUDA stream alive
    let y = rill::with_stream(&g.default_stream().unwrap(), || x.add(1.0).unwrap());
    std::thread::spawn(move || drop(x)).join().unwrap();
    assert_eq!(y.to_vec::<f32>().unwrap()[..3], [4.0, 4.0, 4.0]);
    drop(y);
    rill::synchronize_all().unwrap();
    assert!(rill::runtime::active_memory() <= before + (1 << 20), "memory not released");
}
