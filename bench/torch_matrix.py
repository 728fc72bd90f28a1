"""PyTorch peer of `rill bench matrix`: times every case of a case list in PyTorch, the
same way rill times it, and prints one JSON line per case.

    rill bench matrix --list [OPTIONS] > cases.jsonl         the cases (schema: matrix.rs)
    rill bench matrix --cases cases.jsonl > rill.jsonl       rill's times
    python3 bench/torch_matrix.py cases.jsonl > torch.jsonl  this script (GPU machine)
    python3 bench/matrix_report.py cases.jsonl rill.jsonl torch.jsonl --md m.md --png m.png

Options: --device cuda|cpu (default cuda when available), --filter TEXT (only ids
containing it), --dry-run (parse every case and print the inputs it would build and the
expression it would time, without importing torch; exits 1 if a case cannot be planned).

Output: {"id": ..., "impl": "torch", "seconds": <per op>} or {"id": ..., "impl": "torch",
"error": "<short message>"}. The first stderr line names the torch version and device.

Timing, as in matrix.rs: the inputs are built once on the device; one repetition
synchronises, launches the op 8 times on the same inputs (8 separate outputs) and
synchronises once; 3 warm-up repetitions, then R repetitions with R = 0.02 s / (fastest
warm-up), clamped to 5..50; the figure is the median repetition (the upper one of an
even count, as rill) divided by 8. On the CPU there is nothing to synchronise.

Inputs (seeded, input k with seed 7 + k): floats uniform in [-1, 1), positive [0.5, 1.5)
for log, log1p, sqrt, rsqrt, reciprocal and pow's base; integers uniform in [-100, 100)
(pow's exponent in [0, 4); u8 and u32 in [0, 100)); bool uniform; take's index uniform in
[0, shape[axis]). An integer div's divisor has its zeros replaced by 1 (rill's div is true
division, integers giving f32, as torch.div; the time does not depend on the divisor).
Integer sums and products are asked for in rill's result dtype (i32 for i32, i64 for i64;
u8 and u32, which torch cannot sum into u32, as int32, of u32's size). Matmul cases with
"tf32" set torch.backends.cuda.matmul.allow_tf32 for their timing (restored afterwards).
Families: every one of matrix.rs (unary, binary, cast, where, reduce, argreduce, softmax,
log_softmax, layer_norm, rms_norm, take, concatenate of 2 to 8 inputs, transpose, matmul);
torch's missing kernels (most ops on uint32) are reported as errors.
Only torch and the standard library are needed.
"""
import argparse
import json
import platform
import sys
import time

COPIES = 8
WARMUP = 3
MIN_REPS, MAX_REPS, TARGET_S = 5, 50, 0.02

TORCH_DTYPES = {"f32": "float32", "f64": "float64", "bf16": "bfloat16", "f16": "float16",
                "i32": "int32", "i64": "int64", "u8": "uint8", "u32": "uint32", "bool": "bool"}
FLOAT_DTYPES = {"f32", "f64", "bf16", "f16"}
POSITIVE_UNARY = {"log", "log1p", "sqrt", "rsqrt", "reciprocal"}

# The op of each unary / binary name, as an expression of x0 (and x1).
UNARY = {op: f"torch.{op}(x0)" for op in
         ["neg", "abs", "sign", "exp", "log", "log1p", "sqrt", "rsqrt", "square", "reciprocal",
          "sin", "cos", "tanh", "sigmoid", "relu", "erf", "floor", "ceil", "logical_not"]}
UNARY.update({"gelu": "F.gelu(x0)", "gelu_tanh": "F.gelu(x0, approximate='tanh')",
              "silu": "F.silu(x0)", "round": "torch.round(x0)",  # torch.round: half to even
              # The derivatives: torch's backward kernels with a cotangent of ones (a
              # broadcast scalar, nothing stored).
              "gelu_grad": "torch.ops.aten.gelu_backward(x0.new_ones(()).expand_as(x0), x0)",
              "gelu_tanh_grad": "torch.ops.aten.gelu_backward(x0.new_ones(()).expand_as(x0), x0, approximate='tanh')",
              "silu_grad": "torch.ops.aten.silu_backward(x0.new_ones(()).expand_as(x0), x0)"})
BINARY = {"add": "torch.add", "sub": "torch.sub", "mul": "torch.mul", "div": "torch.div",
          "pow": "torch.pow", "maximum": "torch.maximum", "minimum": "torch.minimum",
          "equal": "torch.eq", "not_equal": "torch.ne", "less": "torch.lt",
          "less_equal": "torch.le", "greater": "torch.gt", "greater_equal": "torch.ge",
          "logical_and": "torch.logical_and", "logical_or": "torch.logical_or"}
