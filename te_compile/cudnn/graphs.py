"""cuDNN SDPA forward/backward graphs: build, cache, execute on PyTorch's current stream.

Everything here runs inside the te_compile custom ops on CUDA tensors. Facts that shape it
(see docs/cudnn-notes.md):

* The cache key is te_compile's own (spec + shapes + strides + dtypes + device + dBias):
  cuDNN's ``graph.key()`` ignores score_mod callbacks and costs a full lowering.
* One ``cudnn.Handle`` per (thread, device), re-bound to ``torch.cuda.current_stream()`` on
  every call; without a handle cuDNN runs on stream 0.
* Q/K/V/dO are passed with their own strides (BSHD views stay views); only a non-unit last
  stride or a base pointer that is not 16-byte aligned forces a copy.
* dBias is a separate output: the backward graph only has it when the bias needs a grad.
* Building a graph takes ~100s of ms; failures (no engine for this config) raise
  ``Unsupported`` and are remembered, so a rejected config is not rebuilt on every call.
"""

from __future__ import annotations

import collections
import ctypes
import dataclasses
import functools
import gc
import logging
import math
import threading
import time
import types
from enum import IntEnum
from typing import Any, Callable, Optional, Sequence

import torch
from torch import Tensor

import cudnn  # the cuDNN frontend package (nvidia-cudnn-frontend)

from ..layout import contiguous_strides, empty_like_layout, like_layout_strides
from ..spec import AttentionSpec
from .emit import Emitter, inputs_full, structure
from . import prefix
from .lowering import Lowering, lower

log = logging.getLogger("te_compile")

IO_TYPES = {torch.float16: cudnn.data_type.HALF, torch.bfloat16: cudnn.data_type.BFLOAT16}
_F32 = cudnn.data_type.FLOAT

#: bound of the LRU of built graphs (te_compile.cudnn.graphs.cache.maxsize changes it at run time)
CACHE_SIZE = 256


class Unsupported(RuntimeError):
    """cuDNN cannot serve this configuration; the op falls back to the reference math."""


class _UID(IntEnum):
    Q = 1
    K = 2
    V = 3
    BIAS = 4
    O = 100  # noqa: E741
    STATS = 101
    DO = 200
    DQ = 201
    DK = 202
    DV = 203
    DBIAS = 204
    INPUTS = 300  # + i for the i-th (in i) score_mod input
    CONSTS = 400  # + j for the j-th pass-by-value constant


class _Built:
    """A built graph and how to execute it: ``run(buffers, workspace, handle)``, buffers in ``uids`` order.

    Steady-state execute goes straight to the backend graph's ``_execute_with_raw_ptrs`` (one C++
    call with a ``void*[]`` in the backend's ascending-uid order) when the graph is served by the
    cuDNN backend and the caller's uids are exactly the backend's operand slots. The public
    ``graph.execute(..., tensor_uids=...)`` re-reads every operand's geometry through a Python layer
    on every call (FE 1.32 ``_pygraph._execute``; host times in docs/cudnn-notes.md);
    anything unexpected about the graph keeps that public path."""

    __slots__ = ("graph", "workspace", "uids", "_raw")

    def __init__(self, graph: Any, workspace: int, uids: tuple[int, ...]):
        self.graph, self.workspace, self.uids = graph, workspace, uids
        self._raw: Any = _FIRST  # the first execute goes the public way (it finishes any lazy build)

    def run(self, buffers: Sequence[Tensor], workspace: Optional[Tensor], handle: Any) -> None:
        """``workspace`` may be None only where ``workspace_for`` returned None (no workspace, raw execute)."""
        raw = self._raw
        if raw is None or raw is _FIRST or not RAW_EXECUTE:
            self.graph.execute(buffers, workspace, handle=handle, tensor_uids=self.uids)
            if raw is _FIRST:
                self._raw = _raw_executor(self.graph, self.uids)
                # FE 1.32's first execute of a graph leaves a reference cycle that holds this call's
                # buffers (q/k/v, out, lse, workspace) until Python's cycle collector runs. Under
                # mode="reduce-overhead" those buffers live in the CUDA-graph pool: cudagraph trees then
                # found the forward's lse (dead, but not yet collected) and refused to record ("storage
                # data ptrs are not allocated in pool", bench/probes/probe_cudagraphs.py). Collecting here,
                # once per built graph, frees them when their last real owner lets go.
                gc.collect()
            return
        lowered, index, slots, n = raw
        ptrs = (ctypes.c_void_p * n)()
        for i, t in zip(slots, buffers):
            if i >= 0:
                ptrs[i] = t.data_ptr()
        ws = 0 if workspace is None else workspace.data_ptr()
        lowered._execute_with_raw_ptrs(ctypes.addressof(ptrs), n, ws, handle.backend_handle or 0, index)

    def workspace_for(self, device: torch.device) -> Optional[Tensor]:
        """The workspace for one execute: None (no allocation) when the graph needs no workspace and the
        raw-pointer execute serves it (the public execute always gets a tensor)."""
        if self.workspace == 0 and RAW_EXECUTE and self._raw is not None and self._raw is not _FIRST:
            return None
        return new_workspace(self.workspace, device)


