//! Fused blocks: patterns of a fused tape that become one [`FusedBlock`] node.
//!
//! Run after elementwise fusion (`fuse.rs`), on nodes nothing else reads:
//! - **Matmul epilogues.** An elementwise node (a `Fused` group or a single op) reading a
//!   `Matmul` of its own shape that has no other consumer and is not an output becomes a
//!   `Matmul` block: the product and the program in one node. The backends compute the
//!   product and run the program on it; when the program is `act(product + bias +
//!   residual)` (`primitives::fused::lt_epilogue`), cuBLASLt can do it all in one call.
//! - **Residual norms.** `layer_norm(x + r)` / `rms_norm(x + r)` with `x` and `r` of one
//!   shape becomes a `ResidualNorm` block; when the sum is also read elsewhere (pre-norm
//!   transformers return it), the block stores both (`[2, ..]`) and the sum and the norm
//!   become views of it (not in a shapeless tape).
//! - **Elementwise clusters.** Elementwise nodes (`Fused` groups and single ops) of one
//!   shape, dtype and stream that read one another, whose inputs each have that shape or
//!   one element, become one program of several outputs: every member that is an output
//!   or read outside the cluster is stored (an optimizer's moments and the parameter
//!   update that reads them: one pass over the four inputs instead of three passes). The
//!   program is a single-member `Multi` block and the members views of its pieces (not in
//!   a shapeless tape). A cluster stays apart when a node outside it is made from a member
//!   and read by another (the block would read its own output).
//! - **Multi-tensor apply.** `Fused` nodes and the clusters' blocks with the same program,
//!   at the same depth of the graph (so none reads another), whose inputs each have the
//!   node's shape or one element, become one `Multi` block over all of them, and each
//!   becomes a view of its piece of the block's output (not in a shapeless tape). An
//!   optimizer step over many parameters is then one kernel.
//!
//! - **Quantized products.** A `QuantMatmul` whose `x` is an RMS norm or an elementwise
//!   program that nothing else reads, or whose product only an elementwise node of its
//!   shape reads, becomes a `QMatmul` block: `post(x @ wᵀ, ..)` with `x` computed inside
//!   (made first, so the residual add after a product becomes its post program rather
//!   than the first half of a residual norm). A decode step's products then take the
//!   norm before them, the gated activation and the residual add after them into their
//!   one kernel on a GPU; the norm's sum of squares is then summed in another order than
//!   the norm kernel's, so the last bits of a half-precision result may differ from eager.
//!
//! Before fusion (`attention`, on the simplified tape):
//! - **Attention.** `softmax(q @ swapaxes(k) [* c] [+ mask], -1) @ v` with scalar `c`
//!   becomes one `Attention` node (the fused kernel of `scaled_dot_product_attention`),
//!   when the scores, the softmax and the scaled or masked scores are read by nothing
//!   else and `q`, `k`, `v` fit its shape rule (no batch broadcasting). The scores are
//!   then never stored; the kernels accumulate in f32 where the ops rounded the scores to
//!   the dtype, so a half-precision result may differ from eager in its last bits.

use std::sync::Arc;

use crate::compile::simplify::dce;
use crate::compile::trace::{Ref, Tape, TapeNode, order_reads};
use crate::dtype::DType;
use crate::primitives::attention::AttentionMaskKind;
use crate::primitives::fused::{
    BlockKind, Builder, FusedBlock, FusedProgram, Inst, QInput, fusable, lt_epilogue, renumber_inputs,
};
use crate::primitives::{BinaryOp, Primitive};

fn ref_shape(tape: &Tape, r: Ref) -> &[usize] {
    match r {
        Ref::Input(i) => &tape.input_shapes[i],
        Ref::Node(i) => &tape.nodes[i].shape,
        Ref::Const(i) => tape.consts[i].shape(),
    }
}

fn ref_dtype(tape: &Tape, r: Ref) -> DType {
    match r {
        Ref::Input(i) => tape.input_dtypes[i],
        Ref::Node(i) => tape.nodes[i].dtype,
        Ref::Const(i) => tape.consts[i].dtype(),
    }
}

