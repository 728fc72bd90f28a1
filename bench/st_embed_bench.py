"""Peer of `rill bench embed`: sentence-transformers on the same sentences, end to end
(strings in, normalised float32 vectors on the host out), same batch size, same lines:
    python3 bench/st_embed_bench.py --model DIR [--device cuda|cpu]
DIR is the model directory `rill bench embed --model DIR` reads. Prints, for fp32 and
(on a GPU) fp16, sentences per second for batches of 128 sentences of about 100 tokens
and the latency of one short sentence: the median of repeated runs after a warm-up."""
import argparse
import time

import torch
from sentence_transformers import SentenceTransformer

# The generator and words of crates/rill-cli/src/bench_embed.rs.
WORDS = (
    "the of and to in is was for on that with as by at from his her an they which this are were be has "
    "had it not or but one all new more also after first two time would some other there people year world "
    "city state into about over its only most like during between many made such under three where school"
).split()
assert len(WORDS) == 64
SHORT = "A short sentence."
MASK = (1 << 64) - 1


def sentences(n, words):
    x = 42
    out = []
    for _ in range(n):
        s = []
        for _ in range(words):
            x = (x * 6364136223846793005 + 1442695040888963407) & MASK
            s.append(WORDS[(x >> 33) % len(WORDS)])
        out.append(" ".join(s) + ".")
    return out


def median_secs(f, warm, reps, sync):
    for _ in range(warm):
        f()
    ts = []
    for _ in range(reps):
        sync()
        t = time.perf_counter()
        f()
        sync()
        ts.append(time.perf_counter() - t)
    ts.sort()
    return ts[len(ts) // 2]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = ap.parse_args()
    gpu = args.device.startswith("cuda")
    sync = torch.cuda.synchronize if gpu else (lambda: None)
    batch = 128
    batches = 16 if gpu else 2
    texts = sentences(batch * batches, 97)
    name = torch.cuda.get_device_name(0) if gpu else "cpu"
    print(f"sentence-transformers on {name} (torch {torch.__version__}): {args.model}")
    for label, half in [("f32", False), ("f16", True)] if gpu else [("f32", False)]:
        model = SentenceTransformer(args.model, device=args.device)
        if half:
            model.half()
        model.eval()
        tokens = sum(len(model.tokenizer(t, truncation=True, max_length=model.max_seq_length)["input_ids"]) for t in texts)
        mean_tokens = tokens / len(texts)

        def run_batch():
            model.encode(texts, batch_size=batch, convert_to_numpy=True)

        with torch.inference_mode():
            t = median_secs(run_batch, 1, 10 if gpu else 3, sync)
            print(
                f"embed    {label} batch {batch} x {mean_tokens:.0f} tokens: {len(texts) / t:9.1f} sentences/s"
                f"  ({t / batches * 1e3:8.3f} ms per batch)"
            )
            t = median_secs(lambda: model.encode([SHORT], convert_to_numpy=True), 3, 200 if gpu else 20, sync)
            print(f"embed    {label} one short sentence: {t * 1e3:8.3f} ms")
        del model


if __name__ == "__main__":
    main()
