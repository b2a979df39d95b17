"""Compile-time support check: can cuDNN serve this attention call? (Thunder-style checker.)

Runs on the CPU while the graph is rewritten, from the graph's example values only: static
rules first (dtype, rank, head dim), then cuDNN FE's own validator on the forward (and, when
gradients are needed, the backward) graph description. On a machine with the call's GPU it
also builds the plans: the validator accepts graphs no engine runs (a bias with dBias under
any mask at key lengths that are not a multiple of 8), and a site served on such a graph would run
the reference math at every call; ``check(..., plans=False)`` stops after the validator, so that a site the
speed decision keeps costs no plan build (te_compile.backend composes the two). It returns a ``Reason`` (a
string with a category, te_compile.reasons), or None when cuDNN should serve the call. A configuration that passes here and
still finds no engine at run time (symbolic shapes, other layouts) falls back to the reference math,
with a warning (te_compile.runtime_fallbacks()).
"""

from __future__ import annotations

import functools
import re
from typing import Callable, Optional

import torch

from ..score import ir
from ..layout import concrete as _concrete, contiguous_strides, like_layout_strides
from ..reasons import NOT_EXACT, NOT_ON_CUDNN, Reason
from ..spec import AttentionSpec
from .. import counters
from ..lowering import prefix
from . import versions
from ..lowering.lower import lower

#: largest head dim cuDNN's sm90 SDPA serves forward *and* backward (cuDNN 9.x)
MAX_HEAD_DIM = 256
SUPPORTED_DTYPES = (torch.float16, torch.bfloat16)


#: functions with an infinite value or derivative at 0: log(0) = -inf, 1 / 0, sqrt'(0)
_SINGULAR_AT_0 = {"log", "log2", "sqrt", "rsqrt"}


def _first(e: ir.Expr, at: Callable[[ir.Expr], Optional[str]]) -> Optional[str]:
    """The first non-None ``at(node)`` over ``e``'s nodes, outermost first."""
    why = at(e)
    for a in e.args:
        if why:
            break
        why = _first(a, at)
    return why


def _singular_arg(e: ir.Expr) -> Optional[ir.Expr]:
    """The operand at whose 0 ``e`` has an infinite value or derivative (log, sqrt, rsqrt, a denominator, x ** p with
    p < 1), or None."""
    if e.op == "div" and len(e.args) == 2:
        return e.args[1]
    if e.op in _SINGULAR_AT_0 or (e.op == "pow" and e.args[1].op == "const" and float(e.args[1].value) < 1):
        return e.args[0]
    return None


def _has_float_step(e: ir.Expr) -> bool:
    return (e.op in ("rem", "floordiv") and "score" in e.leaves()) or any(_has_float_step(a) for a in e.args)


def singular_of_remainder(score: Optional[ir.Expr]) -> Optional[str]:
    """Why a score_mod that applies a function singular at 0 to a remainder (or floor division) of a float that
    reads the score is not served, or None. cuDNN's float remainder is ``x - floor(x / c) * c`` with an inexact
    division, so next to multiples of ``c`` it lands on the other side of the step from torch's (0 instead of
    ``c``); after a singular function that is an infinite gradient: ``log(remainder(score + 2, 3))`` gave dQ and dK
    inf at L = 255 and 256, S = 128 (GPU fuzzer, cuDNN 9.19 and 9.27), where eager's are finite."""
    def at(e: ir.Expr) -> Optional[str]:
        arg = _singular_arg(e)
        if arg is None or not _has_float_step(arg):
            return None
        return (f"the score_mod applies {e.op} to a remainder of the score: cuDNN's float remainder differs "
                "from torch's next to multiples of the divisor, and the function turns that into infinite gradients")
    return None if score is None else _first(score, at)


def super_exponential(score: Optional[ir.Expr]) -> Optional[str]:
    """Why a score_mod that applies exp to a function of the score that is not affine in it is not served with
    grads, or None. Such a score_mod grows faster than any exponential, so the softmax is one-hot on its largest
    entries and the backward's ``P * (dP - delta)`` rests on an exact cancellation that eager autograd gets (one-hot
    P) and cuDNN, whose ``delta`` comes from a separate reduction, does not; times the score_mod's derivative, the
    rounding left over is the gradient: ``exp(|2 score| ** 2.25 / 8)`` gave dQ, dK, dV 30% off and
    ``exp(score * score)`` off by 1e21 where plain torch.compile matched eager (GPU fuzzer, cuDNN 9.19); ``exp(4 * score)``, ``(2 score) ** 4``, ``exp(score * score / 4)``
    passed. The forward is right."""
    def at(e: ir.Expr) -> Optional[str]:
        if e.op not in ("exp", "exp2") or "score" not in e.args[0].leaves() or ir.affine_in_score(e.args[0]):
            return None
        return (f"the score_mod applies {e.op} to a function of the score that is not affine in it: the softmax "
                "turns one-hot and cuDNN's backward leaves rounding where eager cancels exactly, times a derivative "
                "that large")
    return None if score is None else _first(score, at)