/// Distinct consumers of each node (outputs and rule reads count), and which are outputs.
fn uses(tape: &Tape) -> (Vec<u32>, Vec<bool>) {
    let n = tape.nodes.len();
    let (mut count, mut last) = (vec![0u32; n], vec![usize::MAX; n]);
    for (c, node) in tape.nodes.iter().enumerate() {
        for r in node.inputs.iter().copied().chain(node.rule.iter().flat_map(|r| r.refs())) {
            if let Ref::Node(i) = r
                && last[i] != c
            {
                last[i] = c;
                count[i] += 1;
            }
        }
    }
    let mut out = vec![false; n];
    for r in &tape.outputs {
        if let Ref::Node(i) = *r {
            out[i] = true;
            count[i] += 1;
        }
    }
    (count, out)
}

fn block(kind: BlockKind) -> Primitive {
    Primitive::Block(Arc::new(FusedBlock { kind }))
}

/// Rewrites `tape` with fused blocks. `fixed_shapes`: the tape is replayed on its traced
/// shapes only, so blocks whose views fix shapes may be made.
pub(crate) fn blocks(tape: &mut Tape, fixed_shapes: bool) {
    if qmatmul_blocks(tape) {
        order_reads(tape);
        dce(tape);
    }
    let mut changed = matmul_epilogues(tape);
    changed |= residual_norms(tape, fixed_shapes);
    // Blocks and views appended at the end are read by earlier nodes: order first (the
    // liveness walk and the depths assume inputs come before their readers).
    if changed {
        order_reads(tape);
        dce(tape);
    }
    if fixed_shapes && multi_output(tape) {
        order_reads(tape);
        dce(tape);
    }
    if fixed_shapes && multi_tensor(tape) {
        order_reads(tape);
        dce(tape);
    }
}

/// The program of node `i` and its external inputs, when it is elementwise: a `Fused`
/// node's own, or a one-op program of a single fusable op (0-d fills inlined).
fn program_of(tape: &Tape, i: usize) -> Option<(FusedProgram, Vec<Ref>)> {
    let node = &tape.nodes[i];
    if let Primitive::Fused(p) = &node.prim {
        return Some(((**p).clone(), node.inputs.clone()));
    }
    let dts: Vec<DType> = node.inputs.iter().map(|&r| ref_dtype(tape, r)).collect();
    if !node.prim.is_elementwise() || !fusable(&node.prim, &dts, node.dtype) {
        return None;
    }
    let mut b = Builder::default();
    let mut ext: Vec<Ref> = Vec::new();
    let regs: Vec<usize> = node
        .inputs
        .iter()
        .map(|&r| {
            if let Ref::Node(j) = r {
                let n = &tape.nodes[j];
                if let Primitive::Full { value } = n.prim
                    && n.shape.is_empty()
                    && n.rule.is_none()
                {
                    return b.constant(value, n.dtype);
                }
            }
            let k = ext.iter().position(|&e| e == r).unwrap_or_else(|| {
                ext.push(r);
                ext.len() - 1
            });
            b.load(k, ref_dtype(tape, r))
        })
        .collect();
    let inst = match &node.prim {
        Primitive::Cast => Inst::Cast(regs[0]),
        Primitive::Unary(op) => Inst::Unary(*op, regs[0]),
        Primitive::Binary(op) => Inst::Binary(*op, regs[0], regs[1]),
        Primitive::Where => Inst::Where(regs[0], regs[1], regs[2]),
        _ => return None,
    };
    let out = b.push(inst, node.dtype);
    Some((b.finish(out), ext))
}

