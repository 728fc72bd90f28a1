//! The gradient slot of every primitive: [`Primitive::vjp`] and [`Primitive::jvp`]
//! dispatch to the rule in the primitive's family file (`unary.rs`, `binary.rs`,
//! `reduce.rs`, `nn.rs`, `linalg.rs`, `attention.rs`, `decode.rs`, `movement.rs`,
//! `scatter.rs`, `creation.rs`, `fused.rs`), so each primitive's gradient sits beside its
//! shape rule and its kernels' formulas. A rule sees
//! the node's inputs and output as arrays of a traced graph and builds its result with
//! ops. A primitive without a rule returns `Error::Unsupported` naming it (never a zero).
//! `None` stands for a cotangent or tangent that is structurally zero (an integer input,
//! an index, a source).

//!
//! Adding a primitive: give it an [`Owner`] in `grad_owner` (the one table); its family
//! file's `vjp`/`jvp` then either handle it or return `no_rule` for it.

use crate::array::Array;
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::ops::elementwise::where_;
use crate::ops::{on_device, target_stream};

use super::{
    BinaryOp, Primitive, UnaryOp, attention, creation, decode, fused, linalg, movement, nn, reduce, scatter, sort,
};

/// What a reverse-mode rule is given: the node's inputs, its output, and the cotangent of
/// the output (same shape and dtype as `output`).
pub(crate) struct Vjp<'a> {
    pub(crate) inputs: &'a [Array],
    pub(crate) output: &'a Array,
    pub(crate) cotangent: &'a Array,
}

/// What a forward-mode rule is given: the node's inputs, the tangent of each input, and
/// the node's output.
pub(crate) struct Jvp<'a> {
    pub(crate) inputs: &'a [Array],
    pub(crate) tangents: &'a [Option<Array>],
    pub(crate) output: &'a Array,
}

/// The error of a primitive whose `transform` (`"vjp"` or `"jvp"`) rule is not written.
pub(crate) fn no_rule(op: &'static str, transform: &str) -> Error {
    Error::Unsupported { op, backend: "autodiff", msg: format!("no {transform} rule for this primitive") }
}

/// Records `prim` of `inputs` with `shape` and `dtype` (the rules that re-apply a linear
/// primitive to a tangent).
pub(crate) fn record(prim: Primitive, inputs: Vec<Array>, shape: &[usize], dtype: DType) -> Result<Array> {
    let refs: Vec<&Array> = inputs.iter().collect();
    let stream = target_stream(&refs)?;
    let inputs: Vec<Array> = inputs.iter().map(|a| on_device(a, &stream)).collect();
    Ok(Array::from_op(prim, inputs, shape.to_vec(), dtype, stream))
}

/// `ct` (of a broadcast shape) summed over the axes broadcasting added or stretched, in
/// `shape`: the cotangent of an operand that was broadcast.
pub(crate) fn unbroadcast(ct: &Array, shape: &[usize]) -> Result<Array> {
    if ct.shape() == shape {
        return Ok(ct.clone());
    }
    if let Some(folded) = linalg::batch_summed(ct, shape)? {
        return Ok(folded);
    }
    let lead = ct.ndim() - shape.len();
    let axes: Vec<isize> = (0..ct.ndim())
        .filter(|&i| i < lead || (shape[i - lead] == 1 && ct.shape()[i] != 1))
        .map(|i| i as isize)
        .collect();
    let summed = if axes.is_empty() { ct.clone() } else { ct.sum(&axes, true)? };
    let spec: Vec<isize> = shape.iter().map(|&d| d as isize).collect();
    summed.reshape(&spec)
}

/// `t` broadcast to `shape` (a tangent of a smaller operand, as the output's).
pub(crate) fn broadcast(t: Array, shape: &[usize]) -> Result<Array> {
    if t.shape() == shape { Ok(t) } else { t.broadcast_to(shape) }
}

/// The sum of two optional terms (`None`: zero).
pub(crate) fn add_opt(a: Option<Array>, b: Option<Array>) -> Result<Option<Array>> {
    Ok(match (a, b) {
        (Some(a), Some(b)) => Some(a.add(&b)?),
        (a, None) => a,
        (None, b) => b,
    })
}

