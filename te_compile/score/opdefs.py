"""The ScoreExpr ops, one row each.

An ``OpDef`` is everything te_compile knows about one op of the IR (te_compile.score.expr), and each module
reads the part it needs from it instead of keeping a table of its own:

* ``aten``: the aten overloads that translate to it one to one (passes/score_mod.py; aten spellings
  that become several IR ops, such as ``clamp`` or ``rsub``, stay translations there);
* ``torch_fn`` and ``result``: its torch evaluation and result kind (ir.evaluate, ir.kind_of);
* ``deriv``: its derivative rule (ir.derivative), None where there is none;
* ``at_neg_inf``: its value where the score is -inf, from its operands' (lowering.py), None when
  NaN is possible or not known;
* ``cudnn``: how emit.py emits it (a ``Cudnn`` style and pointwise op), or ``NotOnCudnn`` and why;
* ``infix``: its readable Python form (infix.py).

Adding an op is adding a row here and its test data in tests/test_opdefs.py, which checks each row from
the torch callable to the emitted cuDNN ops. Leaves, constants, ``cast`` and the captured-tensor
references (``in``, ``buf``, ``index``) are the tree's structure, not ops: each module handles them.

This module imports neither the cuDNN frontend nor te_compile's analyses, so it loads anywhere.
"""

from __future__ import annotations

import dataclasses
from typing import Callable, Optional, Union

import torch

from .expr import Expr, add, div, mul, neg, sub

LN2 = 0.6931471805599453

# Python's precedence levels for the infix form (higher binds tighter)
LOWEST = 0   # a whole expression, a call argument, a subscript
CMP = 4      # == != < <= > >=  (below | and &, as in Python: hence the parentheses in `(a < b) & (c < d)`)
OR = 5       # |
AND = 7      # &
ADD = 9      # + -
MUL = 10     # * / // %
UNARY = 11   # -x ~x
POW = 12     # **
ATOM = 13    # names, calls, subscripts, non-negative constants


class NotDifferentiable(ValueError):
    pass


@dataclasses.dataclass(frozen=True)
class Cudnn:
    """How cudnn/emit.py emits the op: ``style`` picks the Emitter's handler, ``op`` is the graph's
    pointwise op it calls (``graph.<op>``)."""

    #: "unary", "scaled_unary" (op(x * scale)), "arith", "power", "floor_divide", "remainder",
    #: "compare", "logical" or "select"
    style: str
    op: str
    #: all-INT32 operands compute in INT32 (index arithmetic stays exact)
    int_ok: bool = False
    #: the score-dependent operand goes first: `g + score` with no bprop gave dQ / dK off by 1e10
    #: (fuzzer), `score + g` is right
    score_first: bool = False
    #: ``x op where(c, k1, k2)`` is emitted as ``where(c, x op k1, x op k2)``
    over_const_where: bool = False
    #: the "scaled_unary" factor (a pass-by-value constant of the graph)
    scale: Optional[float] = None


@dataclasses.dataclass(frozen=True)
class NotOnCudnn:
    """The op has no cuDNN emission; ``reason`` is what the kept site says."""

    reason: str


@dataclasses.dataclass(frozen=True)
class Infix:
    """The op's readable Python form (infix.py)."""

    #: "function" (``text(a, ...)``), "operator" (``a text b``, left-associative), "minus" (``-a``),
    #: "power" (``a ** b``), "logical" (``a text b`` on bools, else ``otherwise(a, b)``), "not" (``~a``
    #: on a bool, else ``otherwise(a)``)
    form: str
    text: str
    prec: int = ATOM
    otherwise: str = ""


@dataclasses.dataclass(frozen=True)
class OpDef:
    name: str
    #: "unary", "binary", "compare", "logical" or "select"
    kind: str
    arity: int
    torch_fn: Callable
    #: "float" (always), "bool" (always), "promote" (float when an operand is, else int) or "promote_bool"
    #: (also bool when every operand is: torch's bool + bool is OR, bool * bool is AND)
    result: str
    infix: Infix
    cudnn: Union[Cudnn, NotOnCudnn]
    aten: tuple[str, ...] = ()
    #: d(op(args)) / d(wrt) as ``deriv(x, d, wrt)``: x is the node, d(arg) the operand's derivative
    deriv: Optional[Callable[[Expr, Callable[[Expr], Expr], str], Expr]] = None
    #: ``at_neg_inf(e, a)``: the node's value class ("fin", "+inf", "-inf", "nan") from its operands' ``a``
    at_neg_inf: Optional[Callable[[Expr, list], str]] = None
    #: comparisons: the op with its operands swapped (``a < b`` is ``b > a``) and the negated op
    swapped: str = ""
    negated: str = ""
    #: evaluation: a Python-number operand takes the first operand's dtype (torch.minimum wants tensors)
    like_first: bool = False
    #: translation: aten's ``alpha`` (``add(x, y, alpha=a)`` is ``x + a * y``)
    alpha: bool = False


