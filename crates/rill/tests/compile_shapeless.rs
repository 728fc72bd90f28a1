//! Shapeless replay gives the eager result or an error, never another answer: the
//! numbers ops compute from shapes while they build the graph (the counts `mean` and `var`
//! divide by, the axes reductions and 1-D matmuls remove or insert, matmul's broadcast of
//! its operands to a batch shape, captured operands included) are recomputed for each
//! replay's shapes, and where the traced graph does not describe the new shapes the call
//! traces them. The property test runs random small graphs traced on one shape and
//! called on others of the same ranks, against the same function evaluated eagerly
//! (compiled functions called inside included).

#![allow(clippy::disallowed_types)] // a test uses rill as a user does, with std's primitives (clippy.toml)

use std::sync::{Arc, Mutex, OnceLock};

mod common;

use proptest::prelude::*;
use rill::{Array, DType, Result, compile_shapeless};

fn values(a: &Array) -> Vec<f64> {
    a.to_f64_vec().unwrap()
}

#[test]
fn mean_and_var_with_keepdims_divide_by_the_replayed_count() {
    let f = compile_shapeless(|x: &[Array]| {
        Ok(vec![x[0].mean(&[-1], true)?, x[0].var(&[-1], true, 0)?, x[0].var(&[-1], true, 1)?])
    });
    let a = Array::from_slice(&[1.0f32, 2.0, 3.0, 4.0], &[1, 4]).unwrap();
    let out = f.call(&[a]).unwrap();
    assert_eq!(values(&out[0]), vec![2.5]);
    assert_eq!(values(&out[1]), vec![1.25]);
    let b = Array::from_slice(&[1.0f32, 2.0], &[1, 2]).unwrap();
    let out = f.call(std::slice::from_ref(&b)).unwrap();
    assert_eq!(values(&out[0]), vec![1.5], "traced on [1, 4], replayed on [1, 2]");
    assert_eq!(values(&out[1]), vec![0.25]);
    assert_eq!(values(&out[2]), vec![0.5], "ddof 1 divides by 2 - 1");
    assert_eq!(values(&out[0]), values(&b.mean(&[-1], true).unwrap()));
    assert_eq!(f.trace_count(), 1, "the counts are recomputed, not traced again");
    // Over several axes, and over all of them.
    let g = compile_shapeless(|x: &[Array]| Ok(vec![x[0].mean(&[0, 2], true)?, x[0].var(&[], true, 0)?]));
    for shape in [[2usize, 3, 4], [5, 1, 2], [1, 2, 3]] {
        let n: usize = shape.iter().product();
        let x = Array::from_vec((0..n).map(|i| (i * i % 7) as f32).collect(), &shape).unwrap();
        let out = g.call(std::slice::from_ref(&x)).unwrap();
        assert_eq!(values(&out[0]), values(&x.mean(&[0, 2], true).unwrap()), "{shape:?}");
        assert_eq!(values(&out[1]), values(&x.var(&[], true, 0).unwrap()), "{shape:?}");
    }
    assert_eq!(g.trace_count(), 1);
}

#[test]
fn reductions_without_keepdims_replay_on_new_shapes() {
    let f = compile_shapeless(|x: &[Array]| {
        Ok(vec![x[0].mean(&[1], false)?, x[0].sum(&[0], false)?, x[0].argmax(-1, false)?, x[0].logsumexp(&[1], false)?])
    });
    for shape in [[2usize, 3], [4, 5], [1, 1]] {
        let n: usize = shape.iter().product();
        let x = Array::from_vec((0..n).map(|i| (i % 5) as f32 - 2.0).collect(), &shape).unwrap();
        let out = f.call(std::slice::from_ref(&x)).unwrap();
        let want = [
            x.mean(&[1], false).unwrap(),
            x.sum(&[0], false).unwrap(),
            x.argmax(-1, false).unwrap(),
            x.logsumexp(&[1], false).unwrap(),
        ];
        for (o, w) in out.iter().zip(&want) {
            assert_eq!(o.shape(), w.shape(), "{shape:?}");
            assert_eq!(values(o), values(w), "{shape:?}");
        }
    }
    assert_eq!(f.trace_count(), 1);
    // An empty axis: eager `max` is an error and `logsumexp` -inf; a replay agrees.
    let x = Array::zeros(&[2, 0], DType::F32).unwrap();
    let out = f.call(std::slice::from_ref(&x));
    assert!(out.is_err(), "argmax of an empty axis is an error, as eagerly");
    let g = compile_shapeless(|x: &[Array]| Ok(vec![x[0].logsumexp(&[1], true)?]));
    g.call(&[Array::ones(&[2, 3], DType::F32).unwrap()]).unwrap();
    assert_eq!(values(&g.call(std::slice::from_ref(&x)).unwrap()[0]), vec![f64::NEG_INFINITY; 2]);
}