/// `Cast`: the cotangent converted back (no derivative through an integer or bool on
/// either side). `Where`: the cotangent routed to the chosen operand (the condition has
/// none).
fn elementwise_vjp(p: &Primitive, g: &Vjp<'_>) -> Result<Vec<Option<Array>>> {
    match p {
        Primitive::Cast => {
            let x = &g.inputs[0];
            let ok = x.dtype().is_float() && g.output.dtype().is_float();
            Ok(vec![if ok { Some(g.cotangent.astype(x.dtype())?) } else { None }])
        }
        Primitive::Where => {
            let (c, x, y, ct) = (&g.inputs[0], &g.inputs[1], &g.inputs[2], g.cotangent);
            let cx = unbroadcast(&where_(c, ct, 0.0)?, x.shape())?;
            let cy = unbroadcast(&where_(c, 0.0, ct)?, y.shape())?;
            Ok(vec![None, Some(cx), Some(cy)])
        }
        other => Err(no_rule(other.name(), "vjp")),
    }
}

fn elementwise_jvp(p: &Primitive, g: &Jvp<'_>) -> Result<Option<Array>> {
    match p {
        Primitive::Cast => match &g.tangents[0] {
            Some(t) if g.output.dtype().is_float() => Ok(Some(t.astype(g.output.dtype())?)),
            _ => Ok(None),
        },
        Primitive::Where => {
            let c = &g.inputs[0];
            let pick = |t: &Option<Array>| t.clone().map(crate::ops::Operand::Array);
            let zero = || crate::ops::Operand::Scalar(crate::dtype::Scalar::Float(0.0));
            let (tx, ty) = (pick(&g.tangents[1]), pick(&g.tangents[2]));
            if tx.is_none() && ty.is_none() {
                return Ok(None);
            }
            let t = where_(c, tx.unwrap_or_else(zero), ty.unwrap_or_else(zero))?;
            let t = if t.dtype() == g.output.dtype() { t } else { t.astype(g.output.dtype())? };
            Ok(Some(broadcast(t, g.output.shape())?))
        }
        other => Err(no_rule(other.name(), "jvp")),
    }
}

/// Where a primitive's gradient rules live: the one table from primitives to rule files.
enum Owner {
    Creation,
    Unary(UnaryOp),
    Binary(BinaryOp),
    /// `Cast` and `Where`, whose rules go here.
    Elementwise,
    Reduce,
    Sort,
    Nn,
    Linalg,
    Attention,
    /// `Rope` and `SliceUpdate` (`decode.rs`).
    Decode,
    /// No rule written yet (`QuantMatmul`, `Dequantize`): both modes return
    /// `Unsupported` naming the primitive.
    Unwritten,
    Movement,
    /// `ScatterAdd`, `TakeAlongAxis`, `PutAlongAxis`.
    Scatter,
    /// A host callback: no derivative.
    Host(&'static str),
    /// A traced input: no inputs of its own, and a given tangent.
    Placeholder,
    Fused,
    /// `stop_gradient`: the identity, with no derivative.
    Stop,
    /// `Depend` and `Checkpoint`, whose rules live beside `checkpoint` (`autodiff.rs`).
    Checkpoint,
}

impl Primitive {
    fn grad_owner(&self) -> Owner {
        use Primitive::*;
        match self {
            Constant | Full { .. } | Arange { .. } | Eye { .. } | Random { .. } => Owner::Creation,
            Unary(op) => Owner::Unary(*op),
            Binary(op) => Owner::Binary(*op),
            Cast | Where => Owner::Elementwise,
            Reduce { .. } | ArgReduce { .. } | Cumsum { .. } => Owner::Reduce,
            Sort(_) => Owner::Sort,
            Softmax { .. } | LayerNorm { .. } | RmsNorm { .. } => Owner::Nn,
            Matmul => Owner::Linalg,
            Attention { .. } | AttentionGrad { .. } => Owner::Attention,
            QuantMatmul { .. } | Dequantize { .. } => Owner::Unwritten,
            Rope { .. } | SliceUpdate { .. } => Owner::Decode,
            Reshape
            | Permute(_)
            | BroadcastTo
            | Slice { .. }
            | Contiguous
            | Take { .. }
            | Concatenate { .. }
            | Pad { .. }
            | ToDevice => Owner::Movement,
            ScatterAdd { .. } | TakeAlongAxis { .. } | PutAlongAxis { .. } => Owner::Scatter,
            Host { name, .. } => Owner::Host(name),
            Placeholder { .. } => Owner::Placeholder,
            Fused(_) | FusedReduce { .. } | Block(_) => Owner::Fused,
            StopGradient => Owner::Stop,
            Depend | Checkpoint { .. } => Owner::Checkpoint,
        }
    }

