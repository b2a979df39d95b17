"""A flex mask_mod as a per-row union of key intervals: the mask cuDNN's interval-mask kernels take.

``cudnn.flex_attention`` (cuDNN frontend 1.32, SM90 / SM100 / SM103) reads a mask as int32 endpoints
``[Hmask, nfunc, total_q]``: query row ``q`` sees the keys ``[0, F0) U [F1, F2) U ...`` (``nfunc`` odd, the
endpoints nondecreasing within ``[0, S]``). Causal, sliding windows, prefix-LM, sink + local, packed documents
and padding masks are all such unions.

``shape(mask)`` decides at compile time, from the mask_mod's ScoreExpr alone, whether te_compile can derive the
endpoints exactly, and how many intervals a row needs at most (or None, with ``why``); ``endpoints(mask, B, L, S,
bufs)`` computes them with ordinary torch ops on the buffers' device, with no host synchronisation.

Exact by construction. Every sub-expression becomes a list of disjoint, sorted intervals per query row:

* a comparison linear in ``kv_idx`` (coefficient +-1; the other side any integer expression of ``q_idx``, ``b`` and
  captured tensors, so ``kv_idx < lens[b]`` is one too) is one interval, ``!=`` two;
* a comparison without ``kv_idx`` keeps the whole row or none of it;
* ``ids[..., q_idx] == ids[..., kv_idx]`` (document ids) is the run of equal ids around ``kv_idx = q_idx``: exact
  only when each id occupies one contiguous run of its row, which ``endpoints`` reports as a per-row flag
  (``valid``) for the caller to check, never assumes;
* ``&`` intersects, ``|`` unites, ``~`` complements (the list is re-sorted and swept so it stays disjoint).

A mask_mod that reads the head index, or anything else, has no derivation here: the caller keeps the site.
"""

from __future__ import annotations

import dataclasses
from typing import Optional, Sequence

import torch
from torch import Tensor

from ..score import ir
from ..score.expr import Expr

#: the most intervals per row te_compile derives (nfunc <= 2 * MAX_INTERVALS + 1)
MAX_INTERVALS = 4


@dataclasses.dataclass(frozen=True)
class Shape:
    """What a mask_mod needs at most: ``intervals`` per row, ``zero_start`` when the first one always starts at key 0
    (so it takes the ``[0, F0)`` slot), and whether any row's answer rests on document ids being runs."""

    intervals: int
    zero_start: bool
    runs: bool

    @property
    def nfunc(self) -> int:
        return 2 * self.intervals - 1 if self.zero_start else 2 * self.intervals + 1


class NoIntervals(ValueError):
    """The mask_mod is not a union of key intervals te_compile can derive."""


# --------------------------------------------------------------------------- compile time: the shape alone

def shape(mask: Expr) -> Shape:
    """The interval count of ``mask`` (raises NoIntervals with the reason)."""
    s = _shape(mask)
    if s.intervals > MAX_INTERVALS:
        raise NoIntervals(f"a row may need {s.intervals} key intervals (at most {MAX_INTERVALS} are derived)")
    return s


def _shape(e: Expr) -> Shape:
    if e.op == "const" and e.dtype == "bool":
        return Shape(1, True, False)
    if e.op in ("and", "or"):
        a, b = _shape(e.args[0]), _shape(e.args[1])
        if e.op == "and":
            return Shape(a.intervals * b.intervals, a.zero_start and b.zero_start, a.runs or b.runs)
        # two intervals that both start at key 0 unite into one
        both = a.zero_start and b.zero_start
        return Shape(a.intervals + b.intervals - both, a.zero_start or b.zero_start, a.runs or b.runs)
    if e.op == "not":
        a = _shape(e.args[0])
        return Shape(a.intervals + 1, True, a.runs)
    if e.op in ir.COMPARISONS:
        if "h" in e.leaves():
            raise NoIntervals("the mask_mod reads the head index")
        if _runs_atom(e) is not None:
            if e.op == "eq":
                return Shape(1, False, True)
            return Shape(2, True, True)
        lin = _compare(e)
        if lin is None:
            raise NoIntervals(f"{e} is not linear in kv_idx with a coefficient of +-1")
        coef, _ = lin
        if coef == 0:
            return Shape(1, True, False)
        zero = e.op == "ne" or (e.op in ("lt", "le") and coef > 0) or (e.op in ("gt", "ge") and coef < 0)
        return Shape(2 if e.op == "ne" else 1, zero, False)
    raise NoIntervals(f"the mask_mod uses {e.op!r}")


