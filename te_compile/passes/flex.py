"""flex_attention sites: decide (serve or keep + reason) as named steps, and rewrite to the te_compile op.

A served flex call becomes

    in_i = te_compile.passes.inserted.bh_input(q, "<(b, h, captured)-only term i>", *captured)   # [B|1,H|1,1,1]
    out, lse = te_compile.attn_fwd(q, k, v, bias?, [in_0, ..., <BlockMask tensors>], spec)
    lse_log2 = lse * (1 / ln 2)          # the HOP's lse is in log2 units; ours is natural-log

with ``spec.score`` / ``spec.mask_mod`` the translated ScoreExprs. ``decide`` runs the steps in
order; each fills in the draft decision or raises ``Keep`` with a reason:

1. ``translate_mods``: score_mod / mask_mod subgraphs -> simplified ScoreExprs (te_compile.score.ir)
2. ``fold_scale``: ``a * score + g`` moves ``a`` into the softmax scale, a negative scale's sign
   into the score_mod
3. ``split_terms``: (b, h)-only terms become ``(in i)`` inputs; gathered additive terms a bias,
   a gathering mask_mod a materialized 0/-inf mask
4. ``check_bias_term``: captured tensors need a gradient only in the additive bias term (need_dbias)
5. ``check_call``: outputs used, mask kind, constant scale, device, rank
6. ``check_block_mask``: the BlockMask is what create_block_mask(mask_mod) builds (or is
   materialized with the mask)
7. ``check_dbias``: no cuDNN dBias with a score_mod whose derivative is not 1
8. ``build_spec``: the AttentionSpec and the cuDNN support check, and the ``FlexInserts``

Adding a flex feature means changing one step (and, for cuDNN, its emission in te_compile.cudnn).
"""

from __future__ import annotations

import dataclasses
import math
import numbers
import operator
from typing import Any, Optional

import torch
from torch.fx import GraphModule, Node

from .. import env
from ..lowering import alibi, intervals
from ..score import ir
from .inserted import bh_input, materialize_bias, materialize_mask
from ..reasons import (BLOCK_MASK, NEEDS_GRAD, NOT_EXACT, NOT_ON_CUDNN, SLOWER, SPARSE_MASK, TOO_LARGE,
                       UNSUPPORTED_ARGS, Reason, category)
from ..spec import AttentionSpec
from .decision import Checker, Decision, FlexInserts, Keep, copy_meta, cudnn_supports, impl_for, operands
from .find import AttentionSite, example_value
from .grad import site_grads
from .score_mod import translate

#: block size flex uses for its own "no block_mask" mask (one block covering everything)
_EMPTY_BLOCK = 1 << 30
_INV_LN2 = 1.0 / math.log(2.0)
_SCORE = ir.Expr.leaf("score")


def _real(n: Any) -> Optional[torch.Tensor]:
    """The real tensor behind a graph input (Dynamo keeps it while the backend runs)."""
    if not isinstance(n, Node) or n.op != "placeholder":
        return None
    ga = n.meta.get("grapharg")
    ex = getattr(ga, "example", None) if ga is not None else None
    return ex if isinstance(ex, torch.Tensor) and not isinstance(ex, torch._subclasses.FakeTensor) else None


@dataclasses.dataclass
class _Mods:
    """The translated mods and what they read."""

    score: ir.Expr
    mask: ir.Expr
    buffers: list  # captured tensor nodes, score_mod's then mask_mod's
    learned: set  # indices of captured tensors that need a gradient


@dataclasses.dataclass
class _Terms:
    """The mods split for cuDNN: pointwise parts, (b, h) inputs, gathered terms."""

    score: ir.Expr  # what cuDNN evaluates (reads (in i))
    mask: ir.Expr
    inputs: list  # (b, h)-only terms, the (in i)
    bias_term: Optional[ir.Expr] = None  # additive gathered score_mod term
    mask_gather: Optional[ir.Expr] = None  # a gathering mask_mod
    mask_why: str = ""  # why the mask_mod is not pointwise


