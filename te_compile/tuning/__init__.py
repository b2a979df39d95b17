"""Serve where it is measured faster: the graph timed with a class of its sites on cuDNN and without, on request.

``speed_reason`` (the ``serve="fastest"`` check) decides a site cuDNN can serve from, in order: a measurement in
the persistent cache (``tuning.cache``) for the graph being compiled and the site's class
(te_compile.tuning.rules.site_class); a new one when measuring is on (``mode="max-autotune"``, ``te_compile.tune`` /
``te-compile tune``: ``tuning.graph_ab``); otherwise the rule for its class (``te_compile.tuning.rules``). A class is
served only when its graph measured faster by ``timing.serve_on_cudnn``. Under CUDA graphs, with symbolic shapes,
without real inputs or when the graph writes into an input, nothing is measured and the rules decide.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
from typing import Iterator, Optional

import torch

from ..layout import size_hints
from ..reasons import SLOWER, Reason
from ..spec import AttentionSpec
from . import cache
from .timing import MIN_MARGIN, Measurement, serve_on_cudnn

_measuring: contextvars.ContextVar[bool] = contextvars.ContextVar("te_compile_measuring", default=False)
_progress: contextvars.ContextVar = contextvars.ContextVar("te_compile_tune_progress", default=None)
#: the graph being rewritten: (its cache key maker: class -> key, or None) and the classes its sites fell in
_graph: contextvars.ContextVar = contextvars.ContextVar("te_compile_tuning_graph", default=None)
#: class -> serve? while a graph variant for a measurement is rewritten
_force: contextvars.ContextVar[dict] = contextvars.ContextVar("te_compile_tuning_force", default={})


@contextlib.contextmanager
def _set(var: contextvars.ContextVar, value, result=None) -> Iterator:
    token = var.set(value)
    try:
        yield result
    finally:
        var.reset(token)


def measuring(on: bool = True):
    """Measure undecided classes while compiling inside this block (what mode="max-autotune" and tune() use)."""
    return _set(_measuring, on)


def is_measuring() -> bool:
    return _measuring.get()


def progress(echo):
    """``echo(line)`` gets one line per graph measured inside this block (te-compile tune's progress)."""
    return _set(_progress, echo)


def progress_echo():
    """The progress callback of the enclosing ``progress`` block, or None."""
    return _progress.get()


@functools.lru_cache(maxsize=4)
def platform(device_index: int = 0) -> dict:
    """The GPU and library versions a measurement belongs to."""
    from ..cudnn import versions
    gpu = torch.cuda.get_device_name(device_index) if torch.cuda.is_available() else "cpu"
    return {"gpu": gpu, "cudnn": versions.running(), "torch": torch.__version__.split("+")[0]}


class GraphScope:
    """What ``speed_reason`` knows of the graph being rewritten: how to key its measurements (``key(cls)``, None:
    nothing is cached or measured for this graph) and the classes of the sites it decided (``classes``)."""

    def __init__(self, key=None):
        self.key = key
        self.classes: dict = {}  # class -> needs_grad of its sites


def graph(scope: Optional[GraphScope]):
    return _set(_graph, scope, scope)


def forcing(force: dict):
    """Rewrite with the classes of ``force`` served (True) or kept (False): the two variants of a measurement."""
    return _set(_force, force)


def _class(q, k, bias, spec: AttentionSpec, need_dbias: bool) -> Optional[str]:
    from .rules import site_class
    shape = size_hints((q.shape[1], q.shape[2], k.shape[2]))
    return None if shape is None else site_class(spec, bias is not None, need_dbias, shape[1], shape[2], shape[0])


def describe(m: Measurement, cls: str, plat: Optional[dict] = None) -> str:
    from ..cudnn.versions import describe as version
    p = plat or platform()
    took = f", measuring took {m.seconds:.1f} s" if m.seconds else ""
    return (f"measured: the graph ran {m.te_ms:.3f} ms with its {cls} sites on cuDNN vs {m.tc_ms:.3f} ms on "
            f"torch.compile, cuDNN faster in {m.wins} of {len(m.ratios)} rounds ({p['gpu']}, cuDNN "
            f"{version(p['cudnn'])}{took})")


_notes: dict = {}


def _note_key(spec: AttentionSpec, q) -> tuple:
    return spec.key(), None if q is None else tuple(size_hints(tuple(q.shape)) or ())


def served_note(spec: AttentionSpec, q) -> str:
    """What the serve decision of this site (spec, q's shape) was based on, or "" (not decided by speed)."""
    return _notes.get(_note_key(spec, q), "")


def _served(spec: AttentionSpec, q, note: str) -> None:
    if len(_notes) > 4096:
        _notes.clear()
    _notes[_note_key(spec, q)] = note


def speed_reason(q, k, v, bias, spec: AttentionSpec, needs_grad: bool, need_dbias: bool,
                 cuda_graphs: bool = False) -> Optional[str]:
    """Why the site stays with torch.compile for speed, or None (serve it on cuDNN)."""
    from .rules import MEASURED_ON, decide, slower_reason
    if spec.impl != "cudnn":
        return None
    cls = _class(q, k, bias, spec, need_dbias)
    force = {} if cuda_graphs else _force.get()  # under CUDA graphs the rules alone decide (kernel time)
    if cls in force:
        return None if force[cls] else Reason(f"kept while its graph is measured without its {cls} sites", SLOWER)
    scope = None if cuda_graphs else _graph.get()
    entry = None
    if scope is not None and cls is not None:
        scope.classes[cls] = needs_grad
        entry = cache.get(scope.key(cls)) if scope.key else None
    m = Measurement.from_entry(entry) if entry else None
    if m is None:
        why = slower_reason(q, k, v, bias, spec, needs_grad, need_dbias, cuda_graphs=cuda_graphs)
        if not why:  # served: the rule that served it, for the report
            rule = decide(q, k, v, bias, spec, needs_grad, need_dbias, cuda_graphs=cuda_graphs)[1]
            _served(spec, q, Reason(f"{rule} ({MEASURED_ON}); not measured here: te-compile tune", short=rule.short))
        return why
    if serve_on_cudnn(m):
        _served(spec, q, Reason(f"served: {describe(m, cls)}",
                                short="served: measured faster on this GPU"))
        return None
    what = "training step" if needs_grad else "forward"
    why = (f"{what} of the whole model, te_compile.tune): the model measured {m.te_ms:.3f} ms with its measured-"
           f"faster sites on cuDNN vs {m.tc_ms:.3f} ms with plain torch.compile, cuDNN faster in {m.wins} of "
           f"{len(m.ratios)} rounds; its graph measured faster, the model's host time outside its graphs did not allow "
           "it (te_compile.api.model_check)" if entry.get("scope") == "model" else
           f"{what}): {describe(m, cls)}; cuDNN must win by {100 * MIN_MARGIN:.0f}% in the median round and in nearly "
           "every round (te_compile.tuning)")
    return Reason(f"kept for speed ({why}; te_compile.backend(serve='always') serves it anyway", SLOWER,
                  short="kept for speed: measured slower on this GPU")


__all__ = ["progress_echo", "speed_reason", "served_note", "measuring", "progress", "is_measuring",
           "describe", "platform", "graph", "forcing", "GraphScope"]
