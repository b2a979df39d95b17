"""flex ``score_mod`` / ``mask_mod`` subgraph -> ScoreExpr (te_compile.ir), or a readable reason.

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

from ..ir import Expr

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


_UNARY = {
    aten.neg.default: "neg", aten.abs.default: "abs", aten.exp.default: "exp", aten.log.default: "log",
    aten.tanh.default: "tanh", aten.sigmoid.default: "sigmoid", aten.sin.default: "sin",
    aten.cos.default: "cos", aten.tan.default: "tan", aten.sqrt.default: "sqrt", aten.rsqrt.default: "rsqrt",
    aten.logical_not.default: "not",
}
_BINARY = {
    aten.mul.Tensor: "mul", aten.mul.Scalar: "mul", aten.div.Tensor: "div", aten.div.Scalar: "div",
    aten.minimum.default: "min", aten.maximum.default: "max",
    aten.remainder.Scalar: "rem", aten.remainder.Tensor: "rem",
    aten.floor_divide.default: "floordiv", aten.floor_divide.Scalar: "floordiv",
    aten.pow.Tensor_Scalar: "pow", aten.pow.Tensor_Tensor: "pow",
    aten.eq.Tensor: "eq", aten.eq.Scalar: "eq", aten.ne.Tensor: "ne", aten.ne.Scalar: "ne",
    aten.lt.Tensor: "lt", aten.lt.Scalar: "lt", aten.le.Tensor: "le", aten.le.Scalar: "le",
    aten.gt.Tensor: "gt", aten.gt.Scalar: "gt", aten.ge.Tensor: "ge", aten.ge.Scalar: "ge",
    aten.logical_and.default: "and", aten.logical_or.default: "or",
}
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
    t, a, kw = n.target, n.args, n.kwargs
    if t in _IDENTITY:
        return arg(a[0])
    if t in _UNARY:
        return Expr(_UNARY[t], (arg(a[0]),))
    if t == aten.exp2.default:  # exact in the reference (exp(x ln 2) is not: remainder(exp2(4), 1) differs)
        return Expr("exp2", (arg(a[0]),))
    if t in (aten.add.Tensor, aten.add.Scalar, aten.sub.Tensor, aten.sub.Scalar):
        alpha = kw.get("alpha", a[2] if len(a) > 2 else 1)
        rhs = arg(a[1]) if alpha == 1 else Expr("mul", (arg(a[1]), Expr.const(alpha)))
        return Expr("add" if t in (aten.add.Tensor, aten.add.Scalar) else "sub", (arg(a[0]), rhs))
    if t in (aten.rsub.Tensor, aten.rsub.Scalar):  # other - alpha * self  (1 - x)
        alpha = kw.get("alpha", a[2] if len(a) > 2 else 1)
        x = arg(a[0]) if alpha == 1 else Expr("mul", (arg(a[0]), Expr.const(alpha)))
        return Expr("sub", (arg(a[1]), x))
    if t in (aten.bitwise_and.Tensor, aten.bitwise_or.Tensor, aten.bitwise_and.Scalar, aten.bitwise_or.Scalar):
        if not (_is_bool(a[0]) and _is_bool(a[1])):
            raise Untranslatable(f"{_op_name(n)} on integers (bitwise arithmetic has no cuDNN pointwise op)")
        return Expr("and" if "and" in str(t) else "or", (arg(a[0]), arg(a[1])))
    if t == aten.bitwise_not.default:
        if not _is_bool(a[0]):
            raise Untranslatable("bitwise_not on integers")
        return Expr("not", (arg(a[0]),))
    if t == aten.div.Tensor_mode:
        mode = kw.get("rounding_mode", a[2] if len(a) > 2 else None)
        if mode == "floor":
            return Expr("floordiv", (arg(a[0]), arg(a[1])))
        if mode is None:
            return Expr("div", (arg(a[0]), arg(a[1])))
        raise Untranslatable(f"div with rounding_mode={mode!r}")
    if t in _BINARY:
        return Expr(_BINARY[t], (arg(a[0]), arg(a[1])))
    if t == aten.where.self:
        return Expr("where", (arg(a[0]), arg(a[1]), arg(a[2])))
    if t in (aten.clamp.default, aten.clamp_min.default, aten.clamp_max.default):
        x = arg(a[0])
        lo = a[1] if t != aten.clamp_max.default else None
        hi = (a[2] if len(a) > 2 else kw.get("max")) if t == aten.clamp.default else (
            a[1] if t == aten.clamp_max.default else None)
        if lo is not None:
            x = Expr("max", (x, arg(lo)))
        if hi is not None:
            x = Expr("min", (x, arg(hi)))
        return x
    if t in (aten._to_copy.default, aten.to.dtype, aten.type_as.default, aten.to.dtype_layout):
        v = _val(n)
        if v is None or v.dtype not in _DTYPES:
            raise Untranslatable("cast to an unknown dtype")
        return Expr("cast", (arg(a[0]),), dtype=_DTYPES[v.dtype])
    if t in (aten.scalar_tensor.default, aten.full.default, aten.new_ones.default, aten.new_zeros.default,
             aten.new_full.default, aten.ones.default, aten.zeros.default):
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
    if t == aten.index.Tensor:
        base, idx = a[0], a[1]
        if any(i is None for i in idx):
            raise Untranslatable("index with slices")
        return _index(arg(base), [arg(i) for i in idx])
    if t == aten.select.int:  # T[0] with a Python int: the same as T[0] by index when dim is 0
        if (a[1] if len(a) > 1 else kw.get("dim")) != 0:
            raise Untranslatable("select along a dimension other than the first")
        return _index(arg(a[0]), [arg(a[2])])
    if t in (aten.gather.default, aten.index_select.default, operator.getitem):
        raise Untranslatable(f"{_op_name(n)}: gathers from a tensor by index (not pointwise in cuDNN)")
    raise Untranslatable(f"{_op_name(n)} has no cuDNN pointwise equivalent in te_compile's table")


def _index(base: Expr, idx: list[Expr]) -> Expr:
    """``base[idx...]``; chained indexing (``T[b][q_idx]``) is one gather ``T[b, q_idx]``: inside a
    score_mod every index is a scalar, so indexing the result of an index reads the next dims."""
    if base.op == "index":
        return Expr("index", (*base.args, *idx))
    return Expr("index", (base, *idx))


def translate(sub: GraphModule, kind: str, score_dtype: torch.dtype,
              buffers: Sequence[torch.Tensor] = (), buf_offset: int = 0) -> Union[Expr, str]:
    """The ScoreExpr of a score_mod/mask_mod subgraph, or the reason it cannot be translated."""
    try:
        gm = trace_canonical(sub, kind, score_dtype, buffers)
    except Exception as e:  # noqa: BLE001 - data-dependent control flow etc.: keep the node
        return f"could not trace the {kind}_mod to aten ({type(e).__name__}: {str(e).splitlines()[0][:120]})"
    try:
        return to_expr(gm, kind, buf_offset)
    except Untranslatable as e:
        return f"{kind}_mod: {e}"