def translate_mods(site: AttentionSite, q: torch.Tensor, d: Decision) -> _Mods:
    d.mask = "mask_mod ?"
    sb, mb = site.score_buffers, site.mask_buffers
    score_vals = [example_value(b) for b in sb]
    mask_vals = [example_value(b) for b in mb]
    if any(x is None for x in score_vals + mask_vals):
        raise Keep("a score_mod/mask_mod captures a value that is not a tensor", UNSUPPORTED_ARGS)
    score = translate(site.score_mod, "score", q.dtype, score_vals)
    mask = translate(site.mask_mod, "mask", q.dtype, mask_vals, buf_offset=len(sb))
    d.mask = f"mask_mod {mask}"
    if isinstance(score, str):  # translate's Reason: its category
        raise Keep(score, category(score))
    if isinstance(mask, str):
        raise Keep(mask, category(mask))
    out = example_value(site.node)
    grad_on = out is None or bool(getattr(out, "requires_grad", False)) or d.grads.any
    learned = {i for i, val in enumerate(score_vals + mask_vals) if val.requires_grad and grad_on}
    score, mask = ir.simplify(score), ir.simplify(mask)
    d.mask = f"mask_mod {mask}"
    d.score = "" if score == _SCORE else str(score)
    d.score_expr, d.mask_expr = (None if score == _SCORE else score), mask
    return _Mods(score, mask, list(sb) + list(mb), learned)


def fold_scale(scale: Any, score: ir.Expr) -> tuple[Any, ir.Expr]:
    """(scale, score_mod) with a linear factor of the score moved into the (positive) softmax scale."""
    lin = ir.linear_in_score(score) if isinstance(scale, numbers.Number) else None
    if lin is not None:
        # a * score + g: a goes into the softmax scale, so cuDNN needs no bprop for it (and, when g
        # is 0, no score_mod at all: built-in masks apply). `score * 0.5`, `1 - 0.1 * score`.
        scale = float(scale) * lin[0]
        score = ir.simplify(ir.add(_SCORE, lin[1]))
    if isinstance(scale, numbers.Number) and scale < 0:
        # cuDNN's softmax scale must be positive (a negative one gave inf at ragged lengths: the
        # padded -inf scores turn +inf): the sign moves into the score_mod, f(-s)
        scale = -float(scale)
        score = ir.simplify(ir.substitute(score, "score", ir.Expr("neg", (_SCORE,))))
    return scale, score


def _gathering_mask(mods: _Mods, q, k) -> tuple[ir.Expr, Optional[ir.Expr], str]:
    """(mask for cuDNN, the gathering mask_mod or None, why it gathers)."""
    try:
        ir.extract_bh_terms(mods.mask, strict=True)
    except ir.NotPointwise as e:
        # a mask_mod that gathers at q/kv-dependent indices (document ids): it becomes a 0/-inf
        # bias computed by torch in the graph, with the BlockMask's semantics (materialize_mask)
        if ir.buffers_used(mods.mask) & mods.learned:
            raise Keep("the mask_mod gathers from a captured tensor that requires grad", NEEDS_GRAD) from None
        why = _bias_too_big(q, k, mods.mask, "mask_mod (it gathers from captured tensors)")
        if why:
            raise Keep(why, TOO_LARGE) from None
        return ir.Expr.const(True), mods.mask, str(e)
    return mods.mask, None, ""


