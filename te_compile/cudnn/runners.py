"""A runner per call signature: what a repeated call of a te_compile op does on cuDNN, decided once.

te_compile.runtime.kernels looks every CUDA call up by its signature (the spec, and each tensor's shape, strides,
dtype, device and 16-byte alignment) and hands it to the runner built for it. On the first call of a
signature, ``forward`` / ``backward`` here build that runner: everything that depends only on the
signature is settled there (the graph, the prefix-LM split, which fully-masked rows need output 0 / lse
-inf, whether cuDNN's backward needs the lse guard, whether the operands are used as they are), so a
later call is the per-call checks that really depend on the data, the allocations and the launch.

Runners:
* ``Graph``: one cuDNN graph. Where its operands are the call's own tensors, ``native_info()`` describes the launch
  and the native call path (te_compile.cudnn.native) executes every later call in C++; Python executes the
  signature's first call, and every call where C++ cannot (the native path off; an operand cuDNN cannot take as
  it is: a broadcast or unaligned bias, a non-float32 (in i) input, a strided or unaligned q / k / v, a dlse),
  through te_compile.cudnn.graphs and the frontend's public execute.
* ``Prefix``: the prefix-LM split (te_compile.lowering.prefix): two calls of their own runners and a merge.
* ``Interval``: cuDNN's interval-mask kernels (te_compile.cudnn.flexkernel).

The fully-masked-rows work: a query row whose keys are all masked must give output 0 and lse -inf (eager;
flex). cuDNN gets this right for a -inf *bias* without a score_mod, but not for masks emitted inside a
score_mod or a -inf bias together with one (differential fuzzer): te_compile sets those rows itself. The
rows of an emitted mask depend only on (q_idx, kv_idx) (per-batch and (b, h)-compared terms are kept off
cuDNN), so they are computed once per runner; a bias's -inf rows are data and are found per call.
"""

from __future__ import annotations

import functools
import math
import threading
from typing import Any, Callable, Optional, Sequence

import torch
from torch import Tensor

from ..score import ir
from ..layout import empty_like_layout
from ..spec import AttentionSpec
from ..lowering import prefix
from . import graphs
from ..lowering.lower import lower


# --------------------------------------------------------------------------- fully-masked rows

@functools.lru_cache(maxsize=256)
def empty_rows_of_mask(mask_mod: str, L: int, S: int, device: torch.device) -> Optional[Tensor]:
    """[1, 1, L] bool on ``device``: True where the mask leaves a query row no key; None when there is no such row."""
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


def static_empty_rows(spec: AttentionSpec, L: int, S: int, device: torch.device) -> Optional[Tensor]:
    """The rows an emitted mask_mod leaves empty at (L, S) (None: none; a built-in band never empties a row)."""
    if not spec.mask_mod or "(in " in spec.mask_mod or lower(spec, (L, S)).band is not None:
        return None
    return empty_rows_of_mask(spec.mask_mod, L, S, device)


def bias_rows_checked(spec: AttentionSpec, has_bias: bool) -> bool:
    """Whether each call looks for -inf rows in the bias (cuDNN handles them only without a score_mod)."""
    return has_bias and bool(spec.score or spec.empty_rows)


def fill_empty_rows(out: Tensor, lse: Tensor, rows: Optional[Tensor], bias: Optional[Tensor]) -> None:
    """Output 0 and lse -inf on ``rows`` and, given a bias, on the rows it masks entirely."""
    if bias is not None:
        b = torch.isneginf(bias).all(dim=-1)
        while b.dim() < 3:
            b = b.unsqueeze(0)
        rows = b if rows is None else (rows | b)
    if rows is not None:
        out.masked_fill_(rows.unsqueeze(-1), 0.0)
        lse.masked_fill_(rows, float("-inf"))


@functools.lru_cache(maxsize=1024)
def may_have_empty_rows(spec: AttentionSpec, L: int, S: int, has_bias: bool) -> bool:
    """Can a query row of this call have every key masked (lse = -inf)? Not with no mods and no bias, nor
    with a mask_mod that cuDNN's built-in band serves alone: that band always holds the diagonal (or, causal,
    every key up to it) and exists only for L <= S when it has a left bound (te_compile.lowering.lower)."""
    if not (spec.mask_mod or spec.score or has_bias):
        return False
    lw = lower(spec, (L, S))
    return not (lw.band is not None and not spec.score and not has_bias and not lw.alibi)


