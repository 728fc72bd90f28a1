//! `scaled_dot_product_attention` on the CPU: generated cases (batch axes, grouped-query
//! ratios, Tq != Tk, head dimensions 1..128, keys past one block, causal, bool and
//! additive masks with broadcasting, fully masked rows, strided inputs, every float
//! dtype) against a float64 reference; the same under `compile` (traced and shapeless);
//! every error case.

mod attention_ref;
mod common;

use attention_ref::{Case, MaskCase, check, tolerance};
use common::{Rng, assert_close};
use rill::{Array, AttentionMask, DType, Device, Error, SliceArg, scaled_dot_product_attention as sdpa};

const FLOATS: [DType; 4] = [DType::F32, DType::F16, DType::BF16, DType::F64];

#[test]
fn generated_cases_match_the_float64_reference() {
    let mut rng = Rng::new(26);
    common::on(Device::cpu(), || {
        for n in 0..120 {
            let case = Case::random(&mut rng, &FLOATS, false);
            check(&case, &mut rng, &format!("case {n}"));
        }
    });
}

/// The shapes models run: one query per head against many keys with grouped heads
/// (decoding), and long causal prefills whose rows span several pieces and key blocks;
/// every float dtype, masks and strided inputs as generated.
#[test]
fn decode_and_long_prefill_shapes_match_the_float64_reference() {
    let mut rng = Rng::new(27);
    common::on(Device::cpu(), || {
        for n in 0..40 {
            let mut case = Case::random(&mut rng, &FLOATS, true);
            if n % 2 == 0 {
                case.tq = 1;
                case.hq = case.hkv * 3;
                if let MaskCase::Bool(s) | MaskCase::Add(s, _) = &mut case.mask {
                    let r = s.len();
                    if r >= 2 {
                        s[r - 2] = 1;
                    }
                    if r >= 3 && s[r - 3] > 1 {
                        s[r - 3] = case.hq;
                    }
                }
            }
            check(&case, &mut rng, &format!("case {n}"));
        }
    });
}

/// The generated decode cases of the GPU's split-key kernel (one query row, wide
/// grouped heads, caches up to about 3000 keys) on the CPU.
#[test]
fn generated_decode_rows_match_the_float64_reference() {
    let mut rng = Rng::new(28);
    common::on(Device::cpu(), || {
        for n in 0..30 {
            let case = Case::decode(&mut rng, &FLOATS);
            check(&case, &mut rng, &format!("decode case {n}"));
        }
    });
}

/// Keys and values read through views of a larger cache (as a KV cache is sliced to the
/// positions filled so far): a row stride longer than the row, an offset, per-head planes
/// apart; f32 views are read in place.
#[test]
fn cache_slices_are_read_through_their_strides() {
    let mut rng = Rng::new(5);
    common::on(Device::cpu(), || {
        for (dtype, hq, hkv, tq, tk, causal) in [
            (DType::F32, 9, 3, 1, 200, false),
            (DType::F32, 4, 2, 70, 150, true),
            (DType::BF16, 6, 2, 1, 33, true),
            (DType::F32, 2, 2, 3, 129, true),
        ] {
            let (b, cap, d) = (2, 256, 64);
            let case = Case {
                batch: vec![b],
                hq,
                hkv,
                tq,
                tk,
                d,
                dv: d,
                dtype,
                mask: if causal { MaskCase::Causal } else { MaskCase::None },
                scale: None,
                transposed: false,
            };
            let q = Array::from_slice(&rng.vec(b * hq * tq * d, -1.0, 1.0), &[b, hq, tq, d])
                .unwrap()
                .astype(dtype)
                .unwrap();
            let cache = |rng: &mut Rng| {
                let full = Array::from_slice(&rng.vec(b * hkv * cap * d, -1.0, 1.0), &[b, hkv, cap, d]).unwrap();
                let start = 7;
                full.astype(dtype)
                    .unwrap()
                    .slice(&[SliceArg::full(), SliceArg::full(), SliceArg::range(start, start + tk as isize)])
                    .unwrap()
            };
            let (k, v) = (cache(&mut rng), cache(&mut rng));
            let vals: Vec<Vec<f64>> = [&q, &k, &v].iter().map(|a| a.to_f64_vec().unwrap()).collect();
            let got = case.call(&[q, k, v], None).unwrap().to_f64_vec().unwrap();
            assert_close(&got, &case.reference(&vals, None), tolerance(dtype), &format!("{case:?}"));
        }
    });
}

