"""How long a GPU takes to run a chain of dependent tiny kernels, by itself.

Captures N dependent `y = y * 1.0001` ops on a 16-element f32 tensor into one CUDA graph
with PyTorch and times graph replays with CUDA events (kernel time, no Python per op), and
the same chain eagerly (host-bound). The floor that `rill bench chain` (1000 dependent tiny
ops) can reach while it launches one kernel per op.

    python3 bench/graph_lab.py [N ...]
    python3 bench/graph_lab.py --raw [N ...]   # a minimal raw kernel instead (CuPy)

With `--raw` the chain is N launches of a one-line CUDA kernel (`y[i] = x[i] * 1.0001f`,
one block, block sizes 32 to 1024) captured into one graph with CuPy: the GPU's time per
dependent kernel when the kernel itself does next to nothing.
"""
import sys


def raw(sizes):
    import cupy as cp

    src = r"""
    extern "C" __global__ void k(float* __restrict__ y, const float* __restrict__ x, long long n) {
        long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;
        if (i < n) y[i] = x[i] * 1.0001f;
    }
    """
    k = cp.RawModule(code=src).get_function("k")
    n = 16
    bufs = [cp.ones(n, dtype=cp.float32) for _ in range(2)]
    for count in sizes:
        for block in (32, 128, 256, 1024):
            s = cp.cuda.Stream(non_blocking=True)
            with s:
                s.begin_capture()
                for j in range(count):
                    k((1,), (block,), (bufs[(j + 1) % 2], bufs[j % 2], cp.int64(n)))
                g = s.end_capture()
            for _ in range(3):
                g.launch(s)
            s.synchronize()
            ts = []
            for _ in range(20):
                a, b = cp.cuda.Event(), cp.cuda.Event()
                a.record(s)
                g.launch(s)
                b.record(s)
                b.synchronize()
                ts.append(cp.cuda.get_elapsed_time(a, b) * 1e3)
            ts.sort()
            med = ts[len(ts) // 2]
            print(f"raw graph {count:5d} dependent kernels, block {block:4d}: {med / count:6.3f} us/kernel (GPU time)")


def main():
    args = sys.argv[1:]
    if args[:1] == ["--raw"]:
        return raw([int(a) for a in args[1:]] or [128, 1000])
    import torch

    sizes = [int(a) for a in args] or [256, 512, 1000]
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
