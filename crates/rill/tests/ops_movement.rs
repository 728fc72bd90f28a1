//! Movement ops against a float64 reference written with plain multi-index loops.

mod common;

use common::{Rng, array_of, devices, on};
use rill::{Array, DType, SliceArg, concatenate, stack};

const DTYPES: [DType; 9] =
    [DType::F32, DType::F64, DType::F16, DType::BF16, DType::I32, DType::I64, DType::U32, DType::U8, DType::Bool];

/// A row-major float64 reference array.
#[derive(Clone, Debug)]
struct Nd {
    shape: Vec<usize>,
    data: Vec<f64>,
}

/// Every multi-index of `shape` in row-major order.
fn indices(shape: &[usize]) -> Vec<Vec<usize>> {
    let n: usize = shape.iter().product();
    let mut out = Vec::with_capacity(n);
    for mut flat in 0..n {
        let mut idx = vec![0; shape.len()];
        for k in (0..shape.len()).rev() {
            idx[k] = flat % shape[k];
            flat /= shape[k];
        }
        out.push(idx);
    }
    out
}

impl Nd {
    fn get(&self, idx: &[usize]) -> f64 {
        let mut flat = 0;
        for (k, &i) in idx.iter().enumerate() {
            assert!(i < self.shape[k]);
            flat = flat * self.shape[k] + i;
        }
        self.data[flat]
    }
    fn from_fn(shape: &[usize], f: impl Fn(&[usize]) -> f64) -> Nd {
        Nd { shape: shape.to_vec(), data: indices(shape).iter().map(|i| f(i)).collect() }
    }
    fn transpose(&self, perm: &[usize]) -> Nd {
        let shape: Vec<usize> = perm.iter().map(|&p| self.shape[p]).collect();
        Nd::from_fn(&shape, |i| {
            let mut src = vec![0; perm.len()];
            for (k, &p) in perm.iter().enumerate() {
                src[p] = i[k];
            }
            self.get(&src)
        })
    }
    fn broadcast(&self, shape: &[usize]) -> Nd {
        let off = shape.len() - self.shape.len();
        Nd::from_fn(shape, |i| {
            let src: Vec<usize> =
                (0..self.shape.len()).map(|k| if self.shape[k] == 1 { 0 } else { i[off + k] }).collect();
            self.get(&src)
        })
    }
    /// Picks `lists[k]` on axis k.
    fn select(&self, lists: &[Vec<usize>]) -> Nd {
        let shape: Vec<usize> = lists.iter().map(|l| l.len()).collect();
        Nd::from_fn(&shape, |i| self.get(&i.iter().enumerate().map(|(k, &j)| lists[k][j]).collect::<Vec<_>>()))
    }
}

/// The indices NumPy's `start:stop:step` takes from an axis of size `n`, by walking.
fn slice_indices(n: usize, a: SliceArg) -> Vec<usize> {
    let n = n as isize;
    let wrap = |v: isize| if v < 0 { v + n } else { v };
    let mut out = Vec::new();
    if a.step > 0 {
        let (mut i, e) = (a.start.map_or(0, wrap).max(0), a.stop.map_or(n, wrap).min(n));
        while i < e {
            out.push(i as usize);
            i += a.step;
        }
    } else {
        let (mut i, e) = (a.start.map_or(n - 1, wrap).min(n - 1), a.stop.map_or(-1, wrap).max(-1));
        while i > e {
            out.push(i as usize);
            i += a.step;
        }
    }
    out
}

/// Small integer values, exact in every dtype (0/1 for bool).
fn values(rng: &mut Rng, n: usize, dtype: DType) -> Vec<f64> {
    let m = if dtype == DType::Bool { 2.0 } else { 60.0 };
    (0..n).map(|_| rng.uniform(0.0, m).floor()).collect()
}

fn input(rng: &mut Rng, shape: &[usize], dtype: DType) -> (Array, Nd) {
    let n = shape.iter().product();
    let (a, exact) = array_of(&values(rng, n, dtype), shape, dtype);
    (a, Nd { shape: shape.to_vec(), data: exact })
}

/// The same logical array built three ways: contiguous, as a transpose, and as a reversed
/// slice (the last two are strided views).
fn variants(rng: &mut Rng, shape: &[usize], dtype: DType) -> Vec<(&'static str, Array, Nd)> {
    let mut v = Vec::new();
    let (a, r) = input(rng, shape, dtype);
    v.push(("contiguous", a, r));
    let rev: Vec<usize> = shape.iter().rev().copied().collect();
    let (a, r) = input(rng, &rev, dtype);
    v.push(("transposed", a.t().unwrap(), r.transpose(&(0..shape.len()).rev().collect::<Vec<_>>())));
    if !shape.is_empty() {
        let (a, r) = input(rng, shape, dtype);
        let lists: Vec<Vec<usize>> = shape
            .iter()
            .enumerate()
            .map(|(k, &d)| if k == 0 { (0..d).rev().collect() } else { (0..d).collect() })
            .collect();
        v.push(("reversed", a.slice(&[SliceArg::reversed()]).unwrap(), r.select(&lists)));
    }
    v
}

fn check(got: &Array, want: &Nd, what: &str) {
    assert_eq!(got.shape(), &want.shape[..], "{what}: shape");
    assert_eq!(got.to_f64_vec().unwrap(), want.data, "{what}");
}

const SHAPES: [&[usize]; 6] = [&[], &[5], &[3, 4], &[2, 3, 4], &[2, 0, 3], &[1, 3, 1]];

