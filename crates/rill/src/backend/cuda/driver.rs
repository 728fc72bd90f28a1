//! The driver token: every call into the CUDA driver, NVRTC, cuBLAS or cuBLASLt needs a
//! [`Driver`], and a `Driver` exists only while its thread holds a pass of the backend gate.
//!
//! Why: shutdown closes the gate and waits for every thread inside before the process may
//! tear the libraries down (`runtime/gate.rs`). A call made without a pass is one it does
//! not wait for. The token turns "every call site takes a pass" into a type check:
//! - a `Driver<'p>` is made only by [`BackendPass::driver`] and borrows the pass, so it
//!   cannot outlive it; it is neither `Send` nor `Sync`, like the pass (a pool thread that
//!   compiles takes its own);
//! - the raw cudarc handles (a stream handle's CUDA stream, a device's context, its
//!   transfer stream, a stream's cuBLAS state) are reachable only through accessors that
//!   take one ([`GpuStream`] carries one with a stream handle, for the kernels);
//! - cudarc's free functions (`cudarc::driver::result`/`sys`, `cudarc::nvrtc`, `cudarc::cublas`,
//!   `cudarc::cublaslt`) are called only here, as methods of the token: `clippy.toml`
//!   refuses them in every other file (`disallowed-methods`, allowed for this module only).
//!
//! A pass nested in one the thread already holds (`lifecycle::backend_pass`) is not tied
//! to the outer pass by the types; taking a token from it is where
//! `stats().backend_calls_after_shutdown` still counts a call the gate did not wait for.
//!
//! Calls reached through methods of cudarc's own objects (`CudaStream::synchronize`, a
//! `CudaSlice`'s stream-ordered free when it drops, `CudaModule::load_function`) need no
//! wrapper here: the objects are only reachable through the accessors above, and their
//! drops happen under a pass, as before.

use std::ffi::{CStr, c_char, c_int, c_void};
use std::marker::PhantomData;

use cudarc::cublas::{result as cbr, result::CublasError, sys as cbsys};
use cudarc::cublaslt::{result as ltr, result::CublasError as LtError, sys as lt};
use cudarc::driver::{CudaContext, CudaSlice, CudaStream, DriverError, sys};
use cudarc::nvrtc::{result as nvr, result::NvrtcError, sys as nvsys};

use crate::runtime::lifecycle::{self, BackendPass};
use crate::sync::Arc;

use super::handles::CudaStreamHandle;

/// Proof that the calling thread holds a pass of the backend gate for `'p` (see the module
/// docs). Zero-sized and `Copy`: passing it costs nothing.
#[derive(Clone, Copy)]
pub(crate) struct Driver<'p> {
    _pass: PhantomData<&'p BackendPass>,
}

impl BackendPass {
    /// The token for calls made while this pass is held. From a nested pass it also
    /// counts a call the closed gate did not wait for (see the module docs).
    pub(crate) fn driver(&self) -> Driver<'_> {
        if !self.is_own() {
            lifecycle::note_backend_call();
        }
        Driver { _pass: PhantomData }
    }
}

/// A CUDA stream handle used under a held pass: what every kernel receives. Derefs to the
/// handle for its plain fields (`dev`, `id`, caches).
#[derive(Clone, Copy)]
pub(crate) struct GpuStream<'a> {
    cs: &'a CudaStreamHandle,
    d: Driver<'a>,
}

impl<'a> GpuStream<'a> {
    pub fn new(d: Driver<'a>, cs: &'a CudaStreamHandle) -> GpuStream<'a> {
        GpuStream { cs, d }
    }
    /// The token of the pass this stream is used under.
    pub fn driver(&self) -> Driver<'a> {
        self.d
    }
    /// The stream handle itself.
    pub fn handle(&self) -> &'a CudaStreamHandle {
        self.cs
    }
    /// The cudarc stream after this thread's recorded launches ([`CudaStreamHandle::stream`]).
    pub fn stream(&self) -> &'a Arc<CudaStream> {
        self.cs.stream(self.d)
    }
    /// The cudarc stream without sending recorded launches ([`CudaStreamHandle::raw_stream`]).
    pub fn raw_stream(&self) -> &'a Arc<CudaStream> {
        self.cs.raw_stream(self.d)
    }
    /// Makes the stream's device context current on this thread.
    pub fn bind(&self) -> Result<(), DriverError> {
        self.cs.dev.ctx(self.d).bind_to_thread()
    }
}

