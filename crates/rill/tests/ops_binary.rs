//! Binary elementwise ops and `where_` against float64 references: every dtype,
//! broadcasting pairs, empty and 0-d operands, the parallel paths, and dtype promotion.

mod common;
mod elem_ref;

use common::Rng;
use elem_ref::*;
use rill::{Array, DType, Result};

#[derive(Clone, Copy, PartialEq, Debug)]
enum Kind {
    /// add, sub, mul: wrap on integers; on bool, add is or and mul is and.
    Arith,
    /// True division: integers give f32.
    Div,
    Pow,
    MinMax,
    /// Comparisons and logical ops: bool output.
    Pred,
}

struct Case {
    name: &'static str,
    op: fn(&Array, &Array) -> Result<Array>,
    f: fn(f64, f64) -> f64,
    i: fn(i128, i128) -> i128,
    kind: Kind,
}

macro_rules! method {
    ($m:ident) => {
        |a: &Array, b: &Array| a.$m(b)
    };
}

/// Integer power with the documented rules: wrapping; with a negative exponent only
/// bases 1 and -1 survive, every other base gives 0.
fn ipow(a: i128, b: i128) -> i128 {
    if b < 0 {
        return match a {
            1 => 1,
            -1 => {
                if b % 2 == 0 {
                    1
                } else {
                    -1
                }
            }
            _ => 0,
        };
    }
    let mut r: i128 = 1;
    for _ in 0..b {
        r = (r * a).rem_euclid(1 << 64);
    }
    r
}

fn cases() -> Vec<Case> {
    vec![
        Case { name: "add", op: method!(add), f: |x, y| x + y, i: |x, y| x + y, kind: Kind::Arith },
        Case { name: "sub", op: method!(sub), f: |x, y| x - y, i: |x, y| x - y, kind: Kind::Arith },
        Case { name: "mul", op: method!(mul), f: |x, y| x * y, i: |x, y| x * y, kind: Kind::Arith },
        Case { name: "div", op: method!(div), f: |x, y| x / y, i: |_, _| 0, kind: Kind::Div },
        Case { name: "pow", op: method!(pow), f: f64::powf, i: ipow, kind: Kind::Pow },
        Case {
            name: "maximum",
            op: method!(maximum),
            f: |x, y| if x.is_nan() || y.is_nan() { f64::NAN } else { x.max(y) },
            i: |x, y| x.max(y),
            kind: Kind::MinMax,
        },
        Case {
            name: "minimum",
            op: method!(minimum),
            f: |x, y| if x.is_nan() || y.is_nan() { f64::NAN } else { x.min(y) },
            i: |x, y| x.min(y),
            kind: Kind::MinMax,
        },
        Case {
            name: "eq",
            op: method!(eq),
            f: |x, y| (x == y) as u8 as f64,
            i: |x, y| (x == y) as i128,
            kind: Kind::Pred,
        },
        Case {
            name: "ne",
            op: method!(ne),
            f: |x, y| (x != y) as u8 as f64,
            i: |x, y| (x != y) as i128,
            kind: Kind::Pred,
        },
        Case {
            name: "lt",
            op: method!(lt),
            f: |x, y| (x < y) as u8 as f64,
            i: |x, y| (x < y) as i128,
            kind: Kind::Pred,
        },
        Case {
            name: "le",
            op: method!(le),
            f: |x, y| (x <= y) as u8 as f64,
            i: |x, y| (x <= y) as i128,
            kind: Kind::Pred,
        },
        Case {
            name: "gt",
            op: method!(gt),
            f: |x, y| (x > y) as u8 as f64,
            i: |x, y| (x > y) as i128,
            kind: Kind::Pred,
        },
        Case {
            name: "ge",
            op: method!(ge),
            f: |x, y| (x >= y) as u8 as f64,
            i: |x, y| (x >= y) as i128,
            kind: Kind::Pred,
        },
        Case {
            name: "logical_and",
            op: method!(logical_and),
            f: |x, y| (x != 0.0 && y != 0.0) as u8 as f64,
            i: |x, y| (x != 0 && y != 0) as i128,
            kind: Kind::Pred,
        },
        Case {
            name: "logical_or",
            op: method!(logical_or),
            f: |x, y| (x != 0.0 || y != 0.0) as u8 as f64,
            i: |x, y| (x != 0 || y != 0) as i128,
            kind: Kind::Pred,
        },
    ]
}

