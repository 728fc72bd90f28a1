//! The CUDA backend (built with the `cuda` feature).
