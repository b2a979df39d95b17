"""The differential fuzzer's hand-edited BlockMask class (``kind="flex_edited"``).

A case builds ``create_block_mask(mask_mod)`` for a random mask_mod (causal, sliding window, prefix-LM, or one of
the fuzzer's random ones, document masks included) and edits one block of it: a full block dropped, added, moved or
made partial, a partial block dropped, added or made full (``EDITS``; which one and where follows from the case's
seed). Compiled flex honours the edited block structure (full blocks skip mask_mod, unlisted blocks are masked);
te_compile applies mask_mod element-wise unless it materializes the mask with the BlockMask's semantics. So the
edited BlockMask must be refused (kept at compile time, or a RuntimeError at run time for a graph compiled with the
unedited one) or served with flex's block semantics: equal to eager flex given a mask_mod that spells the edited
BlockMask's semantics out element-wise (eager flex itself ignores the block lists).

Each case runs twice: compiled with the edited BlockMask (the compile-time check), and compiled with the unedited
one, then called with the edited one (the run-time check). Outcomes as the fuzzer's (``pass``: served and equal,
``kept``: refused either way, ``wrong``, ``crash``, ``invalid``). The cases' seeds follow the peers'
(``EDIT_OFFSET``); one case per 20 random cases of a run.
"""

from __future__ import annotations

import random
import traceback
from typing import Any, Optional

import torch

#: the edited-BlockMask cases of a run at seed s have the case seeds s * SEED_STRIDE + EDIT_OFFSET + i
EDIT_OFFSET = 200_000
#: one edited-BlockMask case per this many random cases
PER_CASES = 20
EDITS = ("drop_full", "add_full", "move_full", "full_to_partial", "partial_to_full", "drop_partial", "add_partial")
REFUSED = "not built by create_block_mask"


