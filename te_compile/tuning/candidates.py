"""The two things a site can run, as zero-argument callables on random inputs of the site's shapes.

Both are compiled functions, because what a site costs in a training loop is what it costs inside a compiled
graph: a one-site graph carries Dynamo's guards, AOTAutograd's runtime wrappers and Inductor's call wrapper on
both sides, and a bare op call would leave them out of te_compile's side only (a served softcap site measured
1.5x faster as a bare op and 0.92x as a compiled step, docs/cudnn-notes.md). te_compile's candidate compiles
a call of its op (``te_compile::attn_fwd``; AOTAutograd traces its backward, ``attn_bwd``) with the site's spec,
as the rewrite leaves it. torch.compile's candidate is what plain ``torch.compile`` runs for the site: aten's
``scaled_dot_product_attention`` for SDPA sites, Inductor's flex kernel for flex sites, with a score_mod /
mask_mod rebuilt from the spec's ScoreExprs (the same math as the user's mods after te_compile's
canonicalisation; ``(in i)`` terms become per-head inputs). Training sites run forward + backward.

A flex site whose additive term or mask gathers from captured tensors (a materialized bias) cannot be rebuilt
from its spec: ``build`` returns None and the rules decide it.

Two things make compiling here safe:

* Measuring runs inside te_compile's backend, that is inside Dynamo's compile, which holds Dynamo's compile
  lock. Inductor compiles a backward lazily, at its first call, and takes that lock; on a GPU the autograd
  engine runs the backward on its device thread, so a lazily compiled backward would wait forever for the lock
  this thread holds. ``build`` compiles each candidate's backward with its forward, on this thread
  (``force_non_lazy_backward_lowering``), and leaves a training site to the model where torch has no such
  switch.
* Dynamo keeps compiled entries, and counts recompiles, per code object. Each candidate is a function with a
  code object of its own (``_fresh``), so measuring many sites never reaches a recompile limit and never
  spends the budget of a code object the user compiles (``flex_attention`` itself: the candidate calls it,
  Dynamo inlines it).
"""

from __future__ import annotations

import itertools
import types
from typing import Callable, Optional

import torch
import torch.nn.functional as F

from .. import ir
from ..spec import AttentionSpec

Pair = tuple[Callable[[], object], Callable[[], object]]


def _shape(t) -> tuple[int, ...]:
    return tuple(int(s) for s in t.shape)


def _inputs(q, k, v, bias_like, needs_grad: bool, need_dbias: bool, device) -> tuple:
    g = torch.Generator(device=device).manual_seed(0)
    mk = [torch.randn(_shape(t), dtype=q.dtype, device=device, generator=g) for t in (q, k, v)]
    bias = None
    if bias_like is not None:
        bias = torch.randn(_shape(bias_like), dtype=q.dtype, device=device, generator=g)
    if needs_grad:
        for t in mk:
            t.requires_grad_()
        if bias is not None and need_dbias:
            bias.requires_grad_()
    dout = torch.randn(_shape(q)[:-1] + (_shape(v)[-1],), dtype=q.dtype, device=device, generator=g)
    return mk, bias, dout


def _step(fwd: Callable[[], torch.Tensor], leaves: list[torch.Tensor], dout: torch.Tensor,
          needs_grad: bool) -> Callable[[], object]:
    if not needs_grad:
        def infer() -> object:
            with torch.no_grad():
                return fwd()
        return infer

    def train() -> object:
        return torch.autograd.grad(fwd(), leaves, dout)
    return train


def _mods(spec: AttentionSpec, heads: torch.Tensor):
    score, mask = spec.score_expr(), spec.mask_expr()

    def env(b, h, q_idx, kv_idx, **more):
        return {"b": b, "h": h, "q_idx": q_idx, "kv_idx": kv_idx, "inputs": [t[h] for t in heads], **more}
    score_mod = None if score is None else (lambda s, b, h, qi, ki: ir.evaluate(score, env(b, h, qi, ki, score=s)))
    mask_mod = None if mask is None else (lambda b, h, qi, ki: ir.evaluate(mask, env(b, h, qi, ki)))
    return score_mod, mask_mod


_serial = itertools.count()


def _fresh(fn: Callable) -> Callable:
    """``fn`` with a code object of its own (see the module doc)."""
    code = fn.__code__.replace(co_name=f"te_compile_candidate_{next(_serial)}")
    return types.FunctionType(code, fn.__globals__, code.co_name, fn.__defaults__, fn.__closure__)


def _compiled(fwd: Callable[[], torch.Tensor]) -> Callable[[], torch.Tensor]:
    return torch.compile(_fresh(fwd), backend="inductor", dynamic=False)


