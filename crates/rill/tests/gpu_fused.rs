//! The CUDA fused kernel's launch paths (`rill::compile`): contiguous arrays with vector
//! loads and a scalar tail, a sliced input whose offset breaks 16-byte alignment, a bias
//! broadcast along the last axis (and a column broadcast), scalar inputs, a transposed
//! input (strided path), in f32, f16, bf16 and f64. Each result is compared with the same
//! function evaluated without compiling on the GPU, and with a float64 reference computed
//! on the CPU from the same (rounded) inputs. Skipped without a GPU; `RILL_REQUIRE_GPU=1`
//! makes a missing GPU a failure.

mod common;

use common::{Rng, assert_close, chain, gpu, tol};
use rill::{Array, DType, Device, Result};

const FLOATS: [DType; 4] = [DType::F32, DType::F16, DType::BF16, DType::F64];

/// A transformer block's `gelu(h + bias) + residual`.
fn bias_gelu_residual(x: &[Array]) -> Result<Vec<Array>> {
    Ok(vec![x[0].add(&x[1])?.gelu()?.add(&x[2])?])
}

/// `x0 * x1 + x2` with scalar-shaped `x1` and `x2`, then `exp(-y) * y`.
fn scalars(x: &[Array]) -> Result<Vec<Array>> {
    let y = x[0].mul(&x[1])?.add(&x[2])?;
    Ok(vec![y.neg()?.exp()?.mul(&y)?])
}

type F = fn(&[Array]) -> Result<Vec<Array>>;

/// Runs `f` on inputs built by `make` (from f64 values, in `dt`) compiled and not
/// compiled on `g`, and in f64 on the CPU; compares all three.
fn check(g: Device, f: F, make: &dyn Fn(DType) -> Vec<Array>, dt: DType, what: &str) {
    let compiled = rill::compile(f);
    let (fused, again, count) = common::on(g, || {
        let x = make(dt);
        let count = compiled.fused_node_count(&x).unwrap();
        let y = compiled.call(&x).unwrap()[0].to_f64_vec().unwrap();
        // A replay finds the memoised kernel.
        let y2 = compiled.call(&x).unwrap()[0].to_f64_vec().unwrap();
        (y, y2, count)
    });
    assert!(count > 0, "{what}: no fused node");
    assert_eq!(fused.len(), again.len());
    assert!(fused.iter().zip(&again).all(|(a, b)| a.to_bits() == b.to_bits()), "{what}: replay differs");
    let unfused = common::on(g, || f(&make(dt)).unwrap()[0].to_f64_vec().unwrap());
    let reference = common::on(Device::cpu(), || {
        let x: Vec<Array> = make(dt).iter().map(|a| a.astype(DType::F64).unwrap()).collect();
        f(&x).unwrap()[0].to_f64_vec().unwrap()
    });
    let differ = fused.iter().zip(&unfused).filter(|(a, b)| a.to_bits() != b.to_bits()).count();
    println!("{what}: {} elements, {differ} differ in bits from the unfused GPU evaluation", fused.len());
    assert_close(&fused, &unfused, tol(dt), &format!("{what}: fused vs unfused"));
    assert_close(&fused, &reference, tol(dt) * 8.0, &format!("{what}: fused vs f64 reference"));
}

fn arr(v: &[f64], shape: &[usize], dt: DType) -> Array {
    Array::from_slice(v, shape).unwrap().astype(dt).unwrap()
}

#[test]
fn gpu_fused_contiguous_and_sliced() {
    let Some(g) = gpu() else { return };
    let mut rng = Rng::new(21);
    // Not a multiple of any vector width.
    let n = 1_000_003;
    let (av, bv) = (rng.vec(n + 1, -2.0, 2.0), rng.vec(n, -2.0, 2.0));
    for dt in FLOATS {
        check(g, chain, &|dt| vec![arr(&av[..n], &[n], dt), arr(&bv, &[n], dt)], dt, &format!("chain {dt} n={n}"));
        // One element in: the first input's pointer is not 16-byte aligned.
        let sliced = |dt| vec![arr(&av, &[n + 1], dt).slice_axis(0, Some(1), None, 1).unwrap(), arr(&bv, &[n], dt)];
        check(g, chain, &sliced, dt, &format!("chain {dt} sliced by one"));
        // Small arrays: only a tail, or one vector and a tail.
        for m in [1usize, 3, 13] {
            check(
                g,
                chain,
                &|dt| vec![arr(&av[..m], &[m], dt), arr(&bv[..m], &[m], dt)],
                dt,
                &format!("chain {dt} n={m}"),
            );
        }
    }
}

#[test]
fn gpu_fused_bias_broadcasts() {
    let Some(g) = gpu() else { return };
    let mut rng = Rng::new(22);
    for dt in FLOATS {
        // Rows a multiple of every vector width (vector path), and rows of 30 (scalar path).
        for (r, c) in [(257usize, 512usize), (65, 30), (3, 8)] {
            let (hv, bv, resv) = (rng.vec(r * c, -3.0, 3.0), rng.vec(c, -1.0, 1.0), rng.vec(r * c, -1.0, 1.0));
            let make = |dt| vec![arr(&hv, &[r, c], dt), arr(&bv, &[c], dt), arr(&resv, &[r, c], dt)];
            check(g, bias_gelu_residual, &make, dt, &format!("bias [{c}] over [{r}, {c}] {dt}"));
            // A per-row column, [r, 1].
            let colv = rng.vec(r, -1.0, 1.0);
            let make = |dt| vec![arr(&hv, &[r, c], dt), arr(&colv, &[r, 1], dt), arr(&resv, &[r, c], dt)];
            check(g, bias_gelu_residual, &make, dt, &format!("column [{r}, 1] over [{r}, {c}] {dt}"));
        }
    }
}

#[test]
fn gpu_fused_scalars_and_strided() {
    let Some(g) = gpu() else { return };
    let mut rng = Rng::new(23);
    let n = 100_003;
    let xv = rng.vec(n, -2.0, 2.0);
    let (r, c) = (300usize, 257usize);
    let (tv, bv) = (rng.vec(r * c, -2.0, 2.0), rng.vec(r * c, -2.0, 2.0));
    for dt in FLOATS {
        let make = |dt| vec![arr(&xv, &[n], dt), arr(&[1.5], &[], dt), arr(&[-0.25], &[1], dt)];
        check(g, scalars, &make, dt, &format!("scalar inputs {dt}"));
        // A transposed input: the strided kernel.
        let make = |dt| vec![arr(&tv, &[c, r], dt).transpose(&[]).unwrap(), arr(&bv, &[r, c], dt)];
        check(g, chain, &make, dt, &format!("chain {dt} transposed"));
    }
}
