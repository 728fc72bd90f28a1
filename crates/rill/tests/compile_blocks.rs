//! `compile`'s fused blocks on the CPU: matmul epilogues, residual norms, multi-tensor
//! apply (the Adam/AdamW update of `rill::optim`), quantized products with the norm or
//! gated activation before them and the residual after, and attention written as ops.
//! Generated cases (`common/blocks.rs`) give the bits of eager evaluation (attention:
//! within the dtype's tolerance) and match a float64 reference; the compiled graphs
//! hold the blocks (`Compiled::primitive_counts`) and the kernels ran
//! (`runtime::stats`). The same cases run on a GPU in `gpu_blocks.rs`.

#[path = "common/blocks.rs"]
mod blocks;
mod common;

use rill::{Array, DType, Device};

#[test]
fn matmul_epilogues_give_eager_bits() {
    let _serial = blocks::stats_lock();
    let before = rill::runtime::stats().matmul_epilogue_kernels;
    let cases = blocks::matmul_cases(1, 33);
    for c in &cases {
        blocks::run(Device::cpu(), c);
    }
    // Each case's compiled function ran twice, one block each.
    assert!(rill::runtime::stats().matmul_epilogue_kernels - before >= 2 * cases.len() as u64);
}

#[test]
fn matmul_epilogue_edges() {
    let _serial = blocks::stats_lock();
    for c in &blocks::matmul_edge_cases() {
        blocks::run(Device::cpu(), c);
    }
}

/// A product cast to another dtype after it (a bf16 model's f32 logits): the block
/// computes the product in the matmul's dtype, as eager evaluation does.
#[test]
fn a_cast_product_keeps_the_matmul_dtype() {
    let _serial = blocks::stats_lock();
    let mut rng = common::Rng::new(7);
    for (dt, to) in [(DType::BF16, DType::F32), (DType::F32, DType::F16), (DType::F16, DType::F64)] {
        let x = Array::from_slice(&rng.vec(3 * 8, -1.0, 1.0), &[3, 8]).unwrap().astype(dt).unwrap();
        let w = Array::from_slice(&rng.vec(8 * 5, -1.0, 1.0), &[8, 5]).unwrap().astype(dt).unwrap();
        let f = move |a: &[Array]| Ok(vec![a[0].matmul(&a[1])?.astype(to)?.mul(2.0)?]);
        let eager = f(&[x.clone(), w.clone()]).unwrap().remove(0);
        let compiled = rill::compile(f).call(&[x, w]).unwrap().remove(0);
        assert_eq!(compiled.dtype(), to);
        assert_eq!(compiled.to_f64_vec().unwrap(), eager.to_f64_vec().unwrap(), "{dt} product cast to {to}");
    }
}

#[test]
fn a_bias_of_the_wrong_shape_errors_as_eager() {
    let _serial = blocks::stats_lock();
    let x = Array::from_slice(&[1.0f32; 12], &[3, 4]).unwrap();
    let w = Array::from_slice(&[0.5f32; 20], &[4, 5]).unwrap();
    let bias = Array::from_slice(&[1.0f32; 4], &[4]).unwrap();
    let f = |x: &[Array]| Ok(vec![x[0].matmul(&x[1])?.add(&x[2])?.gelu_tanh()?]);
    let eager = f(&[x.clone(), w.clone(), bias.clone()]).unwrap_err();
    let compiled = rill::compile(f).call(&[x, w, bias]).unwrap_err();
    assert_eq!(format!("{eager}"), format!("{compiled}"));
}

/// A norm or gated activation before a block-quantized product and a residual after it
/// are one block, with eager's bits.
#[test]
fn qmatmul_blocks_give_eager_bits() {
    let _serial = blocks::stats_lock();
    assert_eq!(blocks::qmatmul_blocks(Device::cpu(), 21, 42), 42);
}

#[test]
fn residual_norms_give_eager_bits() {
    let _serial = blocks::stats_lock();
    let before = rill::runtime::stats().residual_norms;
    let cases = blocks::norm_cases(2, 48);
    for c in &cases {
        blocks::run(Device::cpu(), c);
    }
    for c in &blocks::norm_edge_cases() {
        blocks::run(Device::cpu(), c);
    }
    assert!(rill::runtime::stats().residual_norms - before >= 2 * cases.len() as u64);
}

