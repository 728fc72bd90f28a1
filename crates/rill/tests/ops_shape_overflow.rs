//! Shape arithmetic never wraps: an op whose output (or a node it records) would have more
//! elements than a `usize` counts, or more than `isize::MAX` bytes, returns `Error::Shape`
//! when it is built, and never panics. Nothing here is evaluated: the inputs are broadcast
//! views of tiny arrays, valid however large they look.

use std::panic::{AssertUnwindSafe, catch_unwind};

use proptest::prelude::*;
use rill::{Array, DType, Error, Result, compile_shapeless, concatenate, stack};

const MAX: u128 = isize::MAX as u128;

/// True when `shape` of elements of `size` bytes spans at most `isize::MAX` bytes, empty
/// axes counted as 1 (the rule, computed independently in u128).
fn fits(shape: &[usize], size: usize) -> bool {
    let mut n = size as u128;
    for &d in shape {
        n *= d.max(1) as u128;
        if n > MAX {
            return false;
        }
    }
    true
}

/// A zero-copy view of `shape` (a broadcast of one zero).
fn view(shape: &[usize], dtype: DType) -> Result<Array> {
    Array::zeros(&vec![1; shape.len()], dtype)?.broadcast_to(shape)
}

/// `f`'s result, with a panic turned into a test failure naming `what`.
fn no_panic<T>(what: &str, f: impl FnOnce() -> Result<T>) -> Result<T> {
    catch_unwind(AssertUnwindSafe(f)).unwrap_or_else(|_| panic!("{what} panicked"))
}

fn assert_too_large<T: std::fmt::Debug>(what: &str, r: Result<T>) {
    match r {
        Err(Error::Shape { msg, .. }) => assert!(msg.contains("isize::MAX") || msg.contains("too"), "{what}: {msg}"),
        other => panic!("{what}: expected a shape error, got {other:?}"),
    }
}

#[test]
fn broadcasting_that_overflows_is_an_error() {
    let (a, b) = (view(&[1 << 40], DType::F32).unwrap(), view(&[1 << 40, 1], DType::F32).unwrap());
    // [2^40] with [2^40, 1] is [2^40, 2^40]: 2^80 elements, which used to wrap to 0.
    assert_too_large("add", a.add(&b));
    assert_too_large("where", rill::where_(&a.gt(0.0).unwrap(), &b, 0.0));
    let e = a.mul(&b).unwrap_err().to_string();
    assert!(e.contains("[1099511627776, 1099511627776]") && e.contains("isize::MAX elements"), "{e}");
    // A count that wraps to a small number ((2^61 + 1) * 8 = 8 mod 2^64) used to panic in
    // the kernels.
    let c = view(&[(1 << 61) + 1, 1], DType::U8).unwrap();
    let d = view(&[8], DType::U8).unwrap();
    assert_too_large("add (wraps to 8)", c.add(&d));
    // Matmul of broadcast views: the batch shapes broadcast to [2^40, 2^40].
    let x = view(&[1 << 40, 2, 2], DType::F32).unwrap();
    let y = view(&[1 << 40, 1, 2, 2], DType::F32).unwrap();
    assert_too_large("matmul batch", x.matmul(&y));
    // Matrices whose product is too large.
    let m = view(&[1 << 31, 1], DType::F32).unwrap();
    assert_too_large("matmul [2^31, 1] @ [1, 2^31]", m.matmul(&m.t().unwrap()));
}

