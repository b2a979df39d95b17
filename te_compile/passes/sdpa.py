"""scaled_dot_product_attention sites: decide (serve or keep + reason) and rewrite to the te_compile op.

Served: no mask, ``is_causal`` (top-left), a bool ``attn_mask`` (True = attend: converted in the
graph to an additive 0/-inf bias that never needs a gradient), a float ``attn_mask`` (added to the
scores; cast to q's dtype in the graph if needed, so autograd carries its gradient back through
the cast); ``enable_gqa`` / MQA, a custom ``scale``, fp16 and bf16, the head dims cuDNN supports.

Kept: ``dropout_p > 0`` (cuDNN's RNG cannot reproduce torch's), ``attn_mask`` together with
``is_causal`` (eager behaviour differs by backend), fp32 inputs, non-CUDA inputs under
``target="auto"``, and anything the cuDNN support check rejects.
"""

from __future__ import annotations

import numbers
import operator
from typing import Optional

import torch
from torch.fx import GraphModule, Node

from .inserted import mask_to_bias
from ..reasons import NOT_EXACT, UNSUPPORTED_ARGS
from ..spec import AttentionSpec
from .decision import (Checker, Decision, Keep, constant_scale, copy_meta, cudnn_supports, four_d, impl_for,
                       operands)
from .find import AttentionSite, example_value
from .grad import site_grads


def _fmt_shape(t: Optional[torch.Tensor]) -> str:
    return "?" if t is None else "[" + ",".join(str(s) for s in t.shape) + "]"


def _dtype(t: torch.Tensor) -> str:
    return str(t.dtype).replace("torch.", "")


def describe_mask(site: AttentionSite) -> str:
    if site.attn_mask is None:
        return "causal" if site.is_causal is True else "none"
    mask = example_value(site.attn_mask)
    if mask is None:
        return "mask (unknown)"
    kind = "bool mask" if mask.dtype == torch.bool else f"float bias {_dtype(mask)}"
    return f"{kind} {_fmt_shape(mask)}"


def _check_flags(site: AttentionSite) -> None:
    if not isinstance(site.dropout_p, numbers.Number):
        raise Keep("dropout_p is not a constant", UNSUPPORTED_ARGS)
    if site.dropout_p > 0:
        raise Keep(f"dropout_p={site.dropout_p:g} > 0: cuDNN's dropout RNG cannot reproduce torch's",
                   UNSUPPORTED_ARGS)
    if not isinstance(site.is_causal, bool):
        raise Keep("is_causal is not a constant", UNSUPPORTED_ARGS)
    if site.attn_mask is not None and site.is_causal:
        raise Keep("attn_mask together with is_causal=True: eager behaviour differs by backend "
                   "(error on math, AND on CPU flash); fold the causal mask into attn_mask", NOT_EXACT)


def _mask_conversion(site: AttentionSite, q, k) -> tuple[Optional[torch.Tensor], Optional[str]]:
    """(the mask's example value, how the graph turns it into a bias: "bool->bias" | "cast" | None)."""
    if site.attn_mask is None:
        return None, None
    mask = example_value(site.attn_mask)
    if mask is None:
        raise Keep("attn_mask has no example value", UNSUPPORTED_ARGS)
    if mask.dtype == torch.bool:
        conversion: Optional[str] = "bool->bias"
    elif mask.dtype.is_floating_point:
        conversion = "cast" if mask.dtype != q.dtype else None
    else:
        raise Keep(f"attn_mask dtype {_dtype(mask)}: SDPA takes bool or float masks", UNSUPPORTED_ARGS)
    full = (q.shape[0], q.shape[1], q.shape[2], k.shape[2])
    if mask.dim() > 4:
        raise Keep(f"attn_mask is {mask.dim()}-D", UNSUPPORTED_ARGS)
    try:
        fits = tuple(torch.broadcast_shapes(mask.shape, full)) == tuple(full)
    except RuntimeError:
        fits = False
    if not fits:
        raise Keep(f"attn_mask {_fmt_shape(mask)} does not broadcast to {list(full)}", UNSUPPORTED_ARGS)
    return mask, conversion


def decide(site: AttentionSite, target: str, checker: Optional[Checker], d: Decision) -> Decision:
    """Fill ``d`` for an SDPA site (see the module docstring); raises Keep."""
    d.mask = describe_mask(site)
    q, k, v = operands(site)
    d.grads = grads = site_grads(site)
    _check_flags(site)
    scale = constant_scale(site.scale)
    if scale is not None and scale < 0 and site.is_causal:
        raise Keep("a negative scale with is_causal: torch's own SDPA kernels disagree there (its flash kernel "
                   "gives NaN in rows with masked keys, its math kernel does not), so the call stays with torch",
                   UNSUPPORTED_ARGS)
    impl = impl_for(target, q)
    dims = (f"{q.dim()}-D" if q.dim() == k.dim() == v.dim() else
            f"q {q.dim()}-D, k {k.dim()}-D, v {v.dim()}-D")
    four_d(q, k, v, f"inputs are {dims}: te_compile serves 4-D [B, H, S, D] attention")
    if q.shape[1] != k.shape[1] and not site.enable_gqa:
        raise Keep("query and key head counts differ without enable_gqa", UNSUPPORTED_ARGS)
    mask, d.bias_conversion = _mask_conversion(site, q, k)
    spec = AttentionSpec(scale=scale, mask="causal" if site.is_causal else "none", impl=impl, source="sdpa")
    bias_like = None if mask is None else torch.empty_strided(mask.shape, mask.stride(), dtype=q.dtype,
                                                               device="meta")
    cudnn_supports(checker, q, k, v, bias_like, spec, grads.any, grads.bias)
    return d.serve(spec)


def apply(gm: GraphModule, d: Decision) -> None:
    """Replace the site's node by the te_compile op."""
    site, spec = d.site, d.spec
    assert spec is not None
    graph, n = gm.graph, site.node
    q_dtype = example_value(site.q).dtype
    meta = copy_meta(n)
    with graph.inserting_before(n):
        bias = site.attn_mask
        if d.bias_conversion == "bool->bias":
            bias = graph.call_function(mask_to_bias, (bias, q_dtype))
        elif d.bias_conversion == "cast":
            bias = graph.call_method("to", (bias, q_dtype))
        if isinstance(bias, Node) and bias is not site.attn_mask:
            bias.meta.update(meta)
        call = graph.call_function(torch.ops.te_compile.attn_fwd.default,
                                   (site.q, site.k, site.v, bias, [], spec.key()))
        call.meta.update(meta)
        out = graph.call_function(operator.getitem, (call, 0))
        out.meta = dict(n.meta)
    n.replace_all_uses_with(out)
    graph.erase_node(n)
    d.replacement = call.name
    d.replaced = {n: out}
