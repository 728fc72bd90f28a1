//! GPU runtime behaviour: cross-stream dependencies, buffers freed on other threads after
//! their stream is gone, async_eval, errors isolated per node.

mod common;

use common::gpu;

use rill::{Array, Device, Stream};

#[test]
fn gpu_cross_stream_dependency() {
    let Some(g) = gpu() else { return };
    let (s1, s2) = (Stream::new(&g).unwrap(), Stream::new(&g).unwrap());
    let n = 1 << 20;
    let vals: Vec<f32> = (0..n).map(|i| (i % 97) as f32).collect();
    // A long chain on stream A, consumed on stream B before A is synchronised.
    let a = rill::with_stream(&s1, || {
        let mut x = Array::from_slice(&vals, &[n]).unwrap();
        for _ in 0..50 {
            x = x.add(1.0).unwrap();
        }
        x
    });
    a.eval().unwrap();
    let b = rill::with_stream(&s2, || a.mul(2.0).unwrap());
    assert_eq!(b.stream(), s2);
    let got = b.to_vec::<f32>().unwrap();
    for (i, v) in got.iter().enumerate() {
        assert_eq!(*v, ((i % 97) as f32 + 50.0) * 2.0, "element {i}");
    }
}

#[test]
fn gpu_async_eval() {
    let Some(g) = gpu() else { return };
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let s = Stream::new(&g).unwrap();
    let out = rt.block_on(s.scope(async {
        let x = Array::from_slice(&[1.0f32, 2.0, 3.0], &[3]).unwrap().exp().unwrap();
        rill::async_eval(std::slice::from_ref(&x)).await.unwrap();
        x
    }));
    let v = out.to_vec::<f32>().unwrap();
    for (g, w) in v.iter().zip([1.0f32, 2.0, 3.0]) {
        assert!((g - w.exp()).abs() < 1e-5 * w.exp());
    }
}

#[test]
fn gpu_unsupported_op_poisons_only_its_dependants() {
    let Some(g) = gpu() else { return };
    common_free(g);
}

/// The GPU nodes computed on the host are counted, one per node; a float product is not
/// one of them. (No other test of this binary makes one, so the counts are exact.)
#[test]
fn gpu_host_round_trips_are_counted() {
    let Some(g) = gpu() else { return };
    let trips = || rill::runtime::stats().host_round_trips;
    let s = Stream::new(&g).unwrap();
    rill::with_stream(&s, || {
        let v: Vec<i32> = (0..16).map(|i| i % 5 - 2).collect();
        let a = Array::from_slice(&v, &[4, 4]).unwrap();
        let before = trips();
        let p = a.matmul(&a).unwrap();
        let got = p.to_vec::<i32>().unwrap();
        assert_eq!(trips() - before, 1, "an integer product goes through the host");
        for i in 0..4 {
            for j in 0..4 {
                let want: i32 = (0..4).map(|k| v[i * 4 + k] * v[k * 4 + j]).sum();
                assert_eq!(got[i * 4 + j], want, "element ({i}, {j})");
            }
        }
        let before = trips();
        let c = rill::custom("twice", &[&a], &[4, 4], rill::DType::F32, |x| Ok(x[0].iter().map(|v| 2.0 * v).collect()))
            .unwrap();
        assert_eq!(c.to_vec::<f32>().unwrap(), v.iter().map(|&x| 2.0 * x as f32).collect::<Vec<_>>());
        assert_eq!(trips() - before, 1, "a host callback on a GPU stream goes through the host");
        let before = trips();
        let f = a.astype(rill::DType::F32).unwrap();
        f.matmul(&f).unwrap().eval().unwrap();
        assert_eq!(trips() - before, 0, "a float product runs on the GPU");
    });
}

fn common_free(g: Device) {
    let s = Stream::new(&g).unwrap();
    rill::with_stream(&s, || {
        let x = Array::from_slice(&[1i32, 2, 3], &[3]).unwrap();
        let ok = x.add(1).unwrap();
        // integer exp is converted to float by the op layer, so it works on the GPU too
        let e = x.exp().unwrap();
        assert_eq!(ok.to_vec::<i32>().unwrap(), vec![2, 3, 4]);
        assert!(e.to_vec::<f32>().is_ok());
    });
}

/// Split reductions (a row over many blocks, combined by the row's last block through the
/// stream's row counters) on four streams at once, repeatedly: each stream's counters
/// must be its own and back at zero after every launch, or sums come out wrong.
#[test]
fn split_reductions_on_several_streams_at_once() {
    let Some(g) = gpu() else { return };
    common::on_threads(4, |k| {
        let s = Stream::new(&g).unwrap();
        let mut rng = common::Rng::new(40 + k);
        for round in 0..12 {
            // A full sum of 2^20 values and row sums of 3 long rows, on stream `s`.
            let v = rng.vec(1 << 20, -1.0, 1.0);
            let (x, xv) = common::array_of(&v, &[1 << 20], rill::DType::F32);
            let rows = 3 + round % 2;
            let cols = (1 << 20) / 4;
            let (y, yv) = common::array_of(&v[..rows * cols], &[rows, cols], rill::DType::F32);
            let (total, per_row) = rill::with_stream(&s, || {
                let t = x.sum(&[], false).unwrap();
                let r = y.sum(&[1], false).unwrap();
                rill::eval(&[t.clone(), r.clone()]).unwrap();
                (t.to_f64_vec().unwrap(), r.to_f64_vec().unwrap())
            });
            let what = format!("stream {k} round {round}");
            common::assert_close(&total, &[xv.iter().sum()], 1e-4, &format!("{what}: total"));
            let want: Vec<f64> = yv.chunks(cols).map(|c| c.iter().sum()).collect();
            common::assert_close(&per_row, &want, 1e-4, &format!("{what}: rows"));
        }
    });
}