def raw_slots(order: Sequence[int], uids: Sequence[int]) -> Optional[tuple[int, ...]]:
    """Each caller buffer's slot in the backend's ascending-uid variant pack, -1 for a buffer the backend does
    not read; None when the pack is not ascending or holds a uid the caller does not pass.

    The backend may read fewer tensors than the caller defines: constants of an emitted score_mod that the
    lowered graph dropped (a softcap's scalars, or all of them with a causal band) are in FE's graph but not
    in the backend's variant pack."""
    order = [int(u) for u in order]
    ours = [int(u) for u in uids]
    if sorted(order) != order or len(set(ours)) != len(ours) or not set(order) <= set(ours):
        return None
    pos = {u: i for i, u in enumerate(order)}
    return tuple(pos.get(u, -1) for u in ours)


#: steady-state execute through the backend graph's raw-pointer entry (False: FE's public execute)
RAW_EXECUTE = True
_FIRST = object()


def _raw_executor(g: Any, uids: Sequence[int]) -> Optional[tuple]:
    """(backend graph, plan index, slot of each caller buffer (-1: the backend does not read it), slot count),
    or None for the public path."""
    try:
        if g.selected_engine is not None or g._lowered_graph is None or not g._plans:
            return None  # a Python engine serves this graph, or nothing was lowered
        lowered = g._lowered_graph
        lowered._prepare_variant_pack_template()
        order = [int(u) for u in lowered._get_variant_pack_uids_sorted()]
        slots = raw_slots(order, uids)
        if slots is None:
            return None
        cfg = g._materialize_backend_plan(g._plan_index)
        index = -1 if cfg.cpp_index is None else int(cfg.cpp_index)
        return lowered, index, slots, len(order)
    except Exception as e:  # noqa: BLE001 - a frontend without these internals: public execute
        log.debug("te_compile: cuDNN raw execute unavailable (%s: %s)", type(e).__name__, e)
        return None


class GraphCache:
    """Bounded LRU of built graphs, with failures remembered as well."""

    def __init__(self, maxsize: int):
        self.maxsize = maxsize
        self._entries: "collections.OrderedDict[tuple, _Built | Unsupported]" = collections.OrderedDict()
        self._lock = threading.Lock()
        self.builds = 0
        self.build_seconds = 0.0

    def get(self, key: tuple, build: Callable[[], _Built]) -> _Built:
        hit = self._entries.get(key)
        if hit is None:
            with self._lock:
                hit = self._entries.get(key)
                if hit is None:
                    hit = self._build(key, build)
                    self._entries[key] = hit
                    while len(self._entries) > max(1, self.maxsize):
                        self._entries.popitem(last=False)
                        _plans.clear()
        else:
            try:
                self._entries.move_to_end(key)
            except KeyError:  # evicted by another thread meanwhile
                pass
        if isinstance(hit, Unsupported):
            raise hit
        return hit

    def _build(self, key: tuple, build: Callable[[], _Built]) -> "_Built | Unsupported":
        t0 = time.perf_counter()
        try:
            built: _Built | Unsupported = build()
        except (cudnn.cudnnGraphNotSupportedError, RuntimeError, ValueError) as e:
            built = Unsupported(f"{type(e).__name__}: {str(e).strip().splitlines()[0] if str(e).strip() else e!r}")
        dt = time.perf_counter() - t0
        self.builds += 1
        self.build_seconds += dt
        what = "built" if isinstance(built, _Built) else "could not build"
        log.info("te_compile: %s cuDNN %s graph in %.0f ms (%d cached)", what, key[0], dt * 1e3,
                 len(self._entries) + 1)
        return built

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()
            _plans.clear()

    def __len__(self) -> int:
        return len(self._entries)


cache = GraphCache(CACHE_SIZE)

@dataclasses.dataclass(frozen=True, slots=True)
class CallPlan:
    """What a repeated call needs at run time, worked out once by the slow path for one call signature
    (``signature``): the built graph, the layouts of what the call allocates, the constant buffers. The fast
    path of ``forward`` / ``backward`` runs it without lowering, keys or layout checks (host time per call)."""

    built: "_Built"
    consts: tuple  # the pass-by-value constant buffers, after the inputs
    out_shape: tuple = ()  # forward: out and lse
    out_stride: tuple = ()
    lse_shape: tuple = ()
    lse_stride: tuple = ()
    grad_strides: tuple = ()  # backward: dq, dk, dv
    need_dbias: bool = False
    reads_inputs: bool = True  # the (in i) inputs are operands (native ALiBi reads none)


