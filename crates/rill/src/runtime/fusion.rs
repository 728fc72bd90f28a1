//! Fusion at eval: before an evaluation queues its nodes, chains of elementwise ops whose
//! intermediates nobody else holds become one `Fused` node (and an elementwise group
//! feeding a reduction one `FusedReduce` node), so `eval` runs one generated kernel where
//! the graph has a chain of ops, without `compile`.
//!
//! The groups are those of `compile`'s fuser (`compile::fuse::groups`), found on a tape
//! view of the evaluation's pending nodes. A pending node may be absorbed into its
//! consumer's group only when nothing but that consumer and this evaluation refers to it:
//! its reference count is exactly one for the evaluation's list plus one per use by the
//! pending nodes listed. A node the user holds (or another graph, or another thread's
//! evaluation) has more and stays materialised, so a chain is never fused past a value
//! someone can still read.
//!
//! The rewrite changes only the group's root (the node whose value the group computes):
//! under its state lock, while it is still `Pending`, its fused primitive is set
//! (`Node::fused`) and its inputs become the group's external inputs. Members are never
//! modified: one that escapes after the check (through `Array::inputs` of the root, read
//! before the rewrite) is still a complete lazy node and is computed if evaluated. Members
//! are dropped from the evaluation's list, so they are never computed.
//!
//! Programs are interned by structure (instructions, dtypes, inputs), so an evaluation of
//! the same graph shape finds the program, and every kernel a backend built for it, of the
//! previous one. A fused program computes the same bits as the ops it replaces (see
//! `primitives/fused.rs`), so results do not depend on whether fusion ran.
//!
//! [`set_eval_fusion`] (or `RILL_EVAL_FUSION=0` in the environment) turns it off; the
//! counters `eval_fused_groups` and `eval_fused_ops` say what it did.

use rustc_hash::FxHashMap as HashMap;

use crate::array::Array;
use crate::compile::trace::{Ref, Tape, TapeNode};
use crate::compile::{fuse, simplify};
use crate::primitives::Primitive;
use crate::primitives::fused::FusedProgram;
use crate::runtime::claim::Status;
use crate::runtime::stats;
use crate::sync::atomic::{AtomicU8, Ordering::Relaxed};
use crate::sync::{Arc, Mutex};

/// Most ops one fused node computes: a long chain becomes several kernels of this size
/// (each a quick compile), not one kernel of every op.
const MAX_GROUP_OPS: usize = 128;

/// 0: not read yet, 1: on, 2: off.
static MODE: AtomicU8 = AtomicU8::new(0);

/// Turns fusion at eval on or off for the whole process (on by default, unless the
/// environment sets `RILL_EVAL_FUSION=0`); returns the previous setting. Results are the
/// same either way; only the number of kernels (and the memory of intermediates) changes.
pub fn set_eval_fusion(on: bool) -> bool {
    let was = eval_fusion();
    MODE.store(if on { 1 } else { 2 }, Relaxed);
    was
}

/// Whether evaluations fuse elementwise chains (see [`set_eval_fusion`]).
pub fn eval_fusion() -> bool {
    match MODE.load(Relaxed) {
        1 => true,
        2 => false,
        _ => {
            let on = std::env::var("RILL_EVAL_FUSION").as_deref() != Ok("0");
            // A concurrent setter wins over the environment.
            let _ = MODE.compare_exchange(0, if on { 1 } else { 2 }, Relaxed, Relaxed);
            MODE.load(Relaxed) == 1
        }
    }
}

/// True for the primitives a group can hold (the fuser decides with the dtypes).
fn elementwise(p: &Primitive) -> bool {
    matches!(p, Primitive::Cast | Primitive::Unary(_) | Primitive::Binary(_) | Primitive::Where)
}

