//! Binary elementwise ops: the enum and each op's CUDA formula.
//!
//! Adding an op: a variant here (with its name), its formula in [`BinaryOp::cuda`] (the
//! one both CUDA generators use; see [`super::cuda`] for the rules a formula follows), its
//! CPU function in `backend/cpu/elementwise.rs` (and `compile/cpu.rs`, the fused
//! interpreter), its dtype rule in `ops/elementwise.rs` and an `Array` method there.
//! Every match on the enum is exhaustive, so the compiler lists what else needs a
//! decision.

#![cfg_attr(not(feature = "cuda"), allow(dead_code))]

use crate::dtype::DType;

use super::cuda::utype;

op_enum! {
    /// Elementwise functions of two broadcast arrays.
    enum BinaryOp ("binary") {
        Add => "add",
        Sub => "sub",
        Mul => "mul",
        Div => "div",
        Pow => "pow",
        Maximum => "maximum",
        Minimum => "minimum",
        Equal => "equal",
        NotEqual => "not_equal",
        Less => "less",
        LessEqual => "less_equal",
        Greater => "greater",
        GreaterEqual => "greater_equal",
        LogicalAnd => "logical_and",
        LogicalOr => "logical_or",
    }
}

impl BinaryOp {
    /// True for the comparisons and logical ops, whose output is bool.
    pub fn is_predicate(self) -> bool {
        use BinaryOp::*;
        match self {
            Equal | NotEqual | Less | LessEqual | Greater | GreaterEqual | LogicalAnd | LogicalOr => true,
            Add | Sub | Mul | Div | Pow | Maximum | Minimum => false,
        }
    }

    /// The CUDA C expression of `a op b`, for identifiers `a` and `b` holding values of
    /// `d` in [`compute_type`](super::cuda::compute_type)`(d)`. Arithmetic (and
    /// `maximum`/`minimum`) has a value of that type; a predicate's value is a C truth
    /// value (0 or 1) and its operands may also be integers held in `double`. Integer
    /// powers call the device function that [`BinaryOp::cuda_decls`] defines.
    pub(crate) fn cuda(self, d: DType, a: &str, b: &str) -> String {
        use BinaryOp::*;
        match self {
            Equal => format!("({a} == {b})"),
            NotEqual => format!("({a} != {b})"),
            Less => format!("({a} < {b})"),
            LessEqual => format!("({a} <= {b})"),
            Greater => format!("({a} > {b})"),
            GreaterEqual => format!("({a} >= {b})"),
            LogicalAnd => format!("({a} != 0 && {b} != 0)"),
            LogicalOr => format!("({a} != 0 || {b} != 0)"),
            Add | Sub | Mul | Div | Pow | Maximum | Minimum if d.is_float() => self.cuda_float(d == DType::F64, a, b),
            Add | Sub | Mul | Div | Pow | Maximum | Minimum => self.cuda_int(d, a, b),
        }
    }

    /// Device code that the expression of [`BinaryOp::cuda`] on `d` calls, to be placed
    /// before it (empty for most).
    pub(crate) fn cuda_decls(self, d: DType) -> String {
        if self != BinaryOp::Pow || d.is_float() {
            return String::new();
        }
        let (t, u) = (d.c_type(), utype(d));
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

    /// The arithmetic formulas on float (`double` when `double`) operands.
    fn cuda_float(self, double: bool, a: &str, b: &str) -> String {
        use BinaryOp::*;
        let f = if double { "" } else { "f" };
        let r = if double { "__d" } else { "__f" };
        match self {
            Add => format!("{r}add_rn({a}, {b})"),
            Sub => format!("{r}sub_rn({a}, {b})"),
            Mul => format!("{r}mul_rn({a}, {b})"),
            Div => format!("({a} / {b})"),
            Pow => format!("pow{f}({a}, {b})"),
            Maximum => format!("((isnan({a}) || {a} > {b}) ? {a} : {b})"),
            Minimum => format!("((isnan({a}) || {a} < {b}) ? {a} : {b})"),
            Equal | NotEqual | Less | LessEqual | Greater | GreaterEqual | LogicalAnd | LogicalOr => {
                self.cuda(DType::F32, a, b)
            }
        }
    }

    /// The arithmetic formulas on integer operands, in their own C type: `+ - *` wrap,
    /// division by zero gives 0 (and `MIN / -1` wraps).
    fn cuda_int(self, d: DType, a: &str, b: &str) -> String {
        use BinaryOp::*;
        let (t, u) = (d.c_type(), utype(d));
        match self {
            Add => format!("({t})(({u}){a} + ({u}){b})"),
            Sub => format!("({t})(({u}){a} - ({u}){b})"),
            Mul => format!("({t})(({u}){a} * ({u}){b})"),
            Div if d.is_signed_int() => {
                format!("({b} == 0 ? ({t})0 : (({b} == -1) ? ({t})(({u})0 - ({u}){a}) : ({t})({a} / {b})))")
            }
            Div => format!("({b} == 0 ? ({t})0 : ({t})({a} / {b}))"),
            Pow => format!("ipow({a}, {b})"),
            Maximum => format!("(({a} > {b}) ? {a} : {b})"),
            Minimum => format!("(({a} < {b}) ? {a} : {b})"),
            Equal | NotEqual | Less | LessEqual | Greater | GreaterEqual | LogicalAnd | LogicalOr => self.cuda(d, a, b),
        }
    }
}
