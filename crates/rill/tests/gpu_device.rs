//! GPU device discovery: without a GPU `Device::gpu(0)` is a quick, clean error; with one
//! (or with `RILL_REQUIRE_GPU=1`) it works and streams on it are usable.

use std::time::{Duration, Instant};

use rill::{Array, DType, Device, Stream};

fn gpu() -> Option<Device> {
    match Device::gpu(0) {
        Ok(d) => Some(d),
        Err(e) => {
            assert!(std::env::var("RILL_REQUIRE_GPU").as_deref() != Ok("1"), "RILL_REQUIRE_GPU=1 but no GPU: {e}");
            None
        }
    }
}

#[test]
fn gpu_lookup_is_an_error_or_a_device() {
    let t = Instant::now();
    let r = Device::gpu(0);
    let took = t.elapsed();
    match r {
        Ok(d) => {
            assert!(d.is_gpu());
            assert!(Device::gpu_count() >= 1);
        }
        Err(e) => {
            let msg = e.to_string();
            assert!(msg.contains("gpu:0"), "{msg}");
            assert_eq!(Device::gpu_count(), 0);
            assert!(took < Duration::from_secs(10), "probing took {took:?}");
            // Asking again is an error again, never a panic.
            assert!(Device::gpu(0).is_err());
            assert!(Stream::new(&Device::gpu(0).unwrap_or(Device::cpu())).is_ok());
            eprintln!("skipped: no GPU ({msg})");
        }
    }
    // An ordinal past the count is always an error naming it.
    let e = Device::gpu(1000).unwrap_err().to_string();
    assert!(e.contains("gpu:1000"), "{e}");
}

#[test]
fn gpu_stream_basics() {
    let Some(g) = gpu() else {
        eprintln!("skipped: no GPU");
        return;
    };
    let s = Stream::new(&g).unwrap();
    assert_eq!(s.device(), g);
    let a = rill::with_stream(&s, || Array::from_slice(&[1.0f32, 2.0, 3.0], &[3]).unwrap().mul(2.0).unwrap());
    assert_eq!(a.device(), g);
    assert_eq!(a.to_vec::<f32>().unwrap(), vec![2.0, 4.0, 6.0]);
    s.synchronize().unwrap();
    let z = rill::with_stream(&s, || Array::zeros(&[0, 4], DType::F32).unwrap());
    assert_eq!(z.to_vec::<f32>().unwrap(), Vec::<f32>::new());
}
