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
import dataclasses
import functools
import gc
import logging
import threading
import time
from enum import IntEnum
from typing import Any, Callable, Optional, Sequence

import torch
from torch import Tensor

import cudnn  # the cuDNN frontend package (nvidia-cudnn-frontend)

from ..layout import like_layout_strides
from ..spec import AttentionSpec
from .emit import Emitter, inputs_full, structure
from ..lowering.lower import Lowering, lower

log = logging.getLogger("te_compile")

IO_TYPES = {torch.float16: cudnn.data_type.HALF, torch.bfloat16: cudnn.data_type.BFLOAT16}
_F32 = cudnn.data_type.FLOAT

#: bound of the LRU of built graphs (te_compile.cudnn.graphs.cache.maxsize changes it at run time)
CACHE_SIZE = 256


class Unsupported(RuntimeError):
    """cuDNN cannot serve this configuration; the op falls back to the reference math."""


class UID(IntEnum):
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
    """A built graph and how to execute it: ``run(buffers, workspace, handle)``, buffers in ``uids`` order, through the
    frontend's public ``graph.execute`` (the Python path; the native call path loads ``serialized()`` in C++)."""

    __slots__ = ("graph", "workspace", "uids", "_executed")

    def __init__(self, graph: Any, workspace: int, uids: tuple[int, ...]):
        self.graph, self.workspace, self.uids = graph, workspace, uids
        self._executed = False

    def run(self, buffers: Sequence[Tensor], workspace: Tensor, handle: Any) -> None:
        self.graph.execute(buffers, workspace, handle=handle, tensor_uids=self.uids)
        if not self._executed:
            self._executed = True
            # FE 1.32's first execute of a graph leaves a reference cycle that holds this call's
            # buffers (q/k/v, out, lse, workspace) until Python's cycle collector runs. Under
            # mode="reduce-overhead" those buffers live in the CUDA-graph pool: cudagraph trees then
            # found the forward's lse (dead, but not yet collected) and refused to record ("storage
            # data ptrs are not allocated in pool"). Collecting here, once per built graph, frees them
            # when their last real owner lets go.
            gc.collect()

    def python_engine(self) -> Optional[str]:
        """The name of the frontend's Python engine that runs this graph (``selected_engine``: CuTe DSL kernels the
        frontend may pick where its DSL is importable), or None: the cuDNN backend runs it."""
        engine = self.graph.selected_engine
        return None if engine is None else str(getattr(engine, "name", type(engine).__name__))

    def serialized(self) -> Optional[bytes]:
        """The built plan in the cuDNN frontend's serialized form (what the native call path loads), or None when
        it has none: a plan of a Python engine, or a frontend that cannot serialize this graph."""
        if self.python_engine() is not None:
            return None
        try:
            blob = self.graph.serialize(as_bytes=True)
        except Exception as e:  # noqa: BLE001 - any refusal means: not on the native path
            log.debug("te_compile: cuDNN plan not serializable (%s: %s)", type(e).__name__, e)
            return None
        return bytes(blob) if isinstance(blob, (bytes, bytearray)) else bytes(bytearray(blob))


class GraphCache:
    """Bounded LRU of built graphs, with failures remembered as well."""

    def __init__(self, maxsize: int):
        self.maxsize = maxsize
        self._entries: "collections.OrderedDict[tuple, _Built | Unsupported]" = collections.OrderedDict()
        self._lock = threading.Lock()
        self.builds = 0
        self.build_seconds = 0.0
        #: called with each graph that leaves the cache, or None when the cache empties (the runner maps of
        #: te_compile.runtime.kernels drop the runners built on it)
        self.on_forget: list[Callable[[Any], None]] = []

    def get(self, key: tuple, build: Callable[[], _Built]) -> _Built:
        hit = self._entries.get(key)
        if hit is None:
            with self._lock:
                hit = self._entries.get(key)
                if hit is None:
                    hit = self._build(key, build)
                    self._entries[key] = hit
                    while len(self._entries) > max(1, self.maxsize):
                        self._forget(self._entries.popitem(last=False)[1])
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
            self._forget(None)

    def _forget(self, gone: "_Built | Unsupported | None") -> None:
        """A graph left the cache (None: every graph): whatever holds it per call signature lets go of it too."""
        for fn in self.on_forget:
            fn(gone)

    def __len__(self) -> int:
        return len(self._entries)


cache = GraphCache(CACHE_SIZE)

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
        b = padded_empty(tuple(b.shape), b.dtype, b.device).copy_(b)
    return b