#[test]
fn reshape_flatten_expand_squeeze() {
    let mut rng = Rng::new(1);
    for dev in devices() {
        on(dev, || {
            for dtype in DTYPES {
                for shape in SHAPES {
                    for (how, a, r) in variants(&mut rng, shape, dtype) {
                        let what = format!("{dtype} {shape:?} {how}");
                        let flat = Nd { shape: vec![r.data.len()], data: r.data.clone() };
                        check(&a.flatten().unwrap(), &flat, &format!("flatten {what}"));
                        let n = r.data.len() as isize;
                        let back: Vec<isize> = shape.iter().map(|&d| d as isize).collect();
                        check(&a.reshape(&[-1]).unwrap().reshape(&back).unwrap(), &r, &format!("reshape {what}"));
                        if n % 2 == 0 && n > 0 {
                            let want = Nd { shape: vec![2, n as usize / 2], data: r.data.clone() };
                            check(&a.reshape(&[2, -1]).unwrap(), &want, &format!("reshape [2, -1] {what}"));
                        }
                        for ax in [0isize, -1] {
                            let e = a.expand_dims(ax).unwrap();
                            let mut s = shape.to_vec();
                            s.insert(if ax == 0 { 0 } else { shape.len() }, 1);
                            check(&e, &Nd { shape: s, data: r.data.clone() }, &format!("expand_dims {ax} {what}"));
                            check(&e.squeeze(&[ax]).unwrap(), &r, &format!("squeeze {what}"));
                        }
                        let s: Vec<usize> = shape.iter().copied().filter(|&d| d != 1).collect();
                        check(
                            &a.squeeze(&[]).unwrap(),
                            &Nd { shape: s, data: r.data.clone() },
                            &format!("squeeze all {what}"),
                        );
                    }
                }
            }
        });
    }
}

#[test]
fn transpose_swapaxes_t() {
    let mut rng = Rng::new(2);
    let perms: [&[usize]; 6] = [&[0, 1, 2], &[0, 2, 1], &[1, 0, 2], &[1, 2, 0], &[2, 0, 1], &[2, 1, 0]];
    for dev in devices() {
        on(dev, || {
            for dtype in DTYPES {
                for shape in [&[2usize, 3, 4][..], &[3, 0, 2], &[1, 5, 2]] {
                    for (how, a, r) in variants(&mut rng, shape, dtype) {
                        for perm in perms {
                            let what = format!("{dtype} {shape:?} {how} {perm:?}");
                            let t = a.transpose(perm).unwrap();
                            check(&t, &r.transpose(perm), &what);
                            // A copy of the transposed view (through a reshape) is row-major.
                            check(
                                &t.reshape(&[-1]).unwrap(),
                                &Nd { shape: vec![r.data.len()], data: r.transpose(perm).data },
                                &what,
                            );
                            // `contiguous` copies it, and the copy reads back the same.
                            let c = t.contiguous().unwrap();
                            check(&c, &r.transpose(perm), &format!("contiguous {what}"));
                        }
                        check(&a.t().unwrap(), &r.transpose(&[2, 1, 0]), "t");
                        check(&a.swapaxes(0, -1).unwrap(), &r.transpose(&[2, 1, 0]), "swapaxes");
                        check(&a.swapaxes(1, 1).unwrap(), &r, "swapaxes same");
                    }
                }
                let (s, r) = input(&mut rng, &[], dtype);
                check(&s.t().unwrap(), &r, "0-d t");
            }
        });
    }
}

#[test]
fn broadcast_to_views() {
    let mut rng = Rng::new(3);
    let cases: [(&[usize], &[usize]); 6] =
        [(&[], &[2, 3]), (&[3], &[4, 3]), (&[2, 1], &[2, 5]), (&[1, 3], &[2, 4, 3]), (&[1], &[0]), (&[2, 3], &[2, 3])];
    for dev in devices() {
        on(dev, || {
            for dtype in DTYPES {
                for (from, to) in cases {
                    for (how, a, r) in variants(&mut rng, from, dtype) {
                        let b = a.broadcast_to(to).unwrap();
                        check(&b, &r.broadcast(to), &format!("{dtype} {from:?}->{to:?} {how}"));
                        // A broadcast view fed into a copy.
                        let flat = b.reshape(&[-1]).unwrap();
                        assert_eq!(flat.to_f64_vec().unwrap(), r.broadcast(to).data);
                    }
                }
            }
        });
    }
}

fn random_arg(rng: &mut Rng, n: usize) -> SliceArg {
    let n = n as f64;
    let bound = |rng: &mut Rng| {
        if rng.uniform(0.0, 1.0) < 0.25 { None } else { Some(rng.uniform(-n - 3.0, n + 3.0).floor() as isize) }
    };
    let (start, stop) = (bound(rng), bound(rng));
    let mut step = rng.uniform(1.0, 4.0).floor() as isize;
    if rng.uniform(0.0, 1.0) < 0.5 {
        step = -step;
    }
    SliceArg::new(start, stop, step)
}

#[test]
fn slices_with_steps() {
    let mut rng = Rng::new(4);
    for dev in devices() {
        on(dev, || {
            for dtype in DTYPES {
                for shape in [&[7usize][..], &[5, 6], &[3, 4, 5], &[0, 3], &[1]] {
                    for (how, a, r) in variants(&mut rng, shape, dtype) {
                        for _ in 0..6 {
                            let args: Vec<SliceArg> = shape.iter().map(|&d| random_arg(&mut rng, d)).collect();
                            let lists: Vec<Vec<usize>> =
                                shape.iter().zip(&args).map(|(&d, &a)| slice_indices(d, a)).collect();
                            let want = r.select(&lists);
                            let what = format!("{dtype} {shape:?} {how} {args:?}");
                            let s = a.slice(&args).unwrap();
                            check(&s, &want, &what);
                            // A slice fed into a copy op, and a slice of a slice.
                            check(
                                &s.reshape(&[-1]).unwrap(),
                                &Nd { shape: vec![want.data.len()], data: want.data.clone() },
                                &what,
                            );
                            let again = s.slice(&[SliceArg::reversed()]).unwrap();
                            let mut l2 = lists.clone();
                            l2[0].reverse();
                            check(&again, &r.select(&l2), &format!("reversed {what}"));
                        }
                    }
                }
            }
        });
    }
}