/// The result dtype of op `c` on operands promoted to `p`, or `None` where it is an error.
fn out_dtype(c: &Case, p: DType) -> Option<DType> {
    match c.kind {
        Kind::Pred => Some(DType::Bool),
        _ if p == DType::Bool => match c.name {
            "add" | "mul" | "maximum" | "minimum" => Some(DType::Bool),
            _ => None,
        },
        Kind::Div if !p.is_float() => Some(DType::F32),
        _ => Some(p),
    }
}

/// Random operands for op `c` on dtype `d`: (lhs, rhs).
fn inputs(rng: &mut Rng, c: &Case, d: DType, na: usize, nb: usize) -> (Vec<f64>, Vec<f64>) {
    let f = d.is_float();
    match c.kind {
        // Small integers, so that equal values are common.
        Kind::Pred => (draw(rng, na, -3.0, 3.0, d).into_iter().map(f64::floor).collect(), {
            draw(rng, nb, -3.0, 3.0, d).into_iter().map(f64::floor).collect()
        }),
        Kind::Arith | Kind::MinMax => {
            let (lo, hi) = int_range(d);
            (draw(rng, na, lo, hi, d), draw(rng, nb, lo, hi, d))
        }
        Kind::Div if f => {
            let y = rng.vec(nb, 0.25, 4.0).into_iter().enumerate().map(|(i, v)| if i % 2 == 0 { v } else { -v });
            (draw(rng, na, -4.0, 4.0, d), y.collect())
        }
        Kind::Div => (draw(rng, na, -20.0, 20.0, d), draw(rng, nb, -5.0, 6.0, d)),
        Kind::Pow if f => (draw(rng, na, 0.1, 3.0, d), draw(rng, nb, -2.0, 2.0, d)),
        Kind::Pow => {
            let (lo, hi) = int_range(d);
            let (elo, ehi) = if d.is_signed_int() { (-3.0, 6.0) } else { (0.0, 6.0) };
            let mut x = draw(rng, na, lo, hi, d);
            // Bases 1 and -1 make negative exponents interesting.
            for (k, v) in x.iter_mut().step_by(3).enumerate() {
                *v = if k % 2 == 0 || !d.is_signed_int() { 1.0 } else { -1.0 };
            }
            (x, draw(rng, nb, elo, ehi, d))
        }
    }
}

/// Reference values of op `c` for operands already rounded to `d`, broadcast to `out`.
fn reference(c: &Case, d: DType, od: DType, x: &[f64], xs: &[usize], y: &[f64], ys: &[usize]) -> Vec<f64> {
    let out = bshape(xs, ys);
    (0..numel(&out))
        .map(|k| {
            let (a, b) = (x[bindex(&out, xs, k)], y[bindex(&out, ys, k)]);
            if d.is_float() || c.kind == Kind::Div {
                (c.f)(a, b)
            } else {
                let r = (c.i)(a as i128, b as i128);
                if od == DType::Bool { (r != 0) as i128 as f64 } else { wrap(r, od) as f64 }
            }
        })
        .collect()
}

fn run_case(c: &Case, d: DType, xs: &[usize], ys: &[usize], rng: &mut Rng, dev: rill::Device) {
    let Some(od) = out_dtype(c, d) else { return };
    let (xv, yv) = inputs(rng, c, d, numel(xs), numel(ys));
    common::on(dev, || {
        let (a, x) = common::array_of(&xv, xs, d);
        let (b, y) = common::array_of(&yv, ys, d);
        let what = format!("{} {d} {xs:?} {ys:?} on {dev:?}", c.name);
        let got = (c.op)(&a, &b).unwrap_or_else(|e| panic!("{what}: {e}"));
        let want = reference(c, d, od, &x, xs, &y, ys);
        check(&got, &want, od, &bshape(xs, ys), &what);
    });
}

#[test]
fn binary_ops_every_dtype_and_broadcast() {
    let mut rng = Rng::new(21);
    for dev in common::devices() {
        for c in cases() {
            for d in ALL {
                for (xs, ys) in PAIRS {
                    run_case(&c, d, xs, ys, &mut rng, dev);
                }
            }
        }
    }
}

