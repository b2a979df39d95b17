"""Differential fuzzer: te_compile against eager PyTorch, on random and peer score_mods / mask_mods.

Each case is a flex_attention (or SDPA) call written as Python source: a random score_mod /
mask_mod drawn from everything te_compile claims to translate (te_compile's op table, index
arithmetic, captured tensors indexed by b / h / q_idx / kv_idx, learned or frozen, where /
comparisons / logical ops, casts), or one of PyTorch's and attention-gym's own (``peers.py``),
on a random shape (lengths that are not multiples of the tile, L != S, GQA, Dv != D, K/V batch 1,
custom scale, non-contiguous inputs, block sizes), with or without return_lse (lse in the loss)
and gradients. The case runs compiled with te_compile and in eager, and every output and gradient
(q, k, v, learned captured tensors) is compared:

* CPU: te_compile's reference target in float64 against eager float64 (``--cpu-dtype bfloat16``: in bfloat16
  against eager float32, with the CUDA tolerance);
* CUDA: te_compile (cuDNN) in bfloat16 against eager float32, tolerance
  ``max(3 x eager-bf16 error, 1e-2)`` per tensor (errors relative to the tensor's largest value), at most
  ``BF16_CAP`` (0.1): a tensor that would need more (eager's own bfloat16 error above 0.033) is not judged in
  bfloat16, and the summary counts those cases.

Outcomes: ``pass`` (served and equal), ``kept`` (te_compile kept the node: fine), ``wrong``
(served and beyond tolerance, or non-finite where eager is finite), ``crash`` (te_compile raised),
``invalid`` (eager itself raised or is not finite, or every tensor is too ill-conditioned in bfloat16 to judge:
the case says nothing). Every failure prints a
standalone reproducer; the run ends with one summary line.

    python -m tools.fuzz --cases 300 --seed 0            # CPU, reference target
    python -m tools.fuzz --device cuda --cases 500 --jobs 8
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import random
import re
import shlex
import shutil
import subprocess
import sys
import textwrap
import time
import traceback
from typing import Any, Optional

import torch


# --------------------------------------------------------------------------- cases


@dataclasses.dataclass
class Case:
    seed: int
    kind: str = "flex"  # "flex" | "sdpa" | "sdpa_chain" | "flex_chain"
    score: Optional[str] = None  # source of `def score_mod(score, b, h, q_idx, kv_idx)`
    mask: Optional[str] = None  # source of `def mask_mod(b, h, q_idx, kv_idx)`
    captured: list = dataclasses.field(default_factory=list)  # [Captured as a dict]
    B: int = 2
    H: int = 2
    HKV: int = 2
    L: int = 16
    S: int = 16
    D: int = 8
    DV: int = 8
    scale: Optional[float] = None
    return_lse: bool = False
    lse_loss: bool = False
    block: int = 128
    no_grad: bool = False
    kv_batch1: bool = False
    noncontig: bool = False
    # SDPA only
    is_causal: bool = False
    attn_mask: str = ""  # "" | "bool" | "float" | "float_learned"
    autocast: bool = False
    peer: str = ""

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), sort_keys=True)

    @staticmethod
    def from_json(s: str) -> "Case":
        d = json.loads(s)
        return Case(**d)

    def describe(self) -> str:
        what = self.peer or self.kind
        shape = f"B{self.B} H{self.H}/{self.HKV} L{self.L} S{self.S} D{self.D}/{self.DV}"
        flags = [f for f, on in (("lse_loss", self.lse_loss), ("lse", self.return_lse and not self.lse_loss),
                                 ("no_grad", self.no_grad), ("kv_b1", self.kv_batch1),
                                 ("noncontig", self.noncontig), ("causal", self.is_causal),
                                 ("autocast", self.autocast)) if on]
        if self.attn_mask:
            flags.append("mask=" + self.attn_mask)
        if self.scale is not None:
            flags.append(f"scale={self.scale:g}")
        if self.block != 128:
            flags.append(f"block={self.block}")
        return f"seed {self.seed} {what} {shape} {' '.join(flags)}".strip()


# --------------------------------------------------------------------------- random score_mods / mask_mods


class _Gen:
    """Random Python expressions over the score_mod / mask_mod arguments, with the captured tensors
    they read."""

    def __init__(self, rng: random.Random, case: Case):
        self.r = rng
        self.c = case
        self.captured: list[dict] = []

    def cap(self, shape: tuple, make: str = "randn", dtype: str = "float32", learned: bool = False) -> str:
        name = f"T{len(self.captured)}"
        self.captured.append({"name": name, "shape": list(shape), "make": make, "dtype": dtype, "learned": learned})
        return name

    # -- integers (index arithmetic)
    def idx(self, depth: int, mask: bool = False) -> str:
        r = self.r
        leaves = ["q_idx", "kv_idx", "q_idx", "kv_idx", "b", "h", str(r.randint(0, 9))]
        if depth <= 0 or r.random() < 0.35:
            return r.choice(leaves)
        k = r.randrange(9)
        a = self.idx(depth - 1, mask)
        if k < 3:
            return f"({a} {r.choice(['+', '-', '*'])} {self.idx(depth - 1, mask)})"
        if k == 3:
            return f"({a} // {r.randint(1, 8)})"
        if k == 4:
            return f"({a} % {r.randint(1, 8)})"
        if k == 5:  # (one operand is always a tensor: torch.minimum takes no Python ints)
            return f"torch.{r.choice(['minimum', 'maximum'])}({a}, {r.choice(['q_idx', 'kv_idx', 'h'])} + {self.idx(depth - 1, mask)})"
        if k == 6:
            return f"torch.abs({a})"
        if k == 7:  # a captured int tensor indexed by b or h (offsets, lengths)
            by = "b" if r.random() < 0.6 else "h"
            t = self.cap((by.upper(),), "randint:0:8", "int64")
            return f"{t}[{by}]"
        return f"({a} - {self.idx(depth - 1, mask)})"

    def cond(self, depth: int, with_score: bool) -> str:
        r = self.r
        k = r.randrange(10)
        if with_score and k < 3:
            return f"(score {r.choice(['>', '<', '>=', '<='])} {r.choice(['0.0', '0.5', '-0.25', '1.0'])})"
        if depth > 0 and k == 3:
            return f"({self.cond(depth - 1, with_score)} {r.choice(['&', '|'])} {self.cond(depth - 1, with_score)})"
        if depth > 0 and k == 4:
            return f"~{self.cond(depth - 1, with_score)}"
        if k == 5:  # a length / window per batch element or head
            t = self.cap(("B",), f"randint:1:{max(2, self.c.S + 1)}", "int64")
            return f"(kv_idx < {t}[b])"
        if k == 6:
            return f"(q_idx - kv_idx {r.choice(['<=', '<', '>=', '>'])} {r.randint(-4, 12)})"
        if k == 7 and with_score and depth > 0:
            t = self.cap(("B",), "randn")
            return f"(score <= {t}[b])"
        return f"({self.idx(1)} {r.choice(['>=', '<=', '>', '<', '==', '!='])} {self.idx(1)})"

    # -- the score_mod body (a float expression that reads score)
    def fexpr(self, depth: int) -> str:
        r = self.r
        if depth <= 0:
            return r.choice(["score", "score", f"(score * {r.choice(['0.5', '2', '1.5', '-1.0'])})"])
        k = r.randrange(22)
        a = self.fexpr(depth - 1)
        if k < 3:
            return f"({a} {r.choice(['+', '-', '*'])} {self.term(depth - 1)})"
        if k == 3:
            return f"({a} / {r.choice(['2.0', '3', '-4.0', '0.7'])})"
        if k == 4:
            return f"({r.choice(['1', '2.0', '-0.5'])} {r.choice(['-', '+', '*'])} {a})"
        if k == 5:
            c = r.choice(["5.0", "20.0", "30.0", "2.0"])
            return f"({c} * torch.tanh({a} / {c}))"
        if k == 6:
            return f"torch.{r.choice(['tanh', 'sigmoid', 'sin', 'cos', 'abs', 'neg'])}({a})"
        if k == 7:
            return f"torch.exp({a} / 8.0)" if r.random() < 0.5 else f"torch.exp2(torch.clamp({a}, max=4.0))"
        if k == 8:
            return f"torch.log(torch.abs({a}) + 1.0)" if r.random() < 0.7 else f"torch.log({a})"
        if k == 9:
            return f"torch.sqrt(torch.abs({a}) + 0.5)" if r.random() < 0.7 else f"torch.rsqrt(torch.abs({a}) + 1.0)"
        if k == 10:
            return f"torch.where({self.cond(depth - 1, True)}, {a}, {r.choice([self.fexpr(depth - 1), self.term(0), '0.0', '-1.0'])})"
        if k == 11:
            return f"torch.clamp({a}, {r.choice(['min=-2.0', 'max=1.5', 'min=-1.0, max=1.0'])})"
        if k == 12:
            return f"({a} ** {r.choice(['2', '3', '0.5', '2.0'])})"  # (no negative powers: singular at 0)
        if k == 13:
            return f"torch.{r.choice(['minimum', 'maximum'])}({a}, {self.fexpr(depth - 1)})"
        if k == 14:  # bool / int arithmetic mixed into the score
            return f"({a} {r.choice(['+', '-'])} {self.cond(0, False)} * {r.choice(['1', '2', '0.5'])})"
        if k == 15:
            return f"({a} + {r.choice(['(score > 0)', '(score > 0).float()', 'score.to(torch.int32)'])})"
        if k == 16:
            return f"torch.remainder({a}, {r.choice(['1.0', '3.0'])})"
        if k == 17:
            return f"({a}).float()" if r.random() < 0.5 else f"({a}).to(torch.float32)"
        if k == 18:
            return f"torch.abs({a}) ** {r.choice(['0.5', '1.5'])}"
        return f"({a} + {self.term(depth - 1)})"

    def term(self, depth: int) -> str:
        """A score-free term: index arithmetic, constants, captured tensors."""
        r = self.r
        k = r.randrange(12)
        if k < 2:
            return f"({self.idx(depth)} * {r.choice(['0.1', '-0.05', '1', '0.25'])})"
        if k == 2:
            return r.choice(["0.5", "1.0", "-2.0", "3"])
        if k == 3:
            t = self.cap(("H",), "rand")
            return f"{t}[h]"
        if k == 4:
            t = self.cap(("B", "H"), "randn")
            return f"{t}[b, h]"
        if k == 5:  # ALiBi-style
            t = self.cap(("H",), "rand")
            return f"{t}[h] * (kv_idx - q_idx)"
        if k == 6:  # a learned or frozen additive table gathered by q/kv (materialized bias), maybe chained
            t = self.cap(("L", "S"), "randn", learned=r.random() < 0.5)
            return f"{t}[q_idx][kv_idx]" if r.random() < 0.3 else f"{t}[q_idx, kv_idx]"
        if k == 7:
            t = self.cap(("H", "L+S-1"), "randn", learned=r.random() < 0.5)
            return f"{t}[h, q_idx - kv_idx + {self.c.S - 1}]"
        if k == 8:
            t = self.cap(("L",), "randn")
            return f"{t}[q_idx]"
        if k == 9:  # chained indexing
            t = self.cap(("B", "L"), "randn")
            return f"{t}[b][q_idx]"
        if k == 10:
            return f"({self.cond(0, False)} * {r.choice(['1', '2', '0.5'])})"
        return f"({self.idx(depth)} {r.choice(['+', '-'])} {self.idx(depth)}) * 0.1"

    def mask_body(self, depth: int) -> str:
        r = self.r
        k = r.randrange(8)
        if k == 0:
            return "q_idx >= kv_idx"
        if k == 1:
            w = r.randint(1, 20)
            return f"(q_idx >= kv_idx) & (q_idx - kv_idx {r.choice(['<=', '<'])} {w})"
        if k == 2:
            return f"q_idx + {r.randint(-5, 40)} >= kv_idx"
        if k == 3:
            t = self.cap(("S",), "doc", "int64")
            t2 = self.cap(("L",), "doc", "int64")
            return f"{t2}[q_idx] == {t}[kv_idx]"
        return self.cond(depth, False)


def _source(kind: str, body: str) -> str:
    if kind == "score":
        return f"def score_mod(score, b, h, q_idx, kv_idx):\n    return {body}\n"
    return f"def mask_mod(b, h, q_idx, kv_idx):\n    return {body}\n"


_CPU_LENGTHS = (1, 5, 16, 17, 24, 33, 40)
_CUDA_LENGTHS = (64, 100, 128, 129, 200, 255, 256, 300)


def make_case(seed: int, device: str, peer: Optional[Any] = None) -> Case:
    """The case of ``seed``: a random (or the given peer's) score_mod / mask_mod on a random shape."""
    r = random.Random(seed * 7919 + (0 if peer is None else 1))
    cuda = device == "cuda"
    lengths = _CUDA_LENGTHS if cuda else _CPU_LENGTHS
    H = r.choice((1, 2, 4)) if not cuda else r.choice((2, 4))
    D = r.choice((8, 16)) if not cuda else r.choice((64, 64, 128))
    c = Case(seed=seed, B=r.choice((1, 2)), H=H, L=r.choice(lengths), D=D)
    c.S = c.L if r.random() < 0.5 else r.choice(lengths)
    c.HKV = H if r.random() < 0.7 else r.choice([h for h in (1, 2) if H % h == 0])
    c.DV = c.D if r.random() < 0.8 else (c.D * 2 if not cuda else 64 if c.D == 128 else 128)
    c.scale = None if r.random() < 0.7 else r.choice((0.1, 0.3, 1.0, -0.3))
    c.return_lse = r.random() < 0.4
    c.lse_loss = c.return_lse and r.random() < 0.5
    c.no_grad = r.random() < 0.1
    c.kv_batch1 = c.B > 1 and r.random() < 0.08
    c.noncontig = r.random() < 0.15
    c.block = 128 if r.random() < 0.6 else r.choice((16, 32, 64) if not cuda else (64, 128, 256))
    if peer is not None:
        c.peer = peer.name
        c.captured = [dataclasses.asdict(x) for x in peer.captured]
        if peer.kind == "score":
            c.score = peer.code
            c.mask = None if r.random() < 0.5 else _source("mask", "q_idx >= kv_idx")
        else:
            c.mask = peer.code
        return c
    k = r.random()
    if k < 0.07:
        return _sdpa_case(c, r, cuda)
    if k < 0.09:
        c.kind = r.choice(("sdpa_chain", "flex_chain"))
        c.DV = c.D
        c.HKV = c.H
        c.S = c.L
        return c
    if k < 0.12:  # ALiBi + causal with cuDNN's own slopes (computed from h): cuDNN's built-in ALiBi when L == S
        c.S = c.L if r.random() < 0.8 else c.S
        c.score = _source("score", f"score + torch.exp2(-((h + 1) * 8.0 / {c.H})) * (kv_idx - q_idx)")
        c.mask = _source("mask", "q_idx >= kv_idx")
        return c
    if r.random() < 0.12:
        return _interval_case(c, r)
    g = _Gen(r, c)
    if r.random() < 0.85:
        c.score = _source("score", g.fexpr(r.randint(1, 3)) if r.random() < 0.8 else g.term(1) + " + score")
    if r.random() < 0.55 or c.score is None:
        c.mask = _source("mask", g.mask_body(2))
    c.captured = list(g.captured)
    return c


def _interval_case(c: Case, r: random.Random) -> Case:
    """A mask_mod of key intervals and no score_mod (cuDNN's interval kernels on a GPU): packed documents (runs of
    ids per row, a different packing per row, length-1 documents, one document; sometimes ids that are not runs),
    prefix-LM, sink + local, padding by length (rows that see no key), global tokens, Hugging Face's packed sequences
    (the cache position, a 0-dim tensor, added to q_idx), and compositions of them."""
    c.S = c.L
    g = _Gen(r, c)

    def atom() -> str:
        k = r.randrange(8)
        if k == 0:
            t = g.cap(("B", "L"), "scatter" if r.random() < 0.1 else "packing", "int64")
            return f"({t}[b, q_idx] == {t}[b, kv_idx])"
        if k == 1:
            t = g.cap(("L",), "packing", "int64")
            return f"({t}[q_idx] == {t}[kv_idx])"
        if k == 2:
            return f"((kv_idx < {r.randint(0, c.L)}) | (q_idx >= kv_idx))"
        if k == 3:
            return f"((q_idx >= kv_idx) & ((kv_idx < {r.randint(1, 4)}) | (q_idx - kv_idx <= {r.randint(0, 20)})))"
        if k == 4:
            t = g.cap(("B",), f"randint:0:{c.L + 1}", "int64")
            return f"((kv_idx < {t}[b]) & (q_idx < {t}[b]))"
        if k == 5:
            n = r.randint(1, 3)
            return f"((kv_idx < {n}) | (q_idx < {n}) | (q_idx - kv_idx <= {r.randint(0, 9)}))"
        if k == 6:
            t, off = g.cap(("B", "L"), "packing", "int64"), g.cap((), "randint:0:1", "int64")
            return f"((kv_idx <= q_idx + {off}) & ({t}[b, q_idx + {off}] == {t}[b, kv_idx]))"
        return "(q_idx >= kv_idx)"

    body = atom()
    for _ in range(r.choice((0, 0, 1, 2))):
        op = r.choice(("&", "|", "& ~"))
        body = f"({body} {op} {atom()})"
    c.mask = _source("mask", body)
    c.captured = list(g.captured)
    return c


def _sdpa_case(c: Case, r: random.Random, cuda: bool) -> Case:
    c.kind = "sdpa"
    c.return_lse = c.lse_loss = False
    c.DV = c.D if r.random() < 0.8 else c.DV
    c.is_causal = r.random() < 0.4
    c.attn_mask = "" if c.is_causal or r.random() < 0.4 else r.choice(("bool", "float", "float_learned"))
    c.autocast = r.random() < 0.2
    return c


# --------------------------------------------------------------------------- running one case


def _sym(x: Any, c: Case) -> int:
    if isinstance(x, int):
        return x
    return int(eval(str(x), {}, {"B": c.B, "H": c.H, "HKV": c.HKV, "L": c.L, "S": c.S}))  # noqa: S307


def _make_tensor(cap: dict, c: Case, g: torch.Generator) -> torch.Tensor:
    shape = tuple(max(1, _sym(s, c)) for s in cap["shape"])
    make, dtype = cap["make"], getattr(torch, cap.get("dtype", "float32"))
    if make == "randn":
        t = torch.randn(shape, generator=g)
    elif make == "rand":
        t = torch.rand(shape, generator=g)
    elif make.startswith("randint"):
        _, lo, hi = make.split(":")
        lo, hi = _sym(lo, c), _sym(hi, c)
        t = torch.randint(lo, max(hi, lo + 1), shape, generator=g)
    elif make == "doc":
        n = shape[-1]
        cuts = sorted(torch.randint(0, max(n, 1), (3,), generator=g).tolist())
        ids = torch.zeros(n, dtype=torch.int64)
        for cut in cuts:
            ids[cut:] += 1
        t = ids.expand(shape).clone()
    elif make in ("packing", "scatter"):  # document ids per row: contiguous runs (packing) or not (scatter)
        n = shape[-1]
        rows = []
        for _ in range(math.prod(shape[:-1])):
            if make == "scatter":
                rows.append(torch.randint(0, 3, (n,), generator=g))
                continue
            docs = int(torch.randint(1, n + 1, (1,), generator=g)) if torch.rand((), generator=g) < 0.7 else 1
            cuts = torch.randperm(max(n - 1, 0), generator=g)[: docs - 1].add(1).sort().values
            ids = torch.zeros(n, dtype=torch.int64)
            for cut in cuts.tolist():
                ids[cut:] += 1
            rows.append(ids + int(torch.randint(0, 5, (1,), generator=g)))
        t = torch.stack(rows).view(shape) if rows else torch.zeros(shape, dtype=torch.int64)
    elif make == "arange":
        t = torch.arange(shape[-1]).expand(shape).clone()
    elif make == "bool":
        t = torch.rand(shape, generator=g) < 0.7
    else:
        raise ValueError(f"unknown make {make!r}")
    return t.to(dtype)


def eager_source(src: str, learned: list[str]) -> str:
    """``src`` as the eager reference runs it: ``T[a][b]`` of a learned table ``T`` reads ``T[a, b]``.

    The two are the same function, but eager flex_attention's gradient for the chained spelling of a
    table that needs a gradient is wrong (torch 2.11 CUDA and 2.13 CPU: every row of dT gets the sum over
    rows; rel. error 15.7 against float64 math, where te_compile's is 3e-7), and Inductor refuses it."""
    for name in learned:
        src = re.sub(rf"\b{re.escape(name)}\[([^\[\]]+)\]\[([^\[\]]+)\]", rf"{name}[\1, \2]", src)
    return src


def build(c: Case, device: str, dtype: torch.dtype, eager: bool = False) -> tuple[dict, list, list]:
    """(namespace with torch, math, the captured tensors, score_mod, mask_mod; learned tensors;
    [q, k, v]). ``eager``: the sources as the eager reference runs them (``eager_source``)."""
    g = torch.Generator().manual_seed(c.seed)
    ns: dict = {"torch": torch, "math": math}
    learned = []
    for cap in c.captured:
        t = _make_tensor(cap, c, g).to(device)
        if t.is_floating_point():
            t = t.to(torch.float64 if dtype == torch.float64 else torch.float32)
            if cap.get("learned"):
                t.requires_grad_(True)
                learned.append(t)
        ns[cap["name"]] = t
    learned_names = [cap["name"] for cap in c.captured if cap.get("learned")]
    for src in (c.score, c.mask):
        if src:
            src = eager_source(src, learned_names) if eager else src
            exec(compile(src, "<fuzz case>", "exec"), ns)  # noqa: S102
    B, kvB = c.B, (1 if c.kv_batch1 else c.B)
    dims = ((B, c.H, c.L, c.D), (kvB, c.HKV, c.S, c.D), (kvB, c.HKV, c.S, c.DV))
    qkv = []
    for shape in dims:
        t = torch.randn(shape, generator=g, dtype=torch.float64)
        if c.noncontig:
            t = t.transpose(1, 2).contiguous().transpose(1, 2)
        t = t.to(device=device, dtype=dtype)
        qkv.append(t)
    return ns, learned, qkv


def _attention_fn(c: Case, ns: dict, device: str, dtype: torch.dtype):
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention
    import torch.nn.functional as F

    gqa = c.H != c.HKV
    if c.kind in ("sdpa", "sdpa_chain"):
        g = torch.Generator().manual_seed(c.seed + 1)
        mask = None
        if c.attn_mask == "bool":
            mask = (torch.rand(c.L, c.S, generator=g) < 0.8).to(device)
        elif c.attn_mask.startswith("float"):
            mask = torch.randn(1, c.H, c.L, c.S, generator=g).to(device=device, dtype=dtype)
            if c.autocast:
                mask = mask.float()
            if c.attn_mask == "float_learned":
                mask.requires_grad_(True)
        extra = [mask] if mask is not None and mask.requires_grad else []

        def attn(q, k, v):
            if c.kind == "sdpa_chain":
                o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
                return F.scaled_dot_product_attention(o, k, v), None
            return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=c.is_causal, scale=c.scale,
                                                  enable_gqa=gqa), None
        return attn, extra
    bm = None
    if c.mask:
        bm = create_block_mask(ns["mask_mod"], c.B, c.H, c.L, c.S, device=device, BLOCK_SIZE=c.block)
    score_mod = ns.get("score_mod") if c.score else None

    def attn(q, k, v):
        if c.kind == "flex_chain":
            o = flex_attention(q, k, v, block_mask=bm)
            return flex_attention(o, k, v), None
        r = flex_attention(q, k, v, score_mod=score_mod, block_mask=bm, scale=c.scale, enable_gqa=gqa,
                           return_lse=c.return_lse)
        return r if c.return_lse else (r, None)
    return attn, []


