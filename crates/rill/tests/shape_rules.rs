//! Each primitive's shape rule, checked from outside against NumPy's semantics written
//! out here independently: for random shapes and parameters, the shape an eager op builds,
//! the shape a shapeless replay derives for other shapes of the same ranks, and the
//! reference shape agree; where the reference says the input is invalid, both the op and
//! the replay return an error (never a panic). The replay's values match eager evaluation.
//!
//! Shapes are drawn as patterns over a pool of three sizes (0 to 3) and size 1, so axes
//! that must agree (a matmul's inner axes, a weight and the last axis) often do, and a
//! replay draws a new pool for the same patterns (the sizes change, the ties stay, as in a
//! model run on other shapes), with a pattern now and then that breaks a tie.

mod common;

use proptest::prelude::*;
use rill::{Array, DType, Result, compile_shapeless, concatenate};

/// One op and its parameters; the op reads its operands from inputs 0, 1 and 2.
#[derive(Clone, Debug)]
enum Op {
    /// sum, prod, max, min, mean, var (ddof 0, 1), logsumexp over `axes` (empty: all).
    Reduce(u8, Vec<isize>, bool),
    /// argmax (true) or argmin along an axis.
    Arg(bool, isize, bool),
    Cumsum(isize),
    /// softmax or log_softmax (true).
    Softmax(bool, isize),
    /// layer_norm with a weight, a bias (inputs 1 and 2).
    LayerNorm(bool, bool),
    /// rms_norm with a weight (input 1).
    RmsNorm(bool),
    Matmul,
    Transpose(Vec<usize>),
    Swapaxes(isize, isize),
    ExpandDims(isize),
    Squeeze(Vec<isize>),
    /// take along an axis with input 1 (as i32 indices).
    Take(isize),
    Concatenate(isize),
    Pad(Vec<(usize, usize)>),
}

fn apply(op: &Op, x: &[Array]) -> Result<Array> {
    let a = &x[0];
    Ok(match op {
        Op::Reduce(k, axes, keep) => match k % 8 {
            0 => a.sum(axes, *keep)?,
            1 => a.prod(axes, *keep)?,
            2 => a.max(axes, *keep)?,
            3 => a.min(axes, *keep)?,
            4 => a.mean(axes, *keep)?,
            5 => a.var(axes, *keep, 0)?,
            6 => a.var(axes, *keep, 1)?,
            _ => a.logsumexp(axes, *keep)?,
        },
        Op::Arg(true, axis, keep) => a.argmax(*axis, *keep)?,
        Op::Arg(false, axis, keep) => a.argmin(*axis, *keep)?,
        Op::Cumsum(axis) => a.cumsum(*axis)?,
        Op::Softmax(false, axis) => a.softmax(*axis)?,
        Op::Softmax(true, axis) => a.log_softmax(*axis)?,
        Op::LayerNorm(w, b) => a.layer_norm(w.then_some(&x[1]), b.then_some(&x[2]), 1e-5)?,
        Op::RmsNorm(w) => a.rms_norm(w.then_some(&x[1]), 1e-5)?,
        Op::Matmul => a.matmul(&x[1])?,
        Op::Transpose(perm) => a.transpose(perm)?,
        Op::Swapaxes(i, j) => a.swapaxes(*i, *j)?,
        Op::ExpandDims(axis) => a.expand_dims(*axis)?,
        Op::Squeeze(axes) => a.squeeze(axes)?,
        Op::Take(axis) => a.take(&x[1].astype(DType::I32)?, *axis)?,
        Op::Concatenate(axis) => concatenate(&[a, &x[1]], *axis)?,
        Op::Pad(widths) => a.pad(widths, 0.5)?,
    })
}

// ---- the reference: NumPy's shapes, written independently of rill ----

fn axis(a: isize, nd: usize) -> Option<usize> {
    let a = if a < 0 { a + nd as isize } else { a };
    (0..nd as isize).contains(&a).then_some(a as usize)
}

