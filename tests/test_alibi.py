"""ALiBi with cuDNN's own slopes under a causal mask: recognised at compile time (te_compile.lowering.alibi), lowered
to cuDNN's built-in ALiBi (use_alibi_mask + the causal band) only where it is exact."""

from __future__ import annotations

import pytest
import torch
from torch.nn.attention.flex_attention import create_block_mask, flex_attention

import te_compile
from te_compile.lowering import alibi
from te_compile.score import ir
from te_compile.lowering import lower as lowering

CAUSAL = "(ge q_idx kv_idx)"
ALIBI = "(add score (mul (in 0) (sub kv_idx q_idx)))"


def _gym(heads):  # attention-gym's generate_alibi_bias
    return lambda s, b, h, q, kv: s + torch.exp2(-((h + 1) * 8.0 / heads)) * (kv - q)


def _spec(score, mask, heads, L=128, S=None, causal=True, H=None):
    """The spec te_compile builds for a flex site on CPU (reference target)."""
    H = H or heads
    S = S or L
    torch._dynamo.reset()  # a second compile of the same lambdas would see the captured head count as dynamic
    bm = create_block_mask(lambda b, h, q, kv: q >= kv, 1, 1, L, S, device="cpu") if causal else None
    q = torch.randn(1, H, L, 16)
    k = v = torch.randn(1, H, S, 16)
    rep = te_compile.explain(lambda q, k, v: flex_attention(q, k, v, score_mod=score, block_mask=bm), q, k, v,
                             target="reference")
    (d,) = rep.decisions
    return d.spec


def test_cudnn_slopes_follow_the_alibi_recipe():
    assert alibi.cudnn_slopes(8) == [2.0 ** -(h + 1) for h in range(8)]
    assert alibi.cudnn_slopes(16) == [2.0 ** (-(h + 1) / 2) for h in range(16)]
    # 12 heads: the 8 of the largest power of two, then the odd-indexed slopes of 16 heads
    assert alibi.cudnn_slopes(12) == [2.0 ** -(h + 1) for h in range(8)] + [2.0 ** (-(2 * j + 1) / 2) for j in range(4)]


@pytest.mark.parametrize("score", [ALIBI, "(add (mul (sub kv_idx q_idx) (in 0)) score)",
                                   "(sub score (mul (in 0) (sub q_idx kv_idx)))"])
def test_alibi_spellings(score):
    assert alibi.slope_input(ir.parse(score)) == 0


@pytest.mark.parametrize("score", ["(add score (mul (in 0) (sub q_idx kv_idx)))", "(mul score (in 0))",
                                   "(add score (mul 0.5 (sub kv_idx q_idx)))", "(add (tanh score) (in 0))",
                                   "(sub score (mul (in 0) (sub kv_idx q_idx)))"])
def test_not_alibi(score):
    assert alibi.slope_input(ir.parse(score)) is None


def test_heads_for_checks_the_slope_values():
    s, m = ir.parse(ALIBI), ir.parse(CAUSAL)
    gym16 = ir.parse("(exp2 (neg (div (mul (add h 1) 8.0) 16)))")
    assert alibi.heads_for(s, m, [gym16], 16) == 16
    assert alibi.heads_for(s, m, [gym16], 8) == 0  # the same formula at another head count: other slopes
    assert alibi.heads_for(s, ir.parse("(le kv_idx q_idx)"), [gym16], 16) == 16
    assert alibi.heads_for(s, None, [gym16], 16) == 0  # no causal mask
    assert alibi.heads_for(s, ir.parse("(gt q_idx kv_idx)"), [gym16], 16) == 0
    assert alibi.heads_for(s, m, [ir.parse("(mul 0.5 (add h 1))")], 16) == 0
    assert alibi.heads_for(s, m, [ir.parse("(index (buf 0) h)")], 16) == 0  # slopes in a captured tensor
    assert alibi.heads_for(s, m, [gym16], object()) == 0  # not a concrete head count


def test_flex_site_records_the_checked_head_count():
    assert _spec(_gym(16), None, 16).alibi_heads == 16
    assert _spec(_gym(8), None, 8, L=128, S=256).alibi_heads == 8  # recorded; the lowering decides on lengths
    assert _spec(_gym(16), None, 12).alibi_heads == 0  # 2^(-8(h+1)/16) is not cuDNN's slope for 12 heads
    assert _spec(_gym(16), None, 16, causal=False).alibi_heads == 0
    slopes = torch.tensor(alibi.cudnn_slopes(16))
    assert _spec(lambda s, b, h, q, kv: s + slopes[h] * (kv - q), None, 16).alibi_heads == 0  # values unknown


