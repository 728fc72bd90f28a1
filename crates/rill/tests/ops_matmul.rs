//! matmul against float64 references.

mod common;

use common::{Rng, array_of, assert_close, devices, on, tol};
use rill::{Array, DType};

/// Reference `[.., M, K] @ [.., K, N]` with NumPy broadcasting and 1-D promotion.
fn ref_matmul(a: &[f64], sa: &[usize], b: &[f64], sb: &[usize]) -> (Vec<f64>, Vec<usize>) {
    let a_sh: Vec<usize> = if sa.len() == 1 { vec![1, sa[0]] } else { sa.to_vec() };
    let b_sh: Vec<usize> = if sb.len() == 1 { vec![sb[0], 1] } else { sb.to_vec() };
    let (na, nb) = (a_sh.len(), b_sh.len());
    let (m, k, n) = (a_sh[na - 2], a_sh[na - 1], b_sh[nb - 1]);
    let nbatch = (na - 2).max(nb - 2);
    let pad = |s: &[usize]| {
        let mut v = vec![1; nbatch - (s.len() - 2)];
        v.extend_from_slice(&s[..s.len() - 2]);
        v
    };
    let (ba, bb) = (pad(&a_sh), pad(&b_sh));
    let batch: Vec<usize> = ba.iter().zip(&bb).map(|(&x, &y)| if x == 1 { y } else { x }).collect();
    let count: usize = batch.iter().product();
    let mut out = Vec::with_capacity(count * m * n);
    for bi in 0..count {
        let (mut r, mut ia, mut ib) = (bi, 0, 0);
        let (mut sa_, mut sb_) = (1, 1);
        for i in (0..nbatch).rev() {
            let idx = r % batch[i];
            r /= batch[i];
            ia += if ba[i] == 1 { 0 } else { idx * sa_ };
            ib += if bb[i] == 1 { 0 } else { idx * sb_ };
            sa_ *= ba[i];
            sb_ *= bb[i];
        }
        for i in 0..m {
            for j in 0..n {
                let mut s = 0.0;
                for p in 0..k {
                    s += a[ia * m * k + i * k + p] * b[ib * k * n + p * n + j];
                }
                out.push(s);
            }
        }
    }
    let mut shape = batch;
    if sa.len() > 1 {
        shape.push(m);
    }
    if sb.len() > 1 {
        shape.push(n);
    }
    (out, shape)
}

const CASES: &[(&[usize], &[usize])] = &[
    (&[3, 4], &[4, 5]),
    (&[1, 1], &[1, 1]),
    (&[4], &[4, 3]),
    (&[2, 4], &[4]),
    (&[6], &[6]),
    (&[2, 3, 4], &[2, 4, 5]),
    (&[2, 1, 3, 4], &[5, 4, 2]),
    (&[3, 4], &[2, 4, 5]),
    (&[7], &[3, 7, 2]),
    (&[3, 2, 5], &[5]),
    (&[0, 4], &[4, 3]),
    (&[3, 0], &[0, 5]),
    (&[3, 4], &[4, 0]),
    (&[0, 2, 3], &[3, 4]),
    (&[2, 0], &[0]),
    (&[33, 70], &[70, 65]),
    (&[130, 200], &[200, 90]),
    // A batch sharing one right matrix (the GPU folds the batch into M), odd sizes.
    (&[2, 3, 4], &[4, 5]),
    (&[3, 2, 17, 9], &[9, 13]),
    (&[2, 3, 33, 70], &[1, 3, 70, 65]),
    (&[4, 1, 7], &[7, 1]),
];

