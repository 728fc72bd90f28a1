//! Property test: random elementwise graphs, sometimes ending in a reduction, give the
//! same results compiled (traced, simplified, fused) and not compiled, for f32, f64 and
//! f16, with broadcasting.

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
    let mut vals: Vec<Array> = inputs.to_vec();
    for op in ops {
        let y = apply(op, &vals, dtype)?;
        vals.push(y);
    }
    let last = vals.last().cloned().unwrap_or_else(|| inputs[0].clone());
    // A trailing reduction now and then (compile fuses it into the group before it).
    let last = match red {
        0 => last.sum(&[-1], false)?,
        1 => last.max(&[0], true)?,
        2 => last.mean(&[0, -1], false)?,
        3 => last.min(&[-1], true)?,
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
/// dropped, some axes of size 1), now and then with an empty axis or a long last axis
/// (several kernel chunks).
fn shapes_strategy() -> impl Strategy<Value = Vec<Vec<usize>>> {
    (proptest::collection::vec(1..6usize, 0..4), 1..4usize, any::<u64>()).prop_map(|(mut base, n, bits)| {
        if !base.is_empty() {
            match bits % 11 {
                0 => base[0] = 0,
                1 | 2 => *base.last_mut().unwrap() = 1500,
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

fn same(got: &[f64], want: &[f64]) -> bool {
    got.len() == want.len() && got.iter().zip(want).all(|(g, w)| g == w || (g.is_nan() && w.is_nan()))
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 96, ..ProptestConfig::default() })]
    #[test]
    fn random_elementwise_graphs_match(
        shapes in shapes_strategy(),
        ops in proptest::collection::vec(op_strategy(), 1..12),
        extra in 0..64usize,
        red in 0..8u8,
        dt in 0..3u8,
        seed in any::<u64>(),
    ) {
        let dtype = [DType::F32, DType::F64, DType::F16][dt as usize];
        let mut s = seed | 1;
        let inputs: Vec<Array> = shapes.iter().map(|sh| {
            let n: usize = sh.iter().product();
            let v: Vec<f64> = (0..n).map(|_| {
                s ^= s << 13; s ^= s >> 7; s ^= s << 17;
                (s % 2000) as f64 / 500.0 - 2.0
            }).collect();
            Array::from_slice(&v, sh).unwrap().astype(dtype).unwrap()
        }).collect();
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