REDUCE = {"sum": "torch.sum", "mean": "torch.mean", "max": "torch.amax", "min": "torch.amin"}
# The dtype of an integer sum or product: rill keeps i32, i64 and u32 and sums u8 as u32
# (torch would give int64 and has no uint32 sums: int32 has u32's size).
SUM_DTYPES = {"i32": "int32", "i64": "int64", "u8": "int32", "u32": "int32"}
# Number of inputs each family takes (min, max).
ARITY = {"unary": (1, 1), "binary": (2, 2), "cast": (1, 1), "where": (3, 3), "reduce": (1, 1),
         "argreduce": (1, 1), "softmax": (1, 1), "log_softmax": (1, 1), "layer_norm": (1, 3),
         "rms_norm": (1, 2), "take": (2, 2), "concatenate": (2, 8), "transpose": (1, 1),
         "matmul": (2, 2)}


class CaseError(Exception):
    """A case this script cannot plan (bad or unknown schema)."""


class Spec:
    """How to build one input: `kind` is float, int, bool or index; values uniform in
    [lo, hi) (floored for int and index); `strided`: made with the last two axes swapped,
    then swapped back; `nonzero`: zeros replaced by 1."""

    def __init__(self, shape, dtype, strided, kind, lo=0.0, hi=1.0, nonzero=False):
        self.shape, self.dtype, self.strided = list(shape), dtype, strided
        self.kind, self.lo, self.hi, self.nonzero = kind, lo, hi, nonzero

    def alloc_shape(self):
        s = list(self.shape)
        if self.strided:
            s[-2], s[-1] = s[-1], s[-2]
        return s

    def describe(self):
        vals = "bool" if self.kind == "bool" else f"{self.kind} [{self.lo:g}, {self.hi:g})"
        s = f"{self.dtype}{self.shape} {vals}"
        if self.nonzero:
            s += " (0 -> 1)"
        if self.strided:
            s += f" strided (alloc {self.alloc_shape()}, .transpose(-1, -2))"
        return s


def input_specs(case):
    """The Specs of a case's inputs (see the module docs for the value ranges)."""
    fam, op, specs = case["family"], case["op"], []
    for k, inp in enumerate(case["inputs"]):
        shape, dtype, strided = inp["shape"], inp["dtype"], bool(inp.get("strided", False))
        if dtype not in TORCH_DTYPES:
            raise CaseError(f"unknown dtype {dtype!r}")
        if not isinstance(shape, list) or not all(isinstance(d, int) and d >= 0 for d in shape):
            raise CaseError(f"bad shape {shape!r}")
        if strided and len(shape) < 2:
            raise CaseError(f"strided input {k} of rank {len(shape)} < 2")
        if fam == "take" and k == 1:
            if dtype not in ("i32", "i64"):
                raise CaseError(f"take index of dtype {dtype}")
            n = case["inputs"][0]["shape"][case["axis"]]
            specs.append(Spec(shape, dtype, strided, "index", 0, n))
        elif dtype == "bool":
            specs.append(Spec(shape, dtype, strided, "bool"))
        elif dtype in FLOAT_DTYPES:
            positive = (fam == "unary" and op in POSITIVE_UNARY) or (op == "pow" and k == 0)
            lo, hi = (0.5, 1.5) if positive else (-1.0, 1.0)
            specs.append(Spec(shape, dtype, strided, "float", lo, hi))
        else:
            lo, hi = (0, 4) if op == "pow" and k == 1 else (0 if dtype in ("u8", "u32") else -100, 100)
            nonzero = fam == "binary" and op == "div" and k == 1
            specs.append(Spec(shape, dtype, strided, "int", lo, hi, nonzero))
    return specs


def need(case, key):
    if key not in case:
        raise CaseError(f"{case['family']} case without {key!r}")
    return case[key]


