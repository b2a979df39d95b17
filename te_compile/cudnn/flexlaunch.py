"""Recorded launches of cuDNN's interval kernels: the frontend's compiled CuTe kernels called with nothing in between.

The frontend's allocating wrappers (``frontend_private.flex_wrappers``) resolve,
validate and normalise the same plan and shapes again on every call, in Python: for a training step that is several
hundred microseconds of host time, more than the kernels take at a few thousand tokens. What a call launches depends
only on the plan, the operands' shapes, strides and dtypes, the softmax scale and whether a dlse is passed; so the
first call for such a key runs the frontend's own code once with every compiled kernel wrapped in a recorder, and
names each tensor argument of each launch by where it came from: an operand of the call, a buffer allocated for the
call (an output or a workspace, empty or zeroed as the frontend does), or a tensor of the plan (kept, as the plan
is). Every later call with the same key allocates the buffers and calls the same kernels with the same arguments in
the same order. An argument that is none of these (the frontend changed) means no recording: such calls keep going
through the frontend's wrappers.

``native_form`` gives a replay in the form the native call path (csrc/interval_launch.h) launches from C++: the
kernels' TVM-FFI functions and every argument by kind.

This module and te_compile.cudnn.flexkernel are the only ones that use ``cudnn.flex_attention``; the private names
they use are read in te_compile.cudnn.frontend_private.
"""

from __future__ import annotations

import dataclasses
from typing import Callable, Optional, Sequence

import torch
from torch import Tensor

from . import frontend_private

#: workspace buffers of the frontend's backward, and the ones it zeroes before the kernels run
#: (``frontend_private.backward`` with ``_preallocated``)
_BWD_WORKSPACE = ("dq_accum", "dpsum", "lse_log2", "dk_accum", "dv_accum", "dq_semaphore", "dk_semaphore", "dv_semaphore")
_BWD_ZEROED = ("dk_accum", "dv_accum", "dq_semaphore", "dk_semaphore", "dv_semaphore")


class NoReplay(Exception):
    """The recorded launches cannot be replayed (the message says why); the caller keeps the frontend's wrappers."""


def _key(t: Tensor) -> tuple:
    return (t.data_ptr(), tuple(t.shape), tuple(t.stride()), t.dtype)


class _Log:
    """Recorders for compiled kernels that share one ordered log of (kernel, args)."""

    def __init__(self) -> None:
        self.calls: list = []

    def wrap(self, fn: Optional[Callable]) -> Optional[Callable]:
        if fn is None:
            return None

        def recorded(*args):
            self.calls.append((fn, args))
            return fn(*args)

        return recorded


@dataclasses.dataclass(frozen=True)
class Buffer:
    """A tensor allocated for each call: shape, strides, dtype, zeroed or not."""

    shape: tuple
    stride: tuple
    dtype: torch.dtype
    zero: bool

    @staticmethod
    def like(t: Tensor, zero: bool) -> "Buffer":
        return Buffer(tuple(t.shape), tuple(t.stride()), t.dtype, zero)

    def new(self, device) -> Tensor:
        t = torch.empty_strided(self.shape, self.stride, dtype=self.dtype, device=device)
        return t.zero_() if self.zero else t


class Replay:
    """Kernel launches whose tensor arguments are slots: operands 0..n-1, then one buffer per ``buffers`` entry.

    ``calls``: (kernel, args with slot positions filled by None, ((position, slot), ...)). Built by ``record``."""

    __slots__ = ("calls", "buffers", "n_operands", "outputs")

    def __init__(self, calls, buffers: Sequence[Buffer], n_operands: int, outputs: Sequence[int]):
        self.calls, self.buffers, self.n_operands, self.outputs = calls, tuple(buffers), n_operands, tuple(outputs)

    def __call__(self, *operands: Optional[Tensor]) -> tuple:
        device = next(t for t in operands if t is not None).device
        vals = [None if t is None else t.detach() for t in operands]
        vals += [b.new(device) for b in self.buffers]
        for fn, args, subs in self.calls:
            a = list(args)
            for pos, slot in subs:
                a[pos] = vals[slot]
            fn(*a)
        return tuple(vals[i] for i in self.outputs)