def _kv_linear(e: Expr) -> Optional[tuple[int, Optional[Expr]]]:
    """e as ``coef * kv_idx + rest`` with rest free of kv_idx (None: rest is 0), or None."""
    if e.op == "kv_idx":
        return 1, None
    if "kv_idx" not in e.leaves():
        return 0, e
    if e.op in ("add", "sub"):
        a, b = _kv_linear(e.args[0]), _kv_linear(e.args[1])
        if a is None or b is None:
            return None
        s = 1 if e.op == "add" else -1
        rest = a[1] if b[1] is None else (Expr(e.op, (a[1], b[1])) if a[1] is not None else
                                          (b[1] if s > 0 else Expr("neg", (b[1],))))
        return a[0] + s * b[0], rest
    if e.op == "neg":
        a = _kv_linear(e.args[0])
        return None if a is None else (-a[0], None if a[1] is None else Expr("neg", (a[1],)))
    return None


def _compare(e: Expr) -> Optional[tuple[int, Optional[Expr]]]:
    """A comparison ``x cmp y`` as ``coef * kv_idx cmp t`` (coef in -1, 0, 1; t free of kv_idx), or None."""
    x, y = _kv_linear(e.args[0]), _kv_linear(e.args[1])
    if x is None or y is None:
        return None
    coef = x[0] - y[0]
    if abs(coef) > 1:
        return None
    # coef * kv  cmp  y_rest - x_rest
    if x[1] is None and y[1] is None:
        t = Expr.const(0)
    elif x[1] is None:
        t = y[1]
    elif y[1] is None:
        t = Expr("neg", (x[1],))
    else:
        t = Expr("sub", (y[1], x[1]))
    return coef, t


def _offset(e: Expr, var: str) -> Optional[tuple[Expr]]:
    """``var``, ``var + c``, ``c + var`` or ``var - c`` with ``c`` free of q_idx, kv_idx and h: (c or None,), or None."""
    def free(x: Expr) -> bool:
        return not ({"q_idx", "kv_idx", "h"} & set(x.leaves()))
    if e.op == var:
        return (None,)
    if e.op == "add" and len(e.args) == 2:
        x, y = e.args
        if x.op == var and free(y):
            return (y,)
        if y.op == var and free(x):
            return (x,)
    if e.op == "sub" and len(e.args) == 2 and e.args[0].op == var and free(e.args[1]):
        return (Expr("neg", (e.args[1],)),)
    return None


def _runs_atom(e: Expr) -> Optional[tuple[Expr, int, Optional[Expr], Optional[Expr]]]:
    """``(index (buf i) ... q_idx + c1 ...) ==/!= (index (buf i) ... kv_idx + c2 ...)``: (the buffer's index expression
    with kv_idx, the position of the sequence index, c1, c2), or None. Both sides read the same buffer at the same
    indices but for one, where one side has q_idx and the other kv_idx (either order), each plus an offset free of
    q_idx and kv_idx (None: no offset; Hugging Face adds the cache position to q_idx)."""
    if e.op not in ("eq", "ne"):
        return None
    a, b = e.args
    if a.op != "index" or b.op != "index" or a.args[0] != b.args[0] or len(a.args) != len(b.args):
        return None
    diff = [i for i, (x, y) in enumerate(zip(a.args[1:], b.args[1:])) if x != y]
    if len(diff) != 1:
        return None
    i = diff[0]
    x, y = a.args[1 + i], b.args[1 + i]
    if _offset(x, "kv_idx") is not None and _offset(y, "q_idx") is not None:
        x, y, a, b = y, x, b, a
    qo, ko = _offset(x, "q_idx"), _offset(y, "kv_idx")
    if qo is None or ko is None:
        return None
    if any("q_idx" in z.leaves() or "kv_idx" in z.leaves() or "h" in z.leaves()
           for j, z in enumerate(a.args[1:]) if j != i):
        return None
    return b, i, qo[0], ko[0]


# --------------------------------------------------------------------------- run time: the endpoints