#[test]
fn slice_axis_index_and_ranges() {
    let mut rng = Rng::new(5);
    for dev in devices() {
        on(dev, || {
            for dtype in DTYPES {
                for (how, a, r) in variants(&mut rng, &[4, 5], dtype) {
                    let what = format!("{dtype} {how}");
                    let s = a.slice_axis(-1, Some(-1), None, -2).unwrap();
                    check(&s, &r.select(&[vec![0, 1, 2, 3], vec![4, 2, 0]]), &what);
                    let s = a.slice(&[(1..3).into(), (..).into()]).unwrap();
                    check(&s, &r.select(&[vec![1, 2], (0..5).collect()]), &what);
                    let s = a.slice(&[(2..).into(), SliceArg::from(..-2).step_by(2)]).unwrap();
                    check(&s, &r.select(&[vec![2, 3], vec![0, 2]]), &what);
                    for i in [0isize, 2, -1, -4] {
                        let row = a.index(0, i).unwrap();
                        let k = if i < 0 { (i + 4) as usize } else { i as usize };
                        check(&row, &Nd::from_fn(&[5], |j| r.get(&[k, j[0]])), &format!("index {i} {what}"));
                        let col = a.index(1, i).unwrap();
                        let k = if i < 0 { (i + 5) as usize } else { i as usize };
                        check(&col, &Nd::from_fn(&[4], |j| r.get(&[j[0], k])), &format!("col {i} {what}"));
                    }
                    let e = a.index(0, 0).unwrap().index(0, 3).unwrap();
                    assert_eq!(e.shape(), &[] as &[usize]);
                    assert_eq!(e.item_f64().unwrap(), r.get(&[0, 3]));
                }
            }
        });
    }
}

#[test]
fn chained_views() {
    let mut rng = Rng::new(6);
    for dev in devices() {
        on(dev, || {
            for dtype in DTYPES {
                let (a, r) = input(&mut rng, &[3, 1, 4], dtype);
                // slice of transpose of broadcast
                let b = a.broadcast_to(&[2, 3, 5, 4]).unwrap();
                let t = b.transpose(&[3, 1, 0, 2]).unwrap();
                let args = [
                    SliceArg::new(None, None, -1),
                    SliceArg::range(1, 3),
                    SliceArg::full(),
                    SliceArg::new(Some(4), Some(0), -2),
                ];
                let s = t.slice(&args).unwrap();
                let rt = r.broadcast(&[2, 3, 5, 4]).transpose(&[3, 1, 0, 2]);
                let lists: Vec<Vec<usize>> = rt.shape.iter().zip(&args).map(|(&d, &a)| slice_indices(d, a)).collect();
                let want = rt.select(&lists);
                check(&s, &want, &format!("chain {dtype}"));
                // ... then reshape (a copy: not re-stridable), expand, swap and squeeze.
                let v =
                    s.reshape(&[-1]).unwrap().expand_dims(0).unwrap().swapaxes(0, 1).unwrap().squeeze(&[1]).unwrap();
                assert_eq!(v.to_f64_vec().unwrap(), want.data, "chain copy {dtype}");
            }
        });
    }
}

/// `x.take(idx, axis)` by multi-index loops; `idx` values already wrapped.
fn take_ref(x: &Nd, idx: &Nd, axis: usize) -> Nd {
    let mut shape = x.shape[..axis].to_vec();
    shape.extend(&idx.shape);
    shape.extend(&x.shape[axis + 1..]);
    let k = idx.shape.len();
    Nd::from_fn(&shape, |i| {
        let j = idx.get(&i[axis..axis + k]);
        let j = if j < 0.0 { j + x.shape[axis] as f64 } else { j } as usize;
        let mut src = i[..axis].to_vec();
        src.push(j);
        src.extend(&i[axis + k..]);
        x.get(&src)
    })
}

#[test]
fn take_gathers() {
    let mut rng = Rng::new(7);
    for dev in devices() {
        on(dev, || {
            for dtype in DTYPES {
                for shape in [&[6usize][..], &[4, 5], &[3, 4, 2]] {
                    for (how, a, r) in variants(&mut rng, shape, dtype) {
                        for axis in 0..shape.len() {
                            let n = shape[axis] as f64;
                            for (idt, ishape) in [
                                (DType::I32, &[5usize][..]),
                                (DType::I64, &[2, 3]),
                                (DType::U32, &[]),
                                (DType::U8, &[0]),
                                (DType::I64, &[4, 1]),
                            ] {
                                let lo = if idt.is_signed_int() { -n } else { 0.0 };
                                let iv: Vec<f64> =
                                    (0..ishape.iter().product()).map(|_| rng.uniform(lo, n).floor()).collect();
                                let (idx, iref) = array_of(&iv, ishape, idt);
                                let iref = Nd { shape: ishape.to_vec(), data: iref };
                                let what = format!("{dtype} {shape:?} {how} axis {axis} {idt} {ishape:?}");
                                let want = take_ref(&r, &iref, axis);
                                check(&a.take(&idx, axis as isize).unwrap(), &want, &what);
                                let neg = a.take(&idx, axis as isize - shape.len() as isize).unwrap();
                                check(&neg, &want, &what);
                                // Non-contiguous indices (a transposed index array).
                                if ishape.len() == 2 {
                                    let want = take_ref(&r, &iref.transpose(&[1, 0]), axis);
                                    check(&a.take(&idx.t().unwrap(), axis as isize).unwrap(), &want, &what);
                                }
                            }
                        }
                    }
                }
            }
        });
    }
}