def split_terms(mods: _Mods, score: ir.Expr, q, k) -> _Terms:
    """Split the mods into what cuDNN evaluates pointwise, (b, h) inputs and gathered terms.

    Per-batch terms and compared (b, h) terms are not pointwise on cuDNN (strict); the reference
    target makes the same decisions, so CPU runs exercise the routes (bias, materialized mask) the GPU
    takes."""
    mask, mask_gather, mask_why = _gathering_mask(mods, q, k)
    if mask_gather is not None and ir.may_be_nan(score):
        # flex masks with where(mask, score_mod(s), -inf); the materialized mask is a -inf bias added after the
        # score_mod, and NaN + -inf is NaN (CPU fuzzer: log(score / -4) under a document mask, out inf)
        raise Keep("the mask_mod gathers, so it is added as a -inf bias after the score_mod, and the score_mod can be "
                   "NaN (log / sqrt of a value that may be negative, a division by the score) where flex's mask "
                   "would hide it", NOT_EXACT)
    try:
        if mods.learned & ir.buffers_used(score):
            raise ir.NotPointwise("reads a captured tensor that requires grad")
        (score_x, mask_x), inputs = ir.extract_bh_terms(score, mask, strict=True)
        return _Terms(score_x, mask_x, inputs, None, mask_gather, mask_why)
    except ir.NotPointwise as e:
        why = str(e)
    # score_mod = f(score, ...) + g(b, h, q_idx, kv_idx, captured): f runs in cuDNN, g becomes a bias
    # computed by torch in the graph (autograd then carries dBias to the tables). Only the terms that
    # must be gathered go into the bias: the bias is in q's dtype (bf16), eager computes the score_mod
    # in fp32, and a large index term (slope * (kv - q) up to 300) rounded to bf16 changes the softmax
    # (fuzzer); pointwise terms stay in fp32 inside cuDNN.
    def pointwise(t: ir.Expr) -> bool:
        if ir.buffers_used(t) & mods.learned:
            return False
        try:
            ir.extract_bh_terms(t, strict=True)
        except ir.NotPointwise:
            return False
        return True

    f, g = ir.split_additive(score, pointwise)
    if f is None or g is None or ir.buffers_used(f) & mods.learned:
        # a learned table outside an additive term: its gradient is what te_compile cannot compute
        raise Keep(f"score_mod/mask_mod {why}, and the score_mod is not score-independent-additive "
                   "(f(score) + g(indices, tables)), so it cannot become a bias",
                   NEEDS_GRAD if mods.learned & ir.buffers_used(score) else NOT_ON_CUDNN)
    try:
        (score_x, mask_x), inputs = ir.extract_bh_terms(f, mask, strict=True)
    except ir.NotPointwise as e2:
        raise Keep(f"score_mod/mask_mod {e2}", NOT_ON_CUDNN) from None
    return _Terms(score_x, mask_x, inputs, g, mask_gather, mask_why)


def check_bias_term(mods: _Mods, t: _Terms, d: Decision, q, k) -> bool:
    """Captured tensors may need a gradient only in the additive (bias) term, whose size is bounded;
    returns need_dbias (and records it in the decision's grads)."""
    for i in sorted(mods.learned):
        if t.bias_term is None or i not in ir.buffers_used(t.bias_term) or i in ir.buffers_used(t.mask) or \
                (t.mask_gather is not None and i in ir.buffers_used(t.mask_gather)):
            b = mods.buffers[i]
            name = b.name if isinstance(b, Node) else "?"
            raise Keep(f"captured tensor {name} requires grad: te_compile computes gradients for captured "
                       "tensors only in an additive score_mod term", NEEDS_GRAD)
    need_dbias = t.bias_term is not None and bool(mods.learned & ir.buffers_used(t.bias_term))
    if t.bias_term is not None:
        why = _bias_too_big(q, k, t.bias_term, itemsize=4 if wide_bias(t, need_dbias) else None)
        if why:
            raise Keep(why, TOO_LARGE)
    if t.bias_term is not None or t.mask_gather is not None:
        d.grads = dataclasses.replace(d.grads, bias=need_dbias)
    return need_dbias


def check_call(site: AttentionSite, t: _Terms, scale: Any, q, k, v) -> None:
    if ir.kind_of(t.mask) != "bool":
        raise Keep(f"mask_mod returns a {ir.kind_of(t.mask)}, not a bool", UNSUPPORTED_ARGS)
    for user in site.node.users:
        if user.target is not operator.getitem or user.args[1] not in (0, 1):
            raise Keep("the max_scores output (or the raw HOP result) is used; te_compile returns out and lse",
                       UNSUPPORTED_ARGS)
    if not isinstance(scale, numbers.Number):
        raise Keep("scale is not a constant", UNSUPPORTED_ARGS)


