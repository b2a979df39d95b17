"""The decision types every site kind shares, and the small checks they have in common.

A site kind (``sdpa``, ``flex``) decides by running named steps over a ``Decision`` draft: each
step either fills in what it learned (the mask and score_mod as shown in the report, the input
gradients, the spec, what a flex rewrite inserts) or raises ``Keep`` with the reason the site stays with
Inductor. ``te_compile.passes.rewrite`` catches ``Keep`` once, so a kept site's report row
shows whatever the steps before it had learned, plus the reason.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import numbers
from typing import Any, Callable, Iterator, Optional

import torch
from torch.fx import Node

from ..score import ir
from ..reasons import DEVICE, DISTRIBUTED, NOT_ON_CUDNN, UNSUPPORTED_ARGS, Reason, category
from ..spec import AttentionSpec
from .find import AttentionSite, example_value
from .grad import SiteGrads

#: what ``te_compile.backend(target=...)`` accepts: "auto" serves CUDA sites on cuDNN, "reference"
#: serves every site on the reference kernel (any device)
TARGETS = ("auto", "reference")

#: the cuDNN support check (te_compile.cudnn.check.check), passed in so the passes never import cuDNN:
#: checker(q, k, v, bias_like, spec, needs_grad, need_dbias) -> reason or None (a ``Reason`` keeps its
#: category; a plain string reads as OTHER)
Checker = Callable[..., Optional[str]]


class Keep(Exception):
    """The site keeps its node (Inductor runs it); ``reason`` says why, in the report, and carries
    ``category`` (one of te_compile.reasons.CATEGORIES) for code that asks what kind of reason it is."""

    def __init__(self, reason: str, category: str):
        super().__init__(reason)
        self.reason = Reason(reason, category, getattr(reason, "short", None))


@dataclasses.dataclass
class FlexInserts:
    """What the flex rewrite inserts next to the op (te_compile.passes.inserted helpers)."""

    #: (b, h, captured)-only terms: each a ``bh_input`` node, the op's ``(in i)`` inputs
    terms: list[str]
    #: the captured tensors (score_mod's, then mask_mod's), in the order ``(buf j)`` names them
    buffers: list[Node]
    #: BlockMask tensors handed to the op for its run-time check (empty: no BlockMask to check)
    block_nodes: list[Node]
    #: an additive score_mod term that gathers: ``materialize_bias`` computes it (dBias through autograd)
    bias_term: Optional[str] = None
    #: a mask_mod that gathers (document ids): ``materialize_mask`` computes it as a 0/-inf bias
    mask_term: Optional[str] = None
    #: (QB, KB, kv_num, kv_idx, full_num, full_idx): the BlockMask ``materialize_mask`` honours
    mask_block: Optional[tuple] = None
    #: ``materialize_bias`` keeps the bias in float32 (te_compile.passes.flex.wide_bias says when)
    bias_float32: bool = False
    #: the captured tensors go to the op as they are (an interval spec's mask_mod reads them as ``(buf j)``)
    pass_buffers: bool = False

    def nodes(self) -> list[Node]:
        return [*self.buffers, *self.block_nodes, *(x for x in (self.mask_block or ()) if isinstance(x, Node))]


@dataclasses.dataclass
class Decision:
    """What te_compile did with one attention site, and why."""

    site: AttentionSite
    rewrite: bool = False
    reason: str = ""
    #: "cudnn" | "reference" | "kept" (which kernel runs the site; Options.target is the user's choice)
    runs_on: str = "kept"
    spec: Optional[AttentionSpec] = None
    grads: Optional[SiteGrads] = None
    mask: str = "none"  # as the report shows it
    score: str = ""  # flex: the score_mod as ScoreExpr text ("" for SDPA / identity)
    #: flex: the translated mods (the report prints them in infix form too)
    score_expr: Optional[ir.Expr] = None
    mask_expr: Optional[ir.Expr] = None
    bias_conversion: Optional[str] = None  # SDPA: "bool->bias" | "cast" | None
    inserts: Optional[FlexInserts] = None  # flex: what apply() inserts next to the op
    replacement: Optional[str] = None  # name of the node that now carries the output (set by apply)
    replaced: Optional[dict] = None  # old node -> the node that now stands for it (set by apply)
    #: a served site's speed basis for the report ("served: measured ..." / "served by the rule for ...")
    note: str = ""

    @property
    def name(self) -> str:
        return self.site.name

    @property
    def need_dbias(self) -> bool:
        """Does the op compute dBias for this site (the bias needs a gradient)?"""
        return bool(self.grads and self.grads.bias)

    def serve(self, spec: AttentionSpec) -> "Decision":
        self.rewrite, self.reason, self.spec, self.runs_on = True, "", spec, spec.impl
        return self

    def keep(self, reason: str) -> "Decision":
        self.rewrite, self.reason, self.spec, self.runs_on, self.inserts = False, reason, None, "kept", None
        return self

    @property
    def dbias_note(self) -> str:
        """The report's dbias column: whether dBias is computed, and why."""
        if self.site.kind == "flex":
            if not (self.inserts and self.inserts.bias_term):
                return "no (mask as -inf bias)" if self.inserts and self.inserts.mask_term else "-"
            return "yes (table needs grad)" if self.need_dbias else "no (table frozen)"
        if self.grads is None or self.mask in ("none", "causal"):
            return "-"
        if self.mask.startswith("bool"):
            return "no (bool mask)"
        return "yes (bias needs grad)" if self.need_dbias else "no (bias frozen)"