/// Matmul epilogues (see the module docs); true when any was made.
fn matmul_epilogues(tape: &mut Tape) -> bool {
    let (count, is_out) = uses(tape);
    let mut changed = false;
    for i in 0..tape.nodes.len() {
        let Some((prog, ext)) = program_of(tape, i) else { continue };
        let node = &tape.nodes[i];
        let product = ext.iter().position(|&r| match r {
            Ref::Node(j) => {
                let m = &tape.nodes[j];
                matches!(m.prim, Primitive::Matmul)
                    && count[j] == 1
                    && !is_out[j]
                    && m.stream == node.stream
                    && m.shape == node.shape
                    && m.dtype.is_float()
                    && m.inputs.len() == 2
            }
            _ => false,
        });
        let Some(pk) = product else { continue };
        let Ref::Node(j) = ext[pk] else { continue };
        // The product becomes program input 0; the other externals follow in order.
        let perm: Vec<usize> = (0..ext.len()).map(|k| if k == pk { 0 } else { k + (k < pk) as usize }).collect();
        let program = renumber_inputs(&prog, &perm);
        let mut inputs = tape.nodes[j].inputs.clone();
        inputs.extend(ext.iter().enumerate().filter(|&(k, _)| k != pk).map(|(_, &r)| r));
        // Program input k (k >= 1) is node input k + 1.
        let shape = &node.shape;
        let n = shape.last().copied().unwrap_or(1);
        let is_bias = |k: usize| {
            let s = ref_shape(tape, inputs[k + 1]);
            !s.is_empty() && s.len() <= shape.len() && s[s.len() - 1] == n && s[..s.len() - 1].iter().all(|&d| d == 1)
        };
        let is_full = |k: usize| ref_shape(tape, inputs[k + 1]) == shape.as_slice();
        let lt = lt_epilogue(&program, is_bias, is_full);
        let new = TapeNode {
            prim: block(BlockKind::Matmul { program, lt }),
            inputs,
            shape: node.shape.clone(),
            dtype: node.dtype,
            stream: node.stream.clone(),
            rule: node.rule.clone(),
        };
        tape.nodes[i] = new;
        changed = true;
    }
    changed
}

/// Whether `s` broadcasts to `to` without growing it.
fn broadcasts_to(s: &[usize], to: &[usize]) -> bool {
    crate::shape::broadcast_shapes("fused_qmatmul", s, to).is_ok_and(|b| b == to)
}

/// Quantized product blocks (see the module docs); true when any was made.
fn qmatmul_blocks(tape: &mut Tape) -> bool {
    let (count, is_out) = uses(tape);
    let n = tape.nodes.len();
    // The last reader of each node (its only one where `count` is 1).
    let mut reader = vec![usize::MAX; n];
    for (c, node) in tape.nodes.iter().enumerate() {
        for r in node.inputs.iter().copied().chain(node.rule.iter().flat_map(|r| r.refs())) {
            if let Ref::Node(i) = r {
                reader[i] = c;
            }
        }
    }
    let mut changed = false;
    for j in 0..n {
        let node = &tape.nodes[j];
        let Primitive::QuantMatmul { format } = node.prim else { continue };
        let [x, w] = node.inputs[..] else { continue };
        if node.rule.is_some() {
            continue;
        }
        let (xshape, xd) = (ref_shape(tape, x).to_vec(), ref_dtype(tape, x));
        // The x side: an RMS norm or an elementwise program that only this product reads.
        let own = |p: usize| {
            let m = &tape.nodes[p];
            count[p] == 1 && !is_out[p] && m.stream == node.stream && m.rule.is_none()
        };
        let (input, xins) = match x {
            Ref::Node(p) if own(p) => match tape.nodes[p].prim {
                Primitive::RmsNorm { eps, has_weight } if tape.nodes[p].inputs.len() == 1 + has_weight as usize => {
                    (QInput::RmsNorm { eps, has_weight }, tape.nodes[p].inputs.clone())
                }
                _ => match program_of(tape, p) {
                    Some((prog, ext))
                        if prog.more.is_empty()
                            && prog.output_dtype() == xd
                            && ext.iter().all(|&r| broadcasts_to(ref_shape(tape, r), &xshape)) =>
                    {
                        (QInput::Program(prog), ext)
                    }
                    _ => (QInput::Plain, vec![x]),
                },
            },
            _ => (QInput::Plain, vec![x]),
        };
        // The post program: the product's only reader, elementwise, of the product's shape.
        let mut post = None;
        let mut place = j;
        let mut extra: Vec<Ref> = Vec::new();
        let i = reader[j];
        if count[j] == 1 && !is_out[j] && i != usize::MAX {
            let c = &tape.nodes[i];
            if c.rule.is_none()
                && c.stream == node.stream
                && c.shape == node.shape
                && let Some((prog, ext)) = program_of(tape, i)
                && prog.more.is_empty()
                && ext.iter().filter(|&&r| r == Ref::Node(j)).count() == 1
                && ext.iter().all(|&r| r == Ref::Node(j) || broadcasts_to(ref_shape(tape, r), &node.shape))
            {
                let pk = ext.iter().position(|&r| r == Ref::Node(j)).unwrap_or(0);
                let perm: Vec<usize> =
                    (0..ext.len()).map(|k| if k == pk { 0 } else { k + (k < pk) as usize }).collect();
                post = Some(renumber_inputs(&prog, &perm));
                extra = ext.iter().enumerate().filter(|&(k, _)| k != pk).map(|(_, &r)| r).collect();
                place = i;
            }
        }
        if input == QInput::Plain && post.is_none() {
            continue;
        }
        let mut inputs = xins;
        inputs.push(w);
        inputs.extend(extra);
        let at = &tape.nodes[place];
        let new = TapeNode {
            prim: block(BlockKind::QMatmul { format, input, post, kernels: Default::default() }),
            inputs,
            shape: at.shape.clone(),
            dtype: at.dtype,
            stream: at.stream.clone(),
            rule: None,
        };
        tape.nodes[place] = new;
        changed = true;
    }
    changed
}

