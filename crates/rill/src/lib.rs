//! # rill
//!
//! Lazy arrays on explicit streams, on the CPU and on NVIDIA GPUs, with a runtime that is
//! correct across threads, async tasks and process exit.
//!
//! ```
//! use rill::{Array, DType};
//! let a = Array::from_slice(&[1.0f32, 2.0, 3.0], &[3])?;
//! let b = a.mul(2.0)?.add(&a)?; // recorded, not computed
//! assert_eq!(b.to_vec::<f32>()?, vec![3.0, 6.0, 9.0]); // evaluated here
//! # Ok::<(), rill::Error>(())
//! ```
//!
//! See `docs/ARCHITECTURE.md` for the layers and `docs/RUNTIME.md` for the contract.

#![deny(unsafe_op_in_unsafe_fn, unused_must_use)]
#![warn(missing_docs)]
#![allow(clippy::needless_range_loop)]

mod array;
pub mod autodiff;
mod backend;
pub mod dtype;
mod error;
pub mod io;
pub mod models;
pub mod ops;
pub mod primitives;
pub mod quant;
pub mod runtime;
pub mod shape;
mod sync;

pub use array::Array;
pub use autodiff::{Checkpoint, Grad, ValueAndGrad, checkpoint, grad, jvp, stop_gradient, value_and_grad, vjp};
#[cfg(feature = "cuda")]
pub use backend::cuda::set_allow_tf32;
pub use dtype::{DType, Element, Scalar};
pub use error::{Error, Result};
pub use ops::attention::{AttentionMask, scaled_dot_product_attention};
pub use ops::custom::custom;
pub use ops::decode::{RopeOptions, rope, slice_update};
pub use ops::elementwise::where_;
pub use ops::scatter::{put_along_axis, scatter_add, scatter_add_along_axis, take_along_axis};
pub use ops::{IntoOperand, Operand};
pub use primitives::RopeLayout;
pub use runtime::clear_cache;
pub use runtime::device::{Device, DeviceKind, default_device, set_default_device};
pub use runtime::lifecycle::shutdown;
pub use runtime::scheduler::{EvalFuture, async_eval, eval, submit};
pub use runtime::scope::{StreamGuard, WithStream, current_stream_override, with_stream};
pub use runtime::stream::{Stream, synchronize, synchronize_all};
pub mod compile;
pub mod optim;
pub mod random;
pub mod sample;
pub use compile::{Compiled, compile, compile_shapeless};
pub use ops::movement::SliceArg;
pub use ops::movement::copies::{concatenate, stack};
