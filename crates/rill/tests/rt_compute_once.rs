//! Laziness and compute-once for elementwise graphs. One test in its own binary, so that
//! the process-wide `nodes_computed` counter moves only because of this test.

#![allow(clippy::disallowed_types)] // a test uses rill as a user does, with std's primitives (clippy.toml)

mod common;

use std::collections::HashSet;
use std::sync::Barrier;

use rill::{Array, DType};

/// The nodes of the graph below `roots` that are not evaluated yet (each once).
fn pending(roots: &[&Array]) -> Vec<Array> {
    let mut seen = HashSet::new();
    let mut out = Vec::new();
    let mut stack: Vec<Array> = roots.iter().map(|a| (*a).clone()).collect();
    while let Some(a) = stack.pop() {
        if !seen.insert(a.id()) || a.is_evaluated() {
            continue;
        }
        stack.extend(a.inputs());
        out.push(a);
    }
    out
}

#[test]
fn elementwise_graphs_are_lazy_and_computed_once() {
    let mut rng = common::Rng::new(41);
    for dev in common::devices() {
        let xv = rng.vec(4096, -2.0, 2.0);
        let yv = rng.vec(64, 0.5, 3.0);
        let before = rill::runtime::stats().nodes_computed;
        let (x, y, roots) = common::on(dev, || {
            let x = Array::from_slice(&xv, &[64, 64]).unwrap();
            let y = Array::from_slice(&yv, &[64]).unwrap().astype(DType::F32).unwrap();
            // A shared trunk with several branches, mixed dtypes and scalars.
            let t = x.astype(DType::F32).unwrap().mul(&y).unwrap().tanh().unwrap();
            let a = t.add(1.0).unwrap().sqrt().unwrap();
            let b = t.gt(0.0).unwrap();
            let c = rill::where_(&b, &a, t.exp().unwrap()).unwrap();
            let d = c.astype(DType::BF16).unwrap().sub(0.5).unwrap();
            (x, y, vec![a, c, d])
        });
        let refs: Vec<&Array> = roots.iter().collect();
        let nodes = pending(&refs);
        // Building recorded nodes and computed nothing.
        assert_eq!(rill::runtime::stats().nodes_computed, before, "building an op computed something");
        // 11 ops; their scalar operands are pending fills too unless they cost nothing
        // (see `scalar_operands_are_fills_evaluated_when_free` in ops_binary.rs).
        assert!(nodes.len() >= 11, "graph has {} pending nodes", nodes.len());
        assert!(roots.iter().all(|r| !r.is_evaluated()));
        // Host data is evaluated at once on the CPU; on a GPU it is a pending upload.
        assert!(x.is_evaluated() || !x.device().is_gpu() || !x.inputs().is_empty());
        assert!(!y.is_evaluated());

        // 16 threads evaluate overlapping roots of the same graph at once.
        let barrier = Barrier::new(16);
        let results: Vec<Vec<f64>> = std::thread::scope(|s| {
            let hs: Vec<_> = (0..16)
                .map(|k| {
                    let (r, barrier) = (&roots[k % roots.len()], &barrier);
                    s.spawn(move || {
                        barrier.wait();
                        if k % 2 == 0 {
                            rill::eval(std::slice::from_ref(r)).unwrap();
                        }
                        r.to_f64_vec().unwrap()
                    })
                })
                .collect();
            hs.into_iter().map(|h| h.join().unwrap()).collect()
        });
        let computed = rill::runtime::stats().nodes_computed - before;
        assert_eq!(computed, nodes.len() as u64, "each pending node computed exactly once");
        assert!(nodes.iter().all(|n| n.is_evaluated()));

        // Independent reference (f32 rounding of the inputs, f64 math).
        let xs: Vec<f64> = xv.iter().map(|&v| v as f32 as f64).collect();
        let ys: Vec<f64> = yv.iter().map(|&v| v as f32 as f64).collect();
        let t: Vec<f64> = (0..4096).map(|k| (xs[k] * ys[k % 64]).tanh()).collect();
        let a: Vec<f64> = t.iter().map(|v| (v + 1.0).sqrt()).collect();
        let c: Vec<f64> = t.iter().zip(&a).map(|(&t, &a)| if t > 0.0 { a } else { t.exp() }).collect();
        let d: Vec<f64> = c.iter().map(|v| v - 0.5).collect();
        for (k, r) in results.iter().enumerate() {
            let (want, tol) = match k % 3 {
                0 => (&a, common::tol(DType::F32)),
                1 => (&c, common::tol(DType::F32)),
                _ => (&d, common::tol(DType::BF16)),
            };
            common::assert_close(r, want, tol, &format!("thread {k}"));
        }
        // Evaluating again computes nothing.
        rill::eval(&roots).unwrap();
        assert_eq!(rill::runtime::stats().nodes_computed - before, computed);
    }
}
