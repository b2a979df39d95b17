"""The kernels behind the te_compile ops (registered in te_compile.runtime.ops): CUDA and reference.

On CUDA a call is one lookup of the runner for its signature (the spec and each tensor's geometry;
te_compile.cudnn.runners builds it on the signature's first call) and that runner's launch. A spec with
``impl=reference``, or one cuDNN rejects, runs the reference math (the latter with one warning per spec);
every other device runs the reference math. Where the native call path is on (te_compile.cudnn.native),
the op's CUDA kernel is C++ and comes here only for a signature it does not hold yet. The fake kernels
give the outputs' shapes, strides and dtypes for tracing.

Naming: ``key`` is the ops' ``spec`` argument, the string form of an AttentionSpec (``AttentionSpec.key()``;
``from_key`` reads it back); ``spec`` and ``s`` are the dataclass. ``extra`` is the ops' tensor-list argument as the graph passes it: the ``(in i)`` inputs
(``spec.n_inputs`` of them) followed by the BlockMask tensors (when ``spec.block_q``). The
kernels split it into ``inputs`` (what cuDNN and the reference math read) and ``block`` (checked
once per BlockMask, te_compile.runtime.blockmask.check_call).
"""

from __future__ import annotations

import logging
from typing import Optional

import torch
from torch import Tensor

from .. import counters, reference, user_warnings
from . import blockmask, verify
from ..cudnn import native
from ..layout import empty_like_layout
from ..spec import AttentionSpec

log = logging.getLogger("te_compile")

def runtime_fallbacks() -> list[dict]:
    """The served sites whose calls ran the reference math because cuDNN declined the graph at run time (no
    engine on this GPU / cuDNN version), in this process: one dict per site and direction, with ``site`` (the
    spec described), ``direction``, ``calls`` and ``reason``. Such results are correct but slow; an empty list
    means every served call ran on cuDNN."""
    items = sorted(counters.fallbacks.items())
    reasons = dict(counters.fallback_reasons)
    return [{"site": AttentionSpec.from_key(key).describe(), "direction": d, "calls": n,
             "reason": reasons.get((key, d), ""), "spec": key} for (key, d), n in items if n]


def _warn_fallback(spec_key: str, direction: str, why: str) -> None:
    if not counters.fallback(spec_key, direction, why):
        return
    spec = AttentionSpec.from_key(spec_key)
    msg = (f"te_compile: cuDNN could not serve the attention {direction} ({spec.describe()}); "
           f"running the reference math instead (correct but slow). Reason: {why}")
    log.warning(msg)
    user_warnings.warn(msg)


def split_extra(spec: AttentionSpec, q: Tensor, k: Tensor, extra: list[Tensor]) -> list[Tensor]:
    """The ``(in i)`` inputs of ``extra``; checks the BlockMask tensors that follow them, if any."""
    if spec.block_q:
        _check_block(spec, q, k, extra, spec.key())
    return list(extra[: spec.n_inputs])


# --------------------------------------------------------------------------- layouts

def lse_dtype(q: Tensor) -> torch.dtype:
    return reference.compute_dtype(q.dtype)


def _out_shape(q: Tensor, v: Tensor) -> tuple[int, ...]:
    return (q.shape[0], q.shape[1], q.shape[2], v.shape[3])


def _place_out(out: Tensor, q: Tensor, v: Tensor) -> Tensor:
    o = empty_like_layout(_out_shape(q, v), q)
    o.copy_(out)
    return o


def _place_grads(grads, q, k, v, bias, need_dbias):
    dq, dk, dv, dbias = grads
    outs = []
    for g, like in ((dq, q), (dk, k), (dv, v)):
        t = empty_like_layout(like.shape, like)
        t.copy_(g)
        outs.append(t)
    outs.append(_dbias_out(dbias, q, bias, need_dbias))
    return tuple(outs)


def _dbias_out(dbias: Optional[Tensor], q: Tensor, bias: Optional[Tensor], need_dbias: bool) -> Tensor:
    if need_dbias and bias is not None:
        t = bias.new_empty(bias.shape)
        t.copy_(dbias)
        return t
    return q.new_empty((0,))