/// Resolved axes, none repeated.
fn axes(list: &[isize], nd: usize) -> Option<Vec<usize>> {
    let mut out = Vec::new();
    for &a in list {
        let a = axis(a, nd)?;
        if out.contains(&a) {
            return None;
        }
        out.push(a);
    }
    Some(out)
}

/// `x` with `axes` removed, or kept as 1.
fn reduced(x: &[usize], axes: &[usize], keep: bool) -> Vec<usize> {
    let kept = x.iter().enumerate().filter(|(i, _)| keep || !axes.contains(i));
    kept.map(|(i, &d)| if axes.contains(&i) { 1 } else { d }).collect()
}

fn matmul(a: &[usize], b: &[usize]) -> Option<Vec<usize>> {
    if a.is_empty() || b.is_empty() {
        return None;
    }
    let a2 = if a.len() == 1 { vec![1, a[0]] } else { a.to_vec() };
    let b2 = if b.len() == 1 { vec![b[0], 1] } else { b.to_vec() };
    let (ra, rb) = (a2.len(), b2.len());
    if a2[ra - 1] != b2[rb - 2] {
        return None;
    }
    let n = (ra - 2).max(rb - 2);
    let dim = |s: &[usize], r: usize, i: usize| if i + r >= n + 2 { s[i + r - n - 2] } else { 1 };
    let mut out = Vec::new();
    for i in 0..n {
        let (x, y) = (dim(&a2, ra, i), dim(&b2, rb, i));
        out.push(if x == y || y == 1 {
            x
        } else if x == 1 {
            y
        } else {
            return None;
        });
    }
    if a.len() > 1 {
        out.push(a2[ra - 2]);
    }
    if b.len() > 1 {
        out.push(b2[rb - 1]);
    }
    Some(out)
}

/// The shape `op` gives for inputs of `s`, `None` for an error.
fn expected(op: &Op, s: &[Vec<usize>]) -> Option<Vec<usize>> {
    let x = &s[0];
    let nd = x.len();
    match op {
        Op::Reduce(k, list, keep) => {
            let ax = if list.is_empty() { (0..nd).collect() } else { axes(list, nd)? };
            let extremum = matches!(k % 8, 2 | 3);
            if extremum && ax.iter().any(|&a| x[a] == 0) {
                return None;
            }
            Some(reduced(x, &ax, *keep))
        }
        Op::Arg(_, a, keep) => {
            let a = axis(*a, nd)?;
            (x[a] != 0).then(|| reduced(x, &[a], *keep))
        }
        Op::Cumsum(a) | Op::Softmax(_, a) => axis(*a, nd).map(|_| x.clone()),
        Op::LayerNorm(w, b) => {
            let last = *x.last()?;
            let ok = |on: bool, c: &Vec<usize>| !on || *c == [last];
            (ok(*w, &s[1]) && ok(*b, &s[2])).then(|| x.clone())
        }
        Op::RmsNorm(w) => {
            let last = *x.last()?;
            (!w || s[1] == [last]).then(|| x.clone())
        }
        Op::Matmul => matmul(x, &s[1]),
        Op::Transpose(perm) => {
            let perm: Vec<usize> = if perm.is_empty() { (0..nd).rev().collect() } else { perm.clone() };
            let mut sorted = perm.clone();
            sorted.sort_unstable();
            (sorted == (0..nd).collect::<Vec<_>>()).then(|| perm.iter().map(|&p| x[p]).collect())
        }
        Op::Swapaxes(i, j) => {
            let (i, j) = (axis(*i, nd)?, axis(*j, nd)?);
            let mut y = x.clone();
            y.swap(i, j);
            Some(y)
        }
        Op::ExpandDims(a) => {
            let a = axis(*a, nd + 1)?;
            let mut y = x.clone();
            y.insert(a, 1);
            Some(y)
        }
        Op::Squeeze(list) => {
            let ax: Vec<usize> =
                if list.is_empty() { (0..nd).filter(|&i| x[i] == 1).collect() } else { axes(list, nd)? };
            if ax.iter().any(|&a| x[a] != 1) {
                return None;
            }
            Some(reduced(x, &ax, false))
        }
        Op::Take(a) => {
            let a = axis(*a, nd)?;
            Some([&x[..a], &s[1][..], &x[a + 1..]].concat())
        }
        Op::Concatenate(a) => {
            let (a, y) = (axis(*a, nd)?, &s[1]);
            if y.len() != nd || (0..nd).any(|i| i != a && x[i] != y[i]) {
                return None;
            }
            let mut out = x.clone();
            out[a] += y[a];
            Some(out)
        }
        Op::Pad(w) => {
            let w: Vec<(usize, usize)> = match w.len() {
                1 => vec![w[0]; nd],
                l if l == nd => w.clone(),
                _ => return None,
            };
            Some(x.iter().zip(&w).map(|(&d, &(b, a))| d + b + a).collect())
        }
    }
}

