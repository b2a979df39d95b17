"""Host time per call: te_compile's ops, compiled flex calls and a kept model against aten's cuDNN SDPA and Inductor (GPU).

    python3 bench/host_time.py [--shapes "2,16,4096,128;1,1,256,64"] [--json docs/data/host-time.json]

In one process, per shape:
* the te ops called as a compiled graph calls them (no autograd history): ``attn_fwd`` / ``attn_bwd`` on the
  native call path (with its CUDA-graph replays, and without), and on the Python path (te_compile.cudnn.native
  off), against aten's cuDNN SDPA ops
  (``_scaled_dot_product_cudnn_attention`` and its backward), for no mask and causal;
* compiled flex calls, forward (no grad) and training (forward and backward): te_compile (serve="always"; with and
  without replays; and the same graph handed to Inductor, ``TE_COMPILE_DIRECT=0``, where te_compile calls a
  graph of only its ops directly), and te_compile with its site kept (serve="fastest" with every class kept: what a
  kept site costs), against plain torch.compile (Inductor), for no mask, causal, a sliding window and softcap;
  Inductor's call is measured twice, as two rows (A/A: the measurement's own noise).
* (``--parts model``) a whole model of ``--model-layers`` decoder blocks (hidden H x D, causal flex and SDPA), a
  training step per call, compiled whole: te_compile with every site kept against Inductor, measured twice.

Host µs per call: a loop of --iters calls without a sync, timed on the host. The calls compared in one group
(the op calls of one shape and mask; te_compile's and Inductor's compiled call of one variant) take turns, one
loop each per round, for --repeats rounds, and each keeps the median of its rounds, so a change in the host's
speed during the run falls on all of them alike. Kernel µs per call: the profiler's CUDA time. Every row is
printed and written, the ones te_compile loses included.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import os
import platform
import statistics
import sys
import time
from typing import Callable

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import record  # noqa: E402


def host_us(calls: dict, iters: int, repeats: int, setup: Callable = lambda name: None,
            counts: dict | None = None) -> dict:
    """Host µs per call of each of ``calls`` (name -> callable), measured in alternating rounds; ``setup(name)``
    runs before each of its loops, untimed. ``counts``: filled with how the te ops' calls of each timed loop ran
    (bench/sweep.py count_native: native, replayed, captured, handed to Python)."""
    from te_compile.cudnn import native

    from sweep import count_native
    for name, fn in calls.items():
        setup(name)
        for _ in range(3):
            fn()
    torch.cuda.synchronize()
    runs: dict = {name: [] for name in calls}
    names = list(calls)
    for r in range(repeats):  # each round starts with the next call: no call always runs first (or after another)
        for name in names[r % len(names):] + names[:r % len(names)]:
            fn = calls[name]
            setup(name)
            s0 = native.stats()
            t0 = time.perf_counter()
            for _ in range(iters):
                fn()
            runs[name].append((time.perf_counter() - t0) / iters * 1e6)
            torch.cuda.synchronize()
            if counts is not None:
                count_native(counts, name, s0, native.stats())
    return {name: statistics.median(r) for name, r in runs.items()}


def kernel_us(fn: Callable, calls: int = 10) -> float:
    from torch.profiler import ProfilerActivity, profile
    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
    return sum(e.self_device_time_total for e in prof.key_averages()
               if e.device_type == torch.autograd.DeviceType.CUDA) / calls


def op_rows(B: int, H: int, L: int, D: int, iters: int, repeats: int, log, rows: list) -> list[dict]:
    from te_compile.cudnn import native
    from te_compile.spec import AttentionSpec

    g = torch.Generator(device="cuda").manual_seed(0)
    q, k, v, dout = (torch.randn(B, H, L, D, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(4))
    aten_fwd = torch.ops.aten._scaled_dot_product_cudnn_attention.default
    aten_bwd = torch.ops.aten._scaled_dot_product_cudnn_attention_backward.default
    # the overloads themselves, as a compiled graph calls them (and as aten's are called here)
    te_fwd, te_bwd = torch.ops.te_compile.attn_fwd.default, torch.ops.te_compile.attn_bwd.default
    for causal in (False, True):
        variant = "causal" if causal else "none"
        spec = AttentionSpec(mask=variant).key()
        with torch.no_grad():
            o, lse, cq, ck, mq, mk, seed, off, _ = aten_fwd(q, k, v, None, True, 0.0, causal, False)
            te_out, te_lse = te_fwd(q, k, v, None, [], spec)
            calls = {
                "te op fwd": lambda: te_fwd(q, k, v, None, [], spec),
                "aten cuDNN SDPA fwd": lambda: aten_fwd(q, k, v, None, True, 0.0, causal, False),
                "te op bwd": lambda: te_bwd(dout, q, k, v, te_out, te_lse, None, [], spec, False),
                "aten cuDNN SDPA bwd": lambda: aten_bwd(dout, q, k, v, o, lse, seed, off, None, cq, ck, mq, mk, 0.0,
                                                        causal),
            }
            host = {}
            # the te ops on each path; aten's calls take turns with each
            for path in ("native", "native, no replays", "python"):
                if path == "python":
                    native.disable()
                native.set_replay(path == "native")
                counts: dict = {}
                got = host_us(calls, iters, repeats, counts=counts)
                host.update({(f"{n} ({path})" if n.startswith("te") else f"{n} [{path} round]"): t
                             for n, t in got.items()})
                for name in ("te op fwd", "te op bwd"):
                    rows.append(_row(f"{name} ({path})", (B, H, L, D), variant, host[f"{name} ({path})"],
                                     calls[name], log, counts.get(name)))
                native.enable()
                native.set_replay(True)
            for name in ("aten cuDNN SDPA fwd", "aten cuDNN SDPA bwd"):
                rows.append(_row(name, (B, H, L, D), variant, host[f"{name} [native round]"], calls[name], log))
    return rows


def _row(name: str, shape: tuple, variant: str, host: float, fn: Callable, log, calls: dict | None = None) -> dict:
    row = {"call": name, "shape": list(shape), "variant": variant, "host_us": host, "kernel_us": kernel_us(fn)}
    if calls and any(calls.values()):  # how the te ops' calls in the timed loops ran
        row["native_calls"] = calls
    log(f"{name:32s} {str(list(shape)):20s} {variant:16s} host {row['host_us']:7.1f} us   "
        f"kernels {row['kernel_us']:8.1f} us" + (f"   native {calls}" if "native_calls" in row else ""))
    return row


def _through_inductor(backend: Callable) -> Callable:
    """``backend`` with te_compile's direct call of a graph of only its ops turned off while it compiles
    (``TE_COMPILE_DIRECT=0``, te_compile.runtime.direct): the graph goes through Inductor as any other."""
    def compile_(*args, **kwargs):
        saved = os.environ.get("TE_COMPILE_DIRECT")
        os.environ["TE_COMPILE_DIRECT"] = "0"
        try:
            return backend(*args, **kwargs)
        finally:
            if saved is None:
                os.environ.pop("TE_COMPILE_DIRECT")
            else:
                os.environ["TE_COMPILE_DIRECT"] = saved
    return compile_


def flex_rows(B: int, H: int, L: int, D: int, iters: int, repeats: int, log, rows: list, train: bool = False,
              flush: Callable = lambda: None) -> list[dict]:
    """Compiled flex calls: forward only (no grad), or with ``train`` a forward and a backward
    (``torch.autograd.grad``, so no gradient accumulates) per call."""
    import te_compile
    from te_compile import tuning
    from te_compile.cudnn import native
    from te_compile.tuning import rules
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    g = torch.Generator(device="cuda").manual_seed(0)
    q, k, v, dout = (torch.randn(B, H, L, D, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(4))
    if train:
        q, k, v = (t.requires_grad_() for t in (q, k, v))
    kind = "train" if train else "fwd"
    W = min(1024, L // 4)
    masks = {"none": None, "causal": lambda b, h, q, kv: q >= kv,
             "sliding window": lambda b, h, q, kv: (q >= kv) & (q - kv <= W), "softcap": None}
    for variant, mask in masks.items():
        bm = create_block_mask(mask, 1, 1, L, L, device="cuda") if mask is not None else None
        score = (lambda s, b, h, q_, kv: 30.0 * torch.tanh(s / 30.0)) if variant == "softcap" else None

        def fn(q, k, v, score=score, bm=bm):
            return flex_attention(q, k, v, score_mod=score, block_mask=bm)
        calls = {}
        te = te_compile.backend(serve="always")
        torch._dynamo.reset()
        for impl, backend in (("te_compile", te), ("te_compile, through Inductor", _through_inductor(te)),
                              ("te_compile, site kept", te_compile.backend(serve="fastest")), ("Inductor", "inductor")):
            compiled = torch.compile(fn, backend=backend, dynamic=False)  # one cache entry per backend
            if train:
                def call(compiled=compiled):
                    return torch.autograd.grad(compiled(q, k, v), (q, k, v), dout)
            else:
                def call(compiled=compiled):
                    return compiled(q, k, v)
            # "site kept": the speed decision keeps every class, so the graph is torch.compile's own (what a kept
            # site must cost: Inductor's call, within the A/A row)
            kept = tuning.forcing({c: False for c in rules.RULES}) if impl.endswith("kept") else contextlib.nullcontext()
            with torch.set_grad_enabled(train), kept:
                call()
            calls[f"compiled flex {kind} ({impl})"] = call
            if impl == "te_compile":  # the same compiled call with the native path's replays off
                calls[f"compiled flex {kind} (te_compile, no replays)"] = call
        # Inductor's call measured twice, as its own row: the measurement's noise (A/A)
        calls[f"compiled flex {kind} (Inductor, A/A)"] = calls[f"compiled flex {kind} (Inductor)"]
        counts: dict = {}
        with torch.set_grad_enabled(train):
            host = host_us(calls, iters, repeats, setup=lambda name: native.set_replay("no replays" not in name),
                           counts=counts)
            for name, call in calls.items():
                rows.append(_row(name, (B, H, L, D), variant, host[name], call, log, counts.get(name)))
        flush()
    return rows


class _Block(torch.nn.Module):
    """One decoder block of ``model_rows``' model: RMSNorm, q/k/v, causal attention (flex or SDPA), o, a SwiGLU."""

    def __init__(self, H: int, D: int, attn: str, bm):
        super().__init__()
        from torch.nn.attention.flex_attention import flex_attention
        hidden = H * D
        self.H, self.D, self.attn, self.bm, self.flex = H, D, attn, bm, flex_attention
        self.n1, self.n2 = torch.nn.RMSNorm(hidden), torch.nn.RMSNorm(hidden)
        self.qkv = torch.nn.Linear(hidden, 3 * hidden, bias=False)
        self.o = torch.nn.Linear(hidden, hidden, bias=False)
        self.up = torch.nn.Linear(hidden, 8 * hidden, bias=False)
        self.down = torch.nn.Linear(4 * hidden, hidden, bias=False)

    def forward(self, x):
        B, L, _ = x.shape
        q, k, v = self.qkv(self.n1(x)).view(B, L, 3, self.H, self.D).permute(2, 0, 3, 1, 4)
        if self.attn == "sdpa":
            a = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            a = self.flex(q, k, v, block_mask=self.bm)
        x = x + self.o(a.transpose(1, 2).reshape(B, L, -1))
        g, u = self.up(self.n2(x)).chunk(2, dim=-1)
        return x + self.down(torch.nn.functional.silu(g) * u)


