//! Elementwise ops on GPU 0 against the CPU and float64 references (skipped without a GPU;
//! `RILL_REQUIRE_GPU=1` makes a missing GPU a failure).

mod common;

use common::{Rng, assert_close, gpu, tol};
use rill::{Array, DType, Device};

const FLOATS: [DType; 4] = [DType::F32, DType::F16, DType::BF16, DType::F64];
const SHAPES: [&[usize]; 5] = [&[], &[7], &[3, 5], &[2, 0, 3], &[4, 33, 9]];

fn unary_ref(name: &str, x: f64) -> f64 {
    match name {
        "exp" => x.exp(),
        "tanh" => x.tanh(),
        "sigmoid" => 1.0 / (1.0 + (-x).exp()),
        "relu" => x.max(0.0),
        "round" => x.round_ties_even(),
        "sqrt_abs" => x.abs().sqrt(),
        "gelu_tanh" => 0.5 * x * (1.0 + (0.797_884_560_802_865_4 * (x + 0.044715 * x * x * x)).tanh()),
        _ => unreachable!(),
    }
}

fn unary_op(name: &str, a: &Array) -> Array {
    match name {
        "exp" => a.exp(),
        "tanh" => a.tanh(),
        "sigmoid" => a.sigmoid(),
        "relu" => a.relu(),
        "round" => a.round(),
        "sqrt_abs" => a.abs().unwrap().sqrt(),
        "gelu_tanh" => a.gelu_tanh(),
        _ => unreachable!(),
    }
    .unwrap()
}

#[test]
fn gpu_unary_matches_f64_and_cpu() {
    let Some(g) = gpu() else { return };
    let mut rng = Rng::new(1);
    for dt in FLOATS {
        for shape in SHAPES {
            let n: usize = shape.iter().product();
            let vals = rng.vec(n, -3.0, 3.0);
            for name in ["exp", "tanh", "sigmoid", "relu", "round", "sqrt_abs", "gelu_tanh"] {
                let (cpu_x, exact) = common::on(Device::cpu(), || common::array_of(&vals, shape, dt));
                let want: Vec<f64> = exact.iter().map(|&x| unary_ref(name, x)).collect();
                let got = common::on(g, || {
                    let x = Array::from_slice(&exact, shape).unwrap().astype(dt).unwrap();
                    assert_eq!(x.device(), g);
                    unary_op(name, &x).to_f64_vec().unwrap()
                });
                let cpu = unary_op(name, &cpu_x).to_f64_vec().unwrap();
                let what = format!("{name} {dt} {shape:?}");
                assert_close(&got, &want, tol(dt) * 4.0, &what);
                assert_close(&got, &cpu, tol(dt) * 4.0, &what);
            }
        }
    }
}

#[test]
fn gpu_binary_broadcast_and_views() {
    let Some(g) = gpu() else { return };
    let mut rng = Rng::new(2);
    for dt in [DType::F32, DType::F16, DType::BF16, DType::F64, DType::I32, DType::I64, DType::U8] {
        let (lo, hi) = if dt.is_float() { (-4.0, 4.0) } else { (0.0, 9.0) };
        let a_v =
            rng.vec(4 * 6, lo, hi).into_iter().map(|v| if dt.is_float() { v } else { v.floor() }).collect::<Vec<_>>();
        let b_v = rng.vec(6, lo, hi).into_iter().map(|v| if dt.is_float() { v } else { v.floor() }).collect::<Vec<_>>();
        for (name, f) in [
            ("add", (|x: f64, y: f64| x + y) as fn(f64, f64) -> f64),
            ("mul", |x, y| x * y),
            ("maximum", |x: f64, y: f64| x.max(y)),
            ("lt", |x, y| (x < y) as u8 as f64),
        ] {
            let run = |dev: Device| {
                common::on(dev, || {
                    let a = Array::from_slice(&a_v, &[4, 6]).unwrap().astype(dt).unwrap();
                    let b = Array::from_slice(&b_v, &[6]).unwrap().astype(dt).unwrap();
                    let op = |x: &Array, y: &Array| {
                        match name {
                            "add" => x.add(y),
                            "mul" => x.mul(y),
                            "maximum" => x.maximum(y),
                            _ => x.lt(y),
                        }
                        .unwrap()
                    };
                    let r1 = op(&a, &b).to_f64_vec().unwrap();
                    let r2 = op(&b, &a).to_f64_vec().unwrap();
                    let r3 = op(&a, &Array::scalar(2.0f32).unwrap().astype(dt).unwrap()).to_f64_vec().unwrap();
                    (r1, r2, r3)
                })
            };
            let (g1, g2, g3) = run(g);
            let (c1, c2, c3) = run(Device::cpu());
            let what = format!("{name} {dt}");
            let a_exact = common::on(Device::cpu(), || common::array_of(&a_v, &[4, 6], dt).1);
            let b_exact = common::on(Device::cpu(), || common::array_of(&b_v, &[6], dt).1);
            let want1: Vec<f64> = (0..24).map(|i| f(a_exact[i], b_exact[i % 6])).collect();
            let t = if name == "mul" && !dt.is_float() { 0.0 } else { tol(dt) * 2.0 };
            if !(dt == DType::U8 && name == "mul") {
                assert_close(&g1, &want1, t, &what);
            }
            assert_close(&g1, &c1, t, &what);
            assert_close(&g2, &c2, t, &what);
            assert_close(&g3, &c3, t, &what);
        }
    }
}