impl std::ops::Deref for GpuStream<'_> {
    type Target = CudaStreamHandle;
    fn deref(&self) -> &CudaStreamHandle {
        self.cs
    }
}

/// The driver API (`cudarc::driver::result`, `cudarc::driver::sys`, cudarc's constructors).
impl Driver<'_> {
    /// `cuInit`.
    pub fn init(self) -> Result<(), DriverError> {
        cudarc::driver::result::init()
    }
    /// `cuDeviceGetCount`.
    pub fn device_count(self) -> Result<c_int, DriverError> {
        cudarc::driver::result::device::get_count()
    }
    /// Retains device `ordinal`'s primary context.
    pub fn primary_context(self, ordinal: usize) -> Result<Arc<CudaContext>, DriverError> {
        CudaContext::new(ordinal)
    }
    /// The default memory pool of device `dev`.
    fn default_mem_pool(self, dev: sys::CUdevice) -> Option<sys::CUmemoryPool> {
        let mut pool: sys::CUmemoryPool = std::ptr::null_mut();
        // SAFETY: a plain query of a device into a local (an invalid device is an error).
        let ok = unsafe { sys::cuDeviceGetDefaultMemPool(&mut pool, dev) } == sys::CUresult::CUDA_SUCCESS;
        ok.then_some(pool)
    }
    /// Lets device `dev`'s default memory pool keep freed memory for reuse (release
    /// threshold `u64::MAX`); failures only leave the driver's default.
    pub fn keep_freed_memory(self, dev: sys::CUdevice) {
        let Some(pool) = self.default_mem_pool(dev) else { return };
        let mut threshold: u64 = u64::MAX;
        // SAFETY: the device's live pool; the attribute's value is a u64, read by the call.
        let _ = unsafe {
            sys::cuMemPoolSetAttribute(
                pool,
                sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_RELEASE_THRESHOLD,
                (&mut threshold as *mut u64).cast(),
            )
        };
    }
    /// Returns the memory device `dev`'s default pool keeps to the driver.
    pub fn trim_freed_memory(self, dev: sys::CUdevice) {
        let Some(pool) = self.default_mem_pool(dev) else { return };
        // SAFETY: the device's live pool.
        let _ = unsafe { sys::cuMemPoolTrimTo(pool, 0) };
    }
    /// A new event of the context bound to this thread.
    pub fn event_create(self, flags: u32) -> Result<sys::CUevent, DriverError> {
        let mut ev: sys::CUevent = std::ptr::null_mut();
        // SAFETY: writes a new handle into a local.
        unsafe { sys::cuEventCreate(&mut ev, flags).result()? };
        Ok(ev)
    }
    /// Records the current end of `stream` into `ev`.
    ///
    /// # Safety
    /// Both handles are live, of the context bound to this thread.
    pub unsafe fn event_record(self, ev: sys::CUevent, stream: sys::CUstream) -> Result<(), DriverError> {
        // SAFETY: the caller's.
        unsafe { sys::cuEventRecord(ev, stream).result() }
    }
    /// Whether the work recorded in `ev` has finished.
    ///
    /// # Safety
    /// `ev` is live, of the context bound to this thread.
    pub unsafe fn event_query(self, ev: sys::CUevent) -> Result<bool, DriverError> {
        // SAFETY: the caller's.
        match unsafe { sys::cuEventQuery(ev) } {
            sys::CUresult::CUDA_SUCCESS => Ok(true),
            sys::CUresult::CUDA_ERROR_NOT_READY => Ok(false),
            e => Err(DriverError(e)),
        }
    }
    /// Destroys `ev`.
    ///
    /// # Safety
    /// `ev` is live and not used again.
    pub unsafe fn event_destroy(self, ev: sys::CUevent) {
        // SAFETY: the caller's.
        let _ = unsafe { sys::cuEventDestroy_v2(ev) };
    }
    /// Makes `stream` wait (on the GPU) for the work recorded in `ev`.
    ///
    /// # Safety
    /// Both handles are live, of the context bound to this thread.
    pub unsafe fn stream_wait_event(self, stream: sys::CUstream, ev: sys::CUevent) -> Result<(), DriverError> {
        // SAFETY: the caller's.
        unsafe { sys::cuStreamWaitEvent(stream, ev, 0).result() }
    }
    /// Frees device memory (stream-ordered, on the stream it was allocated on).
    pub fn free(self, slice: CudaSlice<u8>) {
        drop(slice);
    }
    /// Copies `src` to device address `dst` in stream order.
    ///
    /// # Safety
    /// `dst` holds `src.len()` elements; `src` stays valid until the copy has been staged.
    pub unsafe fn memcpy_htod_async<T>(self, dst: u64, src: &[T], stream: sys::CUstream) -> Result<(), DriverError> {
        // SAFETY: the caller's.
        unsafe { cudarc::driver::result::memcpy_htod_async(dst, src, stream) }
    }
    /// Copies from device address `src` into `dst` in stream order.
    ///
    /// # Safety
    /// `src` holds `dst.len()` elements; `dst` stays valid until the copy has finished.
    pub unsafe fn memcpy_dtoh_async<T>(
        self,
        dst: &mut [T],
        src: u64,
        stream: sys::CUstream,
    ) -> Result<(), DriverError> {
        // SAFETY: the caller's.
        unsafe { cudarc::driver::result::memcpy_dtoh_async(dst, src, stream) }
    }
    /// Sets `n` bytes at device address `dst` to `v` in stream order.
    ///
    /// # Safety
    /// The `n` bytes lie inside one live allocation.
    pub unsafe fn memset_d8_async(self, dst: u64, v: u8, n: usize, stream: sys::CUstream) -> Result<(), DriverError> {
        // SAFETY: the caller's.
        unsafe { cudarc::driver::result::memset_d8_async(dst, v, n, stream) }
    }
    /// `cuLaunchKernel`.
    ///
    /// # Safety
    /// The arguments match the kernel's signature; every address it touches stays valid
    /// until it has run.
    pub unsafe fn launch_kernel(
        self,
        func: sys::CUfunction,
        grid: (u32, u32, u32),
        block: (u32, u32, u32),
        shared: u32,
        stream: sys::CUstream,
        params: &mut [*mut c_void],
    ) -> Result<(), DriverError> {
        // SAFETY: the caller's.
        unsafe { cudarc::driver::result::launch_kernel(func, grid, block, shared, stream, params) }
    }
}

