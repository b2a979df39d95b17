"""Decide, per attention site, rewrite or keep (with a reason); then rewrite the graph.

Each site kind registers its ``(decide, apply)`` pair in ``SITE_KINDS`` (te_compile.passes.sdpa,
te_compile.passes.flex). ``decide`` fills a ``Decision`` draft or raises ``Keep``; the one place
``Keep`` is caught is ``decide`` here. This module never imports cuDNN: the support check is
passed in as ``checker``.
"""

from __future__ import annotations

import dataclasses
from typing import Callable, Optional

from torch.fx import GraphModule, Node

from ..reasons import INTERNAL_ERROR, UNSUPPORTED_ARGS, Reason
from . import flex, sdpa
from .decision import TARGETS, Checker, Decision, Keep
from .find import AttentionSite, find_sites

Decide = Callable[[AttentionSite, str, Optional[Checker], Decision], Decision]
Apply = Callable[[GraphModule, Decision], None]

#: site kind -> (decide, apply)
SITE_KINDS: dict[str, tuple[Decide, Apply]] = {
    "sdpa": (sdpa.decide, sdpa.apply),
    "flex": (flex.decide, flex.apply),
}


def decide(site: AttentionSite, target: str = "auto", checker: Optional[Checker] = None) -> Decision:
    """Rewrite or keep ``site``; a malformed site, or a te_compile bug, keeps it with a reason."""
    if target not in TARGETS:
        raise ValueError(f"unknown target {target!r}; expected one of {TARGETS}")
    d = Decision(site=site, mask="mask_mod" if site.kind == "flex" else sdpa.describe_mask(site))
    if site.problem:
        return d.keep(Reason(site.problem, UNSUPPORTED_ARGS))
    try:
        return SITE_KINDS[site.kind][0](site, target, checker, d)
    except Keep as k:
        return d.keep(k.reason)
    except Exception as e:  # noqa: BLE001 - a te_compile bug must never break the user's model
        return d.keep(Reason(f"te_compile internal error while deciding ({type(e).__name__}: {e}); please report it",
                             INTERNAL_ERROR))


def apply(gm: GraphModule, d: Decision) -> None:
    """Replace the site's node by the te_compile op (only for ``d.rewrite``)."""
    if d.rewrite:
        SITE_KINDS[d.site.kind][1](gm, d)


def _sub(x, replaced: dict):
    if isinstance(x, Node):
        while x in replaced:
            x = replaced[x]
        return x
    if isinstance(x, (list, tuple)):
        return type(x)(_sub(y, replaced) for y in x)
    return x


def _remap(d: Decision, replaced: dict) -> None:
    """Point ``d``'s site and inserts at the nodes that replaced the ones they name."""
    if not replaced:
        return
    site = d.site
    for f in ("q", "k", "v", "attn_mask", "score_buffers", "mask_buffers"):
        setattr(site, f, _sub(getattr(site, f), replaced))
    if d.inserts:
        for f in ("buffers", "block_nodes", "mask_block"):
            setattr(d.inserts, f, _sub(getattr(d.inserts, f), replaced))


def rewrite_graph(gm: GraphModule, target: str = "auto", checker: Optional[Checker] = None,
                  verify: bool = False) -> list[Decision]:
    """Decide and apply for every site of ``gm``; returns the decisions in graph order.

    ``verify`` marks every rewritten site's spec so the op compares cuDNN with the reference on
    the first call of each configuration (te_compile.runtime.verify)."""
    decisions = [decide(site, target, checker) for site in find_sites(gm.graph)]
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