def guard_lse(lse: Tensor) -> Tensor:
    """lse for cuDNN's backward: fully-masked rows (lse = -inf) get a huge lse, which makes cuDNN's
    P = exp(s - lse) exactly 0 there, so their gradients are 0 as in eager (cuDNN's own -inf handling is
    not reliable with score_mods). One kernel (NaN and +inf stay as they are)."""
    return torch.nan_to_num(lse, nan=math.nan, posinf=math.inf, neginf=1e30)


def prefix_split(spec: AttentionSpec, L: int, S: int, has_bias: bool) -> Optional[prefix.Split]:
    """The prefix-LM split of a mask_mod-only call (forward and backward take the same one), else None."""
    if spec.mask_mod and not spec.score and not has_bias:
        return prefix.split(spec, L, S)
    return None


# --------------------------------------------------------------------------- dlse

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


# --------------------------------------------------------------------------- runners

class GraphForward:
    """One cuDNN graph: each call in Python goes through te_compile.cudnn.graphs.forward (the graph cache, any operand
    copies, the frontend's public execute), then sets the fully-masked rows. ``launch``: how the graph runs on the
    call's own tensors (None: an operand is copied or cast first), which is what the native call path executes."""

    __slots__ = ("spec", "rows", "bias_rows", "launch")

    def __init__(self, spec: AttentionSpec, rows: Optional[Tensor], bias_rows: bool, launch: Optional[graphs.Launch]):
        self.spec, self.rows, self.bias_rows, self.launch = spec, rows, bias_rows, launch

    def __call__(self, q, k, v, bias, inputs):
        out, lse, _ = graphs.forward(q, k, v, bias, self.spec, inputs)
        if self.rows is not None or self.bias_rows:
            fill_empty_rows(out, lse, self.rows, bias if self.bias_rows else None)
        return out, lse

    def native_info(self) -> "dict | str | None":
        """What the native call path needs to run this signature, or None / why not (a graph it cannot take)."""
        if self.launch is None:
            return "an operand cuDNN cannot take as it is (each call copies or casts it)"
        return _native_info(self.launch, rows=self.rows, bias_rows=self.bias_rows)


class GraphBackward:
    """One cuDNN backward graph, as ``GraphForward``; a dlse enters through extra head-dim columns (``launch`` None)."""

    __slots__ = ("spec", "need_dbias", "guard", "launch")

    def __init__(self, spec: AttentionSpec, need_dbias: bool, guard: bool, launch: Optional[graphs.Launch]):
        self.spec, self.need_dbias, self.guard, self.launch = spec, need_dbias, guard, launch

    def __call__(self, dout, q, k, v, out, lse, bias, inputs, dlse=None):
        if self.guard:
            lse = guard_lse(lse)
        if dlse is None:
            return graphs.backward(dout, q, k, v, out, lse, bias, self.spec, self.need_dbias, inputs)[:4]
        dout2, v2, out2 = _with_dlse(dout, v, out, dlse)
        dq, dk, dv, dbias, _ = graphs.backward(dout2, q, k, v2, out2, lse, bias, self.spec, self.need_dbias, inputs)
        return dq, dk, empty_like_layout(v.shape, v).copy_(dv[..., : v.shape[-1]]), dbias

    def native_info(self) -> "dict | str | None":
        if self.launch is None:
            return "a gradient through lse, or an operand cuDNN cannot take as it is (copied or cast each call)"
        return _native_info(self.launch, guard=self.guard)


def _native_info(launch: graphs.Launch, rows: Optional[Tensor] = None, bias_rows: bool = False,
                 guard: bool = False) -> "dict | str | None":
    """What C++ needs to run the launch; a reason where it cannot (te_compile.runtime.kernels records it)."""
    engine = launch.built.python_engine()
    if engine is not None:
        return f"the frontend runs this graph on its Python engine {engine} (no cuDNN plan to load)"
    blob = launch.built.serialized()
    if blob is None:
        return "the frontend cannot serialize this graph's plan"
    return {"plan": blob, "owner": id(launch.built), "workspace": int(launch.built.workspace),
            "consts": [float(c.item()) for c in launch.consts], "reads_inputs": launch.reads_inputs,
            "out_shape": list(launch.out_shape), "out_stride": list(launch.out_stride),
            "grad_strides": [list(s) for s in launch.grad_strides], "need_dbias": launch.need_dbias,
            "bias_shape": list(launch.bias_shape), "bias_copy": launch.bias_copy,
            "rows": rows, "bias_rows": bias_rows, "guard_lse": guard}


