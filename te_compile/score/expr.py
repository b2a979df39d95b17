"""The ScoreExpr tree itself: ``Expr``, its canonical text (``str(e)``, an s-expression) and ``parse``,
and the folding constructors ``add`` / ``sub`` / ``mul`` / ``div`` / ``neg`` the derivative rules build with.

What an op means (evaluation, kinds, derivative, cuDNN emission) is not here: te_compile.score.opdefs has one
row per op, and te_compile.score.ir the analyses over whole expressions. This module knows only the shape of
the tree, so both can import it.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Optional, Union

LEAVES = ("score", "b", "h", "q_idx", "kv_idx")
#: ``(in i)``: the i-th extra input, a [B|1, H|1, 1, 1] float32 tensor computed by torch from a
#: sub-expression of (b, h, captured tensors) only; ``(buf i)``: the i-th captured tensor, only
#: ever read through ``(index (buf i) idx...)`` inside such a sub-expression.
REFS = ("in", "buf")

Const = Union[bool, int, float]


@dataclasses.dataclass(frozen=True)
class Expr:
    op: str  # a leaf name, "const", a unary/binary/ternary op, or "cast"
    args: tuple["Expr", ...] = ()
    value: Const | None = None  # for "const"
    dtype: str | None = None  # for "cast": the target dtype; for "const": "bool" | "int" | "float"

    def __str__(self) -> str:
        return _text(self)

    # -- construction helpers (used by the translator and by tests)
    @staticmethod
    def leaf(name: str) -> "Expr":
        if name not in LEAVES:
            raise ValueError(f"unknown leaf {name!r}")
        return Expr(name)

    @staticmethod
    def ref(kind: str, i: int) -> "Expr":
        if kind not in REFS:
            raise ValueError(f"unknown reference {kind!r}")
        return Expr(kind, value=int(i), dtype="int")

    @staticmethod
    def const(v: Const) -> "Expr":
        # the type tag keeps 1, 1.0 and True apart (they compare equal in Python)
        if isinstance(v, bool):
            return Expr("const", value=bool(v), dtype="bool")
        if isinstance(v, int):
            return Expr("const", value=int(v), dtype="int")
        return Expr("const", value=float(v), dtype="float")

    def is_const(self, v: Const | None = None) -> bool:
        return self.op == "const" and (v is None or (self.value == v and type(self.value) is type(v)))

    def leaves(self) -> set[str]:
        return _leaves(self)


@functools.lru_cache(maxsize=4096)
def _text(e: Expr) -> str:
    if e.op in LEAVES:
        return e.op
    if e.op == "const":
        v = e.value
        if isinstance(v, bool):
            return "true" if v else "false"
        if isinstance(v, float):
            return repr(v) if math.isfinite(v) else ("inf" if v > 0 else "-inf" if v < 0 else "nan")
        return str(v)
    if e.op == "cast":
        return f"(cast {e.dtype} {_text(e.args[0])})"
    if e.op in REFS:
        return f"({e.op} {e.value})"
    return "(" + " ".join([e.op] + [_text(a) for a in e.args]) + ")"


@functools.lru_cache(maxsize=4096)
def _leaves(e: Expr) -> frozenset:
    if e.op in LEAVES:
        return frozenset([e.op])
    out: frozenset = frozenset()
    for a in e.args:
        out |= _leaves(a)
    return out


# --------------------------------------------------------------------------- parsing

def _tokens(s: str) -> list[str]:
    return s.replace("(", " ( ").replace(")", " ) ").split()


@functools.lru_cache(maxsize=1024)
def parse(text: str) -> Expr:
    """Inverse of ``str(expr)``."""
    toks = _tokens(text)
    pos = 0

    def atom(t: str) -> Expr:
        if t in LEAVES:
            return Expr(t)
        if t in ("true", "false"):
            return Expr.const(t == "true")
        if t in ("inf", "-inf", "nan"):
            return Expr.const(float(t))
        try:
            return Expr.const(int(t))
        except ValueError:
            pass
        try:
            return Expr.const(float(t))
        except ValueError:
            raise ValueError(f"bad token {t!r} in score expression {text!r}") from None

    def node() -> Expr:
        nonlocal pos
        t = toks[pos]
        pos += 1
        if t != "(":
            return atom(t)
        op = toks[pos]
        pos += 1
        if op == "cast":
            dtype = toks[pos]
            pos += 1
            arg = node()
            e = Expr("cast", (arg,), dtype=dtype)
        elif op in REFS:
            e = Expr.ref(op, int(toks[pos]))
            pos += 1
        else:
            args = []
            while toks[pos] != ")":
                args.append(node())
            e = Expr(op, tuple(args))
        if toks[pos] != ")":
            raise ValueError(f"unbalanced score expression {text!r}")
        pos += 1
        return e

    e = node()
    if pos != len(toks):
        raise ValueError(f"trailing tokens in score expression {text!r}")
    return e


# --------------------------------------------------------------------------- folding constructors

def _c(v: Const) -> Expr:
    return Expr.const(v)


def _num(e: Expr):
    return e.value if e.op == "const" and e.dtype in ("int", "float") else None


def _fold(op: str, a: Expr, b: Expr) -> Optional[Expr]:
    x, y = _num(a), _num(b)
    if x is None or y is None:
        return None
    if op == "div":
        return None if y == 0 else _c(float(x) / float(y))
    r = {"add": x + y, "sub": x - y, "mul": x * y}[op]
    return _c(float(r) if (a.dtype == "float" or b.dtype == "float") else int(r))


def add(a: Expr, b: Expr) -> Expr:
    folded = _fold("add", a, b)
    if folded is not None:
        return folded
    if a.is_const(0) or a.is_const(0.0):
        return b
    if b.is_const(0) or b.is_const(0.0):
        return a
    return Expr("add", (a, b))


def mul(a: Expr, b: Expr) -> Expr:
    folded = _fold("mul", a, b)
    if folded is not None:
        return folded
    for x, y in ((a, b), (b, a)):
        if x.is_const(0) or x.is_const(0.0):
            return _c(0.0)
        if x.is_const(1) or x.is_const(1.0):
            return y
    return Expr("mul", (a, b))


def neg(a: Expr) -> Expr:
    if a.op == "const" and isinstance(a.value, (int, float)) and not isinstance(a.value, bool):
        return _c(-a.value)
    return Expr("neg", (a,))


def sub(a: Expr, b: Expr) -> Expr:
    folded = _fold("sub", a, b)
    if folded is not None:
        return folded
    if b.is_const(0) or b.is_const(0.0):
        return a
    if a.is_const(0) or a.is_const(0.0):
        return neg(b)
    return Expr("sub", (a, b))


def div(a: Expr, b: Expr) -> Expr:
    folded = _fold("div", a, b)
    if folded is not None:
        return folded
    if a.is_const(0) or a.is_const(0.0):
        return _c(0.0)
    if b.is_const(1) or b.is_const(1.0):
        return a
    return Expr("div", (a, b))
