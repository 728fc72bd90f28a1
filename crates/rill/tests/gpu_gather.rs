//! Gathers and copies on GPU 0 (and the same checks on the CPU) against float64
//! references computed here: `take` with every index dtype, negative and out-of-range
//! indices (the error on the take, on arrays computed from it in the same eval and in
//! later ones, on another stream; unrelated arrays of the same eval unaffected), empty
//! index arrays and every axis; `concatenate` of 1..20 inputs of odd sizes and mixed
//! views; transposed and permuted copies of odd shapes in every dtype; layer and RMS norm
//! with and without weight/bias over row lengths 1..8192+.
//!
//! Without a GPU only the CPU half runs (`RILL_REQUIRE_GPU=1` makes that a failure).

mod common;

use common::{Rng, assert_close};
use rill::{Array, DType, Device, Error, Stream};

const INDEX_DTYPES: [DType; 4] = [DType::U8, DType::U32, DType::I32, DType::I64];
/// One dtype of each element size (and the half types), so every copy width is used.
const MOVE_DTYPES: [DType; 7] = [DType::U8, DType::F16, DType::BF16, DType::I32, DType::F32, DType::I64, DType::F64];

fn devices() -> Vec<Device> {
    common::devices()
}

/// Values exactly representable in every dtype of `MOVE_DTYPES` (small integers).
fn ints(rng: &mut Rng, n: usize) -> Vec<f64> {
    (0..n).map(|_| (rng.next_u64() % 200) as f64).collect()
}

/// A random shape of rank `rank` with odd, empty and size-1 axes now and then.
fn shape(rng: &mut Rng, rank: usize) -> Vec<usize> {
    (0..rank)
        .map(|_| match rng.next_u64() % 10 {
            0 => 1,
            1 if rank > 1 => 0,
            _ => 1 + (rng.next_u64() % 9) as usize,
        })
        .collect()
}

/// Row-major strides of `shape`.
fn strides(shape: &[usize]) -> Vec<usize> {
    let mut s = vec![1; shape.len()];
    for d in (0..shape.len().saturating_sub(1)).rev() {
        s[d] = s[d + 1] * shape[d + 1];
    }
    s
}

/// `x` (row-major values of `xs`) gathered along `axis` at `idx` (already in range).
fn take_ref(x: &[f64], xs: &[usize], idx: &[i64], axis: usize) -> Vec<f64> {
    let outer: usize = xs[..axis].iter().product();
    let size = xs[axis];
    let inner: usize = xs[axis + 1..].iter().product();
    let mut out = Vec::with_capacity(outer * idx.len() * inner);
    for o in 0..outer {
        for &j in idx {
            let j = if j < 0 { j + size as i64 } else { j } as usize;
            out.extend_from_slice(&x[(o * size + j) * inner..(o * size + j + 1) * inner]);
        }
    }
    out
}

/// A view of `x` chosen by `kind`: itself, a transpose, a sliced (offset, stepped)
/// view, both; with the row-major values of the view (computed from `vals` here).
fn view_of(x: &Array, vals: &[f64], xs: &[usize], kind: u64) -> (Array, Vec<f64>, Vec<usize>) {
    let rank = xs.len();
    match kind % 3 {
        1 if rank >= 2 => {
            let mut perm: Vec<usize> = (0..rank).collect();
            perm.reverse();
            let ts: Vec<usize> = perm.iter().map(|&p| xs[p]).collect();
            let st = strides(xs);
            let n: usize = ts.iter().product();
            let mut out = Vec::with_capacity(n);
            let tst = strides(&ts);
            for i in 0..n {
                let mut off = 0;
                for d in 0..rank {
                    off += (i / tst[d] % ts[d]) * st[perm[d]];
                }
                out.push(vals[off]);
            }
            (x.transpose(&perm).unwrap(), out, ts)
        }
        2 if xs[0] >= 2 => {
            // Every other row from the second: an offset, a step.
            let rows: Vec<usize> = (1..xs[0]).step_by(2).collect();
            let inner: usize = xs[1..].iter().product();
            let out = rows.iter().flat_map(|&r| vals[r * inner..(r + 1) * inner].to_vec()).collect();
            let mut s = xs.to_vec();
            s[0] = rows.len();
            (x.slice_axis(0, Some(1), None, 2).unwrap(), out, s)
        }
        _ => (x.clone(), vals.to_vec(), xs.to_vec()),
    }
}