#[test]
fn every_op_checks_the_bytes_it_records() {
    let u8_view = view(&[1 << 62], DType::U8).unwrap(); // 2^62 bytes: fits
    let bool_view = view(&[1 << 62], DType::Bool).unwrap();
    // Conversions to wider dtypes: 2^62 elements of 4 or 8 bytes do not fit.
    assert_too_large("astype", u8_view.astype(DType::F32));
    assert_too_large("exp", u8_view.exp());
    assert_too_large("softmax", u8_view.softmax(0));
    assert_too_large("sum of bool", bool_view.sum(&[], false));
    assert_too_large("mean", u8_view.mean(&[], false));
    assert_too_large("var", u8_view.var(&[], false, 0));
    assert_too_large("logsumexp", u8_view.logsumexp(&[], false));
    assert_too_large("cumsum", bool_view.cumsum(0));
    assert_too_large("layer_norm", u8_view.layer_norm(None, None, 1e-5));
    assert_too_large("argmax", view(&[1 << 61, 2], DType::U8).unwrap().argmax(1, true));
    // A comparison's operands are converted to i64 though its output is bool.
    let u32_view = view(&[1 << 60], DType::U32).unwrap();
    let i32_one = Array::zeros(&[1], DType::I32).unwrap();
    assert_too_large("less (u32 vs i32 computes in i64)", u32_view.lt(&i32_one));
    // Copies and views.
    assert_too_large("concatenate", concatenate(&[&u8_view, &u8_view], 0));
    assert_too_large("stack", stack(&[&u8_view, &u8_view], 0));
    let max_view = view(&[isize::MAX as usize], DType::U8).unwrap();
    assert_too_large("pad", max_view.pad(&[(1, 0)], 0));
    assert_too_large("broadcast_to", Array::zeros(&[1], DType::F64).unwrap().broadcast_to(&[1 << 61]));
    let empty = Array::zeros(&[0], DType::U8).unwrap();
    assert_too_large("reshape of an empty array", empty.reshape(&[0, 1 << 40, 1 << 40]));
    let rows = view(&[1 << 40, 1], DType::F32).unwrap();
    let idx = view(&[1 << 40], DType::I64).unwrap();
    assert_too_large("take", rows.take(&idx, 1));
    assert_too_large("custom", rill::custom("huge", &[], &[1 << 62], DType::F32, |_: &[Vec<f64>]| Ok(Vec::new())));
    // Creation.
    assert_too_large("full", Array::full(&[1 << 61], 1.0, DType::F32));
    assert_too_large("zeros", Array::zeros(&[1 << 62, 2], DType::U8));
    assert_too_large("zeros (wraps to 0)", Array::zeros(&[1 << 32, 1 << 32], DType::U8));
    assert_too_large("eye", Array::eye(1 << 31, None, 0, DType::F32));
    assert_too_large("linspace", Array::linspace(0.0, 1.0, 1 << 61, DType::F64));
    assert_too_large("uniform", rill::random::uniform(rill::random::Key::new(0), &[1 << 61], 0.0, 1.0, DType::F32));
    assert_too_large("from_slice of an empty shape", Array::from_slice::<f32>(&[], &[0, 1 << 40, 1 << 40]));
    assert!(Array::arange(0.0, (1u64 << 60) as f64, 1.0, DType::F64).is_err());
    // Just inside the limit, views and lazy fills are fine (nothing is allocated).
    assert!(Array::full(&[(isize::MAX as usize) / 4], 1.0, DType::F32).is_ok());
    assert!(Array::zeros(&[0, 1 << 40], DType::F64).is_ok(), "an empty array of a large shape");
}

#[test]
fn shapeless_replays_check_the_shapes_they_derive() {
    let f = compile_shapeless(|x: &[Array]| Ok(vec![x[0].add(&x[1])?.exp()?]));
    f.call(&[Array::ones(&[3], DType::F32).unwrap(), Array::ones(&[2, 1], DType::F32).unwrap()]).unwrap();
    let (a, b) = (view(&[1 << 40], DType::F32).unwrap(), view(&[1 << 40, 1], DType::F32).unwrap());
    assert_too_large("replay", f.call(&[a, b]));
}

/// A shape of 1 to 4 axes near powers of two whose product is near 2^56 to 2^68, so that
/// with 4-byte elements it falls on either side of `isize::MAX` bytes.
fn near_limit() -> impl Strategy<Value = Vec<usize>> {
    (proptest::collection::vec((1..20u32, -1i64..=1), 1..5), 56..69u32).prop_map(|(parts, total)| {
        let sum: u32 = parts.iter().map(|p| p.0).sum();
        parts.iter().map(|&(p, d)| ((1i64 << (p * total / sum).min(62)) + d).max(0) as usize).collect()
    })
}

/// Two shapes that broadcast together: each axis is in `a`, in `b` (the other has 1) or in
/// both, and `b` perhaps has fewer axes.
fn shape_pair() -> impl Strategy<Value = (Vec<usize>, Vec<usize>)> {
    (near_limit(), any::<u16>(), 0..2usize).prop_map(|(a, bits, drop)| {
        let mut a = a;
        let mut b: Vec<usize> = a.clone();
        for i in 0..a.len() {
            match bits >> (2 * i) & 3 {
                0 => b[i] = 1,
                1 | 2 => {
                    b[i] = a[i];
                    a[i] = 1;
                }
                _ => {}
            }
        }
        let drop = drop.min(b.len() - 1);
        (a, b[drop..].to_vec())
    })
}