/// Causal with more queries than keys: the first `Tq - Tk` rows see no key and are 0;
/// with no keys at all every row is 0 (never NaN).
#[test]
fn rows_without_keys_are_zero() {
    let mut rng = Rng::new(3);
    for (tq, tk, mask) in [(9, 4, MaskCase::Causal), (5, 0, MaskCase::None), (3, 0, MaskCase::Causal)] {
        let case = Case {
            batch: vec![2],
            hq: 2,
            hkv: 1,
            tq,
            tk,
            d: 8,
            dv: 8,
            dtype: DType::F32,
            mask,
            scale: None,
            transposed: false,
        };
        let (x, vals, _) = case.inputs(&mut rng);
        let got = case.call(&x, None).unwrap().to_f64_vec().unwrap();
        assert!(got.iter().all(|v| v.is_finite()));
        assert_close(&got, &case.reference(&vals, None), 3e-5, &format!("{case:?}"));
        let zero_rows = tq.saturating_sub(tk);
        assert!(got[..zero_rows * 8].iter().all(|&v| v == 0.0), "{case:?}");
    }
    // A bool mask all false, and an additive mask all -inf.
    let q = Array::from_slice(&rng.vec(2 * 3 * 4, -1.0, 1.0), &[2, 3, 4]).unwrap();
    let none = Array::zeros(&[1, 1, 3], DType::Bool).unwrap();
    let inf = Array::full(&[3], f64::NEG_INFINITY, DType::F32).unwrap();
    for m in [&none, &inf] {
        let got = sdpa(&q, &q, &q, AttentionMask::Array(m), None).unwrap().to_f64_vec().unwrap();
        assert!(got.iter().all(|&v| v == 0.0), "{got:?}");
    }
}

/// The op composes with elementwise ops on both sides (fusion at eval stops at it) and
/// under `compile`: traced replays and shapeless replays on other shapes give the eager
/// values.
#[test]
fn under_compile_and_fusion() {
    let mut rng = Rng::new(7);
    for n in 0..24 {
        let case = Case::random(&mut rng, &[DType::F32, DType::BF16], false);
        let (x, vals, mask) = case.inputs(&mut rng);
        let c2 = case.clone();
        let f = move |a: &[Array]| -> rill::Result<Vec<Array>> {
            let q = a[0].mul(2.0)?;
            let o = c2.call(&[q, a[1].clone(), a[2].clone()], a.get(3))?;
            Ok(vec![o.add(1.0)?])
        };
        let mut args = x.clone();
        args.extend(mask.as_ref().map(|m| m.0.clone()));
        let eager = f(&args).unwrap().remove(0).to_f64_vec().unwrap();
        let mut qv = vals.clone();
        qv[0] = x[0].mul(2.0).unwrap().to_f64_vec().unwrap();
        let want: Vec<f64> =
            case.reference(&qv, mask.as_ref().map(|m| m.1.as_slice())).iter().map(|v| v + 1.0).collect();
        let tol = tolerance(case.dtype) * 3.0;
        assert_close(&eager, &want, tol, &format!("eager {n}: {case:?}"));
        for shapeless in [false, true] {
            let cf = if shapeless { rill::compile_shapeless(f.clone()) } else { rill::compile(f.clone()) };
            for _ in 0..2 {
                let got = cf.call(&args).unwrap().remove(0).to_f64_vec().unwrap();
                assert!(common::same_values(&got, &eager), "replay {n} (shapeless {shapeless}): {case:?}");
            }
        }
    }
    // One shapeless function replayed on other lengths and head dimensions (its scale
    // follows each call's D).
    let f = rill::compile_shapeless(|a: &[Array]| Ok(vec![sdpa(&a[0], &a[1], &a[2], AttentionMask::Causal, None)?]));
    for (tq, tk, d) in [(5, 7, 8), (9, 3, 16), (1, 70, 8), (33, 65, 4)] {
        let case = Case {
            batch: vec![2],
            hq: 4,
            hkv: 2,
            tq,
            tk,
            d,
            dv: d,
            dtype: DType::F32,
            mask: MaskCase::Causal,
            scale: None,
            transposed: false,
        };
        let (x, vals, _) = case.inputs(&mut rng);
        let got = f.call(&x).unwrap().remove(0).to_f64_vec().unwrap();
        assert_close(&got, &case.reference(&vals, None), 3e-5, &format!("shapeless replay {case:?}"));
    }
}