#[test]
fn take_large_parallel() {
    let mut rng = Rng::new(8);
    let (a, r) = input(&mut rng, &[300, 257], DType::F32);
    let iv: Vec<f64> = (0..500).map(|_| rng.uniform(-300.0, 300.0).floor()).collect();
    let (idx, ir) = array_of(&iv, &[500], DType::I64);
    let ir = Nd { shape: vec![500], data: ir };
    check(&a.take(&idx, 0).unwrap(), &take_ref(&r, &ir, 0), "take rows");
    let iv: Vec<f64> = (0..400).map(|_| rng.uniform(0.0, 257.0).floor()).collect();
    let (idx, ir) = array_of(&iv, &[400], DType::I32);
    let ir = Nd { shape: vec![400], data: ir };
    check(&a.t().unwrap().take(&idx, 0).unwrap(), &take_ref(&r.transpose(&[1, 0]), &ir, 0), "take transposed");
}

#[test]
fn take_out_of_range_fails_at_eval() {
    for dev in devices() {
        on(dev, || {
            let a = Array::from_slice(&[1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0], &[2, 3]).unwrap();
            for (bad, axis) in [(3i32, 1isize), (-4, 1), (2, 0), (-3, 0)] {
                let idx = Array::from_slice(&[0i32, bad], &[2]).unwrap();
                let t = a.take(&idx, axis).unwrap(); // recorded: values unknown yet
                let e = t.to_vec::<f32>().unwrap_err();
                assert!(matches!(e, rill::Error::Index { .. }), "{e:?}");
                let msg = e.to_string();
                assert!(msg.contains("take") && msg.contains(&bad.to_string()), "{msg}");
                // Dependants report the same error.
                assert_eq!(t.add(1.0).unwrap().eval().unwrap_err().to_string(), msg);
            }
            let empty = Array::zeros(&[0, 3], DType::F32).unwrap();
            let idx = Array::from_slice(&[0i64], &[1]).unwrap();
            assert!(empty.take(&idx, 0).unwrap().eval().is_err());
            let none = Array::zeros(&[0], DType::I64).unwrap();
            assert_eq!(empty.take(&none, 0).unwrap().shape(), &[0, 3]);
        });
    }
}

/// Concatenation along `axis` by multi-index loops.
fn concat_ref(parts: &[Nd], axis: usize) -> Nd {
    let mut shape = parts[0].shape.clone();
    shape[axis] = parts.iter().map(|p| p.shape[axis]).sum();
    Nd::from_fn(&shape, |i| {
        let mut j = i[axis];
        for p in parts {
            if j < p.shape[axis] {
                let mut src = i.to_vec();
                src[axis] = j;
                return p.get(&src);
            }
            j -= p.shape[axis];
        }
        unreachable!()
    })
}

#[test]
fn concatenate_and_stack() {
    let mut rng = Rng::new(9);
    for dev in devices() {
        on(dev, || {
            for dtype in DTYPES {
                for axis in 0..3 {
                    let mut arrays = Vec::new();
                    let mut refs = Vec::new();
                    for (k, len) in [2usize, 0, 3].into_iter().enumerate() {
                        let mut shape = vec![2, 3, 4];
                        shape[axis] = len;
                        // Alternate contiguous, transposed and reversed inputs.
                        let mut v = variants(&mut rng, &shape, dtype);
                        let (_, a, r) = v.swap_remove(k % v.len());
                        arrays.push(a);
                        refs.push(r);
                    }
                    let views: Vec<&Array> = arrays.iter().collect();
                    let c = concatenate(&views, axis as isize).unwrap();
                    assert_eq!(c.dtype(), dtype);
                    check(&c, &concat_ref(&refs, axis), &format!("concat {dtype} axis {axis}"));
                    let c = concatenate(&views, axis as isize - 3).unwrap();
                    check(&c, &concat_ref(&refs, axis), &format!("concat {dtype} axis {}", axis as isize - 3));
                }
                // stack: shapes equal; new axis anywhere.
                let ins: Vec<(Array, Nd)> = (0..3).map(|_| input(&mut rng, &[2, 3], dtype)).collect();
                let views: Vec<&Array> = ins.iter().map(|p| &p.0).collect();
                for axis in [0isize, 1, 2, -1] {
                    let s = stack(&views, axis).unwrap();
                    let ax = if axis < 0 { 2 } else { axis as usize };
                    let parts: Vec<Nd> = ins
                        .iter()
                        .map(|(_, r)| {
                            let mut shape = r.shape.clone();
                            shape.insert(ax, 1);
                            Nd { shape, data: r.data.clone() }
                        })
                        .collect();
                    check(&s, &concat_ref(&parts, ax), &format!("stack {dtype} axis {axis}"));
                }
            }
            // Promotion across inputs.
            let a = Array::from_slice(&[1u8, 2], &[2]).unwrap();
            let b = Array::from_slice(&[-3i32], &[1]).unwrap();
            let c = Array::from_slice(&[0.5f32], &[1]).unwrap();
            let ab = concatenate(&[&a, &b], 0).unwrap();
            assert_eq!(ab.dtype(), DType::I32);
            assert_eq!(ab.to_vec::<i32>().unwrap(), vec![1, 2, -3]);
            let abc = concatenate(&[&a, &b, &c], 0).unwrap();
            assert_eq!(abc.dtype(), DType::F32);
            assert_eq!(abc.to_vec::<f32>().unwrap(), vec![1.0, 2.0, -3.0, 0.5]);
            // 0-d arrays stack into a vector.
            let (x, y) = (Array::scalar(1.5f64).unwrap(), Array::scalar(2.5f64).unwrap());
            assert_eq!(stack(&[&x, &y], 0).unwrap().to_vec::<f64>().unwrap(), vec![1.5, 2.5]);
        });
    }
}