    /// The cotangent of each input (`None`: structurally zero), from the cotangent of the
    /// output.
    pub(crate) fn vjp(&self, g: &Vjp<'_>) -> Result<Vec<Option<Array>>> {
        match self.grad_owner() {
            Owner::Creation => creation::vjp(self, g),
            Owner::Unary(op) => Ok(vec![op.vjp(g)?]),
            Owner::Binary(op) => Ok(op.vjp(g)?.into()),
            Owner::Elementwise => elementwise_vjp(self, g),
            Owner::Reduce => reduce::vjp(self, g),
            Owner::Sort => sort::vjp(self, g),
            Owner::Nn => nn::vjp(self, g),
            Owner::Linalg => linalg::vjp(self, g),
            Owner::Attention => attention::vjp(self, g),
            Owner::Decode => decode::vjp(self, g),
            Owner::Unwritten => Err(no_rule(self.name(), "vjp")),
            Owner::Movement => movement::vjp(self, g),
            Owner::Scatter => scatter::vjp(self, g),
            Owner::Host(name) => Err(no_derivative(name)),
            Owner::Placeholder => Ok(Vec::new()),
            Owner::Fused => fused::vjp(self, g),
            Owner::Stop => Ok(vec![None]),
            Owner::Checkpoint => crate::autodiff::checkpoint_vjp(self, g),
        }
    }

    /// The tangent of the output (`None`: structurally zero), from the tangents of the
    /// inputs.
    pub(crate) fn jvp(&self, g: &Jvp<'_>) -> Result<Option<Array>> {
        match self.grad_owner() {
            Owner::Creation => creation::jvp(self, g),
            Owner::Unary(op) => op.jvp(g),
            Owner::Binary(op) => op.jvp(g),
            Owner::Elementwise => elementwise_jvp(self, g),
            Owner::Reduce => reduce::jvp(self, g),
            Owner::Sort => sort::jvp(self, g),
            Owner::Nn => nn::jvp(self, g),
            Owner::Linalg => linalg::jvp(self, g),
            Owner::Attention => attention::jvp(self, g),
            Owner::Decode => decode::jvp(self, g),
            Owner::Unwritten => Err(no_rule(self.name(), "jvp")),
            Owner::Movement => movement::jvp(self, g),
            Owner::Scatter => scatter::jvp(self, g),
            Owner::Host(name) => Err(no_derivative(name)),
            Owner::Placeholder => Ok(None),
            Owner::Fused => fused::jvp(self, g),
            Owner::Stop => Ok(None),
            Owner::Checkpoint => crate::autodiff::checkpoint_jvp(self, g),
        }
    }
}

fn no_derivative(op: &'static str) -> Error {
    Error::Unsupported { op, backend: "autodiff", msg: "a host callback has no derivative".into() }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A host callback refuses by name in both modes; sources and traced inputs have
    /// nothing to differentiate; `stop_gradient` passes nothing.
    #[test]
    fn slots_refuse_by_name_or_pass_nothing() {
        let x = Array::from_slice(&[1.0f32, 2.0], &[2]).unwrap();
        let inputs = [x.clone(), x.clone()];
        let vjp = Vjp { inputs: &inputs, output: &x, cotangent: &x };
        let jvp = Jvp { inputs: &inputs, tangents: &[Some(x.clone()), None], output: &x };
        let refused = [
            Primitive::Host { name: "my_callback", f: std::sync::Arc::new(|v: &[Vec<f64>]| Ok(v[0].clone())) },
            Primitive::QuantMatmul { format: crate::quant::QuantFormat::Q4_0 },
            Primitive::Dequantize { format: crate::quant::QuantFormat::Q8_0 },
        ];
        for p in &refused {
            for r in [p.vjp(&vjp).map(|_| ()), p.jvp(&jvp).map(|_| ())] {
                match r {
                    Err(Error::Unsupported { op, backend: "autodiff", .. }) => assert_eq!(op, p.name()),
                    other => panic!("{}: {other:?}", p.name()),
                }
            }
        }
        for p in [Primitive::Full { value: 1.0 }, Primitive::Placeholder { index: 0 }] {
            assert!(p.vjp(&vjp).unwrap().is_empty(), "{}", p.name());
            assert!(p.jvp(&jvp).unwrap().is_none(), "{}", p.name());
        }
        let s = Primitive::StopGradient;
        assert!(s.vjp(&vjp).unwrap().iter().all(Option::is_none));
        assert!(s.jvp(&jvp).unwrap().is_none());
    }

    #[test]
    fn unbroadcast_sums_the_broadcast_axes() {
        let ct = Array::from_slice(&(0..24).map(|i| i as f64).collect::<Vec<_>>(), &[2, 3, 4]).unwrap();
        let r = unbroadcast(&ct, &[3, 1]).unwrap();
        assert_eq!(r.shape(), &[3, 1]);
        let want: Vec<f64> =
            (0..3).map(|j| (0..2).flat_map(|i| (0..4).map(move |k| (i * 12 + j * 4 + k) as f64)).sum()).collect();
        assert_eq!(r.to_vec::<f64>().unwrap(), want);
    }
}
