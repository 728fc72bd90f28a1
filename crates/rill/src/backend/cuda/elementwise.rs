//! Elementwise kernels (cast, unary, binary, where), copies and sources (full, arange,
//! eye), generated as CUDA C with the same semantics as `backend/cpu/elementwise.rs`:
//! f16/bf16 compute in float, NaN propagates through maximum/minimum/relu/sign, round is
//! half-to-even, integer arithmetic wraps, integer division by zero gives 0, float to
//! integer conversions saturate (NaN gives 0).

use crate::backend::Storage;
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::primitives::{BinaryOp, UnaryOp};

use super::buffer::{cuda_of, new_storage};
use super::handles::CudaStreamHandle;
use super::launch::Launch;
use super::map::{In, MapFn, map};
use super::nvrtc::{self, grid_for};
use super::source::{PRELUDE, bits_type, ctype, ftype, load, store_float, utype};

fn float_unary_expr(op: UnaryOp, f: &str) -> String {
    use UnaryOp::*;
    let s = if f == "float" { "f" } else { "" };
    let k = if f == "float" { "0.7978846f" } else { "0.7978845608028654" };
    match op {
        Neg => "-x".into(),
        Abs => format!("fabs{s}(x)"),
        Sign => format!("(x > ({f})0 ? ({f})1 : (x < ({f})0 ? ({f})-1 : x))"),
        Exp => format!("exp{s}(x)"),
        Log => format!("log{s}(x)"),
        Log1p => format!("log1p{s}(x)"),
        Sqrt => format!("sqrt{s}(x)"),
        Rsqrt => format!("({f})1 / sqrt{s}(x)"),
        Square => "x * x".into(),
        Reciprocal => format!("({f})1 / x"),
        Sin => format!("sin{s}(x)"),
        Cos => format!("cos{s}(x)"),
        Tanh => format!("tanh{s}(x)"),
        Sigmoid => format!("({f})1 / (({f})1 + exp{s}(-x))"),
        Relu => format!("(x > ({f})0 ? x : (x != x ? x : ({f})0))"),
        Gelu => format!("({f})0.5 * x * (({f})1 + erf{s}(x * ({f})0.70710678118654752440))"),
        GeluTanh => format!("({f})0.5 * x * (({f})1 + tanh{s}({k} * (x + ({f})0.044715 * x * x * x)))"),
        Silu => format!("x / (({f})1 + exp{s}(-x))"),
        Erf => format!("erf{s}(x)"),
        Floor => format!("floor{s}(x)"),
        Ceil => format!("ceil{s}(x)"),
        Round => format!("rint{s}(x)"),
        LogicalNot => format!("(x == ({f})0)"),
    }
}

fn int_unary_expr(op: UnaryOp, d: DType) -> Option<String> {
    use UnaryOp::*;
    let (t, u) = (ctype(d), utype(d));
    let signed = d.is_signed_int();
    Some(match op {
        Neg => format!("({t})(({u})0 - ({u})x)"),
        Abs if signed => format!("(x < 0 ? ({t})(({u})0 - ({u})x) : x)"),
        Abs => "x".into(),
        Sign if signed => format!("(x > 0 ? ({t})1 : (x == 0 ? ({t})0 : ({t})-1))"),
        Sign => format!("(x > 0 ? ({t})1 : ({t})0)"),
        Square => format!("({t})(({u})x * ({u})x)"),
        Relu => format!("(x > 0 ? x : ({t})0)"),
        Floor | Ceil | Round => "x".into(),
        _ => return None,
    })
}

pub(crate) fn unary(cs: &CudaStreamHandle, op: UnaryOp, x: &Storage, dtype: DType) -> Result<Storage> {
    let shape = x.layout.shape.clone();
    let d = x.dtype;
    let t = ctype(d);
    if op == UnaryOp::LogicalNot {
        let v = if d.is_float() { load(d, "a") } else { "a".into() };
        let fsrc = move || format!("__device__ __forceinline__ u8 fop({t} a) {{ return (u8)(({v}) == 0); }}");
        return map(cs, MapFn::LogicalNot, fsrc, DType::Bool, &[In::new(x, t)], &shape);
    }
    if !d.is_float() && int_unary_expr(op, d).is_none() {
        return Err(Error::dtype(op.name(), dtype, "integer inputs are converted to float by the op"));
    }
    // The source is written only when the device has no kernel for it yet.
    let body = move || {
        if d.is_float() {
            let f = ftype(d);
            let e = float_unary_expr(op, f);
            let l = load(d, "a");
            let st = store_float(d, "y", d == DType::F64);
            format!("__device__ __forceinline__ {t} fop({t} a) {{ {f} x = {l}; {f} y = {e}; return {st}; }}")
        } else {
            let e = int_unary_expr(op, d).unwrap_or_default();
            format!("__device__ __forceinline__ {t} fop({t} x) {{ return {e}; }}")
        }
    };
    map(cs, MapFn::Unary(op), body, dtype, &[In::new(x, t)], &shape)
}

