"""The demo: a small GPT compiled with te_compile; prints the site report and the error vs eager.

On a GPU the attention runs on cuDNN (bf16) and the step time is compared with default
``torch.compile``; on a CPU the sites are rewritten to the reference kernel (float32).
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import statistics
import sys
import time
from typing import Callable, Optional

import torch
import torch.nn as nn
import torch.nn.functional as F

from .cli_parser import Parser
from ..reasons import SLOWER, category


class Block(nn.Module):
    """Pre-norm transformer block; attention is causal SDPA, or SDPA with a learned bias."""

    def __init__(self, dim: int, heads: int, seq: int, learned_bias: bool):
        super().__init__()
        self.heads, self.hd = heads, dim // heads
        self.ln1, self.ln2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.qkv = nn.Linear(dim, 3 * dim, bias=False)
        self.proj = nn.Linear(dim, dim, bias=False)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))
        # a learned additive attention bias (e.g. a relative-position table), causal folded in
        self.attn_bias = nn.Parameter(torch.randn(1, heads, seq, seq) * 0.02) if learned_bias else None
        if learned_bias:
            self.register_buffer("causal", torch.ones(seq, seq, dtype=torch.bool).tril(), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, C = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(B, T, 3, self.heads, self.hd).unbind(2)
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))  # [B, H, T, hd] views of BSHD storage
        if self.attn_bias is None:
            a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            bias = self.attn_bias[:, :, :T, :T].masked_fill(~self.causal[:T, :T], float("-inf"))
            a = F.scaled_dot_product_attention(q, k, v, attn_mask=bias)
        x = x + self.proj(a.transpose(1, 2).reshape(B, T, C))
        return x + self.mlp(self.ln2(x))


class TinyGPT(nn.Module):
    def __init__(self, vocab: int = 512, dim: int = 256, heads: int = 4, layers: int = 3, seq: int = 128):
        super().__init__()
        self.tok = nn.Embedding(vocab, dim)
        self.pos = nn.Parameter(torch.randn(1, seq, dim) * 0.02)
        self.blocks = nn.ModuleList(Block(dim, heads, seq, learned_bias=(i == layers - 1)) for i in range(layers))
        self.ln = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, vocab, bias=False)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        x = self.tok(idx) + self.pos[:, : idx.shape[1]]
        for b in self.blocks:
            x = b(x)
        return self.head(self.ln(x))


def _step(fn: Callable, model: nn.Module, idx: torch.Tensor) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    model.zero_grad(set_to_none=True)
    logits = fn(idx)
    loss = F.cross_entropy(logits.float().flatten(0, 1), idx.roll(-1, 1).flatten())
    loss.backward()
    return logits.detach(), {n: p.grad.detach().clone() for n, p in model.named_parameters()}


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.double() - b.double()).abs().max() / b.double().abs().max().clamp_min(1e-12)).item()


def _time(fn: Callable[[], object], iters: int) -> float:
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    ts = []
    for _ in range(iters):
        t0 = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts) * 1e3


def example() -> tuple:
    """A factory for ``te-compile explain te_compile.cli.demo:example``: a small TinyGPT and its input."""
    torch.manual_seed(0)
    model = TinyGPT(seq=64, dim=128, heads=4)
    return model, (torch.randint(0, 512, (2, 64)),)


@contextlib.contextmanager
def _quiet_site_logs():
    """The demo prints the site report itself, once. te_compile logs each graph's decisions and report at
    INFO (the CLI turns INFO on for progress), which would print the table again per graph; keep only
    warnings unless the user asked for te_compile's logs with ``TORCH_LOGS``."""
    log = logging.getLogger("te_compile")
    if "te_compile" in os.environ.get("TORCH_LOGS", ""):
        yield
        return
    level = log.level
    log.setLevel(max(level, logging.WARNING))
    try:
        yield
    finally:
        log.setLevel(level)


def main(argv: Optional[list[str]] = None) -> int:
    with _quiet_site_logs():
        return _main(argv)


