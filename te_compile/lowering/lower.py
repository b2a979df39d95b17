"""What cuDNN is asked to do for one attention spec: the lowering record, computed once.

``lower(spec, lengths)`` analyses a spec's score_mod / mask_mod once (cached) and returns a
``Lowering``: whether cuDNN can emit it at all (``unsupported``), whether a native diagonal band
serves the mask (``band``, tile skipping) or the mods are emitted as pointwise ops (``emitted``), the
mask-first emission, the derivative, the padded-tile guard and the pass-by-value constants. The
compile-time support check (cudnn/check.py) and the graph builder (cudnn/graphs.py, emit.py) read the
same record. Per op (its value at -inf, whether and how cuDNN emits it) it reads the op's row in
te_compile.score.opdefs. This module does not import the cuDNN frontend, so it runs (and is tested) anywhere.

Emission options (``EmitOptions``) are passed in: ``OPTIONS`` holds the settled choices; diagnosis and
the fuzzer's ``--emit`` change them with ``set_options``.

Mask first (``mask_first``): cuDNN skips fully-masked tiles, forward *and* backward, only when
the mask is a ``binary_select(score, -inf, cmp(index, index))`` applied to the raw score and the
bprop reuses the intermediates computed from that masked score without a select of its own
(docs/cudnn-notes.md, "Tile skipping with a score_mod"). So for a single
index-vs-index comparison mask, te_compile emits ``s1 = select(score, -inf, mask)``, then ``f(s1)``,
then ``min(f(s1), s1 + 1e30)`` when ``f(-inf)`` is not already -inf (exact: it is ``f(s)`` where kept
and -inf where masked), and a bprop ``dS * f'(s1)`` with no select, which is exact because dS is 0
where masked and ``f'`` is proven finite at -inf (``at_neg_inf``). Anything else keeps the mask
after the score_mod and a masking select in the bprop.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Optional

from . import alibi
from ..score import ir
from ..score.opdefs import OPS, Cudnn, NotOnCudnn
from ..spec import AttentionSpec

#: integer powers up to this magnitude are emitted as products (cuDNN's pow of a negative base is
#: NaN even for integer exponents: pow(score * c, 2) gave NaN)
MAX_INT_POW = 4


@dataclasses.dataclass(frozen=True)
class EmitOptions:
    """Emission choices (settled by measurement on the GPU machine; docs/cudnn-notes.md)."""

    #: guard ragged kv lengths: when f(-inf) is not -inf, positions past the kv length (cuDNN pads the
    #: last tile) are masked after the score_mod, or they come back into the softmax (fuzzer: sigmoid
    #: and tanh(abs) score_mods, dV 50-170x off at S = 129, 255)
    kv_guard: bool = True
    #: how constants enter the graph: "pbv" (pass-by-value [1,1,1,1] FLOAT inputs of the outer graph,
    #: fed at execute, so a changed softcap reuses the built graph), "scalar" (RUNTIME_PARAM scalars),
    #: "pbv_nonint" (pass-by-value for non-integer values only)
    const_mode: str = "pbv"
    #: clamp a score_mod with a finite f(-inf) to -inf where cuDNN hands it -inf: ``min(f(s), s + BIG)``
    #: at every length. Without it, tanh(score) / sigmoid(score) gave dV 40-140x off at L = S = 128 and
    #: 256 (tile multiples, no mask; cuDNN 9.19): the backward evaluates the score_mod at -inf
    #: positions even where no tile is padded, and exp(f(-inf) - lse) is not 0
    ninf_clamp: bool = True
    #: never hand one tensor to two operands of an op (``mul(s, s)``, the ``t * t`` of tanh's derivative): the
    #: second use goes through an identity op. cuDNN 9.27's runtime-compiled engines ran such graphs into an
    #: illegal memory access that poisons the CUDA context (docs/cudnn-notes.md)
    distinct_operands: bool = True
    #: the raw score reaches the score_mod through one identity op, so cuDNN's score tensor has a single
    #: consumer. cuDNN 9.27 and 9.28 ran graphs that read the raw score in two ops, one feeding the other
    #: (``score ** 3``, ``maximum(score * 2, score)``), into the same context-killing illegal memory access;
    #: 9.19 ran them. No kernel-time cost measured (docs/cudnn-notes.md)
    score_identity: bool = True
    #: keep (not serve) a site whose emitted graph still has an op with no full [B, H, L, S] operand (only
    #: captured inputs and constants: ``mul(T0[h], 2.0)``). cuDNN 9.19 and 9.27 run such a graph into a misaligned
    #: address that leaves the CUDA context unusable (fuzzer; docs/cudnn-notes.md). With ``full_inputs_where_needed``
    #: no such op is left; 0 serves them anyway, for diagnosis
    keep_broadcast_only: bool = True
    #: a graph that would have such an op gets every captured input broadcast to the score's shape first
    #: (``add(full(0), input)``), so each op has a full operand: the crashing graphs then ran right on 9.19 and 9.27.
    #: Graphs without such an op are emitted as before (no extra op)
    full_inputs_where_needed: bool = True
    #: every graph with captured inputs gets them broadcast (for diagnosis)
    full_inputs: bool = False
    #: treat inverse causal (``kv_idx >= q_idx``) like causal: mask first, a select on the raw score. Off: cuDNN
    #: skipped tiles as if it were causal (``is_causal_cmp``); 1 emits the band without that guard
    mask_first_inverse: bool = False

    def __post_init__(self) -> None:
        if self.const_mode not in ("pbv", "scalar", "pbv_nonint"):
            raise ValueError(f"unknown const_mode {self.const_mode!r}")


OPTIONS = EmitOptions()


def set_options(**changes) -> EmitOptions:
    """Change the process-wide emission options (diagnosis, ``fuzz --emit kv_guard=0``); returns the old ones."""
    global OPTIONS
    old, OPTIONS = OPTIONS, dataclasses.replace(OPTIONS, **changes)
    lower.cache_clear()
    return old


@dataclasses.dataclass(frozen=True)
class Lowering:
    """Everything the support check and the graph builder need to know about one spec at (L, S)."""

    spec: AttentionSpec
    lengths: tuple[int, int]
    options: EmitOptions
    score: Optional[ir.Expr]  # the parsed score_mod (None: identity)
    mask: Optional[ir.Expr]  # the parsed mask_mod (None: no mask)
    #: why the mods cannot be emitted to cuDNN (None: they can)
    unsupported: Optional[str]
    #: cuDNN's native diagonal band (left bound or None, right bound) serving the mask_mod, or None
    band: Optional[tuple[Optional[int], int]]
    #: the mods go into cuDNN as score_mod callbacks (a spec with mods and no built-in band)
    emitted: bool
    deriv: Optional[ir.Expr]  # d score_mod / d score
    mask_first: "Optional[MaskFirst]"
    guard: Optional[ir.Expr]  # the padded-tile guard (kv_guard)
    #: pass-by-value constants in uid order (emitted specs only)
    constants: tuple[float, ...]
    #: emit ``min(f(s), s + BIG)`` after the score_mod (no mask-first emission; ``EmitOptions.ninf_clamp``)
    ninf_clamp: bool = False
    #: cuDNN's built-in ALiBi (``use_alibi_mask``) with the causal ``band`` serves the mods (te_compile.lowering.alibi);
    #: nothing is emitted and the slope input is not read
    alibi: bool = False

    @property
    def needs_bprop(self) -> bool:
        return self.deriv is not None and not self.deriv.is_const(1.0)


@functools.lru_cache(maxsize=2048)
def _lower(spec: AttentionSpec, lengths: tuple[int, int], options: EmitOptions, heads: int = 0) -> Lowering:
    score, mask = spec.score_expr(), spec.mask_expr()
    if builtin_alibi(spec, lengths, heads, score, mask):
        return Lowering(spec, lengths, options, score, mask, None, (None, 0), False, None, None, None, (), alibi=True)
    unsupported = _unsupported_reason(score, mask) if (score is not None or mask is not None) else None
    band = _builtin_band(spec, mask)
    if band is not None and band[0] is not None and lengths[0] > lengths[1]:
        band = None  # "Sliding window attention is only supported with max_s_q <= max_s_kv" (cuDNN 9.19)
    emitted = (score is not None or mask is not None) and band is None
    if unsupported is not None:  # nothing is emitted (the derivative may not even exist)
        return Lowering(spec, lengths, options, score, mask, unsupported, band, emitted, None, None, None, ())
    first = _mask_first(score, mask)
    deriv = ir.derivative(score) if score is not None else None
    clamp = bool(emitted and options.ninf_clamp and first is None and score is not None and needs_ninf_clamp(score))
    consts = _constants(score, mask, first, options.const_mode, clamp) if emitted else ()
    return Lowering(spec, lengths, options, score, mask, None, band, emitted, deriv, first,
                    _kv_guard(score, lengths, options.kv_guard), consts, clamp)


def needs_ninf_clamp(score: ir.Expr) -> bool:
    """Is ``min(f(s), s + BIG)`` needed and exact? f(-inf) finite (so a -inf cuDNN feeds in does not stay
    -inf) and f'(-inf) finite (the bprop ``dS * f'(s)`` stays 0 where dS is 0). Where f(-inf) is +inf or
    f'(-inf) is not finite, the index guard (``_kv_guard``) masks every length instead."""
    return _ninf(score) == "fin" and _ninf(ir.derivative(score)) == "fin"


