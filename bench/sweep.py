"""Training-step sweep: te_compile vs plain torch.compile, side by side in one process (GPU).

    python3 bench/sweep.py --part sdpa --json sdpa.json     # SDPA none / causal over a grid of shapes
    python3 bench/sweep.py --part flex --json flex.json     # every flex variant at --shape

Each row is one attention call as a training step (forward + backward, q/k/v require grad, a fixed
upstream gradient), timed back to back between CUDA events after warm-up (median of --iters),
plus the host time per step (a loop without syncs; short kernels let the host show) and the CUDA kernel time
per step (profiler; tests/test_rules.py checks te_compile.tuning.rules against committed runs). Every row is
printed, the ones te_compile loses included; the ratio is torch.compile's time / te_compile's.

The variant "document (loader)" rewrites its document ids in place before every step (the same values: a data
loader's new packing, at no cost to a kernel that reads them), so whatever te_compile keeps per ids tensor (its
interval plan) is built again every step, as in training; "document" reuses one set of ids. The objects left by
compiling are frozen out of Python's collector while a case is timed (``gc.freeze``), so a collection of the
compilers' heap does not land in one column's round.
"""

from __future__ import annotations

import argparse
import datetime
import gc
import math
import os
import statistics
import sys
import time
from typing import Callable

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import record  # noqa: E402


#: torch.compile's mode for every implementation (--mode)
MODE = None
#: forward-only steps on inputs that need no gradient (--infer): inference as users run it
INFER = False
#: te_compile.tune each case before measuring it (--tune): the default policy then decides from measurements
TUNE = False


def step_ms(fn: Callable, args: list, iters: int, warmup: int = 10,
            before: Callable | None = None) -> tuple[float, float, float]:
    """(median device ms of one step between events, host µs per step, ms per step of a loop of
    ``iters`` steps timed as a whole) of one fwd+bwd step (forward only with --infer). The loop time
    is the throughput a training loop sees: on host-bound steps the per-step events also time the
    gaps where the GPU waits for the host, and their median is noisier. ``before``: run at the start of
    every step, inside the timing (a loader's work, such as new document ids)."""
    mark = torch.compiler.cudagraph_mark_step_begin if MODE else (lambda: None)
    mark()
    out = fn(*args)
    dout = torch.randn_like(out)

    grads = [a for a in args if isinstance(a, torch.Tensor) and a.requires_grad] if MODE else []

    def step():
        # under CUDA graphs: a new step (the first call's output above never ran its backward), and
        # fresh .grad tensors (accumulating into the last replay's outputs is not allowed)
        mark()
        if before is not None:
            before()
        for a in grads:
            a.grad = None
        o = fn(*args)
        if not INFER:
            o.backward(dout)

    for _ in range(warmup):
        step()
    torch.cuda.synchronize()
    ev = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(iters)]
    for a, b in ev:
        a.record()
        step()
        b.record()
    torch.cuda.synchronize()
    dev = statistics.median(a.elapsed_time(b) for a, b in ev)
    t0 = time.perf_counter()
    for _ in range(iters):
        step()
    host = (time.perf_counter() - t0) / iters * 1e6
    torch.cuda.synchronize()
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record()
    for _ in range(iters):
        step()
    b.record()
    torch.cuda.synchronize()
    loop = a.elapsed_time(b) / iters
    for a in args:
        if isinstance(a, torch.Tensor):
            a.grad = None
    return dev, host, loop


def kernel_ms(fn: Callable, args: list, steps: int = 10, before: Callable | None = None) -> float | None:
    """CUDA kernel time per step from the profiler (the GPU's work alone, whatever the host costs); None under
    --mode (CUDA-graph replays)."""
    if MODE:
        return None
    from torch.profiler import ProfilerActivity, profile
    out = fn(*args)
    dout = torch.randn_like(out)

    def step():
        if before is not None:
            before()
        o = fn(*args)
        if not INFER:
            o.backward(dout)
    step()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            step()
        torch.cuda.synchronize()
    kernels = [e for e in prof.key_averages() if e.device_type == torch.autograd.DeviceType.CUDA]
    for a in args:
        if isinstance(a, torch.Tensor):
            a.grad = None
    return sum(e.self_device_time_total for e in kernels) / steps / 1e3


