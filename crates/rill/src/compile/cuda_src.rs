//! CUDA C source for a [`FusedProgram`], for the CUDA backend to compile with NVRTC.
//!
//! Pure string generation: nothing here needs a GPU. Registers follow the CPU
//! interpreter's lanes (`float` for f32/f16/bf16/bool registers, `double` for f64 and
//! integer loads) and are rounded to their dtype after each instruction, so the GPU
//! computes what the unfused kernels compute (up to the libm differences of the math
//! functions).

#![allow(dead_code)]

use std::fmt::Write;

use crate::compile::ir::{FusedProgram, Inst, wide_lane};
use crate::dtype::DType;
use crate::primitives::{BinaryOp, UnaryOp};

/// Most axes the generated kernels index; callers merge axes first (see
/// [`cuda_source`]).
pub(crate) const CUDA_MAX_DIMS: usize = 8;

/// The CUDA C storage type of a dtype.
pub(crate) fn c_type(d: DType) -> &'static str {
    match d {
        DType::Bool | DType::U8 => "unsigned char",
        DType::U32 => "unsigned int",
        DType::I32 => "int",
        DType::I64 => "long long",
        DType::F16 => "__half",
        DType::BF16 => "__nv_bfloat16",
        DType::F32 => "float",
        DType::F64 => "double",
    }
}

fn lane(d: DType) -> &'static str {
    if wide_lane(d) { "double" } else { "float" }
}

/// Expression reading a stored element `e` of dtype `d` into its lane.
fn load_expr(d: DType, e: &str) -> String {
    match d {
        DType::F16 => format!("__half2float({e})"),
        DType::BF16 => format!("__bfloat162float({e})"),
        DType::F32 => e.to_string(),
        d => format!("({})({e})", lane(d)),
    }
}

/// Statement rounding register `r` to dtype `d` (f16/bf16 only).
fn round_stmt(d: DType, r: &str) -> Option<String> {
    match d {
        DType::F16 => Some(format!("{r} = __half2float(__float2half_rn({r}));")),
        DType::BF16 => Some(format!("{r} = __bfloat162float(__float2bfloat16_rn({r}));")),
        _ => None,
    }
}

fn unary_expr(op: UnaryOp, x: &str, double: bool) -> String {
    use UnaryOp::*;
    let (f, l) = if double { ("", "") } else { ("f", "f") };
    match op {
        Neg => format!("(-{x})"),
        Abs => format!("fabs{f}({x})"),
        Sign => format!("({x} > 0 ? 1.0{l} : ({x} < 0 ? -1.0{l} : {x}))"),
        Exp => format!("exp{f}({x})"),
        Log => format!("log{f}({x})"),
        Log1p => format!("log1p{f}({x})"),
        Sqrt => format!("sqrt{f}({x})"),
        Rsqrt => format!("(1.0{l} / sqrt{f}({x}))"),
        Square => format!("({x} * {x})"),
        Reciprocal => format!("(1.0{l} / {x})"),
        Sin => format!("sin{f}({x})"),
        Cos => format!("cos{f}({x})"),
        Tanh => format!("tanh{f}({x})"),
        Sigmoid => format!("(1.0{l} / (1.0{l} + exp{f}(-{x})))"),
        Relu => format!("(({x} > 0 || isnan({x})) ? {x} : 0.0{l})"),
        Gelu => format!("(0.5{l} * {x} * (1.0{l} + erf{f}({x} * 0.7071067811865476{l})))"),
        GeluTanh => {
            format!(
                "(0.5{l} * {x} * (1.0{l} + tanh{f}(0.7978845608028654{l} * ({x} + 0.044715{l} * {x} * {x} * {x}))))"
            )
        }
        Silu => format!("({x} / (1.0{l} + exp{f}(-{x})))"),
        Erf => format!("erf{f}({x})"),
        Floor => format!("floor{f}({x})"),
        Ceil => format!("ceil{f}({x})"),
        Round => format!("rint{f}({x})"),
        LogicalNot => format!("(({x} == 0) ? 1.0f : 0.0f)"),
    }
}

fn binary_expr(op: BinaryOp, a: &str, b: &str, double: bool) -> String {
    use BinaryOp::*;
    let f = if double { "" } else { "f" };
    match op {
        Add => format!("({a} + {b})"),
        Sub => format!("({a} - {b})"),
        Mul => format!("({a} * {b})"),
        Div => format!("({a} / {b})"),
        Pow => format!("pow{f}({a}, {b})"),
        Maximum => format!("((isnan({a}) || {a} > {b}) ? {a} : {b})"),
        Minimum => format!("((isnan({a}) || {a} < {b}) ? {a} : {b})"),
        Equal => format!("(({a} == {b}) ? 1.0f : 0.0f)"),
        NotEqual => format!("(({a} != {b}) ? 1.0f : 0.0f)"),
        Less => format!("(({a} < {b}) ? 1.0f : 0.0f)"),
        LessEqual => format!("(({a} <= {b}) ? 1.0f : 0.0f)"),
        Greater => format!("(({a} > {b}) ? 1.0f : 0.0f)"),
        GreaterEqual => format!("(({a} >= {b}) ? 1.0f : 0.0f)"),
        LogicalAnd => format!("(({a} != 0 && {b} != 0) ? 1.0f : 0.0f)"),
        LogicalOr => format!("(({a} != 0 || {b} != 0) ? 1.0f : 0.0f)"),
    }
}