fn ipow_src(d: DType) -> String {
    let (t, u) = (ctype(d), utype(d));
    let neg = if d.is_signed_int() {
        "if (b < 0) { if (a == 1) return 1; if (a == -1) return (b % 2 == 0) ? 1 : a; return 0; }"
    } else {
        ""
    };
    format!(
        "__device__ __forceinline__ {t} ipow({t} a, {t} b) {{ {neg} u64 e = (u64)(i64)b; if (e > 4294967295ull) e = 4294967295ull; \
         {u} base = ({u})a, r = 1; while (e) {{ if (e & 1ull) r = ({u})(r * base); base = ({u})(base * base); e >>= 1; }} return ({t})r; }}"
    )
}

pub(crate) fn binary(
    cs: &CudaStreamHandle,
    op: BinaryOp,
    a: &Storage,
    b: &Storage,
    shape: &[usize],
    dtype: DType,
) -> Result<Storage> {
    use BinaryOp::*;
    let d = a.dtype;
    let t = ctype(d);
    let out_dtype = match op {
        Equal | NotEqual | Less | LessEqual | Greater | GreaterEqual | LogicalAnd | LogicalOr => DType::Bool,
        Maximum | Minimum => d,
        _ => dtype,
    };
    // The source is written only when the device has no kernel for it yet.
    let fsrc = move || binary_source(op, d);
    map(cs, MapFn::Binary(op), fsrc, out_dtype, &[In::new(a, t), In::new(b, t)], shape)
}

/// The `fop` of a binary op on inputs of `d`.
fn binary_source(op: BinaryOp, d: DType) -> String {
    use BinaryOp::*;
    let (t, u) = (ctype(d), utype(d));
    let float = d.is_float();
    let c = if float { ftype(d) } else { t };
    let (la, lb) = if float { (load(d, "p"), load(d, "q")) } else { ("p".into(), "q".into()) };
    let pred = |e: &str| format!("(u8)({e})");
    let (out_t, expr, extra) = match op {
        Equal => ("u8", pred("x == y"), String::new()),
        NotEqual => ("u8", pred("x != y"), String::new()),
        Less => ("u8", pred("x < y"), String::new()),
        LessEqual => ("u8", pred("x <= y"), String::new()),
        Greater => ("u8", pred("x > y"), String::new()),
        GreaterEqual => ("u8", pred("x >= y"), String::new()),
        LogicalAnd => ("u8", pred("x != 0 && y != 0"), String::new()),
        LogicalOr => ("u8", pred("x != 0 || y != 0"), String::new()),
        Maximum => (t, "((x != x || x > y) ? p : q)".to_string(), String::new()),
        Minimum => (t, "((x != x || x < y) ? p : q)".to_string(), String::new()),
        _ if float => {
            let s = if c == "float" { "f" } else { "" };
            let e = match op {
                Add => "x + y".to_string(),
                Sub => "x - y".to_string(),
                Mul => "x * y".to_string(),
                Div => "x / y".to_string(),
                _ => format!("pow{s}(x, y)"),
            };
            (t, store_float(d, &e, d == DType::F64), String::new())
        }
        _ => {
            let e = match op {
                Add => format!("({t})(({u})p + ({u})q)"),
                Sub => format!("({t})(({u})p - ({u})q)"),
                Mul => format!("({t})(({u})p * ({u})q)"),
                Div if d.is_signed_int() => {
                    format!("(q == 0 ? ({t})0 : ((q == -1) ? ({t})(({u})0 - ({u})p) : ({t})(p / q)))")
                }
                Div => format!("(q == 0 ? ({t})0 : ({t})(p / q))"),
                _ => "ipow(p, q)".to_string(),
            };
            (t, e, if op == Pow { ipow_src(d) } else { String::new() })
        }
    };
    format!(
        "{extra}\n__device__ __forceinline__ {out_t} fop({t} p, {t} q) {{ {c} x = {la}; {c} y = {lb}; (void)x; (void)y; return {expr}; }}"
    )
}

pub(crate) fn where_(
    cs: &CudaStreamHandle,
    c: &Storage,
    x: &Storage,
    y: &Storage,
    shape: &[usize],
    dtype: DType,
) -> Result<Storage> {
    // The dtype's own C type, which is also what `map` writes to `out`.
    let t = ctype(dtype);
    let fsrc = move || format!("__device__ __forceinline__ {t} fop(u8 c, {t} x, {t} y) {{ return c != 0 ? x : y; }}");
    map(cs, MapFn::Where, fsrc, dtype, &[In::new(c, "u8"), In::new(x, t), In::new(y, t)], shape)
}