/// Index values for an axis of `size` (in range; negative ones for signed dtypes).
fn indices(rng: &mut Rng, n: usize, size: usize, dt: DType) -> Vec<i64> {
    let max = if dt == DType::U8 { size.min(256) } else { size };
    (0..n)
        .map(|_| {
            let j = (rng.next_u64() % max as u64) as i64;
            if matches!(dt, DType::I32 | DType::I64) && rng.next_u64().is_multiple_of(2) { j - size as i64 } else { j }
        })
        .collect()
}

fn index_array(v: &[i64], shape: &[usize], dt: DType) -> Array {
    Array::from_slice(v, shape).unwrap().astype(dt).unwrap()
}

#[test]
fn take_matches_f64_reference_on_every_axis_dtype_and_view() {
    for dev in devices() {
        let mut rng = Rng::new(11);
        for case in 0..160u64 {
            let rank = 1 + (case % 4) as usize;
            let xs = shape(&mut rng, rank);
            let dt = MOVE_DTYPES[(case % 7) as usize];
            let it = INDEX_DTYPES[(case / 7 % 4) as usize];
            let n: usize = xs.iter().product();
            let vals = ints(&mut rng, n);
            common::on(dev, || {
                let base = Array::from_slice(&vals, &xs).unwrap().astype(dt).unwrap();
                let (x, xv, vs) = view_of(&base, &vals, &xs, case / 28);
                for axis in 0..rank {
                    if vs[axis] == 0 {
                        continue; // no index is in range (the error cases are below)
                    }
                    let ishape: Vec<usize> = match rng.next_u64() % 4 {
                        0 => vec![],
                        1 => vec![0],
                        2 => vec![1 + (rng.next_u64() % 13) as usize],
                        _ => vec![2, 1 + (rng.next_u64() % 5) as usize],
                    };
                    let ni: usize = ishape.iter().product();
                    let iv = indices(&mut rng, ni, vs[axis], it);
                    let idx = index_array(&iv, &ishape, it);
                    let got = x.take(&idx, axis as isize).unwrap();
                    let mut want_shape = vs[..axis].to_vec();
                    want_shape.extend_from_slice(&ishape);
                    want_shape.extend_from_slice(&vs[axis + 1..]);
                    let what = format!("{dev:?} take {dt} {it} x{vs:?} axis {axis} idx{ishape:?} {iv:?}");
                    assert_eq!(got.shape(), &want_shape[..], "{what}");
                    let want = take_ref(&xv, &vs, &iv, axis);
                    assert_close(&got.to_f64_vec().unwrap(), &want, 0.0, &what);
                }
            });
        }
    }
}

/// The error a bad index must give.
fn is_index_err(r: rill::Result<impl Sized>, index: i64, axis: usize, size: usize, what: &str) {
    match r {
        Err(Error::Index { op: "take", index: i, axis: a, size: s }) => {
            assert_eq!((i, a, s), (index, axis, size), "{what}")
        }
        Err(e) => panic!("{what}: wrong error {e:?}"),
        Ok(_) => panic!("{what}: no error"),
    }
}

