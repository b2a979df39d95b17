"""A readable, Python-like infix form of a score_mod / mask_mod ``Expr`` (the s-expression of ``te_compile.score.ir``).

    >>> from te_compile import ir
    >>> infix(ir.parse("(mul (tanh (div score 30.0)) 30.0)"))
    'tanh(score / 30.0) * 30.0'

The text reads like the user's own Python, with the fewest parentheses Python's precedence allows
(plus a few for clarity: a comparison inside a comparison, a power under a minus or in a power,
an ``&`` inside a ``|``):

* leaves ``score b h q_idx kv_idx``; constants ``30.0``, ``3``, ``True``, ``inf``, ``-inf``, ``nan``;
* ``+ - * / // % **``, unary ``-``; comparisons ``== != < <= > >=``;
* ``&`` ``|`` ``~`` for the logical ops on booleans (as in mask_mods), ``logical_and(a, b)``,
  ``logical_or(a, b)``, ``logical_not(a)`` otherwise (on integers ``&`` would be bitwise);
* functions ``tanh(x)``, ``exp(x)``, ``exp2(x)``, ``abs(x)``, ... ``min(a, b)``, ``max(a, b)``,
  ``clamp(x, lo, hi)`` (the translated ``torch.clamp``: a min of a max with constant bounds),
  ``where(cond, a, b)``;
* casts ``float32(x)``, ``int64(x)``, ``bool(x)``, ...;
* ``(in i)`` as ``in0``, ``in1``, ... (the i-th extra input, a (b, h) term computed by torch), and a
  captured tensor ``(buf i)`` read at ``(index (buf i) h q_idx)`` as ``buf0[h, q_idx]``.

Each op's form (function, operator and precedence, ...) is its row's ``infix`` in te_compile.score.opdefs;
any other op prints as ``name(arg, ...)``. The result is a valid Python expression: with torch
tensors for the leaves, ``in*`` / ``buf*`` and the functions above bound to their torch versions it
evaluates to what ``ir.evaluate`` computes (``tests/test_infix.py`` checks that).
"""

from __future__ import annotations

import functools
import math

from . import opdefs
from .ir import Expr, kind_of
from .opdefs import OPS, OpDef

# Python's precedence levels (higher binds tighter; te_compile.score.opdefs defines them with the ops' forms)
_CMP, _OR, _AND, _UNARY, _POW, _ATOM = opdefs.CMP, opdefs.OR, opdefs.AND, opdefs.UNARY, opdefs.POW, opdefs.ATOM

__all__ = ["infix"]


def infix(e: Expr) -> str:
    """``e`` as a readable Python-like infix expression (see the module's docstring)."""
    return _fmt(e)[0]


def _wrap(part: tuple[str, int], need: int, strict: bool = False) -> str:
    """The text of ``part``, parenthesized when it binds less tightly than ``need`` (or as tightly, if strict)."""
    text, prec = part
    return f"({text})" if prec < need or (strict and prec == need) else text


def _const(e: Expr) -> tuple[str, int]:
    v = e.value
    if isinstance(v, bool):
        return ("True" if v else "False"), _ATOM
    if isinstance(v, float):
        if math.isnan(v):
            return "nan", _ATOM
        if math.isinf(v):
            return ("inf", _ATOM) if v > 0 else ("-inf", _UNARY)
        text = repr(v)
    else:
        text = str(v)
    return (text, _UNARY) if text.startswith("-") else (text, _ATOM)


def _is_bool(e: Expr) -> bool:
    try:
        return kind_of(e) == "bool"
    except Exception:  # noqa: BLE001 - an op kind_of does not know: not a boolean for printing purposes
        return False


def _call(name: str, args: tuple[Expr, ...]) -> tuple[str, int]:
    return f"{name}({', '.join(_fmt(a)[0] for a in args)})", _ATOM


def _clamp_bounds(e: Expr):
    """(x, lo, hi) when ``e`` is ``(min (max x lo) hi)`` with constant bounds (what torch.clamp translates to)."""
    if e.op != "min" or len(e.args) != 2:
        return None
    inner, hi = e.args
    if inner.op != "max" or len(inner.args) != 2 or hi.op != "const":
        return None
    x, lo = inner.args
    if lo.op != "const":
        return None
    return x, lo, hi


