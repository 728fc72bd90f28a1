//! `astype` between every pair of the nine dtypes against an exact reference of the
//! documented cast semantics, and the promotion table printed for docs/DTYPES.md.

mod common;
mod elem_ref;

use common::Rng;
use elem_ref::*;
use rill::{Array, DType};

/// Inputs that exercise every rule: signed zeros, halves, NaN, infinities, values that
/// saturate or wrap each integer type, values that overflow f16, and 2^30 + 2^22 + 1,
/// which rounds up to bf16 when rounded once but down when rounded through f32 first.
fn special_values() -> Vec<f64> {
    let mut v = vec![
        f64::NAN,
        f64::INFINITY,
        f64::NEG_INFINITY,
        0.0,
        -0.0,
        0.5,
        -0.5,
        1.5,
        2.5,
        -2.7,
        0.999,
        255.0,
        256.0,
        300.7,
        -1.0,
        -129.0,
        65504.0,
        65519.0,
        65520.0,
        70000.0,
        2f64.powi(31),
        -(2f64.powi(31)) - 1.0,
        3e9,
        5e9,
        1e12,
        -1e12,
        1_077_936_129.0,
        16_777_217.0,
        2f64.powi(53) + 2.0,
        1e20,
        -1e20,
        1e-3,
        -6e-5,
        1e-40,
    ];
    v.extend([1.0 / 3.0, std::f64::consts::PI, -1e5 / 7.0]);
    v
}

/// The exact source values: (as f64, as an exact integer where the source is integral).
fn source(a: &Array) -> (Vec<f64>, Option<Vec<i128>>) {
    let f = a.to_f64_vec().unwrap();
    let i = if a.dtype().is_float() { None } else { Some(exact_ints(a)) };
    (f, i)
}

fn check_cast(a: &Array, to: DType, what: &str) {
    let from = a.dtype();
    let (f, i) = source(a);
    let got = a.astype(to).unwrap_or_else(|e| panic!("{what}: {e}"));
    assert_eq!(got.dtype(), to, "{what}");
    assert_eq!(got.shape(), a.shape(), "{what}");
    if to == DType::Bool {
        // Nonzero (NaN included) is true.
        let want: Vec<f64> = f.iter().map(|&v| (v != 0.0) as u8 as f64).collect();
        let g = got.to_f64_vec().unwrap();
        assert_eq!(g, want, "{what}");
    } else if !to.is_float() {
        let want: Vec<i128> = match &i {
            // integer to integer wraps
            Some(i) => i.iter().map(|&v| wrap(v, to)).collect(),
            // float to integer truncates toward zero and saturates, NaN is 0
            None => f.iter().map(|&v| sat(v, to)).collect(),
        };
        check_int(&got, &want, to, a.shape(), what);
    } else {
        // To a float: rounded once to the nearest representable value (ties to even).
        let want: Vec<f64> = match &i {
            Some(i) if from == DType::I64 => i.iter().map(|&v| round_to(v as f64, to)).collect(),
            _ => f.iter().map(|&v| round_to(v, to)).collect(),
        };
        let g = got.to_f64_vec().unwrap();
        for (k, (g, w)) in g.iter().zip(&want).enumerate() {
            assert!(g == w || (g.is_nan() && w.is_nan()), "{what}: element {k} ({}): got {g:e}, want {w:e}", f[k]);
            if *w == 0.0 {
                assert_eq!(g.is_sign_negative(), w.is_sign_negative(), "{what}: sign of zero at {k}");
            }
        }
    }
}

#[test]
fn astype_all_pairs() {
    let mut rng = Rng::new(31);
    let special = special_values();
    for dev in common::devices() {
        for from in ALL {
            for to in ALL {
                for shape in [&[][..], &[special.len()], &[2, 0, 3], &[3, 4, 5]] {
                    let n = numel(shape);
                    let vals: Vec<f64> = if n == special.len() {
                        special.clone()
                    } else if n == 1 {
                        vec![rng.uniform(-300.0, 300.0)]
                    } else {
                        (0..n)
                            .map(|k| match k % 3 {
                                0 => rng.uniform(-300.0, 300.0),
                                1 => rng.uniform(-1e10, 1e10).round(),
                                _ => rng.uniform(-3.0, 3.0).round(),
                            })
                            .collect()
                    };
                    common::on(dev, || {
                        let (a, _) = common::array_of(&vals, shape, from);
                        check_cast(&a, to, &format!("{from} -> {to} {shape:?} on {dev:?}"));
                    });
                }
            }
        }
    }
}

#[test]
fn astype_large_parallel() {
    let mut rng = Rng::new(32);
    let vals = rng.vec(70_001, -1e6, 1e6);
    for dev in common::devices() {
        for (from, to) in [(DType::F64, DType::BF16), (DType::F32, DType::I32), (DType::I64, DType::U8)] {
            common::on(dev, || {
                let (a, _) = common::array_of(&vals, &[70_001], from);
                check_cast(&a, to, &format!("{from} -> {to} large"));
            });
        }
    }
}

#[test]
fn astype_exact_i64_wraps() {
    for dev in common::devices() {
        common::on(dev, || {
            let v = [i64::MAX, i64::MIN, -1, (1 << 40) + 7, (1 << 53) + 1];
            let a = Array::from_slice(&v, &[5]).unwrap();
            for to in ALL {
                check_cast(&a, to, &format!("i64 extremes -> {to}"));
            }
        });
    }
}

/// Prints the 9x9 table pasted into docs/DTYPES.md, and checks the doc still holds it.
#[test]
fn promotion_table_in_docs() {
    let order =
        [DType::Bool, DType::U8, DType::U32, DType::I32, DType::I64, DType::F16, DType::BF16, DType::F32, DType::F64];
    let mut t = String::from("|      |");
    for b in order {
        t += &format!(" {:<4} |", b.name());
    }
    t += "\n|------|";
    for _ in order {
        t += "------|";
    }
    t += "\n";
    for a in order {
        t += &format!("| {:<4} |", a.name());
        for b in order {
            let p = rill::dtype::promote(a, b);
            assert_eq!(p, spec_promote(a, b), "promote({a}, {b})");
            t += &format!(" {:<4} |", p.name());
        }
        t += "\n";
    }
    println!("{t}");
    // Read at run time (a test binary may run on another machine, see gpu-pack).
    let dir = std::env::var("CARGO_MANIFEST_DIR").expect("CARGO_MANIFEST_DIR is set by cargo and gpu-pack");
    let doc = std::fs::read_to_string(std::path::Path::new(&dir).join("../../docs/DTYPES.md")).unwrap();
    assert!(doc.contains(&t), "docs/DTYPES.md does not hold the current promotion table:\n{t}");
}
