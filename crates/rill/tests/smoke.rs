use rill::{Array, DType};

#[test]
fn add_mul_broadcast() {
    let a = Array::from_slice(&[1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0], &[2, 3]).unwrap();
    let b = Array::from_slice(&[10.0f32, 20.0, 30.0], &[3]).unwrap();
    let c = a.add(&b).unwrap().mul(2.0).unwrap();
    assert_eq!(c.to_vec::<f32>().unwrap(), vec![22.0, 44.0, 66.0, 28.0, 50.0, 72.0]);
    let i = Array::from_slice(&[1i32, 2, 3], &[3]).unwrap();
    let d = i.div(2).unwrap();
    assert_eq!(d.dtype(), DType::F32);
    assert_eq!(d.to_vec::<f32>().unwrap(), vec![0.5, 1.0, 1.5]);
    let e = i.exp().unwrap();
    assert_eq!(e.dtype(), DType::F32);
    let w = rill::where_(&i.gt(1).unwrap(), &i, 0).unwrap();
    assert_eq!(w.to_vec::<i32>().unwrap(), vec![0, 2, 3]);
}

#[test]
fn deep_chain_and_threads() {
    let mut x = Array::from_slice(&[0.0f32; 4], &[4]).unwrap();
    for _ in 0..20000 {
        x = x.add(1.0).unwrap();
    }
    let xs = x.clone();
    let hs: Vec<_> = (0..8)
        .map(|_| {
            let x = xs.clone();
            std::thread::spawn(move || x.to_vec::<f32>().unwrap())
        })
        .collect();
    for h in hs {
        assert_eq!(h.join().unwrap(), vec![20000.0; 4]);
    }
    // a deep unevaluated chain drops without overflowing the stack
    let mut y = Array::from_slice(&[0.0f32; 4], &[4]).unwrap();
    for _ in 0..200000 {
        y = y.add(1.0).unwrap();
    }
    drop(y);
}
