"""Serve where it is measured faster: per-site measurements on the running GPU and cuDNN, cached on disk.

For a site cuDNN can serve, ``speed_reason`` (the ``serve="fastest"`` check) decides from, in order:

1. a measurement in the persistent cache (``tuning.cache``) for this site signature: spec, shapes, dtype,
   which gradients, GPU name, cuDNN and torch versions;
2. a new measurement, when measuring is on: ``torch.compile(..., mode="max-autotune")`` or
   ``te_compile.tune`` / ``te-compile tune`` (``measuring()``); it times te_compile's op against what plain
   torch.compile runs for the same site (``tuning.candidates``), in alternating rounds, and stores the result;
3. otherwise the rule for its site class (``te_compile.rules``), and the reason says so.

A site is served only when cuDNN measured faster in the median round and in nearly every round (``timing.serve_on_cudnn``).
Under CUDA graphs (mode="reduce-overhead") host time does not count and the candidates are not captured, so such
graphs are decided by the rules.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import json
import logging
from typing import Iterator, Optional

import torch

from ..layout import size_hints
from ..reasons import SLOWER, Reason
from ..spec import AttentionSpec
from . import cache
from .timing import MIN_MARGIN, Measurement, measure_pair, serve_on_cudnn, wall_timer

log = logging.getLogger("te_compile")
_measuring: contextvars.ContextVar[bool] = contextvars.ContextVar("te_compile_measuring", default=False)
_progress: contextvars.ContextVar = contextvars.ContextVar("te_compile_tune_progress", default=None)
#: the length of one timed round of one candidate, ms (each round runs as many calls as fit)
ROUND_MS = 25.0
#: less of the graph's other GPU work than this (ms) is not simulated when measuring
REST_MIN_MS = 0.05
#: sites measured in this process (for ``tune``'s summary and the tests: a second run measures nothing)
measured_log: list[dict] = []


@contextlib.contextmanager
def measuring(on: bool = True) -> Iterator[None]:
    """Measure undecided sites while compiling inside this block (what mode="max-autotune" and tune() use)."""
    token = _measuring.set(on)
    try:
        yield
    finally:
        _measuring.reset(token)


def is_measuring() -> bool:
    return _measuring.get()


def progress_echo():
    """The progress callback of the enclosing ``progress`` block, or None."""
    return _progress.get()


@contextlib.contextmanager
def progress(echo) -> Iterator[None]:
    """``echo(line)`` gets one line per site measured inside this block (te-compile tune's progress)."""
    token = _progress.set(echo)
    try:
        yield
    finally:
        _progress.reset(token)


@functools.lru_cache(maxsize=4)
def platform(device_index: int = 0) -> dict:
    """The GPU and library versions a measurement belongs to."""
    from ..cudnn import versions
    gpu = torch.cuda.get_device_name(device_index) if torch.cuda.is_available() else "cpu"
    return {"gpu": gpu, "cudnn": versions.running(), "torch": torch.__version__.split("+")[0]}


def _shape(t) -> Optional[list[int]]:
    from ..layout import size_hints
    if t is None:
        return None
    s = size_hints(tuple(t.shape))
    return None if s is None else list(s)


def site_key(q, k, v, bias, spec: AttentionSpec, needs_grad: bool, need_dbias: bool,
             plat: Optional[dict] = None, rest: float = 0.0) -> Optional[str]:
    """The cache key of a site (None: symbolic shapes); ``rest``: ms of the graph's other GPU work the
    candidates run with (``rest_ms``), in the key at two significant digits when it is not negligible."""
    shapes = [_shape(t) for t in (q, k, v)]
    if any(s is None for s in shapes):
        return None
    d = {"spec": spec.key(), "q": shapes[0], "k": shapes[1], "v": shapes[2], "bias": _shape(bias),
         "dtype": str(q.dtype).replace("torch.", ""), "grad": [bool(needs_grad), bool(need_dbias)],
         **(plat or platform()), **({"rest": float(f"{rest:.2g}")} if rest >= REST_MIN_MS else {})}
    return json.dumps(d, sort_keys=True, separators=(",", ":"))


def lookup(key: Optional[str]) -> Optional[Measurement]:
    entry = cache.get(key) if key else None
    return Measurement.from_entry(entry) if entry else None


#: the matrix-multiply throughput the graph's other GPU work is timed at, TFLOP/s (bf16 on sm90)
REST_TFLOPS = 500.0


def rest_ms(q, k, v, bias, spec: AttentionSpec, needs_grad: bool, need_dbias: bool) -> float:
    """ms of the compiling graph's other GPU work credited to this site (te_compile.tuning.graph_work.rest_ms); 0 off
    CUDA, below REST_MIN_MS, and for bands narrower than causal (sliding windows: served in Hugging Face models'
    training steps they measured slower than Inductor with that work around them, docs/cudnn-notes.md)."""
    from . import graph_work
    from ..rules import site_class
    if getattr(q, "device", None) is None or q.device.type != "cuda":
        return 0.0
    shape = size_hints((q.shape[1], q.shape[2], k.shape[2]))
    if shape is None or site_class(spec, bias is not None, need_dbias, shape[1], shape[2], shape[0]) == "flex narrow band":
        return 0.0
    ms = graph_work.rest_ms(needs_grad, REST_TFLOPS)
    return ms if ms >= REST_MIN_MS else 0.0


def measure(q, k, v, bias, spec: AttentionSpec, needs_grad: bool, need_dbias: bool, key: str,
            timer=None, rest: float = 0.0) -> Optional[Measurement]:
    """Time the two candidates of this site and store the result (None: the site cannot be rebuilt). ``rest``:
    ms of GPU work run before each call of both (the rest of the site's graph; candidates.busy)."""
    import dataclasses
    import time

    from torch._subclasses.fake_tensor import unset_fake_temporarily

    from .candidates import build, busy
    t0 = time.perf_counter()
    with unset_fake_temporarily():
        pair = build(q, k, v, bias, spec, needs_grad, need_dbias)
        if pair is None:
            return None
        if rest > 0:
            pair = busy(pair, rest, q.device)
        sync = torch.cuda.synchronize if q.device.type == "cuda" else None
        m = measure_pair(*pair, timer=timer or wall_timer(sync), target_ms=ROUND_MS)
    m = dataclasses.replace(m, seconds=time.perf_counter() - t0)  # the candidates' compiles included
    cache.put(key, m.as_entry(site=spec.describe()))
    measured_log.append({"key": key, "te_ms": m.te_ms, "tc_ms": m.tc_ms, "seconds": m.seconds})
    echo = _progress.get()
    if echo:
        pick = "cuDNN" if serve_on_cudnn(m) else "torch.compile"
        busy_note = f", after {rest:.2f} ms of other GPU work per call" if rest else ""
        echo(f"  site {len(measured_log)}: {spec.describe()}: {m.te_ms:.3f} ms on cuDNN vs {m.tc_ms:.3f} ms "
             f"torch.compile{busy_note} -> {pick} ({m.seconds:.1f} s)")
    log.info("te_compile: measured %s: %.3f ms on cuDNN vs %.3f ms torch.compile (%.1f s)", spec.describe(),
             m.te_ms, m.tc_ms, m.seconds)
    return m


def describe(m: Measurement, plat: Optional[dict] = None, rest: float = 0.0) -> str:
    from ..cudnn.versions import describe as version
    p = plat or platform()
    took = f", tuning took {m.seconds:.1f} s" if m.seconds else ""
    rounds = (f"cuDNN faster in {m.wins} of {len(m.ratios)} rounds" if m.ratios
              else f"noise {100 * m.noise:.0f}%")
    busy = f", each call after {rest:.2f} ms of the graph's other GPU work" if rest else ""
    return (f"measured: {m.te_ms:.3f} ms on cuDNN vs {m.tc_ms:.3f} ms torch.compile{busy}, {rounds} "
            f"({p['gpu']}, cuDNN {version(p['cudnn'])}{took})")


_notes: dict = {}


def _note_key(spec: AttentionSpec, q) -> tuple:
    return spec.key(), None if q is None else tuple(_shape(q) or ())


def served_note(spec: AttentionSpec, q) -> str:
    """What the serve decision of this site (spec, q's shape) was based on, or "" (not decided by speed)."""
    return _notes.get(_note_key(spec, q), "")


def _served(spec: AttentionSpec, q, note: str) -> None:
    if len(_notes) > 4096:
        _notes.clear()
    _notes[_note_key(spec, q)] = note


def _rule_note(q, k, v, bias, spec: AttentionSpec, needs_grad: bool, need_dbias: bool) -> str:
    from ..rules import served_note
    return served_note(q, k, v, bias, spec, needs_grad, need_dbias) + "; not measured here: te-compile tune"


def speed_reason(q, k, v, bias, spec: AttentionSpec, needs_grad: bool, need_dbias: bool,
                 cuda_graphs: bool = False) -> Optional[str]:
    """Why the site stays with torch.compile for speed, or None (serve it on cuDNN)."""
    from ..rules import slower_reason
    if spec.impl != "cudnn" or cuda_graphs:
        return slower_reason(q, k, v, bias, spec, needs_grad, need_dbias, cuda_graphs=cuda_graphs)
    rest = rest_ms(q, k, v, bias, spec, needs_grad, need_dbias)
    key = site_key(q, k, v, bias, spec, needs_grad, need_dbias, rest=rest)
    m = lookup(key)
    if m is None and key is not None and is_measuring():
        try:
            m = measure(q, k, v, bias, spec, needs_grad, need_dbias, key, rest=rest)
        except Exception as e:  # noqa: BLE001 - a failed measurement must not fail the user's compile
            log.warning("te_compile: measuring %s failed (%s: %s); the rules decide it", spec.describe(),
                        type(e).__name__, e)
    if m is None:
        why = slower_reason(q, k, v, bias, spec, needs_grad, need_dbias, cuda_graphs=cuda_graphs)
        if not why:
            _served(spec, q, _rule_note(q, k, v, bias, spec, needs_grad, need_dbias))
        return why
    if serve_on_cudnn(m):
        _served(spec, q, f"served: {describe(m, rest=rest)}")
        return None
    what = "training step" if needs_grad else "forward"
    return Reason(f"kept for speed ({what}): {describe(m, rest=rest)}; cuDNN must win by {100 * MIN_MARGIN:.0f}% in the median "
                  "round and in nearly every round (te_compile.tuning); te_compile.backend(serve='always') serves it "
                  "anyway", SLOWER)


__all__ = ["progress_echo", "speed_reason", "served_note", "measuring", "progress", "is_measuring", "site_key", "lookup", "measure", "describe", "platform",
           "measured_log"]
