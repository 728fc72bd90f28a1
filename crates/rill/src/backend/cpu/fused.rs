//! The CPU kernel of `Fused` nodes: an interpreter over chunks.
//!
//! The output is cut into chunks of [`CHUNK`] elements, processed in parallel on the
//! worker pool. For each chunk the program runs instruction by instruction over
//! chunk-sized scratch vectors (one per register, f32 or f64), so every inner loop is a
//! plain loop over slices. Loads gather the chunk's elements of a broadcast, possibly
//! strided input; the last register is converted into the output buffer.

use half::{bf16, f16};

use crate::backend::cpu::reduce::acc::Reducible;
use crate::backend::cpu::{CpuBuffer, par, reduce, strided};
use crate::backend::{Buffer, Storage};
use crate::dtype::{DType, Element};
use crate::error::{Error, Result};
use crate::primitives::fused::{FusedProgram, Inst, wide_lane};
use crate::primitives::{BinaryOp, ReduceOp, UnaryOp, each_binary, each_unary};
use crate::shape::{Layout, broadcast_shapes, numel};

/// Elements per chunk.
pub(crate) const CHUNK: usize = 1024;

/// One register's values over a chunk.
enum Lane {
    F(Vec<f32>),
    D(Vec<f64>),
}

/// Runs a fused program on CPU storages (see the module docs).
pub(crate) fn eval_fused(p: &FusedProgram, inputs: &[&Storage], shape: &[usize], dtype: DType) -> Result<Storage> {
    let layouts = prepare(p, inputs, shape, dtype)?;
    let n = numel(shape);
    let mut buf = CpuBuffer::alloc(dtype, n)?;
    if n == 0 {
        return Ok(Storage::contiguous(Buffer::Cpu(buf), dtype, shape));
    }
    crate::with_dtype!(dtype, O => fill(p, inputs, &layouts, buf.typed_mut::<O>()));
    Ok(Storage::contiguous(Buffer::Cpu(buf), dtype, shape))
}

/// Runs a fused program over `shape` into `out` (`shape`'s elements, row-major): the
/// loop of [`eval_fused`], for callers that own the output (a multi-tensor block).
pub(crate) fn eval_fused_into<O: Element>(
    p: &FusedProgram,
    inputs: &[&Storage],
    shape: &[usize],
    dtype: DType,
    out: &mut [O],
) -> Result<()> {
    let layouts = prepare(p, inputs, shape, dtype)?;
    if !out.is_empty() {
        fill(p, inputs, &layouts, out);
    }
    Ok(())
}

fn fill<O: Element>(p: &FusedProgram, inputs: &[&Storage], layouts: &[Layout], out: &mut [O]) {
    let n = out.len();
    par::chunks_init(
        out,
        CHUNK,
        || scratch(p, n.min(CHUNK)),
        |regs, c, o| run_chunk(p, inputs, layouts, c * CHUNK, o, regs),
    );
}