#[test]
fn gpu_casts_and_where_match_cpu() {
    let Some(g) = gpu() else { return };
    let vals = [-3.7, -0.5, 0.5, 1.5, 2.5, 1e10, -1e10, 300.0, f64::NAN, 0.0];
    let all =
        [DType::Bool, DType::U8, DType::U32, DType::I32, DType::I64, DType::F16, DType::BF16, DType::F32, DType::F64];
    for from in [DType::F64, DType::F32, DType::F16, DType::I64] {
        for to in all {
            let run = |dev| {
                common::on(dev, || {
                    Array::from_slice(&vals, &[10])
                        .unwrap()
                        .astype(from)
                        .unwrap()
                        .astype(to)
                        .unwrap()
                        .to_f64_vec()
                        .unwrap()
                })
            };
            let (gv, cv) = (run(g), run(Device::cpu()));
            assert_close(&gv, &cv, 0.0, &format!("cast {from} -> {to}"));
        }
    }
    let run = |dev| {
        common::on(dev, || {
            let x = Array::from_slice(&[1.0f32, -2.0, 3.0, -4.0], &[4]).unwrap();
            rill::where_(&x.gt(0.0).unwrap(), &x, 0.5).unwrap().to_f64_vec().unwrap()
        })
    };
    assert_eq!(run(g), run(Device::cpu()));
    assert_eq!(run(g), vec![1.0, 0.5, 3.0, 0.5]);
}

/// f32 to bf16 on the GPU, bit for bit against the `half` crate (the CPU's rounding): f32
/// patterns of every exponent (subnormals, the largest finite values that round to
/// infinity), ties to even both ways, and NaNs with payloads (quieted, payload kept). The
/// values also go through a unary op, whose kernel stores its bf16 results the same way.
#[test]
fn gpu_bf16_rounding_matches_the_cpu_bit_for_bit() {
    let Some(g) = gpu() else { return };
    let mut rng = Rng::new(5);
    let mut bits: Vec<u32> = (0..1 << 16).map(|_| rng.next_u64() as u32).collect();
    for e in 0..256u32 {
        for low in [0x0000u32, 0x7fff, 0x8000, 0x8001, 0xffff, 0x1_8000] {
            for sign in [0, 1u32 << 31] {
                bits.push(sign | e << 23 | (low & 0x7f_ffff) | (rng.next_u64() as u32 & 0x7e_0000));
            }
        }
    }
    bits.extend([0x7f80_0001, 0xff80_0001, 0x7fc0_0000, 0x7fbf_ffff, 0x7f7f_ffff, 0x7f7f_8000, 0x0000_8000]);
    let vals: Vec<f32> = bits.iter().map(|&b| f32::from_bits(b)).collect();
    let want: Vec<u16> = vals.iter().map(|&v| half::bf16::from_f32(v).to_bits()).collect();
    let n = vals.len();
    let got = common::on(g, || {
        let x = Array::from_slice(&vals, &[n]).unwrap();
        let cast = x.astype(DType::BF16).unwrap().to_vec::<half::bf16>().unwrap();
        let neg = x.neg().unwrap().astype(DType::BF16).unwrap().neg().unwrap().to_vec::<half::bf16>().unwrap();
        (cast, neg)
    });
    for (i, (&w, (c, m))) in want.iter().zip(got.0.iter().zip(&got.1)).enumerate() {
        assert_eq!(c.to_bits(), w, "cast of {:#010x} (element {i})", bits[i]);
        assert_eq!(m.to_bits(), w, "negated twice, {:#010x} (element {i})", bits[i]);
    }
}

