//! The `fused` family: the IR of `Fused` and `FusedReduce` nodes, a straight-line program
//! over registers run once per output element. `compile` builds programs (`fuse.rs`);
//! each backend lowers them (`backend/cpu/fused.rs` interprets them, the CUDA backend
//! generates a kernel per program: `backend/cuda/fused_src.rs`), so the IR sits below both.
//!
//! Register `i` is defined by instruction `i` (SSA form) and has dtype `dtypes[i]`.
//! Values are held as f32 (for f32, f16, bf16 and bool registers) or f64 (for f64 and the
//! integer dtypes, which only appear as loads of external inputs); after every
//! instruction the value is rounded to its register's dtype exactly as the unfused
//! kernel rounds its output, so a fused program computes the same bits as the chain of
//! ops it replaces.

use std::any::Any;
use std::fmt;

use half::{bf16, f16};

use crate::sync::{Arc, Mutex};

use crate::dtype::DType;
use crate::primitives::{BinaryOp, UnaryOp};

/// A register index.
pub(crate) type Reg = usize;

/// One instruction; instruction `i` defines register `i`.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum Inst {
    /// Element of external input `k` (broadcast to the output shape), converted to the
    /// register's lane type without rounding (the register dtype is the input dtype).
    Load(usize),
    /// A constant, already rounded to the register dtype (bools are 0 or 1).
    Const(f64),
    /// A unary function (register dtype = op output dtype; operand dtype = same, except
    /// `LogicalNot`, whose operand may be any loadable dtype).
    Unary(UnaryOp, Reg),
    /// A binary function of two registers of one dtype (output bool for predicates).
    Binary(BinaryOp, Reg, Reg),
    /// `cond ? x : y` (cond is bool; x, y and the output share a dtype).
    Where(Reg, Reg, Reg),
    /// Conversion from the operand register's dtype to this register's dtype, with the
    /// rules of the `astype` kernel.
    Cast(Reg),
}

/// A fused elementwise kernel: built by `compile` from a group of elementwise ops
/// (see the module docs of `crate::compile`), run by the backends.
///
/// The node's inputs are the program's external inputs, in order, each with the dtype
/// given by [`FusedProgram::input_dtypes`] and broadcastable to the node shape.
#[derive(Clone, Debug, PartialEq)]
pub struct FusedProgram {
    pub(crate) input_dtypes: Vec<DType>,
    pub(crate) insts: Vec<Inst>,
    pub(crate) dtypes: Vec<DType>,
    pub(crate) out: Reg,
    /// Further outputs, of `out`'s dtype, stored after it (empty for a `Fused` node's
    /// program; a multi-tensor block's program may have several, see [`BlockKind::Multi`]).
    pub(crate) more: Vec<Reg>,
    /// Kernels a backend built for this program (not part of its value).
    pub(crate) kernels: KernelMemo,
}

/// What a backend built for one program (compiled kernels), keyed by bytes the backend
/// chooses (device, launch plan), so that a replayed call finds its kernel without
/// generating source or formatting a cache key. It is not part of the program's value:
/// a clone starts empty, every memo compares equal, and it is freed with the program.
#[derive(Default)]
pub(crate) struct KernelMemo(Mutex<Vec<MemoEntry>>);

/// One memoised value and its key.
type MemoEntry = (Box<[u8]>, Arc<dyn Any + Send + Sync>);

impl KernelMemo {
    /// The value memoised under `key`, or the one `make` builds (kept when it succeeds).
    /// `make` runs under the memo's lock, so concurrent first calls build once.
    #[allow(dead_code)]
    pub(crate) fn get_or_try_insert<T, E>(&self, key: &[u8], make: impl FnOnce() -> Result<T, E>) -> Result<T, E>
    where
        T: Any + Send + Sync + Clone,
    {
        let mut g = self.0.lock();
        if let Some(v) = g.iter().find(|(k, _)| **k == *key).and_then(|(_, v)| v.downcast_ref::<T>()) {
            return Ok(v.clone());
        }
        let v = make()?;
        g.retain(|(k, _)| **k != *key);
        g.push((key.into(), Arc::new(v.clone())));
        Ok(v)
    }
    /// Number of memoised values.
    #[allow(dead_code)]
    pub(crate) fn len(&self) -> usize {
        self.0.lock().len()
    }
}

