//! Elementwise fusion: groups of elementwise tape nodes become one `Fused` node.
//!
//! A node joins its consumer's group when both are fusable elementwise ops (see
//! [`op_ok`]), it has exactly one consumer, it is not an output of the function, and both
//! run on the same stream. Each group is a tree rooted at a node that does not join (an
//! output, a node with several users, or one consumed by a non-elementwise op); groups of
//! two or more ops become a `Fused` node whose inputs are the group's external inputs.
//! 0-d `Full` inputs are inlined as constants (not the count fills of a shapeless tape,
//! whose values each replay recomputes), and (outside shapeless mode) a
//! `BroadcastTo` input is replaced by its source, since the fused kernel broadcasts.
//!
//! A group root (or a single elementwise node) whose only consumer is a `Reduce` on the
//! same stream, and which is not an output, becomes one `FusedReduce` node with that
//! reduction: the group's values are reduced as they are computed instead of being
//! stored (when the reduced shape is the broadcast of the group's inputs).

use std::sync::Arc;

use crate::compile::simplify::dce;
use crate::compile::trace::{Ref, Tape, TapeNode};
use crate::dtype::DType;
use crate::primitives::Primitive;
use crate::primitives::fused::{Builder, Inst, Reg, fusable};
use crate::shape::broadcast_all;

/// The dtype a ref has in a tape.
fn ref_dtype(tape: &Tape, r: Ref) -> DType {
    match r {
        Ref::Input(i) => tape.input_dtypes[i],
        Ref::Node(i) => tape.nodes[i].dtype,
        Ref::Const(i) => tape.consts[i].dtype(),
    }
}

/// The shape a ref has in a tape.
fn ref_shape(tape: &Tape, r: Ref) -> &[usize] {
    match r {
        Ref::Input(i) => &tape.input_shapes[i],
        Ref::Node(i) => &tape.nodes[i].shape,
        Ref::Const(i) => tape.consts[i].shape(),
    }
}

/// True when node `i` is an elementwise op the fused IR computes exactly.
fn op_ok(tape: &Tape, i: usize) -> bool {
    let n = &tape.nodes[i];
    let d: Vec<DType> = n.inputs.iter().map(|&r| ref_dtype(tape, r)).collect();
    fusable(&n.prim, &d, n.dtype)
}

/// Rewrites `tape` with fused groups. `absorb_views` allows replacing `BroadcastTo`
/// inputs by their sources (not in shapeless mode, where node shapes are re-derived from
/// input shapes).
pub(crate) fn fuse(tape: &mut Tape, absorb_views: bool) {
    let mut is_output = vec![false; tape.nodes.len()];
    for r in &tape.outputs {
        if let Ref::Node(i) = *r {
            is_output[i] = true;
        }
    }
    for (i, node) in groups(tape, absorb_views, &is_output, usize::MAX) {
        tape.nodes[i] = node;
    }
    dce(tape);
}

