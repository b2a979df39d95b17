"""flex ``score_mod`` / ``mask_mod`` subgraph -> ScoreExpr (te_compile.score.ir), or a readable reason.

The Dynamo spelling of a subgraph differs between torch versions (``__eq__`` call_method on
2.11, ``operator.eq`` on 2.13, kwargs vs args, ...), so the subgraph is first re-traced to
canonical aten with ``make_fx`` on 0-dim fake inputs (score in q's dtype, indices int32), which
gives the same graph on both versions; the translator reads only that aten graph.
"""

from __future__ import annotations

import operator
from typing import Any, Optional, Sequence, Union

import torch
from torch.fx import GraphModule, Node

from ..score.ir import Expr
from ..score.opdefs import OPS, OpDef
from ..reasons import NOT_ON_CUDNN, UNSUPPORTED_ARGS, Reason

aten = torch.ops.aten

SCORE_ARGS = ("score", "b", "h", "q_idx", "kv_idx")
MASK_ARGS = ("b", "h", "q_idx", "kv_idx")


class Untranslatable(ValueError):
    """The subgraph has something cuDNN's pointwise ops cannot express; the message says what."""


def trace_canonical(sub: GraphModule, kind: str, score_dtype: torch.dtype,
                    buffers: Sequence[torch.Tensor] = ()) -> GraphModule:
    """Re-trace a score_mod (``kind="score"``) or mask_mod (``kind="mask"``) to aten."""
    from torch._dynamo._trace_wrapped_higher_order_op import TransformGetItemToIndex
    from torch._guards import detect_fake_mode
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.proxy_tensor import make_fx

    mode = detect_fake_mode() or FakeTensorMode(allow_non_fake_inputs=True)
    with mode, TransformGetItemToIndex():
        idx = [torch.zeros((), dtype=torch.int32) for _ in range(4)]
        args = ([torch.zeros((), dtype=score_dtype)] if kind == "score" else []) + idx
        bufs = [torch.empty_strided(b.shape, b.stride(), dtype=b.dtype, device="cpu") for b in buffers]
        return make_fx(sub, tracing_mode="fake")(*args, *bufs)


def _overload(name: str) -> Any:
    packet, overload = name.rsplit(".", 1)
    return getattr(getattr(aten, packet), overload)


#: aten overload -> the op it translates to one to one (each op's row in te_compile.score.opdefs lists them)
_DIRECT: dict[Any, OpDef] = {_overload(t): row for row in OPS.values() for t in row.aten}
_IDENTITY = {aten.clone.default, aten.detach.default, aten.alias.default, aten.lift_fresh_copy.default}
_DTYPES = {torch.float32: "float32", torch.float64: "float64", torch.float16: "float16",
           torch.bfloat16: "bfloat16", torch.int32: "int32", torch.int64: "int64", torch.bool: "bool"}


def _val(n: Any) -> Optional[torch.Tensor]:
    v = n.meta.get("val") if isinstance(n, Node) else None
    return v if isinstance(v, torch.Tensor) else None


def _is_bool(n: Any) -> bool:
    v = _val(n)
    return isinstance(n, bool) or (v is not None and v.dtype == torch.bool)


def to_expr(gm: GraphModule, kind: str, buf_offset: int = 0) -> Expr:
    """Translate a canonical aten score_mod / mask_mod graph; raises Untranslatable.

    Captured tensors become ``(buf buf_offset + i)``."""
    names = SCORE_ARGS if kind == "score" else MASK_ARGS
    env: dict[Node, Expr] = {}
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    for i, n in enumerate(placeholders):
        env[n] = Expr.leaf(names[i]) if i < len(names) else Expr.ref("buf", buf_offset + i - len(names))

    def arg(a: Any) -> Expr:
        if isinstance(a, Node):
            return env[a]
        if isinstance(a, (bool, int, float)):
            return Expr.const(a)
        raise Untranslatable(f"unsupported argument {a!r}")

    out: Optional[Expr] = None
    for n in gm.graph.nodes:
        if n.op == "placeholder":
            continue
        if n.op == "output":
            res = n.args[0]
            while isinstance(res, (tuple, list)):
                if len(res) != 1:
                    raise Untranslatable(f"returns {len(res)} values")
                res = res[0]
            out = arg(res)
            continue
        if n.op == "get_attr":
            raise Untranslatable(f"reads a tensor constant ({n.target})")
        if n.op != "call_function":
            raise Untranslatable(f"{n.op} {n.target}")
        env[n] = _translate(n, arg)
    if out is None:
        raise Untranslatable("no output")
    return out