@dataclasses.dataclass
class Endpoints:
    """``funcs``: int32 [1, nfunc, B * L] (rows in (b, q) order); ``valid``: a bool tensor per batch row (or a
    0-dim one) that is True where the derivation holds (document ids form runs). Both stay on the device."""

    funcs: Tensor
    valid: Tensor


def endpoints(mask: Expr, B: int, L: int, S: int, bufs: Sequence[Tensor], device: torch.device) -> Endpoints:
    """The endpoints of ``mask`` for every (b, q) row (``shape(mask)`` must have accepted it)."""
    sh = shape(mask)
    ev = _Eval(B, L, S, list(bufs), device)
    pieces = ev.eval(mask)
    while len(pieces) < sh.intervals:  # a row needs fewer than the shape allows: pad with empty intervals
        pieces.append((ev.full(S), ev.full(S)))
    cols: list[Tensor] = []
    if sh.zero_start:
        cols.append(pieces[0][1])
        rest = pieces[1:]
    else:
        cols.append(ev.full(0))
        rest = pieces
    for s, e in rest:
        cols += [s, e]
    funcs = torch.stack([c.expand(B, L).reshape(B * L) for c in cols]).to(torch.int32).unsqueeze(0).contiguous()
    return Endpoints(funcs, ev.valid)