/// A view node: `prim` of `input`, with `shape`.
fn view(prim: Primitive, input: Ref, shape: Vec<usize>, like: &TapeNode) -> TapeNode {
    TapeNode { prim, inputs: vec![input], shape, dtype: like.dtype, stream: like.stream.clone(), rule: None }
}

/// Residual norms (see the module docs); true when any was made.
fn residual_norms(tape: &mut Tape, fixed_shapes: bool) -> bool {
    let (count, is_out) = uses(tape);
    let mut changed = false;
    for i in 0..tape.nodes.len() {
        let node = &tape.nodes[i];
        let (eps, rms, has_weight, has_bias) = match node.prim {
            Primitive::LayerNorm { eps, has_weight, has_bias } => (eps, false, has_weight, has_bias),
            Primitive::RmsNorm { eps, has_weight } => (eps, true, has_weight, false),
            _ => continue,
        };
        let Some(&Ref::Node(j)) = node.inputs.first() else { continue };
        let sum = &tape.nodes[j];
        let plain_add = matches!(sum.prim, Primitive::Binary(crate::primitives::BinaryOp::Add))
            && sum.stream == node.stream
            && sum.dtype == node.dtype
            && sum.dtype.is_float()
            && sum.rule.is_none()
            && sum
                .inputs
                .iter()
                .all(|&r| ref_shape(tape, r) == sum.shape.as_slice() && ref_dtype(tape, r) == sum.dtype);
        if !plain_add {
            continue;
        }
        let only = count[j] == 1 && !is_out[j];
        // The sum's other readers get a view of the block: the norm's other inputs must
        // come before the sum (so the block, placed there, reads nothing made from it).
        let before = node.inputs[1..].iter().all(|&r| !matches!(r, Ref::Node(k) if k >= j));
        if !(only || fixed_shapes && before) {
            continue;
        }
        let mut inputs = sum.inputs.clone();
        inputs.extend_from_slice(&node.inputs[1..]);
        let keep_sum = !only;
        let kind = BlockKind::ResidualNorm { eps, rms, has_weight, has_bias, keep_sum };
        let shape = node.shape.clone();
        if !keep_sum {
            tape.nodes[i] = TapeNode { prim: block(kind), inputs, ..node.clone() };
        } else {
            let like = node.clone();
            let mut packed_shape = vec![2];
            packed_shape.extend_from_slice(&shape);
            let b = tape.nodes.len();
            tape.nodes.push(TapeNode {
                prim: block(kind),
                inputs,
                shape: packed_shape,
                dtype: like.dtype,
                stream: like.stream.clone(),
                rule: None,
            });
            let mut one = vec![1];
            one.extend_from_slice(&shape);
            for (half, target) in [(0usize, j), (1, i)] {
                let mut start = vec![0; shape.len() + 1];
                start[0] = half;
                let slice = Primitive::Slice { start, step: vec![1; shape.len() + 1] };
                tape.nodes.push(view(slice, Ref::Node(b), one.clone(), &like));
                let s = tape.nodes.len() - 1;
                // The sum and the norm keep their indices: their readers need no change.
                tape.nodes[target] = view(Primitive::Reshape, Ref::Node(s), shape.clone(), &like);
            }
        }
        changed = true;
    }
    changed
}