def op_expr(case):
    """The timed op as a Python expression of x0, x1, ... (and torch, F, rms_norm)."""
    fam, op, ins = case["family"], case["op"], case["inputs"]
    if fam == "unary":
        if op not in UNARY:
            raise CaseError(f"unknown unary op {op!r}")
        return UNARY[op]
    if fam == "binary":
        if op not in BINARY:
            raise CaseError(f"unknown binary op {op!r}")
        # rill's `div` is true division (integers give f32), as torch.div is.
        return f"{BINARY[op]}(x0, x1)"
    if fam == "cast":
        to = need(case, "to")
        if to not in TORCH_DTYPES:
            raise CaseError(f"unknown dtype {to!r}")
        return f"x0.to(torch.{TORCH_DTYPES[to]})"
    if fam == "where":
        return "torch.where(x0, x1, x2)"
    if fam == "reduce":
        axes, rank = sorted(need(case, "axes")), len(ins[0]["shape"])
        if not axes or any(a < 0 or a >= rank for a in axes) or len(set(axes)) != len(axes):
            raise CaseError(f"bad axes {axes} for rank {rank}")
        dt = ins[0]["dtype"]
        kw = f", dtype=torch.{SUM_DTYPES[dt]}" if op in ("sum", "prod") and dt in SUM_DTYPES else ""
        if op == "prod":  # torch.prod takes one dim: all axes at once, else one by one
            if len(axes) == rank:
                return f"torch.prod(x0{kw})"
            e = "x0"
            for a in reversed(axes):
                e = f"torch.prod({e}, dim={a}{kw})"
            return e
        if op not in REDUCE:
            raise CaseError(f"unknown reduce op {op!r}")
        return f"{REDUCE[op]}(x0, dim={tuple(axes)}{kw})"
    if fam == "argreduce":
        if op not in ("argmax", "argmin"):
            raise CaseError(f"unknown argreduce op {op!r}")
        return f"torch.{op}(x0, dim={int(need(case, 'axis'))})"
    if fam in ("softmax", "log_softmax"):
        return f"torch.{fam}(x0, dim={int(need(case, 'axis'))})"
    if fam in ("layer_norm", "rms_norm"):
        eps, n = float(need(case, "eps")), ins[0]["shape"][-1]
        weight, bias = bool(need(case, "weight")), bool(case.get("bias", False))
        if len(ins) != 1 + weight + bias:
            raise CaseError(f"{fam} with weight {weight}, bias {bias} and {len(ins)} inputs")
        w = "x1" if weight else "None"
        if fam == "rms_norm":
            if bias:
                raise CaseError("rms_norm with a bias")
            return f"rms_norm(x0, ({n},), {w}, eps={eps!r})"
        b = f"x{1 + weight}" if bias else "None"
        return f"F.layer_norm(x0, ({n},), {w}, {b}, eps={eps!r})"
    if fam == "take":
        return f"torch.index_select(x0, {int(need(case, 'axis'))}, x1)"
    if fam == "concatenate":
        xs = ", ".join(f"x{k}" for k in range(len(ins)))
        return f"torch.cat(({xs}), dim={int(need(case, 'axis'))})"
    if fam == "transpose":
        perm = [int(p) for p in need(case, "perm")]
        if sorted(perm) != list(range(len(ins[0]["shape"]))):
            raise CaseError(f"bad perm {perm}")
        return f"x0.permute({tuple(perm)}).contiguous()"
    if fam == "matmul":
        return "torch.matmul(x0, x1)"
    raise CaseError(f"unknown family {fam!r}")


def plan(case):
    """(input Specs, op expression, tf32 or None) of a case; CaseError if it is malformed."""
    try:
        fam = case["family"]
        if fam not in ARITY:
            raise CaseError(f"unknown family {fam!r}")
        lo, hi = ARITY[fam]
        if not lo <= len(case["inputs"]) <= hi:
            raise CaseError(f"{fam} with {len(case['inputs'])} inputs")
        specs, expr = input_specs(case), op_expr(case)
    except (KeyError, IndexError, TypeError, ValueError) as e:
        raise CaseError(f"malformed case: {type(e).__name__} {e}") from None
    compile(expr, case["id"], "eval")
    tf32 = case.get("tf32")
    return specs, expr, (None if tf32 is None else bool(tf32))


def read_cases(path, filt):
    cases = []
    with open(path) as f:
        for n, line in enumerate(f, 1):
            line = line.strip()
            if not line:
                continue
            try:
                c = json.loads(line)
            except json.JSONDecodeError as e:
                sys.exit(f"{path}:{n}: not JSON: {e}")
            if filt is None or filt in c.get("id", ""):
                cases.append(c)
    return cases


def dry_run(cases):
    bad, families = 0, {}
    for c in cases:
        try:
            specs, expr, tf32 = plan(c)
        except (CaseError, SyntaxError) as e:
            bad += 1
            print(f"{c.get('id')}: ERROR {e}")
            continue
        families[c["family"]] = families.get(c["family"], 0) + 1
        ins = "; ".join(f"x{k} = {s.describe()}" for k, s in enumerate(specs))
        flag = "" if tf32 is None else f" [allow_tf32={tf32}]"
        print(f"{c['id']}: {ins} -> {expr}{flag}")
    fams = ", ".join(f"{f} {n}" for f, n in families.items())
    print(f"dry run: {len(cases)} cases, {bad} unplannable ({fams})", file=sys.stderr)
    return 1 if bad else 0