#[test]
fn out_of_range_indices_fail_the_take_and_everything_built_from_it() {
    for dev in devices() {
        let mut rng = Rng::new(12);
        for case in 0..48u64 {
            let it = INDEX_DTYPES[(case % 4) as usize];
            let size = [1usize, 5, 37][(case / 4 % 3) as usize];
            let xs = [3usize, size, 4];
            let vals = ints(&mut rng, xs.iter().product());
            let ni = 1 + (rng.next_u64() % 40) as usize;
            let mut iv = indices(&mut rng, ni, size, it);
            // Two bad positions: the first one is reported.
            let p = (rng.next_u64() % ni as u64) as usize;
            let bad = |k: u64| -> i64 {
                match (it, k % 2) {
                    (DType::I32 | DType::I64, 0) => -(size as i64) - 1 - (k % 3) as i64,
                    (DType::U8, _) => size as i64 + (k % 50) as i64,
                    _ => size as i64 + (k % 1000) as i64,
                }
            };
            iv[p] = bad(case);
            if p + 1 < ni {
                iv[ni - 1] = bad(case + 1);
            }
            let what = format!("{dev:?} {it} size {size} idx {iv:?}");
            common::on(dev, || {
                let x = Array::from_slice(&vals, &xs).unwrap();
                let other = x.mul(2.0).unwrap();
                let idx = index_array(&iv, &[ni], it);
                let t = x.take(&idx, 1).unwrap();
                let dep = t.add(1.0).unwrap().exp().unwrap().sum_all().unwrap();
                let mixed = dep.add(other.sum_all().unwrap()).unwrap();
                // One eval with many nodes: the bad ones fail, the others are computed.
                let r = rill::eval(&[other.clone(), t.clone(), dep.clone(), mixed.clone()]);
                is_index_err(r, iv[p], 1, size, &what);
                is_index_err(t.to_f64_vec(), iv[p], 1, size, &what);
                is_index_err(dep.to_f64_vec(), iv[p], 1, size, &what);
                is_index_err(mixed.to_f64_vec(), iv[p], 1, size, &what);
                let want: Vec<f64> = vals.iter().map(|v| v * 2.0).collect();
                assert_close(&other.to_f64_vec().unwrap(), &want, 0.0, &what);
                // Built after the take failed, in a later eval.
                is_index_err(t.mul(3.0).unwrap().to_f64_vec(), iv[p], 1, size, &what);
                // In the same batch as the take, never evaluated on its own.
                let t2 = x.take(&idx, 1).unwrap();
                is_index_err(t2.neg().unwrap().reshape(&[-1]).unwrap().to_f64_vec(), iv[p], 1, size, &what);
            });
        }
    }
}

#[test]
fn a_bad_take_fails_its_readers_on_another_stream() {
    for dev in devices() {
        let s1 = Stream::new(&dev).unwrap();
        let s2 = Stream::new(&dev).unwrap();
        let x = rill::with_stream(&s1, || Array::from_slice(&[1.0f32, 2.0, 3.0], &[3]).unwrap());
        let idx = rill::with_stream(&s1, || Array::from_slice(&[0i32, 3], &[2]).unwrap());
        let t = rill::with_stream(&s1, || x.take(&idx, 0).unwrap());
        t.eval().ok(); // submitted (and failed) before the reader exists
        let r = rill::with_stream(&s2, || t.add(1.0).unwrap());
        is_index_err(r.to_f64_vec(), 3, 0, 3, &format!("{dev:?}"));
        // Not yet evaluated when the reader on the other stream is built.
        let t = rill::with_stream(&s1, || x.take(&idx, 0).unwrap());
        let r = rill::with_stream(&s2, || t.sqrt().unwrap());
        is_index_err(r.to_f64_vec(), 3, 0, 3, &format!("{dev:?}"));
        // A good take on the same streams is unaffected.
        let ok = rill::with_stream(&s1, || Array::from_slice(&[2u8, 0], &[2]).unwrap());
        let t = rill::with_stream(&s1, || x.take(&ok, 0).unwrap());
        let r = rill::with_stream(&s2, || t.add(1.0).unwrap());
        assert_eq!(r.to_f64_vec().unwrap(), vec![4.0, 2.0]);
    }
}

#[test]
fn empty_and_degenerate_takes() {
    for dev in devices() {
        common::on(dev, || {
            for it in INDEX_DTYPES {
                let x = Array::from_slice(&[1.0f64, 2.0, 3.0, 4.0, 5.0, 6.0], &[2, 3]).unwrap();
                let none = index_array(&[], &[0], it);
                let t = x.take(&none, 1).unwrap();
                assert_eq!(t.shape(), &[2, 0]);
                assert!(t.to_f64_vec().unwrap().is_empty());
                // An empty x along another axis: nothing copied, the indices still checked.
                let e = Array::from_slice::<f32>(&[], &[0, 3]).unwrap();
                let good = index_array(&[2, 0], &[2], it);
                assert!(e.take(&good, 1).unwrap().to_f64_vec().unwrap().is_empty());
                let bad = index_array(&[1, 7], &[2], it);
                is_index_err(e.take(&bad, 1).unwrap().to_f64_vec(), 7, 1, 3, &format!("{dev:?} {it}"));
                // Indexing an empty axis: every index is out of range.
                let z = Array::from_slice::<f32>(&[], &[2, 0]).unwrap();
                is_index_err(z.take(&good, 1).unwrap().to_f64_vec(), 2, 1, 0, &format!("{dev:?} {it}"));
            }
        });
    }
}