/// The representative of `i` in a union-find forest.
fn root(parent: &mut [usize], mut i: usize) -> usize {
    while parent[i] != i {
        parent[i] = parent[parent[i]];
        i = parent[i];
    }
    i
}

/// Elementwise clusters (see the module docs); true when any block was made.
fn multi_output(tape: &mut Tape) -> bool {
    let n = tape.nodes.len();
    let (count, is_out) = uses(tape);
    // Candidates: elementwise nodes (`Fused` groups and single ops) of more than one
    // element whose external inputs each have the node's shape or one element (what a
    // multi-tensor member reads), with their programs.
    let progs: Vec<Option<(FusedProgram, Vec<Ref>)>> = (0..n)
        .map(|i| {
            let node = &tape.nodes[i];
            if node.rule.is_some() || node.shape.iter().product::<usize>() <= 1 {
                return None;
            }
            let (p, ext) = program_of(tape, i)?;
            let fits = ext.iter().all(|&r| {
                let s = ref_shape(tape, r);
                s == node.shape.as_slice() || s.iter().product::<usize>() == 1
            });
            (p.more.is_empty() && fits).then_some((p, ext))
        })
        .collect();
    let candidate: Vec<bool> = progs.iter().map(Option::is_some).collect();
    // A candidate joins the candidates it reads that have its shape, dtype and stream.
    let mut parent: Vec<usize> = (0..n).collect();
    for i in (0..n).filter(|&i| candidate[i]) {
        for &r in progs[i].iter().flat_map(|(_, ext)| ext) {
            if let Ref::Node(j) = r {
                let (a, b) = (&tape.nodes[i], &tape.nodes[j]);
                if candidate[j] && a.shape == b.shape && a.dtype == b.dtype && a.stream == b.stream {
                    let (ri, rj) = (root(&mut parent, i), root(&mut parent, j));
                    parent[ri.max(rj)] = ri.min(rj);
                }
            }
        }
    }
    let mut clusters: Vec<Vec<usize>> = vec![Vec::new(); n];
    for i in (0..n).filter(|&i| candidate[i]) {
        let r = root(&mut parent, i);
        clusters[r].push(i);
    }
    // Each node's readers (kept up to date as blocks are made).
    let mut readers: Vec<Vec<usize>> = vec![Vec::new(); n];
    for (c, node) in tape.nodes.iter().enumerate() {
        for r in node.inputs.iter().copied().chain(node.rule.iter().flat_map(|r| r.refs())) {
            if let Ref::Node(i) = r {
                readers[i].push(c);
            }
        }
    }
    let mut member = vec![false; n];
    let mut changed = false;
    for cluster in clusters.into_iter().filter(|c| c.len() >= 2) {
        for &m in &cluster {
            member[m] = true;
        }
        let made = cluster_block(tape, &mut readers, &progs, &cluster, &member, (&count, &is_out));
        for &m in &cluster {
            member[m] = false;
        }
        changed |= made;
    }
    changed
}

