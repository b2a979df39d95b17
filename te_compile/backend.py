"""The Dynamo backend: rewrite attention sites in the captured graph, then hand the graph on.

``torch.compile(model, backend="te_compile")`` (entry point ``torch_dynamo_backends``) uses the
defaults: cuDNN for CUDA sites, Inductor for everything else. ``te_compile.backend(...)`` makes a
backend with options. The rewrite happens on the Dynamo graph, before AOTAutograd, so the
inner compiler partitions our forward op into the forward graph and our backward op into the
backward graph, and the rest of the model is compiled as usual.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import os
import threading
from typing import Any, Callable, Optional

import torch
from torch.fx import GraphModule

from .passes.decision import TARGETS, deciding_for
from .passes.find import example_value
from .passes.rewrite import rewrite_graph
from .reasons import CUDNN_VERSION, SERVED_AFTER_INNER_FAILURE, SLOWER, Reason, category
from . import counters, tuning, user_warnings
from .runtime import stale_outputs
from .tuning import graph_ab
from .runtime.direct import direct_callable
from .fxcopy import copy_graph, copy_module
from .report import GraphReport, Report, record

log = logging.getLogger("te_compile")

INNER_COMPILERS = ("inductor", "aot_eager", "eager")


_DICT_TAG_SKIP = "skip_tensor_guards_with_matching_dict_tags"
_restore_dict_tag_skip = threading.local()


def _guard_requires_grad_flips() -> None:
    """Recompile when a parameter's requires_grad flips after compiling, for frames with a served site
    that reads a tensor besides q/k/v (``_depends_on_other_requires_grad``).

    The backward graph bakes need_dbias in as a literal (from ``ctx.needs_input_grad`` at trace
    time). On torch 2.11 Dynamo skips tensor guards on nn.Module parameters whose dict tags match
    (``torch._dynamo.config.skip_tensor_guards_with_matching_dict_tags``), so
    ``bias.requires_grad_(True)`` after compiling does not recompile: the stale graph would return no
    gradient for a now-learned bias (or compute dBias for a now-frozen one). Dynamo reads the setting
    while it builds a frame's guards, after the backend ran; so the backend turns the skip off for the
    frame it is compiling and an end-of-compile callback restores the user's value: other frames and
    other backends keep Dynamo's default (tests/test_dbias.py).
    """
    cfg = torch._dynamo.config
    if not getattr(cfg, _DICT_TAG_SKIP, False):
        return
    setattr(cfg, _DICT_TAG_SKIP, False)
    handler = getattr(torch._dynamo, "callback_handler", None)
    if handler is None:  # pragma: no cover - no compile callbacks: the skip stays off (correct, slower guards)
        return
    _restore_dict_tag_skip.value = True
    # registered here, not at import: torch._dynamo.reset() clears the callbacks
    if _restore_guard_setting not in handler.end_callbacks:
        handler.register_end_callback(_restore_guard_setting)


def _depends_on_other_requires_grad(decisions: list) -> bool:
    """Does a served site's graph depend on the requires_grad of a tensor other than q/k/v (an SDPA
    attn_mask / bias, the tensors a flex score_mod / mask_mod captures)? Only then does the frame need
    Dynamo's tensor guards on parameters (``_guard_requires_grad_flips``), which are checked on every
    call of the compiled model. A frame whose sites are all kept, or served without such operands, keeps
    Dynamo's default, so its guards are plain torch.compile's (a kept site must cost exactly what
    torch.compile costs). On the GPU the difference was within noise (docs/cudnn-notes.md, "Dynamo's dict-tag
    guard skip")."""
    for d in decisions:
        if d.rewrite and (d.site.attn_mask is not None or d.site.score_buffers or d.site.mask_buffers):
            return True
    return False


def _restore_guard_setting(*_: Any) -> None:
    """Dynamo's end-of-compile callback (runs once the frame's guards are built)."""
    if getattr(_restore_dict_tag_skip, "value", False):
        _restore_dict_tag_skip.value = False
        setattr(torch._dynamo.config, _DICT_TAG_SKIP, True)


SERVE = ("fastest", "always")


def _default_serve() -> str:
    from .env import value
    return value("TE_COMPILE_SERVE")


@dataclasses.dataclass(frozen=True)
class Options:
    inner: str = "inductor"
    target: str = "auto"
    verify: bool = False
    #: "fastest": serve a site on cuDNN only where it beats torch.compile (a measurement, else the rule for its
    #: site class, te_compile.tuning.rules); "always": wherever cuDNN can serve it (default from TE_COMPILE_SERVE)
    serve: str = dataclasses.field(default_factory=_default_serve)
    #: decide sites as if the graph runs under CUDA graphs (True) or not (False); None: from torch.compile's
    #: mode / options and Inductor's config (te_compile.explain(mode=...) sets it for its aot_eager compile)
    cuda_graphs: Optional[bool] = None
    #: decide every site as for this device ("cuda"), whatever device its inputs are on (te_compile.explain's
    #: for_device: what a GPU would run, asked on a CPU); the graph itself runs on its own device
    for_device: Optional[str] = None

    def __post_init__(self) -> None:
        if not isinstance(self.verify, bool):
            raise TypeError(f"verify must be True or False, got {self.verify!r}")
        if self.cuda_graphs is not None and not isinstance(self.cuda_graphs, bool):
            raise TypeError(f"cuda_graphs must be None, True or False, got {self.cuda_graphs!r}")
        if self.inner not in INNER_COMPILERS:
            raise ValueError(f"unknown inner compiler {self.inner!r}; expected one of {INNER_COMPILERS}")
        if self.target not in TARGETS:
            raise ValueError(f"unknown target {self.target!r}; expected one of {TARGETS}")
        if self.serve not in SERVE:
            raise ValueError(f"unknown serve policy {self.serve!r}; expected one of {SERVE}")
        if self.for_device not in (None, "cuda"):
            raise ValueError(f"for_device must be None or 'cuda', got {self.for_device!r}")
        if self.for_device is not None and self.target != "auto":
            raise ValueError("for_device decides for cuDNN: it goes with target='auto'")


def _checker(target: str, serve: str = "fastest", cuda_graphs: bool = False) -> Optional[Callable[..., Optional[str]]]:
    """The support check the passes call for sites bound for cuDNN: can cuDNN serve it (cudnn/check.py),
    and, under serve="fastest", is it faster there (te_compile.tuning, te_compile.tuning.rules; ``cuda_graphs``: the graph will run
    under CUDA graphs, so host time per call does not count)."""
    if target != "auto":
        return None
    try:
        from .cudnn.check import check
    except Exception as e:  # noqa: BLE001 - no usable cuDNN frontend: keep every site, say why
        from .cudnn.install import frontend_missing
        msg = frontend_missing(e)
        return lambda *a, **k: msg
    if cuda_graphs:
        check = _no_intervals(check)
    if serve == "always":
        return check

    def check_and_cost(*args: Any) -> Optional[str]:
        # the plan build (on a machine with the call's GPU) comes after the speed decision: a site kept for speed
        # costs no plan build. A measurement (tuning.is_measuring) needs the plans first: it times the classes of
        # the sites cuDNN can serve, and a variant that serves one runs it.
        if tuning.is_measuring():
            return check(*args) or _speed_reason(args, cuda_graphs)
        return check(*args, plans=False) or _speed_reason(args, cuda_graphs) or check(*args)
    return check_and_cost


def _no_intervals(check: Callable[..., Optional[str]]) -> Callable[..., Optional[str]]:
    """``check`` refusing cuDNN's interval kernels: the graph runs under CUDA graphs, and those kernels are not
    capture-safe (a replay failed; their plans allocate and synchronise), so such a site takes the graph path."""
    def checked(*args: Any, **kw: Any) -> Optional[str]:
        if args[4].intervals:
            return "under CUDA graphs: cuDNN's interval kernels are not capture-safe (docs/cudnn-notes.md)"
        return check(*args, **kw)
    return checked


def _speed_reason(args: tuple, cuda_graphs: bool) -> Optional[str]:
    with counters.timed("speed decision"):
        return tuning.speed_reason(*args, cuda_graphs=cuda_graphs)


_graph_counter = 0


def _inner_compile(inner: str, gm: GraphModule, example_inputs: list[Any],
                   inductor_config: Optional[dict] = None) -> Callable:
    if inner == "eager":
        return gm.forward
    if inner == "inductor" and inductor_config is not None:
        # the wrapper plain torch.compile(mode=..., options=...) itself compiles through, so a graph with
        # every site kept is compiled exactly as plain torch.compile compiles it
        return _inductor_wrapper(inductor_config)(gm, example_inputs)
    return torch._dynamo.lookup_backend(inner)(gm, example_inputs)


def _inductor_wrapper(config: dict) -> Callable:
    """torch's ``_TorchCompileInductorWrapper`` with ``config`` as its options (mode already expanded)."""
    wrapper_cls = getattr(torch, "_TorchCompileInductorWrapper", None)
    if wrapper_cls is None:  # pragma: no cover - a torch without it: compile_fx with the same patches
        from torch._inductor.compile_fx import compile_fx
        return lambda gm, ex: compile_fx(gm, ex, config_patches=config)
    return wrapper_cls(None, config, None)


_warned_mode: set = set()


def _inductor_config(inner: str, mode: Optional[str], options: Optional[dict]) -> Optional[dict]:
    """torch.compile's ``mode=`` / ``options=`` (passed to every custom backend) as Inductor config
    patches: ``mode="reduce-overhead"`` is CUDA graphs, ``"max-autotune"`` autotuning + CUDA graphs.
    Ignored, with a warning, when the inner compiler is not Inductor."""
    if not mode and not options:
        return None if inner != "inductor" else {}
    if inner != "inductor":
        key = (inner, mode, tuple(sorted((options or {}).items())))
        if key not in _warned_mode:
            _warned_mode.add(key)
            log.warning("te_compile: torch.compile(mode=%r, options=%r) applies to Inductor; inner=%r ignores it",
                        mode, options, inner)
        return None
    from torch._inductor import list_mode_options
    return {**(list_mode_options(mode) if mode and mode != "default" else {}), **(options or {})}


def compile_graph(gm: GraphModule, example_inputs: list[Any], options: Options,
                  mode: Optional[str] = None, inductor_options: Optional[dict] = None,
                  replay_report: bool = False) -> Callable:
    """Rewrite ``gm`` in place, record and log the decisions, then run the inner compiler. ``replay_report``:
    the compiled graph records its report again whenever it runs (te_compile.explain: see ``explain_backend``)."""
    original = copy_graph(gm.graph)
    inductor_config = _inductor_config(options.inner, mode, inductor_options)
    graphs_on = options.cuda_graphs if options.cuda_graphs is not None else _uses_cuda_graphs(options.inner,
                                                                                               inductor_config)
    checker = _checker(options.target, options.serve, graphs_on)
    with tuning.measuring(tuning.is_measuring() or _autotunes(mode, inductor_options)), counters.timed("decide"):
        decisions = _decide(gm, original, example_inputs, options, checker, graphs_on)
    guard_stale = graphs_on and options.inner == "inductor" and _is_cuda_graph(example_inputs)
    if guard_stale:  # an overwritten CUDA-graph output must raise, not crash (te_compile/runtime/stale_outputs.py)
        inductor_config = stale_outputs.without_static_launcher(inductor_config)
    if options.inner == "inductor" and _may_fail_in_inductor(decisions):
        with counters.timed("inner compile"):
            compiled, decisions = _compile_or_serve_kept(gm, example_inputs, options, original, decisions,
                                                         inductor_config, graphs_on)
        report = _finish(gm, decisions, options)
    else:
        direct = _direct(gm, options, inductor_config, graphs_on)
        report = _finish(gm, decisions, options, direct is not None)  # before Inductor, which changes gm in place
        if direct is not None:
            compiled = direct
        else:
            with counters.timed("inner compile"):
                compiled = _inner_compile(options.inner, gm, example_inputs, inductor_config)
    if replay_report:
        compiled = _replaying(compiled, report)
    return stale_outputs.raising_on_overwritten(compiled) if guard_stale else compiled


def _decide(gm: GraphModule, original: torch.fx.Graph, example_inputs: list[Any], options: Options, checker: Any,
            graphs_on: bool) -> list:
    """Rewrite ``gm``; under serve="fastest" each class of sites cuDNN can serve is decided by a measurement of this
    graph in the cache, or made now when measuring (te_compile.tuning.graph_ab), else by its rule."""
    if options.serve != "fastest" or checker is None or not _is_cuda_graph(example_inputs):
        return _rewrite(gm, original, options, checker)
    scope = tuning.GraphScope(graph_ab.keyer(gm, original, example_inputs, graphs_on, tuning.platform()))
    with tuning.graph(scope):
        decisions = _rewrite(gm, original, options, checker)
    if not (scope.key and scope.classes and tuning.is_measuring()):
        return decisions

    def variant(force: dict) -> GraphModule:
        g = copy_module(gm, original)
        with tuning.graph(tuning.GraphScope(scope.key)), tuning.forcing(force):
            _rewrite(g, copy_graph(original), options, checker)
        return g

    if graph_ab.measure_classes(variant, example_inputs, sorted(scope.classes), scope.key,
                                echo=tuning.progress_echo()) == 0:
        return decisions
    gm.graph = copy_graph(original)
    gm.recompile()
    with tuning.graph(scope):
        return _rewrite(gm, copy_graph(original), options, checker)


def _direct(gm: GraphModule, options: Options, inductor_config: Optional[dict], graphs_on: bool) -> Optional[Callable]:
    """The rewritten graph called directly when it holds only te_compile's ops (te_compile.runtime.direct), for
    Inductor with no mode or options and no CUDA graphs; None otherwise."""
    if options.inner != "inductor" or inductor_config or graphs_on:
        return None
    return direct_callable(gm)


def _replaying(compiled: Callable, report: GraphReport) -> Callable:
    """``compiled``, recording ``report`` (once per recorder) each time it runs."""

    @functools.wraps(compiled)
    def run(*args: Any) -> Any:
        record(report)
        return compiled(*args)

    return run


def _autotunes(mode: Optional[str], inductor_options: Optional[dict]) -> bool:
    """torch.compile's max-autotune modes, ``options={"max_autotune": True}`` and Inductor's own switch
    (``torch._inductor.config.max_autotune``, ``TORCHINDUCTOR_MAX_AUTOTUNE=1``) measure at compile time;
    te_compile measures its sites then too (te_compile.tuning)."""
    import torch._inductor.config as inductor_config
    return ((mode or "").startswith("max-autotune") or bool((inductor_options or {}).get("max_autotune"))
            or bool(inductor_config.max_autotune))


def _is_cuda_graph(example_inputs: list[Any]) -> bool:
    """Does the graph read a CUDA tensor (only then can Inductor run it under CUDA graphs)?"""
    return any(isinstance(x, torch.Tensor) and x.is_cuda for x in example_inputs)


def _may_fail_in_inductor(decisions: list) -> bool:
    """Does the graph keep for speed a flex site whose score_mod / mask_mod reads a tensor that needs a gradient (a
    learned table)? Inductor's flex backward was seen to fail to compile such a site (out of shared memory), so
    such a graph compiles its backward at once (``_compile_or_serve_kept``). Any other graph goes to Inductor as
    plain torch.compile hands it over, backward compiled lazily at its first call."""
    for d in decisions:
        if category(d.reason) != SLOWER or d.site.kind != "flex":
            continue
        out = example_value(d.site.node)
        if out is not None and not out.requires_grad:
            continue
        if any(getattr(example_value(b), "requires_grad", False) for b in (*d.site.score_buffers,
                                                                            *d.site.mask_buffers)):
            return True
    return False


def _compile_or_serve_kept(gm: GraphModule, example_inputs: list[Any], options: Options, original: torch.fx.Graph,
                           decisions: list, inductor_config: Optional[dict], graphs_on: bool) -> tuple[Callable, list]:
    """Compile a graph with sites kept for speed (cuDNN could serve them); if Inductor cannot compile it (its
    flex backward can run out of shared memory for a learned table), serve those sites and compile again.

    The backward is compiled with the forward here, not lazily at the first ``backward()``, so that its failure
    shows while the graph can still change. Returns (compiled callable, the decisions it was compiled with)."""
    import torch._functorch.config as functorch_config
    try:
        with functorch_config.patch(force_non_lazy_backward_lowering=True):
            return _inner_compile(options.inner, gm, example_inputs, inductor_config), decisions
    except Exception as e:  # noqa: BLE001 - the retry below either compiles or raises
        text = str(e).strip()
        failure = f"{type(e).__name__}: {text.splitlines()[0][:200]}" if text else type(e).__name__
    log.warning("te_compile: Inductor could not compile a graph with sites kept for speed (%s); serving them "
                "with te_compile and compiling again", failure)
    gm.graph = copy_graph(original)
    gm.recompile()
    kept = {d.site.name for d in decisions if category(d.reason) == SLOWER}
    decisions = _rewrite(gm, copy_graph(original), options, _checker(options.target, "always", graphs_on))
    for d in decisions:
        if d.rewrite and d.site.name in kept:
            d.reason = Reason(f"served although the speed decision keeps it: Inductor could not compile the graph "
                              f"with it kept ({failure})", SERVED_AFTER_INNER_FAILURE)
    return _inner_compile(options.inner, gm, example_inputs, inductor_config), decisions


def _rewrite(gm: GraphModule, original: torch.fx.Graph, options: Options, checker: Any) -> list:
    """``rewrite_graph``; a failed rewrite hands on the graph as Dynamo captured it (``original``)."""
    try:
        with deciding_for(options.for_device):
            return rewrite_graph(gm, options.target, checker, options.verify)
    except Exception as e:  # noqa: BLE001 - never break the user's model over a rewrite
        # the rewrite may have stopped half-way: hand on the graph as Dynamo captured it
        gm.graph = original
        gm.recompile()
        log.warning("te_compile: rewrite failed (%s: %s); graph left unchanged", type(e).__name__, e)
        return []


def _finish(gm: GraphModule, decisions: list, options: Options, direct: bool = False) -> GraphReport:
    """Record, log and trace the decisions of one compiled graph."""
    with counters.timed("finish"):
        return _finish_graph(gm, decisions, options, direct)


def _finish_graph(gm: GraphModule, decisions: list, options: Options, direct: bool) -> GraphReport:
    global _graph_counter
    _graph_counter += 1
    if _depends_on_other_requires_grad(decisions):
        _guard_requires_grad_flips()
    if options.verify and decisions and not any(d.runs_on == "cudnn" for d in decisions):
        msg = ("te_compile: verify=True compares cuDNN with the reference math, but no attention site of this "
               "graph runs on cuDNN (CPU inputs, target='reference', or kept sites): nothing is verified")
        user_warnings.warn(msg)  # not also logged: the CLI would print it twice
    for d in decisions:  # why a served site was judged faster (te_compile.tuning), for the report
        if d.runs_on == "cudnn" and d.spec is not None and not d.reason:
            d.note = tuning.served_note(d.spec, example_value(d.site.q))
    report = GraphReport(_graph_counter, decisions, gm.code, options, _cudnn_version(decisions, options),
                         _call_path(decisions, options), direct)
    record(report)
    for d in decisions:
        if d.rewrite:
            log.info("te_compile: %s -> %s (%s; %s)", d.name, d.runs_on, d.mask, d.spec.describe(with_mask=False))
        else:
            log.info("te_compile: %s kept: %s", d.name, d.reason)
    if decisions and log.isEnabledFor(logging.INFO):
        log.info("te_compile: graph %d\n%s", report.index, Report([report]).table(verbose=True))
    if decisions:
        _trace_artifact(report)
    return report


def _call_path(decisions: list, options: Options) -> str:
    """Turn the native call path on for a graph with a site on cuDNN (its build runs once per machine); its
    status line, "" when no site runs on cuDNN (or the sites were decided for a device this is not)."""
    if options.for_device is not None or not any(d.runs_on == "cudnn" for d in decisions):
        return ""
    from .cudnn import native
    with counters.timed("native"):
        return native.enable()


def _cudnn_version(decisions: list, options: Options) -> str:
    """The running cuDNN version ("9.19") when a site of the graph was decided for cuDNN, else ""."""
    if options.target != "auto" or not any(d.runs_on == "cudnn" or category(d.reason) == CUDNN_VERSION
                                           for d in decisions):
        return ""
    from .cudnn import versions
    return versions.describe(versions.running())


def _uses_cuda_graphs(inner: str, inductor_config: Optional[dict]) -> bool:
    """Will Inductor run this graph under CUDA graphs (mode="reduce-overhead" / "max-autotune", or
    torch._inductor.config.triton.cudagraphs)?"""
    if inner != "inductor":
        return False
    if inductor_config and "triton.cudagraphs" in inductor_config:
        return bool(inductor_config["triton.cudagraphs"])
    import torch._inductor.config as ic
    return bool(ic.triton.cudagraphs)


def _trace_artifact(report: GraphReport) -> None:
    """The site report as a structured-trace artifact (``TORCH_TRACE=/tmp/trace`` + ``tlparse``): a JSON
    ``te_compile_sites`` entry next to the graph's other compile artifacts. Costs nothing without a trace."""
    try:
        from torch._logging import trace_structured
    except ImportError:  # pragma: no cover
        return

    def payload() -> str:
        import json
        r = Report([report])
        return json.dumps({"table": r.table(), "summary": r.summary(), "sites": r.rows()}, indent=1)

    trace_structured("artifact", metadata_fn=lambda: {"name": "te_compile_sites", "encoding": "json"},
                     payload_fn=payload)


def backend(inner: str = "inductor", target: str = "auto", verify: bool = False,
            serve: Optional[str] = None, cuda_graphs: Optional[bool] = None) -> Callable:
    """A Dynamo backend with options, for ``torch.compile(model, backend=te_compile.backend(...))``.

    inner:  "inductor" (default), "aot_eager" or "eager": what compiles the rewritten graph.
    target: "auto" (cuDNN for CUDA sites; other devices keep their nodes) or "reference"
            (rewrite every servable site to the exact reference kernel; for tests and CPU).
    verify: on the first call of each configuration, compare cuDNN with the reference math and
            raise te_compile.VerificationError with the error figures if they disagree.
    serve:  "fastest" (default; or TE_COMPILE_SERVE): rewrite a CUDA site only where cuDNN beats
            torch.compile: measured (te-compile tune, mode="max-autotune"), else the rule for the site's class
            (te_compile.tuning.rules, from the measurements in docs/data); the report says "kept by the rule" or
            "kept for speed" otherwise. "always": wherever cuDNN can serve it.
    cuda_graphs: None (default): the decision learns from torch.compile's mode whether the graph runs
            under CUDA graphs (then host time does not count); True / False overrides that.
    """
    options_ = Options(inner=inner, target=target, verify=verify, cuda_graphs=cuda_graphs,
                       **({"serve": serve} if serve else {}))
    # one callable per set of options: Dynamo guards on the backend's identity (BACKEND_MATCH), so a new
    # callable per call recompiled every block of `for blk in layers: torch.compile(blk,
    # backend=te_compile.backend(...))` and ran the blocks past the recompile limit (8) eagerly
    with _backends_lock:
        be = _backends.get(options_)
        if be is None:
            be = _backends[options_] = _make_backend(options_)
    return be


_backends: dict[Any, Callable] = {}
_backends_lock = threading.Lock()


def explain_backend(measuring: bool, **kw: Any) -> Callable:
    """te_compile.explain's backend (``kw``: te_compile.backend's options): one callable per set of options and
    ``measuring``, never the one ``backend()`` returns, and its graphs record their report each time they run.

    Dynamo reuses a compiled entry for the backend callable that made it (BACKEND_MATCH). On torch < 2.13 the
    frames past a graph break inside a submodule run on the model's own code objects, so a later explain call
    reuses an earlier one's entries there: tracing nothing, it must still report those graphs' sites. A
    measuring call (te_compile.tune) gets callables of its own: reusing an entry compiled without measuring
    would measure nothing."""
    options_ = Options(**kw)
    key = (options_, "explain", bool(measuring))
    with _backends_lock:
        be = _backends.get(key)
        if be is None:
            be = _backends[key] = _make_backend(options_, replay_report=True)
    return be


def _make_backend(options_: Options, replay_report: bool = False) -> Callable:
    def te_compile_backend(gm: GraphModule, example_inputs: list[Any], mode: Optional[str] = None,
                           options: Optional[dict] = None) -> Callable:
        # torch.compile(..., mode=..., options=...) hands these to the backend: they configure Inductor
        return compile_graph(gm, example_inputs, options_, mode, options, replay_report)

    te_compile_backend.options = options_  # type: ignore[attr-defined]
    return te_compile_backend


#: the entry-point backend: ``torch.compile(model, backend="te_compile")``
te_compile_backend = backend()


def compile(fn: Optional[Callable] = None, *, inner: str = "inductor", target: str = "auto",  # noqa: A001
            verify: bool = False, serve: Optional[str] = None, **torch_compile_kwargs: Any) -> Callable:
    """Opt in for one module or function: ``te_compile.compile(model)`` or ``@te_compile.compile(verify=True)``.

    The te_compile options (``inner``, ``target``, ``verify``, ``serve``) configure the backend; any other
    keyword (``fullgraph``, ``dynamic``, ...) goes to ``torch.compile``.
    """
    be = backend(inner=inner, target=target, verify=verify, serve=serve)
    if fn is None:
        return lambda f: torch.compile(f, backend=be, **torch_compile_kwargs)
    return torch.compile(fn, backend=be, **torch_compile_kwargs)
