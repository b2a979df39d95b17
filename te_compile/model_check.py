"""The whole-model check of ``te_compile.tune``: is the model, as the user calls it, faster as served?

A measurement (``tuning.graph_ab``) times a graph with a class of its sites on cuDNN against it with them kept,
but it calls Inductor's compiled graph directly: the host time the model spends outside its graphs (Dynamo's
guards, the Python of the model's wrapper code) is not in it. Where a model's step is short, that host time
decides: a Hugging Face model passed the graph check for inference (its graph faster served) and ran its forward
slower as a whole (docs/cudnn-notes.md), because te_compile's op took more host time per call
than Inductor's kernels and the step became host-bound.

``tune`` has the model and its inputs, so after measuring its graphs it compiles the model twice, with te_compile
(deciding from the cache just filled) and with plain torch.compile, each with compiled entries of its own, and
times whole calls in alternating rounds (forward; or forward and the gradients of every parameter and input that
requires grad, when grad mode is on). The graph measurements have already found the served classes faster; this
check looks for the opposite, a model made slower by host time: when the served model is slower in the median
round (``stands``), every class this tune run served because of a measurement is marked kept in the cache, and
the default policy then keeps those sites too, with a reason that names this check. A win too small or too noisy
for the measurement's rule leaves the graph's verdict (that rule here kept a long-context model whose served
forward was clearly faster: docs/cudnn-notes.md). ``mode="max-autotune"`` at compile time has no model to call, so
there only the graph measurements apply.
"""

from __future__ import annotations

import statistics
import time
from typing import Any, Callable, Mapping, Optional

import torch

from .tuning import cache

from .tuning.timing import Measurement, measure_pair, wall_timer

#: the length of one timed round of one variant, ms
ROUND_MS = 100.0
#: model checks made in this process (tests, ``tune``'s summary, the benchmark's rows)
model_log: list[dict] = []


def _tensors(x: Any) -> list[torch.Tensor]:
    """Every tensor in a model's output (tensors, tuples, lists, dicts and dict-like outputs)."""
    if isinstance(x, torch.Tensor):
        return [x]
    if isinstance(x, Mapping):
        x = list(x.values())
    if isinstance(x, (list, tuple)):
        return [t for item in x for t in _tensors(item)]
    return []


def step(compiled: Callable, fn: Any, args: tuple, kwargs: dict, needs_grad: bool) -> Callable[[], object]:
    """One call of ``compiled``: a forward without grad, or a forward and the gradients of every leaf (the
    module's parameters and the inputs that require grad; nothing accumulates into ``.grad``)."""
    if not needs_grad:
        def infer() -> object:
            with torch.no_grad():
                return compiled(*args, **kwargs)
        return infer
    leaves = [p for p in (fn.parameters() if isinstance(fn, torch.nn.Module) else ()) if p.requires_grad]
    leaves += [t for t in _tensors((list(args), kwargs)) if t.requires_grad]

    def train() -> object:
        outs = [o for o in _tensors(compiled(*args, **kwargs)) if o.requires_grad and o.is_floating_point()]
        if not outs or not leaves:
            return outs
        return torch.autograd.grad(outs, leaves, [torch.ones_like(o) for o in outs], allow_unused=True)
    return train


def measure_model(fn: Any, args: tuple, kwargs: dict, mode: Optional[str], needs_grad: bool,
                  timer=None, compile_fn: Optional[Callable] = None) -> Measurement:
    """Time ``fn`` compiled with te_compile against ``fn`` compiled with plain torch.compile; te_ms is the former.
    ``compile_fn(fn, backend, mode)``: ``explain.isolated_compile`` (tests pass a fake)."""
    from .backend import backend
    from .explain import isolated_compile
    from .tuning.graph_ab import rng_restored
    compile_fn = compile_fn or isolated_compile
    t0 = time.perf_counter()
    cuda = any(t.is_cuda for t in _tensors((list(args), kwargs)))
    with rng_restored():
        te = step(compile_fn(fn, backend(), mode), fn, args, kwargs, needs_grad)
        tc = step(compile_fn(fn, "inductor", mode), fn, args, kwargs, needs_grad)
        m = measure_pair(te, tc, timer=timer or wall_timer(torch.cuda.synchronize if cuda else None),
                         target_ms=ROUND_MS)
    return Measurement(m.te_ms, m.tc_ms, m.noise, m.rounds, time.perf_counter() - t0, m.ratios)


def stands(m: Measurement) -> bool:
    """The served model is not slower: te_compile faster or even in the median round."""
    if not m.ratios:
        return m.te_ms <= m.tc_ms
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


__all__ = ["check", "measure_model", "step", "stands", "model_log", "ROUND_MS"]