# ---- everything below needs torch ----

def build(torch, spec, seed, dev):
    """One input on the device, from a seeded uniform f32 draw."""
    g = torch.Generator(device=dev)
    g.manual_seed(seed)
    u = torch.rand(spec.alloc_shape(), generator=g, device=dev, dtype=torch.float32)
    dtype = getattr(torch, TORCH_DTYPES[spec.dtype])
    if spec.kind == "bool":
        x = u < 0.5
    else:
        x = u.mul_(spec.hi - spec.lo).add_(spec.lo)
        if spec.kind in ("int", "index"):
            x = x.floor_().clamp_(spec.lo, spec.hi - 1)
        x = x.to(dtype)
        if spec.nonzero:
            x = torch.where(x == 0, torch.ones((), dtype=dtype, device=dev), x)
    del u
    return x.transpose(-1, -2) if spec.strided else x


def time_op(f, sync):
    """Seconds per op: median over repetitions of (8 launches + one sync) / 8."""
    def rep():
        sync()
        t = time.perf_counter()
        outs = [f() for _ in range(COPIES)]
        sync()
        dt = time.perf_counter() - t
        del outs
        return dt
    warm = min(rep() for _ in range(WARMUP))
    reps = min(max(int(TARGET_S / max(warm, 1e-9)), MIN_REPS), MAX_REPS)
    ts = sorted(rep() for _ in range(reps))
    return ts[len(ts) // 2] / COPIES


def short(e):
    lines = str(e).strip().splitlines()
    msg = f"{type(e).__name__}: {lines[0] if lines else ''}"
    return msg[:200]


def run(cases, device):
    import torch
    import torch.nn.functional as F

    if device == "cuda" and not torch.cuda.is_available():
        sys.exit("--device cuda: CUDA is not available")
    if device == "cuda":
        name = torch.cuda.get_device_name(0)
        sync = torch.cuda.synchronize
    else:
        name = f"cpu {platform.processor() or platform.machine()}, {torch.get_num_threads()} threads"
        sync = lambda: None  # noqa: E731
    print(f"torch {torch.__version__} on {name} ({device}), {len(cases)} cases", file=sys.stderr)
    torch.manual_seed(0)

    def rms_fallback(x, shape, w, eps):
        y = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
        return y if w is None else y * w

    rms_norm = getattr(F, "rms_norm", None) or rms_fallback
    matmul_flags = torch.backends.cuda.matmul
    default_tf32 = matmul_flags.allow_tf32
    for n, c in enumerate(cases):
        out = {"id": c.get("id"), "impl": "torch"}
        inputs, env, f = [], {}, None
        try:
            specs, expr, tf32 = plan(c)
            inputs = [build(torch, s, 7 + k, device) for k, s in enumerate(specs)]
            env.update({"torch": torch, "F": F, "rms_norm": rms_norm})
            env.update({f"x{k}": x for k, x in enumerate(inputs)})
            f = eval("lambda: " + expr, env)
            matmul_flags.allow_tf32 = default_tf32 if tf32 is None else tf32
            sync()
            out["seconds"] = time_op(f, sync)
        except Exception as e:  # one case failing (unsupported dtype, OOM, ...) is reported
            out["error"] = short(e)
        finally:
            matmul_flags.allow_tf32 = default_tf32
        print(json.dumps(out), flush=True)
        big = c.get("bytes", 0) > (1 << 30)
        env.clear()  # f's globals: holds the inputs
        del inputs, f
        if device == "cuda" and ("error" in out or big or n % 50 == 49):
            torch.cuda.empty_cache()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("cases", help="case list from `rill bench matrix --list`")
    ap.add_argument("--device", choices=["cuda", "cpu"], help="default: cuda when available")
    ap.add_argument("--filter", help="only the cases whose id contains this text")
    ap.add_argument("--dry-run", action="store_true", help="print the plan, do not import torch")
    a = ap.parse_args()
    cases = read_cases(a.cases, a.filter)
    if a.dry_run:
        sys.exit(dry_run(cases))
    device = a.device
    if device is None:
        import torch
        device = "cuda" if torch.cuda.is_available() else "cpu"
    run(cases, device)


if __name__ == "__main__":
    main()
