"""ScoreExpr: the small pointwise IR a flex ``score_mod`` / ``mask_mod`` is translated into.

An ``Expr`` is an immutable tree (shared subtrees are fine; it is a DAG in practice) over the
leaves ``score``, ``b``, ``h``, ``q_idx``, ``kv_idx`` and constants. It has

* a canonical text form (``str(e)``, an s-expression) and a parser (``parse``), so an expression
  travels inside the op's spec string and is its own cache key;
* ``evaluate``: the exact torch math (the reference kernel and the verifier use it);
* ``derivative``: d(expr)/d(score), symbolic, with light constant folding; cuDNN needs it as the
  ``score_mod_bprop`` (without one it silently uses 1).

The tree, its text and ``parse`` live in te_compile.score.expr, and what each op means (its torch function,
result kind, derivative rule) in its row of te_compile.score.opdefs; this module holds the analyses over
whole expressions and re-exports the tree's names, so ``ir.Expr`` / ``ir.parse`` are the IR's API.

Integer index arithmetic follows torch: the index leaves are int32, ``div`` is true division
(float), ``floordiv`` / ``rem`` by a positive constant are exact on integers.
"""

from __future__ import annotations

import functools
import math
from typing import Callable, Optional

import torch

from .expr import LEAVES, REFS, Const, Expr, add, div, mul, neg, parse, sub  # noqa: F401 - the IR's public names
from .opdefs import LN2, OPS, NotDifferentiable, OpDef  # noqa: F401

COMPARISONS = tuple(r.name for r in OPS.values() if r.kind == "compare")
#: the comparison with its operands swapped: ``a < b`` is ``b > a``
SWAPPED = {r.name: r.swapped for r in OPS.values() if r.kind == "compare"}
#: the negated comparison: ``not (a < b)`` is ``a >= b``
NEGATED = {r.name: r.negated for r in OPS.values() if r.kind == "compare"}
LOGICAL = tuple(r.name for r in OPS.values() if r.kind == "logical")
#: the float dtypes a cast may target: the value stays a float (the cast only changes precision)
FLOAT_CASTS = ("float32", "float64", "float16", "bfloat16")

_c = Expr.const


# --------------------------------------------------------------------------- evaluation

def evaluate(e: Expr, env: dict[str, torch.Tensor]) -> torch.Tensor:
    """Evaluate with torch; ``env`` maps the leaves used to (broadcastable) tensors."""
    memo: dict[int, torch.Tensor] = {}

    def ev(x: Expr):
        key = id(x)
        if key in memo:
            return memo[key]
        if x.op in LEAVES:
            r = env[x.op]
        elif x.op == "in":
            r = env["inputs"][x.value]
        elif x.op == "buf":
            r = env["bufs"][x.value]
        elif x.op == "index":
            base = ev(x.args[0])
            idx = [_as_tensor(ev(a)).long() for a in x.args[1:]]
            r = base[tuple(idx)]
        elif x.op == "const":
            r = x.value
        elif x.op == "cast":
            a = ev(x.args[0])
            r = a.to(getattr(torch, x.dtype)) if isinstance(a, torch.Tensor) else a
        elif x.op in OPS:
            r = _apply(OPS[x.op], [ev(y) for y in x.args])
        else:
            raise ValueError(f"unknown op {x.op!r}")
        memo[key] = r
        return r

    out = ev(e)
    return _as_tensor(out)


def _apply(row: OpDef, vals: list):
    """The op of ``row`` on evaluated operands (tensors or Python numbers), as torch computes it."""
    if row.arity == 1:
        return row.torch_fn(_as_tensor(vals[0]))
    if row.arity == 3:
        return row.torch_fn(*vals)
    a, b = vals
    if not isinstance(a, torch.Tensor) and not isinstance(b, torch.Tensor):
        a = _as_tensor(a)
    if row.like_first:
        a, b = _as_tensor(a), _as_tensor(b, like=a)
    if not isinstance(a, torch.Tensor):  # python-number first operand
        a = torch.as_tensor(a, device=b.device)
    return row.torch_fn(a, b)