def test_report_names_builtin_alibi():
    torch._dynamo.reset()
    L = 128
    bm = create_block_mask(lambda b, h, q, kv: q >= kv, 1, 1, L, L, device="cpu")
    q = torch.randn(1, 16, L, 16)
    rep = te_compile.explain(lambda q, k, v: flex_attention(q, k, v, score_mod=_gym(16), block_mask=bm), q, q, q,
                             target="reference")
    assert "(ALiBi with cuDNN's slopes)" in str(rep)


def test_flex_alibi_matches_eager_on_the_reference_target():
    H, L = 8, 64
    bm = create_block_mask(lambda b, h, q, kv: q >= kv, 1, 1, L, L, device="cpu")
    q, k, v = (torch.randn(1, H, L, 16, dtype=torch.float64) for _ in range(3))

    def fn(q, k, v):
        return flex_attention(q, k, v, score_mod=_gym(H), block_mask=bm)
    got = torch.compile(fn, backend=te_compile.backend(target="reference", inner="aot_eager"))(q, k, v)
    torch.testing.assert_close(got, fn(q, k, v))


def test_lowering_uses_builtin_alibi_only_where_exact():
    import dataclasses
    spec = dataclasses.replace(_spec(_gym(16), None, 16), impl="cudnn")
    lw = lowering.lower(spec, (128, 128), heads=16)
    assert lw.alibi and not lw.emitted and lw.band == (None, 0) and lw.constants == ()
    for lengths, heads in (((128, 128), 8), ((128, 256), 16), ((128, 128), 0)):
        other = lowering.lower(spec, lengths, heads=heads)
        assert not other.alibi and other.emitted, (lengths, heads)


def test_builtin_alibi_is_served_on_an_unchecked_cudnn(monkeypatch):
    """Built-in ALiBi emits nothing, so the version gate for emitted graphs does not keep it; the cuDNN support
    check (the frontend's validator) accepts the graph, forward and backward."""
    import dataclasses

    from te_compile.cudnn import check, versions
    monkeypatch.delenv(versions.ENV, raising=False)
    monkeypatch.setattr(versions, "running", lambda: 93100)
    spec = dataclasses.replace(_spec(_gym(16), None, 16, L=256), impl="cudnn")
    q = torch.empty(2, 16, 256, 64, dtype=torch.bfloat16, device="meta")
    assert check.check(q, q, q, None, spec, True, False) is None
    q12 = torch.empty(2, 12, 256, 64, dtype=torch.bfloat16, device="meta")  # slopes not cuDNN's: emitted, gated
    why = check.check(q12, q12, q12, None, spec, True, False)
    assert why is not None and "9.31" in why


def test_builtin_alibi_graph_asks_cudnn_for_alibi():
    import dataclasses

    from te_compile.cudnn import graphs
    spec = dataclasses.replace(_spec(_gym(16), None, 16), impl="cudnn")
    kw = graphs._sdpa_kwargs(lowering.lower(spec, (128, 128), heads=16), 64, None)
    assert kw.get("use_alibi_mask") is True and kw["diagonal_band_right_bound"] == 0 and "score_mod" not in kw


@pytest.mark.parametrize("off", [1e-3, -1e-3, 1e-5])
def test_near_miss_slopes_stay_off_builtin_alibi(off):
    """Slopes a little off cuDNN's (``off`` relative) are the user's own: built-in ALiBi would use cuDNN's slopes
    instead (a logit error growing with the distance), so the spec records no ALiBi head count and the cuDNN
    lowering emits the score_mod with the user's slopes."""
    import dataclasses

    def near(s, b, h, q, kv):
        return s + torch.exp2(-((h + 1) * 8.0 / 16)) * (1.0 + off) * (kv - q)
    spec = _spec(near, None, 16)
    assert spec.alibi_heads == 0 and spec.score == ALIBI
    lw = lowering.lower(dataclasses.replace(spec, impl="cudnn"), (128, 128), heads=16)
    assert not lw.alibi and lw.emitted
    # the same spelling with cuDNN's exact slopes is native: only the slope values decide
    exact = _spec(lambda s, b, h, q, kv: s + torch.exp2(-((h + 1) * 8.0 / 16)) * 1.0 * (kv - q), None, 16)
    assert exact.alibi_heads == 16
