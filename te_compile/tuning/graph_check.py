"""The whole-graph check of measured decisions: is the graph faster with its measured-faster sites on cuDNN?

Each site is measured alone (``tuning.measure``, with the rest of the graph's GPU work simulated before each
call), but what a site costs inside a model also depends on the graph around it: how much host time the rest of
the graph needs (a small model's step is host-bound, and te_compile's op takes more host time per call than
Inductor's kernel launch), and layouts and fusions that change around a custom op. A Hugging Face model at 4 x
1024 tokens served sites that measured faster alone and ran its forward slower (docs/cudnn-notes.md).

So when measuring (``te_compile.tune``, ``mode="max-autotune"``), a graph that has other work besides its
attention sites and serves at least one site because it measured faster is compiled twice with Inductor, once as
rewritten and once with every site kept, and both are timed as whole graphs (forward, or forward + backward when
it needs gradients) in alternating rounds on the graph's own inputs. The served sites stay served only if the
rewritten graph wins by the same rule as a site (``timing.serve_on_cudnn``); otherwise all of them are kept, with
the reason. The verdict is cached under the graph's signature (its structure, shapes, dtypes and the platform,
not its node names), so a later compile of the same graph measures nothing and follows it.

Skipped (the per-site decisions stand) when there is nothing to decide (no site served by a measurement, or no
other work: a one-site graph is what the site measurement timed), under CUDA graphs, with symbolic shapes, when
the graph writes into one of its inputs (timing would run the write again and again), or without real inputs.
Random number generator states are restored after timing, so measuring does not change a model's dropout.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import operator
import re
import time
from typing import Any, Callable, Iterator, Optional

import torch

from ..fxcopy import copy_module
from ..reasons import SLOWER, Reason
from . import cache
from .timing import Measurement, measure_pair, serve_on_cudnn, wall_timer

log = logging.getLogger("te_compile")
#: the length of one timed round of one variant, ms
ROUND_MS = 50.0
#: graphs checked in this process (tests, tune's summary)
checked_log: list[dict] = []

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


def key(sig: str, needs_grad: bool, plat: dict) -> str:
    return json.dumps({"graph": sig, "grad": bool(needs_grad), **plat}, sort_keys=True, separators=(",", ":"))


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
    """Why the whole graph is not timed, or None."""
    from .graph_work import forward_gemm_flops
    if cuda_graphs:
        return "the graph runs under CUDA graphs"
    if forward_gemm_flops(original) <= 0:
        return "the graph has no other work to measure with"
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


def _step(compiled: Callable, inputs: list[Any], needs_grad: bool) -> Callable[[], object]:
    leaves = [x for x in inputs if isinstance(x, torch.Tensor) and x.requires_grad]
    if not needs_grad:
        def infer() -> object:
            with torch.no_grad():
                return compiled(*inputs)
        return infer

    def train() -> object:
        outs = compiled(*inputs)
        outs = [o for o in (outs if isinstance(outs, (list, tuple)) else [outs])
                if isinstance(o, torch.Tensor) and o.requires_grad]
        return torch.autograd.grad(outs, leaves, [torch.ones_like(o) for o in outs], allow_unused=True)
    return train


def _compile(gm: torch.fx.GraphModule, inputs: list[Any], needs_grad: bool) -> Callable:
    """Inductor on ``gm``, outside Dynamo's tracing context, the backward compiled with the forward (a backward
    compiled lazily inside a compile would wait for Dynamo's lock; te_compile.tuning.candidates)."""
    from torch._inductor.compile_fx import compile_fx
    cfg = torch._functorch.config
    patch = (cfg.patch(force_non_lazy_backward_lowering=True) if needs_grad else contextlib.nullcontext())
    with torch._guards.tracing(None), patch:
        return compile_fx(gm, inputs)


