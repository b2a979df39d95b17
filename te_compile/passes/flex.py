"""flex_attention sites: decide (serve or keep + reason) and rewrite to the te_compile op.

A served flex call becomes

    in_i = te_compile.ops.bh_input(q, "<(b, h, captured)-only term i>", *captured)   # [B|1,H|1,1,1]
    out, lse = te_compile.attn_fwd(q, k, v, None, [in_0, ..., <BlockMask tensors>], spec)
    lse_log2 = lse * (1 / ln 2)          # the HOP's lse is in log2 units; ours is natural-log

with ``spec.score`` / ``spec.mask_mod`` the translated ScoreExprs. Kept, with a reason: anything
the translator cannot express, a captured tensor read at a q/kv-dependent index (a gather), a
captured tensor that needs a gradient, a used ``max_scores`` output, a BlockMask that
``create_block_mask(mask_mod)`` did not build (checked at compile time when the BlockMask is a
graph input, and again at run time per BlockMask).
"""

from __future__ import annotations

import dataclasses
import math
import numbers
import operator
from typing import Any, Optional

import torch
from torch.fx import GraphModule, Node

from .. import ir
from ..ops import bh_input, materialize_bias, materialize_mask
from ..spec import AttentionSpec
from .find import AttentionSite, example_value
from .grad import site_grads
from .score_mod import translate

#: block size flex uses for its own "no block_mask" mask (one block covering everything)
_EMPTY_BLOCK = 1 << 30
_INV_LN2 = 1.0 / math.log(2.0)


def _block_tuple(site: AttentionSite) -> tuple:
    return tuple(site.node.args[4])


def _real(n: Any) -> Optional[torch.Tensor]:
    """The real tensor behind a graph input (Dynamo keeps it while the backend runs)."""
    if not isinstance(n, Node) or n.op != "placeholder":
        return None
    ga = n.meta.get("grapharg")
    ex = getattr(ga, "example", None) if ga is not None else None
    return ex if isinstance(ex, torch.Tensor) and not isinstance(ex, torch._subclasses.FakeTensor) else None