def record(run: Callable[[_Log], None], operands: Sequence[Optional[Tensor]], buffers: Sequence[tuple[Tensor, Buffer]],
           constants: Sequence[Tensor], outputs: Sequence[int]) -> Replay:
    """Run ``run(log)`` (the frontend's code, its kernels wrapped by ``log.wrap``) and turn what it launched into a
    Replay. ``operands``: the call's tensors; ``buffers``: (tensor passed to the frontend for this call, how to allocate
    it again); ``constants``: tensors that may be passed as they are (the plan's); ``outputs``: slots returned."""
    log = _Log()
    run(log)
    if not log.calls:
        raise NoReplay("the frontend launched no kernel through its compiled callables")
    slots: dict = {}
    for i, t in enumerate(operands):
        if t is not None:
            slots.setdefault(_key(t), i)
    for j, (t, _) in enumerate(buffers):
        slots.setdefault(_key(t), len(operands) + j)
    const_ptrs = {c.data_ptr() for c in constants if c is not None}

    def constant(x) -> bool:  # a value that is the same on every call with this key
        if isinstance(x, Tensor):
            return x.data_ptr() in const_ptrs and _key(x) not in slots
        if isinstance(x, (tuple, list)):
            return all(constant(y) for y in x)
        return x is None or isinstance(x, (bool, int, float, str))

    calls = []
    for fn, args in log.calls:
        static, subs = [], []
        for pos, x in enumerate(args):
            if isinstance(x, Tensor) and _key(x) in slots:
                static.append(None)
                subs.append((pos, slots[_key(x)]))
            elif constant(x):
                static.append(x)
            else:
                raise NoReplay(f"argument {pos} of a recorded launch ({type(x).__name__}) is neither an operand, a "
                               "buffer of the call nor a tensor of the plan")
        calls.append((fn, tuple(static), tuple(subs)))
    return Replay(calls, [b for _, b in buffers], len(operands), outputs)


def plan_tensors(plan) -> list:
    """Every tensor a mask plan hands to the kernels (what a recording may pass as it is)."""
    return frontend_private.plan_tensors(plan)


def forward(plan, q: Tensor, k: Tensor, v: Tensor, scale: float) -> tuple[Replay, Tensor, Tensor]:
    """Compile (or find) the forward for this plan and these [B, S, H, D] operands, run it once recorded.
    Returns the replay (operands q, k, v; outputs out, lse) and this call's out, lse."""
    fe = frontend_private
    packed = fe.forward_runtime_args(plan)
    dispatch = fe.prepare_forward(q, k, v, pack_gqa=plan.metadata.pack_gqa, block_sparse_tensors=packed, has_lse=True)
    out = torch.empty(dispatch.output_shape, dtype=q.dtype, device=q.device)
    lse = torch.empty(dispatch.lse_shape, dtype=torch.float32, device=q.device)
    sched = torch.zeros((1,), dtype=torch.int32, device=q.device) if dispatch.arch == 90 else None
    kernel = fe.compile_forward(dispatch, q, k, v, out, lse, scale, None, None, sched)
    buffers = [(out, Buffer.like(out, False)), (lse, Buffer.like(lse, False))]
    if sched is not None:
        buffers.append((sched, Buffer.like(sched, True)))

    def run(log: _Log) -> None:
        fe.launch_forward(dispatch, log.wrap(kernel), q, k, v, out, lse, scale, None, None, sched)

    rep = record(run, (q, k, v), buffers, plan_tensors(plan), outputs=(3, 4))
    return rep, out, lse


def backward(plan, q: Tensor, k: Tensor, v: Tensor, out: Tensor, dout: Tensor, lse: Tensor, dlse: Optional[Tensor],
             scale: float) -> tuple[Replay, tuple]:
    """Compile (or find) the backward for this plan and these operands, run it once recorded.
    Returns the replay (operands q, k, v, out, dout, lse, dlse; outputs dq, dk, dv) and this call's dq, dk, dv."""
    fe = frontend_private
    packed = fe.backward_runtime_args(plan)
    grads = [torch.empty_like(t) for t in (q, k, v)]
    common = dict(softmax_scale=scale, deterministic=False, block_sparse_tensors=packed, dlse=dlse, _native_inputs=True)
    *_, bundle = fe.backward(q, k, v, out, dout, lse, _compile_only=True, _compile_outputs=tuple(grads), **common)
    names = [name for name, _, _ in bundle.workspace_specs]
    if any(n not in _BWD_WORKSPACE for n in names):
        raise NoReplay(f"the frontend's backward asks for workspace {names}, not the buffers checked "
                       f"({', '.join(_BWD_WORKSPACE)})")
    ws = {}
    for name, shape, dtype in bundle.workspace_specs:
        ws[name] = None if shape is None else torch.empty(shape, dtype=dtype, device=q.device)
    buffers = [(g, Buffer.like(g, False)) for g in grads]
    buffers += [(t, Buffer.like(t, n in _BWD_ZEROED)) for n, t in ws.items() if t is not None]

    def run(log: _Log) -> None:
        wrapped = dataclasses.replace(bundle, preprocess=log.wrap(bundle.preprocess), main=log.wrap(bundle.main),
                                      post_dq=log.wrap(bundle.post_dq), post_dk=log.wrap(bundle.post_dk),
                                      post_dv=log.wrap(bundle.post_dv))
        pre = fe.backward_preallocated(dq=grads[0], dk=grads[1], dv=grads[2], **ws)
        fe.backward(q, k, v, out, dout, lse, _preallocated=pre, _compiled=wrapped, **common)

    rep = record(run, (q, k, v, out, dout, lse, dlse), buffers, plan_tensors(plan), outputs=(7, 8, 9))
    return rep, tuple(grads)


# --------------------------------------------------------------------------- the C++ form (te_compile.cudnn.native)

