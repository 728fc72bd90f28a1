"""Joins `rill bench matrix` times with `bench/torch_matrix.py` times into a report.

    rill bench matrix --list [OPTIONS] > cases.jsonl
    rill bench matrix --cases cases.jsonl > rill.jsonl
    python3 bench/torch_matrix.py cases.jsonl > torch.jsonl
    python3 bench/matrix_report.py cases.jsonl rill.jsonl torch.jsonl [--md OUT.md]
        [--png OUT.png] [--title TEXT] [--all | --rows N] [--worst K] [--fallback-png]
    python3 bench/matrix_report.py --selftest     checks the pure-Python PNG writer

Per case: ratio = torch seconds / rill seconds (>= 1.0: rill at least as fast), rill's
GB/s from `bytes` (GFLOP/s from `flops` for matmul). Prints (and writes to --md) a
Markdown summary (cases compared, shares with ratio >= 1.0 and >= 0.9, geometric mean
ratio per family and per family and dtype, the worst cases of each family (--worst, 5),
missing results) and a table per family, worst ratio first (40 rows unless --all or
--rows). --png draws ratio (log y) against bytes moved (log x), one colour
per family, with lines at 1.0 and 0.9: with matplotlib when it is importable, otherwise
(or with --fallback-png) with a small pure-Python renderer (zlib + struct).
Standard library only; matplotlib optional.
"""
import argparse
import json
import math
import os
import random
import struct
import sys
import tempfile
import zlib

DTYPES = ["f32", "bf16", "f16", "u8", "u32", "i32", "i64"]
FAMILIES = ["unary", "binary", "cast", "where", "reduce", "argreduce", "softmax", "log_softmax",
            "layer_norm", "rms_norm", "take", "concatenate", "transpose", "matmul"]
COLOURS = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2",
           "#7f7f7f", "#bcbd22", "#17becf", "#393b79", "#637939", "#843c39", "#000000"]


def colour(families, fam):
    return COLOURS[families.index(fam) % len(COLOURS)]


def read_jsonl(path, what):
    """The JSON objects of a file, one a line; other lines are counted and skipped."""
    rows, skipped = [], 0
    with open(path) as f:
        for line in f:
            line = line.strip()
            try:
                obj = json.loads(line) if line else None
            except json.JSONDecodeError:
                obj = None
            if isinstance(obj, dict) and "id" in obj:
                rows.append(obj)
            elif line:
                skipped += 1
    if skipped:
        print(f"{path}: skipped {skipped} lines that are not {what} JSON objects", file=sys.stderr)
    return rows


def index(rows, label, notes):
    """id -> row, noting ids that occur more than once (the last one is kept)."""
    out, dups = {}, []
    for r in rows:
        if r["id"] in out and r["id"] not in dups:
            dups.append(r["id"])
        out[r["id"]] = r
    if dups:
        notes.append(f"{len(dups)} ids occur more than once in {label} (the last is used), "
                     f"e.g. {', '.join(dups[:3])}")
    return out


def join(cases, rill, torch):
    """(compared rows, missing {'rill': [(id, why)], 'torch': [...]}, notes)."""
    notes, seen, rows = [], set(), []
    missing = {"rill": [], "torch": []}
    rill, torch = index(rill, "the rill results", notes), index(torch, "the torch results", notes)
    dup_cases = sorted({c["id"] for c in cases if c["id"] in seen or seen.add(c["id"])})
    if dup_cases:
        notes.append(f"{len(dup_cases)} ids occur more than once in the case list (the first "
                     f"is used), e.g. {', '.join(dup_cases[:3])}")
    done = set()
    for c in cases:
        if c["id"] in done:
            continue
        done.add(c["id"])
        secs = {}
        for side, res in (("rill", rill), ("torch", torch)):
            r = res.get(c["id"])
            s = r.get("seconds") if r else None
            if r is None:
                missing[side].append((c["id"], "no result"))
            elif not isinstance(s, (int, float)) or s <= 0:
                missing[side].append((c["id"], str(r.get("error", f"bad seconds {s!r}"))))
            else:
                secs[side] = float(s)
        if len(secs) == 2:
            rows.append({"id": c["id"], "family": c.get("family", "?"), "bytes": c.get("bytes", 0),
                         "flops": c.get("flops", 0), "rill": secs["rill"], "torch": secs["torch"],
                         "ratio": secs["torch"] / secs["rill"]})
    extra = len(set(rill) - done) + len(set(torch) - done)
    if extra:
        notes.append(f"{extra} results have ids that are not in the case list (ignored)")
    return rows, missing, notes


