//! Elementwise kernels (cast, unary, binary, where), copies and sources (full, arange,
//! eye), generated as CUDA C. The formulas of cast, unary, binary and where are the
//! shared ones of the primitives layer ([`UnaryOp::cuda`], [`BinaryOp::cuda`],
//! `primitives::cuda`), which the fused kernels (`fused_src.rs`) use too; their
//! semantics are the scalar functions beside them, which the CPU kernels compute.
//!
//! Each kernel's `fop` is written as the fused kernels write one instruction: the inputs
//! converted to their compute type as registers `r0, r1, ..`, the op's expression as the
//! next register, then the store.

use crate::backend::Storage;
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::primitives::cuda::{cast as cast_expr, compute_type, select};
use crate::primitives::{BinaryOp, UnaryOp};

use super::buffer::{cuda_of, new_storage};
use super::driver::GpuStream;
use super::launch::Launch;
use super::map::{In, MapFn, map};
use super::nvrtc::{self, grid_for};
use super::source::{PRELUDE, bits_type, ctype, load, store_float};

pub(crate) fn unary(cs: &GpuStream<'_>, op: UnaryOp, x: &Storage, dtype: DType) -> Result<Storage> {
    let shape = x.layout.shape.clone();
    let d = x.dtype;
    if op.cuda(d, "r0").is_none() {
        return Err(Error::dtype(op.name(), dtype, "integer inputs are converted to float by the op"));
    }
    let out = if op == UnaryOp::LogicalNot { DType::Bool } else { dtype };
    // The source is written only when the device has no kernel for it yet.
    map(cs, MapFn::Unary(op), move || unary_source(op, d), out, &[In::new(x, ctype(d))], &shape)
}

/// The `fop` of a unary op on inputs of `d` (`logical_not`: bool output; the others: `d`).
pub(crate) fn unary_source(op: UnaryOp, d: DType) -> String {
    let (t, c) = (ctype(d), compute_type(d));
    let e = op.cuda(d, "r0").unwrap_or_else(|| crate::primitives::cuda::undefined(op.name(), d));
    let (out_t, rt, st) = if op == UnaryOp::LogicalNot {
        ("u8", "u8", "r1".to_string())
    } else if d.is_float() {
        (t, c, store_float(d, "r1", d == DType::F64))
    } else {
        (t, c, "r1".to_string())
    };
    let l = load(d, "a");
    format!("__device__ __forceinline__ {out_t} fop({t} a) {{ {c} r0 = {l}; {rt} r1 = {e}; return {st}; }}")
}

pub(crate) fn binary(
    cs: &GpuStream<'_>,
    op: BinaryOp,
    a: &Storage,
    b: &Storage,
    shape: &[usize],
    dtype: DType,
) -> Result<Storage> {
    let d = a.dtype;
    let t = ctype(d);
    // Arithmetic computes and stores in the operands' dtype (the op made them the output's).
    debug_assert!(op.is_predicate() || dtype == d, "{op:?}: operands {d}, output {dtype}");
    let out_dtype = if op.is_predicate() { DType::Bool } else { d };
    // The source is written only when the device has no kernel for it yet.
    let fsrc = move || binary_source(op, d);
    map(cs, MapFn::Binary(op), fsrc, out_dtype, &[In::new(a, t), In::new(b, t)], shape)
}

/// The `fop` of a binary op on inputs of `d` (predicates: bool output; the others: `d`).
pub(crate) fn binary_source(op: BinaryOp, d: DType) -> String {
    let (t, c) = (ctype(d), compute_type(d));
    let e = op.cuda(d, "r0", "r1");
    let (out_t, rt, st) = if op.is_predicate() {
        ("u8", "u8", "r2".to_string())
    } else if d.is_float() {
        (t, c, store_float(d, "r2", d == DType::F64))
    } else {
        (t, c, "r2".to_string())
    };
    let (lp, lq) = (load(d, "p"), load(d, "q"));
    format!(
        "{}\n__device__ __forceinline__ {out_t} fop({t} p, {t} q) {{ {c} r0 = {lp}; {c} r1 = {lq}; {rt} r2 = {e}; return {st}; }}",
        op.cuda_decls(d)
    )
}

