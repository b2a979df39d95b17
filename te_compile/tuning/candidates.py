"""The two things a site can run, as zero-argument callables on random inputs of the site's shapes.

te_compile's candidate calls its op (``te_compile::attn_fwd``, and the backward through autograd when the site
needs gradients) with the site's spec. torch.compile's candidate is what plain ``torch.compile`` runs for it:
aten's ``scaled_dot_product_attention`` for SDPA sites (Inductor calls the aten op), and Inductor's compiled
flex kernel for flex sites, with a score_mod / mask_mod rebuilt from the spec's ScoreExprs (the same math as
the user's mods after te_compile's canonicalisation; ``(in i)`` terms become per-head inputs).

A flex site whose additive term or mask gathers from captured tensors (a materialized bias) cannot be rebuilt
from its spec: ``build`` returns None and the cost model decides it.

Measuring runs inside te_compile's backend, that is inside Dynamo's compile, which holds Dynamo's compile lock.
Inductor compiles a backward lazily, at its first call, and takes that lock; on a GPU the autograd engine runs
the backward on its device thread, so a lazily compiled backward of the flex candidate would wait forever for
the lock this thread holds. ``build`` therefore compiles the flex candidate's backward with its forward, on
this thread (``force_non_lazy_backward_lowering``), and leaves a training flex site to the model where torch
has no such switch.
"""

from __future__ import annotations

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


def _compile_now(step: Callable[[], object]) -> bool:
    """Run ``step`` once with the backward compiled eagerly (see the module doc); False: torch cannot."""
    cfg = torch._functorch.config
    if not hasattr(cfg, "force_non_lazy_backward_lowering"):
        return False
    with cfg.patch(force_non_lazy_backward_lowering=True):
        step()
    return True


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
    if spec.source != "flex":
        te_fwd = (lambda: torch.ops.te_compile.attn_fwd(qq, kk, vv, bias, [], spec.key())[0])
        tc_fwd = (lambda: F.scaled_dot_product_attention(qq, kk, vv, attn_mask=bias, is_causal=spec.is_causal,
                                                         scale=spec.scale, enable_gqa=gqa))
        return _step(te_fwd, leaves, dout, needs_grad), _step(tc_fwd, leaves, dout, needs_grad)
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
    te_fwd = (lambda: torch.ops.te_compile.attn_fwd(qq, kk, vv, None, extra, spec.key())[0])
    flex = torch.compile(flex_attention, dynamic=False)
    tc_fwd = (lambda: flex(qq, kk, vv, score_mod=score_mod, block_mask=bm, scale=spec.scale, enable_gqa=gqa))
    tc = _step(tc_fwd, leaves, dout, needs_grad)
    if needs_grad and not _compile_now(tc):
        return None
    return _step(te_fwd, leaves, dout, needs_grad), tc


__all__ = ["build"]
