"""Kernel tuning lab (GPU machine): times variants of rill's bandwidth-bound kernels,
written here in CUDA C and compiled with CuPy, beside PyTorch's kernels for the same
operation, all with CUDA events (kernel time only, no host overhead). Used to choose
launch shapes for `backend/cuda/map.rs`, `reduce.rs` and the fused kernels.
    python3 bench/kernel_lab.py [add] [sum] [chain] [matmul] [alloc] [blas]
"""
import sys

import cupy as cp
import torch

REPS = 30


def ev_time(f, reps=REPS, warm=3):
    """Median milliseconds of `f` between two CUDA events on the current stream."""
    for _ in range(warm):
        f()
    cp.cuda.Device().synchronize()
    torch.cuda.synchronize()
    ts = []
    for _ in range(reps):
        s, e = cp.cuda.Event(), cp.cuda.Event()
        s.record()
        f()
        e.record()
        e.synchronize()
        ts.append(cp.cuda.get_elapsed_time(s, e))
    ts.sort()
    return ts[len(ts) // 2]


def torch_time(f, reps=REPS, warm=3):
    for _ in range(warm):
        f()
    torch.cuda.synchronize()
    ts = []
    for _ in range(reps):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        f()
        e.record()
        e.synchronize()
        ts.append(s.elapsed_time(e))
    ts.sort()
    return ts[len(ts) // 2]


SMS = cp.cuda.Device().attributes["MultiProcessorCount"]
want = sys.argv[1:] or ["add", "sum", "chain", "matmul"]

EW = r"""
typedef long long i64;
template <typename T, int N> struct alignas(sizeof(T) * N) V { T v[N]; };
__device__ __forceinline__ float fop(float p, float q) FOPBODY
extern "C" __global__ void __launch_bounds__(BLK) k(float* __restrict__ out, const float* __restrict__ a0, const float* __restrict__ a1, i64 n) {
    IX nv = n / 4;
    IX step = GS ? (IX)gridDim.x * blockDim.x * UNR : 0;
    for (IX base = (IX)blockIdx.x * blockDim.x * UNR + threadIdx.x; base < nv; base += step) {
        V<float, 4> x0[UNR], x1[UNR];
#pragma unroll
        for (int u = 0; u < UNR; ++u) {
            IX t = base + (IX)u * blockDim.x;
            if (t < nv) { x0[u] = ((const V<float, 4>*)a0)[t]; x1[u] = ((const V<float, 4>*)a1)[t]; }
        }
#pragma unroll
        for (int u = 0; u < UNR; ++u) {
            IX t = base + (IX)u * blockDim.x;
            if (t < nv) {
                V<float, 4> o;
#pragma unroll
                for (int j = 0; j < 4; ++j) o.v[j] = fop(x0[u].v[j], x1[u].v[j]);
                STORE;
            }
        }
        if (!GS) break;
    }
}
"""

CHAIN = "{ float y = p * q + 1.0f; y = tanhf(y) * 0.5f + p; y = y * y - q; return 1.0f / (1.0f + expf(-y)); }"


def ew_kernel(unr, blk, gs, stcs, ix, body):
    store = "__stcs((float4*)out + t, *(float4*)&o)" if stcs else "((V<float, 4>*)out)[t] = o"
    src = EW.replace("FOPBODY", body)
    src = (src.replace("UNR", str(unr)).replace("BLK", str(blk)).replace("GS", "1" if gs else "0")
           .replace("STORE", store).replace("IX", ix))
    return cp.RawKernel(src, "k", options=("-std=c++17",))


def ew_lab(label, body, torch_f):
    n = 1 << 28
    a = cp.random.uniform(-1, 1, n, dtype=cp.float32)
    b = cp.random.uniform(-1, 1, n, dtype=cp.float32)
    out = cp.empty_like(a)
    nbytes = 12 * n
    ta, tb = torch.as_tensor(a, device="cuda"), torch.as_tensor(b, device="cuda")
    t = torch_time(lambda: torch_f(ta, tb))
    print(f"{label} torch: {t:.4f} ms {nbytes / t / 1e6:.1f} GB/s")
    configs = []
    for unr in (1, 2, 4, 8):
        for blk in (128, 256, 512):
            configs.append((unr, blk, False, False, "i64"))
    configs += [(4, 256, False, True, "i64"), (1, 256, False, True, "i64"), (2, 256, False, True, "i64"),
                (4, 256, False, False, "int"), (1, 128, False, False, "int"), (1, 256, False, True, "int"),
                (4, 256, True, False, "i64"), (1, 256, True, False, "i64"), (4, 256, True, True, "i64")]
    nv = n // 4
    res = []
    for unr, blk, gs, stcs, ix in configs:
        k = ew_kernel(unr, blk, gs, stcs, ix, body)
        blocks = -(-nv // (blk * unr))
        if gs:
            blocks = min(blocks, SMS * 2048 // blk * 2)
        t = ev_time(lambda: k((blocks,), (blk,), (out, a, b, cp.int64(n))))
        res.append((t, unr, blk, gs, stcs, ix, blocks))
        print(f"{label} unr={unr} blk={blk} gs={gs} stcs={stcs} ix={ix} blocks={blocks}: {t:.4f} ms {nbytes / t / 1e6:.1f} GB/s")
    ref = torch_f(ta, tb)
    k = ew_kernel(4, 256, False, False, "i64", body)
    k((-(-nv // 1024),), (256,), (out, a, b, cp.int64(n)))
    err = float(torch.max(torch.abs(torch.as_tensor(out, device="cuda") - ref)))
    print(f"{label} check max abs err vs torch: {err:.3g}")
    res.sort()
    print(f"{label} best: {res[:4]}")
    del a, b, out, ta, tb


if "add" in want:
    ew_lab("add", "{ return p + q; }", lambda x, y: x + y)

if "chain" in want:
    def chain(a, b):
        y = a * b + 1
        y = torch.tanh(y) * 0.5 + a
        y = y * y - b
        return torch.sigmoid(y)
    cchain = torch.compile(chain)
    ew_lab("chain", CHAIN, cchain)

SUM = r"""
typedef long long i64;
template <typename T, int N> struct alignas(sizeof(T) * N) V { T v[N]; };
// LD(p): the 16-byte load variant under test (plain, streaming, or non-coherent with an
// L2 prefetch of 256 bytes).
__device__ __forceinline__ V<float, 4> ld_plain(const V<float, 4>* p) { return *p; }
__device__ __forceinline__ V<float, 4> ld_cs(const V<float, 4>* p) {
    float4 r = __ldcs((const float4*)p); V<float, 4> v; v.v[0] = r.x; v.v[1] = r.y; v.v[2] = r.z; v.v[3] = r.w; return v;
}
__device__ __forceinline__ V<float, 4> ld_nc256(const V<float, 4>* p) {
    V<float, 4> v;
    asm volatile("ld.global.nc.L1::no_allocate.L2::256B.v4.f32 {%0,%1,%2,%3}, [%4];"
                 : "=f"(v.v[0]), "=f"(v.v[1]), "=f"(v.v[2]), "=f"(v.v[3]) : "l"(p));
    return v;
}
__device__ __forceinline__ float warp_red(float a) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) a += __shfl_down_sync(0xffffffffu, a, o);
    return a;
}
extern "C" __global__ void __launch_bounds__(BLK) k_part(float* __restrict__ part, const float* __restrict__ x, i64 nvec, i64 splits) {
    __shared__ float sh[32];
    const V<float, 4>* pv = (const V<float, 4>*)x;
    i64 c = blockIdx.x;
    i64 v0 = nvec * c / splits, v1 = nvec * (c + 1) / splits;
    i64 bd = blockDim.x;
    i64 j = v0 + threadIdx.x;
    float acc[ACC];
#pragma unroll
    for (int q = 0; q < ACC; ++q) acc[q] = 0.f;
    for (; j + (UNR - 1) * bd < v1; j += UNR * bd) {
        V<float, 4> xs[UNR];
#pragma unroll
        for (int u = 0; u < UNR; ++u) xs[u] = LD(pv + j + u * bd);
#pragma unroll
        for (int u = 0; u < UNR; ++u)
#pragma unroll
            for (int e = 0; e < 4; ++e) acc[(u * 4 + e) % ACC] += xs[u].v[e];
    }
    for (; j < v1; j += bd) {
        V<float, 4> x0 = pv[j];
#pragma unroll
        for (int e = 0; e < 4; ++e) acc[e % ACC] += x0.v[e];
    }
    float a = 0.f;
#pragma unroll
    for (int q = 0; q < ACC; ++q) a += acc[q];
    int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    a = warp_red(a);
    if (lane == 0) sh[w] = a;
    __syncthreads();
    if (w == 0) {
        a = lane < (BLK / 32) ? sh[lane] : 0.f;
        a = warp_red(a);
        if (lane == 0) part[c] = a;
    }
}
extern "C" __global__ void k_fin(float* __restrict__ out, const float* __restrict__ part, i64 splits) {
    int lane = threadIdx.x & 31;
    float a = 0.f;
    for (i64 j = lane; j < splits; j += 32) a += part[j];
    a = warp_red(a);
    if (lane == 0) out[0] = a;
}
"""


def sum_lab():
    n = 1 << 28
    x = cp.random.uniform(-1, 1, n, dtype=cp.float32)
    tx = torch.as_tensor(x, device="cuda")
    t = torch_time(lambda: tx.sum())
    print(f"sum torch: {t:.4f} ms {4 * n / t / 1e6:.1f} GB/s")
    out = cp.zeros(1, dtype=cp.float32)
    res = []
    for blk, unr, acc, per_sm, ld in [(b, u, a, p, l) for b in (256, 512, 1024) for u in (4, 8) for a in (1, 4)
                          for p in (2, 4, 8, 16) for l in ("ld_plain",)] + \
            [(b, u, 4, p, l) for b in (256, 1024) for u in (4, 8) for p in (4, 8)
             for l in ("ld_cs", "ld_nc256")]:
        splits = SMS * per_sm * 256 // blk
        if blk * per_sm * 256 // blk > 2048 * 2:
            continue
        src = SUM.replace("BLK", str(blk)).replace("UNR", str(unr)).replace("ACC", str(acc))
        src = src.replace("LD(", ld + "(")
        mod = cp.RawModule(code=src, options=("-std=c++17",))
        kp, kf = mod.get_function("k_part"), mod.get_function("k_fin")
        part = cp.empty(splits, dtype=cp.float32)

        def run():
            kp((splits,), (blk,), (part, x, cp.int64(n // 4), cp.int64(splits)))
            kf((1,), (32,), (out, part, cp.int64(splits)))
        t = ev_time(run)
        res.append((t, blk, unr, acc, splits, ld))
        print(f"sum blk={blk} unr={unr} acc={acc} splits={splits} {ld}: {t:.4f} ms {4 * n / t / 1e6:.1f} GB/s")
    run()
    print(f"sum check: {float(out[0]):.6g} vs torch {float(tx.double().sum()):.6g}")
    res.sort()
    print(f"sum best: {res[:4]}")


if "sum" in want:
    sum_lab()

if "matmul" in want:
    n = 8192
    for name, mk in [("rand", lambda: torch.rand(n, n, device="cuda", dtype=torch.bfloat16)),
                     ("uniform(-1,1)", lambda: torch.rand(n, n, device="cuda", dtype=torch.bfloat16) * 2 - 1),
                     ("randn", lambda: torch.randn(n, n, device="cuda", dtype=torch.bfloat16))]:
        m1, m2 = mk(), mk()
        t = torch_time(lambda: m1 @ m2, reps=10)
        print(f"matmul torch bf16 8192^3 {name}: {t:.4f} ms {2 * n ** 3 / t / 1e9:.1f} TFLOP/s")
        del m1, m2

if "alloc" in want:
    # Stream-ordered allocation of 1 GiB from the device's default pool with a release
    # threshold of "never" (what rill sets): host-side cost of cuMemAllocAsync/FreeAsync.
    import time
    rt = cp.cuda.runtime
    pool = rt.deviceGetDefaultMemPool(0)
    rt.memPoolSetAttribute(pool, rt.cudaMemPoolAttrReleaseThreshold, 2 ** 64 - 1)
    s = cp.cuda.Stream(non_blocking=True)
    for live in (1, 8):
        ta, tf = [], []
        for _ in range(20):
            t0 = time.perf_counter()
            ps = [rt.mallocAsync(1 << 30, s.ptr) for _ in range(live)]
            t1 = time.perf_counter()
            for p in ps:
                rt.freeAsync(p, s.ptr)
            t2 = time.perf_counter()
            s.synchronize()
            ta.append((t1 - t0) / live)
            tf.append((t2 - t1) / live)
        ta.sort(), tf.sort()
        print(f"alloc 1 GiB x{live} live: mallocAsync {ta[10] * 1e6:.1f} us, freeAsync {tf[10] * 1e6:.1f} us (median)")

if "blas" in want:
    # bf16 8192^3 through the cuBLAS entry points rill could use, on one handle with a
    # 32 MiB workspace, beside PyTorch's default and cuBLASLt backends.
    from cupy_backends.cuda.libs import cublas
    n = 8192
    a = torch.rand(n, n, device="cuda", dtype=torch.bfloat16) * 2 - 1
    b = torch.rand(n, n, device="cuda", dtype=torch.bfloat16) * 2 - 1
    c = torch.empty(n, n, device="cuda", dtype=torch.bfloat16)
    flops = 2 * n ** 3
    t = torch_time(lambda: torch.matmul(a, b, out=c), reps=10)
    print(f"blas torch default: {t:.4f} ms {flops / t / 1e9:.1f} TFLOP/s")
    libs = sorted({ln.split()[-1] for ln in open("/proc/self/maps") if "libcublas" in ln})
    print(f"blas libraries loaded: {libs}")
    try:
        torch.backends.cuda.preferred_blas_library("cublaslt")
        t = torch_time(lambda: torch.matmul(a, b, out=c), reps=10)
        print(f"blas torch cublaslt: {t:.4f} ms {flops / t / 1e9:.1f} TFLOP/s")
        torch.backends.cuda.preferred_blas_library("cublas")
    except Exception as e:  # noqa: BLE001
        print(f"blas torch cublaslt: unavailable ({e})")
    h = cublas.create()
    if hasattr(cublas, "setWorkspace"):
        ws = cp.empty(32 << 20, dtype=cp.uint8)
        cublas.setWorkspace(h, ws.data.ptr, 32 << 20)
    else:
        print("blas: this CuPy cannot set a cuBLAS workspace (the handle's default is used)")
    stream = torch.cuda.current_stream().cuda_stream
    cublas.setStream(h, stream)
    one = __import__("numpy").array(1.0, dtype="float32")
    zero = __import__("numpy").array(0.0, dtype="float32")
    R16BF, R32F = 14, 0  # cudaDataType
    C32F = 68  # CUBLAS_COMPUTE_32F
    pa, pb, pc = a.data_ptr(), b.data_ptr(), c.data_ptr()

    def ex(algo):
        cublas.gemmEx(h, 0, 0, n, n, n, one.ctypes.data, pb, R16BF, n, pa, R16BF, n,
                      zero.ctypes.data, pc, R16BF, n, C32F, algo)

    def strided(algo):
        cublas.gemmStridedBatchedEx(h, 0, 0, n, n, n, one.ctypes.data, pb, R16BF, n, n * n, pa, R16BF, n, n * n,
                                    zero.ctypes.data, pc, R16BF, n, n * n, 1, C32F, algo)
    cublas.setPointerMode(h, 0)
    for name, f in [("gemmEx default", lambda: ex(-1)), ("gemmEx tensor-op", lambda: ex(99)),
                    ("gemmStridedBatchedEx default", lambda: strided(-1)),
                    ("gemmStridedBatchedEx tensor-op", lambda: strided(99))]:
        try:
            t = torch_time(f, reps=10)
            print(f"blas {name}: {t:.4f} ms {flops / t / 1e9:.1f} TFLOP/s")
        except Exception as e:  # noqa: BLE001
            print(f"blas {name}: failed ({e})")
    ref = torch.matmul(a, b)
    ex(-1)
    torch.cuda.synchronize()
    print(f"blas check gemmEx vs torch max abs diff: {float((c.float() - ref.float()).abs().max()):.3g}")
