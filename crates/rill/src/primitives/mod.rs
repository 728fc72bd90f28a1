//! The closed set of primitives every array node is built from.
//!
//! Ops (`crate::ops`) validate their inputs, infer the output shape and dtype, and record
//! one of these. Backends and passes dispatch on this enum (and on the op enums) with
//! exhaustive `match`es, never a `_` arm, so a new primitive or op does not compile
//! until every backend and pass has decided what to do with it (or returns
//! `Error::Unsupported` on purpose). Family predicates (`is_elementwise`, `is_view`,
//! from the one table `Primitive::family`) let passes such as fusion treat whole
//! families at once.
//!
//! The elementwise ops have one home each: [`UnaryOp`] (`unary.rs`) and [`BinaryOp`]
//! (`binary.rs`) hold each op's CUDA formula, which the eager and the fused CUDA kernels
//! share; `cuda.rs` holds the conversions, `cast` and `where`.
//!
//! The other families' shape and dtype rules have one home each, as pure functions over
//! shapes and parameters: `reduce.rs`, `movement.rs`, `linalg.rs`, `nn.rs`, `attention.rs`,
//! `quant.rs`, `decode.rs`, `creation.rs`, `sort.rs`, `scatter.rs`.
//! The op that records a node and shapeless replay (`compile/shapes.rs`) both call them,
//! so a replay derives the shape, or the error, the op would give.

use std::fmt;
use std::sync::Arc;

use crate::error::Result;

