"""The GPU work of the rest of the graph being compiled, for measuring a site (te_compile.tuning).

A site's host time (te_compile's ops run Python per call) costs a step only where the GPU waits for it. In a
one-site graph it does. In a model's graph, the matrix multiplies around the attention keep the GPU busy, and
host time can hide behind them: a Hugging Face model at 1x8192 tokens ran its served flex sites faster while a
per-site ``max(host, kernel)`` kept them. So a site is measured with its share of the rest of the graph's GPU
work run before each call of both candidates (``tuning.candidates.busy``).

A graph with N attention sites hides N sites' host time behind its work, so each site is credited with 1/N of
it: with every site served or every site kept, the step is max(host, kernels) summed over the sites, which per
site is ``max(host, kernel + rest / N)``.

Only the graph's matrix multiplies are counted (2 M N K FLOPs each; three times that in training, for the
two backward products), at a fixed sm90 bf16 throughput (te_compile.tuning.REST_TFLOPS). The rest of the graph's host time is not known here,
and where the graph is close to host-bound that host time does not hide: a model at 4 x 1024 tokens served
sites measured faster this way and ran slower. So the rules do not use this share, and a measured
decision is checked on the whole graph (``tuning.graph_check``).
"""

from __future__ import annotations

import contextlib
import contextvars
import operator
from typing import Any, Iterator, Optional

import torch

_rest_flops: contextvars.ContextVar[float] = contextvars.ContextVar("te_compile_rest_flops", default=0.0)
_sites: contextvars.ContextVar[int] = contextvars.ContextVar("te_compile_attention_sites", default=1)

# attention calls as Dynamo captures them (te_compile.passes.find has the full site rules)
_ATTENTION = (torch.nn.functional.scaled_dot_product_attention, torch.ops.aten.scaled_dot_product_attention.default,
              torch.ops.higher_order.flex_attention)

# (callable, index of the argument whose last dimension is the reduced one)
_GEMMS: dict[Any, int] = {
    torch.nn.functional.linear: 0, torch._C._nn.linear: 0, torch.matmul: 0, operator.matmul: 0,
    torch.mm: 0, torch.bmm: 0, torch.addmm: 1, torch.baddbmm: 1,
    torch.ops.aten.mm.default: 0, torch.ops.aten.bmm.default: 0, torch.ops.aten.addmm.default: 1,
    torch.ops.aten.linear.default: 0, torch.ops.aten.matmul.default: 0,
}


def _value(n: Any) -> Optional[torch.Tensor]:
    if not isinstance(n, torch.fx.Node):
        return None
    v = n.meta.get("example_value", n.meta.get("val"))
    return v if isinstance(v, torch.Tensor) else None


def _int(x: Any) -> Optional[int]:
    try:
        return int(x)
    except Exception:  # noqa: BLE001 - a symbolic size without a hint: not counted
        return None


def forward_gemm_flops(graph: torch.fx.Graph) -> float:
    """FLOPs of the forward matrix multiplies in ``graph`` (nodes whose shapes are known)."""
    total = 0.0
    for n in graph.nodes:
        arg = _GEMMS.get(n.target) if n.op == "call_function" else None
        if arg is None or len(n.args) <= arg:
            continue
        out, a = _value(n), _value(n.args[arg])
        if out is None or a is None or a.dim() == 0:
            continue
        numel, k = _int(out.numel()), _int(a.shape[-1])
        if numel is not None and k is not None:
            total += 2.0 * numel * k
    return total


def attention_sites(graph: torch.fx.Graph) -> int:
    """The attention calls in ``graph`` (SDPA and flex)."""
    return sum(n.op == "call_function" and n.target in _ATTENTION for n in graph.nodes)


@contextlib.contextmanager
def graph(gm: torch.fx.GraphModule) -> Iterator[None]:
    """Decide the sites of ``gm`` knowing the rest of its work."""
    token = _rest_flops.set(forward_gemm_flops(gm.graph))
    sites = _sites.set(max(1, attention_sites(gm.graph)))
    try:
        yield
    finally:
        _rest_flops.reset(token)
        _sites.reset(sites)


def rest_ms(needs_grad: bool, tflops: float) -> float:
    """One attention site's share (1/N of N sites) of the GPU time per step of the current graph's matrix
    multiplies, at ``tflops``; 0 outside ``graph``."""
    return _rest_flops.get() * (3.0 if needs_grad else 1.0) / (tflops * 1e9) / _sites.get()


__all__ = ["graph", "rest_ms", "forward_gemm_flops", "attention_sites"]