#[test]
fn matmul_matches_reference_for_every_dtype() {
    for dev in devices() {
        on(dev, || {
            let mut rng = Rng::new(20);
            let dtypes =
                [DType::F32, DType::F64, DType::F16, DType::BF16, DType::I32, DType::I64, DType::U8, DType::U32];
            for &(sa, sb) in CASES {
                let (na, nb) = (sa.iter().product::<usize>(), sb.iter().product::<usize>());
                for dt in dtypes {
                    let make = |rng: &mut Rng, n| -> Vec<f64> {
                        if dt.is_float() {
                            rng.vec(n, -1.0, 1.0)
                        } else if dt == DType::U8 || dt == DType::U32 {
                            rng.vec(n, 0.0, 4.0).iter().map(|v| v.floor()).collect()
                        } else {
                            rng.vec(n, -3.0, 4.0).iter().map(|v| v.floor()).collect()
                        }
                    };
                    if dt == DType::U8 && sa.iter().any(|&d| d > 10) {
                        continue; // u8 products of long rows overflow (wrapping) by design
                    }
                    let (a, av) = array_of(&make(&mut rng, na), sa, dt);
                    let (b, bv) = array_of(&make(&mut rng, nb), sb, dt);
                    let c = a.matmul(&b).unwrap();
                    let (want, shape) = ref_matmul(&av, sa, &bv, sb);
                    let what = format!("{dt} {sa:?} @ {sb:?}");
                    assert_eq!((c.shape(), c.dtype()), (shape.as_slice(), dt), "{what}");
                    let k = if sa.len() == 1 { sa[0] } else { sa[sa.len() - 1] };
                    let t = tol(dt) * (k as f64).sqrt().max(1.0);
                    assert_close(&c.to_f64_vec().unwrap(), &want, t, &what);
                }
            }
        });
    }
}

#[test]
fn matmul_promotes_and_handles_bool() {
    for dev in devices() {
        on(dev, || {
            let mut rng = Rng::new(21);
            let (a, av) =
                array_of(&rng.vec(6, -3.0, 3.0).iter().map(|v| v.floor()).collect::<Vec<_>>(), &[2, 3], DType::I32);
            let (b, bv) = array_of(&rng.vec(12, -1.0, 1.0), &[3, 4], DType::F32);
            let c = a.matmul(&b).unwrap();
            assert_eq!(c.dtype(), DType::F32);
            let (want, _) = ref_matmul(&av, &[2, 3], &bv, &[3, 4]);
            assert_close(&c.to_f64_vec().unwrap(), &want, tol(DType::F32), "i32 @ f32");
            let (h, hv) = array_of(&rng.vec(12, -1.0, 1.0), &[3, 4], DType::F16);
            let (g, gv) = array_of(&rng.vec(12, -1.0, 1.0), &[4, 3], DType::BF16);
            let c = h.matmul(&g).unwrap();
            assert_eq!(c.dtype(), DType::F32);
            let (want, _) = ref_matmul(&hv, &[3, 4], &gv, &[4, 3]);
            assert_close(&c.to_f64_vec().unwrap(), &want, tol(DType::F32), "f16 @ bf16");
            let p = Array::from_bools(&[true, false, true, true, true, false], &[2, 3]).unwrap();
            let q = Array::from_bools(&[true, true, false, true, true, true], &[3, 2]).unwrap();
            let c = p.matmul(&q).unwrap();
            assert_eq!(c.dtype(), DType::I32);
            let pv = p.to_f64_vec().unwrap();
            let qv = q.to_f64_vec().unwrap();
            let (want, _) = ref_matmul(&pv, &[2, 3], &qv, &[3, 2]);
            assert_close(&c.to_f64_vec().unwrap(), &want, 0.0, "bool @ bool");
            // k = 0 gives zeros.
            let z = Array::zeros(&[3, 0], DType::F32).unwrap().matmul(&Array::zeros(&[0, 2], DType::F32).unwrap());
            assert_eq!(z.unwrap().to_vec::<f32>().unwrap(), vec![0.0; 6]);
        });
    }
}

#[test]
fn matmul_errors_name_shapes() {
    for dev in devices() {
        on(dev, || {
            let a = Array::zeros(&[2, 3], DType::F32).unwrap();
            let b = Array::zeros(&[4, 5], DType::F32).unwrap();
            let e = a.matmul(&b).unwrap_err().to_string();
            assert!(e.contains("[2, 3]") && e.contains("[4, 5]"), "{e}");
            let v = Array::zeros(&[4], DType::F32).unwrap();
            let e = a.matmul(&v).unwrap_err().to_string();
            assert!(e.contains("[2, 3]") && e.contains("[4]"), "{e}");
            let s = Array::scalar(1.0f32).unwrap();
            let e = s.matmul(&a).unwrap_err().to_string();
            assert!(e.contains("[]") && e.contains("[2, 3]"), "{e}");
            let x = Array::zeros(&[2, 2, 3], DType::F32).unwrap();
            let y = Array::zeros(&[3, 3, 4], DType::F32).unwrap();
            let e = x.matmul(&y).unwrap_err().to_string();
            assert!(e.contains("[2, 2, 3]") && e.contains("[3, 3, 4]"), "{e}");
        });
    }
}