def lower(spec: AttentionSpec, lengths: tuple[int, int] = (0, 0), options: Optional[EmitOptions] = None,
          heads: int = 0) -> Lowering:
    """The lowering record of ``spec`` at sequence lengths (L, S) ((0, 0): length-independent parts) and
    ``heads`` query heads (0: unknown; only built-in ALiBi depends on it)."""
    return _lower(spec, lengths, options or OPTIONS, heads)


def builtin_alibi(spec: AttentionSpec, lengths: tuple[int, int], heads: int, score: Optional[ir.Expr],
                 mask: Optional[ir.Expr]) -> bool:
    """cuDNN's built-in ALiBi serves the mods: the compile-time check (``spec.alibi_heads``) holds at this head
    count, queries and keys are as many (the ALiBi term and the causal band then agree with cuDNN's alignment),
    and the mods still have the ALiBi form."""
    return (bool(spec.alibi_heads) and heads == spec.alibi_heads and lengths[0] == lengths[1] > 0
            and alibi.slope_input(score) is not None and alibi.is_causal(mask))


lower.cache_clear = _lower.cache_clear  # type: ignore[attr-defined]


def _uses_pbv(v: float, mode: str) -> bool:
    if not math.isfinite(v):
        return False
    return mode == "pbv" or (mode == "pbv_nonint" and not float(v).is_integer())