def _op_name(n: Node) -> str:
    return str(n.target).replace("aten.", "").replace(".default", "")


def _translate(n: Node, arg) -> Expr:
    t = n.target
    if t in _IDENTITY:
        return arg(n.args[0])
    row = _DIRECT.get(t)
    if row is not None:
        return _from_row(row, n, arg)
    compound = _COMPOUND.get(t)
    if compound is not None:
        return compound(n, arg)
    if t in (aten.gather.default, aten.index_select.default, operator.getitem):
        raise Untranslatable(f"{_op_name(n)}: gathers from a tensor by index (not pointwise in cuDNN)")
    raise Untranslatable(f"{_op_name(n)} has no cuDNN pointwise equivalent in te_compile's table")


def _from_row(row: OpDef, n: Node, arg) -> Expr:
    a, kw = n.args, n.kwargs
    if row.alpha:  # x (+-) alpha * y
        alpha = kw.get("alpha", a[2] if len(a) > 2 else 1)
        rhs = arg(a[1]) if alpha == 1 else Expr("mul", (arg(a[1]), Expr.const(alpha)))
        return Expr(row.name, (arg(a[0]), rhs))
    return Expr(row.name, tuple(arg(a[i]) for i in range(row.arity)))


# -- aten ops that are not one IR op: spelled with several, or one only for some arguments

def _rsub(n: Node, arg) -> Expr:  # other - alpha * self  (1 - x)
    a, kw = n.args, n.kwargs
    alpha = kw.get("alpha", a[2] if len(a) > 2 else 1)
    x = arg(a[0]) if alpha == 1 else Expr("mul", (arg(a[0]), Expr.const(alpha)))
    return Expr("sub", (arg(a[1]), x))


def _bitwise(n: Node, arg) -> Expr:
    a = n.args
    if not (_is_bool(a[0]) and _is_bool(a[1])):
        raise Untranslatable(f"{_op_name(n)} on integers (bitwise arithmetic has no cuDNN pointwise op)")
    return Expr("and" if "and" in str(n.target) else "or", (arg(a[0]), arg(a[1])))


def _bitwise_not(n: Node, arg) -> Expr:
    if not _is_bool(n.args[0]):
        raise Untranslatable("bitwise_not on integers")
    return Expr("not", (arg(n.args[0]),))


def _div_mode(n: Node, arg) -> Expr:
    a, kw = n.args, n.kwargs
    mode = kw.get("rounding_mode", a[2] if len(a) > 2 else None)
    if mode == "floor":
        return Expr("floordiv", (arg(a[0]), arg(a[1])))
    if mode is None:
        return Expr("div", (arg(a[0]), arg(a[1])))
    raise Untranslatable(f"div with rounding_mode={mode!r}")


def _clamp(n: Node, arg) -> Expr:
    t, a, kw = n.target, n.args, n.kwargs
    x = arg(a[0])
    lo = a[1] if t != aten.clamp_max.default else None
    hi = (a[2] if len(a) > 2 else kw.get("max")) if t == aten.clamp.default else (
        a[1] if t == aten.clamp_max.default else None)
    if lo is not None:
        x = Expr("max", (x, arg(lo)))
    if hi is not None:
        x = Expr("min", (x, arg(hi)))
    return x


