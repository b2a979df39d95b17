"""The cuDNN frontend's private surface, in one place: every name te_compile reads that the frontend does not document.

* The Python graph's raw-pointer execute (``graph._lowered_graph._execute_with_raw_ptrs``; te_compile.cudnn.graphs
  runs a graph's steady-state execute through it on the Python call path).
* ``cudnn.flex_attention``'s allocating wrappers (``execution._flex_attention_forward / _backward``), the dispatch
  functions below them (``dispatch._prepare_flex_attn_fwd``, ``_compile_flex_attn_fwd``, ``_launch_flex_attn_fwd``,
  ``_flex_attn_bwd``, ``_BwdPreallocated``) and a mask plan's runtime arguments and tensors
  (te_compile.cudnn.flexkernel runs the interval kernels through them, te_compile.cudnn.flexlaunch records their launches).

``FRONTEND_CHECKED`` names the frontend versions this was checked on (tests/test_frontend_private.py pins them to
the frontend the CPU suite installs, and checks that no other module reads these names). Where a name is gone or a
call's signature changed, the call raises ``FrontendChanged`` naming the running version; each caller then takes
the frontend's public path (``graph.execute``, ``flex_attention``'s wrappers) or keeps the site.
"""

from __future__ import annotations

import logging
from typing import Any, Callable, Optional

log = logging.getLogger("te_compile")

#: the cuDNN frontend versions whose private surface te_compile was checked on
FRONTEND_CHECKED = ("1.32.0",)


class FrontendChanged(RuntimeError):
    """A private name of the cuDNN frontend is gone or its call changed (the message names the version)."""


def version() -> str:
    try:
        import cudnn
    except Exception:  # noqa: BLE001 - not importable: no version to name
        return "?"
    return str(getattr(cudnn, "__version__", "?"))


def changed(what: str, e: BaseException) -> FrontendChanged:
    """The error for a private ``what`` that failed with ``e``: it names the running frontend and the checked ones."""
    ver = version()
    checked = ", ".join(FRONTEND_CHECKED)
    note = "" if ver in FRONTEND_CHECKED else f"; te_compile checked its private surface on {checked}"
    return FrontendChanged(f"cuDNN frontend {ver}: {what} failed ({type(e).__name__}: {str(e)[:160]}){note}")


def _call(what: str, fn: Callable[[], Any]) -> Any:
    try:
        return fn()
    except (AttributeError, TypeError, KeyError) as e:
        raise changed(what, e) from e


# --------------------------------------------------------------------------- the Python graph's raw execute

def raw_target(g: Any) -> Optional[tuple]:
    """(backend graph, plan index, the backend's variant-pack uids in ascending order) for a graph the cuDNN backend
    serves, or None (a Python engine serves it, nothing was lowered, or this frontend lacks the entry)."""
    try:
        if g.selected_engine is not None or g._lowered_graph is None or not g._plans:
            return None
        lowered = g._lowered_graph
        lowered._prepare_variant_pack_template()
        order = [int(u) for u in lowered._get_variant_pack_uids_sorted()]
        cfg = g._materialize_backend_plan(g._plan_index)
        return lowered, -1 if cfg.cpp_index is None else int(cfg.cpp_index), order
    except Exception as e:  # noqa: BLE001 - public execute instead
        log.debug("te_compile: %s", changed("the raw-pointer execute's setup", e))
        return None


def execute_raw(lowered: Any, ptrs_address: int, n: int, workspace: int, handle: Any, index: int) -> None:
    """One execute of a backend graph from a ``void*[n]`` at ``ptrs_address`` in its ascending-uid order."""
    lowered._execute_with_raw_ptrs(ptrs_address, n, workspace, handle.backend_handle or 0, index)


# --------------------------------------------------------------------------- cudnn.flex_attention

def flex_wrappers(execution: Any) -> Optional[tuple[Callable, Callable]]:
    """The allocating forward and backward wrappers of ``cudnn.flex_attention.execution``, or None."""
    fwd, bwd = getattr(execution, "_flex_attention_forward", None), getattr(execution, "_flex_attention_backward", None)
    return None if fwd is None or bwd is None else (fwd, bwd)


def _dispatch() -> Any:
    from cudnn.flex_attention import dispatch
    return dispatch


def plan_tensors(plan: Any) -> list:
    """Every tensor a mask plan hands to the kernels."""
    from cudnn.flex_attention import execution
    return _call("execution._plan_tensors", lambda: list(execution._plan_tensors(plan)))


def forward_runtime_args(plan: Any) -> Any:
    """The block-sparse tensors a mask plan passes to the forward kernels."""
    return _call("a mask plan's _runtime_args", lambda: plan._runtime_args[0])


def backward_runtime_args(plan: Any) -> Any:
    """The block-sparse tensors a mask plan passes to the backward kernels."""
    return _call("a mask plan's _backward_runtime_args", lambda: plan._backward_runtime_args(False)[0])


def prepare_forward(*args: Any, **kw: Any) -> Any:
    return _call("dispatch._prepare_flex_attn_fwd", lambda: _dispatch()._prepare_flex_attn_fwd(*args, **kw))


def compile_forward(*args: Any) -> Any:
    return _call("dispatch._compile_flex_attn_fwd", lambda: _dispatch()._compile_flex_attn_fwd(*args))


def launch_forward(*args: Any) -> Any:
    return _call("dispatch._launch_flex_attn_fwd", lambda: _dispatch()._launch_flex_attn_fwd(*args))


def backward(*args: Any, **kw: Any) -> Any:
    return _call("dispatch._flex_attn_bwd", lambda: _dispatch()._flex_attn_bwd(*args, **kw))


def backward_preallocated(**kw: Any) -> Any:
    return _call("dispatch._BwdPreallocated", lambda: _dispatch()._BwdPreallocated(**kw))
