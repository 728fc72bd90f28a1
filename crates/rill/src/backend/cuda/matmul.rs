//! Matrix products through cuBLASLt (`cublasLtMatmul`, one product or a strided batch),
//! with cuBLAS (`cublasGemmEx`, `cublasGemmStridedBatchedEx`) where cuBLASLt cannot be
//! loaded, has no algorithm for a problem, or is turned off (`RILL_CUDA_BLASLT=0`): f32
//! (TF32 only when allowed), f16 and bf16 with f32 accumulation, f64. Row-major
//! `C = A @ B` is computed as the column-major `Cᵀ = Bᵀ Aᵀ`, so no transposition is
//! materialised.
//!
//! Each stream has its own cuBLAS and cuBLASLt handles and one 32 MiB workspace, made on
//! first use. cuBLASLt's algorithm for a problem (shape, dtype and the alignment of each
//! operand's address, which its kernels assume) is chosen once by its heuristic and kept
//! with the descriptors in the stream's plan cache. cuBLASLt is the default because its
//! choice was at least as fast as `cublasGemmEx` in same-call comparisons (`rill bench
//! matmul` with and without `RILL_CUDA_BLASLT=0`, docs/PERFORMANCE.md).
//! `RILL_CUDA_LT_ALGO=i` takes the heuristic's `i`-th candidate instead of its first, for
//! measuring the alternatives.

use std::collections::HashMap;
use std::ffi::c_void;
use std::panic::{AssertUnwindSafe, catch_unwind};

use cudarc::cublas::sys as cbsys;
use cudarc::cublaslt::sys as lt;

use crate::backend::Storage;
use crate::dtype::DType;
use crate::error::Result;
use crate::primitives::fused::LtAct;
use crate::shape::{Dims, Layout, contiguous_strides};
use crate::sync::OnceLock;
use crate::sync::atomic::{AtomicBool, Ordering::Relaxed};

use super::buffer::{cuda_of, new_storage};
use super::driver::{Driver, GpuStream};
use super::handles::Blas;

static TF32: AtomicBool = AtomicBool::new(false);

/// Bytes of the per-stream cuBLAS workspace.
const WORKSPACE: usize = 32 << 20;

/// Allows f32 matrix products on GPUs to use TF32 tensor cores (faster, about 10 bits of
/// mantissa in the products). Off by default; `RILL_CUDA_TF32=1` also turns it on.
/// Returns the previous setting.
pub fn set_allow_tf32(allow: bool) -> bool {
    TF32.swap(allow, Relaxed)
}

fn tf32() -> bool {
    TF32.load(Relaxed) || std::env::var("RILL_CUDA_TF32").as_deref() == Ok("1")
}

pub(crate) fn matmul(cs: &GpuStream<'_>, a: &Storage, b: &Storage, shape: &[usize], dtype: DType) -> Result<Storage> {
    product(cs, a, b, shape, dtype, None, None)?.ok_or_else(|| super::unsupported("matmul", "no product was computed"))
}

/// `a @ b` written into `out`, a contiguous view (any offset) of the product's shape and
/// dtype, for callers that place products inside a larger buffer. The inner dimension
/// must not be 0 (nothing would be written).
pub(crate) fn matmul_into(cs: &GpuStream<'_>, a: &Storage, b: &Storage, out: &Storage) -> Result<()> {
    let k = a.layout.shape.last().copied().unwrap_or(0);
    if k == 0 || !out.layout.is_contiguous() {
        return Err(super::unsupported("matmul", "a product into a buffer needs k > 0 and a contiguous output"));
    }
    let shape = out.layout.shape.clone();
    product(cs, a, b, &shape, out.dtype, None, Some(out))?
        .map(|_| ())
        .ok_or_else(|| super::unsupported("matmul", "no product was computed"))
}

/// What cuBLASLt applies after a product (`primitives::fused::LtEpilogue` for one call).
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
struct Epi {
    act: LtAct,
    bias: bool,
    residual: bool,
}

/// An epilogue and its operands for one product.
struct EpiArgs<'s> {
    epi: Epi,
    bias: Option<&'s Storage>,
    residual: Option<&'s Storage>,
    alpha: f32,
}