def _compile_now(step: Callable[[], object], needs_grad: bool) -> bool:
    """Run ``step`` once (its compile), a backward compiled with its forward (see the module doc); False:
    this torch cannot compile a backward eagerly."""
    if not needs_grad:
        step()
        return True
    cfg = torch._functorch.config
    if not hasattr(cfg, "force_non_lazy_backward_lowering"):
        return False
    with cfg.patch(force_non_lazy_backward_lowering=True):
        step()
    return True


def _pair(te_fwd: Callable[[], torch.Tensor], tc_fwd: Callable[[], torch.Tensor], leaves: list[torch.Tensor],
          dout: torch.Tensor, needs_grad: bool) -> Optional[Pair]:
    """Both candidates compiled (each compile done here, not in the timed rounds), or None."""
    pair = tuple(_step(_compiled(f), leaves, dout, needs_grad) for f in (te_fwd, tc_fwd))
    if not all(_compile_now(step, needs_grad) for step in pair):
        return None
    return pair


def _block_tensors(spec: AttentionSpec, bm) -> list[torch.Tensor]:
    if not spec.block_q:
        return []
    out = [bm.kv_num_blocks, bm.kv_indices]
    if spec.block_full:
        out += [bm.full_kv_num_blocks, bm.full_kv_indices]
    return out


def build(q, k, v, bias_like, spec: AttentionSpec, needs_grad: bool, need_dbias: bool,
          device: Optional[torch.device] = None) -> Optional[Pair]:
    """(te_compile's candidate, torch.compile's candidate), or None when the site cannot be rebuilt."""
    from .. import ops  # noqa: F401 - registers torch.ops.te_compile
    device = device or q.device
    (qq, kk, vv), bias, dout = _inputs(q, k, v, bias_like, needs_grad, need_dbias, device)
    leaves = [qq, kk, vv] + ([bias] if bias is not None and bias.requires_grad else [])
    gqa = qq.shape[1] != kk.shape[1]
    key = spec.key()
    if spec.source != "flex":
        te_fwd = (lambda: torch.ops.te_compile.attn_fwd(qq, kk, vv, bias, [], key)[0])
        tc_fwd = (lambda: F.scaled_dot_product_attention(qq, kk, vv, attn_mask=bias, is_causal=spec.is_causal,
                                                         scale=spec.scale, enable_gqa=gqa))
        return _pair(te_fwd, tc_fwd, leaves, dout, needs_grad)
    if bias_like is not None or spec.empty_rows:
        return None
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention
    H, L, S = qq.shape[1], qq.shape[2], kk.shape[2]
    heads = [torch.rand(H, dtype=torch.float32, device=device) for _ in range(spec.n_inputs)]
    score_mod, mask_mod = _mods(spec, heads)
    bm = None
    if mask_mod is not None or spec.block_q:
        blocks = (spec.block_q, spec.block_kv) if spec.block_q else (128, 128)
        bm = create_block_mask(mask_mod or (lambda b, h, qi, ki: qi >= 0), 1, 1, L, S, device=str(device),
                               BLOCK_SIZE=blocks)
    extra = [t.view(1, H, 1, 1) for t in heads] + _block_tensors(spec, bm)
    te_fwd = (lambda: torch.ops.te_compile.attn_fwd(qq, kk, vv, None, extra, key)[0])
    tc_fwd = (lambda: flex_attention(qq, kk, vv, score_mod=score_mod, block_mask=bm, scale=spec.scale,
                                     enable_gqa=gqa))
    return _pair(te_fwd, tc_fwd, leaves, dout, needs_grad)


def _cycles_per_ms(device: torch.device) -> float:
    """Clock cycles of ``torch.cuda._sleep`` per ms on ``device`` (median of three timed sleeps)."""
    n, got = 1 << 21, []
    with torch.cuda.device(device):
        torch.cuda._sleep(1000)
        for _ in range(3):
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            torch.cuda._sleep(n)
            b.record()
            b.synchronize()
            got.append(n / max(a.elapsed_time(b), 1e-3))
    return sorted(got)[1]


def busy(pair: Pair, ms: float, device: torch.device) -> Pair:
    """Both candidates, each call preceded by ``ms`` of GPU work (a sleep kernel): the rest of the site's graph,
    which in a model hides host time behind it (te_compile.tuning.graph_work). One launch, no memory traffic."""
    cycles = int(ms * _cycles_per_ms(device))

    def wrap(step: Callable[[], object]) -> Callable[[], object]:
        def run() -> object:
            torch.cuda._sleep(cycles)
            return step()
        return run
    return wrap(pair[0]), wrap(pair[1])


__all__ = ["build", "busy"]
