//! `compile`'s fused blocks on a GPU: the generated cases of `common/blocks.rs` (matmul
//! epilogues through cuBLASLt or a generated kernel, residual norms, multi-tensor Adam
//! and AdamW, generated elementwise graphs of several outputs) against eager GPU evaluation and a float64 reference, and the kernels
//! counted (`runtime::stats`: cuBLASLt epilogues, residual norms, multi-tensor launches).
//! Skipped without a GPU; `RILL_REQUIRE_GPU=1` makes a missing GPU a failure.

#[path = "common/blocks.rs"]
mod blocks;
mod common;

use rill::DType;

#[test]
fn gpu_matmul_epilogues() {
    let _serial = blocks::stats_lock();
    let Some(g) = common::gpu() else { return };
    let before = rill::runtime::stats();
    let cases = blocks::matmul_cases(11, 66);
    for c in &cases {
        blocks::run(g, c);
    }
    for c in &blocks::matmul_edge_cases() {
        blocks::run(g, c);
    }
    let after = rill::runtime::stats();
    let lt = cases.iter().filter(|c| c.expect[0].0 == "fused_matmul_lt").count() as u64;
    // Every cuBLASLt pattern ran as one call (twice per case); the others as kernels.
    assert!(after.matmul_epilogues_lt - before.matmul_epilogues_lt >= 2 * lt, "{after:?}");
    assert!(
        after.matmul_epilogue_kernels - before.matmul_epilogue_kernels >= 2 * (cases.len() as u64 - lt),
        "{after:?}"
    );
}

#[test]
fn gpu_residual_norms() {
    let _serial = blocks::stats_lock();
    let Some(g) = common::gpu() else { return };
    let before = rill::runtime::stats().residual_norms;
    let cases = blocks::norm_cases(12, 48);
    for c in &cases {
        blocks::run(g, c);
    }
    for c in &blocks::norm_edge_cases() {
        blocks::run(g, c);
    }
    assert!(rill::runtime::stats().residual_norms - before >= 2 * cases.len() as u64);
}

#[test]
fn gpu_adam_multi_tensor() {
    let _serial = blocks::stats_lock();
    let Some(g) = common::gpu() else { return };
    for (seed, adamw, dt) in
        [(1, false, DType::F32), (2, true, DType::F32), (3, true, DType::BF16), (5, false, DType::BF16)]
    {
        let before = rill::runtime::stats();
        let counts = blocks::adam_steps(g, seed, adamw, dt, 3);
        let after = rill::runtime::stats();
        // One program of three outputs for every parameter (at most 33): one launch a step.
        assert_eq!(counts.get("fused_multi").copied().unwrap_or(0), 1, "{counts:?}");
        assert_eq!(after.multi_tensor_launches - before.multi_tensor_launches, 3, "{after:?}");
    }
}

#[test]
fn gpu_elementwise_clusters() {
    let _serial = blocks::stats_lock();
    let Some(g) = common::gpu() else { return };
    let cases = blocks::cluster_cases(22, 90);
    let mut merged = 0;
    for c in &cases {
        merged += blocks::run(g, c).get("fused_multi").copied().unwrap_or(0);
    }
    assert!(merged >= cases.len() / 2, "{merged} blocks in {} cases", cases.len());
}

#[test]
fn gpu_attention_written_as_ops() {
    let _serial = blocks::stats_lock();
    let Some(g) = common::gpu() else { return };
    assert_eq!(blocks::attention_blocks(g, 42, 48), 48);
}

/// Quantized product blocks on a GPU: the fused matrix-vector kernel (norm, gated
/// activation and residual inside) and the tiled kernels' rows (the ops one by one).
#[test]
fn gpu_qmatmul_blocks() {
    let _serial = blocks::stats_lock();
    let Some(g) = common::gpu() else { return };
    assert_eq!(blocks::qmatmul_blocks(g, 22, 84), 84);
}