impl Clone for KernelMemo {
    fn clone(&self) -> Self {
        KernelMemo::default()
    }
}

impl PartialEq for KernelMemo {
    fn eq(&self, _: &Self) -> bool {
        true
    }
}

impl fmt::Debug for KernelMemo {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "KernelMemo({})", self.len())
    }
}

impl FusedProgram {
    /// The dtypes of the external inputs, in input order.
    pub fn input_dtypes(&self) -> &[DType] {
        &self.input_dtypes
    }
    /// The output dtype.
    pub fn output_dtype(&self) -> DType {
        self.dtypes[self.out]
    }
    /// The output registers: `out`, then the further outputs.
    pub(crate) fn outputs(&self) -> impl Iterator<Item = Reg> + '_ {
        std::iter::once(self.out).chain(self.more.iter().copied())
    }
    /// Number of outputs (1 unless a multi-tensor block stores several).
    pub(crate) fn output_count(&self) -> usize {
        1 + self.more.len()
    }
    /// The same program computing only register `r` as its output.
    pub(crate) fn with_output(&self, r: Reg) -> FusedProgram {
        FusedProgram { out: r, more: Vec::new(), ..self.clone() }
    }
    /// Number of instructions (registers).
    pub fn len(&self) -> usize {
        self.insts.len()
    }
    /// True when the program has no instructions (never, for a built program).
    pub fn is_empty(&self) -> bool {
        self.insts.is_empty()
    }
    /// Number of arithmetic instructions (not loads or constants): the ops fused.
    pub fn op_count(&self) -> usize {
        self.insts.iter().filter(|i| !matches!(i, Inst::Load(_) | Inst::Const(_))).count()
    }
}

impl fmt::Display for FusedProgram {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, (inst, d)) in self.insts.iter().zip(&self.dtypes).enumerate() {
            write!(f, "r{i}: {d} = ")?;
            match inst {
                Inst::Load(k) => writeln!(f, "load in{k}")?,
                Inst::Const(v) => writeln!(f, "const {v}")?,
                Inst::Unary(op, a) => writeln!(f, "{} r{a}", op.name())?,
                Inst::Binary(op, a, b) => writeln!(f, "{} r{a}, r{b}", op.name())?,
                Inst::Where(c, a, b) => writeln!(f, "where r{c}, r{a}, r{b}")?,
                Inst::Cast(a) => writeln!(f, "cast r{a}")?,
            }
        }
        write!(f, "out r{}", self.out)?;
        for r in &self.more {
            write!(f, ", r{r}")?;
        }
        Ok(())
    }
}

/// True when values of `d` are held in f64 lanes (f64 and the integer dtypes); the
/// others (f32, f16, bf16, bool) use f32 lanes.
pub(crate) fn wide_lane(d: DType) -> bool {
    matches!(d, DType::F64 | DType::U8 | DType::U32 | DType::I32)
}

/// Dtypes an external input of a fused program may have (exactly representable in its
/// lane). i64 is not: its values do not all fit an f64.
pub(crate) fn loadable(d: DType) -> bool {
    d != DType::I64
}

/// Dtypes a computed register may have.
pub(crate) fn computable(d: DType) -> bool {
    matches!(d, DType::F16 | DType::BF16 | DType::F32 | DType::F64 | DType::Bool)
}

/// A `Full` value as the kernel would store it in `d`, as f64.
pub(crate) fn round_const(v: f64, d: DType) -> f64 {
    match d {
        DType::Bool => (v != 0.0) as u8 as f64,
        DType::F16 => f16::from_f64(v).to_f64(),
        DType::BF16 => bf16::from_f64(v).to_f64(),
        DType::F32 => v as f32 as f64,
        DType::U8 => v as u8 as f64,
        DType::U32 => v as u32 as f64,
        DType::I32 => v as i32 as f64,
        DType::I64 => v as i64 as f64,
        DType::F64 => v,
    }
}

