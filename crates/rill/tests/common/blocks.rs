//! Cases of `compile`'s fused blocks shared by `compile_blocks.rs` (CPU) and
//! `gpu_blocks.rs` (GPU): generated shapes, dtypes and patterns; each compiled result is
//! compared with the same function evaluated eagerly (bit for bit on the CPU, within the
//! dtype's tolerance on a GPU, where cuBLASLt's epilogues round once) and with the
//! function evaluated in float64 on the CPU from the same rounded inputs.
#![allow(dead_code, clippy::disallowed_types)]

use std::collections::BTreeMap;

use super::common::{Rng, assert_close, on, tol};
use rill::{Array, DType, Device, Result};

pub type F = std::sync::Arc<dyn Fn(&[Array]) -> Result<Vec<Array>> + Send + Sync>;

pub const DTYPES: [DType; 3] = [DType::F32, DType::BF16, DType::F16];

/// Held by every test of a binary that compiles functions: `runtime::stats` is
/// process-wide and the tests of a binary run at once, so a test that counts launches
/// (multi-tensor blocks, epilogues) must not see another test's.
pub fn stats_lock() -> std::sync::MutexGuard<'static, ()> {
    static LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());
    LOCK.lock().unwrap_or_else(|e| e.into_inner())
}

/// One generated case: a function, its inputs (as f64 values and shapes), the dtype and
/// the block nodes its compiled graph must hold (and the primitives it must not).
pub struct Case {
    pub what: String,
    pub f: F,
    pub inputs: Vec<(Vec<f64>, Vec<usize>)>,
    pub dtype: DType,
    pub expect: Vec<(&'static str, usize)>,
}

fn make(inputs: &[(Vec<f64>, Vec<usize>)], dt: DType) -> Vec<Array> {
    inputs.iter().map(|(v, s)| Array::from_slice(v, s).unwrap().astype(dt).unwrap()).collect()
}

/// Runs a case on `g`: compiled (twice: the replay must give the same bits) against
/// eager and against float64. Returns the compiled graph's primitive counts.
pub fn run(g: Device, c: &Case) -> BTreeMap<&'static str, usize> {
    let exact = !g.is_gpu();
    let f = c.f.clone();
    let compiled = rill::compile(move |x: &[Array]| f(x));
    let (counts, got, again) = on(g, || {
        let x = make(&c.inputs, c.dtype);
        let counts = compiled.primitive_counts(&x).unwrap();
        let vals = |o: Vec<Array>| o.iter().map(|a| a.to_f64_vec().unwrap()).collect::<Vec<_>>();
        (counts, vals(compiled.call(&x).unwrap()), vals(compiled.call(&x).unwrap()))
    });
    for (name, n) in &c.expect {
        assert_eq!(counts.get(name).copied().unwrap_or(0), *n, "{}: {name} nodes in {counts:?}", c.what);
    }
    let eager = on(g, || {
        let x = make(&c.inputs, c.dtype);
        (c.f)(&x).unwrap().iter().map(|a| a.to_f64_vec().unwrap()).collect::<Vec<_>>()
    });
    let reference = on(Device::cpu(), || {
        let x: Vec<Array> = make(&c.inputs, c.dtype).iter().map(|a| a.astype(DType::F64).unwrap()).collect();
        (c.f)(&x).unwrap().iter().map(|a| a.to_f64_vec().unwrap()).collect::<Vec<_>>()
    });
    assert_eq!(got.len(), eager.len(), "{}: outputs", c.what);
    for (k, ((y, e), r)) in got.iter().zip(&eager).zip(&reference).enumerate() {
        let what = format!("{} output {k}", c.what);
        assert!(y.iter().zip(&again[k]).all(|(a, b)| a.to_bits() == b.to_bits()), "{what}: the replay differs");
        if exact {
            let differ = y.iter().zip(e).position(|(a, b)| a.to_bits() != b.to_bits());
            assert!(
                differ.is_none(),
                "{what}: element {differ:?} differs from eager: {:?} vs {:?}",
                y.get(differ.unwrap_or(0)),
                e.get(differ.unwrap_or(0))
            );
        } else {
            assert_close(y, e, 2.0 * tol(c.dtype), &format!("{what}: compiled vs eager"));
        }
        assert_close(y, r, 8.0 * tol(c.dtype), &format!("{what}: compiled vs f64"));
    }
    counts
}

fn vals(rng: &mut Rng, shape: &[usize], scale: f64) -> (Vec<f64>, Vec<usize>) {
    (rng.vec(shape.iter().product(), -scale, scale), shape.to_vec())
}