#[test]
fn binary_ops_large_parallel() {
    let mut rng = Rng::new(22);
    for dev in common::devices() {
        for c in cases() {
            for d in [DType::F32, DType::F16, DType::I64] {
                // Contiguous parallel path, then the strided (broadcast) parallel path.
                run_case(&c, d, &[70_001], &[70_001], &mut rng, dev);
                run_case(&c, d, &[3, 256, 100], &[256, 1], &mut rng, dev);
            }
        }
    }
}

#[test]
fn min_max_propagate_nan() {
    for dev in common::devices() {
        common::on(dev, || {
            let a = Array::from_slice(&[f32::NAN, 1.0, f32::NAN, -2.0], &[4]).unwrap();
            let b = Array::from_slice(&[0.0f32, f32::NAN, f32::NAN, 3.0], &[4]).unwrap();
            let (x, y) = (a.to_f64_vec().unwrap(), b.to_f64_vec().unwrap());
            for c in cases().iter().filter(|c| c.kind == Kind::MinMax || c.kind == Kind::Pred) {
                let got = (c.op)(&a, &b).unwrap().to_f64_vec().unwrap();
                let want: Vec<f64> = x.iter().zip(&y).map(|(&p, &q)| (c.f)(p, q)).collect();
                common::assert_close(&got, &want, 0.0, c.name);
            }
        });
    }
}

/// Every pair of dtypes: result dtype follows the promotion table and values are right.
#[test]
fn binary_promotion_all_pairs() {
    let mut rng = Rng::new(23);
    for dev in common::devices() {
        for da in ALL {
            for db in ALL {
                let p = spec_promote(da, db);
                assert_eq!(rill::dtype::promote(da, db), p, "promote({da}, {db})");
                for c in cases() {
                    let (xs, ys): (&[usize], &[usize]) = (&[3, 1, 4], &[5, 4]);
                    let xv = draw(&mut rng, numel(xs), 0.0, 6.0, da);
                    let yv = draw(&mut rng, numel(ys), 1.0, 4.0, db);
                    let what = format!("{} {da} with {db}", c.name);
                    common::on(dev, || {
                        let (a, x) = common::array_of(&xv, xs, da);
                        let (b, y) = common::array_of(&yv, ys, db);
                        let r = (c.op)(&a, &b);
                        let Some(od) = out_dtype(&c, p) else {
                            let e = r.expect_err(&what).to_string();
                            assert!(e.contains("bool") && e.contains(c.name), "{what}: {e}");
                            return;
                        };
                        let got = r.unwrap_or_else(|e| panic!("{what}: {e}"));
                        // Operands are exact in both dtypes, so compute in the promoted type.
                        let want = reference(&c, p, od, &x, xs, &y, ys);
                        check(&got, &want, od, &bshape(xs, ys), &what);
                    });
                }
            }
        }
    }
}

/// Rust scalars are weakly typed: they never widen the array's dtype.
#[test]
fn weak_scalar_promotion() {
    let mut rng = Rng::new(24);
    for dev in common::devices() {
        for d in ALL {
            let vals = draw(&mut rng, 6, 0.0, 50.0, d);
            common::on(dev, || {
                let (a, x) = common::array_of(&vals, &[2, 3], d);
                // bool scalar: the array keeps its dtype (bool + true is logical or).
                let r = a.add(true).unwrap();
                let want: Vec<f64> = if d == DType::Bool {
                    x.iter().map(|_| 1.0).collect()
                } else {
                    x.iter().map(|v| v + 1.0).collect()
                };
                check(&r, &want, d, &[2, 3], &format!("{d} + true"));
                // int scalar: keeps the dtype, except bool becomes i32.
                let r = a.mul(3).unwrap();
                let od = if d == DType::Bool { DType::I32 } else { d };
                let want: Vec<f64> =
                    x.iter().map(|&v| if od.is_float() { v * 3.0 } else { wrap(v as i128 * 3, od) as f64 }).collect();
                check(&r, &want, od, &[2, 3], &format!("{d} * 3"));
                // float scalar: floats keep their dtype, integers and bool become f32.
                let r = a.mul(2.5).unwrap();
                let od = if d.is_float() { d } else { DType::F32 };
                check(&r, &x.iter().map(|v| v * 2.5).collect::<Vec<_>>(), od, &[2, 3], &format!("{d} * 2.5"));
                // scalar on the left through a 0-d array of the scalar's own dtype does widen.
                let s = Array::scalar(2.5f64).unwrap();
                assert_eq!(a.add(&s).unwrap().dtype(), spec_promote(d, DType::F64));
            });
        }
    }
}