@dataclasses.dataclass
class _Blocks:
    """What the op and the inserted nodes take from the BlockMask."""

    q: int = 0  # spec.block_q / block_kv / block_full: the op checks the BlockMask (0: nothing to check)
    kv: int = 0
    full: bool = False
    nodes: list = dataclasses.field(default_factory=list)  # handed to the op
    mask_block: Optional[tuple] = None  # handed to materialize_mask


def check_block_mask(site: AttentionSite, t: _Terms, q, k) -> _Blocks:
    bm = site.flex.block_mask
    qb, kb = bm.q_block, bm.kv_block
    if not (isinstance(qb, int) and isinstance(kb, int)):
        raise Keep("BlockMask block sizes are not constants", BLOCK_MASK)
    empty = qb == _EMPTY_BLOCK and kb == _EMPTY_BLOCK
    kvn, kvi, fkn, fki = bm.kv_num_blocks, bm.kv_indices, bm.full_kv_num_blocks, bm.full_kv_indices
    if t.mask_gather is not None:
        # the BlockMask goes into the materialized mask (its semantics exactly): nothing to check
        mask_block = (qb, kb) + ((None,) * 4 if empty else (kvn, kvi, fkn, fki))
        density = None if empty else _block_density([kvn, kvi, fkn, fki], q, k, qb, kb)
        if density is None or density < MIN_GATHER_MASK_DENSITY:
            seen = "unknown at compile time" if density is None else f"{100 * density:.0f}% of the blocks"
            raise Keep(f"the mask_mod is not pointwise on cuDNN (document-style mask: it {t.mask_why}): "
                       f"te_compile would run it as a dense -inf bias and compute every block, Inductor's flex "
                       f"skips the masked blocks (attended: {seen}; te_compile serves it from "
                       f"{100 * MIN_GATHER_MASK_DENSITY:.0f}%, te_compile.passes.flex.MIN_GATHER_MASK_DENSITY)",
                       SPARSE_MASK)
        return _Blocks(mask_block=mask_block)
    if empty:
        return _Blocks()
    if kvn is None or kvi is None:
        raise Keep("the BlockMask has no kv block lists", BLOCK_MASK)
    has_full = fkn is not None and fki is not None
    blocks = _Blocks(qb, kb, has_full, [kvn, kvi] + ([fkn, fki] if has_full else []))
    why = _compile_time_block_check(t.mask, t.inputs, q, k, blocks)
    if why:
        raise Keep(f"the BlockMask was not built by create_block_mask from its mask_mod ({why}); "
                   "compiled flex honours its block structure", BLOCK_MASK)
    return blocks


def check_dbias(impl: str, t: _Terms, need_dbias: bool) -> None:
    if impl == "cudnn" and need_dbias and t.score != _SCORE and not ir.derivative(t.score).is_const(1.0):
        # cuDNN's dBias with a score_mod whose derivative is not 1 is not flex's gradient of the
        # additive table (differential fuzzer: softcap / rsqrt score_mods with a learned
        # rel-pos table gave dTable 0.9-1.0 off), or no backward engine is found at all
        raise Keep("a learned additive table (dBias) together with a score_mod whose derivative is not 1: "
                   "cuDNN's dBias is not flex's table gradient there", NOT_EXACT)


def build_spec(impl: str, scale: float, t: _Terms, blocks: _Blocks, heads: object = None) -> AttentionSpec:
    plain = t.bias_term is None and t.mask_gather is None
    return AttentionSpec(scale=float(scale), mask="none", impl=impl, source="flex",
                         score="" if t.score == _SCORE else str(t.score),
                         mask_mod="" if t.mask.is_const(True) else str(t.mask),
                         n_inputs=len(t.inputs), block_q=blocks.q, block_kv=blocks.kv, block_full=blocks.full,
                         empty_rows=t.mask_gather is not None,
                         alibi_heads=alibi.heads_for(t.score, t.mask, t.inputs, heads) if plain else 0)


