"""Measurement on request: a graph timed with the sites of one class on cuDNN and with them on torch.compile.

Each class of sites cuDNN can serve (te_compile.tuning.rules.site_class) gets one A/B: the graph rewritten with those sites
on cuDNN and with them kept (every other site as the cache or the rules decide it), both compiled with Inductor and
timed whole (forward, or forward + backward) in alternating rounds on the graph's own inputs: what a site costs
depends on the graph around it, so the graph is what is timed (document ids as a loader gives them: integer inputs
get a new version before each call, so what te_compile keeps per ids is built again). The verdict is cached under
the graph's signature (structure, shapes, dtypes, platform; not node names) and the class. Nothing is measured under CUDA graphs, with
symbolic shapes, without real inputs, or when the graph writes into an input; random number generator states are
restored after timing.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import logging
import operator
import re
import time
from typing import Any, Callable, Iterator, Optional

import torch

from ..runtime.direct import direct_callable
from ..fxcopy import copy_module
from . import cache
from .timing import Measurement, measure_pair, serve_on_cudnn, step, wall_timer

log = logging.getLogger("te_compile")
#: the length of one timed round of one variant, ms
ROUND_MS = 50.0
#: classes measured in this process (tests, tune's summary, the whole-model check): key, ms, served
measured_log: list[dict] = []

_VIEWS = {"view", "reshape", "transpose", "permute", "t", "expand", "unsqueeze", "squeeze", "narrow", "select",
          "split", "chunk", "unbind", "unflatten", "flatten", "view_as", "as_strided", "__getitem__", "contiguous"}


def _name(target: Any) -> str:
    if isinstance(target, str):
        return target
    mod = getattr(target, "__module__", "") or ""
    return f"{mod}.{getattr(target, '__qualname__', getattr(target, '__name__', repr(target)))}"


class _Symbolic(Exception):
    pass


def _meta(v: Any) -> Any:
    if isinstance(v, torch.SymInt):
        raise _Symbolic
    if not isinstance(v, torch.Tensor):
        return None
    if not all(isinstance(d, int) for d in v.shape):
        raise _Symbolic
    return [list(v.shape), str(v.dtype).replace("torch.", ""), v.device.type]


def signature(gm: torch.fx.GraphModule, example_inputs: list[Any]) -> Optional[str]:
    """A hash of the graph's structure (ops, how they connect, shapes and dtypes, the code of its submodules:
    a flex score_mod) and of its inputs, independent of node names; None with symbolic shapes."""
    try:
        return _signature(gm, example_inputs)
    except _Symbolic:
        return None


def _signature(gm: torch.fx.GraphModule, example_inputs: list[Any]) -> str:
    index: dict = {}
    parts: list[str] = []
    for i, n in enumerate(gm.graph.nodes):
        index[n] = i
        args = torch.fx.node.map_arg((n.args, n.kwargs), lambda a: f"%{index[a]}")
        target = "input" if n.op == "placeholder" else _name(n.target)
        sub = getattr(gm, n.target, None) if n.op == "get_attr" else None
        if isinstance(sub, torch.fx.GraphModule):
            target += "{" + re.sub(r"\b[lL]_\w+", "x", sub.code) + "}"
        parts.append(f"{n.op}|{target}|{args!r}|{_meta(n.meta.get('example_value', n.meta.get('val')))}")
    for x in example_inputs:
        parts.append(f"in|{_meta(x)}|{x.requires_grad}" if isinstance(x, torch.Tensor) else f"in|{_meta(x)}|{x!r}")
    text = re.sub(r"0x[0-9a-f]+", "", "\n".join(parts))
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def key(sig: str, cls: str, needs_grad: bool, plat: dict) -> str:
    return json.dumps({"graph": sig, "class": cls, "grad": bool(needs_grad), **plat}, sort_keys=True,
                      separators=(",", ":"))


def writes_an_input(graph: torch.fx.Graph) -> bool:
    """Does an in-place op write into a graph input (or a view of one)?"""
    aliases: set = set()
    for n in graph.nodes:
        if n.op == "placeholder":
            aliases.add(n)
            continue
        name = n.target if n.op == "call_method" else getattr(n.target, "__name__", "")
        first = n.args[0] if n.args else None
        if first not in aliases or not isinstance(name, str):
            continue
        if name in _VIEWS or n.target is operator.getitem:
            aliases.add(n)
        elif n.target is operator.setitem or (name.endswith("_") and not name.startswith("__")):
            return True
    return False


def skip_reason(original: torch.fx.Graph, example_inputs: list[Any], cuda_graphs: bool) -> Optional[str]:
    """Why the graph is not timed, or None."""
    if cuda_graphs:
        return "the graph runs under CUDA graphs"
    if any(isinstance(x, torch.SymInt) for x in example_inputs):
        return "symbolic shapes"
    if any(isinstance(x, torch._subclasses.FakeTensor) for x in example_inputs):
        return "no real inputs to time with"
    if writes_an_input(original):
        return "the graph writes into one of its inputs"
    return None


@contextlib.contextmanager
def rng_restored() -> Iterator[None]:
    cpu = torch.get_rng_state()
    cuda = torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None
    try:
        yield
    finally:
        torch.set_rng_state(cpu)
        if cuda is not None:
            torch.cuda.set_rng_state_all(cuda)


def _compile(gm: torch.fx.GraphModule, inputs: list[Any], needs_grad: bool) -> Callable:
    """Inductor on ``gm``, outside Dynamo's tracing context, the backward compiled with the forward (a backward
    compiled lazily inside a compile would wait for Dynamo's lock: on a GPU the autograd engine runs the backward
    on its device thread while this thread holds the lock)."""
    from torch._inductor.compile_fx import compile_fx
    cfg = torch._functorch.config
    patch = (cfg.patch(force_non_lazy_backward_lowering=True) if needs_grad else contextlib.nullcontext())
    with torch._guards.tracing(None), patch:
        return direct_callable(gm) or compile_fx(gm, inputs)  # te_compile ops only: called as the backend calls it


def measure_graph(served: torch.fx.GraphModule, kept: torch.fx.GraphModule, inputs: list[Any], needs_grad: bool,
                  timer=None, compile_fn: Callable = _compile, fresh: list = ()) -> Measurement:
    """Time the graph with a class of its sites on cuDNN (``served``) against it with them kept; te_ms is the
    former. ``fresh``: tensors given a new version before every call (a loader's new document ids)."""
    from torch._subclasses.fake_tensor import unset_fake_temporarily
    t0 = time.perf_counter()
    leaves = [x for x in inputs if isinstance(x, torch.Tensor) and x.requires_grad]
    with unset_fake_temporarily(), rng_restored():
        te, tc = (compile_fn(g, inputs, needs_grad) for g in (served, kept))
        te, tc = (step(lambda f=f: f(*inputs), leaves, needs_grad) for f in (te, tc))
        if fresh:  # a loader's new ids before every call of either variant
            te, tc = (lambda f=f: (torch.autograd.graph.increment_version(fresh), f())[1] for f in (te, tc))
        sync = torch.cuda.synchronize if any(isinstance(x, torch.Tensor) and x.is_cuda for x in inputs) else None
        m = measure_pair(te, tc, timer=timer or wall_timer(sync), target_ms=ROUND_MS)
    return Measurement(m.te_ms, m.tc_ms, m.noise, m.rounds, time.perf_counter() - t0, m.ratios)


def needs_grad_of(example_inputs: list[Any]) -> bool:
    return torch.is_grad_enabled() and any(isinstance(x, torch.Tensor) and x.requires_grad for x in example_inputs)


def keyer(gm: torch.fx.GraphModule, original: torch.fx.Graph, example_inputs: list[Any], cuda_graphs: bool,
          plat: dict) -> Optional[Callable[[str], Optional[str]]]:
    """class -> the cache key of this graph's verdict for it (None: symbolic shapes); None when the graph is not
    measured. The signature is made at the first key asked for (while the sites are decided, before the rewrite)."""
    why = skip_reason(original, example_inputs, cuda_graphs)
    if why:
        log.info("te_compile: this graph is not measured (%s); the rules decide", why)
        return None
    sig = functools.cache(lambda: signature(copy_module(gm, original), example_inputs))
    return lambda cls: None if sig() is None else key(sig(), cls, needs_grad_of(example_inputs), plat)


def measure_classes(variant: Callable[[dict], torch.fx.GraphModule], example_inputs: list[Any],
                    classes: list[str], key_of: Callable[[str], str], timer=None, compile_fn: Callable = _compile,
                    echo: Optional[Callable[[str], None]] = None) -> int:
    """One A/B per class not in the cache yet: ``variant({cls: True})`` against ``variant({cls: False})``;
    stores each verdict and returns how many were measured. A failed measurement leaves that class to the rules."""
    needs_grad = needs_grad_of(example_inputs)
    made = 0
    for cls in classes:
        k = key_of(cls)
        if k is None or cache.get(k):
            continue
        try:
            ids = [x for x in example_inputs if isinstance(x, torch.Tensor) and not x.is_floating_point()]
            m = measure_graph(variant({cls: True}), variant({cls: False}), example_inputs, needs_grad, timer,
                              compile_fn, fresh=ids if cls.startswith("flex intervals, document ids") else [])
        except Exception as e:  # noqa: BLE001 - a failed measurement must not fail the user's compile
            log.warning("te_compile: measuring the graph for its %s sites failed (%s: %s); the rules decide them", cls,
                        type(e).__name__, str(e).splitlines()[0][:200] if str(e) else "")
            continue
        cache.put(k, m.as_entry(site=cls))
        made += 1
        served = serve_on_cudnn(m)
        measured_log.append({"key": k, "class": cls, "te_ms": m.te_ms, "tc_ms": m.tc_ms, "seconds": m.seconds,
                             "served": served})
        if echo:
            echo(f"  graph, {cls} sites: {m.te_ms:.3f} ms on cuDNN vs {m.tc_ms:.3f} ms on torch.compile -> "
                 f"{'cuDNN' if served else 'torch.compile'} ({m.seconds:.1f} s)")
        log.info("te_compile: measured the graph with its %s sites: %.3f ms on cuDNN vs %.3f ms on torch.compile "
                 "(%.1f s)", cls, m.te_ms, m.tc_ms, m.seconds)
    return made


__all__ = ["measure_classes", "measure_graph", "keyer", "signature", "skip_reason", "writes_an_input", "key",
           "measured_log", "rng_restored", "needs_grad_of"]