// ---- shapes, arrays and outcomes ----

/// An axis of a pattern: a size of the pool, or 1.
type Pattern = Vec<Vec<Option<usize>>>;

fn shapes(patterns: &Pattern, pool: &[usize]) -> Vec<Vec<usize>> {
    patterns.iter().map(|p| p.iter().map(|a| a.map_or(1, |i| pool[i % pool.len()])).collect()).collect()
}

fn arrays(shapes: &[Vec<usize>]) -> Vec<Array> {
    let fill = |(j, s): (usize, &Vec<usize>)| {
        let n: usize = s.iter().product();
        Array::from_vec((0..n).map(|i| ((i * 7 + j * 3) % 11) as f32 / 5.0 - 1.0).collect(), s).unwrap()
    };
    shapes.iter().enumerate().map(fill).collect()
}

type Outcome = std::result::Result<(Vec<usize>, DType, Vec<f64>), String>;

fn outcome(r: Result<Array>) -> Outcome {
    let a = r.map_err(|e| e.to_string())?;
    let v = a.to_f64_vec().map_err(|e| e.to_string())?;
    Ok((a.shape().to_vec(), a.dtype(), v))
}

/// The op's (or the replay's) shape is the reference's, and an error exactly where the
/// reference has none.
fn matches_reference(what: &str, built: &Result<Array>, want: &Option<Vec<usize>>) -> std::result::Result<(), String> {
    match (built, want) {
        (Ok(a), Some(s)) if a.shape() == s.as_slice() => Ok(()),
        (Err(_), None) => Ok(()),
        (Ok(a), _) => Err(format!("{what}: shape {:?}, reference {want:?}", a.shape())),
        (Err(e), Some(s)) => Err(format!("{what}: error `{e}`, reference shape {s:?}")),
    }
}

/// Equal shapes, dtypes and values, or errors on both sides.
fn agree(got: &Outcome, want: &Outcome) -> bool {
    match (got, want) {
        (Ok((gs, gd, gv)), Ok((ws, wd, wv))) => gs == ws && gd == wd && common::same_values(gv, wv),
        (Err(_), Err(_)) => true,
        _ => false,
    }
}

fn op_strategy() -> impl Strategy<Value = Op> {
    let ax = || -4..4isize;
    let list = || proptest::collection::vec(-4..4isize, 0..3);
    prop_oneof![
        4 => (any::<u8>(), list(), any::<bool>()).prop_map(|(k, a, keep)| Op::Reduce(k, a, keep)),
        2 => (any::<bool>(), ax(), any::<bool>()).prop_map(|(m, a, keep)| Op::Arg(m, a, keep)),
        1 => ax().prop_map(Op::Cumsum),
        1 => (any::<bool>(), ax()).prop_map(|(l, a)| Op::Softmax(l, a)),
        2 => (any::<bool>(), any::<bool>()).prop_map(|(w, b)| Op::LayerNorm(w, b)),
        1 => any::<bool>().prop_map(Op::RmsNorm),
        4 => Just(Op::Matmul),
        1 => proptest::collection::vec(0..4usize, 0..4).prop_map(Op::Transpose),
        1 => (ax(), ax()).prop_map(|(i, j)| Op::Swapaxes(i, j)),
        1 => ax().prop_map(Op::ExpandDims),
        1 => list().prop_map(Op::Squeeze),
        1 => ax().prop_map(Op::Take),
        1 => ax().prop_map(Op::Concatenate),
        1 => proptest::collection::vec((0..3usize, 0..3usize), 0..4).prop_map(Op::Pad),
    ]
}

