"""The te_compile custom ops: the only bridge between graph passes and cuDNN.

``te_compile::attn_fwd(q, k, v, bias?, extra[], spec) -> (out, lse)``
``te_compile::attn_bwd(dout, q, k, v, out, lse, bias?, extra[], spec, need_dbias, dlse?)
    -> (dq, dk, dv, dbias)``

* ``spec`` is ``AttentionSpec.key()``: the whole non-tensor description of the call.
* ``lse`` is the natural-log logsumexp, float32 ``[B, Hq, L]`` (-inf on fully-masked rows). It is
  differentiable (flex's is): ``dlse`` is its gradient, None when nothing uses lse, and enters the
  backward as ``dS = P * (dP - delta + dlse)``.
* ``bias`` is a float tensor in q's dtype that broadcasts to ``[B, Hq, L, S]``.
* ``extra``: the ``(in i)`` inputs of a flex score_mod / mask_mod (``spec.n_inputs`` float32
  [B|1, H|1, 1, 1] tensors), then the BlockMask tensors the op checks (when ``spec.block_q``);
  SDPA passes ``[]``.
* ``dbias`` has bias's shape when ``need_dbias``; otherwise it is an empty placeholder
  (custom ops cannot return ``None``). ``need_dbias`` comes from ``ctx.needs_input_grad``,
  which AOTAutograd evaluates while tracing, so the backward graph shows it as a literal.

This module defines and registers the ops, their autograd and autocast kernels; the CUDA,
reference and fake kernels are in te_compile.runtime.kernels.
"""

from __future__ import annotations

from typing import Optional

import torch

from .. import env
from ..cudnn import native
from .kernels import (attn_bwd_cuda, attn_bwd_fake, attn_bwd_reference, attn_fwd_cuda, attn_fwd_fake,
                      attn_fwd_reference, clear_runners)
from ..spec import AttentionSpec


# The ops are defined with torch.library.Library rather than @custom_op: same schema, fake
# kernels and autograd formula, but the CUDA kernel is called by the dispatcher directly and the
# Autograd kernel below has a short no-grad path. Inside a compiled graph every call is a no-grad
# call, and custom_op's Python layers (autograd_impl -> redispatch -> backend_impl -> the
# disable-dynamo wrapper) cost tens of µs of host time per call (docs/cudnn-notes.md, "Host time per call").
_lib = torch.library.Library("te_compile", "DEF")
# CUDA graphs (mode="reduce-overhead") record te_compile's ops: cuDNN's execute is capturable and
# the kernels allocate nothing that outlives a call in the graph pool (see cudnn/graphs.py: the
# first-execute cycle collection; runners.py: _outside_cudagraph_pool). TE_COMPILE_CUDAGRAPH_UNSAFE=1 tags the ops
# cudagraph_unsafe instead, so Inductor runs graphs holding them without CUDA graphs (an escape hatch
# if recording ever fails; read at import).
_TAGS = ((torch.Tag.pt2_compliant_tag, torch.Tag.cudagraph_unsafe)
         if env.value("TE_COMPILE_CUDAGRAPH_UNSAFE") == "1" else (torch.Tag.pt2_compliant_tag,))
_lib.define("attn_fwd(Tensor q, Tensor k, Tensor v, Tensor? bias, Tensor[] extra, str spec) -> (Tensor, Tensor)",
            tags=_TAGS)
_lib.define("attn_bwd(Tensor dout, Tensor q, Tensor k, Tensor v, Tensor out, Tensor lse, Tensor? bias, "
            "Tensor[] extra, str spec, bool need_dbias, Tensor? dlse=None) -> (Tensor, Tensor, Tensor, Tensor)", tags=_TAGS)


# --------------------------------------------------------------------------- autograd

#: _AttnFunction.apply's arguments before ``*extra``: ``ctx.needs_input_grad`` is indexed by these
_APPLY_ARGS = ("keyset", "q", "k", "v", "bias", "spec")
_Q, _K, _V, _BIAS = (_APPLY_ARGS.index(a) for a in ("q", "k", "v", "bias"))
_EXTRA = len(_APPLY_ARGS)