def run(c: Case, device: str, dtype: torch.dtype, compiled_with: Optional[Any] = None) -> dict:
    """Run the case once; returns {"out", "lse", "grads": [...]} (detached) and, when compiled,
    the te_compile decisions."""
    ns, learned, qkv = build(c, device, dtype, eager=compiled_with is None)
    attn, extra = _attention_fn(c, ns, device, dtype)
    fn = attn if compiled_with is None else torch.compile(attn, backend=compiled_with, fullgraph=False)
    leaves = [t.detach().requires_grad_(not c.no_grad) for t in qkv]
    params = leaves + learned + extra
    ctx = torch.no_grad() if c.no_grad else _null()
    if c.autocast:
        ac = torch.autocast(device_type=device, dtype=torch.bfloat16)
    else:
        ac = _null()
    from te_compile.report import record_reports

    # compiled on CUDA the case runs four times and the last run is compared: a signature's first call builds its
    # runner in Python, later calls run on the native call path (te_compile.cudnn.native) where it is on: the
    # second executes, the third captures a CUDA graph for its pointers, the fourth replays it (each run frees
    # the last one's tensors first, so the caching allocator hands out the same blocks)
    reports: list = []
    for _ in range(4 if compiled_with is not None and device == "cuda" else 1):
        res = out = lse = loss = grads = None  # noqa: F841 - frees the previous run's tensors
        with record_reports() as compiled_now, ctx, ac:
            out, lse = fn(*leaves)
        reports += compiled_now
        res: dict = {"out": out.detach(), "lse": None if lse is None else lse.detach(), "grads": [],
                     "reports": reports}
        if c.no_grad:
            continue
        g = torch.Generator().manual_seed(c.seed + 2)
        loss = (out.float() * torch.randn(out.shape, generator=g).to(out.device)).sum()
        if c.lse_loss and lse is not None:
            loss = loss + (lse.float() * torch.randn(lse.shape, generator=g).to(lse.device)).sum()
        need = [p for p in params if p.requires_grad]
        grads = torch.autograd.grad(loss, need, allow_unused=True)
        res["grads"] = [None if x is None else x.detach() for x in grads]
    return res