def wide_bias(t: _Terms, need_dbias: bool) -> bool:
    """Whether the gathered bias term is materialized in float32 (``materialize_bias``): a learned table (its
    gradient), or a site whose mask hides keys. ``materialize_bias`` shifts each row by its largest entry over all
    keys; where that entry is a hidden key, the visible entries sit far below it, and bf16 rounds them in steps
    that move the softmax (``score + T[kv_idx]`` under causal: out 7x eager bf16's error)."""
    return t.bias_term is not None and (need_dbias or t.mask_gather is not None or not t.mask.is_const(True))


def _bias_like(t: _Terms, q, k, need_dbias: bool) -> Optional[torch.Tensor]:
    """A meta tensor shaped like the bias the op will get (for the cuDNN support check): float32 where
    ``wide_bias``."""
    if t.bias_term is None and t.mask_gather is None:
        return None
    per_batch = t.mask_gather is not None and "b" in t.mask_gather.leaves()
    return torch.empty((q.shape[0] if per_batch else 1, q.shape[1], q.shape[2], k.shape[2]),
                       dtype=torch.float32 if wide_bias(t, need_dbias) else q.dtype, device="meta")


def decide(site: AttentionSite, target: str, checker: Optional[Checker], d: Decision) -> Decision:
    """Fill ``d`` for a flex site by running the steps (module docstring); raises Keep."""
    d.mask = "mask_mod ?"
    d.grads = site_grads(site)
    q, k, v = operands(site)
    mods = translate_mods(site, q, d)
    scale, score = fold_scale(site.scale, mods.score)
    refused: list[Keep] = []
    served = interval_path(site, mods, score, scale, target, checker, d, q, k, v, refused)
    if served is not None:
        return served
    try:
        return graph_path(site, mods, score, scale, target, checker, d, q, k, v)
    except Keep as kept:
        raise with_intervals(kept, refused) from None


def with_intervals(kept: Keep, refused: list[Keep]) -> Keep:
    """The graph path's ``kept``, told what cuDNN's interval kernels said of a site whose mask they take (``refused``):
    kept there for speed, that reason (serve="always" runs it there); unable to run it, both reasons."""
    if not refused:
        return kept
    r = refused[0].reason
    if r.category == SLOWER:
        return refused[0]
    text = r if str(r).startswith("cuDNN's interval kernels") else f"cuDNN's interval kernels: {r}"
    kept.reason = Reason(f"{kept.reason}; {text}", kept.reason.category, kept.reason.short)
    return kept


def graph_path(site: AttentionSite, mods: _Mods, score: ir.Expr, scale: Any, target: str,
               checker: Optional[Checker], d: Decision, q, k, v) -> Decision:
    """Serve the site as a cuDNN SDPA graph (its score_mod and mask_mod as pointwise ops); raises Keep."""
    t = split_terms(mods, score, q, k)
    need_dbias = check_bias_term(mods, t, d, q, k)
    check_call(site, t, scale, q, k, v)
    impl = impl_for(target, q)
    if q.dim() != 4 or k.dim() != 4 or v.dim() != 4:
        raise Keep("flex inputs must be 4-D", NOT_ON_CUDNN)
    blocks = check_block_mask(site, t, q, k)
    check_dbias(impl, t, need_dbias)
    spec = build_spec(impl, scale, t, blocks, q.shape[1])
    cudnn_supports(checker, q, k, v, _bias_like(t, q, k, need_dbias), spec, d.grads.any, need_dbias)
    d.inserts = FlexInserts(terms=[str(x) for x in t.inputs], buffers=mods.buffers, block_nodes=blocks.nodes,
                      bias_term=None if t.bias_term is None else str(t.bias_term),
                      mask_term=None if t.mask_gather is None else str(t.mask_gather), mask_block=blocks.mask_block,
                      bias_float32=wide_bias(t, need_dbias))
    return d.serve(spec)


