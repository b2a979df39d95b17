"""The masks people train with, per path: te_compile (default, serve="always", its graph path alone), cuDNN's
interval kernels called directly, Inductor flex, FLASH.

    python3 bench/masks.py --shape 2,16,4096,128 --json masks.json [--flash] [--rounds 5] [--masks causal,document4]

One process, one GPU. For each mask class (causal, sliding window 1024, prefix-LM with 512 prefix keys, 4 equal
documents + causal, 16 documents of random lengths (one of length 1) + causal, 4 sink keys + a 1024 window) and each
path, a forward and a training step (forward + backward, a fixed upstream gradient) are timed between CUDA events after
warm-up, the median of ``--iters`` calls per round and, for the step, a loop of ``--iters`` steps timed as a whole
(``loop_ms``: throughput, steadier where the host bounds the step), rounds alternating between paths (each round
starts with the next path), the best round kept; "A/A" is plain torch.compile timed again as its own column (the noise floor).

Paths: ``te_compile`` its default policy, ``always`` serve="always" (the interval kernels where the mask takes them),
``graph`` serve="always" with the interval kernels off (``TE_COMPILE_INTERVALS=0``: te_compile's cuDNN graph path);
``cudnn_flex`` is the frontend's ``cudnn.flex_attention`` (SM90 interval-mask kernels, BSHD views of the same
tensors, the MaskPlan built once outside the timed loop; its build time is reported apart); ``cudnn_flex_thd`` the same
kernels on the variable-length layout for document masks (one sequence per document); ``torch.compile`` plain
``torch.compile`` of flex_attention (Inductor), ``control`` the same again; ``flash`` flex's
FLASH backend where it imports (``--flash``). Every output and gradient is compared with float32 flex first; a path
whose numbers differ is reported as wrong and not timed.
"""

from __future__ import annotations

import argparse
import datetime
import math
import os
import statistics
import sys
import time
import types
from typing import Callable, Optional

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import record  # noqa: E402

W, P, SINK = 1024, 512, 4


def doc_ids(B: int, L: int, kind: str, device) -> torch.Tensor:
    """[B, L] document ids: 4 equal documents, or 16 of random lengths (seeded, one of length 1), per row."""
    if kind == "document4":
        return (torch.arange(L, device=device) // max(L // 4, 1)).clamp(max=3).expand(B, L).contiguous()
    g = torch.Generator().manual_seed(1234)
    rows = []
    for _ in range(B):
        cuts = torch.randperm(L - 2, generator=g)[:14].add(1).sort().values.tolist()
        lengths = [b - a for a, b in zip([0] + cuts, cuts + [L - 1])] + [1]  # 15 documents, then a length-1 one
        rows.append(torch.repeat_interleave(torch.arange(16), torch.tensor(lengths)))
    return torch.stack(rows).to(device)


def mask_mods(B: int, L: int, device) -> dict:
    docs = {k: doc_ids(B, L, k, device) for k in ("document4", "document16")}

    def doc(kind):
        d = docs[kind]
        return lambda b, h, q, kv: (d[b, q] == d[b, kv]) & (q >= kv)
    return {
        "causal": lambda b, h, q, kv: q >= kv,
        "sliding": lambda b, h, q, kv: (q >= kv) & (q - kv <= W),
        "prefix-LM": lambda b, h, q, kv: (kv < P) | (q >= kv),
        "document4": doc("document4"),
        "document16": doc("document16"),
        "sink+local": lambda b, h, q, kv: (q >= kv) & ((kv < SINK) | (q - kv <= W)),
    }, docs


def endpoints(name: str, B: int, L: int, docs: dict, device) -> torch.Tensor:
    """[1, nfunc, B*L] int32 interval endpoints ``[0, F0) U [F1, F2)`` of the mask for every query row."""
    q = torch.arange(L, device=device, dtype=torch.int32).expand(B, L)
    zero = torch.zeros_like(q)
    if name == "causal":
        f = [q + 1]
    elif name == "prefix-LM":
        f = [torch.clamp(q + 1, min=P)]
    elif name == "sliding":
        f = [zero, torch.clamp(q - W, min=0), q + 1]
    elif name == "sink+local":
        f0 = torch.clamp(q + 1, max=SINK)
        f = [f0, torch.maximum(q - W, f0), q + 1]
    else:  # documents: runs of equal ids; a row sees [start of its document, q]
        d = docs[name]
        new = torch.ones_like(d, dtype=torch.bool)
        new[:, 1:] = d[:, 1:] != d[:, :-1]
        start = torch.where(new, q, zero).cummax(dim=1).values
        f = [zero, start, q + 1]
    return torch.stack([x.reshape(-1) for x in f]).unsqueeze(0).to(torch.int32).contiguous()


def _median_ms(fn: Callable, iters: int, warmup: int = 5) -> float:
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    ev = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(iters)]
    for a, b in ev:
        a.record()
        fn()
        b.record()
    torch.cuda.synchronize()
    return statistics.median(a.elapsed_time(b) for a, b in ev)


