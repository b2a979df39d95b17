"""Convergence: does a model trained through te_compile learn what it learns through plain torch.compile?

    python3 bench/convergence.py --attention flex --json conv-flex.json            # CUDA: 113M params, 3000 steps
    python3 bench/convergence.py --attention flex-docs --json conv-flex-docs.json
    python3 bench/convergence.py --attention flex-bias --json conv-flex-bias.json
    python3 bench/convergence.py --attention sdpa --json conv-sdpa.json
    python3 bench/convergence.py --smoke --json conv-smoke.json                    # CPU: tiny model, a few steps

The model is a Llama-style decoder: byte embeddings (vocabulary 256), RMSNorm, rotary positions, SwiGLU MLP, tied
output head; default 16 layers, hidden 768 (SwiGLU width 2048), 12 heads of 64, 1024 tokens: 113M parameters (the
JSON records the count). Its attention is one of

* ``flex``: flex_attention with a causal BlockMask (built once) and a softcap score_mod, 30 * tanh(s / 30);
* ``flex-docs``: packed documents + causal: each sequence is a window of the byte stream, the document ids come
  from the stream's file boundaries, and every step builds a new BlockMask with create_block_mask, as a
  pretraining loader does;
* ``flex-bias``: flex_attention with a causal BlockMask and a learned bias per head and query - key offset (a
  ``[heads, 2 * seq - 1]`` table per layer, zero at first, gathered in the score_mod) and no rotary embedding
  (T5-style: the tables are the model's only position signal, so a wrong dBias shows in the loss): te_compile
  materializes it as an attention bias and cuDNN computes its gradient (dBias);
* ``sdpa``: F.scaled_dot_product_attention with is_causal=True.

Data: byte-level language modelling on the Python sources of the running interpreter's site-packages (``*.py``,
sorted by relative path; each file goes to validation when the first byte of the SHA-1 of its relative path is
below 256 * --val-fraction, else to training; files joined by a 0 byte, which also ends a document). Nothing
is downloaded. Training batches are random windows of the training stream drawn with the column's data seed;
validation is a fixed set of windows of the validation stream, the same for every column.

Precision: float32 parameters and AdamW state, forward and backward under bf16 autocast on CUDA (``--smoke``:
float32, no autocast). AdamW (fused on CUDA), linear warm-up then cosine decay to 10% of --lr, gradient norm
clipped at 1.0.

Columns (--columns), each in a fresh process (compile caches and RNG states do not leak between columns):
``te_compile`` (te_compile.backend(serve="fastest"), the default policy whatever TE_COMPILE_SERVE says),
``always`` (te_compile.backend(serve="always")), ``torch.compile`` (seed A), ``torch.compile-B`` (seed B: another
initialisation and data order, the run-to-run spread), ``eager``. Every column but ``torch.compile-B`` uses seed A.
``NAME#k`` (``torch.compile#2``, ``always#2``) trains column NAME again, same seed: what nondeterministic kernels
(atomic adds, as in Inductor's gradient of a captured table) do to one seed's run.
With --smoke the te_compile columns run target="reference" under inner="aot_eager" and the torch.compile columns
use backend="aot_eager" (no C++ compiler needed), on the CPU.

Output: one JSON (date, command, card, versions, config, per-column train / validation curves, final validation
loss, median step time of the second half of the steps, first step's time with its compile, and for te_compile
columns what each attention site ran on and why; ``graphs``: the graphs Dynamo compiled, recompiles included)
and a PNG of the curves next to it when matplotlib imports. ``--parallel`` trains the columns at once, each
in its own process on the one GPU (their compiles and
host work overlap; no step times then). The summary line compares each te_compile column's
final validation loss with the mean of the torch.compile runs (both seeds and any repeats), against their spread,
and its training curve with torch.compile's on the same seed (the mean absolute difference), against the other
seed's. ``--append`` adds columns to an existing JSON of the same config, so the columns can
run one command each.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import datetime
import hashlib
import json
import math
import os
import re
import statistics
import subprocess
import sys
import sysconfig
import tempfile
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

ATTENTIONS = ("flex", "flex-docs", "flex-bias", "sdpa")
COLUMNS = ("te_compile", "always", "torch.compile", "torch.compile-B", "eager")
SEED_A, SEED_B = 0, 1
SOFTCAP = 30.0
SEP = 0  # the byte that joins (and ends) files in the stream
#: Inductor's flex finds no Triton config at its default block sizes for a learned table's backward on an H100 / H200
#: (shared memory; docs/benchmarks.md, "Learned relative-position table"): flex-bias passes these smaller ones on CUDA
#: (kernel options are Inductor's alone: a site te_compile serves ignores them)
SMALL_BLOCKS = {"BLOCK_M": 32, "BLOCK_N": 32, "BLOCK_M1": 16, "BLOCK_N1": 32, "BLOCK_M2": 32, "BLOCK_N2": 16,
                "num_stages": 1, "num_warps": 4}


@dataclasses.dataclass
class Config:
    layers: int = 16
    hidden: int = 768
    heads: int = 12
    seq: int = 1024
    batch: int = 16
    steps: int = 3000
    lr: float = 6e-4
    warmup: int = 200
    schedule: str = "cosine"  # or "constant" (after the warm-up)
    weight_decay: float = 0.1
    attention: str = "flex"
    train_every: int = 10  # train loss recorded every N steps (the mean of those N)
    val_every: int = 250
    val_batches: int = 16
    val_fraction: float = 0.05
    max_train_bytes: int = 200_000_000
    device: str = "cuda"
    autocast: bool = True  # bf16 autocast (CUDA); float32 parameters either way
    smoke: bool = False


def smoke_config(**kw) -> Config:
    base = dict(layers=2, hidden=64, heads=4, seq=128, batch=4, steps=30, lr=3e-3, warmup=5, train_every=5,
                val_every=15, val_batches=2, max_train_bytes=2_000_000, device="cpu", autocast=False, smoke=True,
                attention="sdpa")
    base.update(kw)
    return Config(**base)


# --------------------------------------------------------------------------- data

def source_files(root: str | None = None) -> list[tuple[str, str]]:
    """(relative path, absolute path) of every ``*.py`` under ``root`` (the interpreter's site-packages), sorted."""
    root = root or sysconfig.get_paths()["purelib"]
    out = []
    for d, dirs, files in os.walk(root):
        dirs.sort()
        for f in files:
            if f.endswith(".py"):
                p = os.path.join(d, f)
                out.append((os.path.relpath(p, root), p))
    out.sort()
    return out


def is_validation(rel: str, fraction: float) -> bool:
    return hashlib.sha1(rel.encode()).digest()[0] < 256 * fraction


def load_corpus(cfg: Config, root: str | None = None) -> dict:
    """The training and validation byte streams ([N] uint8 tensors), each with its per-byte document ids ([N]
    int32, a new id after each separator) and the files it holds. Reading stops once the training stream holds
    cfg.max_train_bytes and validation its fraction of that (files are read in sorted order, so a smaller limit
    reads a prefix of the same files)."""
    want = {"train": cfg.max_train_bytes, "val": max(int(cfg.max_train_bytes * cfg.val_fraction), 4 * cfg.seq)}
    parts: dict[str, list[bytes]] = {"train": [], "val": []}
    files: dict[str, list[str]] = {"train": [], "val": []}
    size = {"train": 0, "val": 0}
    for rel, path in source_files(root):
        split = "val" if is_validation(rel, cfg.val_fraction) else "train"
        if size[split] >= want[split]:
            if all(size[s] >= want[s] for s in size):
                break
            continue
        try:
            with open(path, "rb") as f:
                data = f.read().replace(bytes([SEP]), b"")
        except OSError:
            continue
        parts[split].append(data + bytes([SEP]))
        files[split].append(rel)
        size[split] += len(data) + 1
    out = {}
    for split in ("train", "val"):
        stream = torch.frombuffer(bytearray(b"".join(parts[split])), dtype=torch.uint8)
        docs = torch.cumsum((stream == SEP).to(torch.int32), 0) - (stream == SEP).to(torch.int32)
        out[split] = {"bytes": stream, "docs": docs, "files": files[split]}
    return out


def batch(split: dict, offsets: torch.Tensor, seq: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(inputs [B, L] int64, targets [B, L] int64, document ids [B, L] int32 from 0 within each row)."""
    idx = offsets[:, None] + torch.arange(seq + 1)
    b = split["bytes"][idx].long()
    d = split["docs"][idx[:, :-1]]
    return b[:, :-1], b[:, 1:], (d - d[:, :1]).to(torch.int32)


def train_offsets(split: dict, cfg: Config, seed: int):
    """Random window starts per step, drawn from the column's data seed."""
    g = torch.Generator().manual_seed(1000 + seed)
    n = split["bytes"].numel() - cfg.seq - 1
    while True:
        yield torch.randint(0, n, (cfg.batch,), generator=g)


def val_offsets(split: dict, cfg: Config) -> list[torch.Tensor]:
    """The fixed validation windows: evenly spaced over the validation stream, the same for every column."""
    n = split["bytes"].numel() - cfg.seq - 1
    starts = torch.linspace(0, n, cfg.val_batches * cfg.batch).long()
    return list(starts.split(cfg.batch))


# --------------------------------------------------------------------------- model

def softcap(s, b, h, q, kv):
    return SOFTCAP * torch.tanh(s / SOFTCAP)


def causal(b, h, q, kv):
    return q >= kv


def document_mask(docs: torch.Tensor):
    """Packed documents + causal, for [B, L] document ids."""
    def mask(b, h, q, kv):
        return (docs[b, q] == docs[b, kv]) & (q >= kv)
    return mask


def block_mask_for(cfg: Config, docs: torch.Tensor | None, device):
    """The BlockMask a step passes to the model (None for SDPA)."""
    from torch.nn.attention.flex_attention import create_block_mask
    if cfg.attention in ("flex", "flex-bias"):
        return create_block_mask(causal, None, None, cfg.seq, cfg.seq, device=device)
    if cfg.attention == "flex-docs":
        return create_block_mask(document_mask(docs.to(device)), docs.shape[0], None, cfg.seq, cfg.seq,
                                 device=device)
    return None


def rotary(seq: int, dim: int, base: float = 10000.0):
    inv = 1.0 / base ** (torch.arange(0, dim, 2).float() / dim)
    ang = torch.outer(torch.arange(seq).float(), inv)
    return ang.cos(), ang.sin()


def apply_rotary(x, cos, sin):
    x1, x2 = x[..., 0::2], x[..., 1::2]
    return torch.stack([x1 * cos - x2 * sin, x1 * sin + x2 * cos], -1).flatten(-2).type_as(x)


class Block(nn.Module):
    def __init__(self, cfg: Config):
        super().__init__()
        d, self.heads = cfg.hidden, cfg.heads
        self.kind = cfg.attention
        if self.kind == "flex-bias":  # a learned bias per head and query - key offset (T5-style), zero at first
            self.rel = nn.Parameter(torch.zeros(cfg.heads, 2 * cfg.seq - 1))
        self.norm1, self.norm2 = nn.RMSNorm(d), nn.RMSNorm(d)
        self.qkv = nn.Linear(d, 3 * d, bias=False)
        self.proj = nn.Linear(d, d, bias=False)
        ff = 64 * math.ceil(8 * d / 3 / 64)
        self.gate_up = nn.Linear(d, 2 * ff, bias=False)
        self.down = nn.Linear(ff, d, bias=False)

    def attend(self, q, k, v, block_mask):
        if self.kind == "sdpa":
            return F.scaled_dot_product_attention(q, k, v, is_causal=True)
        from torch.nn.attention.flex_attention import flex_attention
        score_mod = softcap if self.kind == "flex" else None
        if self.kind == "flex-bias":
            rel = self.rel

            def score_mod(s, b, h, q_idx, kv_idx):
                return s + rel[h, q_idx - kv_idx + (rel.shape[1] - 1) // 2]
            return flex_attention(q, k, v, score_mod=score_mod, block_mask=block_mask,
                                  kernel_options=SMALL_BLOCKS if q.is_cuda else None)
        return flex_attention(q, k, v, score_mod=score_mod, block_mask=block_mask)

    def forward(self, x, cos, sin, block_mask):
        B, L, d = x.shape
        q, k, v = self.qkv(self.norm1(x)).view(B, L, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        if self.kind != "flex-bias":  # T5-style: the learned table is the only position signal
            q, k = apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)
        a = self.attend(q, k, v, block_mask)
        x = x + self.proj(a.transpose(1, 2).reshape(B, L, d))
        g, u = self.gate_up(self.norm2(x)).chunk(2, -1)
        return x + self.down(F.silu(g) * u)


class Decoder(nn.Module):
    def __init__(self, cfg: Config):
        super().__init__()
        self.embed = nn.Embedding(256, cfg.hidden)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.layers))
        self.norm = nn.RMSNorm(cfg.hidden)
        cos, sin = rotary(cfg.seq, cfg.hidden // cfg.heads)
        self.register_buffer("cos", cos, persistent=False)
        self.register_buffer("sin", sin, persistent=False)
        for name, p in self.named_parameters():
            if p.dim() == 2 and not name.endswith(".rel"):
                std = 0.02 / math.sqrt(2 * cfg.layers) if name.endswith(("proj.weight", "down.weight")) else 0.02
                nn.init.normal_(p, std=std)

    def forward(self, x, y, block_mask=None):
        h = self.embed(x)
        for blk in self.blocks:
            h = blk(h, self.cos, self.sin, block_mask)
        logits = F.linear(self.norm(h), self.embed.weight)  # tied head
        return F.cross_entropy(logits.float().view(-1, 256), y.reshape(-1))


def make_model(cfg: Config, seed: int) -> Decoder:
    torch.manual_seed(seed)
    return Decoder(cfg).to(cfg.device)


def compiled(model: nn.Module, column: str, cfg: Config):
    """The column's callable for ``model``."""
    if column == "eager":
        return model
    if column in ("torch.compile", "torch.compile-B"):
        return torch.compile(model, backend="aot_eager" if cfg.smoke else "inductor")
    import te_compile
    serve = "always" if column == "always" else "fastest"
    if cfg.smoke:
        return torch.compile(model, backend=te_compile.backend(target="reference", inner="aot_eager", serve=serve))
    return torch.compile(model, backend=te_compile.backend(serve=serve))


def lr_at(step: int, cfg: Config) -> float:
    if step < cfg.warmup:
        return cfg.lr * (step + 1) / cfg.warmup
    if cfg.schedule == "constant":
        return cfg.lr
    t = (step - cfg.warmup) / max(1, cfg.steps - cfg.warmup)
    return cfg.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(t, 1.0))))