/// `act(alpha a @ b + residual + bias)` in one `cublasLtMatmul` (the bias a row of `n`
/// elements added to every row, the residual through the C matrix with beta = 1), or
/// `None` when cuBLASLt cannot: not a single f32/f16/bf16 product of nonempty operands,
/// an operand of another dtype or layout than contiguous, cuBLASLt off or missing, or no
/// algorithm with this epilogue. The caller then runs the product and its program.
#[allow(clippy::too_many_arguments)]
pub(crate) fn matmul_epilogue(
    cs: &GpuStream<'_>,
    a: &Storage,
    b: &Storage,
    (bias, residual): (Option<&Storage>, Option<&Storage>),
    act: LtAct,
    alpha: f32,
    shape: &[usize],
    dtype: DType,
) -> Result<Option<Storage>> {
    let nd = shape.len();
    if !matches!(dtype, DType::F32 | DType::F16 | DType::BF16) || nd < 2 || !lt_enabled() {
        return Ok(None);
    }
    let (m, n) = (shape[nd - 2], shape[nd - 1]);
    let k = a.layout.shape.last().copied().unwrap_or(0);
    let batch: usize = shape[..nd - 2].iter().product();
    let fits = |s: &Storage, count: usize| {
        s.dtype == dtype && s.layout.is_contiguous() && crate::shape::numel(&s.layout.shape) == count
    };
    if batch != 1 || m * n * k == 0 || !bias.is_none_or(|s| fits(s, n)) || !residual.is_none_or(|s| fits(s, m * n)) {
        return Ok(None);
    }
    // The bias is read with vector loads: an address off 16 bytes (a sliced bias) takes
    // the generated kernel instead.
    let elem = |s: &Storage| cuda_of(s).map(|x| x.ptr()).unwrap_or(0) + (s.layout.offset * dtype.size()) as u64;
    if bias.is_some_and(|s| elem(s) % 16 != 0) {
        return Ok(None);
    }
    let epi = Epi { act, bias: bias.is_some(), residual: residual.is_some() };
    product(cs, a, b, shape, dtype, Some(EpiArgs { epi, bias, residual, alpha }), None)
}

/// The product `a @ b` into a new storage, or into `into` (a contiguous view of `shape`)
/// when given (with `epi` through cuBLASLt, or `None` when it cannot apply it).
fn product(
    cs: &GpuStream<'_>,
    a: &Storage,
    b: &Storage,
    shape: &[usize],
    dtype: DType,
    epi: Option<EpiArgs<'_>>,
    into: Option<&Storage>,
) -> Result<Option<Storage>> {
    use cbsys::cublasComputeType_t as C;
    use cbsys::cudaDataType_t as T;
    let (ty, compute) = match dtype {
        DType::F32 => (T::CUDA_R_32F, if tf32() { C::CUBLAS_COMPUTE_32F_FAST_TF32 } else { C::CUBLAS_COMPUTE_32F }),
        DType::F16 => (T::CUDA_R_16F, C::CUBLAS_COMPUTE_32F),
        DType::BF16 => (T::CUDA_R_16BF, C::CUBLAS_COMPUTE_32F),
        DType::F64 => (T::CUDA_R_64F, C::CUBLAS_COMPUTE_64F),
        d => return Err(super::unsupported("matmul", format!("dtype {d} (cuBLAS handles f16, bf16, f32, f64)"))),
    };
    let nd = shape.len();
    let (m, n) = (shape[nd - 2], shape[nd - 1]);
    let k = a.layout.shape[a.layout.shape.len() - 1];
    let batch: usize = shape[..nd - 2].iter().product();
    if m * n * batch == 0 {
        return into.map_or_else(|| new_storage(cs, dtype, shape), |o| Ok(o.clone())).map(Some);
    }
    if k == 0 && into.is_none() {
        return super::elementwise::full(cs, shape, dtype, 0.0).map(Some);
    }
    // A batch of products sharing one right operand (a matrix broadcast over the batch)
    // with a row-major left operand is one product of batch x m rows: the broadcast
    // operand is not copied per batch, and one large product replaces many small ones.
    let shared = Some(OperandView { trans: false, ld: n as i64, stride: 0 });
    if batch > 1 && epi.is_none() && a.layout.is_contiguous() && operand_view(&b.layout) == shared {
        let rows = batch * m;
        let view = |s: &Storage, r: usize, c: usize| {
            let shape = [r, c];
            s.with_layout(Layout {
                shape: Dims::from_slice(&shape),
                strides: contiguous_strides(&shape),
                offset: s.layout.offset,
            })
        };
        let into = into.map(|o| view(o, rows, n));
        let folded = product(cs, &view(a, rows, k), &view(b, k, n), &[rows, n], dtype, None, into.as_ref())?;
        return Ok(folded.map(|c| c.with_layout(Layout { offset: c.layout.offset, ..Layout::contiguous(shape) })));
    }
    let too_big = [m, n, k, batch].iter().any(|&v| v > i32::MAX as usize);
    if too_big {
        return Err(super::unsupported("matmul", format!("dimensions beyond i32 for shape {shape:?}")));
    }
    // Transposed, row-sliced and uniformly batched operands are read in place (a
    // leading dimension, a transpose flag and a batch stride); any other layout is copied.
    let viewed = |s: &Storage| -> Result<(Storage, OperandView)> {
        if let Some(v) = operand_view(&s.layout) {
            return Ok((s.clone(), v));
        }
        let c = super::elementwise::copy(cs, s)?;
        let v = operand_view(&c.layout).ok_or_else(|| super::unsupported("matmul", "operand layout"))?;
        Ok((c, v))
    };
    let ((a, va), (b, vb)) = (viewed(a)?, viewed(b)?);
    let out = match into {
        Some(o) => o.clone(),
        None => new_storage(cs, dtype, shape)?,
    };
    let size = dtype.size() as u64;
    let addr = |s: &Storage| cuda_of(s).map(|x| x.ptr()).unwrap_or(0) + s.layout.offset as u64 * size;
    let (pa, pb, pc) = (addr(&a), addr(&b), addr(&out));
    let epi = epi.map(|e| EpiPtrs {
        epi: e.epi,
        bias: e.bias.map(addr).unwrap_or(0),
        c: e.residual.map(addr).unwrap_or(pc),
        alpha: e.alpha,
    });
    let r = catch_unwind(AssertUnwindSafe(|| -> Result<bool> {
        // Loaded at process start or when the device was probed; never here (`libs.rs`).
        if !super::libs::loaded(super::libs::Lib::Cublas) {
            return Err(super::unsupported("matmul", "cuBLAS (libcublas) was not found"));
        }
        let _ = cs.bind();
        let mut g = cs.blas(cs.driver()).lock();
        let fresh = g.is_none();
        if fresh {
            let h = cs.driver().cublas_create_handle().map_err(|e| super::backend_err("matmul", e))?;
            // A workspace of its own lets cuBLAS pick its fastest Hopper kernels (the
            // default one is small); without memory for it, cuBLAS runs without.
            // SAFETY: scratch memory, written by cuBLAS before it is read.
            let ws = unsafe { cs.stream().alloc::<u8>(WORKSPACE) }.ok();
            let mut ws_ptr = 0;
            if let Some(w) = &ws {
                ws_ptr = cudarc::driver::DevicePtr::device_ptr(w, cs.stream()).0;
                // SAFETY: the workspace outlives the handle (both freed together).
                unsafe { cs.driver().cublas_set_workspace(h, ws_ptr, WORKSPACE) };
            }
            let workspace = std::mem::ManuallyDrop::new(ws);
            *g = Some(Blas { handle: h, workspace, ws_ptr, lt: Default::default() });
        }
        let Some(blas) = g.as_mut() else { return Err(super::unsupported("matmul", "no cuBLAS handle")) };
        let tf32 = compute == C::CUBLAS_COMPUTE_32F_FAST_TF32;
        let p = Problem { sizes: Sizes { dtype, tf32, m, n, k, batch, a: va, b: vb }, pa, pb, pc, epi };
        // SAFETY: a plan is made for this problem and used with the stream's workspace;
        // the addresses and views cover the [batch, m, k] and [batch, k, n] operands and
        // the contiguous [batch, m, n] output (and the epilogue's bias of n and residual
        // of m x n elements).
        let res = match lt_plan(cs.driver(), blas, &p) {
            Some((h, plan)) => unsafe { lt_matmul(cs, h, blas.ws_ptr, &plan, &p) }.map(|_| true),
            None if p.epi.is_some() => Ok(false),
            None => unsafe { gemm_ex(cs, blas.handle, &p, ty, compute) }.map(|_| true),
        };
        if fresh {
            // Statics cuBLAS and cuBLASLt built for this handle and its first call (see
            // `libs::after_first_use`).
            super::libs::after_first_use(super::libs::Lib::Cublas);
            super::libs::after_first_use(super::libs::Lib::CublasLt);
        }
        res
    }));
    let done = r.unwrap_or_else(|_| Err(super::unsupported("matmul", "cuBLAS could not be loaded")))?;
    Ok(done.then_some(out))
}

