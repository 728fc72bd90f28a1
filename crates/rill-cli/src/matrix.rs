//! `rill bench matrix`: a benchmark matrix generated from rules, not picked by hand.
//!
//! Every unary and binary op (from `UnaryOp::ALL`, `BinaryOp::ALL`), casts between the
//! benchmarked dtypes, `where`, every reduction over the last, first, middle and all
//! axes, arg-reductions, softmax and log-softmax, layer and RMS norm, take, concatenate,
//! transpose copies and matmul (f32 with and without TF32, bf16, f16; plain, batched and
//! with a broadcast batch), each in f32, bf16 and f16 (and i32 where it applies), over
//! sizes from 2^10 to 2^28 elements, contiguous and strided, and for binary ops every
//! broadcasting pattern (same shape, row, column, scalar, outer).
//!
//! ```text
//! rill bench matrix --list [OPTIONS] > cases.jsonl      the cases, one JSON object a line
//! rill bench matrix [OPTIONS] > rill.jsonl              time them: {"id", "impl", "seconds"}
//! rill bench matrix --cases cases.jsonl > rill.jsonl    time the cases of a list
//! python3 bench/torch_matrix.py cases.jsonl > torch.jsonl
//! python3 bench/matrix_report.py cases.jsonl rill.jsonl torch.jsonl --md m.md --png m.png
//! ```
//!
//! Options: `--sizes MIN:MAX:STEP` (log2 of the element count; 10:28:2 on a GPU, 10:22:4
//! on the CPU), `--family a,b` (only these families), `--filter TEXT` (only ids
//! containing it). A case's inputs are built and evaluated before timing; each of its
//! repetitions records the op 8 times on the same inputs and evaluates the 8 results with
//! one `rill::eval` (the peer launches 8 and synchronises once); the figure is the median
//! repetition divided by 8, after 3 warm-up repetitions, with 5 to 50 repetitions (about
//! 20 ms of timing). `bytes` counts what the op reads and writes.

use std::fmt::Write as _;
use std::time::Instant;

use rill::primitives::{BinaryOp, UnaryOp};
use rill::random::{Key, uniform};
use rill::{Array, DType, Device, Result};

/// One input of a case: a shape, a dtype, and whether it is a non-contiguous view (made
/// with its last two axes swapped, then swapped back).
#[derive(Clone, Debug, PartialEq)]
pub struct Input {
    pub shape: Vec<usize>,
    pub dtype: DType,
    pub strided: bool,
}

/// What a case computes, beyond its family and op.
#[derive(Clone, Debug, PartialEq, Default)]
pub struct Params {
    pub to: Option<DType>,
    pub axes: Option<Vec<usize>>,
    pub axis: Option<usize>,
    pub perm: Option<Vec<usize>>,
    pub weight: Option<bool>,
    pub tf32: Option<bool>,
}

/// One case of the matrix.
#[derive(Clone, Debug, PartialEq)]
pub struct Case {
    pub id: String,
    pub family: &'static str,
    pub op: String,
    pub inputs: Vec<Input>,
    pub params: Params,
    pub bytes: u64,
    pub flops: u64,
}

pub const FAMILIES: [&str; 14] = [
    "unary",
    "binary",
    "cast",
    "where",
    "reduce",
    "argreduce",
    "softmax",
    "log_softmax",
    "layer_norm",
    "rms_norm",
    "take",
    "concatenate",
    "transpose",
    "matmul",
];

const FLOATS: [DType; 3] = [DType::F32, DType::BF16, DType::F16];
const WITH_INT: [DType; 4] = [DType::F32, DType::BF16, DType::F16, DType::I32];
const EPS: f64 = 1e-5;

/// A 2-D shape of `2^l` elements: rows by columns, with at most 4096 columns.
fn shape2(l: u32) -> Vec<usize> {
    let c = l.div_ceil(2).min(12);
    vec![1 << (l - c), 1 << c]
}

