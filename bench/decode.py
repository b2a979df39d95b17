"""Decoding: attention with a few query tokens against a long KV cache, te_compile against plain torch.compile, and
Hugging Face ``generate`` with a static cache (tokens per second).

    python3 bench/decode.py --json decode.json                   # CUDA: the grid below, then generate
    python3 bench/decode.py --mode reduce-overhead --json decode-graphs.json
    python3 bench/decode.py --variants "" --json generate.json   # generate only
    python3 bench/decode.py --smoke                              # CPU: a tiny grid, one round (checks the script)

Each row is one attention call as generation makes it: query lengths 1, 4, 16 (--q-lens) against a KV cache of
1k, 8k, 32k keys (--kv-lens), GQA 32 query heads over 8 KV heads, head dim 128, bf16, forward only. Variants:
SDPA with no mask (the whole cache valid: the one-token step Hugging Face runs with SDPA's ``enable_gqa``), SDPA
with a bottom-right causal bool mask ``[B, 1, Lq, S]`` (Hugging Face's static-cache mask: query i sees the keys up
to its own position S - Lq + i; the KV heads repeated, as Hugging Face does with a mask), flex with no mask and flex with that bottom-right causal BlockMask (flex's
decoding kernel serves Lq < 128; the mask_mod reads the cache offset from a tensor, as decoding loops do). Columns: torch.compile, its A/A control, te_compile (default) and
``serve="always"``, each compiled apart (``dynamic=False``), measured in alternating rounds (each round starts
with the next column); the row keeps every column's median ms per call between events, the loop's ms per call (a
loop of calls timed as a whole: what a generation loop sees on a host-bound step) and what te_compile decided
(runs_on and reason per site). On the CPU the te_compile columns are the default (CPU sites are kept) and
``target="reference"``.

``generate``: a small Llama with a random config (--gen-layers layers, hidden 1024, 16 heads over 4 KV heads, head
dim 64), greedy, ``cache_implementation="static"``, ``model.forward`` compiled per column (generate's own
compile turned off so that the compiled forward is what runs), --gen-tokens new tokens after a prompt of
--gen-prompt, tokens per second over alternating rounds; where ``transformers`` imports.
"""

from __future__ import annotations

import argparse
import datetime
import os
import statistics
import sys
import time
import types

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import record  # noqa: E402

VARIANTS = ("sdpa", "sdpa causal", "flex", "flex causal")


def _fresh(fn):
    """``fn`` with a code object of its own: each column compiles its own entry (no shared cache, no recompiles)."""
    return types.FunctionType(fn.__code__.replace(), fn.__globals__, fn.__name__, fn.__defaults__, fn.__closure__)


def _variant(name: str, B: int, Hq: int, Hkv: int, Lq: int, S: int, D: int, device: str, dtype):
    """(function, args) of one decoding call."""
    q = torch.randn(B, Hq, Lq, D, device=device, dtype=dtype)
    k, v = (torch.randn(B, Hkv, S, D, device=device, dtype=dtype) for _ in range(2))
    off = S - Lq
    if name == "sdpa":
        def fn(q, k, v):
            return F.scaled_dot_product_attention(q, k, v, enable_gqa=True)
        return fn, [q, k, v]
    if name == "sdpa causal":
        pos = torch.arange(Lq, device=device)[:, None] + off
        mask = (torch.arange(S, device=device)[None, :] <= pos)[None, None].expand(B, 1, Lq, S)

        def fn(q, k, v, mask):  # with a mask Hugging Face repeats the KV heads (repeat_kv) instead of enable_gqa
            n = q.shape[1] // k.shape[1]
            k = k[:, :, None].expand(B, Hkv, n, S, D).reshape(B, Hq, S, D)
            v = v[:, :, None].expand(B, Hkv, n, S, D).reshape(B, Hq, S, D)
            return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        return fn, [q, k, v, mask]
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention
    if name == "flex":
        def fn(q, k, v):
            return flex_attention(q, k, v, enable_gqa=True)
        return fn, [q, k, v]

    offset = torch.tensor(off, device=device)  # a tensor, as decoding loops pass the cache position

    def bottom_right(b, h, q_idx, kv_idx):
        return kv_idx <= q_idx + offset
    bm = create_block_mask(bottom_right, None, None, Lq, S, device=device)

    def fn(q, k, v):
        return flex_attention(q, k, v, block_mask=bm, enable_gqa=True)
    return fn, [q, k, v]


def _sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def _time(fn, args, iters: int, device: str, mark) -> tuple[float, float]:
    """(median ms per call between events, ms per call of a loop of ``iters`` calls timed as a whole); on the CPU
    both from the wall clock."""
    for _ in range(5):
        mark()
        fn(*args)
    _sync(device)
    if device == "cuda":
        ev = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(iters)]
        for a, b in ev:
            mark()
            a.record()
            fn(*args)
            b.record()
        torch.cuda.synchronize()
        per_call = statistics.median(a.elapsed_time(b) for a, b in ev)
    else:
        ts = []
        for _ in range(iters):
            t0 = time.perf_counter()
            fn(*args)
            ts.append((time.perf_counter() - t0) * 1e3)
        per_call = statistics.median(ts)
    t0 = time.perf_counter()
    for _ in range(iters):
        mark()
        fn(*args)
    _sync(device)
    return per_call, (time.perf_counter() - t0) * 1e3 / iters


