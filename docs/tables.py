"""Render the docs' generated tables from their sources: the headline benchmark table (README.md, docs/README.md,
docs/benchmarks.md), every other table of docs/benchmarks.md that has a JSON in docs/data/ (with the sentences that
state numbers about it) and the rule table (docs/README.md) from te_compile/tuning/rules.py.

    python docs/tables.py           rewrite the tables between their marker comments
    python docs/tables.py --check   exit 1 (and say where) if a table differs from what its source gives

A table sits between ``<!-- table:NAME begin -->`` and ``<!-- table:NAME end -->`` in each file TABLES names for
it. To publish a newer headline run: put its JSON (``bench/sweep.py --part flex --shape 2,16,4096,128 --always
--control --json``, with ``--flash`` for the FLASH columns) in docs/data/, point HEADLINE at it, run this script;
likewise HOST_TIMES for ``bench/host_time.py --json`` and the paths named above each renderer of docs/benchmarks.md. A renderer checks
what its text says in words against the JSON (``_need``) and stops where they disagree.
"""

from __future__ import annotations

import json
import math
import os
import re
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NAME = "flex-headline"
#: the headline (README.md, docs/README.md): the default policy's training steps on the native call path
HEADLINE = "docs/data/sweep-flex-flash-h200-919-2026-11-28-2x16x4096x128.json"
HEADLINE_COMMAND = "bench/sweep.py --part flex --shape 2,16,4096,128 --always --control"

# file -> how it links to docs/data/
TARGETS = {"docs/README.md": "data/", "docs/benchmarks.md": "data/"}
#: the README's one results table: a few rows of the headline run, and one headline figure
README_NAME = "readme-results"
#: the README's rows: the newest default-policy run at the headline's shape (the rules as they are)
README_SOURCE = "docs/data/sweep-flex-default-h200-919-2026-11-29-2x16x4096x128.json"
README_ROWS = ("flex causal", "flex sliding <", "flex softcap + causal", "flex ALiBi", "flex prefix-LM")

# rows whose decision or meaning changed since the run, marked in the table itself (case -> what changed)
SINCE = {
    "flex sliding <=": "served since from 4096 tokens (the default-policy table in docs/benchmarks.md)",
    "flex sliding <": "served since from 4096 tokens (the default-policy table in docs/benchmarks.md)",
    "flex ALiBi + causal": "served since (cuDNN's built-in ALiBi, for cuDNN's own slopes), not re-measured",
    "flex document": "both sides ran torch.compile's own code: its ratio is noise (a later run: parity)",
}

# bench/sweep.py's case names -> what the variant is (W, P, softcap and slopes as bench/sweep.py defines them)
VARIANTS = {
    "flex none": "no mask",
    "flex causal": "causal",
    "flex sliding <=": "causal sliding window, W = 1024 (`q - kv <= W`)",
    "flex sliding <": "causal sliding window, W = 1024 (`q - kv < W`)",
    "flex softcap": "softcap 30",
    "flex softcap + causal": "softcap 30 + causal",
    "flex ALiBi": "ALiBi",
    "flex ALiBi + causal": "ALiBi + causal",
    "flex prefix-LM": "prefix-LM (512 prefix keys)",
    "flex document": "document mask (4 documents) + causal",
}


def _site(row: dict) -> str:
    if row["served"]:
        return "cuDNN"
    reason = row["reason"]
    if reason.startswith("kept for speed"):
        return "kept for speed"
    if "document-style mask" in reason:
        return "kept (sparse document mask)"
    return "kept"


def _geomean(xs: list[float]) -> float:
    return math.exp(sum(math.log(x) for x in xs) / len(xs))


def render_headline(link_prefix: str) -> str:
    """The headline block: per flex variant, the default policy's training step against plain torch.compile's, with
    plain torch.compile against itself (A/A) and both sides' kernel time per step (profiler)."""
    data = _json(HEADLINE)
    rows = data["rows"]
    flash = any(r.get("ratio_vs_FLASH") for r in rows)  # a run with --flash: the FLASH backend's columns too
    b, h, s, d = rows[0]["shape"][:4]
    out = [GENERATED,
           f"flex_attention as a training step (forward + backward of one call, {b}x{h}x{s}x{d} bf16), te_compile with "
           f"its default policy against plain `torch.compile`, in one process. **{data['device']}, torch "
           f"{data['torch']}, cuDNN {_ver(data['cudnn'])}, native call path, {data['date']}**; `{HEADLINE_COMMAND}{' --flash' * flash}`; ms "
           "per step (each side's best median over alternating rounds); ratio = torch.compile's ms / te_compile's "
           "(> 1: te_compile is faster); A/A = plain torch.compile against itself, the noise floor. Raw rows: "
           f"[{os.path.basename(HEADLINE)}]({link_prefix}{os.path.basename(HEADLINE)}).", "",
           "| variant | te_compile runs it on | te_compile ms | torch.compile (Inductor flex) ms | vs torch.compile "
           "| A/A | kernels per step, te_compile / torch.compile ms |" + (" FLASH backend (FA4) ms | vs FLASH |" if flash else ""),
           "|---|---|---|---|---|---|---|" + ("---|---|" if flash else "")]
    for r in rows:
        lo, hi = _aa(r)
        out.append(f"| {VARIANTS.get(r['case'], r['case'])} | {_site(r)} | {r['te_compile']['ms']:.3f} "
                   f"| {r['torch.compile']['ms']:.3f} | {r['ratio']:.2f}x | {_span([lo, hi])}x "
                   f"| {r['te_compile']['kernel_ms']:.3f} / {r['torch.compile']['kernel_ms']:.3f} |"
                   + ((f" {r['FLASH']['ms']:.3f} | {r['ratio_vs_FLASH']:.2f}x |" if r.get("ratio_vs_FLASH")
                       else " - | - |") if flash else ""))
    served = [r for r in rows if r["served"]]
    below = [r for r in served if r["ratio"] < 1.0]
    out += ["", f"Where te_compile serves the call on cuDNN ({len(served)} of {len(rows)} variants) the ratio is "
            f"{_span([r['ratio'] for r in served])}x (geometric mean {_geomean([r['ratio'] for r in served]):.2f}x), "
            f"and its kernels per step are "
            f"{_span([r['torch.compile']['kernel_ms'] / r['te_compile']['kernel_ms'] for r in served])}x as fast as "
            "torch.compile's; a kept call runs torch.compile's own code on both sides."
            + "".join(f" The {VARIANTS.get(r['case'], r['case'])} ran {r['ratio']:.2f}x, within torch.compile's own "
                      f"spread (A/A {_span(list(_aa(r)))}x): a step of {r['te_compile']['host_us'] / 1000:.2f} ms of "
                      f"host time against {r['te_compile']['kernel_ms']:.2f} ms of kernels is host-bound."
                      for r in below if r["ratio"] >= min(_aa(r)))
            + (f" Against the FLASH backend (FA4, plain torch.compile with `kernel_options={{\"BACKEND\": \"FLASH\"}}`) "
               f"the served rows run {_span([r['ratio_vs_FLASH'] for r in served if r.get('ratio_vs_FLASH')])}x."
               if flash else "")
            + "".join(f" The kept {VARIANTS.get(r['case'], r['case'])} ran {r['ratio']:.2f}x (A/A {_span(list(_aa(r)))}x) "
                      f"with the same kernels on both sides ({r['te_compile']['kernel_ms']:.3f} / "
                      f"{r['torch.compile']['kernel_ms']:.3f} ms): both run torch.compile's code, so that is the "
                      "measurement's noise." for r in rows if not r["served"] and r["ratio"] < min(1.0, *_aa(r)))]
    if any(r["ratio"] < min(_aa(r)) for r in below):
        raise SystemExit("docs/tables.py: a served headline row is slower than torch.compile beyond its A/A spread: "
                         "the headline's text does not cover that")
    return "\n".join(out)


def render_readme(link_prefix: str) -> str:
    """The README's results: a few variants of the headline run (training steps) and one headline figure, the
    geometric mean of te_compile / torch.compile over the variants served on cuDNN."""
    data = _json(README_SOURCE)
    rows = data["rows"]
    served = [r for r in rows if r["served"]]
    b, h, s, d = rows[0]["shape"][:4]
    pick = [r for name in README_ROWS for r in rows if r["case"] == name]
    _need(len(pick) == len(README_ROWS), f"the README's rows {README_ROWS} in {README_SOURCE}")
    out = [GENERATED,
           f"**A flex_attention training step is {_geomean([r['ratio'] for r in served]):.2f}x as fast as plain "
           f"`torch.compile`'s** (geometric mean over the {len(served)} of {len(rows)} variants te_compile serves on "
           f"cuDNN; {data['device']}, torch {data['torch']}, cuDNN {_ver(data['cudnn'])}, {b}x{h}x{s}x{d} bf16, "
           f"{data['date']}, [raw rows]({link_prefix}{os.path.basename(README_SOURCE)})). "
           "A variant it keeps runs torch.compile's own code. Some of the rows:", "",
           "| variant | runs on | te_compile ms | torch.compile ms | speedup |", "|---|---|---|---|---|"]
    for r in pick:
        out.append(f"| {VARIANTS.get(r['case'], r['case'])} | {_site(r)} | {r['te_compile']['ms']:.3f} "
                   f"| {r['torch.compile']['ms']:.3f} | {r['ratio']:.2f}x |")
    return "\n".join(out)


