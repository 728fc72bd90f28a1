//! Bad input to the elementwise family and to array creation/readback returns an error
//! naming the shapes or dtypes involved; nothing panics.

mod common;

use rill::{Array, DType};

fn msg<T: std::fmt::Debug>(r: rill::Result<T>, what: &str) -> String {
    match r {
        Ok(v) => panic!("{what}: expected an error, got {v:?}"),
        Err(e) => e.to_string(),
    }
}

#[test]
fn broadcast_mismatch_names_both_shapes() {
    for dev in common::devices() {
        common::on(dev, || {
            let a = Array::zeros(&[2, 3], DType::F32).unwrap();
            let b = Array::zeros(&[4], DType::F32).unwrap();
            let c = Array::zeros(&[5, 1, 7], DType::I32).unwrap();
            for (name, r) in [
                ("add", a.add(&b)),
                ("sub", a.sub(&b)),
                ("eq", a.eq(&b)),
                ("logical_or", a.logical_or(&b)),
                ("maximum", a.maximum(&b)),
            ] {
                let e = msg(r, name);
                assert!(e.contains("[2, 3]") && e.contains("[4]"), "{name}: {e}");
            }
            let e = msg(c.mul(&a), "mul 3-d");
            assert!(e.contains("[5, 1, 7]") && e.contains("[2, 3]"), "{e}");
            let cond = Array::from_bools(&[true, false, true], &[3]).unwrap();
            let e = msg(rill::where_(&cond, &b, 0.0), "where");
            assert!(e.contains("[3]") && e.contains("[4]"), "where: {e}");
        });
    }
}

#[test]
fn bool_arithmetic_is_an_error() {
    for dev in common::devices() {
        common::on(dev, || {
            let a = Array::from_bools(&[true, false], &[2]).unwrap();
            let b = Array::from_bools(&[true, true], &[2]).unwrap();
            for (name, r) in [("sub", a.sub(&b)), ("div", a.div(&b)), ("pow", a.pow(&b)), ("sub", a.sub(true))] {
                let e = msg(r, name);
                assert!(e.contains(name) && e.contains("bool"), "{name}: {e}");
            }
            // The same ops with a number on either side are fine.
            assert_eq!(a.sub(1).unwrap().dtype(), DType::I32);
            assert_eq!(a.div(b.astype(DType::F16).unwrap()).unwrap().dtype(), DType::F16);
        });
    }
}

#[test]
fn to_vec_with_the_wrong_type_names_both_dtypes() {
    for dev in common::devices() {
        common::on(dev, || {
            let a = Array::zeros(&[3], DType::F32).unwrap();
            let e = msg(a.to_vec::<i32>(), "to_vec");
            assert!(e.contains("f32") && e.contains("i32"), "{e}");
            let h = a.astype(DType::BF16).unwrap();
            let e = msg(h.to_vec::<half::f16>(), "to_vec bf16");
            assert!(e.contains("bf16") && e.contains("f16"), "{e}");
            let u = Array::zeros(&[3], DType::U8).unwrap();
            let e = msg(u.to_vec::<u32>(), "to_vec u8");
            assert!(e.contains("u8") && e.contains("u32"), "{e}");
            let e = msg(a.to_bool_vec(), "to_bool_vec");
            assert!(e.contains("f32"), "{e}");
        });
    }
}

#[test]
fn from_slice_length_names_the_shape() {
    for dev in common::devices() {
        common::on(dev, || {
            let e = msg(Array::from_slice(&[1.0f32; 5], &[2, 3]), "from_slice");
            assert!(e.contains("[2, 3]") && e.contains('5'), "{e}");
            let e = msg(Array::from_slice::<i32>(&[], &[]), "from_slice 0-d");
            assert!(e.contains("[]"), "{e}");
            let e = msg(Array::from_bools(&[true], &[0, 4]), "from_bools");
            assert!(e.contains("[0, 4]"), "{e}");
        });
    }
}

#[test]
fn item_needs_one_element() {
    for dev in common::devices() {
        common::on(dev, || {
            let a = Array::zeros(&[2, 2], DType::F32).unwrap();
            let e = msg(a.item::<f32>(), "item");
            assert!(e.contains("[2, 2]"), "{e}");
            let e = msg(a.item_f64(), "item_f64");
            assert!(e.contains("[2, 2]"), "{e}");
            let z = Array::zeros(&[0], DType::F32).unwrap();
            let e = msg(z.item::<f32>(), "item empty");
            assert!(e.contains("[0]"), "{e}");
            // one element of any rank is fine
            let one = Array::full(&[1, 1], 2.5, DType::F64).unwrap();
            assert_eq!(one.item::<f64>().unwrap(), 2.5);
            let e = msg(one.item::<f32>(), "item wrong dtype");
            assert!(e.contains("f64") && e.contains("f32"), "{e}");
        });
    }
}