/// Builds a program instruction by instruction, sharing loads and equal constants.
#[derive(Default)]
pub(crate) struct Builder {
    prog: Vec<Inst>,
    dtypes: Vec<DType>,
    inputs: Vec<DType>,
    /// The register of each loaded input and of each constant (bits, dtype): found without
    /// a scan of the program (fusion at eval builds programs on every evaluation).
    loads: Vec<Option<Reg>>,
    consts: rustc_hash::FxHashMap<(u64, DType), Reg>,
}

impl Builder {
    /// Register holding external input `k` (of dtype `d`), loaded once.
    pub fn load(&mut self, k: usize, d: DType) -> Reg {
        if let Some(&Some(r)) = self.loads.get(k) {
            return r;
        }
        if self.inputs.len() <= k {
            self.inputs.resize(k + 1, d);
            self.loads.resize(k + 1, None);
        }
        self.inputs[k] = d;
        let r = self.push(Inst::Load(k), d);
        self.loads[k] = Some(r);
        r
    }
    /// Register holding a constant (rounded here to `d`).
    pub fn constant(&mut self, v: f64, d: DType) -> Reg {
        let v = round_const(v, d);
        if let Some(&r) = self.consts.get(&(v.to_bits(), d)) {
            return r;
        }
        let r = self.push(Inst::Const(v), d);
        self.consts.insert((v.to_bits(), d), r);
        r
    }
    /// Appends an instruction defining a new register of dtype `d`.
    pub fn push(&mut self, inst: Inst, d: DType) -> Reg {
        self.prog.push(inst);
        self.dtypes.push(d);
        self.prog.len() - 1
    }
    /// Finishes with `out` as the output register.
    pub fn finish(self, out: Reg) -> FusedProgram {
        self.finish_outputs(out, Vec::new())
    }
    /// Finishes with `out` and the further outputs `more` (of `out`'s dtype).
    pub fn finish_outputs(self, out: Reg, more: Vec<Reg>) -> FusedProgram {
        FusedProgram {
            input_dtypes: self.inputs,
            insts: self.prog,
            dtypes: self.dtypes,
            out,
            more,
            kernels: KernelMemo::default(),
        }
    }
}

/// True when the fused IR computes `prim` exactly on inputs of dtypes `ins` into an
/// output of dtype `out`: an elementwise op with a computable output and loadable inputs
/// (see the module docs), whose operands have the dtypes the op gives them.
pub(crate) fn fusable(prim: &crate::primitives::Primitive, ins: &[DType], out: DType) -> bool {
    use crate::primitives::Primitive::*;
    if !computable(out) || !ins.iter().all(|&x| loadable(x)) {
        return false;
    }
    match prim {
        Cast => ins.len() == 1,
        Unary(crate::primitives::UnaryOp::LogicalNot) => ins.len() == 1 && out == DType::Bool,
        Unary(op) => ins.len() == 1 && ins[0] == out && (out != DType::Bool || op.keeps_bool()),
        Binary(op) => {
            ins.len() == 2
                && ins[0] == ins[1]
                && if op.is_predicate() { out == DType::Bool } else { ins[0] == out && out != DType::Bool }
        }
        Where => ins.len() == 3 && ins[0] == DType::Bool && ins[1] == out && ins[2] == out,
        Constant
        | Full { .. }
        | Arange { .. }
        | Eye { .. }
        | Random { .. }
        | Reduce { .. }
        | ArgReduce { .. }
        | Softmax { .. }
        | LayerNorm { .. }
        | RmsNorm { .. }
        | Cumsum { .. }
        | Sort(_)
        | Matmul
        | Attention { .. }
        | AttentionGrad { .. }
        | QuantMatmul { .. }
        | Dequantize { .. }
        | Rope { .. }
        | SliceUpdate { .. }
        | Reshape
        | Permute(_)
        | BroadcastTo
        | Slice { .. }
        | Contiguous
        | StopGradient
        | Depend
        | Checkpoint { .. }
        | Take { .. }
        | ScatterAdd { .. }
        | TakeAlongAxis { .. }
        | PutAlongAxis { .. }
        | Concatenate { .. }
        | Pad { .. }
        | ToDevice
        | Host { .. }
        | Placeholder { .. }
        | Fused(_)
        | FusedReduce { .. }
        | Block(_) => false,
    }
}