#[test]
fn concatenate_large_parallel() {
    let mut rng = Rng::new(10);
    let (a, ra) = input(&mut rng, &[200, 300], DType::F64);
    let (b, rb) = input(&mut rng, &[100, 200], DType::F64);
    let c = concatenate(&[&a, &b.t().unwrap()], 1).unwrap();
    check(&c, &concat_ref(&[ra, rb.transpose(&[1, 0])], 1), "large concat");
}

#[test]
fn split_sections_and_indices() {
    let mut rng = Rng::new(11);
    for dev in devices() {
        on(dev, || {
            for dtype in DTYPES {
                for (how, a, r) in variants(&mut rng, &[6, 4], dtype) {
                    for (axis, sections) in [(0isize, 3usize), (1, 2), (-1, 4), (0, 1), (0, 6)] {
                        let parts = a.split(sections, axis).unwrap();
                        assert_eq!(parts.len(), sections);
                        let ax = if axis < 0 { 1 } else { axis as usize };
                        let w = r.shape[ax] / sections;
                        for (i, p) in parts.iter().enumerate() {
                            let mut lists: Vec<Vec<usize>> = r.shape.iter().map(|&d| (0..d).collect()).collect();
                            lists[ax] = (i * w..(i + 1) * w).collect();
                            check(p, &r.select(&lists), &format!("split {dtype} {how} {axis} {sections} part {i}"));
                        }
                    }
                    // Indices with NumPy slice semantics: [:2], [2:-1], [-1:9], [9:]
                    let parts = a.split_indices(&[2, -1, 9], 0).unwrap();
                    let want: [Vec<usize>; 4] = [vec![0, 1], vec![2, 3, 4], vec![5], vec![]];
                    for (p, rows) in parts.iter().zip(want) {
                        check(p, &r.select(&[rows, (0..4).collect()]), &format!("split_indices {dtype} {how}"));
                    }
                    let parts = a.split_indices(&[], 1).unwrap();
                    assert_eq!(parts.len(), 1);
                    check(&parts[0], &r, "split_indices none");
                }
            }
        });
    }
}

#[test]
fn pad_constant() {
    let mut rng = Rng::new(12);
    for dev in devices() {
        on(dev, || {
            for dtype in DTYPES {
                for (shape, widths) in [
                    (&[3usize][..], &[(2usize, 1usize)][..]),
                    (&[2, 3], &[(1, 0), (2, 2)]),
                    (&[2, 3, 2], &[(0, 0), (1, 1), (0, 3)]),
                    (&[2, 0], &[(1, 1), (1, 0)]),
                    (&[2, 2], &[(1, 2)]),
                    (&[], &[]),
                ] {
                    for (how, a, r) in variants(&mut rng, shape, dtype) {
                        let full: Vec<(usize, usize)> =
                            if widths.len() == 1 { vec![widths[0]; shape.len()] } else { widths.to_vec() };
                        let out: Vec<usize> = shape.iter().zip(&full).map(|(&d, &(b, e))| d + b + e).collect();
                        let value = if dtype == DType::Bool { 1.0 } else { 7.0 };
                        let want = Nd::from_fn(&out, |i| {
                            let mut src = Vec::new();
                            for (k, &j) in i.iter().enumerate() {
                                if j < full[k].0 || j >= full[k].0 + shape[k] {
                                    return value;
                                }
                                src.push(j - full[k].0);
                            }
                            r.get(&src)
                        });
                        check(&a.pad(widths, 7.0).unwrap(), &want, &format!("pad {dtype} {shape:?} {widths:?} {how}"));
                    }
                }
            }
        });
    }
}

// ---- scatter_add, take_along_axis, put_along_axis, scatter_add_along_axis ----

const INDEX_DTYPES: [DType; 4] = [DType::U8, DType::U32, DType::I32, DType::I64];

/// `a + b` as `add` computes it in `dtype` (integers wrap; bool is logical or), for the
/// small values these tests use (exact in every float dtype).
fn add_in(dtype: DType, a: f64, b: f64) -> f64 {
    match dtype {
        DType::Bool => ((a != 0.0) || (b != 0.0)) as u8 as f64,
        DType::U8 => (a + b).rem_euclid(256.0),
        DType::U32 => (a + b).rem_euclid(4294967296.0),
        DType::I32 => ((a + b) as i64 as i32) as f64,
        _ => a + b,
    }
}

impl Nd {
    /// The element at `i`, reading index 0 on this array's axes of size 1 (broadcast).
    fn get_b(&self, i: &[usize]) -> f64 {
        let off = i.len() - self.shape.len();
        self.get(&(0..self.shape.len()).map(|k| if self.shape[k] == 1 { 0 } else { i[off + k] }).collect::<Vec<_>>())
    }
    fn set(&mut self, i: &[usize], v: f64) {
        let flat = i.iter().zip(&self.shape).fold(0, |f, (&j, &d)| f * d + j);
        self.data[flat] = v;
    }
}