# --------------------------------------------------------------------------- forward

def attn_fwd_fake(q, k, v, bias, extra, key):
    out = empty_like_layout(_out_shape(q, v), q)
    lse = q.new_empty((q.shape[0], q.shape[1], q.shape[2]), dtype=lse_dtype(q))
    return out, lse


def attn_fwd_reference(q: Tensor, k: Tensor, v: Tensor, bias: Optional[Tensor], extra: list[Tensor],
                       key: str) -> tuple[Tensor, Tensor]:
    """Attention forward on any device: the reference math."""
    s = AttentionSpec.from_key(key)
    return _reference_forward(q, k, v, bias, s, split_extra(s, q, k, extra))


def _reference_forward(q, k, v, bias, s: AttentionSpec, inputs: list[Tensor]) -> tuple[Tensor, Tensor]:
    out, lse = reference.attention_forward(q, k, v, bias, s, inputs)
    return _place_out(out, q, v), lse.to(lse_dtype(q)).contiguous()


def attn_fwd_cuda(q: Tensor, k: Tensor, v: Tensor, bias: Optional[Tensor], extra: list[Tensor],
                  key: str) -> tuple[Tensor, Tensor]:
    """The forward on CUDA: one lookup of the runner for this call's signature, then the BlockMask check (once
    per BlockMask) and the runner. The first call of a signature builds its runner (``_first_forward``)."""
    e = _fwd.get((key, _sig(q), _sig(k), _sig(v), _sig(bias), *map(_sig, extra)))
    if e is None:
        return _first_forward(q, k, v, bias, extra, key)
    s = e.spec
    check = _begin_block(s, q, k, extra) if s.block_q else None
    out, lse = e.runner(q, k, v, bias, extra[: s.n_inputs])
    if check is not None:  # after the attention is queued: the wait overlaps it; nothing returned before the answer
        _finish_block(check, q, k, extra, key)
    if e.native_pending:
        _offer_native(e, "forward", (q, k, v, bias, extra, key))
    return out, lse


def _dispatch_forward(q, k, v, bias, extra, key):
    """attn_fwd through the dispatcher below Autograd, for a runner made of other calls (the prefix-LM split's two
    halves): with the native call path on, each half runs in C++ through a runner of its own."""
    with torch._C._AutoDispatchBelowAutograd():
        return torch.ops.te_compile.attn_fwd.default(q, k, v, bias, extra, key)


def _dispatch_backward(dout, q, k, v, out, lse, bias, extra, key, need_dbias, dlse=None):
    """attn_bwd through the dispatcher below Autograd (as ``_dispatch_forward``)."""
    with torch._C._AutoDispatchBelowAutograd():
        return torch.ops.te_compile.attn_bwd.default(dout, q, k, v, out, lse, bias, extra, key, need_dbias, dlse)


def _first_forward(q, k, v, bias, extra, key):
    s = AttentionSpec.from_key(key)
    inputs = list(extra[: s.n_inputs])
    check = _begin_block(s, q, k, extra) if s.block_q else None
    if s.impl != "cudnn":
        runner = _ReferenceForward(s, key, None)
        out, lse = runner(q, k, v, bias, inputs)
    else:
        from ..cudnn import runners
        _forget_with_graphs(runners.graphs)
        try:
            runner, (out, lse) = runners.forward(s, q, k, v, bias, inputs, _dispatch_forward)
        except runners.graphs.Unsupported as e:
            runner = _ReferenceForward(s, key, str(e))
            out, lse = runner(q, k, v, bias, inputs)
        else:
            if s.verify:
                verify.forward(key, s, q, k, v, bias, inputs, out, lse)
    if check is not None:
        _finish_block(check, q, k, extra, key)
    entry = _Entry(s, runner)
    _remember(_fwd, (key, _sig(q), _sig(k), _sig(v), _sig(bias), *map(_sig, extra)), entry)
    if entry.native_pending:
        _offer_native(entry, "forward", (q, k, v, bias, extra, key))
    return out, lse