class _AttnFunction(torch.autograd.Function):
    """attn_fwd with its backward (attn_bwd); dBias only when the bias needs a gradient."""

    @staticmethod
    def forward(ctx, keyset, q, k, v, bias, spec, *extra):
        with torch._C._AutoDispatchBelowAutograd():
            if keyset is None:  # from the native Autograd kernel: a plain call below Autograd
                out, lse = _fwd_op(q, k, v, bias, list(extra), spec)
            else:
                out, lse = _fwd_op.redispatch(keyset & torch._C._after_autograd_keyset, q, k, v, bias, list(extra),
                                              spec)
        # the backward reads only the (in i) inputs of extra, not the BlockMask tensors after them
        ctx.n_extra = len(extra)
        ctx.save_for_backward(q, k, v, out, lse, bias, *extra[: AttentionSpec.from_key(spec).n_inputs])
        ctx.spec = spec
        # lse is differentiable (flex's is); an unused lse gives dlse = None, not a zero tensor
        ctx.set_materialize_grads(False)
        return out, lse

    @staticmethod
    def backward(ctx, dout, dlse):
        q, k, v, out, lse, bias, *extra = ctx.saved_tensors
        if dout is None:
            dout = torch.zeros_like(out)
        nig = ctx.needs_input_grad  # by _APPLY_ARGS, then *extra
        if any(nig[_EXTRA:]):
            # the rewrite keeps such sites; never hand back a silent zero/None gradient
            raise RuntimeError("te_compile: gradients for captured score_mod tensors are not supported")
        need_dbias = bias is not None and bool(nig[_BIAS])
        dq, dk, dv, dbias = _bwd_op(dout, q, k, v, out, lse, bias, list(extra), ctx.spec, need_dbias, dlse)
        grads = {_Q: dq, _K: dk, _V: dv, _BIAS: dbias if need_dbias else None}
        return (*(grads.get(i) if nig[i] else None for i in range(_EXTRA)), *([None] * ctx.n_extra))


_IGNORED = torch._C.DispatchKeySet(torch._C.DispatchKey.ADInplaceOrView)
#: keyset (raw representation) -> whether the CUDA kernel is the next kernel below Autograd (memoized:
#: computing it costs three DispatchKeySet objects per call)
_CUDA_NEXT: dict = {}


def _runs_cuda_kernel(keyset: "torch._C.DispatchKeySet") -> bool:
    raw = keyset.raw_repr()
    cuda_next = _CUDA_NEXT.get(raw)
    if cuda_next is None:
        below = keyset & torch._C._after_autograd_keyset
        cuda_next = _CUDA_NEXT[raw] = (below - _IGNORED).highestPriorityTypeId() == torch._C.DispatchKey.CUDA
    return cuda_next


def _below_autograd(op, cuda_kernel, keyset, *args):
    """Run ``op`` below the Autograd key: the CUDA kernel itself in the common case (plain CUDA
    tensors, no mode or subclass in the keyset), a redispatch otherwise.

    Callers come here only when grad mode is off or no input requires grad, so the kernel records
    no autograd history and needs no below-autograd guard (one context manager less per call)."""
    if _runs_cuda_kernel(keyset):
        return cuda_kernel(*args)
    with torch._C._AutoDispatchBelowAutograd():
        return op.redispatch(keyset & torch._C._after_autograd_keyset, *args)


def _fwd_autograd(keyset, q, k, v, bias, extra, spec):
    if torch.is_grad_enabled() and torch._C._any_requires_grad(q, k, v, bias, *extra):
        return _AttnFunction.apply(keyset, q, k, v, bias, spec, *extra)
    return _below_autograd(_fwd_op, attn_fwd_cuda, keyset, q, k, v, bias, extra, spec)


def _tensor_slots(schema: "torch._C.FunctionSchema") -> tuple[tuple[slice, ...], tuple[int, ...]]:
    """Where an op's tensor arguments sit: runs of Tensor / Tensor? arguments as slices, Tensor[] arguments
    by index. The Autograd kernel below reads its positional ``args`` through these (slices cost less per
    call than a name lookup), so they follow the schema instead of being written out by hand."""
    runs: list[slice] = []
    lists: list[int] = []
    start = None
    for i, a in enumerate(schema.arguments):
        kind = str(a.type)
        single = kind in ("Tensor", "Optional[Tensor]")
        if single and start is None:
            start = i
        if not single and start is not None:
            runs.append(slice(start, i))
            start = None
        if kind == "List[Tensor]":
            lists.append(i)
    if start is not None:
        runs.append(slice(start, len(schema.arguments)))
    return tuple(runs), tuple(lists)


