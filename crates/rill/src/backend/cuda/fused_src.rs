//! CUDA C source for a [`FusedProgram`], for the CUDA backend to compile with NVRTC.
//!
//! Pure string generation and launch planning: nothing here needs a GPU. Registers follow
//! the CPU interpreter's lanes (`float` for f32/f16/bf16/bool registers, `double` for f64
//! and integer loads) and are rounded to their dtype after each instruction, with the
//! conversions the unfused kernels use (the CUDA backend's prelude). Each instruction's
//! expression is its op's one CUDA formula ([`UnaryOp::cuda`](crate::primitives::UnaryOp),
//! `BinaryOp::cuda`, and `primitives::cuda` for casts and `where`), the same text the
//! unfused kernels compute, so the GPU computes what the unfused kernels compute. The
//! formulas leave no FMA contraction to the compiler (their additions, subtractions and
//! multiplications are the explicitly rounded intrinsics `__fadd_rn`, `__fmul_rn`, ...),
//! so fusing a chain of ops into one function changes no rounding.
//!
//! A program is launched with a [`Plan`] chosen from its operands' layouts
//! ([`plan`]): a *linear* kernel when every input, after merging axes, is contiguous with
//! the output, a broadcast scalar, or a row (or column) vector broadcast over a 2-D output
//! (read at `i % cols` or `i / cols`), using 16-byte vector loads and stores when the
//! pointers line up; otherwise a *strided* kernel, unrolled for the number of merged
//! axes. Both use 32-bit index arithmetic when every index fits.
//!
//! For a fused reduction, [`reduce_read`] gives the pieces with which the CUDA backend's
//! reduction kernels compute each element they reduce: the program as a device function
//! of its input values, the input parameters, each row's pointers and the element
//! expression.

use std::fmt::Write;

use crate::dtype::DType;
use crate::primitives::cuda;
use crate::primitives::fused::{FusedProgram, Inst, Reg, wide_lane};

/// Most axes the generated kernels index; callers merge axes first (see
/// [`cuda_source`]).
pub(crate) const CUDA_MAX_DIMS: usize = 8;

/// Threads per block of the fused kernels (the kernels declare it as a launch bound).
pub(crate) const FUSED_BLOCK: u32 = 256;

/// The CUDA C storage type of a dtype (the type names of the CUDA backend's prelude).
pub(crate) fn c_type(d: DType) -> &'static str {
    d.c_type()
}

fn lane(d: DType) -> &'static str {
    if wide_lane(d) { "double" } else { "float" }
}

/// Expression reading a stored element `e` of dtype `d` into its lane.
fn load_expr(d: DType, e: &str) -> String {
    match d {
        DType::F16 => format!("ld_f16({e})"),
        DType::BF16 => format!("ld_bf16({e})"),
        DType::F32 => e.to_string(),
        d => format!("({})({e})", lane(d)),
    }
}

/// Statement rounding register `r` to dtype `d` (f16/bf16 only).
fn round_stmt(d: DType, r: &str) -> Option<String> {
    match d {
        DType::F16 => Some(format!("{r} = ld_f16(st_f16({r}));")),
        DType::BF16 => Some(format!("{r} = ld_bf16(st_bf16({r}));")),
        _ => None,
    }
}

fn constant_expr(v: f64, d: DType) -> String {
    if wide_lane(d) {
        format!("__longlong_as_double({}LL) /* {v} */", v.to_bits() as i64)
    } else {
        format!("__int_as_float({}) /* {v} */", (v as f32).to_bits() as i32)
    }
}

/// How a linear kernel reads one input at output element `i`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Access {
    /// `in[i]`: contiguous with the output.
    Contig,
    /// `in[0]`: one value broadcast everywhere (read once per thread).
    Scalar,
    /// `in[i % cols]`: a row vector broadcast along the rows of a 2-D output.
    Row,
    /// `in[i / cols]`: a column vector broadcast along the columns of a 2-D output.
    Col,
}

