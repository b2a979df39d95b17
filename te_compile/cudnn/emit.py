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
"""

from __future__ import annotations

from typing import Any, Optional, Sequence

import cudnn

from .. import ir
from ..spec import AttentionSpec

_I32, _F32, _BOOL = cudnn.data_type.INT32, cudnn.data_type.FLOAT, cudnn.data_type.BOOLEAN
_AXES = {"b": 0, "q_idx": 2, "kv_idx": 3}
_FLOAT_UNARY = {"neg": "neg", "abs": "abs", "exp": "exp", "log": "log", "tanh": "tanh", "sigmoid": "sigmoid",
                "sin": "sin", "cos": "cos", "tan": "tan", "sqrt": "sqrt", "rsqrt": "rsqrt"}
_ARITH = {"add": "add", "sub": "sub", "mul": "mul", "div": "div", "min": "min", "max": "max", "pow": "pow"}
_INT_OK = ("add", "sub", "mul", "neg", "abs", "min", "max")
_CMP = {"eq": "cmp_eq", "ne": "cmp_neq", "lt": "cmp_lt", "le": "cmp_le", "gt": "cmp_gt", "ge": "cmp_ge"}
_FLOAT_CASTS = ("float32", "float64", "float16", "bfloat16")


def unsupported_reason(spec: AttentionSpec) -> Optional[str]:
    """Why the spec's score_mod / mask_mod cannot be emitted to cuDNN, or None."""
    for what, e in (("score_mod", spec.score_expr()), ("mask_mod", spec.mask_expr())):
        if e is None:
            continue
        why = _unsupported(e)
        if why:
            return f"{what} on cuDNN: {why}"
    return None


def _unsupported(e: ir.Expr) -> Optional[str]:
    if e.op in ("score", "q_idx", "kv_idx", "in"):
        return None
    if e.op in ("b", "h"):
        return None if e.op == "b" else "a head-index term outside a (b, h) input"
    if e.op == "const":
        return "a bool constant" if e.dtype == "bool" else None
    if e.op == "cast":
        src = ir.kind_of(e.args[0])
        if e.dtype in _FLOAT_CASTS or (e.dtype.startswith("int") and src == "int"):
            return _unsupported(e.args[0])
        return f"a cast from {src} to {e.dtype}"
    if e.op == "pow" and e.args[1].op != "const":
        return "pow with a non-constant exponent"
    if e.op in ("buf", "index"):
        return "a captured-tensor gather"
    if e.op not in (*_FLOAT_UNARY, *_ARITH, *_CMP, "and", "or", "not", "where", "rem", "floordiv"):
        return f"no cuDNN op for {e.op!r}"
    for a in e.args:
        why = _unsupported(a)
        if why:
            return why
    return None


def native_band(spec: AttentionSpec) -> Optional[tuple[Optional[int], int]]:
    """(left bound or None, right bound) when the mask_mod is causal or causal + sliding window
    and there is no score_mod: cuDNN's native diagonal band, which skips masked tiles.

    cuDNN's left bound counts the visible keys including the diagonal (window W -> W + 1)."""
    if spec.score or not spec.mask_mod:
        return None
    lo, hi = _d_bounds(spec.mask_expr())
    if lo != 0:
        return None  # only q_idx - kv_idx >= 0 (top-left causal) maps to right bound 0
    return (None if hi is None else hi + 1, 0)


def _lin(e: ir.Expr) -> Optional[tuple[int, int, int]]:
    """e as a*q_idx + b*kv_idx + c with integer a, b, c (or None)."""
    if e.op == "q_idx":
        return (1, 0, 0)
    if e.op == "kv_idx":
        return (0, 1, 0)
    if e.op == "const" and e.dtype == "int":
        return (0, 0, int(e.value))
    if e.op in ("add", "sub"):
        x, y = _lin(e.args[0]), _lin(e.args[1])
        if x is None or y is None:
            return None
        s = 1 if e.op == "add" else -1
        return (x[0] + s * y[0], x[1] + s * y[1], x[2] + s * y[2])
    if e.op == "neg":
        x = _lin(e.args[0])
        return None if x is None else (-x[0], -x[1], -x[2])
    return None


def _d_bounds(e: ir.Expr) -> tuple[Optional[int], Optional[int]]:
    """Bounds lo <= (q_idx - kv_idx) <= hi implied by a conjunction of comparisons; (None, None)
    when the mask is anything else."""
    if e.op == "and":
        a, b = _d_bounds(e.args[0]), _d_bounds(e.args[1])
        if a == (None, None) or b == (None, None):
            return (None, None)  # one side is not a constraint on q_idx - kv_idx
        los = [x for x in (a[0], b[0]) if x is not None]
        his = [x for x in (a[1], b[1]) if x is not None]
        return (max(los) if los else None, min(his) if his else None)
    if e.op not in _CMP or e.op in ("eq", "ne"):
        return (None, None)
    x, y = _lin(e.args[0]), _lin(e.args[1])
    if x is None or y is None:
        return (None, None)
    a, b, c = x[0] - y[0], x[1] - y[1], x[2] - y[2]  # a*q + b*kv + c  (cmp)  0
    if a == 0 or a != -b or abs(a) != 1:
        return (None, None)
    # a*(q - kv) + c cmp 0  ->  with d = q - kv:  d cmp' -c*a  (flip if a < 0)
    op = e.op
    if a < 0:
        op = {"lt": "gt", "le": "ge", "gt": "lt", "ge": "le"}[op]
    t = -c * a
    if op == "ge":
        return (t, None)
    if op == "gt":
        return (t + 1, None)
    if op == "le":
        return (None, t)
    return (None, t - 1)  # lt