/// Runs a fused program over the broadcast of its inputs and reduces its values over
/// `axes` into `shape` (the broadcast shape with those axes set to 1) without storing
/// them: the reduction asks for the pieces it needs (see
/// [`crate::backend::cpu::reduce::reduce_blocks`]) and each is computed on demand, so
/// the result has the bits of the fused node followed by the `Reduce` node.
pub(crate) fn eval_fused_reduce(
    p: &FusedProgram,
    op: ReduceOp,
    axes: &[usize],
    inputs: &[&Storage],
    shape: &[usize],
    dtype: DType,
) -> Result<Storage> {
    let ins: Vec<&[usize]> = inputs.iter().map(|s| &s.layout.shape[..]).collect();
    let in_shape = crate::shape::broadcast_all("fused_reduce", &ins)?;
    let mut reduced = in_shape.clone();
    for &a in axes {
        match reduced.get_mut(a) {
            Some(d) => *d = 1,
            None => return Err(Error::invalid("fused_reduce", format!("axis {a} out of range for {in_shape:?}"))),
        }
    }
    if reduced != shape {
        return Err(Error::invalid("fused_reduce", format!("output shape {shape:?} does not fit {in_shape:?}")));
    }
    let form = reduce::block_form(&in_shape, axes);
    let (n_in, n_out) = (numel(&in_shape), numel(shape));
    let Some(form) = form.filter(|_| n_in > 0 && n_out > 0) else {
        // Empty inputs and reductions over separated axes: store the values, then reduce.
        let x = eval_fused(p, inputs, &in_shape, dtype)?;
        return reduce::reduce(op, &x, axes, shape, dtype);
    };
    let layouts = prepare(p, inputs, &in_shape, dtype)?;
    if op == ReduceOp::Mean {
        // Summed in the mean's computing type (the program's values widened exactly), as
        // the unfused mean sums, then divided and rounded once.
        let sum = if dtype == DType::F64 {
            wide_sum::<f64>(p, inputs, &layouts, form, shape, dtype)?
        } else {
            wide_sum::<f32>(p, inputs, &layouts, form, shape, dtype)?
        };
        return reduce::finish_mean(&sum, n_in / n_out, dtype);
    }
    let mut buf = CpuBuffer::alloc(dtype, n_out)?;
    crate::with_dtype!(dtype, O => {
        let src = reduce::Generated(|start: usize, out: &mut [O]| {
            let mut regs = scratch(p, out.len().min(CHUNK));
            for (k, o) in out.chunks_mut(CHUNK).enumerate() {
                run_chunk(p, inputs, &layouts, start + k * CHUNK, o, &mut regs);
            }
        });
        reduce::reduce_blocks::<O, _>(op, &src, form, buf.typed_mut::<O>());
    });
    Ok(Storage::contiguous(Buffer::Cpu(buf), dtype, shape))
}

/// The sum, in `W`, of `p`'s values (of `dtype`, widened exactly to `W`) over the block
/// form `form`, into a contiguous storage of `shape`.
fn wide_sum<W: Reducible + Element>(
    p: &FusedProgram,
    inputs: &[&Storage],
    layouts: &[Layout],
    form: (usize, usize, usize),
    shape: &[usize],
    dtype: DType,
) -> Result<Storage> {
    let mut buf = CpuBuffer::alloc(W::DTYPE, numel(shape))?;
    crate::with_dtype!(dtype, O => {
        let src = reduce::Generated(|start: usize, out: &mut [W]| {
            let mut regs = scratch(p, out.len().min(CHUNK));
            let mut vals = vec![O::zero(); out.len().min(CHUNK)];
            for (k, o) in out.chunks_mut(CHUNK).enumerate() {
                let v = &mut vals[..o.len()];
                run_chunk(p, inputs, layouts, start + k * CHUNK, v, &mut regs);
                for (w, x) in o.iter_mut().zip(v.iter()) {
                    *w = W::from_f64(x.to_f64());
                }
            }
        });
        reduce::reduce_blocks::<W, _>(ReduceOp::Sum, &src, form, buf.typed_mut::<W>());
    });
    Ok(Storage::contiguous(Buffer::Cpu(buf), W::DTYPE, shape))
}

/// Checks the inputs and output dtype of a fused program run over `shape`; returns each
/// input's layout broadcast to `shape` (merged).
fn prepare(p: &FusedProgram, inputs: &[&Storage], shape: &[usize], dtype: DType) -> Result<Vec<Layout>> {
    if !p.more.is_empty() {
        return Err(Error::invalid("fused", "a program of several outputs runs only in a multi-tensor block"));
    }
    if inputs.len() != p.input_dtypes.len() || dtype != p.output_dtype() {
        return Err(Error::invalid(
            "fused",
            format!(
                "program expects {} inputs and outputs {}; got {} inputs and output {dtype}",
                p.input_dtypes.len(),
                p.output_dtype(),
                inputs.len()
            ),
        ));
    }
    let mut layouts = Vec::with_capacity(inputs.len());
    for (k, (s, &d)) in inputs.iter().zip(&p.input_dtypes).enumerate() {
        let b = broadcast_shapes("fused", &s.layout.shape, shape)?;
        if s.dtype != d || b != shape {
            return Err(Error::invalid(
                "fused",
                format!("input {k} ({}, shape {:?}) does not fit ({d}, shape {shape:?})", s.dtype, s.layout.shape),
            ));
        }
        layouts.push(merged(&s.layout.broadcast_to(shape)));
    }
    Ok(layouts)
}