/// Replaces the nodes of `cluster` (ascending, so in tape order; `member` marks them) by
/// views of one single-member `Multi` block computing every member that is read outside
/// the cluster or is an output; false (the tape unchanged) when a node outside the
/// cluster both reads a member and feeds one (the block would read its own output).
fn cluster_block(
    tape: &mut Tape,
    readers: &mut Vec<Vec<usize>>,
    progs: &[Option<(FusedProgram, Vec<Ref>)>],
    cluster: &[usize],
    member: &[bool],
    (count, is_out): (&[u32], &[bool]),
) -> bool {
    let (first, last) = (cluster[0], cluster[cluster.len() - 1]);
    // The nodes made from a member outside the cluster: the block would read its own
    // output if a member read one of them. (Earlier blocks appended nodes past the tape's
    // order, so this walks the readers instead of the indices.)
    let mut made = vec![false; tape.nodes.len()];
    let mut stack: Vec<usize> = cluster.iter().flat_map(|&m| readers[m].iter().copied()).collect();
    while let Some(x) = stack.pop() {
        if (x < member.len() && member[x]) || made[x] {
            continue;
        }
        made[x] = true;
        stack.extend(readers[x].iter().copied());
    }
    let through = |r: &Ref| matches!(*r, Ref::Node(j) if made[j]);
    if cluster.iter().any(|&m| tape.nodes[m].inputs.iter().any(through)) {
        return false;
    }
    // The merged program: members in tape order, a member's reads of another member
    // replaced by that member's output register (the bits the member stored).
    let mut b = Builder::default();
    let mut ext: Vec<Ref> = Vec::new();
    let mut out_reg = vec![usize::MAX; last + 1 - first];
    let mut outputs = Vec::new();
    for &m in cluster {
        let Some((p, inputs)) = &progs[m] else { return false };
        let mut regs: Vec<usize> = Vec::with_capacity(p.insts.len());
        for (inst, &d) in p.insts.iter().zip(&p.dtypes) {
            let r = match *inst {
                Inst::Load(k) => match inputs[k] {
                    Ref::Node(j) if j >= first && member[j] => out_reg[j - first],
                    r => {
                        let e = ext.iter().position(|&x| x == r).unwrap_or_else(|| {
                            ext.push(r);
                            ext.len() - 1
                        });
                        b.load(e, p.input_dtypes[k])
                    }
                },
                Inst::Const(v) => b.constant(v, d),
                Inst::Unary(op, a) => b.push(Inst::Unary(op, regs[a]), d),
                Inst::Binary(op, a, c) => b.push(Inst::Binary(op, regs[a], regs[c]), d),
                Inst::Where(c, x, y) => b.push(Inst::Where(regs[c], regs[x], regs[y]), d),
                Inst::Cast(a) => b.push(Inst::Cast(regs[a]), d),
            };
            regs.push(r);
        }
        out_reg[m - first] = regs[p.out];
        // Stored when something outside the cluster reads it (outputs count as readers).
        let inside = cluster.iter().filter(|&&c| tape.nodes[c].inputs.contains(&Ref::Node(m))).count() as u32;
        if is_out[m] || count[m] > inside {
            outputs.push(m);
        }
    }
    let Some((&head, rest)) = outputs.split_first() else { return false };
    let more = rest.iter().map(|&m| out_reg[m - first]).collect();
    let program = b.finish_outputs(out_reg[head - first], more);
    let like = tape.nodes[head].clone();
    let size: usize = like.shape.iter().product();
    let scalar: Vec<bool> = ext.iter().map(|&r| ref_shape(tape, r).iter().product::<usize>() == 1).collect();
    let k = tape.nodes.len();
    let kind = BlockKind::Multi { program, sizes: vec![size], scalar };
    for &r in &ext {
        if let Ref::Node(j) = r {
            readers[j].push(k);
        }
    }
    tape.nodes.push(TapeNode { prim: block(kind), inputs: ext, shape: vec![size * outputs.len()], ..like.clone() });
    readers.push(Vec::new());
    for (j, &m) in outputs.iter().enumerate() {
        let slice = Primitive::Slice { start: vec![j * size], step: vec![1] };
        tape.nodes.push(view(slice, Ref::Node(k), vec![size], &like));
        let s = tape.nodes.len() - 1;
        readers[k].push(s);
        readers.push(vec![m]);
        let shape = tape.nodes[m].shape.clone();
        // The member's old inputs keep it as a reader: the member now depends on all of
        // them through the block, so the readers over-approximate and never miss a path.
        tape.nodes[m] = view(Primitive::Reshape, Ref::Node(s), shape, &like);
    }
    true
}

/// A multi-tensor candidate: a `Fused` node, or a single-member block of
/// [`multi_output`], as (program, elements per output, scalar mask).
fn multi_member(tape: &Tape, i: usize) -> Option<(&FusedProgram, usize, Vec<bool>)> {
    let node = &tape.nodes[i];
    if node.rule.is_some() {
        return None;
    }
    match &node.prim {
        Primitive::Fused(p) => {
            let size: usize = node.shape.iter().product();
            let mask: Vec<bool> =
                node.inputs.iter().map(|&r| ref_shape(tape, r).iter().product::<usize>() == 1).collect();
            let fits = node.inputs.iter().zip(&mask).all(|(&r, &s)| s || ref_shape(tape, r) == node.shape.as_slice());
            (size > 1 && fits && !mask.iter().all(|&s| s)).then_some((&**p, size, mask))
        }
        Primitive::Block(b) => match &b.kind {
            BlockKind::Multi { program, sizes, scalar } if sizes.len() == 1 => {
                Some((program, sizes[0], scalar.clone()))
            }
            _ => None,
        },
        _ => None,
    }
}

