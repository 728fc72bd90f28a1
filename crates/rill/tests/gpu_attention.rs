//! `scaled_dot_product_attention` on the GPU (the decode kernel for one query row, the
//! tensor-core kernel for f16/bf16 with D and Dv multiples of 16 up to 128, cuBLAS
//! products around a row softmax for f32/f64, the SIMT kernel otherwise) against the float64
//! reference, on generated cases: batch axes, grouped-query ratios, Tq != Tk and
//! decode-sized Tq, several key tiles, causal, bool and additive masks with
//! broadcasting, fully masked rows, strided inputs. Skipped without a GPU;
//! `RILL_REQUIRE_GPU=1` makes a missing GPU a failure.

mod attention_ref;
mod common;

use attention_ref::{Case, MaskCase, check, check_rows};
use common::{Rng, gpu};
use rill::{Array, AttentionMask, DType};

#[test]
fn gpu_tensor_core_shapes_match_the_float64_reference() {
    let Some(g) = gpu() else { return };
    let mut rng = Rng::new(126);
    common::on(g, || {
        for n in 0..80 {
            let case = Case::random(&mut rng, &[DType::F16, DType::BF16], true);
            check(&case, &mut rng, &format!("case {n}"));
        }
    });
}

#[test]
fn gpu_generic_shapes_match_the_float64_reference() {
    let Some(g) = gpu() else { return };
    let mut rng = Rng::new(127);
    common::on(g, || {
        for n in 0..80 {
            let case = Case::random(&mut rng, &[DType::F32, DType::F16, DType::BF16, DType::F64], false);
            check(&case, &mut rng, &format!("case {n}"));
        }
    });
}

/// One query row against caches of many lengths (the split-key decode kernel and its
/// merge), f16/bf16/f32.
#[test]
fn gpu_decode_rows_match_the_float64_reference() {
    let Some(g) = gpu() else { return };
    let mut rng = Rng::new(404);
    common::on(g, || {
        for n in 0..120 {
            let case = Case::decode(&mut rng, &[DType::F32, DType::F16, DType::BF16]);
            check(&case, &mut rng, &format!("decode case {n}"));
        }
    });
}

/// Decode (a few queries against a long cache) and long causal prefill, the shapes of
/// text generation.
#[test]
fn gpu_decode_and_long_causal() {
    let Some(g) = gpu() else { return };
    let mut rng = Rng::new(5);
    common::on(g, || {
        for (tq, tk, mask, dtype) in [
            (1, 2000, MaskCase::Causal, DType::BF16),
            (4, 1500, MaskCase::Causal, DType::F16),
            (1, 777, MaskCase::None, DType::F32),
            (700, 700, MaskCase::Causal, DType::BF16),
            (600, 1000, MaskCase::Causal, DType::F16),
            (300, 200, MaskCase::Causal, DType::F16),
            (256, 512, MaskCase::Bool(vec![2, 1, 1, 512]), DType::BF16),
        ] {
            let case = Case {
                batch: vec![2],
                hq: 4,
                hkv: 2,
                tq,
                tk,
                d: 128,
                dv: 128,
                dtype,
                mask,
                scale: None,
                transposed: false,
            };
            check(&case, &mut rng, "long");
        }
    });
}

/// The tensor-core kernel with two row tiles a warp (head dimension 64, no array mask,
/// 512 and more queries over enough planes to fill a GPU of up to 132 multiprocessors
/// twice), grouped heads, with and without the causal mask; sampled rows against the
/// float64 reference.
#[test]
fn gpu_two_row_tiles_a_warp() {
    let Some(g) = gpu() else { return };
    let mut rng = Rng::new(64);
    common::on(g, || {
        for (tq, tk, mask, dtype) in [(512, 512, MaskCase::None, DType::BF16), (600, 700, MaskCase::Causal, DType::F16)]
        {
            let case = Case {
                batch: vec![4],
                hq: 24,
                hkv: 8,
                tq,
                tk,
                d: 64,
                dv: 64,
                dtype,
                mask,
                scale: None,
                transposed: false,
            };
            check_rows(&case, &mut rng, 200, "two tiles");
        }
    });
}

/// f32 and f64 attention whose scores exceed what the cuBLAS path holds at once (512 MiB):
/// planes taken in chunks, and one plane's rows in chunks, with bool, causal and additive
/// masks; sampled rows against the float64 reference.
#[test]
fn gpu_scores_larger_than_one_chunk() {
    let Some(g) = gpu() else { return };
    let mut rng = Rng::new(31);
    common::on(g, || {
        let cases = [
            (vec![3], 4, 4096, 4096, 16, 8, MaskCase::Bool(vec![3, 1, 1, 4096]), DType::F32, true),
            (vec![], 8, 4096, 4200, 8, 8, MaskCase::Causal, DType::F32, false),
            (vec![1], 2, 6000, 6000, 8, 8, MaskCase::Add(vec![2, 6000, 1], DType::F32), DType::F64, false),
        ];
        for (batch, hq, tq, tk, d, dv, mask, dtype, transposed) in cases {
            let case = Case { batch, hq, hkv: 1, tq, tk, d, dv, dtype, mask, scale: None, transposed };
            check_rows(&case, &mut rng, 64, "chunks");
        }
    });
}

/// Rows with no key: causal rows before the first key, an all-false bool mask, an
/// all -inf additive mask, and no keys at all are 0 on both kernels.
#[test]
fn gpu_rows_without_keys_are_zero() {
    let Some(g) = gpu() else { return };
    common::on(g, || {
        for dt in [DType::F16, DType::F32] {
            for d in [64usize, 8] {
                let q = Array::ones(&[1, 2, 70, d], dt).unwrap();
                let k = Array::ones(&[1, 2, 3, d], dt).unwrap();
                let got = rill::scaled_dot_product_attention(&q, &k, &k, AttentionMask::Causal, None).unwrap();
                let got = got.to_f64_vec().unwrap();
                // Rows 0..67 see no key; the last three see keys with value 1.
                for (r, row) in got.chunks(d).enumerate() {
                    let want = if r % 70 < 67 { 0.0 } else { 1.0 };
                    assert!(row.iter().all(|&v| v == want), "{dt} d {d} row {r}: {row:?}");
                }
                let none = Array::zeros(&[1, 1, 1, 3], DType::Bool).unwrap();
                let inf = Array::full(&[3], f64::NEG_INFINITY, DType::F32).unwrap();
                for m in [&none, &inf] {
                    let got = rill::scaled_dot_product_attention(&q, &k, &k, AttentionMask::Array(m), None).unwrap();
                    assert!(got.to_f64_vec().unwrap().iter().all(|&v| v == 0.0), "{dt} d {d}");
                }
                let empty = Array::ones(&[1, 2, 0, d], dt).unwrap();
                let got = rill::scaled_dot_product_attention(&q, &empty, &empty, AttentionMask::None, None).unwrap();
                assert!(got.to_f64_vec().unwrap().iter().all(|&v| v == 0.0), "{dt} d {d}");
            }
        }
    });
}