def cases(n: int, base: int, device: str, fuzz) -> list:
    """The edited-BlockMask cases of a run of ``n`` random cases whose case seeds start at ``base`` (``fuzz``: the
    fuzzer's module, as it runs)."""
    return [make_case(base + EDIT_OFFSET + i, device, fuzz) for i in range(n // PER_CASES)]


def make_case(seed: int, device: str, fuzz):
    r = random.Random(seed * 7919 + 2)
    cuda = device == "cuda"
    H = r.choice((1, 2, 4)) if not cuda else r.choice((2, 4))
    c = fuzz.Case(seed=seed, kind="flex_edited", B=r.choice((1, 2)), H=H, HKV=H,
                  L=r.choice((24, 33, 40) if not cuda else (256, 300, 384)), D=8 if not cuda else 64)
    c.DV = c.D
    c.S = c.L if r.random() < 0.6 else r.choice((24, 33, 40) if not cuda else (256, 300, 384))
    c.block = r.choice((8, 16)) if not cuda else r.choice((64, 128))
    c.return_lse = c.lse_loss = r.random() < 0.5
    g = fuzz._Gen(r, c)
    k = r.randrange(5)
    if k == 0:
        body = "q_idx >= kv_idx"
    elif k == 1:
        body = f"(q_idx >= kv_idx) & (q_idx - kv_idx <= {r.randint(c.block, 3 * c.block)})"
    elif k == 2:
        body = f"(kv_idx < {r.randint(1, c.S - 1)}) | (q_idx >= kv_idx)"
    else:
        body = g.mask_body(2)
    c.mask = fuzz._source("mask", body)
    if r.random() < 0.5:
        c.score = fuzz._source("score", g.fexpr(1))
    c.captured = list(g.captured)
    return c


def _lists(num: torch.Tensor, idx: torch.Tensor, nk: int) -> torch.Tensor:
    """[B, H, nq, nk] bool (on the CPU): the blocks the lists name."""
    num, idx = num.cpu(), idx.long().cpu()
    valid = torch.arange(idx.shape[-1]) < num.unsqueeze(-1)
    out = torch.zeros(*idx.shape[:-1], nk + 1, dtype=torch.bool)
    out.scatter_(-1, torch.where(valid, idx, nk).clamp(max=nk), True)
    return out[..., :nk]


def _to_lists(blocks: torch.Tensor, device) -> tuple[torch.Tensor, torch.Tensor]:
    """[B, H, nq, nk] bool -> (num [B, H, nq] int32, idx [B, H, nq, nk] int32), listed blocks first."""
    nk = blocks.shape[-1]
    num = blocks.sum(-1).to(torch.int32)
    order = torch.argsort((~blocks).to(torch.int8) * nk + torch.arange(nk), dim=-1, stable=True)
    return num.to(device), order.to(torch.int32).to(device)


def edit(bm, seed: int) -> Optional[tuple[str, Any, torch.Tensor, torch.Tensor]]:
    """(what was edited, the edited BlockMask, its partial and full blocks [B, H, nq, nk]), or None when no edit
    has a block to act on."""
    from torch.nn.attention.flex_attention import BlockMask

    r = random.Random(seed * 7919 + 3)
    nk = -(-bm.seq_lengths[1] // bm.BLOCK_SIZE[1])
    part = _lists(bm.kv_num_blocks, bm.kv_indices, nk)
    full = _lists(bm.full_kv_num_blocks, bm.full_kv_indices, nk) if bm.full_kv_num_blocks is not None \
        else torch.zeros_like(part)
    unlisted = ~(part | full)
    for what in r.sample(EDITS, len(EDITS)):  # the first edit, in the seed's order, that has a block to act on
        source = {"drop_full": full, "move_full": full, "full_to_partial": full, "partial_to_full": part,
                  "drop_partial": part}.get(what, unlisted)
        spots = [s for s in source.nonzero().tolist() if what != "move_full" or unlisted[tuple(s[:3])].any()]
        if spots:
            break
    else:
        return None
    b, h, i, j = r.choice(spots)
    if what == "move_full":
        free = unlisted[b, h, i].nonzero().flatten().tolist()
        full[b, h, i, j] = False
        full[b, h, i, r.choice(free)] = True
    elif what in ("drop_full", "full_to_partial"):
        full[b, h, i, j] = False
        part[b, h, i, j] = what == "full_to_partial"
    elif what in ("drop_partial", "partial_to_full"):
        part[b, h, i, j] = False
        full[b, h, i, j] = what == "partial_to_full"
    else:
        (full if what == "add_full" else part)[b, h, i, j] = True
    dev = bm.kv_num_blocks.device
    new = BlockMask.from_kv_blocks(*_to_lists(part, dev), *_to_lists(full, dev), BLOCK_SIZE=bm.BLOCK_SIZE,
                                   mask_mod=bm.mask_mod, seq_lengths=bm.seq_lengths)
    return f"{what} at (b {b}, h {h}, q block {i}, kv block {j})", new, part, full


def _semantics(mask_mod, part: torch.Tensor, full: torch.Tensor, qb: int, kb: int, device):
    """The edited BlockMask's semantics as an element-wise mask_mod: full blocks kept, partial blocks where mask_mod
    keeps, unlisted blocks masked."""
    part, full = part.to(device), full.to(device)

    def mask(b, h, q_idx, kv_idx):
        at = (b, h, q_idx // qb, kv_idx // kb)
        return full[at] | (part[at] & mask_mod(b, h, q_idx, kv_idx))
    return mask


def _run(c, device: str, dtype: torch.dtype, fn, ns: dict, learned: list, qkv: list, bms: list) -> dict:
    """Call ``fn(q, k, v, bm)`` for each BlockMask of ``bms`` (the last call's result is returned) and differentiate
    a loss on out (and lse) by q, k, v and the learned captured tensors."""
    leaves = [t.detach().requires_grad_() for t in qkv]
    for bm in bms:
        out, lse = fn(*leaves, bm)
    g = torch.Generator().manual_seed(c.seed + 2)
    loss = (out.float() * torch.randn(out.shape, generator=g).to(out.device)).sum()
    if c.lse_loss:
        w = torch.randn(lse.shape, generator=g).to(lse.device)
        loss = loss + (torch.where(torch.isfinite(lse), lse, 0.0).float() * w).sum()
    grads = torch.autograd.grad(loss, leaves + learned, allow_unused=True)
    return {"out": out.detach(), "lse": lse.detach(), "grads": [None if x is None else x.detach() for x in grads]}


def _flex(c, ns: dict):
    from torch.nn.attention.flex_attention import flex_attention

    score_mod = ns.get("score_mod") if c.score else None

    def fn(q, k, v, bm):
        return flex_attention(q, k, v, score_mod=score_mod, block_mask=bm, return_lse=True)
    return fn


def compare(c, device: str, backend: Any, fuzz) -> tuple[str, str, list]:
    """(outcome, detail, decisions) of an edited-BlockMask case (module docstring); ``fuzz``: the fuzzer's module
    as it runs (``python -m tools.fuzz`` runs it as ``__main__``, with its options set there)."""
    from torch.nn.attention.flex_attention import BlockMask, create_block_mask

    from te_compile.report import record_reports

    fuzz.last_errors.clear()
    low, ref_dtype = fuzz._dtypes(c, device)
    torch._dynamo.reset()
    try:
        ns, learned, qkv = fuzz.build(c, device, ref_dtype, eager=True)
        good = create_block_mask(ns["mask_mod"], c.B, c.H, c.L, c.S, device=device, BLOCK_SIZE=c.block)
        edited = edit(good, c.seed)
        if edited is None:
            return "invalid", "the BlockMask has no block any edit acts on", []
        what, bad, part, full = edited
        qb, kb = good.BLOCK_SIZE
        spelled = BlockMask.from_kv_blocks(bad.kv_num_blocks, bad.kv_indices, bad.full_kv_num_blocks,
                                           bad.full_kv_indices, BLOCK_SIZE=bad.BLOCK_SIZE, seq_lengths=bad.seq_lengths,
                                           mask_mod=_semantics(ns["mask_mod"], part, full, qb, kb, device))
        want = _run(c, device, ref_dtype, _flex(c, ns), ns, learned, qkv, [spelled])
        elow = None
        if low == torch.bfloat16:
            ns_l, learned_l, qkv_l = fuzz.build(c, device, low, eager=True)
            elow = _run(c, device, low, _flex(c, ns_l), ns_l, learned_l, qkv_l, [spelled])
    except Exception as e:  # noqa: BLE001
        return "invalid", f"eager raised {type(e).__name__}: {str(e).splitlines()[0][:160]}", []
    results, decisions = [], []
    for phase, calls in (("compiled with the edited BlockMask", ["bad"]),
                         ("compiled with create_block_mask's, then called with the edited one", ["good", "bad"])):
        torch._dynamo.reset()
        ns, learned, qkv = fuzz.build(c, device, low)
        blocks = {"good": good, "bad": BlockMask.from_kv_blocks(
            bad.kv_num_blocks, bad.kv_indices, bad.full_kv_num_blocks, bad.full_kv_indices, BLOCK_SIZE=bad.BLOCK_SIZE,
            seq_lengths=bad.seq_lengths, mask_mod=good.mask_mod)}
        fn = torch.compile(_flex(c, ns), backend=backend)
        try:
            with record_reports() as reports:
                got = _run(c, device, low, fn, ns, learned, qkv, [blocks[x] for x in calls])
        except Exception as e:  # noqa: BLE001
            if isinstance(e, RuntimeError) and REFUSED in str(e):
                results.append(("kept", f"{phase} ({what}): refused at run time"))
                continue
            detail = "".join(traceback.format_exception_only(type(e), e)).strip()[:1500]
            results.append(("crash", f"{phase} ({what}): {detail}"))
            continue
        now = [d for rep in reports for d in rep.decisions]
        decisions += now
        if not any(d.rewrite for d in now):
            results.append(("kept", f"{phase} ({what}): kept ({'; '.join(d.reason for d in now)[:200]})"))
            continue
        results.append(_judge(c, low, got, want, elow, f"{phase} ({what})", fuzz))
    for outcome in ("wrong", "crash", "pass"):
        for o, detail in results:
            if o == outcome:
                return o, detail, decisions
    return "kept", "; ".join(d for _, d in results), decisions


def _judge(c, low: torch.dtype, got: dict, want: dict, elow: Optional[dict], phase: str, fuzz) -> tuple[str, str]:
    pairs = [("out", got["out"], want["out"]), ("lse", got["lse"], want["lse"])]
    pairs += [(f"grad{i}", a, b) for i, (a, b) in enumerate(zip(got["grads"], want["grads"]))]
    low_list = None if elow is None else [elow["out"], elow["lse"], *elow["grads"]]
    bad = []
    for i, (name, a, b) in enumerate(pairs):
        floor = 1.0 if low == torch.float64 or name.startswith("grad") and int(name[4:]) >= 3 else 1e-3
        e = fuzz._err(a, b, floor)
        tol = fuzz._tolerance(c, i, low_list, None, b, floor)
        fuzz.last_errors[name] = [float(f"{e:.4g}"), float(f"{tol:.4g}"), None, None]
        if low_list is not None and tol > fuzz.BF16_CAP:
            continue  # too ill-conditioned in bfloat16 to judge (the CPU run judges it in float64)
        if not e <= tol:
            bad.append(f"{name} err {e:.3g} > tol {tol:.3g}")
    return ("wrong", f"{phase}: served, not flex's answer for the edited BlockMask: {'; '.join(bad)}") if bad \
        else ("pass", f"{phase}: served with flex's block semantics")
