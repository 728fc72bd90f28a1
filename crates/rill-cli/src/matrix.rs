//! `rill bench matrix`: a benchmark matrix generated from rules, not picked by hand.
//!
//! Families and what each case varies (the dtypes: f32, bf16, f16 and the integers u8,
//! u32, i32, i64 where rill's op takes them; sizes are `2^l` elements for `l` in `--sizes`):
//!
//! - `unary`: every op of `UnaryOp::ALL`, contiguous and strided (integers only for the ops
//!   that do not convert them to a float first).
//! - `binary`: every op of `BinaryOp::ALL`, for the patterns same shape, strided, row,
//!   column, scalar and outer.
//! - `cast`: every ordered pair of the seven dtypes, contiguous and strided.
//! - `where`: the condition full, a row or a column, with the values both full, the second
//!   a scalar, or both a row; and a strided value.
//! - `reduce` (sum, prod, max, min, mean; mean of floats only) over the last, first, middle
//!   and all axes; `argreduce` (argmax, argmin) over the last and first axis.
//! - `softmax`, `log_softmax` over the last and a middle axis (floats); `layer_norm` with
//!   neither, either or both of weight and bias, `rms_norm` with and without weight.
//! - `take` of rows and of columns; `concatenate` of 2 to 8 inputs along the first and the
//!   last axis; `transpose` copies of every permutation of 2 and 3 axes and of the 4-axis
//!   ones that keep the batch axis first (`[0, 2, 1, 3]`...).
//! - `matmul` in f32, f32 with TF32 (`rill::set_allow_tf32`), bf16 and f16: for even `l`
//!   with side `s = 2^(l/2) <= 8192`, the (M, N, K) grid of `{16, s}^3` but `16^3`, each
//!   plain `[M,K] x [K,N]`, batched `[8,M,K] x [8,K,N]` and broadcast `[8,M,K] x [K,N]`
//!   (the sides `s` halved in the batched forms).
//!
//! A case whose one pass reads and writes more than [`MAX_BYTES`] is not generated. Ids are
//! `family/op/dtype/tag/2^l` (the dtype of the values; `where`'s condition is bool).
//!
//! ```text
//! rill bench matrix --list [OPTIONS] > cases.jsonl      the cases, one JSON object a line
//! rill bench matrix [OPTIONS] > rill.jsonl              time them: {"id", "impl", "seconds"}
//! rill bench matrix --cases cases.jsonl > rill.jsonl    time the cases of a list
//! rill bench matrix --check [--sample N --seed S]       compare with a float64 reference
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
//!
//! `--check` computes each selected case on the device and compares it with a float64
//! reference computed on the CPU from the same inputs by `check.rs` (plain loops, not
//! rill's kernels); `--sample N` checks N of them, seeded by `--seed`, covering every
//! family, dtype and layout once before any twice. It prints each failure and a summary
//! and fails when any case differs.

mod check;
#[cfg(test)]
mod tests;

use std::fmt::Write as _;
use std::path::PathBuf;
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
    pub bias: Option<bool>,
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

/// The largest case generated: bytes one pass reads and writes (the timing holds 8
/// outputs besides the inputs, so about 30 GiB of device memory at most).
pub const MAX_BYTES: u64 = 4 << 30;

const FLOATS: [DType; 3] = [DType::F32, DType::BF16, DType::F16];
const DTYPES: [DType; 7] = [DType::F32, DType::BF16, DType::F16, DType::U8, DType::U32, DType::I32, DType::I64];
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

/// A shape of `rank` axes and `2^l` elements, the larger axes last.
fn shape_n(l: u32, rank: u32) -> Vec<usize> {
    (0..rank).map(|k| 1 << (l / rank + u32::from(k >= rank - l % rank))).collect()
}

/// Every permutation of `0..n`, in lexicographic order.
fn permutations(n: usize) -> Vec<Vec<usize>> {
    if n == 0 {
        return vec![vec![]];
    }
    let mut out = Vec::new();
    for first in 0..n {
        for rest in permutations(n - 1) {
            let mut p = vec![first];
            p.extend(rest.into_iter().map(|r| if r >= first { r + 1 } else { r }));
            out.push(p);
        }
    }
    out
}

