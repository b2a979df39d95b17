"""cuDNN's interval-mask attention kernels (the frontend's ``cudnn.flex_attention``) behind te_compile's ops.

A flex site whose mask_mod is a per-row union of key intervals (te_compile.lowering.intervals) and that has no score_mod or
bias can run on these kernels (SM90 / SM100 / SM103, CuTe DSL): they skip every tile outside the intervals, which
the graph SDPA does only for bands. This module and te_compile.cudnn.flexlaunch are the only ones that use
``cudnn.flex_attention``: the plan builder (public) here, the compiled kernels' launches there, and the frontend's
allocating forward / backward wrappers where a launch cannot be recorded. The private names among them are read in
te_compile.cudnn.frontend_private (``FRONTEND_CHECKED``: the versions they were checked on); a frontend without
them is reported unavailable with its version, never called.

Layouts: te_compile's q / k / v are flex's [B, H, S, D]; the kernels read [B, S, H, D] (``transpose(1, 2)``, a
view: no copy, whatever the strides, as long as the head dim is contiguous).

Where the native call path is on (te_compile.cudnn.native), a runner hands it the launches of the call it served
(``native_info``): later calls with the same signature (and the same mask inputs) run them from C++.

Plans (the intervals' block lists, built on the GPU with one host synchronisation, ``_Plans``): a mask_mod that
reads no captured tensor depends only on the shapes, so its plan is built once per (spec, shapes) and kept; one that
reads captured tensors (document ids) is kept per those tensors (address and version). The same synchronisation
reads whether the derivation holds (document ids in runs) and whether a row sees no key: a call whose ids are
not runs runs the reference math (warned once); rows that see no key get output 0 and lse -inf, and their
gradients 0 (the backward reads a huge lse there), as in flex.
"""

from __future__ import annotations

import collections
import functools
import logging
import threading
from typing import Optional, Sequence

import torch
from torch import Tensor

from .. import user_warnings
from ..lowering import intervals
from . import flexlaunch, frontend_private, native
from ..layout import like_layout_strides
from ..spec import AttentionSpec

log = logging.getLogger("te_compile")

#: the architectures the kernels exist for (the frontend's runtime/arch.py)
ARCHES = (90, 100, 103)


@functools.lru_cache(maxsize=1)
def _frontend() -> tuple[Optional[object], str]:
    """(the frontend's flex modules, "") or (None, why they cannot be used here)."""
    try:
        import cudnn
    except Exception as e:  # noqa: BLE001 - any import failure means: not available
        return None, f"cuDNN frontend not importable ({type(e).__name__})"
    ver = getattr(cudnn, "__version__", "?")
    try:
        from cudnn.flex_attention import create_mask_plan
        from cudnn.flex_attention import execution
    except Exception as e:  # noqa: BLE001 - the CuTe DSL (nvidia-cutlass-dsl) or a newer layout missing
        return None, f"cudnn.flex_attention not importable in frontend {ver} ({type(e).__name__}: {str(e)[:80]})"
    wrappers = frontend_private.flex_wrappers(execution)
    try:  # which head dims / head counts the SM90 forward and backward kernels implement
        from cudnn.flex_attention.kernels.sm90.bwd.backward_config import sm90_native_bwd_can_implement
    except Exception:  # noqa: BLE001
        sm90_native_bwd_can_implement = None
    if wrappers is None or sm90_native_bwd_can_implement is None:
        return None, (f"frontend {ver}: cudnn.flex_attention's wrappers changed (checked on "
                      f"{', '.join(frontend_private.FRONTEND_CHECKED)})")
    return (create_mask_plan, *wrappers, sm90_native_bwd_can_implement), ""


def frontend_reason() -> str:
    """Why the frontend's interval kernels cannot be used in this process ("" where they can): no frontend, no CuTe
    DSL, or wrappers that changed."""
    return _frontend()[1]


def sm90_implements(dqk: int, dv: int, hq: int, hkv: int) -> Optional[bool]:
    """Whether the SM90 kernels implement these head dims and counts, forward and backward (the frontend's own
    predicate); None where the frontend is not importable."""
    mods, _ = _frontend()
    return None if mods is None else bool(mods[3](dqk, dv, hq, hkv))


