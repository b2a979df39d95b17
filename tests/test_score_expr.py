"""flex score_mod / mask_mod -> ScoreExpr: translation from real Dynamo subgraphs, evaluation
equal to the user's function, derivative equal to autograd, text round trip, and reasons."""

import math

import pytest
import torch
from torch.nn.attention.flex_attention import flex_attention

from te_compile.score import ir
from te_compile.passes.score_mod import translate

B, H, L, S = 2, 4, 8, 8


def _subgraphs(score_mod=None, mask_mod=None):
    """(score_mod GraphModule, mask_mod GraphModule) as Dynamo hands them to a backend."""
    from torch.nn.attention.flex_attention import create_block_mask
    got = []

    def capture(gm, example_inputs):
        for n in gm.graph.nodes:
            if n.target is torch.ops.higher_order.flex_attention:
                got.append((getattr(gm, n.args[3].target), getattr(gm, n.args[4][-1].target)))
        return gm.forward

    torch._dynamo.reset()
    q = torch.randn(1, H, L, 8)
    bm = create_block_mask(mask_mod, 1, 1, L, S, device="cpu") if mask_mod else None
    torch.compile(lambda q, k, v: flex_attention(q, k, v, score_mod=score_mod, block_mask=bm),
                  backend=capture, fullgraph=True)(q, q, q)
    assert len(got) == 1
    return got[0]


def _grids(dtype=torch.float64):
    g = torch.Generator().manual_seed(0)
    score = torch.randn(B, H, L, S, generator=g, dtype=dtype) * 3
    idx = lambda n, shape: torch.arange(n, dtype=torch.int32).view(shape)  # noqa: E731
    return {"score": score, "b": idx(B, (B, 1, 1, 1)), "h": idx(H, (1, H, 1, 1)),
            "q_idx": idx(L, (1, 1, L, 1)), "kv_idx": idx(S, (1, 1, 1, S))}