/// A fused block: work of more than elementwise ops in one node, made by `compile`
/// (`compile/blocks.rs`) and run by each backend's block kernels
/// (`backend/cpu/blocks.rs`, `backend/cuda/blocks.rs`).
#[derive(Clone, Debug, PartialEq)]
pub struct FusedBlock {
    pub(crate) kind: BlockKind,
}

/// What a [`FusedBlock`] computes.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum BlockKind {
    /// `program(a @ b, extra...)`: the node's inputs are `a, b, extra...`; the program's
    /// input 0 is the product and its input `k` the node's input `k + 1`, broadcast to the
    /// node shape (the product's). `lt`: the program is a cuBLASLt epilogue.
    Matmul { program: FusedProgram, lt: Option<LtEpilogue> },
    /// `s = x + r`, then layer norm (`rms`: RMS norm) of `s`: inputs `x, r[, weight][, bias]`
    /// (`x` and `r` of the node's shape, or of its last axes when `keep_sum`). The output is
    /// the norm, or with `keep_sum` `[2, ..]`: the sum, then the norm.
    ResidualNorm { eps: f64, rms: bool, has_weight: bool, has_bias: bool, keep_sum: bool },
    /// One program applied to `sizes.len()` tensors (multi-tensor apply): the inputs are
    /// the members' inputs, member by member (`program.input_dtypes().len()` each); input
    /// `k` of every member has the member's `sizes` elements, or one when `scalar[k]`. The
    /// output is 1-D: the members' results one after the other, each member's as its
    /// program's outputs one after the other (`output_count() * size` elements).
    Multi { program: FusedProgram, sizes: Vec<usize>, scalar: Vec<bool> },
    /// `post(x @ wᵀ, extra...)` of a block-quantized product (`QuantMatmul`) whose `x`
    /// is computed from the block's first inputs as `input` says. The node's inputs are
    /// the `x` side's (`input.arity()`), then the packed `w`, then `post`'s inputs after
    /// its first (each broadcast to the node's shape). `post`'s input 0 is the product
    /// in `x`'s dtype. A decode step's matrix-vector products then read the normalised
    /// or gated activations and add the residual inside their one kernel.
    QMatmul { format: crate::quant::QuantFormat, input: QInput, post: Option<FusedProgram>, kernels: KernelMemo },
}

/// How a [`BlockKind::QMatmul`] block computes the `x` of its product.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum QInput {
    /// `x` itself (one input): the block exists for its `post` program.
    Plain,
    /// An elementwise program of its inputs, all broadcast to `x`'s shape; its output
    /// dtype is `x`'s.
    Program(FusedProgram),
    /// `rms_norm(x[, weight], eps)` over the last axis (inputs `x[, weight]`).
    RmsNorm { eps: f64, has_weight: bool },
}

impl QInput {
    /// The block inputs the `x` side reads.
    pub(crate) fn arity(&self) -> usize {
        match self {
            QInput::Plain => 1,
            QInput::Program(p) => p.input_dtypes.len(),
            QInput::RmsNorm { has_weight, .. } => 1 + *has_weight as usize,
        }
    }
}