/// Operands that are contiguous views starting 0-3 elements into their buffer: on a GPU the
/// library kernels are chosen for the alignment of each operand's address, so one shape at
/// several alignments (aligned again last, after the misaligned ones) must give the
/// reference every time, for one product and a batch.
#[test]
fn matmul_of_views_at_every_alignment() {
    for dev in devices() {
        on(dev, || {
            let mut rng = Rng::new(21);
            for dt in [DType::F32, DType::F64, DType::F16, DType::BF16] {
                for batch in [1usize, 3] {
                    let (m, k, n) = (24, 40, 16);
                    let (na, nb) = (batch * m * k, batch * k * n);
                    let (abig, av) = array_of(&rng.vec(na + 3, -1.0, 1.0), &[na + 3], dt);
                    let (bbig, bv) = array_of(&rng.vec(nb + 3, -1.0, 1.0), &[nb + 3], dt);
                    for (oa, ob) in [(0, 0), (1, 0), (0, 1), (2, 3), (3, 2), (1, 1), (0, 0)] {
                        let view = |x: &Array, off: usize, len: usize, shape: &[isize]| {
                            x.slice_axis(0, Some(off as isize), Some((off + len) as isize), 1)
                                .and_then(|v| v.reshape(shape))
                                .unwrap()
                        };
                        let (bi, mi, ki, ni) = (batch as isize, m as isize, k as isize, n as isize);
                        let a = view(&abig, oa, na, &[bi, mi, ki]);
                        let b = view(&bbig, ob, nb, &[bi, ki, ni]);
                        let c = a.matmul(&b).unwrap();
                        let sa = [batch, m, k];
                        let sb = [batch, k, n];
                        let (want, shape) = ref_matmul(&av[oa..oa + na], &sa, &bv[ob..ob + nb], &sb);
                        let what = format!("{dt} batch {batch} offsets ({oa}, {ob})");
                        assert_eq!(c.shape(), shape.as_slice(), "{what}");
                        assert_close(&c.to_f64_vec().unwrap(), &want, tol(dt) * (k as f64).sqrt(), &what);
                    }
                }
            }
        });
    }
}

/// Half-precision products accumulate in f32 and round once: a long row of f16 values
/// whose partial sums pass 2048 (where f16's spacing is 2) stays within the output's
/// rounding of the float64 result.
#[test]
fn half_precision_products_accumulate_in_f32() {
    for dev in devices() {
        on(dev, || {
            for dt in [DType::F16, DType::BF16] {
                let (m, k, n) = (3, 4096, 2);
                let mut rng = Rng::new(31);
                // Values near 1 with low bits set, exact in both dtypes.
                let (a, av) = array_of(
                    &rng.vec(m * k, 0.5, 1.5).iter().map(|v| (v * 64.0).round() / 64.0).collect::<Vec<_>>(),
                    &[m, k],
                    dt,
                );
                let (b, bv) = array_of(
                    &rng.vec(k * n, 0.5, 1.5).iter().map(|v| (v * 64.0).round() / 64.0).collect::<Vec<_>>(),
                    &[k, n],
                    dt,
                );
                let (want, _) = ref_matmul(&av, &[m, k], &bv, &[k, n]);
                let got = a.matmul(&b).unwrap().to_f64_vec().unwrap();
                // One rounding of the result: half a unit in the last place, relative.
                let ulp = if dt == DType::F16 { 2f64.powi(-10) } else { 2f64.powi(-7) };
                for (g, w) in got.iter().zip(&want) {
                    assert!((g - w).abs() <= ulp * w.abs(), "{dt} on {dev}: got {g}, want {w}");
                }
            }
        });
    }
}