def interval_path(site: AttentionSite, mods: _Mods, score: ir.Expr, scale: Any, target: str,
                  checker: Optional[Checker], d: Decision, q, k, v, refused: list) -> Optional[Decision]:
    """Serve the site on cuDNN's interval-mask kernels (te_compile.lowering.intervals) when its mask_mod is a union of key
    intervals that the graph SDPA cannot skip tiles for (documents, prefix-LM, sink + local; a built-in band stays on
    the graph path), with no score_mod; None to go on with the graph path (which may keep the site). A support or
    speed check that refuses a site the path takes appends its Keep to ``refused``."""
    if env.value("TE_COMPILE_INTERVALS") == "0":  # read at compile time
        return None
    mask = mods.mask
    if score != _SCORE or mask.is_const(True) or mods.learned or not isinstance(scale, numbers.Number):
        return None
    try:
        intervals.shape(mask)
    except intervals.NoIntervals:
        return None
    if not ir.buffers_used(mask) and _builtin_band(mask):
        return None
    bufs = [example_value(b) for b in mods.buffers]
    if any(getattr(b, "device", None) != q.device for b in bufs) or q.dim() != 4:
        return None
    impl = impl_for(target, q)
    try:
        check_call(site, _Terms(_SCORE, mask, []), scale, q, k, v)
        blocks = check_block_mask(site, _Terms(_SCORE, mask, list(bufs)), q, k)
        spec = AttentionSpec(scale=float(scale), mask="none", impl=impl, source="flex", mask_mod=str(mask),
                             n_inputs=len(bufs), block_q=blocks.q, block_kv=blocks.kv, block_full=blocks.full,
                             intervals=True)
    except Keep:
        return None  # the graph path decides (and says why it keeps the site, if it does)
    try:
        cudnn_supports(checker, q, k, v, None, spec, d.grads.any, False)
    except Keep as kept:
        refused.append(kept)  # the graph path decides; a keep there names this refusal too (with_intervals)
        return None
    d.inserts = FlexInserts(terms=[], buffers=mods.buffers, block_nodes=blocks.nodes, pass_buffers=True)
    d.note = "on cuDNN's interval kernels (cudnn.flex_attention)" if impl == "cudnn" else "key intervals"
    return d.serve(spec)


def _builtin_band(mask: ir.Expr) -> bool:
    """The mask is a band the graph SDPA serves natively (causal, sliding windows): it skips those tiles itself."""
    from ..lowering.lower import diagonal_bounds

    return diagonal_bounds(mask) != (None, None)


#: largest bias te_compile materializes for an additive score_mod term (bytes); larger keeps the node
MAX_BIAS_BYTES = 2 << 30

#: a mask_mod that gathers (document ids) runs as a dense -inf bias: cuDNN then computes every block,
#: while Inductor's flex skips the blocks the BlockMask leaves out. Measured at 2x16x4096x128
#: (document + causal, 14% of blocks attended): several times slower than Inductor (docs/benchmarks.md). So
#: such sites are served only when at least this fraction of the blocks is attended (known at compile
#: time when the BlockMask is a graph input); at full density cuDNN is the faster one.
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


def _bias_too_big(q, k, g: ir.Expr, what: str = "additive score_mod term", itemsize: Optional[int] = None
                  ) -> Optional[str]:
    try:
        B = int(q.shape[0]) if "b" in g.leaves() else 1
        n = B * int(q.shape[1]) * int(q.shape[2]) * int(k.shape[2]) * (itemsize or q.element_size())
    except (TypeError, ValueError):
        return None  # symbolic sizes: not checked at compile time
    if n > MAX_BIAS_BYTES:
        return (f"the {what} would be materialized as a {n / 2**30:.1f} GiB bias "
                f"(limit te_compile.passes.flex.MAX_BIAS_BYTES = {MAX_BIAS_BYTES / 2**30:.0f} GiB)")
    return None