def unavailable(q: Tensor, k: Tensor, v: Tensor) -> Optional[str]:
    """Why the interval kernels cannot serve this call (tensors may be fake), or None."""
    if q.dtype not in (torch.float16, torch.bfloat16) or k.dtype != q.dtype or v.dtype != q.dtype:
        return f"dtype {str(q.dtype).replace('torch.', '')}: cuDNN's interval kernels take float16 and bfloat16"
    if q.dim() != 4 or k.dim() != 4 or v.dim() != 4:
        return "cuDNN's interval kernels take 4-D q, k, v"
    dqk, dv = q.shape[-1], v.shape[-1]
    if isinstance(dqk, int) and isinstance(dv, int):
        if not ((8 <= dqk <= 128 and 8 <= dv <= 128 and dqk % 8 == 0 and dv % 8 == 0) or (dqk, dv) in ((192, 128),
                                                                                                    (256, 256))):
            return f"head dims {dqk}/{dv}: cuDNN's interval kernels take 8..128 in steps of 8, 192/128 or 256/256"
    if isinstance(q.shape[1], int) and isinstance(k.shape[1], int) and q.shape[1] % k.shape[1]:
        return f"{q.shape[1]} query heads over {k.shape[1]} key heads"
    if q.device.type != "cuda":
        # decided for a CUDA GPU on a machine without one (explain's for_device; the passes keep non-CUDA sites
        # otherwise): what a GPU with the frontend installed as te_compile[cuda] installs it (its CuTe DSL) runs
        return None
    mods, why = _frontend()
    if why:
        return why
    if torch.cuda.is_available():
        major, minor = torch.cuda.get_device_capability(q.device)
        if major * 10 + minor not in ARCHES:
            return f"sm{major}{minor}: cuDNN's interval kernels exist for sm90, sm100 and sm103"
        dims = (q.shape[-1], v.shape[-1], q.shape[1], k.shape[1])
        if major == 9 and all(isinstance(x, int) for x in dims) and not sm90_implements(*dims):
            return (f"head dims {dims[0]}/{dims[1]} with {dims[2]}/{dims[3]} heads: the SM90 interval kernels implement "
                    "no backward for them")
    return None


# --------------------------------------------------------------------------- plans

class _Plan:
    """A mask plan, whether its derivation held, its rows that see no key, and its recorded launches
    (te_compile.cudnn.flexlaunch) by operand strides and scale; False where a recording cannot be replayed."""

    __slots__ = ("plan", "valid", "empty_rows", "launches")

    def __init__(self, plan, valid: bool, empty_rows: Optional[Tensor]):
        self.plan, self.valid, self.empty_rows = plan, valid, empty_rows
        self.launches: dict = {}


def _bshd(t: Tensor) -> Tensor:
    return t.transpose(1, 2)


def _conform(t: Tensor, like: Tensor) -> Tensor:
    """``t`` ([B, H, S, D]) in the layout the fake kernels promise (te_compile.layout: ``like``'s order)."""
    want = like_layout_strides(t.shape, like)
    if t.stride() == want:
        return t
    o = torch.empty_strided(t.shape, want, dtype=t.dtype, device=t.device)
    o.copy_(t)
    return o


def _build(spec: AttentionSpec, q: Tensor, k: Tensor, v: Tensor, bufs: Sequence[Tensor], backward: bool) -> _Plan:
    create_mask_plan = _frontend()[0][0]
    B, L, S = q.shape[0], q.shape[2], k.shape[2]
    ep = intervals.endpoints(spec.mask_expr(), B, L, S, bufs, q.device)
    f = ep.funcs[0]
    seen = f[0].long()  # keys per row: [0, F0) plus every [F(2i+1), F(2i+2))
    for i in range(1, f.shape[0], 2):
        seen = seen + (f[i + 1] - f[i]).long()
    empty = (seen == 0).view(B, 1, L)
    flags = torch.stack([ep.valid.all(), empty.any()])
    host = torch.empty(2, dtype=torch.bool, pin_memory=True)
    host.copy_(flags, non_blocking=True)
    ready = torch.cuda.Event()
    ready.record()
    plan = create_mask_plan(ep.funcs, _bshd(q), _bshd(k), _bshd(v), build_backward=backward)  # synchronises
    ready.synchronize()  # recorded before the plan's own read-back: no further wait for the plan's later kernels
    valid, any_empty = (bool(x) for x in host.tolist())
    return _Plan(plan, valid, empty if any_empty else None)


