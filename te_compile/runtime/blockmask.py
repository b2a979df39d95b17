"""Is a flex BlockMask exactly what ``create_block_mask(mask_mod)`` builds?

te_compile applies a flex mask_mod element-wise (inside cuDNN or as built-in masks). Compiled
flex instead honours the BlockMask's block structure: blocks that are not listed are skipped,
"full" blocks skip mask_mod. Both agree exactly when the BlockMask was built by
``create_block_mask`` from the same mask_mod (missing = all masked, full = all kept, partial =
mixed; padding past the sequence end counts as masked). A hand-built BlockMask
(``from_kv_blocks``, edited indices, another mask_mod) can differ, so te_compile checks.

``mismatch(...)`` returns None when the structure matches, or a short description of the first
difference. ``checked(...)`` remembers a verified BlockMask by tensor identity and version, so
re-using one BlockMask costs a dictionary lookup per call.
"""

from __future__ import annotations

import collections
import functools
import logging
import threading
from typing import Optional, Sequence

import torch
from torch import Tensor

from ..score import ir


def listed_blocks(num: Tensor, idx: Tensor, nk: int) -> Tensor:
    """[..., nq] counts + [..., nq, nk_max] indices -> [..., nq, nk] bool."""
    valid = torch.arange(idx.shape[-1], device=idx.device) < num.unsqueeze(-1)
    target = torch.where(valid, idx.long(), torch.full_like(idx.long(), nk))
    out = torch.zeros(*idx.shape[:-1], nk + 1, dtype=torch.bool, device=idx.device)
    out.scatter_(-1, target.clamp(max=nk), True)
    return out[..., :nk]