def _constants(score: Optional[ir.Expr], mask: Optional[ir.Expr], first: "Optional[MaskFirst]",
               mode: str, clamp: bool = False) -> tuple[float, ...]:
    """The constants the emitted graph will read as pass-by-value inputs (unique, in order of first
    appearance: specs that differ only in constant values use the same uid for the same place)."""
    out: dict[float, None] = {}

    def walk(e: Optional[ir.Expr]) -> None:
        if e is None:
            return
        if e.op == "const" and not isinstance(e.value, bool) and _uses_pbv(float(e.value), mode):
            out[float(e.value)] = None
        for v in _emission_constants(e):
            if _uses_pbv(v, mode):
                out[v] = None
        if e.op not in ("const", "in") and e.args and not e.leaves() and not refs_input(e):
            v = float(ir.evaluate(e, {}).item())  # folded at emission
            if _uses_pbv(v, mode):
                out[v] = None
            return
        for a in e.args:
            walk(a)
    walk(score)
    walk(mask)
    if clamp:
        out[BIG] = None
    if first is not None:
        if first.needs_min:
            out[BIG] = None
        if not first.deriv.is_const():  # a constant derivative goes in as a RUNTIME_PARAM scalar
            walk(first.deriv)
    elif score is not None:
        walk(ir.derivative(score))
    return tuple(out)


def _emission_constants(e: ir.Expr) -> tuple[float, ...]:
    """The constants the cuDNN emission of ``e``'s op adds (emit.py's styles): the factor of a scaled
    unary (exp2 is exp(x * ln 2)), the exact integer division's 0.5 and 1 / c."""
    row = OPS.get(e.op)
    c = row.cudnn if row is not None else None
    if not isinstance(c, Cudnn):
        return ()
    if c.style == "scaled_unary":
        return (c.scale,)
    if c.style in ("floor_divide", "remainder") and int_by_const(e):
        return (0.5, 1.0 / float(e.args[1].value))
    return ()


