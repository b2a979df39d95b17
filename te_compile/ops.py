"""The te_compile custom ops: the only bridge between graph passes and cuDNN.

``te_compile::attn_fwd(q, k, v, bias?, extra[], spec) -> (out, lse)``
``te_compile::attn_bwd(dout, q, k, v, out, lse, bias?, extra[], spec, need_dbias, dlse?)
    -> (dq, dk, dv, dbias)``

* ``spec`` is ``AttentionSpec.key()``: the whole non-tensor description of the call.
* ``lse`` is the natural-log logsumexp, float32 ``[B, Hq, L]`` (-inf on fully-masked rows). It is
  differentiable (flex's is): ``dlse`` is its gradient, None when nothing uses lse, and enters the
  backward as ``dS = P * (dP - delta + dlse)``.
* ``bias`` is a float tensor in q's dtype that broadcasts to ``[B, Hq, L, S]``.
* ``extra`` is reserved for captured score_mod tensors (flex); SDPA passes ``[]``.
* ``dbias`` has bias's shape when ``need_dbias``; otherwise it is an empty placeholder
  (custom ops cannot return ``None``). ``need_dbias`` comes from ``ctx.needs_input_grad``,
  which AOTAutograd evaluates while tracing, so the backward graph shows it as a literal.

Kernels: CUDA runs the cached cuDNN graph (``te_compile.cudnn``) unless the spec says
``impl=reference`` or cuDNN rejects the configuration, in which case it runs the reference
math with one warning per spec; every other device runs the reference math.
"""

from __future__ import annotations

import functools
import logging
import threading
import warnings
from typing import Optional

import torch
from torch import Tensor

from . import ir, reference
from .layout import empty_like_layout, like_layout_strides
from .spec import AttentionSpec

log = logging.getLogger("te_compile")

_warned: set[tuple[str, str]] = set()
_warned_lock = threading.Lock()


def _warn_fallback(spec_key: str, direction: str, why: str) -> None:
    with _warned_lock:
        if (spec_key, direction) in _warned:
            return
        _warned.add((spec_key, direction))
    spec = AttentionSpec.from_key(spec_key)
    msg = (f"te_compile: cuDNN could not serve the attention {direction} ({spec.describe()}); "
           f"running the reference math instead (correct but slow). Reason: {why}")
    log.warning(msg)
    warnings.warn(msg, RuntimeWarning, stacklevel=3)


# --------------------------------------------------------------------------- forward

# The ops are defined with torch.library.Library rather than @custom_op: same schema, fake
# kernels and autograd formula, but the CUDA kernel is called by the dispatcher directly and the
# Autograd kernel below has a short no-grad path. Inside a compiled graph every call is a no-grad
# call, and custom_op's Python layers (autograd_impl -> redispatch -> backend_impl -> the
# disable-dynamo wrapper) cost ~35 µs of host time per call on the H200 machine.
_lib = torch.library.Library("te_compile", "DEF")
# cudagraph_unsafe: Inductor leaves graphs with these ops out of CUDA graphs (mode="reduce-overhead").
# Recording them failed on the GPU machine ("storage data ptrs are not allocated in pool"), so
# te_compile's graphs run without CUDA graphs and everything else keeps them.
_TAGS = (torch.Tag.pt2_compliant_tag, torch.Tag.cudagraph_unsafe)
_lib.define("attn_fwd(Tensor q, Tensor k, Tensor v, Tensor? bias, Tensor[] extra, str spec) -> (Tensor, Tensor)",
            tags=_TAGS)
_lib.define("attn_bwd(Tensor dout, Tensor q, Tensor k, Tensor v, Tensor out, Tensor lse, Tensor? bias, "
            "Tensor[] extra, str spec, bool need_dbias, Tensor? dlse=None) -> (Tensor, Tensor, Tensor, Tensor)", tags=_TAGS)