def geomean(xs):
    return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else float("nan")


def share(rows, lo):
    return sum(r["ratio"] >= lo for r in rows) / len(rows) if rows else 0.0


def us(s):
    v = s * 1e6
    return f"{v:.2f}" if v < 10 else f"{v:.1f}" if v < 1000 else f"{v:,.0f}"


def cell(text):
    return str(text).replace("|", "\\|").replace("\n", " ")


def family_order(rows, cases):
    fams = {c.get("family", "?") for c in cases} | {r["family"] for r in rows}
    return [f for f in FAMILIES if f in fams] + sorted(fams - set(FAMILIES))


def dtype_of(case_id):
    """The dtype part of a case id (family/op/dtype/...)."""
    parts = case_id.split("/")
    return parts[2] if len(parts) > 2 else "?"


def report(cases, rows, missing, notes, title, max_rows, worst=5):
    """The Markdown report as a string."""
    out = [f"# {title}", ""]
    n_ids = len({c["id"] for c in cases})
    out.append(f"- cases: {n_ids} listed, **{len(rows)} compared**")
    if rows:
        out.append(f"- ratio = torch time / rill time: >= 1.0 in **{share(rows, 1.0):.1%}** of "
                   f"cases, >= 0.9 in **{share(rows, 0.9):.1%}**; geometric mean "
                   f"**{geomean([r['ratio'] for r in rows]):.3f}**")
    for side in ("rill", "torch"):
        m = missing[side]
        errs = sum(why != "no result" for _, why in m)
        out.append(f"- missing on the {side} side: {len(m)} ({errs} errors, {len(m) - errs} "
                   "without a result)")
    out += [f"- note: {n}" for n in notes]
    fams = family_order(rows, cases)
    out += ["", "| family | compared | geomean ratio | >= 1.0 | >= 0.9 | worst case | worst ratio |",
            "|---|---:|---:|---:|---:|---|---:|"]
    for f in fams:
        fr = [r for r in rows if r["family"] == f]
        if fr:
            w = min(fr, key=lambda r: r["ratio"])
            out.append(f"| {f} | {len(fr)} | {geomean([r['ratio'] for r in fr]):.3f} | "
                       f"{share(fr, 1.0):.0%} | {share(fr, 0.9):.0%} | {cell(w['id'])} | "
                       f"{w['ratio']:.3f} |")
        else:
            out.append(f"| {f} | 0 | - | - | - | - | - |")
    out += ["", "Geometric mean ratio by family and dtype (cases in parentheses):", "",
            "| family | " + " | ".join(DTYPES) + " |", "|---|" + "---:|" * len(DTYPES)]
    for f in fams:
        fr = [r for r in rows if r["family"] == f]
        if not fr:
            continue
        cells = []
        for d in DTYPES:
            dr = [r for r in fr if dtype_of(r["id"]) == d]
            cells.append(f"{geomean([r['ratio'] for r in dr]):.2f} ({len(dr)})" if dr else "-")
        out.append(f"| {f} | " + " | ".join(cells) + " |")
    if worst:
        out += ["", f"The {worst} worst cases of each family:", ""]
        for f in fams:
            fr = sorted((r for r in rows if r["family"] == f), key=lambda r: r["ratio"])[:worst]
            if fr:
                out.append(f"- **{f}**: " + ", ".join(f"`{r['id']}` {r['ratio']:.2f}" for r in fr))
    for side in ("rill", "torch"):  # missing results grouped by reason, most frequent first
        groups = {}
        for i, why in missing[side]:
            groups.setdefault(why, []).append(i)
        if groups:
            out += ["", f"Missing on the {side} side, by reason:", ""]
            top = sorted(groups.items(), key=lambda g: -len(g[1]))
            out += [f"- {len(ids)} × {cell(why)[:160]} (e.g. `{ids[0]}`)" for why, ids in top[:10]]
    for f in fams:
        fr = sorted((r for r in rows if r["family"] == f), key=lambda r: r["ratio"])
        if not fr:
            continue
        unit = "GFLOP/s" if f == "matmul" else "GB/s"
        shown = fr if max_rows is None else fr[:max_rows]
        more = "" if len(shown) == len(fr) else f", the {len(shown)} worst shown"
        out += ["", f"## {f}: {len(fr)} cases, geometric mean ratio "
                f"{geomean([r['ratio'] for r in fr]):.3f}{more}", "",
                f"| case | rill µs | torch µs | rill {unit} | ratio |", "|---|---:|---:|---:|---:|"]
        for r in shown:
            work = r["flops"] if f == "matmul" and r["flops"] else r["bytes"]
            out.append(f"| {cell(r['id'])} | {us(r['rill'])} | {us(r['torch'])} | "
                       f"{work / r['rill'] / 1e9:,.1f} | {r['ratio']:.3f} |")
    return "\n".join(out) + "\n"