class _Eval:
    def __init__(self, B: int, L: int, S: int, bufs: list[Tensor], device: torch.device) -> None:
        self.B, self.L, self.S, self.device = B, L, S, device
        self.env = {"b": torch.arange(B, device=device).view(B, 1), "q_idx": torch.arange(L, device=device).view(1, L),
                    "h": torch.zeros((), dtype=torch.long, device=device), "bufs": bufs}
        self.valid = torch.ones((), dtype=torch.bool, device=device)

    def full(self, v: int) -> Tensor:
        return torch.full((1, 1), v, dtype=torch.long, device=self.device)

    def rows(self, e: Expr) -> Tensor:
        """An expression free of kv_idx, as an int64 tensor broadcastable to [B, L]."""
        r = ir.evaluate(e, self.env)
        r = torch.as_tensor(r, device=self.device)
        if r.is_floating_point():
            raise NoIntervals(f"{e} is not an integer")
        while r.dim() < 2:
            r = r.unsqueeze(0)
        return r.long()

    def eval(self, e: Expr) -> list[tuple[Tensor, Tensor]]:
        S = self.S
        if e.op == "const":
            return [(self.full(0), self.full(S if e.value else 0))]
        if e.op == "and":
            a, b = self.eval(e.args[0]), self.eval(e.args[1])
            return self.norm([(torch.maximum(sa, sb), torch.minimum(ea, eb)) for sa, ea in a for sb, eb in b])
        if e.op == "or":
            a, b = self.eval(e.args[0]), self.eval(e.args[1])
            if _shape(e.args[0]).zero_start and _shape(e.args[1]).zero_start:
                return self.norm([(a[0][0], torch.maximum(a[0][1], b[0][1]))] + a[1:] + b[1:])
            return self.norm(a + b)
        if e.op == "not":
            a = self.eval(e.args[0])
            starts = [self.full(0)] + [en for _, en in a]
            ends = [st for st, _ in a] + [self.full(S)]
            return self.norm(list(zip(starts, ends)))
        runs = _runs_atom(e)
        if runs is not None:
            s, en = self.run(*runs)
            if e.op == "eq":
                return [(s, en)]
            return self.norm([(self.full(0), s), (en, self.full(S))])
        coef, t = _compare(e)
        if coef == 0:  # no kv_idx left (``kv_idx - kv_idx <= q_idx - 3``): 0 (op) t keeps the row or not
            keep = ir.evaluate(Expr(e.op, (Expr.const(0), t)), self.env)
            keep = torch.as_tensor(keep, device=self.device).bool()
            while keep.dim() < 2:
                keep = keep.unsqueeze(0)
            return [(self.full(0), torch.where(keep, S, 0).long())]
        t = self.rows(t)
        op = e.op if coef > 0 else ir.SWAPPED[e.op]  # kv (op) t
        if coef < 0:
            t = -t
        zero, end = self.full(0), self.full(S)
        if op == "lt":
            iv = [(zero, t)]
        elif op == "le":
            iv = [(zero, t + 1)]
        elif op == "gt":
            iv = [(t + 1, end)]
        elif op == "ge":
            iv = [(t, end)]
        elif op == "eq":
            iv = [(t, t + 1)]
        else:
            iv = [(zero, t), (t + 1, end)]
        return self.norm(iv)

    def run(self, kv_side: Expr, axis: int, q_off: Optional[Expr], kv_off: Optional[Expr]) -> tuple[Tensor, Tensor]:
        """[start, end) of the keys whose id equals row q's: the run of equal ids (read with kv_idx = 0..S-1, so key
        j reads position j + c2) holding the key j = q + c1 - c2 that reads row q's position. Rows whose position no
        key reads, and ids that are not runs, mark the derivation invalid (the call runs the reference math)."""
        env = dict(self.env, kv_idx=torch.arange(self.S, device=self.device).view(1, self.S))
        ids = torch.as_tensor(ir.evaluate(kv_side, env), device=self.device)
        while ids.dim() < 2:
            ids = ids.unsqueeze(0)
        ids = ids.expand(ids.shape[0], self.S)
        pos = torch.arange(self.S, device=self.device).expand_as(ids)
        new = torch.ones_like(ids, dtype=torch.bool)
        new[:, 1:] = ids[:, 1:] != ids[:, :-1]
        start = torch.where(new, pos, 0).cummax(dim=1).values
        nxt = torch.where(new, pos, self.S)  # the next run's first position, from the right
        end = torch.cat([nxt[:, 1:], torch.full_like(nxt[:, :1], self.S)], dim=1).flip(1).cummin(dim=1).values.flip(1)
        # runs: each id occupies one contiguous run, i.e. as many runs as distinct ids in the row
        srt = ids.sort(dim=1).values
        distinct = 1 + (srt[:, 1:] != srt[:, :-1]).sum(dim=1)
        self.valid = self.valid & (new.sum(dim=1) == distinct)
        anchor = torch.arange(self.L, device=self.device).view(1, self.L)
        if q_off is not None:
            anchor = anchor + self.rows(q_off)
        if kv_off is not None:
            anchor = anchor - self.rows(kv_off)
        if q_off is None and kv_off is None and self.L == self.S:
            return start, end
        self.valid = self.valid & ((anchor >= 0) & (anchor < self.S)).all(dim=1)
        rows = max(start.shape[0], anchor.shape[0])
        j = anchor.clamp(0, self.S - 1).expand(rows, self.L)
        return start.expand(rows, self.S).gather(1, j), end.expand(rows, self.S).gather(1, j)

    def norm(self, pieces: list[tuple[Tensor, Tensor]]) -> list[tuple[Tensor, Tensor]]:
        """Clamp to [0, S], sort by start (an empty interval moves to the end, one at key 0 stays first), and sweep
        so the intervals are disjoint with nondecreasing endpoints; the union is unchanged."""
        S = self.S
        ss, es = [], []
        for s, e in pieces:
            s, e = torch.broadcast_tensors(s.clamp(0, S), e.clamp(0, S))
            empty = e <= s
            s = torch.where(empty & (s > 0), S, s)
            ss.append(s)
            es.append(torch.where(empty, s, e))
        shp = torch.broadcast_shapes(*[x.shape for x in ss])
        st = torch.stack([x.expand(shp) for x in ss])
        en = torch.stack([x.expand(shp) for x in es])
        st, order = st.sort(dim=0, stable=True)
        en = en.gather(0, order)
        out, prev = [], torch.zeros(shp, dtype=torch.long, device=self.device)
        for i in range(st.shape[0]):
            s = torch.maximum(st[i], prev)
            e = torch.maximum(en[i], s)
            out.append((s, e))
            prev = e
        return out


def dense(funcs: Tensor, B: int, L: int, S: int) -> Tensor:
    """[B, L, S] bool: the keys each row's endpoints let through (for checks and tests)."""
    kv = torch.arange(S, device=funcs.device)
    f = funcs[0].view(funcs.shape[1], B, L, 1).long()
    keep = kv < f[0]
    for i in range(1, f.shape[0], 2):
        keep = keep | ((kv >= f[i]) & (kv < f[i + 1]))
    return keep
