"""Decide, per attention site, rewrite or keep (with a reason); then rewrite the graph.

SDPA sites served (everything else keeps its node, and the decision says why):

* no mask, ``is_causal`` (top-left), a bool ``attn_mask`` (True = attend: converted in the
  graph to an additive 0/-inf bias that never needs a gradient), a float ``attn_mask``
  (added to the scores; cast to q's dtype in the graph if needed, so autograd carries its
  gradient back through the cast);
* ``enable_gqa`` / MQA, a custom ``scale``, fp16 and bf16, the head dims cuDNN supports.

Kept: ``dropout_p > 0`` (cuDNN's RNG cannot reproduce torch's), ``attn_mask`` together with
``is_causal`` (eager behaviour differs by backend), fp32 inputs, non-CUDA inputs under
``target="auto"``, and anything the cuDNN support check rejects.

This module never imports cuDNN: the support check is passed in as ``checker``.
"""

from __future__ import annotations

import dataclasses
import numbers
import operator
from typing import Any, Callable, Optional

import torch
from torch.fx import GraphModule, Node

from ..ops import mask_to_bias
from ..spec import AttentionSpec
from .find import AttentionSite, example_value, find_sites
from .grad import SiteGrads, site_grads

Checker = Callable[..., Optional[str]]
TARGETS = ("auto", "reference")


@dataclasses.dataclass
class Decision:
    """What te_compile did with one attention site, and why."""

    site: AttentionSite
    rewrite: bool
    reason: str
    target: str  # "cudnn" | "reference" | "kept"
    spec: Optional[AttentionSpec] = None
    grads: Optional[SiteGrads] = None
    mask: str = "none"
    bias_conversion: Optional[str] = None  # "bool->bias" | "cast" | None
    replacement: Optional[str] = None  # name of the node that now carries the output
    replaced: Optional[dict] = None  # old node -> the node that now stands for it (set by apply)
    plan: Optional[dict] = None  # flex: what apply() inserts (terms, captured tensors, BlockMask nodes)
    score: str = ""  # flex: the score_mod as a readable ScoreExpr ("" for SDPA / identity)

    @property
    def name(self) -> str:
        return self.site.name

    @property
    def dbias(self) -> str:
        if self.site.kind == "flex":
            if not (self.plan and self.plan.get("bias_term")):
                return "no (mask as -inf bias)" if self.plan and self.plan.get("mask_term") else "-"
            return "yes (table needs grad)" if self.grads and self.grads.bias else "no (table frozen)"
        if self.grads is None or self.mask in ("none", "causal"):
            return "-"
        if self.mask.startswith("bool"):
            return "no (bool mask)"
        return "yes (bias needs grad)" if self.grads.bias else "no (bias frozen)"


def _fmt_shape(t: Optional[torch.Tensor]) -> str:
    if t is None:
        return "?"
    return "[" + ",".join(str(s) for s in t.shape) + "]"


def _dtype(t: torch.Tensor) -> str:
    return str(t.dtype).replace("torch.", "")


def describe_mask(site: AttentionSite) -> str:
    if site.kind == "flex":
        return "mask_mod"
    mask = example_value(site.attn_mask)
    if site.attn_mask is None:
        return "causal" if site.is_causal is True else "none"
    if mask is None:
        return "mask (unknown)"
    kind = "bool mask" if mask.dtype == torch.bool else f"float bias {_dtype(mask)}"
    return f"{kind} {_fmt_shape(mask)}"


def _keep(site: AttentionSite, reason: str, **kw: Any) -> Decision:
    return Decision(site=site, rewrite=False, reason=reason, target="kept", **kw)