#[test]
fn many_takes_in_flight() {
    // More takes than fit in one eval's batch, each with its own verdict.
    for dev in devices() {
        common::on(dev, || {
            let x = Array::from_slice(&(0..64).map(|v| v as f32).collect::<Vec<_>>(), &[64]).unwrap();
            let mut outs = Vec::new();
            for k in 0..300i64 {
                let j = if k % 7 == 3 { 64 + k } else { k % 64 - (k % 2) * 64 };
                let idx = Array::from_slice(&[j, k % 64], &[2]).unwrap();
                outs.push((k, j, x.take(&idx, 0).unwrap().add(0.5).unwrap()));
            }
            let all: Vec<Array> = outs.iter().map(|o| o.2.clone()).collect();
            assert!(rill::eval(&all).is_err());
            for (k, j, a) in &outs {
                if k % 7 == 3 {
                    is_index_err(a.to_f64_vec(), *j, 0, 64, &format!("{dev:?} take {k}"));
                } else {
                    let jj = if *j < 0 { j + 64 } else { *j };
                    assert_eq!(a.to_f64_vec().unwrap(), vec![jj as f64 + 0.5, (k % 64) as f64 + 0.5]);
                }
            }
        });
    }
}

#[test]
fn concatenate_of_1_to_20_inputs_on_every_axis_with_views() {
    for dev in devices() {
        let mut rng = Rng::new(13);
        for case in 0..120u64 {
            let rank = 1 + (case % 3) as usize;
            let axis = (case / 3 % rank as u64) as usize;
            let k = 1 + (rng.next_u64() % 20) as usize;
            let dt = MOVE_DTYPES[(case % 7) as usize];
            let base = shape(&mut rng, rank);
            common::on(dev, || {
                let mut parts = Vec::new();
                let mut refs = Vec::new();
                for j in 0..k {
                    let mut s = base.clone();
                    s[axis] = (rng.next_u64() % 6) as usize + (j % 2);
                    let n: usize = s.iter().product();
                    let vals = ints(&mut rng, n);
                    let x = Array::from_slice(&vals, &s).unwrap().astype(dt).unwrap();
                    // Now and then a view: a double transpose (same values, strided) or a
                    // contiguous input at an odd offset of a larger buffer.
                    let (x, vals, s) = match rng.next_u64() % 4 {
                        0 if rank >= 2 => {
                            let mut perm: Vec<usize> = (0..rank).collect();
                            perm.reverse();
                            let t = x.transpose(&perm).unwrap().contiguous().unwrap();
                            (t.transpose(&perm).unwrap(), vals, s)
                        }
                        1 => {
                            let mut big = s.clone();
                            big[0] += 1;
                            let bn: usize = big.iter().product();
                            let mut bv = ints(&mut rng, bn);
                            let row: usize = s[1..].iter().product();
                            bv[row..].copy_from_slice(&vals);
                            let b = Array::from_slice(&bv, &big).unwrap().astype(dt).unwrap();
                            (b.slice_axis(0, Some(1), None, 1).unwrap(), vals, s)
                        }
                        _ => (x, vals, s),
                    };
                    refs.push((vals, s));
                    parts.push(x);
                }
                let views: Vec<&Array> = parts.iter().collect();
                let got = rill::concatenate(&views, axis as isize).unwrap();
                let outer: usize = base[..axis].iter().product();
                let inner: usize = base[axis + 1..].iter().product();
                let mut want = Vec::new();
                for o in 0..outer {
                    for (v, s) in &refs {
                        let row = s[axis] * inner;
                        want.extend_from_slice(&v[o * row..(o + 1) * row]);
                    }
                }
                let what = format!("{dev:?} concatenate {dt} {k} inputs axis {axis} of {base:?}");
                assert_close(&got.to_f64_vec().unwrap(), &want, 0.0, &what);
            });
        }
    }
}