def _bwd_autograd(keyset, *args):
    (head, tail), (extra,) = _BWD_TENSORS  # (dout .. bias), (dlse,); extra[]
    if torch.is_grad_enabled() and torch._C._any_requires_grad(*args[head], *args[extra], *args[tail]):
        # attn_bwd has no derivative: refuse rather than return grads that silently lack one
        raise RuntimeError("te_compile: double backward (create_graph=True) through a te_compile attention op "
                           "is not supported; compile this model without te_compile for higher-order gradients")
    return _below_autograd(_bwd_op, attn_bwd_cuda, keyset, *args)


for _name, _ref, _fake in (("attn_fwd", attn_fwd_reference, attn_fwd_fake), ("attn_bwd", attn_bwd_reference, attn_bwd_fake)):
    _lib.impl(_name, _ref, "CompositeExplicitAutograd")
    torch.library.register_fake(f"te_compile::{_name}", _fake, lib=_lib)

#: the Python CUDA and Autograd kernels (te_compile.cudnn.native swaps them for C++ ones where it can build them)
_py_lib: Optional[torch.library.Library] = None


def use_python_kernels() -> None:
    """Register the Python CUDA and Autograd kernels (the default)."""
    global _py_lib
    if _py_lib is not None:
        return
    if _native is not None:
        _native.uninstall()
    _py_lib = torch.library.Library("te_compile", "IMPL")
    for name, cuda, ag in (("attn_fwd", attn_fwd_cuda, _fwd_autograd), ("attn_bwd", attn_bwd_cuda, _bwd_autograd)):
        _py_lib.impl(name, cuda, "CUDA")
        _py_lib.impl(name, ag, "Autograd", with_keyset=True)


def use_native_kernels(ext) -> None:
    """Serve the ops' CUDA and Autograd keys with the native extension's kernels; they call back into
    ``attn_fwd_cuda`` / ``attn_bwd_cuda`` for a signature they do not hold, and into the autograd.Function for a
    call that records history."""
    global _py_lib, _native
    if _py_lib is not None:
        _py_lib._destroy()
        _py_lib = None
    _native = ext
    ext.install(attn_fwd_cuda, attn_bwd_cuda, _native_grad_forward)


_native = None


def _native_grad_forward(q, k, v, bias, extra, spec):
    return _AttnFunction.apply(None, q, k, v, bias, spec, *extra)


def _on_native(ext) -> None:
    if ext is None:
        use_python_kernels()
    else:
        use_native_kernels(ext)
    clear_runners()  # runners built before hold no native registration: rebuilt on their next call


native.hooks.append(_on_native)

_fwd_op = torch.ops.te_compile.attn_fwd.default
_bwd_op = torch.ops.te_compile.attn_bwd.default
_BWD_TENSORS = _tensor_slots(_bwd_op._schema)
use_python_kernels()


def _autocast_kernel(device_type: str, key: "torch._C.DispatchKey"):
    """attn_fwd under torch.autocast: like eager SDPA and flex, float inputs run in the autocast dtype
    (so fp32 q/k/v under autocast(bfloat16) give a bfloat16 output). The casts are ordinary
    differentiable ``.to`` calls, so gradients reach the fp32 inputs. The (in i) inputs stay fp32."""
    excluded = torch._C.DispatchKeySet(key)

    def kernel(q, k, v, bias, extra, spec):
        dt = torch.get_autocast_dtype(device_type)

        def cast(t):
            if t is None or not t.is_floating_point() or t.dtype in (torch.float64, dt):
                return t
            return t.to(dt)
        with torch._C._ExcludeDispatchKeyGuard(excluded):
            return _fwd_op(cast(q), cast(k), cast(v), cast(bias), extra, spec)
    return kernel


_lib.impl("attn_fwd", _autocast_kernel("cuda", torch._C.DispatchKey.AutocastCUDA), "AutocastCUDA")
_lib.impl("attn_fwd", _autocast_kernel("cpu", torch._C.DispatchKey.AutocastCPU), "AutocastCPU")
attn_fwd = torch.ops.te_compile.attn_fwd
attn_bwd = torch.ops.te_compile.attn_bwd


__all__ = ["attn_fwd", "attn_bwd"]