def _lower_bound(e: ir.Expr) -> Optional[float]:
    """A lower bound of ``e`` wherever its leaves are finite, read off the structure, or None."""
    if e.op == "const":
        return None if isinstance(e.value, bool) or e.value is None else float(e.value)
    if e.op in ("abs", "exp", "exp2", "sigmoid"):
        return 0.0
    if e.op == "tanh":
        return -1.0
    if e.op == "max":
        known = [b for b in map(_lower_bound, e.args) if b is not None]
        return max(known) if known else None
    if e.op == "add":
        a, b = map(_lower_bound, e.args)
        return None if a is None or b is None else a + b
    return 0.0 if ir.nonneg(e) else None


def _away_from_0(e: ir.Expr) -> bool:
    """Is ``e`` bounded away from 0 by structure (``|x| + 0.5``, ``tanh(x) + 2``, ``max(x, 0) + 1``)?"""
    b = _lower_bound(e)
    return b is not None and b > 0


def singular_derivative(score: Optional[ir.Expr]) -> Optional[str]:
    """Why a score_mod with a derivative that is infinite at a finite score is not served with grads, or None:
    log, sqrt, rsqrt, 1/x or x**p (p < 1) of a function of the score that is not kept away from 0 by a constant.
    Next to that point the gradient swings by orders of magnitude with the last bits of the score, which cuDNN
    recomputes in the backward in another order than eager's forward: ``abs(score) ** 0.5 + T0[q_idx]`` gave dQ
    and dK 25x off (GPU fuzzer, seed 15003, cuDNN 9.27; the CPU reference in bf16 gives inf). ``sqrt(|score| +
    0.5)`` is served."""
    def at(e: ir.Expr) -> Optional[str]:
        arg = _singular_arg(e)
        if arg is None or "score" not in arg.leaves() or _away_from_0(arg):
            return None
        return (f"the score_mod applies {e.op} to a function of the score that may reach 0, where its derivative is "
                "infinite: cuDNN's recomputed scores move that gradient by orders of magnitude")
    return None if score is None else _first(score, at)


#: at most this many keys, a score_mod with index terms is not served with grads (``_short_keys``)
SHORT_KEYS = 64


def _short_keys(lw, k: torch.Tensor, needs_grad: bool) -> Optional[str]:
    """Why a training call with at most SHORT_KEYS keys and a score_mod that reads q_idx / kv_idx is not served:
    ``score + (kv_idx * kv_idx + q_idx) * c`` gave dQ inf at S = 64 (L = 64 and 200) once the index term spans
    40 or more (c = 0.01 to 0.1), with or without GQA, mask and padded-tile guard, and not at S = 32, 96, 127,
    129, 200 nor without grads (GPU fuzzer, cuDNN 9.19); a span of 4 passed.
    Below 64 (cuDNN 9.19): dQ and dK wrong at S = 63, right at 16, 33, 40, 48, 56. The
    cause is not known, so every size up to 64 is kept."""
    S = k.shape[2] if k.dim() == 4 else None
    if not needs_grad or lw.score is None or not isinstance(S, int) or S > SHORT_KEYS:
        return None
    if not lw.score.leaves() & {"q_idx", "kv_idx"}:
        return None
    return (f"a score_mod with index terms at {S} <= {SHORT_KEYS} keys with grads: cuDNN gave dQ inf for large "
            "index terms at 64 keys")


def check(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bias: Optional[torch.Tensor],
          spec: AttentionSpec, needs_grad: bool, need_dbias: bool, plans: bool = True) -> Optional[Reason]:
    """Reason cuDNN cannot serve this call, or None. Tensors may be fake. ``plans=False``: the validator only,
    also where the call's GPU is at hand (no plan build)."""
    with counters.timed("support check"):
        return _check(q, k, v, bias, spec, needs_grad, need_dbias, plans)