SCORE_MODS = {
    "identity": lambda s, b, h, q, kv: s,
    "times_two": lambda s, b, h, q, kv: s * 2,
    "squared": lambda s, b, h, q, kv: s * s,
    "rel_bias": lambda s, b, h, q, kv: s + (q - kv),
    "rel_causal": lambda s, b, h, q, kv: torch.where(q >= kv, s + (q - kv), float("-inf")),
    "alibi_from_h": lambda s, b, h, q, kv: s + torch.exp2(-((h + 1) * 8.0 / H)) * (kv - q),
    "softcap": lambda s, b, h, q, kv: 30.0 * torch.tanh(s / 30.0),
    "trig": lambda s, b, h, q, kv: torch.sin(s) * torch.cos(s / 2) + torch.tan(s / 10),
    "sigmoid_exp_log": lambda s, b, h, q, kv: torch.sigmoid(s) + torch.log(torch.exp(s / 4) + 1),
    "abs_sqrt_pow": lambda s, b, h, q, kv: torch.sqrt(torch.abs(s) + 1) + s.pow(3) / 10 - torch.rsqrt(s * s + 2),
    "min_max_clamp": lambda s, b, h, q, kv: torch.clamp(s, -2.0, 2.0) + torch.maximum(s, s * 0.5),
    "batch_dependent": lambda s, b, h, q, kv: s * (b + 1),
    "int_arith": lambda s, b, h, q, kv: s + ((q - kv) % 4) + (q // 2),
}
MASK_MODS = {
    "causal": lambda b, h, q, kv: q >= kv,
    "inverse_causal": lambda b, h, q, kv: q < kv,
    "sliding_window": lambda b, h, q, kv: (q >= kv) & (q - kv <= 3),
    "not_diagonal": lambda b, h, q, kv: ~(q == kv) | (b == 0),
}


def _score_expr(fn):
    sub, _ = _subgraphs(score_mod=fn)
    expr = translate(sub, "score", torch.float32)
    assert isinstance(expr, ir.Expr), expr
    return expr


@pytest.mark.parametrize("name", SCORE_MODS)
def test_score_mod_translates_and_evaluates(name):
    fn = SCORE_MODS[name]
    expr = _score_expr(fn)
    assert ir.parse(str(expr)) == expr
    env = _grids()
    want = fn(env["score"], env["b"], env["h"], env["q_idx"], env["kv_idx"])
    got = ir.evaluate(expr, env)
    torch.testing.assert_close(got.to(want.dtype).expand_as(want), want)


@pytest.mark.parametrize("name", SCORE_MODS)
def test_derivative_matches_autograd(name):
    expr = _score_expr(SCORE_MODS[name])
    env = _grids()
    score = env["score"].clone().requires_grad_()
    out = ir.evaluate(expr, {**env, "score": score})
    finite = torch.isfinite(out)
    (auto,) = torch.autograd.grad(out.where(finite, 0).sum(), score)
    d = ir.evaluate(ir.derivative(expr), env).to(torch.float64).expand_as(auto)
    torch.testing.assert_close(d.where(finite.expand_as(d), 0), auto)


@pytest.mark.parametrize("name", MASK_MODS)
def test_mask_mod_translates(name):
    fn = MASK_MODS[name]
    _, sub = _subgraphs(mask_mod=fn)
    expr = translate(sub, "mask", torch.float32)
    assert isinstance(expr, ir.Expr), expr
    env = _grids()
    want = fn(env["b"], env["h"], env["q_idx"], env["kv_idx"])
    got = ir.evaluate(expr, env)
    assert got.dtype == torch.bool
    assert torch.equal(got.expand(B, H, L, S), want.expand(B, H, L, S))


def test_no_mask_is_constant_true():
    _, sub = _subgraphs(score_mod=SCORE_MODS["softcap"])
    assert str(translate(sub, "mask", torch.float32)) == "true"


def test_readable_expressions():
    sub, _ = _subgraphs(score_mod=SCORE_MODS["softcap"])
    assert str(translate(sub, "score", torch.bfloat16)) == "(mul (tanh (div score 30.0)) 30.0)"
    sub, _ = _subgraphs(score_mod=SCORE_MODS["rel_bias"])
    assert str(translate(sub, "score", torch.float32)) == "(add score (sub q_idx kv_idx))"


def test_captured_tensors_become_buffers_and_bh_terms():
    table = torch.randn(2 * L - 1)
    slopes = torch.rand(H)
    sub, _ = _subgraphs(score_mod=lambda s, b, h, q, kv: s + slopes[h] * (kv - q))
    expr = translate(sub, "score", torch.float32, [slopes])
    assert str(expr) == "(add score (mul (index (buf 0) h) (sub kv_idx q_idx)))"
    (rewritten,), terms = ir.extract_bh_terms(expr)
    assert str(rewritten) == "(add score (mul (in 0) (sub kv_idx q_idx)))"
    assert [str(t) for t in terms] == ["(index (buf 0) h)"]
    sub, _ = _subgraphs(score_mod=lambda s, b, h, q, kv: s + table[q - kv + L - 1])
    expr = translate(sub, "score", torch.float32, [table])
    with pytest.raises(ir.NotPointwise, match="gather"):
        ir.extract_bh_terms(expr)


def test_unsupported_op_names_the_op():
    sub, _ = _subgraphs(score_mod=lambda s, b, h, q, kv: s + torch.erf(s))
    why = translate(sub, "score", torch.float32)
    assert isinstance(why, str) and why.startswith("score_mod: erf")


def test_derivative_of_index_only_terms_is_zero_and_constants_fold():
    rel = ir.parse("(add score (mul h (sub kv_idx q_idx)))")
    assert str(ir.derivative(rel)) == "1.0"
    assert str(ir.derivative(ir.parse("(mul score 2.0)"))) == "2.0"
    assert str(ir.derivative(ir.parse("(where (ge q_idx kv_idx) score -inf)"))) == "(where (ge q_idx kv_idx) 1.0 0.0)"


def test_text_round_trip_keeps_constant_types():
    e = ir.parse("(add (mul score 1.0) (cast float32 (add h 1)))")
    assert str(e) == "(add (mul score 1.0) (cast float32 (add h 1)))"
    assert ir.parse("true") != ir.parse("1") != ir.parse("1.0")
    assert math.isinf(ir.parse("-inf").value)


def test_simplify_hugging_face_style_masks():
    hf = ir.parse("(and (and true (cast bool (gt (add kv_idx 0) (sub (add q_idx 0) 64)))) "
                  "(cast bool (le (add kv_idx 0) (add q_idx 0))))")
    s = ir.simplify(hf)
    assert str(s) == "(and (gt kv_idx (sub q_idx 64)) (le kv_idx q_idx))"
    env = _grids()
    assert torch.equal(ir.evaluate(s, env), ir.evaluate(hf, env))
    assert str(ir.simplify(ir.parse("(mul (add score 0) 1.0)"))) == "score"
    # an identity that would change the type is kept: q_idx * 1.0 is a float in torch
    assert ir.kind_of(ir.simplify(ir.parse("(mul q_idx 1.0)"))) == "float"


def test_linear_in_score():
    from te_compile.score import ir
    cases = {"(mul score 2.0)": (2.0, "0.0"), "(sub 1.0 (mul score 0.1))": (-0.1, "1.0"),
             "(div score 8.0)": (0.125, "0.0"), "(mul (tanh (div score 30.0)) 30.0)": None,
             "(mul score score)": None, "(add score (sub q_idx kv_idx))": None, "(mul score 0.0)": None}
    for text, want in cases.items():
        got = ir.linear_in_score(ir.parse(text))
        assert (got if got is None else (got[0], str(got[1]))) == (want if want is None else want), text
        if got is not None:  # a * s + g == e at a few scores
            s = torch.tensor([-3.0, 0.5, 7.0], dtype=torch.float64)
            e = ir.evaluate(ir.parse(text), {"score": s})
            torch.testing.assert_close(got[0] * s + ir.evaluate(got[1], {"score": s}), e.double())