/// How a fused kernel walks its output (see the module docs).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Plan {
    /// One linear index over the output; input `k` is read as `access[k]` says.
    /// `vec > 1`: the main loop handles `vec` consecutive elements per step with one
    /// vector load per contiguous or row operand and one vector store (16 bytes for the
    /// widest of them), then a scalar tail. `wide`: 64-bit indices.
    Linear { access: Vec<Access>, vec: usize, wide: bool },
    /// Row-major decomposition over `ndim` merged axes, with per-input strides.
    Strided { ndim: usize, wide: bool },
}

impl Plan {
    /// A short byte key naming the plan (for kernel memos).
    pub(crate) fn key_bytes(&self, out: &mut Vec<u8>) {
        match self {
            Plan::Linear { access, vec, wide } => {
                out.extend([0, *vec as u8, *wide as u8]);
                out.extend(access.iter().map(|a| *a as u8));
            }
            Plan::Strided { ndim, wide } => out.extend([1, *ndim as u8, *wide as u8]),
        }
    }
    /// Units of work the launch covers (vectors for a vector plan, else elements); the
    /// grid needs one thread per unit at most (it loops with a grid stride).
    pub(crate) fn units(&self, n: usize) -> usize {
        match self {
            Plan::Linear { vec, .. } if *vec > 1 => (n / vec).max(1),
            _ => n,
        }
    }
}

/// One input of a launch, as [`plan`] sees it after axes are merged.
pub(crate) struct Operand<'a> {
    /// Element strides over the merged axes (0 on broadcast axes).
    pub strides: &'a [isize],
    /// Address of the first element (already advanced by the layout's offset).
    pub addr: u64,
    /// Element size in bytes.
    pub size: usize,
}

/// Chooses the kernel for an output of `n` elements whose merged axes are `dims`
/// (row-major, contiguous output at `out_addr` with elements of `out_size` bytes).
pub(crate) fn plan(dims: &[usize], ins: &[Operand<'_>], out_addr: u64, out_size: usize, n: usize) -> Plan {
    let small = n <= i32::MAX as usize;
    let access: Option<Vec<Access>> = match dims.len() {
        0 => Some(vec![Access::Scalar; ins.len()]),
        1 => ins
            .iter()
            .map(|o| match o.strides[0] {
                1 => Some(Access::Contig),
                0 => Some(Access::Scalar),
                _ => None,
            })
            .collect(),
        2 => {
            let cols = dims[1] as isize;
            ins.iter()
                .map(|o| match (o.strides[0], o.strides[1]) {
                    (r, 1) if r == cols => Some(Access::Contig),
                    (0, 1) => Some(Access::Row),
                    (1, 0) => Some(Access::Col),
                    (0, 0) => Some(Access::Scalar),
                    _ => None,
                })
                .collect()
        }
        _ => None,
    };
    let Some(access) = access else {
        // Every offset must fit an i32 for the 32-bit strided kernel.
        let extent = |o: &Operand<'_>| -> usize {
            dims.iter().zip(o.strides).map(|(&d, &s)| (d - 1).saturating_mul(s.unsigned_abs())).sum()
        };
        let wide = !small || ins.iter().any(|o| extent(o) > i32::MAX as usize);
        return Plan::Strided { ndim: dims.len(), wide };
    };
    let cols = if dims.len() == 2 { dims[1] } else { 1 };
    let vector_read = |a: Access| matches!(a, Access::Contig | Access::Row);
    let widest =
        ins.iter().zip(&access).filter(|(_, a)| vector_read(**a)).map(|(o, _)| o.size).fold(out_size, usize::max);
    let mut vec = (16 / widest.max(1)).max(1);
    let aligned = |addr: u64, size: usize| addr.is_multiple_of((size * vec) as u64);
    let fits = aligned(out_addr, out_size)
        && ins.iter().zip(&access).all(|(o, &a)| !vector_read(a) || aligned(o.addr, o.size))
        && (cols % vec == 0 || access.iter().all(|a| matches!(a, Access::Contig | Access::Scalar)));
    if !fits {
        vec = 1;
    }
    Plan::Linear { access, vec, wide: !small }
}