#: kv tile multiple below which no guard is needed
KV_TILE = 128


#: added to the masked score to bound f(s1) from above in ``min(f(s1), s1 + BIG)``
BIG = 1e30


class MaskFirst:
    """How the mask-first emission applies to a spec (see the module docstring)."""

    __slots__ = ("needs_min", "deriv")

    def __init__(self, needs_min: bool, deriv: ir.Expr):
        self.needs_min, self.deriv = needs_min, deriv


def _mask_first(score: Optional[ir.Expr], mask: Optional[ir.Expr]) -> Optional[MaskFirst]:
    """The mask-first emission, or None to emit the mask after the score_mod."""
    if score is None or mask is None or not is_causal_cmp(mask):
        # only top-left causal itself: cuDNN treats select(score, -inf, <index compare>) on the raw
        # score as the causal mask when it skips tiles, so any other compare there (an offset
        # q_idx + 256 >= kv_idx, strict kv_idx < q_idx, q_idx <= q_idx) gave wrong results (cuDNN
        # 9.19, tests/test_cuda_flex.py::test_bottom_right_causal and the differential fuzzer)
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


def _kv_guard(e: Optional[ir.Expr], lengths: tuple[int, int], enabled: bool) -> Optional[ir.Expr]:
    """``q_idx < L & kv_idx < S`` (the parts needed) when positions past the sequence lengths need
    masking after the score_mod: a score_mod whose value at -inf is not -inf (cuDNN fills the padded
    tail of the last tile with -inf *before* the score_mod; f(-inf) finite lets padded keys into the
    softmax, f(-inf) = +inf turns padded query rows into inf * 0 = NaN in dK / dV) and a length
    that is not a multiple of the tile."""
    if not enabled or e is None:
        return None
    at, d_at = _ninf(e), _ninf(ir.derivative(e))
    L, S = lengths
    if at == "-inf" and d_at == "fin":
        # padded query rows of a ragged L are not -inf: q is 0 there, so they see f(0, indices, inputs), and
        # an index term as large as q_idx overflowed exp(f - lse) in the backward (score + q_idx at L = 200,
        # S = 64: dQ / dK inf, cuDNN 9.19). Mask those rows when f reads anything besides the score
        if L > 0 and L % KV_TILE and (e.leaves() - {"score"} or refs_input(e)):
            return ir.Expr("lt", (ir.Expr.leaf("q_idx"), ir.Expr.const(int(L))))
        return None
    # f(-inf) = +inf / NaN or a non-finite f'(-inf): the backward also evaluates positions past the
    # lengths at tile-multiple lengths (sqrt(|s| + 0.5) at L = S = 256: dV 158x off), so guard always;
    # a finite f(-inf) (softcap) only matters where the last tile is padded
    always = at in ("+inf", "nan") or d_at != "fin"
    terms = [ir.Expr("lt", (ir.Expr.leaf(leaf), ir.Expr.const(int(n))))
             for leaf, n in (("kv_idx", S), ("q_idx", L)) if n > 0 and (always or n % KV_TILE)]
    if not terms:
        return None
    return terms[0] if len(terms) == 1 else ir.Expr("and", tuple(terms))


def is_causal_cmp(c: ir.Expr) -> bool:
    """``q_idx >= kv_idx`` (either spelling, ``kv_idx <= q_idx``): the one mask cuDNN may see as a select on the
    raw score. Inverse causal (``kv_idx >= q_idx``) is not: it passed at one tile, and gave outputs ~100% off at
    L = S = 200, D 128 with a score_mod (GPU fuzzer, cuDNN 9.19: cuDNN skips tiles as if it were causal)."""
    if c.op not in ("ge", "le") or len(c.args) != 2 or {a.op for a in c.args} != {"q_idx", "kv_idx"}:
        return False
    big = c.args[0] if c.op == "ge" else c.args[1]
    return big.op == "q_idx" or OPTIONS.mask_first_inverse


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
    if not has_score(e):
        return "fin"
    a = [_ninf(x) for x in e.args]
    if "nan" in a:
        return "nan"
    if op == "cast":
        return a[0] if e.dtype in ir.FLOAT_CASTS else ("fin" if a[0] == "fin" else "nan")
    row = OPS.get(op)
    if row is None or row.at_neg_inf is None:
        return "nan"  # log, sqrt, rsqrt, sin, cos, tan, rem, floordiv, ...: NaN possible or not known
    return row.at_neg_inf(e, a)