def _compile_time_block_check(mask: ir.Expr, inputs: list, q, k, blocks: "_Blocks") -> Optional[str]:
    """When the BlockMask is a graph input, check it now with the real tensors Dynamo holds."""
    reals = [_real(n) for n in blocks.nodes]
    if inputs or any(r is None for r in reals):
        return None  # checked at run time instead (the op checks each new BlockMask once)
    from ..runtime.blockmask import mismatch

    B, H, L, S = (int(x) for x in (q.shape[0], q.shape[1], q.shape[2], k.shape[2]))
    full = (reals[2], reals[3]) if blocks.full else (None, None)
    try:
        return mismatch(mask, [], B, H, L, S, blocks.q, blocks.kv, reals[0], reals[1], *full,
                        device=reals[0].device)
    except Exception:  # noqa: BLE001 - shapes we cannot check now are checked at run time
        return None


def apply(gm: GraphModule, d: Decision) -> None:
    """Replace the flex HOP by the te_compile op and the inserted helpers ``d.inserts`` names."""
    site, spec, ins = d.site, d.spec, d.inserts
    assert spec is not None and ins is not None
    graph, n = gm.graph, site.node
    meta = copy_meta(n)
    with graph.inserting_before(n):
        inputs = [graph.call_function(bh_input, (site.q, term, *ins.buffers)) for term in ins.terms]
        made = list(inputs)  # the nodes that carry the site's source line
        if ins.pass_buffers:
            inputs = list(ins.buffers)
        bias = shift = None
        if ins.bias_term:  # the bias, each row shifted by its top (materialize_bias says why), and the shifts
            both = graph.call_function(materialize_bias, (site.q, site.k, ins.bias_term, *ins.buffers),
                                       {"float32": True} if ins.bias_float32 else {})
            bias = graph.call_function(operator.getitem, (both, 0))
            shift = graph.call_function(operator.getitem, (both, 1))
            made += [both, bias, shift]
        if ins.mask_term:
            mask = graph.call_function(materialize_mask, (site.q, site.k, ins.mask_term, *ins.mask_block,
                                                          *ins.buffers))
            made.append(mask)
            bias = mask if bias is None else graph.call_function(operator.add, (bias, mask))
        call = graph.call_function(torch.ops.te_compile.attn_fwd.default,
                                   (site.q, site.k, site.v, bias, inputs + ins.block_nodes, spec.key()))
        for node in (*made, call):
            node.meta.update(meta)
        out = graph.call_function(operator.getitem, (call, 0))
        lse = graph.call_function(operator.getitem, (call, 1))
        if shift is not None:
            lse = graph.call_function(operator.add, (lse, shift))
        lse2 = graph.call_function(operator.mul, (lse, _INV_LN2))
    _replace_outputs(graph, d, n, out, lse, lse2)
    d.replacement = call.name


def _replace_outputs(graph: Any, d: Decision, n: Node, out: Node, lse: Node, lse2: Node) -> None:
    """Point the HOP's getitem users at the op's outputs; erase the HOP and what only it used."""
    d.replaced = {}
    for user in list(n.users):
        new = out if user.args[1] == 0 else lse2
        new.meta = dict(user.meta)
        user.replace_all_uses_with(new)
        graph.erase_node(user)
        d.replaced[user] = new
    attrs = [a for a in (d.site.flex.score_mod, d.site.flex.block_mask.mask_mod) if isinstance(a, Node)]
    graph.erase_node(n)
    if not lse2.users:
        graph.erase_node(lse2)
        parts = list(lse.args) if lse.target is operator.add else []  # lse + the bias rows' shift
        graph.erase_node(lse)
        for p in parts:
            if isinstance(p, Node) and not p.users:
                graph.erase_node(p)
    for a in attrs:  # the score_mod / mask_mod subgraphs, now unused (no general DCE: see docs)
        if a.op == "get_attr" and not a.users:
            graph.erase_node(a)