def _as_tensor(v, like: torch.Tensor | None = None) -> torch.Tensor:
    if isinstance(v, torch.Tensor):
        return v
    if like is not None:
        return torch.full((), v, dtype=like.dtype, device=like.device)
    return torch.as_tensor(v)


# --------------------------------------------------------------------------- derivative

def derivative(e: Expr, wrt: str = "score") -> Expr:
    """d(e)/d(wrt), as an Expr (0.0 when e does not depend on ``wrt``); each op's rule is its row's ``deriv``."""
    memo: dict[Expr, Expr] = {}

    def d(x: Expr) -> Expr:
        if x in memo:
            return memo[x]
        r = _d(x)
        memo[x] = r
        return r

    def _d(x: Expr) -> Expr:
        if wrt not in x.leaves():
            return _c(0.0)
        op = x.op
        if op == wrt:
            return _c(1.0)
        if op == "cast":
            if x.dtype in FLOAT_CASTS:
                return d(x.args[0])
            return _c(0.0)  # integer / bool casts are piecewise constant
        row = OPS.get(op)
        if row is None or row.deriv is None:
            raise NotDifferentiable(f"no derivative rule for {op!r}")
        return row.deriv(x, d, wrt)

    return d(e)


# --------------------------------------------------------------------------- types and (b, h) terms

def kind_of(e: Expr, score_kind: str = "float") -> str:
    """"bool" | "int" | "float": the torch result category of ``e`` (score is float)."""
    return _kind(e, score_kind)


@functools.lru_cache(maxsize=4096)
def _kind(e: Expr, score_kind: str) -> str:
    op = e.op
    if op == "score":
        return score_kind
    if op in ("b", "h", "q_idx", "kv_idx"):
        return "int"
    if op == "in":
        return "float"
    if op == "buf":
        return "float"
    if op == "index":
        return "float"
    if op == "const":
        return e.dtype or "float"
    if op == "cast":
        return "bool" if e.dtype == "bool" else ("int" if e.dtype.startswith("int") else "float")
    row = OPS.get(op)
    result = row.result if row is not None else "promote"
    if result == "bool":
        return "bool"
    # a select's kind is its branches' (the condition is a bool)
    kinds = [_kind(a, score_kind) for a in e.args[1:] if row is not None and row.kind == "select"] \
        or [_kind(a, score_kind) for a in e.args]
    if result == "float":
        return "float"
    if "float" in kinds:
        return "float"
    if all(k == "bool" for k in kinds) and result == "promote_bool":
        return "bool"  # torch: bool + bool is OR, bool * bool is AND, both stay bool
    return "int"


def is_bh_term(e: Expr) -> bool:
    """True if ``e`` depends only on b, h and captured tensors (and does depend on one of them)."""
    leaves = e.leaves()
    refs = _has_ref(e, "buf")
    if leaves - {"b", "h"}:
        return False
    return bool(leaves) or refs


@functools.lru_cache(maxsize=4096)
def _has_ref(e: Expr, kind: str) -> bool:
    return e.op == kind or any(_has_ref(a, kind) for a in e.args)


class NotPointwise(ValueError):
    pass


