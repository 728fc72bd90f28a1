"""Peer of `rill bench train`: the same two training workloads in PyTorch, forward plus
backward (the loss and the gradient of every parameter), eager autograd and under
torch.compile, with the cases of crates/rill-cli/src/bench_train.rs:
    python3 bench/torch_train.py [--device cuda|cpu] [train:WORKLOAD[:DTYPE] ...]
(with case filters as `rill bench train:encoder:f32` takes them: only the matching cases)
Prints one line per case in the format of `rill bench train`, each figure the median of
5 timed steps after 2 warm-up steps (3 for torch.compile, which compiles on the first)."""
import argparse
import statistics
import time

import torch
import torch.nn.functional as F


def cases(gpu):
    mlp = [8192, 4096, 4] if gpu else [256, 256, 4]
    enc = [32, 512, 768, 12] if gpu else [2, 64, 128, 4]
    out = []
    for dt in ["bf16", "f32"]:
        out.append(("mlp", dt, mlp))
        out.append(("encoder", dt, enc))
    return out


def mlp_loss(params, x):
    h = x
    layers = len(params) // 2
    for i in range(layers):
        h = h @ params[2 * i] + params[2 * i + 1]
        if i + 1 < layers:
            h = F.gelu(h, approximate="tanh")
    return h.float().square().mean()


def encoder_loss(params, x, heads):
    wqkv, bqkv, wo, bo, g1, b1, w1, bf1, w2, bf2, g2, b2 = params
    b, t, d = x.shape
    dh = d // heads
    qkv = (x @ wqkv + bqkv).reshape(b, t, 3, heads, dh).permute(2, 0, 3, 1, 4)
    o = F.scaled_dot_product_attention(qkv[0], qkv[1], qkv[2])
    o = o.transpose(1, 2).reshape(b, t, d)
    y = F.layer_norm(x + (o @ wo + bo), (d,), g1, b1, 1e-5)
    f = F.gelu(y @ w1 + bf1, approximate="tanh") @ w2 + bf2
    z = F.layer_norm(y + f, (d,), g2, b2, 1e-5)
    return z.float().square().mean()


def inputs(workload, dt, dims, dev):
    g = torch.Generator(device="cpu").manual_seed(0)

    def p(shape, scale):
        return ((torch.rand(shape, generator=g) * 2 - 1) * scale).to(dev, dt).requires_grad_()

    if workload == "mlp":
        batch, w, layers = dims
        params = []
        for _ in range(layers):
            params += [p((w, w), w ** -0.5), p((w,), 0.1)]
        return params, p((batch, w), 1.0).detach()
    batch, t, d, _ = dims
    s = d ** -0.5
    ones = lambda: torch.ones(d, device=dev, dtype=dt, requires_grad=True)
    zeros = lambda: torch.zeros(d, device=dev, dtype=dt, requires_grad=True)
    params = [p((d, 3 * d), s), p((3 * d,), 0.1), p((d, d), s), p((d,), 0.1), ones(), zeros(),
              p((d, 4 * d), s), p((4 * d,), 0.1), p((4 * d, d), 0.5 * s), p((d,), 0.1), ones(), zeros()]
    return params, p((batch, t, d), 1.0).detach()


def timed(fn, warm, reps, sync):
    for _ in range(warm):
        fn()
    sync()
    out = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        sync()
        out.append(time.perf_counter() - t)
    return statistics.median(out)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("filters", nargs="*", help="train[:WORKLOAD[:DTYPE]] (all cases when none)")
    args = ap.parse_args()

    def selected(workload, dtn):
        if not args.filters:
            return True
        for f in args.filters:
            parts = f.split(":")[1:]
            if (not parts or parts[0] == workload) and (len(parts) < 2 or parts[1] == dtn):
                return True
        return False

    dev = torch.device(args.device)
    gpu = dev.type == "cuda"
    sync = torch.cuda.synchronize if gpu else (lambda: None)
    for workload, dtn, dims in cases(gpu):
        if not selected(workload, dtn):
            continue
        dt = {"bf16": torch.bfloat16, "f32": torch.float32}[dtn]
        params, x = inputs(workload, dt, dims, dev)
        heads = dims[3] if workload == "encoder" else 1
        loss = (lambda ps, x: mlp_loss(ps, x)) if workload == "mlp" else (lambda ps, x: encoder_loss(ps, x, heads))

        def step(f):
            l = f(params, x)
            return l, torch.autograd.grad(l, params)

        eager = timed(lambda: step(loss), 2, 5, sync)
        compiled_loss = torch.compile(loss)
        comp = timed(lambda: step(compiled_loss), 3, 5, sync)
        name = "x".join(str(d) for d in dims)
        print(f"train {workload} {dtn} {name}: eager {eager * 1e3:9.3f} ms, torch.compile {comp * 1e3:9.3f} ms "
              f"(torch {torch.__version__})", flush=True)
        del params, x


if __name__ == "__main__":
    main()
