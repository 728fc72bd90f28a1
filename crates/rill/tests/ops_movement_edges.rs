//! Movement ops: every kind of bad input, and empty and 0-d arrays; `slice_update`
//! writing into an input nothing else holds (donation), on generated cases, on the CPU
//! and on GPU 0 when there is one.

mod common;
mod decode_ref;

use common::{Rng, array_of, devices, on};
use decode_ref::UpdateCase;
use rill::{Array, DType, SliceArg, concatenate, stack};

/// Donation is counted process-wide: no other test of this binary updates slices.
fn donated() -> u64 {
    rill::runtime::stats().buffers_donated
}

#[test]
fn slice_update_writes_into_an_input_nothing_else_holds() {
    let dtypes = [DType::F32, DType::BF16, DType::F64, DType::I32, DType::U8, DType::I64];
    for d in devices() {
        on(d, || {
            let mut rng = Rng::new(301);
            for n in 0..150 {
                let case = UpdateCase::random(&mut rng, &dtypes);
                let (x, u, s, xv, uv) = case.inputs(&mut rng);
                let (u2, u2v) = array_of(
                    &rng.vec(uv.len(), -9.0, 9.0).iter().map(|v| v.round()).collect::<Vec<_>>(),
                    &case.update_shape(),
                    case.dtype,
                );
                let (want, want2) = (case.reference(&xv, &uv), case.reference(&case.reference(&xv, &uv), &u2v));
                let axis = case.axis as isize;
                let what = format!("{d:?} case {n}: {case:?}");
                rill::eval(&[x.clone(), u.clone(), u2.clone(), s.clone()]).unwrap();

                // Held by the caller: a new buffer, and x keeps its values.
                let before = donated();
                let y = x.slice_update(&u, &s, axis).unwrap();
                assert_eq!(y.to_f64_vec().unwrap(), want, "{what}");
                assert_eq!(x.to_f64_vec().unwrap(), xv, "{what}: x itself is unchanged");
                assert_eq!(donated(), before, "{what}: a held input is not donated");

                // Nothing else holds y (a fresh buffer): the next update writes into it.
                let before = donated();
                let z = y.slice_update(&u2, &s, axis).unwrap();
                drop(y);
                assert_eq!(z.to_f64_vec().unwrap(), want2, "{what}: written in place");
                assert_eq!(donated(), before + 1, "{what}: y was donated");

                // A view of y2 still reads its buffer: y2 is given up but not written into.
                let y2 = x.slice_update(&u, &s, axis).unwrap();
                let view = y2.reshape(&[-1]).unwrap();
                view.eval().unwrap();
                let before = donated();
                let z = y2.slice_update(&u2, &s, axis).unwrap();
                drop(y2);
                assert_eq!(z.to_f64_vec().unwrap(), want2, "{what}: past a view");
                assert_eq!(view.to_f64_vec().unwrap(), want, "{what}: the view keeps its values");
                assert_eq!(donated(), before, "{what}: a buffer a view reads is not written");

                // A transposed view that alone holds its buffer: given up, but its strided
                // layout is not what the kernel writes, so the result goes to a new buffer.
                if case.shape.len() >= 2 {
                    let mut sw = case.shape.clone();
                    sw.swap(0, 1);
                    let t = Array::from_slice(&xv, &case.shape).unwrap().swapaxes(0, 1).unwrap();
                    let base = t.contiguous().unwrap().astype(case.dtype).unwrap();
                    let xt = base.swapaxes(0, 1).unwrap();
                    xt.eval().unwrap();
                    drop((t, base));
                    let z = xt.slice_update(&u, &s, axis).unwrap();
                    drop(xt);
                    assert_eq!(z.to_f64_vec().unwrap(), want, "{what}: a transposed input");
                }
            }

            // Across streams: an input made on another stream, and one another stream has
            // read, give the right values (on a GPU they are not written into: the buffer
            // belongs to, or was read by, another stream; on the CPU they are).
            let other = rill::Stream::new(&d).unwrap();
            let base = Array::from_slice(&[1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0], &[2, 3]).unwrap();
            let u = Array::from_slice(&[7.0f32, 8.0], &[2, 1]).unwrap();
            let s = Array::from_slice(&[1i32], &[]).unwrap();
            rill::eval(&[base.clone(), u.clone(), s.clone()]).unwrap();
            let want = vec![1.0, 7.0, 3.0, 4.0, 8.0, 6.0];
            let per_device = |n: u64| if d.is_gpu() { 0 } else { n };
            let before = donated();
            let y = rill::with_stream(&other, || base.slice_update(&u, &s, 1)).unwrap();
            y.eval().unwrap();
            let z = y.slice_update(&u, &s, 1).unwrap();
            drop(y);
            assert_eq!(z.to_f64_vec().unwrap(), want, "{d:?}: made on another stream");
            let y = base.slice_update(&u, &s, 1).unwrap();
            let read = rill::with_stream(&other, || y.mul(2.0)).unwrap();
            read.eval().unwrap();
            let z = y.slice_update(&Array::from_slice(&[0.0f32, 0.0], &[2, 1]).unwrap(), &s, 1).unwrap();
            drop(y);
            assert_eq!(z.to_f64_vec().unwrap(), vec![1.0, 0.0, 3.0, 4.0, 0.0, 6.0], "{d:?}: read by another stream");
            let doubled: Vec<f64> = want.iter().map(|v| v * 2.0).collect();
            assert_eq!(read.to_f64_vec().unwrap(), doubled, "{d:?}: the other stream's read");
            assert_eq!(donated(), before + per_device(2), "{d:?}: across streams");

            // A cache updated by a compiled step, as a decoder's: each step writes into the
            // cache the previous one returned (the first into the zeros).
            let f = rill::compile(|a: &[Array]| Ok(vec![a[0].slice_update(&a[1], &a[2], 1)?]));
            let (mut cache, mut want) = (Array::zeros(&[2, 9, 3], DType::F32).unwrap(), vec![0.0f64; 54]);
            cache.eval().unwrap();
            let before = donated();
            for p in 0..9 {
                let row: Vec<f64> = (0..6).map(|i| (p * 10 + i) as f64).collect();
                let u = Array::from_slice(&row, &[2, 1, 3]).unwrap().astype(DType::F32).unwrap();
                let pos = Array::from_slice(&[p as i32], &[]).unwrap();
                cache = f.call(&[cache, u, pos]).unwrap().remove(0);
                cache.eval().unwrap();
                for b in 0..2 {
                    for c in 0..3 {
                        want[(b * 9 + p) * 3 + c] = row[b * 3 + c];
                    }
                }
                assert_eq!(cache.to_f64_vec().unwrap(), want, "{d:?} step {p}");
            }
            assert_eq!(donated(), before + 9, "{d:?}: every step wrote in place");
        });
    }
}

