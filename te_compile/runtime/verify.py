"""``verify``: on the first call of each configuration, compare the cuDNN result with the reference.

Enabled per backend (``te_compile.backend(verify=True)`` / ``te_compile.compile(..., verify=True)``);
the flag travels in the spec, so the op checks itself: the first time it runs a (spec, shapes,
dtypes) on cuDNN it also runs the reference math and raises ``VerificationError`` with the error
figures if they disagree beyond bf16/fp16 tolerance. Later calls of that configuration are not
checked again (it is a first-call check, not a per-call cost).
"""

from __future__ import annotations

import logging
import threading
from typing import Optional, Sequence

import torch
from torch import Tensor

from .. import reference

log = logging.getLogger("te_compile")

#: relative error (max |a - b| / max |b|) accepted for outputs and gradients in fp16 / bf16
TOLERANCE = 2e-2

_done: set = set()
_lock = threading.Lock()


class VerificationError(RuntimeError):
    pass


def rel_err(a: Tensor, b: Tensor) -> float:
    a, b = a.double(), b.double()
    finite = torch.isfinite(b)
    if not torch.equal(torch.isfinite(a), finite):
        return float("inf")
    a, b = a[finite], b[finite]
    if b.numel() == 0:
        return 0.0
    return ((a - b).abs().max() / b.abs().max().clamp_min(1e-6)).item()


def first_time(key: tuple) -> bool:
    with _lock:
        if key in _done:
            return False
        _done.add(key)
        return True


def compare(what: str, names: Sequence[str], got: Sequence[Optional[Tensor]], want: Sequence[Optional[Tensor]],
            tol: float = TOLERANCE) -> Optional[str]:
    """None if every pair agrees; else a message with the error figures."""
    errs = {}
    for n, a, b in zip(names, got, want):
        if a is None or b is None or a.numel() == 0:
            continue
        errs[n] = rel_err(a, b)
    bad = {n: e for n, e in errs.items() if not e <= tol}
    if not bad:
        return None
    figures = ", ".join(f"{n} {e:.3g}" for n, e in errs.items())
    return f"{what}: relative error vs the reference above {tol:g} ({figures})"


def key_of(tag: str, spec: str, tensors: Sequence[Optional[Tensor]], flag: object = None) -> tuple:
    return (tag, spec, flag) + tuple(None if t is None else (tuple(t.shape), t.stride(), t.dtype, t.device)
                                     for t in tensors)


# --------------------------------------------------------------------------- the ops' hooks

def forward(spec_key: str, s, q, k, v, bias, inputs, out, lse) -> None:
    """Called by the CUDA forward kernel after cuDNN ran (``s.verify``)."""
    if torch.cuda.is_current_stream_capturing():
        return  # the warm-up run before a CUDA graph capture is verified instead
    if not first_time(key_of("fwd", spec_key, (q, k, v, bias, *inputs))):
        return
    ref_out, ref_lse = reference.attention_forward(q, k, v, bias, s, inputs)
    why = compare("forward", ("out", "lse"), (out, lse), (ref_out, ref_lse.float()))
    if why:
        raise VerificationError(f"te_compile verify: cuDNN {why}; spec {s.describe()}, q {tuple(q.shape)} {q.dtype}")
    log.info("te_compile verify: forward (%s) agrees with the reference", s.describe())


def backward(spec_key: str, s, dout, q, k, v, out, lse, bias, need_dbias, inputs, grads, dlse=None) -> None:
    """Called by the CUDA backward kernel after cuDNN ran (``s.verify``)."""
    if torch.cuda.is_current_stream_capturing():
        return
    if not first_time(key_of("bwd", spec_key, (dout, q, k, v, bias, *inputs), (need_dbias, dlse is None))):
        return
    ref = reference.attention_backward(dout, q, k, v, out, lse, bias, s, need_dbias, inputs, dlse)
    why = compare("backward", ("dq", "dk", "dv", "dbias"), grads, ref)
    if why:
        raise VerificationError(f"te_compile verify: cuDNN {why}; spec {s.describe()}, q {tuple(q.shape)} {q.dtype}")
    log.info("te_compile verify: backward (%s) agrees with the reference", s.describe())