class _Plans:
    """Plans by what they depend on (bounded, oldest first).

    A mask_mod that reads no captured tensor: by (spec, shapes, strides, dtype, device). One that reads captured tensors
    (document ids): by the same plus each tensor's address, version, shape and strides, and the entry holds those
    tensors, so their memory cannot be handed to another tensor while the entry names it: a key can only meet the same
    tensor again, unchanged (an in-place write bumps its version). Every layer of a step that reads the same ids, and
    every step that passes the same ids, reuses one plan without a host synchronisation. Inference tensors have no
    version counter: their plans are built per call."""

    def __init__(self, maxsize: int = 64, per_data: int = 8) -> None:
        self.static: "collections.OrderedDict[tuple, _Plan]" = collections.OrderedDict()
        self.data: "collections.OrderedDict[tuple, tuple[_Plan, list]]" = collections.OrderedDict()
        self.maxsize, self.per_data = maxsize, per_data
        self.lock = threading.Lock()
        self.builds = 0

    @staticmethod
    def _put(table, key, value, size: int, lock) -> None:
        with lock:
            table[key] = value
            while len(table) > size:
                table.popitem(last=False)

    def get(self, spec: AttentionSpec, q, k, v, bufs, backward: bool) -> _Plan:
        key = (spec, q.shape, k.shape, v.shape, q.stride(), k.stride(), v.stride(), q.dtype, q.device, backward)
        if not bufs:
            p = self.static.get(key)
            if p is None:
                self.builds += 1
                p = _build(spec, q, k, v, (), backward)
                self._put(self.static, key, p, self.maxsize, self.lock)
            return p
        if any(b.is_inference() for b in bufs):
            self.builds += 1
            return _build(spec, q, k, v, bufs, backward)
        key += tuple((b.data_ptr(), b._version, b.shape, b.stride(), b.dtype) for b in bufs)
        hit = self.data.get(key)
        if hit is not None:
            return hit[0]
        self.builds += 1
        p = _build(spec, q, k, v, bufs, backward)
        self._put(self.data, key, (p, list(bufs)), self.per_data, self.lock)
        return p


plans = _Plans()
_warned: set = set()


def _warn(spec: AttentionSpec, why: str) -> None:
    key = (spec.key(), why)
    if key in _warned:
        return
    _warned.add(key)
    msg = f"te_compile: {why}; such calls run the reference math (correct but slow). Site: {spec.describe()}"
    log.warning(msg)
    user_warnings.warn(msg)


_NOT_RUNS = ("the document ids of a flex mask_mod are not contiguous runs in every row (a document comes back later "
             "in its row)")


_CAPTURE = ("under CUDA graph capture cuDNN's interval kernels are not used (a replay of them failed with "
            "cudaErrorInvalidAddressSpace, frontend 1.32, H200; a plan build synchronises)")


def _usable(t: Tensor) -> Tensor:
    """An operand the kernels take as it is (unit last stride, no broadcast dimension), else a dense copy."""
    return t if t.stride(-1) == 1 and 0 not in t.stride() else t.contiguous()


# --------------------------------------------------------------------------- launches

#: what a recording that cannot be made raises (the frontend changed under us): such calls use its wrappers
_NOT_RECORDED = (flexlaunch.NoReplay, frontend_private.FrontendChanged, AttributeError, ImportError, KeyError)


def _launch(p: _Plan, key: tuple, operands: tuple, record, wrapper) -> tuple:
    """The call through ``p``'s recorded launches for ``key``; the first call records them (``record()`` returns
    (replay, this call's outputs)); where a recording cannot be made, every call goes through ``wrapper()``."""
    rep = p.launches.get(key)
    if rep:
        return rep(*operands)
    if rep is False:
        return wrapper()
    try:
        rep, outs = record()
    except _NOT_RECORDED as e:
        log.info("te_compile: cuDNN's interval kernels run through the frontend's wrappers (%s)", e)
        p.launches[key] = False
        return wrapper()
    p.launches[key] = rep
    return outs


