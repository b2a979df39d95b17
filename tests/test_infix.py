"""te_compile.score.infix: the readable form of a score_mod / mask_mod expression.

Two checks: the exact text for hand-picked expressions (precedence, parentheses, every op), and the
meaning: the infix text, evaluated as Python with torch tensors, equals ``ir.evaluate`` of the
expression, for PyTorch's / attention-gym's score_mods and mask_mods (tools.peers) and
random fuzzer expressions, translated by te_compile's own translator.
"""

import math
import types

import pytest
import torch

from te_compile.score import ir
from te_compile.score.infix import infix
from te_compile.score.opdefs import OPS

CASES = [
    # arithmetic and precedence
    ("(mul (tanh (div score 30.0)) 30.0)", "tanh(score / 30.0) * 30.0"),
    ("(mul 30.0 (tanh (div score 30.0)))", "30.0 * tanh(score / 30.0)"),
    ("(add score (sub q_idx kv_idx))", "score + (q_idx - kv_idx)"),
    ("(add (sub score q_idx) kv_idx)", "score - q_idx + kv_idx"),
    ("(sub score (add q_idx kv_idx))", "score - (q_idx + kv_idx)"),
    ("(sub score (sub q_idx kv_idx))", "score - (q_idx - kv_idx)"),
    ("(mul (add score 1.0) 2.0)", "(score + 1.0) * 2.0"),
    ("(add (mul score 2.0) 1.0)", "score * 2.0 + 1.0"),
    ("(div score (mul 2.0 h))", "score / (2.0 * h)"),
    ("(div (div score 2.0) 3.0)", "score / 2.0 / 3.0"),
    ("(floordiv q_idx 4)", "q_idx // 4"),
    ("(rem (add kv_idx 1) 3)", "(kv_idx + 1) % 3"),
    ("(mul (floordiv q_idx 4) 4)", "q_idx // 4 * 4"),
    # unary minus and powers
    ("(neg score)", "-score"),
    ("(neg (add score 1.0))", "-(score + 1.0)"),
    ("(neg (pow score 2))", "-(score ** 2)"),
    ("(neg -1.0)", "-(-1.0)"),
    ("(neg (neg score))", "-(-score)"),
    ("(pow (neg score) 2)", "(-score) ** 2"),
    ("(pow score 2.0)", "score ** 2.0"),
    ("(pow 2.0 (neg score))", "2.0 ** -score"),
    ("(pow -2.0 score)", "(-2.0) ** score"),
    ("(pow (pow score 2) 3)", "(score ** 2) ** 3"),
    ("(pow score (pow 2 3))", "score ** (2 ** 3)"),
    ("(pow (mul score 2.0) 0.5)", "(score * 2.0) ** 0.5"),
    ("(mul -1.0 score)", "-1.0 * score"),
    ("(sub score -1.0)", "score - -1.0"),
    # functions
    ("(exp2 (neg (mul (add h 1) 0.5)))", "exp2(-((h + 1) * 0.5))"),
    ("(add (log (add (abs score) 1.0)) (sqrt (rsqrt (sigmoid score))))",
     "log(abs(score) + 1.0) + sqrt(rsqrt(sigmoid(score)))"),
    ("(add (sin (cos score)) (tan b))", "sin(cos(score)) + tan(b)"),
    ("(exp (div score 8.0))", "exp(score / 8.0)"),
    ("(min score 1.5)", "min(score, 1.5)"),
    ("(max (min score 1.0) -1.0)", "max(min(score, 1.0), -1.0)"),
    ("(min (max score -1.0) 1.0)", "clamp(score, -1.0, 1.0)"),
    ("(min (max score kv_idx) 1.0)", "min(max(score, kv_idx), 1.0)"),
    ("(where (ge q_idx kv_idx) score -inf)", "where(q_idx >= kv_idx, score, -inf)"),
    ("(where (eq score inf) nan 0.0)", "where(score == inf, nan, 0.0)"),
    # comparisons and logic
    ("(and (ge q_idx kv_idx) (lt (sub q_idx kv_idx) 8))", "(q_idx >= kv_idx) & (q_idx - kv_idx < 8)"),
    ("(le (add kv_idx 0) q_idx)", "kv_idx + 0 <= q_idx"),
    ("(lt (lt q_idx kv_idx) true)", "(q_idx < kv_idx) < True"),
    ("(eq (index (buf 1) q_idx) (index (buf 2) kv_idx))", "buf1[q_idx] == buf2[kv_idx]"),
    ("(not (eq b h))", "~(b == h)"),
    ("(not (not (eq b h)))", "~~(b == h)"),
    ("(not true)", "logical_not(True)"),
    ("(not q_idx)", "logical_not(q_idx)"),
    ("(and q_idx (gt kv_idx 2))", "logical_and(q_idx, kv_idx > 2)"),
    ("(or q_idx kv_idx)", "logical_or(q_idx, kv_idx)"),
    ("(or (and (lt b 1) (gt h 0)) (eq q_idx 0))", "((b < 1) & (h > 0)) | (q_idx == 0)"),
    ("(and (or (lt b 1) (gt h 0)) (eq q_idx 0))", "((b < 1) | (h > 0)) & (q_idx == 0)"),
    ("(or (or (lt b 1) (gt h 0)) (eq q_idx 0))", "(b < 1) | (h > 0) | (q_idx == 0)"),
    ("(and (lt b 1) (and (gt h 0) (eq q_idx 0)))", "(b < 1) & ((h > 0) & (q_idx == 0))"),
    ("(and true (cast bool (le (add kv_idx 0) q_idx)))", "True & bool(kv_idx + 0 <= q_idx)"),
    ("(add score (mul (gt q_idx kv_idx) 2))", "score + (q_idx > kv_idx) * 2"),
    # inputs, captured tensors, casts, constants
    ("(add score (index (buf 0) h q_idx kv_idx))", "score + buf0[h, q_idx, kv_idx]"),
    ("(mul score (in 0))", "score * in0"),
    ("(add score (mul (ne (in 1) 0.0) (in 0)))", "score + (in1 != 0.0) * in0"),
    ("(cast float32 (sub q_idx kv_idx))", "float32(q_idx - kv_idx)"),
    ("(add score (cast int32 score))", "score + int32(score)"),
    ("(add score 1e-05)", "score + 1e-05"),
    ("(add score false)", "score + False"),
    ("(mul score 3)", "score * 3"),
    # an op this printer does not know
    ("(foo score 1)", "foo(score, 1)"),
]


