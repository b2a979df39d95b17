"""``te_compile.explain``: compile, run once, and report every attention site (te_compile.report).

``te_compile.explain(model_or_fn, *args, **kwargs)`` compiles with the backend, runs once, and
returns a ``Report``; ``print(report)`` is a compact table, ``report.to_dict()`` is JSON-ready,
``report.code()`` is the rewritten graphs' code.
"""

from __future__ import annotations

import inspect
import contextlib
import types
from typing import Any, Callable, Optional

import torch

from .. import tuning, user_warnings
from ..backend import explain_backend
from ..reasons import Reason
from ..report import Report, record_reports


def _fresh_code(f: Callable) -> Callable:
    """``f`` (a plain function) with a code object of its own: Dynamo keeps compiled entries on code
    objects, so entries made through the copy go away with it."""
    code = f.__code__.replace(co_name=f.__code__.co_name)  # a distinct code object, same names
    g = types.FunctionType(code, f.__globals__, f.__name__, f.__defaults__, f.__closure__)
    g.__kwdefaults__ = getattr(f, "__kwdefaults__", None)
    return g


@contextlib.contextmanager
def _own_entries(fn: Callable):
    """What to compile so explain's compiled entries do not use up the recompile budget of ``fn``'s
    code (Dynamo's recompile_limit, 8 by default). torch >= 2.13 has ``isolate_recompiles``; before,
    the frame Dynamo compiles (a function, or a module's forward) runs through a copy of its code."""
    if _ISOLATE:
        yield fn, {"isolate_recompiles": True}
        return
    optimized = getattr(torch._dynamo.eval_frame, "OptimizedModule", ())
    if isinstance(fn, torch.nn.Module) and not isinstance(fn, optimized) \
            and isinstance(getattr(type(fn), "forward", None), types.FunctionType):
        own = "forward" in vars(fn)
        fn.forward = types.MethodType(_fresh_code(type(fn).forward), fn)
        try:
            yield fn, {}
        finally:
            if not own:
                del fn.forward
        return
    if isinstance(fn, types.FunctionType):
        yield _fresh_code(fn), {}
        return
    yield fn, {}


def isolated_compile(fn: Callable, backend: Any, mode: Optional[str] = None) -> Callable:
    """``torch.compile(fn, backend=backend)`` whose compiled entries are its own (not the user's recompile budget,
    not another such call's): ``isolate_recompiles`` on torch >= 2.13; before, a copy of the code of the frame
    Dynamo compiles (a module's forward is called as a method, so the module's hooks do not run)."""
    kw = {} if mode in (None, "default") else {"mode": mode}
    if _ISOLATE:
        return torch.compile(fn, backend=backend, isolate_recompiles=True, **kw)
    if isinstance(fn, torch.nn.Module) and isinstance(getattr(type(fn), "forward", None), types.FunctionType):
        return torch.compile(types.MethodType(_fresh_code(type(fn).forward), fn), backend=backend, **kw)
    if isinstance(fn, types.FunctionType):
        return torch.compile(_fresh_code(fn), backend=backend, **kw)
    return torch.compile(fn, backend=backend, **kw)


#: torch >= 2.13: a torch.compile call whose recompilations count apart from every other call's
_ISOLATE = "isolate_recompiles" in inspect.signature(torch.compile).parameters


_NOT_KNOWN = ("not known here: the cuDNN version (a site cuDNN rejects only at plan time stays with torch.compile on "
              "the GPU), the card (the speed rules are the built-in ones), and whether the frontend's CuTe DSL and the "
              "native call path are there (taken as a te_compile[cuda] install has them); run explain on the GPU for "
              "its decisions")
#: what a report decided for a GPU on a machine without one says: the cuDNN frontend's own check decided support
FOR_CUDA_NOTE = Reason("decided for a CUDA GPU on a machine without one: cuDNN's support is the installed cuDNN "
                       f"frontend's own check (no plans are built here); {_NOT_KNOWN}",
                       short="decided for a CUDA GPU here: support from the cuDNN frontend's check; card, version unknown")
#: ... and where the frontend is not installed: te_compile's own rules decided support
FOR_CUDA_NOTE_RULES = Reason("decided for a CUDA GPU on a machine without one: cuDNN's support is te_compile's own "
                             "rules (dtypes, ranks, head dims, the score_mod / mask_mod ops cuDNN has); the cuDNN "
                             "frontend is not installed here (pip install --no-deps 'nvidia-cudnn-frontend>=1.32' adds "
                             f"its own check, without its CUDA libraries); {_NOT_KNOWN}",
                             short="decided for a CUDA GPU here: support from te_compile's own rules (no cuDNN frontend)")
NO_GRAPH_NOTE = Reason("Dynamo compiled no graph: the call ran eagerly (torch.compiler.disable, a recompile limit hit "
                       "on this code, or no tensor work); TORCH_LOGS=recompiles,graph_breaks says why",
                       short="Dynamo compiled no graph: the call ran eagerly (TORCH_LOGS=recompiles,graph_breaks: why)")