/// A matmul program that cuBLASLt computes as `act(a @ b + residual + bias)`: the
/// program inputs holding the bias (a row broadcast along the rows) and the residual (of
/// the product's shape).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) struct LtEpilogue {
    pub act: LtAct,
    pub bias: Option<usize>,
    pub residual: Option<usize>,
    /// The product's scale (cuBLASLt's alpha), as f32 bits; 1.0 when not scaled.
    pub alpha: u32,
}

/// The activations of a cuBLASLt epilogue (its GELU is the tanh approximation).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum LtAct {
    None,
    Relu,
    GeluTanh,
}

impl FusedBlock {
    /// The block's name in messages and in `Compiled::primitive_counts`: `fused_matmul_lt`
    /// (a matmul whose program cuBLASLt can apply as its epilogue), `fused_matmul`,
    /// `fused_add_layer_norm`, `fused_add_rms_norm`, `fused_multi`, `fused_qmatmul`.
    pub fn name(&self) -> &'static str {
        match self.kind {
            BlockKind::Matmul { lt: Some(_), .. } => "fused_matmul_lt",
            BlockKind::Matmul { lt: None, .. } => "fused_matmul",
            BlockKind::ResidualNorm { rms: false, .. } => "fused_add_layer_norm",
            BlockKind::ResidualNorm { rms: true, .. } => "fused_add_rms_norm",
            BlockKind::Multi { .. } => "fused_multi",
            BlockKind::QMatmul { .. } => "fused_qmatmul",
        }
    }
}

/// The program `prog` with its inputs renumbered: input `k` becomes input `perm[k]`.
pub(crate) fn renumber_inputs(prog: &FusedProgram, perm: &[usize]) -> FusedProgram {
    let mut input_dtypes = prog.input_dtypes.clone();
    for (k, &d) in prog.input_dtypes.iter().enumerate() {
        input_dtypes[perm[k]] = d;
    }
    let insts = prog
        .insts
        .iter()
        .map(|i| match *i {
            Inst::Load(k) => Inst::Load(perm[k]),
            ref i => i.clone(),
        })
        .collect();
    FusedProgram {
        input_dtypes,
        insts,
        dtypes: prog.dtypes.clone(),
        out: prog.out,
        more: prog.more.clone(),
        kernels: KernelMemo::default(),
    }
}

/// The cuBLASLt epilogue `prog` is, when it is `act(sum)` or `sum` with `sum` a sum of
/// the product (input 0, or the product times a constant: alpha), at most one bias (an input `is_bias` accepts) and at most one
/// residual (`is_full`), the adds in any order, and something besides the product. Only
/// the tanh GELU (cuBLASLt's) and ReLU are activations; the erf GELU is not.
pub(crate) fn lt_epilogue(
    prog: &FusedProgram,
    is_bias: impl Fn(usize) -> bool,
    is_full: impl Fn(usize) -> bool,
) -> Option<LtEpilogue> {
    let out_d = prog.output_dtype();
    if !matches!(out_d, DType::F32 | DType::F16 | DType::BF16) || prog.dtypes.iter().any(|&d| d != out_d) {
        return None;
    }
    let (act, top) = match prog.insts[prog.out] {
        Inst::Unary(UnaryOp::Relu, a) => (LtAct::Relu, a),
        Inst::Unary(UnaryOp::GeluTanh, a) => (LtAct::GeluTanh, a),
        _ => (LtAct::None, prog.out),
    };
    // The leaves of the tree of adds under `top` (each register used once).
    let mut leaves = Vec::new();
    let mut alpha_of: Option<f32> = None;
    let mut stack = vec![top];
    while let Some(r) = stack.pop() {
        match prog.insts[r] {
            Inst::Binary(BinaryOp::Add, a, b) => stack.extend([a, b]),
            Inst::Load(k) => leaves.push(k),
            // The product times a constant: alpha (a scaled product is marked MAX).
            Inst::Binary(BinaryOp::Mul, a, b) => match (&prog.insts[a], &prog.insts[b]) {
                (Inst::Load(0), Inst::Const(c)) | (Inst::Const(c), Inst::Load(0)) if alpha_of.is_none() => {
                    alpha_of = Some(*c as f32);
                    leaves.push(usize::MAX);
                }
                _ => return None,
            },
            _ => return None,
        }
    }
    let (mut product, mut bias, mut residual) = (0, None, None);
    let mut alpha = 1.0f32;
    for k in leaves {
        if k == usize::MAX || k == 0 {
            product += 1;
        // A full-shape operand is the residual first: with one row it is a bias too.
        } else if residual.is_none() && is_full(k) {
            residual = Some(k);
        } else if bias.is_none() && is_bias(k) {
            bias = Some(k);
        } else {
            return None;
        }
    }
    if let Some(a) = alpha_of {
        alpha = a;
    }
    let binaries = prog.insts.iter().filter(|i| matches!(i, Inst::Binary(..))).count();
    let scaled = alpha_of.is_some();
    let something = bias.is_some() || residual.is_some() || act != LtAct::None || scaled;
    // Every instruction is a load, one of the adds (or the scale and its constant), or
    // the activation.
    let loads = prog.insts.iter().filter(|i| matches!(i, Inst::Load(_))).count();
    let counted = loads + binaries + scaled as usize + (act != LtAct::None) as usize;
    let lt = LtEpilogue { act, bias, residual, alpha: alpha.to_bits() };
    (product == 1 && something && counted == prog.insts.len()).then_some(lt)
}