def padded_strides(shape: Sequence[int]) -> tuple[int, ...]:
    """Row-major strides with the rows (last dim) padded to a multiple of 8 elements (16 bytes):
    cuDNN reads and writes bias / dBias rows at 16-byte-aligned strides (a dBias with S = 255 came
    back wrong)."""
    B, H, L, S = shape
    sp = -(-S // 8) * 8
    return (H * L * sp, L * sp, sp, 1)


def padded_empty(shape: tuple, dtype: torch.dtype, device: torch.device) -> Tensor:
    sp = -(-shape[-1] // 8) * 8
    return torch.empty(*shape[:-1], sp, dtype=dtype, device=device)[..., : shape[-1]]


def _sdpa_kwargs(lw: Lowering, head_dim: int, bias_t: Any, emitter: Optional[Emitter] = None,
                 backward: bool = False) -> dict:
    kw: dict = {"attn_scale": lw.spec.scale_for(head_dim)}
    if bias_t is not None:
        kw["bias"] = bias_t
    band = (None, 0) if lw.spec.is_causal else lw.band
    if band is not None:  # built-in masks skip masked tiles (a score_mod disables them)
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
    return [g.tensor(name=f"in{i}", dim=list(m[0]), stride=list(m[1]), data_type=_F32, uid=UID.INPUTS + i)
            for i, m in enumerate(inputs)]


def _emitter(g: Any, lw: Lowering, inputs: Sequence[Meta]) -> tuple[Optional[Emitter], list]:
    if not lw.emitted:
        return None, []
    ts = _input_tensors(g, inputs)
    uids = [UID.INPUTS + i for i in range(len(inputs))]
    consts = {v: g.tensor(name=f"c{j}", dim=[1, 1, 1, 1], stride=[1, 1, 1, 1], data_type=_F32,
                          uid=UID.CONSTS + j, is_pass_by_value=True)
              for j, v in enumerate(lw.constants)}
    uids += [UID.CONSTS + j for j in range(len(consts))]
    return Emitter(lw, ts, consts, inputs_full(lw)), uids


def _graph_key(lw: Lowering) -> Any:
    """What a built graph depends on: the spec itself for built-in masks and plain SDPA; for emitted
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
    qt, kt, vt = _tensor(g, "q", q, io, UID.Q), _tensor(g, "k", k, io, UID.K), _tensor(g, "v", v, io, UID.V)
    bt = None if b4 is None else _tensor(g, "bias", b4, io, UID.BIAS)
    em, in_uids = _emitter(g, lw, inputs)
    o, stats = g.sdpa(name="sdpa_fwd", q=qt, k=kt, v=vt, generate_stats=True, **_sdpa_kwargs(lw, q[0][3], bt, em))
    o.set_uid(UID.O).set_output(True).set_dim(o_shape).set_stride(list(o_stride)).set_data_type(io)
    stats.set_uid(UID.STATS).set_output(True).set_dim([B, H, L, 1]).set_stride([H * L, L, 1, 1]).set_data_type(_F32)
    return [UID.Q, UID.K, UID.V, UID.O, UID.STATS] + ([] if bt is None else [UID.BIAS]) + in_uids


def define_backward(g: Any, io: Any, lw: Lowering, q: Meta, k: Meta, v: Meta, o: Meta, do: Meta,
                    b4: Optional[Meta], need_dbias: bool, grad_strides: tuple, inputs: Sequence[Meta] = ()) -> list[int]:
    """Add the backward SDPA node to ``g`` (with a dBias output only if ``need_dbias``)."""
    B, H, L, _ = q[0]
    qt, kt, vt = _tensor(g, "q", q, io, UID.Q), _tensor(g, "k", k, io, UID.K), _tensor(g, "v", v, io, UID.V)
    ot, dot = _tensor(g, "o", o, io, UID.O), _tensor(g, "dO", do, io, UID.DO)
    st = g.tensor(name="stats", dim=[B, H, L, 1], stride=[H * L, L, 1, 1], data_type=_F32, uid=UID.STATS)
    bt = None if b4 is None else _tensor(g, "bias", b4, io, UID.BIAS)
    em, in_uids = _emitter(g, lw, inputs)
    kw = _sdpa_kwargs(lw, q[0][3], bt, em, backward=True)
    dbt = None
    if need_dbias and b4 is not None:
        # dBias in the io type even for a float32 bias: cuDNN 9.19 and 9.27 build no plan with a float32 dBias
        dbt = _tensor(g, "dBias", (b4[0], padded_strides(b4[0])), io, UID.DBIAS)
        kw["dBias"] = dbt
    dq, dk, dv = g.sdpa_backward(name="sdpa_bwd", q=qt, k=kt, v=vt, o=ot, dO=dot, stats=st, **kw)
    for t, uid, ref, stride in zip((dq, dk, dv), (UID.DQ, UID.DK, UID.DV), (q, k, v), grad_strides):
        t.set_uid(uid).set_output(True).set_dim(list(ref[0])).set_stride(list(stride)).set_data_type(io)
    if dbt is not None:
        dbt.set_output(True)
    uids = [UID.Q, UID.K, UID.V, UID.O, UID.DO, UID.STATS, UID.DQ, UID.DK, UID.DV]
    return uids + ([] if bt is None else [UID.BIAS]) + ([] if dbt is None else [UID.DBIAS]) + in_uids


def _check_shapes(q: Tensor, k: Tensor, v: Tensor) -> None:
    if q.dim() != 4 or k.dim() != 4 or v.dim() != 4:
        raise Unsupported("cuDNN SDPA needs 4-D [B, H, S, D] q, k, v")
    if q.shape[1] % k.shape[1] or q.shape[1] % v.shape[1]:
        raise Unsupported(f"query heads {q.shape[1]} not a multiple of kv heads {k.shape[1]}")


def _input_operands(inputs: Sequence[Tensor]) -> list[Tensor]:
    """The (in i) inputs as cuDNN reads them: float32 [B|1, H|1, 1, 1] with their own broadcast shape
    (full [B, H, 1, 1] copies gave wrong results where [1, H, 1, 1] ones are right, GPU
    fuzzer; per-batch terms are kept off cuDNN instead: ir.extract_bh_terms strict)."""
    return [_operand(t.float()) if t.dtype != torch.float32 else _operand(t) for t in inputs]

# --------------------------------------------------------------------------- one call

@dataclasses.dataclass(frozen=True, slots=True)
class Launch:
    """How a call whose operands cuDNN takes as they are launches its graph (te_compile.cudnn.runners keeps one
    per call signature): the built graph, the layouts of what the call allocates, the constant buffers."""

    built: "_Built"
    consts: tuple  # the pass-by-value constant buffers (CPU float32 scalars), after the inputs
    reads_inputs: bool  # the (in i) inputs are operands (built-in ALiBi reads none)
    out_shape: tuple = ()  # forward: out (lse is [B, H, L] float32, contiguous)
    out_stride: tuple = ()
    grad_strides: tuple = ()  # backward: dq, dk, dv
    need_dbias: bool = False
    bias_shape: tuple = ()  # the bias as the graph reads it, [1|B, 1|H, L, S] ((): no bias)
    bias_copy: bool = False  # each call copies the bias into a padded buffer first (cuDNN cannot read it in place)


def forward(q: Tensor, k: Tensor, v: Tensor, bias: Optional[Tensor], spec: AttentionSpec,
            inputs: Sequence[Tensor] = ()) -> tuple[Tensor, Tensor, Optional[Launch]]:
    """One cuDNN forward call: (out, lse, launch), ``launch`` None when an operand had to be copied or cast
    first (the next call with this signature must do the same). Raises ``Unsupported``."""
    lw = lower(spec, (q.shape[2], k.shape[2]), heads=q.shape[1])
    if lw.unsupported:
        raise Unsupported(lw.unsupported)
    inputs = () if lw.alibi else tuple(inputs)  # built-in ALiBi reads no slope input
    q0, k0, v0, inputs0 = q, k, v, inputs
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
    consts = _const_buffers(lw)
    buffers = [q, k, v, out, lse] + ([] if b4 is None else [b4]) + inputs + list(consts)
    built.run(buffers, new_workspace(built.workspace, q.device), h)
    as_they_are = q is q0 and k is k0 and v is v0 and all(a is b for a, b in zip(inputs, inputs0))
    launch = Launch(built, consts, not lw.alibi, out_shape=o_shape, out_stride=o_stride,
                    **_bias_fields(bias, b4)) if as_they_are else None
    return out, lse, launch


def _bias_fields(bias: Optional[Tensor], b4: Optional[Tensor]) -> dict:
    if bias is None:
        return {}
    return {"bias_shape": tuple(b4.shape), "bias_copy": b4.data_ptr() != bias.data_ptr()}


def backward(dout: Tensor, q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse: Tensor, bias: Optional[Tensor],
             spec: AttentionSpec, need_dbias: bool, inputs: Sequence[Tensor] = ()
             ) -> tuple[Tensor, Tensor, Tensor, Tensor, Optional[Launch]]:
    """One cuDNN backward call: (dq, dk, dv, dbias, launch), ``launch`` as in ``forward``. Raises ``Unsupported``."""
    lw = lower(spec, (q.shape[2], k.shape[2]), heads=q.shape[1])
    if lw.unsupported:
        raise Unsupported(lw.unsupported)
    inputs = () if lw.alibi else tuple(inputs)  # built-in ALiBi reads no slope input
    raw_ops = (q, k, v, out, dout, lse, inputs)
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
    dbias4 = padded_empty(tuple(b4.shape), q.dtype, q.device) if need_dbias else None
    consts = _const_buffers(lw)
    buffers += ([dbias4] if need_dbias else []) + inputs + list(consts)
    built.run(buffers, new_workspace(built.workspace, q.device), h)
    as_they_are = all(a is b for a, b in zip((q, k, v, out, dout, lse), raw_ops[:6]))
    launch = None
    if as_they_are and all(a is b for a, b in zip(inputs, raw_ops[6])):
        launch = Launch(built, consts, not lw.alibi, grad_strides=grad_strides, need_dbias=need_dbias,
                        **_bias_fields(bias, b4))
    return dq, dk, dv, dbias_of(dbias4, bias, q), launch


def dbias_of(dbias4: Optional[Tensor], bias: Optional[Tensor], q: Tensor) -> Tensor:
    """The bias's gradient from the graph's dBias output (summed over the dims the bias broadcasts), in the
    bias's dtype (a learned table's float32 bias gets a float32 gradient); an empty placeholder without one."""
    if dbias4 is None:
        return q.new_empty((0,))
    return dbias4.sum_to_size(bias.shape).reshape(bias.shape).to(bias.dtype).contiguous()