/// A 3-D shape of `2^l` elements, the middle axis of about a third of them.
fn shape3(l: u32) -> Vec<usize> {
    let (a, b) = (l / 3, l / 3);
    vec![1 << a, 1 << b, 1 << (l - a - b)]
}

fn numel(s: &[usize]) -> u64 {
    s.iter().product::<usize>() as u64
}

fn inp(shape: &[usize], dtype: DType) -> Input {
    Input { shape: shape.to_vec(), dtype, strided: false }
}

fn nbytes(inputs: &[Input]) -> u64 {
    inputs.iter().map(|i| numel(&i.shape) * i.dtype.size() as u64).sum()
}

/// The element count of the broadcast of the inputs' shapes.
fn broadcast_numel(inputs: &[Input]) -> u64 {
    let rank = inputs.iter().map(|i| i.shape.len()).max().unwrap_or(0);
    (0..rank)
        .map(|k| {
            inputs.iter().map(|i| if k + i.shape.len() >= rank { i.shape[k + i.shape.len() - rank] } else { 1 }).max()
        })
        .map(|d| d.unwrap_or(1) as u64)
        .product()
}

struct Gen {
    cases: Vec<Case>,
    /// The size being generated (log2 of the main input's element count).
    l: u32,
}

impl Gen {
    fn push(
        &mut self,
        family: &'static str,
        op: &str,
        tag: &str,
        inputs: Vec<Input>,
        params: Params,
        out: (u64, DType),
    ) {
        // `where`'s first input is its bool condition: the id names the values' dtype. The
        // last part is the size the case was generated for, `2^l`.
        let dtype = inputs[if family == "where" { 1 } else { 0 }].dtype;
        let id = format!("{family}/{op}/{dtype}/{tag}{}2^{}", if tag.is_empty() { "" } else { "/" }, self.l);
        let bytes = nbytes(&inputs) + out.0 * out.1.size() as u64;
        self.cases.push(Case { id, family, op: op.to_string(), inputs, params, bytes, flops: 0 });
    }
}

