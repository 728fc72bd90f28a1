//! The parts of attention's gradient (`Primitive::AttentionGrad`) on the CPU, without a
//! stored score matrix: each part recomputes a query row's scores key by key and turns them
//! into probabilities with the row's log-sum-exp from `Stats` (see
//! [`AttentionGradPart`] for what each part holds). f16, bf16 and f32 compute in f32, f64
//! in f64. `Stats` and `Dkv` are split over (batch, head) planes, `Dq` over query rows.

use half::{bf16, f16};

use crate::backend::cpu::attention::{dot, up};
use crate::backend::cpu::nn::{FloatElem, Real};
use crate::backend::cpu::reduce::acc::Acc;
use crate::backend::cpu::{CpuBuffer, from_f64_slice, par};
use crate::backend::{Buffer, Storage};
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::primitives::AttentionGradPart;
use crate::shape::numel;

/// Query rows per parallel piece of `Dq`.
const ROWS: usize = 16;

/// Part `part` of the gradient over inputs `q, k, v, o, do` (`Stats`) or `q, k, v, do,
/// stats`, into an output of `shape` and `dtype`.
pub(crate) fn attention_grad(
    inputs: &[&Storage],
    scale: f64,
    causal: bool,
    part: AttentionGradPart,
    shape: &[usize],
    dtype: DType,
) -> Result<Storage> {
    match inputs[0].dtype {
        DType::F16 => run::<f16>(inputs, scale, causal, part, shape, dtype),
        DType::BF16 => run::<bf16>(inputs, scale, causal, part, shape, dtype),
        DType::F32 => run::<f32>(inputs, scale, causal, part, shape, dtype),
        DType::F64 => run::<f64>(inputs, scale, causal, part, shape, dtype),
        d => Err(Error::Unsupported {
            op: "scaled_dot_product_attention_grad",
            backend: "cpu",
            msg: format!("dtype {d} (floats only)"),
        }),
    }
}

/// The sizes of one attention and the keys each query row attends.
#[derive(Clone, Copy)]
struct Dims {
    hq: usize,
    hkv: usize,
    tq: usize,
    tk: usize,
    d: usize,
    causal: bool,
}

impl Dims {
    /// The keys `0 .. kend(i)` query row `i` attends (causal: aligned at the bottom right).
    fn kend(&self, i: usize) -> usize {
        if self.causal { (i + self.tk).saturating_sub(self.tq - 1).min(self.tk) } else { self.tk }
    }
    /// The key/value plane that query plane `bh` reads.
    fn kv_plane(&self, bh: usize) -> usize {
        (bh / self.hq) * self.hkv + (bh % self.hq) / (self.hq / self.hkv)
    }
}

/// The rows of one query plane's probabilities and score cotangents: calls
/// `f(j, p, ds)` for each key `j` row `i` attends, with `p = exp(scale q·kⱼ − lse)` and
/// `ds = p (dO·vⱼ − delta)`.
#[allow(clippy::too_many_arguments)]
fn each_key<C: Real>(
    dm: &Dims,
    q_row: &[C],
    do_row: &[C],
    k: &[C],
    v: &[C],
    kv: usize,
    i: usize,
    scale: C,
    lse: C,
    delta: C,
    mut f: impl FnMut(usize, C, C),
) {
    let d = dm.d;
    for j in 0..dm.kend(i) {
        let at = (kv * dm.tk + j) * d;
        let p = (scale.mul(dot(q_row, &k[at..at + d])) - lse).exp();
        let ds = p.mul(dot(do_row, &v[at..at + d]) - delta);
        f(j, p, ds);
    }
}

