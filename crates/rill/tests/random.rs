//! Counter-based random numbers: determinism, key derivation, the documented bit mapping
//! (checked against an independent threefry written here), and statistics.

mod common;

use common::{devices, on};
use rill::random::{self, Key};
use rill::{Array, DType};

const FLOATS: [DType; 4] = [DType::F32, DType::F64, DType::F16, DType::BF16];

/// Threefry-2x32, 20 rounds, written out round by round from the Random123 description.
fn threefry_ref(k: [u32; 2], c: [u32; 2]) -> [u32; 2] {
    let k2 = 0x1BD1_1BDA ^ k[0] ^ k[1];
    let keys = [k[0], k[1], k2];
    let (mut a, mut b) = (c[0].wrapping_add(k[0]), c[1].wrapping_add(k[1]));
    let rots = [[13, 15, 26, 6], [17, 29, 16, 24]];
    for inj in 1..=5u32 {
        for r in rots[((inj - 1) % 2) as usize] {
            a = a.wrapping_add(b);
            b = b.rotate_left(r);
            b ^= a;
        }
        a = a.wrapping_add(keys[(inj % 3) as usize]);
        b = b.wrapping_add(keys[((inj + 1) % 3) as usize]).wrapping_add(inj);
    }
    [a, b]
}

fn mean_var(v: &[f64]) -> (f64, f64) {
    let n = v.len() as f64;
    let m = v.iter().sum::<f64>() / n;
    (m, v.iter().map(|x| (x - m) * (x - m)).sum::<f64>() / n)
}

#[test]
fn known_answers_of_the_reference() {
    assert_eq!(threefry_ref([0, 0], [0, 0]), [0x6b20_0159, 0x99ba_4efe]);
    assert_eq!(threefry_ref([0x1319_8a2e, 0x0370_7344], [0x243f_6a88, 0x85a3_08d3]), [0xc492_3a9c, 0x483d_f7a0]);
}

#[test]
fn uniform_matches_the_documented_bit_mapping() {
    for dev in devices() {
        on(dev, || {
            let key = Key::new(0x0123_4567_89ab_cdef);
            let w = key.words();
            assert_eq!(w, [0x0123_4567, 0x89ab_cdef]);
            let n = 70_000; // more than one parallel chunk
            let f32s = random::uniform(key, &[n], 0.0, 1.0, DType::F32).unwrap().to_vec::<f32>().unwrap();
            let f64s = random::uniform(key, &[n], -2.0, 3.0, DType::F64).unwrap().to_vec::<f64>().unwrap();
            let bern = random::bernoulli(key, 0.3, &[n]).unwrap().to_bool_vec().unwrap();
            for i in 0..n {
                let [x0, x1] = threefry_ref(w, [i as u32, 0]);
                assert_eq!(f32s[i] as f64, (x0 >> 8) as f64 / 16777216.0, "f32 element {i}");
                let u = ((((x0 as u64) << 32) | x1 as u64) >> 11) as f64 / 9007199254740992.0;
                assert_eq!(f64s[i], -2.0 + 5.0 * u, "f64 element {i}");
                assert_eq!(bern[i], u < 0.3, "bernoulli element {i}");
            }
            // Normal: Box-Muller from counters 2i and 2i + 1.
            let z = random::normal(key, &[1000], 1.0, 2.0, DType::F64).unwrap().to_vec::<f64>().unwrap();
            for i in 0..1000 {
                let u = |c: u32| {
                    let [x0, x1] = threefry_ref(w, [c, 0]);
                    ((((x0 as u64) << 32) | x1 as u64) >> 11) as f64 / 9007199254740992.0
                };
                let (u1, u2) = (u(2 * i), u(2 * i + 1));
                let want = 1.0 + 2.0 * (-2.0 * (1.0 - u1).ln()).sqrt() * (2.0 * std::f64::consts::PI * u2).cos();
                assert!((z[i as usize] - want).abs() <= 1e-12 * (1.0 + want.abs()), "normal {i}");
            }
        });
    }
}

