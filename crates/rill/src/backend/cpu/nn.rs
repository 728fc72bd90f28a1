//! Fused softmax, layer_norm and rms_norm over one axis.

use crate::backend::Storage;
use crate::error::{Error, Result};

pub(crate) fn softmax(_x: &Storage, _axis: usize, _log: bool) -> Result<Storage> {
    Err(Error::Unsupported { op: "softmax", backend: "cpu", msg: "not yet implemented".into() })
}

pub(crate) fn layer_norm(_inputs: &[Storage], _eps: f64, _has_weight: bool, _has_bias: bool) -> Result<Storage> {
    Err(Error::Unsupported { op: "layer_norm", backend: "cpu", msg: "not yet implemented".into() })
}

pub(crate) fn rms_norm(_inputs: &[Storage], _eps: f64, _has_weight: bool) -> Result<Storage> {
    Err(Error::Unsupported { op: "rms_norm", backend: "cpu", msg: "not yet implemented".into() })
}