// ---- gradient rules (see `grad.rs`) ----

use super::Primitive;
use super::grad::{Jvp, Vjp};
use crate::array::Array;

/// `prog` run with ops on `ins` (its external inputs): the chain of ops it replaces.
fn run_program(prog: &FusedProgram, ins: &[Array]) -> crate::error::Result<Array> {
    let mut regs: Vec<Array> = Vec::with_capacity(prog.insts.len());
    for (inst, &d) in prog.insts.iter().zip(&prog.dtypes) {
        let r = match inst {
            Inst::Load(k) => ins[*k].clone(),
            Inst::Const(c) => Array::full(&[], *c, d)?,
            Inst::Unary(op, a) => regs[*a].unary(*op)?,
            Inst::Binary(op, a, b) => regs[*a].binary(&regs[*b], *op)?,
            Inst::Where(c, x, y) => crate::ops::elementwise::where_(&regs[*c], &regs[*x], &regs[*y])?,
            Inst::Cast(a) => regs[*a].astype(d)?,
        };
        regs.push(if r.dtype() == d { r } else { r.astype(d)? });
    }
    Ok(regs[prog.out].clone())
}

/// `prog`'s outputs run with ops on `ins`, one after the other as a 1-D array of
/// `size` elements per output (a multi-tensor member's piece of the block).
fn run_outputs(prog: &FusedProgram, ins: &[Array], size: usize) -> crate::error::Result<Array> {
    let parts = prog
        .outputs()
        .map(|r| fit(run_program(&prog.with_output(r), ins)?, &[size]))
        .collect::<crate::error::Result<Vec<_>>>()?;
    match parts.as_slice() {
        [one] => Ok(one.clone()),
        _ => crate::ops::movement::copies::concatenate(&parts.iter().collect::<Vec<_>>(), 0),
    }
}

fn fit(a: Array, shape: &[usize]) -> crate::error::Result<Array> {
    super::grad::broadcast(a, shape)
}