#[test]
fn gpu_sources_match_cpu() {
    let Some(g) = gpu() else { return };
    for dt in [DType::F32, DType::F16, DType::I32, DType::Bool, DType::F64] {
        let run = |dev| {
            common::on(dev, || {
                let f = Array::full(&[3, 4], 2.5, dt).unwrap().to_f64_vec().unwrap();
                let z = Array::zeros(&[0, 2], dt).unwrap().to_f64_vec().unwrap();
                (f, z)
            })
        };
        assert_eq!(run(g), run(Device::cpu()), "{dt}");
    }
}

/// Maps over large arrays (over a million 16-byte vectors: tens of thousands of blocks of
/// the vector kernel): two and three inputs, f32 and bf16, a cast, with a tail that is not
/// a whole vector; against float64.
#[test]
fn gpu_large_contiguous_maps_match_f64() {
    let Some(g) = gpu() else { return };
    let mut rng = Rng::new(9);
    let n = 9_000_005usize;
    let (a, b, c) = (rng.vec(n, -2.0, 2.0), rng.vec(n, -2.0, 2.0), rng.vec(n, -1.0, 1.0));
    for dt in [DType::F32, DType::BF16] {
        common::on(g, || {
            let (x, xv) = common::array_of(&a, &[n], dt);
            let (y, yv) = common::array_of(&b, &[n], dt);
            let want: Vec<f64> = xv.iter().zip(&yv).map(|(p, q)| p * q + p).collect();
            let got = x.mul(&y).unwrap().add(&x).unwrap().to_f64_vec().unwrap();
            assert_close(&got, &want, tol(dt) * 4.0, &format!("x * y + x, {dt}"));
            let (cond, cv) = common::array_of(&c, &[n], DType::F32);
            let pick = cond.gt(0.0).unwrap();
            let want: Vec<f64> =
                cv.iter().zip(xv.iter().zip(&yv)).map(|(k, (p, q))| if *k > 0.0 { *p } else { *q }).collect();
            let got = rill::where_(&pick, &x, &y).unwrap().to_f64_vec().unwrap();
            assert_close(&got, &want, 0.0, &format!("where, {dt}"));
            let got = x.astype(DType::F32).unwrap().to_f64_vec().unwrap();
            assert_close(&got, &xv, 0.0, &format!("cast {dt} to f32"));
        });
    }
}

/// One batch (one thread) that keeps switching elementwise kernels: the same op over
/// f32, f16 and bf16 (f16 and bf16 share a C type, not code), on contiguous operands (the
/// vector kernel), with a transposed operand (the two-axis kernel) and with a scalar
/// operand (the contiguous kernel), in two orders. The kernel lookup remembers the last
/// kernel a thread launched; each result against float64 shows it is keyed by the
/// function, every dtype and the variant.
#[test]
fn gpu_kernel_switches_within_one_batch_match_f64() {
    let Some(g) = gpu() else { return };
    let mut rng = Rng::new(21);
    let (a, b) = (rng.vec(64, -2.0, 2.0), rng.vec(64, -2.0, 2.0));
    common::on(g, || {
        let mut outs = Vec::new();
        let mut wants: Vec<(Vec<f64>, f64, String)> = Vec::new();
        for order in [[DType::F32, DType::F16, DType::BF16], [DType::BF16, DType::F16, DType::F32]] {
            for dt in order {
                let (x, xv) = common::array_of(&a, &[8, 8], dt);
                let (y, yv) = common::array_of(&b, &[8, 8], dt);
                outs.push(x.add(&y).unwrap());
                wants.push((xv.iter().zip(&yv).map(|(p, q)| p + q).collect(), tol(dt), format!("x + y, {dt}")));
                outs.push(x.transpose(&[1, 0]).unwrap().add(&y).unwrap());
                let want = (0..64).map(|k| xv[(k % 8) * 8 + k / 8] + yv[k]).collect();
                wants.push((want, tol(dt), format!("x.T + y, {dt}")));
                outs.push(x.add(0.5).unwrap());
                wants.push((xv.iter().map(|p| p + 0.5).collect(), tol(dt), format!("x + 0.5, {dt}")));
            }
        }
        rill::eval(&outs).unwrap();
        for (o, (want, t, what)) in outs.iter().zip(&wants) {
            assert_close(&o.to_f64_vec().unwrap(), want, *t * 2.0, what);
        }
    });
}