#[test]
fn matmul_with_a_captured_operand_replays_on_new_batch_shapes() {
    let w = Array::from_slice(&[1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0], &[2, 3]).unwrap();
    let w2 = w.clone();
    let f = compile_shapeless(move |x: &[Array]| Ok(vec![x[0].matmul(&w2)?]));
    for shape in [[2usize, 3, 2], [3, 3, 2], [1, 4, 2], [5, 1, 2]] {
        let n: usize = shape.iter().product();
        let x = Array::from_vec((0..n).map(|i| i as f32).collect(), &shape).unwrap();
        let got = f.call(std::slice::from_ref(&x)).unwrap();
        let want = x.matmul(&w).unwrap();
        assert_eq!(got[0].shape(), want.shape());
        assert_eq!(values(&got[0]), values(&want), "{shape:?}");
    }
    assert_eq!(f.trace_count(), 1, "the broadcast of the captured operand follows the batch shape");
    // Captured on the left, with batch axes of its own, and 1-D operands.
    let wb = Array::from_vec((0..12).map(|i| i as f32 - 5.0).collect(), &[2, 2, 3]).unwrap();
    let wb2 = wb.clone();
    let g = compile_shapeless(move |x: &[Array]| Ok(vec![wb2.matmul(&x[0])?, x[1].matmul(&x[0])?]));
    for (sx, sv) in [([3usize, 2], [3usize]), ([3, 4], [3]), ([3, 1], [3])] {
        let nx: usize = sx.iter().product();
        let x = Array::from_vec((0..nx).map(|i| (i % 4) as f32).collect(), &sx).unwrap();
        let v = Array::from_slice(&[1.0f32, -1.0, 2.0], &sv).unwrap();
        let got = g.call(&[x.clone(), v.clone()]).unwrap();
        let want = [wb.matmul(&x).unwrap(), v.matmul(&x).unwrap()];
        for (o, w) in got.iter().zip(&want) {
            assert_eq!(o.shape(), w.shape(), "{sx:?}");
            assert_eq!(values(o), values(w), "{sx:?}");
        }
    }
    assert_eq!(g.trace_count(), 1);
}

#[test]
fn a_matmul_operand_that_needed_no_broadcast_when_traced_traces_again() {
    // Traced with equal batch shapes (no broadcast view); replayed where one is needed.
    let f = compile_shapeless(|x: &[Array]| Ok(vec![x[0].matmul(&x[1])?]));
    let ones = |s: &[usize]| Array::ones(s, DType::F32).unwrap();
    f.call(&[ones(&[2, 2, 3]), ones(&[2, 3, 4])]).unwrap();
    let got = f.call(&[ones(&[1, 2, 3]), ones(&[5, 3, 4])]).unwrap();
    assert_eq!(got[0].shape(), [5, 2, 4]);
    assert_eq!(values(&got[0]), vec![3.0; 40]);
    assert_eq!(f.trace_count(), 2);
    let e = f.call(&[ones(&[2, 2, 3]), ones(&[3, 3, 4])]).unwrap_err().to_string();
    assert!(e.contains("matmul"), "{e}");
}

#[test]
fn counts_noted_on_another_thread_of_the_traced_function() {
    // The traced function may build its graph on threads it starts.
    let f = compile_shapeless(|x: &[Array]| {
        let x = x[0].clone();
        std::thread::scope(|s| s.spawn(|| x.mean(&[-1], true)).join().unwrap()).map(|m| vec![m])
    });
    f.call(&[Array::ones(&[1, 4], DType::F32).unwrap()]).unwrap();
    let b = Array::from_slice(&[1.0f32, 2.0], &[1, 2]).unwrap();
    assert_eq!(values(&f.call(&[b]).unwrap()[0]), vec![1.5]);
}

