//! The one error type of rill.
//!
//! Every public operation returns [`Result<T>`]. Errors are `Clone` (messages are
//! reference-counted) so that one failure can poison every array it produced: each of them
//! reports the same error when evaluated.

use std::sync::Arc;

use crate::dtype::DType;

/// A `Result` whose error is [`Error`].
pub type Result<T> = std::result::Result<T, Error>;

/// Everything that can go wrong in rill, grouped by area.
#[derive(Clone, Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    // ---- bad input: detected when an op is built ----
    /// Shapes do not fit the operation.
    #[error("[{op}] {msg}")]
    Shape {
        /// The operation that rejected its input.
        op: &'static str,
        /// What was wrong, naming the shapes involved.
        msg: String,
    },
    /// An axis is out of range for the array's rank, or repeated.
    #[error("[{op}] invalid axis {axis} for an array of rank {ndim}")]
    Axis {
        /// The operation that rejected its input.
        op: &'static str,
        /// The axis as given (negative axes count from the end).
        axis: isize,
        /// The rank of the array.
        ndim: usize,
    },
    /// A dtype the operation does not accept.
    #[error("[{op}] dtype {dtype} is not supported: {msg}")]
    DType {
        /// The operation that rejected its input.
        op: &'static str,
        /// The offending dtype.
        dtype: DType,
        /// Why, or what is accepted instead.
        msg: String,
    },
    /// An index is out of range.
    #[error("[{op}] index {index} is out of range for axis {axis} of size {size}")]
    Index {
        /// The operation that rejected its input.
        op: &'static str,
        /// The index as given.
        index: i64,
        /// The axis it indexes.
        axis: usize,
        /// The size of that axis.
        size: usize,
    },
    /// Any other invalid argument (a step of zero, a negative size, ...).
    #[error("[{op}] {msg}")]
    InvalidArgument {
        /// The operation that rejected its input.
        op: &'static str,
        /// What was wrong.
        msg: String,
    },

    // ---- devices and backends ----
    /// The device does not exist or its backend could not start.
    #[error("device {device} is not available: {reason}")]
    DeviceUnavailable {
        /// The device asked for, for example `gpu:0`.
        device: String,
        /// Why it is not available.
        reason: String,
    },
    /// The operation has no kernel on this backend for these dtypes.
    #[error("[{op}] is not supported on the {backend} backend: {msg}")]
    Unsupported {
        /// The operation.
        op: &'static str,
        /// The backend (`cpu` or `cuda`).
        backend: &'static str,
        /// What is missing.
        msg: String,
    },
    /// An allocation failed.
    #[error("out of memory on {device}: could not allocate {bytes} bytes")]
    OutOfMemory {
        /// The device whose memory is exhausted.
        device: String,
        /// The size of the failed allocation.
        bytes: usize,
    },
    /// A backend call failed while running a kernel.
    #[error("[{op}] backend error: {msg}")]
    Backend {
        /// The operation being run.
        op: &'static str,
        /// The backend's message.
        msg: Arc<str>,
    },
    /// User code or a kernel panicked while computing an array; only the arrays that
    /// depend on it are poisoned.
    #[error("[{op}] panicked while computing: {msg}")]
    Panic {
        /// The operation being run.
        op: &'static str,
        /// The panic message.
        msg: Arc<str>,
    },

    // ---- lifecycle ----
    /// The runtime has shut down (explicitly or because the process is exiting).
    #[error("the rill runtime has shut down; no new work is accepted")]
    ShutDown,

    // ---- files ----
    /// Reading or writing a file failed, or its contents are malformed.
    #[error("[{op}] {path}: {msg}")]
    Io {
        /// The operation (`load`, `save`).
        op: &'static str,
        /// The file.
        path: String,
        /// What went wrong.
        msg: String,
    },
}

impl Error {
    pub(crate) fn shape(op: &'static str, msg: impl Into<String>) -> Self {
        Error::Shape { op, msg: msg.into() }
    }
    pub(crate) fn invalid(op: &'static str, msg: impl Into<String>) -> Self {
        Error::InvalidArgument { op, msg: msg.into() }
    }
    pub(crate) fn dtype(op: &'static str, dtype: DType, msg: impl Into<String>) -> Self {
        Error::DType { op, dtype, msg: msg.into() }
    }
    #[allow(dead_code)]
    pub(crate) fn backend(op: &'static str, msg: impl std::fmt::Display) -> Self {
        Error::Backend { op, msg: msg.to_string().into() }
    }
}

/// The message of a caught panic (its `&str` or `String` payload).
pub(crate) fn panic_message(p: &(dyn std::any::Any + Send)) -> String {
    p.downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| p.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "unknown panic".into())
}
