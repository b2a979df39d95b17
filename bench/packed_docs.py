"""Pretraining on packed documents: a Llama-style training step with a new document mask every step, te_compile
against plain torch.compile, both paying their mask building.

    python3 bench/packed_docs.py --json packed-docs.json      # CUDA: Llama-3-8B layer dims, 2x4096, 1x8192, 1x32768
    python3 bench/packed_docs.py --smoke                      # CPU: tiny dims, one round: checks the script

Each step does what a pretraining loop does: the loader's next packing (document ids per row, lengths drawn per step,
held in pinned memory) is copied into the ids buffer the mask_mod reads, ``create_block_mask`` builds the step's
BlockMask (documents + causal), and the model (RMSNorm, rotary, GQA flex attention, SwiGLU; bf16, random weights)
runs forward and backward with a fixed upstream gradient. The mask_mod is one function reading that buffer, so no
column recompiles per step (each column's graph count is recorded); te_compile builds its interval plan once per step
(the buffer's version changes), inside the step. Columns: torch.compile, its A/A control, te_compile (default) and
``serve="always"``, compiled apart, timed in alternating rounds (each round starts with the next column): ms per step
of a loop timed as a whole and the median between events, the best round, every round kept. Before timing, each
te_compile column's output and gradients for one packing are compared with torch.compile's (and, in the smoke run,
eager's); a column that differs is reported wrong and not timed.
"""

from __future__ import annotations

import argparse
import datetime
import functools
import json
import os
import sys
import time
import types

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from big_model import _time  # noqa: E402


