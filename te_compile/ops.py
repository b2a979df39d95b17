"""The te_compile custom ops: the only bridge between graph passes and cuDNN.

``te_compile::attn_fwd(q, k, v, bias?, extra[], spec) -> (out, lse)``
``te_compile::attn_bwd(dout, q, k, v, out, lse, bias?, extra[], spec, need_dbias)
    -> (dq, dk, dv, dbias)``

* ``spec`` is ``AttentionSpec.key()``: the whole non-tensor description of the call.
* ``lse`` is the natural-log logsumexp, float32 ``[B, Hq, L]`` (-inf on fully-masked rows).
* ``bias`` is a float tensor in q's dtype that broadcasts to ``[B, Hq, L, S]``.
* ``extra`` is reserved for captured score_mod tensors (flex); SDPA passes ``[]``.
* ``dbias`` has bias's shape when ``need_dbias``; otherwise it is an empty placeholder
  (custom ops cannot return ``None``). ``need_dbias`` comes from ``ctx.needs_input_grad``,
  which AOTAutograd evaluates while tracing, so the backward graph shows it as a literal.

Kernels: CUDA runs the cached cuDNN graph (``te_compile.cudnn``) unless the spec says
``impl=reference`` or cuDNN rejects the configuration, in which case it runs the reference
math with one warning per spec; every other device runs the reference math.
"""

from __future__ import annotations

import logging
import threading
import warnings
from typing import Optional

import torch
from torch import Tensor

from . import reference
from .layout import empty_like_layout, like_layout_strides
from .spec import AttentionSpec

log = logging.getLogger("te_compile")

_warned: set[tuple[str, str]] = set()
_warned_lock = threading.Lock()


def _warn_fallback(spec_key: str, direction: str, why: str) -> None:
    with _warned_lock:
        if (spec_key, direction) in _warned:
            return
        _warned.add((spec_key, direction))
    spec = AttentionSpec.from_key(spec_key)
    msg = (f"te_compile: cuDNN could not serve the attention {direction} ({spec.describe()}); "
           f"running the reference math instead (correct but slow). Reason: {why}")
    log.warning(msg)
    warnings.warn(msg, RuntimeWarning, stacklevel=3)


def _check_extra(extra: list[Tensor]) -> None:
    if extra:
        raise NotImplementedError("te_compile: captured score_mod tensors are not supported yet")


# --------------------------------------------------------------------------- forward

@torch.library.custom_op("te_compile::attn_fwd", mutates_args=())
def attn_fwd(q: Tensor, k: Tensor, v: Tensor, bias: Optional[Tensor], extra: list[Tensor],
             spec: str) -> tuple[Tensor, Tensor]:
    """Attention forward (reference kernel; CUDA has its own registration)."""
    _check_extra(extra)
    out, lse = reference.attention_forward(q, k, v, bias, AttentionSpec.from_key(spec))
    return _place_out(out, q, v), lse.to(_lse_dtype(q)).contiguous()


def _lse_dtype(q: Tensor) -> torch.dtype:
    return reference.compute_dtype(q.dtype)


def _out_shape(q: Tensor, v: Tensor) -> tuple[int, ...]:
    return (q.shape[0], q.shape[1], q.shape[2], v.shape[3])


def _place_out(out: Tensor, q: Tensor, v: Tensor) -> Tensor:
    o = empty_like_layout(_out_shape(q, v), q)
    o.copy_(out)
    return o


@attn_fwd.register_fake
def _attn_fwd_fake(q, k, v, bias, extra, spec):
    out = empty_like_layout(_out_shape(q, v), q)
    lse = q.new_empty((q.shape[0], q.shape[1], q.shape[2]), dtype=_lse_dtype(q))
    return out, lse


@attn_fwd.register_kernel("cuda")
def _attn_fwd_cuda(q, k, v, bias, extra, spec):
    _check_extra(extra)
    s = AttentionSpec.from_key(spec)
    if s.impl == "cudnn":
        from .cudnn import graphs
        try:
            return graphs.forward(q, k, v, bias, s)
        except graphs.Unsupported as e:
            _warn_fallback(spec, "forward", str(e))
    out, lse = reference.attention_forward(q, k, v, bias, s)
    return _place_out(out, q, v), lse.to(_lse_dtype(q)).contiguous()