def _check(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bias: Optional[torch.Tensor],
           spec: AttentionSpec, needs_grad: bool, need_dbias: bool, plans: bool) -> Optional[Reason]:
    if spec.intervals:
        from .flexkernel import unavailable
        why = unavailable(q, k, v)
        return Reason(f"cuDNN's interval kernels: {why}", NOT_ON_CUDNN) if why else None
    lw = lower(spec)
    if lw.unsupported:
        return Reason(lw.unsupported, NOT_ON_CUDNN)
    why = (singular_of_remainder(lw.score) or _short_keys(lw, k, needs_grad)
           or (super_exponential(lw.score) or singular_derivative(lw.score) if needs_grad else None))
    if why:
        return Reason(why, NOT_EXACT)
    why = _broadcast_only_op(lw) if lw.options.keep_broadcast_only else None
    if why:
        return Reason(f"the emitted graph has an op on captured tensors and constants alone, {why}: cuDNN ran "
                      "such a graph into a misaligned address that leaves the CUDA context unusable", NOT_ON_CUDNN)
    if lw.emitted and not _builtin_alibi(spec, q, k):
        why = versions.emitted_reason()
        if why:
            return why
    if spec.scale is not None and spec.scale <= 0:
        return Reason(f"softmax scale {spec.scale:g} <= 0: cuDNN's padded key positions turn +inf with a negative "
                      "scale (wrong results at lengths that are not a multiple of the tile)", NOT_EXACT)
    why = _static_reason(q, k, v)
    if why:
        return Reason(why, NOT_ON_CUDNN)
    shapes = [_concrete(t.shape) for t in (q, k, v)]
    if any(s is None for s in shapes):
        return None  # symbolic shapes: leave the rest to the run-time check
    if shapes[0][0] != shapes[1][0] or shapes[0][0] != shapes[2][0]:
        return Reason(f"batch sizes differ (q {shapes[0][0]}, k {shapes[1][0]}, v {shapes[2][0]})", NOT_ON_CUDNN)
    bias_meta = None
    if bias is not None:
        bshape = _concrete(bias.shape)
        if bshape is None:
            return None
        B, H, L, _ = shapes[0]
        S = shapes[1][2]
        b = (1,) * (4 - len(bshape)) + bshape
        b4 = (B if b[0] != 1 else 1, H if b[1] != 1 else 1, L, S)
        bias_meta = (b4, _bias_strides(b4))
        if bias.dtype != q.dtype:  # a learned table's float32 bias (graphs.bias_meta)
            if bias.dtype != torch.float32:
                return Reason(f"a {bias.dtype} bias with {q.dtype} q", NOT_ON_CUDNN)
            bias_meta += ("float32",)
    gpu = _gpu(q)
    return _validate(spec, tuple((s, _strides(s, t)) for s, t in zip(shapes, (q, k, v))), bias_meta,
                     str(q.dtype), needs_grad, need_dbias, gpu, plans or gpu is None)  # no GPU: one cache entry


def _gpu(q: torch.Tensor) -> Optional[str]:
    """The CUDA device the call runs on, where this process can build plans there; else None."""
    return str(q.device) if q.device.type == "cuda" and torch.cuda.is_available() else None