/// A row-major copy of any layout (bits only).
pub(crate) fn copy(cs: &CudaStreamHandle, x: &Storage) -> Result<Storage> {
    // The storage's own C type on both sides: map writes `out` as ctype(x.dtype), so a
    // raw-bits type here would convert bits to numbers.
    let t = ctype(x.dtype);
    let fsrc = move || format!("__device__ __forceinline__ {t} fop({t} x) {{ return x; }}");
    let shape = x.layout.shape.clone();
    map(cs, MapFn::Copy, fsrc, x.dtype, &[In::new(x, t)], &shape)
}

pub(crate) fn cast(cs: &CudaStreamHandle, x: &Storage, to: DType) -> Result<Storage> {
    let from = x.dtype;
    if from == to {
        return copy(cs, x);
    }
    let (ft, tt) = (ctype(from), ctype(to));
    let body = if to == DType::Bool {
        let v = if from.is_float() { load(from, "a") } else { "a".into() };
        format!("return (u8)(({v}) != 0);")
    } else if !from.is_float() && !to.is_float() {
        format!("return ({tt})(i64)a;")
    } else if from.is_float() && from != DType::F64 && to != DType::F64 {
        // Float to float through f32 (exact for f16/bf16/f32 sources). Integers take the
        // f64 path below so that they round once, like the CPU.
        let v = if from.is_float() { load(from, "a") } else { "(float)a".into() };
        format!("float v = {v}; return {};", store_float(to, "v", false))
    } else {
        let v = if from.is_float() { format!("(double)({})", load(from, "a")) } else { "(double)a".into() };
        format!("double v = {v}; return {};", store_float(to, "v", true))
    };
    let fsrc = move || format!("__device__ __forceinline__ {tt} fop({ft} a) {{ {body} }}");
    let shape = x.layout.shape.clone();
    map(cs, MapFn::Cast, fsrc, to, &[In::new(x, ft)], &shape)
}

// ---- sources ----

#[allow(clippy::too_many_arguments)]
fn index_kernel(
    cs: &CudaStreamHandle,
    key: &str,
    dtype: DType,
    shape: &[usize],
    body: String,
    a: f64,
    b: f64,
    m: i64,
) -> Result<Storage> {
    let out = new_storage(cs, dtype, shape)?;
    let n: usize = shape.iter().product();
    if n == 0 {
        return Ok(out);
    }
    let t = ctype(dtype);
    // Keyed by dtype, not C type: f16/bf16 (and bool/u8) share a C type but not code.
    let full_key = format!("{key}|{}", dtype.name());
    let f = nvrtc::function(&cs.dev, &full_key, "k_index", || {
        format!(
            "{PRELUDE}\nextern \"C\" __global__ void k_index({t}* __restrict__ out, i64 n, double a, double b, i64 m, u64 bits) {{\n\
             for (i64 i = blockIdx.x * (i64)blockDim.x + threadIdx.x; i < n; i += (i64)gridDim.x * blockDim.x) {{ {body} }}\n}}"
        )
    })?;
    let ptr = cuda_of(&out).map(|b| b.ptr()).unwrap_or(0);
    let n64 = n as i64;
    let bits = super::source::host_bits(dtype, a);
    let _ = cs.dev.ctx.bind_to_thread();
    let mut lb = Launch::new(&f);
    lb.arg(&ptr).arg(&n64).arg(&a).arg(&b).arg(&m).arg(&bits);
    // SAFETY: the arguments match the generated signature; `out` holds n elements.
    unsafe { lb.launch(cs, grid_for(n)) }.map_err(|e| super::backend_err("launch", e))?;
    Ok(out)
}

pub(crate) fn full(cs: &CudaStreamHandle, shape: &[usize], dtype: DType, value: f64) -> Result<Storage> {
    let bt = bits_type(dtype.size());
    let t = ctype(dtype);
    let body = format!("{bt} v = ({bt})bits; out[i] = *({t}*)&v;");
    index_kernel(cs, "full", dtype, shape, body, value, 0.0, 0)
}

pub(crate) fn arange(cs: &CudaStreamHandle, shape: &[usize], dtype: DType, start: f64, step: f64) -> Result<Storage> {
    // No contraction into an FMA: the CPU computes `start + i * step` with two roundings.
    let v = "__dadd_rn(a, __dmul_rn((double)i, b))";
    let e = if dtype == DType::Bool { format!("sat_u8({v})") } else { store_float(dtype, v, true) };
    let body = format!("out[i] = {e};");
    index_kernel(cs, "arange", dtype, shape, body, start, step, 0)
}

pub(crate) fn eye(cs: &CudaStreamHandle, shape: &[usize], dtype: DType, k: isize) -> Result<Storage> {
    let bt = bits_type(dtype.size());
    let t = ctype(dtype);
    // `a` carries 1 (its bits are `bits`); zero is all-zero bits for every dtype.
    let body =
        format!("i64 r = i / m, c = i - r * m; {bt} v = (c == r + (i64)b) ? ({bt})bits : ({bt})0; out[i] = *({t}*)&v;");
    let m = shape.get(1).copied().unwrap_or(1).max(1) as i64;
    index_kernel(cs, "eye", dtype, shape, body, 1.0, k as f64, m)
}