/// The matmul epilogues: `x @ w` (m x k x n random) followed by each pattern, with the
/// name of the block the pattern must become.
pub fn matmul_cases(seed: u64, count: usize) -> Vec<Case> {
    type Epi = fn(&Array, &Array, &Array) -> Result<Array>;
    let patterns: [(&str, &'static str, Epi); 11] = [
        ("bias", "fused_matmul_lt", |p, b, _| p.add(b)),
        ("bias+gelu_tanh", "fused_matmul_lt", |p, b, _| p.add(b)?.gelu_tanh()),
        ("bias+relu", "fused_matmul_lt", |p, b, _| p.add(b)?.relu()),
        ("bias+residual", "fused_matmul_lt", |p, b, r| r.add(&b.add(p)?)),
        ("residual", "fused_matmul_lt", |p, _, r| p.add(r)),
        ("bias+gelu_tanh+residual inside", "fused_matmul_lt", |p, b, r| p.add(b)?.add(r)?.gelu_tanh()),
        // cuBLASLt's GELU is the tanh one: the erf GELU stays a generated kernel.
        ("bias+gelu_erf", "fused_matmul", |p, b, _| p.add(b)?.gelu()),
        // A residual after the activation is not what the C matrix adds.
        ("bias+gelu_tanh then residual", "fused_matmul", |p, b, r| p.add(b)?.gelu_tanh()?.add(r)),
        ("scale+tanh", "fused_matmul", |p, _, _| p.mul(0.5)?.tanh()),
        // A scaled product is cuBLASLt's alpha.
        ("scale", "fused_matmul_lt", |p, _, _| p.mul(0.125)),
        ("scale+bias+relu", "fused_matmul_lt", |p, b, _| p.mul(0.5)?.add(b)?.relu()),
    ];
    let mut rng = Rng::new(seed);
    let mut v = Vec::new();
    for i in 0..count {
        let (name, block, epi) = patterns[i % patterns.len()];
        let dt = DTYPES[(i / patterns.len()) % DTYPES.len()];
        let (m, k, n) =
            (1 + rng.next_u64() as usize % 40, 1 + rng.next_u64() as usize % 70, 1 + rng.next_u64() as usize % 50);
        let f: F = std::sync::Arc::new(move |x: &[Array]| Ok(vec![epi(&x[0].matmul(&x[1])?, &x[2], &x[3])?]));
        v.push(Case {
            what: format!("{name} {dt} {m}x{k}x{n}"),
            f,
            inputs: vec![
                vals(&mut rng, &[m, k], 1.0),
                vals(&mut rng, &[k, n], 0.3),
                vals(&mut rng, &[n], 1.0),
                vals(&mut rng, &[m, n], 1.0),
            ],
            dtype: dt,
            expect: vec![(block, 1), ("matmul", 0)],
        });
    }
    v
}

/// Edge cases of matmul epilogues: what must stay unfused, and operands that are views.
pub fn matmul_edge_cases() -> Vec<Case> {
    let mut rng = Rng::new(7);
    let (m, k, n) = (9, 13, 11);
    let ins = |rng: &mut Rng| {
        vec![vals(rng, &[m, k], 1.0), vals(rng, &[k, n], 0.5), vals(rng, &[n], 1.0), vals(rng, &[m, 1], 1.0)]
    };
    let case = |what: &str, f: F, expect: Vec<(&'static str, usize)>, rng: &mut Rng| Case {
        what: what.into(),
        f,
        inputs: ins(rng),
        dtype: DType::F32,
        expect,
    };
    vec![
        // The product is an output too: it is not fused past.
        case(
            "product also returned",
            std::sync::Arc::new(|x: &[Array]| {
                let p = x[0].matmul(&x[1])?;
                Ok(vec![p.add(&x[2])?, p])
            }),
            vec![("matmul", 1), ("fused_matmul", 0), ("fused_matmul_lt", 0)],
            &mut rng,
        ),
        // Two readers of the product: it stays a product of its own.
        case(
            "product read by two outputs",
            std::sync::Arc::new(|x: &[Array]| {
                let p = x[0].matmul(&x[1])?;
                Ok(vec![p.add(&x[2])?, p.mul(2.0)?.tanh()?])
            }),
            vec![("matmul", 1), ("fused_matmul", 0), ("fused_matmul_lt", 0)],
            &mut rng,
        ),
        // One epilogue reading the product twice is one reader.
        case(
            "product read twice by one epilogue",
            std::sync::Arc::new(|x: &[Array]| {
                let p = x[0].matmul(&x[1])?;
                Ok(vec![p.add(&x[2])?.mul(&p.relu()?)?])
            }),
            vec![("matmul", 0), ("fused_matmul", 1)],
            &mut rng,
        ),
        // A column bias ([m, 1]) is no cuBLASLt bias: a generated epilogue.
        case(
            "column bias",
            std::sync::Arc::new(|x: &[Array]| Ok(vec![x[0].matmul(&x[1])?.add(&x[3])?])),
            vec![("fused_matmul", 1), ("fused_matmul_lt", 0), ("matmul", 0)],
            &mut rng,
        ),
        // The weight transposed (a view) and the input sliced.
        case(
            "transposed weight",
            std::sync::Arc::new(|x: &[Array]| {
                let w = x[1].transpose(&[1, 0])?.transpose(&[1, 0])?.contiguous()?.transpose(&[1, 0])?;
                Ok(vec![x[0].matmul(&w.transpose(&[1, 0])?)?.add(&x[2])?.gelu_tanh()?])
            }),
            vec![("fused_matmul_lt", 1), ("matmul", 0)],
            &mut rng,
        ),
        // A batched product keeps its epilogue (run as product then kernel on a GPU).
        case(
            "batched",
            std::sync::Arc::new(move |x: &[Array]| {
                let a = x[0].reshape(&[1, m as isize, k as isize])?.broadcast_to(&[3, m, k])?;
                Ok(vec![a.matmul(&x[1])?.add(&x[2])?.relu()?])
            }),
            vec![("matmul", 0)],
            &mut rng,
        ),
    ]
}

/// Residual norms: `layer_norm(x + r)` / `rms_norm(x + r)` over random rows and columns,
/// with and without weight and bias, the sum also returned or not.
pub fn norm_cases(seed: u64, count: usize) -> Vec<Case> {
    let mut rng = Rng::new(seed);
    let mut v = Vec::new();
    for i in 0..count {
        let dt = DTYPES[i % DTYPES.len()];
        let rms = (i / 3) % 2 == 1;
        let keep = (i / 6) % 2 == 1;
        let (w, b) = ((i / 12) % 2 == 0, (i / 24) % 2 == 0 && !rms);
        let (rows, cols) = (1 + rng.next_u64() as usize % 30, 1 + rng.next_u64() as usize % 600);
        let f: F = std::sync::Arc::new(move |x: &[Array]| {
            let s = x[0].add(&x[1])?;
            let y = if rms {
                s.rms_norm(w.then_some(&x[2]), 1e-5)?
            } else {
                s.layer_norm(w.then_some(&x[2]), b.then_some(&x[3]), 1e-5)?
            };
            Ok(if keep { vec![y, s] } else { vec![y] })
        });
        let block = if rms { "fused_add_rms_norm" } else { "fused_add_layer_norm" };
        v.push(Case {
            what: format!("{block} {dt} {rows}x{cols} weight={w} bias={b} keep_sum={keep}"),
            f,
            inputs: vec![
                vals(&mut rng, &[rows, cols], 2.0),
                vals(&mut rng, &[rows, cols], 2.0),
                vals(&mut rng, &[cols], 1.5),
                vals(&mut rng, &[cols], 1.0),
            ],
            dtype: dt,
            expect: vec![(block, 1), ("layer_norm", 0), ("rms_norm", 0), ("add", 0)],
        });
    }
    v
}

/// Norms that must stay as they are: a broadcast residual, a sum of another dtype.
pub fn norm_edge_cases() -> Vec<Case> {
    let mut rng = Rng::new(9);
    vec![
        Case {
            what: "broadcast residual".into(),
            f: std::sync::Arc::new(|x: &[Array]| Ok(vec![x[0].add(&x[2])?.layer_norm(None, None, 1e-5)?])),
            inputs: vec![vals(&mut rng, &[5, 33], 1.0), vals(&mut rng, &[5, 33], 1.0), vals(&mut rng, &[33], 1.0)],
            dtype: DType::F32,
            expect: vec![("layer_norm", 1), ("fused_add_layer_norm", 0)],
        },
        Case {
            what: "a transposed summand".into(),
            f: std::sync::Arc::new(|x: &[Array]| {
                let r = x[1].reshape(&[33, 5])?.transpose(&[1, 0])?;
                Ok(vec![x[0].add(&r)?.rms_norm(Some(&x[2]), 1e-6)?])
            }),
            inputs: vec![vals(&mut rng, &[5, 33], 1.0), vals(&mut rng, &[5, 33], 1.0), vals(&mut rng, &[33], 1.0)],
            dtype: DType::BF16,
            expect: vec![("fused_add_rms_norm", 1), ("rms_norm", 0)],
        },
    ]
}

/// Shapes of `count` parameters (1-D and 2-D, sizes from 2 to a few thousand).
pub fn param_shapes(rng: &mut Rng, count: usize) -> Vec<Vec<usize>> {
    (0..count)
        .map(|_| {
            let a = 2 + rng.next_u64() as usize % 300;
            if rng.next_u64().is_multiple_of(2) { vec![a] } else { vec![a, 1 + rng.next_u64() as usize % 12] }
        })
        .collect()
}

/// Adam and AdamW steps, compiled through `AdamState` and eager through `Adam::update`,
/// over random parameter shapes; returns the compiled graph's primitive counts of one step.
pub fn adam_steps(g: Device, seed: u64, adamw: bool, dt: DType, steps: u64) -> BTreeMap<&'static str, usize> {
    let exact = !g.is_gpu();
    let mut rng = Rng::new(seed);
    let count = 3 + rng.next_u64() as usize % 30;
    let shapes = param_shapes(&mut rng, count);
    let p0: Vec<(Vec<f64>, Vec<usize>)> = shapes.iter().map(|s| vals(&mut rng, s, 1.0)).collect();
    let gs: Vec<Vec<(Vec<f64>, Vec<usize>)>> =
        (0..steps).map(|_| shapes.iter().map(|s| vals(&mut rng, s, 1.0)).collect()).collect();
    let opt = if adamw {
        rill::optim::Adam::adamw(1e-2, 0.1)
    } else {
        rill::optim::Adam { weight_decay: 0.05, ..rill::optim::Adam::new(1e-2) }
    };
    let what = format!("{} {dt} {count} parameters", if adamw { "adamw" } else { "adam" });
    let mut counts = BTreeMap::new();
    on(g, || {
        let mut p = make(&p0, dt);
        let mut state = rill::optim::AdamState::new(opt, &p).unwrap();
        let (mut pe, mut me, mut ve) = (p.clone(), state.moments().0.to_vec(), state.moments().1.to_vec());
        // float64 reference state.
        let mut pr: Vec<Vec<f64>> = p.iter().map(|a| a.to_f64_vec().unwrap()).collect();
        let mut mr: Vec<Vec<f64>> = pr.iter().map(|x| vec![0.0; x.len()]).collect();
        let mut vr = mr.clone();
        for (t, g_t) in gs.iter().enumerate() {
            let grads = make(g_t, dt);
            if t == 1 {
                // The step's graph, before it is evaluated (one step per program and dtype).
                let c = rill::optim::Adam::compiled(opt);
                let s = opt.scalars(2, dt, &p[0]).unwrap();
                let mut x: Vec<Array> = p.clone();
                x.extend(grads.iter().cloned());
                x.extend(state.moments().0.iter().cloned());
                x.extend(state.moments().1.iter().cloned());
                x.extend([s.step_size, s.inv_sqrt_bc2, s.decay]);
                counts = c.primitive_counts(&x).unwrap();
            }
            p = state.step(&p, &grads).unwrap();
            let s = opt.scalars(t as u64 + 1, dt, &pe[0]).unwrap();
            let (a, b, c) = opt.update(&pe, &grads, &me, &ve, &s).unwrap();
            (pe, me, ve) = (a, b, c);
            // Reference, in f64 from the rounded gradients.
            let (b1, b2) = (opt.beta1, opt.beta2);
            let tt = t as i32 + 1;
            let (bc1, bc2) = (1.0 - b1.powi(tt), 1.0 - b2.powi(tt));
            for i in 0..count {
                let gr = grads[i].to_f64_vec().unwrap();
                for j in 0..gr.len() {
                    let mut gj = gr[j];
                    if !opt.decoupled {
                        gj += opt.weight_decay * pr[i][j];
                    } else {
                        pr[i][j] *= 1.0 - opt.lr * opt.weight_decay;
                    }
                    mr[i][j] = b1 * mr[i][j] + (1.0 - b1) * gj;
                    vr[i][j] = b2 * vr[i][j] + (1.0 - b2) * gj * gj;
                    pr[i][j] -= opt.lr / bc1 * mr[i][j] / (vr[i][j].sqrt() / bc2.sqrt() + opt.eps);
                }
            }
            let (mc, vc) = state.moments();
            for i in 0..count {
                for (name, got, want, r) in
                    [("p", &p[i], &pe[i], &pr[i]), ("m", &mc[i], &me[i], &mr[i]), ("v", &vc[i], &ve[i], &vr[i])]
                {
                    let (y, e) = (got.to_f64_vec().unwrap(), want.to_f64_vec().unwrap());
                    let w = format!("{what}: step {t} {name}[{i}] {:?}", got.shape());
                    if exact {
                        assert!(y.iter().zip(&e).all(|(a, b)| a.to_bits() == b.to_bits()), "{w}: differs from eager");
                    } else {
                        assert_close(&y, &e, 2.0 * tol(dt), &format!("{w}: compiled vs eager"));
                    }
                    // The moments are small and the update divides them: compare in
                    // units of the parameters' scale.
                    assert_close(&y, r, 16.0 * tol(dt) * (1 + t) as f64, &format!("{w}: compiled vs f64"));
                }
            }
        }
    });
    counts
}

