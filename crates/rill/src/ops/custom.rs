//! Host callbacks as graph nodes.

use std::sync::Arc;

use crate::array::Array;
use crate::dtype::DType;
use crate::error::Result;
use crate::ops::{prepare, target_stream};
use crate::primitives::Primitive;
use crate::shape::checked_size;

/// Records a node whose value is computed by `f` on the host, from its inputs' values
/// (as f64, row-major). `f` runs in stream order, like any kernel: on the runtime's
/// worker pool, or, on a GPU stream that a blocking `eval` found idle, on the thread that
/// called `eval`. If `f` returns an error or panics, only this array and the arrays computed
/// from it report the error; every other array, stream and thread keeps working.
///
/// `f` must not block waiting for other rill work (it occupies a worker while it runs).
pub fn custom<F>(name: &'static str, inputs: &[&Array], shape: &[usize], dtype: DType, f: F) -> Result<Array>
where
    F: Fn(&[Vec<f64>]) -> Result<Vec<f64>> + Send + Sync + 'static,
{
    checked_size(name, shape, dtype)?;
    let stream = target_stream(inputs)?;
    let ins: Vec<Array> = inputs.iter().map(|a| prepare(a, a.dtype(), &stream)).collect();
    Ok(Array::from_op(Primitive::Host { name, f: Arc::new(f) }, ins, shape.to_vec(), dtype, stream))
}