#[test]
fn weak_int_scalars_wrap() {
    for dev in common::devices() {
        common::on(dev, || {
            let u = Array::from_slice(&[0u8, 10, 200, 255], &[4]).unwrap();
            let x = u.to_f64_vec().unwrap();
            let r = u.add(300).unwrap();
            let want: Vec<f64> = x.iter().map(|&v| wrap(v as i128 + 300, DType::U8) as f64).collect();
            check(&r, &want, DType::U8, &[4], "u8 + 300");
            let r = u.add(-1).unwrap();
            let want: Vec<f64> = x.iter().map(|&v| wrap(v as i128 - 1, DType::U8) as f64).collect();
            check(&r, &want, DType::U8, &[4], "u8 + -1");
            let w = Array::from_slice(&[0u32, 7], &[2]).unwrap();
            check(&w.sub(1).unwrap(), &[wrap(-1, DType::U32) as f64, 6.0], DType::U32, &[2], "u32 - 1");
            // i64 scalars beyond 2^53 stay exact.
            let big = (1i64 << 60) + 1;
            let l = Array::from_slice(&[0i64, 1, -5], &[3]).unwrap();
            let got = l.add(big).unwrap();
            assert_eq!(got.dtype(), DType::I64);
            let want: Vec<i128> = [0i128, 1, -5].iter().map(|v| v + big as i128).collect();
            check_int(&got, &want, DType::I64, &[3], "i64 + 2^60+1");
            let got = rill::where_(&Array::from_bools(&[true, false, true], &[3]).unwrap(), &l, big).unwrap();
            check_int(&got, &[0, big as i128, -5], DType::I64, &[3], "where i64 2^60+1");
            // f16 stays f16 with a float scalar; i32 * 2.5 is f32.
            let (h, hx) = common::array_of(&[1.0, 2.0, -3.0], &[3], DType::F16);
            let want: Vec<f64> = hx.iter().map(|v| v + 1.5).collect();
            check(&h.add(1.5).unwrap(), &want, DType::F16, &[3], "f16 + 1.5");
            let i = Array::from_slice(&[1i32, -2, 3], &[3]).unwrap();
            let ix = i.to_f64_vec().unwrap();
            let want: Vec<f64> = ix.iter().map(|v| v * 2.5).collect();
            check(&i.mul(2.5).unwrap(), &want, DType::F32, &[3], "i32 * 2.5");
            // comparisons with a float scalar compare in float.
            let want: Vec<f64> = ix.iter().map(|&v| (v > 1.5) as u8 as f64).collect();
            check(&i.gt(1.5).unwrap(), &want, DType::Bool, &[3], "i32 > 1.5");
        });
    }
}

fn where_ref(c: &[f64], cs: &[usize], x: &[f64], xs: &[usize], y: &[f64], ys: &[usize]) -> (Vec<usize>, Vec<f64>) {
    let out = bshape(&bshape(cs, xs), ys);
    let v = (0..numel(&out))
        .map(|k| if c[bindex(&out, cs, k)] != 0.0 { x[bindex(&out, xs, k)] } else { y[bindex(&out, ys, k)] })
        .collect();
    (out, v)
}

#[test]
fn where_every_dtype_and_broadcast() {
    let mut rng = Rng::new(25);
    let triples: [(&[usize], &[usize], &[usize]); 6] = [
        (&[], &[], &[]),
        (&[7], &[7], &[7]),
        (&[3, 1, 4], &[5, 4], &[]),
        (&[2, 3], &[], &[2, 3]),
        (&[0, 3], &[3], &[1]),
        (&[4, 1, 1], &[300, 1], &[1, 256]),
    ];
    for dev in common::devices() {
        for d in ALL {
            for cd in [DType::Bool, DType::F32, DType::I32] {
                for (cs, xs, ys) in triples {
                    let cv = draw(&mut rng, numel(cs), -1.0, 2.0, cd).into_iter().map(f64::floor).collect::<Vec<_>>();
                    let (lo, hi) = int_range(d);
                    let (xv, yv) = (draw(&mut rng, numel(xs), lo, hi, d), draw(&mut rng, numel(ys), lo, hi, d));
                    common::on(dev, || {
                        let (c, cx) = common::array_of(&cv, cs, cd);
                        let (a, x) = common::array_of(&xv, xs, d);
                        let (b, y) = common::array_of(&yv, ys, d);
                        let (out, want) = where_ref(&cx, cs, &x, xs, &y, ys);
                        let got = rill::where_(&c, &a, &b).unwrap();
                        check(&got, &want, d, &out, &format!("where cond {cd} {cs:?} {d} {xs:?} {ys:?}"));
                    });
                }
            }
        }
    }
}

