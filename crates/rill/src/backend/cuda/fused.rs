//! `Fused` nodes: the kernel source comes from [`crate::backend::cuda::fused_src::cuda_source`]
//! for the launch [`Plan`] that the operands' layouts allow (linear with 16-byte vectors,
//! linear with row/column/scalar broadcasts, or strided over merged axes), behind the
//! backend's prelude. Each source is compiled once per device (the NVRTC cache is keyed
//! by the full source, which names every C type, register dtype and access), and the
//! loaded function is memoised in the program itself under (device, plan), so a replayed
//! call generates no source and formats no key: it merges axes, picks the plan, finds
//! the function and launches.
//!
//! `FusedReduce` nodes ([`fused_reduce`]) run as one reduction module of `reduce.rs` whose
//! elements are the program's values ([`crate::backend::cuda::fused_src::reduce_read`]), so the
//! values are never stored, when they read as rows: the kept axes merge into one row
//! index and the reduced axes into one column index for every input, each input
//! contiguous (stride 1) or broadcast (stride 0) along the reduced axes, any stride
//! between rows. That covers reducing the last axes (`sum(axis=-1)`, full reductions)
//! with inputs that are contiguous, row vectors, columns or scalars, in every launch
//! shape (a warp per row, a block per row, rows split over blocks). Other layouts
//! (reduced axes not last, broadcasts that do not merge with the reduced axes, transposed
//! inputs, empty arrays) store the values with the fused kernel and reduce them with the
//! reduction kernels. The module is memoised in the program under (device, op, each
//! input's read), and compiled once per device under its full source.

use cudarc::driver::{CudaFunction, LaunchConfig};

use crate::backend::Storage;
use crate::backend::cuda::fused_src::{CUDA_MAX_DIMS, FUSED_BLOCK, Operand, Plan, cuda_source, plan, reduce_read};
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::primitives::ReduceOp;
use crate::primitives::fused::FusedProgram;
use crate::runtime::stats;
use crate::shape::broadcast_all;
use crate::shape::{Layout, Strides, broadcast_shapes, numel};
use crate::sync::atomic::Ordering::Relaxed;

use super::buffer::{cuda_of, new_storage};
use super::driver::GpuStream;
use super::launch::Launch;
use super::map::merge_dims;
use super::nvrtc;
use super::reduce::{self, Elems};
use super::source::PRELUDE;

/// The kernel's name in every generated module.
const KERNEL: &str = "rill_fused";

/// A 1-D launch of `units` work items, one per thread (the kernels loop with a grid
/// stride only past 2^30 blocks): faster for the 8-op chain than a smaller grid whose
/// threads loop (`bench/kernel_lab.py chain` times both).
fn grid(units: usize) -> LaunchConfig {
    nvrtc::grid_1d(units, FUSED_BLOCK)
}

/// The full source of `p`'s kernel for `plan` (prelude included).
fn source(p: &FusedProgram, plan: &Plan) -> String {
    format!("{PRELUDE}\n{}", cuda_source(p, plan, KERNEL))
}

/// The compiled kernel of `p` for `plan` on this stream's device: memoised in `p`.
fn kernel(cs: &GpuStream<'_>, p: &FusedProgram, plan: &Plan) -> Result<CudaFunction> {
    let mut key = Vec::with_capacity(8 + p.input_dtypes().len());
    key.extend((cs.dev.ordinal as u32).to_le_bytes());
    plan.key_bytes(&mut key);
    p.kernels.get_or_try_insert(&key, || {
        let src = source(p, plan);
        nvrtc::function(cs.driver(), &cs.dev, &format!("fused:{src}"), KERNEL, || src)
    })
}

/// Checks that `inputs` fit `p` run over `shape` with output `dtype`.
fn check(p: &FusedProgram, inputs: &[Storage], shape: &[usize], dtype: DType) -> Result<()> {
    if !p.more.is_empty() {
        return Err(Error::invalid("fused", "a program of several outputs runs only in a multi-tensor block"));
    }
    if inputs.len() != p.input_dtypes().len() || dtype != p.output_dtype() {
        return Err(Error::invalid(
            "fused",
            format!(
                "program expects {} inputs and outputs {}; got {} inputs and output {dtype}",
                p.input_dtypes().len(),
                p.output_dtype(),
                inputs.len()
            ),
        ));
    }
    for (k, (s, &d)) in inputs.iter().zip(p.input_dtypes()).enumerate() {
        if s.dtype != d
            || (s.layout.shape.as_slice() != shape && broadcast_shapes("fused", &s.layout.shape, shape)? != shape)
        {
            return Err(Error::invalid(
                "fused",
                format!("input {k} ({}, shape {:?}) does not fit ({d}, shape {shape:?})", s.dtype, s.layout.shape),
            ));
        }
    }
    Ok(())
}