def _loop_ms(fn: Callable, iters: int) -> float:
    """ms per call of a loop of ``iters`` calls timed as a whole (events at its ends): a host-bound step's
    throughput, steadier than the median of single calls between events."""
    fn()
    torch.cuda.synchronize()
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record()
    for _ in range(iters):
        fn()
    b.record()
    torch.cuda.synchronize()
    return a.elapsed_time(b) / iters


def kernel_ms(f: Callable, q, k, v, dout, steps: int = 5) -> Optional[float]:
    """CUDA kernel time per training step from the profiler: the GPU's work alone, whatever the host costs."""
    from torch.profiler import ProfilerActivity, profile

    def step():
        torch.autograd.grad(f(q, k, v), (q, k, v), dout)
    step()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            step()
        torch.cuda.synchronize()
    ks = [e for e in prof.key_averages() if e.device_type == torch.autograd.DeviceType.CUDA]
    return sum(e.self_device_time_total for e in ks) / steps / 1e3


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", default="2,16,4096,128", help="B,H,L,D[,Hkv]")
    ap.add_argument("--masks", default="causal,sliding,prefix-LM,document4,document16,sink+local")
    ap.add_argument("--paths", default="te_compile,always,graph,cudnn_flex,cudnn_flex_thd,torch.compile,control")
    ap.add_argument("--flash", action="store_true", help="also flex's FLASH backend (needs flash_attn.cute)")
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    why = record.interval_kernels()
    if why != "available":
        print(f"note: cuDNN's interval kernels cannot run here ({why}): the interval masks take the graph path or "
              "stay with Inductor in every te_compile column", flush=True)

    dims = [int(x) for x in a.shape.split(",")]
    B, H, L, D = dims[:4]
    Hkv = dims[4] if len(dims) > 4 else H
    dev = torch.device("cuda")
    torch.manual_seed(0)
    # q / k / v as a model makes them: [B, L, H, D] projections viewed as flex's [B, H, L, D]
    qs = torch.randn(B, L, H, D, device=dev, dtype=torch.bfloat16).transpose(1, 2).requires_grad_()
    ks = torch.randn(B, L, Hkv, D, device=dev, dtype=torch.bfloat16).transpose(1, 2).requires_grad_()
    vs = torch.randn(B, L, Hkv, D, device=dev, dtype=torch.bfloat16).transpose(1, 2).requires_grad_()
    dout = torch.randn(B, H, L, D, device=dev, dtype=torch.bfloat16)
    mods, docs = mask_mods(B, L, dev)
    paths = a.paths.split(",") + (["flash"] if a.flash else [])
    rows = []
    gqa = {"enable_gqa": True} if Hkv != H else {}
    import te_compile

    for name in a.masks.split(","):
        mm = mods[name]
        t0 = time.perf_counter()
        bm = create_block_mask(mm, B, 1, L, L, device=dev)
        torch.cuda.synchronize()
        row = {"case": f"flex {name}", "mask": name, "shape": [B, H, L, D, Hkv], "block_mask_ms": (time.perf_counter() - t0) * 1e3}
        flex = lambda q, k, v, bm=bm, **kw: flex_attention(q, k, v, block_mask=bm, **gqa, **kw)  # noqa: E731
        fns: dict = {}
        torch._dynamo.reset()
        for p in paths:
            try:
                if p in ("torch.compile", "control"):
                    fns[p] = torch.compile(flex, dynamic=False)
                elif p in ("te_compile", "always", "graph"):
                    fns[p] = _te(flex, p, qs, ks, vs, row)
                elif p == "flash":
                    cf = torch.compile(flex, dynamic=False)
                    fns[p] = lambda q, k, v, cf=cf: cf(q, k, v, kernel_options={"BACKEND": "FLASH"})
                elif p == "cudnn_flex":
                    fns[p], row["plan_ms"] = _cudnn_flex(name, B, L, docs, qs, ks, vs)
                elif p == "cudnn_flex_thd" and name.startswith("document"):
                    fns[p], row["plan_thd_ms"] = _cudnn_flex_thd(docs[name], qs, ks, vs)
            except Exception as e:  # noqa: BLE001 - a path that cannot run is a row entry, not a failure
                row[p] = {"error": f"{type(e).__name__}: {str(e).splitlines()[0][:160] if str(e) else ''}"}
        # correctness against float32 flex (compiled: eager flex materializes every score)
        ref_fn = torch.compile(flex, dynamic=False)
        q32, k32, v32 = (t.detach().float().requires_grad_() for t in (qs, ks, vs))
        ro = ref_fn(q32, k32, v32)
        rg = torch.autograd.grad(ro, (q32, k32, v32), dout.float())
        scale = [ro.abs().max().item()] + [g.abs().max().item() for g in rg]
        for p, f in list(fns.items()):
            try:
                o = f(qs, ks, vs)
                g = torch.autograd.grad(o, (qs, ks, vs), dout)
                errs = [(o.float() - ro).abs().max().item()] + [(x.float() - y).abs().max().item() for x, y in zip(g, rg)]
                rel = [e / max(s, 1e-6) for e, s in zip(errs, scale)]
                row.setdefault(p, {})["max_rel_err"] = rel
                if max(rel) > 0.05 or any(math.isnan(x) for x in rel):
                    row[p]["wrong"] = True
                    fns.pop(p)
            except Exception as e:  # noqa: BLE001
                row[p] = {"error": f"{type(e).__name__}: {str(e).splitlines()[0][:160] if str(e) else ''}"}
                fns.pop(p)
        del ro, rg, q32, k32, v32
        order = list(fns.items())
        for r in range(a.rounds):
            for p, f in order[r % len(order):] + order[:r % len(order)]:
                with torch.no_grad():
                    fwd = _median_ms(lambda: f(qs, ks, vs), a.iters)

                def step():
                    o = f(qs, ks, vs)
                    torch.autograd.grad(o, (qs, ks, vs), dout)
                st = _median_ms(step, a.iters)
                cell = row.setdefault(p, {})
                cell.setdefault("loop_rounds", []).append(_loop_ms(step, a.iters))
                cell.setdefault("fwd_rounds", []).append(fwd)
                cell.setdefault("step_rounds", []).append(st)
        for p, f in fns.items():
            c = row[p]
            c["fwd_ms"], c["step_ms"], c["loop_ms"] = min(c["fwd_rounds"]), min(c["step_rounds"]), min(c["loop_rounds"])
            c["kernel_step_ms"] = kernel_ms(f, qs, ks, vs, dout)
        ind = row.get("torch.compile", {})
        for p in fns:
            row[p]["ms"], row[p]["kernel_ms"] = row[p]["step_ms"], row[p].get("kernel_step_ms")
            if "step_ms" in ind:
                row[p]["step_vs_inductor"] = ind["step_ms"] / row[p]["step_ms"]
                row[p]["fwd_vs_inductor"] = ind["fwd_ms"] / row[p]["fwd_ms"]
                row[p]["loop_vs_inductor"] = ind["loop_ms"] / row[p]["loop_ms"]
        rows.append(row)
        record.write(a.json, {"date": datetime.date.today().isoformat(), "command": record.command("bench/masks.py"),
                              "device": torch.cuda.get_device_name(), "torch": torch.__version__,
                              "cudnn": torch.backends.cudnn.version(), "rows": rows})  # after every row
        print(f"{name:12s} served {row.get('served')} " + "  ".join(
            f"{p} {row[p]['fwd_ms']:.3f}/{row[p]['step_ms']:.3f} ms ({row[p]['step_vs_inductor']:.2f}x"
            f", loop {row[p]['loop_ms']:.3f} {row[p]['loop_vs_inductor']:.2f}x"
            f", kernels {row[p].get('kernel_step_ms') or float('nan'):.3f})"
            if "step_ms" in row.get(p, {}) else f"{p} {row.get(p, {}).get('error', 'wrong' if row.get(p, {}).get('wrong') else '-')}"
            for p in paths) + f"  plan {row.get('plan_ms', float('nan')):.1f} ms  block_mask {row['block_mask_ms']:.1f} ms",
            flush=True)
    return 0