def model_rows(B: int, H: int, L: int, D: int, layers: int, iters: int, repeats: int, log, rows: list,
               flush: Callable = lambda: None) -> list[dict]:
    """A whole model whose attention sites are all kept: ``layers`` decoder blocks (hidden H x D, causal attention,
    flex with a BlockMask or SDPA), a training step (forward, backward into the parameters) per call, compiled whole.
    te_compile's default with every class kept (its graphs are torch.compile's: what kept sites cost in a model, the
    wrappers around them included) against plain torch.compile, measured twice (A/A)."""
    import te_compile
    from te_compile import tuning
    from te_compile.tuning import rules
    from torch.nn.attention.flex_attention import create_block_mask

    bm = create_block_mask(lambda b, h, q, kv: q >= kv, 1, 1, L, L, device="cuda")
    g = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randn(B, L, H * D, device="cuda", dtype=torch.bfloat16, generator=g)
    for attn in ("flex", "sdpa"):
        calls = {}
        torch._dynamo.reset()
        for impl, backend in (("te_compile, every site kept", te_compile.backend(serve="fastest")),
                              ("Inductor", "inductor")):
            torch.manual_seed(0)
            model = torch.nn.Sequential(*(_Block(H, D, attn, bm) for _ in range(layers))).to("cuda", torch.bfloat16)
            params = list(model.parameters())
            compiled = torch.compile(model, backend=backend, dynamic=False)

            def call(compiled=compiled, params=params):
                return torch.autograd.grad(compiled(x).float().square().mean(), params)
            kept = tuning.forcing({c: False for c in rules.RULES}) if impl.startswith("te_compile") else \
                contextlib.nullcontext()
            with kept:
                call()
            calls[f"compiled model train ({impl})"] = call
        calls["compiled model train (Inductor, A/A)"] = calls["compiled model train (Inductor)"]
        host = host_us(calls, iters, repeats)
        for name, call in calls.items():
            row = _row(f"{name}, {layers} layers", (B, H, L, D), f"{attn} causal", host[name], call, log)
            rows.append({**row, "layers": layers})
        flush()
    return rows


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shapes", default="2,16,4096,128;1,1,256,64", help="B,H,L,D shapes, ';'-separated")
    p.add_argument("--iters", type=int, default=50, help="calls per timed loop (default 50)")
    p.add_argument("--repeats", type=int, default=15, help="alternating rounds; each call keeps the median of its rounds (default 15)")
    p.add_argument("--json", default="", help="write the rows here (with the card, host and versions)")
    p.add_argument("--model-layers", type=int, default=4,
                   help="a whole model of this many blocks (hidden H x D) per shape, its sites kept (0: none)")
    p.add_argument("--parts", default="ops,flex,model", help="which parts run per shape (comma-separated)")
    a = p.parse_args()
    unknown = set(a.parts.split(",")) - {"ops", "flex", "model"}
    if unknown:
        p.error(f"--parts: unknown {', '.join(sorted(unknown))} (the parts are ops, flex, model)")
    if not torch.cuda.is_available():
        raise SystemExit("bench/host_time.py: no CUDA GPU here (torch.cuda.is_available() is False)")
    import torch._inductor.config as ic
    ic.compile_threads = 1  # compile workers starting in the background slow the host (docs/cudnn-notes.md)
    from te_compile.cudnn import native
    print(f"native call path: {native.enable()}", flush=True)
    log = lambda s: print(s, flush=True)  # noqa: E731
    rows: list = []

    def flush(complete: bool = False) -> None:  # the JSON after every variant: a run cut short keeps its rows
        if a.json:
            save(a.json, rows, a.iters, a.repeats, complete)
    for shape in a.shapes.split(";"):
        B, H, L, D = (int(x) for x in shape.split(","))
        parts = a.parts.split(",")
        if "ops" in parts:
            op_rows(B, H, L, D, a.iters, a.repeats, log, rows)
            flush()
        if "flex" in parts:
            flex_rows(B, H, L, D, a.iters, a.repeats, log, rows, flush=flush)
            flex_rows(B, H, L, D, a.iters, a.repeats, log, rows, train=True, flush=flush)
        if "model" in parts and a.model_layers:
            model_rows(B, H, L, D, a.model_layers, a.iters, a.repeats, log, rows, flush=flush)
    flush(complete=True)
    return 0


def _cpu() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


def save(path: str, rows: list, iters: int, repeats: int, complete: bool = True) -> None:
    """The rows so far; ``complete``: False while the run goes on (a JSON left by a run cut short says so)."""
    from te_compile.cudnn import native
    from te_compile.cudnn.versions import running
    meta = {"device": torch.cuda.get_device_name(), "host": f"{_cpu()}, {os.cpu_count()} cores",
            "torch": torch.__version__, "cudnn": running(), "native": native.status(),
            "date": datetime.date.today().isoformat(), "iters": iters, "repeats": repeats,
            "command": record.command("bench/host_time.py"), "complete": complete}
    record.write(path, {**meta, "rows": rows})


if __name__ == "__main__":
    raise SystemExit(main())
