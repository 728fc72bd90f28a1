"""How long a GPU takes to run a chain of dependent tiny kernels, by itself.

Captures N dependent `y = y * 1.0001` ops on a 16-element f32 tensor into one CUDA graph
with PyTorch and times graph replays with CUDA events (kernel time, no Python per op), and
the same chain eagerly (host-bound). The floor that `rill bench chain` (1000 dependent tiny
ops) can reach while it launches one kernel per op.

    python3 bench/graph_lab.py [N ...]
"""
import sys

import torch


def main():
    sizes = [int(a) for a in sys.argv[1:]] or [256, 512, 1000]
    x = torch.rand(16, device="cuda")
    for n in sizes:
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            y = x
            for _ in range(n):
                y = y * 1.0001
        torch.cuda.current_stream().wait_stream(s)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            y = x
            for _ in range(n):
                y = y * 1.0001
        for _ in range(3):
            g.replay()
        torch.cuda.synchronize()
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        ts = []
        for _ in range(20):
            a.record()
            g.replay()
            b.record()
            b.synchronize()
            ts.append(a.elapsed_time(b) * 1e3)
        ts.sort()
        med = ts[len(ts) // 2]
        print(f"graph  {n:5d} dependent tiny kernels: {med:9.1f} us  {med / n:6.3f} us/kernel (GPU time)")


if __name__ == "__main__":
    main()