#: argument kinds of the C++ form (csrc/interval_launch.h, ``Arg``)
_SLOT, _CONST, _INT, _FLOAT, _BOOL, _NONE, _ARRAY = range(7)


def native_form(rep: Replay) -> tuple:
    """``rep`` as the native call path loads it (``register_interval_*``): per launch the TVM-FFI function handle and
    its arguments as parallel lists (kind, integer, float), the plan's tensors, the buffers (shapes, strides, a tensor
    of each dtype, zeroed), the operand count and the output slots, then the objects the handles point into (the
    kernels' functions, and each tuple argument converted once to the TVM-FFI Array the kernel reads: the plan's
    tensors), which the caller keeps alive until C++ holds references of its own. Raises NoReplay where a launch has no C form (a kernel that is not a positional TVM-FFI
    function, an argument that is not a tensor, a number, a bool, None or a tuple of the plan's tensors)."""
    import tvm_ffi

    funcs, kinds, ints, floats, consts, keep = [], [], [], [], [], []
    const_at: dict = {}
    for fn, args, subs in rep.calls:
        target = _ffi_function(fn, len(args))
        if getattr(getattr(fn, "execution_args", None), "has_pointer_address_arg_specs", True):
            raise NoReplay("a recorded kernel converts pointer arguments in Python")
        slot_at = dict(subs)
        k, iv, fv = [], [], []
        for pos, x in enumerate(args):
            if pos in slot_at:
                k.append(_SLOT), iv.append(slot_at[pos]), fv.append(0.0)
            elif isinstance(x, Tensor):
                at = const_at.setdefault(id(x), len(consts))
                if at == len(consts):
                    consts.append(x)
                k.append(_CONST), iv.append(at), fv.append(0.0)
            elif x is None:
                k.append(_NONE), iv.append(0), fv.append(0.0)
            elif isinstance(x, bool):
                k.append(_BOOL), iv.append(int(x)), fv.append(0.0)
            elif isinstance(x, int) and -(1 << 63) <= x < (1 << 63):
                k.append(_INT), iv.append(x), fv.append(0.0)
            elif isinstance(x, float):
                k.append(_FLOAT), iv.append(0), fv.append(x)
            elif isinstance(x, (tuple, list)) and all(y is None or isinstance(y, Tensor) for y in x):
                arr = tvm_ffi.convert(tuple(x))
                if not isinstance(arr, tvm_ffi.Array) or not arr.__chandle__():
                    raise NoReplay(f"argument {pos} of a recorded launch did not convert to a TVM-FFI Array")
                keep.append(arr)
                k.append(_ARRAY), iv.append(int(arr.__chandle__())), fv.append(0.0)
            else:
                raise NoReplay(f"argument {pos} of a recorded launch ({type(x).__name__}) has no C form")
        funcs.append(int(target.__chandle__()))
        keep += [fn, target]
        kinds.append(k), ints.append(iv), floats.append(fv)
    b = rep.buffers
    form = (funcs, kinds, ints, floats, consts, [list(x.shape) for x in b], [list(x.stride) for x in b],
            [torch.empty(0, dtype=x.dtype) for x in b], [x.zero for x in b], rep.n_operands, list(rep.outputs))
    return form, keep


def _ffi_function(fn, n_args: int):
    """The positional TVM-FFI function a compiled kernel calls with ``n_args`` positional arguments: the kernel itself,
    or the function behind its keyword wrapper when every parameter is positional and all were passed (the wrapper
    then passes them through). Raises NoReplay otherwise."""
    import inspect

    import tvm_ffi

    if isinstance(fn, tvm_ffi.Function):
        target = fn
    else:
        get, wrapper = getattr(fn, "__tvm_ffi_object__", None), getattr(fn, "_kwargs_wrapper", None)
        target = get() if get is not None and wrapper is not None else None
        if not isinstance(target, tvm_ffi.Function):
            raise NoReplay(f"a recorded kernel ({type(fn).__name__}) has no TVM-FFI function")
        params = list(inspect.signature(wrapper).parameters.values())
        if len(params) != n_args or any(p.kind not in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) for p in params):
            raise NoReplay(f"a recorded kernel takes {len(params)} parameters, {n_args} were passed positionally")
    if not target.__chandle__():
        raise NoReplay("a recorded kernel's TVM-FFI function is not initialized")
    return target


def tvm_ffi_api() -> tuple[int, ...]:
    """Addresses of TVM-FFI's ``TVMFFIFunctionCall``, ``TVMFFIEnvSetStream``, ``TVMFFIErrorMoveFromRaised``,
    ``TVMFFIObjectIncRef`` and ``TVMFFIObjectDecRef`` in the libtvm_ffi this process loaded (the one the compiled
    kernels link)."""
    import ctypes

    import tvm_ffi

    lib = tvm_ffi.LIB
    return tuple(ctypes.cast(getattr(lib, name), ctypes.c_void_p).value
                 for name in ("TVMFFIFunctionCall", "TVMFFIEnvSetStream", "TVMFFIErrorMoveFromRaised",
                              "TVMFFIObjectIncRef", "TVMFFIObjectDecRef"))