def _attn_fwd_reference(q: Tensor, k: Tensor, v: Tensor, bias: Optional[Tensor], extra: list[Tensor],
                        spec: str) -> tuple[Tensor, Tensor]:
    """Attention forward on any device: the reference math."""
    s = AttentionSpec.from_key(spec)
    return _reference_forward(q, k, v, bias, s, _inputs(s, q, k, extra))


def _reference_forward(q, k, v, bias, s: AttentionSpec, inputs: list[Tensor]) -> tuple[Tensor, Tensor]:
    out, lse = reference.attention_forward(q, k, v, bias, s, inputs)
    return _place_out(out, q, v), lse.to(_lse_dtype(q)).contiguous()


def _inputs(spec: AttentionSpec, q: Tensor, k: Tensor, extra: list[Tensor]) -> list[Tensor]:
    """The ``(in i)`` inputs of ``extra``; checks the BlockMask tensors that follow them, if any."""
    inputs = list(extra[: spec.n_inputs])
    if spec.block:
        _check_block_mask(spec, q, k, inputs, list(extra[spec.n_inputs:]))
    return inputs


@functools.lru_cache(maxsize=1024)
def _block_layout(spec: AttentionSpec) -> tuple[int, int, bool, "ir.Expr"]:
    qb, kb, has_full = (int(x) for x in spec.block.split(","))
    return qb, kb, bool(has_full), spec.mask_expr() or ir.Expr.const(True)


def _check_block_mask(spec: AttentionSpec, q: Tensor, k: Tensor, inputs: list[Tensor], block: list[Tensor]) -> None:
    from . import blockmask

    if q.is_cuda and torch.cuda.is_current_stream_capturing():
        # CUDA graph capture (mode="reduce-overhead"): no checking work can run (it syncs); the
        # capture replays what the warm-up run, which did check this BlockMask, computed
        _note_capture_skip()
        return
    qb, kb, has_full, mask = _block_layout(spec)
    kv_num, kv_idx = block[0], block[1]
    full_num, full_idx = (block[2], block[3]) if has_full else (None, None)
    B, H, L, S = q.shape[0], q.shape[1], q.shape[2], k.shape[2]
    why = blockmask.verified.check(
        block + inputs, (B, H, L, S, spec.mask_mod, spec.block),
        lambda: blockmask.mismatch(mask, inputs, B, H, L, S, qb, kb, kv_num, kv_idx, full_num, full_idx, q.device))
    if why:
        raise RuntimeError(
            "te_compile: the BlockMask given to flex_attention was not built by create_block_mask from its "
            f"mask_mod ({why}). Compiled flex_attention honours the block structure, te_compile applies "
            "mask_mod element-wise, so it refuses to run rather than give a different answer. Build the mask "
            "with create_block_mask(mask_mod, ...), or compile this model without te_compile.")


_capture_noted = False


def _note_capture_skip() -> None:
    global _capture_noted
    if not _capture_noted:
        _capture_noted = True
        log.warning("te_compile: under CUDA graph capture the run-time BlockMask check is skipped; graph replays "
                    "do not re-check a different BlockMask passed later (the compile-time and warm-up checks "
                    "still apply). Build BlockMasks with create_block_mask.")


def _lse_dtype(q: Tensor) -> torch.dtype:
    return reference.compute_dtype(q.dtype)


def _out_shape(q: Tensor, v: Tensor) -> tuple[int, ...]:
    return (q.shape[0], q.shape[1], q.shape[2], v.shape[3])


def _place_out(out: Tensor, q: Tensor, v: Tensor) -> Tensor:
    o = empty_like_layout(_out_shape(q, v), q)
    o.copy_(out)
    return o


def _attn_fwd_fake(q, k, v, bias, extra, spec):
    out = empty_like_layout(_out_shape(q, v), q)
    lse = q.new_empty((q.shape[0], q.shape[1], q.shape[2]), dtype=_lse_dtype(q))
    return out, lse


