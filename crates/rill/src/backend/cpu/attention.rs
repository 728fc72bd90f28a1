//! Scaled dot-product attention on the CPU: the keys are walked in blocks of [`BK`] with
//! an online softmax (a running maximum, sum and output row per query), so no `[Tq, Tk]`
//! score matrix is stored. The work is split over blocks of [`BQ`] query rows of the
//! flattened `[batch * Hq * Tq]` rows, through `par.rs` (the runtime's pool). f16, bf16
//! and f32 compute in f32, f64 in f64. A row with no key left after masking is 0.

use half::{bf16, f16};

use crate::backend::cpu::nn::{FloatElem, Real};
use crate::backend::cpu::reduce::acc::Reducible;
use crate::backend::cpu::{CpuBuffer, par, strided};
use crate::backend::{Buffer, Storage};
use crate::dtype::{DType, Element};
use crate::error::{Error, Result};
use crate::primitives::AttentionMaskKind;
use crate::shape::{Layout, numel};

/// Query rows per parallel piece.
const BQ: usize = 16;
/// Keys per block of the online softmax.
const BK: usize = 64;

/// Attention over inputs `q, k, v[, mask]` into an output of `shape` and `dtype`.
pub(crate) fn attention(
    inputs: &[&Storage],
    scale: Option<f64>,
    kind: AttentionMaskKind,
    shape: &[usize],
    dtype: DType,
) -> Result<Storage> {
    let name = "scaled_dot_product_attention";
    match dtype {
        DType::F16 => run::<f16>(inputs, scale, kind, shape, dtype),
        DType::BF16 => run::<bf16>(inputs, scale, kind, shape, dtype),
        DType::F32 => run::<f32>(inputs, scale, kind, shape, dtype),
        DType::F64 => run::<f64>(inputs, scale, kind, shape, dtype),
        d => Err(Error::Unsupported { op: name, backend: "cpu", msg: format!("dtype {d} (floats only)") }),
    }
}

/// The sizes of one attention, from the input shapes.
struct Dims {
    hq: usize,
    hkv: usize,
    tq: usize,
    tk: usize,
    d: usize,
    dv: usize,
}

/// The values of `s` in row-major order, in the compute type.
fn up<T: FloatElem>(s: &Storage) -> Vec<T::A> {
    strided::contiguous::<T>(s).iter().map(|v| v.up()).collect()
}

/// The mask as additive values (bool: 0 or -inf) in its own row-major order, with the
/// offset of each (batch, query head)'s `[Tq, Tk]` plane and the strides along Tq and Tk
/// of its broadcast to the scores' shape.
struct Mask<C> {
    values: Vec<C>,
    base: Vec<usize>,
    sq: usize,
    sk: usize,
}

fn mask<C: Real>(m: &Storage, scores: &[usize]) -> Mask<C> {
    let values: Vec<C> = crate::with_dtype!(m.dtype, M => {
        strided::contiguous::<M>(m)
            .iter()
            .map(|v| {
                let x = v.to_f64();
                if m.dtype == DType::Bool { if x != 0.0 { C::ZERO } else { C::LOWEST } } else { C::of(x) }
            })
            .collect()
    });
    let l = Layout::contiguous(&m.layout.shape).broadcast_to(scores);
    let r = scores.len();
    let planes: usize = scores[..r - 2].iter().product();
    // Offsets of each plane, from the broadcast strides of the batch and head axes.
    let base = (0..planes)
        .map(|p| {
            let (mut rem, mut off) = (p, 0isize);
            for ax in (0..r - 2).rev() {
                off += (rem % scores[ax]) as isize * l.strides[ax];
                rem /= scores[ax];
            }
            off as usize
        })
        .collect();
    Mask { values, base, sq: l.strides[r - 2] as usize, sk: l.strides[r - 1] as usize }
}

fn run<T: FloatElem>(
    inputs: &[&Storage],
    scale: Option<f64>,
    kind: AttentionMaskKind,
    shape: &[usize],
    dtype: DType,
) -> Result<Storage> {
    let (qs, ks, vs) = (&inputs[0].layout.shape, &inputs[1].layout.shape, &inputs[2].layout.shape);
    let r = qs.len();
    let dm = Dims { hq: qs[r - 3], hkv: ks[r - 3], tq: qs[r - 2], tk: ks[r - 2], d: qs[r - 1], dv: vs[r - 1] };
    let n = numel(shape);
    let mut buf = CpuBuffer::alloc(dtype, n)?;
    if n == 0 {
        return Ok(Storage::contiguous(Buffer::Cpu(buf), dtype, shape));
    }
    let (q, k, v) = (up::<T>(inputs[0]), up::<T>(inputs[1]), up::<T>(inputs[2]));
    let scores: Vec<usize> = qs[..r - 1].iter().copied().chain([dm.tk]).collect();
    let m = match kind {
        AttentionMaskKind::Array => Some(mask::<T::A>(inputs[3], &scores)),
        AttentionMaskKind::None | AttentionMaskKind::Causal => None,
    };
    let causal = kind == AttentionMaskKind::Causal;
    let scale = <T::A as Real>::of(scale.unwrap_or(if dm.d == 0 { 1.0 } else { 1.0 / (dm.d as f64).sqrt() }));
    let out = buf.typed_mut::<T>();
    let dv = dm.dv;
    let init = || Scratch::<T::A> { m: vec![], l: vec![], acc: vec![], s: vec![] };
    par::chunks_init(out, BQ * dv, init, |scr, ci, o| {
        let (r0, r1) = (ci * BQ, ci * BQ + o.len() / dv);
        let mut row = r0;
        // The piece's rows, one (batch, head) plane at a time.
        while row < r1 {
            let bh = row / dm.tq;
            let end = r1.min((bh + 1) * dm.tq);
            let o_seg = &mut o[(row - r0) * dv..(end - r0) * dv];
            let plane = Plane { q: &q, k: &k, v: &v, mask: m.as_ref(), causal, scale, bh };
            rows(&dm, &plane, row % dm.tq, end - row, scr, o_seg);
            row = end;
        }
    });
    Ok(Storage::contiguous(Buffer::Cpu(buf), dtype, shape))
}