def render(link_prefix: str) -> str:
    """The FLASH table block (without its markers) for a file that reaches docs/data/ as ``link_prefix``."""
    rows, meta = _load()
    shape = {tuple(r["shape"]) for r in rows}
    if len(shape) != 1:
        raise SystemExit(f"docs/tables.py: one shape expected, got {sorted(shape)}")
    b, h, s, d, _ = rows[0]["shape"]
    links = ", ".join(f"[{os.path.basename(p)}]({link_prefix}{os.path.basename(p)})" for p in SOURCES)
    out = [
        "<!-- generated by docs/tables.py from the JSON named below; edit the JSON or the script, not this table -->",
        f"flex_attention as a training step (forward + backward of one call, {b}x{h}x{s}x{d} bf16), "
        f"te_compile with its default `serve=\"fastest\"` against plain `torch.compile`. "
        f"**{meta['gpu']}, torch {meta['torch']}, {CUDNN}, {meta['date']}**; `{COMMAND}`; "
        f"ms per step (each side's best median over alternating rounds); ratio = the other side's ms / te_compile's (> 1: te_compile is faster). Raw rows: {links}.",
        "",
        "| variant | te_compile runs it on | te_compile ms | torch.compile (Inductor flex) ms | vs torch.compile "
        "| FLASH backend (FA4) ms | vs FLASH |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        since = f"; {SINCE[r['case']]}" if r["case"] in SINCE else ""
        out.append(f"| {VARIANTS.get(r['case'], r['case'])} | {_site(r)}{since} | {r['te_compile']['ms']:.3f} "
                   f"| {r['torch.compile']['ms']:.3f} | {r['ratio']:.2f}x | {r['FLASH']['ms']:.3f} "
                   f"| {r['ratio_vs_FLASH']:.2f}x |")
    ratios, flash = [r["ratio"] for r in rows], [r["ratio_vs_FLASH"] for r in rows]
    out.append(f"| **geometric mean ({len(rows)} variants)** | | | | **{_geomean(ratios):.2f}x** "
               f"(min {min(ratios):.2f}x) | | **{_geomean(flash):.2f}x** (min {min(flash):.2f}x) |")
    served = [r["ratio"] for r in rows if r["served"]]
    out += ["", f"Where te_compile serves the call on cuDNN ({len(served)} of {len(rows)} variants) its step is "
            f"{min(served):.2f}x-{max(served):.2f}x as fast as torch.compile's (geometric mean "
            f"{_geomean(served):.2f}x); a kept call runs torch.compile's own code on both sides."]
    return "\n".join(out)


#: one block per card
HOST_TIMES = ("docs/data/host-time-h200-919-2026-11-28-allowlist.json",)
#: bench/host_time.py's call names -> the table's row labels, in the table's order
HOST_ROWS = (("te op fwd (native)", "te op fwd, native"), ("te op fwd (native, no replays)", "te op fwd, native, no replays"),
             ("te op fwd (python)", "te op fwd, Python path"), ("aten cuDNN SDPA fwd", "aten cuDNN SDPA fwd"),
             ("te op bwd (native)", "te op bwd, native"), ("te op bwd (native, no replays)", "te op bwd, native, no replays"),
             ("te op bwd (python)", "te op bwd, Python path"), ("aten cuDNN SDPA bwd", "aten cuDNN SDPA bwd"))
#: per kind of compiled call ("fwd", "train"): bench/host_time.py's call names -> row labels
COMPILED_ROWS = (("compiled flex {kind} (te_compile)", "te_compile"),
                 ("compiled flex {kind} (te_compile, no replays)", "te_compile, no replays"),
                 ("compiled flex {kind} (te_compile, through Inductor)",
                  "te_compile, its graph through Inductor (`TE_COMPILE_DIRECT=0`)"),
                 ("compiled flex {kind} (te_compile, site kept)", "te_compile, its site kept (`serve=\"fastest\"`, every class kept)"),
                 ("compiled flex {kind} (Inductor)", "torch.compile (Inductor)"),
                 ("compiled flex {kind} (Inductor, A/A)", "torch.compile (Inductor), measured again (A/A)"))
COMPILED_KINDS = (("fwd", "A compiled flex forward call (no grad; te_compile with `serve=\"always\"`)"),
                  ("train", "A compiled flex training call (forward, then `torch.autograd.grad`; te_compile with "
                            "`serve=\"always\"`)"))


def _grid(rows: list, names: tuple, prefix: str) -> list[str]:
    """One row per (call, label) of ``names``, one column per (shape, variant) of the calls starting with ``prefix``."""
    cols: list[tuple] = []
    for r in rows:
        col = (tuple(r["shape"]), r["variant"])
        if r["call"].startswith(prefix) and col not in cols:
            cols.append(col)
    cell = {(r["call"], tuple(r["shape"]), r["variant"]): r["host_us"] for r in rows}
    out = ["| call | " + " | ".join(f"{'x'.join(map(str, shape))} {variant}" for shape, variant in cols) + " |",
           "|---|" + "---|" * len(cols)]
    for call, label in names:
        if not any(c == call for c, _, _ in cell):  # a row this run did not measure
            continue
        out.append(f"| {label} | " + " | ".join(f"{cell[(call, shape, variant)]:.1f}" for shape, variant in cols) + " |")
    return out


def render_host_time(link_prefix: str) -> str:
    """Host µs per call from bench/host_time.py's JSON, one block per card: the op calls, then the compiled flex
    calls."""
    out = ["<!-- generated by docs/tables.py from the JSON named below; edit the JSON or the script, not this table -->"]
    for path in HOST_TIMES:
        out += _host_time_block(path, link_prefix)
    return "\n".join(out).rstrip()


def _host_time_block(path: str, link_prefix: str) -> list[str]:
    with open(os.path.join(ROOT, path)) as f:
        data = json.load(f)
    name = os.path.basename(path)
    out = [f"Host µs per call, **{data['device']} ({data['host']}), torch {data['torch']}, cuDNN "
           f"{data['cudnn'] // 10000}.{data['cudnn'] // 100 % 100}, {data['date']}**; loops of {data['iters']} calls, "
           f"median of {data['repeats']} rounds; raw rows: "
           f"[{name}]({link_prefix}{name}).", "", "The ops, called as a compiled graph calls them:", ""]
    out += _grid(data["rows"], HOST_ROWS, ("te op", "aten"))
    cell = {(r["call"], tuple(r["shape"]), r["variant"]): r["host_us"] for r in data["rows"]}
    ops = [(shape, variant) for (call, shape, variant) in cell if call == "te op fwd (native)"]
    op_wins = sum(cell[(f"te op {d} (native)", *c)] < cell[(f"aten cuDNN SDPA {d}", *c)] for c in ops for d in ("fwd", "bwd"))
    summary = [f"With replays the te op costs less host time than aten's cuDNN SDPA op in {op_wins} of {2 * len(ops)} "
               f"calls (forward and backward)."]
    if not any("through Inductor" in r["call"] for r in data["rows"]):
        summary.append("This run predates te_compile's direct call of a graph of only its ops (te_compile.runtime.direct): "
                       "its compiled calls went through Inductor.")
    for kind, title in COMPILED_KINDS:
        names = tuple((call.format(kind=kind), label) for call, label in COMPILED_ROWS)
        if not any(call == names[0][0] for call, _, _ in cell):  # a run without this kind of call
            continue
        out += ["", f"{title}:", ""] + _grid(data["rows"], names, f"compiled flex {kind} ")
        summary.append(_compiled_sentence(cell, kind))
    return out + ["", " ".join(summary), ""]


def _compiled_sentence(cell: dict, kind: str) -> str:
    """Where te_compile's compiled call of ``kind`` costs more host time than Inductor's, with the A/A spread."""
    te, ind, aa = (f"compiled flex {kind} ({n})" for n in ("te_compile", "Inductor", "Inductor, A/A"))
    calls = [(shape, variant) for (call, shape, variant) in cell if call == te]
    losses = [(c, cell[(te, *c)], cell[(ind, *c)]) for c in calls if cell[(te, *c)] > cell[(ind, *c)]]
    again = {c: cell.get((aa, *c)) for c in calls}
    lost = "; ".join(f"{'x'.join(map(str, shape))} {variant}: {t:.1f} against {i:.1f}"
                     + (f" (A/A {again[(shape, variant)]:.1f})" if again[(shape, variant)] is not None else "")
                     for (shape, variant), t, i in losses)
    spread = [abs(cell[(aa, *c)] - cell[(ind, *c)]) for c in calls if (aa, *c) in cell]
    what = {"fwd": "forward", "train": "training"}[kind]
    return (f"A compiled te_compile {what} call costs less than Inductor's in {len(calls) - len(losses)} of "
            f"{len(calls)} rows" + (f"; more in {lost}." if losses else ".")
            + (f" Inductor's call measured twice differs by up to {max(spread):.1f} µs (A/A)." if spread else ""))


def render_rules(link_prefix: str) -> str:
    """te_compile/tuning/rules.py's rule table: each class, from how many query tokens it is served, and why."""
    sys.path.insert(0, ROOT)
    from te_compile.tuning import rules

    def when(n):
        return "never" if n is None else f"from {n} tokens"
    out = ["<!-- generated by docs/tables.py from te_compile/tuning/rules.py; edit the rules, not this table -->",
           f"Measured on {rules.MEASURED_ON}.", "",
           "| site class | served | served under CUDA graphs | why |",
           "|---|---|---|---|"]
    for cls, r in rules.RULES.items():
        out.append(f"| {cls} | {when(r.min_tokens)} | {when(r.graphs_min_tokens)} | {r.why} |")
    return "\n".join(out)


# --------------------------------------------------------------------------- docs/benchmarks.md's other tables
# Each renderer below gives one block of docs/benchmarks.md: the text around its table(s) that states numbers, computed
# from the JSON it names. What a block says in words about its rows is checked against the JSON (_need): a row that
# contradicts the words stops the script instead of being published under them.

DATA = "docs/data/"
GENERATED = ("<!-- generated by docs/tables.py from the JSON named below; edit the JSON or the script, not this "
             "table -->")


def _json(path: str) -> dict:
    with open(os.path.join(ROOT, path)) as f:
        return json.load(f)


def _rows(path: str) -> list[dict]:
    return _json(path)["rows"]


def _ln(path: str, prefix: str, label: str | None = None) -> str:
    name = os.path.basename(path)
    return f"[{label or name}]({prefix}{name})"


def _need(ok: bool, what: str) -> None:
    if not ok:
        raise SystemExit(f"docs/tables.py: the text says {what}; its JSON does not: fix the text or the JSON")


def _x(v: float, bold: bool = False) -> str:
    return f"**{v:.2f}x**" if bold else f"{v:.2f}x"


def _span(xs, fmt: str = "{:.2f}") -> str:
    """'lo-hi' of xs as fmt prints them, or one value where both print the same."""
    lo, hi = fmt.format(min(xs)), fmt.format(max(xs))
    return lo if lo == hi else f"{lo}-{hi}"


def _ver(cudnn: int) -> str:
    return f"{cudnn // 10000}.{cudnn // 100 % 100}"


def _date(path: str) -> str:
    return re.search(r"\d{4}-\d\d-\d\d", os.path.basename(path)).group(0)


def _gpu(data: dict) -> str:
    return data["device"].removeprefix("NVIDIA ")


def _dims(shape, kv: bool = False) -> str:
    """2x16x4096x128 (and the KV heads as a fifth number where kv and they differ from the heads)."""
    dims = list(shape[:4]) + ([shape[4]] if kv and len(shape) > 4 and shape[4] != shape[1] else [])
    return "x".join(map(str, dims))


def _case(row: dict) -> str:
    return row["case"].removeprefix("flex ").removeprefix("sdpa ")


def _cells(cells: list[str]) -> str:
    """One table row; an empty cell as ``| |``."""
    line = "| " + " | ".join(cells) + " |"
    while "|  |" in line:
        line = line.replace("|  |", "| |")
    return line


def _dec(row: dict) -> str:
    return "served" if row["served"] else "kept"


def _by_case(path: str) -> dict:
    return {r["case"]: r for r in _rows(path)}


def _measured(row: dict) -> tuple[float, float] | None:
    """(cuDNN ms, torch.compile ms) of the measurement that decided a kept site, from its reason."""
    m = re.search(r"measured: ([\d.]+) ms on cuDNN vs ([\d.]+) ms", row["reason"])
    return (float(m.group(1)), float(m.group(2))) if m else None


WORDS = dict(enumerate(("no", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten")))


def _tokens(n: int) -> str:
    return f"{n // 1024}k"


FLEX_H200 = {"9.19": DATA + "tuned-flex-h200-919-2026-11-27.json", "9.27": DATA + "tuned-flex-h200-927-2026-11-27.json"}
FLEX_H200_SECOND = DATA + "tuned-flex-h200-927-2026-11-27-second-process.json"
#: the H100 shapes of the tuned flex sweep, in the table's order; the last one's cells give ms, not ratios
FLEX_H100 = [DATA + f"tuned-flex-h100-919-2026-11-27-{s}.json"
             for s in ("1x32x8192x128x8", "1x16x16384x128", "8x16x512x64", "8x16x1024x64")]
FLEX_H100_CACHED = DATA + "tuned-flex-h100-919-2026-11-27-1x32x8192x128x8-cached.json"
FLEX_H100_4K = DATA + "tuned-flex-h100-919-2026-11-27-2x16x4096x128.json"
FLEX_H200_SMALL = DATA + "tuned-flex-h200-919-2026-11-27-4x16x512x64.json"
TUNED_SDPA = DATA + "tuned-sdpa-h200-919-2026-11-27.json"
SWEEP_SDPA = DATA + "sweep-sdpa-h200-2026-11-26.json"
BENCH = DATA + "bench-h200-2026-11-26.json"
BENCH_H100 = DATA + "bench-h100-bias-2026-11-26.json"


def render_summary(link_prefix: str) -> str:
    """The page's opening summary: its numbers from the headline run, the H100 sweeps and the SDPA sweeps."""
    soft_srcs = [HEADLINE, FLEX_H100_4K, *FLEX_H100[:2]]
    soft = [r for src in soft_srcs for r in _rows(src) if _case(r).startswith("softcap")]
    _need(all(r["served"] for r in soft), "every softcap site of those runs is served")
    long = [_rows(src) for src in FLEX_H100[:2]]
    for rows in long:
        _need(all(bool(r["served"]) == (r["case"] != "flex document") for r in rows),
              "every flex variant but the document mask is served at 8k and 16k tokens")
    bias = [r for src in (SWEEP_SDPA, TUNED_SDPA) for r in _rows(src) if r["served"]]
    _need(all(r["case"] == "sdpa learned bias" for r in bias), "the only SDPA sites served are learned biases")
    _need(not any(r["served"] for r in _rows(TUNED_SDPA) if r["case"] in ("sdpa none", "sdpa causal")),
          "plain SDPA is kept")
    lens = sorted({r["shape"][2] for r in soft})
    return "\n".join([
        "<!-- generated by docs/tables.py from the JSON of the tables below; edit the JSON or the script, not this "
        "text -->",
        "In short: te_compile is fastest where cuDNN computes a score_mod that Inductor's flex kernel computes slowly "
        f"(softcap {_span([r['ratio'] for r in soft])}x at {_tokens(lens[0])}-{_tokens(lens[-1])} tokens), on long "
        f"sequences (at {_tokens(long[0][0]['shape'][2])} and {_tokens(long[1][0]['shape'][2])} tokens on an H100 "
        "every flex variant but the document mask is served, "
        f"{_span([r['ratio'] for rows in long for r in rows if r['served']])}x, geometric mean "
        f"{_span([_geomean([r['ratio'] for r in rows]) for rows in long])}x), and for an SDPA bias that needs a "
        f"gradient ({_span([r['ratio'] for r in bias])}x). Plain SDPA runs the same cuDNN kernels as torch.compile "
        "and is kept. Masks of key intervals run on cuDNN's interval kernels (a static mask such as prefix-LM from 128 "
        "tokens: 1.05-1.54x at 128-2048, 1.60x at 4096; sink + local 1.54x at 4096, 1.42x at 32768). Document ids "
        "are kept: a loader's new ids need a new plan every step (one site served 0.08-0.29x of torch.compile at "
        "128-32768 tokens; 16 Llama-3-8B-dims layers sharing the plan 1.03x); ids that never change run 1.51-1.70x at "
        "4096-32768 under `serve=\"always\"`. Steps of 128-1024 tokens are host-bound, and "
        "the native call path spends less host time per call than Inductor's code: plain, causal and score_mod sites "
        "are served from 128 tokens (1.09-2.19x at 128 tokens, 0.97-1.80x at 256-512, paired rounds). Models' sliding windows of 512 keys measured no faster "
        "and stay with torch.compile."])


def render_flex_tuned(link_prefix: str) -> str:
    """The tuned flex sweep on the H200 (9.19, 9.27, a second process), then at four more shapes on the H100."""
    runs = {v: _rows(p) for v, p in FLEX_H200.items()}
    second = _rows(FLEX_H200_SECOND)
    for v, p in FLEX_H200.items():
        _need(_ver(_json(p)["cudnn"]) == v, f"{p} ran cuDNN {v}")
    _need(all(r["tune"]["measured"] == 0 for r in second), "the second process measured nothing")
    _need([r["served"] for r in second] == [r["served"] for r in runs["9.27"]], "the second process decided the same")
    shape = {tuple(r["shape"]) for rows in (*runs.values(), second) for r in rows}
    _need(len(shape) == 1, "one shape")
    a, b = runs["9.19"], runs["9.27"]
    out = [GENERATED,
           "Each site measured first (`bench/sweep.py --part flex --tune --always --control --rounds 2 --iters 20`, "
           f"fresh cache), {_dims(a[0]['shape'])} bf16, ms per step; 9.27 preloaded with "
           "`TE_COMPILE_UNCHECKED_CUDNN=serve`. The last column is a second process on the 9.27 cache (nothing "
           f"measured, same decisions). Data: {_ln(FLEX_H200['9.19'], link_prefix, '9.19')}, "
           f"{_ln(FLEX_H200['9.27'], link_prefix, '9.27')}, {_ln(FLEX_H200_SECOND, link_prefix, 'second process')}.",
           "",
           "| variant | 9.19 decision | default | always | torch.compile | A/A | / oracle | 9.27 decision | default "
           "| always | torch.compile | A/A | / oracle | 9.27, 2nd process: / oracle |",
           "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]

    def cells(r):
        return (f"{_dec(r)} | {r['te_compile']['ms']:.3f} | {r['always']['ms']:.3f} | {r['torch.compile']['ms']:.3f} "
                f"| {_x(r['control_aa'][0])} | {_x(r['vs_oracle'])}")
    for x, y, z in zip(a, b, second):
        _need(x["case"] == y["case"] == z["case"], "the runs' rows in one order")
        out.append(f"| {_case(x)} | {cells(x)} | {cells(y)} | {_x(z['vs_oracle'])} |")
    gm = {v: _geomean([r["ratio"] for r in rows]) for v, rows in (("9.19", a), ("9.27", b), ("2nd", second))}
    always = {v: _geomean([r["torch.compile"]["ms"] / r["always"]["ms"] for r in rows]) for v, rows in runs.items()}
    causal = [r for rows in (a, b, second) for r in rows if r["case"] == "flex causal"]
    _need(all(r["served"] for r in causal), "causal is served")
    held = [r for rows in (a, b) for r in rows if _case(r).startswith(("sliding", "prefix"))]
    _need(not any(r["served"] for r in held), "sliding windows and prefix-LM are kept")
    sliding = [r for r in held if _case(r).startswith("sliding")]
    out += ["", f"* Default / torch.compile, geometric mean: **{_x(gm['9.19'])} on 9.19** (min "
            f"{_x(min(r['ratio'] for r in a))}), {_x(gm['9.27'])} on 9.27 ({_x(gm['2nd'])} in the second process), "
            f"{_x(_geomean([max(x['ratio'], y['ratio']) for x, y in zip(a, b)]))} taking the better version per row; "
            f"`serve=\"always\"` {_x(always['9.19'])} (9.19), {_x(always['9.27'])} (9.27). Default / oracle: "
            f"{_x(_geomean([r['vs_oracle'] for r in a]))} (9.19, min {_x(min(r['vs_oracle'] for r in a))}), "
            f"{_x(_geomean([r['vs_oracle'] for r in b]))} (9.27, min {_x(min(r['vs_oracle'] for r in b))}). Causal "
            f"({_span([r['vs_oracle'] for r in causal])}x) is served in both te_compile columns: two runs of one "
            "host-bound graph. Sliding windows and prefix-LM are kept: cuDNN's sliding-window kernels are faster "
            f"({_span([r['always']['kernel_ms'] for r in sliding])} ms against "
            f"{_span([r['torch.compile']['kernel_ms'] for r in sliding])} ms per step), the served step is host-bound."]
    return "\n".join(out)


def render_flex_shapes(link_prefix: str) -> str:
    """The tuned flex sweep at four more shapes (H100), with the H100 at 4k tokens and the H200 at 4x16x512x64."""
    data = [_json(p) for p in FLEX_H100]
    runs = [d["rows"] for d in data]
    _need(len({(d["device"], d["cudnn"]) for d in data}) == 1, "one GPU and cuDNN version")
    labels = []
    for rows in runs:
        s = rows[0]["shape"]
        labels.append(_dims(s) + (f", {s[4]} KV heads" if s[4] != s[1] else ""))
    labels[-1] += ", ms"
    out = [GENERATED,
           "The same sweep after `te_compile.tune` at four more shapes (`--shape B,H,L,D[,Hkv]`): decision and "
           f"default / torch.compile (for {_dims(runs[-1][0]['shape'])} in ms). Data: "
           + ", ".join(_ln(p, link_prefix, _dims(r[0]["shape"], kv=True)) for p, r in zip(FLEX_H100, runs)) + ".",
           "", "| variant | " + " | ".join(labels) + " |", "|---|" + "---|" * len(runs)]
    for cols in zip(*runs):
        _need(len({r["case"] for r in cols}) == 1, "the shapes' rows in one order")
        note = " (mask_mod not pointwise on cuDNN)" if cols[0]["case"] == "flex document" else ""
        cells = [f"{_dec(r)} {_x(r['ratio'])}" for r in cols[:-1]]
        last = cols[-1]
        cells.append(f"{_dec(last)} {last['te_compile']['ms']:.3f} / {last['torch.compile']['ms']:.3f}")
        out.append(f"| {_case(cols[0])}{note} | " + " | ".join(cells) + " |")
    half = [sum(r["served"] for r in rows) * 2 > len(rows) for rows in runs]
    out.append("| geometric mean | " + " | ".join(_x(_geomean([r["ratio"] for r in rows]), bold)
                                                 for rows, bold in zip(runs[:-1], half)) + " | |")
    out.append("| default / oracle: geomean (min) | " + " | ".join(
        f"{_x(_geomean([r['vs_oracle'] for r in rows]))} ({_x(min(r['vs_oracle'] for r in rows))})"
        for rows in runs[:-1]) + " | |")
    out.append("| A/A | " + " | ".join(f"{_span([r['control_aa'][0] for r in rows])}x" for rows in runs) + " |")
    long = runs[:2]
    for rows in long:
        _need(all(bool(r["served"]) == (r["case"] != "flex document") and (r["ratio"] > 1 or not r["served"])
                  for r in rows), "at 8k and 16k tokens every site cuDNN can serve measured faster and was served")
    cached = _rows(FLEX_H100_CACHED)
    first = {r["case"]: r for r in runs[0]}
    _need(all(r["tune"]["measured"] == 0 and r["served"] == first[r["case"]]["served"] for r in cached),
          "a second process on the 8k cache measured nothing and decided the same")
    small = runs[2]
    cols = ("te_compile", "torch.compile", "always", "control")
    sc = {r["case"]: r for r in runs[3]}["flex softcap + causal"]
    _need(sc["served"], "softcap + causal is served at the last shape")
    h4k = _rows(FLEX_H100_4K)
    small200 = _rows(FLEX_H200_SMALL)
    _need(not any(r["served"] for r in small200), f"every site of {FLEX_H200_SMALL} was kept")
    tried = [r for r in small200 if r["tune"]["measured"]]
    _need(all(r["reason"].startswith("kept for speed") for r in tried), "every measured site measured slower")
    out += ["", f"* At {_tokens(long[0][0]['shape'][2])} and {_tokens(long[1][0]['shape'][2])} tokens every site "
            "cuDNN can serve measured faster and was served; a second process on the 8k cache measured nothing and "
            f"decided the same ({_ln(FLEX_H100_CACHED, link_prefix, 'data')}). At {small[0]['shape'][2]} tokens the "
            f"step is host-bound (kernels {_span([r[c]['kernel_ms'] for r in small for c in cols])} ms of "
            f"{_span([r[c]['ms'] for r in small for c in cols], '{:.1f}')} ms steps); at "
            f"{small[0]['shape'][2]} and {runs[3][0]['shape'][2]} tokens kept rows run torch.compile's graph and "
            f"spread like the A/A column; softcap + causal at {_dims(sc['shape'])} ran {sc['te_compile']['ms']:.3f} ms "
            f"in the default column and {sc['always']['ms']:.3f} ms in the always column, the same served graph.",
            f"* At {_dims(h4k[0]['shape'])} ({_ln(FLEX_H100_4K, link_prefix, 'data')}): "
            + ", ".join(f"{VARIANTS[r['case']]} {_dec(r)} {_x(r['ratio'])}" for r in h4k)
            + f". On the H200 at {_dims(small200[0]['shape'])} ({_ln(FLEX_H200_SMALL, link_prefix, 'data')}) every "
            "site cuDNN can serve was measured slower and kept; `serve=\"always\"` took "
            f"{_x(min(r['always']['ms'] / r['torch.compile']['ms'] for r in tried))} to "
            f"{_x(max(r['always']['ms'] / r['torch.compile']['ms'] for r in tried))} torch.compile's time."]
    return "\n".join(out)


def _bench(path: str) -> tuple[dict, dict]:
    """bench/attention.py's JSON: its header and {(case, impl): row}."""
    data = _json(path)
    return data, {(r["case"], r["impl"]): r for r in data["rows"]}


def _env_gpu(data: dict) -> str:
    return data["env"].split(",")[0].removeprefix("NVIDIA ")


def _fb(row: dict) -> str:
    return f"{row['fwd_ms']:.3f} / {row['bwd_ms']:.3f}"


def render_flex_per_call(link_prefix: str) -> str:
    """Per-call kernel times of the flex variants (bench/attention.py), te_compile against Inductor's flex."""
    data, cell = _bench(BENCH)
    cases = [c for c, impl in cell if c.startswith("flex ") and impl == "te_compile"]
    out = [GENERATED,
           f"`bench/attention.py --suite all --iters 40`, {_dims(data['shape'])} bf16, every site served (kernel time per "
           f"call). Data: {_ln(BENCH, link_prefix)}; plot: "
           f"`python3 bench/plot.py {BENCH} docs/benchmarks.png`.", "",
           "| flex variant | te_compile fwd / bwd ms | Inductor flex fwd / bwd ms | fwd / bwd / fwd+bwd speedup |",
           "|---|---|---|---|"]
    total = []
    for c in cases:
        te, ind = cell[(c, "te_compile")], cell[(c, "torch.compile flex (inductor)")]
        both = (ind["fwd_ms"] + ind["bwd_ms"]) / (te["fwd_ms"] + te["bwd_ms"])
        total.append(both)
        out.append(f"| {c.removeprefix('flex ')} | {_fb(te)} | {_fb(ind)} | {_x(ind['fwd_ms'] / te['fwd_ms'])} / "
                   f"{_x(ind['bwd_ms'] / te['bwd_ms'])} / {_x(both)} |")
    out.append(f"| **geometric mean** | | | **{_x(_geomean(total))}** |")
    return "\n".join(out)


SDPA_FORMS = ("none", "causal", "bool mask", "frozen bias", "learned bias")
SDPA_IMPLS = (("te_compile", "**te_compile**"), ("torch.compile (inductor)", "torch.compile (Inductor)"),
              ("torch SDPA cudnn", "torch SDPA cudnn (eager: pays its host time per call)"),
              ("torch SDPA flash", "torch SDPA flash"), ("torch SDPA efficient", "torch SDPA efficient"))


def render_sdpa(link_prefix: str) -> str:
    """The tuned SDPA grid (training steps) and the per-call SDPA kernels."""
    data = _json(TUNED_SDPA)
    rows = data["rows"]
    grid: dict[tuple, dict] = {}
    for r in rows:
        grid.setdefault(tuple(r["shape"]), {})[_case(r)] = r
    out = [GENERATED,
           "One `F.scaled_dot_product_attention` call as a training step, bf16, after `te_compile.tune` "
           "(`bench/sweep.py --part sdpa --tune --always --control --rounds 2 --iters 20`, one process, fresh "
           f"measurement cache). **{_gpu(data)}, cuDNN {_ver(data['cudnn'])}, {_date(TUNED_SDPA)}.** Each cell: the "
           "decision, default / torch.compile, and (A/A). Data (with the ms and each site's measurement): "
           f"{_ln(TUNED_SDPA, link_prefix)}.", "",
           "| B, H, L, D, KV heads | " + " | ".join(SDPA_FORMS) + " |", "|---|" + "---|" * len(SDPA_FORMS)]
    for shape, forms in grid.items():
        cells = []
        for form in SDPA_FORMS:
            r = forms.get(form)
            if r is None:
                cells.append("")
                continue
            head = f"{_dec(r)} {_x(r['ratio'])}"
            cells.append(f"{f'**{head}**' if r['served'] else head} ({_x(r['control_aa'][0])})")
        out.append(_cells([", ".join(map(str, shape)), *cells]))
    served = [r for r in rows if r["served"]]
    _need(all(_case(r) == "learned bias" for r in served), "only learned biases are served")
    rounds = []
    for r in rows:
        if not r["served"]:
            m = re.search(r"cuDNN faster in (\d+) of (\d+) rounds", r["reason"])
            rounds.append((int(m.group(2)) - int(m.group(1)), int(m.group(2))))
    _need(len({n for _, n in rounds}) == 1, "one number of rounds")
    slower = sorted({s for s, _ in rounds})
    low = [r for r in rows if r["vs_oracle"] < 0.97]
    odd = [r for r in low if not r["served"] and r["always"]["ms"] < r["torch.compile"]["ms"]]
    _need(len(odd) == 1 and odd[0]["shape"][4] < odd[0]["shape"][1], "one GQA row below the oracle on a wrong keep")
    g = odd[0]
    te, tc = _measured(g)
    low_served = [r for r in low if r["served"]]

    def where(r):
        return _dims(r["shape"])
    out += ["", f"* Default / torch.compile: geometric mean **{_x(_geomean([r['ratio'] for r in rows]))}** over the "
            f"{len(rows)} rows (min {_x(min(r['ratio'] for r in rows))}); default / oracle "
            f"{_x(_geomean([r['vs_oracle'] for r in rows]))} (min {_x(min(r['vs_oracle'] for r in rows))}).",
            f"* Served: the learned biases at {', '.join(where(r) for r in served[:-1])} and {where(served[-1])}, "
            f"{_span([r['ratio'] for r in served])}x: torch runs an SDPA bias that needs a gradient on its efficient "
            "kernel, te_compile on cuDNN. Every other row is kept: plain SDPA, bool masks and frozen biases run the "
            "same cuDNN kernels under torch.compile, and te_compile's served step measured slower.",
            f"* Kept sites measured slower in {' or '.join(map(str, slower))} of the {rounds[0][1]} rounds. The rows "
            "below 0.97x of the oracle run the same graph on both sides of the ratio (kept rows; "
            + "; ".join(f"the {_case(r)} at {where(r)}, {_x(r['vs_oracle'])}" for r in low_served)
            + f", served in both te_compile columns), except GQA {where(g)} with {g['shape'][4]} KV heads "
            f"({_x(g['vs_oracle'])}): kept on a measurement of {te:.3f} vs {tc:.3f} ms while the always column ran "
            f"{g['always']['ms']:.3f} against {g['torch.compile']['ms']:.3f} ms. Loops of the same compiled steps "
            "agree with the measurement: the sweep's per-step events leave out part of a host-bound step's host time "
            "([cudnn-notes.md](cudnn-notes.md#measured-decisions-and-the-rule-table))."]
    bench, cell = _bench(BENCH)
    for case in ("no mask", "causal"):
        te, ind = cell[(case, "te_compile")], cell[(case, "torch.compile (inductor)")]
        _need(all(abs(te[k] / ind[k] - 1) < 0.01 for k in ("fwd_ms", "bwd_ms")),
              "te_compile matches torch.compile's SDPA lowering")
    out += ["", f"Per call ({_env_gpu(bench)}, {_date(BENCH)}, `bench/attention.py`, {_dims(bench['shape'])} bf16; "
            f"{_ln(BENCH, link_prefix)}), te_compile runs the very engine torch's cuDNN SDPA runs, and matches "
            "`torch.compile`'s own SDPA lowering:", "",
            "| implementation | no mask fwd / bwd ms | TFLOP/s | causal fwd / bwd ms | TFLOP/s |",
            "|---|---|---|---|---|"]
    for impl, label in SDPA_IMPLS:
        cells = []
        for case in ("no mask", "causal"):
            r = cell[(case, impl)]
            cells.append(f"{_fb(r)} | {r['fwd_tflops']:.0f} / {r['bwd_tflops']:.0f}")
        out.append(f"| {label} | " + " | ".join(cells) + " |")
    return "\n".join(out)


def render_bias(link_prefix: str) -> str:
    """Per-call times of biases, the relative-position table and the document mask (H200), and the H100's."""
    data, cell = _bench(BENCH)
    _, h100 = _bench(BENCH_H100)
    h100_gpu = _env_gpu(_json(BENCH_H100))
    out = ["## Bias, relative-position tables, document masks", "",
           f"Per call, `bench/attention.py --suite bias --iters 30`, {_dims(data['shape'])} bf16, "
           f"**{_env_gpu(data)}, {_date(BENCH)}**, every site served (the rules keep the frozen bias: torch runs the same cuDNN kernel). "
           f"Data: {_ln(BENCH, link_prefix)}.", "",
           "| case, fwd / bwd ms | te_compile | torch.compile (Inductor) | torch SDPA efficient | other |",
           "|---|---|---|---|---|"]
    inductor = ("torch.compile (inductor)", "torch.compile flex (inductor)")
    other = {"torch SDPA cudnn": "torch SDPA cudnn", "te_compile, dense -inf bias forced":
             "dense -inf bias forced on te_compile", "per-document causal SDPA cudnn (ragged estimate)":
             "per-document causal cuDNN SDPA (ragged estimate)"}
    for case in ("frozen float bias", "learned float bias", "learned rel-pos table", "document + causal mask"):
        te = _fb(cell[(case, "te_compile")]) + (" (kept for Inductor)" if case.startswith("document") else "")
        ind = next(cell[(case, i)] for i in inductor if (case, i) in cell)
        ind = _fb(ind) if ind["fwd_ms"] is not None else "no valid Triton config"
        small = cell.get((case, "torch.compile flex (inductor, small blocks)"))
        if small:
            ind += f"; small blocks {_fb(small)}"
        eff = cell.get((case, "torch SDPA efficient"))
        rest = "; ".join(f"{label} {_fb(cell[(case, impl)])}" for impl, label in other.items() if (case, impl) in cell)
        out.append(_cells([case, te, ind, _fb(eff) if eff else "", rest]))

    def step(r):
        return r["fwd_ms"] + r["bwd_ms"]
    frozen, learned = cell[("frozen float bias", "te_compile")], cell[("learned float bias", "te_compile")]
    ind = cell[("learned float bias", "torch.compile (inductor)")]
    rel = [cell[("learned rel-pos table", i)] for i in
           ("te_compile", "torch.compile flex (inductor, small blocks)", "torch SDPA efficient")]
    hf, hl = h100[("frozen float bias", "te_compile")], h100[("learned float bias", "te_compile")]
    hrel = [h100[("learned rel-pos table", i)] for i in ("te_compile", "torch.compile flex (inductor, small blocks)")]
    _need(h100[("learned rel-pos table", "torch.compile flex (inductor)")]["fwd_ms"] is None,
          "Inductor's default blocks found no valid Triton config on the H100 either")
    sweep = [r for r in _rows(SWEEP_SDPA) if r["served"]]
    _need(all(r["case"] == "sdpa learned bias" and r["shape"][:3] == [2, 16, 4096] for r in sweep),
          "the sweep served the learned biases at 2x16x4096")
    doc = "document + causal mask"
    hdoc = [("te_compile (kept)", "te_compile"), ("Inductor", "torch.compile flex (inductor)"),
            ("dense bias forced", "te_compile, dense -inf bias forced"),
            ("per-document cuDNN calls", "per-document causal SDPA cudnn (ragged estimate)"),
            ("cuDNN varlen THD op", "cuDNN varlen THD (frontend op, with layout copies)")]
    out += ["", f"* **dBias only when needed:** the frozen-bias backward ({frozen['bwd_ms']:.3f} ms) is "
            f"{100 * (1 - frozen['bwd_ms'] / learned['bwd_ms']):.0f}% faster than the learned-bias one "
            f"({learned['bwd_ms']:.3f} ms). Where torch has no cuDNN kernel (a bias that needs a gradient) "
            "te_compile is "
            f"{ind['fwd_ms'] / learned['fwd_ms']:.1f}x (fwd) / {ind['bwd_ms'] / learned['bwd_ms']:.1f}x (bwd) faster "
            f"than torch.compile. As a training step ({_date(SWEEP_SDPA)} sweep, {_ln(SWEEP_SDPA, link_prefix)}): "
            + " and ".join(f"{_x(r['ratio'])} at head dim {r['shape'][3]}" for r in sweep)
            + f", {'x'.join(map(str, sweep[0]['shape'][:3]))}.",
            f"* **Learned relative-position table:** te_compile is {step(rel[1]) / step(rel[0]):.2f}x faster fwd+bwd "
            f"than Inductor's flex with small blocks, and {step(rel[2]) / step(rel[0]):.1f}x faster than torch's "
            "efficient SDPA on the gathered bias.",
            f"* **On an {h100_gpu}** (same software and date, {_ln(BENCH_H100, link_prefix)}): frozen vs learned bias "
            f"backward {hf['bwd_ms']:.3f} vs {hl['bwd_ms']:.3f} ms ({100 * (1 - hf['bwd_ms'] / hl['bwd_ms']):.0f}% "
            f"faster); learned rel-pos table te_compile {_fb(hrel[0])} ms vs Inductor flex with small blocks "
            f"{_fb(hrel[1])} ({step(hrel[1]) / step(hrel[0]):.2f}x; default blocks: no valid Triton config here "
            "either); document + causal " + ", ".join(f"{label} {_fb(h100[(doc, impl)])}" for label, impl in hdoc)
            + "."]
    return "\n".join(out)


MODELS = {"qwen3": "Qwen3", "llama": "Llama", "gemma2": "Gemma-2", "mistral": "Mistral", "gemma3": "Gemma-3"}
#: bench/hf_models.py at 1x8192 with the FLASH column, per model: (cuDNN 9.19 JSON, cuDNN 9.27 JSON)
HF_FLASH = {m: tuple(DATA + f"hf-flash-1x8192-h200-{v}-2026-11-27-{m}.json" for v in ("919", "927")) for m in MODELS}
#: what a model's sites column adds, by (model, cuDNN version)
HF_FLASH_NOTES = {("gemma2", "9.19"): " (global softcap sites)",
                  ("gemma2", "9.27"): " (version gate: softcap is emitted)"}


def _hf(path: str) -> tuple[dict, dict]:
    data = _json(path)
    _need(len(data["rows"]) == 1, f"one model in {path}")
    return data, data["rows"][0]


def _ms(side: dict, cols) -> str:
    return " / ".join(f"{side[c]:.2f}" for c in cols)


def render_hf_flash(link_prefix: str) -> str:
    """Hugging Face models at 1x8192 with the FLASH column, cuDNN 9.19 and 9.27 (H200)."""
    runs = []  # (model, version, row)
    for m, paths in HF_FLASH.items():
        for p in paths:
            data, r = _hf(p)
            _need(r["model"] == m, f"{p} is {m}")
            runs.append((m, _ver(data["cudnn"]), r))
    vers = sorted({v for _, v, _ in runs})
    data = ", ".join(f"{v} " + ", ".join(_ln(HF_FLASH[m][i], link_prefix, MODELS[m]) for m in MODELS)
                     for i, v in enumerate(vers))
    out = [GENERATED,
           "`bench/hf_models.py --batch 1 --seq 8192 --iters 10 --impls flex_attention --tune --always --control "
           f"--flash`, one model per process, torch's cuDNN {vers[0]} and `nvidia-cudnn-jit-cu13` 9.27.0.42 preloaded "
           "(version gate on, as a user gets it). FLASH is plain torch.compile with "
           "`kernel_options={\"BACKEND\": \"FLASH\"}`. ms per step; \"x\" is torch.compile / te_compile's default, "
           f"\"vs FLASH\" FLASH / te_compile. Data: {data}.", "",
           "| model | cuDNN | sites on cuDNN (train / infer) | train: default / always / torch.compile / FLASH "
           "| train x "
           "| A/A | / oracle | vs FLASH | infer: default / always / torch.compile / FLASH | infer x | A/A | / oracle "
           "| vs FLASH |", "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    cols = ("te_compile", "always", "torch.compile", "FLASH")
    for m, v, r in runs:
        t = r["train_sites"]["cudnn"]
        sites = f"{f'**{t}**' if t == 0 and r['train_vs_oracle'] < 0.95 else t} / {r['infer_sites']['cudnn']}"
        cells = []
        for mode in ("train", "infer"):
            cells += [_ms(r[mode], cols), _x(r[f"{mode}_ratio"]), _x(r[f"{mode}_aa"], abs(r[f"{mode}_aa"] - 1) > 0.1),
                      _x(r[f"{mode}_vs_oracle"], r[f"{mode}_vs_oracle"] < 0.95), _x(r[f"{mode}_vs_flash"])]
        out.append(f"| {MODELS[m]} | {v} | {sites}{HF_FLASH_NOTES.get((m, v), '')} | " + " | ".join(cells) + " |")
    full = [m for m in MODELS if all(r["infer_sites"]["cudnn"] == r["sites"] for mm, _, r in runs if mm == m)]
    full_rows = [r for m, _, r in runs if m in full]
    trained = [r for m, v, r in runs if m in full and r["train_sites"]["cudnn"] == r["sites"]]
    trained_v = sorted({v for m, v, r in runs if m in full and r["train_sites"]["cudnn"] == r["sites"]})
    wrong = [(m, v, r) for m, v, r in runs if r["train_vs_oracle"] < 0.95]
    _need(len(wrong) == 2 and all(r["train_sites"]["cudnn"] == 0 and r["tune"]["train"]["measured"] == 0
                                  for _, _, r in wrong), "two wrong keeps, of training tunes that measured no site")
    wv = {v for _, v, _ in wrong}
    _need(len(wv) == 1, "the wrong keeps are on one version")
    run = {(m, v): r for m, v, r in runs}
    mis = [run[("mistral", v)] for v in vers]
    _need(all(r["train_sites"]["cudnn"] == 0 for r in mis), "Mistral's site is kept")
    g2, g2b, g3 = run[("gemma2", vers[0])], run[("gemma2", vers[1])], run[("gemma3", vers[1])]
    _need(g2b["reasons"] == ["cudnn-version"], "the version gate keeps Gemma-2's sites on the newer version")
    _need(g3["train_sites"]["cudnn"] == g3["infer_sites"]["cudnn"] == 0, "Gemma-3 keeps every site")

    def always(r, mode):
        return r[mode]["torch.compile"] / r[mode]["always"]
    out += ["", f"* Inference: {_span([r['infer_ratio'] for r in full_rows])}x over torch.compile and "
            f"{_span([r['infer_vs_flash'] for r in full_rows])}x over FLASH for the served models "
            f"({', '.join(MODELS[m] for m in full)}) on both versions; training with the sites served "
            f"({', '.join(trained_v)}): {_span([r['train_ratio'] for r in trained])}x over torch.compile, "
            f"{_span([r['train_vs_flash'] for r in trained])}x of FLASH.",
            f"* **Two wrong keeps on {wv.pop()}**: {' and '.join(MODELS[m] + chr(39) + 's' for m, _, _ in wrong)} "
            "causal "
            "training sites stayed with torch.compile while `serve=\"always\"` ran those steps "
            f"{' / '.join(_x(always(r, 'train')) for _, _, r in wrong)} faster: the training tune of these runs "
            "measured no site (a bug, since fixed), so the cost model of then decided ([history.md](history.md)).",
            f"* The Gemma-2 ({vers[0]}), Mistral and Gemma-3 rows come from runs after that fix. Mistral's "
            "sliding-window site (window 512) measured slower in training and is kept; `serve=\"always\"` runs the "
            f"model {_span([always(r, mode) for r in mis for mode in ('train', 'infer')])}x. Gemma-2 on {vers[0]} "
            "serves only its global softcap sites (the sliding + softcap ones measured slower and are kept; the "
            "sites' measurements are in [cudnn-notes.md](cudnn-notes.md#measuring-candidates-inside-a-compile)): "
            f"{_x(g2['train_ratio'])} / {_x(g2['infer_ratio'])}, where serving all runs "
            f"{_x(always(g2, 'train'))} / {_x(always(g2, 'infer'))}. On {vers[1]} the version gate keeps Gemma-2's "
            f"softcap sites, and FLASH wins it by {100 * (1 - g2b['train_vs_flash']):.0f}%. Gemma-3 on {vers[1]} "
            f"keeps every site, yet its A/A spread is {_x(g3['train_aa'])} / {_x(g3['infer_aa'])}."]
    return "\n".join(out)


#: the whole-model check (H200, 9.19): (shape, model) -> JSON, in the table's order
HF_CHECK = {(s, m): DATA + f"hf-model-check-median-rule-{s}-h200-919-2026-11-27-{m}.json"
            for s in ("1x8192", "1x4096") for m in ("llama", "qwen3")}
#: the H100 runs at 1x8192: (model, cuDNN) -> JSON, in the table's order
HF_H100 = {(m, v): DATA + f"hf-model-check-h100-{v}-2026-11-27-{m}-1x8192.json"
           for m, v in (("llama", "919"), ("qwen3", "919"), ("mistral", "919"), ("gemma3", "919"), ("gemma3", "927"))}


def render_hf_check(link_prefix: str) -> str:
    """Hugging Face models with the whole-model check (H200), then at 1x8192 on the H100."""
    rows = {k: _hf(p)[1] for k, p in HF_CHECK.items()}
    meta = _json(next(iter(HF_CHECK.values())))
    out = [f"### With the whole-model check ({_gpu(meta)}, cuDNN {_ver(meta['cudnn'])}, "
           f"{_date(next(iter(HF_CHECK.values())))})", "",
           "`bench/hf_models.py --impls flex_attention --tune --always --control`, each shape in its own process with "
           "its own empty measurement cache, te_compile's current measuring: per site, then the whole graph, then the "
           "whole model (a model's sites are kept when the served model is slower in the median round). Data: "
           + ", ".join(_ln(p, link_prefix, f"{s} {m}") for (s, m), p in HF_CHECK.items()) + ".", "",
           "| shape, model | sites on cuDNN, train / infer | train: default / always / torch.compile | train x | A/A "
           "| default / oracle | infer: default / always / torch.compile | infer x | A/A | default / oracle |",
           "|---|---|---|---|---|---|---|---|---|---|"]
    cols = ("te_compile", "always", "torch.compile")
    for (s, m), r in rows.items():
        cells = []
        for mode in ("train", "infer"):
            cells += [_ms(r[mode], cols), _x(r[f"{mode}_ratio"], r[f"{mode}_sites"]["cudnn"] > 0), _x(r[f"{mode}_aa"]),
                      _x(r[f"{mode}_vs_oracle"])]
        out.append(f"| {s}, {m} | {r['train_sites']['cudnn']} / {r['infer_sites']['cudnn']} | "
                   + " | ".join(cells) + " |")
    short = [(m, r) for (s, m), r in rows.items() if s == "1x4096"]
    _need(all(r[f"{mode}_sites"]["cudnn"] == 0 and not any(g["served"] for g in r["tune"][mode]["graphs_timed_whole"])
              for _, r in short for mode in ("train", "infer")), "at 1x4096 the graph check kept every site")
    _need(all(r[mode]["always"] > r[mode]["torch.compile"] for _, r in short for mode in ("train", "infer")),
          "serve='always' was slower in all four 1x4096 rows")
    llama = dict(short)["llama"]["tune"]
    graph = {mode: llama[mode]["graphs_timed_whole"][0] for mode in ("train", "infer")}
    out += ["", "At 1x4096 the graph check kept every site (Llama's graph "
            f"{graph['train']['te_ms']:.2f} vs {graph['train']['tc_ms']:.2f} ms training, "
            f"{graph['infer']['te_ms']:.2f} vs {graph['infer']['tc_ms']:.2f} ms inference), so the default column runs "
            "torch.compile's own graph: its "
            f"{' / '.join(_x(r['train_ratio']) for _, r in short)} training rows sit at the A/A column's "
            f"{' / '.join(_x(r['train_aa']) for _, r in short)}. `serve=\"always\"` was slower in all four 1x4096 "
            "rows."]
    h100 = {}
    for (m, v), p in HF_H100.items():
        data, r = _hf(p)
        h100[(m, _ver(data["cudnn"]))] = r
    gpu = _gpu(_json(next(iter(HF_H100.values()))))
    files = list(HF_H100.values())
    out += ["", f"### On an H100 ({gpu}, {_date(files[0])})", "",
            "1x8192, flex_attention, after tuning, cuDNN 9.19 (Gemma-3 also on 9.27). Data: "
            + ", ".join(_ln(p, link_prefix, f"{m} {_ver(_json(p)['cudnn'])}") for (m, _), p in HF_H100.items()) + ".",
            "", "| model | cuDNN | sites on cuDNN | train: default / always / torch.compile | train x | A/A "
            "| infer: default / always / torch.compile | infer x | A/A |", "|---|---|---|---|---|---|---|---|---|"]
    for (m, v), r in h100.items():
        _need(r["train_sites"] == r["infer_sites"], f"{m}'s sites are decided alike in training and inference")
        cells = []
        for mode in ("train", "infer"):
            cells += [_ms(r[mode], cols), _x(r[f"{mode}_ratio"]), _x(r[f"{mode}_aa"])]
        out.append(f"| {m} | {v} | {r['train_sites']['cudnn']} of {r['train_sites']['sites']} | "
                   + " | ".join(cells) + " |")
    first = [r for (m, v), r in h100.items() if v == "9.19"]
    g3 = h100[("gemma3", "9.19")]
    _need(g3["train_sites"]["cudnn"] == 0, "Gemma-3's sites were kept")
    out += ["", "Every row is within "
            f"{_span([r[f'{mode}_vs_oracle'] for r in h100.values() for mode in ('train', 'infer')])}x of its oracle; "
            f"the flex training geometric mean over the {WORDS[len(first)]} models is "
            f"{_x(_geomean([r['train_ratio'] for r in first]))}. Gemma-3's sliding-window sites measured slower and "
            f"were kept (`serve=\"always\"` {_x(g3['train']['torch.compile'] / g3['train']['always'])} training, "
            f"{_x(g3['infer']['torch.compile'] / g3['infer']['always'])} inference on 9.19)."]
    return "\n".join(out)


HF_4096 = {"default": DATA + "hf-4096-h200-2026-11-26.json",
           "always": DATA + "hf-4096-serve-always-h200-2026-11-26.json"}
HF_GRAPH_4X1024 = [DATA + f"hf-graph-check-4x1024-h200-919-2026-11-27-{m}.json" for m in ("llama", "qwen3", "mistral")]


def render_hf_4096(link_prefix: str) -> str:
    """Hugging Face models at 1x4096 under the cost model and with every site served; the 4x1024 graph check."""
    default, always = _rows(HF_4096["default"]), _rows(HF_4096["always"])
    for d, a in zip(default, always):
        _need((d["model"], d["impl"]) == (a["model"], a["impl"]) and a["kept"] == 0, "the same models, all served")
        _need(a["train_ratio"] < 1, "serving every site is slower in training")
    out = [GENERATED,
           "Serving every site is slower at these sizes. At batch 1 x 4096 tokens (2026-11-26) Llama and Gemma-2 with sdpa and "
           f"flex_attention ran training steps at {_span([a['train_ratio'] for a in always])}x of torch.compile and "
           f"inference at {_span([a['infer_ratio'] for a in always])}x, where the default (every site kept) ran "
           f"{_span([d[f'{m}_ratio'] for d in default for m in ('train', 'infer')])}x (data "
           f"{_ln(HF_4096['default'], link_prefix)} (default), {_ln(HF_4096['always'], link_prefix)} (always))."]
    graph = [_hf(p)[1] for p in HF_GRAPH_4X1024]
    _need(all(r[f"{m}_sites"]["cudnn"] == 0 for r in graph for m in ("train", "infer")), "every 4x1024 site is kept")
    out += ["", f"With measured decisions at 4x1024 (H200, 9.19, {_date(HF_GRAPH_4X1024[0])}, after the whole-graph "
            "check) every site is kept too: " + ", ".join(MODELS[r["model"]] for r in graph[:-1])
            + f" and {MODELS[graph[-1]['model']]} at "
            f"{_span([r[f'{m}_ratio'] for r in graph for m in ('train', 'infer')])}x "
            "of torch.compile, training and inference (data: "
            + ", ".join(_ln(p, link_prefix, MODELS[r["model"]]) for p, r in zip(HF_GRAPH_4X1024, graph)) + ")."]
    return "\n".join(out)


#: every site served, one process per cuDNN version: 9.19 against 9.27 (with FLASH), 9.19 against 9.28
VERSIONS_927 = [DATA + f"flex-919-vs-927-h200-2026-11-27-{v}.json" for v in ("919", "927")]
VERSIONS_928 = [DATA + f"flex-919-vs-928-h200-2026-11-27-{v}.json" for v in ("919", "928")]
#: the identity op on the raw score, off and on: (label, JSON)
IDENTITY = [(f"{v} {s}", DATA + f"score-identity-h200-{v.replace('.', '')}-{s}-2026-11-27.json")
            for v in ("9.19", "9.28") for s in ("off", "on")]
H100_927 = [DATA + f"tuned-flex-h100-927-2026-11-27-{s}.json" for s in ("2x16x4096x128", "8x16x1024x64")]


def _pct(new: float, old: float) -> tuple[int, str]:
    """How much faster or slower new is than old, in whole percent."""
    p = round(abs(new / old - 1) * 100)
    return p, "faster" if new < old else "slower"


def render_cudnn_versions(link_prefix: str) -> str:
    """The flex sweep with every site served on cuDNN 9.19, 9.27 and 9.28, the identity op, and the H100 on 9.27."""
    a, b = (_rows(p) for p in VERSIONS_927)
    c, d = (_rows(p) for p in VERSIONS_928)
    _need(_ver(_json(VERSIONS_928[1])["cudnn"]) == "9.28", "the 9.28 run ran 9.28")
    shape = {tuple(r["shape"]) for rows in (a, b, c, d) for r in rows}
    _need(len(shape) == 1, "one shape")
    out = [GENERATED,
           "te_compile is checked on cuDNN 9.19 (torch 2.11's), 9.27 (`nvidia-cudnn-jit-cu13` 9.27.0.42) and 9.28.1 "
           "(the full `nvidia-cudnn-cu13` 9.28.1.4 package with its precompiled engines); "
           "[gpu.md](gpu.md#which-cudnn) says how to run a newer one. The flex sweep with every site served "
           "(`TE_COMPILE_SERVE=always bench/sweep.py --part flex --rounds 2 --iters 20`, "
           f"{_dims(a[0]['shape'])} bf16 training steps), on one **{_gpu(_json(VERSIONS_927[0]))}, "
           f"{_date(VERSIONS_927[0])}**, each comparison two processes in a row with "
           "`TE_COMPILE_UNCHECKED_CUDNN=serve` "
           "so that the newer version runs the emitted graphs too. \"x\" is torch.compile / te_compile; left, 9.19 "
           "against 9.27 with the FLASH column (`--flash`; ALiBi + causal as cuDNN's built-in ALiBi; data "
           f"{_ln(VERSIONS_927[0], link_prefix, '9.19')}, {_ln(VERSIONS_927[1], link_prefix, '9.27')}); right, 9.19 "
           "against 9.28 with te_compile's kernel time per step (data "
           f"{_ln(VERSIONS_928[0], link_prefix, '9.19')}, {_ln(VERSIONS_928[1], link_prefix, '9.28')}).", "",
           "| variant | 9.19 x | 9.27 x | 9.19 vs FLASH | 9.27 vs FLASH | 9.19 x | 9.28 x "
           "| te kernels 9.19 / 9.28 ms |",
           "|---|---|---|---|---|---|---|---|"]
    for w, x, y, z in zip(a, b, c, d):
        _need(len({w["case"], x["case"], y["case"], z["case"]}) == 1, "the runs' rows in one order")
        _need(len({w["served"], x["served"], y["served"], z["served"]}) == 1, "the runs served the same sites")
        kept = "" if w["served"] else " (kept)"
        out.append(f"| {_case(w)}{kept} | {_x(w['ratio'])} | {_x(x['ratio'])} | {_x(w['ratio_vs_FLASH'])} | "
                   f"{_x(x['ratio_vs_FLASH'])} | {_x(y['ratio'])} | {_x(z['ratio'])} | "
                   f"{y['te_compile']['kernel_ms']:.3f} / {z['te_compile']['kernel_ms']:.3f} |")
    out.append("| geometric mean | " + " | ".join(_x(_geomean([r[k] for r in rows])) for rows, k in
               ((a, "ratio"), (b, "ratio"), (a, "ratio_vs_FLASH"), (b, "ratio_vs_FLASH"), (c, "ratio"), (d, "ratio")))
               + " | |")

    def better(xs, ys, k, floor=0.0):
        return _x(_geomean([max(x[k], y[k], floor) for x, y in zip(xs, ys)]))
    change = {}
    for y, z in zip(c, d):
        change.setdefault(_pct(z["te_compile"]["kernel_ms"], y["te_compile"]["kernel_ms"]), []).append(_case(y))
    named = sorted(((p, how), cases) for (p, how), cases in change.items() if p >= 3)
    rest = max(p for p, _ in change if p < 3)
    named_txt = ", ".join(f"{' and '.join(cases)} {p}% {how}" for (p, how), cases in
                          sorted(named, key=lambda t: (t[0][1], -t[0][0])))
    ac = {k: {r["case"]: r for r in rows}["flex ALiBi + causal"] for k, rows in (("9.19", a), ("9.27", b))}
    sliding = [r for rows in (c, d) for r in rows if _case(r).startswith("sliding")]
    host_rows = [r for rows in (a, b, c, d) for r in rows if _case(r).startswith("sliding")]
    _need(all(r["served"] for r in sliding), "the sliding rows are served in these runs")
    out += ["", f"* Taking the better version per row: {better(a, b, 'ratio')} over torch.compile and "
            f"{better(a, b, 'ratio_vs_FLASH')} over FLASH (9.19 / 9.27), {better(c, d, 'ratio')} over torch.compile "
            "(9.19 / 9.28); with the default policy's keeps (a losing row runs torch.compile's graph, about 1.00x) the "
            f"better of 9.19 and 9.28 per row gives about {better(c, d, 'ratio', 1.0)}.",
            f"* 9.28's kernels against 9.19's: {named_txt}, the rest within {rest}%. Single steps carry tens of "
            "percent of host-side noise between the two processes (ALiBi + causal on 9.27: "
            f"{ac['9.27']['te_compile']['host_us'] / 1000:.1f} ms of host time against "
            f"{ac['9.19']['te_compile']['host_us'] / 1000:.1f} ms on 9.19, with the same native kernels); the kernel "
            "column is steadier.",
            "* The sliding rows lose on host time, not in the kernels: te_compile's kernels per step are "
            f"{_span([r['te_compile']['kernel_ms'] for r in sliding])} ms against Inductor's "
            f"{_span([r['torch.compile']['kernel_ms'] for r in sliding])} ms on both versions, while its step carries "
            f"{_span([r['te_compile']['host_us'] / 1000 for r in host_rows], '{:.1f}')} ms of host time against "
            f"Inductor's {_span([r['torch.compile']['host_us'] / 1000 for r in host_rows], '{:.1f}')} ms (the four "
            "runs). The rules serve them from 4096 tokens, where the native call path's host time makes the step faster (the "
            "default-policy table), and keep prefix-LM below 8192."]
    ident = [(label, {r["case"]: r for r in _rows(p)}) for label, p in IDENTITY]
    cases = list(ident[0][1])
    drift = [abs(on[k]["te_compile"]["kernel_ms"] / off[k]["te_compile"]["kernel_ms"] - 1)
             for (_, off), (_, on) in zip(ident[::2], ident[1::2]) for k in cases]
    out += ["", "The identity op that te_compile puts on the raw score (what keeps 9.27 and 9.28 from crashing, "
            "[cudnn-notes.md](cudnn-notes.md#cudnn-versions-919-927-928)) costs no kernel time (within "
            f"{100 * max(drift):.1f}%): te_compile kernel ms per training step, one process per setting. Data: "
            + ", ".join(_ln(p, link_prefix, label) for label, p in IDENTITY) + ".", "",
            "| variant | " + " | ".join(label for label, _ in ident) + " |", "|---|" + "---|" * len(ident)]
    for k in cases:
        out.append(f"| {k.removeprefix('flex ')} | "
                   + " | ".join(f"{rows[k]['te_compile']['kernel_ms']:.3f}" for _, rows in ident) + " |")
    s4k, s1k = ({r["case"]: r for r in _rows(p)} for p in H100_927)
    _need(all(_ver(_json(p)["cudnn"]) == "9.27" for p in H100_927), "the H100 runs ran 9.27")

    def alw(r):
        return r["torch.compile"]["ms"] / r["always"]["ms"]
    sw, sc4 = s4k["flex sliding <="], s4k["flex softcap + causal"]
    sc1, sf1 = s1k["flex softcap + causal"], s1k["flex softcap"]
    _need(not sw["served"] and sc4["served"] and not sc1["served"] and sf1["served"], "the H100 decisions as written")
    out += ["", f"On an {_gpu(_json(H100_927[0]))} (9.27, after tuning; data "
            f"{_ln(H100_927[0], link_prefix, '2x16x4096x128')}, "
            f"`--rounds 3`, and {_ln(H100_927[1], link_prefix, '8x16x1024x64')}, `--rounds 5 --iters 50`): the "
            f"sliding window `q - kv <= 1024` at {_dims(sw['shape'])} measured {_x(alw(sw))} served and was kept "
            f"({_x(sw['ratio'])}); softcap + causal served {_x(sc4['ratio'])} at {_dims(sc4['shape'])} and kept at "
            f"{_dims(sc1['shape'])} (measured {_x(alw(sc1))} served; {_x(sc1['ratio'])}); softcap at "
            f"{_dims(sf1['shape'])} served, {_x(sf1['ratio'])} in the default column and {_x(alw(sf1))} in the always "
            "column, the same served graph."]
    return "\n".join(out)


def render_sdpa_and_bias(link_prefix: str) -> str:
    """The SDPA section's tables and the next section's (bias, relative-position table, document mask)."""
    return render_sdpa(link_prefix) + "\n\n" + render_bias(link_prefix)


def render_hf_models(link_prefix: str) -> str:
    """The Hugging Face models at 1x8192 with FLASH, then with the whole-model check and on the H100."""
    return render_hf_flash(link_prefix) + "\n\n" + render_hf_check(link_prefix)


BENCHMARKS = {"docs/benchmarks.md": "data/"}


#: table name -> (renderer, {file: how it links to docs/data/})
NATIVE_SWEEPS = (("forward only", "docs/data/sweep-flex-infer-h200-919-2026-11-28-prefix-halves.json"),)


def render_native_sweeps(link_prefix: str, sweeps: tuple = None) -> str:
    """The flex sweep at one shape on the native call path: per variant and kind of step (``sweeps``: (what, JSON)
    pairs, forward-only first), what the default policy did, the loop throughput of serve="always" and of the
    default against torch.compile, and always's loop time over its kernel time."""
    out = ["<!-- generated by docs/tables.py from the JSON named below; edit the JSON or the script, not this table -->"]
    runs = []
    for what, path in sweeps or NATIVE_SWEEPS:
        with open(os.path.join(ROOT, path)) as f:
            runs.append((what, path, json.load(f)))
    d0 = runs[0][2]
    shape = ",".join(map(str, d0["rows"][0]["shape"]))
    links = ", ".join(f"[{what}]({link_prefix}{os.path.basename(path)})" for what, path, _ in runs)
    kinds = " / ".join(what for what, _, _ in runs)
    infer = " --infer" if len(runs) == 1 and d0.get("infer") else ""
    out += [f"`bench/sweep.py --part flex --shape {shape} --always --control{infer}`"
            f"{' (and `--infer`)' if len(runs) > 1 else ''}, "
            f"**{d0['device']}, torch {d0['torch']}, cuDNN {d0['cudnn'] // 10000}.{d0['cudnn'] // 100 % 100}, "
            f"native call path with replays, {d0.get('date', '2026-11-28')}**; ratios are loop throughput (a loop of steps "
            f"between two events), torch.compile's time over the other's; \"always / kernels\" is `serve=\"always\"`'s "
            f"loop time over its profiler kernel time (in parentheses: its median step, events around one step, over "
            f"the same kernel time). Data: {links}.", "",
            f"| variant | default decision ({kinds}) | always vs torch.compile | default vs torch.compile | "
            "A/A | always / kernels |", "|---|---|---|---|---|---|"]
    by_case: dict = {}
    for _, _, d in runs:
        for r in d["rows"]:
            by_case.setdefault(r["case"], []).append(r)

    def vs_tc(col):
        return lambda r: f"{r['torch.compile']['loop_ms'] / r[col]['loop_ms']:.2f}x"

    def decision(r):
        return "served" if r.get("served") else "kept"

    def on_kernels(r):  # a row serve="always" kept runs torch.compile's kernels (runs that record it)
        kept = " (kept: Inductor's)" if r.get("served_always") == 0 else ""
        a = r["always"]
        return f"{a['loop_ms'] / a['kernel_ms']:.2f}x (step {a['ms'] / a['kernel_ms']:.2f}x){kept}"

    def cell(rows, fn):  # forward / training (a variant the training run left out: "-")
        return " / ".join(fn(r) for r in rows) if len(rows) == len(runs) else f"{fn(rows[0])} / -"
    for case, rows in by_case.items():
        out.append(f"| {case.removeprefix('flex ')} | {cell(rows, decision)} | {cell(rows, vs_tc('always'))} | "
                   f"{cell(rows, vs_tc('te_compile'))} | {cell(rows, vs_tc('control'))} | {cell(rows, on_kernels)} |")
    note = runs[-1][2].get("note")
    if note:
        out += ["", f"Training run: {note}."]
    return "\n".join(out)


#: the interval kernels' rows (prefix-LM, document) below 4096 tokens under the rules, run with the CuTe DSL
_IV = "sweep-flex-intervals-h200-919-2026-11-29"
_LD = "sweep-flex-loader-h200-919-2026-11-29"  # the document ids rewritten before every step (bench/sweep.py)
#: the default policy against the better of serve="always" and plain torch.compile, per shape (JSON files of one
#: shape, one process each; the first file with a variant gives its row); 2x16x4096x128 is the README headline's run
#: (the same command with --flash, after te_compile.runtime.direct landed)
DEFAULT_SWEEPS = tuple(tuple(f"docs/data/{s if s.startswith('sweep-') else 'sweep-flex-default-h200-919-' + s}.json"
                             for s in shape) for shape in (
    (f"{_IV}-2x16x4096x128-rules", f"{_LD}-2x16x4096x128-rules", f"{_LD}-2x16x4096x128", "2026-11-29-2x16x4096x128"), (f"{_IV}-1x32x4096x128x8-rules", f"{_LD}-1x32x4096x128x8-rules", f"{_LD}-1x32x4096x128x8", f"{_IV}-1x32x4096x128x8", "2026-11-28-1x32x4096x128x8"), ("2026-11-28-1x16x16384x128-part1", "2026-11-28-1x16x16384x128-part2"),
    (f"{_LD}-8x16x1024x64", "2026-11-29-8x16x1024x64"), (f"{_LD}-1x8x512x64", f"{_IV}-1x8x512x64-rules", "2026-11-29-1x8x512x64"),
    (f"{_IV}-1x1x256x64-rules", "2026-11-29-1x1x256x64"), (f"{_LD}-16x16x128x64", f"{_IV}-16x16x128x64", "2026-11-29-16x16x128x64"),
    ("2026-11-29-1x8x128x64-rules", "2026-11-29-1x8x128x64"), ("2026-11-29-8x32x128x128x8",)))
#: Hugging Face models at 1x8192 under the default policy, in the order they ran (a later file's model replaces an
#: earlier row of it)
HF_DEFAULT = ("docs/data/hf-default-1x8192-h200-919-2026-11-28.json",
              "docs/data/hf-default-1x8192-h200-919-2026-11-28-gemma3.json",
              "docs/data/hf-default-1x8192-h200-919-2026-11-28-mistral.json")
#: what a run's table says about how it ran (a model a run left out comes from a later file of HF_DEFAULT)
HF_DEFAULT_NOTES = {HF_DEFAULT[0]: "each round timed the columns in the same order, te_compile's first "
                                   "(bench/hf_models.py rotates the order since)"}


def _aa(r: dict) -> tuple[float, float]:
    return min(r["control_aa"]), max(r["control_aa"])


def render_default_policy(link_prefix: str) -> str:
    """The flex sweep's training steps at four shapes: per variant, what the default policy decided and its time
    against the better of serve="always" and plain torch.compile (events, the best of three alternating rounds), with
    the A/A spread of plain torch.compile against itself; then which rows fall short, computed."""
    out = [GENERATED]
    shapes = []
    for paths in DEFAULT_SWEEPS:
        rows = [r for p in paths for r in _rows(p)]
        shapes.append((paths, rows))
    d0 = _json(DEFAULT_SWEEPS[0][0])
    links = ", ".join(f"[{_dims(rows[0]['shape'], True)}]({link_prefix}{os.path.basename(paths[0])})"
                      + "".join(f" [(2)]({link_prefix}{os.path.basename(p)})" for p in paths[1:])
                      for paths, rows in shapes)
    dates = {_json(paths[0])["date"]: None for paths, _ in shapes}
    when = d0["date"] if len(dates) == 1 else ", ".join(
        f"{_dims(rows[0]['shape'], True)} {_json(paths[0])['date']}" for paths, rows in shapes)
    out += [f"`bench/sweep.py --part flex --shape B,H,L,D[,Hkv] --always --control`, training steps, "
            f"**{_gpu(d0)}, torch {d0['torch']}, cuDNN {_ver(d0['cudnn'])}, native call path; {when}**. A cell: the "
            "default policy's decision, its step time over the better of `serve=\"always\"` and plain torch.compile "
            "(< 1: slower than the better one), and plain torch.compile against itself (A/A, the noise floor). "
            f"Data: {links}.", "",
            "| variant | " + " | ".join(_dims(rows[0]["shape"], True) for _, rows in shapes) + " |",
            "|---|" + "---|" * len(shapes)]
    cases = list(dict.fromkeys(r["case"] for _, rows in shapes for r in rows))
    short, slow, twins, low = [], [], [], []
    for case in cases:
        cells = []
        for _, rows in shapes:
            r = next((x for x in rows if x["case"] == case), None)
            if r is None:
                cells.append("-")
                continue
            lo, hi = _aa(r)
            cells.append(f"{'served' if r['served'] else 'kept'} {r['vs_oracle']:.2f}x (A/A {lo:.2f}-{hi:.2f})")
            where = f"{_case(r)} at {_dims(r['shape'], True)}"
            if r["served"] and r["ratio"] < min(lo, 1.0):
                slow.append(f"{where} ({r['ratio']:.2f}x)")
            if r["shape"][2] >= 4096 and r["vs_oracle"] < 0.97:
                # both columns kept it (runs that record it): the same torch.compile program in every column
                both = "; `serve=\"always\"` kept it too: every column runs one program" if (
                    not r["served"] and r.get("served_always") == 0) else ""
                if not r["served"] and not both and r["torch.compile"]["ms"] <= r.get("always", {}).get("ms", 0):
                    both = "; kept, against torch.compile: one program twice"
                short.append(f"{where} ({r['vs_oracle']:.2f}x, A/A {lo:.2f}-{hi:.2f}{both})")
            loop = (min(r["always"]["loop_ms"], r["torch.compile"]["loop_ms"]) / r["te_compile"]["loop_ms"]
                    if all(r.get(c, {}).get("loop_ms") for c in ("always", "torch.compile", "te_compile")) else None)
            paired = r.get("paired", {}).get("vs_oracle")
            if r["shape"][2] < 4096 and loop and paired and max(r["vs_oracle"], loop, paired) < 0.97:
                same = ("; the same compiled step as `serve=\"always\"`" if r["served"] else
                        "; every column one program" if r.get("served_always") == 0 else "")
                low.append(f"{where} ({r['vs_oracle']:.2f}x, loop {loop:.2f}x, paired {paired:.2f}x{same})")
            if r["served"]:  # the default and serve="always" ran the same compiled sites: te_compile against itself
                twins.append(r["always"]["ms"] / r["te_compile"]["ms"])
        out.append(f"| {case.removeprefix('flex ')} | " + " | ".join(cells) + " |")
    out += ["", ("Served rows slower than plain torch.compile beyond the A/A spread: " + "; ".join(slow) + "."
                 if slow else "No served row is slower than plain torch.compile beyond the A/A spread.")
            + (" Rows at 4096 tokens or more below 0.97x of the better one: " + "; ".join(short) + "."
               if short else " Every row at 4096 tokens or more is within 0.97x of the better one.")
            + f" Where the default and `serve=\"always\"` served the same sites (the same compiled step twice), "
              f"their times differ by {_span(twins)}x."
            + (" Below 4096 tokens (host-bound steps), rows below 0.97x of the better one by the best round, the loop "
               "and the paired rounds alike: " + "; ".join(low) + "." if low else "")]
    return "\n".join(out)


def render_hf_default(link_prefix: str) -> str:
    """Hugging Face models at 1x8192 with flex_attention: the default policy against plain torch.compile and against
    the better of it and serve="always", training and inference, with the A/A column. HF_DEFAULT's files in the order
    they ran: a model measured again in a later file takes that file's row."""
    runs = [(path, _json(path)) for path in HF_DEFAULT]
    rows: dict = {}
    for path, d in runs:
        for r in d["rows"]:
            rows[r["model"]] = (path, r)
    d0 = runs[0][1]
    sources = []
    for path, d in runs:
        models = [MODELS.get(m, m) for m, (p, _) in rows.items() if p == path]
        if models:
            name = os.path.basename(path)
            note = f"; {HF_DEFAULT_NOTES[path]}" if path in HF_DEFAULT_NOTES else ""
            sources.append(f"{', '.join(models)}: `{d['command']}`, {d['date']} ([{name}]({link_prefix}{name}){note})")
    out = [GENERATED, f"**{_gpu(d0)}, torch {d0['torch']}, cuDNN {_ver(d0['cudnn'])}, native call path**; ms per step, "
           "the best of three alternating rounds; one process per command. " + "; ".join(sources) + ". "
           "A kept site runs torch.compile's own code on both sides, so where every site is kept the ratio is the "
           "run's noise, as the A/A column is.", "",
           "| model | sites on cuDNN (default) | step | default | always | torch.compile | default vs torch.compile "
           "| default vs the better | A/A |", "|---|---|---|---|---|---|---|---|---|"]
    for _, r in rows.values():
        for mode in ("train", "infer"):
            t, sites = r[mode], r[mode + "_sites"]
            out.append(f"| {MODELS.get(r['model'], r['model'])} | {sites['cudnn']} of {sites['sites']} | "
                       f"{'training' if mode == 'train' else 'inference'} | {t['te_compile']:.2f} | {t['always']:.2f} | "
                       f"{t['torch.compile']:.2f} | {r[mode + '_ratio']:.2f}x | {r[mode + '_vs_oracle']:.2f}x | "
                       f"{r[mode + '_aa']:.2f}x |")
    return "\n".join(out)


DIST_BENCH = "docs/data/dist-bench-fastest-2xh200-2026-11-26.json"


def render_dist_steps(link_prefix: str) -> str:
    """tools.distributed --bench-only --serve fastest: ms per training step, te_compile against torch.compile."""
    with open(os.path.join(ROOT, DIST_BENCH)) as f:
        d = json.load(f)
    name = os.path.basename(DIST_BENCH)
    rows = d["bench"]
    ratios = [r["speedup"] for r in rows]
    out = ["<!-- generated by docs/tables.py from the JSON named below; edit the JSON or the script, not this table -->",
           f"Raw rows: [{name}]({link_prefix}{name}) ({d['world']}x {d['gpu']}, torch {d['torch']}, transformers "
           f"{d.get('transformers', '?')}, `--serve {d['serve']}`).", "",
           "| case | mode | sites | te_compile / torch.compile ms (3 alternating rounds) | speedup |", "|---|---|---|---|---|"]
    for r in rows:
        sites = ", ".join(sorted(set(r["te_compile_runs_on"])))
        why = ", ".join(sorted(set(r["te_compile_reasons"])))
        out.append(f"| {r['case']} | {r['mode']} | {sites}{f' ({why})' if why else ''} | {r['te_compile_ms']:.2f} / "
                   f"{r['inductor_ms']:.2f} | {r['speedup']:.2f}x |")
    kept = all(set(r["te_compile_runs_on"]) == {"kept"} for r in rows)
    out += ["", f"{'Every site here is kept' if kept else 'Sites are served in some rows'}: the alternating rounds put "
                f"te_compile at {min(ratios):.2f}-{max(ratios):.2f}x of torch.compile over the {len(rows)} rows."]
    return "\n".join(out)


DIST_CORRECT = "docs/data/dist-bias-2xh200-2026-11-26.json"


def render_dist_correctness(link_prefix: str) -> str:
    """tools.distributed's correctness cases: pass or fail, where the sites ran on both ranks, dBias, and the worst
    relative errors against the one-process run (loss, gradient)."""
    with open(os.path.join(ROOT, DIST_CORRECT)) as f:
        d = json.load(f)
    name = os.path.basename(DIST_CORRECT)
    modes = ["ddp", "fsdp2", "tp", "dtensor", "cp"]
    cells: dict = {}
    for r in d["results"]:
        sites = [x for rank in r["sites"] for x in rank]
        where = "/".join(sorted({x["runs_on"] for x in sites}))
        dbias = {x["dbias"].split()[0] for x in sites if x["dbias"] not in ("-", "")}
        parts = [f"{'pass' if r['pass'] else 'FAIL'}: {where} x{d['world']}"]
        if dbias:
            parts.append(f"dBias {'/'.join(sorted(dbias))}")
        parts.append(f"loss {r['loss_err']:.0e}, grad {r['worst_grad_err']:.0e}")
        cells[(r["case"], r["mode"])] = "; ".join(parts)
    cases = list(dict.fromkeys(r["case"] for r in d["results"]))
    passed = sum(r["pass"] for r in d["results"])
    out = ["<!-- generated by docs/tables.py from the JSON named below; edit the JSON or the script, not this table -->",
           f"{passed} of {len(d['results'])} cases pass ({d['world']}x {d['gpu']}, torch {d['torch']}, transformers "
           f"{d.get('transformers', '?')}, `--serve {d['serve']}`); raw rows: [{name}]({link_prefix}{name}).", "",
           "| case | " + " | ".join(modes) + " |", "|---|" + "---|" * len(modes)]
    for c in cases:
        out.append(f"| {c} | " + " | ".join(cells.get((c, m), "-") for m in modes) + " |")
    return "\n".join(out)


TABLES = {NAME: (render_headline, TARGETS), README_NAME: (render_readme, {"README.md": "docs/data/"}),
          "host-time": (render_host_time, BENCHMARKS),
          "rules": (render_rules, {"docs/README.md": "data/"}),
          "summary": (render_summary, BENCHMARKS), "flex-tuned": (render_flex_tuned, {"docs/history.md": "data/"}),
          "flex-shapes": (render_flex_shapes, BENCHMARKS),
          "flex-per-call": (render_flex_per_call, {"docs/history.md": "data/"}), "sdpa": (render_sdpa_and_bias, BENCHMARKS),
          "hf-flash": (render_hf_models, {"docs/history.md": "data/"}),
          "hf-4096": (render_hf_4096, {"docs/history.md": "data/"}),
          "cudnn-versions": (render_cudnn_versions, BENCHMARKS),
          "native-sweeps": (render_native_sweeps, BENCHMARKS),
          "default-policy": (render_default_policy, BENCHMARKS), "hf-default": (render_hf_default, BENCHMARKS),
          "dist-steps": (render_dist_steps, {"docs/distributed.md": "data/"}),
          "dist-correctness": (render_dist_correctness, {"docs/distributed.md": "data/"})}


def _markers(name: str = NAME) -> tuple[str, str]:
    return f"<!-- table:{name} begin -->", f"<!-- table:{name} end -->"


def _split(text: str, path: str, name: str = NAME) -> tuple[str, str, str]:
    begin, end = _markers(name)
    if text.count(begin) != 1 or text.count(end) != 1 or text.index(begin) > text.index(end):
        raise SystemExit(f"docs/tables.py: {path} needs one {begin} ... {end} pair")
    head, rest = text.split(begin)
    body, tail = rest.split(end)
    return head + begin, body, end + tail


def _pins() -> dict[str, str]:
    """The version pins the README may state -> where each is defined (the Makefile, pyproject.toml,
    te_compile/cudnn/install.py)."""
    def grab(path: str, pattern: str) -> str:
        with open(os.path.join(ROOT, path)) as f:
            m = re.search(pattern, f.read(), flags=re.M)
        _need(m is not None, f"{pattern!r} in {path}")
        return m.group(1)
    return {grab("Makefile", r"^TORCH_PIN \?= (torch==[\d.]+)$"): "Makefile TORCH_PIN",
            grab("pyproject.toml", r'"(torch>=[\d.]+)"'): "pyproject.toml",
            grab("te_compile/cudnn/install.py", r'^FRONTEND = "([^"]+)"'): "te_compile/cudnn/install.py FRONTEND",
            grab("Makefile", r'--no-deps "(nvidia-cudnn-frontend==[\d.]+)"'): "Makefile (the CPU suite's frontend)"}


def readme_numbers() -> list[str]:
    """Every number README.md states outside its generated table that is not a version pin defined elsewhere
    (the Makefile, pyproject.toml, te_compile/cudnn/install.py): the README's figures all come from the table."""
    with open(os.path.join(ROOT, "README.md")) as f:
        head, _, tail = _split(f.read(), "README.md", README_NAME)
    text = re.sub(r"\]\([^)]*\)", "]", head + tail)  # link targets (file names) are not figures
    for pin in _pins():
        text = text.replace(pin, "")
    text = re.sub(r"\b(?:docs/)?[\w.-]+\.(?:md|py|json)\b", "", text)
    return [f"README.md: {m.group(0)!r} outside the generated table (figures belong in it or docs/benchmarks.md)"
            for m in re.finditer(r"(?<![\w.])\d+(?:\.\d+)*", text)]


def stale() -> list[str]:
    """"file: table" for every generated table that differs from what its source gives (empty: all current), and
    every number README.md states outside its table (readme_numbers)."""
    out = readme_numbers()
    for name, (fn, targets) in TABLES.items():
        for path, prefix in targets.items():
            with open(os.path.join(ROOT, path)) as f:
                _, body, _ = _split(f.read(), path, name)
            if body.strip("\n") != fn(prefix):
                out.append(f"{path}: {name}")
    return out


def check() -> None:
    """Raise AssertionError naming the stale tables (for the tests)."""
    bad = stale()
    assert not bad, f"tables out of date in {', '.join(bad)}: run python docs/tables.py"


def write() -> list[str]:
    changed = []
    for name, (fn, targets) in TABLES.items():
        for path, prefix in targets.items():
            full = os.path.join(ROOT, path)
            with open(full) as f:
                text = f.read()
            head, body, tail = _split(text, path, name)
            new = f"{head}\n{fn(prefix)}\n{tail}"
            if new != text:
                with open(full, "w") as f:
                    f.write(new)
                changed.append(f"{path}: {name}")
    return changed


def main(argv: list[str]) -> int:
    if argv == ["--check"]:
        bad = stale()
        for where in bad:
            print(where if " outside " in where else f"{where}: the table differs from its source: run python "
                  "docs/tables.py", file=sys.stderr)
        return 1 if bad else 0
    if argv:
        print(__doc__, file=sys.stderr)
        return 2
    for where in write():
        print(f"rewrote {where}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