def _site_class(rep, args) -> str | None:
    """te_compile.tuning.rules.site_class of the (first) site te_compile served in the measured function."""
    from te_compile.tuning.rules import site_class
    for d in rep.decisions:
        if d.runs_on == "cudnn" and d.spec is not None:
            q, k = args[0], args[1]
            bias = args[3] if len(args) > 3 and isinstance(args[3], torch.Tensor) else None
            return site_class(d.spec, bias is not None, d.need_dbias, q.shape[2], k.shape[2], q.shape[1])
    return None


def _qkv(B, H, L, D, Hkv=None):
    g = torch.Generator(device="cuda").manual_seed(0)
    Hkv = Hkv or H
    return [torch.randn(B, h, L, D, device="cuda", dtype=torch.bfloat16, generator=g).requires_grad_(not INFER)
            for h in (H, Hkv, Hkv)]


def sdpa_variants():
    def none(q, k, v):
        return F.scaled_dot_product_attention(q, k, v, enable_gqa=q.shape[1] != k.shape[1])

    def causal(q, k, v):
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=q.shape[1] != k.shape[1])
    return {"sdpa none": none, "sdpa causal": causal}


#: the flex variants, as --cases names them (a "flex " prefix may be left out)
FLEX_CASES = ("flex none", "flex causal", "flex sliding <=", "flex sliding <", "flex softcap", "flex softcap + causal",
              "flex ALiBi", "flex ALiBi + causal", "flex prefix-LM", "flex document", "flex document (loader)")


def cases_wanted(arg: str) -> list[str]:
    """The flex variants ``--cases`` names (every one when empty); ValueError names an unknown one."""
    wanted = ["flex " + c.strip().removeprefix("flex ") for c in arg.split(",") if c.strip()]
    unknown = [c for c in wanted if c not in FLEX_CASES]
    if unknown:
        raise ValueError(f"unknown {', '.join(unknown)}; the variants are "
                         + ", ".join(c.removeprefix("flex ") for c in FLEX_CASES))
    return wanted