class _ReferenceForward:
    """The reference math on CUDA tensors: ``impl=reference``, or cuDNN declined the graph (``why``; counted and
    warned once per spec)."""

    __slots__ = ("spec", "key", "why")

    def __init__(self, spec: AttentionSpec, key: str, why: Optional[str]):
        self.spec, self.key, self.why = spec, key, why

    def __call__(self, q, k, v, bias, inputs):
        if self.why is not None:
            _warn_fallback(self.key, "forward", self.why)
        return _reference_forward(q, k, v, bias, self.spec, list(inputs))

    def native_info(self) -> None:
        return None


# --------------------------------------------------------------------------- backward

def attn_bwd_fake(dout, q, k, v, out, lse, bias, extra, key, need_dbias, dlse=None):
    dq = empty_like_layout(q.shape, q)
    dk = empty_like_layout(k.shape, k)
    dv = empty_like_layout(v.shape, v)
    dbias = bias.new_empty(bias.shape) if (need_dbias and bias is not None) else q.new_empty((0,))
    return dq, dk, dv, dbias


def attn_bwd_reference(dout: Tensor, q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse: Tensor,
                       bias: Optional[Tensor], extra: list[Tensor], key: str,
                       need_dbias: bool, dlse: Optional[Tensor] = None) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Attention backward on any device: the reference math."""
    s = AttentionSpec.from_key(key)
    grads = reference.attention_backward(dout, q, k, v, out, lse, bias, s, need_dbias, extra[: s.n_inputs], dlse)
    return _place_grads(grads, q, k, v, bias, need_dbias)


def attn_bwd_cuda(dout: Tensor, q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse: Tensor, bias: Optional[Tensor],
                  extra: list[Tensor], key: str, need_dbias: bool,
                  dlse: Optional[Tensor] = None) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """The backward on CUDA: one lookup of the runner for this call's signature, then the runner."""
    e = _bwd.get((key, need_dbias, _sig(dout), _sig(q), _sig(k), _sig(v), _sig(out), _sig(lse), _sig(bias),
                  _sig(dlse), *map(_sig, extra)))
    if e is None:
        return _first_backward(dout, q, k, v, out, lse, bias, extra, key, need_dbias, dlse)
    grads = e.runner(dout, q, k, v, out, lse, bias, extra[: e.spec.n_inputs], dlse)
    if e.native_pending:
        _offer_native(e, "backward", (dout, q, k, v, out, lse, bias, extra, key, need_dbias))
    return grads


def _first_backward(dout, q, k, v, out, lse, bias, extra, key, need_dbias, dlse):
    s = AttentionSpec.from_key(key)
    inputs = list(extra[: s.n_inputs])
    if s.impl != "cudnn":
        runner = _ReferenceBackward(s, key, need_dbias, None)
        grads = runner(dout, q, k, v, out, lse, bias, inputs, dlse)
    else:
        from ..cudnn import runners
        _forget_with_graphs(runners.graphs)
        try:
            runner, grads = runners.backward(s, dout, q, k, v, out, lse, bias, need_dbias, inputs, dlse,
                                             _dispatch_backward)
        except runners.graphs.Unsupported as e:
            runner = _ReferenceBackward(s, key, need_dbias, str(e))
            grads = runner(dout, q, k, v, out, lse, bias, inputs, dlse)
        else:
            if s.verify:
                verify.backward(key, s, dout, q, k, v, out, lse, bias, need_dbias, inputs, grads, dlse)
    entry = _Entry(s, runner)
    _remember(_bwd, (key, need_dbias, _sig(dout), _sig(q), _sig(k), _sig(v), _sig(out), _sig(lse), _sig(bias),
                     _sig(dlse), *map(_sig, extra)), entry)
    if entry.native_pending:
        _offer_native(entry, "backward", (dout, q, k, v, out, lse, bias, extra, key, need_dbias))
    return grads


class _ReferenceBackward:
    __slots__ = ("spec", "key", "need_dbias", "why")

    def __init__(self, spec: AttentionSpec, key: str, need_dbias: bool, why: Optional[str]):
        self.spec, self.key, self.need_dbias, self.why = spec, key, need_dbias, why

    def __call__(self, dout, q, k, v, out, lse, bias, inputs, dlse=None):
        if self.why is not None:
            _warn_fallback(self.key, "backward", self.why)
        grads = reference.attention_backward(dout, q, k, v, out, lse, bias, self.spec, self.need_dbias, list(inputs),
                                             dlse)
        return _place_grads(grads, q, k, v, bias, self.need_dbias)

    def native_info(self) -> None:
        return None


