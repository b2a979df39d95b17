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

Mask first (``mask_first``): cuDNN skips fully-masked tiles, forward *and* backward, only when
the mask is a ``binary_select(score, -inf, cmp(index, index))`` applied to the raw score and the
bprop reuses the intermediates computed from that masked score without a select of its own
(measured on the H200, bench/probe_skip.py: softcap + causal 0.566 / 1.625 ms -> 0.350 / 0.872).
So for a single index-vs-index comparison mask, te_compile emits ``s1 = select(score, -inf,
mask)``, then ``f(s1)``, then ``min(f(s1), s1 + 1e30)`` when ``f(-inf)`` is not already -inf (exact:
it is ``f(s)`` where kept and -inf where masked), and a bprop ``dS * f'(s1)`` with no select, which
is exact because dS is 0 where masked and ``f'`` is proven finite at -inf (``at_neg_inf``).
Anything else keeps the mask after the score_mod and a masking select in the bprop.
"""

from __future__ import annotations

import functools
import math
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

#: index-vs-index comparisons compute in BOOLEAN (as cuDNN's own causal helper); False: FLOAT
INDEX_CMP_BOOL = True
#: emission choices, settled by measurement on the GPU machine (bench/probe_emit.py):
#: compute type of comparisons ("bool" as cuDNN's own causal helper, or "float")
CMP_COMPUTE = "float"
#: declare FLOAT outputs on float ops (otherwise cuDNN infers them)
FLOAT_OUT = False
#: rewrite binary ops whose first operand is a scalar (cuDNN wants a virtual first input)
SWAP_SCALAR_FIRST = True
#: turn index leaves into FLOAT right after gen_index (no INT32 arithmetic at all)
INDEX_AS_FLOAT = False
#: how constants enter the graph: "scalar" (tensor_scalar RUNTIME_PARAM), "pbv" (pass-by-value
#: [1,1,1,1] FLOAT inputs of the outer graph, fed from the CPU at execute), "pbv_nonint" (pbv for
#: non-integer values only)
CONST_MODE = "pbv"


def _uses_pbv(v: float) -> bool:
    if not math.isfinite(v):
        return False
    return CONST_MODE == "pbv" or (CONST_MODE == "pbv_nonint" and not float(v).is_integer())


@functools.lru_cache(maxsize=1024)
def constants(spec: AttentionSpec) -> tuple[float, ...]:
    """The constants the emitted graph will read as pass-by-value inputs (unique, in order of first
    appearance: specs that differ only in constant values use the same uid for the same place)."""
    out: dict[float, None] = {}

    def walk(e: Optional[ir.Expr]) -> None:
        if e is None:
            return
        if e.op == "const" and not isinstance(e.value, bool) and _uses_pbv(float(e.value)):
            out[float(e.value)] = None
        if e.op == "exp2" and _uses_pbv(ir.LN2):  # emitted as exp(x * ln 2)
            out[ir.LN2] = None
        if e.op in ("floordiv", "rem") and _int_by_const(e):  # the exact integer division's constants
            for v in (0.5, 1.0 / float(e.args[1].value)):
                if _uses_pbv(v):
                    out[v] = None
        if e.op not in ("const", "in") and e.args and not e.leaves() and not _refs_input(e):
            v = float(ir.evaluate(e, {}).item())  # folded at emission
            if _uses_pbv(v):
                out[v] = None
            return
        for a in e.args:
            walk(a)
    score = spec.score_expr()
    walk(score)
    walk(spec.mask_expr())
    plan = mask_first(spec)
    if plan is not None:
        if plan.needs_min:
            out[BIG] = None
        if not plan.deriv.is_const():  # a constant derivative goes in as a RUNTIME_PARAM scalar
            walk(plan.deriv)
    elif score is not None:
        walk(ir.derivative(score))
    return tuple(out)


#: integer powers up to this magnitude are emitted as products (cuDNN's pow of a negative base is
#: NaN even for integer exponents: pow(score * c, 2) gave NaN on the H200)
MAX_INT_POW = 4

#: guard ragged kv lengths: when f(-inf) is not -inf, positions past the kv length (cuDNN pads the
#: last tile) must be masked after the score_mod, or they come back into the softmax (fuzzer: sigmoid
#: and tanh(abs) score_mods, dV 50-170x off at S = 129, 255)
KV_GUARD = True
#: kv tile multiple below which no guard is needed
KV_TILE = 128


@functools.lru_cache(maxsize=1024)
def structure(spec: AttentionSpec, lengths: tuple[int, int] = (0, 0)) -> tuple:
    """What the emitted score_mod / bprop ops are, with pass-by-value constants as slots: the
    transcript of running the Emitter on a recording graph. Two specs with equal structures
    build identical cuDNN graphs that differ only in the values fed at execute, so the graph
    cache keys on this, and a changed softcap or bias slope reuses the built graph."""
    rec = _Recorder()
    consts = {v: _Rec(("pbv", j)) for j, v in enumerate(constants(spec))}
    inputs = [_Rec(("in", i)) for i in range(spec.n_inputs)]
    em = Emitter(spec, inputs, consts, lengths)
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


#: added to the masked score to bound f(s1) from above in ``min(f(s1), s1 + BIG)``
BIG = 1e30


class MaskFirst:
    """How the mask-first emission applies to a spec (see the module docstring)."""

    __slots__ = ("needs_min", "deriv")

    def __init__(self, needs_min: bool, deriv: ir.Expr):
        self.needs_min, self.deriv = needs_min, deriv


@functools.lru_cache(maxsize=1024)
def mask_first(spec: AttentionSpec) -> Optional[MaskFirst]:
    """The mask-first plan for ``spec``, or None to emit the mask after the score_mod."""
    score, mask = spec.score_expr(), spec.mask_expr()
    if score is None or mask is None or not is_causal_cmp(mask):
        # only top-left causal itself: cuDNN treats select(score, -inf, <index compare>) on the raw
        # score as the causal mask when it skips tiles, so any other compare there (an offset
        # q_idx + 256 >= kv_idx, strict kv_idx < q_idx, q_idx <= q_idx) gave wrong results (H200,
        # cuDNN 9.19, tests/test_cuda_flex.py::test_bottom_right_causal and the differential fuzzer)
        return None
    if at_neg_inf(score) == "nan":
        return None
    deriv = ir.derivative(score)
    if deriv.is_const():
        # a bprop that is only dS * <pass-by-value constant> found no engine; integer-valued
        # constants work as RUNTIME_PARAM scalars (non-integer ones give NaN on 9.19)
        v = float(deriv.value)
        if not (math.isfinite(v) and v.is_integer()):
            return None
    elif at_neg_inf(deriv) != "fin":
        return None
    return MaskFirst(at_neg_inf(score) != "-inf", deriv)


def kv_guard(spec: AttentionSpec, lengths: tuple[int, int]) -> Optional[ir.Expr]:
    """``q_idx < L & kv_idx < S`` (the parts needed) when positions past the sequence lengths need
    masking after the score_mod: a score_mod whose value at -inf is not -inf (cuDNN fills the padded
    tail of the last tile with -inf *before* the score_mod; f(-inf) finite lets padded keys into the
    softmax, f(-inf) = +inf turns padded query rows into inf * 0 = NaN in dK / dV) and a length
    that is not a multiple of the tile."""
    e = spec.score_expr()
    if not KV_GUARD or e is None:
        return None
    at, d_at = _ninf(e), _ninf(ir.derivative(e))
    if at == "-inf" and d_at == "fin":
        return None
    # f(-inf) = +inf / NaN or a non-finite f'(-inf): the backward also evaluates positions past the
    # lengths at tile-multiple lengths (sqrt(|s| + 0.5) at L = S = 256: dV 158x off), so guard always;
    # a finite f(-inf) (softcap) only matters where the last tile is padded
    always = at in ("+inf", "nan") or d_at != "fin"
    L, S = lengths
    terms = [ir.Expr("lt", (ir.Expr.leaf(leaf), ir.Expr.const(int(n))))
             for leaf, n in (("kv_idx", S), ("q_idx", L)) if n > 0 and (always or n % KV_TILE)]
    if not terms:
        return None
    return terms[0] if len(terms) == 1 else ir.Expr("and", tuple(terms))


def is_causal_cmp(c: ir.Expr) -> bool:
    """``q_idx >= kv_idx`` or ``q_idx <= kv_idx`` (either spelling): the masks cuDNN may see as a select
    on the raw score (causal, and inverse causal: both measured right on the H200)."""
    if c.op not in ("ge", "le") or len(c.args) != 2 or {a.op for a in c.args} != {"q_idx", "kv_idx"}:
        return False
    return True


def at_neg_inf(e: ir.Expr) -> str:
    """What ``e`` is where the score is -inf and every other leaf is finite: "fin", "+inf", "-inf"
    or "nan" (NaN possible or not known). Sub-expressions without the score are "fin": they take
    the same values as in eager where the score is kept."""
    return _ninf(e)


def _ninf(e: ir.Expr) -> str:
    op = e.op
    if op == "score":
        return "-inf"
    if op == "const":
        v = float(e.value)
        return "fin" if math.isfinite(v) else ("+inf" if v > 0 else ("-inf" if v < 0 else "nan"))
    if not _has_score(e):
        return "fin"
    a = [_ninf(x) for x in e.args]
    if "nan" in a:
        return "nan"
    if op in ("eq", "ne", "lt", "le", "gt", "ge", "and", "or", "not"):
        return "fin"
    if op == "cast":
        return a[0] if e.dtype in _FLOAT_CASTS else ("fin" if a[0] == "fin" else "nan")
    if op == "neg":
        return _NEG[a[0]]
    if op in ("tanh", "sigmoid"):
        return "fin"
    if op in ("exp", "exp2"):
        return "+inf" if a[0] == "+inf" else "fin"
    if op == "abs":
        return "fin" if a[0] == "fin" else "+inf"
    if op == "add":
        return _add(a[0], a[1])
    if op == "sub":
        return _add(a[0], _NEG[a[1]])
    if op in ("mul", "div"):
        x, y = a
        if op == "div":
            if y != "fin":
                return "fin" if x == "fin" else "nan"  # finite / inf = 0
            c = e.args[1]
            if c.op != "const" or float(c.value) == 0:
                return "nan"  # a divisor that may be 0 where the score is -inf
            return x if float(c.value) > 0 else _NEG[x]
        if x == "fin" and y == "fin":
            return "fin"
        if x != "fin" and y != "fin":
            return "+inf" if x == y else "-inf"
        inf, other = (x, e.args[1]) if x != "fin" else (y, e.args[0])
        if other.op != "const" or float(other.value) == 0:
            return "nan"  # inf * (maybe 0)
        return inf if float(other.value) > 0 else _NEG[inf]
    if op == "pow":
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
    if op in ("min", "max"):
        lo, hi = ("-inf", "+inf") if op == "min" else ("+inf", "-inf")
        if lo in a:
            return lo
        return "fin" if all(x == "fin" for x in a) else ("fin" if "fin" in a else hi)
    if op == "where":
        x, y = a[1], a[2]
        return x if x == y else "nan"
    return "nan"  # log, sqrt, rsqrt, sin, cos, tan, rem, floordiv, ...


_NEG = {"fin": "fin", "+inf": "-inf", "-inf": "+inf", "nan": "nan"}


def _add(x: str, y: str) -> str:
    if x == "fin":
        return y
    if y == "fin" or x == y:
        return x
    return "nan"


def _int_by_const(e: ir.Expr) -> bool:
    """``e`` is an integer floordiv / rem by a positive integer constant."""
    c = e.args[1]
    return (c.op == "const" and c.dtype == "int" and int(c.value) > 0 and ir.kind_of(e.args[0]) in ("int", "bool"))


def _has_score(e: ir.Expr) -> bool:
    return e.op == "score" or any(_has_score(a) for a in e.args)


@functools.lru_cache(maxsize=1024)
def unsupported_reason(spec: AttentionSpec) -> Optional[str]:
    """Why the spec's score_mod / mask_mod cannot be emitted to cuDNN, or None."""
    for what, e in (("score_mod", spec.score_expr()), ("mask_mod", spec.mask_expr())):
        if e is None:
            continue
        why = _unsupported(e, cond=(what == "mask_mod"))
        if why:
            return f"{what} on cuDNN: {why}"
    return None