def _cast(n: Node, arg) -> Expr:
    v = _val(n)
    if v is None or v.dtype not in _DTYPES:
        raise Untranslatable("cast to an unknown dtype")
    return Expr("cast", (arg(n.args[0]),), dtype=_DTYPES[v.dtype])


def _scalar(n: Node, arg) -> Expr:
    t, a = n.target, n.args
    v = _val(n)
    if v is None or v.dim() != 0:
        raise Untranslatable(f"{_op_name(n)} of a non-scalar")
    value = {aten.scalar_tensor.default: lambda: a[0], aten.full.default: lambda: a[1],
             aten.new_full.default: lambda: a[2], aten.new_ones.default: lambda: 1,
             aten.ones.default: lambda: 1, aten.new_zeros.default: lambda: 0,
             aten.zeros.default: lambda: 0}[t]()
    if v.dtype == torch.bool:
        value = bool(value)
    elif v.dtype.is_floating_point:
        value = float(value)
    else:
        value = int(value)
    return Expr.const(value)


def _index_tensor(n: Node, arg) -> Expr:
    base, idx = n.args[0], n.args[1]
    if any(i is None for i in idx):
        raise Untranslatable("index with slices")
    return _index(arg(base), [arg(i) for i in idx])


def _select_int(n: Node, arg) -> Expr:  # T[0] with a Python int: the same as T[0] by index when dim is 0
    a = n.args
    if (a[1] if len(a) > 1 else n.kwargs.get("dim")) != 0:
        raise Untranslatable("select along a dimension other than the first")
    return _index(arg(a[0]), [arg(a[2])])


_COMPOUND = {
    aten.rsub.Tensor: _rsub, aten.rsub.Scalar: _rsub,
    aten.bitwise_and.Tensor: _bitwise, aten.bitwise_or.Tensor: _bitwise, aten.bitwise_and.Scalar: _bitwise,
    aten.bitwise_or.Scalar: _bitwise, aten.bitwise_not.default: _bitwise_not,
    aten.div.Tensor_mode: _div_mode,
    aten.clamp.default: _clamp, aten.clamp_min.default: _clamp, aten.clamp_max.default: _clamp,
    aten._to_copy.default: _cast, aten.to.dtype: _cast, aten.type_as.default: _cast, aten.to.dtype_layout: _cast,
    **{t: _scalar for t in (aten.scalar_tensor.default, aten.full.default, aten.new_ones.default,
                            aten.new_zeros.default, aten.new_full.default, aten.ones.default, aten.zeros.default)},
    aten.index.Tensor: _index_tensor,
    aten.select.int: _select_int,
}


def _index(base: Expr, idx: list[Expr]) -> Expr:
    """``base[idx...]``; chained indexing (``T[b][q_idx]``) is one gather ``T[b, q_idx]``: inside a
    score_mod every index is a scalar, so indexing the result of an index reads the next dims."""
    if base.op == "index":
        return Expr("index", (*base.args, *idx))
    return Expr("index", (base, *idx))


def translate(sub: GraphModule, kind: str, score_dtype: torch.dtype,
              buffers: Sequence[torch.Tensor] = (), buf_offset: int = 0) -> Union[Expr, str]:
    """The ScoreExpr of a score_mod/mask_mod subgraph, or the reason (a ``Reason``) it cannot be translated."""
    try:
        gm = trace_canonical(sub, kind, score_dtype, buffers)
    except Exception as e:  # noqa: BLE001 - data-dependent control flow etc.: keep the node
        return Reason(f"could not trace the {kind}_mod to aten ({type(e).__name__}: {str(e).splitlines()[0][:120]})",
                      UNSUPPORTED_ARGS)
    try:
        return to_expr(gm, kind, buf_offset)
    except Untranslatable as e:
        return Reason(f"{kind}_mod: {e}", NOT_ON_CUDNN)
