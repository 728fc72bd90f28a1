//! Property tests: random elementwise graphs, sometimes ending in a reduction, give the
//! same results compiled (traced, simplified, fused) and not compiled, for f32, f64 and
//! f16, with broadcasting; and the same bits with fusion at eval (intermediates dropped,
//! so evaluation fuses them) as with every intermediate held (nothing fused).

use proptest::prelude::*;
use rill::{Array, DType, Result, compile};

#[derive(Clone, Debug)]
enum Op {
    Unary(u8, usize),
    Binary(u8, usize, usize),
    Scalar(u8, usize, f64),
    Where(usize, usize, usize, usize),
    RoundTrip(usize, bool),
}

fn apply(op: &Op, vals: &[Array], dtype: DType) -> Result<Array> {
    let v = |i: usize| &vals[i % vals.len()];
    Ok(match *op {
        Op::Unary(k, a) => {
            let x = v(a);
            match k % 14 {
                0 => x.neg()?,
                1 => x.abs()?,
                2 => x.exp()?,
                3 => x.tanh()?,
                4 => x.sigmoid()?,
                5 => x.sin()?,
                6 => x.square()?,
                7 => x.relu()?,
                8 => x.floor()?,
                9 => x.sign()?,
                10 => x.log()?,
                11 => x.sqrt()?,
                12 => x.gelu()?,
                _ => x.silu()?,
            }
        }
        Op::Binary(k, a, b) => {
            let (x, y) = (v(a), v(b));
            match k % 7 {
                0 => x.add(y)?,
                1 => x.sub(y)?,
                2 => x.mul(y)?,
                3 => x.div(y)?,
                4 => x.maximum(y)?,
                5 => x.minimum(y)?,
                _ => x.pow(y)?,
            }
        }
        Op::Scalar(k, a, s) => {
            let x = v(a);
            match k % 4 {
                0 => x.add(s)?,
                1 => x.mul(s)?,
                2 => x.sub(s)?,
                _ => x.div(s)?,
            }
        }
        Op::Where(a, b, c, d) => rill::where_(&v(a).gt(v(b))?, v(c), v(d))?,
        Op::RoundTrip(a, wide) => {
            let other = if wide { DType::F64 } else { DType::F16 };
            v(a).astype(other)?.mul(1.5)?.astype(dtype)?
        }
    })
}

fn run(inputs: &[Array], ops: &[Op], extra_out: usize, red: u8, dtype: DType) -> Result<Vec<Array>> {
    run_keeping(inputs, ops, extra_out, red, dtype, &mut Vec::new())
}

/// `run`, with every intermediate value also pushed to `kept` (a caller that holds them
/// stops fusion at eval from absorbing any).
fn run_keeping(
    inputs: &[Array],
    ops: &[Op],
    extra_out: usize,
    red: u8,
    dtype: DType,
    kept: &mut Vec<Array>,
) -> Result<Vec<Array>> {
    let mut vals: Vec<Array> = inputs.to_vec();
    for op in ops {
        let y = apply(op, &vals, dtype)?;
        vals.push(y);
    }
    kept.extend(vals.iter().cloned());
    let last = vals.last().cloned().unwrap_or_else(|| inputs[0].clone());
    // A trailing reduction now and then (compile fuses it into the group before it):
    // over the last axis, the first, all of them, or the first and last.
    let last = match red {
        0 => last.sum(&[-1], false)?,
        1 => last.max(&[0], true)?,
        2 => last.mean(&[0, -1], false)?,
        3 => last.min(&[-1], true)?,
        4 => last.sum(&[], false)?,
        5 => last.mean(&[-1], true)?,
        6 => last.sum(&[0], false)?,
        _ => last,
    };
    Ok(vec![last, vals[extra_out % vals.len()].clone()])
}

fn op_strategy() -> impl Strategy<Value = Op> {
    prop_oneof![
        (any::<u8>(), 0..64usize).prop_map(|(k, a)| Op::Unary(k, a)),
        (any::<u8>(), 0..64usize, 0..64usize).prop_map(|(k, a, b)| Op::Binary(k, a, b)),
        (any::<u8>(), 0..64usize, -3.0..3.0f64).prop_map(|(k, a, s)| Op::Scalar(k, a, s)),
        (0..64usize, 0..64usize, 0..64usize, 0..64usize).prop_map(|(a, b, c, d)| Op::Where(a, b, c, d)),
        (0..64usize, any::<bool>()).prop_map(|(a, w)| Op::RoundTrip(a, w)),
    ]
}