#[test]
fn transposed_and_permuted_copies_of_odd_shapes_in_every_dtype() {
    for dev in devices() {
        let mut rng = Rng::new(14);
        for case in 0..140u64 {
            let rank = 2 + (case % 3) as usize;
            let dt = MOVE_DTYPES[(case % 7) as usize];
            let xs: Vec<usize> =
                (0..rank).map(|_| [1usize, 2, 5, 31, 32, 33, 67][(rng.next_u64() % 7) as usize]).collect();
            let n: usize = xs.iter().product();
            let vals = ints(&mut rng, n);
            // A random permutation (Fisher-Yates).
            let mut perm: Vec<usize> = (0..rank).collect();
            for i in (1..rank).rev() {
                perm.swap(i, (rng.next_u64() % (i as u64 + 1)) as usize);
            }
            let ps: Vec<usize> = perm.iter().map(|&p| xs[p]).collect();
            let st = strides(&xs);
            let pst = strides(&ps);
            let want: Vec<f64> =
                (0..n).map(|i| vals[(0..rank).map(|d| (i / pst[d] % ps[d]) * st[perm[d]]).sum::<usize>()]).collect();
            common::on(dev, || {
                let x = Array::from_slice(&vals, &xs).unwrap().astype(dt).unwrap();
                let what = format!("{dev:?} {dt} {xs:?} perm {perm:?}");
                let t = x.transpose(&perm).unwrap();
                assert_close(&t.contiguous().unwrap().to_f64_vec().unwrap(), &want, 0.0, &what);
                // A reshape that cannot be a view copies.
                let flat = t.reshape(&[-1]).unwrap();
                assert_close(&flat.to_f64_vec().unwrap(), &want, 0.0, &what);
            });
        }
    }
}

// ---- scatter_add, take_along_axis, put_along_axis, scatter_add_along_axis ----

/// Every dtype: the scatters add with a different instruction for each.
const ALL_DTYPES: [DType; 9] =
    [DType::Bool, DType::U8, DType::U32, DType::I32, DType::I64, DType::F16, DType::BF16, DType::F32, DType::F64];

/// Values 0..4 (0/1 for bool): sums of up to 60 of them are exact in every dtype.
fn tiny(rng: &mut Rng, n: usize, dt: DType) -> Vec<f64> {
    let m = if dt == DType::Bool { 2 } else { 4 };
    (0..n).map(|_| (rng.next_u64() % m) as f64).collect()
}

/// `a + b` in `dt` for values that stay exact (bool: logical or).
fn plus(dt: DType, a: f64, b: f64) -> f64 {
    if dt == DType::Bool { ((a != 0.0) || (b != 0.0)) as u8 as f64 } else { a + b }
}

fn wrapped(j: i64, size: usize) -> usize {
    (if j < 0 { j + size as i64 } else { j }) as usize
}

/// `scatter_add(x, idx, upd, axis)` over row-major values: `upd` is `[outer, nidx, inner]`.
fn scatter_add_ref(x: &[f64], xs: &[usize], idx: &[i64], upd: &[f64], axis: usize, dt: DType) -> Vec<f64> {
    let (outer, size, inner) =
        (xs[..axis].iter().product::<usize>(), xs[axis], xs[axis + 1..].iter().product::<usize>());
    let mut out = x.to_vec();
    for o in 0..outer {
        for (k, &j) in idx.iter().enumerate() {
            for c in 0..inner {
                let t = (o * size + wrapped(j, size)) * inner + c;
                out[t] = plus(dt, out[t], upd[(o * idx.len() + k) * inner + c]);
            }
        }
    }
    out
}

/// The target of position `i` of an index array of shape `is` along `axis` in an array of
/// shape `xs` (equal but along `axis`), row-major.
fn along_target(xs: &[usize], is: &[usize], axis: usize, i: usize, j: i64) -> usize {
    let inner: usize = xs[axis + 1..].iter().product();
    let (c, o) = (i % inner, i / inner / is[axis]);
    (o * xs[axis] + wrapped(j, xs[axis])) * inner + c
}