/// Multi-tensor apply (see the module docs); true when any block was made.
fn multi_tensor(tape: &mut Tape) -> bool {
    let n = tape.nodes.len();
    // Longest path from the inputs: nodes of one depth never read one another.
    let mut depth = vec![0usize; n];
    for i in 0..n {
        let d =
            tape.nodes[i].inputs.iter().filter_map(|r| if let Ref::Node(j) = *r { Some(depth[j] + 1) } else { None });
        depth[i] = d.max().unwrap_or(0);
    }
    let member = |i: usize| multi_member(tape, i);
    // Grouped by program, mask, dtype, stream, depth: (first node, its mask, members).
    let mut classes: Vec<(usize, Vec<bool>, Vec<usize>)> = Vec::new();
    for i in 0..n {
        let Some((p, _, mask)) = member(i) else { continue };
        let node = &tape.nodes[i];
        let same = |&(k, ref m, _): &(usize, Vec<bool>, Vec<usize>)| {
            let o = &tape.nodes[k];
            *m == mask
                && depth[k] == depth[i]
                && o.dtype == node.dtype
                && o.stream == node.stream
                && member(k).is_some_and(|(q, _, _)| std::ptr::eq(p, q) || *p == *q)
        };
        match classes.iter_mut().find(|c| same(c)) {
            Some(c) => c.2.push(i),
            None => classes.push((i, mask, vec![i])),
        }
    }
    let mut changed = false;
    for (first, scalar, members) in classes.into_iter().filter(|c| c.2.len() >= 2) {
        let like = tape.nodes[first].clone();
        let Some((p, _, _)) = multi_member(tape, first) else { continue };
        let program = p.clone();
        let outs = program.output_count();
        let sizes: Vec<usize> =
            members.iter().filter_map(|&m| multi_member(tape, m).map(|(_, size, _)| size)).collect();
        let inputs: Vec<Ref> = members.iter().flat_map(|&m| tape.nodes[m].inputs.clone()).collect();
        let total: usize = sizes.iter().sum();
        let b = tape.nodes.len();
        let kind = BlockKind::Multi { program, sizes: sizes.clone(), scalar };
        tape.nodes.push(TapeNode { prim: block(kind), inputs, shape: vec![total * outs], ..like.clone() });
        let mut off = 0;
        for (&m, &size) in members.iter().zip(&sizes) {
            let slice = Primitive::Slice { start: vec![off], step: vec![1] };
            tape.nodes.push(view(slice, Ref::Node(b), vec![size * outs], &like));
            let s = tape.nodes.len() - 1;
            let shape = tape.nodes[m].shape.clone();
            tape.nodes[m] = view(Primitive::Reshape, Ref::Node(s), shape, &like);
            off += size * outs;
        }
        changed = true;
    }
    changed
}

/// The value of a 0-d operand that is a fill (a node or a captured constant), rounded to
/// `dtype` as the op that reads it sees it.
fn scalar_value(tape: &Tape, r: Ref, dtype: DType) -> Option<f64> {
    let (prim, shape_empty) = match r {
        Ref::Node(i) => {
            let n = &tape.nodes[i];
            // A fill with a rule is recomputed per replay: not a constant.
            if n.rule.is_some() {
                return None;
            }
            (n.prim.clone(), n.shape.is_empty())
        }
        Ref::Const(i) => (tape.consts[i].primitive().clone(), tape.consts[i].shape().is_empty()),
        Ref::Input(_) => return None,
    };
    let Primitive::Full { value } = prim else { return None };
    if !shape_empty {
        return None;
    }
    match dtype {
        DType::F32 => Some(value as f32 as f64),
        DType::BF16 => Some(half::bf16::from_f64(value).to_f64()),
        DType::F16 => Some(half::f16::from_f64(value).to_f64()),
        _ => None,
    }
}

/// Attention blocks (see the module docs); true when any was made.
pub(crate) fn attention(tape: &mut Tape) -> bool {
    let (count, is_out) = uses(tape);
    let mut changed = false;
    for i in 0..tape.nodes.len() {
        if let Some(new) = attention_at(tape, i, &count, &is_out) {
            tape.nodes[i] = new;
            changed = true;
        }
    }
    if changed {
        dce(tape);
    }
    changed
}