#[test]
fn determinism_and_key_derivation() {
    for dev in devices() {
        on(dev, || {
            let key = Key::new(42);
            let draw = |k: Key| random::uniform(k, &[64], 0.0, 1.0, DType::F32).unwrap().to_vec::<f32>().unwrap();
            assert_eq!(draw(key), draw(key), "same key, same values");
            assert_eq!(draw(Key::new(42)), draw(key));
            assert_ne!(draw(Key::new(43)), draw(key), "different seeds differ");
            let ks = key.split(4);
            assert_eq!(ks, key.split(4), "split is deterministic");
            assert_eq!(&key.split(6)[..4], &ks[..], "split(n) is a prefix of split(n + k)");
            let mut all: Vec<Vec<f32>> = ks.iter().map(|&k| draw(k)).collect();
            all.push(draw(key));
            all.push(draw(key.fold_in(0)));
            all.push(draw(key.fold_in(1)));
            for i in 0..all.len() {
                for j in 0..i {
                    assert_ne!(all[i], all[j], "derived keys {i} and {j} draw the same values");
                }
            }
            assert_eq!(key.fold_in(7), key.fold_in(7));
            // The shape does not matter: element i depends only on the key and i.
            let flat = random::normal(key, &[6, 5], 0.0, 1.0, DType::F32).unwrap().to_vec::<f32>().unwrap();
            let other = random::normal(key, &[30], 0.0, 1.0, DType::F32).unwrap().to_vec::<f32>().unwrap();
            assert_eq!(flat, other);
            let big = random::uniform(key, &[100_000], 0.0, 1.0, DType::F64).unwrap().to_vec::<f64>().unwrap();
            let small = random::uniform(key, &[10], 0.0, 1.0, DType::F64).unwrap().to_vec::<f64>().unwrap();
            assert_eq!(&big[..10], &small[..]);
            // The process-wide generator.
            random::seed(5);
            let a = (random::next_key(), random::next_key());
            random::seed(5);
            let b = (random::next_key(), random::next_key());
            assert_eq!(a, b);
            assert_ne!(a.0, a.1);
            assert_eq!(a.0, Key::new(5).fold_in(0).fold_in(0));
        });
    }
}

#[test]
fn uniform_statistics_and_range() {
    for dev in devices() {
        on(dev, || {
            for dtype in FLOATS {
                for (k, (lo, hi)) in [(0.0, 1.0), (-3.0, 5.0), (0.99, 1.0)].into_iter().enumerate() {
                    let a = random::uniform(Key::new(k as u64 + 10), &[100_000], lo, hi, dtype).unwrap();
                    assert_eq!(a.dtype(), dtype);
                    let v = a.to_f64_vec().unwrap();
                    let (rlo, rhi) = (round(lo, dtype), round(hi, dtype));
                    assert!(v.iter().all(|&x| x >= rlo && x < rhi), "{dtype} [{lo}, {hi}) out of range");
                    if rhi - rlo > 0.5 {
                        let (m, var) = mean_var(&v);
                        let w = rhi - rlo;
                        assert!((m - (rlo + rhi) / 2.0).abs() < 0.01 * w, "{dtype} mean {m}");
                        assert!((var / (w * w / 12.0) - 1.0).abs() < 0.03, "{dtype} var {var}");
                    }
                }
            }
            // Scalars and empty shapes.
            assert_eq!(random::uniform(Key::new(1), &[], 0.0, 1.0, DType::F32).unwrap().shape(), &[] as &[usize]);
            assert!(
                random::uniform(Key::new(1), &[0, 3], 0.0, 1.0, DType::F32).unwrap().to_f64_vec().unwrap().is_empty()
            );
        });
    }
}

fn round(v: f64, dtype: DType) -> f64 {
    Array::from_slice(&[v], &[1]).unwrap().astype(dtype).unwrap().to_f64_vec().unwrap()[0]
}