def _te(flex: Callable, p: str, qs, ks, vs, row: dict) -> Callable:
    """te_compile's column ``p``: its default policy, serve="always", or serve="always" on the graph path alone (the
    interval kernels off); compiled and run once here, so the row records what it served."""
    import os

    import te_compile
    from te_compile.report import Report, record_reports

    # a code object of its own per column: Dynamo caches compiled frames per code object, and two columns with equal
    # backends would otherwise share one compile
    flex = types.FunctionType(flex.__code__.replace(co_name=f"flex_{p}"), flex.__globals__, f"flex_{p}",
                              flex.__defaults__, flex.__closure__)
    old = os.environ.get("TE_COMPILE_INTERVALS")
    if p == "graph":
        os.environ["TE_COMPILE_INTERVALS"] = "0"  # read at compile time
    try:
        f = torch.compile(flex, backend=te_compile.backend(serve="fastest" if p == "te_compile" else "always"),
                          dynamic=False)
        with record_reports() as graphs:
            f(qs, ks, vs)
    finally:
        if old is None:
            os.environ.pop("TE_COMPILE_INTERVALS", None)
        else:
            os.environ["TE_COMPILE_INTERVALS"] = old
    rep = Report(list(graphs))
    row.setdefault(p, {})["served"] = rep.summary()["cudnn"]
    row[p]["spec"] = [d.spec.key() if d.spec else None for d in rep.decisions]
    row[p]["reason"] = "; ".join(d.reason or d.note for d in rep.decisions)[:200]
    if p == "te_compile":
        row["served"] = row[p]["served"]
    return f


