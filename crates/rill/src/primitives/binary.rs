//! Binary elementwise ops, each with everything that defines it: its name, its dtype
//! rule ([`BinaryOp::is_predicate`]; the promotion itself is `ops/elementwise.rs`'s),
//! its scalar semantics ([`BinaryOp::float`], [`BinaryOp::int`], with [`BinaryOp::pick`]
//! and [`BinaryOp::test`] for the ops that only compare: the CPU kernels and the CPU
//! fused interpreter call them), its CUDA formula ([`BinaryOp::cuda`]: the eager and
//! the fused CUDA kernels both use it; see [`super::cuda`] for the rules a formula
//! follows) and its gradient rules ([`BinaryOp::vjp`], [`BinaryOp::jvp`]).
//!
//! Adding an op: a variant here (with its name) and an answer in each of those
//! functions, and an `Array` method in `ops/elementwise.rs`. Every match on the enum is
//! exhaustive, so the compiler lists what else needs a decision.

#![cfg_attr(not(feature = "cuda"), allow(dead_code))]

use crate::array::Array;
use crate::dtype::DType;
use crate::error::Result;

use super::cuda::utype;
use super::grad::{Jvp, Vjp, add_opt, broadcast, unbroadcast};
use super::scalar::{Float, IntOps};
use crate::ops::elementwise::where_;