class _null:
    def __enter__(self):
        return None

    def __exit__(self, *a):
        return False


def _err(got: Optional[torch.Tensor], want: Optional[torch.Tensor], floor: float = 1e-3) -> float:
    """Largest difference relative to want's largest finite value (at least ``floor``: a gradient that
    is all but zero, e.g. of a 1-key softmax, is compared in absolute terms); inf on a non-finite
    mismatch."""
    if got is None or want is None:
        return 0.0 if got is None and want is None else math.inf
    if got.shape != want.shape:
        return math.inf
    got, want = got.double(), want.double()
    fin = torch.isfinite(want)
    if not torch.equal(torch.isfinite(got), fin):
        return math.inf
    if not torch.equal(got[~fin], want[~fin]):  # -inf lse of fully-masked rows must agree
        return math.inf
    if not fin.any():
        return 0.0
    scale = max(want[fin].abs().max().item(), floor)
    return (got[fin] - want[fin]).abs().max().item() / scale


_NAMES = ("out", "lse")


#: the CPU run's dtype: float64 (exact, against eager float64) or bfloat16 (``--cpu-dtype bfloat16``: against eager
#: float32 with the CUDA run's tolerance, so the reference target meets the precision a bf16 bias or input has)
CPU_LOW = torch.float64


def _dtypes(c: Case, device: str) -> tuple[torch.dtype, torch.dtype]:
    """(the dtype te_compile runs in, eager's reference dtype)."""
    if c.autocast:  # float32 inputs under torch.autocast(bfloat16), both sides
        return torch.float32, torch.float32
    if device == "cuda" or CPU_LOW == torch.bfloat16:
        return torch.bfloat16, torch.float32
    return torch.float64, torch.float64


