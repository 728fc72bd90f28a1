"""PyTorch peer of `rill bench qmatmul`: the same ids, timed as DENSE bf16 matmuls.

PyTorch has no Q4_0/Q4_1/Q8_0 kernels, so the peer of a quantized product `x @ w.T`
(w [N, K] packed) is the bf16 product with w stored densely in bf16: what a PyTorch
stack runs after dequantizing the GGUF weights at load time (as transformers does).
The `gbs` figure counts the bytes that dense product moves (the bf16 weight, x and the
output), so it is comparable as a bandwidth, and the `seconds` are what matter.

Shapes: SmolLM2-135M's weights, (N, K) in 576x576, 1536x576, 576x1536, 49152x576, with
x bf16 [M, K] for M in 1, 4, 16, 64, 512, for each format id of the rill benchmark (the
dense product does not depend on the format; it is timed once per shape and printed
under each format's id). A figure is the median of 7 repetitions (after two warm-ups) of
8 products queued before one synchronisation, divided by 8.

    python3 bench/torch_qmatmul.py            (cuda when available, else cpu)
    RILL_QMATMUL_FILTER=m1,n576 python3 bench/torch_qmatmul.py
"""
import json
import os
import time

import torch

SHAPES = [(576, 576), (1536, 576), (576, 1536), (49152, 576)]
ROWS = [1, 4, 16, 64, 512]
FORMATS = ["Q4_0", "Q4_1", "Q8_0"]
CALLS = 8

dev = "cuda" if torch.cuda.is_available() else "cpu"


def sync():
    if dev == "cuda":
        torch.cuda.synchronize()


def rep(f):
    sync()
    t = time.perf_counter()
    for _ in range(CALLS):
        f()
    sync()
    return (time.perf_counter() - t) / CALLS


def main():
    pieces = [p for p in os.environ.get("RILL_QMATMUL_FILTER", "").split(",") if p]
    for n, k in SHAPES:
        w = (torch.rand(n, k, device=dev) * 2 - 1).to(torch.bfloat16)
        for m in ROWS:
            ids = [f"qmatmul:{f}:m{m}:n{n}:k{k}" for f in FORMATS]
            ids = [i for i in ids if all(p in i for p in pieces)]
            if not ids:
                continue
            x = (torch.rand(m, k, device=dev) * 2 - 1).to(torch.bfloat16)
            f = lambda: x @ w.T
            rep(f)
            rep(f)
            ts = sorted(rep(f) for _ in range(7))
            s = ts[len(ts) // 2]
            nbytes = 2 * n * k + 2 * m * k + 2 * m * n
            for rid in ids:
                print(json.dumps({"id": rid, "impl": "torch-bf16-dense", "seconds": s,
                                  "gbs": round(nbytes / s / 1e9, 1),
                                  "tflops": round(2 * m * n * k / s / 1e12, 3)}), flush=True)
        del w


if __name__ == "__main__":
    main()