#: fast path: call signature (spec + shapes/strides/dtypes of the raw operands) -> its CallPlan, for calls
#: whose operands cuDNN takes as they are
_plans: "dict[tuple, CallPlan]" = {}


def plans() -> "types.MappingProxyType[tuple, CallPlan]":
    """The remembered call plans (read-only; ``cache.clear()`` empties them)."""
    return types.MappingProxyType(_plans)


def signature(tag: str, spec: AttentionSpec, flag: Any, tensors: Sequence[Optional[Tensor]]) -> tuple:
    """The fast path's key: direction, spec, flag (need_dbias) and each raw operand's geometry."""
    return (tag, spec, flag) + tuple(None if t is None else (t.shape, t.stride(), t.dtype, t.device)
                                     for t in tensors)


def _aligned(tensors: Sequence[Optional[Tensor]]) -> bool:
    return all(t is None or t.data_ptr() % 16 == 0 for t in tensors)


def _same(a: Optional[Tensor], b: Optional[Tensor]) -> bool:
    """b is a as cuDNN sees it (same memory, shape and strides)."""
    if a is None or b is None:
        return a is b
    return a.data_ptr() == b.data_ptr() and a.shape == b.shape and a.stride() == b.stride()


def _remember(sig: tuple, plan: CallPlan) -> None:
    if len(_plans) >= 4 * CACHE_SIZE:
        _plans.clear()
    _plans[sig] = plan


_tls = threading.local()


def handle(device: torch.device) -> Any:
    """This thread's cuDNN handle for ``device``, bound to torch's current stream."""
    handles = getattr(_tls, "handles", None)
    if handles is None:
        handles = _tls.handles = {}
    h = handles.get(device)
    if h is None:
        with torch.cuda.device(device):
            h = handles[device] = cudnn.create_handle()
    # the raw stream int, without building a torch.cuda.Stream object per call
    cudnn.set_stream(handle=h, stream=torch._C._cuda_getCurrentRawStream(device.index))
    return h


def new_workspace(nbytes: int, device: torch.device) -> Tensor:
    """A workspace for one execute, from torch's caching allocator (so freed right after).

    Not cached across calls: under CUDA graphs (mode="reduce-overhead") a buffer kept alive from
    the warm-up run sits in the graph's memory pool, and cudagraph trees refuse to record
    ("tensor(s) in the cudagraph pool not tracked as outputs", tests/test_cuda_graphs.py)."""
    return torch.empty(max(nbytes, 1), dtype=torch.uint8, device=device)


def _operand(t: Tensor) -> Tensor:
    """cuDNN needs a unit last stride and a 16-byte-aligned base (clone, not contiguous())."""
    if t.stride(-1) != 1 or t.data_ptr() % 16:
        t = t.clone(memory_format=torch.contiguous_format)
    return t


def _io_type(q: Tensor, bias: Optional[Tensor], *others: Optional[Tensor]) -> Any:
    """cuDNN's io type for q's dtype; every other operand in it, except a bias, which may be float32 (a learned
    table's bias: rounded to bf16 it put dBias and dQ 3-8x further from eager's float32 math)."""
    if q.dtype not in IO_TYPES:
        raise Unsupported(f"dtype {q.dtype} (cuDNN SDPA serves float16 and bfloat16)")
    for t in others:
        if t is not None and t.dtype != q.dtype:
            raise Unsupported(f"mixed dtypes {q.dtype} and {t.dtype}")
    if bias is not None and bias.dtype not in (q.dtype, torch.float32):
        raise Unsupported(f"a {bias.dtype} bias with {q.dtype} q (served: {q.dtype} or float32)")
    return IO_TYPES[q.dtype]


def _bias4d(bias: Tensor, B: int, H: int, L: int, S: int) -> Tensor:
    """bias broadcastable to [B, H, L, S] -> a 4-D operand [1|B, 1|H, L, S] cuDNN accepts."""
    b = bias
    while b.dim() < 4:
        b = b.unsqueeze(0)
    b = b.expand(B if b.shape[0] != 1 else 1, H if b.shape[1] != 1 else 1, L, S)
    broadcast = any(st == 0 and n > 1 for st, n in zip(b.stride(), b.shape))
    unaligned = any(st % 8 for st, n in zip(b.stride()[:-1], b.shape[:-1]) if n > 1)
    if broadcast or unaligned or b.stride(-1) != 1 or b.data_ptr() % 16:
        b = _padded_empty(tuple(b.shape), b.dtype, b.device).copy_(b)
    return b


