"""ALiBi that cuDNN can compute itself: recognising ``score + slope(h) * (kv_idx - q_idx)`` under a causal mask.

cuDNN's SDPA has a built-in ALiBi mask (the frontend's ``use_alibi_mask``) that makes its own per-head slopes
(the frontend's ``get_alibi_slope``: ``2^(-8(h+1)/n)`` for the first n heads, n the largest power of two <= H,
then the odd-indexed slopes of 2n heads for the rest, as in the ALiBi paper). Together with the causal band it
skips the masked tiles, which the same term emitted as pointwise ops does not (docs/cudnn-notes.md).

te_compile serves a flex site that way only when its score_mod is exactly ALiBi with those slopes: the slope is
a head-only term (no captured tensor, so its values are known at compile time) that evaluates equal to cuDNN's
slopes for the site's head count, and the mask_mod is top-left causal. The spec records the head count it was
checked for (``AttentionSpec.alibi_heads``); the cuDNN lowering uses the native form only at that head count
and with as many queries as keys, and emits the score_mod otherwise.

This module reads only the IR (no cuDNN), so the passes can call it.
"""

from __future__ import annotations

from typing import Optional, Sequence

import torch

from ..score import ir

#: relative tolerance of a slope against cuDNN's (float32 rounding of the user's formula)
SLOPE_RTOL = 1e-6

_Q, _KV, _SCORE = ir.Expr("q_idx"), ir.Expr("kv_idx"), ir.Expr("score")


def cudnn_slopes(heads: int) -> list[float]:
    """The ALiBi slopes cuDNN uses for ``heads`` heads (the frontend's ``get_alibi_slope``)."""
    n = 1 << (heads.bit_length() - 1)
    first = [2.0 ** (-8.0 * (h + 1) / n) for h in range(n)]
    rest = [2.0 ** (-4.0 * (2 * j + 1) / n) for j in range(heads - n)]
    return first + rest


def _distance(e: ir.Expr) -> int:
    """+1 if ``e`` is kv_idx - q_idx, -1 if q_idx - kv_idx, else 0."""
    if e.op == "sub" and e.args == (_KV, _Q):
        return 1
    if e.op == "sub" and e.args == (_Q, _KV):
        return -1
    return 0


def slope_input(score: Optional[ir.Expr]) -> Optional[int]:
    """i when ``score`` is ``score + (in i) * (kv_idx - q_idx)`` (either operand order, or
    ``score - (in i) * (q_idx - kv_idx)``), else None."""
    if score is None or score.op not in ("add", "sub") or len(score.args) != 2:
        return None
    a, b = score.args
    if score.op == "add" and b == _SCORE:
        a, b = b, a
    if a != _SCORE or b.op != "mul":
        return None
    want = 1 if score.op == "add" else -1
    x, y = b.args
    for slope, dist in ((x, y), (y, x)):
        if slope.op == "in" and _distance(dist) == want:
            return int(slope.value)
    return None


def is_causal(mask: Optional[ir.Expr]) -> bool:
    """``q_idx >= kv_idx`` (top-left causal) in either spelling."""
    return mask is not None and ((mask.op == "ge" and mask.args == (_Q, _KV)) or
                                 (mask.op == "le" and mask.args == (_KV, _Q)))


def heads_for(score: Optional[ir.Expr], mask: Optional[ir.Expr], terms: Sequence[ir.Expr], heads: object) -> int:
    """``heads`` when the mods are ALiBi with cuDNN's slopes for that many heads under a causal mask
    (``terms``: the extracted (b, h) terms the ``(in i)`` inputs are computed from); 0 otherwise."""
    if not isinstance(heads, int) or heads < 1 or not is_causal(mask):
        return 0
    i = slope_input(score)
    if i is None or i >= len(terms):
        return 0
    term = terms[i]
    if term.leaves() - {"h"} or ir.buffers_used(term) or "(in " in str(term):
        return 0
    try:
        got = ir.evaluate(term, {"h": torch.arange(heads)})
    except Exception:  # noqa: BLE001 - a term torch cannot evaluate on its own is not a known slope
        return 0
    got = torch.as_tensor(got).to(torch.float64).reshape(-1)
    if got.numel() == 1:
        got = got.expand(heads)
    if got.numel() != heads:
        return 0
    want = torch.tensor(cudnn_slopes(heads), dtype=torch.float64)
    return heads if bool(torch.allclose(got, want, rtol=SLOPE_RTOL, atol=0.0)) else 0


__all__ = ["cudnn_slopes", "heads_for", "is_causal", "slope_input", "SLOPE_RTOL"]