#[test]
fn scatters_and_along_axis_ops_match_f64_on_every_dtype_and_view() {
    for dev in devices() {
        let mut rng = Rng::new(15);
        for case in 0..180u64 {
            let rank = 1 + (case % 3) as usize;
            let dt = ALL_DTYPES[(case % 9) as usize];
            let it = INDEX_DTYPES[(case / 9 % 4) as usize];
            let xs = shape(&mut rng, rank);
            let n: usize = xs.iter().product();
            let vals = tiny(&mut rng, n, dt);
            common::on(dev, || {
                let base = Array::from_slice(&vals, &xs).unwrap().astype(dt).unwrap();
                let (x, xv, vs) = view_of(&base, &vals, &xs, case / 36);
                for axis in 0..rank {
                    let size = vs[axis];
                    if size == 0 {
                        continue;
                    }
                    let what = format!("{dev:?} {dt} {it} x{vs:?} axis {axis}");
                    // scatter_add with up to 40 indices (many repeats), updates strided now and then.
                    let ni = (rng.next_u64() % 41) as usize;
                    let iv = indices(&mut rng, ni, size, it);
                    let idx = index_array(&iv, &[ni], it);
                    let mut us = vs[..axis].to_vec();
                    us.push(ni);
                    us.extend_from_slice(&vs[axis + 1..]);
                    let uv = tiny(&mut rng, us.iter().product(), dt);
                    let up = Array::from_slice(&uv, &us).unwrap().astype(dt).unwrap();
                    let up = if rank >= 2 && case % 2 == 0 {
                        let p: Vec<usize> = (0..rank).rev().collect();
                        up.transpose(&p).unwrap().contiguous().unwrap().transpose(&p).unwrap()
                    } else {
                        up
                    };
                    let got = x.scatter_add(&idx, &up, axis as isize).unwrap();
                    let want = scatter_add_ref(&xv, &vs, &iv, &uv, axis, dt);
                    assert_close(&got.to_f64_vec().unwrap(), &want, 0.0, &format!("scatter_add {what} {iv:?}"));
                    // The along-axis ops with up to 6 indices per row.
                    let mut is = vs.clone();
                    is[axis] = (rng.next_u64() % 7) as usize;
                    let ni: usize = is.iter().product();
                    let iv = indices(&mut rng, ni, size, it);
                    let idx = index_array(&iv, &is, it);
                    let got = x.take_along_axis(&idx, axis as isize).unwrap();
                    let want: Vec<f64> =
                        iv.iter().enumerate().map(|(i, &j)| xv[along_target(&vs, &is, axis, i, j)]).collect();
                    assert_close(&got.to_f64_vec().unwrap(), &want, 0.0, &format!("take_along_axis {what} {iv:?}"));
                    let pv = tiny(&mut rng, ni, dt);
                    let pa = Array::from_slice(&pv, &is).unwrap().astype(dt).unwrap();
                    let (mut put, mut add) = (xv.clone(), xv.clone());
                    for (i, &j) in iv.iter().enumerate() {
                        let t = along_target(&vs, &is, axis, i, j);
                        put[t] = pv[i];
                        add[t] = plus(dt, add[t], pv[i]);
                    }
                    let got = x.put_along_axis(&idx, &pa, axis as isize).unwrap();
                    assert_close(&got.to_f64_vec().unwrap(), &put, 0.0, &format!("put_along_axis {what} {iv:?}"));
                    let got = x.scatter_add_along_axis(&idx, &pa, axis as isize).unwrap();
                    assert_close(&got.to_f64_vec().unwrap(), &add, 0.0, &format!("scatter_add_along_axis {what}"));
                }
            });
        }
    }
}

