"""``verify``: on the first call of each configuration, compare the cuDNN result with the reference.

Enabled per backend (``te_compile.backend(verify=True)`` / ``te_compile.compile(..., verify=True)``);
the flag travels in the spec, so the op checks itself: the first time it runs a (spec, shapes,
dtypes) on cuDNN it also runs the reference math and raises ``VerificationError`` with the error
figures if they disagree beyond bf16/fp16 tolerance. Later calls of that configuration are not
checked again (it is a first-call check, not a per-call cost).
"""

from __future__ import annotations

import threading
from typing import Optional, Sequence

import torch
from torch import Tensor

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