def _fwd_key(scale: float, q: Tensor, k: Tensor, v: Tensor) -> tuple:
    """What a forward's launches depend on besides the plan (the operands' shapes are the plan's)."""
    return ("fwd", scale, q.stride(), k.stride(), v.stride())


def _bwd_key(scale: float, no_dlse: bool, q: Tensor, k: Tensor, v: Tensor, out: Tensor, dout: Tensor) -> tuple:
    return ("bwd", scale, no_dlse, q.stride(), k.stride(), v.stride(), out.stride(), dout.stride())


def _run_forward(p: _Plan, q: Tensor, k: Tensor, v: Tensor, scale: float) -> tuple[Tensor, Tensor]:
    """out [B, S, H, Dv] and lse [B, H, S] of the kernels on [B, S, H, D] operands."""

    def record():
        rep, out, lse = flexlaunch.forward(p.plan, q, k, v, scale)
        return rep, (out, lse)

    def wrapper():
        out, lse, _ = _frontend()[0][1](q, k, v, mask_plan=p.plan, softmax_scale=scale, return_lse=True)
        return out, lse

    return _launch(p, _fwd_key(scale, q, k, v), (q, k, v), record, wrapper)


def _run_backward(p: _Plan, q, k, v, out, dout, lse, dlse, scale: float) -> tuple[Tensor, Tensor, Tensor]:
    """dq, dk, dv of the kernels on [B, S, H, D] operands."""

    def record():
        return flexlaunch.backward(p.plan, q, k, v, out, dout, lse, dlse, scale)

    def wrapper():
        return tuple(_frontend()[0][2](q, k, v, out, dout, lse, mask_plan=p.plan, softmax_scale=scale,
                                       dlse_tensor=dlse))

    return _launch(p, _bwd_key(scale, dlse is None, q, k, v, out, dout), (q, k, v, out, dout, lse, dlse), record,
                   wrapper)


# --------------------------------------------------------------------------- runners

class _Decline(Exception):
    """This call runs the reference math (the reason is the message)."""


class IntervalForward:
    """A forward on the interval kernels: the plan, then the kernel on [B, S, H, D] views."""

    __slots__ = ("spec", "needs_backward", "last")

    def __init__(self, spec: AttentionSpec, needs_backward: bool = True):
        self.spec, self.needs_backward = spec, needs_backward
        self.last = None  # what the native call path needs of the last call (``native_info``)

    def __call__(self, q, k, v, bias, inputs):
        from .. import reference

        s = self.spec
        self.last = None
        if torch.cuda.is_current_stream_capturing():
            _warn(s, _CAPTURE)
            out, lse = reference.attention_forward(q, k, v, None, s, list(inputs))
            return _conform(out, q), lse.to(reference.compute_dtype(q.dtype)).contiguous()
        try:
            p = plans.get(s, q, k, v, list(inputs), self.needs_backward)
            if not p.valid:
                raise _Decline(_NOT_RUNS)
            ops = tuple(_bshd(_usable(t)) for t in (q, k, v))
            key = _fwd_key(s.scale_for(q.shape[-1]), *ops)
            out_b, lse = _run_forward(p, *ops, s.scale_for(q.shape[-1]))
        except (_Decline, ValueError, TypeError, NotImplementedError, AssertionError) as e:
            _warn(s, str(e) if isinstance(e, _Decline) else f"cuDNN's interval kernels declined the call ({e})")
            out, lse = reference.attention_forward(q, k, v, None, s, list(inputs))
            return _conform(out, q), lse.to(reference.compute_dtype(q.dtype)).contiguous()
        out = out_b.transpose(1, 2)
        if p.empty_rows is not None:
            out = out.masked_fill(p.empty_rows.unsqueeze(-1), 0)
            lse = lse.masked_fill(p.empty_rows, float("-inf"))
        if native.active():
            self.last = _Served(p, key, list(inputs), (q, k, v))
        return _conform(out, q), lse.contiguous()

    def native_info(self):
        """The last call's launches in the form the native call path runs (te_compile.cudnn.native), or why not."""
        last, self.last = self.last, None
        info = _native_form(last)
        if isinstance(info, dict):
            q, _, v = last.operands
            info["out_stride"] = like_layout_strides((q.shape[0], q.shape[1], q.shape[2], v.shape[3]), q)
        return info


