"""Which inputs of an attention site need gradients, read from the graph's example values.

Dynamo records a fake tensor per node with the ``requires_grad`` the value has at that point
of the program, under the grad mode active there. So:

* the site's own output not requiring grad (``torch.no_grad()``, inference) means no input
  needs a gradient, whatever the parameters say;
* otherwise an input needs one iff its example value requires grad: a learned bias does, a
  buffer or a bool mask converted to -inf does not, a bias computed from a parameter does.

This is what the report shows. The op itself decides dBias from ``ctx.needs_input_grad``
when AOTAutograd traces its backward, which agrees with this reading of the graph.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

from .find import AttentionSite, example_value


@dataclasses.dataclass(frozen=True)
class SiteGrads:
    q: bool
    k: bool
    v: bool
    bias: bool

    @property
    def any(self) -> bool:
        return self.q or self.k or self.v or self.bias

    def describe(self) -> str:
        names = [n for n in ("q", "k", "v", "bias") if getattr(self, n)]
        return ",".join(names) if names else "none"


def _rg(n: Any) -> bool:
    ev = example_value(n)
    return bool(ev is not None and ev.requires_grad)


def site_grads(site: AttentionSite) -> SiteGrads:
    out = example_value(site.node)
    if out is None:  # no metadata: assume the worst (grads everywhere they may exist)
        enabled = torch.is_grad_enabled()
    else:
        enabled = bool(out.requires_grad)
    mask = example_value(site.attn_mask)
    bias = bool(enabled and mask is not None and mask.dtype != torch.bool and _rg(site.attn_mask))
    return SiteGrads(q=enabled and _rg(site.q), k=enabled and _rg(site.k), v=enabled and _rg(site.v),
                     bias=bias)
