"""Locate attention calls in a Dynamo FX graph and normalize their arguments.

A site is one ``F.scaled_dot_product_attention`` call (``torch._C._nn`` spelling, the same
object) or one ``torch.ops.higher_order.flex_attention`` HOP (also what a nested
``torch.compile(flex_attention)`` becomes). Arguments are normalized with
the schema, so positional and keyword spellings give the same ``AttentionSite``.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Optional

import torch
import torch.nn.functional as F
from torch.fx import Graph, Node
from torch.fx.operator_schemas import normalize_function

SDPA_TARGETS = (F.scaled_dot_product_attention, torch.ops.aten.scaled_dot_product_attention.default)


@dataclasses.dataclass
class AttentionSite:
    """One attention call in the graph, with normalized arguments."""

    node: Node
    kind: str  # "sdpa" | "flex"
    q: Node
    k: Node
    v: Node
    attn_mask: Optional[Any] = None
    dropout_p: Any = 0.0
    is_causal: Any = False
    scale: Any = None  # as written (None = default)
    enable_gqa: Any = False
    problem: Optional[str] = None  # set when the arguments could not be read
    # flex only: the score_mod / mask_mod subgraphs and the tensors they capture
    score_mod: Optional[Any] = None
    mask_mod: Optional[Any] = None
    score_buffers: tuple = ()
    mask_buffers: tuple = ()
    flex: Optional["FlexArgs"] = None  # the HOP's arguments, named

    @property
    def name(self) -> str:
        return self.node.name

    def source_line(self) -> str:
        """``file:line in fn`` of the user code that made this call, when Dynamo recorded it."""
        trace = self.node.meta.get("stack_trace") or ""
        lines = [ln.strip() for ln in trace.strip().splitlines() if ln.strip().startswith("File ")]
        if not lines:
            return ""
        # the innermost frame of user code: skip frames inside torch itself (flex_attention's wrapper)
        user = [ln for ln in lines if "/torch/" not in ln.split('"')[1 if '"' in ln else 0]]
        last = (user or lines)[-1]  # 'File "/path/x.py", line 12, in forward'
        try:
            path = last.split('"')[1]
            rest = last.split('"', 2)[2]  # ', line 12, in forward'
            lineno = rest.split("line", 1)[1].split(",")[0].strip()
            fn = rest.split(" in ", 1)[1].strip() if " in " in rest else "?"
            return f"{path.rsplit('/', 1)[-1]}:{lineno} in {fn}"
        except IndexError:
            return last


def example_value(n: Any) -> Optional[torch.Tensor]:
    """The fake tensor Dynamo recorded for a node (None for non-nodes or missing meta)."""
    if not isinstance(n, Node):
        return None
    v = n.meta.get("example_value", n.meta.get("val"))
    return v if isinstance(v, torch.Tensor) else None


def is_sdpa(n: Node) -> bool:
    return n.op == "call_function" and n.target in SDPA_TARGETS


def _sdpa_site(n: Node) -> AttentionSite:
    norm = normalize_function(n.target, n.args, n.kwargs, normalize_to_only_use_kwargs=True)
    if norm is None:
        q, k, v = (list(n.args) + [None] * 3)[:3]
        return AttentionSite(n, "sdpa", q, k, v, problem="could not normalize the call's arguments")
    kw = norm.kwargs
    return AttentionSite(
        node=n, kind="sdpa", q=kw["query"], k=kw["key"], v=kw["value"],
        attn_mask=kw.get("attn_mask"), dropout_p=kw.get("dropout_p", 0.0),
        is_causal=kw.get("is_causal", False), scale=kw.get("scale"),
        enable_gqa=kw.get("enable_gqa", False),
    )


def is_flex(n: Node) -> bool:
    return n.op == "call_function" and n.target is torch.ops.higher_order.flex_attention


@dataclasses.dataclass(frozen=True)
class FlexBlockMask:
    """The BlockMask as the flex HOP takes it (``BlockMask.as_tuple()``), by name. The tuple has 13 entries on
    torch 2.11 and 17 on 2.13 (2.13 adds four dq-order tensors before the block sizes): the entries used here
    are the same from the front (kv / full-kv block lists) and from the back (block sizes, mask_mod)."""

    kv_num_blocks: Any
    kv_indices: Any
    full_kv_num_blocks: Any
    full_kv_indices: Any
    q_block: Any  # Q_BLOCK_SIZE
    kv_block: Any  # KV_BLOCK_SIZE
    mask_mod: Any  # the mask_mod subgraph's get_attr node

    @classmethod
    def parse(cls, entries: Any) -> "FlexBlockMask":
        t = tuple(entries)
        return cls(t[2], t[3], t[4], t[5], t[-3], t[-2], t[-1])


@dataclasses.dataclass(frozen=True)
class FlexArgs:
    """The flex_attention HOP's arguments, by name: (query, key, value, score_mod, block_mask, scale,
    kernel_options, score_mod_other_buffers, mask_mod_other_buffers)."""

    q: Any
    k: Any
    v: Any
    score_mod: Any  # the score_mod subgraph's get_attr node
    block_mask: FlexBlockMask
    scale: Any
    kernel_options: Any = None
    score_buffers: tuple = ()
    mask_buffers: tuple = ()

    @classmethod
    def parse(cls, n: Node) -> "FlexArgs":
        a = list(n.args) + [None] * (9 - len(n.args))
        return cls(a[0], a[1], a[2], a[3], FlexBlockMask.parse(a[4]), a[5], a[6],
                   tuple(a[7] or ()), tuple(a[8] or ()))


def _flex_site(n: Node) -> AttentionSite:
    try:
        fa = FlexArgs.parse(n)
    except (IndexError, TypeError):
        q, k, v = (list(n.args) + [None] * 3)[:3]
        return AttentionSite(node=n, kind="flex", q=q, k=k, v=v, problem="could not read the flex_attention arguments")
    site = AttentionSite(node=n, kind="flex", q=fa.q, k=fa.k, v=fa.v, scale=fa.scale,
                         score_buffers=fa.score_buffers, mask_buffers=fa.mask_buffers, flex=fa)
    gm = n.graph.owning_module
    try:
        site.score_mod = getattr(gm, fa.score_mod.target)
        site.mask_mod = getattr(gm, fa.block_mask.mask_mod.target)
    except (AttributeError, TypeError):
        site.problem = "could not read the flex_attention score_mod / mask_mod subgraphs"
    return site


def find_sites(graph: Graph) -> list[AttentionSite]:
    """All attention sites of ``graph``, in graph order."""
    sites = []
    for n in graph.nodes:
        if is_sdpa(n):
            sites.append(_sdpa_site(n))
        elif is_flex(n):
            sites.append(_flex_site(n))
    return sites