/// Thousands of updates on a few rows: every atomic add lands (exact counts in every
/// dtype), float sums of random values match float64, and a put keeps the last write.
#[test]
fn scatters_with_heavy_contention() {
    for dev in devices() {
        let mut rng = Rng::new(16);
        common::on(dev, || {
            let n = 2000usize;
            // 250 updates per row of 8: within the exact integers of bf16 and u8.
            let iv: Vec<i64> = (0..n as i64).map(|k| (k * 5) % 8 - (k % 2) * 8).collect();
            let idx = Array::from_slice(&iv, &[n]).unwrap();
            for dt in ALL_DTYPES {
                let x = Array::zeros(&[8, 33], dt).unwrap();
                let ones = Array::ones(&[n, 33], dt).unwrap();
                let got = x.scatter_add(&idx, &ones, 0).unwrap().to_f64_vec().unwrap();
                let per = if dt == DType::Bool { 1.0 } else { 250.0 };
                assert_close(&got, &vec![per; 8 * 33], 0.0, &format!("{dev:?} scatter_add counts {dt}"));
                // Along the last axis: rows of 2000 indices into 8 columns.
                let x = Array::zeros(&[3, 8], dt).unwrap();
                let ia = idx.reshape(&[1, n as isize]).unwrap().broadcast_to(&[3, n]).unwrap();
                let got = x.scatter_add_along_axis(&ia, &Array::ones(&[], dt).unwrap(), 1).unwrap();
                assert_close(&got.to_f64_vec().unwrap(), &[per; 24], 0.0, &format!("{dev:?} along counts {dt}"));
            }
            for dt in [DType::F32, DType::F64] {
                let table = [7usize, 1000];
                let ni = 5000;
                let iv: Vec<i64> = (0..ni).map(|_| (rng.next_u64() % table[0] as u64) as i64).collect();
                let uv = rng.vec(ni * table[1], -1.0, 1.0);
                let (up, uv) = common::array_of(&uv, &[ni, table[1]], dt);
                let idx = Array::from_slice(&iv, &[ni]).unwrap();
                let got = Array::zeros(&table, dt).unwrap().scatter_add(&idx, &up, 0).unwrap();
                let want = scatter_add_ref(&vec![0.0; 7000], &table, &iv, &uv, 0, dt);
                let tol = if dt == DType::F32 { 1e-4 } else { 1e-12 };
                assert_close(&got.to_f64_vec().unwrap(), &want, tol, &format!("{dev:?} scatter_add sums {dt}"));
            }
            // A put of 3 x 5000 positions onto 8 columns: each keeps its last position.
            let iv: Vec<i64> = (0..15000).map(|_| (rng.next_u64() % 8) as i64).collect();
            let idx = Array::from_slice(&iv, &[3, 5000]).unwrap();
            let pos = Array::arange(0i64, 15000i64, 1i64, DType::I64).unwrap().reshape(&[3, 5000]).unwrap();
            let got = Array::full(&[3, 8], -1i64, DType::I64).unwrap().put_along_axis(&idx, &pos, 1).unwrap();
            let mut want = vec![-1.0; 24];
            for (i, &j) in iv.iter().enumerate() {
                want[(i / 5000) * 8 + j as usize] = i as f64;
            }
            assert_eq!(got.to_f64_vec().unwrap(), want, "{dev:?} put keeps the last write");
        });
    }
}

/// The error of a bad index of `op`.
fn is_index_err_of(r: rill::Result<impl Sized>, op: &str, index: i64, size: usize, what: &str) {
    match r {
        Err(Error::Index { op: o, index: i, size: s, .. }) => assert_eq!((o, i, s), (op, index, size), "{what}"),
        Err(e) => panic!("{what}: wrong error {e:?}"),
        Ok(_) => panic!("{what}: no error"),
    }
}

#[test]
fn bad_indices_fail_the_scatters_and_their_readers_only() {
    for dev in devices() {
        let mut rng = Rng::new(17);
        for case in 0..24u64 {
            let it = INDEX_DTYPES[(case % 4) as usize];
            let size = [1usize, 5, 37][(case / 4 % 3) as usize];
            let ni = 1 + (rng.next_u64() % 3000) as usize;
            let mut iv = indices(&mut rng, ni, size, it);
            let p = (rng.next_u64() % ni as u64) as usize;
            let bad = if it == DType::U8 { size as i64 + 3 } else { -(size as i64) - 1 - (case % 3) as i64 };
            iv[p] = if it.is_signed_int() || it == DType::U8 { bad } else { size as i64 + 100 };
            if p + 1 < ni {
                iv[ni - 1] = if it.is_signed_int() { size as i64 } else { size as i64 + 1 };
            }
            let what = format!("{dev:?} {it} size {size} bad {} at {p} of {ni}", iv[p]);
            common::on(dev, || {
                let x = Array::ones(&[2, size, 3], DType::F32).unwrap();
                let fine = x.mul(2.0).unwrap().sum_all().unwrap();
                let idx = index_array(&iv, &[ni], it);
                let s = x.scatter_add(&idx, &Array::ones(&[2, ni, 3], DType::F32).unwrap(), 1).unwrap();
                let ia = idx.reshape(&[1, ni as isize, 1]).unwrap().broadcast_to(&[2, ni, 3]).unwrap();
                let t = x.take_along_axis(&ia, 1).unwrap();
                let u = x.put_along_axis(&ia, &Array::zeros(&[], DType::F32).unwrap(), 1).unwrap();
                let a = x.scatter_add_along_axis(&ia, &Array::ones(&[], DType::F32).unwrap(), 1).unwrap();
                let readers: Vec<Array> =
                    [&s, &t, &u, &a].iter().map(|r| r.exp().unwrap().sum_all().unwrap()).collect();
                let mut all = vec![fine.clone(), s.clone(), t.clone(), u.clone(), a.clone()];
                all.extend(readers.iter().cloned());
                assert!(rill::eval(&all).is_err());
                let ops = ["scatter_add", "take_along_axis", "put_along_axis", "scatter_add_along_axis"];
                for ((arr, reader), op) in [&s, &t, &u, &a].iter().zip(&readers).zip(ops) {
                    is_index_err_of(arr.to_f64_vec(), op, iv[p], size, &what);
                    is_index_err_of(reader.to_f64_vec(), op, iv[p], size, &what);
                }
                assert_eq!(fine.to_f64_vec().unwrap(), vec![12.0 * size as f64], "{what}");
            });
        }
    }
}