def prefix_keys(L: int) -> int:
    """The prefix-LM variant's prefix: 512 keys, at most half the sequence (a prefix of every key is no mask)."""
    return min(512, L // 2)


def flex_variants(H: int, L: int, kernel_options: dict | None = None, gqa: bool = False):
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    W, P = 1024, prefix_keys(L)
    docs = (torch.arange(L, device="cuda") // (L // 4))  # four documents
    loader_docs = docs.clone()  # rewritten in place before every step of "document (loader)"
    masks = {
        "causal": lambda b, h, q, kv: q >= kv,
        "sliding <=": lambda b, h, q, kv: (q >= kv) & (q - kv <= W),
        "sliding <": lambda b, h, q, kv: (q >= kv) & (q - kv < W),
        "prefix-LM": lambda b, h, q, kv: (kv < P) | (q >= kv),
        "document": lambda b, h, q, kv: (docs[q] == docs[kv]) & (q >= kv),
        "document (loader)": lambda b, h, q, kv: (loader_docs[q] == loader_docs[kv]) & (q >= kv),
    }
    softcap = lambda s, b, h, q, kv: 30.0 * torch.tanh(s / 30.0)  # noqa: E731
    alibi = lambda s, b, h, q, kv: s + torch.exp2(-((h + 1) * 8.0 / H)) * (kv - q)  # noqa: E731
    bms = {n: create_block_mask(m, 1, 1, L, L, device="cuda") for n, m in masks.items()}

    def mk(score_mod, mask):
        bm = bms[mask] if mask else None
        extra = {"enable_gqa": True} if gqa else {}
        if kernel_options:
            return lambda q, k, v: flex_attention(q, k, v, score_mod=score_mod, block_mask=bm,
                                                  kernel_options=kernel_options, **extra)
        return lambda q, k, v: flex_attention(q, k, v, score_mod=score_mod, block_mask=bm, **extra)
    variants = {
        "flex none": mk(None, None), "flex causal": mk(None, "causal"),
        "flex sliding <=": mk(None, "sliding <="), "flex sliding <": mk(None, "sliding <"),
        "flex softcap": mk(softcap, None), "flex softcap + causal": mk(softcap, "causal"),
        "flex ALiBi": mk(alibi, None), "flex ALiBi + causal": mk(alibi, "causal"),
        "flex prefix-LM": mk(None, "prefix-LM"), "flex document": mk(None, "document"),
        "flex document (loader)": mk(None, "document (loader)"),
    }
    # a new version of the same ids every step: a kernel reads the same values, a plan kept per ids is built again
    variants["flex document (loader)"].before_step = lambda: loader_docs.copy_(docs)
    assert tuple(variants) == FLEX_CASES
    return variants


def measure_pair(name: str, fn: Callable, args: list, iters: int, log, rounds: int = 3,
                 others: dict | None = None) -> dict:
    """te_compile (default serve policy) and torch.compile on one case: both compiled and warmed first,
    then measured in alternating rounds (A B A B ...), the best round's median kept per implementation:
    two identical kernels measured once each after compiling differed by up to 25% (host jitter).
    ``others``: more implementations {name: fn} compiled with plain torch.compile (the FLASH backend)."""
    import te_compile

    pre = getattr(fn, "before_step", None)  # a loader's work before every step, timed in every column
    row = {"case": name, "shape": [*args[0].shape[:3], args[0].shape[3], args[1].shape[1]]}
    if name == "flex prefix-LM":
        row["prefix_keys"] = prefix_keys(args[0].shape[2])
    torch._dynamo.reset()
    fns = {}
    if TUNE:  # measure this case's sites into the cache (a compile of its own) before the columns compile
        t0 = time.perf_counter()
        _, made = te_compile.tune(fn, *args, echo=log)
        row["tune"] = {"measured": len(made), "seconds": time.perf_counter() - t0}
        torch._dynamo.reset()
    cases = [("te_compile", "te_compile", fn), ("torch.compile", "inductor", fn)]
    cases += [(n, te_compile.backend(serve="always") if n == "always" else "inductor", f)
              for n, f in (others or {}).items()]
    from torch._dynamo.utils import counters

    from te_compile.report import Report, record_reports
    for impl, be, f0 in cases:
        try:
            fns[impl] = torch.compile(f0, backend=be, dynamic=False, mode=MODE)
            before = (counters["stats"]["unique_graphs"], counters["inductor"]["cudagraph_skips"])
            with record_reports() as graphs:
                step_ms(fns[impl], args, 3, before=pre)  # compile + warm
            # graphs compiled and graphs run without CUDA graphs (under --mode reduce-overhead)
            row.setdefault("graphs", {})[impl] = [counters["stats"]["unique_graphs"] - before[0],
                                                  counters["inductor"]["cudagraph_skips"] - before[1]]
            if impl == "always":  # sites serve="always" served (it keeps what cuDNN cannot serve exactly)
                row["served_always"] = Report(list(graphs)).summary()["cudnn"]
            if impl == "te_compile":  # what the measured te_compile function decided (its mode included)
                rep = Report(list(graphs))
                row["served"] = rep.summary()["cudnn"]
                row["reason"] = "; ".join(d.reason for d in rep.decisions if d.reason)[:160]
                row["class"] = _site_class(rep, args)
        except Exception as e:  # noqa: BLE001 - a refused case is a row, not a failure
            row[impl] = {"error": f"{type(e).__name__}: {str(e).splitlines()[0][:120]}"}
            fns.pop(impl, None)
    from te_compile.cudnn import native

    best: dict = {}
    loops: dict = {}
    rounds_ms: dict = {}  # every round's median, per implementation: paired per round by _paired
    calls: dict = {}  # te_compile's op calls during the measured rounds, per implementation (native.stats)
    order = list(fns.items())
    gc.collect()
    gc.freeze()  # the compilers' objects out of the collector's way while timing (module docstring)
    for r in range(rounds):
        # each round starts with the next implementation, so none is always timed first: on host-bound steps the
        # default column (timed first) and the always column disagreed on the same served graph (benchmarks.md)
        for impl, f in order[r % len(order):] + order[:r % len(order)]:
            s0 = native.stats()
            dev, host, loop = step_ms(f, args, iters, before=pre)
            s1 = native.stats()
            count_native(calls, impl, s0, s1)
            loops.setdefault(impl, []).append(loop)
            rounds_ms.setdefault(impl, []).append(dev)
            if impl not in best or dev < best[impl]["ms"]:
                best[impl] = {"ms": dev, "host_us": host}
    for impl, ls in loops.items():
        best[impl]["loop_ms"] = statistics.median(ls)
        if any(calls.get(impl, {}).values()):
            best[impl]["native_calls"] = calls[impl]
        best[impl]["rounds_ms"] = rounds_ms[impl]
        km = kernel_ms(fns[impl], args, before=pre)
        if km is not None:
            best[impl]["kernel_ms"] = km
    gc.unfreeze()
    row.update(best)
    te, tc = row.get("te_compile", {}), row.get("torch.compile", {})
    row["ratio"] = tc["ms"] / te["ms"] if "ms" in te and "ms" in tc else None
    row["loop_ratio"] = tc["loop_ms"] / te["loop_ms"] if "loop_ms" in te and "loop_ms" in tc else None
    alw = row.get("always", {})
    if "ms" in alw and "ms" in tc and "ms" in te:  # the oracle: the faster of serve="always" and torch.compile
        row["vs_oracle"] = min(alw["ms"], tc["ms"]) / te["ms"]
    ctl = row.get("control", {})
    if "ms" in ctl and "ms" in tc:  # the same plain torch.compile twice: the noise floor of the ratio
        row["control_aa"] = [tc["ms"] / ctl["ms"], tc["loop_ms"] / ctl["loop_ms"]]
    row["paired"] = _paired(row)
    vs = ""
    for n in others or {}:
        if n == "always":
            continue
        o = row.get(n, {})
        row[f"ratio_vs_{n}"] = o["ms"] / te["ms"] if "ms" in te and "ms" in o else None
        vs += (f"  {n} {o['ms']:8.3f} ms {row[f'ratio_vs_{n}']:5.2f}x" if "ms" in o and "ms" in te
               else f"  {n} {o.get('error', '-')[:60]}")
    log(f"{name:24s} {str(row['shape']):24s} served {row.get('served', '?')}  te {te.get('ms', float('nan')):8.3f} ms "
        f"({te.get('host_us', float('nan')):6.0f} us host)  tc {tc.get('ms', float('nan')):8.3f} ms "
        f"({tc.get('host_us', float('nan')):6.0f} us host)  {row['ratio'] or float('nan'):5.2f}x "
        f"(kernels {te.get('kernel_ms', float('nan')):.3f} / {tc.get('kernel_ms', float('nan')):.3f} ms) "
        f"(loop {row['loop_ratio'] or float('nan'):4.2f}x){vs}  "
        + (f"  A/A {row['control_aa'][0]:4.2f}x (loop {row['control_aa'][1]:4.2f}x)" if "control_aa" in row else "")
        + (f"  always {alw['ms']:8.3f} ms, default/oracle {row['vs_oracle']:4.2f}x" if "vs_oracle" in row else "")
        + "".join(f"  {impl} native {c['calls']} calls, {c['replays']} replays, {c['captures']} captures, "
                  f"{c['to_python']} to Python" for impl, c in calls.items() if any(c.values()))
        + f"  graphs/skips {row.get('graphs')}  {row.get('reason', '')}")
    return row


#: native.stats() counters -> the names a row keeps (``native_calls``): calls the C++ path ran, of them launched as
#: a captured CUDA graph, graphs captured, calls handed to the Python path
NATIVE_COUNTS = (("hits", "calls"), ("replays", "replays"), ("captures", "captures"), ("misses", "to_python"))


def count_native(calls: dict, name: str, before: dict, after: dict) -> None:
    """Add te_compile's op calls between two ``native.stats()`` snapshots to ``calls[name]`` (nothing where the
    native path is off: its stats are empty)."""
    if not before or not after:
        return
    c = calls.setdefault(name, dict.fromkeys((n for _, n in NATIVE_COUNTS), 0))
    for k, n in NATIVE_COUNTS:
        c[n] += after[k] - before[k]


def _paired(row: dict) -> dict:
    """Ratios from the rounds paired (torch.compile's round over the other's same round, median over rounds):
    drift between rounds cancels, which the best-round columns do not do on host-bound steps. "vs_oracle":
    the default policy against the faster of serve="always" and torch.compile, round by round."""
    r = {k: row[k]["rounds_ms"] for k in ("te_compile", "torch.compile", "always", "control")
         if "rounds_ms" in row.get(k, {})}
    out = {}
    if "torch.compile" in r:
        for k in ("te_compile", "always", "control"):
            if k in r:
                out[k] = statistics.median(t / x for t, x in zip(r["torch.compile"], r[k]))
        if "te_compile" in r and "always" in r:
            out["vs_oracle"] = statistics.median(min(a, t) / x for a, t, x in
                                                 zip(r["always"], r["torch.compile"], r["te_compile"]))
    return out


def _extra(a, fn) -> dict:
    """The extra columns --control and --always ask for."""
    out = {"control": fn} if a.control else {}
    if a.always:
        out["always"] = fn
    return out


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--part", choices=("sdpa", "flex"), default="sdpa")
    p.add_argument("--shape", default="2,16,4096,128",
                   help="B,H,L,D[,Hkv] for --part flex (Hkv < H: grouped-query attention, enable_gqa=True)")
    p.add_argument("--iters", type=int, default=30)
    p.add_argument("--json", default="")
    p.add_argument("--cases", default="", help="--part flex: only these variants (comma-separated, e.g. \"prefix-LM,document\")")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--flash", action="store_true", help="--part flex: add FlexAttention's FLASH backend (FA4) column")
    p.add_argument("--mode", default=None, help="torch.compile mode for every implementation (e.g. reduce-overhead)")
    p.add_argument("--infer", action="store_true", help="forward-only steps on inputs that need no gradient")
    p.add_argument("--control", action="store_true",
                   help="add a second plain torch.compile column: its ratio to the first is the noise floor")
    p.add_argument("--tune", action="store_true",
                   help="te_compile.tune each case first (fills the measurement cache), so the te_compile column's "
                        "default policy decides from measurements; with --always, the ratio to the oracle")
    p.add_argument("--always", action="store_true",
                   help="add a te_compile column with serve='always': the oracle is the faster of it and torch.compile")
    a = p.parse_args()
    try:
        wanted = cases_wanted(a.cases)
    except ValueError as e:
        p.error(f"--cases: {e}")
    global MODE, INFER, TUNE
    MODE, INFER, TUNE = a.mode, a.infer, a.tune
    import torch._inductor.config as ic
    ic.compile_threads = 1  # the compile workers' start-up slows the host side of measurements (cudnn-notes)
    rows = []
    log = lambda s: print(s, flush=True)  # noqa: E731

    def add(row: dict) -> None:  # the JSON is rewritten after every row: a run cut short keeps what it measured
        rows.append(row)
        save(a.json, rows)
    if a.part == "sdpa":
        for B, L, D, Hkv in ((1, 512, 64, 16), (4, 1024, 64, 16), (4, 1024, 64, 4), (8, 1024, 128, 16),
                             (1, 2048, 128, 16), (2, 4096, 64, 16), (2, 4096, 128, 16), (1, 8192, 128, 8),
                             (1, 16384, 128, 16)):
            args = _qkv(B, 16, L, D, Hkv)
            for name, fn in sdpa_variants().items():
                add(measure_pair(name, fn, args, a.iters, log, others=_extra(a, fn)))
            if Hkv == 16 and L in (1024, 4096, 8192):
                # masks: a bool padding mask, a frozen float bias, a learned float bias
                g = torch.Generator(device="cuda").manual_seed(1)
                pad = torch.ones(B, 1, 1, L, dtype=torch.bool, device="cuda")
                pad[:, :, :, L - L // 8:] = False
                bias = torch.randn(1, 16, L, L, device="cuda", dtype=torch.bfloat16, generator=g) * 0.5
                for name, m in (("sdpa bool mask", pad), ("sdpa frozen bias", bias),
                                ("sdpa learned bias", bias.clone().requires_grad_())):
                    fm = lambda q, k, v, m: F.scaled_dot_product_attention(q, k, v, attn_mask=m)  # noqa: E731
                    add(measure_pair(name, fm, args + [m], a.iters, log, others=_extra(a, fm)))
    else:
        B, H, L, D, *kv = (int(x) for x in a.shape.split(","))
        Hkv = kv[0] if kv else H
        args = _qkv(B, H, L, D, Hkv)
        flash = flex_variants(H, L, {"BACKEND": "FLASH"}, Hkv != H) if a.flash else {}
        variants = flex_variants(H, L, gqa=Hkv != H)
        why = record.interval_kernels()
        if why != "available":
            log(f"note: cuDNN's interval kernels cannot run here ({why}): prefix-LM and document masks take the "
                "graph path or stay with Inductor in every column")
        for name, fn in variants.items():
            if wanted and name not in wanted:
                continue
            others = {"FLASH": flash[name]} if name in flash else {}
            others.update(_extra(a, fn))
            add(measure_pair(name, fn, args, a.iters, log, rounds=a.rounds, others=others))
    ratios = [r["ratio"] for r in rows if r["ratio"]]
    if ratios:
        log(f"geomean {math.exp(sum(map(math.log, ratios)) / len(ratios)):.2f}x over {len(ratios)} rows, "
            f"min {min(ratios):.2f}x")
    lr = [r["loop_ratio"] for r in rows if r.get("loop_ratio")]
    if lr:
        log(f"loop throughput: geomean {math.exp(sum(map(math.log, lr)) / len(lr)):.2f}x, min {min(lr):.2f}x")
    vo = [r["vs_oracle"] for r in rows if r.get("vs_oracle")]
    if vo:
        log(f"default policy / oracle: geomean {math.exp(sum(map(math.log, vo)) / len(vo)):.2f}x, min {min(vo):.2f}x "
            f"over {len(vo)} rows; sites measured while tuning: {sum(r.get('tune', {}).get('measured', 0) for r in rows)}")
    pv = [r["paired"]["vs_oracle"] for r in rows if r.get("paired", {}).get("vs_oracle")]
    pa = [r["paired"]["control"] for r in rows if r.get("paired", {}).get("control")]
    if pv:
        log(f"paired rounds: default policy / oracle geomean {math.exp(sum(map(math.log, pv)) / len(pv)):.2f}x, "
            f"min {min(pv):.2f}x" + (f"; A/A {min(pa):.2f}-{max(pa):.2f}x" if pa else ""))
    aa = [r["control_aa"] for r in rows if r.get("control_aa")]
    if aa:
        log(f"A/A (torch.compile vs itself): events {min(x[0] for x in aa):.2f}-{max(x[0] for x in aa):.2f}x, "
            f"loop {min(x[1] for x in aa):.2f}-{max(x[1] for x in aa):.2f}x")
    for other in ("FLASH",):
        fr = [r[f"ratio_vs_{other}"] for r in rows if r.get(f"ratio_vs_{other}")]
        if fr:
            log(f"vs {other}: geomean {math.exp(sum(map(math.log, fr)) / len(fr)):.2f}x over {len(fr)} rows, "
                f"min {min(fr):.2f}x, max {max(fr):.2f}x")
    save(a.json, rows)
    return 0


def save(path: str, rows: list) -> None:
    if not path:
        return
    from te_compile.cudnn.versions import running
    arch = "sm{}{}".format(*torch.cuda.get_device_capability())
    record.write(path, {"device": torch.cuda.get_device_name(), "arch": arch, "torch": torch.__version__,
                        "cudnn": running(), "infer": INFER, "mode": MODE, "date": datetime.date.today().isoformat(),
                        "command": record.command("bench/sweep.py"), "rows": rows})


if __name__ == "__main__":
    raise SystemExit(main())