#[test]
fn where_promotes_and_takes_scalars() {
    let mut rng = Rng::new(26);
    for dev in common::devices() {
        for da in ALL {
            for db in ALL {
                let (xv, yv) = (draw(&mut rng, 4, 0.0, 5.0, da), draw(&mut rng, 3, 0.0, 5.0, db));
                let cv: Vec<f64> = (0..12).map(|_| (rng.next_u64() % 2) as f64).collect();
                common::on(dev, || {
                    let (c, cx) = common::array_of(&cv, &[3, 4], DType::Bool);
                    let (a, x) = common::array_of(&xv, &[4], da);
                    let (b, y) = common::array_of(&yv, &[3, 1], db);
                    let (out, want) = where_ref(&cx, &[3, 4], &x, &[4], &y, &[3, 1]);
                    let got = rill::where_(&c, &a, &b).unwrap();
                    check(&got, &want, spec_promote(da, db), &out, &format!("where {da} {db}"));
                    // A scalar branch is weak: the array's dtype wins (bool + int scalar is i32).
                    let got = rill::where_(&c, &a, 1).unwrap();
                    let od = if da == DType::Bool { DType::I32 } else { da };
                    let (out, want) = where_ref(&cx, &[3, 4], &x, &[4], &[1.0], &[]);
                    check(&got, &want, od, &out, &format!("where {da} 1"));
                });
            }
        }
        common::on(dev, || {
            let c = Array::from_bools(&[true, false], &[2]).unwrap();
            check(&rill::where_(&c, 1, 2.5).unwrap(), &[1.0, 2.5], DType::F32, &[2], "where 1 2.5");
            check(&rill::where_(&c, 7, -2).unwrap(), &[7.0, -2.0], DType::I32, &[2], "where 7 -2");
            let u = Array::from_slice(&[1u8, 2], &[2]).unwrap();
            let want = [wrap(300, DType::U8) as f64, 2.0];
            check(&rill::where_(&c, 300, &u).unwrap(), &want, DType::U8, &[2], "where 300 u8");
        });
    }
}

/// A Rust scalar operand is a 0-d `Full` node (what `compile` inlines as a literal). It is
/// recorded already evaluated when that costs nothing: at once on the CPU, and on a GPU
/// once the device's scalar slab holds the value. A chain of ops with scalar operands then
/// plans and runs one node per op. The values are the same either way.
#[test]
fn scalar_operands_are_fills_evaluated_when_free() {
    use rill::primitives::Primitive;
    let mut rng = Rng::new(77);
    let xv = rng.vec(33, -2.0, 2.0);
    for dev in common::devices() {
        common::on(dev, || {
            let x = Array::from_slice(&xv, &[33]).unwrap();
            let first = x.mul(0.375).unwrap();
            let s = &first.inputs()[1];
            assert!(matches!(s.primitive(), Primitive::Full { value } if *value == 0.375), "{s:?}");
            assert_eq!(s.shape(), &[] as &[usize]);
            if !dev.is_gpu() {
                assert!(s.is_evaluated(), "a CPU scalar operand is recorded evaluated: {s:?}");
            }
            let got = first.to_f64_vec().unwrap();
            // f64 data: the kernel computes in f64, as the reference does.
            let want: Vec<f64> = xv.iter().map(|&v| v * 0.375).collect();
            assert_eq!(got, want, "{dev}");
            // The value is known to the device now: the next use records it evaluated.
            let again = x.mul(0.375).unwrap().add(0.375).unwrap();
            for n in [&again.inputs()[1], &again.inputs()[0].inputs()[1]] {
                assert!(matches!(n.primitive(), Primitive::Full { .. }), "{n:?}");
                assert!(n.is_evaluated(), "{dev}: {n:?}");
            }
            let want: Vec<f64> = xv.iter().map(|&v| v * 0.375 + 0.375).collect();
            assert_eq!(again.to_f64_vec().unwrap(), want, "{dev}");
        });
    }
}