def _backends(device: str) -> dict:
    import te_compile
    cols = {"torch.compile": "inductor", "control": "inductor", "te_compile": te_compile.backend(serve="fastest")}
    if device == "cuda":
        cols["always"] = te_compile.backend(serve="always")
    else:
        cols["reference"] = te_compile.backend(target="reference")
    return cols


def bench_case(name: str, B: int, Hq: int, Hkv: int, Lq: int, S: int, D: int, device: str, iters: int, rounds: int,
               mode) -> dict:
    from te_compile.report import Report, record_reports
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    fn, args = _variant(name, B, Hq, Hkv, Lq, S, D, device, dtype)
    mark = torch.compiler.cudagraph_mark_step_begin if mode else (lambda: None)
    row: dict = {"case": name, "shape": [B, Hq, Lq, S, D, Hkv], "mode": mode or "default"}
    cols = {}
    with torch.no_grad():
        ref = fn(*args)
        for col, be in _backends(device).items():
            compiled = torch.compile(_fresh(fn), backend=be, dynamic=False, **({"mode": mode} if mode else {}))
            with record_reports() as reports:
                mark()
                out = compiled(*args)
            err = (out.float() - ref.float()).abs().max().item()
            if col.startswith("te_compile") or col in ("always", "reference"):
                row[col + "_sites"] = [[d.runs_on, str(d.reason or d.note)[:400]] for d in Report(list(reports)).decisions]
            row[col + "_max_abs_err_vs_eager"] = err
            cols[col] = compiled
        order = list(cols)
        runs: dict = {c: [] for c in order}
        for r in range(rounds):
            for col in order[r % len(order):] + order[:r % len(order)]:
                runs[col].append(_time(cols[col], args, iters, device, mark))
    for col, ts in runs.items():
        row[col] = {"ms": min(t[0] for t in ts), "loop_ms": min(t[1] for t in ts),
                    "rounds_ms": [round(t[0], 5) for t in ts], "rounds_loop_ms": [round(t[1], 5) for t in ts]}
    tc = row["torch.compile"]["loop_ms"]
    row["ratio"] = tc / row["te_compile"]["loop_ms"]  # > 1: te_compile faster (loop throughput)
    row["aa"] = tc / row["control"]["loop_ms"]
    for extra in ("always", "reference"):
        if extra in row:
            row[extra + "_ratio"] = tc / row[extra]["loop_ms"]
    torch._dynamo.reset()
    return row


def bench_generate(layers: int, prompt: int, new: int, rounds: int, mode, impl: str = "sdpa") -> dict:
    """Greedy generate with a static cache, tokens per second per column; every column's tokens must be eager's."""
    import transformers
    import te_compile
    from te_compile.report import Report, record_reports
    cfg = transformers.LlamaConfig(vocab_size=32000, hidden_size=1024, intermediate_size=2816, num_hidden_layers=layers,
                                   num_attention_heads=16, num_key_value_heads=4, head_dim=64,
                                   max_position_embeddings=max(4096, prompt + new))
    cfg._attn_implementation = impl
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(cfg).cuda().to(torch.bfloat16).eval()
    model.generation_config.disable_compile = True  # the forward compiled below is what runs each step
    ids = torch.randint(0, 32000, (1, prompt), device="cuda")
    kw = dict(max_new_tokens=new, min_new_tokens=new, do_sample=False, cache_implementation="static")
    eager_forward = model.forward
    ref = model.generate(ids, **kw)
    m = {"mode": mode} if mode else {}
    forwards = {"eager": eager_forward,
                "torch.compile": torch.compile(eager_forward, **m),
                "control": torch.compile(_fresh_method(model), **m),
                "te_compile": torch.compile(_fresh_method(model), backend=te_compile.backend(serve="fastest"), **m),
                "always": torch.compile(_fresh_method(model), backend=te_compile.backend(serve="always"), **m)}
    row: dict = {"case": f"generate {impl}", "layers": layers, "prompt": prompt, "new_tokens": new,
                 "mode": mode or "default"}
    for col, f in forwards.items():  # compile (prefill and decode shapes) and check the tokens
        model.forward = f
        with record_reports() as reports:
            out = model.generate(ids, **kw)
        row[col + "_agree"] = (out[:, prompt:] == ref[:, prompt:]).float().mean().item()
        if col in ("te_compile", "always"):
            row[col + "_sites"] = sorted({(d.runs_on, str(d.reason or d.note)[:300])
                                          for g in reports for d in g.decisions})
    tps: dict = {c: [] for c in forwards}
    order = list(forwards)
    for r in range(rounds):
        for col in order[r % len(order):] + order[:r % len(order)]:
            model.forward = forwards[col]
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            model.generate(ids, **kw)
            torch.cuda.synchronize()
            tps[col].append(new / (time.perf_counter() - t0))
    model.forward = eager_forward
    for col, xs in tps.items():
        row[col] = {"tokens_per_s": max(xs), "rounds": [round(x, 1) for x in xs]}
    row["ratio"] = row["te_compile"]["tokens_per_s"] / row["torch.compile"]["tokens_per_s"]
    row["aa"] = row["control"]["tokens_per_s"] / row["torch.compile"]["tokens_per_s"]
    row["always_ratio"] = row["always"]["tokens_per_s"] / row["torch.compile"]["tokens_per_s"]
    torch._dynamo.reset()
    return row


