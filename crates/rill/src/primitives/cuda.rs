//! CUDA C text of the elementwise primitives: the value conversions every elementwise
//! kernel uses, and the `cast` and `where` expressions. The op formulas live with their
//! enums ([`UnaryOp::cuda`](super::UnaryOp::cuda), [`BinaryOp::cuda`](super::BinaryOp::cuda)).
//!
//! Both CUDA code generators build their kernels from these expressions and from nowhere
//! else: the eager kernels (one op per kernel, `backend/cuda/elementwise.rs`) and the
//! fused kernels (`backend/cuda/fused_src.rs`), so an op computes the same bits fused or
//! not. The CPU kernels (`backend/cpu/elementwise.rs`, and the fused interpreter
//! `backend/cpu/fused.rs`) compute the same functions; transcendental functions
//! (`exp`, `tanh`, ...) come from different libraries there and may differ in the last
//! place. The semantics:
//!
//! - f16 and bf16 compute in `float` and are rounded to their dtype after each op; f32
//!   computes in `float`, f64 in `double` ([`compute_type`]).
//! - No contraction: every `+`, `-` and `*` of a formula is an explicitly rounded
//!   intrinsic (`__fadd_rn`, `__fmul_rn`, `__dadd_rn`, ...), which the compiler never
//!   fuses into an FMA, so a formula rounds as the CPU (which never contracts) does,
//!   whatever code surrounds it. `square` is `x * x` rounded once.
//! - NaN propagates through `relu`, `sign`, `maximum` and `minimum` (as in NumPy and
//!   PyTorch); `round` is half to even; the math functions are the precise ones (`expf`,
//!   not `__expf`).
//! - Integer arithmetic wraps, integer division by zero gives 0, integer powers with
//!   negative exponents give 0 except for bases 1 and -1.
//! - Conversions follow Rust's `as` and the `half` crate: floats to integers saturate
//!   (NaN gives 0), every conversion rounds once to nearest even (integers that f32 does
//!   not hold exactly go to f16/bf16 through `double`), and any nonzero value (NaN too)
//!   is `true`.
//!
//! A formula's operands are identifiers (register names) holding values in the compute
//! type of their dtype, except that integer operands may also be held in `double` (the
//! fused kernels load them so: every u8, u32 and i32 is exact there), which the formulas
//! that the fused kernels use on integers (comparisons, `logical_not`, casts) allow. The
//! expressions call the conversions of the CUDA backend's prelude (`backend/cuda/source.rs`:
//! `ld_f16`, `st_f16`, `st_bf16_d`, `sat_i32`, ...).

#![cfg_attr(not(feature = "cuda"), allow(dead_code))]

use crate::dtype::DType;

/// The C type values of `d` are computed in: `float` for f16, bf16 and f32, `double` for
/// f64, the storage type ([`DType::c_type`]) for the integers and bool.
pub(crate) fn compute_type(d: DType) -> &'static str {
    match d {
        DType::F16 | DType::BF16 | DType::F32 => "float",
        DType::F64 => "double",
        DType::Bool | DType::U8 | DType::U32 | DType::I32 | DType::I64 => d.c_type(),
    }
}

/// The unsigned C type of the same width (wrapping integer arithmetic).
pub(crate) fn utype(d: DType) -> &'static str {
    match d {
        DType::Bool | DType::U8 => "u8",
        DType::U32 | DType::I32 => "u32",
        DType::I64 => "u64",
        DType::F16 | DType::BF16 => "u16",
        DType::F32 => "u32",
        DType::F64 => "u64",
    }
}

/// An expression converting a stored value `e` of `d` to its [`compute_type`].
pub(crate) fn load(d: DType, e: &str) -> String {
    match d {
        DType::F16 => format!("ld_f16({e})"),
        DType::BF16 => format!("ld_bf16({e})"),
        DType::Bool | DType::U8 | DType::U32 | DType::I32 | DType::I64 | DType::F32 | DType::F64 => e.to_string(),
    }
}

/// An expression storing a float-typed (`float`, or `double` when `wide`) value `e` as `d`
/// with Rust `as`/`half` semantics.
pub(crate) fn store_float(d: DType, e: &str, wide: bool) -> String {
    match (d, wide) {
        (DType::F16, false) => format!("st_f16({e})"),
        (DType::F16, true) => format!("st_f16_d({e})"),
        (DType::BF16, false) => format!("st_bf16({e})"),
        (DType::BF16, true) => format!("st_bf16_d({e})"),
        (DType::F32, _) => format!("(float)({e})"),
        (DType::F64, _) => format!("(double)({e})"),
        (DType::Bool, _) => format!("(u8)(({e}) != 0)"),
        (DType::U8, _) => format!("sat_u8((double)({e}))"),
        (DType::U32, _) => format!("sat_u32((double)({e}))"),
        (DType::I32, _) => format!("sat_i32((double)({e}))"),
        (DType::I64, _) => format!("sat_i64((double)({e}))"),
    }
}

/// `astype`: an expression converting `x`, a value of `from` (in its compute type, or in
/// `double` for an integer), to the storage type of `to` ([`DType::c_type`]).
///
/// To bool: `x != 0`. Between integers: through i64 (wrapping). From f16, bf16 or f32 to
/// anything but f64: from `float`, rounded once. Otherwise (from f64 or an integer, or to
/// f64) through `double`, which holds every source exactly, rounded once.
pub(crate) fn cast(from: DType, to: DType, x: &str) -> String {
    if to == DType::Bool {
        return format!("(u8)(({x}) != 0)");
    }
    if !from.is_float() && !to.is_float() {
        return format!("({})(i64)({x})", to.c_type());
    }
    if to == DType::F64 {
        return format!("(double)({x})");
    }
    if from.is_float() && from != DType::F64 {
        return store_float(to, x, false);
    }
    let v = if from == DType::F64 { x.to_string() } else { format!("(double)({x})") };
    store_float(to, &v, true)
}

/// `where`: `a` where the condition `c` (a bool, 0 or 1 in any C type) is true, else `b`.
pub(crate) fn select(c: &str, a: &str, b: &str) -> String {
    format!("(({c} != 0) ? {a} : {b})")
}

/// An identifier no prelude defines, written in place of the expression of an op on a
/// dtype it has no formula for: a kernel asking for one fails to compile, naming the op
/// and the dtype, instead of computing something else.
pub(crate) fn undefined(op: &str, d: DType) -> String {
    format!("rill_{op}_is_not_defined_on_{}", d.name())
}