/// An output shape and, per input, a shape broadcasting to it (some leading axes
/// dropped, some axes of size 1), now and then with an empty axis, a last axis of 1500
/// (several kernel chunks) or of `long` elements.
fn shapes_strategy(long: usize) -> impl Strategy<Value = Vec<Vec<usize>>> {
    (proptest::collection::vec(1..6usize, 0..4), 1..4usize, any::<u64>()).prop_map(move |(mut base, n, bits)| {
        if !base.is_empty() {
            match bits % 11 {
                0 => base[0] = 0,
                1 => *base.last_mut().unwrap() = 1500,
                2 => *base.last_mut().unwrap() = long,
                _ => {}
            }
        }
        (0..n)
            .map(|i| {
                let b = bits >> (4 + i * 12);
                let drop = if b & 3 == 0 { 1.min(base.len()) } else { 0 };
                base[drop..].iter().enumerate().map(|(j, &d)| if (b >> (2 + 2 * j)) & 3 == 0 { 1 } else { d }).collect()
            })
            .collect()
    })
}

/// Seeded inputs of `shapes` in `dtype`, uniform in [-2, 2).
fn inputs_of(shapes: &[Vec<usize>], dtype: DType, seed: u64) -> Vec<Array> {
    let mut s = seed | 1;
    shapes
        .iter()
        .map(|sh| {
            let n: usize = sh.iter().product();
            let v: Vec<f64> = (0..n)
                .map(|_| {
                    s ^= s << 13;
                    s ^= s >> 7;
                    s ^= s << 17;
                    (s % 2000) as f64 / 500.0 - 2.0
                })
                .collect();
            Array::from_slice(&v, sh).unwrap().astype(dtype).unwrap()
        })
        .collect()
}

/// Bit patterns of an array's elements (as f64: every dtype here converts exactly).
fn bits(a: &Array) -> Vec<u64> {
    a.to_f64_vec().unwrap().iter().map(|v| if v.is_nan() { u64::MAX } else { v.to_bits() }).collect()
}

/// A random graph: input shapes, ops, which intermediate is the second output, the
/// trailing reduction, the dtype (one of `dtypes`) and the inputs' seed.
#[derive(Clone, Debug)]
struct Graph {
    shapes: Vec<Vec<usize>>,
    ops: Vec<Op>,
    extra: usize,
    red: u8,
    dtype: DType,
    seed: u64,
}

fn graph_strategy(max_ops: usize, dtypes: &'static [DType], long: usize) -> impl Strategy<Value = Graph> {
    let ops = proptest::collection::vec(op_strategy(), 1..max_ops);
    (shapes_strategy(long), ops, 0..64usize, 0..9u8, 0..dtypes.len(), any::<u64>())
        .prop_map(move |(shapes, ops, extra, red, dt, seed)| Graph { shapes, ops, extra, red, dtype: dtypes[dt], seed })
}

fn same(got: &[f64], want: &[f64]) -> bool {
    got.len() == want.len() && got.iter().zip(want).all(|(g, w)| g == w || (g.is_nan() && w.is_nan()))
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 96, ..ProptestConfig::default() })]
    #[test]
    fn random_elementwise_graphs_match(g in graph_strategy(12, &[DType::F32, DType::F64, DType::F16], 1500)) {
        let Graph { shapes, ops, extra, red, dtype, seed } = g;
        let inputs = inputs_of(&shapes, dtype, seed);
        let (ops2, dt2) = (ops.clone(), dtype);
        let f = compile(move |x: &[Array]| run(x, &ops2, extra, red, dt2));
        let plain = run(&inputs, &ops, extra, red, dtype);
        let compiled = f.call(&inputs);
        match (plain, compiled) {
            (Ok(p), Ok(c)) => {
                for k in 0..2 {
                    prop_assert_eq!(p[k].shape(), c[k].shape());
                    prop_assert_eq!(p[k].dtype(), c[k].dtype());
                    let (pv, cv) = (p[k].to_f64_vec().unwrap(), c[k].to_f64_vec().unwrap());
                    prop_assert!(same(&cv, &pv), "output {}: compiled {:?} vs plain {:?}", k, cv, pv);
                }
                // Replay from the cache gives the same again.
                let again = f.call(&inputs).unwrap();
                prop_assert!(same(&again[0].to_f64_vec().unwrap(), &p[0].to_f64_vec().unwrap()));
                prop_assert_eq!(f.trace_count(), 1);
            }
            (Err(_), Err(_)) => {}
            (p, c) => prop_assert!(false, "plain ok={} compiled ok={}", p.is_ok(), c.is_ok()),
        }
    }
}

