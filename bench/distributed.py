"""Training at size on several GPUs: FSDP2 (with tensor parallelism inside it, ``--tp``) over a Llama-style model,
te_compile against plain torch.compile, one process per GPU.

    torchrun --nproc-per-node 4 bench/distributed.py --json dist-4.json                 # CUDA: FSDP2 over 4 GPUs
    torchrun --nproc-per-node 4 bench/distributed.py --tp 2 --json dist-4-tp2.json      # 2-way TP inside 2-way FSDP
    torchrun --nproc-per-node 2 bench/distributed.py --json dist-2.json                 # the scaling figure
    torchrun --nproc-per-node 2 bench/distributed.py --smoke --json smoke.json          # CPU (gloo): checks the script

The model is a Llama-style decoder stack (RMSNorm, rotary positions, GQA attention, SwiGLU), default hidden 2048,
16 query heads of 128 over 4 KV heads, SwiGLU 8192, 16 layers (about 1.0B parameters; the JSON records the count),
``--batch`` sequences of ``--seq`` tokens per data-parallel rank, float32 parameters and AdamW state, bf16 compute
(FSDP2's ``MixedPrecisionPolicy``: bf16 parameters in the step, float32 gradient reduction). Attention (``--attn``):

* ``flex``: flex_attention with a causal BlockMask (built once);
* ``flex-docs``: packed documents + causal: each step writes a new packing (documents of mean ``--mean-doc``
  tokens) into the ids buffer the mask_mod reads and builds its BlockMask with create_block_mask, as a pretraining
  loader does; every column pays that;
* ``sdpa``: ``F.scaled_dot_product_attention(is_causal=True, enable_gqa=True)``.

Parallelism: ``fully_shard`` per block, then the model, over the data-parallel mesh dimension; with ``--tp N``,
``parallelize_module`` first over the tensor-parallel dimension (Colwise q, k, v, gate, up; Rowwise o, down: each
rank holds 1/N of the heads). Each block is compiled (``torch.compile(block, backend=...)``, as torchtitan does).

Columns: ``torch.compile`` (Inductor), its A/A ``control``, ``te_compile`` (default policy), each a model built
from the same seed, trained on the same batches. Correctness first: the first ``--check-steps`` losses of every
column against torch.compile's (relative difference; bf16 noise is about 1e-2). Then timing: rounds alternate
between the columns (each round starts with the next), each round ``--iters`` steps timed as a whole after a warm-up,
the best round kept and every round in the JSON; tokens per second per GPU; peak memory per GPU (the largest over the
ranks). Rank 0 writes the JSON and prints one line per column.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
import time

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.attention.flex_attention import create_block_mask, flex_attention

COLUMNS = ("torch.compile", "control", "te_compile")


def _causal(b, h, q_idx, kv_idx):
    return q_idx >= kv_idx


def packing(B: int, L: int, mean_doc: int, g: torch.Generator) -> torch.Tensor:
    """[B, L] int32 document ids: per row, documents of lengths drawn from an exponential of mean ``mean_doc``."""
    rows = []
    for _ in range(B):
        lengths, total = [], 0
        while total < L:
            n = max(1, int(torch.empty(()).exponential_(1.0 / mean_doc, generator=g)))
            lengths.append(min(n, L - total))
            total += lengths[-1]
        rows.append(torch.repeat_interleave(torch.arange(len(lengths), dtype=torch.int32), torch.tensor(lengths)))
    return torch.stack(rows)


class Block(nn.Module):
    def __init__(self, hidden: int, H: int, Hkv: int, D: int, ffn: int, attn: str, ids: torch.Tensor):
        super().__init__()
        self.D, self.attn, self.ids = D, attn, ids
        self.n1, self.n2 = nn.RMSNorm(hidden), nn.RMSNorm(hidden)
        self.q = nn.Linear(hidden, H * D, bias=False)
        self.k = nn.Linear(hidden, Hkv * D, bias=False)
        self.v = nn.Linear(hidden, Hkv * D, bias=False)
        self.o = nn.Linear(H * D, hidden, bias=False)
        self.gate = nn.Linear(hidden, ffn, bias=False)
        self.up = nn.Linear(hidden, ffn, bias=False)
        self.down = nn.Linear(ffn, hidden, bias=False)

    def forward(self, x, cos, sin, block_mask):
        B, L, D = x.shape[0], x.shape[1], self.D
        h = self.n1(x)
        # -1 heads: under tensor parallelism each rank holds its share of the heads
        q = self.q(h).view(B, L, -1, D).transpose(1, 2)
        k = self.k(h).view(B, L, -1, D).transpose(1, 2)
        v = self.v(h).view(B, L, -1, D).transpose(1, 2)
        q, k = _rotary(q, cos, sin), _rotary(k, cos, sin)
        if self.attn == "sdpa":
            a = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        else:
            a = flex_attention(q, k, v, block_mask=block_mask, enable_gqa=True)
        x = x + self.o(a.transpose(1, 2).reshape(B, L, -1))
        return x + self.down(F.silu(self.gate(self.n2(x))) * self.up(self.n2(x)))


def _rotary(x, cos, sin):
    x1, x2 = x.chunk(2, dim=-1)
    return x * cos + torch.cat((-x2, x1), dim=-1) * sin


class Model(nn.Module):
    def __init__(self, layers: int, hidden: int, H: int, Hkv: int, D: int, ffn: int, L: int, attn: str,
                 ids: torch.Tensor):
        super().__init__()
        self.blocks = nn.ModuleList(Block(hidden, H, Hkv, D, ffn, attn, ids) for _ in range(layers))
        t = torch.arange(L, dtype=torch.float32)[:, None] / (10000 ** (torch.arange(D // 2) / (D // 2)))
        self.register_buffer("cos", torch.cat((t, t), -1).cos(), persistent=False)
        self.register_buffer("sin", torch.cat((t, t), -1).sin(), persistent=False)

    def forward(self, x, block_mask):
        cos, sin = self.cos.to(x.dtype), self.sin.to(x.dtype)
        for blk in self.blocks:
            x = blk(x, cos, sin, block_mask)
        return x


def build(a, column: str, mesh, device: str, ids: torch.Tensor):
    """One column's model, parallelized and compiled, and its optimizer."""
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    import te_compile

    H, Hkv = a.hidden // a.head_dim, max(1, a.hidden // a.head_dim // 4)
    torch.manual_seed(0)
    model = Model(a.layers, a.hidden, H, Hkv, a.head_dim, a.ffn, a.seq, a.attn, ids).to(device)
    n_params = sum(p.numel() for p in model.parameters())
    if a.tp > 1:
        from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module
        plan = {**{n: ColwiseParallel() for n in ("q", "k", "v", "gate", "up")},
                **{n: RowwiseParallel() for n in ("o", "down")}}
        for blk in model.blocks:
            parallelize_module(blk, mesh["tp"], plan)
    if a.smoke:
        inner = dict(inner="aot_eager", target="reference")
        backend = "aot_eager" if column != "te_compile" else te_compile.backend(**inner)
    else:
        backend = "inductor" if column != "te_compile" else te_compile.backend(serve=a.serve)
    mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32) if device == "cuda" else \
        MixedPrecisionPolicy()
    for i, blk in enumerate(model.blocks):
        # the compiled block is what FSDP2 wraps: its all-gathers stay outside the compiled code (no graph break)
        model.blocks[i] = torch.compile(blk, backend=backend)
        fully_shard(model.blocks[i], mesh=mesh["dp"], mp_policy=mp)
    fully_shard(model, mesh=mesh["dp"], mp_policy=mp)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, foreach=True)
    return model, opt, n_params


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--attn", default="flex", choices=("flex", "flex-docs", "sdpa"))
    p.add_argument("--tp", type=int, default=1, help="tensor-parallel degree (divides the GPUs and the KV heads)")
    p.add_argument("--layers", type=int, default=16)
    p.add_argument("--hidden", type=int, default=2048)
    p.add_argument("--head-dim", type=int, default=128)
    p.add_argument("--ffn", type=int, default=8192)
    p.add_argument("--seq", type=int, default=8192)
    p.add_argument("--batch", type=int, default=1, help="sequences per data-parallel rank")
    p.add_argument("--mean-doc", type=int, default=1024)
    p.add_argument("--serve", default="fastest", help="te_compile's serve policy")
    p.add_argument("--check-steps", type=int, default=3)
    p.add_argument("--iters", type=int, default=10)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--smoke", action="store_true", help="CPU (gloo), tiny dims, one round: checks the script")
    p.add_argument("--json", default="")
    a = p.parse_args(argv)
    if a.smoke:
        a.layers, a.hidden, a.head_dim, a.ffn, a.seq, a.mean_doc, a.iters, a.rounds, a.check_steps = \
            2, 64, 8, 128, 64, 16, 2, 1, 2
    device = "cpu" if a.smoke or not torch.cuda.is_available() else "cuda"
    if device == "cpu" and a.attn != "sdpa":
        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        from convergence import _cpu_flex_with_grad
        with _cpu_flex_with_grad(True):  # flex refuses CPU inputs that need grad; its math path is fine
            return _run(a, device)
    return _run(a, device)