def _c(v) -> Expr:
    return Expr.const(v)


# --------------------------------------------------------------------------- values at -inf

#: the value class of -x
NEG = {"fin": "fin", "+inf": "-inf", "-inf": "+inf", "nan": "nan"}


def _inf_add(x: str, y: str) -> str:
    if x == "fin":
        return y
    if y == "fin" or x == y:
        return x
    return "nan"


def _inf_div(e: Expr, a: list) -> str:
    x, y = a
    if y != "fin":
        return "fin" if x == "fin" else "nan"  # finite / inf = 0
    c = e.args[1]
    if c.op != "const" or float(c.value) == 0:
        return "nan"  # a divisor that may be 0 where the score is -inf
    return x if float(c.value) > 0 else NEG[x]


def _inf_mul(e: Expr, a: list) -> str:
    x, y = a
    if x == "fin" and y == "fin":
        return "fin"
    if x != "fin" and y != "fin":
        return "+inf" if x == y else "-inf"
    inf, other = (x, e.args[1]) if x != "fin" else (y, e.args[0])
    if other.op != "const" or float(other.value) == 0:
        return "nan"  # inf * (maybe 0)
    return inf if float(other.value) > 0 else NEG[inf]


def _inf_pow(e: Expr, a: list) -> str:
    n = float(e.args[1].value) if e.args[1].op == "const" else None
    if n is None:
        return "nan"
    if a[0] == "fin":  # a score-dependent base: 0 ** negative is inf
        return "fin" if n >= 0 and n.is_integer() else "nan"
    if n < 0:
        return "fin"
    if not n.is_integer() or n == 0:
        return "nan" if not n.is_integer() else "fin"
    return "+inf" if (a[0] == "+inf" or int(n) % 2 == 0) else "-inf"


def _inf_minmax(lo: str, hi: str) -> Callable[[Expr, list], str]:
    def rule(e: Expr, a: list) -> str:
        if lo in a:
            return lo
        return "fin" if all(x == "fin" for x in a) else ("fin" if "fin" in a else hi)
    return rule


def _fin(e: Expr, a: list) -> str:
    return "fin"


def _inf_exp(e: Expr, a: list) -> str:
    return "+inf" if a[0] == "+inf" else "fin"


def _inf_where(e: Expr, a: list) -> str:
    x, y = a[1], a[2]
    return x if x == y else "nan"


# --------------------------------------------------------------------------- derivatives

def _zero(x: Expr, d, wrt: str) -> Expr:
    return _c(0.0)  # piecewise constant


def _times(g: Expr, f: Expr, g_first: bool = False) -> Expr:
    """The chain rule's ``f * g`` for an inner derivative ``g``, taken inside g's selects:
    ``where(c, f * a, f * b)``, and a zero branch stays 0. Eager's backward of a select-type op (where,
    clamp, maximum / minimum) masks the gradient that reaches it, so where the select picks a constant
    branch the gradient is exactly 0 even when an outer factor is not finite there (``sqrt'(0)``,
    ``1 / 0`` after a clamp): ``f * where(c, a, 0)`` would be ``inf * 0 = nan``."""
    if g.op == "where":
        return Expr("where", (g.args[0], _times(g.args[1], f, g_first), _times(g.args[2], f, g_first)))
    return mul(g, f) if g_first else mul(f, g)


def _over(g: Expr, f: Expr) -> Expr:
    """``g / f`` for an inner derivative ``g``, inside g's selects (``_times``)."""
    if g.op == "where":
        return Expr("where", (g.args[0], _over(g.args[1], f), _over(g.args[2], f)))
    return div(g, f)


def _d_div(x: Expr, d, wrt: str) -> Expr:
    a = x.args  # (u/v)' = u'/v - u v' / v^2
    return sub(_over(d(a[0]), a[1]), _over(_times(d(a[1]), a[0]), mul(a[1], a[1])))