/// Every case, for the sizes `2^l` for `l` in `sizes`.
pub fn cases(sizes: &[u32]) -> Vec<Case> {
    let mut g = Gen { cases: Vec::new(), l: 0 };
    let none = Params::default;
    for &l in sizes {
        g.l = l;
        let s2 = shape2(l);
        let (r, c) = (s2[0], s2[1]);
        let n = 1u64 << l;
        for op in UnaryOp::ALL {
            for d in WITH_INT {
                if d == DType::I32 && op.needs_float() {
                    continue;
                }
                let out = if op == UnaryOp::LogicalNot { DType::Bool } else { d };
                for strided in [false, true] {
                    let x = Input { shape: s2.clone(), dtype: d, strided };
                    g.push("unary", op.name(), if strided { "strided" } else { "" }, vec![x], none(), (n, out));
                }
            }
        }
        for op in BinaryOp::ALL {
            for d in WITH_INT {
                let out = if op.is_predicate() { DType::Bool } else { d };
                let patterns: [(&str, Vec<Input>); 6] = [
                    ("same", vec![inp(&s2, d), inp(&s2, d)]),
                    ("strided", vec![Input { strided: true, ..inp(&s2, d) }, inp(&s2, d)]),
                    ("row", vec![inp(&s2, d), inp(&[c], d)]),
                    ("column", vec![inp(&s2, d), inp(&[r, 1], d)]),
                    ("scalar", vec![inp(&s2, d), inp(&[], d)]),
                    ("outer", vec![inp(&[r, 1], d), inp(&[1, c], d)]),
                ];
                for (tag, inputs) in patterns {
                    let m = broadcast_numel(&inputs);
                    g.push("binary", op.name(), tag, inputs, none(), (m, out));
                }
            }
        }
        for from in WITH_INT {
            for to in WITH_INT {
                if from != to {
                    let p = Params { to: Some(to), ..none() };
                    g.push("cast", "astype", &format!("to_{to}"), vec![inp(&s2, from)], p, (n, to));
                }
            }
        }
        for d in WITH_INT {
            g.push("where", "where", "", vec![inp(&s2, DType::Bool), inp(&s2, d), inp(&s2, d)], none(), (n, d));
        }
        let s3 = shape3(l);
        for op in ["sum", "prod", "max", "min", "mean"] {
            for d in WITH_INT {
                if d == DType::I32 && op == "mean" {
                    continue;
                }
                // Integers keep their dtype (sums wrap), as floats do.
                let out_dtype = d;
                let modes: [(&str, Vec<usize>, Vec<usize>); 4] = [
                    ("last", s2.clone(), vec![1]),
                    ("first", s2.clone(), vec![0]),
                    ("middle", s3.clone(), vec![1]),
                    ("all", s2.clone(), vec![0, 1]),
                ];
                for (tag, shape, axes) in modes {
                    let kept: u64 =
                        shape.iter().enumerate().filter(|(k, _)| !axes.contains(k)).map(|(_, &d)| d as u64).product();
                    let p = Params { axes: Some(axes), ..none() };
                    g.push("reduce", op, tag, vec![inp(&shape, d)], p, (kept, out_dtype));
                }
            }
        }
        for op in ["argmax", "argmin"] {
            for d in WITH_INT {
                for (tag, axis) in [("last", 1), ("first", 0)] {
                    let p = Params { axis: Some(axis), ..none() };
                    g.push("argreduce", op, tag, vec![inp(&s2, d)], p, (numel(&s2) / s2[axis] as u64, DType::I64));
                }
            }
        }
        for fam in ["softmax", "log_softmax"] {
            for d in FLOATS {
                for (tag, axis) in [("last", 1), ("first", 0)] {
                    let p = Params { axis: Some(axis), ..none() };
                    g.push(fam, fam, tag, vec![inp(&s2, d)], p, (n, d));
                }
            }
        }
        for fam in ["layer_norm", "rms_norm"] {
            for d in FLOATS {
                for weight in [false, true] {
                    let mut inputs = vec![inp(&s2, d)];
                    if weight {
                        inputs.push(inp(&[c], d));
                        if fam == "layer_norm" {
                            inputs.push(inp(&[c], d));
                        }
                    }
                    let p = Params { weight: Some(weight), ..none() };
                    g.push(fam, fam, if weight { "weight" } else { "plain" }, inputs, p, (n, d));
                }
            }
        }
        for d in WITH_INT {
            for (tag, axis) in [("rows", 0), ("columns", 1)] {
                let idx = inp(&[s2[axis]], DType::I64);
                let p = Params { axis: Some(axis), ..none() };
                g.push("take", "take", tag, vec![inp(&s2, d), idx], p, (n, d));
            }
            if l > 10 {
                let half = shape2(l - 1);
                for (tag, axis) in [("first", 0), ("last", 1)] {
                    let p = Params { axis: Some(axis), ..none() };
                    g.push("concatenate", "concatenate", tag, vec![inp(&half, d), inp(&half, d)], p, (n, d));
                }
            }
        }
        for d in FLOATS {
            let perms: [(&str, Vec<usize>, Vec<usize>); 3] = [
                ("2d", s2.clone(), vec![1, 0]),
                ("last2", s3.clone(), vec![0, 2, 1]),
                ("first_last", s3.clone(), vec![2, 1, 0]),
            ];
            for (tag, shape, perm) in perms {
                let p = Params { perm: Some(perm), ..none() };
                g.push("transpose", "transpose", tag, vec![inp(&shape, d)], p, (n, d));
            }
        }
        // Square products whose output has 2^l elements (sides up to 8192); batched and
        // broadcast-batch products of 8 with half the side.
        if l % 2 == 0 && l / 2 <= 13 {
            let m = 1usize << (l / 2);
            let h = (m / 2).max(16);
            for (d, tf32) in
                [(DType::F32, Some(false)), (DType::F32, Some(true)), (DType::BF16, None), (DType::F16, None)]
            {
                let forms: [(&str, Vec<usize>, Vec<usize>); 3] = [
                    ("plain", vec![m, m], vec![m, m]),
                    ("batched", vec![8, h, h], vec![8, h, h]),
                    ("broadcast", vec![8, h, h], vec![h, h]),
                ];
                for (tag, a, b) in forms {
                    let (batch, side) = if a.len() == 3 { (8u64, h as u64) } else { (1, m as u64) };
                    let tag = if tf32 == Some(true) { format!("{tag}/tf32") } else { tag.to_string() };
                    let p = Params { tf32, ..none() };
                    let out = batch * side * side;
                    g.push("matmul", "matmul", &tag, vec![inp(&a, d), inp(&b, d)], p, (out, d));
                    g.cases.last_mut().expect("pushed").flops = 2 * batch * side * side * side;
                }
            }
        }
    }
    g.cases
}

