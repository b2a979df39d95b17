"""A prefix-LM mask as two native cuDNN calls and a merge, not an emitted mask.

``kv_idx < P | q_idx >= kv_idx`` (bidirectional over the first P keys, causal after them) has no native
cuDNN form, and emitted inside a score_mod it makes cuDNN compute every tile (about 3.7x slower than
Inductor's flex; docs/cudnn-notes.md, "Prefix-LM on cuDNN"). Split by keys it is two native calls:

* A: every query over the prefix keys ``K[:P], V[:P]``, no mask (all of them are visible to every row);
* B: the queries ``q >= P`` over the keys ``kv >= P`` with top-left causal (``kv - P <= q - P``), which
  skips masked tiles. Rows ``q < P`` see no key ``>= P`` (any such key is > q), so B leaves them out.

Rows ``q < P`` are A's rows as they are; rows ``q >= P`` merge A's and B's partial results by their lse
(``lse = logaddexp(lse_A, lse_B)``, ``out = out_A exp(lse_A - lse) + out_B exp(lse_B - lse)``). The
backward runs each call's cuDNN backward with the *merged* out and lse: cuDNN recomputes the
probabilities as ``exp(s - lse)`` and ``delta = rowsum(dO * out)``, both exact with the merged values,
so dQ is the sum of the two calls' dQ, and dK / dV are A's for the prefix keys and B's for the rest.

Measured first: a split by query rows instead (rows ``q >= P`` over all keys with a
band of right bound P, top-left or bottom-right aligned) is correct but computes every tile of that band
in cuDNN 9.19, slower than Inductor's flex (docs/cudnn-notes.md).

Only ``q_idx >= kv_idx`` (not ``>``) with a constant P inside both lengths, and no score_mod, bias or
(in i) input, is split (``split``).
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Callable, Optional

import torch
from torch import Tensor

from ..score import ir
from ..layout import empty_like_layout
from ..spec import AttentionSpec
from .lower import diagonal_bounds, linear_in_indices


@dataclasses.dataclass(frozen=True)
class Split:
    keys: int  # P: the keys every query sees
    prefix: AttentionSpec  # A: all queries over keys < P, no mask
    causal: AttentionSpec  # B: queries >= P over keys >= P, top-left causal


def _kv_below(e: ir.Expr) -> Optional[int]:
    """P when ``e`` is ``kv_idx < P`` in any spelling (``kv <= P - 1``, ``P > kv``, constant offsets)."""
    if e.op not in ("lt", "le", "gt", "ge"):
        return None
    x, y = linear_in_indices(e.args[0]), linear_in_indices(e.args[1])
    if x is None or y is None:
        return None
    a, b, c = x[0] - y[0], x[1] - y[1], x[2] - y[2]  # a*q + b*kv + c  (op)  0
    if a != 0 or abs(b) != 1:
        return None
    op = e.op if b == 1 else ir.SWAPPED[e.op]
    t = -c * b  # kv (op) t
    return {"lt": t, "le": t + 1}.get(op)


@functools.lru_cache(maxsize=1024)
def split(spec: AttentionSpec, L: int, S: int) -> Optional[Split]:
    """The split of ``spec`` at lengths (L, S), or None when it is not a prefix-LM mask."""
    if spec.score or not spec.mask_mod or spec.n_inputs or spec.empty_rows:
        return None
    mask = spec.mask_expr()
    if mask is None or mask.op != "or" or len(mask.args) != 2:
        return None
    for kv_side, causal_side in ((mask.args[0], mask.args[1]), (mask.args[1], mask.args[0])):
        P = _kv_below(kv_side)
        if P is None or diagonal_bounds(causal_side) != (0, None):  # q - kv >= 0 and nothing else
            continue
        if not 0 < P < min(L, S):
            return None  # no causal part inside the lengths: not worth a split
        plain = dataclasses.replace(spec, mask="none", mask_mod="", block_q=0, block_kv=0, block_full=False)
        return Split(P, plain, dataclasses.replace(plain, mask_mod="(ge q_idx kv_idx)"))
    return None


Forward = Callable[..., tuple[Tensor, Tensor]]
Backward = Callable[..., tuple[Tensor, Tensor, Tensor, Tensor]]


def forward(fwd: Forward, q: Tensor, k: Tensor, v: Tensor, sp: Split) -> tuple[Tensor, Tensor]:
    """(out, lse) from the two native calls ``fwd(q, k, v, None, spec)`` and the merge."""
    P = sp.keys
    out_a, lse_a = fwd(q, k[:, :, :P], v[:, :, :P], None, sp.prefix)
    out_b, lse_b = fwd(q[:, :, P:], k[:, :, P:], v[:, :, P:], None, sp.causal)
    out = empty_like_layout((q.shape[0], q.shape[1], q.shape[2], v.shape[3]), q)
    lse = lse_a.clone()
    tail_a = lse_a[:, :, P:]
    merged = torch.logaddexp(tail_a, lse_b)
    lse[:, :, P:] = merged
    w_a = torch.exp(tail_a - merged).unsqueeze(-1)
    w_b = torch.exp(lse_b - merged).unsqueeze(-1)
    out[:, :, :P].copy_(out_a[:, :, :P])
    ct = torch.promote_types(out.dtype, torch.float32)  # merge in float32 (or the inputs' float64)
    out[:, :, P:].copy_(out_a[:, :, P:].to(ct) * w_a + out_b.to(ct) * w_b)
    return out, lse


def backward(bwd: Backward, dout: Tensor, q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse: Tensor,
             sp: Split, dlse: Optional[Tensor] = None) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """(dq, dk, dv, empty dbias) from the two native backward calls ``bwd(dout, q, k, v, out, lse, None,
    spec, False, (), dlse)``, each with the merged out and lse."""
    P = sp.keys
    lse = lse.contiguous()
    tail = (dlse[:, :, P:].contiguous(),) if dlse is not None else (None,)
    dq, dk_a, dv_a, _ = bwd(dout, q, k[:, :, :P], v[:, :, :P], out, lse, None, sp.prefix, False, (), dlse)
    dq_b, dk_b, dv_b, _ = bwd(dout[:, :, P:], q[:, :, P:], k[:, :, P:], v[:, :, P:], out[:, :, P:],
                              lse[:, :, P:].contiguous(), None, sp.causal, False, (), *tail)
    dq[:, :, P:] += dq_b
    dk, dv = empty_like_layout(k.shape, k), empty_like_layout(v.shape, v)
    dk[:, :, :P].copy_(dk_a)
    dk[:, :, P:].copy_(dk_b)
    dv[:, :, :P].copy_(dv_a)
    dv[:, :, P:].copy_(dv_b)
    return dq, dk, dv, q.new_empty((0,))