def decide(site: AttentionSite, target: str = "auto", checker: Optional[Checker] = None) -> Decision:
    """Rewrite or keep ``site``; never raises for a malformed site (it is kept with a reason)."""
    if target not in TARGETS:
        raise ValueError(f"unknown target {target!r}; expected one of {TARGETS}")
    mask_desc = describe_mask(site)
    if site.problem:
        return _keep(site, site.problem, mask=mask_desc)
    if site.kind == "flex":
        from .flex import decide_flex
        return decide_flex(site, target, checker)
    q, k, v = example_value(site.q), example_value(site.k), example_value(site.v)
    if q is None or k is None or v is None:
        return _keep(site, "q/k/v have no example values in the graph", mask=mask_desc)
    grads = site_grads(site)
    kw = {"mask": mask_desc, "grads": grads}
    if not isinstance(site.dropout_p, numbers.Number):
        return _keep(site, "dropout_p is not a constant", **kw)
    if site.dropout_p > 0:
        return _keep(site, f"dropout_p={site.dropout_p:g} > 0: cuDNN's dropout RNG cannot reproduce torch's", **kw)
    if not isinstance(site.is_causal, bool):
        return _keep(site, "is_causal is not a constant", **kw)
    if site.attn_mask is not None and site.is_causal:
        return _keep(site, "attn_mask together with is_causal=True: eager behaviour differs by backend "
                           "(error on math, AND on CPU flash); fold the causal mask into attn_mask", **kw)
    if site.scale is None:
        scale = None  # SDPA's default, resolved from q's head dim at run time
    elif isinstance(site.scale, numbers.Number):
        scale = float(site.scale)
    else:
        return _keep(site, "scale is not a constant", **kw)
    if target == "auto" and q.device.type != "cuda":
        return _keep(site, f"inputs on {q.device.type}: target 'auto' rewrites CUDA sites only "
                           f"(target='reference' rewrites to the reference kernel)", **kw)
    if q.dim() != 4 or k.dim() != 4 or v.dim() != 4:
        return _keep(site, f"inputs are {q.dim()}-D: te_compile serves 4-D [B, H, S, D] attention", **kw)
    if q.shape[1] != k.shape[1] and not site.enable_gqa:
        return _keep(site, "query and key head counts differ without enable_gqa", **kw)
    mask = example_value(site.attn_mask) if site.attn_mask is not None else None
    conversion = None
    if site.attn_mask is not None:
        if mask is None:
            return _keep(site, "attn_mask has no example value", **kw)
        if mask.dtype == torch.bool:
            conversion = "bool->bias"
        elif mask.dtype.is_floating_point:
            conversion = "cast" if mask.dtype != q.dtype else None
        else:
            return _keep(site, f"attn_mask dtype {_dtype(mask)}: SDPA takes bool or float masks", **kw)
        full = (q.shape[0], q.shape[1], q.shape[2], k.shape[2])
        if mask.dim() > 4:
            return _keep(site, f"attn_mask is {mask.dim()}-D", **kw)
        try:
            if tuple(torch.broadcast_shapes(mask.shape, full)) != tuple(full):
                return _keep(site, f"attn_mask {_fmt_shape(mask)} does not broadcast to {list(full)}", **kw)
        except RuntimeError:
            return _keep(site, f"attn_mask {_fmt_shape(mask)} does not broadcast to {list(full)}", **kw)
    impl = "cudnn" if target == "auto" else "reference"
    spec = AttentionSpec(scale=scale, mask="causal" if site.is_causal else "none", impl=impl, source=site.kind)
    if impl == "cudnn" and checker is not None:
        bias_like = None
        if mask is not None:
            bias_like = torch.empty_strided(mask.shape, mask.stride(), dtype=q.dtype, device="meta")
        why = checker(q, k, v, bias_like, spec, grads.any, grads.bias)
        if why:
            return _keep(site, why, **kw)
    return Decision(site=site, rewrite=True, reason="", target=impl, spec=spec, bias_conversion=conversion, **kw)


def apply(gm: GraphModule, decision: Decision) -> None:
    """Replace the site's node by the te_compile op (only for ``decision.rewrite``)."""
    if not decision.rewrite:
        return
    if decision.site.kind == "flex":
        from .flex import apply_flex
        apply_flex(gm, decision)
        return
    site, spec = decision.site, decision.spec
    assert spec is not None
    graph = gm.graph
    n = site.node
    q_dtype = example_value(site.q).dtype
    meta = {key: n.meta[key] for key in ("stack_trace", "nn_module_stack", "source_fn_stack") if key in n.meta}
    with graph.inserting_before(n):
        bias = site.attn_mask
        if decision.bias_conversion == "bool->bias":
            bias = graph.call_function(mask_to_bias, (bias, q_dtype))
        elif decision.bias_conversion == "cast":
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
    decision.replacement = call.name
    decision.replaced = {n: out}


def _sub(x: Any, replaced: dict) -> Any:
    if isinstance(x, Node):
        while x in replaced:
            x = replaced[x]
        return x
    if isinstance(x, (list, tuple)):
        return type(x)(_sub(y, replaced) for y in x)
    return x


def _remap(d: Decision, replaced: dict) -> None:
    """Point ``d``'s site and plan at the nodes that replaced the ones they name."""
    if not replaced:
        return
    site = d.site
    for f in ("q", "k", "v", "attn_mask", "score_buffers", "mask_buffers"):
        setattr(site, f, _sub(getattr(site, f), replaced))
    if d.plan:
        d.plan = {key: _sub(val, replaced) for key, val in d.plan.items()}


def _safe_decide(site: AttentionSite, target: str, checker: Optional[Checker]) -> Decision:
    try:
        return decide(site, target, checker)
    except ValueError:
        raise
    except Exception as e:  # noqa: BLE001 - a te_compile bug must never break the user's model
        return _keep(site, f"te_compile internal error while deciding ({type(e).__name__}: {e}); "
                           "please report it", mask=describe_mask(site))


def rewrite_graph(gm: GraphModule, target: str = "auto", checker: Optional[Checker] = None,
                  verify: bool = False) -> list[Decision]:
    """Decide and apply for every site of ``gm``; returns the decisions in graph order.

    ``verify`` marks every rewritten site's spec so the op compares cuDNN with the reference on
    the first call of each configuration (te_compile.verify)."""
    decisions = [_safe_decide(site, target, checker) for site in find_sites(gm.graph)]
    if verify:
        for d in decisions:
            if d.rewrite and d.spec is not None:
                d.spec = dataclasses.replace(d.spec, verify=True)
    replaced: dict[Node, Node] = {}
    for d in decisions:
        if d.rewrite:
            # a site may read what an earlier rewrite replaced (sdpa(sdpa(q, k, v), k, v)): its
            # operands are the earlier site's old output nodes, now erased
            _remap(d, replaced)
            apply(gm, d)
            replaced.update(d.replaced or {})
    if any(d.rewrite for d in decisions):
        gm.graph.lint()
        gm.recompile()
    return decisions