/// Runs the fused program `p` over `inputs` (broadcast to `shape`) into a new contiguous
/// storage of `dtype`.
pub(crate) fn fused(
    cs: &GpuStream<'_>,
    p: &FusedProgram,
    inputs: &[Storage],
    shape: &[usize],
    dtype: DType,
) -> Result<Storage> {
    check(p, inputs, shape, dtype)?;
    let out = new_storage(cs, dtype, shape)?;
    let n: usize = shape.iter().product();
    if n == 0 {
        return Ok(out);
    }
    // Merge axes over the output (contiguous) and every input's broadcast strides.
    let lays: Vec<Layout> = inputs.iter().map(|s| s.layout.broadcast_to(shape)).collect();
    let mut strides: Vec<Strides> = Vec::with_capacity(1 + inputs.len());
    strides.push(Layout::contiguous(shape).strides);
    strides.extend(lays.iter().map(|l| l.strides.clone()));
    let (dims, mst) = merge_dims(shape, &strides);
    let out_ptr = cuda_of(&out).map(|b| b.ptr()).unwrap_or(0);
    let ptrs: Vec<u64> = inputs
        .iter()
        .zip(&lays)
        .map(|(s, l)| cuda_of(s).map(|b| b.ptr()).unwrap_or(0) + (l.offset * s.dtype.size()) as u64)
        .collect();
    let ops: Vec<Operand<'_>> = (0..inputs.len())
        .map(|k| Operand { strides: &mst[1 + k], addr: ptrs[k], size: inputs[k].dtype.size() })
        .collect();
    let plan = plan(&dims, &ops, out_ptr, dtype.size(), n);
    if let Plan::Strided { ndim, .. } = plan
        && ndim > CUDA_MAX_DIMS
    {
        return Err(super::unsupported(
            "fused",
            format!("inputs of rank {ndim} after merging axes (at most {CUDA_MAX_DIMS})"),
        ));
    }
    let f = kernel(cs, p, &plan)?;
    let cfg = grid(plan.units(n));
    let (n32, n64) = (n as u32, n as u64);
    let cols = if dims.len() == 2 { dims[1] } else { 1 };
    let (cols32, cols64) = (cols as u32, cols as u64);
    // Strided parameters: `{ I shape[D]; S strides[K1][D]; }` flattened (one width).
    let (p64, p32) = match plan {
        Plan::Strided { ndim, wide } => {
            let k1 = inputs.len().max(1);
            let mut v = vec![0i64; ndim * (1 + k1)];
            for (d, &s) in dims.iter().enumerate() {
                v[d] = s as i64;
                for k in 0..inputs.len() {
                    v[ndim * (1 + k) + d] = mst[1 + k][d] as i64;
                }
            }
            // The plan checked that every value fits 32 bits when not wide.
            let v32: Vec<i32> = if wide { Vec::new() } else { v.iter().map(|&x| x as i32).collect() };
            (v, v32)
        }
        Plan::Linear { .. } => (Vec::new(), Vec::new()),
    };
    let _ = cs.bind();
    let mut b = Launch::new(&f);
    b.arg(&out_ptr);
    for ptr in &ptrs {
        b.arg(ptr);
    }
    match plan {
        Plan::Linear { wide: true, .. } => b.arg(&n64).arg(&cols64),
        Plan::Linear { wide: false, .. } => b.arg(&n32).arg(&cols32),
        // The driver copies as many bytes as the kernel's parameter struct declares from
        // the address of the first element.
        Plan::Strided { wide: true, .. } => b.arg(&n64).arg_slice(&p64),
        Plan::Strided { wide: false, .. } => b.arg(&n32).arg_slice(&p32),
    };
    // SAFETY: the arguments match the generated signature for `plan` (pointers, n, then
    // cols or the parameter struct laid out in `p32`/`p64`, alive until the launch
    // returns); every offset the plan produces lies inside its input (views are checked
    // by the op layer), and vector plans were chosen only for aligned pointers.
    unsafe { b.launch(cs, cfg) }.map_err(|e| super::backend_err("launch", e))?;
    Ok(out)
}