/// How a generated attention-as-ops function is written.
#[derive(Clone, Copy, Debug)]
pub struct AttentionForm {
    /// 3-D `[BH, T, D]` or 4-D `[B, H, T, D]` operands.
    pub four_d: bool,
    /// 0: no scale; 1: `scores * c`; 2: `c * scores`; 3: `scores / c`.
    pub scale: u8,
    /// 0: no mask; 1: a padding mask `[B, 1, 1, Tk]` (or `[1, Tk]` in 3-D); 2: a full one.
    pub mask: u8,
    /// `transpose` with a permutation instead of `swapaxes`.
    pub permute: bool,
}

/// `softmax(q @ kᵀ [* c] [+ mask], -1) @ v` written as ops, on `[q, k, v(, mask)]`.
pub fn attention_ops(form: AttentionForm, x: &[Array], d: usize) -> Result<Vec<Array>> {
    let kt = if form.permute {
        let r = x[1].ndim();
        let mut p: Vec<usize> = (0..r).collect();
        p.swap(r - 1, r - 2);
        x[1].transpose(&p)?
    } else {
        x[1].swapaxes(-1, -2)?
    };
    let s = x[0].matmul(&kt)?;
    let c = 1.0 / (d as f64).sqrt();
    let s = match form.scale {
        0 => s,
        1 => s.mul(c)?,
        2 => Array::full(&[], c, s.dtype())?.mul(&s)?,
        _ => s.div(1.0 / c)?,
    };
    let s = if form.mask > 0 { s.add(&x[3])? } else { s };
    Ok(vec![s.softmax(-1)?.matmul(&x[2])?])
}