#: the last ``compare``'s errors: tensor name -> [error, tolerance, eager's own error in the low dtype or None, the
#: distance from eager's low-dtype result or None] (the JSON-lines record keeps them, so tolerances can be read from
#: the error distribution of correct results, also for the tensors too ill-conditioned to judge against float32)
last_errors: dict = {}

#: the largest tolerance of a bfloat16 comparison (relative to the tensor's largest value): a wrong answer is off by
#: more. A tensor whose tolerance would be larger (eager's own bfloat16 error above a third of it: a case
#: ill-conditioned in bfloat16) is not judged in bfloat16; the float64 run on the CPU judges the same case.
BF16_CAP = 0.1
NOT_JUDGED = "not judged in bfloat16 (ill-conditioned: eager's own bfloat16 error above BF16_CAP / 3): "


def compare(c: Case, device: str, backend: Any) -> tuple[str, str, list]:
    """(outcome, detail, decisions) for one case."""
    if c.kind == "flex_edited":  # the hand-edited BlockMask class
        from . import fuzz_blockmask
        return fuzz_blockmask.compare(c, device, backend, sys.modules[__name__])
    last_errors.clear()
    low, ref_dtype = _dtypes(c, device)
    torch._dynamo.reset()
    try:
        want = run(c, device, ref_dtype)
        if _nonfinite(want):
            return "invalid", "eager result is not finite", []
        eager_low = run(c, device, low) if low == torch.bfloat16 else None
        eager_high = _uncast_run(c) if low == torch.float64 else None
    except Exception as e:  # noqa: BLE001
        return "invalid", f"eager raised {type(e).__name__}: {str(e).splitlines()[0][:160]}", []
    try:
        got = run(c, device, low, compiled_with=backend)
    except Exception as e:  # noqa: BLE001
        detail = "".join(traceback.format_exception_only(type(e), e)).strip()[:2000]
        plain = _plain_compile_error(c, device, low, backend)
        if plain is not None and plain == type(e).__name__:
            # torch.compile with the same inner compiler and no te_compile raises the same: not te_compile's
            return "invalid", f"plain torch.compile raises too ({plain}): {detail[:300]}", []
        return "crash", detail, []
    decisions = [d for rep in got["reports"] for d in rep.decisions]
    served = any(d.rewrite for d in decisions)
    fail = "wrong" if served else "kept_mismatch"
    if device == "cpu":
        why = _emission_crash(c, decisions)
        if why:
            return "crash", why, decisions
    if len(got["grads"]) != len(want["grads"]):
        return fail, "different number of gradients", decisions
    if got["out"].dtype != want["out"].dtype and (c.autocast or low == torch.float64):
        return fail, f"output dtype {got['out'].dtype}, eager gives {want['out'].dtype}", decisions
    pairs = [("out", got["out"], want["out"]), ("lse", got["lse"], want["lse"])]
    pairs += [(f"grad{i}", a, b) for i, (a, b) in enumerate(zip(got["grads"], want["grads"]))]
    elow = None if eager_low is None else [eager_low["out"], eager_low["lse"], *eager_low["grads"]]
    ehigh = None if eager_high is None else [eager_high["out"], eager_high["lse"], *eager_high["grads"]]
    bad, unjudged = [], []
    for i, (name, a, b) in enumerate(pairs):
        # captured-tensor gradients (grad3...) are sums over every (q, kv): a per-head bias has a gradient
        # of exactly 0 (softmax rows sum to 1), so they are compared with an absolute floor of 1
        floor = 1.0 if low == torch.float64 or name.startswith("grad") and int(name[4:]) >= 3 else 1e-3
        if ehigh is not None and i < len(ehigh):
            # a mod that casts to float32 makes eager lose precision te_compile keeps (its float64 math keeps
            # the cast's value, not its rounding): compare with the same math kept in float64
            b = ehigh[i]
        e = _err(a, b, floor)
        tol = _tolerance(c, i, elow, ehigh, b, floor)
        own = _err(elow[i], b, floor) if elow is not None and i < len(elow) else None
        near = _err(a, elow[i], floor) if elow is not None and i < len(elow) else None
        last_errors[name] = [float(f"{x:.4g}") if x is not None else None for x in (e, tol, own, near)]
        if elow is not None and not c.autocast and tol > BF16_CAP:
            unjudged.append(name)
        elif not e <= tol:
            bad.append(f"{name} err {e:.3g} > tol {tol:.3g}")
    if bad:
        return fail, "; ".join(bad), decisions
    if len(unjudged) == len(pairs):
        return "invalid", NOT_JUDGED + "every tensor", decisions
    return ("pass" if served else "kept"), (NOT_JUDGED + ", ".join(unjudged) if unjudged else ""), decisions