def _minus(row: OpDef, args: tuple[Expr, ...]):
    if len(args) != 1:
        return None
    a = _fmt(args[0])
    # -(-x) and -(x ** 2) rather than the valid but easily misread --x and -x ** 2
    clear = a[1] <= _UNARY or args[0].op == "pow" or a[0].startswith("-")
    return row.infix.text + (f"({a[0]})" if clear else a[0]), _UNARY


def _not(row: OpDef, args: tuple[Expr, ...]):
    if len(args) != 1:
        return None
    if _is_bool(args[0]) and args[0].op != "const":  # ~ on a Python bool is an integer op
        return row.infix.text + _wrap(_fmt(args[0]), _UNARY), _UNARY
    return _call(row.infix.otherwise, args)


def _logical(row: OpDef, args: tuple[Expr, ...]):
    if len(args) != 2:
        return None
    sym, prec = row.infix.text, row.infix.prec
    if _is_bool(args[0]) and _is_bool(args[1]):
        # an & inside a | gets parentheses too: `(a & b) | c` (Python's precedence, said out loud)
        (lt, lp), (rt, rp) = _fmt(args[0]), _fmt(args[1])
        and_in_or = prec == _OR and _OR < lp <= _AND, prec == _OR and _OR < rp <= _AND
        left = f"({lt})" if lp < prec or and_in_or[0] else lt
        right = f"({rt})" if rp <= prec or and_in_or[1] else rt
        return f"{left} {sym} {right}", prec
    return _call(row.infix.otherwise, args)


def _operator(row: OpDef, args: tuple[Expr, ...]):
    if len(args) != 2:
        return None
    sym, prec = row.infix.text, row.infix.prec
    # left-associative; comparisons do not nest without parentheses (Python chains a < b < c)
    left = _wrap(_fmt(args[0]), prec, strict=prec == _CMP)
    right = _wrap(_fmt(args[1]), prec, strict=True)
    return f"{left} {sym} {right}", prec


def _power(row: OpDef, args: tuple[Expr, ...]):
    if len(args) != 2:
        return None
    a, b = _fmt(args[0]), _fmt(args[1])
    # right-associative: the base binds tighter than ** (so -x and x ** y need parentheses there); the
    # exponent may be a unary minus; a power in a power gets parentheses for clarity
    left = f"({a[0]})" if a[1] <= _POW else a[0]
    right = f"({b[0]})" if b[1] < _UNARY or args[1].op == "pow" else b[0]
    return f"{left} {row.infix.text} {right}", _POW


def _function(row: OpDef, args: tuple[Expr, ...]):
    return _call(row.infix.text, args) if args else None


#: te_compile.score.opdefs.Infix.form -> how it prints (None: the arguments do not fit the form)
_FORMS = {"minus": _minus, "not": _not, "logical": _logical, "operator": _operator, "power": _power,
          "function": _function}


@functools.lru_cache(maxsize=4096)
def _fmt(e: Expr) -> tuple[str, int]:
    op, args = e.op, e.args
    if not args and op in ("score", "b", "h", "q_idx", "kv_idx"):
        return op, _ATOM
    if op == "const":
        return _const(e)
    if op in ("in", "buf") and not args:
        return f"{op}{e.value}", _ATOM
    if op == "index" and args:
        base = _wrap(_fmt(args[0]), _ATOM)
        return f"{base}[{', '.join(_fmt(a)[0] for a in args[1:])}]", _ATOM
    if op == "cast" and len(args) == 1:
        return f"{e.dtype}({_fmt(args[0])[0]})", _ATOM
    row = OPS.get(op)
    if row is not None:
        if op == "min":  # torch.clamp translates to a min of a max: print it as written
            bounds = _clamp_bounds(e)
            if bounds is not None:
                return _call("clamp", bounds)
        form = _FORMS[row.infix.form](row, args)
        if form is not None:
            return form
    # anything else (an op this printer does not know): name(args)
    parts = [_fmt(a)[0] for a in args]
    if e.dtype is not None and op != "const":
        parts.insert(0, str(e.dtype))
    if e.value is not None and op != "const":
        parts.insert(0, repr(e.value))
    return f"{op}({', '.join(parts)})", _ATOM