# --------------------------------------------------------------------------- shared checks

def operands(site: AttentionSite) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    q, k, v = example_value(site.q), example_value(site.k), example_value(site.v)
    if q is None or k is None or v is None:
        raise Keep("q/k/v have no example values in the graph", UNSUPPORTED_ARGS)
    plain_tensors(site)
    return q, k, v


def _subclass_note(t: torch.Tensor) -> str:
    """``DTensor (Shard(dim=1),)``: the subclass of an example value, with its placements if it has them."""
    placements = getattr(t, "placements", None)
    return type(t).__name__ + (f" {tuple(placements)}" if placements is not None else "")


def plain_tensors(site: AttentionSite) -> None:
    """Keep a site whose q / k / v / mask / captured tensors reach the graph as tensor subclasses.

    Under tensor parallelism with ``use_local_output=False`` or context parallelism
    (``torch.distributed.tensor.experimental.context_parallel`` turns q / k / v into sequence-sharded
    DTensors inside its ``F.scaled_dot_product_attention`` wrapper, and DTensor dispatch runs ring
    attention on them) the example values are DTensors. The te_compile op has no DTensor sharding rule:
    rewritten, it would fail to compile (or, for a sequence-sharded DTensor, would have to attend to the
    local chunk only); kept, DTensor dispatches SDPA / flex by its sharding (local heads, ring attention)."""
    from torch.utils._python_dispatch import is_traceable_wrapper_subclass
    named = [("q", site.q), ("k", site.k), ("v", site.v), ("attn_mask", site.attn_mask)]
    named += [("captured tensor", b) for b in (*site.score_buffers, *site.mask_buffers)]
    for name, node in named:
        ev = example_value(node)
        if ev is not None and is_traceable_wrapper_subclass(ev):
            raise Keep(f"{name} is a {_subclass_note(ev)}: te_compile's op has no DTensor / tensor-subclass rule, "
                       f"so torch runs the call by its sharding (heads: local; sequence: context-parallel ring "
                       f"attention); pass local tensors (parallelize_module's default use_local_output=True) "
                       f"to have it served", DISTRIBUTED)


def constant_scale(scale: Any) -> Optional[float]:
    if scale is None:
        return None  # SDPA's default, resolved from q's head dim at run time
    if not isinstance(scale, numbers.Number):
        raise Keep("scale is not a constant", UNSUPPORTED_ARGS)
    return float(scale)


#: the device sites are decided for when it is not the one their inputs are on (``deciding_for``)
_FOR_DEVICE: contextvars.ContextVar = contextvars.ContextVar("te_compile_for_device", default=None)


def deciding_for_device() -> Optional[str]:
    """The device sites are decided for inside ``deciding_for`` ("cuda"), else None."""
    return _FOR_DEVICE.get()


@contextlib.contextmanager
def deciding_for(device: Optional[str]) -> Iterator[None]:
    """Decide the sites of graphs rewritten inside this block as for ``device`` ("cuda"), whatever device their
    inputs are on: a CPU machine asking what a GPU would run (te_compile.explain's ``for_device``)."""
    token = _FOR_DEVICE.set(device)
    try:
        yield
    finally:
        _FOR_DEVICE.reset(token)


def impl_for(target: str, q: torch.Tensor) -> str:
    """"cudnn" or "reference" for a site with inputs like ``q``; Keep for non-CUDA sites under "auto"."""
    if target == "auto" and q.device.type != "cuda" and _FOR_DEVICE.get() != "cuda":
        raise Keep(f"inputs on {q.device.type}: target 'auto' rewrites CUDA sites only "
                   f"(target='reference' rewrites to the reference kernel)", DEVICE)
    return "cudnn" if target == "auto" else "reference"


def four_d(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, msg: str) -> None:
    if q.dim() != 4 or k.dim() != 4 or v.dim() != 4:
        raise Keep(msg, NOT_ON_CUDNN)


def cudnn_supports(checker: Optional[Checker], q, k, v, bias_like: Optional[torch.Tensor],
                   spec: AttentionSpec, needs_grad: bool, need_dbias: bool) -> None:
    """The cuDNN support check (cudnn/check.py) for a site about to be served on cuDNN; a ``Reason`` it
    returns keeps its category (a plain string is OTHER)."""
    if spec.impl != "cudnn" or checker is None:
        return
    why = checker(q, k, v, bias_like, spec, needs_grad, need_dbias)
    if why:
        raise Keep(why, category(why))


def copy_meta(src: Node) -> dict:
    """The node meta the inserted nodes inherit from the site (source line, module stack)."""
    return {key: src.meta[key] for key in ("stack_trace", "nn_module_stack", "source_fn_stack") if key in src.meta}
