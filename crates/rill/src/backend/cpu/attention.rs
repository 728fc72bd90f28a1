//! Scaled dot-product attention on the CPU: the keys are walked in blocks with an online
//! softmax (a running maximum, sum and output row per query), so no `[Tq, Tk]` score
//! matrix is stored. The work is split over blocks of query rows, through `par.rs` (the
//! runtime's pool). f16, bf16 and f32 compute in f32 with each block's two products
//! (`Q Kᵀ` and `P V`) through `gemm` ([`blocked`]); f64 computes in f64 row by row. A row
//! with no key left after masking is 0.

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
    let d = *inputs[0].layout.shape.last().unwrap_or(&0);
    match dtype {
        // A zero-width dot product has no product to hand `gemm`.
        DType::F16 if d == 0 => run::<f16>(inputs, scale, kind, shape, dtype),
        DType::BF16 if d == 0 => run::<bf16>(inputs, scale, kind, shape, dtype),
        DType::F32 if d == 0 => run::<f32>(inputs, scale, kind, shape, dtype),
        DType::F16 => blocked::run::<f16>(inputs, scale, kind, shape, dtype),
        DType::BF16 => blocked::run::<bf16>(inputs, scale, kind, shape, dtype),
        DType::F32 => blocked::run::<f32>(inputs, scale, kind, shape, dtype),
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

impl Dims {
    /// The sizes of the attention over `q, k, v` (the first three inputs).
    fn of(inputs: &[&Storage]) -> Dims {
        let (qs, ks, vs) = (&inputs[0].layout.shape, &inputs[1].layout.shape, &inputs[2].layout.shape);
        let r = qs.len();
        Dims { hq: qs[r - 3], hkv: ks[r - 3], tq: qs[r - 2], tk: ks[r - 2], d: qs[r - 1], dv: vs[r - 1] }
    }
}

/// The array mask (the fourth input) as additive values broadcast to the scores'
/// shape, or none for the other mask kinds.
fn mask_of<C: Real>(inputs: &[&Storage], kind: AttentionMaskKind, dm: &Dims) -> Option<Mask<C>> {
    (kind == AttentionMaskKind::Array).then(|| {
        let qs = &inputs[0].layout.shape;
        let scores: Vec<usize> = qs[..qs.len() - 1].iter().copied().chain([dm.tk]).collect();
        mask::<C>(inputs[3], &scores)
    })
}

/// The values of `s` in row-major order, in the compute type.
pub(crate) fn up<T: FloatElem>(s: &Storage) -> Vec<T::A> {
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
    let dm = Dims::of(inputs);
    let n = numel(shape);
    let mut buf = CpuBuffer::alloc(dtype, n)?;
    if n == 0 {
        return Ok(Storage::contiguous(Buffer::Cpu(buf), dtype, shape));
    }
    let (q, k, v) = (up::<T>(inputs[0]), up::<T>(inputs[1]), up::<T>(inputs[2]));
    let m = mask_of::<T::A>(inputs, kind, &dm);
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
pub(crate) fn dot<C: Real>(a: &[C], b: &[C]) -> C {
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

/// The f32 computation: per piece of query rows, each key block's scores `Q Kᵀ` and the
/// update `acc += P V` are `gemm` products (register-blocked, SIMD), with the online
/// softmax between them. f32 inputs are read in place through their strides (a KV cache's
/// view needs no copy); f16 and bf16 are widened to f32 first.
///
/// Decoding (one query per head) with grouped heads takes the query heads that share a
/// key/value head as the rows of one piece, so each cached key and value row is read once
/// per group.
mod blocked {
    use std::borrow::Cow;

    use super::{Dims, FloatElem, Mask, mask_of, up};
    use crate::backend::cpu::matmul::batch_offsets;
    use crate::backend::cpu::{CpuBuffer, par};
    use crate::backend::{Buffer, Storage};
    use crate::dtype::DType;
    use crate::error::Result;
    use crate::primitives::AttentionMaskKind;
    use crate::primitives::vexp::exp_f32;
    use crate::shape::numel;

    /// Query rows per piece.
    const BQ: usize = 64;
    /// Keys per block.
    const BK: usize = 128;

    /// One input in f32: its values, where each (batch, head) plane starts, and the row
    /// and column strides inside a plane.
    struct Operand<'a> {
        data: Cow<'a, [f32]>,
        planes: Vec<usize>,
        rs: usize,
        cs: usize,
        /// The stride between heads (the axis before the rows).
        hs: usize,
    }

    fn operand<T: FloatElem<A = f32>>(s: &Storage) -> Operand<'_> {
        let l = &s.layout;
        let r = l.shape.len();
        let fix =
            |i: usize| if l.shape[i] <= 1 { Some(1) } else { usize::try_from(l.strides[i]).ok().filter(|&v| v > 0) };
        let inner = (fix(r - 2), fix(r - 1), fix(r - 3));
        let in_place = s.dtype == DType::F32 && l.strides.iter().all(|&v| v >= 0);
        if let (true, (Some(rs), Some(cs), Some(hs))) = (in_place, inner) {
            let buf = s.cpu().expect("CPU kernel given a non-CPU storage").typed::<f32>();
            return Operand { data: Cow::Borrowed(buf), planes: batch_offsets(l), rs, cs, hs };
        }
        let contiguous = crate::shape::Layout::contiguous(&l.shape);
        let (rows, cols) = (l.shape[r - 2], l.shape[r - 1]);
        Operand {
            data: Cow::Owned(up::<T>(s)),
            planes: batch_offsets(&contiguous),
            rs: cols.max(1),
            cs: 1,
            hs: (rows * cols).max(1),
        }
    }

    /// Per-task scratch: each row's running maximum and sum, output row, key limit and
    /// mask offset, and one key block's scores.
    #[derive(Default)]
    struct Scratch {
        m: Vec<f32>,
        l: Vec<f32>,
        acc: Vec<f32>,
        s: Vec<f32>,
        hi: Vec<usize>,
        lo: Vec<usize>,
        mo: Vec<usize>,
    }

    /// Lanes of the max and sum passes: independent partial results that vectorise.
    const LANES: usize = 16;

    /// The largest of `x` (`-inf` when empty; NaN-free scores assumed, as a comparison
    /// fold gives).
    fn lanes_max(x: &[f32]) -> f32 {
        let mut acc = [f32::NEG_INFINITY; LANES];
        let mut it = x.chunks_exact(LANES);
        for c in &mut it {
            for (a, &v) in acc.iter_mut().zip(c) {
                *a = if v > *a { v } else { *a };
            }
        }
        let tail = it.remainder().iter().fold(f32::NEG_INFINITY, |a, &b| if b > a { b } else { a });
        acc.iter().fold(tail, |a, &b| if b > a { b } else { a })
    }

    crate::backend::cpu::simd::multiversion! {
        /// `x[i] = e^(x[i] - m)`, and their sum, built for this CPU's widest vectors.
        fn exp_sum(x: &mut [f32], m: f32) -> f32 {
            // Two passes, so that each vectorises (a running sum would not).
            x.iter_mut().for_each(|v| *v = exp_f32(*v - m));
            lanes_sum(x)
        }
    }

    /// The sum of `x` in [`LANES`] partial sums.
    #[inline(always)]
    fn lanes_sum(x: &[f32]) -> f32 {
        let mut acc = [0f32; LANES];
        let mut it = x.chunks_exact(LANES);
        for c in &mut it {
            for (a, &v) in acc.iter_mut().zip(c) {
                *a += v;
            }
        }
        acc.iter().sum::<f32>() + it.remainder().iter().sum::<f32>()
    }

    /// What a piece of rows reads: every row attends the keys of one key/value plane.
    struct Rows<'a> {
        q: &'a Operand<'a>,
        k: &'a Operand<'a>,
        v: &'a Operand<'a>,
        /// The first row's query offset and the step between rows.
        q0: usize,
        qstep: usize,
        kv: usize,
        mask: Option<&'a Mask<f32>>,
        scale: f32,
    }

    pub(super) fn run<T: FloatElem<A = f32>>(
        inputs: &[&Storage],
        scale: Option<f64>,
        kind: AttentionMaskKind,
        shape: &[usize],
        dtype: DType,
    ) -> Result<Storage> {
        let dm = Dims::of(inputs);
        let n = numel(shape);
        let mut buf = CpuBuffer::alloc(dtype, n)?;
        if n == 0 {
            return Ok(Storage::contiguous(Buffer::Cpu(buf), dtype, shape));
        }
        let (q, k, v) = (operand::<T>(inputs[0]), operand::<T>(inputs[1]), operand::<T>(inputs[2]));
        let m = mask_of::<f32>(inputs, kind, &dm);
        let causal = kind == AttentionMaskKind::Causal;
        let scale = scale.unwrap_or(1.0 / (dm.d as f64).sqrt()) as f32;
        let rep = dm.hq / dm.hkv;
        let dv = dm.dv;
        let out = buf.typed_mut::<T>();
        // The keys row `i` of a plane may attend: all, or up to `i + Tk - Tq` when causal.
        let hi = |i: usize| if causal { (i + 1 + dm.tk).saturating_sub(dm.tq).min(dm.tk) } else { dm.tk };
        if dm.tq == 1 && rep > 1 {
            // One piece per (batch, key/value head): its query heads are the rows.
            par::chunks_init(out, rep * dv, Scratch::default, |scr, ci, o| {
                let (b, g) = (ci / dm.hkv, ci % dm.hkv);
                let h0 = b * dm.hq + g * rep;
                scr.hi.clear();
                scr.hi.resize(rep, hi(0));
                scr.mo.clear();
                if let Some(m) = &m {
                    scr.mo.extend((0..rep).map(|h| m.base[h0 + h]));
                }
                let rows = Rows { q: &q, k: &k, v: &v, q0: q.planes[h0], qstep: q.hs, kv: ci, mask: m.as_ref(), scale };
                attend(&dm, &rows, scr, o);
            });
        } else {
            par::chunks_init(out, BQ * dv, Scratch::default, |scr, ci, o| {
                let (r0, r1) = (ci * BQ, ci * BQ + o.len() / dv);
                let mut row = r0;
                // The piece's rows, one (batch, head) plane at a time.
                while row < r1 {
                    let bh = row / dm.tq;
                    let end = r1.min((bh + 1) * dm.tq);
                    let (i0, nr) = (row % dm.tq, end - row);
                    scr.hi.clear();
                    scr.hi.extend((i0..i0 + nr).map(hi));
                    scr.mo.clear();
                    if let Some(m) = &m {
                        scr.mo.extend((i0..i0 + nr).map(|i| m.base[bh] + i * m.sq));
                    }
                    let kv = (bh / dm.hq) * dm.hkv + (bh % dm.hq) / rep;
                    let q0 = q.planes[bh] + i0 * q.rs;
                    let rows = Rows { q: &q, k: &k, v: &v, q0, qstep: q.rs, kv, mask: m.as_ref(), scale };
                    attend(&dm, &rows, scr, &mut o[(row - r0) * dv..(end - r0) * dv]);
                    row = end;
                }
            });
        }
        Ok(Storage::contiguous(Buffer::Cpu(buf), dtype, shape))
    }

    /// The rows of `p` (as many as `out` holds, `dv` values each; their key limits and
    /// mask offsets in `scr.hi` and `scr.mo`) into `out`.
    fn attend<T: FloatElem<A = f32>>(dm: &Dims, p: &Rows<'_>, scr: &mut Scratch, out: &mut [T]) {
        let (d, dv) = (dm.d, dm.dv);
        let nr = out.len() / dv;
        let (q, k, v) = (p.q, p.k, p.v);
        let (k0, v0) = (k.planes[p.kv], v.planes[p.kv]);
        scr.m.clear();
        scr.m.resize(nr, f32::NEG_INFINITY);
        scr.l.clear();
        scr.l.resize(nr, 0.0);
        scr.acc.clear();
        scr.acc.resize(nr * dv, 0.0);
        scr.s.resize(nr * BK, 0.0);
        scr.lo.clear();
        scr.lo.resize(nr, 0);
        // A mask's leading and trailing keys that are `-inf` for a row leave it unchanged
        // (a cache's unwritten positions, a causal prefill's future): each row walks only
        // the span between its first and last attended key, and blocks outside every
        // row's span are skipped.
        if let Some(m) = p.mask {
            for i in 0..nr {
                let at = scr.mo[i];
                let attended = |j: &usize| m.values[at + j * m.sk] != f32::NEG_INFINITY;
                let hi = (0..scr.hi[i]).rev().find(attended).map_or(0, |j| j + 1);
                scr.lo[i] = (0..hi).find(attended).unwrap_or(hi);
                scr.hi[i] = hi;
            }
        }
        let max_hi = scr.hi.iter().copied().max().unwrap_or(0);
        let min_lo = scr.lo.iter().zip(&scr.hi).filter(|&(_, &h)| h > 0).map(|(&l, _)| l).min().unwrap_or(max_hi);
        for kb in (min_lo / BK * BK..max_hi).step_by(BK) {
            let nk = BK.min(max_hi - kb);
            // SAFETY: the scores are nr x nk at row stride BK inside `s` (nr * BK values);
            // the queries are nr rows of d at `q0 + i * qstep + c * cs`, and the keys nk
            // rows of d at `k0 + (kb + j) * rs + c * cs`, all inside their operands (the
            // offsets come from the layouts of the op's inputs).
            unsafe {
                gemm::gemm(
                    nr,
                    nk,
                    d,
                    scr.s.as_mut_ptr(),
                    1,
                    BK as isize,
                    false,
                    q.data.as_ptr().add(p.q0),
                    q.cs as isize,
                    p.qstep as isize,
                    k.data.as_ptr().add(k0 + kb * k.rs),
                    k.rs as isize,
                    k.cs as isize,
                    0.0,
                    p.scale,
                    false,
                    false,
                    false,
                    gemm::Parallelism::None,
                );
            }
            for i in 0..nr {
                let srow = &mut scr.s[i * BK..i * BK + nk];
                let lim = scr.hi[i].saturating_sub(kb).min(nk);
                let first = scr.lo[i].saturating_sub(kb).min(lim);
                if let Some(m) = p.mask {
                    let at = scr.mo[i] + kb * m.sk;
                    if m.sk == 1 {
                        srow[first..lim].iter_mut().zip(&m.values[at + first..at + lim]).for_each(|(x, &b)| *x += b);
                    } else {
                        for (j, x) in srow.iter_mut().enumerate().take(lim).skip(first) {
                            *x += m.values[at + j * m.sk];
                        }
                    }
                }
                srow[..first].fill(f32::NEG_INFINITY);
                srow[lim..].fill(f32::NEG_INFINITY);
                let mx = lanes_max(&srow[first..lim]);
                let m_old = scr.m[i];
                let m_new = if mx > m_old { mx } else { m_old };
                if m_new == f32::NEG_INFINITY {
                    srow.fill(0.0); // every key so far masked out
                    continue;
                }
                if m_new != m_old {
                    let corr = exp_f32(m_old - m_new);
                    scr.l[i] *= corr;
                    scr.acc[i * dv..(i + 1) * dv].iter_mut().for_each(|a| *a *= corr);
                }
                scr.l[i] += exp_sum(srow, m_new);
                scr.m[i] = m_new;
            }
            // SAFETY: `acc` is nr x dv (row stride dv), the probabilities nr x nk at row
            // stride BK, and the values nk rows of dv at `v0 + (kb + j) * rs + c * cs`,
            // inside the operand.
            unsafe {
                gemm::gemm(
                    nr,
                    dv,
                    nk,
                    scr.acc.as_mut_ptr(),
                    1,
                    dv as isize,
                    true,
                    scr.s.as_ptr(),
                    1,
                    BK as isize,
                    v.data.as_ptr().add(v0 + kb * v.rs),
                    v.cs as isize,
                    v.rs as isize,
                    1.0,
                    1.0,
                    false,
                    false,
                    false,
                    gemm::Parallelism::None,
                );
            }
        }
        for i in 0..nr {
            let l = scr.l[i];
            let o = &mut out[i * dv..(i + 1) * dv];
            if l == 0.0 {
                o.iter_mut().for_each(|x| *x = T::down(0.0));
            } else {
                let inv = 1.0 / l;
                for (x, &a) in o.iter_mut().zip(&scr.acc[i * dv..(i + 1) * dv]) {
                    *x = T::down(a * inv);
                }
            }
        }
    }
}