/// How cuBLAS reads a `[.., rows, cols]` operand where it lies: row-major (`trans`
/// false) or column-major (a transposed view) with leading dimension `ld`, and `stride`
/// elements from one batch matrix to the next (0: one matrix shared by the batch).
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub(crate) struct OperandView {
    pub trans: bool,
    pub ld: i64,
    pub stride: i64,
}

/// The in-place view of an operand of layout `l`, or `None` when cuBLAS cannot read it
/// (neither axis of the matrix of unit stride, a leading dimension that overlaps or
/// passes i32, or batch axes that are not one uniform stride).
pub(crate) fn operand_view(l: &Layout) -> Option<OperandView> {
    let nd = l.shape.len();
    if nd < 2 {
        return None;
    }
    let (r, c) = (l.shape[nd - 2], l.shape[nd - 1]);
    let (sr, sc) = (l.strides[nd - 2], l.strides[nd - 1]);
    let fits = |ld: isize, min: usize| ld >= min.max(1) as isize && ld <= i32::MAX as isize;
    // A single row or column has no leading dimension of its own: the dense one is used.
    let (trans, ld) = if (c == 1 || sc == 1) && (r == 1 || fits(sr, c)) {
        (false, if r == 1 { c.max(1) as isize } else { sr })
    } else if (r == 1 || sr == 1) && (c == 1 || fits(sc, r)) {
        (true, if c == 1 { r.max(1) as isize } else { sc })
    } else {
        return None;
    };
    // The batch axes (size-1 ones aside) must step by one stride: the innermost's stride
    // times the count of the axes inside each.
    let (mut stride, mut inner) = (None::<isize>, 1isize);
    for i in (0..nd - 2).rev().filter(|&i| l.shape[i] != 1) {
        let s = *stride.get_or_insert(l.strides[i]);
        if s < 0 || l.strides[i] != s * inner {
            return None;
        }
        inner *= l.shape[i] as isize;
    }
    Some(OperandView { trans, ld: ld as i64, stride: stride.unwrap_or(0) as i64 })
}

