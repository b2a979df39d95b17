"""The kernels behind the te_compile ops (registered in te_compile.ops): CUDA and reference.

CUDA runs the cached cuDNN graph (te_compile.cudnn.graphs) unless the spec says
``impl=reference`` or cuDNN rejects the configuration, in which case it runs the reference math
with one warning per spec; every other device runs the reference math. The fake kernels give
the outputs' shapes, strides and dtypes for tracing.

Naming: ``extra`` is the ops' tensor-list argument as the graph passes it: the ``(in i)`` inputs
(``spec.n_inputs`` of them) followed by the BlockMask tensors (when ``spec.block_q``). The
kernels split it into ``inputs`` (what cuDNN and the reference math read) and ``block`` (checked
once per BlockMask, te_compile.blockmask.check_call).
"""

from __future__ import annotations

import collections
import logging
import threading
import warnings
from typing import Optional

import torch
from torch import Tensor

from . import blockmask, reference, verify
from .layout import empty_like_layout
from .spec import AttentionSpec

log = logging.getLogger("te_compile")

_warned: set[tuple[str, str]] = set()
_warned_lock = threading.Lock()
#: (spec key, "forward" | "backward") -> how many calls cuDNN could not serve (the reference math ran); every
#: call counts, not only the warned first one, so a test or the fuzzer can tell which implementation ran
fallbacks: "collections.Counter[tuple[str, str]]" = collections.Counter()
#: (spec key, direction) -> cuDNN's reason for the last declined call
_fallback_reasons: dict[tuple[str, str], str] = {}


def runtime_fallbacks() -> list[dict]:
    """The served sites whose calls ran the reference math because cuDNN declined the graph at run time (no
    engine on this GPU / cuDNN version), in this process: one dict per site and direction, with ``site`` (the
    spec described), ``direction``, ``calls`` and ``reason``. Such results are correct but slow; an empty list
    means every served call ran on cuDNN."""
    with _warned_lock:
        items = sorted(fallbacks.items())
        reasons = dict(_fallback_reasons)
    return [{"site": AttentionSpec.from_key(key).describe(), "direction": d, "calls": n,
             "reason": reasons.get((key, d), ""), "spec": key} for (key, d), n in items if n]


def _warn_fallback(spec_key: str, direction: str, why: str) -> None:
    with _warned_lock:
        fallbacks[(spec_key, direction)] += 1
        _fallback_reasons[(spec_key, direction)] = why
        if (spec_key, direction) in _warned:
            return
        _warned.add((spec_key, direction))
    spec = AttentionSpec.from_key(spec_key)
    msg = (f"te_compile: cuDNN could not serve the attention {direction} ({spec.describe()}); "
           f"running the reference math instead (correct but slow). Reason: {why}")
    log.warning(msg)
    warnings.warn(msg, RuntimeWarning, stacklevel=3)


def split_extra(spec: AttentionSpec, q: Tensor, k: Tensor, extra: list[Tensor]) -> list[Tensor]:
    """The ``(in i)`` inputs of ``extra``; checks the BlockMask tensors that follow them, if any."""
    inputs = list(extra[: spec.n_inputs])
    if spec.block_q:
        blockmask.check_call(spec, q, k, inputs, list(extra[spec.n_inputs:]))
    return inputs


# --------------------------------------------------------------------------- layouts

def lse_dtype(q: Tensor) -> torch.dtype:
    return reference.compute_dtype(q.dtype)


def _out_shape(q: Tensor, v: Tensor) -> tuple[int, ...]:
    return (q.shape[0], q.shape[1], q.shape[2], v.shape[3])


def _place_out(out: Tensor, q: Tensor, v: Tensor) -> Tensor:
    o = empty_like_layout(_out_shape(q, v), q)
    o.copy_(out)
    return o


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


# --------------------------------------------------------------------------- forward

def attn_fwd_fake(q, k, v, bias, extra, spec):
    out = empty_like_layout(_out_shape(q, v), q)
    lse = q.new_empty((q.shape[0], q.shape[1], q.shape[2]), dtype=lse_dtype(q))
    return out, lse


def attn_fwd_reference(q: Tensor, k: Tensor, v: Tensor, bias: Optional[Tensor], extra: list[Tensor],
                       spec: str) -> tuple[Tensor, Tensor]:
    """Attention forward on any device: the reference math."""
    s = AttentionSpec.from_key(spec)
    return _reference_forward(q, k, v, bias, s, split_extra(s, q, k, extra))


def _reference_forward(q, k, v, bias, s: AttentionSpec, inputs: list[Tensor]) -> tuple[Tensor, Tensor]:
    out, lse = reference.attention_forward(q, k, v, bias, s, inputs)
    return _place_out(out, q, v), lse.to(lse_dtype(q)).contiguous()


def attn_fwd_cuda(q, k, v, bias, extra, spec):
    s = AttentionSpec.from_key(spec)
    inputs = split_extra(s, q, k, extra)
    if s.impl == "cudnn":
        from .cudnn import graphs
        try:
            out, lse = graphs.forward(q, k, v, bias, s, inputs)
        except graphs.Unsupported as e:
            _warn_fallback(spec, "forward", str(e))
        else:
            if s.verify:
                verify.forward(spec, s, q, k, v, bias, inputs, out, lse)
            return out, lse
    return _reference_forward(q, k, v, bias, s, inputs)


# --------------------------------------------------------------------------- backward

def attn_bwd_fake(dout, q, k, v, out, lse, bias, extra, spec, need_dbias, dlse=None):
    dq = empty_like_layout(q.shape, q)
    dk = empty_like_layout(k.shape, k)
    dv = empty_like_layout(v.shape, v)
    dbias = bias.new_empty(bias.shape) if (need_dbias and bias is not None) else q.new_empty((0,))
    return dq, dk, dv, dbias


def attn_bwd_reference(dout: Tensor, q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse: Tensor,
                       bias: Optional[Tensor], extra: list[Tensor], spec: str,
                       need_dbias: bool, dlse: Optional[Tensor] = None) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Attention backward on any device: the reference math."""
    s = AttentionSpec.from_key(spec)
    grads = reference.attention_backward(dout, q, k, v, out, lse, bias, s, need_dbias, extra[: s.n_inputs], dlse)
    return _place_grads(grads, q, k, v, bias, need_dbias)


def attn_bwd_cuda(dout, q, k, v, out, lse, bias, extra, spec, need_dbias, dlse=None):
    s = AttentionSpec.from_key(spec)
    inputs = list(extra[: s.n_inputs])
    if s.impl == "cudnn":
        from .cudnn import graphs
        try:
            grads = graphs.backward(dout, q, k, v, out, lse, bias, s, need_dbias, inputs, dlse)
        except graphs.Unsupported as e:
            _warn_fallback(spec, "backward", str(e))
        else:
            if s.verify:
                verify.backward(spec, s, dout, q, k, v, out, lse, bias, need_dbias, inputs, grads, dlse)
            return grads
    grads = reference.attention_backward(dout, q, k, v, out, lse, bias, s, need_dbias, inputs, dlse)
    return _place_grads(grads, q, k, v, bias, need_dbias)