#[test]
fn bad_inputs_are_errors() {
    let f = |s: &[usize]| Array::zeros(s, DType::F32).unwrap();
    let (q, k, v) = (f(&[2, 4, 5, 8]), f(&[2, 2, 7, 8]), f(&[2, 2, 7, 3]));
    assert!(sdpa(&q, &k, &v, AttentionMask::None, None).is_ok());
    let shape_err = |r: rill::Result<Array>, what: &str| {
        assert!(matches!(r, Err(Error::Shape { .. })), "{what}: {r:?}");
    };
    shape_err(sdpa(&f(&[5, 8]), &f(&[7, 8]), &f(&[7, 3]), AttentionMask::None, None), "rank 2");
    shape_err(sdpa(&q, &f(&[2, 7, 8]), &v, AttentionMask::None, None), "ranks differ");
    shape_err(sdpa(&q, &f(&[3, 2, 7, 8]), &f(&[3, 2, 7, 3]), AttentionMask::None, None), "batch differs");
    shape_err(sdpa(&q, &f(&[2, 2, 7, 9]), &v, AttentionMask::None, None), "D differs");
    shape_err(sdpa(&q, &f(&[2, 3, 7, 8]), &f(&[2, 3, 7, 3]), AttentionMask::None, None), "Hq % Hkv");
    shape_err(sdpa(&q, &k, &f(&[2, 2, 6, 3]), AttentionMask::None, None), "v's length");
    shape_err(sdpa(&q, &k, &f(&[2, 1, 7, 3]), AttentionMask::None, None), "v's heads");
    shape_err(sdpa(&q, &f(&[2, 0, 7, 8]), &f(&[2, 0, 7, 3]), AttentionMask::None, None), "no kv heads");
    let deep = f(&[1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 8]);
    shape_err(sdpa(&deep, &deep, &deep, AttentionMask::None, None), "9 batch axes");
    for bad in [&[2, 4, 5, 6][..], &[3, 1, 7], &[3, 2, 4, 5, 7], &[6, 1]] {
        let m = Array::zeros(bad, DType::Bool).unwrap();
        shape_err(sdpa(&q, &k, &v, AttentionMask::Array(&m), None), &format!("mask {bad:?}"));
    }
    for good in [&[2, 1, 1, 7][..], &[7], &[5, 1], &[4, 5, 7], &[1, 1, 1, 7]] {
        let m = Array::zeros(good, DType::F16).unwrap();
        assert!(sdpa(&q, &k, &v, AttentionMask::Array(&m), None).is_ok(), "mask {good:?}");
    }
    let dtype_err = |r: rill::Result<Array>, what: &str| {
        assert!(matches!(r, Err(Error::DType { .. })), "{what}: {r:?}");
    };
    let int = Array::zeros(&[2, 4, 5, 8], DType::I32).unwrap();
    dtype_err(sdpa(&int, &k, &v, AttentionMask::None, None), "int q");
    dtype_err(sdpa(&q, &Array::zeros(&[2, 2, 7, 8], DType::Bool).unwrap(), &v, AttentionMask::None, None), "bool k");
    dtype_err(sdpa(&q, &k, &Array::zeros(&[2, 2, 7, 3], DType::I64).unwrap(), AttentionMask::None, None), "int v");
    let im = Array::zeros(&[7], DType::I32).unwrap();
    dtype_err(sdpa(&q, &k, &v, AttentionMask::Array(&im), None), "int mask");
    for s in [f64::NAN, f64::INFINITY] {
        let r = sdpa(&q, &k, &v, AttentionMask::None, Some(s));
        assert!(matches!(r, Err(Error::InvalidArgument { .. })), "scale {s}: {r:?}");
    }
    // Mixed float dtypes promote; the output has the promoted dtype.
    let h = Array::zeros(&[2, 2, 7, 8], DType::F16).unwrap();
    assert_eq!(q.scaled_dot_product_attention(&h, &v, AttentionMask::Causal, Some(0.5)).unwrap().dtype(), DType::F32);
}