def _unsupported(e: ir.Expr, cond: bool = False) -> Optional[str]:
    if e.op in ("and", "or", "not"):  # as a value it is a 1.0 / 0.0 select (Emitter._number)
        return next((w for w in (_unsupported(a, True) for a in e.args) if w), None)
    if e.op == "where":
        return next((w for w in (_unsupported(a, i == 0) for i, a in enumerate(e.args)) if w), None)
    if e.op in ("score", "q_idx", "kv_idx", "in"):
        return None
    if e.op in ("b", "h"):
        return None if e.op == "b" else "a head-index term outside a (b, h) input"
    if e.op == "const":
        return "a bool constant" if e.dtype == "bool" else None
    if e.op == "cast":
        src = ir.kind_of(e.args[0])
        if e.dtype in _FLOAT_CASTS or (e.dtype.startswith("int") and src in ("int", "bool")):
            return _unsupported(e.args[0], cond=(src == "bool"))
        return f"a cast from {src} to {e.dtype}"
    if e.op == "pow" and e.args[1].op != "const":
        return "pow with a non-constant exponent"
    if e.op in ("floordiv", "rem") and ir.kind_of(e.args[0]) != "float" and ir.kind_of(e.args[1]) != "float" \
            and not _int_by_const(e):
        return f"integer {e.op} by a non-constant or non-positive divisor (cuDNN's division is inexact)"
    if e.op in ("buf", "index"):
        return "a captured-tensor gather"
    if e.op not in (*_FLOAT_UNARY, *_ARITH, *_CMP, "and", "or", "not", "where", "rem", "floordiv", "exp2"):
        return f"no cuDNN op for {e.op!r}"
    for a in e.args:
        why = _unsupported(a)
        if why:
            return why
    return None


