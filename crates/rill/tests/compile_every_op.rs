//! Every unary and binary op (and `where`, and every cast), evaluated op by op and under
//! `rill::compile` with fusion, on the same inputs: the results agree bit for bit, on the
//! CPU and on GPU 0 (where the fused kernel and the eager kernels are generated CUDA,
//! from the one formula per op of the primitives layer). The ops and dtypes come from
//! `UnaryOp::ALL`, `BinaryOp::ALL` and `ALL_DTYPES`; each function is the op followed by
//! `neg` (float results) or `logical_not` (bool results), so that the op and that
//! exact second op form a fused group; combinations the fuser does not fuse (integer
//! results, i64 inputs) are skipped, and every op must be compared on some dtype. The
//! inputs hold NaN, infinities, signed zeros, subnormals, halfway cases and values just
//! above bf16 midpoints, besides random values. The GPU test is skipped without a GPU;
//! `RILL_REQUIRE_GPU=1` makes a missing GPU a failure.

mod common;

use std::sync::Arc;

use common::{Rng, gpu, on};
use rill::dtype::ALL_DTYPES;
use rill::primitives::{BinaryOp, UnaryOp};
use rill::{Array, DType, Device, Result};

fn unary(op: UnaryOp, x: &Array) -> Result<Array> {
    use UnaryOp::*;
    match op {
        Neg => x.neg(),
        Abs => x.abs(),
        Sign => x.sign(),
        Exp => x.exp(),
        Log => x.log(),
        Log1p => x.log1p(),
        Sqrt => x.sqrt(),
        Rsqrt => x.rsqrt(),
        Square => x.square(),
        Reciprocal => x.reciprocal(),
        Sin => x.sin(),
        Cos => x.cos(),
        Tanh => x.tanh(),
        Sigmoid => x.sigmoid(),
        Relu => x.relu(),
        Gelu => x.gelu(),
        GeluTanh => x.gelu_tanh(),
        Silu => x.silu(),
        GeluGrad => x.gelu_grad(),
        GeluTanhGrad => x.gelu_tanh_grad(),
        SiluGrad => x.silu_grad(),
        Erf => x.erf(),
        Floor => x.floor(),
        Ceil => x.ceil(),
        Round => x.round(),
        LogicalNot => x.logical_not(),
    }
}

fn binary(op: BinaryOp, a: &Array, b: &Array) -> Result<Array> {
    use BinaryOp::*;
    match op {
        Add => a.add(b),
        Sub => a.sub(b),
        Mul => a.mul(b),
        Div => a.div(b),
        Pow => a.pow(b),
        Maximum => a.maximum(b),
        Minimum => a.minimum(b),
        Equal => a.eq(b),
        NotEqual => a.ne(b),
        Less => a.lt(b),
        LessEqual => a.le(b),
        Greater => a.gt(b),
        GreaterEqual => a.ge(b),
        LogicalAnd => a.logical_and(b),
        LogicalOr => a.logical_or(b),
    }
}

/// The exact op fused after the op under test.
fn then_exact(y: Array) -> Result<Array> {
    match y.dtype() {
        DType::Bool => y.logical_not(),
        d if d.is_float() => y.neg(),
        // Integer results are not fused: the case is skipped.
        _ => Ok(y),
    }
}

/// Values that exercise the formulas' edge cases, then random ones.
fn values(seed: u64, n: usize) -> Vec<f64> {
    let mut v = vec![
        0.0,
        -0.0,
        1.0,
        -1.0,
        0.5,
        -0.5,
        1.5,
        2.5,
        -2.5,
        3.0,
        -3.0,
        0.1,
        0.7,
        10.0,
        88.7,
        -88.7,
        710.0,
        f64::NAN,
        f64::INFINITY,
        f64::NEG_INFINITY,
        1e-40,
        -1e-40,
        1e-310,
        6e-8,
        65504.0,
        65520.0,
        3.4e38,
        -3.4e38,
        1e30,
        255.0,
        256.0,
        -129.0,
        16_777_217.0,
        33_685_505.0,
        -33_685_505.0,
        56_960.003,
        2_147_483_647.0,
        -2_147_483_648.0,
        2_155_872_257.0,
        4_294_967_295.0,
    ];
    let mut rng = Rng::new(seed);
    while v.len() < n {
        let k = v.len() % 4;
        v.push(match k {
            0 => rng.uniform(-6.0, 6.0),
            1 => rng.uniform(-1.0, 1.0),
            2 => rng.uniform(-100.0, 100.0).round(),
            _ => rng.uniform(-1e4, 1e4),
        });
    }
    v
}

type F = Arc<dyn Fn(&[Array]) -> Result<Array> + Send + Sync>;

