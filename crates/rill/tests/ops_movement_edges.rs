//! Movement ops: every kind of bad input, and empty and 0-d arrays.

mod common;

use common::{devices, on};
use rill::{Array, DType, SliceArg, concatenate, stack};

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