@pytest.mark.parametrize("sexpr,want", CASES, ids=[c[0] for c in CASES])
def test_infix_text(sexpr, want):
    assert infix(ir.parse(sexpr)) == want


# one expression per IR op and its form: a new row in te_compile.score.opdefs fails here until it has one
EVERY_OP = {
    "neg": ("(neg score)", "-score"), "abs": ("(abs score)", "abs(score)"), "exp": ("(exp score)", "exp(score)"),
    "exp2": ("(exp2 score)", "exp2(score)"), "log": ("(log score)", "log(score)"),
    "log2": ("(log2 score)", "log2(score)"),
    "tanh": ("(tanh score)", "tanh(score)"), "sigmoid": ("(sigmoid score)", "sigmoid(score)"),
    "sin": ("(sin score)", "sin(score)"), "cos": ("(cos score)", "cos(score)"), "tan": ("(tan score)", "tan(score)"),
    "sqrt": ("(sqrt score)", "sqrt(score)"), "rsqrt": ("(rsqrt score)", "rsqrt(score)"),
    "not": ("(not (gt score 0.0))", "~(score > 0.0)"),
    "add": ("(add score h)", "score + h"), "sub": ("(sub score h)", "score - h"),
    "mul": ("(mul score h)", "score * h"), "div": ("(div score h)", "score / h"),
    "pow": ("(pow score h)", "score ** h"), "min": ("(min score h)", "min(score, h)"),
    "max": ("(max score h)", "max(score, h)"), "rem": ("(rem score 3.0)", "score % 3.0"),
    "floordiv": ("(floordiv q_idx 3)", "q_idx // 3"),
    "eq": ("(eq q_idx kv_idx)", "q_idx == kv_idx"), "ne": ("(ne q_idx kv_idx)", "q_idx != kv_idx"),
    "lt": ("(lt q_idx kv_idx)", "q_idx < kv_idx"), "le": ("(le q_idx kv_idx)", "q_idx <= kv_idx"),
    "gt": ("(gt q_idx kv_idx)", "q_idx > kv_idx"), "ge": ("(ge q_idx kv_idx)", "q_idx >= kv_idx"),
    "and": ("(and (gt score 0.0) (le q_idx kv_idx))", "(score > 0.0) & (q_idx <= kv_idx)"),
    "or": ("(or (gt score 0.0) (le q_idx kv_idx))", "(score > 0.0) | (q_idx <= kv_idx)"),
    "where": ("(where (gt score 0.0) score -inf)", "where(score > 0.0, score, -inf)"),
    "index": ("(index (buf 0) h q_idx)", "buf0[h, q_idx]"),
    "cast": ("(cast float16 score)", "float16(score)"),
    "in": ("(mul score (in 2))", "score * in2"), "buf": ("(index (buf 1) b)", "buf1[b]"),
    "const": ("(add (add (add score 2) -0.5) (add true inf))", "score + 2 + -0.5 + (True + inf)"),
}