/// A case as one JSON object (the schema `bench/torch_matrix.py` reads).
pub fn to_json(c: &Case) -> String {
    let mut s = format!("{{\"id\": \"{}\", \"family\": \"{}\", \"op\": \"{}\", \"inputs\": [", c.id, c.family, c.op);
    for (k, i) in c.inputs.iter().enumerate() {
        let shape: Vec<String> = i.shape.iter().map(|d| d.to_string()).collect();
        let sep = if k > 0 { ", " } else { "" };
        let _ = write!(
            s,
            "{sep}{{\"shape\": [{}], \"dtype\": \"{}\", \"strided\": {}}}",
            shape.join(", "),
            i.dtype,
            i.strided
        );
    }
    s.push(']');
    let list = |v: &[usize]| v.iter().map(|d| d.to_string()).collect::<Vec<_>>().join(", ");
    let p = &c.params;
    if let Some(t) = p.to {
        let _ = write!(s, ", \"to\": \"{t}\"");
    }
    if let Some(a) = &p.axes {
        let _ = write!(s, ", \"axes\": [{}]", list(a));
    }
    if let Some(a) = p.axis {
        let _ = write!(s, ", \"axis\": {a}");
    }
    if let Some(a) = &p.perm {
        let _ = write!(s, ", \"perm\": [{}]", list(a));
    }
    if let Some(w) = p.weight {
        let _ = write!(s, ", \"weight\": {w}, \"eps\": {EPS:e}");
    }
    if let Some(t) = p.tf32 {
        let _ = write!(s, ", \"tf32\": {t}");
    }
    let _ = write!(s, ", \"bytes\": {}", c.bytes);
    if c.flops > 0 {
        let _ = write!(s, ", \"flops\": {}", c.flops);
    }
    s.push('}');
    s
}

/// Inputs that stay in each op's domain: positive for the logarithms, roots and
/// reciprocals (and pow's base), small integers, bool conditions, valid indices.
fn build_input(c: &Case, k: usize, seed: u64) -> Result<Array> {
    let i = &c.inputs[k];
    let key = Key::new(seed);
    let positive =
        matches!(c.op.as_str(), "log" | "log1p" | "sqrt" | "rsqrt" | "reciprocal") || (c.op == "pow" && k == 0);
    let mut shape = i.shape.clone();
    let r = shape.len();
    if i.strided {
        shape.swap(r - 2, r - 1);
    }
    let x = match i.dtype {
        DType::Bool => uniform(key, &shape, 0.0, 1.0, DType::F32)?.lt(0.5)?,
        DType::I64 => {
            let len = c.inputs[0].shape[c.params.axis.unwrap_or(0)] as f64;
            uniform(key, &shape, 0.0, len, DType::F32)?.floor()?.astype(DType::I64)?
        }
        d if d.is_int() => {
            let (lo, hi) = if c.op == "pow" && k == 1 { (0.0, 4.0) } else { (-100.0, 100.0) };
            uniform(key, &shape, lo, hi, DType::F32)?.floor()?.astype(d)?
        }
        d => {
            let (lo, hi) = if positive { (0.5, 1.5) } else { (-1.0, 1.0) };
            uniform(key, &shape, lo, hi, DType::F32)?.astype(d)?
        }
    };
    let x = if i.strided { x.swapaxes(-2, -1)? } else { x };
    x.eval()?;
    Ok(x)
}