#[test]
fn compiled_functions_called_while_tracing_are_not_frozen() {
    // The inner function's replay holds numbers of its own trace (a count inlined in a
    // fused kernel): the outer function is traced per shape rather than replayed.
    for inner in [
        rill::compile(|x: &[Array]| Ok(vec![x[0].mean(&[-1], true)?.mul(2.0)?.exp()?])),
        compile_shapeless(|x: &[Array]| Ok(vec![x[0].mean(&[-1], true)?.mul(2.0)?.exp()?])),
    ] {
        let f = compile_shapeless(move |x: &[Array]| Ok(vec![inner.call(x)?[0].add(1.0)?]));
        f.call(&[Array::ones(&[1, 4], DType::F32).unwrap()]).unwrap();
        let b = Array::from_slice(&[1.0f32, 2.0], &[1, 2]).unwrap();
        let want = b.mean(&[-1], true).unwrap().mul(2.0).unwrap().exp().unwrap().add(1.0).unwrap();
        assert_eq!(values(&f.call(&[b]).unwrap()[0]), values(&want));
    }
}

// ---- the property test ----

/// One op of a random graph; operands are indices into the values so far (modulo).
#[derive(Clone, Debug)]
enum Op {
    Unary(u8, usize),
    Binary(u8, usize, usize),
    Scalar(u8, usize),
    /// With a captured constant shaped like the operand's last axis (`0`), like the whole
    /// operand (`1`), or 0-d (`2`).
    Captured(u8, usize),
    /// sum, max, min, mean, var (ddof 0 and 1), logsumexp, argmax over axes given as a bit
    /// mask (0: all), with or without keepdims.
    Reduce(u8, usize, u8, bool),
    Softmax(usize, u8),
    /// With a captured `[.., K, n]` operand (batch axes when `batched`), on either side.
    MatmulCaptured(usize, usize, bool, bool),
    /// `a @ swapaxes(b)` (or `a @ b` for 1-D values).
    Matmul(usize, usize),
    ExpandSqueeze(usize, u8),
    /// `reshape(-1)`: not shape-polymorphic (traced per shape).
    Flatten(usize),
    /// `a + ones_like(a)`: a fill of the operand's shape (traced per shape).
    OnesLike(usize),
    Where(usize, usize),
    /// A compiled function (exact, or shapeless) called on the operand.
    Inner(usize, bool),
}

/// `x - mean(x)` over the last axis, compiled both ways (shared by every case).
fn inner(shapeless: bool) -> &'static rill::Compiled {
    static INNER: OnceLock<[rill::Compiled; 2]> = OnceLock::new();
    let body = |x: &[Array]| Ok(vec![x[0].sub(&x[0].mean(&[-1], true)?)?.mul(2.0)?]);
    &INNER.get_or_init(|| [rill::compile(body), compile_shapeless(body)])[shapeless as usize]
}

/// Captured constants, made once at the traced shapes (index: the op's position).
type Consts = Arc<Mutex<Vec<Option<Array>>>>;

fn constant(consts: &Consts, i: usize, make: impl FnOnce() -> Result<Array>) -> Result<Array> {
    let mut g = consts.lock().unwrap();
    if let Some(c) = &g[i] {
        return Ok(c.clone());
    }
    let c = make()?;
    g[i] = Some(c.clone());
    Ok(c)
}

fn filled(shape: &[usize], seed: usize) -> Result<Array> {
    let n: usize = shape.iter().product();
    Array::from_vec((0..n).map(|i| ((i * 7 + seed * 3) % 11) as f32 / 5.0 - 1.0).collect(), shape)
}