def decide_flex(site: AttentionSite, target: str, checker) -> Any:
    """The Decision for a flex site (see the module docstring for what is served)."""
    from .rewrite import Decision, _keep as keep

    q, k, v = example_value(site.q), example_value(site.k), example_value(site.v)
    grads = site_grads(site)
    if q is None or k is None or v is None:
        return keep(site, "q/k/v have no example values in the graph", mask="mask_mod ?", grads=grads)
    dtype = q.dtype
    sb, mb = site.score_buffers, site.mask_buffers
    score_vals = [example_value(b) for b in sb]
    mask_vals = [example_value(b) for b in mb]
    if any(x is None for x in score_vals + mask_vals):
        return keep(site, "a score_mod/mask_mod captures a value that is not a tensor", mask="mask_mod ?", grads=grads)
    score = translate(site.score_mod, "score", dtype, score_vals)
    mask = translate(site.mask_mod, "mask", dtype, mask_vals, buf_offset=len(sb))
    mask_desc = f"mask_mod {mask}"
    kw = {"mask": mask_desc, "grads": grads}
    if isinstance(score, str):
        return keep(site, score, **kw)
    if isinstance(mask, str):
        return keep(site, mask, **kw)
    out = example_value(site.node)
    grad_on = out is None or bool(getattr(out, "requires_grad", False)) or grads.any
    bufs = list(sb) + list(mb)
    learned = {i for i, val in enumerate(score_vals + mask_vals) if val.requires_grad and grad_on}
    score, mask = ir.simplify(score), ir.simplify(mask)
    kw["mask"] = mask_desc = f"mask_mod {mask}"
    kw["score"] = "" if score == ir.Expr.leaf("score") else str(score)
    scale = site.scale
    lin = ir.linear_in_score(score) if isinstance(scale, numbers.Number) else None
    if lin is not None:
        # a * score + g: a goes into the softmax scale, so cuDNN needs no bprop for it (and, when g
        # is 0, no score_mod at all: native masks apply). `score * 0.5`, `1 - 0.1 * score`.
        scale = float(scale) * lin[0]
        score = ir.simplify(ir.add(ir.Expr.leaf("score"), lin[1]))
    if isinstance(scale, numbers.Number) and scale < 0:
        # cuDNN's softmax scale must be positive (a negative one gave inf at ragged lengths on the
        # H200: the padded -inf scores turn +inf): the sign moves into the score_mod, f(-s)
        scale = -float(scale)
        score = ir.simplify(ir.substitute(score, "score", ir.Expr("neg", (ir.Expr.leaf("score"),))))
    bias_term = None
    mask_gather = None
    # per-batch terms and compared (b, h) terms are not pointwise on cuDNN; the reference target makes the
    # same decisions, so CPU runs exercise the routes (bias, materialized mask) the GPU takes
    strict = True
    mask_why = ""
    try:
        ir.extract_bh_terms(mask, strict=strict)
    except ir.NotPointwise as e:
        mask_why = str(e)
        # a mask_mod that gathers at q/kv-dependent indices (document ids): it becomes a 0/-inf
        # bias computed by torch in the graph, with the BlockMask's semantics (materialize_mask)
        if ir.buffers_used(mask) & learned:
            return keep(site, "the mask_mod gathers from a captured tensor that requires grad", **kw)
        mask_gather, mask = mask, ir.Expr.const(True)
        why = _bias_too_big(q, k, mask_gather, "mask_mod (it gathers from captured tensors)")
        if why:
            return keep(site, why, **kw)
    try:
        if learned & ir.buffers_used(score):
            raise ir.NotPointwise("reads a captured tensor that requires grad")
        (score_x, mask_x), terms = ir.extract_bh_terms(score, mask, strict=strict)
    except ir.NotPointwise as e:
        # score_mod = f(score, ...) + g(b, h, q_idx, kv_idx, captured): f runs in cuDNN, g becomes
        # a bias computed by torch in the graph (autograd then carries dBias to the tables)
        # Only the terms that must be gathered go into the bias: the bias is in q's dtype (bf16), eager
        # computes the score_mod in fp32, and a large index term (slope * (kv - q) up to 300) rounded
        # to bf16 changes the softmax (fuzzer, H200); pointwise terms stay in fp32 inside cuDNN.
        def pointwise(t: ir.Expr) -> bool:
            if ir.buffers_used(t) & learned:
                return False
            try:
                ir.extract_bh_terms(t, strict=strict)
            except ir.NotPointwise:
                return False
            return True

        f, g = ir.split_additive(score, pointwise)
        if f is None or g is None or ir.buffers_used(f) & learned:
            return keep(site, f"score_mod/mask_mod {e}, and the score_mod is not score-independent-additive "
                              "(f(score) + g(indices, tables)), so it cannot become a bias", **kw)
        try:
            (score_x, mask_x), terms = ir.extract_bh_terms(f, mask, strict=strict)
        except ir.NotPointwise as e2:
            return keep(site, f"score_mod/mask_mod {e2}", **kw)
        bias_term = g
    for i in sorted(learned):
        if bias_term is None or i not in ir.buffers_used(bias_term) or i in ir.buffers_used(mask) or \
                (mask_gather is not None and i in ir.buffers_used(mask_gather)):
            name = bufs[i].name if isinstance(bufs[i], Node) else "?"
            return keep(site, f"captured tensor {name} requires grad: te_compile computes gradients for captured "
                              "tensors only in an additive score_mod term", **kw)
    needs_dbias = bias_term is not None and bool(learned & ir.buffers_used(bias_term))
    if bias_term is not None:
        why = _bias_too_big(q, k, bias_term)
        if why:
            return keep(site, why, **kw)
        kw["grads"] = grads = dataclasses.replace(grads, bias=needs_dbias)
    if ir.kind_of(mask_x) != "bool":
        return keep(site, f"mask_mod returns a {ir.kind_of(mask_x)}, not a bool", **kw)
    for user in site.node.users:
        if user.target is not operator.getitem or user.args[1] not in (0, 1):
            return keep(site, "the max_scores output (or the raw HOP result) is used; te_compile returns out and lse",
                        **kw)
    if not isinstance(scale, numbers.Number):
        return keep(site, "scale is not a constant", **kw)
    if target == "auto" and q.device.type != "cuda":
        return keep(site, f"inputs on {q.device.type}: target 'auto' rewrites CUDA sites only "
                          f"(target='reference' rewrites to the reference kernel)", **kw)
    if q.dim() != 4 or k.dim() != 4 or v.dim() != 4:
        return keep(site, "flex inputs must be 4-D", **kw)
    bm = _block_tuple(site)
    qb, kb = bm[-3], bm[-2]
    if not (isinstance(qb, int) and isinstance(kb, int)):
        return keep(site, "BlockMask block sizes are not constants", **kw)
    block, block_nodes, mask_block = "", [], None
    if mask_gather is not None:
        # the BlockMask goes into the materialized mask (its semantics exactly): nothing to check
        kvn, kvi, fkn, fki = bm[2], bm[3], bm[4], bm[5]
        empty = qb == _EMPTY_BLOCK and kb == _EMPTY_BLOCK
        mask_block = (qb, kb) + ((None,) * 4 if empty else (kvn, kvi, fkn, fki))
        density = None if empty else _block_density([kvn, kvi, fkn, fki], q, k, qb, kb)
        if density is None or density < MIN_GATHER_MASK_DENSITY:
            seen = "unknown at compile time" if density is None else f"{100 * density:.0f}% of the blocks"
            return keep(site, f"the mask_mod is not pointwise on cuDNN (document-style mask: it {mask_why}): "
                              f"te_compile would "
                              f"run it as a dense -inf bias and compute every block, Inductor's flex skips the "
                              f"masked blocks (attended: {seen}; te_compile serves it from "
                              f"{100 * MIN_GATHER_MASK_DENSITY:.0f}%, te_compile.passes.flex.MIN_GATHER_MASK_DENSITY)",
                        **kw)
    elif not (qb == _EMPTY_BLOCK and kb == _EMPTY_BLOCK):
        kvn, kvi, fkn, fki = bm[2], bm[3], bm[4], bm[5]
        if kvn is None or kvi is None:
            return keep(site, "the BlockMask has no kv block lists", **kw)
        has_full = fkn is not None and fki is not None
        block_nodes = [kvn, kvi] + ([fkn, fki] if has_full else [])
        block = f"{qb},{kb},{int(has_full)}"
        why = _compile_time_block_check(site, mask_x, terms, q, k, qb, kb, block_nodes, has_full)
        if why:
            return keep(site, f"the BlockMask was not built by create_block_mask from its mask_mod ({why}); "
                              "compiled flex honours its block structure", **kw)
    impl = "cudnn" if target == "auto" else "reference"
    if impl == "cudnn" and needs_dbias and score_x != ir.Expr.leaf("score") and not ir.derivative(score_x).is_const(1.0):
        # cuDNN's dBias with a score_mod whose derivative is not 1 is not flex's gradient of the
        # additive table (differential fuzzer, H200: softcap / rsqrt score_mods with a learned
        # rel-pos table gave dTable 0.9-1.0 off), or no backward engine is found at all
        return keep(site, "a learned additive table (dBias) together with a score_mod whose derivative is not 1: "
                          "cuDNN's dBias is not flex's table gradient there", **kw)
    spec = AttentionSpec(scale=float(scale), mask="none", impl=impl, source="flex",
                         score="" if score_x == ir.Expr.leaf("score") else str(score_x),
                         mask_mod="" if mask_x.is_const(True) else str(mask_x),
                         n_inputs=len(terms), block=block, empty_rows=mask_gather is not None)
    if impl == "cudnn" and checker is not None:
        bias_like = None
        if bias_term is not None or mask_gather is not None:
            per_batch = mask_gather is not None and "b" in mask_gather.leaves()
            bias_like = torch.empty((q.shape[0] if per_batch else 1, q.shape[1], q.shape[2], k.shape[2]),
                                    dtype=q.dtype, device="meta")
        why = checker(q, k, v, bias_like, spec, grads.any, needs_dbias)
        if why:
            return keep(site, why, **kw)
    d = Decision(site=site, rewrite=True, reason="", target=impl, spec=spec, **kw)
    d.plan = {"terms": [str(t) for t in terms], "buffers": bufs, "block_nodes": block_nodes,
              "bias_term": None if bias_term is None else str(bias_term),
              "mask_term": None if mask_gather is None else str(mask_gather), "mask_block": mask_block}
    if mask_gather is not None and not needs_dbias:
        d.grads = dataclasses.replace(d.grads, bias=False)
    return d