def _frontend_here() -> bool:
    """Does the cuDNN frontend load here (its support check runs)?"""
    try:
        from ..cudnn import graphs  # noqa: F401
    except Exception:  # noqa: BLE001 - not installed, or failing to load: te_compile's own rules decide
        return False
    return True


@contextlib.contextmanager
def _forward_only(fn: Callable, args: tuple, kwargs: dict):
    """Let flex_attention run its forward on CPU inputs that require grad: explain runs the model's forward once
    and never its backward, and flex refuses such inputs only because it has no CPU backward. A model with CUDA
    inputs or parameters is explained as it is."""
    tensors = [*args, *kwargs.values(), *(fn.parameters() if isinstance(fn, torch.nn.Module) else ())]
    if any(isinstance(t, torch.Tensor) and t.is_cuda for t in tensors):
        yield
        return
    try:
        from torch.nn.attention import flex_attention as fa
    except ImportError:  # pragma: no cover - torch without flex_attention
        yield
        return
    check = getattr(fa, "_validate_device", None)
    if check is None:
        yield
        return

    def forward_only(query, key, value, *a, **kw):
        return check(query.detach(), key.detach(), value.detach(), *a, **kw)
    fa._validate_device = forward_only
    try:
        yield
    finally:
        fa._validate_device = check


@contextlib.contextmanager
def _as_step(fn: Callable, args: tuple, kwargs: dict, train: Optional[bool]):
    """``train=None``: as the model and inputs are (their requires_grad decides); True: as a training step (the
    module's floating-point parameters require grad, or, for a function, its floating-point tensor inputs);
    False: as inference (torch.no_grad)."""
    if train is None:
        yield
        return
    if not train:
        with torch.no_grad():
            yield
        return
    if isinstance(fn, torch.nn.Module):
        leaves = [p for p in fn.parameters()]
    else:
        leaves = [t for t in (*args, *kwargs.values()) if isinstance(t, torch.Tensor) and t.is_leaf]
    flipped = [t for t in leaves if t.is_floating_point() and not t.requires_grad]
    for t in flipped:
        t.requires_grad_(True)
    try:
        with torch.enable_grad():
            yield
    finally:
        for t in flipped:
            t.requires_grad_(False)


def explain(fn: Callable, *args: Any, target: str = "auto", inner: str = "aot_eager",
            verify: bool = False, serve: Optional[str] = None, mode: Optional[str] = None,
            for_device: Optional[str] = None, train: Optional[bool] = None, **kwargs: Any) -> Report:
    """Compile ``fn`` (a module or function) with te_compile, call it once on ``args``, and report.

    Uses ``aot_eager`` by default (the decisions do not depend on the inner compiler, and it is
    quicker); pass ``inner="inductor"`` to see exactly what ``torch.compile`` would run. Calling it
    again and again on one model does not use up the model's recompile budget (each call's compiled
    entries are its own), and every call reports every site it runs, also where Dynamo reused an entry
    of an earlier call instead of tracing again. If Dynamo compiled no graph at all, the report says so.

    ``mode``: the ``torch.compile`` mode the model will run under; the decisions follow it (under CUDA
    graphs, ``mode="reduce-overhead"``, the rules count kernel time only). With ``inner="inductor"``
    it is also passed to the compile.

    ``for_device="cuda"``: decide every site as on a CUDA GPU, whatever device ``args`` are on, so a machine
    without a GPU can tell what te_compile would run there (dtype, support and speed reasons included); the
    model still runs on its own device (sites decided for cuDNN run the reference kernel there), and the report
    names what it cannot know without the GPU and what decided cuDNN's support: the cuDNN frontend's own check
    where it is installed, te_compile's own rules where it is not.

    ``train``: None (default) decides as the model and inputs are (the traced graph's requires_grad: a module
    with trainable parameters is decided as a training step); True as a training step, False as inference. Only
    the forward runs, never a backward (so a flex model that needs gradients can be explained on a CPU).
    """
    cuda_graphs = None
    if mode is not None and mode != "default":
        from torch._inductor import list_mode_options
        cuda_graphs = bool(list_mode_options(mode).get("triton.cudagraphs", False))
    be = explain_backend(tuning.is_measuring(), inner=inner, target=target, verify=verify, cuda_graphs=cuda_graphs,
                         for_device=for_device, **({"serve": serve} if serve else {}))
    if mode is not None and inner == "inductor":
        extra_mode = {"mode": mode}
    else:
        extra_mode = {}
    if train not in (None, True, False):
        raise ValueError(f"train must be None, True or False, got {train!r}")
    with _own_entries(fn) as (entry, extra), record_reports() as graphs, _forward_only(fn, args, kwargs), \
            _as_step(fn, args, kwargs, train):
        torch.compile(entry, backend=be, **extra, **extra_mode)(*args, **kwargs)
    report = Report(list(graphs))
    if for_device == "cuda" and not torch.cuda.is_available():
        report.note = FOR_CUDA_NOTE if _frontend_here() else FOR_CUDA_NOTE_RULES
    if not graphs:
        report.note = NO_GRAPH_NOTE
        user_warnings.warn(f"te_compile.explain: {report.note}")
    return report