/// `total` split into `n` parts that differ by at most one, the larger first.
fn split(total: usize, n: usize) -> Vec<usize> {
    (0..n).map(|k| total / n + usize::from(k < total % n)).collect()
}

fn numel(s: &[usize]) -> u64 {
    s.iter().product::<usize>() as u64
}

fn inp(shape: &[usize], dtype: DType) -> Input {
    Input { shape: shape.to_vec(), dtype, strided: false }
}

fn strided(shape: &[usize], dtype: DType) -> Input {
    Input { shape: shape.to_vec(), dtype, strided: true }
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

/// The dtype `sum` and `prod` give (u8 sums as u32).
fn sum_dtype(d: DType) -> DType {
    if d == DType::U8 { DType::U32 } else { d }
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
    ) -> Option<&mut Case> {
        // `where`'s first input is its bool condition: the id names the values' dtype. The
        // last part is the size the case was generated for, `2^l`.
        let dtype = inputs[if family == "where" { 1 } else { 0 }].dtype;
        let id = format!("{family}/{op}/{dtype}/{tag}{}2^{}", if tag.is_empty() { "" } else { "/" }, self.l);
        let bytes = nbytes(&inputs) + out.0 * out.1.size() as u64;
        if bytes > MAX_BYTES {
            return None;
        }
        self.cases.push(Case { id, family, op: op.to_string(), inputs, params, bytes, flops: 0 });
        self.cases.last_mut()
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
            for d in DTYPES {
                if d.is_int() && op.needs_float() {
                    continue;
                }
                let out = if op == UnaryOp::LogicalNot { DType::Bool } else { d };
                for x in [inp(&s2, d), strided(&s2, d)] {
                    let tag = if x.strided { "strided" } else { "" };
                    g.push("unary", op.name(), tag, vec![x], none(), (n, out));
                }
            }
        }
        for op in BinaryOp::ALL {
            for d in DTYPES {
                let out = if op.is_predicate() {
                    DType::Bool
                } else if op == BinaryOp::Div && d.is_int() {
                    DType::F32
                } else {
                    d
                };
                let patterns: [(&str, Vec<Input>); 6] = [
                    ("same", vec![inp(&s2, d), inp(&s2, d)]),
                    ("strided", vec![strided(&s2, d), inp(&s2, d)]),
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
        for from in DTYPES {
            for to in DTYPES {
                if from != to {
                    for x in [inp(&s2, from), strided(&s2, from)] {
                        let tag = format!("to_{to}{}", if x.strided { "/strided" } else { "" });
                        g.push("cast", "astype", &tag, vec![x], Params { to: Some(to), ..none() }, (n, to));
                    }
                }
            }
        }
        for d in DTYPES {
            let conds = [("full", s2.clone()), ("row", vec![c]), ("column", vec![r, 1])];
            let values = [("same", s2.clone(), s2.clone()), ("scalar", s2.clone(), vec![]), ("row", vec![c], vec![c])];
            for (cf, cond) in &conds {
                for (vf, x, y) in &values {
                    let inputs = vec![inp(cond, DType::Bool), inp(x, d), inp(y, d)];
                    // Only the patterns whose output has all `2^l` elements.
                    if broadcast_numel(&inputs) == n {
                        g.push("where", "where", &format!("cond_{cf}/xy_{vf}"), inputs, none(), (n, d));
                    }
                }
            }
            let inputs = vec![inp(&s2, DType::Bool), strided(&s2, d), inp(&s2, d)];
            g.push("where", "where", "strided", inputs, none(), (n, d));
        }
        let s3 = shape3(l);
        for op in ["sum", "prod", "max", "min", "mean"] {
            for d in DTYPES {
                if d.is_int() && op == "mean" {
                    continue;
                }
                let out_dtype = if matches!(op, "sum" | "prod") { sum_dtype(d) } else { d };
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
            for d in DTYPES {
                for (tag, axis) in [("last", 1), ("first", 0)] {
                    let p = Params { axis: Some(axis), ..none() };
                    g.push("argreduce", op, tag, vec![inp(&s2, d)], p, (numel(&s2) / s2[axis] as u64, DType::I64));
                }
            }
        }
        for fam in ["softmax", "log_softmax"] {
            for d in FLOATS {
                for (tag, shape) in [("last", &s2), ("middle", &s3)] {
                    let p = Params { axis: Some(if tag == "last" { shape.len() - 1 } else { 1 }), ..none() };
                    g.push(fam, fam, tag, vec![inp(shape, d)], p, (n, d));
                }
            }
        }
        for d in FLOATS {
            for (weight, bias) in [(false, false), (true, false), (false, true), (true, true)] {
                let tag = match (weight, bias) {
                    (false, false) => "plain",
                    (true, false) => "weight",
                    (false, true) => "bias",
                    (true, true) => "weight_bias",
                };
                let mut inputs = vec![inp(&s2, d)];
                inputs.extend((0..usize::from(weight) + usize::from(bias)).map(|_| inp(&[c], d)));
                let p = Params { weight: Some(weight), bias: Some(bias), ..none() };
                g.push("layer_norm", "layer_norm", tag, inputs.clone(), p, (n, d));
                if !bias {
                    let p = Params { weight: Some(weight), ..none() };
                    g.push("rms_norm", "rms_norm", tag, inputs, p, (n, d));
                }
            }
        }
        for d in DTYPES {
            for (tag, axis) in [("rows", 0), ("columns", 1)] {
                let idx = inp(&[s2[axis]], DType::I64);
                let p = Params { axis: Some(axis), ..none() };
                g.push("take", "take", tag, vec![inp(&s2, d), idx], p, (n, d));
            }
            for parts in (2..=8).filter(|&p| p <= r.min(c)) {
                for (tag, axis) in [("first", 0), ("last", 1)] {
                    let inputs = split(s2[axis], parts)
                        .into_iter()
                        .map(|k| {
                            let mut shape = s2.clone();
                            shape[axis] = k;
                            inp(&shape, d)
                        })
                        .collect();
                    let p = Params { axis: Some(axis), ..none() };
                    g.push("concatenate", "concatenate", &format!("{tag}/n{parts}"), inputs, p, (n, d));
                }
            }
        }
        for d in DTYPES {
            // Every permutation of 2 and 3 axes, and the 4-axis ones that keep axis 0
            // (batch) in place: head splits and merges such as [0, 2, 1, 3].
            let perms = (2..=4).flat_map(|rank| {
                permutations(rank).into_iter().filter(move |p| p.iter().enumerate().any(|(k, &a)| k != a))
            });
            for perm in perms.filter(|p| p.len() < 4 || p[0] == 0) {
                let shape = shape_n(l, perm.len() as u32);
                let tag: String = std::iter::once('p').chain(perm.iter().map(|&a| (b'0' + a as u8) as char)).collect();
                let p = Params { perm: Some(perm), ..none() };
                g.push("transpose", "transpose", &tag, vec![inp(&shape, d)], p, (n, d));
            }
        }
        if l % 2 == 0 && (10..=26).contains(&l) {
            matmuls(&mut g, 1 << (l / 2));
        }
    }
    g.cases
}

/// The matmul cases of side `s` (see the module docs).
fn matmuls(g: &mut Gen, s: usize) {
    const SMALL: usize = 16;
    const BATCH: usize = 8;
    for (d, tf32) in [(DType::F32, Some(false)), (DType::F32, Some(true)), (DType::BF16, None), (DType::F16, None)] {
        for form in ["plain", "batched", "broadcast"] {
            // Bit 2, 1, 0 of `small`: M, N, K is 16 instead of the side.
            for small in 0..7u32 {
                let side = if form == "plain" { s } else { s / 2 };
                let dim = |bit: u32| if small >> bit & 1 == 1 { SMALL } else { side };
                let (m, nn, k) = (dim(2), dim(1), dim(0));
                let shape_name = match small {
                    0 => "square".to_string(),
                    _ => format!(
                        "small_{}",
                        ["m", "n", "k"]
                            .iter()
                            .enumerate()
                            .filter(|(i, _)| small >> (2 - i) & 1 == 1)
                            .map(|(_, n)| *n)
                            .collect::<String>()
                    ),
                };
                let (a, b, batch) = match form {
                    "plain" => (vec![m, k], vec![k, nn], 1),
                    "batched" => (vec![BATCH, m, k], vec![BATCH, k, nn], BATCH),
                    _ => (vec![BATCH, m, k], vec![k, nn], BATCH),
                };
                let tag = format!("{form}/{shape_name}{}", if tf32 == Some(true) { "/tf32" } else { "" });
                let p = Params { tf32, ..Params::default() };
                let out = (batch * m * nn) as u64;
                if let Some(c) = g.push("matmul", "matmul", &tag, vec![inp(&a, d), inp(&b, d)], p, (out, d)) {
                    c.flops = 2 * (batch * m * nn * k) as u64;
                }
            }
        }
    }
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
    if let Some(b) = p.bias {
        let _ = write!(s, ", \"bias\": {b}");
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
/// reciprocals (and pow's base), small integers (unsigned ones not negative), an integer
/// divisor without zeros, bool conditions, valid indices.
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
        DType::I64 if c.family == "take" => {
            let len = c.inputs[0].shape[c.params.axis.unwrap_or(0)] as f64;
            uniform(key, &shape, 0.0, len, DType::F32)?.floor()?.astype(DType::I64)?
        }
        d if d.is_int() => {
            let unsigned = matches!(d, DType::U8 | DType::U32);
            let (lo, hi) =
                if c.op == "pow" && k == 1 { (0.0, 4.0) } else { (if unsigned { 0.0 } else { -100.0 }, 100.0) };
            let x = uniform(key, &shape, lo, hi, DType::F32)?.floor()?.astype(d)?;
            if c.op == "div" && k == 1 { rill::where_(&x.eq(0)?, 1, &x)? } else { x }
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
        "layer_norm" => {
            let w = p.weight == Some(true);
            let b = p.bias == Some(true);
            x[0].layer_norm(x.get(1).filter(|_| w), x.get(if w { 2 } else { 1 }).filter(|_| b), EPS)
        }
        "rms_norm" => x[0].rms_norm(x.get(1), EPS),
        "take" => x[0].take(&x[1], axis),
        "concatenate" => rill::concatenate(&x.iter().collect::<Vec<_>>(), axis),
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

/// Parses `MIN:MAX:STEP` into the log2 sizes.
pub fn parse_sizes(s: &str) -> std::result::Result<Sizes, String> {
    let v: Vec<u32> = s
        .split(':')
        .map(|x| x.parse())
        .collect::<std::result::Result<_, _>>()
        .map_err(|_| format!("--sizes expects MIN:MAX:STEP, got {s:?}"))?;
    match v[..] {
        [lo, hi, step] if lo >= 4 && lo <= hi && hi <= 31 && step > 0 => {
            Ok(Sizes((lo..=hi).step_by(step as usize).collect()))
        }
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

/// The log2 element counts of `--sizes`.
#[derive(Clone, Debug, PartialEq)]
pub struct Sizes(pub Vec<u32>);

/// Where `rill bench matrix` runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum MatrixDevice {
    Cpu,
    Gpu,
}

/// The options of `rill bench matrix` (see the module docs).
#[derive(clap::Args, Clone, Debug, Default)]
pub struct MatrixArgs {
    /// Print the selected cases as JSON lines instead of running them.
    #[arg(long)]
    pub list: bool,
    /// The device (default: a GPU when one is usable, else the CPU); also picks the
    /// default sizes.
    #[arg(long, value_enum)]
    pub device: Option<MatrixDevice>,
    /// log2 of the element counts: MIN:MAX:STEP (default 10:28:2 on a GPU, 10:22:4 on the CPU).
    #[arg(long, value_name = "MIN:MAX:STEP", value_parser = parse_sizes)]
    pub sizes: Option<Sizes>,
    /// Only these families (comma-separated).
    #[arg(long, value_delimiter = ',', value_parser = clap::builder::PossibleValuesParser::new(FAMILIES))]
    pub family: Vec<String>,
    /// Only the cases whose id contains this text.
    #[arg(long, value_name = "TEXT")]
    pub filter: Option<String>,
    /// Only the cases of this list (made by --list; any sizes).
    #[arg(long, value_name = "FILE")]
    pub cases: Option<PathBuf>,
    /// Compare each case with its float64 reference instead of timing it; fails when any differs.
    #[arg(long)]
    pub check: bool,
    /// With --check: only N of the selected cases, every family, dtype and layout first.
    #[arg(long, value_name = "N", requires = "check")]
    pub sample: Option<usize>,
    /// The seed of --sample.
    #[arg(long, value_name = "S", default_value_t = 0)]
    pub seed: u64,
}

impl MatrixArgs {
    fn device(&self) -> std::result::Result<Device, String> {
        match self.device {
            None => Ok(Device::best()),
            Some(MatrixDevice::Cpu) => Ok(Device::cpu()),
            Some(MatrixDevice::Gpu) => Device::gpu(0).map_err(|e| e.to_string()),
        }
    }

    /// The cases the options select.
    pub fn selected(&self) -> std::result::Result<Vec<Case>, String> {
        // The cases depend only on the kind of device named (its default sizes), so
        // `--list` needs none.
        let gpu = match self.device {
            Some(d) => d == MatrixDevice::Gpu,
            None => Device::best().is_gpu(),
        };
        let sizes = match &self.sizes {
            Some(s) => s.0.clone(),
            None => parse_sizes(if gpu { "10:28:2" } else { "10:22:4" })?.0,
        };
        let mut all = match &self.cases {
            Some(path) => {
                let list = std::fs::read_to_string(path).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
                let ids: std::collections::HashSet<String> = ids_of(&list).into_iter().collect();
                let mut wide = cases(&(4..=31).collect::<Vec<_>>());
                wide.retain(|c| ids.contains(&c.id));
                wide
            }
            None => cases(&sizes),
        };
        all.retain(|c| self.family.is_empty() || self.family.iter().any(|x| x == c.family));
        all.retain(|c| self.filter.as_ref().is_none_or(|f| c.id.contains(f.as_str())));
        Ok(all)
    }
}

/// `rill bench matrix ...` (see the module docs).
pub fn run(args: &MatrixArgs) -> std::result::Result<(), String> {
    let all = args.selected()?;
    if args.list {
        for c in &all {
            println!("{}", to_json(c));
        }
        return Ok(());
    }
    let device = args.device()?;
    let s = device.default_stream().map_err(|e| e.to_string())?;
    let _g = s.enter();
    if args.check {
        let chosen: Vec<&Case> = match args.sample {
            Some(n) => check::sample(&all, n, args.seed),
            None => all.iter().collect(),
        };
        let mut failed = 0;
        for c in &chosen {
            let r = check::check_case(c).map_err(|e| e.to_string());
            if let Err(e) | Ok(Some(e)) = &r {
                failed += 1;
                println!("{}: {e}", c.id);
            }
        }
        let strata: std::collections::HashSet<String> = chosen.iter().map(|c| check::stratum(c)).collect();
        println!(
            "rill bench matrix --check on {device}: {} of {} selected cases ({} family/dtype/layout groups), \
             {failed} differ from the float64 reference",
            chosen.len(),
            all.len(),
            strata.len()
        );
        return if failed == 0 { Ok(()) } else { Err(format!("{failed} cases differ")) };
    }
    eprintln!("rill bench matrix on {device}: {} cases", all.len());
    for c in &all {
        match time_case(c) {
            Ok(t) => println!("{{\"id\": \"{}\", \"impl\": \"rill\", \"seconds\": {t:e}}}", c.id),
            Err(e) => println!("{{\"id\": \"{}\", \"impl\": \"rill\", \"error\": {:?}}}", c.id, e.to_string()),
        }
    }
    Ok(())
}