#: largest bias te_compile materializes for an additive score_mod term (bytes); larger keeps the node
MAX_BIAS_BYTES = 2 << 30

#: a mask_mod that gathers (document ids) runs as a dense -inf bias: cuDNN then computes every block,
#: while Inductor's flex skips the blocks the BlockMask leaves out. Measured on the H200 (2x16x4096x128,
#: document + causal, 14% of blocks attended): te_compile 0.79 / 2.33 ms vs Inductor 0.19 / 0.46. So
#: such sites are served only when at least this fraction of the blocks is attended (known at compile
#: time when the BlockMask is a graph input); cuDNN is ~1.4x faster than Inductor at full density.
MIN_GATHER_MASK_DENSITY = 0.6


def _block_density(nodes, q, k, qb: int, kb: int) -> Optional[float]:
    """Fraction of (q block, kv block) pairs the BlockMask attends (partial or full), or None."""
    kvn, kvi, fkn, fki = (_real(n) for n in nodes)
    if kvn is None:
        return None
    try:
        nq, nk = -(-int(q.shape[2]) // qb), -(-int(k.shape[2]) // kb)
        n = kvn.sum().item() + (fkn.sum().item() if fkn is not None else 0)
        return n / (kvn.shape[0] * kvn.shape[1] * nq * nk)
    except (TypeError, ValueError):
        return None


def _bias_too_big(q, k, g: ir.Expr, what: str = "additive score_mod term") -> Optional[str]:
    try:
        B = int(q.shape[0]) if "b" in g.leaves() else 1
        n = B * int(q.shape[1]) * int(q.shape[2]) * int(k.shape[2]) * q.element_size()
    except (TypeError, ValueError):
        return None  # symbolic sizes: not checked at compile time
    if n > MAX_BIAS_BYTES:
        return (f"the {what} would be materialized as a {n / 2**30:.1f} GiB bias "
                f"(limit te_compile.passes.flex.MAX_BIAS_BYTES = {MAX_BIAS_BYTES / 2**30:.0f} GiB)")
    return None


def _compile_time_block_check(site, mask_x, terms, q, k, qb, kb, block_nodes, has_full) -> Optional[str]:
    """When the BlockMask is a graph input, check it now with the real tensors Dynamo holds."""
    reals = [_real(n) for n in block_nodes]
    if terms or any(r is None for r in reals):
        return None  # checked at run time instead (the op checks each new BlockMask once)
    from ..blockmask import mismatch

    B, H, L, S = (int(x) for x in (q.shape[0], q.shape[1], q.shape[2], k.shape[2]))
    full = (reals[2], reals[3]) if has_full else (None, None)
    try:
        return mismatch(mask_x, [], B, H, L, S, qb, kb, reals[0], reals[1], *full, device=reals[0].device)
    except Exception:  # noqa: BLE001 - shapes we cannot check now are checked at run time
        return None


def apply_flex(gm: GraphModule, decision: Any) -> None:
    site, spec, plan = decision.site, decision.spec, decision.plan
    graph, n = gm.graph, site.node
    meta = {key: n.meta[key] for key in ("stack_trace", "nn_module_stack", "source_fn_stack") if key in n.meta}
    with graph.inserting_before(n):
        inputs = []
        for term in plan["terms"]:
            node = graph.call_function(bh_input, (site.q, term, *plan["buffers"]))
            node.meta.update(meta)
            inputs.append(node)
        bias = None
        if plan.get("bias_term"):
            bias = graph.call_function(materialize_bias, (site.q, site.k, plan["bias_term"], *plan["buffers"]))
            bias.meta.update(meta)
        if plan.get("mask_term"):
            mask = graph.call_function(materialize_mask, (site.q, site.k, plan["mask_term"], *plan["mask_block"],
                                                          *plan["buffers"]))
            mask.meta.update(meta)
            bias = mask if bias is None else graph.call_function(operator.add, (bias, mask))
        call = graph.call_function(torch.ops.te_compile.attn_fwd.default,
                                   (site.q, site.k, site.v, bias, inputs + plan["block_nodes"], spec.key()))
        call.meta.update(meta)
        out = graph.call_function(operator.getitem, (call, 0))
        lse = graph.call_function(operator.getitem, (call, 1))
        lse2 = graph.call_function(operator.mul, (lse, _INV_LN2))
    decision.replaced = {}
    for user in list(n.users):
        new = out if user.args[1] == 0 else lse2
        new.meta = dict(user.meta)
        user.replace_all_uses_with(new)
        graph.erase_node(user)
        decision.replaced[user] = new
    attrs = [a for a in (n.args[3], n.args[4][-1]) if isinstance(a, Node)]
    graph.erase_node(n)
    if not lse2.users:
        graph.erase_node(lse2)
        graph.erase_node(lse)
    for a in attrs:  # the score_mod / mask_mod subgraphs, now unused (no general DCE: see docs)
        if a.op == "get_attr" and not a.users:
            graph.erase_node(a)
    decision.replacement = call.name