/// Runs `f` on `device` over inputs of `dtypes` (from `vals`), op by op and compiled.
/// Returns false when the compiled graph has no fused node (or the op rejects the
/// dtypes); otherwise checks that the results agree bit for bit, noting a difference in
/// `failed`.
fn agree(device: Device, what: &str, f: F, dtypes: &[DType], vals: &[Vec<f64>], failed: &mut Vec<String>) -> bool {
    let g = f.clone();
    let compiled = rill::compile(move |x: &[Array]| Ok(vec![then_exact(g(x)?)?]));
    on(device, || {
        let n = vals[0].len();
        let x: Vec<Array> =
            dtypes.iter().zip(vals).map(|(&d, v)| Array::from_slice(v, &[n]).unwrap().astype(d).unwrap()).collect();
        match compiled.fused_node_count(&x) {
            Ok(c) if c > 0 => {}
            _ => return false,
        }
        let fused = compiled.call(&x).unwrap()[0].to_f64_vec().unwrap();
        let eager = then_exact(f(&x).unwrap()).unwrap().to_f64_vec().unwrap();
        assert_eq!(fused.len(), eager.len(), "{what}");
        // Every bit, except of a NaN produced from NaN operands: which operand's payload and
        // sign it keeps is not specified (IEEE 754 6.2, PTX), and the compiler may swap
        // the operands of a commutative op. Negation and abs are exact on NaNs too.
        let exact_nans = what.starts_with("neg ") || what.starts_with("abs ");
        let same = |a: f64, b: f64| a.to_bits() == b.to_bits() || (!exact_nans && a.is_nan() && b.is_nan());
        let differ: Vec<usize> = (0..n).filter(|&i| !same(fused[i], eager[i])).collect();
        if let Some(&i) = differ.first() {
            let ins: Vec<f64> = x.iter().map(|a| a.to_f64_vec().unwrap()[i]).collect();
            failed.push(format!(
                "{what}: {} of {n} elements differ; element {i}: inputs {ins:?}, fused {:e} ({:#x}), \
                 op by op {:e} ({:#x})",
                differ.len(),
                fused[i],
                fused[i].to_bits(),
                eager[i],
                eager[i].to_bits()
            ));
        }
        true
    })
}

/// Every op, `where` and cast on `device`; panics on a difference or an op never fused.
fn every_op_agrees(device: Device) {
    let n = 4099;
    let (a, b, c) = (values(1, n), values(2, n).into_iter().rev().collect::<Vec<_>>(), values(3, n));
    let mut compared: Vec<String> = Vec::new();
    let mut failed: Vec<String> = Vec::new();
    let mut count = 0;
    for op in UnaryOp::ALL {
        for d in ALL_DTYPES {
            let f: F = Arc::new(move |x: &[Array]| unary(op, &x[0]));
            if agree(device, &format!("{} {d}", op.name()), f, &[d], std::slice::from_ref(&a), &mut failed) {
                compared.push(op.name().to_string());
                count += 1;
            }
        }
    }
    for op in BinaryOp::ALL {
        for d in ALL_DTYPES {
            let f: F = Arc::new(move |x: &[Array]| binary(op, &x[0], &x[1]));
            // Both operand orders: every special value meets the others.
            let ab = [a.clone(), b.clone()];
            if agree(device, &format!("{} {d}", op.name()), f.clone(), &[d, d], &ab, &mut failed) {
                compared.push(op.name().to_string());
                count += 1;
            }
            let ba = [b.clone(), a.clone()];
            agree(device, &format!("{} {d} (swapped)", op.name()), f, &[d, d], &ba, &mut failed);
        }
    }
    for d in ALL_DTYPES {
        let f: F = Arc::new(|x: &[Array]| rill::where_(&x[0], &x[1], &x[2]));
        let abc = [c.iter().map(|v| (v.abs() > 1.0) as u8 as f64).collect(), a.clone(), b.clone()];
        if agree(device, &format!("where {d}"), f, &[DType::Bool, d, d], &abc, &mut failed) {
            compared.push("where".into());
            count += 1;
        }
    }
    for from in ALL_DTYPES {
        for to in ALL_DTYPES.into_iter().filter(|&to| to != from) {
            let f: F = Arc::new(move |x: &[Array]| x[0].astype(to));
            if agree(device, &format!("astype {from} to {to}"), f, &[from], std::slice::from_ref(&a), &mut failed) {
                compared.push("astype".into());
                count += 1;
            }
        }
    }
    assert!(failed.is_empty(), "on {device:?}, {} functions differ:\n{}", failed.len(), failed.join("\n"));
    let names = UnaryOp::ALL.map(|o| o.name()).into_iter().chain(BinaryOp::ALL.map(|o| o.name()));
    for name in names.chain(["where", "astype"]) {
        assert!(compared.iter().any(|c| c == name), "{name} was fused on no dtype on {device:?}");
    }
    println!("{device:?}: {count} (op, dtype) functions fused and compared bit for bit");
}

#[test]
fn cpu_fused_and_op_by_op_agree_bit_for_bit() {
    every_op_agrees(Device::cpu());
}

#[test]
fn gpu_fused_and_op_by_op_agree_bit_for_bit() {
    let Some(g) = gpu() else { return };
    every_op_agrees(g);
}

/// `Array::unary` and `Array::binary` (the ops picked by enum) are the named methods.
#[test]
fn ops_by_enum_are_the_named_methods() {
    let bits = |a: Result<Array>| a.unwrap().to_f64_vec().unwrap().iter().map(|v| v.to_bits()).collect::<Vec<_>>();
    let v = values(11, 64);
    let (x, y) = (Array::from_slice(&v, &[64]).unwrap(), Array::from_slice(&values(12, 64), &[64]).unwrap());
    for d in [DType::F32, DType::BF16, DType::I32] {
        let (x, y) = (x.astype(d).unwrap(), y.astype(d).unwrap());
        for op in UnaryOp::ALL {
            assert_eq!(bits(x.unary(op)), bits(unary(op, &x)), "{op:?} {d}");
        }
        for op in BinaryOp::ALL {
            assert_eq!(bits(x.binary(&y, op)), bits(binary(op, &x, &y)), "{op:?} {d}");
        }
    }
}