fn apply(i: usize, op: &Op, vals: &[Array], consts: &Consts) -> Result<Array> {
    let v = |k: usize| &vals[k % vals.len()];
    Ok(match *op {
        Op::Unary(k, a) => match k % 4 {
            0 => v(a).tanh()?,
            1 => v(a).neg()?,
            2 => v(a).square()?,
            _ => v(a).sigmoid()?,
        },
        Op::Binary(k, a, b) => match k % 4 {
            0 => v(a).add(v(b))?,
            1 => v(a).sub(v(b))?,
            2 => v(a).mul(v(b))?,
            _ => v(a).maximum(v(b))?,
        },
        Op::Scalar(k, a) => match k % 3 {
            0 => v(a).add(1.5)?,
            1 => v(a).mul(-0.5)?,
            _ => v(a).div(3.0)?,
        },
        Op::Captured(k, a) => {
            let x = v(a);
            let c = constant(consts, i, || match k % 3 {
                0 => filled(&x.shape()[x.ndim().saturating_sub(1)..], i),
                1 => filled(x.shape(), i),
                _ => filled(&[], i),
            })?;
            x.add(&c)?
        }
        Op::Reduce(k, a, mask, keep) => {
            let x = v(a);
            let axes: Vec<isize> = (0..x.ndim()).filter(|b| mask >> b & 1 == 1).map(|b| b as isize).collect();
            match k % 8 {
                0 => x.sum(&axes, keep)?,
                1 => x.max(&axes, keep)?,
                2 => x.min(&axes, keep)?,
                3 => x.mean(&axes, keep)?,
                4 => x.var(&axes, keep, 0)?,
                5 => x.var(&axes, keep, 1)?,
                6 => x.logsumexp(&axes, keep)?,
                _ => x.argmax(-1, keep)?.astype(DType::F32)?,
            }
        }
        Op::Softmax(a, axis) => {
            let x = v(a);
            x.softmax(-1 - (axis as isize % x.ndim().max(1) as isize))?
        }
        Op::MatmulCaptured(a, n, batched, left) => {
            let x = v(a);
            let nd = x.ndim();
            let k = if left { x.shape().get(nd.wrapping_sub(2)) } else { x.shape().last() }.copied().unwrap_or(1);
            let w = constant(consts, i, || {
                let mat = if left { [n % 3 + 1, k] } else { [k, n % 3 + 1] };
                if batched { filled(&[2, mat[0], mat[1]], i) } else { filled(&mat, i) }
            })?;
            if left { w.matmul(x)? } else { x.matmul(&w)? }
        }
        Op::Matmul(a, b) => {
            let (x, y) = (v(a), v(b));
            if y.ndim() >= 2 { x.matmul(&y.swapaxes(-1, -2)?)? } else { x.matmul(y)? }
        }
        Op::ExpandSqueeze(a, axis) => {
            let x = v(a);
            let ax = (axis as usize % (x.ndim() + 1)) as isize;
            let e = x.expand_dims(ax)?.exp()?;
            if axis & 8 == 0 { e.squeeze(&[ax])? } else { e }
        }
        Op::Flatten(a) => v(a).reshape(&[-1])?,
        Op::OnesLike(a) => v(a).add(&v(a).ones_like()?)?,
        Op::Where(a, b) => rill::where_(&v(a).gt(0.0)?, v(a), v(b))?,
        Op::Inner(a, shapeless) => inner(shapeless).call(std::slice::from_ref(v(a)))?.remove(0),
    })
}

fn run(inputs: &[Array], ops: &[Op], consts: &Consts) -> Result<Vec<Array>> {
    let mut vals = inputs.to_vec();
    for (i, op) in ops.iter().enumerate() {
        let y = apply(i, op, &vals, consts)?;
        vals.push(y);
    }
    // Every value is an output: ops nothing returns are not replayed (nor their errors).
    Ok(vals.split_off(inputs.len()))
}

fn op_strategy() -> impl Strategy<Value = Op> {
    let i = || 0..64usize;
    prop_oneof![
        1 => (any::<u8>(), i()).prop_map(|(k, a)| Op::Unary(k, a)),
        1 => (any::<u8>(), i(), i()).prop_map(|(k, a, b)| Op::Binary(k, a, b)),
        1 => (any::<u8>(), i()).prop_map(|(k, a)| Op::Scalar(k, a)),
        1 => (any::<u8>(), i()).prop_map(|(k, a)| Op::Captured(k, a)),
        3 => (any::<u8>(), i(), any::<u8>(), any::<bool>()).prop_map(|(k, a, m, keep)| Op::Reduce(k, a, m, keep)),
        1 => (i(), any::<u8>()).prop_map(|(a, x)| Op::Softmax(a, x)),
        2 => (i(), i(), any::<bool>(), any::<bool>()).prop_map(|(a, n, b, l)| Op::MatmulCaptured(a, n, b, l)),
        1 => (i(), i()).prop_map(|(a, b)| Op::Matmul(a, b)),
        1 => (i(), any::<u8>()).prop_map(|(a, x)| Op::ExpandSqueeze(a, x)),
        1 => i().prop_map(Op::Flatten),
        1 => i().prop_map(Op::OnesLike),
        1 => (i(), i()).prop_map(|(a, b)| Op::Where(a, b)),
        1 => (i(), any::<bool>()).prop_map(|(a, s)| Op::Inner(a, s)),
    ]
}

