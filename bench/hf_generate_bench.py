"""Peer of `rill bench generate`: Hugging Face transformers on the same GGUF file.
    python3 bench/hf_generate_bench.py --model FILE.gguf [--device cuda|cpu] [--dtype f32|bf16|f16]
        [--prefill 512] [--batch 1,64] [--new-tokens 128] [--reps 3]
FILE.gguf is the file `rill bench generate` reads (the default model in rill's model cache,
see docs/IO.md). transformers dequantizes every tensor when it loads a GGUF, so it runs
dense weights in the dtype given; rill reads the packed blocks.

Prints the same JSON lines as `rill bench generate` with "impl": "transformers":
- generate:prefill:p<P>: one forward pass over P tokens (a fresh cache), logits computed;
- generate:decode:b<B>:n<N>: B prompts of 16 tokens, N new tokens each, greedy, end of
  sequence ignored; seconds is generate(N) minus generate(1) (the N - 1 decode steps after
  the first token), tokens_per_s is B * (N - 1) / seconds.
The token ids come from the generator of crates/rill-cli/src/bench_generate.rs. Each figure
is the median of repeated runs after a warm-up run."""
import argparse
import json
import os
import statistics
import time

import torch
from transformers import AutoModelForCausalLM

MASK = (1 << 64) - 1
DECODE_PROMPT = 16


def token_ids(state, n, vocab):
    span = max(vocab - 100, 1)
    out = []
    for _ in range(n):
        state = (state * 6364136223846793005 + 1442695040888963407) & MASK
        out.append(100 + (state >> 33) % span)
    return state, out


def ints(text):
    return [int(x) for x in text.split(",") if x]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--dtype", default="f32", choices=["f32", "bf16", "f16"])
    ap.add_argument("--prefill", type=ints, default=[512])
    ap.add_argument("--batch", type=ints, default=None)
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--reps", type=int, default=3)
    args = ap.parse_args()
    if args.new_tokens < 2:
        raise SystemExit("--new-tokens must be at least 2")
    dev = torch.device(args.device)
    dtype = {"f32": torch.float32, "bf16": torch.bfloat16, "f16": torch.float16}[args.dtype]
    if dev.type == "cpu":
        torch.set_num_threads(max(1, os.cpu_count() or 1))
    d, f = os.path.split(os.path.abspath(args.model))
    model = AutoModelForCausalLM.from_pretrained(d, gguf_file=f, dtype=dtype).to(dev).eval()
    vocab = model.config.vocab_size
    batches = args.batch or ([1, 64] if dev.type == "cuda" else [1])

    def sync():
        if dev.type == "cuda":
            torch.cuda.synchronize()

    def median(fn):
        fn()
        return statistics.median(fn() for _ in range(max(1, args.reps)))

    with torch.inference_mode():
        for p in args.prefill:
            _, ids = token_ids(42, p, vocab)
            x = torch.tensor([ids], device=dev)

            def prefill():
                sync()
                t = time.perf_counter()
                model(x, use_cache=True).logits[:, -1].float().cpu()
                sync()
                return time.perf_counter() - t

            s = median(prefill)
            print(json.dumps({"id": f"generate:prefill:p{p}", "impl": "transformers", "dtype": args.dtype,
                              "seconds": round(s, 6)}), flush=True)
        n = args.new_tokens
        for b in batches:
            state, rows = 7, []
            for _ in range(b):
                state, ids = token_ids(state, DECODE_PROMPT, vocab)
                rows.append(ids)
            x = torch.tensor(rows, device=dev)
            mask = torch.ones_like(x)

            def gen(k):
                sync()
                t = time.perf_counter()
                out = model.generate(x, attention_mask=mask, max_new_tokens=k, min_new_tokens=k, do_sample=False,
                                     eos_token_id=None, pad_token_id=0)
                out.cpu()
                sync()
                assert out.shape[1] == DECODE_PROMPT + k
                return time.perf_counter() - t

            s = median(lambda: gen(n) - gen(1))
            print(json.dumps({"id": f"generate:decode:b{b}:n{n}", "impl": "transformers", "dtype": args.dtype,
                              "seconds": round(s, 6), "tokens_per_s": round(b * (n - 1) / s, 1)}), flush=True)


if __name__ == "__main__":
    main()
