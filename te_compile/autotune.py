"""``te_compile.tune(model, *args)`` and ``te-compile tune MODULE:FACTORY``: measure a model's sites ahead of time.

Compiles the model once with te_compile (through ``explain``: its compiled entries are its own, so the user's
recompile budget is untouched), with measuring on: each site cuDNN can serve and the cache does not know yet is
timed against torch.compile's candidate on this GPU and stored (te_compile.tuning.cache), and each graph that
serves a site because it measured faster is timed whole (te_compile.tuning.graph_check). When a graph stayed
served, the whole model is then timed as the user calls it (te_compile.model_check: two more compiles,
with entries of their own), and a model that is not faster served keeps those sites. Later compiles of the same
sites (any process, same GPU, cuDNN and torch) decide from the cache and measure nothing.
"""

from __future__ import annotations

import time
from typing import Any, Callable, Optional

from .tuning import measured_log, measuring, progress


def tune(fn: Callable, *args: Any, mode: Optional[str] = None, echo: Optional[Callable[[str], None]] = print,
         **kwargs: Any):
    """Measure ``fn``'s undecided sites on ``args``; returns (report, measurements made now). ``echo`` gets one
    progress line per measured site (None: silent)."""
    from . import model_check
    from .explain import explain
    from .tuning.graph_check import checked_log

    start, graphs, t0 = len(measured_log), len(checked_log), time.perf_counter()
    with measuring(), progress(echo):
        report = explain(fn, *args, mode=mode, serve="fastest", **kwargs)
    made = measured_log[start:]
    served = [c for c in checked_log[graphs:] if c.get("served")]
    model = model_check.check(fn, args, kwargs, mode, served, echo)
    if model is not None and not model_check.stands(model):  # the report shows what the default policy now does
        with progress(None):
            report = explain(fn, *args, mode=mode, serve="fastest", **kwargs)
    if echo:
        checked = len(checked_log) - graphs
        whole = f", {checked} graph(s) timed whole" if checked else ""
        whole += ", the whole model timed" if model is not None else ""
        echo(f"te-compile tune: {len(made)} site(s) measured{whole} in {time.perf_counter() - t0:.1f} s; "
             f"{len(report.decisions)} site(s) in the model, {sum(d.runs_on == 'cudnn' for d in report.decisions)} "
             "on cuDNN")
    return report, made


__all__ = ["tune"]