@functools.lru_cache(maxsize=1024)
def native_band(spec: AttentionSpec) -> Optional[tuple[Optional[int], int]]:
    """(left bound or None, right bound) when the mask_mod is a causal band and there is no
    score_mod: cuDNN's native diagonal band (top-left aligned), which skips masked tiles.

    ``q_idx - kv_idx >= lo`` with ``lo <= 0`` is right bound ``-lo`` (``kv_idx <= q_idx - lo``):
    0 is top-left causal, ``S - L`` is bottom-right causal (``q_idx + (S - L) >= kv_idx``, flex's
    spelling of it). cuDNN's left bound counts the visible keys including the diagonal
    (``q_idx - kv_idx <= W`` -> W + 1)."""
    if spec.score or not spec.mask_mod:
        return None
    lo, hi = _d_bounds(spec.mask_expr())
    if lo is None or lo > 0:
        return None  # no right bound, or one left of the diagonal: in-graph mask
    if hi is not None and hi < 0:
        return None
    return (None if hi is None else hi + 1, -lo)


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


def _const_where(e: ir.Expr) -> bool:
    return e.op == "where" and e.args[1].op == "const" and e.args[2].op == "const"


_FLIP = {"ge": "lt", "lt": "ge", "le": "gt", "gt": "le", "eq": "ne", "ne": "eq"}