/// Rewrites the evaluation's pending nodes `order` (topological, as `claim::pending_order`
/// lists them) with fused groups, and drops the absorbed members from it.
pub(crate) fn fuse_pending(order: &mut Vec<Array>) {
    // Most evaluations have no two elementwise ops to join: decide that before any work.
    if order.iter().filter(|a| elementwise(&a.node.prim)).take(2).count() < 2 || !eval_fusion() {
        return;
    }
    // Reference counts first, before this function clones anything.
    let counts: Vec<usize> = order.iter().map(|a| Arc::strong_count(&a.node)).collect();
    let pos: HashMap<u64, usize> = order.iter().enumerate().map(|(i, a)| (a.node.id, i)).collect();
    let mut uses = vec![0usize; order.len()];
    // Each listed node's inputs as refs: `Node(p)` a listed node, `Const(k)` a 0-d fill
    // from outside (the fuser inlines it as a constant), `Input(k)` any other array.
    let mut outside: Vec<Array> = Vec::new();
    let mut fills: Vec<Array> = Vec::new();
    let mut outside_ref: HashMap<u64, Ref> = HashMap::default();
    let mut refs: Vec<Vec<Ref>> = Vec::with_capacity(order.len());
    for a in order.iter() {
        let g = a.node.state.lock();
        // Claimed since the walk (by another evaluation): nothing of it is rewritten, and
        // its inputs count as held.
        let ins = if g.status == Status::Pending { &g.inputs[..] } else { &[] };
        let rs = ins.iter().map(|i| {
            if let Some(&p) = pos.get(&i.node.id) {
                uses[p] += 1;
                return Ref::Node(p);
            }
            *outside_ref.entry(i.node.id).or_insert_with(|| {
                let fill = matches!(i.node.prim(), Primitive::Full { .. }) && i.node.shape.is_empty();
                let list = if fill { &mut fills } else { &mut outside };
                list.push(i.clone());
                if fill { Ref::Const(list.len() - 1) } else { Ref::Input(list.len() - 1) }
            })
        });
        refs.push(rs.collect());
    }
    // Held: someone besides this list and the listed nodes' inputs refers to the node.
    let held: Vec<bool> = (0..order.len()).map(|i| counts[i] > 1 + uses[i]).collect();

    // The tape view: the fills first, then the listed nodes (tape node `nf + p`).
    let nf = fills.len();
    let node_of = |a: &Array, inputs: Vec<Ref>| TapeNode {
        prim: a.node.prim().clone(),
        inputs,
        shape: a.node.shape.to_vec(),
        dtype: a.node.dtype,
        stream: Some(a.node.stream.clone()),
        rule: None,
    };
    let at = |r: Ref| match r {
        Ref::Node(p) => Ref::Node(nf + p),
        Ref::Const(k) => Ref::Node(k),
        r => r,
    };
    let nodes = fills.iter().map(|f| node_of(f, Vec::new()));
    let nodes = nodes.chain(order.iter().zip(refs).map(|(a, rs)| node_of(a, rs.into_iter().map(at).collect())));
    let mut tape = Tape {
        input_shapes: outside.iter().map(|a| a.node.shape.to_vec()).collect(),
        input_dtypes: outside.iter().map(|a| a.node.dtype).collect(),
        nodes: nodes.collect(),
        consts: Vec::new(),
        outputs: Vec::new(),
        shape_specific: false,
    };
    let is_output: Vec<bool> = std::iter::repeat_n(true, nf).chain(held.iter().copied()).collect();
    let groups = fuse::groups(&tape, true, &is_output, MAX_GROUP_OPS);

    // The array a tape ref names.
    let array_of = |r: Ref| -> Array {
        match r {
            Ref::Node(t) if t < nf => fills[t].clone(),
            Ref::Node(t) => order[t - nf].clone(),
            Ref::Input(k) => outside[k].clone(),
            Ref::Const(_) => unreachable!("the eval tape has no captured constants"),
        }
    };
    let (mut fused_groups, mut fused_ops) = (0u64, 0u64);
    for (t, node) in groups {
        let root = &order[t - nf].node;
        let prim = intern(node.prim);
        let externals: crate::array::Inputs = node.inputs.iter().map(|&r| array_of(r)).collect();
        let old = {
            let mut g = root.state.lock();
            if g.status != Status::Pending || root.fused.set(prim.clone()).is_err() {
                continue;
            }
            std::mem::replace(&mut g.inputs, externals)
        };
        // The old inputs are released outside the lock (members are still listed).
        drop(old);
        fused_groups += 1;
        fused_ops += match &prim {
            Primitive::Fused(p) => p.op_count() as u64,
            Primitive::FusedReduce { program, .. } => program.op_count() as u64 + 1,
            _ => 0,
        };
        // The tape now reads as the graph does, for the liveness pass below.
        tape.nodes[t].inputs = node.inputs;
    }
    if fused_groups == 0 {
        return;
    }
    stats::EVAL_FUSED_GROUPS.fetch_add(fused_groups, Relaxed);
    stats::EVAL_FUSED_OPS.fetch_add(fused_ops, Relaxed);

    // Keep what is held or still read from a held node; the absorbed members go.
    tape.outputs = (0..order.len()).filter(|&i| held[i]).map(|i| Ref::Node(nf + i)).collect();
    let (live, _) = simplify::live(&tape);
    let mut keep = live.into_iter().skip(nf);
    order.retain(|_| keep.next().unwrap_or(true));
}