# ---- the chart ----

def points_by_family(rows, fams):
    return [(f, [(r["bytes"], r["ratio"]) for r in rows if r["family"] == f and r["bytes"] > 0])
            for f in fams]


def chart_matplotlib(path, series, fams, title):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker
    fig, ax = plt.subplots(figsize=(12, 7), dpi=110)
    for f, pts in series:
        if pts:  # small families drawn on top
            ax.scatter([p[0] for p in pts], [p[1] for p in pts], s=12, color=colour(fams, f),
                       label=f"{f} ({len(pts)})", alpha=0.8, linewidths=0, zorder=3 - len(pts) / 1e6)
    ax.axhline(1.0, color="black", lw=1.2)
    ax.axhline(0.9, color="black", lw=1, ls="--")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ys = [p[1] for _, pts in series for p in pts] or [1.0]
    lo, hi = min(min(ys), 0.8) / 1.1, max(max(ys), 1.25) * 1.1
    ax.set_ylim(lo, hi)  # plain tick labels (0.5, 0.9, 1, 2) rather than 9x10^-1
    ax.set_yticks([t for t in (.01, .02, .05, .1, .2, .5, .9, 1, 2, 5, 10, 20, 50, 100) if lo <= t <= hi])
    ax.yaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda v, _: f"{v:g}"))
    ax.yaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
    ax.set_xlabel("bytes moved (read + written)")
    ax.set_ylabel("ratio = torch time / rill time")
    ax.set_title(title)
    ax.grid(True, which="major", alpha=0.3)
    ax.legend(loc="center left", bbox_to_anchor=(1.01, 0.5), fontsize=9)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


# A 3x5 pixel font: five rows of three bits (4 = left), upper-case shapes for letters.
FONT = {g[0]: g[2:] for g in (
    "0:75557 1:26227 2:71747 3:71317 4:55711 5:74717 6:74757 7:71122 8:75757 9:75717 "
    "a:25755 b:65656 c:34443 d:65556 e:74647 f:74644 g:34553 h:55755 i:72227 j:11152 "
    "k:55655 l:44447 m:57755 n:65555 o:25552 p:65644 q:25563 r:65655 s:34216 t:72222 "
    "u:55557 v:55552 w:55775 x:55255 y:55222 z:71247 .:00002 _:00007 -:00700 /:11244 "
    "=:07070 (:12221 ):42224 ,:00024 ::02020 >:42124 <:12421 +:02720 %:51245 ^:25000").split()}


