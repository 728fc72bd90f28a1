"""CPU peer for `rill bench --device cpu`: the same operations in NumPy, same sizes,
median of the same number of repetitions. Run: python3 bench/numpy_bench.py"""
import time
import numpy as np


def median_time(f, warm, reps):
    for _ in range(warm):
        f()
    ts = []
    for _ in range(reps):
        t = time.perf_counter()
        f()
        ts.append(time.perf_counter() - t)
    ts.sort()
    return ts[len(ts) // 2]


rng = np.random.default_rng(0)
print(f"numpy {np.__version__}")
n = 1 << 24
a = rng.uniform(-1, 1, n).astype(np.float32)
b = rng.uniform(-1, 1, n).astype(np.float32)
t = median_time(lambda: a + b, 3, 20)
print(f"add      f32 n=2^24: {t*1e3:8.3f} ms  {12*n/t/1e9:7.1f} GB/s")
t = median_time(lambda: a.sum(), 3, 20)
print(f"sum      f32 n=2^24: {t*1e3:8.3f} ms  {4*n/t/1e9:7.1f} GB/s")
x = rng.uniform(-1, 1, (4096, 4096)).astype(np.float32)


def softmax():
    m = x.max(axis=-1, keepdims=True)
    e = np.exp(x - m)
    return e / e.sum(axis=-1, keepdims=True)


t = median_time(softmax, 3, 20)
print(f"softmax  f32 4096x4096: {t*1e3:8.3f} ms  {8*4096*4096/t/1e9:7.1f} GB/s")
m1 = rng.uniform(-1, 1, (1024, 1024)).astype(np.float32)
m2 = rng.uniform(-1, 1, (1024, 1024)).astype(np.float32)
t = median_time(lambda: m1 @ m2, 2, 10)
print(f"matmul   f32 1024^3: {t*1e3:8.3f} ms  {2*1024**3/t/1e9:7.1f} GFLOP/s")
s = rng.uniform(-1, 1, 16).astype(np.float32)


def chain():
    y = s
    for _ in range(1000):
        y = y * np.float32(1.0001)
    return y


t = median_time(chain, 2, 10)
print(f"chain    1000 dependent tiny ops: {t*1e3:8.3f} ms  {t/1000*1e6:6.2f} us/op")
rb = rng.uniform(-1, 1, 4096).astype(np.float32)


def row_sq_dist():
    return ((x - rb) ** 2).sum(axis=-1)


t = median_time(row_sq_dist, 2, 10)
print(f"fused_reduce f32 4096x4096 row sums of (a-b)^2: {t*1e3:8.3f} ms")
t_sq = median_time(lambda: np.square(a), 3, 20)
t_exp = median_time(lambda: np.exp(a), 3, 20)
print(f"unary    f32 n=2^24: square {t_sq*1e3:8.3f} ms, exp {t_exp*1e3:8.3f} ms")