/// A fused reduction read as rows: each row is the reduced axes (merged), the rows are
/// the kept axes (merged) in output order; input `k` is read at `r * row_strides[k] + j`
/// when `along[k]`, else at `r * row_strides[k]` (broadcast along the row).
#[derive(Debug, PartialEq, Eq)]
struct Rows {
    rows: usize,
    cols: usize,
    row_strides: Vec<isize>,
    along: Vec<bool>,
}

/// The rows of a reduction of `shape` over `axes` whose inputs have the (broadcast)
/// `strides`, or None when an input needs more than one stride for the kept or the
/// reduced axes, or steps by other than 0 or 1 element along the reduced ones.
fn rows_of(shape: &[usize], axes: &[usize], strides: &[Strides]) -> Option<Rows> {
    // (elements, one stride per input) of the kept (`reduced == false`) or reduced axes.
    let side = |reduced: bool| -> Option<(usize, Vec<isize>)> {
        let ax: Vec<usize> = (0..shape.len()).filter(|a| axes.contains(a) == reduced).collect();
        let sh: Vec<usize> = ax.iter().map(|&a| shape[a]).collect();
        let st: Vec<Vec<isize>> = strides.iter().map(|s| ax.iter().map(|&a| s[a]).collect()).collect();
        let (dims, st) = merge_dims(&sh, &st);
        match dims.len() {
            0 => Some((1, vec![0; strides.len()])),
            1 => Some((dims[0], st.iter().map(|s| s[0]).collect())),
            _ => None,
        }
    };
    let (rows, row_strides) = side(false)?;
    let (cols, col_strides) = side(true)?;
    if col_strides.iter().any(|&c| c != 0 && c != 1) {
        return None;
    }
    let along = col_strides.iter().map(|&c| c == 1).collect();
    Some(Rows { rows, cols, row_strides, along })
}

/// Whether the values of `shape`, stored contiguously and reduced over `axes`, are read by
/// [`reduce::reduce`] as rows, row `r` starting at element `r * cols`: the reduced axes
/// (size-1 axes aside) come after the kept ones. Computed rows are combined in that
/// reading's order, so only then does a computed reduction give the stored one's bits.
fn rows_when_stored(shape: &[usize], axes: &[usize]) -> bool {
    let l = Layout::contiguous(shape);
    matches!(reduce::form(shape, &l.strides, axes), Some(f) if f.read() == Some(reduce::Read::Rows) && (f.ni == 1 || f.red == 1))
}