/// Generated attention-as-ops cases on `g`: compiled, each is one attention node (no
/// product or softmax left), within the dtype's tolerance of eager and of the float64
/// evaluation of the same ops (f64 is not rewritten). Returns how many ran.
pub fn attention_blocks(g: Device, seed: u64, count: usize) -> usize {
    let mut rng = Rng::new(seed);
    let pick = |rng: &mut Rng, n: u64| (rng.next_u64() % n) as usize;
    for i in 0..count {
        let form = AttentionForm {
            four_d: pick(&mut rng, 2) == 1,
            scale: pick(&mut rng, 4) as u8,
            mask: pick(&mut rng, 3) as u8,
            permute: pick(&mut rng, 2) == 1,
        };
        let dt = DTYPES[i % DTYPES.len()];
        let (b, h) = (1 + pick(&mut rng, 2), 1 + pick(&mut rng, 3));
        let (tq, tk, d, dv) = (
            1 + pick(&mut rng, 40),
            1 + pick(&mut rng, 70),
            [8, 16, 32, 64][pick(&mut rng, 4)],
            [8, 16, 32, 64][pick(&mut rng, 4)],
        );
        let lead: Vec<usize> = if form.four_d { vec![b, h] } else { vec![b * h] };
        let with = |tail: [usize; 2]| -> Vec<usize> { lead.iter().copied().chain(tail).collect() };
        let mut inputs = vec![
            vals(&mut rng, &with([tq, d]), 1.0),
            vals(&mut rng, &with([tk, d]), 1.0),
            vals(&mut rng, &with([tk, dv]), 1.0),
        ];
        if form.mask > 0 {
            let shape = match (form.mask, form.four_d) {
                (1, true) => vec![b, 1, 1, tk],
                (1, false) => vec![1, tk],
                _ => with([tq, tk]),
            };
            // Padding-style values: 0 or a large negative, never a whole row masked.
            let n: usize = shape.iter().product();
            let v = (0..n).map(|j| if j % tk != 0 && rng.next_u64().is_multiple_of(4) { -1e4 } else { 0.0 }).collect();
            inputs.push((v, shape));
        }
        let what = format!("attention {dt} {form:?} q {:?} k {:?} v {:?}", inputs[0].1, inputs[1].1, inputs[2].1);
        let f = move |x: &[Array]| attention_ops(form, x, d);
        let compiled = rill::compile(f);
        let (counts, got) = on(g, || {
            let x = make(&inputs, dt);
            (compiled.primitive_counts(&x).unwrap(), compiled.call(&x).unwrap()[0].to_f64_vec().unwrap())
        });
        for (name, n) in [("scaled_dot_product_attention", 1), ("softmax", 0), ("matmul", 0)] {
            assert_eq!(counts.get(name).copied().unwrap_or(0), n, "{what}: {name} nodes in {counts:?}");
        }
        let eager = on(g, || f(&make(&inputs, dt)).unwrap()[0].to_f64_vec().unwrap());
        let reference = on(Device::cpu(), || {
            let x: Vec<Array> = make(&inputs, dt).iter().map(|a| a.astype(DType::F64).unwrap()).collect();
            f(&x).unwrap()[0].to_f64_vec().unwrap()
        });
        assert_close(&got, &eager, 4.0 * tol(dt), &format!("{what}: compiled vs eager"));
        assert_close(&got, &reference, 8.0 * tol(dt), &format!("{what}: compiled vs f64"));
    }
    count
}