/// The fused nodes that replace group roots (and the reductions they feed): (index of
/// the replaced node, its replacement). `is_output[i]`: node `i` must stay materialised
/// (an output, or a value someone else holds), so no group absorbs it; a group holds at
/// most `max_ops` ops (a tree with shared inputs counts each use). The replaced
/// members are left in the tape, unreferenced by the replacements.
pub(crate) fn groups(tape: &Tape, absorb_views: bool, is_output: &[bool], max_ops: usize) -> Vec<(usize, TapeNode)> {
    let n = tape.nodes.len();
    let ok: Vec<bool> = (0..n).map(|i| op_ok(tape, i)).collect();
    // Distinct consumers of each node; outputs count as a consumer of their own, and a
    // rule reading a node's shape as a consumer (so the node stays in the tape).
    // Kept as a count and the first one (no list per node: fusion at eval runs this on
    // every evaluation); a consumer's uses of a node are consecutive in this walk.
    const NONE: usize = usize::MAX;
    let (mut n_consumers, mut first, mut last) = (vec![0u32; n], vec![NONE; n], vec![NONE; n]);
    for (c, node) in tape.nodes.iter().enumerate() {
        for r in node.inputs.iter().copied().chain(node.rule.iter().flat_map(|r| r.refs())) {
            if let Ref::Node(i) = r
                && last[i] != c
            {
                last[i] = c;
                n_consumers[i] += 1;
                if first[i] == NONE {
                    first[i] = c;
                }
            }
        }
    }
    let mut absorbed: Vec<bool> = (0..n)
        .map(|i| {
            ok[i]
                && !is_output[i]
                && n_consumers[i] == 1
                && ok[first[i]]
                && tape.nodes[first[i]].stream == tape.nodes[i].stream
        })
        .collect();
    // Groups of at most `max_ops` ops: a node whose tree would grow past it takes none of
    // its inputs' trees (they become roots of their own), so a long chain is cut into
    // kernels of bounded size.
    let mut size = vec![1usize; n];
    for i in 0..n {
        let members = || {
            tape.nodes[i].inputs.iter().filter_map(|r| match *r {
                Ref::Node(j) if absorbed[j] => Some(j),
                _ => None,
            })
        };
        let total: usize = 1 + members().map(|j| size[j]).sum::<usize>();
        if total > max_ops {
            let cut: Vec<usize> = members().collect();
            for j in cut {
                absorbed[j] = false;
            }
        } else {
            size[i] = total;
        }
    }
    // A group root whose only consumer is a `Reduce` on its stream: the reduction joins
    // the group (a trailing reduction), so the group's values are never stored.
    let reduced_by = |root: usize| -> Option<usize> {
        let c = first[root];
        let node = tape.nodes.get(c)?;
        let only = n_consumers[root] == 1 && !is_output[root];
        (only && matches!(node.prim, Primitive::Reduce { .. }) && node.stream == tape.nodes[root].stream).then_some(c)
    };
    let mut replaced: Vec<(usize, TapeNode)> = Vec::new();
    for root in 0..n {
        if !ok[root] || absorbed[root] {
            continue;
        }
        if let Some(red) = reduced_by(root) {
            let (prog, externals) = build_group(tape, root, &absorbed, absorb_views);
            // The reduced shape must be the broadcast of the group's inputs (a `BroadcastTo`
            // read through its source may have widened it); otherwise fuse without it.
            let ins: Vec<&[usize]> = externals.iter().map(|&r| ref_shape(tape, r)).collect();
            let fits = broadcast_all("fused_reduce", &ins).is_ok_and(|s| s == tape.nodes[root].shape);
            if let (true, Primitive::Reduce { op, axes }) = (fits, &tape.nodes[red].prim) {
                let r = &tape.nodes[red];
                let prim = Primitive::FusedReduce { program: Arc::new(prog), op: *op, axes: axes.clone() };
                let node = TapeNode {
                    prim,
                    inputs: externals,
                    shape: r.shape.clone(),
                    dtype: r.dtype,
                    stream: r.stream.clone(),
                    rule: None,
                };
                replaced.push((red, node));
                continue;
            }
        }
        let has_member = tape.nodes[root].inputs.iter().any(|r| matches!(r, Ref::Node(i) if absorbed[*i]));
        if !has_member {
            continue;
        }
        let (prog, externals) = build_group(tape, root, &absorbed, absorb_views);
        let r = &tape.nodes[root];
        replaced.push((
            root,
            TapeNode {
                prim: Primitive::Fused(Arc::new(prog)),
                inputs: externals,
                shape: r.shape.clone(),
                dtype: r.dtype,
                stream: r.stream.clone(),
                rule: None,
            },
        ));
    }
    replaced
}

