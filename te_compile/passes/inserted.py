"""The torch functions the rewrite passes insert into the graph next to the attention op.

They run as ordinary torch ops (Inductor fuses them with their producers; autograd carries
gradients through them): a bool mask as a 0/-inf bias, a flex term of (b, h, captured tensors)
as a small float32 input of the op, an additive gathered score_mod term or a gathering mask_mod
materialized as a bias. The passes import this module, never ``te_compile.runtime.ops``.
"""

from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor

from .. import reference
from ..score import ir


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


def materialize_bias(q: Tensor, k: Tensor, term: str, *bufs: Tensor, float32: bool = False) -> tuple[Tensor, Tensor]:
    """An additive score_mod term that gathers from captured tensors (``table[h, q_idx - kv_idx]``)
    as a [B|1, H|1, L, S] bias in q's dtype (float32 with ``float32``), computed by ordinary torch ops in the graph, so
    autograd carries dBias back to the table through the gather; and the shift [B|1, H|1, L] to add
    to the attention's lse.

    Inserted by the flex rewrite; the attention op then adds it after the score_mod (flex's
    ``score_mod(s) = f(s) + g`` becomes ``f`` in cuDNN plus this bias).

    Eager computes the term in float32; the bias is in q's dtype (bf16 keeps 8 bits), so a large term
    lost what matters to the softmax: ``table[h, q_idx - kv_idx] + q_idx`` at q_idx ~ 260 rounds in steps
    of 2 (GPU fuzzer: out 27% off). Each row's largest finite value is subtracted first (the softmax does
    not change; the lse comes back by the shift), so the entries near the row's top, the ones with weight,
    are small and exact to bf16's relative precision; the shift is not differentiated (d lse / d bias is
    the same softmax either way).

    ``float32`` (the flex rewrite sets it when the table is learned, or when a mask hides keys: the row's top may then
    be a hidden key, te_compile.passes.flex.wide_bias): the bias stays in float32 (or q's wider dtype). Rounded to
    bf16, a learned table's gradient drifted past tolerance (GPU fuzzer; dBias and dQ 3-8x further from
    float64 than with a float32 bias, docs/cudnn-notes.md); cuDNN reads a float32 bias next to bf16 q / k / v."""
    # half-precision tables are read in float32: the gather's backward then sums each table entry's
    # dBias in float32 (a T5 bucket collects thousands of positions; a bf16 sum was 10% off)
    wide = [b.float() if b.dtype in (torch.float16, torch.bfloat16) else b for b in bufs]
    env = {**reference.index_env(q, k), "bufs": wide}
    r = ir.evaluate(ir.parse(term), env)
    if not r.is_floating_point():
        r = r.to(torch.float32)
    while r.dim() < 4:
        r = r.unsqueeze(0)
    B, H, L, S = q.shape[0], q.shape[1], q.shape[2], k.shape[2]
    r = r.expand(r.shape[0] if r.shape[0] == B else 1, r.shape[1] if r.shape[1] == H else 1, L, S)
    top = r.detach().amax(dim=-1, keepdim=True)
    top = torch.where(torch.isfinite(top), top, torch.zeros_like(top))
    dtype = torch.promote_types(q.dtype, torch.float32) if float32 else q.dtype
    return (r - top).to(dtype).contiguous(), top.squeeze(-1).float()


def materialize_mask(q: Tensor, k: Tensor, term: str, qb: int, kb: int, kv_num: Optional[Tensor],
                     kv_idx: Optional[Tensor], full_num: Optional[Tensor], full_idx: Optional[Tensor],
                     *bufs: Tensor) -> Tensor:
    """A mask_mod that gathers from captured tensors (document ids: ``doc[q_idx] == doc[kv_idx]``)
    as a 0 / -inf bias [B|1, H|1, L, S] in q's dtype, with compiled flex's exact semantics: a
    position is kept if its block is listed as full, or listed as partial and mask_mod keeps it
    (unlisted blocks are masked). So any BlockMask, hand-built or not, gives flex's answer.

    Inserted by the flex rewrite; never needs a gradient."""
    from ..runtime.blockmask import listed_blocks

    env = {**reference.index_env(q, k), "bufs": list(bufs)}
    keep = ir.evaluate(ir.parse(term), env).to(torch.bool)
    while keep.dim() < 4:
        keep = keep.unsqueeze(0)
    L, S = q.shape[2], k.shape[2]
    if kv_num is not None and kv_idx is not None:
        nk = -(-S // kb)

        def per_element(num: Tensor, idx: Tensor) -> Tensor:
            blocks = listed_blocks(num, idx, nk)  # [B', H', nq, nk]
            return blocks.repeat_interleave(qb, dim=-2)[..., :L, :].repeat_interleave(kb, dim=-1)[..., :S]

        keep = keep & per_element(kv_num, kv_idx)
        if full_num is not None and full_idx is not None:
            keep = keep | per_element(full_num, full_idx)
    keep = keep.expand(keep.shape[0], keep.shape[1], L, S)
    return torch.where(keep, 0.0, float("-inf")).to(q.dtype).contiguous()