#[test]
fn movement_errors_name_their_inputs() {
    let a = Array::zeros(&[2, 3], DType::F32).unwrap();
    let msg = |r: rill::Result<Array>| r.unwrap_err().to_string();
    let m = msg(a.reshape(&[4, 2]));
    assert!(m.contains("[2, 3]") && m.contains("[4, 2]"), "{m}");
    let m = msg(a.reshape(&[-1, -1]));
    assert!(m.contains("[-1, -1]") && m.contains("-1"), "{m}");
    let m = msg(a.reshape(&[-1, 4]));
    assert!(m.contains("[2, 3]") && m.contains("[-1, 4]"), "{m}");
    assert!(msg(a.reshape(&[-2, -3])).contains("[-2, -3]"));
    assert!(msg(Array::zeros(&[0], DType::F32).unwrap().reshape(&[0, -1])).contains("[0, -1]"));
    for p in [&[0usize, 0][..], &[0], &[0, 2], &[1, 0, 2]] {
        let m = msg(a.transpose(p));
        assert!(m.contains(&format!("{p:?}")) && m.contains("[2, 3]"), "{m}");
    }
    assert!(msg(a.swapaxes(0, 2)).contains("axis 2"));
    assert!(msg(a.expand_dims(3)).contains("axis 3"));
    assert!(msg(a.expand_dims(-4)).contains("axis -4"));
    let m = msg(a.squeeze(&[0]));
    assert!(m.contains("axis 0") && m.contains("[2, 3]"), "{m}");
    assert!(msg(a.squeeze(&[5])).contains("axis 5"));
    for to in [&[3usize, 3][..], &[3], &[2, 1]] {
        let m = msg(a.broadcast_to(to));
        assert!(m.contains("[2, 3]") && m.contains(&format!("{to:?}")), "{m}");
    }
    let m = msg(a.slice(&[SliceArg::new(None, None, 0)]));
    assert!(m.contains("step") && m.contains("axis 0"), "{m}");
    assert!(msg(a.slice_axis(1, None, None, 0)).contains("axis 1"));
    assert!(msg(a.slice(&[SliceArg::full(); 3])).contains("[2, 3]"));
    assert!(msg(a.slice_axis(2, None, None, 1)).contains("axis 2"));
    let m = msg(a.index(1, 3));
    assert!(m.contains("index 3") && m.contains("size 3"), "{m}");
    assert!(msg(a.index(0, -3)).contains("index -3"));
    // take
    let fidx = Array::from_slice(&[0.0f32], &[1]).unwrap();
    assert!(msg(a.take(&fidx, 0)).contains("f32"));
    let bidx = Array::from_bools(&[true], &[1]).unwrap();
    assert!(msg(a.take(&bidx, 0)).contains("bool"));
    let idx = Array::from_slice(&[0i32], &[1]).unwrap();
    assert!(msg(a.take(&idx, 2)).contains("axis 2"));
    assert!(msg(Array::scalar(1.0f32).unwrap().take(&idx, 0)).contains("rank 0"));
    // concatenate / stack
    let b = Array::zeros(&[3, 3], DType::F32).unwrap();
    let m = msg(concatenate(&[&a, &b], 1));
    assert!(m.contains("[2, 3]") && m.contains("[3, 3]"), "{m}");
    let c = Array::zeros(&[2, 3, 1], DType::F32).unwrap();
    let m = msg(concatenate(&[&a, &c], 0));
    assert!(m.contains("[2, 3]") && m.contains("[2, 3, 1]"), "{m}");
    assert!(msg(concatenate(&[&a, &a], 2)).contains("axis 2"));
    assert!(msg(concatenate(&[], 0)).contains("at least one"));
    let s = Array::scalar(1.0f32).unwrap();
    assert!(msg(concatenate(&[&s, &s], 0)).contains("rank 0"));
    let m = msg(stack(&[&a, &b], 0));
    assert!(m.contains("[2, 3]") && m.contains("[3, 3]"), "{m}");
    assert!(msg(stack(&[&a, &a], 3)).contains("axis 3"));
    assert!(msg(stack(&[], 0)).contains("at least one"));
    // split
    let err = |r: rill::Result<Vec<Array>>| r.unwrap_err().to_string();
    let m = err(a.split(2, 1));
    assert!(m.contains("2 equal sections") && m.contains("[2, 3]"), "{m}");
    assert!(err(a.split(0, 0)).contains("0 equal sections"));
    assert!(err(a.split(1, 2)).contains("axis 2"));
    assert!(err(a.split_indices(&[1], -3)).contains("axis -3"));
    // pad
    let m = msg(a.pad(&[(1, 1); 3], 0.0));
    assert!(m.contains("3 (before, after) pairs") && m.contains("[2, 3]"), "{m}");
    assert!(msg(a.pad(&[(usize::MAX, 1), (0, 0)], 0.0)).contains("overflows"));
}

