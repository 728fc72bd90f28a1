//! Ops: validate inputs, infer the output shape and dtype, and record a node.
//!
//! Nothing here computes. Every op picks its stream with `target_stream`: the innermost
//! scoped override if one is active (see `runtime/scope.rs`), otherwise the default stream
//! of the device where its first array input lives (or of the default device). Inputs on
//! another device are moved with a `ToDevice` node; inputs of another dtype get a `Cast`
//! node. Errors name the op and the shapes, axes or dtypes involved.

pub(crate) mod attention;
pub(crate) mod custom;
pub(crate) mod decode;
pub(crate) mod elementwise;
pub(crate) mod linalg;
pub(crate) mod movement;
pub(crate) mod nn;
pub(crate) mod quant;
pub(crate) mod reduce;
pub(crate) mod scatter;
pub(crate) mod sort;

use crate::array::Array;
use crate::dtype::{DType, Scalar};
use crate::error::Result;
use crate::primitives::Primitive;
use crate::runtime::device::default_device;
use crate::runtime::lifecycle;
use crate::runtime::scope::current_stream_override;
use crate::runtime::stream::Stream;
use crate::shape::Dims;
use smallvec::smallvec;

/// An operand of an elementwise op: an array or a weakly typed Rust scalar.
#[derive(Clone, Debug)]
pub enum Operand {
    /// An array.
    Array(Array),
    /// A Rust scalar (it does not widen the other operand's dtype).
    Scalar(Scalar),
}

/// Things usable as operands: `&Array`, `Array`, and Rust numbers and bools.
pub trait IntoOperand {
    /// Converts into an operand.
    fn into_operand(self) -> Operand;
}
impl IntoOperand for &Array {
    fn into_operand(self) -> Operand {
        Operand::Array(self.clone())
    }
}
impl IntoOperand for Array {
    fn into_operand(self) -> Operand {
        Operand::Array(self)
    }
}
impl IntoOperand for Operand {
    fn into_operand(self) -> Operand {
        self
    }
}
macro_rules! scalar_operand {
    ($($t:ty),*) => {$(
        impl IntoOperand for $t {
            fn into_operand(self) -> Operand { Operand::Scalar(Scalar::from(self)) }
        }
    )*};
}
scalar_operand!(f32, f64, i8, i16, i32, i64, u8, u16, u32, usize, bool, half::f16, half::bf16);

/// The stream an op with these array inputs runs on (see the module docs).
pub(crate) fn target_stream(inputs: &[&Array]) -> Result<Stream> {
    lifecycle::check_running()?;
    if let Some(s) = current_stream_override() {
        return Ok(s);
    }
    let device = inputs.first().map(|a| a.device()).unwrap_or_else(default_device);
    device.default_stream()
}

/// `a` as seen from `stream`: moved to the stream's device when it lives elsewhere.
pub(crate) fn on_device(a: &Array, stream: &Stream) -> Array {
    if a.device() == stream.device() {
        a.clone()
    } else {
        Array::from_op(
            Primitive::ToDevice,
            smallvec![a.clone()],
            Dims::from_slice(a.shape()),
            a.dtype(),
            stream.clone(),
        )
    }
}

/// `a` on `stream`'s device, converted to `dtype` when it differs.
pub(crate) fn prepare(a: &Array, dtype: DType, stream: &Stream) -> Array {
    let a = on_device(a, stream);
    if a.dtype() == dtype {
        return a;
    }
    let shape = Dims::from_slice(a.shape());
    Array::from_op(Primitive::Cast, smallvec![a], shape, dtype, stream.clone())
}

/// A scalar as a 0-d `Full` array of `dtype` on `stream`: already evaluated when its value
/// costs no work (see `backend::ready_scalar`), else recorded lazily. Either way it stays a
/// `Full` node, which `compile` inlines as a literal.
///
/// An evaluated scalar is shared: the stream remembers the last few (weakly), so `y * 0.5`
/// in a loop makes one `0.5` node while the previous ones are still held.
pub(crate) fn scalar_on(s: Scalar, dtype: DType, stream: &Stream) -> Array {
    let value = s.as_f64();
    let key = (dtype, value.to_bits());
    if let Some(node) = stream.inner.scalar(key) {
        return Array { node };
    }
    match crate::backend::ready_scalar(stream, dtype, value) {
        Some(storage) => {
            let a = Array::evaluated(Primitive::Full { value }, Vec::new(), storage, stream.clone());
            stream.inner.keep_scalar(key, &a.node);
            a
        }
        None => Array::from_op(Primitive::Full { value }, smallvec![], Dims::new(), dtype, stream.clone()),
    }
}