/// The `Attention` node that replaces node `i` when it is the final product of the
/// pattern.
fn attention_at(tape: &Tape, i: usize, count: &[u32], is_out: &[bool]) -> Option<TapeNode> {
    let node = &tape.nodes[i];
    if !matches!(node.prim, Primitive::Matmul) || !matches!(node.dtype, DType::F32 | DType::BF16 | DType::F16) {
        return None;
    }
    // A node of the pattern other than the last: same stream and dtype, read only here.
    let inner = |r: Ref| -> Option<(usize, &TapeNode)> {
        let Ref::Node(j) = r else { return None };
        let n = &tape.nodes[j];
        (count[j] == 1 && !is_out[j] && n.stream == node.stream && n.dtype == node.dtype).then_some((j, n))
    };
    let [probs, v] = node.inputs[..] else { return None };
    let (_, soft) = inner(probs)?;
    let rank = soft.shape.len();
    match soft.prim {
        Primitive::Softmax { axis, log: false } if axis + 1 == rank && rank >= 3 => {}
        _ => return None,
    }
    let mut x = soft.inputs[0];
    // `+ mask`: the side that is not the chain is the mask.
    let mut mask = None;
    if let Some((_, add)) = inner(x).filter(|(_, n)| matches!(n.prim, Primitive::Binary(BinaryOp::Add))) {
        let chain = |r: Ref| {
            inner(r).is_some_and(|(_, n)| {
                matches!(n.prim, Primitive::Matmul | Primitive::Binary(BinaryOp::Mul | BinaryOp::Div))
                    && n.shape == soft.shape
            })
        };
        let (c, m) = if chain(add.inputs[0]) { (add.inputs[0], add.inputs[1]) } else { (add.inputs[1], add.inputs[0]) };
        if !chain(c) || ref_dtype(tape, m) != node.dtype {
            return None;
        }
        mask = Some(m);
        x = c;
    }
    // `* c` or `/ c` with a 0-d fill `c`, on either side of a product.
    let mut scale = 1.0;
    if let Some((_, op)) = inner(x).filter(|(_, n)| matches!(n.prim, Primitive::Binary(BinaryOp::Mul | BinaryOp::Div)))
    {
        let [a, b] = op.inputs[..] else { return None };
        let div = matches!(op.prim, Primitive::Binary(BinaryOp::Div));
        let (c, value) = match (scalar_value(tape, b, node.dtype), scalar_value(tape, a, node.dtype)) {
            (Some(v), _) => (a, v),
            (None, Some(v)) if !div => (b, v),
            _ => return None,
        };
        scale = if div { 1.0 / value } else { value };
        x = c;
    }
    let (_, scores) = inner(x)?;
    if !matches!(scores.prim, Primitive::Matmul) || scores.shape != soft.shape {
        return None;
    }
    let [q, kt] = scores.inputs[..] else { return None };
    // `swapaxes(k, -1, -2)`: a permutation that swaps the last two axes only.
    let Ref::Node(p) = kt else { return None };
    let Primitive::Permute(perm) = &tape.nodes[p].prim else { return None };
    let swaps = perm.len() == rank
        && perm[..rank - 2].iter().enumerate().all(|(a, &b)| a == b)
        && perm[rank - 2] == rank - 1
        && perm[rank - 1] == rank - 2;
    let k = tape.nodes[p].inputs[0];
    if !swaps || [q, k, v].iter().any(|&r| ref_dtype(tape, r) != node.dtype) {
        return None;
    }
    let mask_shape = mask.map(|m| ref_shape(tape, m));
    let out = crate::primitives::attention::attention(
        "scaled_dot_product_attention",
        ref_shape(tape, q),
        ref_shape(tape, k),
        ref_shape(tape, v),
        mask_shape,
    )
    .ok()?;
    if out != node.shape {
        return None;
    }
    let mut inputs = vec![q, k, v];
    inputs.extend(mask);
    let kind = if mask.is_some() { AttentionMaskKind::Array } else { AttentionMaskKind::None };
    Some(TapeNode {
        prim: Primitive::Attention { scale: Some(scale), mask: kind },
        inputs,
        shape: node.shape.clone(),
        dtype: node.dtype,
        stream: node.stream.clone(),
        rule: node.rule.clone(),
    })
}