fn broadcast(a: &[usize], b: &[usize]) -> Vec<usize> {
    let n = a.len().max(b.len());
    let at = |s: &[usize], i: usize| if i + s.len() >= n { s[i + s.len() - n] } else { 1 };
    (0..n).map(|i| if at(a, i) == 1 { at(b, i) } else { at(a, i) }).collect()
}

/// Asserts that `r` is an error exactly when `over`, and did not panic.
fn check(what: &str, over: bool, r: Result<Array>) -> std::result::Result<(), TestCaseError> {
    match (over, r) {
        (true, Err(Error::Shape { .. })) | (false, Ok(_)) => Ok(()),
        (over, r) => Err(TestCaseError::fail(format!("{what}: too large = {over}, got {r:?}"))),
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]
    #[test]
    fn shapes_near_the_limit_error_exactly_when_too_large((a, b) in shape_pair(), k in 0..4usize) {
        let out = broadcast(&a, &b);
        let (av, bv) = match (view(&a, DType::F32), view(&b, DType::F32)) {
            (Ok(x), Ok(y)) => (x, y),
            // An operand that is too large itself is an error already (checked below).
            (x, y) => {
                prop_assert_eq!(x.is_ok(), fits(&a, 4));
                prop_assert_eq!(y.is_ok(), fits(&b, 4));
                return Ok(());
            }
        };
        let over = !fits(&out, 4);
        check("add", over, no_panic("add", || av.add(&bv)))?;
        check("where", over, no_panic("where", || rill::where_(&av.gt(0.0)?, &bv, 0.0)))?;
        check("broadcast_to", over, no_panic("broadcast_to", || Array::zeros(&[1], DType::F32)?.broadcast_to(&out)))?;
        check("full", !fits(&out, 8), no_panic("full", || Array::full(&out, 2.0, DType::F64)))?;
        let key = rill::random::Key::new(k as u64);
        check("uniform", over, no_panic("uniform", || rill::random::uniform(key, &out, 0.0, 1.0, DType::F32)))?;
        // Concatenating `a` with itself doubles its first axis.
        let mut twice = a.clone();
        twice[0] *= 2;
        check("concatenate", !fits(&twice, 4), no_panic("concatenate", || concatenate(&[&av, &av], 0)))?;
        let mut padded = a.clone();
        padded[0] += 2;
        let widths: Vec<(usize, usize)> = (0..a.len()).map(|i| if i == 0 { (1, 1) } else { (0, 0) }).collect();
        check("pad", !fits(&padded, 4), no_panic("pad", || av.pad(&widths, 0.0)))?;
        // Wider dtypes from a u8 view of `a`.
        if let Ok(u) = view(&a, DType::U8) {
            check("astype", !fits(&a, 8), no_panic("astype", || u.astype(DType::F64)))?;
            check("mean", !fits(&a, 4), no_panic("mean", || u.mean(&[], false)))?;
        }
        // An empty array reshaped to `out` with one more empty axis.
        let mut empty_shape = out.clone();
        empty_shape.insert(k.min(out.len()), 0);
        let spec: Vec<isize> = empty_shape.iter().map(|&d| d as isize).collect();
        let fits_spec = fits(&empty_shape, 4) && empty_shape.iter().all(|&d| d <= isize::MAX as usize);
        check("reshape", !fits_spec, no_panic("reshape", || Array::zeros(&[0], DType::F32)?.reshape(&spec)))?;
        // Gathering `b`'s elements along the last axis of `a`: shape a[..-1] + b.
        let idx = view(&b, DType::I32);
        if let Ok(idx) = idx {
            let gathered = [&a[..a.len() - 1], &b[..]].concat();
            check("take", !fits(&gathered, 4), no_panic("take", || av.take(&idx, -1)))?;
        }
        // Matmul with the last two axes as matrices: [.., M, K] @ [.., K, N].
        if a.len() >= 2 && b.len() >= 2 {
            let (m, kk) = (a[a.len() - 2], a[a.len() - 1]);
            let n = b[b.len() - 1];
            let rhs = [&b[..b.len() - 2], &[kk, n][..]].concat();
            if let Ok(r) = view(&rhs, DType::F32) {
                let batch = broadcast(&a[..a.len() - 2], &b[..b.len() - 2]);
                let with = |mat: [usize; 2]| [&batch[..], &mat[..]].concat();
                let over = !fits(&with([m, kk]), 4) || !fits(&with([kk, n]), 4) || !fits(&with([m, n]), 4);
                check("matmul", over, no_panic("matmul", || av.matmul(&r)))?;
            }
        }
    }
}