/// Runs a small product of every dtype, one and batched, through cuBLASLt and cuBLAS on a
/// stream of its own, while `dev` initialises: the statics the libraries construct on a
/// handle's first calls are built now, before the exit hook is registered again, never by
/// the program's first matmul (see `libs.rs`). Failures are ignored: the first real
/// product reports them.
pub(crate) fn warm_up(d: Driver<'_>, dev: &crate::sync::Arc<super::device::DeviceState>) {
    let _ = catch_unwind(AssertUnwindSafe(|| -> Result<()> {
        let handle = super::handles::new_stream_on(dev.clone())?;
        let cs = &GpuStream::new(d, &handle);
        for dtype in [DType::F32, DType::BF16, DType::F16, DType::F64] {
            for shape in [&[16usize, 16][..], &[2, 16, 16]] {
                // The operands' values do not matter (never read back).
                let a = new_storage(cs, dtype, shape)?;
                let b = new_storage(cs, dtype, shape)?;
                matmul(cs, &a, &b, shape, dtype)?;
            }
        }
        cs.synchronize()
    }));
}

/// The shape and types of a product `C[batch, m, n] = A[batch, m, k] @ B[batch, k, n]`.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
struct Sizes {
    dtype: DType,
    tf32: bool,
    m: usize,
    n: usize,
    k: usize,
    batch: usize,
    a: OperandView,
    b: OperandView,
}

/// One product of operands at device addresses `pa` and `pb` (read through the views
/// in `sizes`) into the contiguous output at `pc`.
struct Problem {
    sizes: Sizes,
    pa: u64,
    pb: u64,
    pc: u64,
    epi: Option<EpiPtrs>,
}

/// An epilogue with its bias address (0: none) and the C matrix's (the residual, or the
/// output when there is none).
#[derive(Clone, Copy)]
struct EpiPtrs {
    epi: Epi,
    bias: u64,
    c: u64,
    alpha: f32,
}

impl Problem {
    /// `alpha = 1` and `beta = 0` in the scale type (f64 for f64, f32 otherwise), as
    /// pointers valid while `s` lives.
    fn scales(&self, s: &Scales) -> (*const c_void, *const c_void) {
        if self.sizes.dtype == DType::F64 {
            ((&s.one64 as *const f64).cast(), (&s.zero64 as *const f64).cast())
        } else {
            ((&s.one32 as *const f32).cast(), (&s.zero32 as *const f32).cast())
        }
    }
}

struct Scales {
    one32: f32,
    zero32: f32,
    one64: f64,
    zero64: f64,
}

static SCALES: Scales = Scales { one32: 1.0, zero32: 0.0, one64: 1.0, zero64: 0.0 };

/// The product through `cublasGemmEx` (one product) or `cublasGemmStridedBatchedEx`.
///
/// # Safety
/// `h` is the stream's cuBLAS handle; the addresses cover the problem's operands.
unsafe fn gemm_ex(
    cs: &GpuStream<'_>,
    h: cbsys::cublasHandle_t,
    p: &Problem,
    ty: cbsys::cudaDataType_t,
    compute: cbsys::cublasComputeType_t,
) -> Result<()> {
    let op = |t: bool| if t { cbsys::cublasOperation_t::CUBLAS_OP_T } else { cbsys::cublasOperation_t::CUBLAS_OP_N };
    let (alpha, beta) = p.scales(&SCALES);
    let (pa, pb, pc) = (p.pa as *const c_void, p.pb as *const c_void, p.pc as *mut c_void);
    let Sizes { m, n, k, batch, a, b, .. } = p.sizes;
    let sc = (m * n) as i64;
    let (m, n, k) = (m as i32, n as i32, k as i32);
    let (lda, ldb) = (a.ld as i32, b.ld as i32);
    let algo = cbsys::cublasGemmAlgo_t::CUBLAS_GEMM_DFALT;
    // SAFETY: forwarded from the caller; row-major C = A @ B is column-major Cᵀ = Bᵀ Aᵀ,
    // and a transposed (column-major) operand is read with op T.
    unsafe {
        let d = cs.driver();
        d.cublas_set_stream(h, cs.stream().cu_stream()).map_err(|e| super::backend_err("matmul", e))?;
        let ops = (op(b.trans), op(a.trans));
        if batch == 1 {
            // One product: cuBLAS picks faster kernels through this entry point than
            // through the strided-batched one with a batch of one (`bench/kernel_lab.py
            // blas` times both).
            d.cublas_gemm_ex(h, ops, n, m, k, alpha, (pb, ldb), (pa, lda), beta, (pc, n), ty, compute, algo)
        } else {
            d.cublas_gemm_strided_batched_ex(
                h,
                ops,
                n,
                m,
                k,
                alpha,
                (pb, ldb, b.stride),
                (pa, lda, a.stride),
                beta,
                (pc, n, sc),
                batch as i32,
                ty,
                compute,
                algo,
            )
        }
    }
    .map_err(|e| super::backend_err("matmul", e))
}

/// What a cuBLASLt plan is chosen for: the problem's shape and types and the alignment of
/// its operands (cuBLASLt's kernels assume the alignment they were chosen with).
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
struct LtKey {
    sizes: Sizes,
    /// A, B, D and C (the residual, when it is not D).
    align: [u32; 4],
    epi: Option<Epi>,
}