/// Ready scalar operands are shared between ops (on the CPU the last few values asked for
/// keep their buffer; on a GPU the scalar slab holds them): every value and dtype must
/// still be its own, with more distinct values than any such cache holds, signed zeros
/// and NaN included, and each value asked again after others pushed it out.
#[test]
fn shared_scalar_operands_keep_each_value_and_dtype() {
    let mut values: Vec<f64> = (0..80).map(|i| (i as f64 - 40.0) * 0.3125).collect();
    values.extend([0.0, -0.0, f64::NAN, 1.0e30, -7.0]);
    for dev in common::devices() {
        common::on(dev, || {
            let zero = Array::from_slice(&[-0.0f64, 0.0, 2.5], &[3]).unwrap();
            for round in 0..2 {
                for dtype in [DType::F32, DType::F64, DType::I32] {
                    let x = zero.astype(dtype).unwrap();
                    for &v in &values {
                        if dtype == DType::I32 && (v.fract() != 0.0 || !v.is_finite() || v.abs() > 1e9) {
                            continue;
                        }
                        // An integer array takes an integer scalar (a float one promotes it).
                        let got = if dtype == DType::I32 { x.add(v as i64) } else { x.add(v) }.unwrap();
                        assert_eq!(got.dtype(), dtype, "{dev} {dtype} + {v}");
                        let got = got.to_f64_vec().unwrap();
                        let xs = x.to_f64_vec().unwrap();
                        let cast = |f: f64| match dtype {
                            DType::F32 => f as f32 as f64,
                            _ => f,
                        };
                        for (g, &a) in got.iter().zip(&xs) {
                            let want = cast(a + cast(v));
                            let same = (g.is_nan() && want.is_nan())
                                || (*g == want && g.is_sign_negative() == want.is_sign_negative());
                            assert!(same, "{dev} {dtype} round {round}: {a} + {v} gave {g}, want {want}");
                        }
                    }
                }
            }
        });
    }
}

/// An evaluated scalar operand is one node per stream, dtype and value while something
/// holds it (the stream remembers it weakly): `y * 0.625` in a loop makes one `0.625`
/// node. Another value or dtype is another node, and once nothing holds it the next use
/// makes a new one. The values stay exact.
#[test]
fn a_repeated_scalar_operand_is_one_node_while_held() {
    for dev in common::devices() {
        common::on(dev, || {
            let x = Array::from_slice(&[1.5f32, -2.0, 0.25], &[3]).unwrap();
            // On a GPU the value becomes free (the scalar slab holds it) once used.
            x.mul(0.625).unwrap().eval().unwrap();
            let a = x.mul(0.625).unwrap();
            let b = a.mul(0.625).unwrap();
            let c = b.mul(0.25).unwrap();
            let d = x.astype(DType::F64).unwrap().mul(0.625).unwrap();
            let scalar = |y: &Array| y.inputs()[1].clone();
            let (sa, sb, sc, sd) = (scalar(&a), scalar(&b), scalar(&c), scalar(&d));
            assert!(sa.is_evaluated(), "{dev}: {sa:?}");
            assert_eq!(sa.id(), sb.id(), "{dev}: one node for one value");
            assert_ne!(sa.id(), sc.id(), "{dev}: another value");
            assert_ne!(sa.id(), sd.id(), "{dev}: another dtype");
            let want: Vec<f64> = [1.5f64, -2.0, 0.25].iter().map(|v| v * 0.625 * 0.625 * 0.25).collect();
            assert_eq!(c.to_f64_vec().unwrap(), want, "{dev}");
            let old = sa.id();
            drop((a, b, c, d, sa, sb, sc, sd));
            let e = x.mul(0.625).unwrap();
            assert_ne!(scalar(&e).id(), old, "{dev}: a node nobody holds is not kept");
            let want: Vec<f64> = [1.5f64, -2.0, 0.25].iter().map(|v| v * 0.625).collect();
            assert_eq!(e.to_f64_vec().unwrap(), want, "{dev}");
        });
    }
}
