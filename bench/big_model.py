"""A model big enough to be GPU-bound at short lengths: Llama-3-8B's layer dims (hidden 4096, 32 query heads over
8 KV heads, head dim 128, SwiGLU 14336), as many layers as --layers, te_compile against plain torch.compile.

    python3 bench/big_model.py --json big-model.json                                # CUDA: 4x1024, 2x2048, 1x8192
    python3 bench/big_model.py --mode reduce-overhead --json big-model-graphs.json  # the same under CUDA graphs
    python3 bench/big_model.py --smoke                                              # CPU: tiny dims, one round

The model is bench/compile_time.py's Llama-style stack (RMSNorm, rotary, GQA attention, SwiGLU; causal SDPA with
``enable_gqa``, or flex with a causal BlockMask), bf16, random weights. Each row is one (attention, batch x length)
as a training step (forward + backward of the whole stack with a fixed upstream gradient) and as an inference
forward, for the columns torch.compile, its A/A control, te_compile (default) and ``serve="always"``, compiled apart
and measured in alternating rounds (each round starts with the next column; --rounds, at least 5 for the tables):
median ms per step between events and ms per step of a loop timed as a whole, the best of the rounds, every round
kept, and what te_compile decided for the attention sites (runs_on and reason).
"""

from __future__ import annotations

import argparse
import datetime
import functools
import os
import statistics
import sys
import time
import types

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import record  # noqa: E402
from compile_time import _llama  # noqa: E402


def _call(model, x):
    return model(x)


def _steps(fn, model, x, train: bool, mark):
    dout = None

    def step():
        nonlocal dout
        mark()
        if train:
            model.zero_grad(set_to_none=True)
            out = fn(x)
            if dout is None:
                dout = torch.randn_like(out)
            out.backward(dout)
        else:
            with torch.no_grad():
                fn(x)
    return step


def _time(step, iters: int, device: str) -> tuple[float, float]:
    """(median ms per step between events, ms per step of a loop of ``iters`` steps timed as a whole)."""
    for _ in range(3):
        step()
    if device == "cuda":
        torch.cuda.synchronize()
        ev = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(iters)]
        for a, b in ev:
            a.record()
            step()
            b.record()
        torch.cuda.synchronize()
        per_step = statistics.median(a.elapsed_time(b) for a, b in ev)
        t0 = time.perf_counter()
        for _ in range(iters):
            step()
        torch.cuda.synchronize()
        return per_step, (time.perf_counter() - t0) * 1e3 / iters
    ts = []
    for _ in range(iters):
        t0 = time.perf_counter()
        step()
        ts.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(ts), sum(ts) / len(ts)


def bench(attn: str, B: int, L: int, layers: int, hidden: int, D: int, ffn: int, device: str, iters: int,
          rounds: int, mode) -> dict:
    import te_compile
    from te_compile.report import Report, record_reports
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    model, (x,) = _llama((B, 0, L, D), layers, hidden, attn, device, dtype, ffn)
    m = {"mode": mode} if mode else {}

    def compiled(backend="inductor"):
        # a code object of its own per column: Dynamo keeps compiled entries per code object, so columns compiling
        # the model's own forward would share one entry list (and its recompile limit)
        fn = types.FunctionType(_call.__code__.replace(), _call.__globals__, "_call")
        return functools.partial(torch.compile(fn, backend=backend, **m), model)
    cols = {"torch.compile": compiled(), "control": compiled(), "te_compile": compiled(te_compile.backend(serve="fastest"))}
    if device == "cuda":
        cols["always"] = compiled(te_compile.backend(serve="always"))
    else:  # on the CPU: every site rewritten to the reference kernel
        cols["reference"] = compiled(te_compile.backend(target="reference"))
    mark = torch.compiler.cudagraph_mark_step_begin if mode else (lambda: None)
    row: dict = {"attn": attn, "batch": B, "seq": L, "layers": layers, "hidden": hidden, "head_dim": D, "ffn": ffn,
                 "mode": mode or "default"}
    for what in ("train", "infer"):
        train = what == "train"
        model.requires_grad_(train)
        x.requires_grad_(False)
        steps = {}
        for name, f in cols.items():
            t0 = time.perf_counter()
            with record_reports() as reports:
                steps[name] = _steps(f, model, x, train, mark)
                steps[name]()  # compile
            if device == "cuda":
                torch.cuda.synchronize()
            row[f"{what}_compile_s_{name}"] = time.perf_counter() - t0
            if name in ("te_compile", "always", "reference"):
                row[f"{what}_sites_{name}"] = sorted({(d.runs_on, str(d.reason or d.note)[:300])
                                                      for d in Report(list(reports)).decisions})
        runs: dict = {n: [] for n in steps}
        order = list(steps)
        for r in range(rounds):
            for name in order[r % len(order):] + order[:r % len(order)]:
                runs[name].append(_time(steps[name], iters, device))
            print(f"  {attn} {B}x{L} {what} round {r + 1}: "
                  + ", ".join(f"{n} {min(t[1] for t in ts):.2f} ms" for n, ts in runs.items()), flush=True)
        best = {n: {"ms": min(t[0] for t in ts), "loop_ms": min(t[1] for t in ts),
                    "rounds_ms": [round(t[0], 4) for t in ts], "rounds_loop_ms": [round(t[1], 4) for t in ts]}
                for n, ts in runs.items()}
        row[what] = best
        tc = best["torch.compile"]["loop_ms"]
        row[what + "_ratio"] = tc / best["te_compile"]["loop_ms"]  # > 1: te_compile faster
        row[what + "_aa"] = tc / best["control"]["loop_ms"]
        for extra in ("always", "reference"):
            if extra in best:
                row[f"{what}_{extra}_ratio"] = tc / best[extra]["loop_ms"]
    torch._dynamo.reset()
    return row