class PrefixForward:
    """The prefix-LM split: two built-in-band calls, each through its own runner, and a merge."""

    __slots__ = ("split", "call", "keys")

    def __init__(self, split: prefix.Split, call: Callable):
        # call(q, k, v, bias, extra, spec key): the op's CUDA kernel, so each part has a runner of its own
        self.split, self.call = split, call
        self.keys = {id(split.prefix): split.prefix.key(), id(split.causal): split.causal.key()}

    def __call__(self, q, k, v, bias, inputs):
        return prefix.forward(lambda q, k, v, b, s: self.call(q, k, v, b, [], self.keys[id(s)]), q, k, v, self.split)

    def native_info(self) -> None:
        return None


class PrefixBackward:
    __slots__ = ("split", "call", "keys")

    def __init__(self, split: prefix.Split, call: Callable):
        # call(dout, q, k, v, out, lse, bias, extra, spec key, need_dbias, dlse): the op's CUDA kernel
        self.split, self.call = split, call
        self.keys = {id(split.prefix): split.prefix.key(), id(split.causal): split.causal.key()}

    def __call__(self, dout, q, k, v, out, lse, bias, inputs, dlse=None):
        def bwd(dout, q, k, v, out, lse, bias, spec, need_dbias, inputs, dlse=None):
            return self.call(dout, q, k, v, out, lse, bias, [], self.keys[id(spec)], need_dbias, dlse)
        return prefix.backward(bwd, dout, q, k, v, out, lse, self.split, dlse)

    def native_info(self) -> None:
        return None


# --------------------------------------------------------------------------- building runners

def forward(spec: AttentionSpec, q: Tensor, k: Tensor, v: Tensor, bias: Optional[Tensor],
            inputs: Sequence[Tensor], call: Callable) -> tuple[Any, tuple[Tensor, Tensor]]:
    """The runner for this call's signature, and this call's (out, lse) (the first call settles the runner).
    ``call(q, k, v, bias, extra, spec)`` runs a forward through the runner map (the prefix split's two calls).
    Raises ``graphs.Unsupported``."""
    if spec.intervals:
        r = _interval_runner(spec, q, k, v, forward=True)
        return r, r(q, k, v, bias, inputs)
    L, S = q.shape[2], k.shape[2]
    sp = prefix_split(spec, L, S, bias is not None)
    if sp is not None:
        r: Any = PrefixForward(sp, call)
        return r, r(q, k, v, bias, inputs)
    rows = static_empty_rows(spec, L, S, q.device)
    bias_rows = bias_rows_checked(spec, bias is not None)
    out, lse, launch = graphs.forward(q, k, v, bias, spec, inputs)
    if rows is not None or bias_rows:
        fill_empty_rows(out, lse, rows, bias if bias_rows else None)
    return GraphForward(spec, rows, bias_rows, launch), (out, lse)


def backward(spec: AttentionSpec, dout: Tensor, q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse: Tensor,
             bias: Optional[Tensor], need_dbias: bool, inputs: Sequence[Tensor], dlse: Optional[Tensor],
             call: Callable) -> tuple[Any, tuple[Tensor, Tensor, Tensor, Tensor]]:
    """As ``forward``, for the backward; ``call(dout, q, k, v, out, lse, bias, extra, spec, need_dbias, dlse)``."""
    if spec.intervals:
        r = _interval_runner(spec, q, k, v, forward=False)
        return r, r(dout, q, k, v, out, lse, bias, inputs, dlse)
    L, S = q.shape[2], k.shape[2]
    sp = prefix_split(spec, L, S, bias is not None)
    if sp is not None:
        r: Any = PrefixBackward(sp, call)
        return r, r(dout, q, k, v, out, lse, bias, inputs, dlse)
    guard = may_have_empty_rows(spec, L, S, bias is not None)
    if dlse is not None:
        r = GraphBackward(spec, need_dbias, guard, None)
        return r, r(dout, q, k, v, out, lse, bias, inputs, dlse)
    dq, dk, dv, dbias, launch = graphs.backward(dout, q, k, v, out, guard_lse(lse) if guard else lse, bias, spec,
                                                need_dbias, inputs)
    return GraphBackward(spec, need_dbias, guard, launch), (dq, dk, dv, dbias)


def _interval_runner(spec: AttentionSpec, q: Tensor, k: Tensor, v: Tensor, forward: bool):
    """cuDNN's interval-mask kernels (te_compile.cudnn.flexkernel) for an interval spec; Unsupported where they
    cannot run here."""
    from . import flexkernel

    why = flexkernel.unavailable(q, k, v)
    if why:
        raise graphs.Unsupported(why)
    return flexkernel.IntervalForward(spec) if forward else flexkernel.IntervalBackward(spec)