def _attn_fwd_cuda(q, k, v, bias, extra, spec):
    s = AttentionSpec.from_key(spec)
    inputs = _inputs(s, q, k, extra)
    if s.impl == "cudnn":
        from .cudnn import graphs
        try:
            out, lse = graphs.forward(q, k, v, bias, s, inputs)
        except graphs.Unsupported as e:
            _warn_fallback(spec, "forward", str(e))
        else:
            if s.verify:
                _verify_forward(spec, s, q, k, v, bias, inputs, out, lse)
            return out, lse
    return _reference_forward(q, k, v, bias, s, inputs)


# --------------------------------------------------------------------------- backward

def _attn_bwd_reference(dout: Tensor, q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse: Tensor,
                        bias: Optional[Tensor], extra: list[Tensor], spec: str,
                        need_dbias: bool, dlse: Optional[Tensor] = None) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Attention backward on any device: the reference math."""
    s = AttentionSpec.from_key(spec)
    grads = reference.attention_backward(dout, q, k, v, out, lse, bias, s, need_dbias, extra[: s.n_inputs], dlse)
    return _place_grads(grads, q, k, v, bias, need_dbias)


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


def _attn_bwd_fake(dout, q, k, v, out, lse, bias, extra, spec, need_dbias, dlse=None):
    dq = empty_like_layout(q.shape, q)
    dk = empty_like_layout(k.shape, k)
    dv = empty_like_layout(v.shape, v)
    dbias = bias.new_empty(bias.shape) if (need_dbias and bias is not None) else q.new_empty((0,))
    return dq, dk, dv, dbias


def _attn_bwd_cuda(dout, q, k, v, out, lse, bias, extra, spec, need_dbias, dlse=None):
    s = AttentionSpec.from_key(spec)
    inputs = list(extra[: s.n_inputs])
    if s.impl == "cudnn":
        from .cudnn import graphs
        try:
            grads = graphs.backward(dout, q, k, v, out, lse, bias, s, need_dbias, inputs, dlse)
        except graphs.Unsupported as e:
            _warn_fallback(spec, "backward", str(e))
        else:
            if s.verify:
                _verify_backward(spec, s, dout, q, k, v, out, lse, bias, need_dbias, inputs, grads, dlse)
            return grads
    grads = reference.attention_backward(dout, q, k, v, out, lse, bias, s, need_dbias, inputs, dlse)
    return _place_grads(grads, q, k, v, bias, need_dbias)


# --------------------------------------------------------------------------- verify

def _verify_forward(spec_key, s, q, k, v, bias, inputs, out, lse) -> None:
    from . import verify

    if torch.cuda.is_current_stream_capturing():
        return  # the warm-up run before a CUDA graph capture is verified instead

    if not verify.first_time(verify.key_of("fwd", spec_key, (q, k, v, bias, *inputs))):
        return
    ref_out, ref_lse = reference.attention_forward(q, k, v, bias, s, inputs)
    why = verify.compare("forward", ("out", "lse"), (out, lse), (ref_out, ref_lse.float()))
    if why:
        raise verify.VerificationError(f"te_compile verify: cuDNN {why}; spec {s.describe()}, "
                                       f"q {tuple(q.shape)} {q.dtype}")
    log.info("te_compile verify: forward (%s) agrees with the reference", s.describe())


def _verify_backward(spec_key, s, dout, q, k, v, out, lse, bias, need_dbias, inputs, grads, dlse=None) -> None:
    from . import verify

    if torch.cuda.is_current_stream_capturing():
        return

    if not verify.first_time(verify.key_of("bwd", spec_key, (dout, q, k, v, bias, *inputs), (need_dbias, dlse is None))):
        return
    ref = reference.attention_backward(dout, q, k, v, out, lse, bias, s, need_dbias, inputs, dlse)
    why = verify.compare("backward", ("dq", "dk", "dv", "dbias"), grads, ref)
    if why:
        raise verify.VerificationError(f"te_compile verify: cuDNN {why}; spec {s.describe()}, "
                                       f"q {tuple(q.shape)} {q.dtype}")
    log.info("te_compile verify: backward (%s) agrees with the reference", s.describe())


# --------------------------------------------------------------------------- autograd

class _AttnFunction(torch.autograd.Function):
    """attn_fwd with its backward (attn_bwd); dBias only when the bias needs a gradient."""

    @staticmethod
    def forward(ctx, keyset, q, k, v, bias, spec, *extra):
        with torch._C._AutoDispatchBelowAutograd():
            out, lse = _fwd_op.redispatch(keyset & torch._C._after_autograd_keyset, q, k, v, bias, list(extra), spec)
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
        nig = ctx.needs_input_grad  # (keyset, q, k, v, bias, spec, *extra)
        if any(nig[6:]):
            # the rewrite keeps such sites; never hand back a silent zero/None gradient
            raise RuntimeError("te_compile: gradients for captured score_mod tensors are not supported")
        need_dbias = bias is not None and bool(nig[4])
        dq, dk, dv, dbias = _bwd_op(dout, q, k, v, out, lse, bias, list(extra), ctx.spec, need_dbias, dlse)
        return (None, dq if nig[1] else None, dk if nig[2] else None, dv if nig[3] else None,
                dbias if need_dbias else None, None, *([None] * ctx.n_extra))


_IGNORED = torch._C.DispatchKeySet(torch._C.DispatchKey.ADInplaceOrView)


def _below_autograd(op, cuda_kernel, keyset, *args):
    """Run ``op`` below the Autograd key: the CUDA kernel directly in the common case (plain CUDA
    tensors, no mode or subclass in the keyset), a redispatch otherwise."""
    below = keyset & torch._C._after_autograd_keyset
    with torch._C._AutoDispatchBelowAutograd():
        if (below - _IGNORED).highestPriorityTypeId() == torch._C.DispatchKey.CUDA:
            return cuda_kernel(*args)
        return op.redispatch(below, *args)


def _fwd_autograd(keyset, q, k, v, bias, extra, spec):
    if torch.is_grad_enabled() and torch._C._any_requires_grad(q, k, v, bias, *extra):
        return _AttnFunction.apply(keyset, q, k, v, bias, spec, *extra)
    return _below_autograd(_fwd_op, _attn_fwd_cuda, keyset, q, k, v, bias, extra, spec)


def _bwd_autograd(keyset, *args):
    if torch.is_grad_enabled() and torch._C._any_requires_grad(*args[:7], *args[7], *args[10:11]):
        # attn_bwd has no derivative: refuse rather than return grads that silently lack one
        raise RuntimeError("te_compile: double backward (create_graph=True) through a te_compile attention op "
                           "is not supported; compile this model without te_compile for higher-order gradients")
    return _below_autograd(_bwd_op, _attn_bwd_cuda, keyset, *args)


for _name, _ref, _cuda, _fake, _ag in (("attn_fwd", _attn_fwd_reference, _attn_fwd_cuda, _attn_fwd_fake, _fwd_autograd),
                                       ("attn_bwd", _attn_bwd_reference, _attn_bwd_cuda, _attn_bwd_fake, _bwd_autograd)):
    _lib.impl(_name, _ref, "CompositeExplicitAutograd")
    _lib.impl(_name, _cuda, "CUDA")
    _lib.impl(_name, _ag, "Autograd", with_keyset=True)
    torch.library.register_fake(f"te_compile::{_name}", _fake, lib=_lib)

_fwd_op = torch.ops.te_compile.attn_fwd.default
_bwd_op = torch.ops.te_compile.attn_bwd.default


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


def mask_to_bias(mask: Tensor, dtype: torch.dtype) -> Tensor:
    """SDPA bool mask (True = attend) -> additive bias (0 / -inf) in ``dtype``; never needs grad.

    Inserted into the graph by the rewrite pass, so Inductor fuses it with its producer.
    """
    return torch.where(mask, 0.0, float("-inf")).to(dtype)


def bh_input(q: Tensor, term: str, *bufs: Tensor) -> Tensor:
    """A flex score_mod/mask_mod term of (b, h, captured tensors) only, as a [B|1, H|1, 1, 1] float32
    extra input of the op (cuDNN cannot evaluate head-indexed expressions itself).

    Inserted into the graph by the rewrite pass; runs as ordinary torch ops, so it is exact.
    """
    env = {**reference.index_grids(q.shape[0], q.shape[1], 1, 1, q.device), "bufs": list(bufs)}
    # a float term keeps torch's dtype for it (a float32 table read by a float64 model is computed in
    # float32 in eager too; a float64 one stays exact on the reference target); others become float32.
    # cuDNN reads float32 inputs (te_compile.cudnn.graphs converts).
    r = ir.evaluate(ir.parse(term), env)
    if not r.is_floating_point() or r.dtype in (torch.float16, torch.bfloat16):
        r = r.to(torch.float32)
    while r.dim() < 4:
        r = r.unsqueeze(0)
    return r.contiguous()


def materialize_bias(q: Tensor, k: Tensor, term: str, *bufs: Tensor) -> Tensor:
    """An additive score_mod term that gathers from captured tensors (``table[h, q_idx - kv_idx]``)
    as a [B|1, H|1, L, S] bias in q's dtype, computed by ordinary torch ops in the graph, so
    autograd carries dBias back to the table through the gather.

    Inserted by the flex rewrite; the attention op then adds it after the score_mod (flex's
    ``score_mod(s) = f(s) + g`` becomes ``f`` in cuDNN plus this bias)."""
    env = {**reference.index_env(q, k), "bufs": list(bufs)}
    r = ir.evaluate(ir.parse(term), env)
    if not r.is_floating_point():
        r = r.to(torch.float32)
    while r.dim() < 4:
        r = r.unsqueeze(0)
    B, H, L, S = q.shape[0], q.shape[1], q.shape[2], k.shape[2]
    r = r.expand(r.shape[0] if r.shape[0] == B else 1, r.shape[1] if r.shape[1] == H else 1, L, S)
    return r.to(q.dtype).contiguous()


def materialize_mask(q: Tensor, k: Tensor, term: str, qb: int, kb: int, kv_num: Optional[Tensor],
                     kv_idx: Optional[Tensor], full_num: Optional[Tensor], full_idx: Optional[Tensor],
                     *bufs: Tensor) -> Tensor:
    """A mask_mod that gathers from captured tensors (document ids: ``doc[q_idx] == doc[kv_idx]``)
    as a 0 / -inf bias [B|1, H|1, L, S] in q's dtype, with compiled flex's exact semantics: a
    position is kept if its block is listed as full, or listed as partial and mask_mod keeps it
    (unlisted blocks are masked). So any BlockMask, hand-built or not, gives flex's answer.

    Inserted by the flex rewrite; never needs a gradient."""
    from .blockmask import _dense

    env = {**reference.index_env(q, k), "bufs": list(bufs)}
    keep = ir.evaluate(ir.parse(term), env).to(torch.bool)
    while keep.dim() < 4:
        keep = keep.unsqueeze(0)
    L, S = q.shape[2], k.shape[2]
    if kv_num is not None and kv_idx is not None:
        nk = -(-S // kb)

        def per_element(num: Tensor, idx: Tensor) -> Tensor:
            blocks = _dense(num, idx, nk)  # [B', H', nq, nk]
            return blocks.repeat_interleave(qb, dim=-2)[..., :L, :].repeat_interleave(kb, dim=-1)[..., :S]

        keep = keep & per_element(kv_num, kv_idx)
        if full_num is not None and full_idx is not None:
            keep = keep | per_element(full_num, full_idx)
    keep = keep.expand(keep.shape[0], keep.shape[1], L, S)
    return torch.where(keep, 0.0, float("-inf")).to(q.dtype).contiguous()


__all__ = ["attn_fwd", "attn_bwd", "mask_to_bias", "bh_input", "materialize_bias", "materialize_mask",
           "like_layout_strides"]
