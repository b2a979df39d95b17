"""Exact eager attention math for every AttentionSpec: forward and an explicit backward.

Used as the CPU kernel of the te_compile ops, as the run-time fallback when cuDNN rejects a
spec, and as the verifier. It computes in float32 (float64 when the inputs are float64, so
``opcheck``/``gradcheck`` are exact) and mirrors eager semantics:

* scores = (q @ k^T) * scale + bias, top-left causal mask (q_idx >= kv_idx);
* GQA: query head h reads kv head h // (Hq // Hkv);
* fully-masked rows give output 0 and lse = -inf, and zero gradients (never NaN);
* lse is the natural-log logsumexp of the masked scores, shape [B, Hq, L], float32/64.

The backward is written out (it runs below autograd inside a custom op, where
``torch.autograd`` is unavailable): dS = P * (dP - rowsum(dO * O)).
"""

from __future__ import annotations

from typing import Optional, Sequence

import torch
from torch import Tensor

from .score import ir
from .spec import AttentionSpec


def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.promote_types(dtype, torch.float32)


def _expand_kv(t: Tensor, hq: int) -> Tensor:
    hk = t.shape[1]
    if hk == hq:
        return t
    return t.repeat_interleave(hq // hk, dim=1)


def index_grids(B: int, H: int, L: int, S: int, device: torch.device) -> dict:
    """The ScoreExpr index leaves b, h, q_idx, kv_idx as broadcastable int32 grids over [B, H, L, S]."""
    def grid(n: int, dim: int) -> Tensor:
        shape = [1, 1, 1, 1]
        shape[dim] = n
        return torch.arange(n, dtype=torch.int32, device=device).view(shape)
    return {"b": grid(B, 0), "h": grid(H, 1), "q_idx": grid(L, 2), "kv_idx": grid(S, 3)}


def index_env(q: Tensor, k: Tensor, extra: Sequence[Tensor] = ()) -> dict:
    """index_grids for a call's q / k, plus the extra inputs: the ``(in i)`` terms, which an interval spec's
    mask_mod reads as its captured tensors ``(buf i)``."""
    return {**index_grids(q.shape[0], q.shape[1], q.shape[2], k.shape[2], q.device), "inputs": list(extra),
            "bufs": list(extra)}


def _raw_scores(q: Tensor, k: Tensor, spec: AttentionSpec) -> Tensor:
    ct = compute_dtype(q.dtype)
    return torch.matmul(q.to(ct), _expand_kv(k, q.shape[1]).to(ct).transpose(-2, -1)) * spec.scale_for(q.shape[-1])


def _modified(s: Tensor, env: dict, spec: AttentionSpec) -> Tensor:
    e = spec.score_expr()
    if e is None:
        return s
    return ir.evaluate(e, {**env, "score": s}).to(s.dtype).expand_as(s)


def _scores(q: Tensor, k: Tensor, bias: Optional[Tensor], spec: AttentionSpec,
            extra: Sequence[Tensor] = ()) -> Tensor:
    """Masked, biased, modified, scaled scores [B, Hq, L, S] in the compute dtype (-inf where masked).

    Order as in cuDNN and flex: scale, score_mod, + bias, masks (mask_mod after score_mod)."""
    ct = compute_dtype(q.dtype)
    s = _raw_scores(q, k, spec)
    if spec.score or spec.mask_mod:
        env = index_env(q, k, extra)
        s = _modified(s, env, spec)
    if bias is not None:
        s = s + bias.to(ct)
    if spec.mask_mod:
        keep = ir.evaluate(spec.mask_expr(), env).to(torch.bool)
        s = s.masked_fill(~keep, float("-inf"))
    if spec.is_causal:
        L, S = s.shape[-2:]
        keep = torch.ones(L, S, dtype=torch.bool, device=s.device).tril()
        s = s.masked_fill(~keep, float("-inf"))
    return s


def _probs(s: Tensor, lse: Tensor) -> Tensor:
    """softmax from scores and lse; rows with lse = -inf (fully masked) are all zero. A +inf or NaN
    lse (an inf or NaN input) gives NaN, as in eager."""
    masked = lse == float("-inf")
    safe = torch.where(masked, torch.zeros_like(lse), lse)
    p = torch.exp(s - safe.unsqueeze(-1))
    return torch.where(masked.unsqueeze(-1), torch.zeros_like(p), p)


def attention_forward(q: Tensor, k: Tensor, v: Tensor, bias: Optional[Tensor],
                      spec: AttentionSpec, extra: Sequence[Tensor] = ()) -> tuple[Tensor, Tensor]:
    """(out [B, Hq, L, Ev] in q's dtype, lse [B, Hq, L] in the compute dtype)."""
    s = _scores(q, k, bias, spec, extra)
    lse = torch.logsumexp(s, dim=-1)  # -inf for fully-masked rows
    p = _probs(s, lse)
    out = torch.matmul(p, _expand_kv(v, q.shape[1]).to(p.dtype))
    return out.to(q.dtype), lse


def _reduce_heads(g: Tensor, hk: int) -> Tensor:
    """Sum a [B, Hq, ...] gradient over each GQA group to [B, Hk, ...]."""
    B, hq = g.shape[:2]
    if hq == hk:
        return g
    return g.reshape(B, hk, hq // hk, *g.shape[2:]).sum(dim=2)


def _reduce_batch(g: Tensor, b: int) -> Tensor:
    """Sum a [B, ...] gradient to a K/V batch of 1 (K/V broadcast over the batch)."""
    return g if g.shape[0] == b else g.sum(dim=0, keepdim=True)


def attention_backward(dout: Tensor, q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse: Tensor,
                       bias: Optional[Tensor], spec: AttentionSpec, need_dbias: bool,
                       extra: Sequence[Tensor] = (), dlse: Optional[Tensor] = None
                       ) -> tuple[Tensor, Tensor, Tensor, Optional[Tensor]]:
    """(dq, dk, dv, dbias or None); dbias has bias's own (broadcast) shape. ``dlse`` is the gradient
    of the (natural-log) lse output, or None: d lse / d score = P, so it joins dP."""
    ct = compute_dtype(q.dtype)
    hq, hk = q.shape[1], k.shape[1]
    scale = spec.scale_for(q.shape[-1])
    s = _scores(q, k, bias, spec, extra)
    p = _probs(s, lse.to(ct))
    do = dout.to(ct)
    dv = _reduce_batch(_reduce_heads(torch.matmul(p.transpose(-2, -1), do), hk), v.shape[0])
    dp = torch.matmul(do, _expand_kv(v, hq).to(ct).transpose(-2, -1))
    delta = (do * out.to(ct)).sum(dim=-1, keepdim=True)
    if dlse is not None:
        delta = delta - dlse.to(ct).unsqueeze(-1)
    ds = p * (dp - delta)  # d loss / d (modified, biased score)
    dbias_src = ds
    if spec.score:
        # chain rule through score_mod: d/d(raw score) = ds * f'(raw score); masked entries have
        # ds == 0 exactly, where f' may be inf/nan (e.g. at -inf) and must not leak
        env = {**index_env(q, k, extra), "score": _raw_scores(q, k, spec)}
        fprime = ir.evaluate(ir.derivative(spec.score_expr()), env).to(ct)
        ds = torch.where(ds == 0, torch.zeros_like(ds), ds * fprime)
    dq = torch.matmul(ds, _expand_kv(k, hq).to(ct)) * scale
    dk = _reduce_batch(_reduce_heads(torch.matmul(ds.transpose(-2, -1), q.to(ct)) * scale, hk), k.shape[0])
    dbias = None
    if need_dbias and bias is not None:
        dbias = dbias_src.sum_to_size(bias.shape).to(bias.dtype)
    return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype), dbias
