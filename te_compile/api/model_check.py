"""The whole-model check of ``te_compile.tune``: is the model, as the user calls it, faster as served?

A graph measurement (``tuning.graph_ab``) calls Inductor's compiled graph directly, so the host time a model spends
outside its graphs (Dynamo's guards, its wrapper's Python) is not in it; where a step is short, that host time can
decide (docs/cudnn-notes.md). ``tune`` has the model and its inputs: after measuring its graphs it compiles the
model with te_compile (deciding from the cache just filled) and with plain torch.compile, each with entries of its
own, and times whole calls in alternating rounds (forward; with grad mode on, also the gradients of every parameter
and input that requires grad). When the served model is slower in the median round (``stands``), every class this
tune run served because of a measurement is marked kept in the cache, with a reason that names this check.
``mode="max-autotune"`` at compile time has no model to call: only the graph measurements apply there.
"""

from __future__ import annotations

import statistics
import time
from typing import Any, Callable, Optional

import torch

from ..tuning import cache

from ..tuning.timing import Measurement, measure_pair, step, tensors, wall_timer

#: the length of one timed round of one variant, ms
ROUND_MS = 100.0
#: model checks made in this process (tests, ``tune``'s summary, the benchmark's rows)
model_log: list[dict] = []


def leaves(fn: Any, args: tuple, kwargs: dict) -> list[torch.Tensor]:
    """What a training step of ``fn`` takes gradients of: the module's parameters and the inputs that require grad."""
    out = [p for p in (fn.parameters() if isinstance(fn, torch.nn.Module) else ()) if p.requires_grad]
    return out + [t for t in tensors((list(args), kwargs)) if t.requires_grad]


def measure_model(fn: Any, args: tuple, kwargs: dict, mode: Optional[str], needs_grad: bool,
                  timer=None, compile_fn: Optional[Callable] = None) -> Measurement:
    """Time ``fn`` compiled with te_compile against ``fn`` compiled with plain torch.compile; te_ms is the former.
    ``compile_fn(fn, backend, mode)``: ``explain.isolated_compile`` (tests pass a fake)."""
    from ..backend import backend
    from .explain import isolated_compile
    from ..tuning.graph_ab import rng_restored
    compile_fn = compile_fn or isolated_compile
    t0 = time.perf_counter()
    cuda = any(t.is_cuda for t in tensors((list(args), kwargs)))
    with rng_restored():
        te, tc = (compile_fn(fn, b, mode) for b in (backend(), "inductor"))
        te, tc = (step(lambda f=f: f(*args, **kwargs), leaves(fn, args, kwargs), needs_grad) for f in (te, tc))
        m = measure_pair(te, tc, timer=timer or wall_timer(torch.cuda.synchronize if cuda else None),
                         target_ms=ROUND_MS)
    return Measurement(m.te_ms, m.tc_ms, m.noise, m.rounds, time.perf_counter() - t0, m.ratios)


def stands(m: Measurement) -> bool:
    """The served model is not slower: te_compile faster or even in the median round."""
    return statistics.median(m.ratios) >= 1.0


def check(fn: Any, args: tuple, kwargs: dict, mode: Optional[str], served: list[dict],
          echo: Optional[Callable[[str], None]] = None, timer=None,
          compile_fn: Optional[Callable] = None) -> Optional[Measurement]:
    """Time the whole model when ``served`` (this tune run's measurements that served a class on cuDNN) is not empty;
    when the served model is not faster, mark each of those graphs kept in the cache. None when nothing was timed."""
    if not served:
        return None
    needs_grad = torch.is_grad_enabled()
    m = measure_model(fn, args, kwargs, mode, needs_grad, timer, compile_fn)
    wins = stands(m)
    what = "training step" if needs_grad else "forward"
    model_log.append({"te_ms": m.te_ms, "tc_ms": m.tc_ms, "seconds": m.seconds, "served": wins, "what": what,
                      "graphs": len(served)})
    if echo:
        echo(f"  whole model ({what}): {m.te_ms:.3f} ms as served vs {m.tc_ms:.3f} ms with plain torch.compile -> "
             f"{'cuDNN stays' if wins else 'every measured site kept'} ({m.seconds:.1f} s)")
    if not wins:
        for g in served:
            cache.put(g["key"], m.as_entry(scope="model", graph=f"the whole model's {what}"))
    return m


__all__ = ["check", "measure_model", "leaves", "stands", "model_log", "ROUND_MS"]