def _run(a, device: str) -> int:
    dist.init_process_group("gloo" if device == "cpu" else "nccl")
    rank, world = dist.get_rank(), dist.get_world_size()
    if device == "cuda":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", rank)))
    hkv = max(1, a.hidden // a.head_dim // 4)
    if world % a.tp or hkv % a.tp:
        raise SystemExit(f"--tp {a.tp} must divide the {world} processes and the {hkv} KV heads")
    from torch.distributed.device_mesh import init_device_mesh
    mesh = init_device_mesh(device, (world // a.tp, a.tp), mesh_dim_names=("dp", "tp"))
    dp_rank = mesh["dp"].get_local_rank()
    B, L = a.batch, a.seq
    dtype = torch.bfloat16 if device == "cuda" else torch.float32

    ids = torch.zeros(B, L, dtype=torch.int32, device=device)
    g = torch.Generator().manual_seed(1000 + dp_rank)  # each data-parallel rank its own packings, equal per column
    pool = [packing(B, L, a.mean_doc, g) for _ in range(8)]
    data_g = torch.Generator(device=device).manual_seed(dp_rank)
    xs = [torch.randn(B, L, a.hidden, device=device, generator=data_g) for _ in range(4)]
    target = torch.randn(B, L, a.hidden, device=device, generator=data_g)

    def mask_mod(b, h, q, kv):
        return (ids[b, q] == ids[b, kv]) & (q >= kv)
    fixed_mask = create_block_mask(_causal, None, None, L, L, device=device) if a.attn == "flex" else None

    def step(model, opt, i: int) -> torch.Tensor:
        bm = fixed_mask
        if a.attn == "flex-docs":
            ids.copy_(pool[i % len(pool)], non_blocking=True)
            bm = create_block_mask(mask_mod, B, None, L, L, device=device)
        with torch.autocast(device, dtype=dtype, enabled=device == "cuda"):
            out = model(xs[i % len(xs)], bm)
        loss = F.mse_loss(out.float(), target)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss.detach()

    from te_compile.report import Report, record_reports
    cols, row = {}, {"attn": a.attn, "world": world, "tp": a.tp, "dp": world // a.tp, "batch_per_dp_rank": B,
                     "seq": L, "layers": a.layers, "hidden": a.hidden, "head_dim": a.head_dim, "ffn": a.ffn}
    for name in COLUMNS:
        model, opt, row["params"] = build(a, name, mesh, device, ids)
        t0 = time.perf_counter()
        with record_reports() as reports:
            losses = [float(step(model, opt, i)) for i in range(a.check_steps)]
        row[f"first_steps_s_{name}"] = round(time.perf_counter() - t0, 2)
        row[f"losses_{name}"] = losses
        if name == "te_compile":
            row["sites"] = sorted({(d.runs_on, str(d.reason or d.note)[:200]) for d in Report(list(reports)).decisions})
        cols[name] = (model, opt)
    ref = row["losses_torch.compile"]
    for name in COLUMNS[1:]:
        row[f"loss_rel_diff_{name}"] = max(abs(x - y) / max(abs(y), 1e-6) for x, y in zip(row[f"losses_{name}"], ref))

    def timed(name: str) -> float:
        model, opt = cols[name]
        for i in range(2):
            step(model, opt, i)
        if device == "cuda":
            torch.cuda.synchronize()
        dist.barrier()
        t0 = time.perf_counter()
        for i in range(a.iters):
            step(model, opt, i)
        if device == "cuda":
            torch.cuda.synchronize()
        ms = torch.tensor((time.perf_counter() - t0) * 1e3 / a.iters)
        dist.all_reduce(ms, op=dist.ReduceOp.MAX)  # a step ends when its slowest rank does
        return float(ms)

    rounds: dict = {n: [] for n in COLUMNS}
    memory: dict = {}
    for r in range(a.rounds):
        for name in COLUMNS[r % len(COLUMNS):] + COLUMNS[:r % len(COLUMNS)]:
            if device == "cuda":
                torch.cuda.reset_peak_memory_stats()
            rounds[name].append(round(timed(name), 3))
            if device == "cuda":
                peak = torch.tensor(torch.cuda.max_memory_allocated() / 2 ** 30)
                dist.all_reduce(peak, op=dist.ReduceOp.MAX)
                memory[name] = max(memory.get(name, 0.0), round(float(peak), 2))
        if rank == 0:
            print(f"round {r + 1}: " + ", ".join(f"{n} {min(t):.2f} ms" for n, t in rounds.items()), flush=True)
    tokens_per_gpu = B * L * (world // a.tp) / world
    row["columns"] = {n: {"step_ms": min(t), "rounds_ms": t, "tokens_per_s_per_gpu": tokens_per_gpu / min(t) * 1e3,
                          "peak_memory_gib": memory.get(n)} for n, t in rounds.items()}
    tc = row["columns"]["torch.compile"]["step_ms"]
    for n in COLUMNS[1:]:
        row[f"ratio_{n}"] = tc / row["columns"][n]["step_ms"]  # > 1: faster than torch.compile
    if rank == 0:
        for n, c in row["columns"].items():
            print(f"{n:14s} {c['step_ms']:9.2f} ms/step  {c['tokens_per_s_per_gpu']:10.0f} tok/s/GPU  "
                  f"peak {c['peak_memory_gib']} GiB  losses {row['losses_' + n]}", flush=True)
        if a.json:
            head = {"date": datetime.date.today().isoformat(), "command": " ".join(["bench/distributed.py"] + sys.argv[1:]),
                    "device": torch.cuda.get_device_name() if device == "cuda" else "cpu", "torch": torch.__version__,
                    "cudnn": torch.backends.cudnn.version() if device == "cuda" else None}
            with open(a.json, "w") as f:
                json.dump({**head, "rows": [row]}, f, indent=1)
    dist.barrier()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