class IntervalBackward:
    """The backward on the interval kernels, with the forward's plan (or a new one) and the empty rows' lse guard."""

    __slots__ = ("spec", "last")

    def __init__(self, spec: AttentionSpec):
        self.spec = spec
        self.last = None

    def __call__(self, dout, q, k, v, out, lse, bias, inputs, dlse=None):
        from .. import reference

        s = self.spec
        self.last = None
        try:
            if torch.cuda.is_current_stream_capturing():
                raise _Decline(_CAPTURE)
            p = plans.get(s, q, k, v, list(inputs), True)
            if not p.valid:
                raise _Decline(_NOT_RUNS)
            # rows that see no key have lse -inf: the kernels read a huge finite one there (gradients 0); only a
            # plan with such rows needs the guard's extra pass
            guarded = lse.contiguous() if p.empty_rows is None else torch.nan_to_num(
                lse, nan=float("nan"), posinf=float("inf"), neginf=1e30).contiguous()
            ops = tuple(_bshd(_usable(t)) for t in (q, k, v, out, dout))
            scale = s.scale_for(q.shape[-1])
            key = _bwd_key(scale, dlse is None, *ops)
            grads = _run_backward(p, *ops, guarded, None if dlse is None else dlse.contiguous(), scale)
            dq, dk, dv = (g.transpose(1, 2) for g in grads)
        except (_Decline, ValueError, TypeError, NotImplementedError, AssertionError) as e:
            _warn(s, str(e) if isinstance(e, _Decline) else f"cuDNN's interval kernels declined the call ({e})")
            dq, dk, dv, _ = reference.attention_backward(dout, q, k, v, out, lse, None, s, False, list(inputs), dlse)
            return _conform(dq, q), _conform(dk, k), _conform(dv, v), q.new_empty((0,))
        if dlse is None and native.active():
            self.last = _Served(p, key, list(inputs), (q, k, v, out, dout))
        return _conform(dq, q), _conform(dk, k), _conform(dv, v), q.new_empty((0,))

    def native_info(self):
        """The last call's launches in the form the native call path runs (te_compile.cudnn.native), or why not."""
        last, self.last = self.last, None
        info = _native_form(last)
        if isinstance(info, dict):
            info["grad_strides"] = [like_layout_strides(t.shape, t) for t in last.operands[:3]]
            info["guard_lse"] = last.plan.empty_rows is not None
        return info


# --------------------------------------------------------------------------- the native call path

class _Served:
    """A call the interval kernels served: its plan, launch key, (in i) inputs and operands."""

    __slots__ = ("plan", "key", "inputs", "operands")

    def __init__(self, plan: _Plan, key: tuple, inputs: list, operands: tuple):
        self.plan, self.key, self.inputs, self.operands = plan, key, inputs, operands


def _native_form(last: Optional[_Served]):
    """What the native call path needs to run the launches of ``last`` in C++: their C form
    (``flexlaunch.native_form``), the kernels to keep alive, the rows that see no key, and the (in i) inputs the
    plan was built from (a call must pass them unchanged: ``again`` asks to register a new plan's launches when
    Python serves such a call). Where the call cannot run there: why (a string); None when no call was served."""
    if last is None:
        return None
    why = None
    rep = last.plan.launches.get(last.key)
    if not rep:
        why = "its launches were not recorded"
    elif any(_usable(t) is not t for t in last.operands):
        why = "an operand is copied before the kernels read it"
    elif any(b.is_inference() for b in last.inputs):
        why = "the mask reads inference tensors (no version to check)"
    if why is None:
        try:
            form, keep = flexlaunch.native_form(rep)
        except (flexlaunch.NoReplay, ImportError, AttributeError, TypeError) as e:
            why = str(e)
    if why is not None:
        return f"cuDNN's interval kernels: {why}"
    return dict(interval=form, keep=keep, ffi=flexlaunch.tvm_ffi_api, rows=last.plan.empty_rows,
                data=list(last.inputs), again=bool(last.inputs))