/// One lane of `len` values per instruction; `len` is the largest chunk it will see (a
/// small array gets small lanes: a long program's full-size lanes cost page faults).
fn scratch(p: &FusedProgram, len: usize) -> Vec<Lane> {
    p.dtypes.iter().map(|&d| if wide_lane(d) { Lane::D(vec![0.0; len]) } else { Lane::F(vec![0.0; len]) }).collect()
}

/// A broadcast layout with size-1 axes dropped and axes merged where the row-major walk
/// allows (same element order, fewer and longer runs).
fn merged(l: &Layout) -> Layout {
    let mut shape: Vec<usize> = Vec::new();
    let mut strides: Vec<isize> = Vec::new();
    for (&d, &s) in l.shape.iter().zip(&l.strides) {
        if d == 1 {
            continue;
        }
        if let (Some(ld), Some(ls)) = (shape.last_mut(), strides.last_mut())
            && *ls == s * d as isize
        {
            *ld *= d;
            *ls = s;
            continue;
        }
        shape.push(d);
        strides.push(s);
    }
    Layout { shape: shape.into(), strides: strides.into(), offset: l.offset }
}

/// Copies elements `[start, start + dst.len())` (row-major over `l.shape`) of `src`
/// through layout `l` into `dst`, converted with `conv`.
fn gather<T: Copy, L: Copy>(src: &[T], l: &Layout, start: usize, dst: &mut [L], conv: impl Fn(T) -> L) {
    let len = dst.len();
    let nd = l.shape.len();
    if len == 0 {
        return;
    }
    if nd == 0 || l.strides.iter().all(|&s| s == 0) {
        let v = conv(src[l.offset]);
        dst.iter_mut().for_each(|d| *d = v);
        return;
    }
    if nd == 1 && l.strides[0] == 1 {
        let s = &src[l.offset + start..l.offset + start + len];
        for (d, &x) in dst.iter_mut().zip(s) {
            *d = conv(x);
        }
        return;
    }
    // Odometer over the merged axes, one run along the last axis at a time.
    let mut idx = vec![0usize; nd];
    let mut rem = start;
    for ax in (0..nd).rev() {
        idx[ax] = rem % l.shape[ax];
        rem /= l.shape[ax];
    }
    let mut off = l.offset as isize + (0..nd).map(|ax| idx[ax] as isize * l.strides[ax]).sum::<isize>();
    let (last, st) = (nd - 1, l.strides[nd - 1]);
    let mut k = 0;
    while k < len {
        let run = (l.shape[last] - idx[last]).min(len - k);
        let d = &mut dst[k..k + run];
        match st {
            0 => {
                let v = conv(src[off as usize]);
                d.iter_mut().for_each(|x| *x = v);
            }
            1 => {
                for (x, &s) in d.iter_mut().zip(&src[off as usize..off as usize + run]) {
                    *x = conv(s);
                }
            }
            _ => {
                for (t, x) in d.iter_mut().enumerate() {
                    *x = conv(src[(off + t as isize * st) as usize]);
                }
            }
        }
        k += run;
        idx[last] += run;
        off += run as isize * st;
        let mut ax = last;
        while idx[ax] == l.shape[ax] && ax > 0 {
            off -= l.shape[ax] as isize * l.strides[ax];
            idx[ax] = 0;
            ax -= 1;
            idx[ax] += 1;
            off += l.strides[ax];
        }
    }
}