/// The device function computing `prog` for one element:
/// `__device__ OUT fused_op(IN0 v0, ..., IN{K-1} v{K-1})` (stored C types in and out).
pub(crate) fn op_function(prog: &FusedProgram) -> String {
    let mut s = String::new();
    let mut params: Vec<String> =
        prog.input_dtypes.iter().enumerate().map(|(i, &d)| format!("{} v{i}", c_type(d))).collect();
    // Several outputs are stored through references: `fused_op(ins.., out0, out1, ..)`.
    let out_t = c_type(prog.output_dtype());
    if !prog.more.is_empty() {
        params.extend((0..prog.output_count()).map(|j| format!("{out_t}& o{j}")));
    }
    let ret = if prog.more.is_empty() { out_t } else { "void" };
    let _ = writeln!(s, "__device__ __forceinline__ {ret} fused_op({}) {{", params.join(", "));
    for (r, (inst, &d)) in prog.insts.iter().zip(&prog.dtypes).enumerate() {
        let ty = lane(d);
        let reg = |a: &Reg| format!("r{a}");
        let e = match inst {
            Inst::Load(j) => load_expr(d, &format!("v{j}")),
            Inst::Const(v) => constant_expr(*v, d),
            Inst::Unary(op, a) => {
                let da = prog.dtypes[*a];
                op.cuda(da, &reg(a)).unwrap_or_else(|| cuda::undefined(op.name(), da))
            }
            Inst::Binary(op, a, b) => op.cuda(prog.dtypes[*a], &reg(a), &reg(b)),
            Inst::Where(c, a, b) => cuda::select(&reg(c), &reg(a), &reg(b)),
            // Stored as `d` (rounded once), then read back into the lane.
            Inst::Cast(a) => load_expr(d, &cuda::cast(prog.dtypes[*a], d, &reg(a))),
        };
        let _ = writeln!(s, "  {ty} r{r} = {e}; // {}", d.name());
        // Computed f16/bf16 values are rounded to their dtype (a cast already is).
        let rounds = match inst {
            Inst::Unary(..) | Inst::Binary(..) | Inst::Where(..) => true,
            Inst::Load(_) | Inst::Const(_) | Inst::Cast(_) => false,
        };
        if let Some(st) = round_stmt(d, &format!("r{r}")).filter(|_| rounds) {
            let _ = writeln!(s, "  {st}");
        }
    }
    let store = |r: Reg| {
        let o = format!("r{r}");
        match prog.output_dtype() {
            DType::F16 => format!("st_f16({o})"),
            DType::BF16 => format!("st_bf16({o})"),
            DType::Bool => format!("(u8)({o} != 0)"),
            d => format!("({})({o})", c_type(d)),
        }
    };
    if prog.more.is_empty() {
        let _ = writeln!(s, "  return {};\n}}", store(prog.out));
    } else {
        for (j, r) in prog.outputs().enumerate() {
            let _ = writeln!(s, "  o{j} = {};", store(r));
        }
        let _ = writeln!(s, "}}");
    }
    s
}

/// How a reduction kernel computes the elements of one row of a program's values (see
/// [`reduce_read`]); the CUDA backend's reduction module places the pieces.
pub(crate) struct RowRead {
    /// Device code the element expression calls: the program as `fused_op`.
    pub decls: String,
    /// The kernel's data parameters: `const IN0* __restrict__ in0, ...` (one per input, in
    /// [`FusedProgram::input_dtypes`] order), then `i64 rs0, ...`, each input's element
    /// stride between rows. Empty for a program without inputs.
    pub params: String,
    /// Statements run once per row, with the row index `i64 r` in scope.
    pub row: String,
    /// The body of the C macro `ELEM(j)`: the program's value (its output dtype's C type)
    /// at element `j` of the row.
    pub elem: String,
}

/// The row reader of a reduction over `prog`'s values laid out as rows: element `j` of row
/// `r` reads input `k` at `in_k[r * rs_k + j]` when `along[k]`, else at `in_k[r * rs_k]`
/// (constant along the row, read once per row), the pointers already advanced by each
/// layout's offset.
pub(crate) fn reduce_read(prog: &FusedProgram, along: &[bool]) -> RowRead {
    let mut params: Vec<String> = Vec::new();
    let mut row = String::new();
    let mut args: Vec<String> = Vec::new();
    for (k, (&d, &a)) in prog.input_dtypes.iter().zip(along).enumerate() {
        let t = c_type(d);
        params.push(format!("const {t}* __restrict__ in{k}"));
        if a {
            let _ = write!(row, "const {t}* p{k} = in{k} + r * rs{k}; ");
            args.push(format!("p{k}[(j)]"));
        } else {
            let _ = write!(row, "const {t} s{k} = in{k}[r * rs{k}]; ");
            args.push(format!("s{k}"));
        }
    }
    params.extend((0..prog.input_dtypes.len()).map(|k| format!("i64 rs{k}")));
    RowRead {
        decls: op_function(prog),
        params: params.join(", "),
        row: row.trim_end().to_string(),
        elem: format!("fused_op({})", args.join(", ")),
    }
}