fn wrap(j: f64, size: usize) -> usize {
    (if j < 0.0 { j + size as f64 } else { j }) as usize
}

/// `scatter_add(x, idx, upd, axis)` by loops over the updates (`upd` broadcasts to the
/// gathered shape), in row-major order.
fn scatter_add_ref(x: &Nd, idx: &Nd, upd: &Nd, axis: usize, dtype: DType) -> Nd {
    let mut gshape = x.shape[..axis].to_vec();
    gshape.extend(&idx.shape);
    gshape.extend(&x.shape[axis + 1..]);
    let k = idx.shape.len();
    let mut out = x.clone();
    for i in indices(&gshape) {
        let mut t = i[..axis].to_vec();
        t.push(wrap(idx.get(&i[axis..axis + k]), x.shape[axis]));
        t.extend(&i[axis + k..]);
        let v = add_in(dtype, out.get(&t), upd.get_b(&i));
        out.set(&t, v);
    }
    out
}

/// `take_along_axis(x, idx, axis)` by loops: both broadcast except along `axis`.
fn take_along_ref(x: &Nd, idx: &Nd, axis: usize) -> Nd {
    let shape: Vec<usize> =
        (0..x.shape.len()).map(|d| if d == axis || x.shape[d] == 1 { idx.shape[d] } else { x.shape[d] }).collect();
    Nd::from_fn(&shape, |i| {
        let mut src = i.to_vec();
        src[axis] = wrap(idx.get_b(i), x.shape[axis]);
        let src: Vec<usize> = src.iter().enumerate().map(|(d, &j)| if x.shape[d] == 1 { 0 } else { j }).collect();
        x.get(&src)
    })
}

/// `put_along_axis` (or, with `acc`, `scatter_add_along_axis`) by loops in row-major
/// order of the broadcast indices: the last write wins.
fn put_along_ref(x: &Nd, idx: &Nd, vals: &Nd, axis: usize, acc: bool, dtype: DType) -> Nd {
    let mut ishape = x.shape.clone();
    ishape[axis] = idx.shape[axis];
    let mut out = x.clone();
    for i in indices(&ishape) {
        let mut t = i.clone();
        t[axis] = wrap(idx.get_b(&i), x.shape[axis]);
        let v = if acc { add_in(dtype, out.get(&t), vals.get_b(&i)) } else { vals.get_b(&i) };
        out.set(&t, v);
    }
    out
}

/// Small integer values (0..8; 0/1 for bool), so that sums are exact in every dtype.
fn small(rng: &mut Rng, shape: &[usize], dtype: DType) -> (Array, Nd) {
    let m = if dtype == DType::Bool { 2.0 } else { 8.0 };
    let n = shape.iter().product();
    let v: Vec<f64> = (0..n).map(|_| rng.uniform(0.0, m).floor()).collect();
    let (a, exact) = array_of(&v, shape, dtype);
    (a, Nd { shape: shape.to_vec(), data: exact })
}

/// Index values for an axis of `size` (negative ones for signed dtypes), as an array of
/// `shape` (given as a transposed view now and then) and its reference.
fn index_input(rng: &mut Rng, shape: &[usize], size: usize, dt: DType) -> (Array, Nd) {
    let lo = if dt.is_signed_int() { -(size as f64) } else { 0.0 };
    let n = shape.iter().product();
    let v: Vec<f64> = (0..n).map(|_| rng.uniform(lo, size as f64).floor()).collect();
    let r = Nd { shape: shape.to_vec(), data: v.clone() };
    if shape.len() >= 2 && rng.next_u64().is_multiple_of(2) {
        let rev: Vec<usize> = shape.iter().rev().copied().collect();
        let t = Nd { shape: rev.clone(), data: r.transpose(&(0..shape.len()).rev().collect::<Vec<_>>()).data };
        let (a, _) = array_of(&t.data, &rev, dt);
        return (a.t().unwrap(), r);
    }
    (array_of(&v, shape, dt).0, r)
}

/// `shape` with some axes other than `keep` set to 1 (stretched by broadcasting).
fn ones_at(rng: &mut Rng, shape: &[usize], keep: usize) -> Vec<usize> {
    shape.iter().enumerate().map(|(d, &n)| if d != keep && rng.next_u64().is_multiple_of(3) { 1 } else { n }).collect()
}