/// Three inputs of rank 0 to 3; an axis of size 1 now and then.
fn pattern_strategy() -> impl Strategy<Value = Pattern> {
    let axis = prop_oneof![4 => (0..3usize).prop_map(Some), 1 => Just(None)];
    proptest::collection::vec(proptest::collection::vec(axis, 0..4), 3)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 2048, ..ProptestConfig::default() })]
    #[test]
    fn eager_ops_and_shapeless_replays_follow_the_reference_shape_rules(
        op in op_strategy(),
        patterns in pattern_strategy(),
        traced_pool in proptest::collection::vec(0..4usize, 3),
        replays in proptest::collection::vec((proptest::collection::vec(0..4usize, 3), any::<bool>(), pattern_strategy()), 1..4),
    ) {
        let traced = shapes(&patterns, &traced_pool);
        let want = expected(&op, &traced);
        let eager = apply(&op, &arrays(&traced));
        if let Err(e) = matches_reference("eager op", &eager, &want) {
            return Err(TestCaseError::fail(format!("{op:?} on {traced:?}: {e}")));
        }
        let op2 = op.clone();
        let f = compile_shapeless(move |x: &[Array]| Ok(vec![apply(&op2, x)?]));
        let first = f.call(&arrays(&traced)).map(|mut v| v.remove(0));
        if let Err(e) = matches_reference("traced call", &first, &want) {
            return Err(TestCaseError::fail(format!("{op:?} on {traced:?}: {e}")));
        }
        let (first, eager) = (outcome(first), outcome(eager));
        prop_assert!(agree(&first, &eager), "{:?} on {:?}: traced call {:?} vs eager {:?}", op, traced, first, eager);
        for (pool, keep_ranks, other) in replays {
            // Mostly the same patterns (ties kept); else another pattern of the same ranks.
            let p: Pattern = if keep_ranks {
                patterns.clone()
            } else {
                patterns.iter().zip(&other).map(|(p, o)| (0..p.len()).map(|i| o.get(i).copied().unwrap_or(Some(i))).collect()).collect()
            };
            let s = shapes(&p, &pool);
            let want = expected(&op, &s);
            let eager = apply(&op, &arrays(&s));
            if let Err(e) = matches_reference("eager op", &eager, &want) {
                return Err(TestCaseError::fail(format!("{op:?} on {s:?}: {e}")));
            }
            let got = f.call(&arrays(&s)).map(|mut v| v.remove(0));
            if let Err(e) = matches_reference("replay", &got, &want) {
                return Err(TestCaseError::fail(format!("{op:?} traced on {traced:?}, called on {s:?}: {e}")));
            }
            let (got, eager) = (outcome(got), outcome(eager));
            prop_assert!(agree(&got, &eager), "{:?} traced on {:?}, on {:?}: replay {:?} vs eager {:?}", op, traced, s, got, eager);
        }
    }
}

/// Found by the property test: `logsumexp` over no elements is a 0-d fill of -inf, chosen
/// from the traced shapes; a replay on shapes with elements must not return it.
#[test]
fn logsumexp_traced_on_no_elements_replays_on_elements() {
    let f = compile_shapeless(|x: &[Array]| Ok(vec![x[0].logsumexp(&[], false)?]));
    let empty = Array::zeros(&[0], DType::F32).unwrap();
    assert_eq!(f.call(&[empty]).unwrap()[0].to_f64_vec().unwrap(), vec![f64::NEG_INFINITY]);
    let one = Array::from_slice(&[-1.0f32], &[1]).unwrap();
    assert_eq!(f.call(&[one]).unwrap()[0].to_f64_vec().unwrap(), vec![-1.0]);
}