def extract_bh_terms(*exprs: Expr, strict: bool = False) -> tuple[list[Expr], list[Expr]]:
    """Replace every maximal (b, h, captured)-only sub-expression by ``(in i)``.

    Returns the rewritten expressions (numbered jointly) and the extracted terms (torch computes term i into
    extra input i). A bool term is computed as 0/1 and read back as ``(ne (in i) 0.0)``.
    Raises NotPointwise if a captured tensor is still read outside such a term (a gather by
    q_idx / kv_idx, which is not pointwise).

    ``strict`` (the cuDNN target) also raises NotPointwise for the terms cuDNN evaluates wrongly
    (cuDNN 9.19, found by the differential fuzzer): a term that depends on the batch
    index b (inputs [B, ...] are mis-broadcast: wrong outputs even as full [B, H, 1, 1] tensors), and
    any (b, h) term under a comparison (masks such as ``kv_idx < lengths[b]`` or ``q_idx <= h``).
    """
    terms: list[Expr] = []
    index: dict[Expr, int] = {}

    def walk(x: Expr, in_cmp: bool = False) -> Expr:
        if x.op == "const" or x.op in ("score", "q_idx", "kv_idx"):
            return x
        if is_bh_term(x):
            if strict and "b" in x.leaves():
                raise NotPointwise("depends on the batch index b (cuDNN reads per-batch inputs wrongly)")
            if strict and in_cmp:
                raise NotPointwise("compares against a (b, h) term (cuDNN evaluates such comparisons wrongly)")
            if x not in index:
                index[x] = len(terms)
                terms.append(x)
            ref = Expr.ref("in", index[x])
            return Expr("ne", (ref, Expr.const(0.0))) if kind_of(x) == "bool" else ref
        if x.op in ("buf", "index"):
            raise NotPointwise("reads a captured tensor at an index that depends on q_idx / kv_idx "
                               "(a gather, not pointwise in cuDNN)")
        if not x.args:
            return x
        under = in_cmp or x.op in COMPARISONS
        return Expr(x.op, tuple(walk(a, under) for a in x.args), value=x.value, dtype=x.dtype)

    return [walk(e) for e in exprs], terms


# --------------------------------------------------------------------------- simplification

def simplify(e: Expr) -> Expr:
    """Fold constants and drop identities (``x + 0``, ``x * 1``, ``true & x``, bool casts of bools).

    Translated Hugging Face masks look like ``(and true (cast bool (le (add kv_idx 0) q_idx)))``;
    simplified they are ``(le kv_idx q_idx)``, which the built-in-mask recognizer understands."""
    return _simplify(e)


@functools.lru_cache(maxsize=4096)
def _simplify(e: Expr) -> Expr:
    if not e.args:
        return e
    args = tuple(_simplify(a) for a in e.args)
    op = e.op
    if op == "cast" and e.dtype == "bool" and kind_of(args[0]) == "bool":
        return args[0]
    if op == "cast" and e.dtype in ("int32", "int64") and kind_of(args[0]) == "int":
        return args[0]
    if op == "and":
        a, b = args
        if a.is_const(True):
            return b
        if b.is_const(True):
            return a
        if a.is_const(False) or b.is_const(False):
            return Expr.const(False)
    if op == "or":
        a, b = args
        if a.is_const(False):
            return b
        if b.is_const(False):
            return a
        if a.is_const(True) or b.is_const(True):
            return Expr.const(True)
    if op == "not" and args[0].op == "const" and isinstance(args[0].value, bool):
        return Expr.const(not args[0].value)
    if op in ("add", "sub", "mul", "div") and len(args) == 2:
        folded = {"add": add, "sub": sub, "mul": mul, "div": div}[op](*args)
        # identities must not change the result type: x_int * 1.0 is a float, and bool * 1 is an
        # int in torch (dropping the `* 1` would turn a later `+` into a logical or)
        if kind_of(folded) == kind_of(Expr(op, args)) and (folded.op != op or folded.args != args):
            return folded
    return Expr(op, args, value=e.value, dtype=e.dtype)


def substitute(e: Expr, name: str, value: Expr) -> Expr:
    """``e`` with every ``name`` leaf replaced by ``value``."""
    if e.op == name and not e.args:
        return value
    if not e.args:
        return e
    return Expr(e.op, tuple(substitute(a, name, value) for a in e.args), value=e.value, dtype=e.dtype)