/// A fused node recomputed with the ops it replaces (un-fused), of the node's `shape`.
fn unfuse(p: &Primitive, ins: &[Array], shape: &[usize]) -> crate::error::Result<Array> {
    match p {
        Primitive::Fused(prog) => fit(run_program(prog, ins)?, shape),
        Primitive::FusedReduce { program, op, axes } => {
            let mut full: Vec<usize> = Vec::new();
            for a in ins {
                full = crate::shape::broadcast_shapes("fused_reduce", &full, a.shape())?;
            }
            let v = fit(run_program(program, ins)?, &full)?;
            let axes: Vec<isize> = axes.iter().map(|&a| a as isize).collect();
            if axes.is_empty() {
                return Ok(v);
            }
            match op {
                crate::primitives::ReduceOp::Sum => v.sum(&axes, true),
                crate::primitives::ReduceOp::Prod => v.prod(&axes, true),
                crate::primitives::ReduceOp::Max => v.max(&axes, true),
                crate::primitives::ReduceOp::Min => v.min(&axes, true),
                crate::primitives::ReduceOp::Mean => v.mean(&axes, true),
            }
        }
        Primitive::Block(b) => match &b.kind {
            BlockKind::Matmul { program, .. } => {
                let mut args = vec![ins[0].matmul(&ins[1])?];
                args.extend(ins[2..].iter().cloned());
                fit(run_program(program, &args)?, shape)
            }
            BlockKind::ResidualNorm { eps, rms, has_weight, has_bias, keep_sum } => {
                let s = ins[0].add(&ins[1])?;
                let w = if *has_weight { ins.get(2) } else { None };
                let bias = if *has_bias { ins.get(2 + *has_weight as usize) } else { None };
                let n = if *rms { s.rms_norm(w, *eps)? } else { s.layer_norm(w, bias, *eps)? };
                if *keep_sum { crate::ops::movement::copies::stack(&[&s, &n], 0) } else { Ok(n) }
            }
            BlockKind::Multi { program, sizes, scalar } => {
                let per = program.input_dtypes().len();
                let mut parts = Vec::with_capacity(sizes.len());
                for (m, &size) in sizes.iter().enumerate() {
                    let member = ins[m * per..(m + 1) * per]
                        .iter()
                        .enumerate()
                        .map(|(k, a)| {
                            let flat = a.reshape(&[-1])?;
                            if scalar[k] { flat.broadcast_to(&[size]) } else { Ok(flat) }
                        })
                        .collect::<crate::error::Result<Vec<_>>>()?;
                    parts.push(run_outputs(program, &member, size)?);
                }
                crate::ops::movement::copies::concatenate(&parts.iter().collect::<Vec<_>>(), 0)
            }
            BlockKind::QMatmul { format, input, post, .. } => {
                let nx = input.arity();
                let x = match input {
                    QInput::Plain => ins[0].clone(),
                    QInput::Program(p) => run_program(p, &ins[..nx])?,
                    QInput::RmsNorm { eps, has_weight } => ins[0].rms_norm(has_weight.then(|| &ins[1]), *eps)?,
                };
                let w = &ins[nx];
                let mut pshape = x.shape().to_vec();
                pshape.pop();
                pshape.push(w.shape().first().copied().unwrap_or(0));
                let product = super::grad::record(
                    Primitive::QuantMatmul { format: *format },
                    vec![x.clone(), w.clone()],
                    &pshape,
                    x.dtype(),
                )?;
                match post {
                    None => Ok(product),
                    Some(p) => {
                        let mut args = vec![product];
                        args.extend(ins[nx + 1..].iter().cloned());
                        fit(run_program(p, &args)?, shape)
                    }
                }
            }
        },
        other => Err(super::grad::no_rule(other.name(), "vjp")),
    }
}

/// The fused nodes (`Fused`, `FusedReduce`, blocks) of a compiled function's replay:
/// differentiated through the ops they replace.
pub(crate) fn vjp(p: &Primitive, g: &Vjp<'_>) -> crate::error::Result<Vec<Option<Array>>> {
    let shape = g.output.shape().to_vec();
    crate::autodiff::vjp_of(&|ins: &[Array]| Ok(vec![unfuse(p, ins, &shape)?]), g.inputs, g.cotangent)
}

/// The forward rule of the fused nodes, through the ops they replace.
pub(crate) fn jvp(p: &Primitive, g: &Jvp<'_>) -> crate::error::Result<Option<Array>> {
    let shape = g.output.shape().to_vec();
    crate::autodiff::jvp_of(&|ins: &[Array]| Ok(vec![unfuse(p, ins, &shape)?]), g.inputs, g.tangents)
}