/// Descriptors and the algorithm cuBLASLt's heuristic chose for one [`LtKey`] (plain
/// handles: the stream's [`LtState`] owns and destroys them).
#[derive(Clone, Copy)]
pub(crate) struct LtPlan {
    desc: lt::cublasLtMatmulDesc_t,
    layouts: [lt::cublasLtMatrixLayout_t; 3],
    algo: lt::cublasLtMatmulAlgo_t,
    workspace: usize,
}

/// Plans kept per stream; the cache is emptied when it is full.
const LT_PLANS: usize = 64;

/// A stream's cuBLASLt state: the handle (`None` before the first product, null when
/// cuBLASLt could not be loaded) and its plans (`None`: the heuristic found no algorithm,
/// use `cublasGemmEx`).
#[derive(Default)]
pub(crate) struct LtState {
    handle: Option<lt::cublasLtHandle_t>,
    plans: HashMap<LtKey, Option<LtPlan>>,
}

impl LtState {
    /// Destroys the plans and the handle.
    ///
    /// # Safety
    /// Called once, before shutdown began, with no product of this stream left to enqueue.
    pub unsafe fn destroy(&mut self, d: Driver<'_>) {
        for plan in self.plans.drain().filter_map(|(_, p)| p) {
            // SAFETY: forwarded; each descriptor is destroyed once.
            unsafe { destroy_plan(d, plan) };
        }
        if let Some(h) = self.handle.take().filter(|h| !h.is_null()) {
            // SAFETY: forwarded.
            unsafe { d.lt_destroy_handle(h) };
        }
    }
}

unsafe fn destroy_plan(d: Driver<'_>, p: LtPlan) {
    // SAFETY: the caller's: each descriptor is destroyed once.
    unsafe {
        d.lt_destroy_matmul_desc(p.desc);
        for l in p.layouts.into_iter().filter(|l| !l.is_null()) {
            d.lt_destroy_matrix_layout(l);
        }
    }
}

/// cuBLASLt is used unless `RILL_CUDA_BLASLT=0`.
fn lt_enabled() -> bool {
    static ON: OnceLock<bool> = OnceLock::new();
    *ON.get_or_init(|| std::env::var("RILL_CUDA_BLASLT").as_deref() != Ok("0"))
}

/// The largest power of two (at most 256) dividing `addr`.
fn alignment(addr: u64) -> u32 {
    if addr == 0 { 256 } else { (1u64 << addr.trailing_zeros().min(8)) as u32 }
}

/// The cuBLASLt plan for `p` on `cs`, made on first use; `None` when cuBLASLt is off,
/// missing, or has no algorithm for `p` (then `cublasGemmEx` computes it).
fn lt_plan(d: Driver<'_>, blas: &mut Blas, p: &Problem) -> Option<(lt::cublasLtHandle_t, LtPlan)> {
    if !lt_enabled() {
        return None;
    }
    let st = &mut blas.lt;
    let h = *st.handle.get_or_insert_with(|| {
        if !super::libs::loaded(super::libs::Lib::CublasLt) {
            return std::ptr::null_mut();
        }
        let h = d.lt_create_handle().unwrap_or(std::ptr::null_mut());
        // cuBLASLt constructed statics for the handle (see `libs::after_first_use`).
        super::libs::after_first_use(super::libs::Lib::CublasLt);
        h
    });
    if h.is_null() {
        return None;
    }
    let pc_in = p.epi.map(|e| e.c).unwrap_or(p.pc);
    let align = [alignment(p.pa), alignment(p.pb), alignment(p.pc), alignment(pc_in)];
    let key = LtKey { sizes: p.sizes, align, epi: p.epi.map(|e| e.epi) };
    if !st.plans.contains_key(&key) {
        if st.plans.len() >= LT_PLANS {
            for plan in st.plans.drain().filter_map(|(_, p)| p) {
                // SAFETY: the plans are this stream's, and no enqueued product needs its
                // descriptors after `cublasLtMatmul` returned.
                unsafe { destroy_plan(d, plan) };
            }
        }
        let ws = if blas.workspace.is_some() { WORKSPACE } else { 0 };
        // SAFETY: `h` is a live cuBLASLt handle.
        let plan = unsafe { make_plan(d, h, &key, ws) };
        st.plans.insert(key, plan);
    }
    st.plans.get(&key).copied().flatten().map(|plan| (h, plan))
}