/// Rounds f32 values to what a register of dtype `d` holds.
fn round_f32(d: DType, v: &mut [f32]) {
    match d {
        DType::F16 => v.iter_mut().for_each(|x| *x = f16::from_f32(*x).to_f32()),
        DType::BF16 => v.iter_mut().for_each(|x| *x = bf16::from_f32(*x).to_f32()),
        _ => {}
    }
}

fn run_chunk<O: Element>(
    p: &FusedProgram,
    inputs: &[&Storage],
    layouts: &[Layout],
    start: usize,
    out: &mut [O],
    regs: &mut [Lane],
) {
    let len = out.len();
    for (i, inst) in p.insts.iter().enumerate() {
        let (prev, rest) = regs.split_at_mut(i);
        let d = p.dtypes[i];
        match (inst, &mut rest[0]) {
            (Inst::Load(k), lane) => {
                let (s, l) = (&inputs[*k], &layouts[*k]);
                crate::with_dtype!(s.dtype, T => {
                    let src = strided::buffer::<T>(s);
                    match lane {
                        Lane::F(v) => gather(src, l, start, &mut v[..len], |x: T| x.to_f32()),
                        Lane::D(v) => gather(src, l, start, &mut v[..len], |x: T| x.to_f64()),
                    }
                });
            }
            (Inst::Const(c), Lane::F(v)) => v[..len].fill(*c as f32),
            (Inst::Const(c), Lane::D(v)) => v[..len].fill(*c),
            (Inst::Unary(op, a), out) => unary(*op, &prev[*a], out, len, d),
            (Inst::Binary(op, a, b), out) => binary(*op, &prev[*a], &prev[*b], out, len, d),
            (Inst::Where(c, a, b), out) => {
                let Lane::F(c) = &prev[*c] else { return };
                match (&prev[*a], &prev[*b], out) {
                    (Lane::F(x), Lane::F(y), Lane::F(o)) => select(&c[..len], x, y, &mut o[..len]),
                    (Lane::D(x), Lane::D(y), Lane::D(o)) => select(&c[..len], x, y, &mut o[..len]),
                    _ => {}
                }
            }
            (Inst::Cast(a), out) => cast(&prev[*a], out, len, d),
        }
    }
    match &regs[p.out] {
        Lane::F(v) => out.iter_mut().zip(v).for_each(|(o, &x)| *o = O::from_f32(x)),
        Lane::D(v) => out.iter_mut().zip(v).for_each(|(o, &x)| *o = O::from_f64(x)),
    }
}

fn select<T: Copy>(c: &[f32], x: &[T], y: &[T], o: &mut [T]) {
    for i in 0..o.len() {
        o[i] = if c[i] != 0.0 { x[i] } else { y[i] };
    }
}

fn unary(op: UnaryOp, a: &Lane, out: &mut Lane, len: usize, d: DType) {
    if op == UnaryOp::LogicalNot {
        let Lane::F(o) = out else { return };
        match a {
            Lane::F(x) => o[..len].iter_mut().zip(x).for_each(|(o, &x)| *o = (x == 0.0) as u8 as f32),
            Lane::D(x) => o[..len].iter_mut().zip(x).for_each(|(o, &x)| *o = (x == 0.0) as u8 as f32),
        }
        return;
    }
    match (a, out) {
        (Lane::F(x), Lane::F(o)) => {
            let o = &mut o[..len];
            crate::backend::cpu::simd::unary_f32(op, x, o);
            round_f32(d, o);
        }
        (Lane::D(x), Lane::D(o)) => {
            each_unary!(op, K => o[..len].iter_mut().zip(x).for_each(|(o, &x)| *o = K.float(x)))
        }
        _ => {}
    }
}

fn zip2<A: Copy, O>(o: &mut [O], x: &[A], y: &[A], f: impl Fn(A, A) -> O) {
    for ((o, &a), &b) in o.iter_mut().zip(x).zip(y) {
        *o = f(a, b);
    }
}