/// Generated elementwise graphs of one shape with shared intermediates and several
/// outputs (what `compile` merges into one block of several outputs): full-shape and 0-d
/// inputs, three to ten ops each reading a full-shape value (an input or an earlier op)
/// and any value, the last op and a random third of the others returned.
pub fn cluster_cases(seed: u64, count: usize) -> Vec<Case> {
    let mut rng = Rng::new(seed);
    let mut pick = move |n: usize| rng.next_u64() as usize % n;
    let mut rng2 = Rng::new(seed ^ 0x9e37);
    (0..count)
        .map(|c| {
            let dtype = DTYPES[c % DTYPES.len()];
            let nd = 1 + pick(3);
            let mut shape: Vec<usize> = (0..nd).map(|_| 1 + pick(9)).collect();
            shape[0] += 1; // more than one element
            let (full, scalars) = (2 + pick(3), pick(3));
            let mut inputs: Vec<(Vec<f64>, Vec<usize>)> = (0..full).map(|_| vals(&mut rng2, &shape, 1.0)).collect();
            inputs.extend((0..scalars).map(|_| vals(&mut rng2, &[], 1.0)));
            let n_ops = 3 + pick(8);
            // (kind, full-shape operand, any operand), as value indices: the inputs, then
            // the ops.
            let mut ops: Vec<(usize, usize, usize)> = Vec::new();
            for k in 0..n_ops {
                let fulls: Vec<usize> = (0..full).chain((0..k).map(|j| full + scalars + j)).collect();
                let a = fulls[pick(fulls.len())];
                let b = pick(full + scalars + k);
                ops.push((pick(7), a, b));
            }
            let mut outs: Vec<usize> = (0..n_ops - 1).filter(|_| pick(3) == 0).collect();
            outs.push(n_ops - 1);
            let what = format!("cluster {c} {dtype} {shape:?} ops {ops:?} outputs {outs:?}");
            let f: F = std::sync::Arc::new(move |x: &[Array]| {
                let mut v: Vec<Array> = x.to_vec();
                for &(kind, a, b) in &ops {
                    let (a, b) = (&v[a], &v[b]);
                    let y = match kind {
                        0 => a.add(b)?,
                        1 => a.sub(b)?,
                        2 => a.mul(b)?,
                        3 => a.maximum(b)?,
                        4 => a.minimum(b)?,
                        5 => a.tanh()?.add(b)?,
                        _ => a.mul(0.5)?.sin()?,
                    };
                    v.push(y);
                }
                Ok(outs.iter().map(|&o| v[x.len() + o].clone()).collect())
            });
            Case { what, f, inputs, dtype, expect: vec![] }
        })
        .collect()
}