def linear_in_score(e: Expr) -> Optional[tuple[float, Expr]]:
    """(a, g) when ``e == a * score + g`` *by structure* (sums, differences, negations, products and
    quotients by score-free factors, float casts), with a constant ``a`` (not 0 or 1) and ``g`` free
    of score; else None. ``a`` can then go into the softmax scale.

    A constant derivative is not enough: ``s * 2 + (s > 0)`` or ``remainder(s, 1.0)`` have one
    almost everywhere but are not affine (the step would be lost)."""
    if "score" not in e.leaves():
        return None
    parts = _affine(e)
    if parts is None:
        return None
    a_expr, g = parts
    a_expr = simplify(a_expr)
    if a_expr.op != "const" or isinstance(a_expr.value, bool):
        return None
    a = float(a_expr.value)
    if a in (0.0, 1.0) or not math.isfinite(a):
        return None  # 1: nothing to fold
    return a, simplify(g)


_EXACT_FLOAT_CASTS = ("float32", "float64")


def affine_in_score(e: Expr) -> bool:
    """Is ``e == a * score + g`` by structure, with a and g free of score (a may be 0 or 1)?"""
    return _affine(e) is not None


def _affine(e: Expr) -> Optional[tuple[Expr, Expr]]:
    """(a, g) with ``e == a * score + g`` and a, g free of score, read off the structure, or None."""
    if "score" not in e.leaves():
        return (_c(0.0), e) if kind_of(e) != "bool" else None
    if e.op == "score":
        return (_c(1.0), _c(0.0))
    if e.op == "cast" and e.dtype in _EXACT_FLOAT_CASTS:
        return _affine(e.args[0])
    if e.op == "neg":
        x = _affine(e.args[0])
        return None if x is None else (neg(x[0]), neg(x[1]))
    if e.op in ("add", "sub"):
        x, y = _affine(e.args[0]), _affine(e.args[1])
        if x is None or y is None:
            return None
        f = add if e.op == "add" else sub
        return f(x[0], y[0]), f(x[1], y[1])
    if e.op == "mul":
        for i in (0, 1):
            c, other = e.args[i], e.args[1 - i]
            if "score" not in c.leaves() and kind_of(c) != "bool":
                x = _affine(other)
                return None if x is None else (mul(x[0], c), mul(x[1], c))
        return None
    if e.op == "div" and "score" not in e.args[1].leaves() and kind_of(e.args[1]) != "bool":
        x = _affine(e.args[0])
        return None if x is None else (div(x[0], e.args[1]), div(x[1], e.args[1]))
    return None


# --------------------------------------------------------------------------- additive split

#: functions that are NaN below 0
_NAN_BELOW_0 = {"log", "log2", "sqrt", "rsqrt"}


def nonneg(e: Expr) -> bool:
    """Is ``e`` >= 0 (or NaN-free and never negative) wherever its leaves are finite? A conservative test."""
    if e.op == "const":
        return not isinstance(e.value, bool) and e.value is not None and float(e.value) >= 0
    if e.op in ("abs", "exp", "exp2", "sigmoid", "q_idx", "kv_idx", "b", "h"):
        return True
    if e.op in ("add", "mul", "min"):
        return all(nonneg(a) for a in e.args)
    if e.op == "max":
        return any(nonneg(a) for a in e.args)
    return False


def may_be_nan(e: Expr) -> bool:
    """Can ``e`` be NaN where the score and every other leaf are finite (log / sqrt of a value that may be
    negative, a fractional power of one, a division or remainder by a value that reads the score)? Conservative:
    True when not shown otherwise for those ops."""
    if e.op in _NAN_BELOW_0 and not nonneg(e.args[0]):
        return True
    if e.op == "pow":
        exp_ = e.args[1]
        integral = exp_.op == "const" and float(exp_.value) == int(float(exp_.value))
        if not integral and not nonneg(e.args[0]):
            return True
    if e.op in ("div", "rem", "floordiv") and "score" in e.args[1].leaves():
        return True
    return any(may_be_nan(a) for a in e.args)