def _d_pow(x: Expr, d, wrt: str) -> Expr:
    a = x.args
    if wrt in a[1].leaves():
        raise NotDifferentiable("pow with a score-dependent exponent")
    n = a[1]
    return _times(d(a[0]), mul(n, Expr("pow", (a[0], sub(n, _c(1.0))))))


def _d_abs(x: Expr, d, wrt: str) -> Expr:
    # eager's abs backward is grad * sgn(x): 0 at x == 0 (a zero score: zero-padded keys or queries)
    x0 = x.args[0]
    sgn = Expr("where", (Expr("lt", (x0, _c(0.0))), _c(-1.0),
                         Expr("where", (Expr("gt", (x0, _c(0.0))), _c(1.0), _c(0.0)))))
    return _times(d(x0), sgn)


def _d_minmax(cmp: str):
    def rule(x: Expr, d, wrt: str) -> Expr:
        a = x.args
        return Expr("where", (Expr(cmp, (a[0], a[1])), d(a[0]), d(a[1])))
    return rule


# --------------------------------------------------------------------------- the rows

def _unary(name: str, fn: Callable, deriv, at_neg_inf=None, result: str = "float", int_ok: bool = False,
           cudnn: Union[Cudnn, NotOnCudnn, None] = None, infix: Optional[Infix] = None) -> OpDef:
    """A one-operand op: by default a float function, translated from ``aten.<name>.default``, printed as
    ``name(x)`` and emitted as cuDNN's pointwise op of the same name."""
    return OpDef(name, "unary", 1, fn, result, infix or Infix("function", name),
                 cudnn or Cudnn("unary", name, int_ok=int_ok), aten=(f"{name}.default",), deriv=deriv,
                 at_neg_inf=at_neg_inf)


def _compare(name: str, sym: str, cudnn_op: str, swapped: str, negated: str) -> OpDef:
    return OpDef(name, "compare", 2, getattr(torch, name), "bool", Infix("operator", sym, CMP),
                 Cudnn("compare", cudnn_op), aten=(f"{name}.Tensor", f"{name}.Scalar"), deriv=_zero, at_neg_inf=_fin,
                 swapped=swapped, negated=negated)


def _logical(name: str, arity: int, sym: str, prec: int) -> OpDef:
    fn = f"logical_{name}"
    return OpDef(name, "logical", arity, getattr(torch, fn), "bool",
                 Infix("logical" if arity == 2 else "not", sym, prec, otherwise=fn),
                 Cudnn("logical", fn), aten=(f"{fn}.default",), deriv=_zero, at_neg_inf=_fin)