def _device(text: str) -> str:
    """--device's value: cpu, cuda or cuda:N."""
    try:
        dev = torch.device(text)
    except (RuntimeError, ValueError):
        dev = None
    if dev is None or dev.type not in ("cpu", "cuda"):
        raise argparse.ArgumentTypeError(f"{text!r}: the demo runs on cpu or cuda (cuda:N)")
    return text


def _positive(text: str) -> int:
    try:
        n = int(text)
    except ValueError:
        n = 0
    if n < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: expected a whole number of at least 1")
    return n


def parser() -> Parser:
    p = Parser("te-compile demo", "te_compile demo: compile a small GPT and report")
    p.add_argument("--device", type=_device, default="cuda" if torch.cuda.is_available() else "cpu",
                   help="cuda: bf16 on cuDNN; cpu: float32 on the reference kernel (the default is this machine's)")
    p.add_argument("--seq", type=_positive, default=None,
                   help="sequence length (none given: 2048 on a GPU, 64 on a CPU)")
    p.add_argument("--batch", type=_positive, default=None, help="batch size (none given: 4 on a GPU, 2 on a CPU)")
    p.add_argument("-v", "--verbose", action="store_true", help="each site's long reason, with its evidence")
    p.add_argument("--traceback", action="store_true", help="on a failure, print the whole traceback too")
    p.add_argument("--serve", choices=("fastest", "always"), default=None,
                   help="te_compile's serve policy (default: fastest, or TE_COMPILE_SERVE): 'always' puts every "
                        "site cuDNN can serve on cuDNN, even where the rules say torch.compile is faster")
    return p


def _main(argv: Optional[list[str]] = None) -> int:
    import te_compile

    a = parser().parse_args(argv)
    dev = torch.device(a.device)
    gpu = dev.type == "cuda"
    if gpu and not torch.cuda.is_available():
        print("te-compile demo: --device cuda needs a CUDA GPU (this torch sees none); run `te-compile demo` "
              "without --device to use the CPU and the reference kernel", file=sys.stderr)
        return 1
    # on a GPU: long enough sequences that attention, not Python, dominates the step
    seq = a.seq if a.seq is not None else (2048 if gpu else 64)
    batch = a.batch if a.batch is not None else (4 if gpu else 2)
    dtype = torch.bfloat16 if gpu else torch.float32
    target = "auto" if gpu else "reference"
    torch.manual_seed(0)
    model = TinyGPT(seq=seq, dim=1024 if gpu else 128, heads=8 if gpu else 4).to(dev)
    idx = torch.randint(0, 512, (batch, seq), device=dev)
    print(f"te_compile demo: TinyGPT ({sum(p.numel() for p in model.parameters()) / 1e6:.1f}M params), "
          f"batch {batch}, seq {seq}, {dtype}, device {dev}, target {target}")

    t0 = time.perf_counter()
    report = te_compile.explain(model.to(dtype), idx, target=target, inner="inductor", serve=a.serve)
    print(f"compiled in {time.perf_counter() - t0:.1f}s")
    print(report.table(verbose=a.verbose))
    if any(category(d.reason) == SLOWER for d in report.decisions):
        print("(sites kept for speed run what torch.compile runs; `te-compile demo --serve always` puts them on cuDNN)")

    compiled = torch.compile(model, backend=te_compile.backend(target=target, serve=a.serve))
    out, grads = _step(compiled, model, idx)
    ref_model = model.float()  # eager reference in float32 on the same weights
    ref_out, ref_grads = _step(ref_model, ref_model, idx)
    model.to(dtype)
    worst = max(grads, key=lambda n: _rel(grads[n], ref_grads[n]))
    print(f"\nmax rel. error vs eager float32: output {_rel(out, ref_out):.2e}, "
          f"worst grad {_rel(grads[worst], ref_grads[worst]):.2e} ({worst})")
    if gpu:
        default = torch.compile(model)
        te_ms = _time(lambda: _step(compiled, model, idx), 20)
        ind_ms = _time(lambda: _step(default, model, idx), 20)
        print(f"train step (fwd+bwd): te_compile {te_ms:.2f} ms, default torch.compile {ind_ms:.2f} ms "
              f"({ind_ms / te_ms:.2f}x)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
