"""Seconds and counts of te_compile's compile-time phases, summed over the process (bench/compile_time.py reads them).

Phases (nested ones are included in their parent): ``decide`` (find the sites, translate them, the support check and
the speed decision, the rewrite), inside it ``support check`` (te_compile.cudnn.check) and, inside that, ``check plan
builds`` (cuDNN plans built by the check on a machine with the call's GPU), and ``speed decision``
(te_compile.tuning, te_compile.tuning.rules); ``inner compile`` (the inner compiler on the rewritten graph: Inductor's
forward, and its backward where it compiles with the forward); ``finish`` (record and log the report), inside it
``native`` (turning the native call path on: its C++ build, once per machine, or loading it).
"""

from __future__ import annotations

import contextlib
import threading
import time
from typing import Iterator

_lock = threading.Lock()
_totals: dict[str, list] = {}


@contextlib.contextmanager
def timed(phase: str) -> Iterator[None]:
    """Add the block's wall time to ``phase`` (and count it once)."""
    t0 = time.perf_counter()
    try:
        yield
    finally:
        dt = time.perf_counter() - t0
        with _lock:
            entry = _totals.setdefault(phase, [0.0, 0])
            entry[0] += dt
            entry[1] += 1


def snapshot() -> dict[str, dict]:
    """{phase: {"seconds": total, "count": times entered}} so far."""
    with _lock:
        return {k: {"seconds": v[0], "count": v[1]} for k, v in _totals.items()}


def reset() -> None:
    with _lock:
        _totals.clear()


__all__ = ["timed", "snapshot", "reset"]