# --------------------------------------------------------------------------- the runner map

def _sig(t: Optional[Tensor]):
    """A tensor's part of a call signature: what a runner depends on (its values are not part of it)."""
    return None if t is None else (t.shape, t.stride(), t.dtype, t.device, t.data_ptr() % 16 == 0)


class _Entry:
    """A signature's runner, its spec, and whether the native call path may still take it over (turning the path
    on or off empties the runner maps: te_compile.runtime.ops)."""

    __slots__ = ("spec", "runner", "native_pending")

    def __init__(self, spec: AttentionSpec, runner):
        self.spec, self.runner = spec, runner
        self.native_pending = native.active()


#: call signature -> _Entry, forward and backward (bounded; emptied when cuDNN graphs leave their cache)
_fwd: dict = {}
_bwd: dict = {}
MAX_RUNNERS = 1024


def _remember(table: dict, key: tuple, entry: _Entry) -> None:
    if len(table) >= MAX_RUNNERS:
        table.clear()
    table[key] = entry


def clear_runners() -> None:
    """Forget every runner (Python and native): the next call of each signature builds its runner again."""
    _fwd.clear()
    _bwd.clear()
    native.clear()


def forget_graph(built) -> None:
    """A cuDNN graph left te_compile.cudnn.graphs' cache (None: all of them): the runners that run it go, here and in
    C++ (which destroys their plans); every other runner stays."""
    if built is None:
        clear_runners()
        return
    for table in (_fwd, _bwd):
        for key in [key for key, e in list(table.items()) if getattr(getattr(e.runner, "launch", None), "built", None)
                    is built]:
            table.pop(key, None)
    native.forget(id(built))


def _forget_with_graphs(graphs) -> None:
    if forget_graph not in graphs.cache.on_forget:
        graphs.cache.on_forget.append(forget_graph)


def _check_block(s: AttentionSpec, q: Tensor, k: Tensor, extra: list[Tensor], key: str) -> None:
    """The BlockMask check (raises on a mismatch; once per BlockMask). The native call path runs a call with a
    BlockMask only once that BlockMask has passed here."""
    _finish_block(_begin_block(s, q, k, extra), q, k, extra, key)


def _begin_block(s: AttentionSpec, q: Tensor, k: Tensor, extra: list[Tensor]):
    """The check's device work queued (a new BlockMask), no wait; ``_finish_block`` reads the answer."""
    return blockmask.begin_call(s, q, k, list(extra[: s.n_inputs]), list(extra[s.n_inputs:]))


def _finish_block(check, q: Tensor, k: Tensor, extra: list[Tensor], key: str) -> None:
    if check.finish() and native.active():
        spec = AttentionSpec.from_key(key)
        native.block_checked(q, k, [extra[i] for i in blockmask.key_indices(spec, len(extra))], key)


def _offer_native(entry: _Entry, direction: str, args: tuple) -> None:
    """Hand a signature's runner to the native call path (once it can: not while a CUDA graph is being captured)."""
    if torch.cuda.is_current_stream_capturing():
        return
    entry.native_pending = False
    info = entry.runner.native_info()
    if info is None:  # a split, a dlse, a reference fallback, or a plan the frontend cannot serialize
        native.decline(direction, f"{type(entry.runner).__name__} has no cuDNN plan the native path can load")
    elif isinstance(info, str):
        native.decline(direction, info)
    else:
        extra = args[4] if direction == "forward" else args[7]
        block = list(blockmask.key_indices(entry.spec, len(extra))) if entry.spec.block_q else []
        native.register(direction, args, dict(info, block=block, n_inputs=entry.spec.n_inputs))
        # a runner whose launches hold for one set of (in i) inputs (a document mask's ids) registers again when
        # Python serves a call with others (C++ hands such calls to Python)
        entry.native_pending = bool(info.get("again"))