fn run<T: FloatElem>(
    inputs: &[&Storage],
    scale: f64,
    causal: bool,
    part: AttentionGradPart,
    shape: &[usize],
    dtype: DType,
) -> Result<Storage> {
    let (qs, ks) = (&inputs[0].layout.shape, &inputs[1].layout.shape);
    let r = qs.len();
    let dm = Dims { hq: qs[r - 3], hkv: ks[r - 3], tq: qs[r - 2], tk: ks[r - 2], d: qs[r - 1], causal };
    let n = numel(shape);
    if n == 0 || dm.hkv == 0 {
        let mut buf = CpuBuffer::alloc(dtype, n)?;
        if n > 0 {
            // No keys at all: every gradient is 0 (the buffer's contents are unspecified).
            crate::with_dtype!(dtype, E => buf.typed_mut::<E>().fill(<E as crate::dtype::Element>::from_f64(0.0)));
        }
        return Ok(Storage::contiguous(Buffer::Cpu(buf), dtype, shape));
    }
    let planes = numel(&qs[..r - 2]);
    let (d, tq, tk) = (dm.d, dm.tq, dm.tk);
    let (q, k, v) = (up::<T>(inputs[0]), up::<T>(inputs[1]), up::<T>(inputs[2]));
    let sc = <T::A as Real>::of(scale);
    if part == AttentionGradPart::Stats {
        let (o, dout) = (up::<T>(inputs[3]), up::<T>(inputs[4]));
        let rows = par::map(planes, |bh| {
            let kv = dm.kv_plane(bh);
            let mut out = Vec::with_capacity(2 * tq);
            for i in 0..tq {
                let at = (bh * tq + i) * d;
                let q_row = &q[at..at + d];
                let s: Vec<T::A> =
                    (0..dm.kend(i)).map(|j| sc.mul(dot(q_row, &k[(kv * tk + j) * d..(kv * tk + j + 1) * d]))).collect();
                let m = s.iter().fold(<T::A as Acc>::LOWEST, |a, &b| if b > a { b } else { a });
                let lse = if s.is_empty() {
                    f64::INFINITY
                } else {
                    let sum = s.iter().fold(<T::A as Real>::of(0.0), |a, &x| a.add((x - m).exp()));
                    m.as_f64() + sum.as_f64().ln()
                };
                out.push(lse);
                out.push(Real::as_f64(dot(&dout[at..at + d], &o[at..at + d])));
            }
            out
        });
        return from_f64_slice(&rows.concat(), dtype, shape);
    }
    let (dout, st) = (up::<T>(inputs[3]), crate::backend::cpu::to_f64_vec(inputs[4]));
    let stat = |bh: usize, i: usize| (st[2 * (bh * tq + i)], st[2 * (bh * tq + i) + 1]);
    let mut buf = CpuBuffer::alloc(dtype, n)?;
    let out = buf.typed_mut::<T>();
    if part == AttentionGradPart::Dq {
        par::chunks(out, ROWS * d, |ci, o| {
            for (ri, o_row) in o.chunks_mut(d).enumerate() {
                let row = ci * ROWS + ri;
                let (bh, i) = (row / tq, row % tq);
                let (lse, delta) = stat(bh, i);
                let at = row * d;
                let mut acc = vec![<T::A as Real>::of(0.0); d];
                let (qr, dr) = (&q[at..at + d], &dout[at..at + d]);
                let kv = dm.kv_plane(bh);
                each_key(&dm, qr, dr, &k, &v, kv, i, sc, of::<T>(lse), of::<T>(delta), |j, _, ds| {
                    let kr = &k[(kv * tk + j) * d..];
                    for (a, &x) in acc.iter_mut().zip(&kr[..d]) {
                        *a = a.add(ds.mul(x));
                    }
                });
                for (o, a) in o_row.iter_mut().zip(acc) {
                    *o = T::down(sc.mul(a));
                }
            }
        });
    } else {
        // `[2, planes_kv, tk, d]`: dk, then dv; each kv plane sums its query heads.
        let kv_planes = planes / dm.hq * dm.hkv;
        let group = dm.hq / dm.hkv;
        let per = tk * d;
        let parts = par::map(kv_planes, |kv| {
            let (mut dk, mut dv) = (vec![<T::A as Real>::of(0.0); per], vec![<T::A as Real>::of(0.0); per]);
            let (b, hk) = (kv / dm.hkv, kv % dm.hkv);
            for h in hk * group..(hk + 1) * group {
                let bh = b * dm.hq + h;
                for i in 0..tq {
                    let (lse, delta) = stat(bh, i);
                    let at = (bh * tq + i) * d;
                    let (qr, dr) = (&q[at..at + d], &dout[at..at + d]);
                    each_key(&dm, qr, dr, &k, &v, kv, i, sc, of::<T>(lse), of::<T>(delta), |j, p, ds| {
                        let (gk, gv) = (&mut dk[j * d..(j + 1) * d], &mut dv[j * d..(j + 1) * d]);
                        for c in 0..d {
                            gk[c] = gk[c].add(ds.mul(qr[c]));
                            gv[c] = gv[c].add(p.mul(dr[c]));
                        }
                    });
                }
            }
            (dk, dv)
        });
        let (first, second) = out.split_at_mut(kv_planes * per);
        for (kv, (dk, dv)) in parts.into_iter().enumerate() {
            for (o, a) in first[kv * per..(kv + 1) * per].iter_mut().zip(dk) {
                *o = T::down(sc.mul(a));
            }
            for (o, a) in second[kv * per..(kv + 1) * per].iter_mut().zip(dv) {
                *o = T::down(a);
            }
        }
    }
    Ok(Storage::contiguous(Buffer::Cpu(buf), dtype, shape))
}

fn of<T: FloatElem>(v: f64) -> T::A {
    <T::A as Real>::of(v)
}