/// Maps over two merged axes (the two-axis kernel, vectors or elements): row, column and
/// outer broadcasts of a binary op and of `where`, a unary op and a cast of a transposed
/// view, a column slice (misaligned, and aligned inside wider rows) and a step on rows; in
/// floats and integers, with column counts that are and are not whole vectors (7,
/// 1000003), many short rows and a few long ones; against float64 (and the CPU for the
/// cast, bit for bit).
#[test]
fn gpu_two_axis_maps_match_f64() {
    let Some(g) = gpu() else { return };
    let mut rng = Rng::new(33);
    for (r, c) in [(5usize, 7usize), (3, 1_000_003), (64, 96), (250_000, 4), (100_000, 3), (2, 70_000), (37, 1000)] {
        for dt in [DType::F32, DType::BF16, DType::F16, DType::I32, DType::U8] {
            let int = !dt.is_float();
            let mut vals = |n: usize| -> Vec<f64> {
                let v = rng.vec(n, if int { 0.0 } else { -2.0 }, if int { 9.0 } else { 2.0 });
                if int { v.into_iter().map(f64::floor).collect() } else { v }
            };
            let (av, bv, rowv, colv, widev) = (vals(r * c), vals(r * c), vals(c), vals(r), vals(2 * r * (c + 8)));
            let t = tol(dt) * 2.0;
            let at = |f: &dyn Fn(usize, usize) -> f64| (0..r * c).map(|k| f(k / c, k % c)).collect::<Vec<f64>>();
            let cast_to = if dt == DType::F32 { DType::BF16 } else { DType::F32 };
            // The transposed view's cast on the CPU: the GPU's must equal it bit for bit.
            let cpu_cast = common::on(Device::cpu(), || {
                let b = Array::from_slice(&bv, &[c, r]).unwrap().astype(dt).unwrap();
                b.transpose(&[1, 0]).unwrap().astype(cast_to).unwrap().to_f64_vec().unwrap()
            });
            common::on(g, || {
                let what = |s: &str| format!("{s}, {dt} [{r}, {c}]");
                let (a, ae) = common::array_of(&av, &[r, c], dt);
                let (b, be) = common::array_of(&bv, &[c, r], dt);
                let (row, re) = common::array_of(&rowv, &[c], dt);
                let (col, ce) = common::array_of(&colv, &[r, 1], dt);
                let (wide, we) = common::array_of(&widev, &[2 * r, c + 8], dt);
                let check = |got: Array, want: Vec<f64>, t: f64, s: &str| {
                    assert_eq!(got.shape(), &[r, c], "{}", what(s));
                    assert_close(&got.to_f64_vec().unwrap(), &want, t, &what(s));
                };
                check(a.mul(&row).unwrap(), at(&|i, j| ae[i * c + j] * re[j]), t, "a * row");
                check(a.add(&col).unwrap(), at(&|i, j| ae[i * c + j] + ce[i]), t, "a + column");
                check(col.maximum(&a).unwrap(), at(&|i, j| ce[i].max(ae[i * c + j])), 0.0, "maximum(column, a)");
                check(col.mul(&row).unwrap(), at(&|i, j| ce[i] * re[j]), t, "outer column * row");
                let pick = |x: f64| if int { x >= 4.0 } else { x > 0.0 };
                let cond = if int { col.ge(4.0) } else { col.gt(0.0) }.unwrap();
                let got = rill::where_(&cond, &row, &a).unwrap();
                check(got, at(&|i, j| if pick(ce[i]) { re[j] } else { ae[i * c + j] }), 0.0, "where(column, row, a)");
                let got = rill::where_(&cond, &row, 1.0).unwrap();
                check(got, at(&|i, j| if pick(ce[i]) { re[j] } else { 1.0 }), 0.0, "where(column, row, 1)");
                let full_cond = if int { a.ge(4.0) } else { a.gt(0.0) }.unwrap();
                let got = rill::where_(&full_cond, &col, &row).unwrap();
                check(got, at(&|i, j| if pick(ae[i * c + j]) { ce[i] } else { re[j] }), 0.0, "where(a, column, row)");
                // A transposed view: element (i, j) is b[j, i].
                let bt = b.transpose(&[1, 0]).unwrap();
                let tr = |i: usize, j: usize| be[j * r + i];
                check(bt.logical_not().unwrap(), at(&|i, j| (tr(i, j) == 0.0) as u8 as f64), 0.0, "logical_not(b.T)");
                if dt != DType::U8 {
                    check(bt.neg().unwrap(), at(&|i, j| -tr(i, j)), 0.0, "-b.T");
                }
                check(bt.add(&a).unwrap(), at(&|i, j| tr(i, j) + ae[i * c + j]), t, "b.T + a");
                let got = bt.astype(cast_to).unwrap();
                assert_eq!(got.to_f64_vec().unwrap(), cpu_cast, "{}", what("cast of b.T"));
                // Column slices of wider rows: from column 1 (misaligned), from column 0 (rows
                // of c + 8 elements: aligned when c is a whole number of vectors); every
                // other row.
                let w = |i: usize, j: usize| we[i * (c + 8) + j];
                let top = wide.slice_axis(0, Some(0), Some(r as isize), 1).unwrap();
                let s1 = top.slice_axis(1, Some(1), Some(c as isize + 1), 1).unwrap();
                check(s1.mul(&row).unwrap(), at(&|i, j| w(i, j + 1) * re[j]), t, "wide[:, 1:] * row");
                let s0 = top.slice_axis(1, Some(0), Some(c as isize), 1).unwrap();
                check(s0.add(&col).unwrap(), at(&|i, j| w(i, j) + ce[i]), t, "wide[:, :c] + column");
                check(s0.abs().unwrap(), at(&|i, j| w(i, j).abs()), 0.0, "abs(wide[:, :c])");
                let stepped =
                    wide.slice_axis(0, None, None, 2).unwrap().slice_axis(1, Some(0), Some(c as isize), 1).unwrap();
                check(stepped.astype(DType::F32).unwrap(), at(&|i, j| w(2 * i, j)), t, "wide[::2, :c] as f32");
                check(stepped.mul(&row).unwrap(), at(&|i, j| w(2 * i, j) * re[j]), t, "wide[::2, :c] * row");
            });
        }
    }
}