def _tolerance(c: Case, i: int, elow: Optional[list], ehigh: Optional[list], want: torch.Tensor,
               floor: float) -> float:
    """The relative tolerance of the ``i``-th compared tensor (out, lse, then the gradients); ``elow``: eager in
    bfloat16 (CUDA, or the CPU in bfloat16), ``ehigh``: eager with the mods' float32 casts kept in float64."""
    if c.autocast:
        return 2e-2
    if elow is not None:
        base = _err(elow[i], want) if elow is not None and i < len(elow) else 0.0
        return max(3 * (base if math.isfinite(base) else 0.0), 1e-2)
    if ehigh is not None:
        # against eager with the casts kept in float64: the same math, summed in another order (an
        # ill-conditioned gradient differs there by up to ~1e-4); a wrong value or derivative is off by far more
        return 1e-4
    return 1e-6


_CASTS = (".to(torch.float32)", ".float()")


def _casts(c: Case) -> bool:
    """Does a mod of the case cast to float32?"""
    return any(x in (c.score or "") + (c.mask or "") for x in _CASTS + ("float32",))


def _uncast_run(c: Case) -> Optional[dict]:
    """Eager on the CPU in float64 with the mods' float32 casts made float64 casts (a cast of a bool still
    makes a number), or None: no cast in the mods, or that variant does not run."""
    if not _casts(c):
        return None

    def uncast(src: Optional[str]) -> Optional[str]:
        if src is None:
            return None
        for x in _CASTS:
            src = src.replace(x, ".to(torch.float64)")
        return src.replace("torch.float32", "torch.float64")
    try:
        return run(dataclasses.replace(c, score=uncast(c.score), mask=uncast(c.mask)), "cpu", torch.float64)
    except Exception:  # noqa: BLE001 - no second opinion: the plain float32 tolerance below decides
        return None