/// The shapes of a quantized product block's pattern (see [`qmatmul_blocks`]).
#[derive(Clone, Copy, Debug)]
pub enum QPattern {
    /// `rms_norm(x, nw) @ wᵀ`
    Norm,
    /// `rms_norm(x) @ wᵀ` (no weight)
    NormPlain,
    /// `(silu(gu[.., :k]) * gu[.., k:]) @ wᵀ`, the gate and up halves of one joined array
    Gated,
    /// `x @ wᵀ + r`
    Residual,
    /// `r + (silu(gate) * up) @ wᵀ`, the gated activation and the residual together
    GatedResidual,
    /// `h1 = r + x @ w1ᵀ; h1, rms_norm(h1, nw) @ w2ᵀ`: a layer's residual, then the next
    /// norm and product (two blocks, `h1` returned)
    Chain,
    /// `n = rms_norm(x, nw); n @ wᵀ, n * 2`: the norm is read elsewhere and stays a node
    Shared,
}

impl QPattern {
    pub const ALL: [QPattern; 7] = [
        QPattern::Norm,
        QPattern::NormPlain,
        QPattern::Gated,
        QPattern::Residual,
        QPattern::GatedResidual,
        QPattern::Chain,
        QPattern::Shared,
    ];

    /// The pattern's outputs from its inputs `x` (see each form), with `prod(i, a)` the
    /// product of `a` with weight `i`.
    fn apply(self, x: &[Array], prod: &dyn Fn(usize, &Array) -> Result<Array>) -> Result<Vec<Array>> {
        let k = x[0].shape().last().copied().unwrap_or(0) as isize;
        let gated = |gu: &Array| -> Result<Array> {
            let axis = gu.ndim() as isize - 1;
            let g = gu.slice_axis(axis, Some(0), Some(k / 2), 1)?;
            let u = gu.slice_axis(axis, Some(k / 2), Some(k), 1)?;
            g.silu()?.mul(&u)
        };
        Ok(match self {
            QPattern::Norm => vec![prod(0, &x[0].rms_norm(Some(&x[1]), 1e-5)?)?],
            QPattern::NormPlain => vec![prod(0, &x[0].rms_norm(None, 1e-6)?)?],
            QPattern::Gated => vec![prod(0, &gated(&x[0])?)?],
            QPattern::Residual => vec![prod(0, &x[0])?.add(&x[1])?],
            QPattern::GatedResidual => vec![x[1].add(&prod(0, &gated(&x[0])?)?)?],
            QPattern::Chain => {
                let h1 = x[1].add(&prod(0, &x[0])?)?;
                let y = prod(1, &h1.rms_norm(Some(&x[2]), 1e-5)?)?;
                vec![h1, y]
            }
            QPattern::Shared => {
                let n = x[0].rms_norm(Some(&x[1]), 1e-5)?;
                vec![prod(0, &n)?, n.mul(2.0)?]
            }
        })
    }