def measure_graph(gm: torch.fx.GraphModule, served: torch.fx.Graph, kept: torch.fx.Graph, inputs: list[Any],
                  needs_grad: bool, timer=None, compile_fn: Callable = _compile) -> Measurement:
    """Time the graph as rewritten (``served``) against the graph with every site kept; te_ms is the former."""
    from torch._subclasses.fake_tensor import unset_fake_temporarily
    t0 = time.perf_counter()
    cuda = any(isinstance(x, torch.Tensor) and x.is_cuda for x in inputs)
    with unset_fake_temporarily(), rng_restored():
        te = _step(compile_fn(copy_module(gm, served), inputs, needs_grad), inputs, needs_grad)
        tc = _step(compile_fn(copy_module(gm, kept), inputs, needs_grad), inputs, needs_grad)
        sync = torch.cuda.synchronize if cuda else None
        m = measure_pair(te, tc, timer=timer or wall_timer(sync), target_ms=ROUND_MS)
    return Measurement(m.te_ms, m.tc_ms, m.noise, m.rounds, time.perf_counter() - t0, m.ratios)


def verdict(gm: torch.fx.GraphModule, original: torch.fx.Graph, example_inputs: list[Any], measured: int,
            sites: int, cuda_graphs: bool, measuring: bool, plat: dict, timer=None,
            compile_fn: Callable = _compile, echo: Optional[Callable[[str], None]] = None) -> Optional[Reason]:
    """Keep every site of this graph (the reason), or None (the rewritten graph stands). ``measured``: the sites
    served because they measured faster; ``sites``: every site of the graph."""
    if measured == 0:
        return None
    why = skip_reason(original, example_inputs, cuda_graphs)
    sig = None if why else signature(copy_module(gm, original), example_inputs)
    if sig is None:
        log.info("te_compile: whole graph not measured (%s); the per-site measurements decide", why or "symbolic shapes")
        return None
    needs_grad = torch.is_grad_enabled() and any(isinstance(x, torch.Tensor) and x.requires_grad
                                                 for x in example_inputs)
    k = key(sig, needs_grad, plat)
    entry = cache.get(k)
    m = Measurement.from_entry(entry) if entry else None
    if m is None and measuring:
        try:
            m = measure_graph(gm, gm.graph, original, example_inputs, needs_grad, timer, compile_fn)
        except Exception as e:  # noqa: BLE001 - a failed measurement must not fail the user's compile
            log.warning("te_compile: measuring the whole graph failed (%s: %s); the per-site measurements decide",
                        type(e).__name__, str(e).splitlines()[0][:200] if str(e) else "")
            return None
        cache.put(k, m.as_entry(graph=f"{sites} site(s), {measured} measured faster"))
        checked_log.append({"key": k, "te_ms": m.te_ms, "tc_ms": m.tc_ms, "seconds": m.seconds,
                            "served": serve_on_cudnn(m)})
        if echo:
            pick = "cuDNN" if serve_on_cudnn(m) else "torch.compile"
            echo(f"  graph with {sites} site(s): {m.te_ms:.3f} ms with {measured} on cuDNN vs {m.tc_ms:.3f} ms "
                 f"with none -> {pick} ({m.seconds:.1f} s)")
    if m is None or serve_on_cudnn(m):
        return None
    what = "training step" if needs_grad else "forward"
    took = f", checking took {m.seconds:.1f} s" if m.seconds else ""
    if entry and entry.get("scope") == "model":
        return Reason(f"kept for speed ({what} of the whole model, te_compile.tune): the model measured "
                      f"{m.te_ms:.3f} ms with its measured-faster sites on cuDNN vs {m.tc_ms:.3f} ms with plain "
                      f"torch.compile, cuDNN faster in {m.wins} of {len(m.ratios)} rounds ({plat.get('gpu')}{took}); "
                      "the sites and their graph measured faster alone, the model's host time outside its graphs "
                      "did not allow it (te_compile.model_check); te_compile.backend(serve='always') serves "
                      "it anyway", SLOWER)
    return Reason(f"kept for speed ({what} of the whole graph): it measured {m.te_ms:.3f} ms with its {measured} "
                  f"measured-faster site(s) on cuDNN vs {m.tc_ms:.3f} ms with them on torch.compile, cuDNN faster in "
                  f"{m.wins} of {len(m.ratios)} rounds ({plat.get('gpu')}{took}); the site alone measured faster, "
                  "the graph around it did not (te_compile.tuning.graph_check); te_compile.backend(serve='always') "
                  "serves it anyway", SLOWER)


__all__ = ["verdict", "measure_graph", "signature", "skip_reason", "writes_an_input", "key", "checked_log",
           "rng_restored"]