_ROWS = (
    _unary("neg", torch.neg, lambda x, d, w: neg(d(x.args[0])), lambda e, a: NEG[a[0]], result="promote",
           int_ok=True, infix=Infix("minus", "-", UNARY)),
    _unary("abs", torch.abs, _d_abs, lambda e, a: "fin" if a[0] == "fin" else "+inf", result="promote", int_ok=True),
    _unary("exp", torch.exp, lambda x, d, w: _times(d(x.args[0]), x), _inf_exp),
    # exact in the reference (exp(x ln 2) is not: remainder(exp2(4), 1) differs); cuDNN has no exp2
    _unary("exp2", torch.exp2, lambda x, d, w: _times(d(x.args[0]), mul(x, _c(LN2))), _inf_exp,
           cudnn=Cudnn("scaled_unary", "exp", scale=LN2)),
    _unary("log", torch.log, lambda x, d, w: _over(d(x.args[0]), x.args[0])),
    _unary("log2", torch.log2, lambda x, d, w: _over(d(x.args[0]), mul(x.args[0], _c(LN2))),
           cudnn=NotOnCudnn("no cuDNN op for 'log2' (the frontend's pointwise ops have log, not log2)")),
    _unary("tanh", torch.tanh, lambda x, d, w: _times(d(x.args[0]), sub(_c(1.0), mul(x, x))), _fin),
    _unary("sigmoid", torch.sigmoid, lambda x, d, w: _times(d(x.args[0]), mul(x, sub(_c(1.0), x))), _fin),
    _unary("sin", torch.sin, lambda x, d, w: _times(d(x.args[0]), Expr("cos", (x.args[0],)))),
    _unary("cos", torch.cos, lambda x, d, w: _times(d(x.args[0]), neg(Expr("sin", (x.args[0],))))),
    _unary("tan", torch.tan, lambda x, d, w: _times(d(x.args[0]), add(_c(1.0), mul(x, x)))),
    _unary("sqrt", torch.sqrt, lambda x, d, w: _over(d(x.args[0]), mul(_c(2.0), x))),
    _unary("rsqrt", torch.rsqrt, lambda x, d, w: _times(d(x.args[0]), mul(_c(-0.5), div(x, x.args[0])))),
    OpDef("add", "binary", 2, torch.add, "promote_bool", Infix("operator", "+", ADD),
          Cudnn("arith", "add", int_ok=True, score_first=True, over_const_where=True),
          aten=("add.Tensor", "add.Scalar"), deriv=lambda x, d, w: add(d(x.args[0]), d(x.args[1])),
          at_neg_inf=lambda e, a: _inf_add(a[0], a[1]), alpha=True),
    OpDef("sub", "binary", 2, torch.sub, "promote", Infix("operator", "-", ADD),
          Cudnn("arith", "sub", int_ok=True, over_const_where=True),
          aten=("sub.Tensor", "sub.Scalar"), deriv=lambda x, d, w: sub(d(x.args[0]), d(x.args[1])),
          at_neg_inf=lambda e, a: _inf_add(a[0], NEG[a[1]]), alpha=True),
    OpDef("mul", "binary", 2, torch.mul, "promote_bool", Infix("operator", "*", MUL),
          Cudnn("arith", "mul", int_ok=True, score_first=True, over_const_where=True),
          aten=("mul.Tensor", "mul.Scalar"),
          deriv=lambda x, d, w: add(_times(d(x.args[0]), x.args[1], g_first=True), _times(d(x.args[1]), x.args[0])), at_neg_inf=_inf_mul),
    OpDef("div", "binary", 2, torch.true_divide, "float", Infix("operator", "/", MUL), Cudnn("arith", "div"),
          aten=("div.Tensor", "div.Scalar"), deriv=_d_div, at_neg_inf=_inf_div),
    # integer powers up to lowering.MAX_INT_POW are emitted as products (the "power" style)
    OpDef("pow", "binary", 2, torch.pow, "promote", Infix("power", "**", POW), Cudnn("power", "pow"),
          aten=("pow.Tensor_Scalar", "pow.Tensor_Tensor"), deriv=_d_pow, at_neg_inf=_inf_pow),
    OpDef("min", "binary", 2, torch.minimum, "promote_bool", Infix("function", "min"),
          Cudnn("arith", "min", int_ok=True, score_first=True), aten=("minimum.default",), deriv=_d_minmax("le"),
          at_neg_inf=_inf_minmax("-inf", "+inf"), like_first=True),
    OpDef("max", "binary", 2, torch.maximum, "promote_bool", Infix("function", "max"),
          Cudnn("arith", "max", int_ok=True, score_first=True), aten=("maximum.default",), deriv=_d_minmax("ge"),
          at_neg_inf=_inf_minmax("+inf", "-inf"), like_first=True),
    # d/dx (x mod c) = 1 almost everywhere
    OpDef("rem", "binary", 2, torch.remainder, "promote", Infix("operator", "%", MUL), Cudnn("remainder", "floor"),
          aten=("remainder.Scalar", "remainder.Tensor"), deriv=lambda x, d, w: d(x.args[0])),
    OpDef("floordiv", "binary", 2, torch.floor_divide, "promote", Infix("operator", "//", MUL),
          Cudnn("floor_divide", "floor"), aten=("floor_divide.default", "floor_divide.Scalar"), deriv=_zero),
    _compare("eq", "==", "cmp_eq", "eq", "ne"),
    _compare("ne", "!=", "cmp_neq", "ne", "eq"),
    _compare("lt", "<", "cmp_lt", "gt", "ge"),
    _compare("le", "<=", "cmp_le", "ge", "gt"),
    _compare("gt", ">", "cmp_gt", "lt", "le"),
    _compare("ge", ">=", "cmp_ge", "le", "lt"),
    _logical("and", 2, "&", AND),
    _logical("or", 2, "|", OR),
    _logical("not", 1, "~", UNARY),
    OpDef("where", "select", 3, torch.where, "promote_bool", Infix("function", "where"),
          Cudnn("select", "binary_select"), aten=("where.self",),
          deriv=lambda x, d, w: Expr("where", (x.args[0], d(x.args[1]), d(x.args[2]))), at_neg_inf=_inf_where),
)

#: op name -> its row
OPS: dict[str, OpDef] = {r.name: r for r in _ROWS}
