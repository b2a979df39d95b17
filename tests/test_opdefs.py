"""Every row of the op registry (te_compile.score.opdefs), end to end on CPU.

For each op: a tiny score_mod calling the row's torch function translates (passes/score_mod.translate) to an
expression with the op; ``ir.evaluate`` equals torch on the same inputs, ``ir.kind_of`` is the torch result's
kind, the value at -inf (``lowering.at_neg_inf``) agrees with torch at -inf; ``ir.derivative`` equals
autograd (finite differences where torch has no derivative); the text round-trips and the infix form,
evaluated as Python, equals ``ir.evaluate``; and the cuDNN lowering either emits the row's pointwise op on
the recording graph (``emit.structure``) or keeps the site with the row's reason.

A new op is a new row in te_compile.score.opdefs and its line in ``CALLS`` here.
"""

import functools

import pytest
import torch

from te_compile.score import ir
from te_compile.score.infix import infix
from te_compile.score.opdefs import OPS, Cudnn, NotOnCudnn
from te_compile.passes.score_mod import translate
from te_compile.spec import AttentionSpec

B, H, L, S = 2, 3, 5, 7


def _one(fn):  # fn(score)
    return lambda s, b, h, q, kv: fn(s)


def _two(fn):  # fn(score, a float tensor that depends on an index)
    return lambda s, b, h, q, kv: fn(s, kv * 0.5 + 1.0)


def _cmp(fn):  # a comparison of two indices, as a where's condition
    return lambda s, b, h, q, kv: torch.where(fn(q, kv), s, s * 2.0)


# the test data: how a tiny score_mod calls each row's torch function. cuDNN emission unrolls and / or / not
# into selects when they are a where's condition, so the logical ops are compared with another condition
# (then they are emitted as themselves)
CALLS = {
    "neg": _one, "abs": _one, "exp": _one, "exp2": _one, "log": _one, "tanh": _one, "sigmoid": _one, "sin": _one,
    "cos": _one, "tan": _one, "sqrt": _one, "rsqrt": _one, "log2": _one,
    "add": _two, "sub": _two, "mul": _two, "div": _two, "min": _two, "max": _two, "rem": _two, "floordiv": _two,
    "pow": lambda fn: lambda s, b, h, q, kv: fn(s, 1.5),  # cuDNN's pow takes a constant exponent only
    "eq": _cmp, "ne": _cmp, "lt": _cmp, "le": _cmp, "gt": _cmp, "ge": _cmp,
    "and": lambda fn: lambda s, b, h, q, kv: torch.where(fn(q >= kv, q < kv + 3) != (q == kv), s, s * 2.0),
    "or": lambda fn: lambda s, b, h, q, kv: torch.where(fn(q >= kv, q < kv - 3) != (q == kv), s, s * 2.0),
    "not": lambda fn: lambda s, b, h, q, kv: torch.where(fn(q >= kv) != (q == kv), s, s * 2.0),
    "where": lambda fn: lambda s, b, h, q, kv: fn(q >= kv, s, s * 2.0),
}


def _env(score=None):
    g = torch.Generator().manual_seed(0)
    # scores in (0.1, 1.3): inside every op's domain (log, sqrt) and away from tan's pole
    s = torch.rand(B, H, L, S, generator=g, dtype=torch.float64) * 1.2 + 0.1 if score is None else score
    idx = lambda n, shape: torch.arange(n, dtype=torch.int32).view(shape)  # noqa: E731
    return {"score": s, "b": idx(B, (B, 1, 1, 1)), "h": idx(H, (1, H, 1, 1)), "q_idx": idx(L, (1, 1, L, 1)),
            "kv_idx": idx(S, (1, 1, 1, S))}


def _mod(name):
    return CALLS[name](OPS[name].torch_fn)


def _call(mod, env):
    return mod(env["score"], env["b"], env["h"], env["q_idx"], env["kv_idx"])


@functools.lru_cache(maxsize=None)
def _translated(name) -> ir.Expr:
    e = translate(_mod(name), "score", torch.float64)
    assert isinstance(e, ir.Expr), e
    return e


def _nodes(e):
    yield e
    for a in e.args:
        yield from _nodes(a)


def _kind(t: torch.Tensor) -> str:
    return "bool" if t.dtype == torch.bool else ("float" if t.dtype.is_floating_point else "int")


def _close(got, want, what):
    got, want = torch.broadcast_tensors(torch.as_tensor(got).double(), torch.as_tensor(want).double())
    torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-9, equal_nan=True, msg=lambda m: f"{what}\n{m}")


def test_every_row_has_test_data():
    assert set(CALLS) == set(OPS)