class Canvas:
    """An RGB image with the few primitives the chart needs."""

    def __init__(self, w, h):
        self.w, self.h = w, h
        self.px = bytearray(b"\xff" * (w * h * 3))

    def set(self, x, y, c):
        if 0 <= x < self.w and 0 <= y < self.h:
            i = 3 * (y * self.w + x)
            self.px[i:i + 3] = c

    def rect(self, x0, y0, x1, y1, c):
        for y in range(max(y0, 0), min(y1, self.h)):
            for x in range(max(x0, 0), min(x1, self.w)):
                self.set(x, y, c)

    def hline(self, x0, x1, y, c, dash=0):
        for x in range(x0, x1):
            if not dash or (x // dash) % 2 == 0:
                self.set(x, y, c)

    def dot(self, cx, cy, r, c):
        for y in range(-r, r + 1):
            for x in range(-r, r + 1):
                if x * x + y * y <= r * r + r:
                    self.set(cx + x, cy + y, c)

    def text(self, x, y, s, c, scale=2):
        for ch in s.lower():
            rows = FONT.get(ch, "00000")
            for j, row in enumerate(rows):
                for i in range(3):
                    if int(row) >> (2 - i) & 1:
                        self.rect(x + i * scale, y + j * scale, x + (i + 1) * scale, y + (j + 1) * scale, c)
            x += 4 * scale

    def png(self):
        raw = b"".join(b"\x00" + bytes(self.px[3 * y * self.w:3 * (y + 1) * self.w]) for y in range(self.h))

        def chunk(tag, data):
            return struct.pack(">I", len(data)) + tag + data + struct.pack(">I", zlib.crc32(tag + data))
        ihdr = struct.pack(">IIBBBBB", self.w, self.h, 8, 2, 0, 0, 0)
        return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(raw, 9))
                + chunk(b"IEND", b""))


def rgb(hexcolour):
    return bytes(int(hexcolour[k:k + 2], 16) for k in (1, 3, 5))


def chart_fallback(path, series, fams, title):
    """The chart without matplotlib: log-log axes, gridlines, dots, lines at 1.0 and 0.9,
    a legend of coloured squares with the family names (3x5 pixel font)."""
    W, H, L, R, T, B = 1200, 720, 70, 960, 50, 660
    cv = Canvas(W, H)
    xs = [p[0] for _, pts in series for p in pts] or [1e3, 1e9]
    ys = [p[1] for _, pts in series for p in pts] or [1.0]
    x0 = max(math.floor(math.log10(min(xs))), 0)
    x1 = max(math.ceil(math.log10(max(xs))), x0 + 1)
    y0, y1 = math.log10(min(min(ys), 0.8) / 1.1), math.log10(max(max(ys), 1.25) * 1.1)
    px = lambda b: round(L + (math.log10(b) - x0) / (x1 - x0) * (R - L))  # noqa: E731
    py = lambda r: round(B - (math.log10(r) - y0) / (y1 - y0) * (B - T))  # noqa: E731
    grid, minor, ink = rgb("#c8c8c8"), rgb("#ececec"), rgb("#000000")
    for k in range(x0, x1 + 1):
        cv.rect(px(10 ** k), T, px(10 ** k) + 1, B, grid)
        cv.text(px(10 ** k) - 8, B + 10, f"{10 ** (k % 3)}{' kmgtp'[k // 3]}".strip(), ink)
    for k in range(math.floor(y0), math.ceil(y1) + 1):
        for m in (1, 2, 5):
            r = m * 10.0 ** k
            if y0 <= math.log10(r) <= y1:
                cv.hline(L, R, py(r), grid if m == 1 else minor)
                cv.text(8, py(r) - 5, f"{r:g}", ink)
    cv.hline(L, R, py(1.0), ink)
    cv.hline(L, R, py(0.9), ink, dash=6)
    cv.text(R - 40, py(0.9) + 4, "0.9", ink)
    for f, pts in sorted(series, key=lambda s: -len(s[1])):  # small families on top
        for b, r in pts:
            cv.dot(px(b), py(r), 3, rgb(colour(fams, f)))
    for x in (L, R):
        cv.rect(x, T, x + 1, B + 1, ink)
    for y in (T, B):
        cv.rect(L, y, R + 1, y + 1, ink)
    y = T
    for f, pts in series:
        if pts:
            cv.rect(R + 20, y, R + 32, y + 12, rgb(colour(fams, f)))
            cv.text(R + 40, y + 1, f"{f} {len(pts)}", ink)
            y += 22
    cv.text(L, 16, title, ink)
    cv.text(L, H - 24, "x: bytes moved   y: torch time / rill time   lines: 1.0 and 0.9 (dashed)", ink)
    with open(path, "wb") as fh:
        fh.write(cv.png())