#[test]
fn empty_and_scalar_arrays() {
    for dev in devices() {
        on(dev, || {
            let s = Array::scalar(3i64).unwrap();
            assert_eq!(s.reshape(&[1, 1]).unwrap().to_vec::<i64>().unwrap(), vec![3]);
            assert_eq!(s.reshape(&[]).unwrap().shape(), &[] as &[usize]);
            assert_eq!(s.flatten().unwrap().shape(), &[1]);
            assert_eq!(s.reshape(&[-1]).unwrap().shape(), &[1]);
            assert_eq!(s.expand_dims(0).unwrap().shape(), &[1]);
            assert_eq!(s.slice(&[]).unwrap().item::<i64>().unwrap(), 3);
            assert_eq!(s.broadcast_to(&[2, 2]).unwrap().to_vec::<i64>().unwrap(), vec![3; 4]);
            assert_eq!(s.pad(&[], 0).unwrap().item::<i64>().unwrap(), 3);
            let e = Array::zeros(&[0, 4], DType::F16).unwrap();
            assert_eq!(e.t().unwrap().shape(), &[4, 0]);
            assert_eq!(e.reshape(&[2, 0, 2]).unwrap().shape(), &[2, 0, 2]);
            assert!(e.reshape(&[2, 0, -1]).is_err()); // as NumPy: -1 is ambiguous with 0 elements
            assert_eq!(e.slice(&[SliceArg::reversed(), SliceArg::range(1, 3)]).unwrap().shape(), &[0, 2]);
            assert!(e.t().unwrap().reshape(&[-1]).unwrap().to_f64_vec().unwrap().is_empty());
            assert_eq!(e.split(4, 1).unwrap()[3].shape(), &[0, 1]);
            assert_eq!(e.split(3, 0).unwrap()[2].shape(), &[0, 4]);
            let p = e.pad(&[(1, 0), (0, 0)], 2.0).unwrap();
            assert_eq!(p.shape(), &[1, 4]);
            assert_eq!(p.to_f64_vec().unwrap(), vec![2.0; 4]);
            let c = concatenate(&[&e, &e], 0).unwrap();
            assert_eq!(c.shape(), &[0, 4]);
            assert!(c.to_f64_vec().unwrap().is_empty());
        });
    }
}