/// Per-task scratch: each row's running maximum and sum, its output row, and one key
/// block's scores.
struct Scratch<C> {
    m: Vec<C>,
    l: Vec<C>,
    acc: Vec<C>,
    s: Vec<C>,
}

/// What the rows of one (batch, query head) plane read.
struct Plane<'a, C> {
    q: &'a [C],
    k: &'a [C],
    v: &'a [C],
    mask: Option<&'a Mask<C>>,
    causal: bool,
    scale: C,
    bh: usize,
}

#[inline(always)]
fn dot<C: Real>(a: &[C], b: &[C]) -> C {
    // Independent lanes, so the compiler can vectorise the sum.
    const L: usize = 8;
    let mut lanes = [C::ZERO; L];
    let (ab, at) = a.split_at(a.len() - a.len() % L);
    let bb = &b[..ab.len()];
    for (x, y) in ab.chunks_exact(L).zip(bb.chunks_exact(L)) {
        for i in 0..L {
            lanes[i] = lanes[i].add(x[i].mul(y[i]));
        }
    }
    let mut s = C::ZERO;
    for (x, y) in at.iter().zip(&b[ab.len()..]) {
        s = s.add(x.mul(*y));
    }
    lanes.into_iter().fold(s, |a, b| a.add(b))
}

/// Rows `i0 .. i0 + nr` of plane `p` into `out` (`nr * dv` values).
fn rows<C: Real, T: Reducible<A = C>>(
    dm: &Dims,
    p: &Plane<'_, C>,
    i0: usize,
    nr: usize,
    scr: &mut Scratch<C>,
    out: &mut [T],
) {
    let (d, dv, tk) = (dm.d, dm.dv, dm.tk);
    let (b, h) = (p.bh / dm.hq, p.bh % dm.hq);
    let kvh = b * dm.hkv + h / (dm.hq / dm.hkv);
    let k = &p.k[kvh * tk * d..(kvh + 1) * tk * d];
    let v = &p.v[kvh * tk * dv..(kvh + 1) * tk * dv];
    let q = &p.q[(p.bh * dm.tq + i0) * d..(p.bh * dm.tq + i0 + nr) * d];
    // The keys each row may attend: all of them, or up to `i + Tk - Tq` when causal.
    let hi = |ri: usize| -> usize { if p.causal { (i0 + ri + 1 + tk).saturating_sub(dm.tq).min(tk) } else { tk } };
    scr.m.clear();
    scr.m.resize(nr, C::LOWEST);
    scr.l.clear();
    scr.l.resize(nr, C::ZERO);
    scr.acc.clear();
    scr.acc.resize(nr * dv, C::ZERO);
    scr.s.resize(BK, C::ZERO);
    let max_hi = (0..nr).map(hi).max().unwrap_or(0);
    for kb in (0..max_hi).step_by(BK) {
        for ri in 0..nr {
            let kend = (kb + BK).min(hi(ri));
            if kend <= kb {
                continue;
            }
            let qr = &q[ri * d..(ri + 1) * d];
            let s = &mut scr.s[..kend - kb];
            let mut mx = C::LOWEST;
            for (j, sj) in s.iter_mut().enumerate() {
                let kj = kb + j;
                let mut x = dot(qr, &k[kj * d..(kj + 1) * d]).mul(p.scale);
                if let Some(m) = p.mask {
                    x = x.add(m.values[m.base[p.bh] + (i0 + ri) * m.sq + kj * m.sk]);
                }
                *sj = x;
                if x > mx {
                    mx = x;
                }
            }
            let m_old = scr.m[ri];
            let m_new = if mx > m_old { mx } else { m_old };
            if m_new == C::LOWEST {
                continue; // every key so far masked out
            }
            let acc = &mut scr.acc[ri * dv..(ri + 1) * dv];
            if m_new != m_old {
                let corr = (m_old - m_new).exp();
                scr.l[ri] = scr.l[ri].mul(corr);
                acc.iter_mut().for_each(|a| *a = a.mul(corr));
            }
            let mut l = scr.l[ri];
            for (j, &sj) in s.iter().enumerate() {
                let e = (sj - m_new).exp();
                l = l.add(e);
                let vj = &v[(kb + j) * dv..(kb + j + 1) * dv];
                for (a, &x) in acc.iter_mut().zip(vj) {
                    *a = a.add(e.mul(x));
                }
            }
            scr.l[ri] = l;
            scr.m[ri] = m_new;
        }
    }
    for ri in 0..nr {
        let l = scr.l[ri];
        let o = &mut out[ri * dv..(ri + 1) * dv];
        if l == C::ZERO {
            o.iter_mut().for_each(|x| *x = T::down(C::ZERO));
        } else {
            let inv = C::ONE / l;
            for (x, &a) in o.iter_mut().zip(&scr.acc[ri * dv..(ri + 1) * dv]) {
                *x = T::down(a.mul(inv));
            }
        }
    }
}