/// Expression converting register `x` of dtype `from` to dtype `to` (into `to`'s lane),
/// with the rules of the `astype` kernel.
fn cast_expr(from: DType, to: DType, x: &str) -> String {
    if to == DType::Bool {
        return format!("(({x} != 0) ? 1.0f : 0.0f)");
    }
    if to == DType::F64 {
        return format!("(double)({x})");
    }
    if from == DType::F64 {
        return match to {
            DType::F16 => format!("__half2float(__double2half({x}))"),
            DType::BF16 => format!("__bfloat162float(__double2bfloat16({x}))"),
            _ => format!("(float)({x})"),
        };
    }
    // Between non-f64 dtypes: through f32, then rounded to `to` by the caller.
    format!("(float)({x})")
}

fn constant_expr(v: f64, d: DType) -> String {
    if wide_lane(d) {
        format!("__longlong_as_double({}LL) /* {v} */", v.to_bits() as i64)
    } else {
        format!("__int_as_float({}) /* {v} */", (v as f32).to_bits() as i32)
    }
}

/// CUDA C source of a kernel computing `prog`, named `kernel_name`.
///
/// The source includes `cuda_fp16.h` and `cuda_bf16.h` (compile with NVRTC with the
/// CUDA include directory on the path) and defines one `extern "C"` kernel and its
/// parameter struct:
///
/// ```c
/// struct NAME_params { long long shape[8]; long long strides[K1][8]; };
/// extern "C" __global__ void NAME(OUT* out, const IN0* in0, ..., const IN{K-1}* in{K-1},
///                                 long long n, int ndim, NAME_params p);
/// ```
///
/// Arguments, in order:
/// - `out`: the output, contiguous, `n` elements of the output dtype's C type
///   ([`FusedProgram::output_dtype`]: `float`, `double`, `__half`, `__nv_bfloat16`,
///   `unsigned char` for bool).
/// - `in0 .. in{K-1}`: one pointer per external input, in
///   [`FusedProgram::input_dtypes`] order, each already advanced by its layout's element
///   offset. C types: bool/u8 `unsigned char`, u32 `unsigned int`, i32 `int`, f16
///   `__half`, bf16 `__nv_bfloat16`, f32 `float`, f64 `double`.
/// - `n`: the number of output elements.
/// - `ndim`: number of axes used in `p` (`1..=8`; pass 1 with `shape[0] = n` for a flat
///   array or a 0-d output).
/// - `p` (by value): `shape[0..ndim]`, the output shape (row-major), and
///   `strides[k][0..ndim]`, input k's element strides after broadcasting to the output
///   shape (0 on broadcast axes; may be negative). `K1 = max(K, 1)`. On the host it is
///   `#[repr(C)] struct { shape: [i64; 8], strides: [[i64; 8]; K1] }`. Callers should
///   merge axes (drop size-1 axes, fuse axes contiguous for the output and every input)
///   and fail with an error when more than 8 remain.
///
/// Launch: 1-D, any grid (the kernel loops with a grid stride), e.g. 256 threads per
/// block and `min(ceil(n / 256), 65535)` blocks; no shared memory. With `n == 0` do
/// not launch.
pub(crate) fn cuda_source(prog: &FusedProgram, kernel_name: &str) -> String {
    let k = prog.input_dtypes.len();
    let mut s = String::new();
    let _ = writeln!(s, "#include <cuda_fp16.h>\n#include <cuda_bf16.h>\n");
    let _ = writeln!(
        s,
        "struct {kernel_name}_params {{ long long shape[{CUDA_MAX_DIMS}]; long long strides[{}][{CUDA_MAX_DIMS}]; }};\n",
        k.max(1)
    );
    let mut args = vec![format!("{}* __restrict__ out", c_type(prog.output_dtype()))];
    for (i, &d) in prog.input_dtypes.iter().enumerate() {
        args.push(format!("const {}* __restrict__ in{i}", c_type(d)));
    }
    args.push("long long n".into());
    args.push("int ndim".into());
    args.push(format!("{kernel_name}_params p"));
    let _ = writeln!(s, "extern \"C\" __global__ void {kernel_name}({}) {{", args.join(", "));
    let _ = writeln!(s, "  long long stride = (long long)blockDim.x * gridDim.x;");
    let _ =
        writeln!(s, "  for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {{");
    for i in 0..k {
        let _ = writeln!(s, "    long long off{i} = 0;");
    }
    if k > 0 {
        let _ = writeln!(s, "    long long rem = i;");
        let _ = writeln!(s, "    for (int d = ndim - 1; d >= 0; --d) {{");
        let _ = writeln!(s, "      long long idx = rem % p.shape[d];");
        let _ = writeln!(s, "      rem /= p.shape[d];");
        for i in 0..k {
            let _ = writeln!(s, "      off{i} += idx * p.strides[{i}][d];");
        }
        let _ = writeln!(s, "    }}");
    }
    for (r, (inst, &d)) in prog.insts.iter().zip(&prog.dtypes).enumerate() {
        let ty = lane(d);
        let double = ty == "double";
        let e = match inst {
            Inst::Load(j) => load_expr(d, &format!("in{j}[off{j}]")),
            Inst::Const(v) => constant_expr(*v, d),
            Inst::Unary(op, a) => unary_expr(*op, &format!("r{a}"), wide_lane(prog.dtypes[*a]) && double),
            Inst::Binary(op, a, b) => binary_expr(*op, &format!("r{a}"), &format!("r{b}"), wide_lane(prog.dtypes[*a])),
            Inst::Where(c, a, b) => format!("((r{c} != 0) ? r{a} : r{b})"),
            Inst::Cast(a) => cast_expr(prog.dtypes[*a], d, &format!("r{a}")),
        };
        let _ = writeln!(s, "    {ty} r{r} = {e}; // {}", d.name());
        let rounds = !matches!(inst, Inst::Load(_) | Inst::Const(_));
        if let Some(st) = round_stmt(d, &format!("r{r}")).filter(|_| rounds) {
            let _ = writeln!(s, "    {st}");
        }
    }
    let o = format!("r{}", prog.out);
    let store = match prog.output_dtype() {
        DType::F16 => format!("__float2half_rn({o})"),
        DType::BF16 => format!("__float2bfloat16_rn({o})"),
        DType::Bool => format!("(unsigned char)({o} != 0)"),
        d => format!("({})({o})", c_type(d)),
    };
    let _ = writeln!(s, "    out[i] = {store};");
    let _ = writeln!(s, "  }}\n}}");
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::compile::ir::Builder;

    #[test]
    fn source_has_the_ops_and_signature() {
        // sigmoid(tanh(a * b + 1) * 0.5 + a) in f16, with a bool comparison and a cast.
        let mut b = Builder::default();
        let a = b.load(0, DType::F16);
        let x = b.load(1, DType::F16);
        let m = b.push(Inst::Binary(BinaryOp::Mul, a, x), DType::F16);
        let one = b.constant(1.0, DType::F16);
        let s = b.push(Inst::Binary(BinaryOp::Add, m, one), DType::F16);
        let t = b.push(Inst::Unary(UnaryOp::Tanh, s), DType::F16);
        let c = b.push(Inst::Binary(BinaryOp::Greater, t, a), DType::Bool);
        let w = b.push(Inst::Where(c, t, a), DType::F16);
        let f = b.push(Inst::Cast(w), DType::F32);
        let y = b.push(Inst::Unary(UnaryOp::Sigmoid, f), DType::F32);
        let prog = b.finish(y);
        let src = cuda_source(&prog, "rill_fused_7");
        for needle in [
            "#include <cuda_fp16.h>",
            "struct rill_fused_7_params { long long shape[8]; long long strides[2][8]; };",
            "extern \"C\" __global__ void rill_fused_7(float* __restrict__ out, const __half* __restrict__ in0, \
             const __half* __restrict__ in1, long long n, int ndim, rill_fused_7_params p)",
            "__half2float(in0[off0])",
            "float r2 = (r0 * r1);",
            "float r4 = (r2 + r3);",
            "r4 = __half2float(__float2half_rn(r4));",
            "float r5 = tanhf(r4);",
            "float r6 = ((r5 > r0) ? 1.0f : 0.0f);",
            "float r7 = ((r6 != 0) ? r5 : r0);",
            "float r8 = (float)(r7);",
            "(1.0f / (1.0f + expf(-r8)))",
            "off1 += idx * p.strides[1][d];",
            "out[i] = (float)(r9);",
        ] {
            assert!(src.contains(needle), "missing {needle:?} in\n{src}");
        }
        assert_eq!(src.matches('{').count(), src.matches('}').count(), "{src}");
    }

    #[test]
    fn double_and_bool_outputs() {
        let mut b = Builder::default();
        let a = b.load(0, DType::F64);
        let e = b.push(Inst::Unary(UnaryOp::Exp, a), DType::F64);
        let z = b.constant(2.5, DType::F64);
        let p = b.push(Inst::Binary(BinaryOp::Pow, e, z), DType::F64);
        let c = b.push(Inst::Binary(BinaryOp::Less, p, a), DType::Bool);
        let src = cuda_source(&b.finish(c), "k");
        assert!(src.contains("double r1 = exp(r0);"), "{src}");
        assert!(src.contains("pow(r1, r2)"), "{src}");
        assert!(src.contains("__longlong_as_double("), "{src}");
        assert!(src.contains("out[i] = (unsigned char)(r4 != 0);"), "{src}");
        assert!(src.contains("extern \"C\" __global__ void k(unsigned char* __restrict__ out, const double*"), "{src}");
    }
}