#[test]
fn residual_norms_replay_shapeless_on_new_rows() {
    let _serial = blocks::stats_lock();
    let f = |x: &[Array]| Ok(vec![x[0].add(&x[1])?.layer_norm(Some(&x[2]), None, 1e-5)?]);
    let c = rill::compile_shapeless(f);
    let mut rng = common::Rng::new(4);
    for rows in [3usize, 7, 1, 12] {
        let cols = 40;
        let mut arr = |s: &[usize]| {
            Array::from_slice(&rng.vec(s.iter().product(), -1.0, 1.0), s).unwrap().astype(DType::F32).unwrap()
        };
        let x = vec![arr(&[rows, cols]), arr(&[rows, cols]), arr(&[cols])];
        let got = c.call(&x).unwrap()[0].to_vec::<f32>().unwrap();
        let want = f(&x).unwrap()[0].to_vec::<f32>().unwrap();
        assert_eq!(got, want, "rows {rows}");
    }
    assert_eq!(c.trace_count(), 1);
}

#[test]
fn adam_and_adamw_are_one_kernel_per_program() {
    let _serial = blocks::stats_lock();
    let before = rill::runtime::stats();
    for (seed, adamw, dt) in
        [(1, false, DType::F32), (2, true, DType::F32), (3, true, DType::BF16), (4, false, DType::BF16)]
    {
        let counts = blocks::adam_steps(Device::cpu(), seed, adamw, dt, 3);
        // The moments, the parameter (and Adam's L2 term in the gradient, read by both
        // moments) of each parameter are one program of three outputs; one block runs it
        // over every parameter.
        let multi = counts.get("fused_multi").copied().unwrap_or(0);
        assert_eq!(multi, 1, "{counts:?}");
        assert_eq!(counts.get("fused").copied().unwrap_or(0), 0, "{counts:?}");
    }
    let after = rill::runtime::stats();
    assert!(after.multi_tensor_launches > before.multi_tensor_launches);
    // Every launch covered at least two tensors.
    let launches = after.multi_tensor_launches - before.multi_tensor_launches;
    assert!(after.multi_tensor_members - before.multi_tensor_members >= 2 * launches);
}

#[test]
fn elementwise_clusters_give_eager_bits() {
    let _serial = blocks::stats_lock();
    let cases = blocks::cluster_cases(21, 90);
    let mut merged = 0;
    for c in &cases {
        let counts = blocks::run(Device::cpu(), c);
        merged += counts.get("fused_multi").copied().unwrap_or(0);
    }
    // Most generated graphs share intermediates or return several values.
    assert!(merged >= cases.len() / 2, "{merged} blocks in {} cases", cases.len());
}

#[test]
fn values_read_outside_a_cluster_are_stored_once_in_one_block() {
    let _serial = blocks::stats_lock();
    // `a` feeds `b` and `c`; `b` is returned and read by `c`: one program stores b and c.
    let f = |x: &[Array]| {
        let a = x[0].mul(2.0)?.add(1.0)?;
        let b = a.add(&x[1])?.tanh()?;
        let c = a.mul(&b)?.sub(&x[1])?;
        Ok(vec![b, c])
    };
    let mut rng = common::Rng::new(8);
    let x: Vec<Array> = (0..2)
        .map(|_| Array::from_slice(&rng.vec(300, -1.0, 1.0), &[3, 100]).unwrap().astype(DType::F32).unwrap())
        .collect();
    let c = rill::compile(f);
    let counts = c.primitive_counts(&x).unwrap();
    assert_eq!(counts.get("fused_multi"), Some(&1), "{counts:?}");
    assert_eq!(counts.get("fused"), None, "{counts:?}");
    let got: Vec<Vec<f32>> = c.call(&x).unwrap().iter().map(|a| a.to_vec().unwrap()).collect();
    let want: Vec<Vec<f32>> = f(&x).unwrap().iter().map(|a| a.to_vec().unwrap()).collect();
    assert_eq!(got, want);
    assert_eq!(c.call(&x).unwrap()[1].shape(), &[3, 100]);
}

#[test]
fn a_cluster_around_a_reduction_stays_apart() {
    let _serial = blocks::stats_lock();
    // `c` reads `a` and the sum of `a`: one block for both would read its own output.
    let f = |x: &[Array]| {
        let a = x[0].mul(2.0)?.add(1.0)?;
        let s = a.sum(&[], false)?;
        let c = a.mul(&s)?.add(&x[0])?;
        Ok(vec![c])
    };
    let x = [Array::from_slice(&[1.0f32, -2.0, 3.0, 0.5], &[4]).unwrap()];
    let c = rill::compile(f);
    let counts = c.primitive_counts(&x).unwrap();
    assert_eq!(counts.get("fused_multi"), None, "{counts:?}");
    let got = c.call(&x).unwrap()[0].to_vec::<f32>().unwrap();
    let a = [3.0f32, -3.0, 7.0, 2.0];
    let s: f32 = a.iter().sum();
    let want: Vec<f32> = a.iter().zip([1.0f32, -2.0, 3.0, 0.5]).map(|(a, x)| a * s + x).collect();
    assert_eq!(got, want);
}