fn binary(op: BinaryOp, a: &Lane, b: &Lane, out: &mut Lane, len: usize, d: DType) {
    // One loop per op over the op's scalar function (see `each_binary`); a predicate's
    // 0 or 1 lands in an f32 lane.
    match (a, b, out) {
        (Lane::F(x), Lane::F(y), Lane::F(o)) => {
            let o = &mut o[..len];
            each_binary!(op, K => zip2(o, &x[..len], &y[..len], |a, b| K.float(a, b)));
            round_f32(d, o);
        }
        (Lane::D(x), Lane::D(y), Lane::F(o)) if op.is_predicate() => {
            each_binary!(op, K => zip2(&mut o[..len], &x[..len], &y[..len], |a, b| K.float(a, b) as f32))
        }
        (Lane::D(x), Lane::D(y), Lane::D(o)) => {
            each_binary!(op, K => zip2(&mut o[..len], &x[..len], &y[..len], |a, b| K.float(a, b)))
        }
        _ => {}
    }
}

/// `astype` from a register into one of dtype `to`, with the rules of the cast kernel:
/// to bool is `!= 0`; otherwise rounded once to `to`, from the f32 lane (which holds f16,
/// bf16 and f32 values) or from the f64 lane (which holds f64 values and the integers
/// exactly).
fn cast(a: &Lane, out: &mut Lane, len: usize, to: DType) {
    match (a, out) {
        (Lane::F(x), Lane::F(o)) => {
            let o = &mut o[..len];
            if to == DType::Bool {
                o.iter_mut().zip(x).for_each(|(o, &x)| *o = (x != 0.0) as u8 as f32);
            } else {
                o.copy_from_slice(&x[..len]);
                round_f32(to, o);
            }
        }
        (Lane::D(x), Lane::F(o)) => {
            let o = &mut o[..len];
            match to {
                DType::Bool => o.iter_mut().zip(x).for_each(|(o, &x)| *o = (x != 0.0) as u8 as f32),
                DType::F16 => o.iter_mut().zip(x).for_each(|(o, &x)| *o = <f16 as Element>::from_f64(x).to_f32()),
                // `Element::from_f64`, not the inherent `bf16::from_f64`, which rounds twice.
                DType::BF16 => o.iter_mut().zip(x).for_each(|(o, &x)| *o = <bf16 as Element>::from_f64(x).to_f32()),
                _ => o.iter_mut().zip(x).for_each(|(o, &x)| *o = x as f32),
            }
        }
        (Lane::F(x), Lane::D(o)) => o[..len].iter_mut().zip(x).for_each(|(o, &x)| *o = x as f64),
        (Lane::D(x), Lane::D(o)) => o[..len].copy_from_slice(&x[..len]),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::primitives::fused::Builder;

    /// A fused cast from an integer or f64 register rounds once, as the cast kernel does:
    /// values just above a bf16 midpoint, which a detour through f32 rounds to the
    /// midpoint and then to even.
    #[test]
    fn casts_from_wide_lanes_round_once() {
        let cases: [(DType, &[f64]); 3] = [
            (DType::I32, &[33_685_505.0, -33_685_505.0, 16_777_217.0, 3.0]),
            (DType::U32, &[2_155_872_257.0, 4_294_967_295.0, 7.0]),
            (DType::F64, &[56_960.003, 1.0 + 1e-9, -2.5e38]),
        ];
        for (from, values) in cases {
            let x = crate::backend::cpu::from_f64_slice(values, from, &[values.len()]).unwrap();
            for to in [DType::BF16, DType::F16, DType::F32] {
                let mut b = Builder::default();
                let r = b.load(0, from);
                let c = b.push(Inst::Cast(r), to);
                let fused = eval_fused(&b.finish(c), &[&x], &[values.len()], to).unwrap();
                let eager = crate::backend::cpu::elementwise::cast(&x, to).unwrap();
                let (f, e) = (crate::backend::cpu::to_f64_vec(&fused), crate::backend::cpu::to_f64_vec(&eager));
                let bits = |v: &[f64]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                assert_eq!(bits(&f), bits(&e), "{from} to {to}: fused {f:?}, cast kernel {e:?}");
            }
        }
    }
}