def _negate(c: ir.Expr) -> ir.Expr:
    if c.op in _FLIP:
        return ir.Expr(_FLIP[c.op], c.args)
    if c.op == "and":
        return ir.Expr("or", tuple(_negate(a) for a in c.args))
    if c.op == "or":
        return ir.Expr("and", tuple(_negate(a) for a in c.args))
    if c.op == "not":
        return c.args[0]
    if c.op == "const":
        return ir.Expr.const(not c.value)
    raise ValueError(f"cannot negate {c.op!r}")


def _refs_input(e: ir.Expr) -> bool:
    return e.op == "in" or any(_refs_input(a) for a in e.args)


class Emitter:
    """Emits a spec's score_mod (+ mask_mod) and its derivative into one cuDNN graph."""

    def __init__(self, spec: AttentionSpec, inputs: Sequence[Any], consts: Optional[dict] = None,
                 lengths: tuple[int, int] = (0, 0)):
        self.consts = dict(consts or {})  # value -> pass-by-value IR tensor (outer graph)
        self.score_expr = spec.score_expr()
        self.mask = spec.mask_expr()
        self.inputs = list(inputs)  # IR tensors for (in i), created on the outer graph
        self.plan = mask_first(spec)
        self.deriv = ir.derivative(self.score_expr) if self.score_expr is not None else None
        self.guard = kv_guard(spec, lengths)
        self.g: Any = None
        self.memo: dict = {}

    @property
    def needs_bprop(self) -> bool:
        return self.deriv is not None and not self.deriv.is_const(1.0)

    # -- the two callbacks
    def score_mod(self, graph: Any, score: Any) -> Any:
        self.g, self.memo = graph, {}
        self.score = self.raw = score
        if self.plan is not None:  # mask first: cuDNN then skips masked tiles (module docstring)
            s1 = self._select(self.mask, score, self._const(float("-inf")))
            self.score = s1
            out = self._emit(self.score_expr)[0]
            if self.plan.needs_min:  # f(-inf) is not -inf: min(f(s1), s1 + BIG) is -inf where masked
                big = self._f(graph.add(s1, self._const(BIG), compute_data_type=_F32))
                out = self._f(graph.min(out, big, compute_data_type=_F32))
            return self._guarded(out, float("-inf"))
        out = self._emit(self.score_expr)[0] if self.score_expr is not None else score
        if self.mask is not None:
            out = self._select(self.mask, out, self._const(float("-inf")))
        return self._guarded(out, float("-inf"))

    def _guarded(self, t: Any, fill: float) -> Any:
        """``t`` where kv_idx < kv_len, ``fill`` past it (the padded part of the last kv tile)."""
        if self.guard is None:
            return t
        return self._select(self.guard, t, self._const(fill))

    def bprop(self, graph: Any, ds: Any) -> Any:
        if self.plan is not None:
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
        if FLOAT_OUT:
            t.set_data_type(_F32)
        return t

    def _binary(self, name: str, a: Any, b: Any, a_scalar: bool) -> Any:
        g = self.g
        if SWAP_SCALAR_FIRST and a_scalar:
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
        if op not in ("const", "in") and not e.leaves() and not _refs_input(e):
            # a constant sub-expression: cuDNN cannot run an op on scalars alone ("All input
            # shapes provided are empty"), so fold it here
            return self._const(float(ir.evaluate(e, {}).item())), "float"
        if op == "score":
            return self.score, "float"
        if op in _AXES:
            t = g.gen_index(self.score, axis=_AXES[op], compute_data_type=_I32)
            t.set_data_type(_I32)
            if INDEX_AS_FLOAT:
                t = g.identity(t, compute_data_type=_F32)
                t.set_data_type(_F32)
                return t, "float"
            return t, "int"
        if op == "in":
            return self.inputs[e.value], "float"
        if op == "const":
            if isinstance(e.value, bool):
                raise ValueError("bool constants are not emitted")
            return self._const(float(e.value)), "float"
        if op == "cast":
            if ir.kind_of(e.args[0]) == "bool" and e.dtype != "bool":
                return self._number(e.args[0])
            t, kind = self._emit(e.args[0])
            return t, ("float" if e.dtype in _FLOAT_CASTS else kind)
        if op in _CMP:
            (a, ka), (b, kb) = self._emit(e.args[0]), self._emit(e.args[1])
            if e.args[0].op == "const":  # c < x  ==  x > c
                a, b, op = b, a, {"lt": "gt", "le": "ge", "gt": "lt", "ge": "le"}.get(op, op)
            # index vs index (the causal pattern): BOOLEAN compute as cuDNN's own causal helper,
            # which lets the forward skip masked tiles; anything with a scalar or a float: FLOAT
            both_index = ka == "int" and kb == "int"
            compute = _BOOL if ((both_index and INDEX_CMP_BOOL) or CMP_COMPUTE == "bool") else _F32
            t = getattr(g, _CMP[op])(a, b, compute_data_type=compute)
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
            c, a, b = e.args
            if a.op == "const" and b.op == "const":
                return self._select(c, self._full(float(a.value)), self._full(float(b.value))), "float"
            if a.op == "const":  # keep a virtual tensor as binary_select's first input
                c, a, b = _negate(c), b, a
            return self._select(c, self._number(a)[0], self._number(b)[0]), "float"
        if op in ("add", "sub", "mul") and any(_const_where(x) for x in e.args):
            # x (+-*) where(c, k1, k2)  ->  where(c, x (+-*) k1, x (+-*) k2)
            i = 0 if _const_where(e.args[0]) else 1
            w, other = e.args[i], e.args[1 - i]
            branch = [ir.Expr(op, (w.args[j], other) if i == 0 else (other, w.args[j])) for j in (1, 2)]
            return self._emit(ir.Expr("where", (w.args[0], *branch)))
        if op == "pow" and e.args[1].op == "const" and float(e.args[1].value).is_integer() \
                and abs(float(e.args[1].value)) <= MAX_INT_POW:
            n = int(float(e.args[1].value))
            if n == 0:
                return self._full(1.0), "float"
            x = self._number(e.args[0])[0]
            t = x
            for _ in range(abs(n) - 1):
                t = self._f(g.mul(t, x, compute_data_type=_F32))
            if n < 0:
                t = self._f(g.reciprocal(t, compute_data_type=_F32))
            return t, "float"
        if op == "exp2":  # 2^x = exp(x ln 2)
            x = self._number(e.args[0])[0]
            return self._f(g.exp(self._f(g.mul(x, self._const(ir.LN2), compute_data_type=_F32)),
                                 compute_data_type=_F32)), "float"
        if op in _FLOAT_UNARY:
            a, kind = self._number(e.args[0])
            if kind == "int" and op in _INT_OK:
                t = getattr(g, op)(a, compute_data_type=_I32)
                t.set_data_type(_I32)
                return t, "int"
            return self._f(getattr(g, _FLOAT_UNARY[op])(a, compute_data_type=_F32)), "float"
        if op in ("add", "mul", "min", "max") and _has_score(e.args[1]) and not _has_score(e.args[0]):
            # the score-dependent operand first: `g + score` with no bprop gave dQ / dK off by 1e10
            # on the H200 (fuzzer), `score + g` is right
            return self._emit(ir.Expr(op, (e.args[1], e.args[0])))
        if op in _ARITH:
            (a, ka), (b, kb) = self._number(e.args[0]), self._number(e.args[1])
            if op in _INT_OK and ka == "int" and kb == "int":
                t = getattr(g, op)(a, b, compute_data_type=_I32)
                t.set_data_type(_I32)
                return t, "int"
            return self._binary(_ARITH[op], a, b, e.args[0].op == "const"), "float"
        if op in ("floordiv", "rem"):
            (a, _), (b, _) = self._number(e.args[0]), self._number(e.args[1])
            if _int_by_const(e):
                # integers by a positive integer constant c: floor((a + 0.5) * (1/c)) is exact for
                # |a| < 2^21 (cuDNN's division is not correctly rounded: floor(6 / 3) gave 1)
                c = float(e.args[1].value)
                half = self._f(g.add(a, self._const(0.5), compute_data_type=_F32))
                q = self._f(g.floor(self._f(g.mul(half, self._const(1.0 / c), compute_data_type=_F32)),
                                    compute_data_type=_F32))
            else:  # float operands: floor(a / b) as eager computes it in float
                q = self._f(g.floor(self._binary("div", a, b, e.args[0].op == "const"), compute_data_type=_F32))
            if op == "floordiv":
                return q, "float"
            # a - floor(a / b) * b  (Python / torch.remainder sign convention)
            return self._binary("sub", a, self._binary("mul", q, b, False), e.args[0].op == "const"), "float"
        raise ValueError(f"no cuDNN emission for {op!r}")


__all__ = ["Emitter", "native_band", "unsupported_reason"]