/// The shapes of the inputs for a base shape: input `j` takes the base with the axes of
/// its pattern set to 1, and its leading axis dropped when asked.
fn input_shapes(base: &[usize], patterns: &[(u8, bool)]) -> Vec<Vec<usize>> {
    patterns
        .iter()
        .map(|&(ones, drop)| {
            let s: Vec<usize> = base.iter().enumerate().map(|(i, &d)| if ones >> i & 1 == 1 { 1 } else { d }).collect();
            if drop && !s.is_empty() { s[1..].to_vec() } else { s }
        })
        .collect()
}

/// A replay's base shape: each axis keeps the traced size or takes another (0 now and then).
fn replay_base(traced: &[usize], bits: u64) -> Vec<usize> {
    traced
        .iter()
        .enumerate()
        .map(|(i, &d)| match (bits >> (4 * i)) & 15 {
            0..=3 => d,
            4 => 0,
            5 | 6 => 1,
            b => b as usize % 5 + 2,
        })
        .collect()
}

type Outcome = std::result::Result<Vec<(Vec<usize>, Vec<f64>)>, String>;

/// The outputs' shapes and values, or the error of building or evaluating them.
fn outcome(outs: Result<Vec<Array>>) -> Outcome {
    let outs = outs.map_err(|e| e.to_string())?;
    outs.iter().map(|o| o.to_f64_vec().map(|v| (o.shape().to_vec(), v)).map_err(|e| e.to_string())).collect()
}

/// Equal results, or errors on both sides: never a result where eager evaluation errs,
/// and (in this op set) never an error where it does not.
fn agree(got: &Outcome, want: &Outcome) -> bool {
    match (got, want) {
        (Ok(g), Ok(w)) => {
            g.len() == w.len() && g.iter().zip(w).all(|((gs, gv), (ws, wv))| gs == ws && common::same_values(gv, wv))
        }
        (Err(_), Err(_)) => true,
        _ => false,
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]
    #[test]
    fn shapeless_replays_match_eager_evaluation(
        base in proptest::collection::vec(1..5usize, 0..4),
        patterns in proptest::collection::vec((any::<u8>(), any::<bool>()), 1..3),
        ops in proptest::collection::vec(op_strategy(), 1..7),
        replays in proptest::collection::vec(any::<u64>(), 1..5),
    ) {
        let arrays = |base: &[usize]| -> Vec<Array> {
            input_shapes(base, &patterns).iter().enumerate().map(|(j, s)| filled(s, j + 1).unwrap()).collect()
        };
        // Captured constants are made eagerly on the traced shapes, before compiling.
        let consts: Consts = Arc::new(Mutex::new(vec![None; ops.len()]));
        let traced = arrays(&base);
        let eager = outcome(run(&traced, &ops, &consts));
        if eager.is_err() {
            // The graph does not build on the traced shapes: nothing to replay.
            return Ok(());
        }
        let (ops2, consts2) = (ops.clone(), consts.clone());
        let f = compile_shapeless(move |x: &[Array]| run(x, &ops2, &consts2));
        let first = outcome(f.call(&traced));
        prop_assert!(agree(&first, &eager), "traced call: {:?} vs eager {:?}", first, eager);
        for bits in replays {
            let inputs = arrays(&replay_base(&base, bits));
            let shapes: Vec<&[usize]> = inputs.iter().map(|a| a.shape()).collect();
            let want = outcome(run(&inputs, &ops, &consts));
            let got = outcome(f.call(&inputs));
            prop_assert!(agree(&got, &want), "on {:?}: replay {:?} vs eager {:?}", shapes, got, want);
        }
    }
}