def padded_strides(shape: Sequence[int]) -> tuple[int, ...]:
    """Row-major strides with the rows (last dim) padded to a multiple of 8 elements (16 bytes):
    cuDNN reads and writes bias / dBias rows at 16-byte-aligned strides (a dBias with S = 255 came
    back wrong)."""
    B, H, L, S = shape
    sp = -(-S // 8) * 8
    return (H * L * sp, L * sp, sp, 1)


def _padded_empty(shape: tuple, dtype: torch.dtype, device: torch.device) -> Tensor:
    sp = -(-shape[-1] // 8) * 8
    return torch.empty(*shape[:-1], sp, dtype=dtype, device=device)[..., : shape[-1]]


def _sdpa_kwargs(lw: Lowering, head_dim: int, bias_t: Any, emitter: Optional[Emitter] = None,
                 backward: bool = False) -> dict:
    kw: dict = {"attn_scale": lw.spec.scale_for(head_dim)}
    if bias_t is not None:
        kw["bias"] = bias_t
    band = (None, 0) if lw.spec.is_causal else lw.band
    if band is not None:  # native masks skip masked tiles (a score_mod disables them)
        kw["diagonal_alignment"] = cudnn.diagonal_alignment.TOP_LEFT
        kw["diagonal_band_right_bound"] = band[1]
        if band[0] is not None:
            kw["diagonal_band_left_bound"] = band[0]
        if lw.alibi:
            kw["use_alibi_mask"] = True
    elif emitter is not None:
        kw["score_mod"] = emitter.score_mod
        if backward and emitter.needs_bprop:
            kw["score_mod_bprop"] = emitter.bprop
    return kw


def _input_tensors(g: Any, inputs: Sequence[Meta]) -> list:
    return [g.tensor(name=f"in{i}", dim=list(m[0]), stride=list(m[1]), data_type=_F32, uid=_UID.INPUTS + i)
            for i, m in enumerate(inputs)]


def _emitter(g: Any, lw: Lowering, inputs: Sequence[Meta]) -> tuple[Optional[Emitter], list]:
    if not lw.emitted:
        return None, []
    ts = _input_tensors(g, inputs)
    uids = [_UID.INPUTS + i for i in range(len(inputs))]
    consts = {v: g.tensor(name=f"c{j}", dim=[1, 1, 1, 1], stride=[1, 1, 1, 1], data_type=_F32,
                          uid=_UID.CONSTS + j, is_pass_by_value=True)
              for j, v in enumerate(lw.constants)}
    uids += [_UID.CONSTS + j for j in range(len(consts))]
    return Emitter(lw, ts, consts, inputs_full(lw)), uids


def _graph_key(lw: Lowering) -> Any:
    """What a built graph depends on: the spec itself for native masks and plain SDPA; for emitted
    mods, their structure (constant values are fed at execute, so a changed softcap reuses the graph)."""
    if not lw.emitted:
        return lw.spec
    return ("emitted", lw.spec.mask, structure(lw))


@functools.lru_cache(maxsize=1024)
def _const_buffers(lw: Lowering) -> tuple[Tensor, ...]:
    """CPU float32 scalars for the pass-by-value constants, in uid order (made once per lowering)."""
    return tuple(torch.full((1, 1, 1, 1), v, dtype=torch.float32) for v in lw.constants)


def new_graph(handle: Any, io: Any) -> Any:
    return cudnn.pygraph(handle=handle, io_data_type=io, intermediate_data_type=_F32, compute_data_type=_F32)


def finish(g: Any, uids: list[int]) -> _Built:
    """Build ``g``'s execution plans (raises cudnnGraphNotSupportedError when no engine runs it)."""
    g.validate()
    g.build_operation_graph()
    g.create_execution_plans([cudnn.heur_mode.A, cudnn.heur_mode.FALLBACK])
    g.check_support()
    g.build_plans()
    return _Built(g, g.get_workspace_size(), tuple(int(u) for u in uids))


Meta = tuple  # (shape, stride) of one operand


def _meta(t: Optional[Tensor]) -> Optional[Meta]:
    return None if t is None else (tuple(t.shape), tuple(t.stride()))


def bias_meta(b4: Optional[Tensor], q: Tensor) -> Optional[Meta]:
    """The bias's meta, with a third entry "float32" for a float32 bias next to half-precision q."""
    m = _meta(b4)
    return m if b4 is None or b4.dtype == q.dtype else (*m, "float32")


def _tensor(g: Any, name: str, m: Meta, io: Any, uid: int) -> Any:
    dt = _F32 if len(m) > 2 and m[2] == "float32" else io
    return g.tensor(name=name, dim=list(m[0]), stride=list(m[1]), data_type=dt, uid=uid)


def define_forward(g: Any, io: Any, lw: Lowering, q: Meta, k: Meta, v: Meta, b4: Optional[Meta],
                   o_stride: tuple, inputs: Sequence[Meta] = ()) -> list[int]:
    """Add the forward SDPA node to ``g``; returns the operand uids in execute order."""
    B, H, L, _ = q[0]
    o_shape = [B, H, L, v[0][3]]
    qt, kt, vt = _tensor(g, "q", q, io, _UID.Q), _tensor(g, "k", k, io, _UID.K), _tensor(g, "v", v, io, _UID.V)
    bt = None if b4 is None else _tensor(g, "bias", b4, io, _UID.BIAS)
    em, in_uids = _emitter(g, lw, inputs)
    o, stats = g.sdpa(name="sdpa_fwd", q=qt, k=kt, v=vt, generate_stats=True, **_sdpa_kwargs(lw, q[0][3], bt, em))
    o.set_uid(_UID.O).set_output(True).set_dim(o_shape).set_stride(list(o_stride)).set_data_type(io)
    stats.set_uid(_UID.STATS).set_output(True).set_dim([B, H, L, 1]).set_stride([H * L, L, 1, 1]).set_data_type(_F32)
    return [_UID.Q, _UID.K, _UID.V, _UID.O, _UID.STATS] + ([] if bt is None else [_UID.BIAS]) + in_uids


def define_backward(g: Any, io: Any, lw: Lowering, q: Meta, k: Meta, v: Meta, o: Meta, do: Meta,
                    b4: Optional[Meta], need_dbias: bool, grad_strides: tuple, inputs: Sequence[Meta] = ()) -> list[int]:
    """Add the backward SDPA node to ``g`` (with a dBias output only if ``need_dbias``)."""
    B, H, L, _ = q[0]
    qt, kt, vt = _tensor(g, "q", q, io, _UID.Q), _tensor(g, "k", k, io, _UID.K), _tensor(g, "v", v, io, _UID.V)
    ot, dot = _tensor(g, "o", o, io, _UID.O), _tensor(g, "dO", do, io, _UID.DO)
    st = g.tensor(name="stats", dim=[B, H, L, 1], stride=[H * L, L, 1, 1], data_type=_F32, uid=_UID.STATS)
    bt = None if b4 is None else _tensor(g, "bias", b4, io, _UID.BIAS)
    em, in_uids = _emitter(g, lw, inputs)
    kw = _sdpa_kwargs(lw, q[0][3], bt, em, backward=True)
    dbt = None
    if need_dbias and b4 is not None:
        # dBias in the io type even for a float32 bias: cuDNN 9.19 and 9.27 build no plan with a float32 dBias
        dbt = _tensor(g, "dBias", (b4[0], padded_strides(b4[0])), io, _UID.DBIAS)
        kw["dBias"] = dbt
    dq, dk, dv = g.sdpa_backward(name="sdpa_bwd", q=qt, k=kt, v=vt, o=ot, dO=dot, stats=st, **kw)
    for t, uid, ref, stride in zip((dq, dk, dv), (_UID.DQ, _UID.DK, _UID.DV), (q, k, v), grad_strides):
        t.set_uid(uid).set_output(True).set_dim(list(ref[0])).set_stride(list(stride)).set_data_type(io)
    if dbt is not None:
        dbt.set_output(True)
    uids = [_UID.Q, _UID.K, _UID.V, _UID.O, _UID.DO, _UID.STATS, _UID.DQ, _UID.DK, _UID.DV]
    return uids + ([] if bt is None else [_UID.BIAS]) + ([] if dbt is None else [_UID.DBIAS]) + in_uids


def _check_shapes(q: Tensor, k: Tensor, v: Tensor) -> None:
    if q.dim() != 4 or k.dim() != 4 or v.dim() != 4:
        raise Unsupported("cuDNN SDPA needs 4-D [B, H, S, D] q, k, v")
    if q.shape[1] % k.shape[1] or q.shape[1] % v.shape[1]:
        raise Unsupported(f"query heads {q.shape[1]} not a multiple of kv heads {k.shape[1]}")


def _input_operands(inputs: Sequence[Tensor]) -> list[Tensor]:
    """The (in i) inputs as cuDNN reads them: float32 [B|1, H|1, 1, 1] with their own broadcast shape
    (full [B, H, 1, 1] copies gave wrong results where [1, H, 1, 1] ones are right,
    bench/probes/probe_fuzz.py; per-batch terms are kept off cuDNN instead: ir.extract_bh_terms strict)."""
    return [_operand(t.float()) if t.dtype != torch.float32 else _operand(t) for t in inputs]


# --------------------------------------------------------------------------- fully-masked rows
#
# A query row whose keys are all masked must give output 0 and lse -inf (eager; flex). cuDNN gets
# this right for a -inf *bias* without a score_mod, but not for masks emitted inside a score_mod or a
# -inf bias together with one (differential fuzzer): te_compile sets those rows itself. The
# rows of an emitted mask depend only on (q_idx, kv_idx) (per-batch and (b, h)-compared terms are
# kept off cuDNN), so they are computed once per (mask, L, S).


@functools.lru_cache(maxsize=256)
def _empty_rows_of_mask(mask_mod: str, L: int, S: int, device: torch.device) -> Optional[Tensor]:
    from .. import ir
    from ..reference import index_grids

    grids = index_grids(1, 1, L, S, torch.device("cpu"))
    keep = ir.evaluate(ir.parse(mask_mod), grids).to(torch.bool).expand(1, 1, L, S)
    rows = ~keep.any(dim=-1)  # [1, 1, L]
    return _outside_cudagraph_pool(rows, device) if bool(rows.any()) else None


def _outside_cudagraph_pool(t: Tensor, device: torch.device) -> Tensor:
    """``t`` copied to ``device`` for a cache that outlives the call.

    Under mode="reduce-overhead" the first (warm-up) call runs with every allocation of the calling
    thread routed into the CUDA-graph pool (torch 2.11: ``_cuda_beginAllocateCurrentThreadToPool``,
    whatever the stream), and cudagraph trees refuse to record while a pool block is held by anything
    but a graph output ("tensor(s) in the cudagraph pool not tracked as outputs"). So the copy is
    made on a short-lived thread, from the ordinary allocator, and finished before it is used (the
    tensor is cached for good, so no later stream ever frees it)."""
    if device.type != "cuda":
        return t.to(device)
    box: dict = {}

    def copy() -> None:
        try:
            with torch.cuda.device(device):
                box["out"] = t.to(device)
                torch.cuda.current_stream(device).synchronize()
        except BaseException as e:  # noqa: BLE001 - re-raised on the calling thread
            box["err"] = e
    th = threading.Thread(target=copy, name="te_compile-cache-copy")
    th.start()
    th.join()
    if "err" in box:
        raise box["err"]
    return box["out"]


def _empty_rows(spec: AttentionSpec, q: Tensor, k: Tensor, bias: Optional[Tensor]) -> Optional[Tensor]:
    """[B|1, H|1, L] True where a query row has no key left, or None (no such rows possible)."""
    rows = None
    if spec.mask_mod and lower(spec, (q.shape[2], k.shape[2])).band is None and not _refs_inputs(spec.mask_mod):
        rows = _empty_rows_of_mask(spec.mask_mod, q.shape[2], k.shape[2], q.device)
    if bias is not None and (spec.score or spec.empty_rows):
        b = torch.isneginf(bias).all(dim=-1)
        while b.dim() < 3:
            b = b.unsqueeze(0)
        rows = b if rows is None else (rows | b)
    return rows


def _refs_inputs(text: str) -> bool:
    return "(in " in text


def _fix_empty_rows(spec: AttentionSpec, q: Tensor, k: Tensor, bias: Optional[Tensor], out: Tensor,
                    lse: Tensor) -> None:
    if not (spec.mask_mod or ((spec.score or spec.empty_rows) and bias is not None)):
        return
    rows = _empty_rows(spec, q, k, bias)
    if rows is not None:
        out.masked_fill_(rows.unsqueeze(-1), 0.0)
        lse.masked_fill_(rows, float("-inf"))


@functools.lru_cache(maxsize=1024)
def _may_have_empty_rows(spec: AttentionSpec, L: int, S: int, has_bias: bool) -> bool:
    """Can a query row of this call have every key masked (lse = -inf)? Not with no mods and no bias, nor
    with a mask_mod that cuDNN's native band serves alone: that band always holds the diagonal (or, causal,
    every key up to it) and exists only for L <= S when it has a left bound (te_compile.cudnn.lowering)."""
    if not (spec.mask_mod or spec.score or has_bias):
        return False
    lw = lower(spec, (L, S))
    return not (lw.band is not None and not spec.score and not has_bias and not lw.alibi)


def guard_lse(lse: Tensor) -> Tensor:
    """lse for cuDNN's backward: fully-masked rows (lse = -inf) get a huge lse, which makes cuDNN's
    P = exp(s - lse) exactly 0 there, so their gradients are 0 as in eager (cuDNN's own -inf handling is
    not reliable with score_mods). One kernel (NaN and +inf stay as they are)."""
    return torch.nan_to_num(lse, nan=math.nan, posinf=math.inf, neginf=1e30)


def _prefix_split(spec: AttentionSpec, q: Tensor, k: Tensor, bias: Optional[Tensor]) -> Any:
    """The prefix-LM split of a mask_mod-only call (forward and backward take the same one), else None."""
    if spec.mask_mod and not spec.score and bias is None:
        return prefix.split(spec, q.shape[2], k.shape[2])
    return None


def forward(q: Tensor, k: Tensor, v: Tensor, bias: Optional[Tensor], spec: AttentionSpec,
            inputs=()) -> tuple[Tensor, Tensor]:
    sp = _prefix_split(spec, q, k, bias)
    if sp is not None:  # a prefix-LM mask: two native calls (te_compile.cudnn.prefix)
        return prefix.forward(forward, q, k, v, sp)
    out, lse = _forward(q, k, v, bias, spec, inputs)
    _fix_empty_rows(spec, q, k, bias, out, lse)
    return out, lse


def _forward(q: Tensor, k: Tensor, v: Tensor, bias: Optional[Tensor], spec: AttentionSpec,
             inputs=()) -> tuple[Tensor, Tensor]:
    raw = (q, k, v, bias, *inputs)
    sig = signature("fwd", spec, None, raw)
    plan = _plans.get(sig)
    if plan is not None and _aligned(raw):
        dev = q.device
        h = handle(dev)
        out = torch.empty_strided(plan.out_shape, plan.out_stride, dtype=q.dtype, device=dev)
        lse = torch.empty_strided(plan.lse_shape, plan.lse_stride, dtype=torch.float32, device=dev)
        buffers = [q, k, v, out, lse] + ([] if bias is None else [bias]) + (list(inputs) if plan.reads_inputs else [])
        buffers += plan.consts
        plan.built.run(buffers, plan.built.workspace_for(dev), h)
        return out, lse
    lw = lower(spec, (q.shape[2], k.shape[2]), heads=q.shape[1])
    if lw.unsupported:
        raise Unsupported(lw.unsupported)
    inputs = () if lw.alibi else inputs  # native ALiBi reads no slope input
    q0, k0, v0, inputs0 = q, k, v, tuple(inputs)
    inputs = _input_operands(inputs)
    io = _io_type(q, bias, k, v)
    _check_shapes(q, k, v)
    q, k, v = _operand(q), _operand(k), _operand(v)
    B, H, L, _ = q.shape
    S, Dv = k.shape[2], v.shape[3]
    b4 = None if bias is None else _bias4d(bias, B, H, L, S)
    o_shape = (B, H, L, Dv)
    o_stride = like_layout_strides(o_shape, q)
    metas = (_meta(q), _meta(k), _meta(v), bias_meta(b4, q))
    in_metas = tuple(_meta(t) for t in inputs)
    key = ("fwd", q.device, q.dtype, _graph_key(lw), spec.scale_for(q.shape[3]), metas, o_stride, in_metas)
    h = handle(q.device)

    def build() -> _Built:
        g = new_graph(h, io)
        return finish(g, define_forward(g, io, lw, *metas, o_stride, in_metas))

    built = cache.get(key, build)
    out = torch.empty_strided(o_shape, o_stride, dtype=q.dtype, device=q.device)
    lse = torch.empty((B, H, L), dtype=torch.float32, device=q.device)
    consts = list(_const_buffers(lw))
    buffers = [q, k, v, out, lse] + ([] if b4 is None else [b4]) + inputs + consts
    ws = new_workspace(built.workspace, q.device)
    built.run(buffers, ws, h)
    if (q is q0 and k is k0 and v is v0 and _same(bias, b4)
            and all(a is b for a, b in zip(inputs, inputs0))):
        _remember(sig, CallPlan(built, tuple(consts), out_shape=o_shape, out_stride=o_stride, lse_shape=(B, H, L),
                                lse_stride=(H * L, L, 1), reads_inputs=not lw.alibi))
    return out, lse


#: extra head-dim columns that carry dlse into cuDNN's backward (a multiple of 8, cuDNN's granule)
_DLSE_PAD = 8


def _with_dlse(dout: Tensor, v: Tensor, out: Tensor, dlse: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """(dout', v', out') such that cuDNN's backward on them computes the gradient with dlse.

    cuDNN's backward reads O only through delta = rowsum(dO * O), and dS = P * (dP - delta). The
    gradient through lse adds P * dlse: dS = P * (dP - (delta - dlse)). Two extra columns with
    dO' = 1 and O' = -dlse (split into a bf16/fp16 high and low part, so dlse keeps ~16 bits)
    subtract dlse from delta; V' = 0 there keeps dP unchanged, and dV's extra columns are dropped."""
    neg = (-dlse.float()).unsqueeze(-1)
    hi = neg.to(out.dtype)
    lo = (neg - hi.float()).to(out.dtype)
    zeros_o = out.new_zeros(*out.shape[:-1], _DLSE_PAD - 2)
    ones = dout.new_ones(*dout.shape[:-1], 2)
    out2 = torch.cat([out, hi, lo, zeros_o], dim=-1)
    dout2 = torch.cat([dout, ones, dout.new_zeros(*dout.shape[:-1], _DLSE_PAD - 2)], dim=-1)
    v2 = torch.cat([v, v.new_zeros(*v.shape[:-1], _DLSE_PAD)], dim=-1)
    return dout2, v2, out2


def backward(dout: Tensor, q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse: Tensor, bias: Optional[Tensor],
             spec: AttentionSpec, need_dbias: bool, inputs=(), dlse: Optional[Tensor] = None
             ) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    sp = _prefix_split(spec, q, k, bias)
    if sp is not None:  # a prefix-LM mask: two native calls (te_compile.cudnn.prefix)
        return prefix.backward(backward, dout, q, k, v, out, lse, sp, dlse)
    if _may_have_empty_rows(spec, q.shape[2], k.shape[2], bias is not None):
        lse = guard_lse(lse)
    if dlse is not None:
        dv_cols = v.shape[-1]
        dout, v2, out = _with_dlse(dout, v, out, dlse)
        dq, dk, dv, dbias = backward(dout, q, k, v2, out, lse, bias, spec, need_dbias, inputs)
        dv = dv[..., :dv_cols]
        return dq, dk, empty_like_layout(v.shape, v).copy_(dv), dbias
    return _backward(dout, q, k, v, out, lse, bias, spec, need_dbias, inputs)


def _backward(dout: Tensor, q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse: Tensor, bias: Optional[Tensor],
              spec: AttentionSpec, need_dbias: bool, inputs=()) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    raw = (dout, q, k, v, out, lse, bias, *inputs)
    sig = signature("bwd", spec, bool(need_dbias), raw)
    plan = _plans.get(sig)
    if plan is not None and _aligned(raw):
        h = handle(q.device)
        dq, dk, dv = (torch.empty_strided(t.shape, st, dtype=t.dtype, device=t.device)
                      for t, st in zip((q, k, v), plan.grad_strides))
        buffers = [q, k, v, out, dout, lse, dq, dk, dv] + ([] if bias is None else [bias])
        dbias = _padded_empty(tuple(bias.shape), q.dtype, q.device) if plan.need_dbias else q.new_empty((0,))
        if plan.need_dbias:
            buffers.append(dbias)
        buffers += (list(inputs) if plan.reads_inputs else []) + list(plan.consts)
        plan.built.run(buffers, plan.built.workspace_for(q.device), h)
        # a float32 bias (a learned table's) gets its dBias in float32, as the slow path and the op's fake say
        return dq, dk, dv, (dbias.to(bias.dtype) if plan.need_dbias else dbias).contiguous()
    lw = lower(spec, (q.shape[2], k.shape[2]), heads=q.shape[1])
    if lw.unsupported:
        raise Unsupported(lw.unsupported)
    inputs = () if lw.alibi else inputs  # native ALiBi reads no slope input
    raw_ops = (q, k, v, out, dout, lse, tuple(inputs))
    inputs = _input_operands(inputs)
    io = _io_type(q, bias, k, v, out, dout)
    _check_shapes(q, k, v)
    grad_strides = (like_layout_strides(q.shape, q), like_layout_strides(k.shape, k), like_layout_strides(v.shape, v))
    q, k, v, out, dout = _operand(q), _operand(k), _operand(v), _operand(out), _operand(dout)
    lse = lse.contiguous()
    B, H, L, _ = q.shape
    b4 = None if bias is None else _bias4d(bias, B, H, L, k.shape[2])
    need_dbias = bool(need_dbias and b4 is not None)
    metas = (_meta(q), _meta(k), _meta(v), _meta(out), _meta(dout), bias_meta(b4, q))
    in_metas = tuple(_meta(t) for t in inputs)
    key = ("bwd", q.device, q.dtype, _graph_key(lw), spec.scale_for(q.shape[3]), metas, need_dbias, grad_strides,
           in_metas)
    h = handle(q.device)

    def build() -> _Built:
        g = new_graph(h, io)
        return finish(g, define_backward(g, io, lw, *metas, need_dbias, grad_strides, in_metas))

    built = cache.get(key, build)
    dq, dk, dv = (torch.empty_strided(tuple(t.shape), st, dtype=t.dtype, device=t.device)
                  for t, st in zip((q, k, v), grad_strides))
    buffers = [q, k, v, out, dout, lse, dq, dk, dv] + ([] if b4 is None else [b4])
    dbias4 = _padded_empty(tuple(b4.shape), q.dtype, q.device) if need_dbias else None
    consts = list(_const_buffers(lw))
    buffers += ([dbias4] if need_dbias else []) + inputs + consts
    ws = new_workspace(built.workspace, q.device)
    built.run(buffers, ws, h)
    unchanged = all(a is b for a, b in zip((q, k, v, out, dout, lse), raw_ops[:6]))
    unchanged = unchanged and all(a is b for a, b in zip(inputs, raw_ops[6])) and _same(bias, b4)
    if unchanged and (bias is None or b4.shape == bias.shape):
        plan = CallPlan(built, tuple(consts), grad_strides=grad_strides, need_dbias=need_dbias, reads_inputs=not lw.alibi)
        _remember(sig, plan)
    if dbias4 is None:
        return dq, dk, dv, q.new_empty((0,))
    dbias = dbias4.sum_to_size(bias.shape).reshape(bias.shape).to(bias.dtype).contiguous()
    return dq, dk, dv, dbias