fn unary_op(op: &str) -> Option<UnaryOp> {
    UnaryOp::ALL.into_iter().find(|u| u.name() == op)
}

fn binary_op(op: &str) -> Option<BinaryOp> {
    BinaryOp::ALL.into_iter().find(|b| b.name() == op)
}

/// Records the case's op on its inputs (not evaluated).
pub fn record(c: &Case, x: &[Array]) -> Result<Array> {
    let p = &c.params;
    let axis = p.axis.unwrap_or(0) as isize;
    let bad = || rill::Error::InvalidArgument { op: "bench matrix", msg: format!("case {} has no such op", c.id) };
    match c.family {
        "unary" => x[0].unary(unary_op(&c.op).ok_or_else(bad)?),
        "binary" => x[0].binary(&x[1], binary_op(&c.op).ok_or_else(bad)?),
        "cast" => x[0].astype(p.to.ok_or_else(bad)?),
        "where" => rill::where_(&x[0], &x[1], &x[2]),
        "reduce" => {
            let axes: Vec<isize> = p.axes.as_deref().unwrap_or(&[]).iter().map(|&a| a as isize).collect();
            match c.op.as_str() {
                "sum" => x[0].sum(&axes, false),
                "prod" => x[0].prod(&axes, false),
                "max" => x[0].max(&axes, false),
                "min" => x[0].min(&axes, false),
                "mean" => x[0].mean(&axes, false),
                _ => Err(bad()),
            }
        }
        "argreduce" if c.op == "argmax" => x[0].argmax(axis, false),
        "argreduce" => x[0].argmin(axis, false),
        "softmax" => x[0].softmax(axis),
        "log_softmax" => x[0].log_softmax(axis),
        "layer_norm" => x[0].layer_norm(x.get(1), x.get(2), EPS),
        "rms_norm" => x[0].rms_norm(x.get(1), EPS),
        "take" => x[0].take(&x[1], axis),
        "concatenate" => rill::concatenate(&[&x[0], &x[1]], axis),
        "transpose" => x[0].transpose(p.perm.as_deref().ok_or_else(bad)?)?.contiguous(),
        "matmul" => x[0].matmul(&x[1]),
        _ => Err(bad()),
    }
}

/// Independent copies of the op in one timed repetition.
const COPIES: usize = 8;

/// Runs `f` on the case's inputs (built and evaluated) with TF32 set as the case says,
/// restoring the previous setting afterwards.
fn with_inputs<R>(c: &Case, f: impl FnOnce(&[Array]) -> Result<R>) -> Result<R> {
    let inputs: Vec<Array> = (0..c.inputs.len()).map(|k| build_input(c, k, 7 + k as u64)).collect::<Result<_>>()?;
    let previous = c.params.tf32.map(rill::set_allow_tf32);
    let r = f(&inputs);
    if let Some(previous) = previous {
        rill::set_allow_tf32(previous);
    }
    r
}

/// Times one case (see the module docs); seconds per op.
pub fn time_case(c: &Case) -> Result<f64> {
    with_inputs(c, |inputs| {
        let rep = || -> Result<f64> {
            let t = Instant::now();
            let outs: Vec<Array> = (0..COPIES).map(|_| record(c, inputs)).collect::<Result<_>>()?;
            rill::eval(&outs)?;
            Ok(t.elapsed().as_secs_f64())
        };
        let mut warm = f64::MAX;
        for _ in 0..3 {
            warm = warm.min(rep()?);
        }
        let reps = ((0.02 / warm.max(1e-9)) as usize).clamp(5, 50);
        let v = (0..reps).map(|_| rep()).collect::<Result<Vec<f64>>>()?;
        Ok(crate::bench::median(v) / COPIES as f64)
    })
}