/// CUDA C source of the kernel `kernel_name` computing `prog` with launch plan `plan`.
///
/// The source expects the CUDA backend's prelude before it (the types `u8`, `u16`, `u32`,
/// `i32`, `i64`, `u64` and the conversions `ld_f16`, `st_f16`, `st_f16_d`, `ld_bf16`,
/// `st_bf16`, `st_bf16_d`); it includes no header. It defines one `extern "C"` kernel,
/// with `I` = `unsigned int`, `S` = `int` (or `unsigned long long` and `long long` when
/// the plan is wide):
///
/// ```c
/// // Plan::Linear
/// extern "C" __global__ void NAME(OUT* out, const IN0* in0, ..., I n, I cols);
/// // Plan::Strided { ndim: D }
/// struct NAME_params { I shape[D]; S strides[K1][D]; };
/// extern "C" __global__ void NAME(OUT* out, const IN0* in0, ..., I n, NAME_params p);
/// ```
///
/// - `out`: the output, contiguous, `n` elements of the output dtype's C type
///   ([`c_type`] of [`FusedProgram::output_dtype`]); 16-byte aligned for a vector plan.
/// - `in0 .. in{K-1}`: one pointer per external input, in
///   [`FusedProgram::input_dtypes`] order, each already advanced by its layout's element
///   offset (aligned to its element size times `vec` for a vector plan's contiguous and
///   row operands).
/// - `n`: the number of output elements (`n > 0`).
/// - `cols`: the length of the last merged axis when the plan reads a row or column
///   operand (a multiple of `vec` for a vector plan), else 1.
/// - `p` (by value, strided plans): `shape[0..D]`, the merged output shape (row-major),
///   and `strides[k][0..D]`, input k's element strides after broadcasting (0 on
///   broadcast axes; may be negative). `K1 = max(K, 1)`. On the host it is a flat array
///   of `D * (1 + K1)` integers of the index width.
///
/// Launch: 1-D, blocks of [`FUSED_BLOCK`] threads, any number of blocks up to
/// `ceil(plan.units(n) / FUSED_BLOCK)` (the kernels loop with a grid stride); no shared
/// memory.
pub(crate) fn cuda_source(prog: &FusedProgram, plan: &Plan, kernel_name: &str) -> String {
    let k = prog.input_dtypes.len();
    let mut s = op_function(prog);
    let wide = match plan {
        Plan::Linear { wide, .. } | Plan::Strided { wide, .. } => *wide,
    };
    let (ix, sx) = if wide { ("unsigned long long", "long long") } else { ("unsigned int", "int") };
    let out_t = c_type(prog.output_dtype());
    let mut args = vec![format!("{out_t}* __restrict__ out")];
    for (i, &d) in prog.input_dtypes.iter().enumerate() {
        args.push(format!("const {}* __restrict__ in{i}", c_type(d)));
    }
    args.push(format!("{ix} n"));
    let head = |s: &mut String, args: &[String]| {
        let _ = writeln!(
            s,
            "extern \"C\" __global__ void __launch_bounds__({FUSED_BLOCK}) {kernel_name}({}) {{",
            args.join(", ")
        );
        let _ = writeln!(s, "  const {ix} step = ({ix})blockDim.x * gridDim.x;");
        let _ = writeln!(s, "  const {ix} gid = ({ix})blockIdx.x * blockDim.x + threadIdx.x;");
    };
    match plan {
        Plan::Linear { access, vec, .. } => {
            args.push(format!("{ix} cols"));
            let vec = *vec;
            if vec > 1 {
                let _ =
                    writeln!(s, "template <typename T, int N> struct alignas(sizeof(T) * N) fused_vec {{ T v[N]; }};");
            }
            head(&mut s, &args);
            let _ = writeln!(s, "  (void)cols;");
            for (i, a) in access.iter().enumerate() {
                if *a == Access::Scalar {
                    let _ = writeln!(s, "  const {} s{i} = in{i}[0];", c_type(prog.input_dtypes[i]));
                }
            }
            // The arguments of fused_op at element `e`.
            let elem_args = |e: &str| -> String {
                access
                    .iter()
                    .enumerate()
                    .map(|(i, a)| match a {
                        Access::Contig => format!("in{i}[{e}]"),
                        Access::Scalar => format!("s{i}"),
                        Access::Row => format!("in{i}[{e} % cols]"),
                        Access::Col => format!("in{i}[{e} / cols]"),
                    })
                    .collect::<Vec<_>>()
                    .join(", ")
            };
            if vec == 1 {
                let _ = writeln!(s, "  for ({ix} i = gid; i < n; i += step) out[i] = fused_op({});", elem_args("i"));
            } else {
                let _ = writeln!(s, "  const {ix} nv = n / {vec};");
                let _ = writeln!(s, "  for ({ix} t = gid; t < nv; t += step) {{");
                let _ = writeln!(s, "    const {ix} base = t * {vec};");
                let _ = writeln!(s, "    (void)base;");
                for (i, a) in access.iter().enumerate() {
                    let t = c_type(prog.input_dtypes[i]);
                    let line = match a {
                        Access::Contig => {
                            format!("const fused_vec<{t}, {vec}> x{i} = ((const fused_vec<{t}, {vec}>*)in{i})[t];")
                        }
                        Access::Row => {
                            format!(
                                "const fused_vec<{t}, {vec}> x{i} = *(const fused_vec<{t}, {vec}>*)(in{i} + base % cols);"
                            )
                        }
                        Access::Col => format!("const {t} x{i} = in{i}[base / cols];"),
                        Access::Scalar => continue,
                    };
                    let _ = writeln!(s, "    {line}");
                }
                let lane_args: Vec<String> = access
                    .iter()
                    .enumerate()
                    .map(|(i, a)| match a {
                        Access::Contig | Access::Row => format!("x{i}.v[j]"),
                        Access::Col => format!("x{i}"),
                        Access::Scalar => format!("s{i}"),
                    })
                    .collect();
                let _ = writeln!(s, "    fused_vec<{out_t}, {vec}> o;");
                let _ = writeln!(s, "#pragma unroll");
                let _ = writeln!(s, "    for (int j = 0; j < {vec}; ++j) o.v[j] = fused_op({});", lane_args.join(", "));
                let _ = writeln!(s, "    ((fused_vec<{out_t}, {vec}>*)out)[t] = o;");
                let _ = writeln!(s, "  }}");
                let _ = writeln!(s, "  const {ix} r = nv * {vec} + gid;");
                let _ = writeln!(s, "  if (r < n) out[r] = fused_op({});", elem_args("r"));
            }
        }
        Plan::Strided { ndim, .. } => {
            let d = (*ndim).max(1);
            let _ = writeln!(s, "struct {kernel_name}_params {{ {ix} shape[{d}]; {sx} strides[{}][{d}]; }};", k.max(1));
            args.push(format!("{kernel_name}_params p"));
            head(&mut s, &args);
            let _ = writeln!(s, "  for ({ix} i = gid; i < n; i += step) {{");
            let _ = writeln!(s, "    {ix} rem = i;");
            for i in 0..k {
                let _ = writeln!(s, "    {sx} off{i} = 0;");
            }
            let _ = writeln!(s, "#pragma unroll");
            let _ = writeln!(s, "    for (int d = {} ; d > 0; --d) {{", d - 1);
            let _ = writeln!(s, "      const {ix} q = rem / p.shape[d];");
            let _ = writeln!(s, "      const {sx} c = ({sx})(rem - q * p.shape[d]);");
            let _ = writeln!(s, "      rem = q;");
            for i in 0..k {
                let _ = writeln!(s, "      off{i} += c * p.strides[{i}][d];");
            }
            let _ = writeln!(s, "    }}");
            for i in 0..k {
                let _ = writeln!(s, "    off{i} += ({sx})rem * p.strides[{i}][0];");
            }
            let call: Vec<String> = (0..k).map(|i| format!("in{i}[off{i}]")).collect();
            let _ = writeln!(s, "    out[i] = fused_op({});", call.join(", "));
            let _ = writeln!(s, "  }}");
        }
    }
    let _ = writeln!(s, "}}");
    s
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::primitives::fused::Builder;
    use crate::primitives::{BinaryOp, UnaryOp};

    /// sigmoid(tanh(a * b + 1) > a ? .. : ..) in f16 with a bool comparison and a cast.
    pub(crate) fn f16_program() -> FusedProgram {
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
        b.finish(y)
    }

    fn contig(n: usize) -> Plan {
        Plan::Linear { access: vec![Access::Contig; n], vec: 1, wide: false }
    }

    #[test]
    fn op_function_has_the_ops() {
        let src = cuda_source(&f16_program(), &contig(2), "rill_fused_7");
        for needle in [
            "__device__ __forceinline__ float fused_op(u16 v0, u16 v1) {",
            "float r0 = ld_f16(v0);",
            "float r2 = __fmul_rn(r0, r1);",
            "float r4 = __fadd_rn(r2, r3);",
            "r4 = ld_f16(st_f16(r4));",
            "float r5 = tanhf(r4);",
            "float r6 = (r5 > r0);",
            "float r7 = ((r6 != 0) ? r5 : r0);",
            "float r8 = (float)(r7);",
            "(1.0f / __fadd_rn(1.0f, expf(-r8)))",
            "return (float)(r9);",
            "extern \"C\" __global__ void __launch_bounds__(256) rill_fused_7(float* __restrict__ out, \
             const u16* __restrict__ in0, const u16* __restrict__ in1, unsigned int n, unsigned int cols)",
            "out[i] = fused_op(in0[i], in1[i]);",
        ] {
            assert!(src.contains(needle), "missing {needle:?} in\n{src}");
        }
        assert!(!src.contains("#include"), "{src}");
        assert_eq!(src.matches('{').count(), src.matches('}').count(), "{src}");
    }

    #[test]
    fn vector_row_col_and_scalar_reads() {
        let plan = Plan::Linear { access: vec![Access::Contig, Access::Row], vec: 8, wide: false };
        let src = cuda_source(&f16_program(), &plan, "k");
        for needle in [
            "const fused_vec<u16, 8> x0 = ((const fused_vec<u16, 8>*)in0)[t];",
            "const fused_vec<u16, 8> x1 = *(const fused_vec<u16, 8>*)(in1 + base % cols);",
            "o.v[j] = fused_op(x0.v[j], x1.v[j]);",
            "((fused_vec<float, 8>*)out)[t] = o;",
            "if (r < n) out[r] = fused_op(in0[r], in1[r % cols]);",
        ] {
            assert!(src.contains(needle), "missing {needle:?} in\n{src}");
        }
        let plan = Plan::Linear { access: vec![Access::Col, Access::Scalar], vec: 1, wide: true };
        let src = cuda_source(&f16_program(), &plan, "k");
        assert!(src.contains("const u16 s1 = in1[0];"), "{src}");
        assert!(src.contains("unsigned long long n"), "{src}");
        assert!(src.contains("out[i] = fused_op(in0[i / cols], s1);"), "{src}");
    }

    #[test]
    fn strided_source() {
        let src = cuda_source(&f16_program(), &Plan::Strided { ndim: 3, wide: false }, "k");
        for needle in [
            "struct k_params { unsigned int shape[3]; int strides[2][3]; };",
            "for (int d = 2 ; d > 0; --d) {",
            "off1 += c * p.strides[1][d];",
            "off0 += (int)rem * p.strides[0][0];",
            "out[i] = fused_op(in0[off0], in1[off1]);",
        ] {
            assert!(src.contains(needle), "missing {needle:?} in\n{src}");
        }
    }

    #[test]
    fn double_and_bool_outputs() {
        let mut b = Builder::default();
        let a = b.load(0, DType::F64);
        let e = b.push(Inst::Unary(UnaryOp::Exp, a), DType::F64);
        let z = b.constant(2.5, DType::F64);
        let p = b.push(Inst::Binary(BinaryOp::Pow, e, z), DType::F64);
        let c = b.push(Inst::Binary(BinaryOp::Less, p, a), DType::Bool);
        let src = cuda_source(&b.finish(c), &contig(1), "k");
        assert!(src.contains("double r1 = exp(r0);"), "{src}");
        assert!(src.contains("pow(r1, r2)"), "{src}");
        assert!(src.contains("__longlong_as_double("), "{src}");
        assert!(src.contains("return (u8)(r4 != 0);"), "{src}");
        assert!(src.contains("k(u8* __restrict__ out, const double* __restrict__ in0"), "{src}");
    }

    #[test]
    fn reduce_read_pieces() {
        let r = reduce_read(&f16_program(), &[true, false]);
        assert!(r.decls.contains("__device__ __forceinline__ float fused_op(u16 v0, u16 v1) {"), "{}", r.decls);
        assert_eq!(r.params, "const u16* __restrict__ in0, const u16* __restrict__ in1, i64 rs0, i64 rs1");
        assert_eq!(r.row, "const u16* p0 = in0 + r * rs0; const u16 s1 = in1[r * rs1];");
        assert_eq!(r.elem, "fused_op(p0[(j)], s1)");
    }

    fn op(strides: &[isize], addr: u64, size: usize) -> Operand<'_> {
        Operand { strides, addr, size }
    }

    #[test]
    fn plans() {
        use Access::*;
        let n = 1000;
        // Contiguous f32 inputs, aligned: float4.
        let p = plan(&[n], &[op(&[1], 4096, 4), op(&[1], 8192, 4)], 0, 4, n);
        assert_eq!(p, Plan::Linear { access: vec![Contig, Contig], vec: 4, wide: false });
        // A sliced input one element off: scalar loop.
        let p = plan(&[n], &[op(&[1], 4100, 4), op(&[0], 8, 4)], 0, 4, n);
        assert_eq!(p, Plan::Linear { access: vec![Contig, Scalar], vec: 1, wide: false });
        // f16 in and out: 8 halves; a scalar input does not limit the width.
        let p = plan(&[n], &[op(&[1], 16, 2), op(&[0], 2, 8)], 32, 2, n);
        assert_eq!(p, Plan::Linear { access: vec![Contig, Scalar], vec: 8, wide: false });
        // Bias along the last axis of [8, 64] and a per-row column.
        let p = plan(&[8, 64], &[op(&[64, 1], 0, 4), op(&[0, 1], 256, 4), op(&[1, 0], 4, 4)], 0, 4, 512);
        assert_eq!(p, Plan::Linear { access: vec![Contig, Row, Col], vec: 4, wide: false });
        // Rows whose length is not a multiple of the vector width: no vectors.
        let p = plan(&[8, 30], &[op(&[30, 1], 0, 4), op(&[0, 1], 0, 4)], 0, 4, 240);
        assert_eq!(p, Plan::Linear { access: vec![Contig, Row], vec: 1, wide: false });
        // A transpose: strided.
        assert_eq!(plan(&[8, 30], &[op(&[1, 8], 0, 4)], 0, 4, 240), Plan::Strided { ndim: 2, wide: false });
        assert_eq!(plan(&[n], &[op(&[2], 0, 4)], 0, 4, n), Plan::Strided { ndim: 1, wide: false });
        // Indices past i32: 64-bit.
        let big = 1usize << 31;
        assert_eq!(
            plan(&[big], &[op(&[1], 0, 4)], 0, 4, big),
            Plan::Linear { access: vec![Contig], vec: 4, wide: true }
        );
        assert_eq!(plan(&[2, 1 << 30], &[op(&[1, 4], 0, 4)], 0, 4, 1 << 31), Plan::Strided { ndim: 2, wide: true });
        assert_eq!(plan(&[2, 1 << 20], &[op(&[1, 4096], 0, 4)], 0, 4, 1 << 21), Plan::Strided { ndim: 2, wide: true });
        // A 0-d output.
        assert_eq!(plan(&[], &[op(&[], 0, 8)], 0, 8, 1), Plan::Linear { access: vec![Scalar], vec: 2, wide: false });
    }
}