def _bias_strides(b4: tuple[int, ...]) -> tuple[int, ...]:
    """The bias operand's strides as the run time hands them to cuDNN (rows at 16-byte strides)."""
    sp = -(-b4[3] // 8) * 8
    return (b4[1] * b4[2] * sp, b4[2] * sp, sp, 1)


def _builtin_alibi(spec: AttentionSpec, q: torch.Tensor, k: torch.Tensor) -> bool:
    """cuDNN's built-in ALiBi serves this call (nothing is emitted): see lowering.builtin_alibi."""
    qs, ks = _concrete(q.shape), _concrete(k.shape)
    return bool(spec.alibi_heads and qs and ks and len(qs) == 4 and len(ks) == 4 and
                lower(spec, (qs[2], ks[2]), heads=qs[1]).alibi)


def _static_reason(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> Optional[str]:
    """Why cuDNN has no kernel for these dtypes / ranks / head dims, or None."""
    if q.dtype not in SUPPORTED_DTYPES:
        return f"dtype {str(q.dtype).replace('torch.', '')}: cuDNN SDPA serves float16 and bfloat16 only"
    if k.dtype != q.dtype or v.dtype != q.dtype:
        return f"q, k, v dtypes differ ({q.dtype}, {k.dtype}, {v.dtype})"
    if q.dim() != 4 or k.dim() != 4 or v.dim() != 4:
        dims = f"{q.dim()}-D" if q.dim() == k.dim() == v.dim() else f"q {q.dim()}-D, k {k.dim()}-D, v {v.dim()}-D"
        return f"inputs are {dims}: cuDNN SDPA serves 4-D [B, H, S, D] q, k, v"
    dqk, dv = q.shape[-1], v.shape[-1]
    if isinstance(dqk, int) and isinstance(dv, int):
        if dqk % 8 or dv % 8:
            return f"head dim {dqk}/{dv} is not a multiple of 8 (cuDNN requirement)"
        if dqk > MAX_HEAD_DIM or dv > MAX_HEAD_DIM:
            return f"head dim {max(dqk, dv)} > {MAX_HEAD_DIM}: no cuDNN sm90 kernel serves forward and backward"
    return None


def _strides(shape: tuple[int, ...], t: torch.Tensor) -> tuple[int, ...]:
    st = _concrete(t.stride())
    if st is None or st[-1] != 1 or 0 in st:
        return contiguous_strides(shape)
    return st


@functools.lru_cache(maxsize=512)
def _validate(spec: AttentionSpec, qkv: tuple, bias_meta: Optional[tuple], dtype: str,
              needs_grad: bool, need_dbias: bool, gpu: Optional[str] = None, plans: bool = True) -> Optional[Reason]:
    try:
        from . import graphs
    except Exception as e:  # noqa: BLE001 - a broken install must not crash compilation
        if gpu is None:  # decided for a GPU this machine does not have (explain's for_device): the rules above decide
            return None
        from .install import frontend_missing
        return frontend_missing(e)
    io = graphs.IO_TYPES[getattr(torch, dtype.replace("torch.", ""))]
    q, k, v = qkv
    B, H, L, _ = q[0]
    sp = prefix.split(spec, L, k[0][2]) if bias_meta is None else None
    if sp is not None:  # a prefix-LM mask runs as two native calls: check those
        P, S = sp.keys, k[0][2]

        def rows(m, n):
            return ((*m[0][:2], n, m[0][3]), m[1])
        return (_validate(sp.prefix, (q, rows(k, P), rows(v, P)), None, dtype, needs_grad, need_dbias, gpu, plans)
                or _validate(sp.causal, (rows(q, L - P), rows(k, S - P), rows(v, S - P)), None, dtype,
                             needs_grad, need_dbias, gpu, plans))
    o_shape = (B, H, L, v[0][3])
    o_meta = (o_shape, like_layout_strides(o_shape, torch.empty_strided(q[0], q[1], device="meta")))
    inputs = tuple(((B, H, 1, 1), (H, 1, 1, 1)) for _ in range(spec.n_inputs))
    lw = lower(spec, (L, k[0][2]), heads=H)
    direction = "forward"
    try:
        g = graphs.new_graph(_handle(graphs, gpu), io)
        _settle(graphs, g, graphs.define_forward(g, io, lw, q, k, v, bias_meta, o_meta[1], inputs), gpu, plans)
        if needs_grad:
            direction = "backward"
            g = graphs.new_graph(_handle(graphs, gpu), io)
            _settle(graphs, g, graphs.define_backward(g, io, lw, q, k, v, o_meta, o_meta, bias_meta, need_dbias,
                                                      (q[1], k[1], v[1]), inputs), gpu, plans)
    except Exception as e:  # noqa: BLE001 - any validator complaint is a reason to keep the node
        msg = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        msg = re.sub(r"\s*_{3,}.*", "", msg)[:240]  # FE pads some messages with a row of underscores
        if gpu is None:
            return Reason(f"cuDNN support check: {msg}", NOT_ON_CUDNN)
        return Reason(f"cuDNN {versions.describe(versions.running())} builds no {direction} plan for this graph on "
                      f"{torch.cuda.get_device_name(gpu)}: {msg}", NOT_ON_CUDNN)
    return None


def _handle(graphs, gpu: Optional[str]):
    return None if gpu is None else graphs.handle(torch.device(gpu))


def _settle(graphs, g, uids: list, gpu: Optional[str], plans: bool = True) -> None:
    """Validate ``g``; with a GPU at hand and ``plans``, build its plans as the run time would (raises when none)."""
    if gpu is None or not plans:
        g.validate()
    else:
        with counters.timed("check plan builds"):
            graphs.finish(g, uids)


def _broadcast_only_op(lw) -> Optional[str]:
    try:
        from . import emit  # the frontend module: absent where cuDNN is not installed (nothing is emitted there)
    except ImportError:
        return None
    return emit.broadcast_only_op(lw)