@pytest.mark.parametrize("name", list(OPS))
def test_row_translates_and_evaluates(name):
    row, e = OPS[name], _translated(name)
    assert ir.parse(str(e)) == e
    node = next((x for x in _nodes(e) if x.op == name), None)
    assert node is not None, f"{name} not in {e}"
    assert len(node.args) == row.arity
    env = _env()
    _close(ir.evaluate(e, env), _call(_mod(name), env), f"evaluate {e}")
    assert ir.kind_of(node) == _kind(ir.evaluate(node, env)), str(node)
    _check_kind_on_integers(name, env)
    # the value where the score is -inf: "nan" means only "not known to be a number"
    from te_compile.lowering.lower import at_neg_inf
    at = at_neg_inf(node)
    v = ir.evaluate(node, _env(torch.full((B, H, L, S), float("-inf"), dtype=torch.float64))).double()
    if at == "fin":
        assert torch.isfinite(v).all(), (str(node), v)
    elif at in ("+inf", "-inf"):
        assert (v == float(at)).all(), (str(node), v)


def _check_kind_on_integers(name, env):
    """``ir.kind_of`` of the op on index (int) operands, and on bools where torch takes them, is torch's."""
    q, kv1 = ir.Expr.leaf("q_idx"), ir.Expr("add", (ir.Expr.leaf("kv_idx"), ir.Expr.const(1)))  # kv1: no / 0
    t, f = ir.parse("(ge q_idx kv_idx)"), ir.parse("(lt q_idx 2)")
    arity = OPS[name].arity
    for args in ((q, kv1, kv1)[:arity], (t, f, t)[:arity]):
        if arity == 3:
            args = (t, *args[1:])
        e = ir.Expr(name, args)
        try:
            want = _kind(ir.evaluate(e, env))
        except RuntimeError:  # torch refuses (bool - bool, ...)
            continue
        assert ir.kind_of(e) == want, str(e)


def _autograd(mod, env):
    s = env["score"].clone().requires_grad_(True)
    out = _call(mod, dict(env, score=s))
    try:
        (g,) = torch.autograd.grad(out.sum(), s, allow_unused=True)
    except RuntimeError as e:  # floor_divide: "derivative ... is not implemented"
        if "not implemented" not in str(e):
            raise
        h = 1e-6  # central differences, away from the steps (the scores are random)
        with torch.no_grad():
            return (_call(mod, dict(env, score=env["score"] + h)) - _call(mod, dict(env, score=env["score"] - h))) / (2 * h)
    return torch.zeros_like(s) if g is None else g


@pytest.mark.parametrize("name", list(OPS))
def test_row_derivative_matches_autograd(name):
    row, e = OPS[name], _translated(name)
    if row.deriv is None:
        with pytest.raises(ir.NotDifferentiable):
            ir.derivative(e)
        return
    env = _env()
    _close(ir.evaluate(ir.derivative(e), env), _autograd(_mod(name), env), f"d/dscore {e}")


def _functions():
    """The names the infix form calls, bound to the rows' torch functions."""
    ns = {}
    for r in OPS.values():
        if r.infix.form == "function":
            ns[r.infix.text] = r.torch_fn
        if r.infix.otherwise:
            ns[r.infix.otherwise] = r.torch_fn
    return ns


@pytest.mark.parametrize("name", list(OPS))
def test_row_infix_means_the_same(name):
    e, env = _translated(name), _env()
    text = infix(e)
    ns = {**_functions(), **{k: env[k] for k in ("score", "b", "h", "q_idx", "kv_idx")}}
    got = eval(compile(text, "<infix>", "eval"), {"__builtins__": {}}, ns)  # noqa: S307
    _close(got, ir.evaluate(e, env), f"infix {text} of {e}")
    if OPS[name].infix.form == "function":
        assert f"{OPS[name].infix.text}(" in text, text
    elif OPS[name].infix.form in ("operator", "power", "logical"):
        assert f" {OPS[name].infix.text} " in text, text


@pytest.mark.parametrize("name", list(OPS))
def test_row_cudnn_emission(name):
    import cudnn
    from te_compile.cudnn.emit import structure
    from te_compile.lowering.lower import lower

    row, e = OPS[name], _translated(name)
    lw = lower(AttentionSpec(score=str(e), source="flex"), (128, 128))
    if isinstance(row.cudnn, NotOnCudnn):
        assert lw.unsupported == f"score_mod on cuDNN: {row.cudnn.reason}"
        assert not hasattr(cudnn.pygraph, name), f"cuDNN has {name} now: emit it"
        return
    assert isinstance(row.cudnn, Cudnn)
    assert lw.unsupported is None and lw.emitted
    assert hasattr(cudnn.pygraph, row.cudnn.op), row.cudnn.op
    entries = structure(lw)
    forward = [x[0] for x in entries[:entries.index(next(x for x in entries if x[0] == "score_mod"))]]
    assert row.cudnn.op in forward, (str(e), forward)