def expected_blocks(mask: Tensor, L: int, S: int, qb: int, kb: int) -> tuple[Tensor, Tensor]:
    """(any, full) per (q block, kv block) of an element mask [B', H', L, S] (padding masked)."""
    nq, nk = -(-L // qb), -(-S // kb)
    pad_q, pad_k = nq * qb - L, nk * kb - S
    m = mask
    if pad_q or pad_k:
        m = torch.nn.functional.pad(m.to(torch.uint8), (0, pad_k, 0, pad_q)).bool()
    blocks = m.reshape(*m.shape[:-2], nq, qb, nk, kb)
    any_ = blocks.any(dim=-1).any(dim=-2)
    full = blocks.all(dim=-1).all(dim=-2)
    return any_, full


#: the most mask elements the check evaluates at once (query rows are taken a few blocks at a time beyond it)
CHUNK_ELEMENTS = 1 << 26


def element_blocks(mask_expr: ir.Expr, inputs: Sequence[Tensor], B: int, H: int, L: int, S: int, qb: int, kb: int,
                   device: torch.device) -> tuple[Tensor, Tensor]:
    """(any, full) per (q block, kv block) of ``mask_expr`` evaluated element by element, as create_block_mask
    classifies blocks; the query rows in chunks of whole blocks, so that no more than about ``CHUNK_ELEMENTS``
    elements are held at once (a [B, H, L, S] mask at long lengths would hold gigabytes)."""
    from ..reference import index_grids

    grids = {**index_grids(B, H, L, S, device), "inputs": list(inputs), "bufs": list(inputs)}
    parts, r0, rows = [], 0, qb  # one query block first: what it holds per row sizes the chunks after it
    while r0 < L:
        rows = min(rows, L - r0)
        grids["q_idx"] = torch.arange(r0, r0 + rows, dtype=torch.int32, device=device).view(1, 1, rows, 1)
        # a mask_mod that folds to a constant (``x | True``) evaluates to a CPU scalar: bring it to the blocks' device
        elem = ir.evaluate(mask_expr, grids).to(device=device, dtype=torch.bool)
        while elem.dim() < 4:
            elem = elem.unsqueeze(0)
        parts.append(expected_blocks(elem.expand(elem.shape[0], elem.shape[1], rows, S), rows, S, qb, kb))
        r0 += rows
        rows = max(1, CHUNK_ELEMENTS // (elem.shape[0] * elem.shape[1] * S * qb)) * qb
    if len(parts) == 1:
        return parts[0]
    lead = torch.broadcast_shapes(*(a.shape[:2] for a, _ in parts))  # a chunk may not depend on b or h where another does
    return tuple(torch.cat([p[i].expand(*lead, *p[i].shape[2:]) for p in parts], dim=-2) for i in range(2))


def mismatch(mask_expr: ir.Expr, inputs: Sequence[Tensor], B: int, H: int, L: int, S: int, qb: int, kb: int,
             kv_num: Tensor, kv_idx: Tensor, full_num: Optional[Tensor], full_idx: Optional[Tensor],
             device: torch.device, defer: bool = False):
    """None when the BlockMask's blocks are the ones ``create_block_mask(mask_expr)`` builds, else the first
    difference. ``defer``: the comparison is queued on the device and a ``_Flags`` returned (its ``result()`` is the
    answer) unless the answer needs no device work (a shape that differs)."""
    nq, nk = -(-L // qb), -(-S // kb)
    if kv_num.shape[-1] != nq:
        return f"the BlockMask has {kv_num.shape[-1]} query blocks, the call needs {nq}"
    any_, full = element_blocks(mask_expr, inputs, B, H, L, S, qb, kb, device)
    listed = listed_blocks(kv_num.to(device), kv_idx.to(device), nk)
    if full_num is not None and full_idx is not None:
        listed_full = listed_blocks(full_num.to(device), full_idx.to(device), nk)
        want_partial, want_full = any_ & ~full, full
    else:  # no separate full blocks: every non-empty block is listed once
        listed_full = torch.zeros_like(listed)
        want_partial, want_full = any_, torch.zeros_like(any_)
    try:
        shape = torch.broadcast_shapes(listed.shape, want_partial.shape)
    except RuntimeError:
        return f"BlockMask batch/head dims {tuple(listed.shape[:2])} do not broadcast to the mask's"
    differs = torch.stack([(listed.expand(shape) != want_partial.expand(shape)).any(),
                           (listed_full.expand(shape) != want_full.expand(shape)).any()])
    pending = _Flags(differs)
    return pending if defer else pending.result()


_DIFFER = ("its partial blocks differ from the ones create_block_mask(mask_mod) builds",
           "its full blocks differ from the ones create_block_mask(mask_mod) builds")


class _Flags:
    """The comparison's two flags (partial blocks differ, full blocks differ), computed on the blocks' device and
    copied to the host without waiting: ``result()`` waits for that copy alone (an event recorded after it), not
    for work the stream took on later."""

    __slots__ = ("host", "event")

    def __init__(self, differs: Tensor) -> None:
        self.event = None
        if differs.is_cuda:
            self.host = torch.empty(differs.shape, dtype=differs.dtype, pin_memory=True)
            self.host.copy_(differs, non_blocking=True)
            self.event = torch.cuda.Event()
            self.event.record()
        else:
            self.host = differs

    def result(self) -> Optional[str]:
        if self.event is not None:
            self.event.synchronize()
        partial, full = self.host.tolist()
        return _DIFFER[0] if partial else (_DIFFER[1] if full else None)


class _Verified:
    """BlockMasks already checked, keyed by what identifies their memory and content version.

    The compiled graph may hand the op fresh tensor objects (aliases) of the same BlockMask on
    every call, so the key is (data_ptr, shape, stride, version) per tensor, not the Python
    object: an in-place edit bumps the version and forces a new check. Bounded (oldest first).
    """

    def __init__(self, maxsize: int = 256) -> None:
        self._seen: "collections.OrderedDict[tuple, Optional[str]]" = collections.OrderedDict()
        self._lock = threading.Lock()
        self.maxsize = maxsize
        self.checks = 0

    def check(self, key_tensors: Sequence[Tensor], extra_key: tuple, run) -> Optional[str]:
        """The verdict, computed now (``run()``) unless known."""
        return self.begin(key_tensors, extra_key, run).finish()

    def begin(self, key_tensors: Sequence[Tensor], extra_key: tuple, run) -> "Check":
        """A check begun: the verdict if known, else ``run()`` (which may return ``_Flags``, the device work queued)
        to be read by ``Check.finish()``."""
        # data pointers are unique across devices in one process (CUDA unified addressing)
        key = tuple([(t.data_ptr(), t._version, t.shape, t.stride()) for t in key_tensors]) + extra_key
        if key in self._seen:
            return Check(self, None, self._seen[key])
        with self._lock:
            self.checks += 1
        return Check(self, key, run())

    def _store(self, key: tuple, why: Optional[str]) -> None:
        with self._lock:
            self._seen[key] = why
            while len(self._seen) > self.maxsize:
                self._seen.popitem(last=False)


class Check:
    """A check begun: ``finish()`` returns the verdict (None: the blocks match; else the first difference), waiting
    for the comparison's device work where ``begin`` queued it, and remembers it for the BlockMask."""

    __slots__ = ("_owner", "_key", "_answer")

    def __init__(self, owner: Optional[_Verified], key: Optional[tuple], answer) -> None:
        self._owner, self._key, self._answer = owner, key, answer

    def finish(self) -> Optional[str]:
        why = self._answer
        if isinstance(why, _Flags):
            why = self._answer = why.result()
        if self._key is not None:
            self._owner._store(self._key, why)
            self._key = None
        return why


verified = _Verified()


# --------------------------------------------------------------------------- the op's run-time check

_log = logging.getLogger("te_compile")
_capture_noted = False


def check_call(spec, q: Tensor, k: Tensor, inputs: list[Tensor], block: list[Tensor]) -> bool:
    """The op's check of the BlockMask it receives (once per BlockMask): raise rather than give an
    answer different from compiled flex's. True when the BlockMask was checked and matches, False when the
    check was skipped (CUDA graph capture)."""
    return begin_call(spec, q, k, inputs, block).finish()


class _Skipped:
    __slots__ = ()

    @staticmethod
    def finish() -> bool:
        return False


class _CallCheck:
    __slots__ = ("check",)

    def __init__(self, check: Check) -> None:
        self.check = check

    def finish(self) -> bool:
        why = self.check.finish()
        if why:
            raise RuntimeError(
                "te_compile: the BlockMask given to flex_attention was not built by create_block_mask from its "
                f"mask_mod ({why}). Compiled flex_attention honours the block structure, te_compile applies "
                "mask_mod element-wise, so it refuses to run rather than give a different answer. Build the mask "
                "with create_block_mask(mask_mod, ...), or compile this model without te_compile.")
        return True


@functools.lru_cache(maxsize=1024)
def key_indices(spec, n_extra: int) -> tuple[int, ...]:
    """Which of the op's ``extra`` tensors (the ``(in i)`` inputs, then the BlockMask's) decide the check's answer:
    the BlockMask's and the inputs its mask_mod reads. A score_mod's inputs do not: a graph may hand the op a fresh
    copy of one every call, or an optimizer may update it in place, and neither changes the blocks."""
    mask = spec.mask_expr()
    used = sorted(ir.refs_used(mask)) if mask is not None else []
    return tuple(range(spec.n_inputs, n_extra)) + tuple(used)


def begin_call(spec, q: Tensor, k: Tensor, inputs: list[Tensor], block: list[Tensor]):
    """``check_call`` in two halves: the check's device work is queued now, without waiting for it; the result's
    ``finish()`` waits for the answer alone and raises or returns as ``check_call`` does. An op that queues its
    attention between the halves waits once, not before its own work, and returns nothing before ``finish()``."""
    global _capture_noted
    if q.is_cuda and torch.cuda.is_current_stream_capturing():
        # CUDA graph capture (mode="reduce-overhead"): no checking work can run (it syncs); the
        # capture replays what the warm-up run, which did check this BlockMask, computed
        if not _capture_noted:
            _capture_noted = True
            _log.warning("te_compile: under CUDA graph capture the run-time BlockMask check is skipped; graph "
                         "replays do not re-check a different BlockMask passed later (the compile-time and "
                         "warm-up checks still apply). Build BlockMasks with create_block_mask.")
        return _Skipped()
    qb, kb, mask = spec.block_q, spec.block_kv, spec.mask_expr() or ir.Expr.const(True)
    kv_num, kv_idx = block[0], block[1]
    full_num, full_idx = (block[2], block[3]) if spec.block_full else (None, None)
    B, H, L, S = q.shape[0], q.shape[1], q.shape[2], k.shape[2]
    extra = inputs + block
    return _CallCheck(verified.begin(
        [extra[i] for i in key_indices(spec, len(extra))], (B, H, L, S, spec.mask_mod, qb, kb, spec.block_full),
        lambda: mismatch(mask, inputs, B, H, L, S, qb, kb, kv_num, kv_idx, full_num, full_idx, q.device,
                         defer=True)))