def test_every_ir_op_has_its_own_form():
    ops = set(OPS) | {"index", "cast", "const"} | set(ir.REFS)
    assert ops <= set(EVERY_OP), sorted(ops - set(EVERY_OP))
    for leaf in ir.LEAVES:
        assert infix(ir.parse(leaf)) == leaf
    for op, (sexpr, want) in EVERY_OP.items():
        assert infix(ir.parse(sexpr)) == want, op
    for dtype in ("float32", "float64", "bfloat16", "int32", "int64", "bool"):
        assert infix(ir.parse(f"(cast {dtype} q_idx)")) == f"{dtype}(q_idx)"


# --------------------------------------------------------------------------- meaning: infix text vs ir.evaluate


def _t(x):
    return x if isinstance(x, torch.Tensor) else torch.as_tensor(x)


def _minmax(fn):
    # as ir.evaluate: the second operand takes the first's dtype
    def f(a, b):
        a = _t(a)
        b = b if isinstance(b, torch.Tensor) else torch.full((), b, dtype=a.dtype)
        return fn(a, b)
    return f


def _cast(dtype):
    return lambda x: x.to(dtype) if isinstance(x, torch.Tensor) else x


_MIN, _MAX = _minmax(torch.minimum), _minmax(torch.maximum)
FUNCTIONS = {
    # the one-operand functions of the infix form (abs, exp, tanh, ...) are their rows' torch functions
    **{r.infix.text: (lambda fn: lambda x: fn(_t(x)))(r.torch_fn)
       for r in OPS.values() if r.infix.form == "function" and r.arity == 1},
    "min": _MIN, "max": _MAX, "clamp": lambda x, lo, hi: _MIN(_MAX(x, lo), hi),
    "where": lambda c, a, b: torch.where(c, a, b),
    "logical_not": lambda x: torch.logical_not(_t(x)),
    "logical_and": lambda a, b: torch.logical_and(_t(a), _t(b)),
    "logical_or": lambda a, b: torch.logical_or(_t(a), _t(b)),
    **{name: _cast(getattr(torch, name)) for name in ("float32", "float64", "float16", "bfloat16", "int32", "int64",
                                                      "bool")},
    "inf": math.inf, "nan": math.nan,
}


def _env(g, B, H, L, S, bufs, inputs):
    return {
        "score": torch.randn(B, H, L, S, generator=g, dtype=torch.float64) * 3,
        "b": torch.arange(B, dtype=torch.int32).view(B, 1, 1, 1),
        "h": torch.arange(H, dtype=torch.int32).view(1, H, 1, 1),
        "q_idx": torch.arange(L, dtype=torch.int32).view(1, 1, L, 1),
        "kv_idx": torch.arange(S, dtype=torch.int32).view(1, 1, 1, S),
        "bufs": list(bufs), "inputs": list(inputs),
    }


