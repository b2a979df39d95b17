"""ScoreExpr -> cuDNN pointwise ops inside the ``score_mod`` / ``score_mod_bprop`` callbacks.

One ``Emitter`` per cuDNN graph. cuDNN calls ``score_mod(graph, score)`` with the *scaled*
score [B, Hq, Sq, Skv] (flex's contract too); in a backward graph it calls it first and then
``bprop(graph, dS)``, so the bprop reuses the forward's emitted intermediates (``tanh(s/c)`` for
softcap). The derivative is ``ir.derivative`` of the score expression; when it is exactly 1
(additive mods, pure masks) no bprop is passed (cuDNN's default derivative is 1).

Types (facts: docs/cudnn-notes.md): index leaves come from ``gen_index`` as INT32; an op whose
operands are all INT32 index values stays INT32; anything that involves a constant, a float
value or a division computes in FLOAT (integer values stay exact below 2^24); comparisons and
logical ops compute and produce BOOLEAN; ``where`` is ``binary_select(a, b, cond)``. The mask_mod
goes in as ``binary_select(score', -inf, mask)`` after the score_mod (flex's order); float-to-
float casts (e.g. ``.float()``) are precision-only and are not emitted.

Each op is emitted by the method of its row's emission style (``te_compile.score.opdefs.Cudnn``: unary, arith,
compare, ...), which calls the row's pointwise op; the leaves, constants and casts are emitted here.

Mask first, the padded-tile guard, the constants and what is emitted at all are decided in
te_compile.lowering.lower (the ``Lowering`` record); this module only emits.
"""

from __future__ import annotations

import functools
from typing import Any, Optional, Sequence

import cudnn

from ..score import ir
from ..score.opdefs import OPS, Cudnn
from ..lowering import lower as lowering_mod
from ..lowering.lower import BIG, MAX_INT_POW, Lowering, has_score, int_by_const, is_causal_cmp, refs_input

_I32, _F32, _BOOL = cudnn.data_type.INT32, cudnn.data_type.FLOAT, cudnn.data_type.BOOLEAN
_AXES = {"b": 0, "q_idx": 2, "kv_idx": 3}


def structure(lw: Lowering) -> tuple:
    """What the emitted score_mod / bprop ops are, with pass-by-value constants as slots: the
    transcript of running the Emitter on a recording graph. Two specs with equal structures
    build identical cuDNN graphs that differ only in the values fed at execute, so the graph
    cache keys on this, and a changed softcap or bias slope reuses the built graph."""
    # the emission options change the ops, not only the record
    return _structure(lw, lowering_mod.OPTIONS, inputs_full(lw))


def inputs_full(lw: Lowering) -> bool:
    """Do the captured inputs enter broadcast to the score's shape (``EmitOptions.full_inputs_where_needed``):
    only where the graph emitted without that would have an op with no full operand."""
    o = lowering_mod.OPTIONS
    if o.full_inputs:
        return True
    if not (o.full_inputs_where_needed and lw.spec.n_inputs and lw.emitted and not lw.unsupported):
        return False
    return _first_broadcast_only(_structure(lw, o, False)) is not None


def broadcast_only_op(lw: Lowering) -> Optional[str]:
    """The first emitted op none of whose operands is a full [B, H, L, S] tensor (only captured inputs,
    pass-by-value constants and scalars: ``mul(T0[h], 2.0)`` in the bprop of ``sqrt(|s * 2 * T0[h] * (kv - q)|)``),
    as text, or None. cuDNN 9.19 and 9.27 ran such graphs into a misaligned address, which left the CUDA context
    unusable, so a site whose emission still has one stays with Inductor (``inputs_full`` removes them)."""
    if not lw.emitted or lw.unsupported or lw.alibi:
        return None
    return _first_broadcast_only(structure(lw))