/// The logical values of `base` (row-major, shape `bs`) seen through `transpose(perm)` and
/// then every `step`-th element of axis `ax`: (shape, values in row-major order).
fn view_values(base: &[f64], bs: &[usize], perm: &[usize], ax: usize, step: usize) -> (Vec<usize>, Vec<f64>) {
    let mut shape: Vec<usize> = perm.iter().map(|&p| bs[p]).collect();
    shape[ax] = shape[ax].div_ceil(step);
    let n: usize = shape.iter().product();
    let bst: Vec<usize> = (0..bs.len()).map(|d| bs[d + 1..].iter().product()).collect();
    let vals = (0..n)
        .map(|mut k| {
            let mut at = 0;
            for d in (0..shape.len()).rev() {
                let i = k % shape[d] * if d == ax { step } else { 1 };
                k /= shape[d];
                at += i * bst[perm[d]];
            }
            base[at]
        })
        .collect();
    (shape, vals)
}

/// Maps over generated views of 2 to 5 axes (permuted, stepped, size-1 axes) with
/// broadcast operands, and the ops that then read their results (reshape, reductions,
/// transposes, products with row-major arrays), against float64 loops: the kernels that
/// follow a permuted operand's memory order, rows over several outer axes, and every
/// consumer of an output that is not row-major.
#[test]
fn gpu_maps_of_any_layout_match_f64() {
    let Some(g) = gpu() else { return };
    let mut rng = Rng::new(71);
    let dims = [1usize, 2, 3, 5, 8, 16, 33];
    for case in 0..60 {
        let rank = 2 + (rng.next_u64() % 4) as usize;
        let bs: Vec<usize> = (0..rank).map(|_| dims[(rng.next_u64() % dims.len() as u64) as usize]).collect();
        let mut perm: Vec<usize> = (0..rank).collect();
        for i in (1..rank).rev() {
            perm.swap(i, (rng.next_u64() % (i as u64 + 1)) as usize);
        }
        let ax = (rng.next_u64() % rank as u64) as usize;
        let step = if case % 3 == 0 { 2 } else { 1 };
        let dt = [DType::F32, DType::BF16, DType::I32, DType::F16][case % 4];
        let n: usize = bs.iter().product();
        let ints = |v: Vec<f64>| v.into_iter().map(f64::floor).collect::<Vec<f64>>();
        let (av, bv) = (ints(rng.vec(n, -8.0, 8.0)), ints(rng.vec(n, -8.0, 8.0)));
        let (shape, va) = view_values(&av, &bs, &perm, ax, step);
        let (_, vb) = view_values(&bv, &bs, &perm, ax, step);
        let m: usize = shape.iter().product();
        let last = *shape.last().unwrap();
        let rowv = ints(rng.vec(last, -4.0, 4.0));
        let what = |s: &str| format!("case {case}: {dt} base {bs:?} perm {perm:?} axis {ax} step {step}: {s}");
        common::on(g, || {
            let view = |v: &[f64]| {
                let x = Array::from_slice(v, &bs).unwrap().astype(dt).unwrap().transpose(&perm).unwrap();
                x.slice_axis(ax as isize, None, None, step as isize).unwrap()
            };
            let (a, b) = (view(&av), view(&bv));
            let row = Array::from_slice(&rowv, &[last]).unwrap().astype(dt).unwrap();
            let check = |got: &Array, want: &[f64], t: f64, s: &str| {
                assert_eq!(got.shape(), &shape[..], "{}", what(s));
                assert_close(&got.to_f64_vec().unwrap(), want, t, &what(s));
            };
            let neg = a.neg().unwrap();
            let negw: Vec<f64> = va.iter().map(|x| -x).collect();
            check(&neg, &negw, 0.0, "-a");
            let sum: Vec<f64> = va.iter().zip(&vb).map(|(x, y)| x + y).collect();
            check(&a.add(&b).unwrap(), &sum, 0.0, "a + b");
            let biased: Vec<f64> = (0..m).map(|k| va[k] * rowv[k % last]).collect();
            check(&a.mul(&row).unwrap(), &biased, 0.0, "a * row");
            let cond = a.gt(0.0).unwrap();
            let pick: Vec<f64> = (0..m).map(|k| if va[k] > 0.0 { va[k] } else { rowv[k % last] }).collect();
            check(&rill::where_(&cond, &a, &row).unwrap(), &pick, 0.0, "where(a > 0, a, row)");
            check(&a.astype(DType::F32).unwrap(), &va, 0.0, "a as f32");
            if dt.is_float() {
                let e: Vec<f64> = va.iter().map(|x| x.exp()).collect();
                check(&a.exp().unwrap(), &e, tol(dt) * 4.0, "exp(a)");
            }
            // Readers of `-a`, whatever order it was written in.
            let flat = neg.reshape(&[m as isize]).unwrap();
            assert_close(&flat.to_f64_vec().unwrap(), &negw, 0.0, &what("(-a).reshape(-1)"));
            let rows: Vec<f64> = negw.chunks(last).map(|c| c.iter().sum()).collect();
            let t = if dt == DType::I32 { 0.0 } else { tol(dt) * last as f64 * 8.0 };
            let got = neg.sum(&[-1], false).unwrap();
            assert_close(&got.to_f64_vec().unwrap(), &rows, t, &what("(-a).sum(-1)"));
            let twice: Vec<f64> = negw.iter().map(|x| 2.0 * x).collect();
            check(&neg.add(neg.contiguous().unwrap()).unwrap(), &twice, 0.0, "-a + contiguous(-a)");
            let inv: Vec<usize> = (0..rank).map(|i| perm.iter().position(|&p| p == i).unwrap()).collect();
            let back = neg.transpose(&inv).unwrap().contiguous().unwrap();
            let got = back.transpose(&perm).unwrap().to_f64_vec().unwrap();
            assert_close(&got, &negw, 0.0, &what("(-a).T.contiguous().T"));
            // A product reads the permuted output as a matrix of its last two axes.
            if dt == DType::F32 {
                let k = last;
                let ones = Array::ones(&[k, 1], DType::F32).unwrap();
                let got = neg.matmul(&ones).unwrap();
                let want: Vec<f64> = negw.chunks(k).map(|c| c.iter().sum()).collect();
                assert_close(&got.to_f64_vec().unwrap(), &want, 1e-5, &what("(-a) @ ones"));
            }
        });
    }
}