op_enum! {
    $ each_binary;
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
    /// True for `maximum` and `minimum`, which pick one of their operands.
    pub const fn is_selection(self) -> bool {
        matches!(self, BinaryOp::Maximum | BinaryOp::Minimum)
    }

    /// True for the comparisons and logical ops, whose output is bool.
    pub const fn is_predicate(self) -> bool {
        use BinaryOp::*;
        match self {
            Equal | NotEqual | Less | LessEqual | Greater | GreaterEqual | LogicalAnd | LogicalOr => true,
            Add | Sub | Mul | Div | Pow | Maximum | Minimum => false,
        }
    }

    /// `a op b` on float values, in their compute type (f16 and bf16 compute in f32): the
    /// reference semantics of every CPU kernel of the op. A predicate's value is 1 or 0.
    /// `maximum` and `minimum` return a NaN operand `a`, else the larger (smaller) one.
    #[inline(always)]
    pub(crate) fn float<F: Float>(self, a: F, b: F) -> F {
        use BinaryOp::*;
        let truth = |t: bool| if t { F::ONE } else { F::ZERO };
        match self {
            Add => a + b,
            Sub => a - b,
            Mul => a * b,
            Div => a / b,
            Pow => a.powf(b),
            Maximum | Minimum => self.pick(a, b),
            Equal | NotEqual | Less | LessEqual | Greater | GreaterEqual | LogicalAnd | LogicalOr => {
                truth(self.test(a, b, F::ZERO))
            }
        }
    }

    /// `a op b` on integer (or bool, held in u8) values, in their own type: `+ - *` and
    /// integer powers wrap, division by zero gives 0 (and `MIN / -1` wraps); a
    /// predicate's value is 1 or 0.
    #[inline(always)]
    pub(crate) fn int<T: IntOps>(self, a: T, b: T) -> T {
        use BinaryOp::*;
        let truth = |t: bool| if t { T::one() } else { T::zero() };
        match self {
            Add => T::wadd(a, b),
            Sub => T::wsub(a, b),
            Mul => T::wmul(a, b),
            Div => T::idiv(a, b),
            Pow => T::ipow(a, b),
            Maximum | Minimum => self.pick(a, b),
            Equal | NotEqual | Less | LessEqual | Greater | GreaterEqual | LogicalAnd | LogicalOr => {
                truth(self.test(a, b, T::zero()))
            }
        }
    }

    /// `maximum` and `minimum` on values of any ordered type (a storage type too: f16
    /// and bf16 need no conversion): a NaN operand `a` (`a != a`) is returned, otherwise
    /// the larger (smaller) operand. The other ops return `a`; they never reach here.
    #[inline(always)]
    pub(crate) fn pick<T: PartialOrd + Copy>(self, a: T, b: T) -> T {
        use BinaryOp::*;
        #[allow(clippy::eq_op)]
        let nan = a != a;
        match self {
            Maximum => {
                if nan || a > b {
                    a
                } else {
                    b
                }
            }
            Minimum => {
                if nan || a < b {
                    a
                } else {
                    b
                }
            }
            Add | Sub | Mul | Div | Pow | Equal | NotEqual | Less | LessEqual | Greater | GreaterEqual | LogicalAnd
            | LogicalOr => a,
        }
    }

    /// A predicate on values of any ordered type (a storage type too), with `zero` its
    /// zero (for the logical ops). The other ops give `false`; they never reach here.
    #[inline(always)]
    pub(crate) fn test<T: PartialOrd + Copy>(self, a: T, b: T, zero: T) -> bool {
        use BinaryOp::*;
        match self {
            Equal => a == b,
            NotEqual => a != b,
            Less => a < b,
            LessEqual => a <= b,
            Greater => a > b,
            GreaterEqual => a >= b,
            LogicalAnd => a != zero && b != zero,
            LogicalOr => a != zero || b != zero,
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

    /// The partial derivatives `(d/da, d/db)` of `y = a op b` (broadcastable to `y`).
    /// Comparisons and logical ops have none (their output is bool). `pow`: `d/da` is 0
    /// where `b == 0` and `d/db` is 0 where `a == 0` (where the formulas give NaN).
    /// `maximum`/`minimum`: a tie splits the derivative evenly between the operands.
    fn partials(self, a: &Array, b: &Array, y: &Array) -> Result<(Partial, Partial)> {
        use BinaryOp::*;
        use Partial::{MinusOne, One, Zero};
        let d = y.dtype();
        Ok(match self {
            Add => (One, One),
            Sub => (One, MinusOne),
            Mul => (Partial::Of(b.clone()), Partial::Of(a.clone())),
            Div => (Partial::Of(b.reciprocal()?), Partial::Of(y.div(b)?.neg()?)),
            Pow => {
                let da = where_(&b.eq(0.0)?, 0.0, &b.mul(&a.pow(&b.sub(1.0)?)?)?)?;
                let db = where_(&a.eq(0.0)?, 0.0, &y.mul(&a.log()?)?)?;
                (Partial::Of(da), Partial::Of(db))
            }
            Maximum | Minimum => {
                let wins = if self == Maximum { a.gt(b)? } else { a.lt(b)? };
                let w = wins.astype(d)?.add(&a.eq(b)?.astype(d)?.mul(0.5)?)?;
                let other = w.neg()?.add(1.0)?;
                (Partial::Of(w), Partial::Of(other))
            }
            Equal | NotEqual | Less | LessEqual | Greater | GreaterEqual | LogicalAnd | LogicalOr => (Zero, Zero),
        })
    }

    /// The op's reverse-mode rule: the cotangents of its two inputs (see `grad.rs`),
    /// summed over the axes each was broadcast along.
    pub(crate) fn vjp(self, g: &Vjp<'_>) -> Result<[Option<Array>; 2]> {
        let (a, b) = (&g.inputs[0], &g.inputs[1]);
        if !g.output.dtype().is_float() {
            return Ok([None, None]);
        }
        let (da, db) = self.partials(a, b, g.output)?;
        let side = |p: &Partial, x: &Array| -> Result<Option<Array>> {
            match p.times(g.cotangent)? {
                Some(c) => Ok(Some(unbroadcast(&c, x.shape())?)),
                None => Ok(None),
            }
        };
        Ok([side(&da, a)?, side(&db, b)?])
    }

    /// The op's forward-mode rule: the tangent of its output (see `grad.rs`).
    pub(crate) fn jvp(self, g: &Jvp<'_>) -> Result<Option<Array>> {
        if !g.output.dtype().is_float() {
            return Ok(None);
        }
        let (da, db) = self.partials(&g.inputs[0], &g.inputs[1], g.output)?;
        let term = |p: &Partial, t: &Option<Array>| match t {
            Some(t) => p.times(t),
            None => Ok(None),
        };
        let t = add_opt(term(&da, &g.tangents[0])?, term(&db, &g.tangents[1])?)?;
        t.map(|t| broadcast(t, g.output.shape())).transpose()
    }
}

/// A partial derivative of a binary op.
enum Partial {
    One,
    MinusOne,
    Zero,
    Of(Array),
}

impl Partial {
    /// `v` times this partial (`None`: zero).
    fn times(&self, v: &Array) -> Result<Option<Array>> {
        Ok(match self {
            Partial::One => Some(v.clone()),
            Partial::MinusOne => Some(v.neg()?),
            Partial::Zero => None,
            Partial::Of(d) => Some(v.mul(d)?),
        })
    }
}