/// The gradient of an embedding lookup (`take` of rows with repeated ids) is the sum of
/// each row's cotangents: a scatter-add, linear in the ids, on every device.
#[test]
fn embedding_gradient_scatters_repeated_rows() {
    for dev in devices() {
        let mut rng = Rng::new(18);
        let (vocab, dim, ni) = (3000usize, 64usize, 4096usize);
        let ids: Vec<i64> =
            (0..ni).map(|_| (rng.next_u64() % 50) as i64 * 7 - (rng.next_u64() % 2) as i64 * 5).collect();
        let w = rng.vec(ni * dim, -1.0, 1.0);
        let tv = rng.vec(vocab * dim, -1.0, 1.0);
        let mut want = vec![0.0; vocab * dim];
        for (k, &j) in ids.iter().enumerate() {
            let r = wrapped(j, vocab);
            for c in 0..dim {
                want[r * dim + c] += w[k * dim + c];
            }
        }
        common::on(dev, || {
            let (table, _) = common::array_of(&tv, &[vocab, dim], DType::F32);
            let (wa, _) = common::array_of(&w, &[ni, dim], DType::F32);
            let idx = Array::from_slice(&ids, &[ni]).unwrap();
            let f = move |x: &[Array]| Ok(vec![x[0].take(&idx, 0)?.mul(&wa)?.sum_all()?]);
            let g = rill::grad(f, &[0]).call(&[table]).unwrap();
            assert_close(&g[0].to_f64_vec().unwrap(), &want, 1e-4, &format!("{dev:?} embedding gradient"));
        });
    }
}

/// Takes along the last axis with thousands of indices (several chunks of the column
/// gather, few and many rows, negative indices, every element size) against the float64
/// reference, and a bad index late in a later chunk: the first bad position is reported.
#[test]
fn column_takes_of_many_indices_match_and_report_the_first_bad_one() {
    for dev in devices() {
        let mut rng = Rng::new(13);
        for (case, (outer, size, ni)) in
            [(1usize, 7usize, 9000usize), (3, 4096, 4096), (700, 33, 5000), (2, 70_000, 12_289), (64, 1, 100)]
                .into_iter()
                .enumerate()
        {
            let dt = MOVE_DTYPES[case % MOVE_DTYPES.len()];
            let it = INDEX_DTYPES[case % INDEX_DTYPES.len()];
            let it = if it == DType::U8 && size > 256 { DType::I64 } else { it };
            let vals = ints(&mut rng, outer * size);
            let iv = indices(&mut rng, ni, size, it);
            let what = format!("{dev:?} {dt} {it} x[{outer}, {size}] {ni} indices");
            common::on(dev, || {
                let x = Array::from_slice(&vals, &[outer, size]).unwrap().astype(dt).unwrap();
                let got = x.take(&index_array(&iv, &[ni], it), 1).unwrap();
                assert_eq!(got.shape(), &[outer, ni], "{what}");
                let want = take_ref(&vals, &[outer, size], &iv, 1);
                assert_close(&got.to_f64_vec().unwrap(), &want, 0.0, &what);
                // Two bad positions past the first chunk: the earlier one is reported.
                if ni > 5000 && (it != DType::U8 || size + 9 < 256) {
                    let mut bad = iv.clone();
                    let (p, q) = (ni - 1 - (rng.next_u64() % 700) as usize, ni - 1);
                    bad[p] = size as i64 + 3;
                    if q != p {
                        bad[q] = size as i64 + 9;
                    }
                    let t = x.take(&index_array(&bad, &[ni], it), 1).unwrap();
                    is_index_err(t.to_f64_vec(), size as i64 + 3, 1, size, &what);
                }
            });
        }
    }
}