/// Builds the descriptors for `key` and asks the heuristic for its best algorithm within
/// `workspace` bytes. `RILL_CUDA_LT_ALGO=i` takes the heuristic's `i`-th choice instead
/// (for measuring the alternatives).
///
/// # Safety
/// `h` is a live cuBLASLt handle.
unsafe fn make_plan(drv: Driver<'_>, h: lt::cublasLtHandle_t, key: &LtKey, workspace: usize) -> Option<LtPlan> {
    use lt::cublasComputeType_t as C;
    use lt::cudaDataType_t as T;
    let d = key.sizes;
    let (ty, compute, scale) = match d.dtype {
        DType::F32 => {
            (T::CUDA_R_32F, if d.tf32 { C::CUBLAS_COMPUTE_32F_FAST_TF32 } else { C::CUBLAS_COMPUTE_32F }, T::CUDA_R_32F)
        }
        DType::F16 => (T::CUDA_R_16F, C::CUBLAS_COMPUTE_32F, T::CUDA_R_32F),
        DType::BF16 => (T::CUDA_R_16BF, C::CUBLAS_COMPUTE_32F, T::CUDA_R_32F),
        DType::F64 => (T::CUDA_R_64F, C::CUBLAS_COMPUTE_64F, T::CUDA_R_64F),
        _ => return None,
    };
    let (m, n, k) = (d.m as u64, d.n as u64, d.k as u64);
    let desc = drv.lt_create_matmul_desc(compute, scale).ok()?;
    // Column-major: Cᵀ (n x m) = Bᵀ (n x k) Aᵀ (k x m); cuBLASLt's A is our B. A
    // transposed operand is stored the other way round and read with op T.
    let stored = |v: OperandView, rows: u64, cols: u64| if v.trans { (cols, rows) } else { (rows, cols) };
    let ((ra, ca), (rb, cb)) = (stored(d.b, n, k), stored(d.a, k, m));
    let dims = [(ra, ca, d.b.ld, d.b.stride), (rb, cb, d.a.ld, d.a.stride), (n, m, n as i64, (m * n) as i64)];
    let mut layouts = [std::ptr::null_mut(); 3];
    let mut ok = true;
    for (slot, &(rows, cols, ld, stride)) in layouts.iter_mut().zip(&dims) {
        match drv.lt_create_matrix_layout(ty, rows, cols, ld) {
            Ok(l) => {
                *slot = l;
                if d.batch > 1 {
                    let count = d.batch as i32;
                    use lt::cublasLtMatrixLayoutAttribute_t as L;
                    // SAFETY: live layout; the buffers are the attributes' types.
                    unsafe {
                        ok &= drv
                            .lt_set_matrix_layout_attribute(
                                l,
                                L::CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT,
                                (&count as *const i32).cast(),
                                4,
                            )
                            .is_ok();
                        ok &= drv
                            .lt_set_matrix_layout_attribute(
                                l,
                                L::CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET,
                                (&stride as *const i64).cast(),
                                8,
                            )
                            .is_ok();
                    }
                }
            }
            Err(_) => ok = false,
        }
    }
    for (attr, t) in [
        (lt::cublasLtMatmulDescAttributes_t::CUBLASLT_MATMUL_DESC_TRANSA, d.b.trans),
        (lt::cublasLtMatmulDescAttributes_t::CUBLASLT_MATMUL_DESC_TRANSB, d.a.trans),
    ] {
        let op = cbsys::cublasOperation_t::CUBLAS_OP_T as i32;
        if t {
            // SAFETY: live descriptor; the value is the attribute's 4-byte enum.
            ok &= unsafe { drv.lt_set_matmul_desc_attribute(desc, attr, (&op as *const i32).cast(), 4) }.is_ok();
        }
    }
    if let Some(e) = key.epi {
        use lt::cublasLtEpilogue_t as E;
        let v = match (e.act, e.bias) {
            (LtAct::None, false) => E::CUBLASLT_EPILOGUE_DEFAULT,
            (LtAct::None, true) => E::CUBLASLT_EPILOGUE_BIAS,
            (LtAct::Relu, false) => E::CUBLASLT_EPILOGUE_RELU,
            (LtAct::Relu, true) => E::CUBLASLT_EPILOGUE_RELU_BIAS,
            (LtAct::GeluTanh, false) => E::CUBLASLT_EPILOGUE_GELU,
            (LtAct::GeluTanh, true) => E::CUBLASLT_EPILOGUE_GELU_BIAS,
        };
        let v = v as u32;
        use lt::cublasLtMatmulDescAttributes_t as A;
        // SAFETY: live descriptor; the value is the attribute's 4-byte enum.
        ok &= unsafe {
            drv.lt_set_matmul_desc_attribute(desc, A::CUBLASLT_MATMUL_DESC_EPILOGUE, (&v as *const u32).cast(), 4)
        }
        .is_ok();
    }
    let plan = LtPlan { desc, layouts, algo: lt::cublasLtMatmulAlgo_t { data: [0; 8] }, workspace: 0 };
    // SAFETY: `h` is live (the caller's) and so are the descriptors just made.
    let chosen = if ok { unsafe { heuristic(drv, h, &plan, key, workspace) } } else { None };
    match chosen {
        Some((algo, ws)) => Some(LtPlan { algo, workspace: ws, ..plan }),
        None => {
            // SAFETY: the descriptors were made above and are not used again.
            unsafe { destroy_plan(drv, plan) };
            None
        }
    }
}

/// Heuristic results asked for.
const LT_CANDIDATES: usize = 8;