/// CUDA graphs (`launch.rs`).
impl Driver<'_> {
    /// A new empty graph.
    pub fn graph_create(self) -> Result<sys::CUgraph, DriverError> {
        let mut graph: sys::CUgraph = std::ptr::null_mut();
        // SAFETY: writes a new handle into a local.
        unsafe { sys::cuGraphCreate(&mut graph, 0) }.result()?;
        Ok(graph)
    }
    /// Adds a kernel node after `deps` (at most one).
    ///
    /// # Safety
    /// `graph` is live; `deps` are its nodes; `params` describes a valid launch.
    pub unsafe fn graph_add_kernel_node(
        self,
        graph: sys::CUgraph,
        deps: &[sys::CUgraphNode],
        params: &sys::CUDA_KERNEL_NODE_PARAMS,
    ) -> Result<sys::CUgraphNode, DriverError> {
        let mut node: sys::CUgraphNode = std::ptr::null_mut();
        let p = if deps.is_empty() { std::ptr::null() } else { deps.as_ptr() };
        // SAFETY: the caller's; the arguments are copied by the call.
        unsafe { sys::cuGraphAddKernelNode_v2(&mut node, graph, p, deps.len(), params) }.result()?;
        Ok(node)
    }
    /// Adds the edge `from -> to`, of kind `edge` (a plain one when `None`).
    ///
    /// # Safety
    /// Both are nodes of the live `graph`.
    pub unsafe fn graph_add_dependency(
        self,
        graph: sys::CUgraph,
        from: sys::CUgraphNode,
        to: sys::CUgraphNode,
        edge: Option<&sys::CUgraphEdgeData>,
    ) -> Result<(), DriverError> {
        let e = edge.map_or(std::ptr::null(), |e| e as *const sys::CUgraphEdgeData);
        // SAFETY: the caller's; the edge data is read by the call.
        unsafe { sys::cuGraphAddDependencies_v2(graph, &from, &to, e, 1) }.result()
    }
    /// Instantiates `graph`.
    ///
    /// # Safety
    /// `graph` is live and complete.
    pub unsafe fn graph_instantiate(self, graph: sys::CUgraph) -> Result<sys::CUgraphExec, DriverError> {
        let mut exec: sys::CUgraphExec = std::ptr::null_mut();
        // SAFETY: the caller's.
        unsafe { sys::cuGraphInstantiateWithFlags(&mut exec, graph, 0) }.result()?;
        Ok(exec)
    }
    /// Sets a kernel node's launch of an executable graph.
    ///
    /// # Safety
    /// `node` belongs to the graph `exec` was made from, with the same function and
    /// argument size.
    pub unsafe fn graph_exec_set_kernel(
        self,
        exec: sys::CUgraphExec,
        node: sys::CUgraphNode,
        params: &sys::CUDA_KERNEL_NODE_PARAMS,
    ) -> Result<(), DriverError> {
        // SAFETY: the caller's; the arguments are copied by the call.
        unsafe { sys::cuGraphExecKernelNodeSetParams_v2(exec, node, params) }.result()
    }
    /// Launches `exec` on `stream`.
    ///
    /// # Safety
    /// A live executable graph and stream of the context bound to this thread.
    pub unsafe fn graph_launch(self, exec: sys::CUgraphExec, stream: sys::CUstream) -> Result<(), DriverError> {
        // SAFETY: the caller's.
        unsafe { sys::cuGraphLaunch(exec, stream) }.result()
    }
    /// Destroys an executable graph (the driver frees it once it has run).
    ///
    /// # Safety
    /// Live and not used again.
    pub unsafe fn graph_exec_destroy(self, exec: sys::CUgraphExec) {
        // SAFETY: the caller's.
        let _ = unsafe { sys::cuGraphExecDestroy(exec) };
    }
    /// Destroys a graph.
    ///
    /// # Safety
    /// Live and not used again.
    pub unsafe fn graph_destroy(self, graph: sys::CUgraph) {
        // SAFETY: the caller's.
        let _ = unsafe { sys::cuGraphDestroy(graph) };
    }
}