def _plain_compile_error(c: Case, device: str, dtype: torch.dtype, backend: Any) -> Optional[str]:
    """The exception type plain torch.compile (te_compile's inner compiler, no rewrite) raises on the case,
    or None when it runs."""
    inner = getattr(getattr(backend, "options", None), "inner", "aot_eager")
    torch._dynamo.reset()
    try:
        run(c, device, dtype, compiled_with=inner)
    except Exception as e:  # noqa: BLE001
        return type(e).__name__
    return None


def _emission_crash(c: Case, decisions: list) -> str:
    """On CPU: emit each served flex site's cuDNN score_mod / bprop onto a recording graph (what the
    GPU would run at graph build); an exception there is a run-time crash on CUDA."""
    try:
        from te_compile.lowering import lower as lowering
        from te_compile.cudnn import emit
    except Exception:  # noqa: BLE001 - no cuDNN frontend here: nothing to check
        return ""
    for d in decisions:
        if not (d.rewrite and d.spec is not None and d.site.kind == "flex"):
            continue
        lw = lowering.lower(dataclasses.replace(d.spec, impl="cudnn"), (c.L, c.S), heads=c.H)
        if lw.unsupported or not lw.emitted:
            continue
        try:
            emit.structure(lw)
        except Exception as e:  # noqa: BLE001
            return f"cuDNN emission raised {type(e).__name__}: {e} (spec {d.spec.describe()})"
    return ""


def emission_digest(c: Case, decisions: list) -> list:
    """Per site: the spec key and, for a flex site cuDNN would emit, a digest of the lowering record and of
    the emitted op transcript (``emit.structure``). Two runs with equal digests build identical cuDNN graphs;
    refactors compare them case by case (``--json`` carries them)."""
    import hashlib
    out = []
    for d in decisions:
        if d.spec is None:
            out.append(None)
            continue
        item = {"spec": d.spec.key()}
        if d.site.kind == "flex":
            try:
                from te_compile.lowering import lower as lowering
                from te_compile.cudnn import emit
                lw = lowering.lower(dataclasses.replace(d.spec, impl="cudnn"), (c.L, c.S), heads=c.H)
                rec = (lw.unsupported, lw.band, lw.emitted, str(lw.deriv), str(lw.guard), lw.constants,
                       None if lw.mask_first is None else (lw.mask_first.needs_min, str(lw.mask_first.deriv)),
                       lw.ninf_clamp)
                if lw.emitted and not lw.unsupported:
                    rec += (emit.structure(lw),)
                item["emission"] = hashlib.sha1(repr(rec).encode()).hexdigest()[:16]
            except Exception as e:  # noqa: BLE001 - recorded, so a refactor that changes it shows
                item["emission"] = f"raised {type(e).__name__}"
        out.append(item)
    return out


def _nonfinite(res: dict) -> bool:
    ts = [res["out"], *(g for g in res["grads"] if g is not None)]
    return any(not torch.isfinite(t).all() for t in ts)


# --------------------------------------------------------------------------- reproducers


def reproducer(c: Case, device: str) -> str:
    """A standalone script that reruns the case and prints each tensor's error."""
    target = "auto" if device == "cuda" else "reference"
    low, ref = _dtypes(c, device)
    dt, ref_dt = f"torch.{str(low).split('.')[-1]}", f"torch.{str(ref).split('.')[-1]}"
    body = f"""\
    # te_compile fuzz case: {c.describe()}
    import torch
    import torch.nn.attention.flex_attention as fa
    import te_compile
    from tools import fuzz

    fa._validate_device = lambda *a, **k: None  # eager CPU flex with grads (the math path is fine)
    case = fuzz.Case.from_json({c.to_json()!r})
    # score_mod:
    {textwrap.indent(c.score or 'None', '    # ').strip()}
    # mask_mod:
    {textwrap.indent(c.mask or 'None', '    # ').strip()}
    want = fuzz.run(case, {device!r}, {ref_dt})
    got = fuzz.run(case, {device!r}, {dt}, compiled_with=te_compile.backend(inner="aot_eager", target={target!r}, serve="always"))
    for name, a, b in [("out", got["out"], want["out"]), ("lse", got["lse"], want["lse"])] + \\
            [(f"grad{{i}}", x, y) for i, (x, y) in enumerate(zip(got["grads"], want["grads"]))]:
        print(name, fuzz._err(a, b))
    """
    return textwrap.dedent(body)


# --------------------------------------------------------------------------- driver


# Case i of a run at seed s has the case seed s * SEED_STRIDE + i, so runs at different seeds draw disjoint cases
# (seed s + i would make seeds 1 apart share all but one case) and seed 0 keeps the case seeds it always had.
SEED_STRIDE = 1_000_000
PEER_OFFSET = 100_000  # the peer list's case seeds follow the random cases'; so a run has fewer random cases
MAX_CASES = PEER_OFFSET


def cases_for(n: int, seed: int, device: str, peers: bool) -> list[Case]:
    if not 0 <= n <= MAX_CASES:
        raise ValueError(f"--cases must be between 0 and {MAX_CASES}, got {n}")
    base = seed * SEED_STRIDE
    out = [make_case(base + i, device) for i in range(n)]
    if peers:
        from .peers import PEERS
        out += [make_case(base + PEER_OFFSET + i, device, p) for i, p in enumerate(PEERS)]
    from . import fuzz_blockmask  # the hand-edited BlockMask class, after the peers
    out += fuzz_blockmask.cases(n, base, device, sys.modules[__name__])
    return out