/// Fusion at eval changes no bit: the same random graph evaluated with its intermediates
/// dropped (fused) and with all of them held (computed one by one), on the current stream.
fn fusion_keeps_the_bits(g: Graph) -> std::result::Result<(), TestCaseError> {
    let Graph { shapes, ops, extra, red, dtype, seed } = g;
    let inputs = inputs_of(&shapes, dtype, seed);
    let fused = run(&inputs, &ops, extra, red, dtype);
    let mut kept = Vec::new();
    let plain = run_keeping(&inputs, &ops, extra, red, dtype, &mut kept);
    match (fused, plain) {
        (Ok(f), Ok(p)) => {
            // Both outputs of each graph in one evaluation, the held intermediates too.
            rill::eval(&f).unwrap();
            kept.extend(p.iter().cloned());
            rill::eval(&kept).unwrap();
            for k in 0..2 {
                prop_assert_eq!(f[k].shape(), p[k].shape());
                prop_assert_eq!(f[k].dtype(), p[k].dtype());
                prop_assert_eq!(bits(&f[k]), bits(&p[k]), "output {} ({:?})", k, f[k].primitive().name());
            }
        }
        (Err(_), Err(_)) => {}
        (f, p) => prop_assert!(false, "fused ok={} plain ok={}", f.is_ok(), p.is_ok()),
    }
    Ok(())
}

/// The GPU's default stream, or None (the GPU test skips) where there is no GPU.
fn gpu_stream() -> Option<rill::Stream> {
    match rill::Device::gpu(0) {
        Ok(d) => Some(d.default_stream().expect("default stream")),
        Err(e) => {
            assert!(std::env::var("RILL_REQUIRE_GPU").as_deref() != Ok("1"), "RILL_REQUIRE_GPU=1 but no GPU: {e}");
            eprintln!("skipped: no GPU ({e})");
            None
        }
    }
}

const FUSION_DTYPES: &[DType] = &[DType::F32, DType::F64, DType::F16, DType::BF16];

proptest! {
    #![proptest_config(ProptestConfig { cases: 128, ..ProptestConfig::default() })]
    /// On the current stream (the CPU unless a test sets one), with rows of up to 40000
    /// elements now and then, long enough for the parallel reductions.
    #[test]
    fn fusion_at_eval_gives_the_bits_of_unfused_eval(g in graph_strategy(16, FUSION_DTYPES, 40_000)) {
        fusion_keeps_the_bits(g)?;
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 96, ..ProptestConfig::default() })]
    /// The same on the GPU, with rows long enough for every reduction launch shape (a warp
    /// per row, a block per row, a row split over blocks).
    #[test]
    fn fusion_at_eval_gives_the_bits_of_unfused_eval_on_the_gpu(g in graph_strategy(16, FUSION_DTYPES, 40_000)) {
        if let Some(s) = gpu_stream() {
            rill::with_stream(&s, || fusion_keeps_the_bits(g))?;
        }
    }
}

/// The one test of this binary that sets the process-wide switch (the others do not
/// depend on it): with fusion at eval on, a chain nobody holds becomes one fused node and
/// the counters say so; a held intermediate is computed and the chain is cut there; with
/// it off, nothing is fused.
#[test]
fn fusion_at_eval_fuses_what_nobody_holds_and_can_be_turned_off() {
    let x = Array::from_slice(&[0.5f32, -1.0, 2.0, 3.0, -4.0, 0.25], &[2, 3]).unwrap();
    let chain = |x: &Array| x.exp().unwrap().mul(2.0).unwrap().sub(x).unwrap().tanh().unwrap();
    let want: Vec<f64> =
        [0.5f32, -1.0, 2.0, 3.0, -4.0, 0.25].iter().map(|&v| ((v.exp() * 2.0) - v).tanh() as f64).collect();
    let was = rill::runtime::set_eval_fusion(true);
    let s0 = rill::runtime::stats();
    let y = chain(&x);
    y.eval().unwrap();
    let s1 = rill::runtime::stats();
    assert!(y.primitive().is_fused(), "root computes {}", y.primitive().name());
    assert!(s1.eval_fused_groups > s0.eval_fused_groups && s1.eval_fused_ops >= s0.eval_fused_ops + 4);
    let got = y.to_f64_vec().unwrap();
    for (g, w) in got.iter().zip(&want) {
        assert!((g - w).abs() <= 1e-6 * w.abs().max(1.0), "{got:?} vs {want:?}");
    }

    // A held intermediate: evaluated itself, and the rest of the chain reads it.
    let h = x.exp().unwrap().mul(2.0).unwrap();
    let z = h.sub(&x).unwrap().tanh().unwrap();
    z.eval().unwrap();
    assert!(h.is_evaluated(), "the held intermediate was fused away");
    assert!(z.inputs().is_empty(), "an evaluated node keeps no inputs");
    assert_eq!(bits(&z), bits(&y));

    // Turned off: the root stays the op it was recorded as.
    rill::runtime::set_eval_fusion(false);
    let w = chain(&x);
    w.eval().unwrap();
    assert_eq!(w.primitive().name(), "tanh");
    assert_eq!(bits(&w), bits(&y));
    rill::runtime::set_eval_fusion(was);
}