def _first_broadcast_only(st: tuple) -> Optional[str]:
    full: dict = {}
    part = "score_mod"
    for i, entry in enumerate(st):
        name = entry[0]
        if name in ("score_mod", "bprop"):
            part = "bprop"
            continue
        if name == "dtype":
            continue
        full[i] = any(isinstance(t, tuple) and (t[0] in ("score", "dS") or (t[0] == "t" and full.get(t[1])))
                      for t in entry[1])
        if not full[i]:
            args = ", ".join(_operand_text(t) for t in entry[1])
            return f"{name}({args}) in the {'score_mod' if part == 'score_mod' else 'derived backward'}"
    return None


def _operand_text(t: Any) -> str:
    if not isinstance(t, tuple):
        return str(t)
    if t[0] == "in":
        return f"input {t[1]}"
    if t[0] == "pbv":
        return "a constant"
    if t[0] == "scalar":
        return f"{t[1]:g}"
    return "an intermediate"


@functools.lru_cache(maxsize=1024)
def _structure(lw: Lowering, options: lowering_mod.EmitOptions, full_inputs: bool) -> tuple:
    rec = _Recorder()
    consts = {v: _Rec(("pbv", j)) for j, v in enumerate(lw.constants)}
    inputs = [_Rec(("in", i)) for i in range(lw.spec.n_inputs)]
    em = Emitter(lw, inputs, consts, full_inputs)
    rec.entries.append(("score_mod", rec.ref(em.score_mod(rec, _Rec(("score",))))))
    if em.needs_bprop:
        rec.entries.append(("bprop", rec.ref(em.bprop(rec, _Rec(("dS",))))))
    return tuple(rec.entries)


class _Rec:
    """A tensor of the recording graph."""

    __slots__ = ("tag", "rec")

    def __init__(self, tag: tuple, rec: "Optional[_Recorder]" = None):
        self.tag, self.rec = tag, rec

    def set_data_type(self, dt: Any) -> "_Rec":
        if self.rec is not None:
            self.rec.entries.append(("dtype", self.tag, str(dt)))
        return self


class _Recorder:
    """Stands in for a cuDNN graph: logs every op with its operands and attributes."""

    def __init__(self) -> None:
        # not "log": every other attribute name stands for a graph op (graph.log is the logarithm)
        self.entries: list = []

    def ref(self, x: Any) -> Any:
        return x.tag if isinstance(x, _Rec) else repr(x)

    def tensor_scalar(self, value: float, kind: Any) -> _Rec:
        return _Rec(("scalar", float(value), str(kind)))

    def __getattr__(self, name: str):
        def op(*args: Any, **kwargs: Any) -> _Rec:
            entry = (name, tuple(self.ref(a) for a in args),
                     tuple(sorted((k, self.ref(v)) for k, v in kwargs.items())))
            self.entries.append(entry)
            return _Rec(("t", len(self.entries) - 1), self)
        return op


class _DistinctOperands:
    """A cuDNN graph whose ops never get one tensor as two operands: a repeated operand goes through an identity
    op first (``mul(s, s)`` becomes ``mul(s, identity(s))``), with the op's compute type. EmitOptions.distinct_operands
    says why."""

    __slots__ = ("_g",)

    def __init__(self, g: Any):
        self._g = g

    def __getattr__(self, name: str) -> Any:
        fn = getattr(self._g, name)
        if not callable(fn):
            return fn

        def op(*args: Any, **kwargs: Any) -> Any:
            seen: set = set()
            fixed = []
            for a in args:
                if id(a) in seen and not isinstance(a, (int, float, str, bool)):
                    a = self._identity(a, kwargs.get("compute_data_type", _F32))
                seen.add(id(a))
                fixed.append(a)
            return fn(*fixed, **kwargs)
        return op

    def _identity(self, t: Any, compute: Any) -> Any:
        out = self._g.identity(t, compute_data_type=compute)
        if compute is not _F32:  # integer / boolean operands keep their type (float outputs are inferred)
            out.set_data_type(compute)
        return out


def _distinct(graph: Any) -> Any:
    if not lowering_mod.OPTIONS.distinct_operands or isinstance(graph, _DistinctOperands):
        return graph
    return _DistinctOperands(graph)


def _const_where(e: ir.Expr) -> bool:
    return e.op == "where" and e.args[1].op == "const" and e.args[2].op == "const"