/// An operand of logical shape `shape` laid out as view `kind` over a random buffer: 0
/// contiguous; 1 the last two axes transposed; 2 rows sliced from wider rows (from
/// element 0 or 1); 3 a transposed view of sliced rows; 4 the last batch axis between the
/// rows and the columns in memory (heads split from a `[.., T, H, D]` array); 5 every
/// other matrix of a batch twice as long. Returns the view and its values, row-major.
fn operand(rng: &mut Rng, shape: &[usize], dt: DType, kind: usize) -> (Array, Vec<f64>) {
    let nd = shape.len();
    let (r, c) = (shape[nd - 2], shape[nd - 1]);
    let batch = &shape[..nd - 2];
    let base = |rng: &mut Rng, s: &[usize]| array_of(&rng.vec(s.iter().product(), -1.0, 1.0), s, dt).0;
    let with = |tail: &[usize]| [batch, tail].concat();
    let cols = |x: Array, start: usize, len: usize| {
        x.slice_axis(-1, Some(start as isize), Some((start + len) as isize), 1).unwrap()
    };
    let x = match kind {
        1 => base(rng, &with(&[c, r])).swapaxes(-1, -2).unwrap(),
        2 => {
            let start = (rng.next_u64() % 2) as usize;
            cols(base(rng, &with(&[r, c + 1 + start])), start, c)
        }
        3 => {
            let start = (rng.next_u64() % 2) as usize;
            cols(base(rng, &with(&[c, r + 3])), start, r).swapaxes(-1, -2).unwrap()
        }
        4 if !batch.is_empty() => {
            let b = batch.len();
            let s = [&batch[..b - 1], &[r, batch[b - 1], c]].concat();
            base(rng, &s).swapaxes(b as isize - 1, b as isize).unwrap()
        }
        5 if !batch.is_empty() => {
            let mut s = shape.to_vec();
            s[0] *= 2;
            base(rng, &s).slice_axis(0, None, None, 2).unwrap()
        }
        _ => base(rng, shape),
    };
    assert_eq!(x.shape(), shape);
    let v = x.to_f64_vec().unwrap();
    (x, v)
}

/// Generated products whose operands are views (transposed, sliced rows, split heads,
/// stepped batches) of every float dtype, with broadcast batch axes and dimensions of 1:
/// a GPU reads most of them in place through cuBLAS's transpose flags, leading
/// dimensions and batch strides, and copies the rest; either way the result is the
/// reference's.
#[test]
fn matmul_of_transposed_sliced_and_batched_views() {
    for dev in devices() {
        on(dev, || {
            let mut rng = Rng::new(22);
            let pick = |rng: &mut Rng, options: &[usize]| options[(rng.next_u64() % options.len() as u64) as usize];
            for case in 0..60 {
                let nb = pick(&mut rng, &[0, 1, 1, 2]);
                let batch: Vec<usize> = (0..nb).map(|_| pick(&mut rng, &[1, 2, 3, 4])).collect();
                let dims = [1usize, 2, 7, 16, 33, 64, 65];
                let (m, k, n) = (pick(&mut rng, &dims), pick(&mut rng, &dims), pick(&mut rng, &dims));
                // Each batch axis is full or broadcast (1) in each operand.
                let one = |rng: &mut Rng| -> Vec<usize> {
                    batch.iter().map(|&d| if rng.next_u64().is_multiple_of(4) { 1 } else { d }).collect()
                };
                let (ba, bb) = (one(&mut rng), one(&mut rng));
                let sa = [ba.as_slice(), &[m, k]].concat();
                let sb = [bb.as_slice(), &[k, n]].concat();
                for dt in [DType::F32, DType::F64, DType::F16, DType::BF16] {
                    let (ka, kb) = (pick(&mut rng, &[0, 1, 2, 3, 4, 5]), pick(&mut rng, &[0, 1, 2, 3, 4, 5]));
                    let (a, av) = operand(&mut rng, &sa, dt, ka);
                    let (b, bv) = operand(&mut rng, &sb, dt, kb);
                    let (want, shape) = ref_matmul(&av, &sa, &bv, &sb);
                    let what = format!("case {case}: {dt} {sa:?} (view {ka}) @ {sb:?} (view {kb})");
                    let c = a.matmul(&b).unwrap();
                    assert_eq!(c.shape(), shape.as_slice(), "{what}");
                    assert_close(&c.to_f64_vec().unwrap(), &want, tol(dt) * (k as f64).sqrt(), &what);
                }
            }
        });
    }
}