def _prepare(device: str) -> Any:
    import te_compile

    if device == "cpu":
        import torch.nn.attention.flex_attention as fa
        fa._validate_device = lambda *a, **k: None
    torch._dynamo.config.cache_size_limit = 64
    import logging
    for name in ("te_compile", "torch._subclasses.fake_tensor", "torch._dynamo", "torch._inductor"):
        logging.getLogger(name).setLevel(logging.CRITICAL)
    import warnings
    warnings.filterwarnings("ignore")
    # serve="always": the fuzzer checks cuDNN's numbers wherever cuDNN can serve, whatever the rules say
    return te_compile.backend(inner="aot_eager", target="auto" if device == "cuda" else "reference", serve="always")


def run_cases(cases: list[Case], device: str, out=sys.stdout, verbose: bool = False, tag: str = "",
              sink: str = "") -> list[dict]:
    """Run ``cases``; with ``sink``, append each result to that JSON-lines file as it comes (so a run that is cut
    short keeps what it did). On CUDA, a crash that leaves the context unusable (an illegal memory access is
    sticky: every later CUDA call fails) ends the run with exit code ``POISONED``; ``--jobs`` starts a fresh
    worker for the rest of the shard."""
    from te_compile import counters

    backend = _prepare(device)
    results = []
    t_start = time.perf_counter()
    for n, c in enumerate(cases, 1):
        if n % 25 == 0 and len(cases) > 50:  # progress on stderr (workers of --jobs inherit it)
            bad = sum(r["outcome"] in ("wrong", "crash") for r in results)
            print(f"fuzz {tag}{n}/{len(cases)} cases, {bad} wrong or crash, {time.perf_counter() - t_start:.0f} s",
                  file=sys.stderr, flush=True)
        t0 = time.perf_counter()
        before = sum(counters.fallbacks.values())
        outcome, detail, decisions = compare(c, device, backend)
        fell_back = sum(counters.fallbacks.values()) - before
        poisoned = device == "cuda" and not _context_usable()
        if poisoned:  # a sticky CUDA error: this case left the context unusable, whatever the comparison said
            outcome, detail = "crash", f"the CUDA context was unusable after this case ({outcome}: {detail})"[:600]
        reasons = [d.reason for d in decisions if not d.rewrite]
        r = {"seed": c.seed, "peer": c.peer, "outcome": outcome, "detail": detail, "case": c.to_json(),
             "kept_reasons": reasons, "sites": emission_digest(c, decisions), "errors": dict(last_errors),
             "seconds": round(time.perf_counter() - t0, 2)}
        if fell_back:  # calls of a served site that ran the reference math (cuDNN declined the graph)
            r["reference_fallback_calls"] = fell_back
        results.append(r)
        if sink:
            with open(sink, "a") as f:
                f.write(json.dumps(r) + "\n")
        if outcome in ("wrong", "crash"):
            via = f" (reference fallback in {fell_back} call(s))" if fell_back else ""
            print(f"--- {outcome.upper()}: {c.describe()}: {detail}{via}", file=out)
            print(reproducer(c, device), file=out)
            # at once on stderr as well (where the progress goes), so a run stopped before its end still names it
            print(f"fuzz {tag}{outcome.upper()}: {c.describe()}: {detail[:300]}{via}; rerun it alone: python -m "
                  f"tools.fuzz --device {device} --case {shlex.quote(c.to_json())}", file=sys.stderr, flush=True)
        elif verbose:
            print(f"{outcome}: {c.describe()} {detail} {reasons}", file=out)
        out.flush()
        if poisoned:
            print(f"fuzz {tag}the CUDA context is unusable after this crash; ending this worker", file=sys.stderr,
                  flush=True)
            sys.exit(POISONED)
    return results


#: a worker's exit code after a crash that left the CUDA context unusable
POISONED = 3


def _context_usable() -> bool:
    try:
        torch.cuda.synchronize()
        torch.ones(1, device="cuda").add_(1).item()
        return True
    except Exception:  # noqa: BLE001 - a sticky CUDA error
        return False


def summary(results: list[dict], device: str) -> str:
    counts = {k: 0 for k in ("pass", "kept", "kept_mismatch", "wrong", "crash", "invalid")}
    for r in results:
        counts[r["outcome"]] = counts.get(r["outcome"], 0) + 1
    valid = len(results) - counts["invalid"]
    served = counts["pass"] + counts["wrong"]
    frac = served / valid if valid else 0.0
    fell_back = sum(1 for r in results if r.get("reference_fallback_calls"))
    unjudged = sum(1 for r in results if r["outcome"] in ("pass", "kept") and r.get("detail", "").startswith(NOT_JUDGED))
    return (f"fuzz {device}: {len(results)} cases, {valid} valid: {counts['pass']} pass, {counts['wrong']} wrong, "
            f"{counts['crash']} crash, {counts['kept']} kept ({counts['kept_mismatch']} kept with a mismatch "
            f"outside te_compile), {counts['invalid']} invalid; served {served}/{valid} ({100 * frac:.0f}%)"
            + (f"; {fell_back} served case(s) ran the reference fallback at run time" if fell_back else "")
            + (f"; {unjudged} case(s) with tensors too ill-conditioned in bfloat16 to judge there" if unjudged else ""))