def int_by_const(e: ir.Expr) -> bool:
    """``e`` is an integer floordiv / rem by a positive integer constant."""
    c = e.args[1]
    return (c.op == "const" and c.dtype == "int" and int(c.value) > 0 and ir.kind_of(e.args[0]) in ("int", "bool"))


def has_score(e: ir.Expr) -> bool:
    return e.op == "score" or any(has_score(a) for a in e.args)


def _unsupported_reason(score: Optional[ir.Expr], mask: Optional[ir.Expr]) -> Optional[str]:
    """Why the score_mod / mask_mod cannot be emitted to cuDNN, or None."""
    for what, e in (("score_mod", score), ("mask_mod", mask)):
        if e is None:
            continue
        why = _unsupported(e, cond=(what == "mask_mod"))
        if why:
            return f"{what} on cuDNN: {why}"
    return None


def _unsupported(e: ir.Expr, cond: bool = False) -> Optional[str]:
    row = OPS.get(e.op)
    if row is not None and row.kind == "logical":  # as a value it is a 1.0 / 0.0 select (Emitter._number)
        return next((w for w in (_unsupported(a, True) for a in e.args) if w), None)
    if row is not None and row.kind == "select":
        return next((w for w in (_unsupported(a, i == 0) for i, a in enumerate(e.args)) if w), None)
    if e.op in ("score", "q_idx", "kv_idx", "in"):
        return None
    if e.op in ("b", "h"):
        return None if e.op == "b" else "a head-index term outside a (b, h) input"
    if e.op == "const":
        return "a bool constant" if e.dtype == "bool" else None
    if e.op == "cast":
        src = ir.kind_of(e.args[0])
        if e.dtype in ir.FLOAT_CASTS or (e.dtype.startswith("int") and src in ("int", "bool")):
            return _unsupported(e.args[0], cond=(src == "bool"))
        return f"a cast from {src} to {e.dtype}"
    if e.op in ("buf", "index"):
        return "a captured-tensor gather"
    if row is None:
        return f"no cuDNN op for {e.op!r}"
    if isinstance(row.cudnn, NotOnCudnn):
        return row.cudnn.reason
    limit = _STYLE_LIMITS.get(row.cudnn.style)
    why = limit(e) if limit is not None else None
    if why:
        return why
    for a in e.args:
        why = _unsupported(a)
        if why:
            return why
    return None


def _pow_limit(e: ir.Expr) -> Optional[str]:
    return "pow with a non-constant exponent" if e.args[1].op != "const" else None


def _floor_limit(e: ir.Expr) -> Optional[str]:
    if ir.kind_of(e.args[0]) != "float" and ir.kind_of(e.args[1]) != "float" and not int_by_const(e):
        return f"integer {e.op} by a non-constant or non-positive divisor (cuDNN's division is inexact)"
    return None


#: what an emission style (te_compile.score.opdefs.Cudnn.style) cannot emit: the power style takes constant
#: exponents only, the floor divisions are exact on integers only by a positive integer constant
_STYLE_LIMITS = {"power": _pow_limit, "floor_divide": _floor_limit, "remainder": _floor_limit}