    /// The block nodes and the unfused products a compiled pattern holds.
    fn expect(self) -> [(&'static str, usize); 3] {
        match self {
            QPattern::Chain => [("fused_qmatmul", 2), ("qmatmul", 0), ("rms_norm", 0)],
            QPattern::Shared => [("fused_qmatmul", 0), ("qmatmul", 1), ("rms_norm", 1)],
            _ => [("fused_qmatmul", 1), ("qmatmul", 0), ("rms_norm", 0)],
        }
    }
}

/// Quantized product blocks (`compile` fusing a norm or elementwise program before a
/// block-quantized product and an elementwise program after it): every pattern of
/// [`QPattern`] over generated formats, dtypes, row counts (the matrix-vector rows, chunks
/// of them, and the tiled kernel's, whose K a GPU splits with `RILL_QMM_SPLITK=1`, the
/// post program then in the kernel that adds the splits), `K` and `N`, compiled against
/// eager on `g` (bit for
/// bit on the CPU, within the dtype's tolerance on a GPU, where the norm's sum of squares
/// is summed in another order) and against float64 with the dequantized weights. Returns
/// the number of cases.
pub fn qmatmul_blocks(g: Device, seed: u64, count: usize) -> usize {
    use rill::quant::{QMatrix, QuantFormat};
    let exact = !g.is_gpu();
    let mut rng = Rng::new(seed);
    for i in 0..count {
        let pat = QPattern::ALL[i % QPattern::ALL.len()];
        let dt = DTYPES[(i / QPattern::ALL.len()) % DTYPES.len()];
        let format = QuantFormat::ALL[rng.next_u64() as usize % 3];
        let m = [1, 1, 2, 3, 5, 8, 9, 17, 64, 70, 130][rng.next_u64() as usize % 11];
        let lead: Vec<usize> = if rng.next_u64().is_multiple_of(3) && m % 2 == 0 { vec![2, m / 2] } else { vec![m] };
        // Up to 9 blocks of K: a tiled product's K splits from 6 blocks (GPU, opt-in).
        let k = 32 * (1 + rng.next_u64() as usize % 9);
        // The chain's second product reads N columns: whole blocks.
        let n = if matches!(pat, QPattern::Chain) {
            32 * (1 + rng.next_u64() as usize % 2)
        } else {
            1 + rng.next_u64() as usize % 70
        };
        let with = |last: usize| -> Vec<usize> { lead.iter().copied().chain([last]).collect() };
        let k2 = if matches!(pat, QPattern::Chain) { n } else { k };
        let weights: Vec<(Vec<f64>, Vec<usize>)> = vec![vals(&mut rng, &[n, k], 0.3), vals(&mut rng, &[n, k2], 0.3)];
        // Inputs per pattern: x (or the joined gate/up), then the norm weight or residual.
        let inputs: Vec<(Vec<f64>, Vec<usize>)> = match pat {
            QPattern::Norm | QPattern::Shared => vec![vals(&mut rng, &with(k), 2.0), vals(&mut rng, &[k], 1.0)],
            QPattern::NormPlain => vec![vals(&mut rng, &with(k), 2.0)],
            QPattern::Gated => vec![vals(&mut rng, &with(2 * k), 2.0)],
            QPattern::Residual => vec![vals(&mut rng, &with(k), 1.0), vals(&mut rng, &with(n), 1.0)],
            QPattern::GatedResidual => vec![vals(&mut rng, &with(2 * k), 2.0), vals(&mut rng, &with(n), 1.0)],
            QPattern::Chain => {
                vec![vals(&mut rng, &with(k), 1.0), vals(&mut rng, &with(n), 1.0), vals(&mut rng, &[n], 1.0)]
            }
        };
        let what = format!("qmatmul block {pat:?} {} {dt} x {:?} N {n}", format.name(), inputs[0].1);
        let run = |dev: Device, as_dt: DType, compiled: bool| {
            on(dev, || {
                let ws: Vec<QMatrix> = weights
                    .iter()
                    .map(|(v, s)| {
                        let a = Array::from_slice(v, s).unwrap().astype(DType::F32).unwrap();
                        QMatrix::quantize(&a, format).unwrap()
                    })
                    .collect();
                let x = make(&inputs, dt);
                if as_dt == DType::F64 {
                    // The reference: the dequantized weights in float64.
                    let wd: Vec<Array> = ws
                        .iter()
                        .map(|w| {
                            w.dequantize(DType::F32).unwrap().astype(DType::F64).unwrap().transpose(&[1, 0]).unwrap()
                        })
                        .collect();
                    let x: Vec<Array> = x.iter().map(|a| a.astype(DType::F64).unwrap()).collect();
                    let prod = |j: usize, a: &Array| a.matmul(&wd[j]);
                    let out = pat.apply(&x, &prod).unwrap();
                    return (BTreeMap::new(), out.iter().map(|a| a.to_f64_vec().unwrap()).collect::<Vec<_>>());
                }
                let f = move |x: &[Array]| pat.apply(x, &|j, a| rill::quant::qmatmul(a, &ws[j]));
                if !compiled {
                    let out = f(&x).unwrap();
                    return (BTreeMap::new(), out.iter().map(|a| a.to_f64_vec().unwrap()).collect::<Vec<_>>());
                }
                let c = rill::compile(f);
                let counts = c.primitive_counts(&x).unwrap();
                let out = c.call(&x).unwrap();
                (counts, out.iter().map(|a| a.to_f64_vec().unwrap()).collect::<Vec<_>>())
            })
        };
        let (counts, got) = run(g, dt, true);
        for (name, want) in pat.expect() {
            assert_eq!(counts.get(name).copied().unwrap_or(0), want, "{what}: {name} nodes in {counts:?}");
        }
        let (_, eager) = run(g, dt, false);
        let (_, reference) = run(Device::cpu(), DType::F64, false);
        for (o, ((y, e), r)) in got.iter().zip(&eager).zip(&reference).enumerate() {
            let what = format!("{what} output {o}");
            if exact {
                let differ = y.iter().zip(e).position(|(a, b)| a.to_bits() != b.to_bits());
                assert!(differ.is_none(), "{what}: element {differ:?} differs from eager");
            } else {
                assert_close(y, e, 2.0 * tol(dt), &format!("{what}: compiled vs eager"));
            }
            assert_close(y, r, 8.0 * tol(dt), &format!("{what}: compiled vs f64"));
        }
    }
    count
}