/// The heuristic's choice for `plan`'s descriptors: (algorithm, workspace bytes).
///
/// # Safety
/// `h` and the plan's descriptors are live.
unsafe fn heuristic(
    d: Driver<'_>,
    h: lt::cublasLtHandle_t,
    plan: &LtPlan,
    key: &LtKey,
    workspace: usize,
) -> Option<(lt::cublasLtMatmulAlgo_t, usize)> {
    use lt::cublasLtMatmulPreferenceAttributes_t as P;
    let pref = d.lt_create_matmul_pref().ok()?;
    let ws = workspace as u64;
    // cuBLASLt's A, B and C/D: our B, A and C.
    let [aa, ab, ad, ac] = key.align;
    let attrs: [(P, u64, usize); 5] = [
        (P::CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, ws, 8),
        (P::CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, ab as u64, 4),
        (P::CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, aa as u64, 4),
        (P::CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, ac as u64, 4),
        (P::CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, ad as u64, 4),
    ];
    let mut ok = true;
    for (attr, v, size) in attrs {
        let v32 = v as u32;
        let ptr: *const c_void = if size == 8 { (&v as *const u64).cast() } else { (&v32 as *const u32).cast() };
        // SAFETY: live preference; the value has the attribute's size.
        ok &= unsafe { d.lt_set_matmul_pref_attribute(pref, attr, ptr, size) }.is_ok();
    }
    let mut results = [lt::cublasLtMatmulHeuristicResult_t {
        algo: lt::cublasLtMatmulAlgo_t { data: [0; 8] },
        workspaceSize: 0,
        state: lt::cublasStatus_t::CUBLAS_STATUS_NOT_INITIALIZED,
        wavesCount: 0.0,
        reserved: [0; 4],
    }; LT_CANDIDATES];
    // SAFETY: live descriptors.
    let got = if ok { unsafe { d.lt_heuristic(h, plan.desc, plan.layouts, pref, &mut results) } } else { None };
    // SAFETY: made above, destroyed once.
    unsafe { d.lt_destroy_matmul_pref(pref) };
    let count = got?;
    let usable: Vec<_> = results[..count]
        .iter()
        .filter(|r| r.state == lt::cublasStatus_t::CUBLAS_STATUS_SUCCESS && r.workspaceSize <= workspace)
        .collect();
    let pick = std::env::var("RILL_CUDA_LT_ALGO").ok().and_then(|v| v.parse::<usize>().ok()).unwrap_or(0);
    let r = usable.get(pick).or(usable.first())?;
    Some((r.algo, r.workspaceSize))
}

/// The product through `cublasLtMatmul` with `plan`.
///
/// # Safety
/// `h` and `plan` are the stream's, made for `p`; `ws` is the stream's workspace (or 0
/// when the plan needs none); the addresses cover the operands.
unsafe fn lt_matmul(cs: &GpuStream<'_>, h: lt::cublasLtHandle_t, ws: u64, plan: &LtPlan, p: &Problem) -> Result<()> {
    let (mut alpha, mut beta) = p.scales(&SCALES);
    let [la, lb, lc] = plan.layouts;
    let stream = cs.stream().cu_stream();
    let mut c_in = p.pc;
    // Read by cublasLtMatmul before it returns (host pointer mode).
    let scale = p.epi.map(|e| e.alpha).unwrap_or(1.0);
    if let Some(e) = p.epi {
        alpha = (&scale as *const f32).cast();
        if e.epi.bias {
            use lt::cublasLtMatmulDescAttributes_t as A;
            let ptr = e.bias;
            // SAFETY: the plan's live descriptor (this stream's, used by one thread at a
            // time under the handle's lock); the value is the attribute's pointer.
            unsafe {
                cs.driver().lt_set_matmul_desc_attribute(
                    plan.desc,
                    A::CUBLASLT_MATMUL_DESC_BIAS_POINTER,
                    (&ptr as *const u64).cast(),
                    8,
                )
            }
            .map_err(|e| super::backend_err("matmul", e))?;
        }
        if e.epi.residual {
            c_in = e.c;
            beta = (&SCALES.one32 as *const f32).cast();
        }
    }
    // SAFETY: forwarded from the caller; C is D unless a residual is added (beta one).
    unsafe {
        cs.driver().lt_matmul(
            h,
            plan.desc,
            alpha,
            beta,
            (p.pb as *const c_void, la),
            (p.pa as *const c_void, lb),
            (c_in as *const c_void, p.pc as *mut c_void, lc),
            &plan.algo,
            (ws, plan.workspace),
            stream,
        )
    }
    .map_err(|e| super::backend_err("matmul", e))
}

#[cfg(test)]
mod tests {
    use super::{OperandView, operand_view};
    use crate::shape::{Dims, Layout};

    fn layout(shape: &[usize], strides: &[isize]) -> Layout {
        Layout { shape: Dims::from_slice(shape), strides: strides.iter().copied().collect(), offset: 0 }
    }

    fn view(trans: bool, ld: i64, stride: i64) -> Option<OperandView> {
        Some(OperandView { trans, ld, stride })
    }