# --------------------------------------------------------------------------- backward

@torch.library.custom_op("te_compile::attn_bwd", mutates_args=())
def attn_bwd(dout: Tensor, q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse: Tensor,
             bias: Optional[Tensor], extra: list[Tensor], spec: str,
             need_dbias: bool) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Attention backward (reference kernel; CUDA has its own registration)."""
    _check_extra(extra)
    grads = reference.attention_backward(dout, q, k, v, out, lse, bias,
                                         AttentionSpec.from_key(spec), need_dbias)
    return _place_grads(grads, q, k, v, bias, need_dbias)


def _place_grads(grads, q, k, v, bias, need_dbias):
    dq, dk, dv, dbias = grads
    outs = []
    for g, like in ((dq, q), (dk, k), (dv, v)):
        t = empty_like_layout(like.shape, like)
        t.copy_(g)
        outs.append(t)
    outs.append(_dbias_out(dbias, q, bias, need_dbias))
    return tuple(outs)


def _dbias_out(dbias: Optional[Tensor], q: Tensor, bias: Optional[Tensor], need_dbias: bool) -> Tensor:
    if need_dbias and bias is not None:
        t = bias.new_empty(bias.shape)
        t.copy_(dbias)
        return t
    return q.new_empty((0,))


@attn_bwd.register_fake
def _attn_bwd_fake(dout, q, k, v, out, lse, bias, extra, spec, need_dbias):
    dq = empty_like_layout(q.shape, q)
    dk = empty_like_layout(k.shape, k)
    dv = empty_like_layout(v.shape, v)
    dbias = bias.new_empty(bias.shape) if (need_dbias and bias is not None) else q.new_empty((0,))
    return dq, dk, dv, dbias


@attn_bwd.register_kernel("cuda")
def _attn_bwd_cuda(dout, q, k, v, out, lse, bias, extra, spec, need_dbias):
    _check_extra(extra)
    s = AttentionSpec.from_key(spec)
    if s.impl == "cudnn":
        from .cudnn import graphs
        try:
            return graphs.backward(dout, q, k, v, out, lse, bias, s, need_dbias)
        except graphs.Unsupported as e:
            _warn_fallback(spec, "backward", str(e))
    grads = reference.attention_backward(dout, q, k, v, out, lse, bias, s, need_dbias)
    return _place_grads(grads, q, k, v, bias, need_dbias)


# --------------------------------------------------------------------------- autograd

def _setup_context(ctx, inputs, output):
    q, k, v, bias, extra, spec = inputs
    out, lse = output
    ctx.save_for_backward(q, k, v, out, lse, bias)
    ctx.spec = spec
    ctx.n_extra = len(extra)
    ctx.mark_non_differentiable(lse)


def _backward(ctx, dout, _dlse):
    q, k, v, out, lse, bias = ctx.saved_tensors
    nig = ctx.needs_input_grad
    need_dbias = bias is not None and bool(nig[3])
    dq, dk, dv, dbias = attn_bwd(dout, q, k, v, out, lse, bias, [], ctx.spec, need_dbias)
    return (dq if nig[0] else None, dk if nig[1] else None, dv if nig[2] else None,
            dbias if need_dbias else None, [None] * ctx.n_extra, None)


attn_fwd.register_autograd(_backward, setup_context=_setup_context)


def mask_to_bias(mask: Tensor, dtype: torch.dtype) -> Tensor:
    """SDPA bool mask (True = attend) -> additive bias (0 / -inf) in ``dtype``; never needs grad.

    Inserted into the graph by the rewrite pass, so Inductor fuses it with its producer.
    """
    return torch.where(mask, 0.0, float("-inf")).to(dtype)


__all__ = ["attn_fwd", "attn_bwd", "mask_to_bias", "like_layout_strides"]