#[test]
fn normal_statistics() {
    for dev in devices() {
        on(dev, || {
            for dtype in FLOATS {
                let (mean, std) = (1.5, 2.0);
                let v = random::normal(Key::new(99), &[100_000], mean, std, dtype).unwrap().to_f64_vec().unwrap();
                assert!(v.iter().all(|x| x.is_finite()));
                let (m, var) = mean_var(&v);
                assert!((m - mean).abs() < 0.03, "{dtype} mean {m}");
                assert!((var.sqrt() / std - 1.0).abs() < 0.02, "{dtype} std {}", var.sqrt());
                let within = v.iter().filter(|&&x| (x - mean).abs() < std).count() as f64 / v.len() as f64;
                assert!((within - 0.6827).abs() < 0.01, "{dtype} one-sigma fraction {within}");
                let skew = v.iter().map(|x| ((x - m) / var.sqrt()).powi(3)).sum::<f64>() / v.len() as f64;
                assert!(skew.abs() < 0.05, "{dtype} skew {skew}");
            }
            let z = random::normal(Key::new(3), &[10], 4.0, 0.0, DType::F32).unwrap().to_vec::<f32>().unwrap();
            assert_eq!(z, vec![4.0; 10]);
        });
    }
}

#[test]
fn bernoulli_frequency() {
    for dev in devices() {
        on(dev, || {
            for p in [0.0, 0.03, 0.3, 0.5, 0.9, 1.0] {
                let b = random::bernoulli(Key::new(7), p, &[100_000]).unwrap();
                assert_eq!(b.dtype(), DType::Bool);
                let v = b.to_bool_vec().unwrap();
                let f = v.iter().filter(|&&x| x).count() as f64 / v.len() as f64;
                assert!((f - p).abs() < 0.01, "p {p}: frequency {f}");
                if p == 0.0 || p == 1.0 {
                    assert_eq!(f, p);
                }
            }
        });
    }
}

#[test]
fn random_errors_name_their_inputs() {
    let k = Key::new(0);
    for dtype in [DType::I32, DType::U8, DType::Bool, DType::I64] {
        let m = random::uniform(k, &[2], 0.0, 1.0, dtype).unwrap_err().to_string();
        assert!(m.contains("uniform") && m.contains(dtype.name()), "{m}");
        let m = random::normal(k, &[2], 0.0, 1.0, dtype).unwrap_err().to_string();
        assert!(m.contains("normal") && m.contains(dtype.name()), "{m}");
    }
    let m = random::uniform(k, &[2], 1.0, 1.0, DType::F32).unwrap_err().to_string();
    assert!(m.contains("[1, 1)"), "{m}");
    assert!(random::uniform(k, &[2], 2.0, 1.0, DType::F32).is_err());
    assert!(random::uniform(k, &[2], 0.0, f64::INFINITY, DType::F64).is_err());
    assert!(random::uniform(k, &[2], f64::NAN, 1.0, DType::F64).is_err());
    let m = random::uniform(k, &[2], 0.0, 1e6, DType::F16).unwrap_err().to_string();
    assert!(m.contains("f16"), "{m}");
    assert!(random::uniform(k, &[2], 1.0, 1.0001, DType::BF16).is_err(), "bounds equal once rounded");
    let m = random::normal(k, &[2], 0.0, -1.0, DType::F32).unwrap_err().to_string();
    assert!(m.contains("std -1"), "{m}");
    assert!(random::normal(k, &[2], f64::NAN, 1.0, DType::F32).is_err());
    for p in [-0.1, 1.5, f64::NAN] {
        let m = random::bernoulli(k, p, &[2]).unwrap_err().to_string();
        assert!(m.contains("bernoulli") && m.contains(&p.to_string()), "{m}");
    }
    let m = random::uniform(k, &[usize::MAX, 2], 0.0, 1.0, DType::F32).unwrap_err().to_string();
    assert!(m.contains("too many elements"), "{m}");
}