/// NVRTC (`cudarc::nvrtc`).
impl Driver<'_> {
    /// A new program of `src`.
    pub fn nvrtc_create_program(self, src: &CStr, name: Option<&CStr>) -> Result<nvsys::nvrtcProgram, NvrtcError> {
        nvr::create_program(src, name)
    }
    /// Compiles `prog` with `opts`.
    ///
    /// # Safety
    /// `prog` is live.
    pub unsafe fn nvrtc_compile_program(self, prog: nvsys::nvrtcProgram, opts: &[String]) -> Result<(), NvrtcError> {
        // SAFETY: the caller's.
        unsafe { nvr::compile_program(prog, opts) }
    }
    /// The PTX of a compiled program.
    ///
    /// # Safety
    /// `prog` is live and compiled.
    pub unsafe fn nvrtc_ptx(self, prog: nvsys::nvrtcProgram) -> Result<Vec<c_char>, NvrtcError> {
        // SAFETY: the caller's.
        unsafe { nvr::get_ptx(prog) }
    }
    /// The CUBIN of a program compiled for a real architecture.
    ///
    /// # Safety
    /// `prog` is live and compiled.
    pub unsafe fn nvrtc_cubin(self, prog: nvsys::nvrtcProgram) -> Result<Vec<u8>, NvrtcError> {
        let mut size = 0usize;
        // SAFETY: the caller's; the buffer has the size NVRTC reported.
        unsafe {
            nvsys::nvrtcGetCUBINSize(prog, &mut size).result()?;
            let mut buf = vec![0 as c_char; size];
            nvsys::nvrtcGetCUBIN(prog, buf.as_mut_ptr()).result()?;
            Ok(buf.into_iter().map(|c| c as u8).collect())
        }
    }
    /// The compile log of `prog`.
    ///
    /// # Safety
    /// `prog` is live.
    pub unsafe fn nvrtc_log(self, prog: nvsys::nvrtcProgram) -> Result<Vec<c_char>, NvrtcError> {
        // SAFETY: the caller's.
        unsafe { nvr::get_program_log(prog) }
    }
    /// Destroys `prog`.
    ///
    /// # Safety
    /// `prog` is live and not used again.
    pub unsafe fn nvrtc_destroy_program(self, prog: nvsys::nvrtcProgram) {
        // SAFETY: the caller's.
        let _ = unsafe { nvr::destroy_program(prog) };
    }
}