pub(crate) fn where_(
    cs: &GpuStream<'_>,
    c: &Storage,
    x: &Storage,
    y: &Storage,
    shape: &[usize],
    dtype: DType,
) -> Result<Storage> {
    // The dtype's own C type, which is also what `map` writes to `out`.
    let t = ctype(dtype);
    let fsrc = move || where_source(dtype);
    map(cs, MapFn::Where, fsrc, dtype, &[In::new(c, "u8"), In::new(x, t), In::new(y, t)], shape)
}

/// The `fop` of `where` with values of `d`: the stored values are selected as they are.
pub(crate) fn where_source(d: DType) -> String {
    let t = ctype(d);
    let e = select("r0", "r1", "r2");
    format!("__device__ __forceinline__ {t} fop(u8 r0, {t} r1, {t} r2) {{ return {e}; }}")
}

/// A row-major copy of any layout (bits only).
pub(crate) fn copy(cs: &GpuStream<'_>, x: &Storage) -> Result<Storage> {
    // The storage's own C type on both sides: map writes `out` as ctype(x.dtype), so a
    // raw-bits type here would convert bits to numbers.
    let t = ctype(x.dtype);
    let fsrc = move || format!("__device__ __forceinline__ {t} fop({t} x) {{ return x; }}");
    let shape = x.layout.shape.clone();
    map(cs, MapFn::Copy, fsrc, x.dtype, &[In::new(x, t)], &shape)
}

pub(crate) fn cast(cs: &GpuStream<'_>, x: &Storage, to: DType) -> Result<Storage> {
    let from = x.dtype;
    if from == to {
        return copy(cs, x);
    }
    let ft = ctype(from);
    let fsrc = move || cast_source(from, to);
    let shape = x.layout.shape.clone();
    map(cs, MapFn::Cast, fsrc, to, &[In::new(x, ft)], &shape)
}

/// The `fop` of `astype` from `from` to `to`.
pub(crate) fn cast_source(from: DType, to: DType) -> String {
    let (ft, tt, c) = (ctype(from), ctype(to), compute_type(from));
    let (l, e) = (load(from, "a"), cast_expr(from, to, "r0"));
    format!("__device__ __forceinline__ {tt} fop({ft} a) {{ {c} r0 = {l}; return {e}; }}")
}

// ---- sources ----

#[allow(clippy::too_many_arguments)]
fn index_kernel(
    cs: &GpuStream<'_>,
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
    let f = nvrtc::function(cs.driver(), &cs.dev, &full_key, "k_index", || {
        format!(
            "{PRELUDE}\nextern \"C\" __global__ void k_index({t}* __restrict__ out, i64 n, double a, double b, i64 m, u64 bits) {{\n\
             for (i64 i = blockIdx.x * (i64)blockDim.x + threadIdx.x; i < n; i += (i64)gridDim.x * blockDim.x) {{ {body} }}\n}}"
        )
    })?;
    let ptr = cuda_of(&out).map(|b| b.ptr()).unwrap_or(0);
    let n64 = n as i64;
    let bits = super::source::host_bits(dtype, a);
    let _ = cs.bind();
    let mut lb = Launch::new(&f);
    lb.arg(&ptr).arg(&n64).arg(&a).arg(&b).arg(&m).arg(&bits);
    // SAFETY: the arguments match the generated signature; `out` holds n elements.
    unsafe { lb.launch(cs, grid_for(n)) }.map_err(|e| super::backend_err("launch", e))?;
    Ok(out)
}

pub(crate) fn full(cs: &GpuStream<'_>, shape: &[usize], dtype: DType, value: f64) -> Result<Storage> {
    let bt = bits_type(dtype.size());
    let t = ctype(dtype);
    let body = format!("{bt} v = ({bt})bits; out[i] = *({t}*)&v;");
    index_kernel(cs, "full", dtype, shape, body, value, 0.0, 0)
}

