"""GPU peer for `rill bench --device gpu`: the same operations in PyTorch on the same card,
same sizes, median of repeated runs (each synchronised). Run on the GPU machine:
    python3 bench/torch_bench.py [--compile] [--batched]
    python3 bench/torch_bench.py sdpa     (only the attention grid of `rill bench sdpa`)
--batched adds, for add/sum/softmax, the time per op when 8 are queued before one
synchronisation (as `rill bench` prints on a GPU)."""
import sys
import time

import torch


def batched_time(f, k=8):
    """Seconds per call when k calls are queued before one synchronisation."""
    def run():
        outs = [f() for _ in range(k)]
        return outs
    return median_time(run, 1, 5) / k


def median_time(f, warm, reps):
    for _ in range(warm):
        f()
    torch.cuda.synchronize()
    ts = []
    for _ in range(reps):
        torch.cuda.synchronize()
        t = time.perf_counter()
        f()
        torch.cuda.synchronize()
        ts.append(time.perf_counter() - t)
    ts.sort()
    return ts[len(ts) // 2]


dev = "cuda"
print(f"torch {torch.__version__} on {torch.cuda.get_device_name(0)}")


def sdpa_grid():
    """`rill bench sdpa`'s grid and ids: F.scaled_dot_product_attention, 8 calls per
    synchronisation, median of 5 after one warm-up, one JSON object a line."""
    import json
    import os
    import torch.nn.functional as F
    pieces = [p for p in os.environ.get("RILL_SDPA_FILTER", "").split(",") if p]
    heads = 16
    for bh in [16, 128, 512]:
        for t in [128, 512, 1024, 2048, 4096]:
            for d in [64, 128]:
                for name, dt in [("bf16", torch.bfloat16), ("f16", torch.float16)]:
                    if not any(all(p in f"sdpa:bh{bh}:t{t}:d{d}:{name}:{m}" for p in pieces)
                               for m in ["none", "causal", "padding"]):
                        continue
                    shape = (bh // heads, heads, t, d)
                    q, k, v = [(torch.rand(shape, device=dev) * 2 - 1).to(dt) for _ in range(3)]
                    b = bh // heads
                    i = torch.arange(b * t, device=dev)
                    keep = (((i // t) % 2) == 0) | ((i % t) < t - t // 4)
                    pad = keep.reshape(b, 1, 1, t)
                    for m in ["none", "causal", "padding"]:
                        rid = f"sdpa:bh{bh}:t{t}:d{d}:{name}:{m}"
                        if not all(p in rid for p in pieces):
                            continue
                        kw = {"is_causal": True} if m == "causal" else ({"attn_mask": pad} if m == "padding" else {})
                        s = batched_time(lambda: F.scaled_dot_product_attention(q, k, v, **kw))
                        flops = 4 * bh * t * t * d * (0.5 if m == "causal" else 1.0)
                        rec = {"id": rid, "impl": "torch", "seconds": s,
                               "tflops": round(flops / s / 1e12, 2)}
                        print(json.dumps(rec), flush=True)
                    del q, k, v


if "sdpa" in sys.argv:
    sdpa_grid()
    sys.exit(0)
n = 1 << 28
a = torch.rand(n, device=dev) * 2 - 1
b = torch.rand(n, device=dev) * 2 - 1
t = median_time(lambda: a + b, 3, 20)
print(f"add      f32 n=2^28: {t*1e3:8.3f} ms  {12*n/t/1e9:7.1f} GB/s")
if "--batched" in sys.argv:
    t = batched_time(lambda: a + b)
    print(f"  batched x8: {t*1e3:8.3f} ms  {12*n/t/1e9:7.1f} GB/s per op")
t = median_time(lambda: a.sum(), 3, 20)
print(f"sum      f32 n=2^28: {t*1e3:8.3f} ms  {4*n/t/1e9:7.1f} GB/s")
if "--batched" in sys.argv:
    t = batched_time(lambda: a.sum())
    print(f"  batched x8: {t*1e3:8.3f} ms  {4*n/t/1e9:7.1f} GB/s per op")
x = torch.rand(65536, 4096, device=dev)
t = median_time(lambda: torch.softmax(x, -1), 3, 20)
print(f"softmax  f32 65536x4096: {t*1e3:8.3f} ms  {8*65536*4096/t/1e9:7.1f} GB/s")
if "--batched" in sys.argv:
    t = batched_time(lambda: torch.softmax(x, -1))
    print(f"  batched x8: {t*1e3:8.3f} ms  {8*65536*4096/t/1e9:7.1f} GB/s per op")
del x
# Uniform on [-1, 1), as `rill bench`'s operands: the tensor cores' speed depends on the
# data (uniform on [0, 1) ran 2-3% faster on the H200, `bench/kernel_lab.py matmul`).
m1 = torch.rand(8192, 8192, device=dev, dtype=torch.bfloat16) * 2 - 1
m2 = torch.rand(8192, 8192, device=dev, dtype=torch.bfloat16) * 2 - 1
t = median_time(lambda: m1 @ m2, 3, 10)
print(f"matmul   bf16 8192^3: {t*1e3:8.3f} ms  {2*8192**3/t/1e9:7.1f} GFLOP/s")
del m1, m2


def chain(x):
    y = x
    for _ in range(1000):
        y = y * 1.0001
    return y


s = torch.rand(16, device=dev)
t = median_time(lambda: chain(s), 2, 10)
print(f"chain    1000 dependent tiny ops: {t*1e3:8.3f} ms  {t/1000*1e6:6.2f} us/op")
w = torch.rand(1 << 20, device=dev)
t = median_time(lambda: chain(w), 2, 10)
print(f"chain_wide 1000 dependent ops on 2^20 f32: {t*1e3:8.3f} ms  {t/1000*1e6:6.2f} us/op")
s1, s2 = torch.rand(1024, device=dev), torch.rand(1024, device=dev)
t = median_time(lambda: s1 + s2, 10, 200)
print(f"overhead add f32 n=2^10, one op and a synchronisation: {t*1e6:8.2f} us")


def fused(a, b):
    y = a * b + 1
    y = torch.tanh(y) * 0.5 + a
    y = y * y - b
    return torch.sigmoid(y)


t = median_time(lambda: fused(a, b), 3, 10)
print(f"chain8   eager f32 n=2^28: {t*1e3:8.3f} ms")
if "--compile" in sys.argv:
    cf = torch.compile(fused)
    t = median_time(lambda: cf(a, b), 3, 10)
    print(f"chain8   torch.compile f32 n=2^28: {t*1e3:8.3f} ms")
    h = torch.rand(8192, 4096, device=dev)
    bias = torch.rand(4096, device=dev)
    res = torch.rand(8192, 4096, device=dev)

    def block(h, bias, res):
        return torch.nn.functional.gelu(h + bias) + res

    cb = torch.compile(block)
    t = median_time(lambda: cb(h, bias, res), 3, 10)
    print(f"bias_gelu_residual torch.compile 8192x4096: {t*1e3:8.3f} ms")