/// cuBLAS (`cudarc::cublas`).
impl Driver<'_> {
    /// A new cuBLAS handle.
    pub fn cublas_create_handle(self) -> Result<cbsys::cublasHandle_t, CublasError> {
        cbr::create_handle()
    }
    /// Destroys a cuBLAS handle.
    ///
    /// # Safety
    /// `h` is live and not used again.
    pub unsafe fn cublas_destroy_handle(self, h: cbsys::cublasHandle_t) {
        // SAFETY: the caller's.
        let _ = unsafe { cbr::destroy_handle(h) };
    }
    /// Gives `h` the workspace of `bytes` bytes at device address `ptr`.
    ///
    /// # Safety
    /// `h` is live; the workspace outlives its use by `h`.
    pub unsafe fn cublas_set_workspace(self, h: cbsys::cublasHandle_t, ptr: u64, bytes: usize) {
        // SAFETY: the caller's.
        unsafe { cbsys::cublasSetWorkspace_v2(h, ptr as *mut c_void, bytes) };
    }
    /// Makes `h` enqueue its work on `stream`.
    ///
    /// # Safety
    /// `h` and `stream` are live.
    pub unsafe fn cublas_set_stream(self, h: cbsys::cublasHandle_t, stream: sys::CUstream) -> Result<(), CublasError> {
        // SAFETY: the caller's.
        unsafe { cbr::set_stream(h, stream as cbsys::cudaStream_t) }
    }
    /// `cublasGemmEx`.
    ///
    /// # Safety
    /// As cuBLAS requires: a live handle, operands covering the problem.
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn cublas_gemm_ex(
        self,
        h: cbsys::cublasHandle_t,
        (opa, opb): (cbsys::cublasOperation_t, cbsys::cublasOperation_t),
        m: i32,
        n: i32,
        k: i32,
        alpha: *const c_void,
        (a, lda): (*const c_void, i32),
        (b, ldb): (*const c_void, i32),
        beta: *const c_void,
        (c, ldc): (*mut c_void, i32),
        ty: cbsys::cudaDataType_t,
        compute: cbsys::cublasComputeType_t,
        algo: cbsys::cublasGemmAlgo_t,
    ) -> Result<(), CublasError> {
        // SAFETY: the caller's.
        unsafe { cbr::gemm_ex(h, opa, opb, m, n, k, alpha, a, ty, lda, b, ty, ldb, beta, c, ty, ldc, compute, algo) }
    }
    /// `cublasGemmStridedBatchedEx`; each operand is (address, leading dimension, stride).
    ///
    /// # Safety
    /// As cuBLAS requires: a live handle, operands covering the problem.
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn cublas_gemm_strided_batched_ex(
        self,
        h: cbsys::cublasHandle_t,
        (opa, opb): (cbsys::cublasOperation_t, cbsys::cublasOperation_t),
        m: i32,
        n: i32,
        k: i32,
        alpha: *const c_void,
        (a, lda, sa): (*const c_void, i32, i64),
        (b, ldb, sb): (*const c_void, i32, i64),
        beta: *const c_void,
        (c, ldc, sc): (*mut c_void, i32, i64),
        batch: i32,
        ty: cbsys::cudaDataType_t,
        compute: cbsys::cublasComputeType_t,
        algo: cbsys::cublasGemmAlgo_t,
    ) -> Result<(), CublasError> {
        // SAFETY: the caller's.
        unsafe {
            cbr::gemm_strided_batched_ex(
                h, opa, opb, m, n, k, alpha, a, ty, lda, sa, b, ty, ldb, sb, beta, c, ty, ldc, sc, batch, compute, algo,
            )
        }
    }
}

