//! Model checks of rill's runtime protocols with loom.
//!
//! The protocol code is not copied: the modules below are rill's own source files,
//! compiled here against loom's `Mutex`, `Condvar` and atomics (rill's `sync` shim picks
//! them under `--cfg loom`). Run:
//!
//! ```text
//! RUSTFLAGS="--cfg loom" CARGO_TARGET_DIR=target/loom cargo test -p rill-loom --release
//! ```
//!
//! Without `--cfg loom` the modules compile against std and the model tests are skipped.
#![allow(dead_code, clippy::new_without_default)]

#[path = "../../rill/src/sync.rs"]
pub(crate) mod sync;

#[path = "../../rill/src/runtime/completion.rs"]
mod completion_src;

#[path = "../../rill/src/runtime/claim.rs"]
mod claim_src;

#[path = "../../rill/src/runtime/registry.rs"]
mod registry_src;

#[path = "../../rill/src/runtime/serial.rs"]
mod serial_src;

#[path = "../../rill/src/runtime/gate.rs"]
mod gate_src;

#[path = "../../rill/src/runtime/phase.rs"]
mod phase_src;

#[path = "../../rill/src/backend/cuda/handoff.rs"]
mod handoff_src;

/// Mirrors rill's module paths, `runtime::claim`, `runtime::completion`, `runtime::gate`,
/// `runtime::phase`, `runtime::registry` and `runtime::serial`.
pub(crate) mod runtime {
    #[allow(unused_imports)]
    pub(crate) use crate::claim_src as claim;
    #[allow(unused_imports)]
    pub(crate) use crate::completion_src as completion;
    #[allow(unused_imports)]
    pub(crate) use crate::gate_src as gate;
    #[allow(unused_imports)]
    pub(crate) use crate::phase_src as phase;
    #[allow(unused_imports)]
    pub(crate) use crate::registry_src as registry;
    #[allow(unused_imports)]
    pub(crate) use crate::serial_src as serial;
}

/// Mirrors rill's module path `backend::cuda::handoff`.
pub(crate) mod backend {
    pub(crate) mod cuda {
        #[allow(unused_imports)]
        pub(crate) use crate::handoff_src as handoff;
    }
}

/// Runs `f` under loom, exploring interleavings with at most `preemptions` preemptions
/// per execution (the bound keeps the larger models within seconds).
#[cfg(all(test, loom))]
pub(crate) fn model_bounded(preemptions: usize, f: impl Fn() + Sync + Send + 'static) {
    let mut builder = loom::model::Builder::new();
    builder.preemption_bound = Some(preemptions);
    builder.check(f);
}

#[cfg(all(test, loom))]
mod jobs;
#[cfg(all(test, loom))]
mod loom_claim;
#[cfg(all(test, loom))]
mod loom_completion;
#[cfg(all(test, loom))]
mod loom_gate;
#[cfg(all(test, loom))]
mod loom_handoff;
#[cfg(all(test, loom))]
mod loom_register;
#[cfg(all(test, loom))]
mod loom_serial;
#[cfg(all(test, loom))]
mod loom_shutdown;