/// Largest number of programs kept for reuse; beyond it the table starts again.
const MAX_PROGRAMS: usize = 4096;

/// The programs fusion at eval has built, by structure.
static PROGRAMS: Mutex<Option<HashMap<ProgramKey, Arc<FusedProgram>>>> = Mutex::new(None);

/// What makes two programs the same: their inputs, instructions and output.
#[derive(Clone, PartialEq, Eq, Hash)]
struct ProgramKey(Vec<u64>);

impl ProgramKey {
    fn of(p: &FusedProgram) -> ProgramKey {
        use crate::primitives::fused::Inst;
        let mut k = Vec::with_capacity(2 + p.input_dtypes.len() + 3 * p.insts.len());
        k.push(p.out as u64);
        k.push(p.more.len() as u64);
        k.extend(p.more.iter().map(|&r| r as u64));
        k.push(p.input_dtypes.len() as u64);
        k.extend(p.input_dtypes.iter().map(|&d| d as u64));
        for (inst, &d) in p.insts.iter().zip(&p.dtypes) {
            let (tag, a, b) = match *inst {
                Inst::Load(i) => (0u64, i as u64, 0u64),
                Inst::Const(v) => (1, v.to_bits(), 0),
                Inst::Unary(op, r) => (2 | (op as u64) << 8, r as u64, 0),
                Inst::Binary(op, r, s) => (3 | (op as u64) << 8, r as u64, s as u64),
                Inst::Where(c, x, y) => (4 | (c as u64) << 8, x as u64, y as u64),
                Inst::Cast(r) => (5, r as u64, 0),
            };
            k.extend([tag | (d as u64) << 40, a, b]);
        }
        ProgramKey(k)
    }
}

/// `prim` with its program replaced by the interned one of the same structure.
fn intern(prim: Primitive) -> Primitive {
    let one = |p: Arc<FusedProgram>| -> Arc<FusedProgram> {
        let key = ProgramKey::of(&p);
        let mut g = PROGRAMS.lock();
        let table = g.get_or_insert_with(HashMap::default);
        if let Some(q) = table.get(&key) {
            return q.clone();
        }
        if table.len() >= MAX_PROGRAMS {
            table.clear();
        }
        table.insert(key, p.clone());
        p
    };
    match prim {
        Primitive::Fused(p) => Primitive::Fused(one(p)),
        Primitive::FusedReduce { program, op, axes } => Primitive::FusedReduce { program: one(program), op, axes },
        p => p,
    }
}