/// cuBLASLt (`cudarc::cublaslt`).
impl Driver<'_> {
    /// A new cuBLASLt handle.
    pub fn lt_create_handle(self) -> Result<lt::cublasLtHandle_t, LtError> {
        ltr::create_handle()
    }
    /// Destroys a cuBLASLt handle.
    ///
    /// # Safety
    /// `h` is live and not used again.
    pub unsafe fn lt_destroy_handle(self, h: lt::cublasLtHandle_t) {
        // SAFETY: the caller's.
        let _ = unsafe { ltr::destroy_handle(h) };
    }
    /// A new matmul descriptor.
    pub fn lt_create_matmul_desc(
        self,
        compute: lt::cublasComputeType_t,
        scale: lt::cudaDataType_t,
    ) -> Result<lt::cublasLtMatmulDesc_t, LtError> {
        ltr::create_matmul_desc(compute, scale)
    }
    /// Destroys a matmul descriptor.
    ///
    /// # Safety
    /// Live and not used again.
    pub unsafe fn lt_destroy_matmul_desc(self, desc: lt::cublasLtMatmulDesc_t) {
        // SAFETY: the caller's.
        let _ = unsafe { ltr::destroy_matmul_desc(desc) };
    }
    /// A new matrix layout.
    pub fn lt_create_matrix_layout(
        self,
        ty: lt::cudaDataType_t,
        rows: u64,
        cols: u64,
        ld: i64,
    ) -> Result<lt::cublasLtMatrixLayout_t, LtError> {
        ltr::create_matrix_layout(ty, rows, cols, ld)
    }
    /// Sets an attribute of a matrix layout.
    ///
    /// # Safety
    /// `l` is live; `buf` points at `size` bytes of the attribute's type.
    pub unsafe fn lt_set_matrix_layout_attribute(
        self,
        l: lt::cublasLtMatrixLayout_t,
        attr: lt::cublasLtMatrixLayoutAttribute_t,
        buf: *const c_void,
        size: usize,
    ) -> Result<(), LtError> {
        // SAFETY: the caller's.
        unsafe { ltr::set_matrix_layout_attribute(l, attr, buf, size) }
    }
    /// Destroys a matrix layout.
    ///
    /// # Safety
    /// Live and not used again.
    pub unsafe fn lt_destroy_matrix_layout(self, l: lt::cublasLtMatrixLayout_t) {
        // SAFETY: the caller's.
        let _ = unsafe { ltr::destroy_matrix_layout(l) };
    }
    /// A new heuristic preference.
    pub fn lt_create_matmul_pref(self) -> Result<lt::cublasLtMatmulPreference_t, LtError> {
        ltr::create_matmul_pref()
    }
    /// Sets an attribute of a preference.
    ///
    /// # Safety
    /// `pref` is live; `buf` points at `size` bytes of the attribute's type.
    pub unsafe fn lt_set_matmul_pref_attribute(
        self,
        pref: lt::cublasLtMatmulPreference_t,
        attr: lt::cublasLtMatmulPreferenceAttributes_t,
        buf: *const c_void,
        size: usize,
    ) -> Result<(), LtError> {
        // SAFETY: the caller's.
        unsafe { ltr::set_matmul_pref_attribute(pref, attr, buf, size) }
    }
    /// Destroys a preference.
    ///
    /// # Safety
    /// Live and not used again.
    pub unsafe fn lt_destroy_matmul_pref(self, pref: lt::cublasLtMatmulPreference_t) {
        // SAFETY: the caller's.
        let _ = unsafe { ltr::destroy_matmul_pref(pref) };
    }
    /// `cublasLtMatmulAlgoGetHeuristic` for `desc` with layouts `[a, b, c]` (C is also D):
    /// fills `results` and returns how many it wrote.
    ///
    /// # Safety
    /// Every descriptor is live.
    pub unsafe fn lt_heuristic(
        self,
        h: lt::cublasLtHandle_t,
        desc: lt::cublasLtMatmulDesc_t,
        [la, lb, lc]: [lt::cublasLtMatrixLayout_t; 3],
        pref: lt::cublasLtMatmulPreference_t,
        results: &mut [lt::cublasLtMatmulHeuristicResult_t],
    ) -> Option<usize> {
        let mut count = 0i32;
        let room = results.len().min(i32::MAX as usize) as i32;
        // SAFETY: the caller's; `results` has room for `room` entries.
        let st = unsafe {
            lt::cublasLtMatmulAlgoGetHeuristic(h, desc, la, lb, lc, lc, pref, room, results.as_mut_ptr(), &mut count)
        };
        (st == lt::cublasStatus_t::CUBLAS_STATUS_SUCCESS).then(|| count.clamp(0, room) as usize)
    }
    /// Sets an attribute of a matmul descriptor.
    ///
    /// # Safety
    /// `desc` is live; `buf` points at `size` bytes of the attribute's type.
    pub unsafe fn lt_set_matmul_desc_attribute(
        self,
        desc: lt::cublasLtMatmulDesc_t,
        attr: lt::cublasLtMatmulDescAttributes_t,
        buf: *const c_void,
        size: usize,
    ) -> Result<(), LtError> {
        // SAFETY: the caller's.
        unsafe { ltr::set_matmul_desc_attribute(desc, attr, buf, size) }
    }
    /// `cublasLtMatmul` of `a` (layout `la`) and `b` (`lb`) plus `beta` times `c` into
    /// `d` (C and D share the layout `lc`).
    ///
    /// # Safety
    /// As cuBLASLt requires: live handle and descriptors made for this problem, operands
    /// and workspace covering it.
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn lt_matmul(
        self,
        h: lt::cublasLtHandle_t,
        desc: lt::cublasLtMatmulDesc_t,
        alpha: *const c_void,
        beta: *const c_void,
        (a, la): (*const c_void, lt::cublasLtMatrixLayout_t),
        (b, lb): (*const c_void, lt::cublasLtMatrixLayout_t),
        (c, d, lc): (*const c_void, *mut c_void, lt::cublasLtMatrixLayout_t),
        algo: &lt::cublasLtMatmulAlgo_t,
        (ws, ws_bytes): (u64, usize),
        stream: sys::CUstream,
    ) -> Result<(), LtError> {
        // SAFETY: the caller's.
        unsafe {
            ltr::matmul(
                h,
                desc,
                alpha,
                beta,
                a,
                la,
                b,
                lb,
                c,
                lc,
                d,
                lc,
                algo,
                ws as *mut c_void,
                ws_bytes,
                stream as lt::cudaStream_t,
            )
        }
    }
}