def _fresh_method(model):
    """``model.forward`` as a bound method with a code object of its own (each column compiles its own entry)."""
    return types.MethodType(_fresh(type(model).forward), model)


def save(path: str, head: dict, rows: list) -> None:
    record.write(path, {**head, "rows": rows})


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--q-lens", default="1,4,16")
    p.add_argument("--kv-lens", default="1024,8192,32768")
    p.add_argument("--variants", default=",".join(VARIANTS))
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--heads", default="32,8", help="query heads, KV heads")
    p.add_argument("--head-dim", type=int, default=128)
    p.add_argument("--iters", type=int, default=50)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--mode", default="", help="torch.compile mode for every column (reduce-overhead: CUDA graphs)")
    p.add_argument("--no-generate", action="store_true")
    p.add_argument("--gen-layers", type=int, default=4)
    p.add_argument("--gen-prompt", type=int, default=128)
    p.add_argument("--gen-tokens", type=int, default=128)
    p.add_argument("--smoke", action="store_true", help="CPU, a tiny grid, one round: checks the script")
    p.add_argument("--json", default="")
    a = p.parse_args()
    device = "cpu" if a.smoke or not torch.cuda.is_available() else "cuda"
    Hq, Hkv = (int(x) for x in a.heads.split(","))
    D = a.head_dim
    if a.smoke:
        a.q_lens, a.kv_lens, Hq, Hkv, D = "1,4", "256", 4, 2, 16
        a.iters, a.rounds = 5, 1
    mode = a.mode or None
    head = {"device": torch.cuda.get_device_name() if device == "cuda" else "cpu", "torch": torch.__version__,
            "date": datetime.date.today().isoformat(), "command": record.command("bench/decode.py")}
    try:
        from te_compile.cudnn.versions import running
        head["cudnn"] = running()
    except Exception:  # noqa: BLE001 - no cuDNN frontend: no version to record
        head["cudnn"] = None
    rows: list = []
    for S in (int(x) for x in a.kv_lens.split(",")):
        for Lq in (int(x) for x in a.q_lens.split(",")):
            for name in [v for v in a.variants.split(",") if v]:  # --variants "": generate only
                try:
                    row = bench_case(name, a.batch, Hq, Hkv, Lq, S, D, device, a.iters, a.rounds, mode)
                except Exception as e:  # noqa: BLE001 - report the row, go on
                    row = {"case": name, "shape": [a.batch, Hq, Lq, S, D, Hkv], "error": f"{type(e).__name__}: {e}"[:400]}
                    print(f"{name:12s} Lq {Lq:3d} S {S:6d}: error {row['error']}", flush=True)
                    torch._dynamo.reset()
                else:
                    te_runs = "; ".join(f"{r} ({why[:90]})" if why else r for r, why in row["te_compile_sites"])
                    extra = "".join(f" {c} {row[c + '_ratio']:.2f}x" for c in ("always", "reference") if c in row)
                    print(f"{name:12s} Lq {Lq:3d} S {S:6d}: torch.compile {row['torch.compile']['loop_ms']:.4f} ms, "
                          f"te_compile {row['te_compile']['loop_ms']:.4f} ms ({row['ratio']:.2f}x, A/A {row['aa']:.2f}x)"
                          f"{extra}; te_compile: {te_runs}", flush=True)
                rows.append(row)
                save(a.json, head, rows)
    if not a.no_generate and device == "cuda":
        try:
            import transformers  # noqa: F401
        except ImportError:
            print("generate: transformers does not import; left out", flush=True)
        else:
            for impl in ("sdpa", "flex_attention"):
                try:
                    row = bench_generate(a.gen_layers, a.gen_prompt, a.gen_tokens, a.rounds, mode, impl)
                except Exception as e:  # noqa: BLE001 - report the row, go on
                    row = {"case": f"generate {impl}", "error": f"{type(e).__name__}: {e}"[:400]}
                    print(f"generate {impl}: error {row['error']}", flush=True)
                else:
                    print(f"generate {impl}: " + ", ".join(f"{c} {row[c]['tokens_per_s']:.0f} tok/s (agree "
                                                        f"{row[c + '_agree']:.2f})" for c in ("eager", "torch.compile",
                                                        "control", "te_compile", "always"))
                          + f"; te_compile {row['ratio']:.2f}x, A/A {row['aa']:.2f}x; sites {row['te_compile_sites']}",
                          flush=True)
                rows.append(row)
                save(a.json, head, rows)
    save(a.json, head, rows)
    return 0 if not any("error" in r for r in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