    #[test]
    fn operand_views_of_common_layouts() {
        // Contiguous, a batch of them, and a transposed batch.
        assert_eq!(operand_view(&Layout::contiguous(&[3, 4])), view(false, 4, 0));
        assert_eq!(operand_view(&Layout::contiguous(&[2, 5, 3, 4])), view(false, 4, 12));
        assert_eq!(operand_view(&Layout::contiguous(&[2, 3, 4]).permute(&[0, 2, 1])), view(true, 4, 12));
        // Rows sliced from rows of 10, and their transpose.
        assert_eq!(operand_view(&layout(&[3, 4], &[10, 1])), view(false, 10, 0));
        assert_eq!(operand_view(&layout(&[4, 3], &[1, 10])), view(true, 10, 0));
        // One matrix broadcast over the batch; size-1 batch axes take any stride.
        assert_eq!(operand_view(&layout(&[6, 3, 4], &[0, 4, 1])), view(false, 4, 0));
        assert_eq!(operand_view(&layout(&[1, 6, 1, 3, 4], &[99, 12, 7, 4, 1])), view(false, 4, 12));
        // A single row or column has the dense leading dimension whatever its stride.
        assert_eq!(operand_view(&layout(&[1, 4], &[0, 1])), view(false, 4, 0));
        assert_eq!(operand_view(&layout(&[4, 1], &[1, 0])), view(false, 1, 0));
        assert_eq!(operand_view(&layout(&[5, 1], &[1, 3])), view(false, 1, 0));
    }

    /// Generated views (permuted, sliced with steps, broadcast, size-1 axes): wherever
    /// `operand_view` accepts one, the address it implies for every element (batch `b`,
    /// row `i`, column `j`) is the layout's own, and the leading dimension is one cuBLAS
    /// accepts.
    #[test]
    fn operand_views_address_what_the_layouts_name() {
        let mut g = crate::backend::cuda::map::tests::Gen(0x2545_f491_4f6c_dd1d);
        let mut below = |n: usize| g.below(n);
        let mut accepted = 0;
        for _ in 0..4000 {
            let nd = 2 + below(3);
            let base: Vec<usize> = (0..nd).map(|_| [1, 2, 3, 5][below(4)]).collect();
            let mut l = Layout::contiguous(&base);
            // A random axis order, then a slice (start, step, shorter) of some axes.
            let mut perm: Vec<usize> = (0..nd).collect();
            for i in (1..nd).rev() {
                perm.swap(i, below(i + 1));
            }
            l = l.permute(&perm);
            for a in 0..nd {
                if below(3) == 0 && l.shape[a] > 1 {
                    let start = below(l.shape[a]);
                    let step = 1 + below(2);
                    let len = (l.shape[a] - start).div_ceil(step);
                    l.offset += start * l.strides[a] as usize;
                    l.strides[a] *= step as isize;
                    l.shape[a] = len;
                }
            }
            // Some batch axes broadcast (stride 0) to a larger size.
            for a in 0..nd - 2 {
                if below(4) == 0 {
                    l.strides[a] = 0;
                    l.shape[a] = 1 + below(3);
                }
            }
            let Some(v) = operand_view(&l) else { continue };
            accepted += 1;
            let (r, c) = (l.shape[nd - 2], l.shape[nd - 1]);
            assert!(v.ld >= if v.trans { r.max(1) } else { c.max(1) } as i64, "{l:?}: {v:?}");
            let batch: usize = l.shape[..nd - 2].iter().product();
            for b in 0..batch {
                // The batch index's own offset, from the layout.
                let (mut rest, mut boff) = (b, l.offset as i64);
                for a in (0..nd - 2).rev() {
                    boff += (rest % l.shape[a]) as i64 * l.strides[a] as i64;
                    rest /= l.shape[a];
                }
                for i in 0..r {
                    for j in 0..c {
                        let want = boff + i as i64 * l.strides[nd - 2] as i64 + j as i64 * l.strides[nd - 1] as i64;
                        let inner = if v.trans { i as i64 + j as i64 * v.ld } else { i as i64 * v.ld + j as i64 };
                        let got = l.offset as i64 + b as i64 * v.stride + inner;
                        assert_eq!(got, want, "{l:?}: {v:?} at batch {b}, ({i}, {j})");
                    }
                }
            }
        }
        assert!(accepted > 1000, "only {accepted} layouts accepted");
    }

    #[test]
    fn layouts_cublas_cannot_read_are_refused() {
        // Heads split from [B, T, H, D]: batch strides T*H*D and D are not one stride.
        let heads = Layout::contiguous(&[2, 8, 3, 4]).permute(&[0, 2, 1, 3]);
        assert_eq!(operand_view(&heads), None);
        // Overlapping rows, a column step, reversed rows, a negative batch stride.
        assert_eq!(operand_view(&layout(&[3, 4], &[2, 1])), None);
        assert_eq!(operand_view(&layout(&[3, 4], &[8, 2])), None);
        assert_eq!(operand_view(&layout(&[3, 4], &[-4, 1])), None);
        assert_eq!(operand_view(&layout(&[2, 3, 4], &[-12, 4, 1])), None);
        // A broadcast row (stride 0 across rows) is no leading dimension.
        assert_eq!(operand_view(&layout(&[3, 4], &[0, 1])), None);
        // One batch axis broadcast inside a full one.
        assert_eq!(operand_view(&layout(&[2, 3, 4, 5], &[20, 0, 5, 1])), None);
    }
}