/// Declares an op enum with its `ALL` list (in declaration order), its `name()`, and a
/// macro `$each!(op, K => expr)` that expands `expr` once per op, with `K` a constant
/// naming that op, and matches `op` to pick one: a kernel written as
/// `each_unary!(op, K => loop calling K.float(x))` gets one loop per op (the op's own
/// expression, which the compiler can vectorise) instead of a match per element. `$d`
/// is a `$` token, for the inner macro's own variables.
macro_rules! op_enum {
    ($d:tt $each:ident; $(#[$m:meta])* enum $name:ident ($what:literal) {
        $($(#[$vm:meta])* $v:ident => $s:literal,)*
    }) => {
        $(#[$m])*
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
        #[allow(missing_docs)]
        pub enum $name {
            $($(#[$vm])* $v,)*
        }

        impl $name {
            #[doc = concat!("Every ", $what, " op, in declaration order.")]
            pub const ALL: [$name; [$($name::$v),*].len()] = [$($name::$v),*];
            /// Name used in messages and generated kernels.
            pub fn name(self) -> &'static str {
                match self {
                    $($name::$v => $s,)*
                }
            }
        }

        #[allow(unused_macros)]
        macro_rules! $each {
            ($d op:expr, $d k:ident => $d e:expr) => {
                match $d op {
                    $(crate::primitives::$name::$v => {
                        const $d k: crate::primitives::$name = crate::primitives::$name::$v;
                        $d e
                    })*
                }
            };
        }
        #[allow(unused_imports)]
        pub(crate) use $each;
    };
}

pub(crate) mod attention;
mod binary;
pub(crate) mod creation;
pub(crate) mod cuda;
pub(crate) mod decode;
pub(crate) mod fused;
pub(crate) mod grad;
pub(crate) mod linalg;
pub(crate) mod movement;
pub(crate) mod nn;
pub(crate) mod quant;
pub(crate) mod reduce;
pub(crate) mod scalar;
pub(crate) mod scatter;
pub(crate) mod sort;
mod unary;
pub(crate) mod vexp;

pub use attention::{AttentionGradPart, AttentionMaskKind};
pub use binary::BinaryOp;
pub(crate) use binary::each_binary;
pub use decode::RopeLayout;
pub use sort::SortSpec;
pub use unary::UnaryOp;
pub(crate) use unary::each_unary;

/// Reductions over a set of axes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[allow(missing_docs)]
pub enum ReduceOp {
    Sum,
    Prod,
    Max,
    Min,
    /// The sum divided by the number of elements combined, of a float dtype: computed in
    /// f32 for f16 and bf16 (f64 for f64) and rounded to the dtype once, the same bits
    /// as the f32 sum, the f32 division and the cast.
    Mean,
}

/// Index-returning reductions over one axis.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[allow(missing_docs)]
pub enum ArgReduceOp {
    ArgMax,
    ArgMin,
}

/// Distributions for counter-based random numbers.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Distribution {
    /// Uniform on `[low, high)`.
    Uniform {
        /// Lower bound.
        low: f64,
        /// Upper bound (exclusive).
        high: f64,
    },
    /// Normal with the given mean and standard deviation.
    Normal {
        /// Mean.
        mean: f64,
        /// Standard deviation.
        std: f64,
    },
    /// True with probability `p`.
    Bernoulli {
        /// Probability of `true`.
        p: f64,
    },
}

/// A user callback run as a node (used for host-side custom work and for testing failure
/// isolation). It receives its inputs as f64 values in row-major order and returns the
/// output values.
pub type HostFn = Arc<dyn Fn(&[Vec<f64>]) -> Result<Vec<f64>> + Send + Sync>;

/// One node's operation. The output shape and dtype live on the node.
#[derive(Clone)]
pub enum Primitive {
    // ---- sources ----
    /// Data given by the user; the node is created evaluated.
    Constant,
    /// Every element equals `value` (converted to the node dtype).
    Full {
        /// The fill value.
        value: f64,
    },
    /// `start + i * step` along the only axis.
    Arange {
        /// First value.
        start: f64,
        /// Increment.
        step: f64,
    },
    /// Ones on the `k`-th diagonal of a 2-D array.
    Eye {
        /// Diagonal offset.
        k: isize,
    },
    /// Counter-based random numbers (threefry-2x32) from an explicit key.
    Random {
        /// The key.
        key: [u32; 2],
        /// What to draw.
        dist: Distribution,
    },

    // ---- elementwise ----
    /// Conversion to the node dtype.
    Cast,
    /// A unary elementwise function.
    Unary(UnaryOp),
    /// A binary elementwise function with broadcasting.
    Binary(BinaryOp),
    /// `where(cond, x, y)` with broadcasting.
    Where,

    // ---- reductions (output keeps reduced axes with size 1) ----
    /// Reduction over `axes` (sorted, unique).
    Reduce {
        /// Which reduction.
        op: ReduceOp,
        /// Reduced axes of the input.
        axes: Vec<usize>,
    },
    /// Argmax/argmin over one axis; i64 output with that axis of size 1.
    ArgReduce {
        /// Which reduction.
        op: ArgReduceOp,
        /// The axis.
        axis: usize,
    },
    /// Softmax (or log-softmax) over one axis, fused.
    Softmax {
        /// The axis.
        axis: usize,
        /// Log-softmax when true.
        log: bool,
    },
    /// Layer normalisation over the last axis; inputs `x[, weight][, bias]`.
    LayerNorm {
        /// Added to the variance.
        eps: f64,
        /// A weight input follows `x`.
        has_weight: bool,
        /// A bias input follows.
        has_bias: bool,
    },
    /// RMS normalisation over the last axis; inputs `x[, weight]`.
    RmsNorm {
        /// Added to the mean square.
        eps: f64,
        /// A weight input follows `x`.
        has_weight: bool,
    },
    /// Cumulative sum along an axis.
    Cumsum {
        /// The axis.
        axis: usize,
        /// Accumulate from the end.
        reverse: bool,
        /// Exclude the current element.
        exclusive: bool,
    },
    /// Sort, argsort or top-k of each row of the last axis (`primitives/sort.rs`).
    Sort(SortSpec),

    // ---- linear algebra ----
    /// `[.., M, K] @ [.., K, N]` with equal (already broadcast) batch shapes.
    Matmul,
    /// Scaled dot-product attention (`primitives/attention.rs`); inputs `q, k, v[, mask]`.
    Attention {
        /// Multiplies the scores; `None`: `1 / sqrt(D)` of the inputs' head dimension.
        scale: Option<f64>,
        /// How the scores are masked.
        mask: AttentionMaskKind,
    },
    /// One part of `Attention`'s gradient by fused kernels that, like the forward, never
    /// store the scores (`primitives/attention.rs`); for `D == Dv` and no mask or the
    /// causal one. Inputs `q, k, v, o, do` for `Stats`, `q, k, v, do, stats` for the others.
    AttentionGrad {
        /// Multiplies the scores (resolved: never the default).
        scale: f64,
        /// The bottom-right causal mask; otherwise none.
        causal: bool,
        /// Which part.
        part: AttentionGradPart,
    },
    /// `x [..., K] @ wᵀ` with `w` block-quantized (`primitives/quant.rs`); inputs `x` and
    /// the packed bytes `[N, K / 32 * block_bytes]` (u8), read without dequantizing the
    /// whole matrix.
    QuantMatmul {
        /// The weight's block format.
        format: crate::quant::QuantFormat,
    },
    /// Packed u8 blocks `[..., B * block_bytes]` as floats `[..., B * 32]` of the node's dtype.
    Dequantize {
        /// The block format.
        format: crate::quant::QuantFormat,
    },
    /// Rotary position embedding (`primitives/decode.rs`); inputs `x, offset` (an integer
    /// array: position `offset + t` for row `t` of the second-to-last axis).
    Rope {
        /// Features rotated (the first `dims` of the last axis).
        dims: usize,
        /// The frequency base (`theta`): pair `i` turns by `p * base^(-2i/dims)`.
        base: f64,
        /// Multiplies each position first (linear position scaling; 1: none).
        scale: f64,
        /// Which features pair up.
        layout: RopeLayout,
    },

    // ---- views: zero-copy on every backend ----
    /// Same elements, new shape.
    Reshape,
    /// Axes permuted.
    Permute(Vec<usize>),
    /// Broadcast to the node shape.
    BroadcastTo,
    /// Strided slice: for each axis the first index and the step.
    Slice {
        /// First index taken on each axis.
        start: Vec<usize>,
        /// Step on each axis (never zero; negative walks backwards).
        step: Vec<isize>,
    },
    /// The identity that the autodiff transforms treat as a constant
    /// ([`crate::stop_gradient`]).
    StopGradient,
    /// Input 0 unchanged (a zero-copy view), computed only after the other inputs:
    /// orders the recomputation of a [`checkpoint`](crate::checkpoint) after the
    /// cotangent that needs it.
    Depend,
    /// Output `output` of a [`checkpoint`](crate::checkpoint)ed function: a zero-copy view
    /// of the last input (the output as the forward pass computed it); the other inputs are
    /// the function's inputs, from which the backward pass recomputes it.
    Checkpoint {
        /// The function.
        body: crate::autodiff::Checkpoint,
        /// Which of its outputs.
        output: usize,
    },

    // ---- copies ----
    /// A row-major copy.
    Contiguous,
    /// `x` with `update` written along `axis` from a start index (inputs `x, update,
    /// start`; `primitives/decode.rs`).
    SliceUpdate {
        /// The axis.
        axis: usize,
    },
    /// Gathers along `axis` with an integer index array (inputs `x, indices`).
    Take {
        /// The axis.
        axis: usize,
    },
    /// `x` with `updates` summed into the rows `indices` names along `axis`, `Take`'s
    /// adjoint (inputs `x, indices, updates`; `primitives/scatter.rs`).
    ScatterAdd {
        /// The axis.
        axis: usize,
    },
    /// Gathers along `axis` with one index per output element (inputs `x, indices` of
    /// one rank, equal on every other axis; `primitives/scatter.rs`).
    TakeAlongAxis {
        /// The axis.
        axis: usize,
    },
    /// `x` with `values` written (or, with `accumulate`, summed) at one index per value
    /// along `axis` (inputs `x, indices, values`; `primitives/scatter.rs`).
    PutAlongAxis {
        /// The axis.
        axis: usize,
        /// Sum the values in instead of assigning them (`TakeAlongAxis`'s adjoint).
        accumulate: bool,
    },
    /// Joins the inputs along `axis`.
    Concatenate {
        /// The axis.
        axis: usize,
    },
    /// Constant padding.
    Pad {
        /// `(before, after)` for each axis.
        widths: Vec<(usize, usize)>,
        /// The fill value.
        value: f64,
    },
    /// Copies the input to the node's device.
    ToDevice,
    /// A host callback (see [`HostFn`]); its output dtype is the node dtype.
    Host {
        /// Name used in messages.
        name: &'static str,
        /// The callback.
        f: HostFn,
    },

    // ---- compile ----
    /// A traced input of `crate::compile` (never evaluated: evaluating it is an error).
    Placeholder {
        /// Which input of the traced function.
        index: usize,
    },
    /// A fused elementwise kernel made by `crate::compile`: its inputs are broadcast to
    /// the node shape and the program runs once per output element.
    Fused(Arc<crate::primitives::fused::FusedProgram>),
    /// A fused elementwise program followed by a reduction, made by `crate::compile`: the
    /// program runs over the broadcast of the inputs and its values are reduced over
    /// `axes` (which keep size 1, as in `Reduce`) without being stored.
    FusedReduce {
        /// The elementwise program producing the reduced values.
        program: Arc<crate::primitives::fused::FusedProgram>,
        /// Which reduction.
        op: ReduceOp,
        /// Reduced axes of the program's (broadcast) shape.
        axes: Vec<usize>,
    },
    /// A fused block made by `crate::compile` (a matmul with its epilogue, a residual
    /// add with its normalisation, one program over many tensors): see
    /// [`FusedBlock`](crate::compile::FusedBlock).
    Block(Arc<crate::primitives::fused::FusedBlock>),
}

impl Primitive {
    /// Short name used in messages, traces and generated kernels.
    pub fn name(&self) -> &'static str {
        use Primitive::*;
        match self {
            Constant => "constant",
            Full { .. } => "full",
            Arange { .. } => "arange",
            Eye { .. } => "eye",
            Random { .. } => "random",
            Cast => "astype",
            Unary(u) => u.name(),
            Binary(b) => b.name(),
            Where => "where",
            Reduce { op, .. } => reduce::name(*op),
            ArgReduce { op, .. } => match op {
                ArgReduceOp::ArgMax => "argmax",
                ArgReduceOp::ArgMin => "argmin",
            },
            Softmax { log: false, .. } => "softmax",
            Softmax { log: true, .. } => "log_softmax",
            LayerNorm { .. } => "layer_norm",
            RmsNorm { .. } => "rms_norm",
            Cumsum { .. } => "cumsum",
            Sort(s) => s.name(),
            Matmul => "matmul",
            Attention { .. } => "scaled_dot_product_attention",
            AttentionGrad { .. } => "scaled_dot_product_attention_grad",
            QuantMatmul { .. } => "qmatmul",
            Dequantize { .. } => "dequantize",
            Rope { .. } => "rope",
            SliceUpdate { .. } => "slice_update",
            Reshape => "reshape",
            Permute(_) => "permute",
            BroadcastTo => "broadcast_to",
            Slice { .. } => "slice",
            StopGradient => "stop_gradient",
            Depend => "depend",
            Checkpoint { .. } => "checkpoint",
            Contiguous => "contiguous",
            Take { .. } => "take",
            ScatterAdd { .. } => "scatter_add",
            TakeAlongAxis { .. } => "take_along_axis",
            PutAlongAxis { accumulate: false, .. } => "put_along_axis",
            PutAlongAxis { accumulate: true, .. } => "scatter_add_along_axis",
            Concatenate { .. } => "concatenate",
            Pad { .. } => "pad",
            ToDevice => "to_device",
            Host { name, .. } => name,
            Placeholder { .. } => "placeholder",
            Fused(_) => "fused",
            FusedReduce { .. } => "fused_reduce",
            Block(b) => b.name(),
        }
    }
    /// The family the primitive belongs to (the section of the enum it is declared in).
    /// The one place that sorts primitives into families: a new primitive does not
    /// compile until it is given one.
    pub(crate) fn family(&self) -> Family {
        use Primitive::*;
        match self {
            Constant | Full { .. } | Arange { .. } | Eye { .. } | Random { .. } => Family::Source,
            Cast | Unary(_) | Binary(_) | Where => Family::Elementwise,
            Reduce { .. } | ArgReduce { .. } | Softmax { .. } | LayerNorm { .. } | RmsNorm { .. } | Cumsum { .. } => {
                Family::Reduction
            }
            Matmul | Attention { .. } | AttentionGrad { .. } | QuantMatmul { .. } | Dequantize { .. } | Rope { .. } => {
                Family::LinearAlgebra
            }
            Sort(_) => Family::Reduction,
            Reshape | Permute(_) | BroadcastTo | Slice { .. } | StopGradient | Depend | Checkpoint { .. } => {
                Family::View
            }
            Contiguous
            | Take { .. }
            | ScatterAdd { .. }
            | TakeAlongAxis { .. }
            | PutAlongAxis { .. }
            | Concatenate { .. }
            | Pad { .. }
            | SliceUpdate { .. }
            | ToDevice
            | Host { .. } => Family::Copy,
            Placeholder { .. } => Family::Placeholder,
            Fused(_) | FusedReduce { .. } | Block(_) => Family::Fused,
        }
    }
    /// Elementwise family: output element `i` depends only on input elements `i`
    /// (after broadcasting). These are what `compile` fuses.
    pub fn is_elementwise(&self) -> bool {
        self.family() == Family::Elementwise
    }
    /// View family: the output shares the input's buffer.
    pub fn is_view(&self) -> bool {
        self.family() == Family::View
    }
    /// A traced input of `crate::compile`.
    pub fn is_placeholder(&self) -> bool {
        self.family() == Family::Placeholder
    }
    /// A fused kernel made by `crate::compile` (elementwise, or elementwise then reduce).
    pub fn is_fused(&self) -> bool {
        self.family() == Family::Fused
    }
    /// Source family: no inputs.
    pub fn is_source(&self) -> bool {
        self.family() == Family::Source
    }
    /// True when the backends can compute this primitive into its first input's buffer
    /// (the input donated: nothing but the node holds it; see `runtime/execute.rs`).
    pub(crate) fn writes_into_first_input(&self) -> bool {
        matches!(self, Primitive::SliceUpdate { .. })
    }
}

/// The families of [`Primitive`] (see [`Primitive::family`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Family {
    /// No inputs: constants, fills, ranges, random numbers.
    Source,
    /// Output element `i` depends only on input elements `i` (after broadcasting).
    Elementwise,
    /// Reductions, scans and the normalisations over an axis.
    Reduction,
    /// Matrix products (dense and block-quantized), dequantization, attention and rotary
    /// embeddings.
    LinearAlgebra,
    /// Zero-copy: the output shares the input's buffer.
    View,
    /// New buffers from the inputs' elements (copies, gathers, transfers, host calls).
    Copy,
    /// A traced input of `crate::compile`.
    Placeholder,
    /// A kernel made by `crate::compile`.
    Fused,
}

impl fmt::Debug for Primitive {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}