def _negate(c: ir.Expr) -> ir.Expr:
    if c.op in ir.NEGATED:
        return ir.Expr(ir.NEGATED[c.op], c.args)
    if c.op == "and":
        return ir.Expr("or", tuple(_negate(a) for a in c.args))
    if c.op == "or":
        return ir.Expr("and", tuple(_negate(a) for a in c.args))
    if c.op == "not":
        return c.args[0]
    if c.op == "const":
        return ir.Expr.const(not c.value)
    raise ValueError(f"cannot negate {c.op!r}")


class Emitter:
    """Emits a spec's score_mod (+ mask_mod) and its derivative into one cuDNN graph."""

    def __init__(self, lw: Lowering, inputs: Sequence[Any], consts: Optional[dict] = None,
                 full_inputs: bool = False):
        self.full_inputs = full_inputs  # captured inputs enter broadcast to the score's shape (inputs_full)
        self.consts = dict(consts or {})  # value -> pass-by-value IR tensor (outer graph)
        self.score_expr, self.mask = lw.score, lw.mask
        self.inputs = list(inputs)  # IR tensors for (in i), created on the outer graph
        self.lw = lw
        self.first, self.deriv, self.guard, self.clamp = lw.mask_first, lw.deriv, lw.guard, lw.ninf_clamp
        self.g: Any = None
        self.memo: dict = {}

    @property
    def needs_bprop(self) -> bool:
        return self.lw.needs_bprop

    # -- the two callbacks
    def score_mod(self, graph: Any, score: Any) -> Any:
        graph = _distinct(graph)
        self.g, self.memo = graph, {}
        if lowering_mod.OPTIONS.score_identity:  # EmitOptions.score_identity says why
            score = graph.identity(score, compute_data_type=_F32)
        self.score = self.raw = score
        if self.first is not None:  # mask first: cuDNN then skips masked tiles (module docstring)
            s1 = self._select(self.mask, score, self._const(float("-inf")))
            self.score = s1
            out = self._emit(self.score_expr)[0]
            if self.first.needs_min:  # f(-inf) is not -inf: min(f(s1), s1 + BIG) is -inf where masked
                big = self._f(graph.add(s1, self._const(BIG), compute_data_type=_F32))
                out = self._f(graph.min(out, big, compute_data_type=_F32))
            return self._guarded(out, float("-inf"))
        out = self._emit(self.score_expr)[0] if self.score_expr is not None else score
        if self.clamp:  # f(-inf) finite: min(f(s), s + BIG) is -inf where cuDNN feeds -inf, f(s) elsewhere
            big = self._f(graph.add(score, self._const(BIG), compute_data_type=_F32))
            out = self._f(graph.min(out, big, compute_data_type=_F32))
        if self.mask is not None:
            out = self._select(self.mask, out, self._const(float("-inf")))
        return self._guarded(out, float("-inf"))

    def _guarded(self, t: Any, fill: float) -> Any:
        """``t`` where kv_idx < kv_len, ``fill`` past it (the padded part of the last kv tile)."""
        if self.guard is None:
            return t
        return self._select(self.guard, t, self._const(fill))

    def bprop(self, graph: Any, ds: Any) -> Any:
        graph = self.g = _distinct(graph)
        if self.first is not None:
            # f'(s1) is finite where masked (at_neg_inf) and dS is 0 there: no select needed,
            # and a select here would stop cuDNN from skipping masked tiles in the backward
            if self.deriv.is_const():
                c = graph.tensor_scalar(float(self.deriv.value), cudnn.scalar_type.RUNTIME_PARAM)
                return self._guarded(self._f(graph.mul(ds, c, compute_data_type=_F32)), 0.0)
            return self._guarded(self._times(ds, self.deriv), 0.0)
        if self.deriv.is_const() and float(self.deriv.value).is_integer():
            # a bprop that is only mul(dS, <pass-by-value>) or neg(dS) finds no engine ("elemsX !=
            # elemsY", "All input shapes provided are empty"); an integer RUNTIME_PARAM scalar works
            c = graph.tensor_scalar(float(self.deriv.value), cudnn.scalar_type.RUNTIME_PARAM)
            out = self._f(graph.mul(ds, c, compute_data_type=_F32))
        else:
            out = self._times(ds, self.deriv)
        if self.mask is not None:  # dS is 0 where masked; keep a nan/inf f'(s) there out of it
            out = self._select(self.mask, out, self._const(0.0))
        return self._guarded(out, 0.0)

    def _full(self, v: float) -> Any:
        """A float tensor of the score's shape holding ``v`` (cuDNN runs no op on scalars alone):
        ``(kv_idx - kv_idx) + v``, an INT32 zero (index arithmetic) plus the constant in FLOAT."""
        key = ("full", float(v))
        if key not in self.memo:
            if "izero" not in self.memo:
                idx = self._emit(ir.Expr.leaf("kv_idx"))[0]
                z = self.g.sub(idx, idx, compute_data_type=_I32)
                z.set_data_type(_I32)
                self.memo["izero"] = z
            self.memo[key] = self._f(self.g.add(self.memo["izero"], self._const(float(v)), compute_data_type=_F32))
        return self.memo[key]

    def _number(self, e: ir.Expr) -> tuple[Any, str]:
        """``e`` as a number: a bool becomes 1.0 / 0.0 (torch's bool arithmetic)."""
        if ir.kind_of(e) == "bool":
            return self._select(e, self._full(1.0), self._full(0.0)), "float"
        return self._emit(e)

    # -- conditions: nested binary_selects (cuDNN found no engine for logical_and of masks)
    def _select(self, cond: ir.Expr, x: Any, y: Any) -> Any:
        """cond ? x : y, with and / or / not unrolled into selects."""
        ninf = self.memo.get(("const", float("-inf")))  # (looked up, not created: no dangling scalar)
        if x is getattr(self, "raw", None) and ninf is not None and y is ninf and not is_causal_cmp(cond):
            # a select on the raw score with -inf is what cuDNN takes for its causal mask (wrong for any
            # other condition): add a 0 / -inf tensor instead, as a bias would be
            return self._f(self.g.add(x, self._select(cond, self._full(0.0), self._full(float("-inf"))),
                                      compute_data_type=_F32))
        op = cond.op
        if op == "and":
            return self._select(cond.args[0], self._select(cond.args[1], x, y), y)
        if op == "or":
            return self._select(cond.args[0], x, self._select(cond.args[1], x, y))
        if op == "not":
            return self._select(_negate(cond.args[0]), x, y)
        if cond.op == "const":
            return x if cond.value else y
        return self._f(self.g.binary_select(x, y, self._emit(cond)[0]))

    def _times(self, t: Any, e: ir.Expr) -> Any:
        """t * e, distributing over where / mul so no op sees two scalar inputs."""
        if e.op == "const":
            if float(e.value) == 1.0:
                return t
            return self._f(self.g.mul(t, self._const(float(e.value)), compute_data_type=_F32))
        if e.op == "where":
            return self._select(e.args[0], self._times(t, e.args[1]), self._times(t, e.args[2]))
        if e.op == "mul":
            return self._times(self._times(t, e.args[0]), e.args[1])
        return self._f(self.g.mul(t, self._emit(e)[0], compute_data_type=_F32))

    # -- emission
    def _f(self, t: Any) -> Any:
        return t  # float ops: cuDNN infers the FLOAT output (declaring it changed nothing)

    def _binary(self, name: str, a: Any, b: Any, a_scalar: bool) -> Any:
        g = self.g
        if a_scalar:  # cuDNN wants a virtual tensor as a binary op's first input
            if name in ("add", "mul", "min", "max"):
                a, b = b, a
            elif name == "sub":  # c - x = (-x) + c
                return self._f(g.add(self._f(g.neg(b, compute_data_type=_F32)), a, compute_data_type=_F32))
            elif name == "div":  # c / x = (1/x) * c
                return self._f(g.mul(self._f(g.reciprocal(b, compute_data_type=_F32)), a, compute_data_type=_F32))
        return self._f(getattr(g, name)(a, b, compute_data_type=_F32))

    def _const(self, v: float) -> Any:
        v = float(v)
        if v in self.consts:
            return self.consts[v]
        key = ("const", v)
        if key not in self.memo:
            self.memo[key] = self.g.tensor_scalar(v, cudnn.scalar_type.RUNTIME_PARAM)
        return self.memo[key]

    def _emit(self, e: ir.Expr) -> tuple[Any, str]:
        """(cuDNN tensor, kind) with kind in "int" (INT32 index math), "float", "bool"."""
        hit = self.memo.get(e)
        if hit is not None:
            return hit
        r = self._emit_new(e)
        self.memo[e] = r
        return r

    def _emit_new(self, e: ir.Expr) -> tuple[Any, str]:
        g, op = self.g, e.op
        if op not in ("const", "in") and not e.leaves() and not refs_input(e):
            # a constant sub-expression: cuDNN cannot run an op on scalars alone ("All input
            # shapes provided are empty"), so fold it here
            return self._const(float(ir.evaluate(e, {}).item())), "float"
        if op == "score":
            return self.score, "float"
        if op in _AXES:
            t = g.gen_index(self.score, axis=_AXES[op], compute_data_type=_I32)
            t.set_data_type(_I32)
            return t, "int"
        if op == "in":
            if self.full_inputs:  # EmitOptions.full_inputs_where_needed says why
                return self._f(g.add(self._full(0.0), self.inputs[e.value], compute_data_type=_F32)), "float"
            return self.inputs[e.value], "float"
        if op == "const":
            if isinstance(e.value, bool):
                raise ValueError("bool constants are not emitted")
            return self._const(float(e.value)), "float"
        if op == "cast":
            if ir.kind_of(e.args[0]) == "bool" and e.dtype != "bool":
                return self._number(e.args[0])
            t, kind = self._emit(e.args[0])
            return t, ("float" if e.dtype in ir.FLOAT_CASTS else kind)
        row = OPS.get(op)
        style = _STYLES.get(row.cudnn.style) if row is not None and isinstance(row.cudnn, Cudnn) else None
        if style is None:
            raise ValueError(f"no cuDNN emission for {op!r}")
        return style(self, e, row.cudnn)

    # -- one method per emission style (te_compile.score.opdefs.Cudnn.style); ``c`` is the op's row's Cudnn
    def _compare(self, e: ir.Expr, c: Cudnn) -> tuple[Any, str]:
        (a, ka), (b, kb) = self._emit(e.args[0]), self._emit(e.args[1])
        if e.args[0].op == "const":  # c < x  ==  x > c
            a, b, c = b, a, OPS[OPS[e.op].swapped].cudnn
        # index vs index (the causal pattern): BOOLEAN compute as cuDNN's own causal helper,
        # which lets the forward skip masked tiles; anything with a scalar or a float: FLOAT
        both_index = ka == "int" and kb == "int"
        compute = _BOOL if both_index else _F32
        t = getattr(self.g, c.op)(a, b, compute_data_type=compute)
        t.set_data_type(_BOOL)
        return t, "bool"

    def _logical(self, e: ir.Expr, c: Cudnn) -> tuple[Any, str]:
        args = [self._emit(a)[0] for a in e.args]
        t = getattr(self.g, c.op)(*args, compute_data_type=_BOOL)
        t.set_data_type(_BOOL)
        return t, "bool"

    def _where(self, e: ir.Expr, c: Cudnn) -> tuple[Any, str]:
        cond, a, b = e.args
        if a.op == "const" and b.op == "const":
            return self._select(cond, self._full(float(a.value)), self._full(float(b.value))), "float"
        if a.op == "const":  # keep a virtual tensor as binary_select's first input
            cond, a, b = _negate(cond), b, a
        return self._select(cond, self._number(a)[0], self._number(b)[0]), "float"

    def _unary(self, e: ir.Expr, c: Cudnn) -> tuple[Any, str]:
        a, kind = self._number(e.args[0])
        if kind == "int" and c.int_ok:
            t = getattr(self.g, c.op)(a, compute_data_type=_I32)
            t.set_data_type(_I32)
            return t, "int"
        return self._f(getattr(self.g, c.op)(a, compute_data_type=_F32)), "float"

    def _scaled_unary(self, e: ir.Expr, c: Cudnn) -> tuple[Any, str]:
        """op(x * scale): exp2(x) is exp(x ln 2)."""
        x = self._number(e.args[0])[0]
        scaled = self._f(self.g.mul(x, self._const(c.scale), compute_data_type=_F32))
        return self._f(getattr(self.g, c.op)(scaled, compute_data_type=_F32)), "float"

    def _arith(self, e: ir.Expr, c: Cudnn) -> tuple[Any, str]:
        op = e.op
        if c.over_const_where and any(_const_where(x) for x in e.args):
            # x (+-*) where(c, k1, k2)  ->  where(c, x (+-*) k1, x (+-*) k2)
            i = 0 if _const_where(e.args[0]) else 1
            w, other = e.args[i], e.args[1 - i]
            branch = [ir.Expr(op, (w.args[j], other) if i == 0 else (other, w.args[j])) for j in (1, 2)]
            return self._emit(ir.Expr("where", (w.args[0], *branch)))
        if c.score_first and has_score(e.args[1]) and not has_score(e.args[0]):
            return self._emit(ir.Expr(op, (e.args[1], e.args[0])))  # Cudnn.score_first says why
        (a, ka), (b, kb) = self._number(e.args[0]), self._number(e.args[1])
        if c.int_ok and ka == "int" and kb == "int":
            t = getattr(self.g, c.op)(a, b, compute_data_type=_I32)
            t.set_data_type(_I32)
            return t, "int"
        return self._binary(c.op, a, b, e.args[0].op == "const"), "float"

    def _power(self, e: ir.Expr, c: Cudnn) -> tuple[Any, str]:
        """Integer powers up to MAX_INT_POW as products (lowering.MAX_INT_POW says why), others as pow."""
        if e.args[1].op == "const" and float(e.args[1].value).is_integer() \
                and abs(float(e.args[1].value)) <= MAX_INT_POW:
            n = int(float(e.args[1].value))
            if n == 0:
                return self._full(1.0), "float"
            x = self._number(e.args[0])[0]
            t = x
            for _ in range(abs(n) - 1):
                t = self._f(self.g.mul(t, x, compute_data_type=_F32))
            if n < 0:
                t = self._f(self.g.reciprocal(t, compute_data_type=_F32))
            return t, "float"
        return self._arith(e, c)

    def _floor_division(self, e: ir.Expr, c: Cudnn) -> tuple[Any, str]:
        """floordiv as floor(a / b); rem (the "remainder" style) as a - floor(a / b) * b."""
        g = self.g
        (a, _), (b, _) = self._number(e.args[0]), self._number(e.args[1])
        if int_by_const(e):
            # integers by a positive integer constant k: floor((a + 0.5) * (1/k)) is exact for
            # |a| < 2^21 (cuDNN's division is not correctly rounded: floor(6 / 3) gave 1)
            k = float(e.args[1].value)
            half = self._f(g.add(a, self._const(0.5), compute_data_type=_F32))
            q = self._f(getattr(g, c.op)(self._f(g.mul(half, self._const(1.0 / k), compute_data_type=_F32)),
                                         compute_data_type=_F32))
        else:  # float operands: floor(a / b) as eager computes it in float
            q = self._f(getattr(g, c.op)(self._binary("div", a, b, e.args[0].op == "const"), compute_data_type=_F32))
        if c.style == "floor_divide":
            return q, "float"
        # a - floor(a / b) * b  (Python / torch.remainder sign convention)
        return self._binary("sub", a, self._binary("mul", q, b, False), e.args[0].op == "const"), "float"


#: emission style -> the Emitter's method
_STYLES = {"compare": Emitter._compare, "logical": Emitter._logical, "select": Emitter._where,
           "unary": Emitter._unary, "scaled_unary": Emitter._scaled_unary, "arith": Emitter._arith,
           "power": Emitter._power, "floor_divide": Emitter._floor_division, "remainder": Emitter._floor_division}


__all__ = ["Emitter", "structure"]