def _cudnn_flex(name: str, B: int, L: int, docs: dict, qs, ks, vs):
    """(f(q, k, v) -> out in flex's layout, plan build ms) on cudnn.flex_attention, BSHD views."""
    from cudnn.flex_attention import create_mask_plan, flex_attn_func

    ep = endpoints(name, B, L, docs, qs.device)
    qb, kb, vb = (t.transpose(1, 2) for t in (qs, ks, vs))
    create_mask_plan(ep, qb, kb, vb, build_backward=True)  # compile the plan kernels once
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    plan = create_mask_plan(ep, qb, kb, vb, build_backward=True)
    torch.cuda.synchronize()
    ms = (time.perf_counter() - t0) * 1e3

    def f(q, k, v):
        return flex_attn_func(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), mask_plan=plan).transpose(1, 2)
    return f, ms


def _cudnn_flex_thd(d: torch.Tensor, qs, ks, vs):
    """The variable-length layout: every document one sequence, causal inside it."""
    from cudnn.flex_attention import create_mask_plan, flex_attn_func

    B, L = d.shape
    new = torch.ones_like(d, dtype=torch.bool)
    new[:, 1:] = d[:, 1:] != d[:, :-1]
    starts = (torch.arange(B * L, device=d.device).view(B, L))[new]
    cu = torch.cat([starts, torch.tensor([B * L], device=d.device)]).to(torch.int32)
    lens = cu[1:] - cu[:-1]
    maxlen = int(lens.max())
    local = torch.arange(B * L, device=d.device) - torch.repeat_interleave(cu[:-1].long(), lens.long())
    ep = (local + 1).to(torch.int32).view(1, 1, -1).contiguous()
    flat = [t.transpose(1, 2).reshape(B * L, t.shape[1], t.shape[3]) for t in (qs, ks, vs)]
    kw = dict(cu_seqlens_q=cu, cu_seqlens_k=cu, max_seqlen_q=maxlen, max_seqlen_k=maxlen, build_backward=True)
    create_mask_plan(ep, *flat, **kw)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    plan = create_mask_plan(ep, *flat, **kw)
    torch.cuda.synchronize()
    ms = (time.perf_counter() - t0) * 1e3

    def f(q, k, v):
        x = [t.transpose(1, 2).reshape(B * L, t.shape[1], t.shape[3]) for t in (q, k, v)]
        o = flex_attn_func(*x, mask_plan=plan)
        return o.view(B, L, o.shape[1], o.shape[2]).transpose(1, 2)
    return f, ms


if __name__ == "__main__":
    sys.exit(main())