/// Builds the program of the group rooted at `root`; returns it with the external refs.
fn build_group(
    tape: &Tape,
    root: usize,
    absorbed: &[bool],
    absorb_views: bool,
) -> (crate::primitives::fused::FusedProgram, Vec<Ref>) {
    let mut b = Builder::default();
    let mut externals: Vec<Ref> = Vec::new();
    let mut memo: rustc_hash::FxHashMap<usize, Reg> = Default::default();
    // Register of an external ref (a load, or an inlined constant).
    let mut leaf = |b: &mut Builder, r: Ref| -> Reg {
        let mut r = r;
        if let Ref::Node(i) = r {
            let node = &tape.nodes[i];
            match &node.prim {
                // A count fill with a rule is recomputed per replay: it stays an input.
                Primitive::Full { value } if node.shape.is_empty() && node.rule.is_none() => {
                    return b.constant(*value, node.dtype);
                }
                Primitive::BroadcastTo if absorb_views && node.inputs.len() == 1 => {
                    let src = node.inputs[0];
                    if ref_dtype(tape, src) == node.dtype {
                        r = src;
                    }
                }
                // Everything else is loaded as it is.
                Primitive::Constant
                | Primitive::Full { .. }
                | Primitive::Arange { .. }
                | Primitive::Eye { .. }
                | Primitive::Random { .. }
                | Primitive::Cast
                | Primitive::Unary(_)
                | Primitive::Binary(_)
                | Primitive::Where
                | Primitive::Reduce { .. }
                | Primitive::ArgReduce { .. }
                | Primitive::Softmax { .. }
                | Primitive::LayerNorm { .. }
                | Primitive::RmsNorm { .. }
                | Primitive::Cumsum { .. }
                | Primitive::Sort(_)
                | Primitive::Matmul
                | Primitive::Attention { .. }
                | Primitive::AttentionGrad { .. }
                | Primitive::QuantMatmul { .. }
                | Primitive::Dequantize { .. }
                | Primitive::Rope { .. }
                | Primitive::SliceUpdate { .. }
                | Primitive::Reshape
                | Primitive::Permute(_)
                | Primitive::BroadcastTo
                | Primitive::Slice { .. }
                | Primitive::Contiguous
                | Primitive::StopGradient
                | Primitive::Depend
                | Primitive::Checkpoint { .. }
                | Primitive::Take { .. }
                | Primitive::ScatterAdd { .. }
                | Primitive::TakeAlongAxis { .. }
                | Primitive::PutAlongAxis { .. }
                | Primitive::Concatenate { .. }
                | Primitive::Pad { .. }
                | Primitive::ToDevice
                | Primitive::Host { .. }
                | Primitive::Placeholder { .. }
                | Primitive::Fused(_)
                | Primitive::FusedReduce { .. }
                | Primitive::Block(_) => {}
            }
        }
        let k = match externals.iter().position(|&e| e == r) {
            Some(k) => k,
            None => {
                externals.push(r);
                externals.len() - 1
            }
        };
        b.load(k, ref_dtype(tape, r))
    };
    // Iterative post-order over the group's tree (members are absorbed nodes).
    let mut stack: Vec<(usize, usize)> = vec![(root, 0)];
    while let Some(&mut (i, ref mut next)) = stack.last_mut() {
        let node = &tape.nodes[i];
        if *next < node.inputs.len() {
            let r = node.inputs[*next];
            *next += 1;
            if let Ref::Node(j) = r
                && absorbed[j]
                && !memo.contains_key(&j)
            {
                stack.push((j, 0));
            }
            continue;
        }
        stack.pop();
        let regs: smallvec::SmallVec<[Reg; 3]> = node
            .inputs
            .iter()
            .map(|&r| match r {
                Ref::Node(j) if absorbed[j] => memo[&j],
                r => leaf(&mut b, r),
            })
            .collect();
        let inst = match &node.prim {
            Primitive::Cast => Inst::Cast(regs[0]),
            Primitive::Unary(op) => Inst::Unary(*op, regs[0]),
            Primitive::Binary(op) => Inst::Binary(*op, regs[0], regs[1]),
            Primitive::Where => Inst::Where(regs[0], regs[1], regs[2]),
            Primitive::Constant
            | Primitive::Full { .. }
            | Primitive::Arange { .. }
            | Primitive::Eye { .. }
            | Primitive::Random { .. }
            | Primitive::Reduce { .. }
            | Primitive::ArgReduce { .. }
            | Primitive::Softmax { .. }
            | Primitive::LayerNorm { .. }
            | Primitive::RmsNorm { .. }
            | Primitive::Cumsum { .. }
            | Primitive::Sort(_)
            | Primitive::Matmul
            | Primitive::Attention { .. }
            | Primitive::AttentionGrad { .. }
            | Primitive::QuantMatmul { .. }
            | Primitive::Dequantize { .. }
            | Primitive::Rope { .. }
            | Primitive::SliceUpdate { .. }
            | Primitive::Reshape
            | Primitive::Permute(_)
            | Primitive::BroadcastTo
            | Primitive::Slice { .. }
            | Primitive::Contiguous
            | Primitive::StopGradient
            | Primitive::Depend
            | Primitive::Checkpoint { .. }
            | Primitive::Take { .. }
            | Primitive::ScatterAdd { .. }
            | Primitive::TakeAlongAxis { .. }
            | Primitive::PutAlongAxis { .. }
            | Primitive::Concatenate { .. }
            | Primitive::Pad { .. }
            | Primitive::ToDevice
            | Primitive::Host { .. }
            | Primitive::Placeholder { .. }
            | Primitive::Fused(_)
            | Primitive::FusedReduce { .. }
            | Primitive::Block(_) => unreachable!("a group holds only nodes `fusable` accepts"),
        };
        let reg = b.push(inst, node.dtype);
        memo.insert(i, reg);
    }
    let out = memo[&root];
    (b.finish(out), externals)
}