#[test]
fn scatter_add_sums_duplicates_into_the_gathered_rows() {
    let mut rng = Rng::new(21);
    for dev in devices() {
        on(dev, || {
            for (case, dtype) in DTYPES.iter().copied().cycle().take(54).enumerate() {
                let shape = [&[5usize][..], &[4, 3], &[3, 2, 4]][case % 3];
                let it = INDEX_DTYPES[case / 3 % 4];
                for (how, x, r) in variants(&mut rng, shape, dtype) {
                    let axis = (rng.next_u64() % shape.len() as u64) as usize;
                    let ishape = [&[][..], &[0], &[7], &[2, 3]][(rng.next_u64() % 4) as usize];
                    let (idx, iref) = index_input(&mut rng, ishape, shape[axis], it);
                    let mut gshape = shape[..axis].to_vec();
                    gshape.extend(ishape);
                    gshape.extend(&shape[axis + 1..]);
                    // Updates of the gathered shape, broadcast from size-1 axes, or strided.
                    let ushape = if case % 2 == 0 { ones_at(&mut rng, &gshape, usize::MAX) } else { gshape.clone() };
                    let (upd, uref) = small(&mut rng, &ushape, dtype);
                    let upd = if ushape.len() >= 2 && case % 4 == 1 {
                        let p: Vec<usize> = (0..ushape.len()).rev().collect();
                        upd.transpose(&p).unwrap().contiguous().unwrap().transpose(&p).unwrap()
                    } else {
                        upd
                    };
                    let what =
                        format!("{dev:?} scatter_add {dtype} {shape:?} {how} axis {axis} {it} {ishape:?} {iref:?}");
                    let want = scatter_add_ref(&r, &iref, &uref, axis, dtype);
                    check(&x.scatter_add(&idx, &upd, axis as isize).unwrap(), &want, &what);
                    let neg = rill::scatter_add(&x, &idx, &upd, axis as isize - shape.len() as isize).unwrap();
                    check(&neg, &want, &what);
                }
            }
            // An embedding table's gradient: one outer row, many rows along the axis and
            // many repeated indices, large enough for the rows to be split across threads.
            let (rows, width, n) = (700usize, 96usize, 3000usize);
            let iv: Vec<i32> = (0..n).map(|_| (rng.next_u64() % rows as u64) as i32).collect();
            let uv = rng.vec(n * width, -1.0, 1.0);
            let xv = rng.vec(rows * width, -1.0, 1.0);
            let mut want = xv.clone();
            for (k, &i) in iv.iter().enumerate() {
                for c in 0..width {
                    want[i as usize * width + c] += uv[k * width + c];
                }
            }
            let x = Array::from_slice(&xv, &[rows, width]).unwrap().astype(DType::F32).unwrap();
            let u = Array::from_slice(&uv, &[n, width]).unwrap().astype(DType::F32).unwrap();
            let got = x.scatter_add(&Array::from_slice(&iv, &[n]).unwrap(), &u, 0).unwrap();
            common::assert_close(&got.to_f64_vec().unwrap(), &want, 1e-5, &format!("{dev:?} embedding gradient"));
            // Each add is rounded to the dtype, as `add` rounds: 256 + 1 + 1 in bf16 stays
            // 256 (257 is a tie that rounds to even), and u8 and i32 wrap.
            let one = |v: f64, d: DType| Array::from_slice(&[v, v], &[2]).unwrap().astype(d).unwrap();
            let at = Array::from_slice(&[0i32, 0], &[2]).unwrap();
            for (d, start, step, want) in [
                (DType::BF16, 256.0, 1.0, 256.0),
                (DType::U8, 250.0, 5.0, 4.0),
                (DType::I32, 2147483647.0, 1.0, -2147483647.0),
                (DType::Bool, 0.0, 1.0, 1.0),
            ] {
                let x = Array::full(&[1], start, d).unwrap();
                let got = x.scatter_add(&at, &one(step, d), 0).unwrap().to_f64_vec().unwrap();
                assert_eq!(got, vec![want], "{dev:?} {d} {start} + {step} + {step}");
            }
        });
    }
}

#[test]
fn take_and_put_along_axis_with_broadcasting_and_duplicates() {
    let mut rng = Rng::new(22);
    for dev in devices() {
        on(dev, || {
            for (case, dtype) in DTYPES.iter().copied().cycle().take(54).enumerate() {
                let shape = [&[6usize][..], &[4, 3], &[3, 2, 4], &[2, 0, 3]][case % 4];
                let it = INDEX_DTYPES[case / 4 % 4];
                for (how, x, r) in variants(&mut rng, shape, dtype) {
                    let axis = (rng.next_u64() % shape.len() as u64) as usize;
                    let size = shape[axis];
                    let m = (rng.next_u64() % 5) as usize * (size > 0) as usize;
                    let mut ishape = shape.to_vec();
                    ishape[axis] = m;
                    let ax = if case % 2 == 0 { axis as isize } else { axis as isize - shape.len() as isize };
                    let what = format!("{dev:?} {dtype} {shape:?} {how} axis {ax} {it}");
                    // take_along_axis: indices stretched on some axes.
                    let ts = ones_at(&mut rng, &ishape, axis);
                    let (idx, iref) = index_input(&mut rng, &ts, size, it);
                    let got = x.take_along_axis(&idx, ax).unwrap();
                    check(&got, &take_along_ref(&r, &iref, axis), &format!("take_along_axis {what} idx {ts:?}"));
                    // put_along_axis and scatter_add_along_axis: values broadcast to the
                    // indices' shape.
                    let ps = ones_at(&mut rng, &ishape, axis);
                    let (idx, iref) = index_input(&mut rng, &ps, size, it);
                    let vs = ones_at(&mut rng, &ishape, usize::MAX);
                    let (vals, vref) = small(&mut rng, &vs, dtype);
                    let w = format!("{what} idx {ps:?} {iref:?} values {vs:?}");
                    let want = put_along_ref(&r, &iref, &vref, axis, false, dtype);
                    check(&rill::put_along_axis(&x, &idx, &vals, ax).unwrap(), &want, &format!("put {w}"));
                    let want = put_along_ref(&r, &iref, &vref, axis, true, dtype);
                    check(&x.scatter_add_along_axis(&idx, &vals, ax).unwrap(), &want, &format!("add {w}"));
                }
            }
            // x stretched too: [1, 5] along axis 1 with indices [3, 2].
            let x = Array::from_slice(&[10.0f32, 11.0, 12.0, 13.0, 14.0], &[1, 5]).unwrap();
            let idx = Array::from_slice(&[4i64, 0, -1, 2, 1, 1], &[3, 2]).unwrap();
            let got = rill::take_along_axis(&x, &idx, 1).unwrap();
            assert_eq!(got.shape(), &[3, 2]);
            assert_eq!(got.to_vec::<f32>().unwrap(), vec![14.0, 10.0, 14.0, 12.0, 11.0, 11.0]);
            // The last write wins: positions 0, 2 and 3 all name element 1.
            let x = Array::zeros(&[3], DType::I32).unwrap();
            let idx = Array::from_slice(&[1u8, 2, 1, 1], &[4]).unwrap();
            let vals = Array::from_slice(&[5i32, 6, 7, 8], &[4]).unwrap();
            assert_eq!(x.put_along_axis(&idx, &vals, 0).unwrap().to_vec::<i32>().unwrap(), vec![0, 8, 6]);
            assert_eq!(x.scatter_add_along_axis(&idx, &vals, 0).unwrap().to_vec::<i32>().unwrap(), vec![0, 20, 6]);
        });
    }
}