@contextlib.contextmanager
def _cpu_flex_with_grad(on: bool):
    """flex_attention refuses CPU inputs that require grad (it has no CPU backward kernel of its own); the math
    path it compiles to is fine. Lifts the check while ``on`` and puts it back after."""
    import torch.nn.attention.flex_attention as fa
    saved = fa._validate_device
    if on:
        fa._validate_device = lambda *a, **k: None
    try:
        yield
    finally:
        fa._validate_device = saved


# --------------------------------------------------------------------------- one column

def train(cfg: Config, column: str, corpus: dict | None = None, log=None) -> dict:
    """Train one column; returns its curves, final validation loss and step times."""
    corpus = corpus or load_corpus(cfg)
    with _cpu_flex_with_grad(cfg.device == "cpu" and cfg.attention.startswith("flex")):
        return _train(cfg, column, corpus, log)


def base_column(column: str) -> str:
    """The column a repeat (``NAME#k``) trains again."""
    return column.split("#")[0]


def _train(cfg: Config, column: str, corpus: dict, log) -> dict:
    kind = base_column(column)
    seed = SEED_B if kind == "torch.compile-B" else SEED_A
    dev = torch.device(cfg.device)
    model = make_model(cfg, seed)
    fn = compiled(model, kind, cfg)
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, betas=(0.9, 0.95), weight_decay=cfg.weight_decay,
                            **({"fused": True} if dev.type == "cuda" else {}))
    amp = torch.autocast("cuda", dtype=torch.bfloat16) if cfg.autocast and dev.type == "cuda" else _null()
    fixed_bm = block_mask_for(cfg, None, dev) if cfg.attention in ("flex", "flex-bias") else None
    vals = val_offsets(corpus["val"], cfg)

    def loss_of(offsets, train_mode):
        x, y, docs = batch(corpus["train" if train_mode else "val"], offsets, cfg.seq)
        bm = fixed_bm if cfg.attention != "flex-docs" else block_mask_for(cfg, docs, dev)
        with amp:
            return fn(x.to(dev, non_blocking=True), y.to(dev, non_blocking=True), bm)

    def validate():
        model.eval()
        with torch.no_grad():
            out = sum(loss_of(o, False).item() for o in vals) / len(vals)
        model.train()
        return out

    curve, val_curve, times, acc, sites = [], [], [], [], None
    offsets = train_offsets(corpus["train"], cfg, seed)
    for step in range(cfg.steps):
        for g in opt.param_groups:
            g["lr"] = lr_at(step, cfg)
        t0 = time.perf_counter()
        if step == 0 and kind in ("te_compile", "always"):
            from te_compile.report import Report, record_reports
            with record_reports() as reports:
                loss = loss_of(next(offsets), True)
            sites = sorted({(d.runs_on, str(d.reason or d.note)[:300]) for d in Report(list(reports)).decisions})
        else:
            loss = loss_of(next(offsets), True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        acc.append(loss.detach())
        if (step + 1) % cfg.train_every == 0:
            curve.append([step + 1, torch.stack(acc).float().mean().item()])  # syncs
            acc = []
            if log:
                log(f"{column} step {step + 1} train {curve[-1][1]:.4f}")
        times.append(time.perf_counter() - t0)
        if (step + 1) % cfg.val_every == 0 and step + 1 < cfg.steps:
            val_curve.append([step + 1, validate()])
    final = validate()
    val_curve.append([cfg.steps, final])
    steady = times[len(times) // 2:] or times
    return {"column": column, "seed": seed, "train": curve, "val": val_curve, "final_val": final,
            "step_ms_median": statistics.median(steady) * 1e3, "first_step_s": times[0] if times else None,
            "params": sum(p.numel() for p in model.parameters()), "sites": sites,
            "graphs": dict(torch._dynamo.utils.counters["stats"]).get("unique_graphs", 0),
            "corpus": {k: {"bytes": corpus[k]["bytes"].numel(), "files": len(corpus[k]["files"])}
                       for k in ("train", "val")}}


class _null:
    def __enter__(self):
        return None

    def __exit__(self, *a):
        return False


def run_column(cfg: Config, column: str, timeout: float | None = None) -> dict:
    """Train ``column`` in a fresh Python process; returns what train() returned (or {"error": ...})."""
    with tempfile.TemporaryDirectory() as d:
        cfg_path, out_path = os.path.join(d, "cfg.json"), os.path.join(d, "out.json")
        with open(cfg_path, "w") as f:
            json.dump(dataclasses.asdict(cfg), f)
        cmd = [sys.executable, os.path.abspath(__file__), "--worker", column, "--worker-config", cfg_path,
               "--worker-out", out_path]
        root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # this checkout's te_compile first
        # Inductor's and AOTAutograd's caches in a folder of the column's own: a cache warmed by another column or
        # run would hand back a graph compiled from other code (its key does not cover te_compile's op bodies)
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH")) if p),
               "TORCHINDUCTOR_CACHE_DIR": os.path.join(d, "inductor"), "TRITON_CACHE_DIR": os.path.join(d, "triton")}
        try:
            p = subprocess.run(cmd, env=env, timeout=timeout, capture_output=True, text=True)
        except subprocess.TimeoutExpired:
            return {"column": column, "error": f"timed out after {timeout} s"}
        if p.returncode != 0 or not os.path.exists(out_path):
            return {"column": column, "error": (p.stderr or p.stdout)[-4000:]}
        with open(out_path) as f:
            return json.load(f)


def run_columns_parallel(cfg: Config, columns: list[str], timeout: float | None = None) -> dict:
    """Every column in its own process, all at once (one GPU shared: for a check of the losses, not for step
    times)."""
    from concurrent.futures import ThreadPoolExecutor
    with ThreadPoolExecutor(len(columns)) as ex:
        return dict(zip(columns, ex.map(lambda c: run_column(cfg, c, timeout), columns)))


def same_seed_gap(a: dict, b: dict) -> float | None:
    """The mean absolute difference of two columns' training curves (nats per byte), None unless both recorded the
    same steps. Between te_compile and torch.compile on one seed (one initialisation, one data order) it measures
    only what their kernels' rounding does to training; between the two seeds, what a change of seed does."""
    ta, tb = a.get("train") or [], b.get("train") or []
    if not ta or [s for s, _ in ta] != [s for s, _ in tb]:
        return None
    return sum(abs(x - y) for (_, x), (_, y) in zip(ta, tb)) / len(ta)


def summary(results: dict) -> dict:
    """te_compile's final validation loss against torch.compile's runs (two seeds, and repeats of a seed where the
    run has them): the gap to their mean, their spread (max - min), and whether each te_compile column (repeats
    included) lies inside [min, max] of those runs widened by their spread; and each column's training curve
    against torch.compile's on the same seed (``same_seed_gap``; for torch.compile-B, the other seed's)."""
    tc_cols = [c for c in results if base_column(c) in ("torch.compile", "torch.compile-B")
               and "final_val" in results[c]]
    tc = [results[c]["final_val"] for c in tc_cols]
    out: dict = {"torch.compile_finals": tc}
    if tc_cols:
        out["torch.compile_columns"] = tc_cols
    base = results.get("torch.compile", {})
    seeds = {base_column(c) for c in tc_cols}
    if seeds == {"torch.compile", "torch.compile-B"}:
        mean, spread = sum(tc) / len(tc), max(tc) - min(tc)
        out.update({"torch.compile_mean": mean, "seed_gap": spread,
                    "seed_curve_gap": same_seed_gap(results.get("torch.compile-B", {}), base)})
        repeats = [results[c]["final_val"] for c in tc_cols if base_column(c) == "torch.compile"]
        if len(repeats) > 1:
            out["repeat_spread"] = max(repeats) - min(repeats)  # one seed, run again
        for c in results:
            if base_column(c) in ("te_compile", "always", "eager") and "final_val" in results[c]:
                v = results[c]["final_val"]
                out[c] = {"final_val": v, "gap_to_mean": v - mean,
                          "inside_spread": min(tc) - spread <= v <= max(tc) + spread,
                          "same_seed_gap": same_seed_gap(results[c], base)}
    return out


def summary_line(s: dict) -> str:
    if "seed_gap" not in s:
        return "summary: needs both torch.compile seeds"
    curve = lambda g: "" if g is None else f", curve {g:.4f} from torch.compile's"  # noqa: E731
    runs = " / ".join(f"{v:.4f}" for v in s["torch.compile_finals"])
    rep = f", one seed again {s['repeat_spread']:.4f}" if "repeat_spread" in s else ""
    parts = [f"torch.compile {'seeds' if len(s['torch.compile_finals']) == 2 else 'runs'} {runs} "
             f"(gap {s['seed_gap']:.4f}{rep}{curve(s.get('seed_curve_gap'))})"]
    for c, r in s.items():
        if isinstance(r, dict) and "final_val" in r:
            parts.append(f"{c} {r['final_val']:.4f} (gap to mean {r['gap_to_mean']:+.4f}"
                         f"{curve(r.get('same_seed_gap'))})")
    return "summary: " + "; ".join(parts)


def environment(cfg: Config, argv: list[str] | None = None) -> dict:
    cuda = cfg.device == "cuda" and torch.cuda.is_available()
    return {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "command": " ".join(["python3", "bench/convergence.py"] + list(sys.argv[1:] if argv is None else argv)),
            "card": torch.cuda.get_device_name() if cuda else "cpu",
            "torch": torch.__version__,
            "cudnn": torch.backends.cudnn.version() if cuda else None,
            "precision": "float32 parameters, bf16 autocast" if cfg.autocast and cuda else "float32"}


def plot(doc: dict, path: str) -> str | None:
    """The train (thin) and validation (markers) curves of every column; None when matplotlib is missing."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    fig, ax = plt.subplots(figsize=(8, 5))
    for i, (col, r) in enumerate(doc["columns"].items()):
        if "train" not in r:
            continue
        c = f"C{i}"
        ax.plot(*zip(*r["train"]), color=c, lw=0.8, alpha=0.6, label=f"{col} train")
        ax.plot(*zip(*r["val"]), color=c, marker="o", ms=3, lw=1.5, label=f"{col} val ({r['final_val']:.4f})")
    cfg = doc["config"]
    ax.set(xlabel="step", ylabel="loss (nats / byte)",
           title=f"{cfg['attention']}, {cfg['layers']}x{cfg['hidden']}, {doc['card']}")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def parse(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--attention", choices=ATTENTIONS)
    ap.add_argument("--columns", default=",".join(COLUMNS), help="comma-separated, from: " + ", ".join(COLUMNS)
                    + "; NAME#2 .. NAME#9 trains NAME again on its seed")
    ap.add_argument("--steps", type=int)
    for name in ("layers", "hidden", "heads", "seq", "batch", "warmup", "train_every", "val_every", "val_batches",
                 "max_train_bytes"):
        ap.add_argument("--" + name.replace("_", "-"), type=int)
    ap.add_argument("--lr", type=float)
    ap.add_argument("--schedule", choices=("cosine", "constant"))
    ap.add_argument("--smoke", action="store_true", help="CPU, tiny model, a few steps, reference target")
    ap.add_argument("--json", default="convergence.json")
    ap.add_argument("--png", help="default: the JSON's name with .png")
    ap.add_argument("--timeout", type=float, help="seconds per column")
    ap.add_argument("--parallel", action="store_true",
                    help="train every column at once, each in its own process on the one GPU: the losses only (the "
                         "columns share the GPU, so their step times are not recorded)")
    ap.add_argument("--append", action="store_true",
                    help="keep the columns already in --json (same config) and add these (one column per command)")
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    ap.add_argument("--worker-config", help=argparse.SUPPRESS)
    ap.add_argument("--worker-out", help=argparse.SUPPRESS)
    return ap.parse_args(argv)


def config_from(a) -> Config:
    kw = {k: getattr(a, k) for k in ("attention", "steps", "layers", "hidden", "heads", "seq", "batch", "warmup",
                                     "train_every", "val_every", "val_batches", "max_train_bytes", "lr", "schedule")
          if getattr(a, k) is not None}
    return smoke_config(**kw) if a.smoke else Config(**kw)


def run(cfg: Config, columns: list[str], timeout: float | None = None, log=print, previous: dict | None = None,
        argv: list[str] | None = None, parallel: bool = False) -> dict:
    """Every column in its own process (one after another, or all at once with ``parallel``: then their step times,
    taken on a shared GPU, are dropped); the JSON document (without writing it). ``previous``: a document of the
    same config whose columns are kept (and whose columns named again are run again)."""
    doc = {**environment(cfg, argv), "config": dataclasses.asdict(cfg), "columns": {}, "parallel": parallel}
    if previous:
        if previous["config"] != doc["config"]:
            raise SystemExit("--append: the JSON's config differs from this command's")
        doc["columns"] = {c: r for c, r in previous["columns"].items() if c not in columns}
        doc["commands"] = previous.get("commands", [previous["command"]]) + [doc["command"]]
    if parallel:
        log(f"columns {', '.join(columns)} at once ...")
        done = run_columns_parallel(cfg, columns, timeout)
    for col in columns:
        if parallel:
            r = done[col]
            for key in ("step_ms_median", "first_step_s"):
                r.pop(key, None)
        else:
            log(f"column {col} ...")
            r = run_column(cfg, col, timeout)
        doc["columns"][col] = r
        log(f"column {col}: " + (f"final val {r['final_val']:.4f}" + ("" if parallel else
                                                                        f", {r['step_ms_median']:.1f} ms/step")
                                 if "final_val" in r else "failed:\n" + r["error"]))
    doc["summary"] = summary(doc["columns"])
    return doc


def main(argv=None) -> int:
    a = parse(argv)
    if a.worker:
        with open(a.worker_config) as f:
            cfg = Config(**json.load(f))
        torch.backends.cuda.matmul.allow_tf32 = True
        out = train(cfg, a.worker, log=lambda s: print(s, flush=True))
        with open(a.worker_out, "w") as f:
            json.dump(out, f)
        return 0
    cfg = config_from(a)
    if cfg.device == "cuda" and not torch.cuda.is_available():
        print("no CUDA device: run with --smoke for the CPU check")
        return 2
    columns = [c for c in a.columns.split(",") if c]
    bad = [c for c in columns if base_column(c) not in COLUMNS or (c != base_column(c) and not
                                                                    re.fullmatch(r"[^#]+#[2-9]", c))]
    if bad:
        print(f"unknown columns {bad}; choose from {list(COLUMNS)}, or NAME#2 .. NAME#9 to train NAME again")
        return 2
    previous = None
    if a.append and os.path.exists(a.json):
        with open(a.json) as f:
            previous = json.load(f)
    doc = run(cfg, columns, a.timeout, previous=previous, argv=argv, parallel=a.parallel)
    with open(a.json, "w") as f:
        json.dump(doc, f, indent=1)
    print(f"wrote {a.json}")
    png = plot(doc, a.png or os.path.splitext(a.json)[0] + ".png")
    print(f"wrote {png}" if png else "matplotlib does not import: no plot, the JSON only")
    print(summary_line(doc["summary"]))
    return 0 if all("final_val" in r for r in doc["columns"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