class Emitter:
    """Emits a spec's score_mod (+ mask_mod) and its derivative into one cuDNN graph."""

    def __init__(self, spec: AttentionSpec, inputs: Sequence[Any]):
        self.score_expr = spec.score_expr()
        self.mask = spec.mask_expr()
        self.inputs = list(inputs)  # IR tensors for (in i), created on the outer graph
        self.deriv = ir.derivative(self.score_expr) if self.score_expr is not None else None
        self.g: Any = None
        self.memo: dict = {}

    @property
    def needs_bprop(self) -> bool:
        return self.deriv is not None and not self.deriv.is_const(1.0)

    # -- the two callbacks
    def score_mod(self, graph: Any, score: Any) -> Any:
        self.g, self.memo = graph, {}
        self.score = score
        out = self._emit(self.score_expr)[0] if self.score_expr is not None else score
        if self.mask is not None:
            keep = self._emit(self.mask)[0]
            out = graph.binary_select(out, self._const(float("-inf")), keep)
        return out

    def bprop(self, graph: Any, ds: Any) -> Any:
        d = self._emit(self.deriv)[0]
        out = graph.mul(ds, d)
        if self.mask is not None:  # dS is 0 where masked; keep a nan/inf f'(s) there out of it
            out = graph.binary_select(out, self._const(0.0), self._emit(self.mask)[0])
        return out

    # -- emission
    def _const(self, v: float) -> Any:
        key = ("const", float(v))
        if key not in self.memo:
            self.memo[key] = self.g.tensor_scalar(float(v), cudnn.scalar_type.RUNTIME_PARAM)
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
        if op == "score":
            return self.score, "float"
        if op in _AXES:
            t = g.gen_index(self.score, axis=_AXES[op], compute_data_type=_I32)
            t.set_data_type(_I32)
            return t, "int"
        if op == "in":
            return self.inputs[e.value], "float"
        if op == "const":
            if isinstance(e.value, bool):
                raise ValueError("bool constants are not emitted")
            return self._const(float(e.value)), "float"
        if op == "cast":
            t, kind = self._emit(e.args[0])
            return t, ("float" if e.dtype in _FLOAT_CASTS else kind)
        if op in _CMP:
            (a, _), (b, _) = self._emit(e.args[0]), self._emit(e.args[1])
            t = getattr(g, _CMP[op])(a, b, compute_data_type=_BOOL)
            t.set_data_type(_BOOL)
            return t, "bool"
        if op in ("and", "or"):
            (a, _), (b, _) = self._emit(e.args[0]), self._emit(e.args[1])
            t = getattr(g, "logical_" + op)(a, b, compute_data_type=_BOOL)
            t.set_data_type(_BOOL)
            return t, "bool"
        if op == "not":
            t = g.logical_not(self._emit(e.args[0])[0], compute_data_type=_BOOL)
            t.set_data_type(_BOOL)
            return t, "bool"
        if op == "where":
            c = self._emit(e.args[0])[0]
            (a, _), (b, _) = self._emit(e.args[1]), self._emit(e.args[2])
            return g.binary_select(a, b, c), "float"
        if op in _FLOAT_UNARY:
            a, kind = self._emit(e.args[0])
            if kind == "int" and op in _INT_OK:
                t = getattr(g, op)(a, compute_data_type=_I32)
                t.set_data_type(_I32)
                return t, "int"
            return getattr(g, _FLOAT_UNARY[op])(a, compute_data_type=_F32), "float"
        if op in _ARITH:
            (a, ka), (b, kb) = self._emit(e.args[0]), self._emit(e.args[1])
            if op in _INT_OK and ka == "int" and kb == "int":
                t = getattr(g, op)(a, b, compute_data_type=_I32)
                t.set_data_type(_I32)
                return t, "int"
            return getattr(g, _ARITH[op])(a, b, compute_data_type=_F32), "float"
        if op == "floordiv":  # floor(a / b), exact on integer values below 2^24
            (a, _), (b, _) = self._emit(e.args[0]), self._emit(e.args[1])
            return g.floor(g.div(a, b, compute_data_type=_F32), compute_data_type=_F32), "float"
        if op == "rem":  # a - floor(a / b) * b  (Python / torch.remainder sign convention)
            (a, _), (b, _) = self._emit(e.args[0]), self._emit(e.args[1])
            q = g.floor(g.div(a, b, compute_data_type=_F32), compute_data_type=_F32)
            return g.sub(a, g.mul(q, b, compute_data_type=_F32), compute_data_type=_F32), "float"
        raise ValueError(f"no cuDNN emission for {op!r}")


__all__ = ["Emitter", "native_band", "unsupported_reason"]
