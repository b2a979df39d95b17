"""Compile time: te_compile (default and serve="always") against plain torch.compile, each compile in a fresh process
with cold caches, per attention site and per whole model.

    python3 bench/compile_time.py --json compile-time.json    # CUDA: the sites and models below
    python3 bench/compile_time.py --cases sdpa,flex --shapes 1,8,512,64 --rounds 5
    python3 bench/compile_time.py --smoke                     # CPU: tiny shapes, one round (checks the script)

Every measurement is one child process (this script with ``--child``) with an empty Inductor cache
(``TORCHINDUCTOR_CACHE_DIR``), Triton cache and te_compile cache (``TE_COMPILE_CACHE_DIR``); the columns run in
rotated order round by round. A child builds its case, then times ``torch.compile(...)`` and the first call
(Dynamo, te_compile's passes, Inductor's forward, the first run) and, for training, the first backward (Inductor's lazily compiled backward),
and reads where te_compile's time went (te_compile.counters: the rewrite passes with the support check, its
cuDNN plan builds and the speed decision; the inner compile; the native call path) and the cuDNN plans the first
call built (te_compile.cudnn.graphs.cache). te_compile's native call path (a C++ extension, built once per machine)
is built by a first child into a directory the measured children share, and its build time is reported apart.

Cases: ``sdpa`` and ``flex`` (one attention call: causal SDPA; flex softcap with a causal BlockMask), ``llama`` and
``llama-flex`` (a Llama-style stack of --layers blocks, hidden --hidden, GQA 4:1, SDPA or flex causal), ``hf-llama``
(Hugging Face Llama with a random config and the same dims, where ``transformers`` imports). On the CPU the
te_compile columns are the default (CPU sites are kept) and ``target="reference"`` (every site rewritten to the
reference kernel), and flex runs forward only (Inductor has no CPU flex backward).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import record  # noqa: E402

CASES = ("sdpa", "flex", "llama", "llama-flex", "hf-llama")
GPU_COLUMNS = ("torch.compile", "te_compile", "always")
CPU_COLUMNS = ("torch.compile", "te_compile", "reference")


# --------------------------------------------------------------------------- the child: one compile, timed

def _softcap(score, b, h, q_idx, kv_idx):
    import torch
    return 30.0 * torch.tanh(score / 30.0)


def _causal(b, h, q_idx, kv_idx):
    return q_idx >= kv_idx


def _site(case: str, shape: tuple, device: str, train: bool, dtype):
    """(callable, inputs) of one attention call."""
    import torch
    import torch.nn.functional as F
    B, H, L, D = shape
    q, k, v = (torch.randn(B, H, L, D, device=device, dtype=dtype, requires_grad=train) for _ in range(3))
    if case == "sdpa":
        def fn(q, k, v):
            return F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return fn, (q, k, v)
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention
    bm = create_block_mask(_causal, None, None, L, L, device=device)

    def fn(q, k, v):
        return flex_attention(q, k, v, score_mod=_softcap, block_mask=bm)
    return fn, (q, k, v)


def _llama(shape: tuple, layers: int, hidden: int, attn: str, device: str, dtype, ffn: int = 0):
    """A Llama-style decoder stack (RMSNorm, rotary, GQA attention with hidden // D query heads over a quarter as
    many KV heads, SwiGLU of width ``ffn``, default 4 * hidden), causal; (model, (x,))."""
    import torch
    import torch.nn as nn
    import torch.nn.functional as F
    B, _, L, D = shape
    H = hidden // D
    Hkv = max(1, H // 4)
    ffn = ffn or 4 * hidden
    block_mask = None
    if attn == "flex":
        from torch.nn.attention.flex_attention import create_block_mask, flex_attention
        block_mask = create_block_mask(_causal, None, None, L, L, device=device)

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

        def forward(self, x, cos, sin):
            h = self.n1(x)
            q = self.q(h).view(B, L, H, D).transpose(1, 2)
            k, v = self.kv(h).view(B, L, 2, Hkv, D).permute(2, 0, 3, 1, 4)
            q, k = rotary(q, cos, sin), rotary(k, cos, sin)
            if attn == "flex":
                a = flex_attention(q, k, v, block_mask=block_mask, enable_gqa=True)
            else:
                a = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
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

        def forward(self, x):
            for blk in self.blocks:
                x = blk(x, self.cos, self.sin)
            return x

    torch.manual_seed(0)
    model = Model().to(device=device, dtype=dtype)
    return model, (torch.randn(B, L, hidden, device=device, dtype=dtype),)


def _hf_llama(shape: tuple, layers: int, hidden: int, device: str, dtype):
    import torch
    import transformers
    B, _, L, D = shape
    H = hidden // D
    cfg = transformers.LlamaConfig(vocab_size=32000, hidden_size=hidden, intermediate_size=int(hidden * 2.75),
                                   num_hidden_layers=layers, num_attention_heads=H, num_key_value_heads=max(1, H // 4),
                                   head_dim=D, max_position_embeddings=max(4096, L))
    cfg._attn_implementation = "sdpa"
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(cfg).to(device=device, dtype=dtype)
    ids = torch.randint(0, 32000, (B, L), device=device)

    class Logits(torch.nn.Module):  # the loss-free forward: what the step differentiates is the logits' sum
        def __init__(self):
            super().__init__()
            self.m = model

        def forward(self, ids):
            return self.m(input_ids=ids).logits
    return Logits(), (ids,)


def _backend(column: str):
    import te_compile
    if column == "torch.compile":
        return "inductor"
    if column == "te_compile":
        return te_compile.backend(serve="fastest")
    if column == "always":
        return te_compile.backend(serve="always")
    if column == "reference":
        return te_compile.backend(target="reference")
    raise ValueError(column)


def child(spec: dict) -> dict:
    t0 = time.perf_counter()
    import torch
    import te_compile
    from te_compile import counters
    from te_compile.report import Report, record_reports
    imported = time.perf_counter() - t0
    device, case, shape = spec["device"], spec["case"], tuple(spec["shape"])
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    train = spec["train"]
    if case in ("sdpa", "flex"):
        fn, args = _site(case, shape, device, train, dtype)
        params = []
    elif case in ("llama", "llama-flex"):
        fn, args = _llama(shape, spec["layers"], spec["hidden"], "flex" if case == "llama-flex" else "sdpa", device,
                          dtype)
        params = list(fn.parameters())
        fn.requires_grad_(train)
    else:
        fn, args = _hf_llama(shape, spec["layers"], spec["hidden"], device, dtype)
        params = list(fn.parameters())
        fn.requires_grad_(train)
    def sync():
        if device == "cuda":
            torch.cuda.synchronize()

    sync()
    counters.reset()
    builds0 = _runtime_builds()
    t1 = time.perf_counter()  # from torch.compile(...) on: plain torch.compile imports Inductor there
    compiled = torch.compile(fn, backend=_backend(spec["column"]))
    with record_reports() as reports, torch.set_grad_enabled(train):
        out = compiled(*args)
    sync()
    first = time.perf_counter() - t1
    backward = None
    if train:
        t2 = time.perf_counter()
        out.float().sum().backward()
        sync()
        backward = time.perf_counter() - t2
    builds1 = _runtime_builds()
    s = Report(list(reports)).summary()
    row = {"first_call_s": first, "backward_s": backward, "total_s": first + (backward or 0.0),
           "import_s": imported, "te_phases": counters.phases(),
           "runtime_plan_builds": builds1[0] - builds0[0], "runtime_plan_build_s": builds1[1] - builds0[1],
           "sites": s, "params": len(params), "dynamo": _dynamo_times()}
    if spec.get("native"):
        from te_compile.cudnn import native
        row["native_status"] = native.enable()
    return row


def _runtime_builds() -> tuple:
    """(cuDNN graphs built by te_compile's op so far, their seconds); (0, 0.0) without cuDNN."""
    try:
        from te_compile.cudnn import graphs
    except Exception:  # noqa: BLE001 - no cuDNN frontend (CPU): nothing is built
        return 0, 0.0
    return graphs.cache.builds, graphs.cache.build_seconds


def _dynamo_times() -> dict:
    """torch's own compile-time breakdown (function name -> seconds), where this torch has it."""
    try:
        from torch._dynamo.utils import compile_times
        names, values = compile_times(repr="csv", aggregate=True)
        return {n: float(v) for n, v in zip(names, values)}
    except Exception:  # noqa: BLE001 - a torch without it: the row goes without
        return {}


# --------------------------------------------------------------------------- the parent: rounds of children

def _run_child(spec: dict, native_dir: str, timeout: int) -> dict:
    with tempfile.TemporaryDirectory(prefix="te-compile-time-") as tmp:
        env = dict(os.environ)
        env.update(TORCHINDUCTOR_CACHE_DIR=os.path.join(tmp, "inductor"), TRITON_CACHE_DIR=os.path.join(tmp, "triton"),
                   TE_COMPILE_CACHE_DIR=os.path.join(tmp, "te_compile"), TE_COMPILE_NATIVE_DIR=native_dir)
        env.pop("TE_COMPILE_SERVE", None)  # the columns name their policy
        here = os.path.dirname(os.path.abspath(__file__))
        env["PYTHONPATH"] = os.pathsep.join([os.path.dirname(here), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
        t0 = time.perf_counter()
        p = subprocess.run([sys.executable, os.path.abspath(__file__), "--child", json.dumps(spec)], env=env,
                           capture_output=True, text=True, timeout=timeout)
        wall = time.perf_counter() - t0
    for line in p.stdout.splitlines():
        if line.startswith("RESULT "):
            row = json.loads(line[len("RESULT "):])
            row["process_s"] = wall
            return row
    tail = (p.stderr or p.stdout).strip().splitlines()[-3:]
    return {"error": " | ".join(tail)[:400], "process_s": wall}


def _device_info(device: str) -> dict:
    import torch
    info = {"device": torch.cuda.get_device_name() if device == "cuda" else "cpu", "torch": torch.__version__}
    try:
        from te_compile.cudnn.versions import running
        info["cudnn"] = running()
    except Exception:  # noqa: BLE001 - no cuDNN frontend: no version to record
        info["cudnn"] = None
    return info


def save(path: str, head: dict, rows: list) -> None:
    record.write(path, {**head, "rows": rows, "summary": summarize(rows)})


def summarize(rows: list) -> list:
    """Per (case, shape, mode, column): the median total seconds over rounds, and its ratio to torch.compile's."""
    groups: dict = {}
    for r in rows:
        if "error" in r:
            continue
        groups.setdefault((r["case"], tuple(r["shape"]), r["mode"], r["column"]), []).append(r)
    out = []
    for (case, shape, mode, column), rs in sorted(groups.items()):
        med = statistics.median(x["total_s"] for x in rs)
        phases: dict = {}
        for x in rs:
            for k, v in x["te_phases"].items():
                phases.setdefault(k, []).append(v["seconds"])
        base = groups.get((case, shape, mode, "torch.compile"))
        entry = {"case": case, "shape": list(shape), "mode": mode, "column": column, "rounds": len(rs),
                 "total_s_median": med, "first_call_s_median": statistics.median(x["first_call_s"] for x in rs),
                 "te_phases_s_median": {k: statistics.median(v) for k, v in phases.items()},
                 "runtime_plan_builds": rs[0]["runtime_plan_builds"], "sites": rs[0]["sites"]}
        if base:
            entry["vs_torch_compile"] = med / statistics.median(x["total_s"] for x in base)
        out.append(entry)
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--child", help=argparse.SUPPRESS)
    p.add_argument("--cases", default="sdpa,flex,llama,llama-flex,hf-llama")
    p.add_argument("--columns", default="", help=f"default: {','.join(GPU_COLUMNS)} (CUDA), "
                   f"{','.join(CPU_COLUMNS)} (CPU)")
    p.add_argument("--shapes", default="", help="B,H,L,D;... (per-site cases use H and D; the models B, L and D); "
                   "default 1,8,512,64;2,16,4096,128 (CUDA)")
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--hidden", type=int, default=1024)
    p.add_argument("--modes", default="train,infer")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--timeout", type=int, default=300, help="seconds per child")
    p.add_argument("--cpu", action="store_true", help="run on the CPU even where CUDA is available")
    p.add_argument("--smoke", action="store_true", help="CPU, tiny shapes and models, one round: checks the script")
    p.add_argument("--json", default="")
    a = p.parse_args()
    if a.child:
        print("RESULT " + json.dumps(child(json.loads(a.child))), flush=True)
        return 0
    import torch
    device = "cpu" if a.cpu or a.smoke or not torch.cuda.is_available() else "cuda"
    if a.smoke:  # a single SDPA call and a 2-layer model, training steps, one round: a few minutes on a CPU
        a.shapes = a.shapes or "1,2,64,16"
        a.layers, a.hidden, a.rounds = min(a.layers, 2), min(a.hidden, 64), 1
        if a.cases == p.get_default("cases"):
            a.cases = "sdpa,llama"
        if a.modes == p.get_default("modes"):
            a.modes = "train"
    shapes = [tuple(int(x) for x in s.split(",")) for s in (a.shapes or "1,8,512,64;2,16,4096,128").split(";")]
    columns = a.columns.split(",") if a.columns else list(GPU_COLUMNS if device == "cuda" else CPU_COLUMNS)
    cases = [c for c in a.cases.split(",") if c]
    if "hf-llama" in cases:
        try:
            import transformers  # noqa: F401
        except ImportError:
            print("hf-llama: transformers does not import; left out", flush=True)
            cases.remove("hf-llama")
    head = {**_device_info(device), "date": datetime.date.today().isoformat(), "command": record.command("bench/compile_time.py")}
    rows: list = []
    with tempfile.TemporaryDirectory(prefix="te-compile-native-") as native_dir:
        if device == "cuda":  # the native call path's build, once, apart from the measured compiles
            spec = {"device": device, "case": "flex", "shape": list(shapes[-1]), "train": False, "column": "always",
                    "layers": a.layers, "hidden": a.hidden, "native": True}
            r = _run_child(spec, native_dir, a.timeout)
            head["native_build"] = {"seconds": r.get("te_phases", {}).get("native", {}).get("seconds"),
                                    "status": r.get("native_status"), "error": r.get("error")}
            print(f"native call path: built in {head['native_build']['seconds']} s "
                  f"({head['native_build']['status'] or head['native_build']['error']})", flush=True)
        for case in cases:
            for shape in shapes:
                for mode in a.modes.split(","):
                    train = mode == "train"
                    if train and device == "cpu" and "flex" in case:
                        continue  # no CPU flex backward in Inductor
                    for rnd in range(a.rounds):
                        order = columns[rnd % len(columns):] + columns[:rnd % len(columns)]
                        for column in order:
                            spec = {"device": device, "case": case, "shape": list(shape), "train": train,
                                    "column": column, "layers": a.layers, "hidden": a.hidden}
                            r = _run_child(spec, native_dir, a.timeout)
                            r.update(case=case, shape=list(shape), mode=mode, column=column, round=rnd)
                            rows.append(r)
                            if "error" in r:
                                print(f"{case} {shape} {mode} {column} round {rnd + 1}: error {r['error']}", flush=True)
                            else:
                                ph = {k: round(v["seconds"], 3) for k, v in r["te_phases"].items()}
                                print(f"{case} {'x'.join(map(str, shape))} {mode} {column:13s} round {rnd + 1}: "
                                      f"{r['total_s']:.2f} s (first call {r['first_call_s']:.2f}, backward "
                                      f"{r['backward_s'] or 0:.2f}) sites {r['sites']} te {ph} plans at run "
                                      f"{r['runtime_plan_builds']}", flush=True)
                            save(a.json, head, rows)
    for s in summarize(rows):
        vs = f" {s['vs_torch_compile']:.2f}x of torch.compile" if "vs_torch_compile" in s else ""
        print(f"{s['case']:10s} {'x'.join(map(str, s['shape'])):14s} {s['mode']:5s} {s['column']:13s} "
              f"{s['total_s_median']:7.2f} s{vs}  te phases {({k: round(v, 2) for k, v in s['te_phases_s_median'].items()})}",
              flush=True)
    save(a.json, head, rows)
    return 0 if not any("error" in r for r in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