/// The float64 reference of a case on the CPU: its inputs' values (the float ones as f64,
/// the others in their dtype) through the same op.
fn reference(c: &Case, inputs: &[Array]) -> Result<Array> {
    let cpu = Device::cpu().default_stream()?;
    let ins: Vec<Array> = inputs
        .iter()
        .map(|x| {
            let v = x.to_f64_vec()?;
            let d = if x.dtype().is_float() { DType::F64 } else { x.dtype() };
            rill::with_stream(&cpu, || Array::from_slice(&v, x.shape())?.astype(d))
        })
        .collect::<Result<_>>()?;
    // A cast's reference converts the f64 values to the target dtype, rounding once.
    rill::with_stream(&cpu, || record(c, &ins))
}

/// How far a case's result may be from its float64 reference: relative to the dtype's
/// precision, and to the magnitude a reduction or product sums over.
fn tolerance(c: &Case, out: DType) -> f64 {
    let eps = |d: DType| match d {
        DType::BF16 => 2f64.powi(-8),
        DType::F16 => 2f64.powi(-11),
        DType::F32 if c.params.tf32 == Some(true) => 2f64.powi(-11),
        DType::F32 => 2f64.powi(-23),
        _ => 0.0,
    };
    let e = eps(out).max(eps(c.inputs[0].dtype));
    match c.family {
        // Sums over up to millions of elements (relative to the sum of magnitudes).
        "reduce" | "matmul" => 128.0 * e,
        // Row statistics over up to 4096 columns, then one elementwise pass.
        "softmax" | "log_softmax" | "layer_norm" | "rms_norm" => 32.0 * e,
        _ => 4.0 * e,
    }
}

/// The smallest positive value of a float dtype (the spacing of its subnormals): a
/// product accumulated in the dtype may keep one where the exact value underflows.
fn tiny(d: DType) -> f64 {
    match d {
        DType::BF16 => 2f64.powi(-133),
        DType::F16 => 2f64.powi(-24),
        DType::F32 => 2f64.powi(-149),
        _ => 0.0,
    }
}

/// Compares one case's result on the current stream with its float64 reference on the
/// CPU; `Some(description)` of the first element out of tolerance.
pub fn check_case(c: &Case) -> Result<Option<String>> {
    let (inputs, out, got) = with_inputs(c, |inputs| {
        let y = record(c, inputs)?;
        Ok((inputs.to_vec(), y.dtype(), y.to_f64_vec()?))
    })?;
    let want = reference(c, &inputs)?.to_f64_vec()?;
    // The magnitude each output element sums over: the same op on |inputs|.
    let scale = if matches!(c.family, "reduce" | "matmul") && c.op != "max" && c.op != "min" {
        let abs: Vec<Array> =
            inputs.iter().map(|x| if x.dtype().is_float() { x.abs() } else { Ok(x.clone()) }).collect::<Result<_>>()?;
        reference(c, &abs)?.to_f64_vec()?.into_iter().map(f64::abs).collect()
    } else {
        vec![1.0; want.len()]
    };
    if got.len() != want.len() {
        return Ok(Some(format!("{} elements, the reference has {}", got.len(), want.len())));
    }
    // The reference rounded to the output dtype too: a product that underflows, or a value
    // among the subnormals, is compared with what the dtype can hold.
    let cpu = Device::cpu().default_stream()?;
    let rounded = rill::with_stream(&cpu, || Array::from_slice(&want, &[want.len()])?.astype(out)?.to_f64_vec())?;
    let tol = tolerance(c, out);
    for (k, ((&g, &w), &r)) in got.iter().zip(&want).zip(&rounded).enumerate() {
        let near = |w: f64| (g - w).abs() <= tol * w.abs().max(scale[k]) + tiny(out);
        let same = g == w || g == r || (g.is_nan() && w.is_nan()) || near(w) || near(r);
        if !same {
            return Ok(Some(format!("element {k}: {g} against the float64 reference {w} (tolerance {tol:e})")));
        }
    }
    Ok(None)
}