def chart(path, rows, fams, title, force_fallback=False):
    series = points_by_family(rows, fams)
    if not force_fallback:
        try:
            chart_matplotlib(path, series, fams, title)
            return "matplotlib"
        except ImportError:
            pass
    chart_fallback(path, series, fams, title)
    return "fallback renderer"


def check_png(path):
    """(width, height) of a valid 8-bit RGB PNG (signature, chunk CRCs, pixel data size)."""
    data = open(path, "rb").read()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "bad signature"
    pos, idat, size = 8, b"", None
    while pos < len(data):
        n, tag = struct.unpack(">I4s", data[pos:pos + 8])
        body = data[pos + 8:pos + 8 + n]
        assert struct.unpack(">I", data[pos + 8 + n:pos + 12 + n])[0] == zlib.crc32(tag + body), tag
        if tag == b"IHDR":
            size = struct.unpack(">II", body[:8])
            depth, ctype = body[8], body[9]
        elif tag == b"IDAT":
            idat += body
        pos += 12 + n
        if tag == b"IEND":
            break
    assert size and tag == b"IEND", "missing IHDR or IEND"
    if depth == 8 and ctype == 2:  # ours; matplotlib writes RGBA (6)
        assert len(zlib.decompress(idat)) == size[1] * (1 + 3 * size[0]), "bad pixel data size"
    return size


def selftest():
    """Synthetic cases and results: report, fallback PNG (checked and read back)."""
    rnd = random.Random(1)
    cases, rill, torch = [], [], []
    for f in FAMILIES:
        for k in range(12):
            cid, nbytes = f"{f}/op/f32/{k}", 2 ** rnd.randint(12, 31)
            cases.append({"id": cid, "family": f, "op": "op", "bytes": nbytes,
                          "flops": nbytes * 100 if f == "matmul" else 0})
            t = 1e-5 + nbytes / 4e12
            rill.append({"id": cid, "impl": "rill", "seconds": t})
            torch.append({"id": cid, "impl": "torch", "seconds": t * math.exp(rnd.gauss(0, 0.3))})
    torch[3] = {"id": torch[3]["id"], "impl": "torch", "error": "unsupported"}
    rows, missing, notes = join(cases, rill, torch)
    md = report(cases, rows, missing, notes, "selftest", 40)
    assert len(rows) == len(cases) - 1 and len(missing["torch"]) == 1 and "## matmul" in md, md
    assert "worst cases of each family" in md and "| matmul | " in md, md
    path = os.path.join(tempfile.mkdtemp(), "selftest.png")
    chart(path, rows, family_order(rows, cases), "selftest: synthetic data", force_fallback=True)
    w, h = check_png(path)
    print(f"selftest ok: {len(rows)} rows, fallback PNG {w}x{h} at {path}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("files", nargs="*", metavar="CASES RILL TORCH")
    ap.add_argument("--md", help="write the Markdown report here too")
    ap.add_argument("--png", help="write the ratio chart here")
    ap.add_argument("--title", default="rill vs torch: benchmark matrix")
    ap.add_argument("--all", action="store_true", help="every row of every family's table")
    ap.add_argument("--rows", type=int, default=40, help="rows per family table (default 40)")
    ap.add_argument("--worst", type=int, default=5, help="worst cases listed per family (default 5)")
    ap.add_argument("--fallback-png", action="store_true", help="do not use matplotlib")
    ap.add_argument("--selftest", action="store_true", help="check the report and PNG writer")
    a = ap.parse_args()
    if a.selftest:
        selftest()
        return
    if len(a.files) != 3:
        ap.error("expects CASES.jsonl RILL.jsonl TORCH.jsonl (or --selftest)")
    cases = read_jsonl(a.files[0], "case")
    rows, missing, notes = join(cases, read_jsonl(a.files[1], "result"), read_jsonl(a.files[2], "result"))
    md = report(cases, rows, missing, notes, a.title, None if a.all else a.rows, a.worst)
    sys.stdout.write(md)
    if a.md:
        with open(a.md, "w") as f:
            f.write(md)
    if a.png:
        how = chart(a.png, rows, family_order(rows, cases), a.title, a.fallback_png)
        print(f"wrote {a.png} ({how}, {len(rows)} points)", file=sys.stderr)


if __name__ == "__main__":
    main()