#[test]
fn scatter_ops_reject_bad_input() {
    let x = Array::zeros(&[3, 4], DType::F32).unwrap();
    let i = Array::from_slice(&[0i32, 2], &[2]).unwrap();
    let i2 = Array::from_slice(&[0i32, 2, 1], &[3, 1]).unwrap();
    let f = Array::from_slice(&[0.0f32, 2.0], &[2]).unwrap();
    let u = Array::ones(&[3, 2], DType::F32).unwrap();
    let is = |r: rill::Result<Array>, what: &str, ok: fn(&rill::Error) -> bool| match r {
        Err(e) => assert!(ok(&e), "{what}: {e:?}"),
        Ok(_) => panic!("{what}: no error"),
    };
    let axis = |e: &rill::Error| matches!(e, rill::Error::Axis { .. });
    let dtype = |e: &rill::Error| matches!(e, rill::Error::DType { .. });
    let shape = |e: &rill::Error| matches!(e, rill::Error::Shape { .. });
    is(x.scatter_add(&i, &u, 2), "scatter_add axis", axis);
    is(x.scatter_add(&i, &u, -3), "scatter_add negative axis", axis);
    is(x.scatter_add(&f, &u, 1), "scatter_add float indices", dtype);
    is(x.scatter_add(&i, &Array::ones(&[3, 3], DType::F32).unwrap(), 1), "scatter_add updates", shape);
    is(x.scatter_add(&i, &Array::ones(&[2, 3, 2], DType::F32).unwrap(), 1), "scatter_add rank", shape);
    is(Array::scalar(1.0f32).unwrap().scatter_add(&i, &u, 0), "scatter_add 0-d", axis);
    is(x.take_along_axis(&i2, 2), "take_along_axis axis", axis);
    is(x.take_along_axis(&i, 1), "take_along_axis rank", shape);
    is(x.take_along_axis(&Array::zeros(&[2, 1], DType::I64).unwrap(), 1), "take_along_axis broadcast", shape);
    is(x.take_along_axis(&f.reshape(&[1, 2]).unwrap(), 1), "take_along_axis float indices", dtype);
    is(x.take_along_axis(&i2.astype(DType::Bool).unwrap(), 1), "take_along_axis bool indices", dtype);
    is(x.put_along_axis(&i2, &u, 5), "put_along_axis axis", axis);
    is(x.put_along_axis(&i, &u, 1), "put_along_axis rank", shape);
    is(x.put_along_axis(&i2, &Array::ones(&[3, 2], DType::F32).unwrap(), 1), "put_along_axis values", shape);
    is(x.put_along_axis(&Array::zeros(&[3, 4, 1], DType::I32).unwrap(), &u, 1), "put_along_axis idx rank", shape);
    // x is the output of a put: it cannot be stretched to the indices.
    let row = Array::zeros(&[1, 4], DType::F32).unwrap();
    is(row.put_along_axis(&i2, &Array::ones(&[], DType::F32).unwrap(), 1), "put_along_axis stretch x", shape);
    is(x.scatter_add_along_axis(&i2.astype(DType::F16).unwrap(), &u, 1), "scatter_add_along_axis float", dtype);
    // Out-of-range indices fail at evaluation with the op's name, the first bad index in
    // row-major order, the axis and its size; dependants report the same error.
    for dev in devices() {
        on(dev, || {
            let x = Array::zeros(&[3, 4], DType::F32).unwrap();
            let bad = Array::from_slice(&[1i64, -5, 4, 0], &[4]).unwrap();
            let bad2 = bad.reshape(&[1, 4]).unwrap();
            let ones4 = Array::ones(&[1, 4], DType::F32).unwrap();
            for (r, op, index, size) in [
                (x.scatter_add(&bad, &Array::ones(&[3, 4], DType::F32).unwrap(), 1), "scatter_add", -5, 4),
                (x.scatter_add(&bad, &Array::ones(&[4, 4], DType::F32).unwrap(), 0), "scatter_add", -5, 3),
                (x.take_along_axis(&bad2, 1), "take_along_axis", -5, 4),
                (x.put_along_axis(&bad2.t().unwrap(), &ones4.t().unwrap(), 0), "put_along_axis", -5, 3),
                (x.put_along_axis(&Array::from_slice(&[2u32, 3], &[2, 1]).unwrap(), &ones4, 0), "put_along_axis", 3, 3),
                (x.scatter_add_along_axis(&bad2, &ones4, 1), "scatter_add_along_axis", -5, 4),
            ] {
                let a = r.unwrap();
                let e = a.to_f64_vec().unwrap_err();
                match &e {
                    rill::Error::Index { op: o, index: i, size: s, .. } => {
                        assert_eq!((*o, *i, *s), (op, index, size), "{dev:?} {e}")
                    }
                    other => panic!("{dev:?} {op}: {other:?}"),
                }
                assert_eq!(a.add(1.0).unwrap().sum_all().unwrap().eval().unwrap_err().to_string(), e.to_string());
            }
        });
    }
}