def packings(B: int, L: int, mean_doc: int, n: int, seed: int = 0) -> list[torch.Tensor]:
    """``n`` [B, L] int32 document-id tensors: per row, documents of lengths drawn from an exponential of mean
    ``mean_doc`` (at least 1 token), the last one cut at L; ids count up from 0 in every row."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n):
        rows = []
        for _ in range(B):
            lengths, total = [], 0
            while total < L:
                n_tok = max(1, int(torch.empty(()).exponential_(1.0 / mean_doc, generator=g)))
                lengths.append(min(n_tok, L - total))
                total += lengths[-1]
            rows.append(torch.repeat_interleave(torch.arange(len(lengths), dtype=torch.int32), torch.tensor(lengths)))
        out.append(torch.stack(rows))
    return out


def make_model(B: int, L: int, layers: int, hidden: int, D: int, ffn: int, device: str, dtype):
    """The stack and the ids buffer its mask_mod reads: (model, ids, mask_mod)."""
    import torch.nn as nn
    import torch.nn.functional as F
    from torch.nn.attention.flex_attention import flex_attention

    H = hidden // D
    Hkv = max(1, H // 4)
    ids = torch.zeros(B, L, dtype=torch.int32, device=device)

    def mask_mod(b, h, q, kv):
        return (ids[b, q] == ids[b, kv]) & (q >= kv)

    def rotary(x, cos, sin):
        x1, x2 = x.chunk(2, dim=-1)
        return x * cos + torch.cat((-x2, x1), dim=-1) * sin

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.n1, self.n2 = nn.RMSNorm(hidden), nn.RMSNorm(hidden)
            self.q = nn.Linear(hidden, H * D, bias=False)
            self.kv = nn.Linear(hidden, 2 * Hkv * D, bias=False)
            self.o = nn.Linear(H * D, hidden, bias=False)
            self.up = nn.Linear(hidden, 2 * ffn, bias=False)
            self.down = nn.Linear(ffn, hidden, bias=False)

        def forward(self, x, cos, sin, block_mask):
            h = self.n1(x)
            q = self.q(h).view(B, L, H, D).transpose(1, 2)
            k, v = self.kv(h).view(B, L, 2, Hkv, D).permute(2, 0, 3, 1, 4)
            q, k = rotary(q, cos, sin), rotary(k, cos, sin)
            a = flex_attention(q, k, v, block_mask=block_mask, enable_gqa=True)
            x = x + self.o(a.transpose(1, 2).reshape(B, L, H * D))
            g, u = self.up(self.n2(x)).chunk(2, dim=-1)
            return x + self.down(F.silu(g) * u)

    class Model(nn.Module):
        def __init__(self):
            super().__init__()
            self.blocks = nn.ModuleList(Block() for _ in range(layers))
            t = torch.arange(L, dtype=torch.float32)[:, None] / (10000 ** (torch.arange(D // 2) / (D // 2)))
            self.register_buffer("cos", torch.cat((t, t), -1).cos().to(dtype), persistent=False)
            self.register_buffer("sin", torch.cat((t, t), -1).sin().to(dtype), persistent=False)

        def forward(self, x, block_mask):
            for blk in self.blocks:
                x = blk(x, self.cos, self.sin, block_mask)
            return x

    torch.manual_seed(0)
    return Model().to(device=device, dtype=dtype), ids, mask_mod


def _call(model, x, block_mask):
    return model(x, block_mask)


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.float() - b.float()).abs().max() / b.float().abs().max().clamp(min=1e-6))


def bench(B: int, L: int, layers: int, hidden: int, D: int, ffn: int, mean_doc: int, device: str, iters: int,
          rounds: int, eager_check: bool) -> dict:
    import te_compile
    from te_compile.report import Report, record_reports
    from torch.nn.attention.flex_attention import create_block_mask

    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    model, ids, mask_mod = make_model(B, L, layers, hidden, D, ffn, device, dtype)
    pool = [p.pin_memory() if device == "cuda" else p for p in packings(B, L, mean_doc, 8)]
    x = torch.randn(B, L, hidden, device=device, dtype=dtype)
    dout = torch.randn_like(x)
    state = {"i": 0}

    def load():  # the loader's next packing and its BlockMask: what each step pays before the model runs
        ids.copy_(pool[state["i"] % len(pool)], non_blocking=True)
        state["i"] += 1
        return create_block_mask(mask_mod, B, None, L, L, device=device)

    def compiled(backend="inductor"):
        fn = types.FunctionType(_call.__code__.replace(), _call.__globals__, "_call")  # a code object per column
        return functools.partial(torch.compile(fn, backend=backend), model)
    if device == "cuda":
        cols = {"torch.compile": compiled(), "control": compiled(),
                "te_compile": compiled(te_compile.backend(serve="fastest")),
                "always": compiled(te_compile.backend(serve="always"))}
    else:  # the smoke run: Inductor's CPU flex is not what is measured; every site on the reference target
        cols = {"torch.compile": compiled("aot_eager"), "control": compiled("aot_eager"),
                "te_compile": compiled(te_compile.backend(serve="fastest", inner="aot_eager")),
                "reference": compiled(te_compile.backend(target="reference", inner="aot_eager"))}
    row: dict = {"batch": B, "seq": L, "layers": layers, "hidden": hidden, "head_dim": D, "ffn": ffn,
                 "mean_doc": mean_doc, "docs_per_row": round(sum(int(p[:, -1].float().mean()) + 1 for p in pool)
                                                             / len(pool), 1)}

    def run(f, grads: bool):
        model.zero_grad(set_to_none=True)
        out = f(x, load())
        out.backward(dout)
        return (out.detach(), model.blocks[0].q.weight.grad.detach().clone()) if grads else None

    # numbers first: every column on the same packing (state rewound), against torch.compile (and eager)
    ref = None
    wrong = {}
    for name, f in [("torch.compile", cols["torch.compile"])] + [(n, c) for n, c in cols.items()
                                                                    if n != "torch.compile"]:
        t0 = time.perf_counter()
        with record_reports() as reports:
            state["i"] = 0
            got = run(f, True)
        row[f"compile_s_{name}"] = round(time.perf_counter() - t0, 2)
        if name not in ("torch.compile", "control"):
            row[f"sites_{name}"] = sorted({(d.runs_on, str(d.reason or d.note)[:300])
                                           for d in Report(list(reports)).decisions})
        if ref is None:
            ref = got
            if eager_check:
                state["i"] = 0
                eager = run(lambda xx, bm: model(xx, bm), True)
                row["eager_err"] = [_rel(a, b) for a, b in zip(ref, eager)]
            continue
        err = [_rel(a, b) for a, b in zip(got, ref)]
        row[f"err_{name}"] = err
        if max(err) > (3e-2 if dtype == torch.bfloat16 else 1e-3):
            wrong[name] = err
    row["wrong"] = wrong
    steps = {n: functools.partial(run, f, False) for n, f in cols.items() if n not in wrong}
    graphs0 = torch._dynamo.utils.counters["stats"]["unique_graphs"]
    runs: dict = {n: [] for n in steps}
    order = list(steps)
    for r in range(rounds):
        for name in order[r % len(order):] + order[:r % len(order)]:
            runs[name].append(_time(steps[name], iters, device))
        print(f"  {B}x{L} round {r + 1}: " + ", ".join(f"{n} {min(t[1] for t in ts):.2f} ms"
                                                      for n, ts in runs.items()), flush=True)
    row["graphs_compiled_while_timed"] = torch._dynamo.utils.counters["stats"]["unique_graphs"] - graphs0
    best = {n: {"ms": min(t[0] for t in ts), "loop_ms": min(t[1] for t in ts),
                "rounds_ms": [round(t[0], 4) for t in ts], "rounds_loop_ms": [round(t[1], 4) for t in ts]}
            for n, ts in runs.items()}
    row["train"] = best
    tc = best["torch.compile"]["loop_ms"]
    for name in best:
        if name != "torch.compile":
            row[f"ratio_{name}"] = tc / best[name]["loop_ms"]  # > 1: faster than torch.compile
    torch._dynamo.reset()
    return row


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--shapes", default="2x4096,1x8192,1x32768", help="batch x length, comma-separated")
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--hidden", type=int, default=4096)
    p.add_argument("--head-dim", type=int, default=128)
    p.add_argument("--ffn", type=int, default=14336)
    p.add_argument("--mean-doc", type=int, default=1024, help="mean document length in tokens")
    p.add_argument("--iters", type=int, default=10)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--smoke", action="store_true", help="CPU, tiny dims, one round: checks the script")
    p.add_argument("--json", default="")
    a = p.parse_args(argv)
    device = "cpu" if a.smoke or not torch.cuda.is_available() else "cuda"
    if a.smoke:
        a.shapes, a.layers, a.hidden, a.head_dim, a.ffn, a.mean_doc, a.iters, a.rounds = \
            "2x128", 2, 64, 16, 128, 24, 2, 1
    head = {"device": torch.cuda.get_device_name() if device == "cuda" else "cpu", "torch": torch.__version__,
            "date": datetime.date.today().isoformat(),
            "command": " ".join(["bench/packed_docs.py"] + [x for x in (argv if argv is not None else sys.argv[1:])
                                                            if not x.endswith(".json") and x != "--json"])}
    try:
        from te_compile.cudnn.versions import running
        head["cudnn"] = running()
    except Exception:  # noqa: BLE001 - no cuDNN frontend: no version to record
        head["cudnn"] = None
    rows = []
    ctx = _cpu_flex_with_grad() if device == "cpu" else _null()
    with ctx:
        for shape in a.shapes.split(","):
            B, L = (int(v) for v in shape.split("x"))
            try:
                row = bench(B, L, a.layers, a.hidden, a.head_dim, a.ffn, a.mean_doc, device, a.iters, a.rounds,
                            eager_check=device == "cpu")
            except Exception as e:  # noqa: BLE001 - report the row, go on
                row = {"batch": B, "seq": L, "error": f"{type(e).__name__}: {e}"[:400]}
                torch._dynamo.reset()
            rows.append(row)
            print(json.dumps({k: v for k, v in row.items() if not k.startswith("sites_")})[:600], flush=True)
            if a.json:
                with open(a.json + ".tmp", "w") as f:
                    json.dump({**head, "rows": rows}, f, indent=1)
                os.replace(a.json + ".tmp", a.json)
    return 0 if all("error" not in r and not r.get("wrong") for r in rows) else 1


class _null:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def _cpu_flex_with_grad():
    from convergence import _cpu_flex_with_grad as lift
    return lift(True)


if __name__ == "__main__":
    sys.exit(main())