def _eval_infix(text, env):
    ns = dict(FUNCTIONS)
    ns.update({k: env[k] for k in ("score", "b", "h", "q_idx", "kv_idx")})
    ns.update({f"buf{i}": t for i, t in enumerate(env["bufs"])})
    ns.update({f"in{i}": t for i, t in enumerate(env["inputs"])})
    return _t(eval(compile(text, "<infix>", "eval"), {"__builtins__": {}}, ns))  # noqa: S307


def _same(e, env):
    text = infix(e)
    want = ir.evaluate(e, env)
    got = _eval_infix(text, env)
    assert (got.dtype == torch.bool) == (want.dtype == torch.bool), (str(e), text, got.dtype, want.dtype)
    got, want = torch.broadcast_tensors(got.double(), want.double())
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6, equal_nan=True,
                               msg=lambda m: f"{e}\n  infix {text}\n{m}")
    return text


def _check_with_inputs(e, env):
    """``e`` as written, and with its (b, h) terms replaced by ``(in i)`` inputs (as the cuDNN target runs it)."""
    _same(e, env)
    try:
        (rewritten,), terms = ir.extract_bh_terms(e)
    except ir.NotPointwise:
        return
    if terms:
        env = dict(env, inputs=[ir.evaluate(t, env).double() for t in terms])
        _same(rewritten, env)


@pytest.mark.parametrize("sexpr", [c[0] for c in CASES if not c[0].startswith("(foo")]
                         + [v[0] for v in EVERY_OP.values()])
def test_infix_means_the_same_hand_picked(sexpr):
    g = torch.Generator().manual_seed(1)
    bufs = [torch.randn(7, 7, 7, generator=g), torch.randint(0, 3, (7,), generator=g), torch.randint(0, 3, (7,), generator=g)]
    env = _env(g, 2, 3, 5, 7, bufs,
               [torch.randn(2, 3, 1, 1, generator=g, dtype=torch.float64),
                (torch.rand(2, 3, 1, 1, generator=g) < 0.5).double(),
                torch.randn(1, 3, 1, 1, generator=g, dtype=torch.float64)])
    _same(ir.parse(sexpr), env)


def _translate(fn, kind, names, tensors):
    """fn's Expr through te_compile's translator, captured globals ``names`` as ``(buf i)``."""
    from te_compile.passes.score_mod import translate

    def sub(*args):
        n = len(args) - len(names)
        g = dict(fn.__globals__)
        g.update(zip(names, args[n:]))
        return types.FunctionType(fn.__code__, g, fn.__name__, fn.__defaults__, fn.__closure__)(*args[:n])

    return translate(sub, kind, torch.float64, [t.detach() for t in tensors])


def test_infix_means_the_same_for_the_peer_mods():
    from tools.peers import PEERS, build_globals, make_fn

    B, H, L, S = 2, 4, 16, 16
    checked = 0
    for peer in PEERS:
        g = torch.Generator().manual_seed(0)
        ns = build_globals(peer, B, H, H, L, S, g, learned_grad=False)
        fn = make_fn(peer, ns)
        names = [c.name for c in peer.captured]
        tensors = [ns[n] for n in names]
        e = _translate(fn, peer.kind, names, tensors)
        if isinstance(e, str):  # not translatable (the site is kept): nothing to print
            continue
        _check_with_inputs(e, _env(g, B, H, L, S, tensors, []))
        checked += 1
    assert checked >= 60, checked


def test_infix_means_the_same_for_random_fuzzer_mods():
    from tools.fuzz import build, make_case

    checked = 0
    for seed in range(120):
        c = make_case(seed, "cpu")
        if c.kind != "flex":
            continue
        ns, _, _ = build(c, "cpu", torch.float64)
        names = [cap["name"] for cap in c.captured]
        tensors = [ns[n].detach() for n in names]
        for kind in ("score", "mask"):
            if not getattr(c, kind):
                continue
            e = _translate(ns[f"{kind}_mod"], kind, names, tensors)
            if isinstance(e, str):
                continue
            _check_with_inputs(e, _env(torch.Generator().manual_seed(seed), c.B, c.H, c.L, c.S, tensors, []))
            checked += 1
    assert checked >= 80, checked