def save(path: str, head: dict, rows: list) -> None:
    record.write(path, {**head, "rows": rows})


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--shapes", default="4x1024,2x2048,1x8192", help="batch x length, comma-separated")
    p.add_argument("--attn", default="sdpa,flex")
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--hidden", type=int, default=4096)
    p.add_argument("--head-dim", type=int, default=128)
    p.add_argument("--ffn", type=int, default=14336)
    p.add_argument("--iters", type=int, default=10)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--mode", default="", help="torch.compile mode for every column (reduce-overhead: CUDA graphs)")
    p.add_argument("--smoke", action="store_true", help="CPU, tiny dims, one round: checks the script")
    p.add_argument("--json", default="")
    a = p.parse_args()
    device = "cpu" if a.smoke or not torch.cuda.is_available() else "cuda"
    if a.smoke:
        a.shapes, a.attn, a.layers, a.hidden, a.head_dim, a.ffn = "1x64", "sdpa", 2, 64, 16, 128
        a.iters, a.rounds = 2, 1
    mode = a.mode or None
    head = {"device": torch.cuda.get_device_name() if device == "cuda" else "cpu", "torch": torch.__version__,
            "date": datetime.date.today().isoformat(), "command": record.command("bench/big_model.py")}
    try:
        from te_compile.cudnn.versions import running
        head["cudnn"] = running()
    except Exception:  # noqa: BLE001 - no cuDNN frontend: no version to record
        head["cudnn"] = None
    rows: list = []
    for shape in a.shapes.split(","):
        B, L = (int(x) for x in shape.split("x"))
        for attn in a.attn.split(","):
            try:
                row = bench(attn, B, L, a.layers, a.hidden, a.head_dim, a.ffn, device, a.iters, a.rounds, mode)
            except Exception as e:  # noqa: BLE001 - report the row, go on
                row = {"attn": attn, "batch": B, "seq": L, "error": f"{type(e).__name__}: {e}"[:400]}
                print(f"{attn} {B}x{L}: error {row['error']}", flush=True)
                torch._dynamo.reset()
            else:
                extra = "always" if "always" in row["train"] else "reference"
                print(f"{attn:5s} {B}x{L} {row['mode']}: " + "; ".join(
                    f"{w} torch.compile {row[w]['torch.compile']['loop_ms']:.2f} ms te_compile "
                    f"{row[w]['te_compile']['loop_ms']:.2f} ms ({row[w + '_ratio']:.2f}x, A/A {row[w + '_aa']:.2f}x, "
                    f"{extra} {row[f'{w}_{extra}_ratio']:.2f}x)" for w in ("train", "infer"))
                    + f"; te_compile sites {row['train_sites_te_compile']}", flush=True)
            rows.append(row)
            save(a.json, head, rows)
    save(a.json, head, rows)
    return 0 if not any("error" in r for r in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