def _builtin_band(spec: AttentionSpec, mask: Optional[ir.Expr]) -> Optional[tuple[Optional[int], int]]:
    """(left bound or None, right bound) when the mask_mod is a causal band and there is no
    score_mod: cuDNN's native diagonal band (top-left aligned), which skips masked tiles.

    ``q_idx - kv_idx >= lo`` with ``lo <= 0`` is right bound ``-lo`` (``kv_idx <= q_idx - lo``):
    0 is top-left causal, ``S - L`` is bottom-right causal (``q_idx + (S - L) >= kv_idx``, flex's
    spelling of it). cuDNN's left bound counts the visible keys including the diagonal
    (``q_idx - kv_idx <= W`` -> W + 1)."""
    if spec.score or not spec.mask_mod:
        return None
    lo, hi = diagonal_bounds(mask)
    if lo is None or lo > 0:
        return None  # no right bound, or one left of the diagonal: in-graph mask
    if hi is not None and hi < 0:
        return None
    return (None if hi is None else hi + 1, -lo)


def linear_in_indices(e: ir.Expr) -> Optional[tuple[int, int, int]]:
    """e as a*q_idx + b*kv_idx + c with integer a, b, c (or None)."""
    if e.op == "q_idx":
        return (1, 0, 0)
    if e.op == "kv_idx":
        return (0, 1, 0)
    if e.op == "const" and e.dtype == "int":
        return (0, 0, int(e.value))
    if e.op in ("add", "sub"):
        x, y = linear_in_indices(e.args[0]), linear_in_indices(e.args[1])
        if x is None or y is None:
            return None
        s = 1 if e.op == "add" else -1
        return (x[0] + s * y[0], x[1] + s * y[1], x[2] + s * y[2])
    if e.op == "neg":
        x = linear_in_indices(e.args[0])
        return None if x is None else (-x[0], -x[1], -x[2])
    return None


def diagonal_bounds(e: ir.Expr) -> tuple[Optional[int], Optional[int]]:
    """Bounds lo <= (q_idx - kv_idx) <= hi implied by a conjunction of comparisons; (None, None)
    when the mask is anything else."""
    if e.op == "and":
        a, b = diagonal_bounds(e.args[0]), diagonal_bounds(e.args[1])
        if a == (None, None) or b == (None, None):
            return (None, None)  # one side is not a constraint on q_idx - kv_idx
        los = [x for x in (a[0], b[0]) if x is not None]
        his = [x for x in (a[1], b[1]) if x is not None]
        return (max(los) if los else None, min(his) if his else None)
    if e.op not in ir.COMPARISONS or e.op in ("eq", "ne"):
        return (None, None)
    if any(a.op == "abs" for a in e.args):
        return _abs_bounds(e)
    x, y = linear_in_indices(e.args[0]), linear_in_indices(e.args[1])
    if x is None or y is None:
        return (None, None)
    a, b, c = x[0] - y[0], x[1] - y[1], x[2] - y[2]  # a*q + b*kv + c  (cmp)  0
    if a == 0 or a != -b or abs(a) != 1:
        return (None, None)
    # a*(q - kv) + c cmp 0  ->  with d = q - kv:  d cmp' -c*a  (flip if a < 0)
    op = e.op
    if a < 0:
        op = ir.SWAPPED[op]
    t = -c * a
    if op == "ge":
        return (t, None)
    if op == "gt":
        return (t + 1, None)
    if op == "le":
        return (None, t)
    return (None, t - 1)  # lt


def _abs_bounds(e: ir.Expr) -> tuple[Optional[int], Optional[int]]:
    """A symmetric window ``abs(q_idx - kv_idx + c) <= t`` (or ``<``, either side order) as bounds on
    q_idx - kv_idx; (None, None) for any other use of abs."""
    op, left, right = e.op, e.args[0], e.args[1]
    if left.op != "abs":
        left, right = right, left
        op = ir.SWAPPED[op]
    if left.op != "abs" or op not in ("le", "lt"):
        return (None, None)
    x, y = linear_in_indices(left.args[0]), linear_in_indices(right)
    if x is None or y is None or y[0] or y[1]:
        return (None, None)
    a, b, c = x
    t = y[2] - (1 if op == "lt" else 0)  # integer indices: |x| < t  <=>  |x| <= t - 1
    if abs(a) != 1 or a != -b or t < 0:
        return (None, None)
    # |a*d + c| <= t  <=>  -t <= a*d + c <= t, with d = q_idx - kv_idx and a = +-1
    return (-t - c, t - c) if a == 1 else (c - t, c + t)


def refs_input(e: ir.Expr) -> bool:
    return e.op == "in" or any(refs_input(a) for a in e.args)