/// Runs a `FusedReduce` node: `p`'s values over the broadcast of `inputs`, reduced by `op`
/// over `axes` into a new contiguous storage of `shape` (the reduced axes kept as 1).
///
/// When the reduced values read as rows ([`rows_of`]: the reduced axes are contiguous or
/// broadcast for every input, and the kept and reduced axes each merge into one) and the
/// stored values would be reduced as rows too ([`rows_when_stored`]), one reduction module
/// whose elements are the program's values runs, with the stored reduction's plan and
/// order, so the values are never stored and the result has the bits of the unfused
/// reduction. Otherwise (reduced axes not last, not mergeable strides, or no elements)
/// the values are stored by [`fused`] and reduced by [`reduce::reduce`].
pub(crate) fn fused_reduce(
    cs: &GpuStream<'_>,
    p: &FusedProgram,
    op: ReduceOp,
    axes: &[usize],
    inputs: &[Storage],
    shape: &[usize],
    dtype: DType,
) -> Result<Storage> {
    let ins: Vec<&[usize]> = inputs.iter().map(|s| &s.layout.shape[..]).collect();
    let in_shape = broadcast_all("fused_reduce", &ins)?;
    let d = p.output_dtype();
    check(p, inputs, &in_shape, d)?;
    let lays: Vec<Layout> = inputs.iter().map(|s| s.layout.broadcast_to(&in_shape)).collect();
    let strides: Vec<Strides> = lays.iter().map(|l| l.strides.clone()).collect();
    let simple = dtype == d
        && numel(&in_shape) > 0
        && axes.iter().all(|&a| a < in_shape.len())
        && rows_when_stored(&in_shape, axes);
    let Some(g) = rows_of(&in_shape, axes, &strides).filter(|g| simple && g.rows == numel(shape)) else {
        let x = fused(cs, p, inputs, &in_shape, d)?;
        return reduce::reduce(cs, op, &x, axes, shape);
    };
    let out = new_storage(cs, d, shape)?;
    let po = cuda_of(&out).map(|b| b.ptr()).unwrap_or(0);
    let ptrs: Vec<u64> = inputs
        .iter()
        .zip(&lays)
        .map(|(s, l)| cuda_of(s).map(|b| b.ptr()).unwrap_or(0) + (l.offset * s.dtype.size()) as u64)
        .collect();
    let ints: Vec<i64> = g.row_strides.iter().map(|&s| s as i64).collect();
    // The program fixes the dtypes; the op and the inputs' reads complete the source.
    let mut key = Vec::with_capacity(6 + inputs.len());
    key.extend((cs.dev.ordinal as u32).to_le_bytes());
    key.extend([2, op as u8]);
    key.extend(g.along.iter().map(|&a| a as u8));
    let fs: [CudaFunction; 2] = p.kernels.get_or_try_insert(&key, || {
        let mut src = Some(reduce::source(op, d, &Elems::Computed(&reduce_read(p, &g.along))));
        let nkey = format!("fused_reduce:{}", src.as_deref().unwrap_or_default());
        let mut load = |name| nvrtc::function(cs.driver(), &cs.dev, &nkey, name, || src.take().unwrap_or_default());
        Ok::<_, Error>([load(reduce::KERNELS[0])?, load(reduce::KERNELS[1])?])
    })?;
    let mut get = |name: &str| match reduce::KERNELS.iter().position(|&k| k == name) {
        Some(i) => Ok(fs[i].clone()),
        None => Err(Error::backend("fused_reduce", format!("no kernel {name}"))),
    };
    let how = reduce::plan_stored(g.rows, g.cols, d, cs.dev.sms as usize);
    // The data parameters are the inputs (advanced by their offsets) and their row
    // strides, as `reduce_read` declares them; every index `r * rs + j` (j < cols only
    // where the input steps along the row) lies inside its input's broadcast layout.
    reduce::launch(cs, &mut get, d, how, po, &ptrs, &ints, g.rows, g.cols)?;
    stats::FUSED_REDUCE_KERNELS.fetch_add(1, Relaxed);
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::cuda::fused_src::Access;
    use crate::backend::cuda::fused_src::tests::f16_program;
    use crate::primitives::fused::{Builder, Inst};
    use crate::primitives::{BinaryOp, UnaryOp};

    /// The chain, `sigmoid((tanh(a*b + 1)*0.5 + a)^2 - b)`, in `d`.
    fn chain(d: DType) -> FusedProgram {
        let mut b = Builder::default();
        let x = b.load(0, d);
        let y = b.load(1, d);
        let m = b.push(Inst::Binary(BinaryOp::Mul, x, y), d);
        let one = b.constant(1.0, d);
        let s = b.push(Inst::Binary(BinaryOp::Add, m, one), d);
        let t = b.push(Inst::Unary(UnaryOp::Tanh, s), d);
        let half = b.constant(0.5, d);
        let h = b.push(Inst::Binary(BinaryOp::Mul, t, half), d);
        let z = b.push(Inst::Binary(BinaryOp::Add, h, x), d);
        let q = b.push(Inst::Binary(BinaryOp::Mul, z, z), d);
        let w = b.push(Inst::Binary(BinaryOp::Sub, q, y), d);
        let o = b.push(Inst::Unary(UnaryOp::Sigmoid, w), d);
        b.finish(o)
    }

    /// `gelu(h + bias) + res` in `d`.
    fn bias_gelu(d: DType) -> FusedProgram {
        let mut b = Builder::default();
        let h = b.load(0, d);
        let bias = b.load(1, d);
        let s = b.push(Inst::Binary(BinaryOp::Add, h, bias), d);
        let g = b.push(Inst::Unary(UnaryOp::Gelu, s), d);
        let r = b.load(2, d);
        let o = b.push(Inst::Binary(BinaryOp::Add, g, r), d);
        b.finish(o)
    }

    /// Integer and bool inputs: `where(i < j, cast(i) * x, x) >= 0` (bool output).
    fn mixed() -> FusedProgram {
        let mut b = Builder::default();
        let i = b.load(0, DType::I32);
        let j = b.load(1, DType::I32);
        let x = b.load(2, DType::F32);
        let c = b.push(Inst::Binary(BinaryOp::Less, i, j), DType::Bool);
        let f = b.push(Inst::Cast(i), DType::F32);
        let m = b.push(Inst::Binary(BinaryOp::Mul, f, x), DType::F32);
        let w = b.push(Inst::Where(c, m, x), DType::F32);
        let z = b.constant(0.0, DType::F32);
        let o = b.push(Inst::Binary(BinaryOp::GreaterEqual, w, z), DType::Bool);
        let u = b.load(3, DType::U8);
        let nu = b.push(Inst::Unary(UnaryOp::LogicalNot, u), DType::Bool);
        let a = b.push(Inst::Binary(BinaryOp::LogicalAnd, o, nu), DType::Bool);
        b.finish(a)
    }

    /// The plans worth compiling for a program with `k` inputs: vector and scalar linear
    /// loops with every access, 32- and 64-bit, and strided ones.
    fn plans(p: &FusedProgram) -> Vec<Plan> {
        use Access::*;
        let k = p.input_dtypes().len();
        let widest = p.input_dtypes().iter().chain([&p.output_dtype()]).map(|d| d.size()).max().unwrap_or(1);
        let mut mixed = vec![Contig; k];
        mixed[k - 1] = Row;
        mixed[0] = Scalar;
        if k > 2 {
            mixed[1] = Col;
        }
        vec![
            Plan::Linear { access: vec![Contig; k], vec: 1, wide: false },
            Plan::Linear { access: vec![Contig; k], vec: 16 / widest, wide: false },
            Plan::Linear { access: mixed.clone(), vec: 16 / widest, wide: true },
            Plan::Linear { access: mixed, vec: 1, wide: false },
            Plan::Strided { ndim: 3, wide: false },
            Plan::Strided { ndim: CUDA_MAX_DIMS, wide: true },
        ]
    }

    #[test]
    fn generated_kernels_compile_for_sm90() {
        let mut progs: Vec<(String, FusedProgram)> = Vec::new();
        for d in [DType::F32, DType::F16, DType::BF16, DType::F64] {
            progs.push((format!("chain_{d}"), chain(d)));
            progs.push((format!("bias_gelu_{d}"), bias_gelu(d)));
        }
        progs.push(("f16_mixed".into(), f16_program()));
        progs.push(("int_bool".into(), mixed()));
        // Every unary and binary op, each in f32 and f64, in one program per dtype.
        for d in [DType::F32, DType::F64, DType::BF16] {
            let mut b = Builder::default();
            let x = b.load(0, d);
            let y = b.load(1, d);
            let mut acc = x;
            for op in UnaryOp::ALL.into_iter().filter(|&o| o != UnaryOp::LogicalNot) {
                let u = b.push(Inst::Unary(op, acc), d);
                acc = b.push(Inst::Binary(BinaryOp::Add, u, y), d);
            }
            for op in BinaryOp::ALL {
                let o = if op.is_predicate() { DType::Bool } else { d };
                let r = b.push(Inst::Binary(op, acc, y), o);
                acc = if o == DType::Bool { b.push(Inst::Where(r, acc, y), d) } else { r };
            }
            let c = b.push(Inst::Cast(acc), DType::F64);
            let e = b.push(Inst::Cast(c), d);
            progs.push((format!("all_ops_{d}"), b.finish(e)));
        }
        for (name, prog) in &progs {
            for plan in plans(prog) {
                let src = source(prog, &plan);
                if !nvrtc::check_compiles(&format!("fused_{name}_{plan:?}"), &src) {
                    return;
                }
            }
        }
    }

    /// The reduction modules of fused programs compile: every op over programs in each
    /// float dtype (and one with a bool output), with inputs read along the row or once
    /// per row, and a program without inputs.
    #[test]
    fn fused_reduction_kernels_compile_for_sm90() {
        let mut progs: Vec<(String, FusedProgram, Vec<Vec<bool>>)> = Vec::new();
        for d in [DType::F32, DType::F16, DType::BF16, DType::F64] {
            progs.push((format!("chain_{d}"), chain(d), vec![vec![true, true], vec![true, false]]));
            progs.push((format!("bias_gelu_{d}"), bias_gelu(d), vec![vec![true, false, true], vec![false; 3]]));
        }
        progs.push(("f16_mixed".into(), f16_program(), vec![vec![false, true]]));
        progs.push(("int_bool".into(), mixed(), vec![vec![true, false, true, true]]));
        let mut b = Builder::default();
        let c = b.constant(2.0, DType::F32);
        let e = b.push(Inst::Unary(UnaryOp::Exp, c), DType::F32);
        progs.push(("no_inputs".into(), b.finish(e), vec![vec![]]));
        for (name, prog, reads) in &progs {
            for along in reads {
                let mean = prog.output_dtype().is_float().then_some(ReduceOp::Mean);
                for op in [ReduceOp::Sum, ReduceOp::Prod, ReduceOp::Max, ReduceOp::Min].into_iter().chain(mean) {
                    let read = reduce_read(prog, along);
                    let src = reduce::source(op, prog.output_dtype(), &Elems::Computed(&read));
                    if !nvrtc::check_compiles(&format!("fused_reduce_{name}_{op:?}_{along:?}"), &src) {
                        return;
                    }
                }
            }
        }
    }

    #[test]
    fn reductions_read_as_rows() {
        let rows = |shape: &[usize], axes: &[usize], st: &[&[isize]]| {
            rows_of(shape, axes, &st.iter().map(|s| Strides::from_slice(s)).collect::<Vec<_>>())
                .map(|g| (g.rows, g.cols, g.row_strides, g.along))
        };
        // sum(axis=-1) of a [64, 33] value with a row vector `b`.
        assert_eq!(rows(&[64, 33], &[1], &[&[33, 1], &[0, 1]]), Some((64, 33, vec![33, 0], vec![true, true])));
        // A full reduction of a 3-d value; a column broadcast (constant along each row).
        assert_eq!(rows(&[4, 5, 6], &[0, 1, 2], &[&[30, 6, 1]]), Some((1, 120, vec![0], vec![true])));
        assert_eq!(rows(&[8, 50], &[1], &[&[1, 0], &[50, 1]]), Some((8, 50, vec![1, 50], vec![false, true])));
        // Trailing axes [1, 2] of [2, 3, 4] merge; kept leading axes merge too.
        assert_eq!(rows(&[2, 3, 4, 5], &[2, 3], &[&[60, 20, 5, 1]]), Some((6, 20, vec![20], vec![true])));
        // Size-1 axes anywhere are ignored; a sliced input keeps its row stride.
        assert_eq!(rows(&[7, 1, 9], &[2], &[&[16, 16, 1]]), Some((7, 9, vec![16], vec![true])));
        // Reduced axes not last: the values would be read down columns.
        assert_eq!(rows(&[300, 200], &[0], &[&[200, 1]]), None);
        assert_eq!(rows(&[5, 4000, 7], &[1], &[&[28000, 7, 1]]), None);
        // Separated reduced axes, and kept axes that do not merge.
        assert_eq!(rows(&[4, 5, 6], &[0, 2], &[&[30, 6, 1]]), None);
        assert_eq!(rows(&[4, 5, 6], &[2], &[&[60, 6, 1]]), None);
        // A transposed input.
        assert_eq!(rows(&[8, 30], &[1], &[&[1, 8]]), None);
        // A value broadcast along the reduced axes only: read once per row.
        assert_eq!(rows(&[5, 300, 200], &[1, 2], &[&[1, 0, 0]]), Some((5, 60000, vec![1], vec![false])));
    }

    #[test]
    fn memo_is_keyed_and_not_part_of_the_value() {
        let p = chain(DType::F32);
        let a: std::result::Result<u32, ()> = p.kernels.get_or_try_insert(b"one", || Ok(1));
        let b: std::result::Result<u32, ()> = p.kernels.get_or_try_insert(b"one", || Ok(2));
        let c: std::result::Result<u32, ()> = p.kernels.get_or_try_insert(b"two", || Err(()));
        assert_eq!((a, b, c), (Ok(1), Ok(1), Err(())));
        assert_eq!(p.kernels.len(), 1);
        let q = p.clone();
        assert_eq!(q.kernels.len(), 0);
        assert_eq!(p, q);
    }
}