def buffers_used(e: Expr) -> set[int]:
    """Indices i of the captured tensors ``(buf i)`` that ``e`` reads."""
    if e.op == "buf":
        return {int(e.value)}
    out: set[int] = set()
    for a in e.args:
        out |= buffers_used(a)
    return out


def refs_used(e: Expr) -> set[int]:
    """Indices i of the tensors ``e`` reads, as ``(in i)`` or ``(buf i)`` (both index the op's inputs)."""
    if e.op in ("in", "buf"):
        return {int(e.value)}
    out: set[int] = set()
    for a in e.args:
        out |= refs_used(a)
    return out


def split_additive(e: Expr, in_f: Optional[Callable[[Expr], bool]] = None) -> tuple[Optional[Expr], Optional[Expr]]:
    """Write ``e`` as ``f + g`` where g collects the additive terms that do not read ``score``
    (and, with ``in_f``, only those of them for which ``in_f(term)`` is false: the rest stay in f).

    Returns (f, g); f is None when no term reads score (the score_mod replaces the score), g is
    None when every term does. The top-level chain of ``add`` / ``sub`` / ``neg`` is split, and a
    product or quotient of such a chain by a float constant is distributed (``(t[b] + kv) * 0.1``):
    that is what "additive" means here; anything else stays one term.
    """
    terms: list[tuple[int, Expr]] = []

    def flat(x: Expr, sign: int, factor: Optional[tuple[str, Expr]] = None) -> None:
        def term(t: Expr) -> Expr:
            return t if factor is None else Expr(factor[0], (t, factor[1]))
        if x.op in ("add", "sub", "neg") and kind_of(x) == "bool":
            terms.append((sign, term(x)))  # bool + bool is a logical or in torch: one term, not two
        elif x.op == "add":
            flat(x.args[0], sign, factor)
            flat(x.args[1], sign, factor)
        elif x.op == "sub":
            flat(x.args[0], sign, factor)
            flat(x.args[1], -sign, factor)
        elif x.op == "neg":
            flat(x.args[0], -sign, factor)
        elif factor is None and x.op in ("mul", "div") and x.args[1].op == "const" and x.args[1].dtype == "float" \
                and x.args[0].op in ("add", "sub", "neg") and kind_of(x.args[0]) in ("float", "int"):
            flat(x.args[0], sign, (x.op, x.args[1]))  # float arithmetic: (a + b) * c = a * c + b * c
        else:
            terms.append((sign, term(x)))

    flat(e, 1)
    if kind_of(e) != "bool":
        # a bool term of a numeric chain (``... - (score > 0)``) was promoted by the chain's add; regrouped, it
        # would be subtracted or negated as a bool (torch refuses) or added to another bool (logical or)
        terms = [(sg, Expr("cast", (t,), dtype="float32") if kind_of(t) == "bool" else t) for sg, t in terms]
    if in_f is not None:
        terms = [(sg, t) for sg, t in terms]
        keep_f = [("score" in t.leaves()) or in_f(t) for _, t in terms]
        f_terms = [t for t, k in zip(terms, keep_f) if k]
        g_terms = [t for t, k in zip(terms, keep_f) if not k]
        if any("score" in t.leaves() for _, t in f_terms):
            return _total(f_terms), _total(g_terms)
        return None, _total(f_terms + g_terms)

    f = _total([t for t in terms if "score" in t[1].leaves()])
    g = _total([t for t in terms if "score" not in t[1].leaves()])
    return f, g


def _total(ts: list[tuple[int, Expr]]) -> Optional[Expr]:
    out: Optional[Expr] = None
    for sign, t in ts:
        if out is None:
            out = t if sign > 0 else Expr("neg", (t,))
        else:
            out = Expr("add" if sign > 0 else "sub", (out, t))
    return out