pub(crate) fn arange(cs: &GpuStream<'_>, shape: &[usize], dtype: DType, start: f64, step: f64) -> Result<Storage> {
    // No contraction into an FMA: the CPU computes `start + i * step` with two roundings.
    let v = "__dadd_rn(a, __dmul_rn((double)i, b))";
    let e = if dtype == DType::Bool { format!("sat_u8({v})") } else { store_float(dtype, v, true) };
    let body = format!("out[i] = {e};");
    index_kernel(cs, "arange", dtype, shape, body, start, step, 0)
}

pub(crate) fn eye(cs: &GpuStream<'_>, shape: &[usize], dtype: DType, k: isize) -> Result<Storage> {
    let bt = bits_type(dtype.size());
    let t = ctype(dtype);
    // `a` carries 1 (its bits are `bits`); zero is all-zero bits for every dtype.
    let body =
        format!("i64 r = i / m, c = i - r * m; {bt} v = (c == r + (i64)b) ? ({bt})bits : ({bt})0; out[i] = *({t}*)&v;");
    let m = shape.get(1).copied().unwrap_or(1).max(1) as i64;
    index_kernel(cs, "eye", dtype, shape, body, 1.0, k as f64, m)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::cuda::fused_src::{Access, Plan, cuda_source};
    use crate::backend::cuda::nvrtc::check_compiles;
    use crate::dtype::ALL_DTYPES;
    use crate::primitives::Primitive;
    use crate::primitives::fused::FusedProgram;
    use crate::primitives::fused::fusable;
    use crate::primitives::fused::{Builder, Inst};

    /// The expression register `r` is defined by in generated source (`.. r = EXPR;`).
    fn definition<'a>(src: &'a str, r: &str) -> &'a str {
        let key = format!(" {r} = ");
        let start = src.find(&key).unwrap_or_else(|| panic!("no {r} in\n{src}")) + key.len();
        &src[start..start + src[start..].find(';').unwrap_or(0)]
    }

    /// The expression an eager `fop` returns (its last `return`).
    fn returned(src: &str) -> &str {
        let start = src.rfind("return ").unwrap_or_else(|| panic!("no return in\n{src}")) + "return ".len();
        &src[start..start + src[start..].find(';').unwrap_or(0)]
    }

    /// The fused kernel of a program of loads of `ins`, then `inst` into `out`.
    fn fused_source(ins: &[DType], inst: impl Fn(&[usize]) -> Inst, out: DType) -> String {
        let mut b = Builder::default();
        let regs: Vec<usize> = ins.iter().enumerate().map(|(k, &d)| b.load(k, d)).collect();
        let r = b.push(inst(&regs), out);
        let prog: FusedProgram = b.finish(r);
        cuda_source(&prog, &Plan::Linear { access: vec![Access::Contig; ins.len()], vec: 1, wide: false }, "k")
    }

    /// For every unary and binary op and every dtype the fuser fuses it on, the fused
    /// kernel and the eager kernel compute the op's value with the same expression text;
    /// so do `where` and every fused cast. Every op is compared on at least one dtype.
    #[test]
    fn eager_and_fused_kernels_write_the_same_expressions() {
        let mut compared: Vec<&str> = Vec::new();
        for op in UnaryOp::ALL {
            for d in ALL_DTYPES {
                let out = if op == UnaryOp::LogicalNot { DType::Bool } else { d };
                if !fusable(&Primitive::Unary(op), &[d], out) {
                    continue;
                }
                let fused = fused_source(&[d], |r| Inst::Unary(op, r[0]), out);
                let eager = unary_source(op, d);
                let (f, e) = (definition(&fused, "r1"), definition(&eager, "r1"));
                assert_eq!(f, e, "{} on {d}: fused and eager differ\nfused:\n{fused}\neager:\n{eager}", op.name());
                compared.push(op.name());
            }
        }
        for op in BinaryOp::ALL {
            for d in ALL_DTYPES {
                let out = if op.is_predicate() { DType::Bool } else { d };
                if !fusable(&Primitive::Binary(op), &[d, d], out) {
                    continue;
                }
                let fused = fused_source(&[d, d], |r| Inst::Binary(op, r[0], r[1]), out);
                let eager = binary_source(op, d);
                let (f, e) = (definition(&fused, "r2"), definition(&eager, "r2"));
                assert_eq!(f, e, "{} on {d}: fused and eager differ\nfused:\n{fused}\neager:\n{eager}", op.name());
                compared.push(op.name());
            }
        }
        for d in ALL_DTYPES.into_iter().filter(|&d| fusable(&Primitive::Where, &[DType::Bool, d, d], d)) {
            let fused = fused_source(&[DType::Bool, d, d], |r| Inst::Where(r[0], r[1], r[2]), d);
            let eager = where_source(d);
            assert_eq!(definition(&fused, "r3"), returned(&eager), "where on {d}\nfused:\n{fused}\neager:\n{eager}");
            compared.push("where");
        }
        for from in ALL_DTYPES {
            for to in ALL_DTYPES.into_iter().filter(|&to| to != from && fusable(&Primitive::Cast, &[from], to)) {
                // The fused register holds the stored value read back into its lane.
                let fused = fused_source(&[from], |r| Inst::Cast(r[0]), to);
                let eager = cast_source(from, to);
                let (f, e) = (definition(&fused, "r1"), returned(&eager));
                assert!(f.contains(e), "cast {from} to {to}: fused {f} does not store {e}\n{fused}\n{eager}");
                compared.push("astype");
            }
        }
        for name in UnaryOp::ALL.map(|o| o.name()).into_iter().chain(BinaryOp::ALL.map(|o| o.name())) {
            assert!(compared.contains(&name), "{name} is fused on no dtype: nothing compared");
        }
        assert!(compared.contains(&"where") && compared.contains(&"astype"));
        println!("{} (op, dtype) pairs compared", compared.len());
    }

    /// One `fop`, its output C type and its input C types.
    type Fop = (String, &'static str, Vec<&'static str>);

    /// A module of every `fop` in `fops` (renamed apart), each called by a kernel of its own.
    fn module(fops: &[Fop]) -> String {
        let mut s = PRELUDE.to_string();
        for (i, (f, out, ins)) in fops.iter().enumerate() {
            let params: String = ins.iter().enumerate().map(|(k, t)| format!(", const {t}* a{k}")).collect();
            let args: Vec<String> = (0..ins.len()).map(|k| format!("a{k}[0]")).collect();
            s.push_str(&f.replace("fop(", &format!("fop_{i}(")));
            s.push_str(&format!(
                "\nextern \"C\" __global__ void k_{i}({out}* o{params}) {{ o[0] = fop_{i}({}); }}\n",
                args.join(", ")
            ));
        }
        s
    }

    /// The eager kernel of every unary and binary op on every dtype it is defined on, of
    /// `where` on every dtype and of every cast compiles for sm_90 (when NVRTC loads):
    /// one module per input dtype.
    #[test]
    fn every_eager_kernel_compiles_for_sm90() {
        for d in ALL_DTYPES {
            let t = ctype(d);
            let mut fops: Vec<Fop> = Vec::new();
            for op in UnaryOp::ALL.into_iter().filter(|op| op.cuda(d, "r0").is_some()) {
                let out = if op == UnaryOp::LogicalNot { "u8" } else { t };
                fops.push((unary_source(op, d), out, vec![t]));
            }
            for op in BinaryOp::ALL {
                fops.push((binary_source(op, d), if op.is_predicate() { "u8" } else { t }, vec![t, t]));
            }
            fops.push((where_source(d), t, vec!["u8", t, t]));
            for to in ALL_DTYPES.into_iter().filter(|&to| to != d) {
                fops.push((cast_source(d, to), ctype(to), vec![t]));
            }
            if !check_compiles(&format!("test:eager:{d}"), &module(&fops)) {
                return;
            }
        }
    }
}
