"""Every count te_compile keeps, in one object per process: ``snapshot()`` reads them all.

* ``phases``: seconds and entries of te_compile's compile-time phases (bench/compile_time.py reads them). Nested ones
  are included in their parent: ``decide`` (find the sites, translate them, the support check and the speed
  decision, the rewrite), inside it ``support check`` (te_compile.cudnn.check) and, inside that, ``check plan builds``
  (cuDNN plans built by the check on a machine with the call's GPU), and ``speed decision`` (te_compile.tuning);
  ``inner compile`` (the inner compiler on the rewritten graph); ``finish`` (record and log the report), inside it
  ``native`` (turning the native call path on: its C++ build, once per machine, or loading it).
* ``fallbacks``: (spec key, "forward" | "backward") -> calls of a served site that ran the reference math because
  cuDNN declined the graph at run time (every call counts, so a test or the fuzzer can tell which implementation
  ran), with cuDNN's reason for the last one (``fallback_reasons``).
* ``declined``: "<direction>: <reason>" -> signatures the native call path left to Python.
* the native call path's own counts (calls it ran, replays, captures, live plans, failed runners), kept in C++ and
  read through the source te_compile.cudnn.native adds (``add_source``).
"""

from __future__ import annotations

import collections
import contextlib
import threading
import time
from typing import Callable, Iterator

_lock = threading.Lock()
_phases: dict[str, list] = {}
fallbacks: "collections.Counter[tuple[str, str]]" = collections.Counter()
fallback_reasons: dict[tuple[str, str], str] = {}
declined: dict[str, int] = {}
_sources: dict[str, Callable[[], dict]] = {}


@contextlib.contextmanager
def timed(phase: str) -> Iterator[None]:
    """Add the block's wall time to ``phase`` (and count it once)."""
    t0 = time.perf_counter()
    try:
        yield
    finally:
        dt = time.perf_counter() - t0
        with _lock:
            entry = _phases.setdefault(phase, [0.0, 0])
            entry[0] += dt
            entry[1] += 1


def phases() -> dict[str, dict]:
    """{phase: {"seconds": total, "count": times entered}} so far."""
    with _lock:
        return {k: {"seconds": v[0], "count": v[1]} for k, v in _phases.items()}


def fallback(spec_key: str, direction: str, why: str) -> bool:
    """Count one call that ran the reference math; True for the first of its site and direction (warn once)."""
    with _lock:
        first = (spec_key, direction) not in fallbacks
        fallbacks[(spec_key, direction)] += 1
        fallback_reasons[(spec_key, direction)] = why
        return first


def decline(direction: str, why: str) -> None:
    """Count one signature the native call path left to Python, by reason."""
    key = f"{direction}: {why}"
    with _lock:
        declined[key] = declined.get(key, 0) + 1


def add_source(name: str, read: Callable[[], dict]) -> None:
    """Counts kept elsewhere (the native path's C++ counters), read by ``snapshot()`` under ``name``."""
    _sources[name] = read


def snapshot() -> dict:
    """Every count: {"phases": ..., "fallbacks": {"<spec key> <direction>": calls}, "declined": ..., and each
    source's counts ({} while it has none)}."""
    with _lock:
        out: dict = {"phases": {k: {"seconds": v[0], "count": v[1]} for k, v in _phases.items()},
                     "fallbacks": {f"{k} {d}": n for (k, d), n in fallbacks.items()},
                     "declined": dict(declined)}
    for name, read in list(_sources.items()):
        out[name] = read()
    return out


def reset() -> None:
    """Zero every count kept in Python (the phases, fallbacks and declined signatures)."""
    with _lock:
        _phases.clear()
        fallbacks.clear()
        fallback_reasons.clear()
        declined.clear()


__all__ = ["timed", "phases", "fallback", "decline", "add_source", "snapshot", "reset"]
