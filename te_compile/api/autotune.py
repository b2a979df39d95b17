"""``te_compile.tune(model, *args)`` and ``te-compile tune MODULE:FACTORY``: measure a model's sites ahead of time.

Compiles the model once with te_compile (through ``explain``: entries of its own) with measuring on, so each class
of sites the cache does not know gets its graph A/B (te_compile.tuning.graph_ab); when a class measured faster, the
whole model is then timed as the user calls it (te_compile.api.model_check). Later compiles of the same graphs (any
process, same GPU, cuDNN and torch) decide from the cache.
"""

from __future__ import annotations

import time
from typing import Any, Callable, Optional

from ..tuning import measuring, progress
from ..tuning.graph_ab import measured_log


def tune(fn: Callable, *args: Any, mode: Optional[str] = None, echo: Optional[Callable[[str], None]] = print,
         **kwargs: Any):
    """Measure ``fn``'s undecided graphs on ``args``; returns (report, measurements made now). ``echo`` gets one
    progress line per measurement (None: silent)."""
    from . import model_check
    from .explain import explain

    start, t0 = len(measured_log), time.perf_counter()
    with measuring(), progress(echo):
        report = explain(fn, *args, mode=mode, serve="fastest", **kwargs)
    made = measured_log[start:]
    served = [c for c in made if c.get("served")]
    model = model_check.check(fn, args, kwargs, mode, served, echo)
    if model is not None and not model_check.stands(model):  # the report shows what the default policy now does
        with progress(None):
            report = explain(fn, *args, mode=mode, serve="fastest", **kwargs)
    if echo:
        whole = ", the whole model timed" if model is not None else ""
        echo(f"te-compile tune: {len(made)} graph measurement(s){whole} in {time.perf_counter() - t0:.1f} s; "
             f"{len(report.decisions)} site(s) in the model, {sum(d.runs_on == 'cudnn' for d in report.decisions)} "
             "on cuDNN")
    return report, made


__all__ = ["tune"]