/// Parses `MIN:MAX:STEP` into the log2 sizes.
pub fn parse_sizes(s: &str) -> std::result::Result<Vec<u32>, String> {
    let v: Vec<u32> = s
        .split(':')
        .map(|x| x.parse())
        .collect::<std::result::Result<_, _>>()
        .map_err(|_| format!("--sizes expects MIN:MAX:STEP, got {s:?}"))?;
    match v[..] {
        [lo, hi, step] if lo >= 4 && lo <= hi && hi <= 31 && step > 0 => Ok((lo..=hi).step_by(step as usize).collect()),
        _ => Err(format!("--sizes expects MIN:MAX:STEP with 4 <= MIN <= MAX <= 31 and STEP > 0, got {s:?}")),
    }
}

/// Reads back the ids of a case list made by `--list` (the generator makes the cases; the
/// list only selects them).
pub fn ids_of(list: &str) -> Vec<String> {
    list.lines()
        .filter_map(|l| l.split("\"id\": \"").nth(1).and_then(|r| r.split('"').next()).map(str::to_string))
        .collect()
}

/// `rill bench matrix ...` (see the module docs): lists the cases for a GPU (`gpu`) or
/// the CPU, or times them on `device`.
pub fn run(
    gpu: bool,
    device: impl FnOnce() -> std::result::Result<Device, String>,
    args: &[String],
) -> std::result::Result<(), String> {
    let flag = |name: &str| args.iter().position(|a| a == name).and_then(|i| args.get(i + 1).cloned());
    let sizes = parse_sizes(&flag("--sizes").unwrap_or_else(|| if gpu { "10:28:2" } else { "10:22:4" }.into()))?;
    let families: Option<Vec<String>> = flag("--family").map(|f| f.split(',').map(str::to_string).collect());
    if let Some(f) = families.iter().flatten().find(|f| !FAMILIES.contains(&f.as_str())) {
        return Err(format!("unknown family {f:?} (one of {})", FAMILIES.join(", ")));
    }
    let filter = flag("--filter");
    let mut all = cases(&sizes);
    if let Some(path) = flag("--cases") {
        let list = std::fs::read_to_string(&path).map_err(|e| format!("cannot read {path}: {e}"))?;
        let ids = ids_of(&list);
        let mut wide = cases(&(4..=31).collect::<Vec<_>>());
        wide.retain(|c| ids.contains(&c.id));
        all = wide;
    }
    all.retain(|c| families.as_ref().is_none_or(|f| f.iter().any(|x| x == c.family)));
    all.retain(|c| filter.as_ref().is_none_or(|f| c.id.contains(f.as_str())));
    if args.iter().any(|a| a == "--check") {
        let device = device()?;
        let s = device.default_stream().map_err(|e| e.to_string())?;
        let _g = s.enter();
        let mut failed = 0;
        for c in &all {
            let r = check_case(c).map_err(|e| e.to_string());
            if let Err(e) | Ok(Some(e)) = &r {
                failed += 1;
                println!("{}: {e}", c.id);
            }
        }
        println!(
            "rill bench matrix --check on {device}: {} cases, {failed} differ from the float64 reference",
            all.len()
        );
        return if failed == 0 { Ok(()) } else { Err(format!("{failed} cases differ")) };
    }
    if args.iter().any(|a| a == "--list") {
        for c in &all {
            println!("{}", to_json(c));
        }
        return Ok(());
    }
    let device = device()?;
    let s = device.default_stream().map_err(|e| e.to_string())?;
    let _g = s.enter();
    eprintln!("rill bench matrix on {device}: {} cases", all.len());
    for c in &all {
        match time_case(c) {
            Ok(t) => println!("{{\"id\": \"{}\", \"impl\": \"rill\", \"seconds\": {t:e}}}", c.id),
            Err(e) => println!("{{\"id\": \"{}\", \"impl\": \"rill\", \"error\": {:?}}}", c.id, e.to_string()),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_matrix_covers_every_op_dtype_and_pattern_once() {
        let all = cases(&(4..=31).collect::<Vec<_>>());
        let mut ids: Vec<&str> = all.iter().map(|c| c.id.as_str()).collect();
        ids.sort();
        let n = ids.len();
        ids.dedup();
        assert_eq!(ids.len(), n, "case ids are unique");
        for f in FAMILIES {
            assert!(all.iter().any(|c| c.family == f), "{f}");
        }
        for d in FLOATS {
            for op in UnaryOp::ALL {
                for strided in [false, true] {
                    let found = all
                        .iter()
                        .any(|c| c.op == op.name() && c.inputs[0].dtype == d && c.inputs[0].strided == strided);
                    assert!(found, "unary {op:?} {d} strided {strided}");
                }
            }
            for op in BinaryOp::ALL {
                for tag in ["same", "strided", "row", "column", "scalar", "outer"] {
                    let id = format!("binary/{}/{d}/{tag}/", op.name());
                    assert!(all.iter().any(|c| c.id.starts_with(&id)), "{id}");
                }
            }
        }
        for tag in ["last", "first", "middle", "all"] {
            assert!(all.iter().any(|c| c.family == "reduce" && c.id.contains(&format!("/{tag}/"))), "{tag}");
        }
        // Sizes: the element count of every case's main input follows the size list.
        assert!(all.iter().any(|c| c.family == "unary" && numel(&c.inputs[0].shape) == 1 << 28));
        assert!(to_json(&all[0]).starts_with("{\"id\": \""));
        assert_eq!(parse_sizes("10:28:6"), Ok(vec![10, 16, 22, 28]));
        assert!(parse_sizes("28:10:2").is_err() && parse_sizes("x").is_err());
    }

    /// Every case of the matrix at small sizes (on the CPU here; `rill bench matrix
    /// --check --device gpu` checks all of it on a GPU) equals its float64 reference.
    #[test]
    fn a_sample_of_the_matrix_matches_float64() {
        let s = Device::cpu().default_stream().unwrap();
        let _g = s.enter();
        // Small sizes of everything, and the row statistics of the norms and softmax over
        // 1024 rows of 4096 columns, where an accumulation in one running sum per row is
        // out of tolerance in f32.
        let mut all = cases(&[10, 14]);
        all.extend(
            cases(&[22])
                .into_iter()
                .filter(|c| matches!(c.family, "layer_norm" | "rms_norm" | "softmax" | "log_softmax")),
        );
        let failures: Vec<String> = all
            .iter()
            .filter_map(|c| check_case(c).unwrap_or_else(|e| Some(e.to_string())).map(|f| format!("{}: {f}", c.id)))
            .collect();
        assert!(
            failures.is_empty(),
            "{} of {} cases: {:#?}",
            failures.len(),
            all.len(),
            &failures[..failures.len().min(10)]
        );
    }

    /// The check finds a wrong result: a case recorded with another op than its reference.
    #[test]
    fn the_check_rejects_a_wrong_op() {
        let s = Device::cpu().default_stream().unwrap();
        let _g = s.enter();
        let mut c = cases(&[10]).into_iter().find(|c| c.id == "unary/exp/f32/2^10").unwrap();
        assert_eq!(check_case(&c).unwrap(), None);
        let inputs: Vec<Array> = vec![build_input(&c, 0, 7).unwrap()];
        c.op = "sin".into();
        let wrong = record(&c, &inputs).unwrap().to_f64_vec().unwrap();
        c.op = "exp".into();
        let want = reference(&c, &inputs).unwrap().to_f64_vec().unwrap();
        assert!(wrong.iter().zip(&want).any(|(a, b)| (a - b).abs() > tolerance(&c, DType::F32) * b.abs()));
    }
}