def main(argv: Optional[list[str]] = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tools.fuzz", description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    p.add_argument("--cases", type=int, default=200, help="random cases (the peer list comes on top)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--no-peers", action="store_true", help="random cases only")
    p.add_argument("--jobs", type=int, default=1, help="worker processes (each runs a shard of the cases)")
    p.add_argument("--shard", default="0/1", help="i/n: run every n-th case starting at i (used by --jobs)")
    p.add_argument("--json", default="", help="write every result as JSON lines to this file")
    p.add_argument("--sink", default="", help=argparse.SUPPRESS)  # a worker's results, appended case by case
    p.add_argument("--resume", type=int, default=0, help=argparse.SUPPRESS)  # a worker: skip this many shard cases
    p.add_argument("--case", default="", help="run one case given as JSON (from a reproducer)")
    p.add_argument("--emit", action="append", default=[],
                   help="NAME=value: a cuDNN emission option (te_compile.lowering.lower.EmitOptions) for this "
                        "run, e.g. kv_guard=0 or const_mode=scalar")
    p.add_argument("--cpu-dtype", default="float64", choices=("float64", "bfloat16"),
                   help="the CPU run's dtype: float64 (exact) or bfloat16 (against eager float32, the CUDA tolerance)")
    p.add_argument("-v", "--verbose", action="store_true")
    a = p.parse_args(argv)
    global CPU_LOW
    CPU_LOW = getattr(torch, a.cpu_dtype)
    if not 0 <= a.cases <= MAX_CASES:
        p.error(f"--cases must be between 0 and {MAX_CASES}")
    _emit_options(a.emit)
    if a.case:
        cases = [Case.from_json(a.case)]
    else:
        cases = cases_for(a.cases, a.seed, a.device, not a.no_peers)
    a.stopped = False
    if a.jobs > 1 and not a.case:
        import signal
        signal.signal(signal.SIGTERM, _on_sigterm)
        results = _parallel(a, cases)
    else:
        i, n = (int(x) for x in a.shard.split("/"))
        results = run_cases(cases[i::n][a.resume:], a.device, verbose=a.verbose, tag=f"shard {i}/{n}: " if n > 1 else "",
                            sink=a.sink)
    if a.json:
        with open(a.json, "w") as f:
            for r in results:
                f.write(json.dumps(r) + "\n")
    line = summary(results, a.device)
    cut = f" (stopped after {len(results)} of {len(cases)} cases)" if len(results) < len(cases) else ""
    print(f"{line}; seed {a.seed}, {_platform(a.device)}{cut}")
    bad = sum(r["outcome"] in ("wrong", "crash") for r in results)
    return 1 if bad else (INTERRUPTED if a.stopped else 0)


def _platform(device: str) -> str:
    """What the run ran on: the GPU and cuDNN for CUDA runs, torch's version always."""
    out = f"torch {torch.__version__}"
    if device == "cuda" and torch.cuda.is_available():
        try:
            import cudnn
            ver = cudnn.backend_version()
        except Exception:  # noqa: BLE001 - the frontend is what the run would have used; say it is missing
            ver = "no frontend"
        out = f"{torch.cuda.get_device_name()}, cuDNN {ver}, {out}"
    return out


def _emit_options(pairs: list[str]) -> None:
    import ast

    if not pairs:
        return
    from te_compile.lowering import lower as lowering

    changes = {}
    for p in pairs:
        name, value = p.split("=", 1)
        if name not in {f.name for f in dataclasses.fields(lowering.EmitOptions)}:
            raise SystemExit(f"--emit: no emission option {name!r} (te_compile.lowering.lower.EmitOptions)")
        try:
            changes[name] = ast.literal_eval(value)
        except (ValueError, SyntaxError):
            changes[name] = value
        if isinstance(getattr(lowering.OPTIONS, name), bool):
            changes[name] = bool(changes[name])
    lowering.set_options(**changes)


#: the exit code of a run stopped before its end (Ctrl-C, a timeout's SIGTERM) with no wrong case among those run
INTERRUPTED = 130


def _parallel(a: argparse.Namespace, cases: list[Case]) -> list[dict]:
    """Run ``cases`` in ``a.jobs`` worker processes, every ``jobs``-th case each. A worker that dies (a segfault)
    or ends on a poisoned CUDA context is restarted after the case it was running, which counts as a crash.
    A run stopped before its end (Ctrl-C, SIGTERM) sets ``a.stopped``."""
    import tempfile

    if a.json:
        os.makedirs(os.path.dirname(os.path.abspath(a.json)), exist_ok=True)
    # next to --json when given, so a run cut short leaves its shards' results where the caller looks
    tmp = tempfile.mkdtemp(prefix=f"fuzz-shards-{a.seed}-", dir=os.path.dirname(os.path.abspath(a.json)) if a.json else None)
    shards = [(i, cases[i::a.jobs], os.path.join(tmp, f"shard{i}.jsonl")) for i in range(a.jobs)]
    live = {i: _start_worker(a, i, 0, path) for i, _, path in shards}
    try:
        _supervise(a, shards, live)
    except (_Stop, KeyboardInterrupt):
        a.stopped = True  # stopped (a timeout's SIGTERM, Ctrl-C): keep what the workers finished
        for proc in live.values():
            proc.terminate()
        for proc in live.values():
            proc.wait()
            proc.log.close()
            _echo_log(proc.log.name)
        print("fuzz: stopped before the end; the summary counts the cases that finished", file=sys.stderr,
              flush=True)
    results = []
    for _, _, path in shards:
        if os.path.exists(path):
            with open(path) as f:
                results += [json.loads(ln) for ln in f if ln.strip()]
    shutil.rmtree(tmp, ignore_errors=True)  # the caller writes the results (--json); the reports were printed
    return results


class _Stop(Exception):
    """SIGTERM reached the --jobs parent."""


def _on_sigterm(signum, frame):  # noqa: ARG001 - a signal handler's signature
    raise _Stop()


def _echo_log(name: str) -> None:
    """Print a worker's report of its wrong / crashed cases (its log, less the progress lines)."""
    with open(name) as f:
        lines = [ln.rstrip("\n") for ln in f if not ln.startswith("fuzz ")]
    if lines:
        print("\n".join(lines), flush=True)


def _supervise(a: argparse.Namespace, shards: list, live: dict) -> None:
    """Wait for the workers; restart one that died or ended on a poisoned context after the case it was on."""
    while live:
        for i, shard, path in shards:
            proc = live.get(i)
            if proc is None or proc.poll() is None:
                continue
            proc.wait()
            proc.log.close()
            _echo_log(proc.log.name)
            done = _count_lines(path)
            del live[i]
            if done < len(shard):  # the worker died on case `done` without writing it
                if proc.returncode != POISONED:
                    c = shard[done]
                    r = {"seed": c.seed, "peer": c.peer, "outcome": "crash", "case": c.to_json(), "kept_reasons": [],
                         "sites": [], "seconds": 0.0, "detail": f"worker died (exit code {proc.returncode})"}
                    with open(path, "a") as f:
                        f.write(json.dumps(r) + "\n")
                    print(f"--- CRASH: {c.describe()}: worker died (exit code {proc.returncode})")
                    print(reproducer(c, a.device))
                    done += 1
                if done < len(shard):
                    live[i] = _start_worker(a, i, done, path)
        time.sleep(0.2)


def _count_lines(path: str) -> int:
    if not os.path.exists(path):
        return 0
    with open(path) as f:
        return sum(1 for ln in f if ln.strip())


def _start_worker(a: argparse.Namespace, i: int, resume: int, path: str) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "tools.fuzz", "--device", a.device, "--cases", str(a.cases),
           "--seed", str(a.seed), "--shard", f"{i}/{a.jobs}", "--resume", str(resume), "--sink", path] \
        + (["--no-peers"] if a.no_peers else []) + [x for p in a.emit for x in ("--emit", p)] \
        + ["--cpu-dtype", a.cpu_dtype]
    # the workers import tools.fuzz from this checkout, wherever they start
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = dict(os.environ, OMP_NUM_THREADS="1",
               PYTHONPATH=os.pathsep.join([root] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]))
    log = open(f"{path}.{resume}.out", "w")
    proc = subprocess.Popen(cmd, stdout=log, stderr=None, text=True, env=env)
    proc.log = log  # type: ignore[attr-defined]
    return proc


if __name__ == "__main__":
    sys.exit(main())