#[test]
fn one_program_at_two_depths_is_not_merged() {
    let _serial = blocks::stats_lock();
    // y2 reads y1 and both run the same program: merging them would read its own output.
    let f = |x: &[Array]| {
        let y1 = x[0].mul(2.0)?.add(1.0)?;
        let y2 = y1.mul(2.0)?.add(1.0)?;
        let z = x[1].mul(2.0)?.add(1.0)?;
        Ok(vec![y1, y2, z])
    };
    let x =
        [Array::from_slice(&[1.0f32, 2.0, 3.0], &[3]).unwrap(), Array::from_slice(&[4.0f32, 5.0, 6.0], &[3]).unwrap()];
    let c = rill::compile(f);
    let counts = c.primitive_counts(&x).unwrap();
    assert_eq!(counts.get("fused_multi"), Some(&1), "{counts:?}");
    let got: Vec<Vec<f32>> = c.call(&x).unwrap().iter().map(|a| a.to_vec().unwrap()).collect();
    assert_eq!(got, vec![vec![3.0, 5.0, 7.0], vec![7.0, 11.0, 15.0], vec![9.0, 11.0, 13.0]]);
}

#[test]
fn blocks_can_be_turned_off() {
    let _serial = blocks::stats_lock();
    let f = |x: &[Array]| Ok(vec![x[0].matmul(&x[1])?.add(&x[2])?.relu()?]);
    let x = [
        Array::from_slice(&[1.0f32; 6], &[2, 3]).unwrap(),
        Array::from_slice(&[0.5f32; 12], &[3, 4]).unwrap(),
        Array::from_slice(&[-1.0f32; 4], &[4]).unwrap(),
    ];
    let opts = rill::compile::CompileOptions { blocks: false, ..Default::default() };
    let off = rill::compile::compile_with_options(move |x: &[Array], _: &[i64]| f(x), opts);
    let counts = off.primitive_counts(&x).unwrap();
    assert_eq!((counts.get("matmul"), counts.get("fused_matmul_lt")), (Some(&1), None), "{counts:?}");
}

#[test]
fn attention_written_as_ops_becomes_one_attention_node() {
    let _serial = blocks::stats_lock();
    assert_eq!(blocks::attention_blocks(Device::cpu(), 41, 36), 36);
}

/// Patterns that must stay ops: an intermediate the function also returns, a
/// log-softmax, a softmax over another axis, a scale that is an array input.
#[test]
fn attention_is_not_fused_past_what_else_reads_it() {
    let _serial = blocks::stats_lock();
    let mut rng = common::Rng::new(5);
    let x: Vec<Array> = [[2usize, 5, 8], [2, 7, 8], [2, 7, 4]]
        .iter()
        .map(|s| Array::from_slice(&rng.vec(s.iter().product(), -1.0, 1.0), s).unwrap())
        .collect();
    let scale = Array::from_slice(&[0.3f64], &[]).unwrap().astype(DType::F32).unwrap();
    type Form = fn(&[Array]) -> rill::Result<Vec<Array>>;
    let forms: [(&str, Form); 4] = [
        ("scores returned", |x| {
            let s = x[0].matmul(&x[1].swapaxes(-1, -2)?)?.mul(0.5)?;
            Ok(vec![s.softmax(-1)?.matmul(&x[2])?, s])
        }),
        ("log_softmax", |x| Ok(vec![x[0].matmul(&x[1].swapaxes(-1, -2)?)?.log_softmax(-1)?.matmul(&x[2])?])),
        ("softmax over queries", |x| Ok(vec![x[0].matmul(&x[1].swapaxes(-1, -2)?)?.softmax(-2)?.matmul(&x[2])?])),
        ("array scale", |x| Ok(vec![x[0].matmul(&x[1].swapaxes(-1, -2)?)?.mul(&x[3])?.softmax(-1)?.matmul(&x[2])?])),
    ];
    let mut args = x.clone();
    args.push(scale);
    for (what, f) in forms {
        let compiled = rill::compile(f);
        let counts = compiled.primitive_counts(&args).unwrap();
        assert_eq!(counts.get("scaled_dot_product_attention"), None, "{what}: {counts:?}");
        let (got, eager) = (compiled.call(&args).unwrap(), f(&args).unwrap());
        for (g, e) in got.iter().zip(&eager) {
            assert_eq!(g.to_f64_vec().unwrap(), e.to_f64_vec().unwrap(), "{what}");
        }
    }
}
