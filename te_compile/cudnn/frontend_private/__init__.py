"""The cuDNN frontend's private surface, in one place: every name te_compile reads that the frontend does not document.

* A built graph's serialized form (``pygraph.serialize()`` is public, the layout of what it writes is not):
  ``plan_blob`` reads the variant pack the native call path fills from it.
* ``cudnn.flex_attention``'s allocating wrappers (``execution._flex_attention_forward / _backward``), the dispatch
  functions below them (``dispatch._prepare_flex_attn_fwd``, ``_compile_flex_attn_fwd``, ``_launch_flex_attn_fwd``,
  ``_flex_attn_bwd``, ``_BwdPreallocated``) and a mask plan's runtime arguments and tensors
  (te_compile.cudnn.flexkernel runs the interval kernels through them, te_compile.cudnn.flexlaunch records their launches).

``FRONTEND_CHECKED`` names the frontend versions this was checked on (tests/test_frontend_private.py pins them to
the frontend the CPU suite installs, and checks that no other module reads these names). Where a name is gone or a
call's signature changed, the call raises ``FrontendChanged`` naming the running version; each caller then takes
the frontend's public path (``flex_attention``'s wrappers) or keeps the site (a plan blob it cannot read leaves the
signature to Python, which runs it through the public ``graph.execute``).
"""

from __future__ import annotations

from typing import Any, Callable, Optional

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
