"""A regression case per bug class of the differential fuzzer, on CPU (reference target, float64):
each runs compiled with te_compile and in eager, and every output and gradient must agree."""

import math

import pytest
import torch

import te_compile
from te_compile.score import ir
from te_compile.reasons import NOT_EXACT, NOT_ON_CUDNN, category
from tools import fuzz

from fuzz_regressions import CUDA_KEPT, cases

CASES = cases(cuda=False)


@pytest.fixture(scope="module")
def backend():
    return fuzz._prepare("cpu")


#: what each class gets on the reference target: every site served there, except the classes kept with the named
#: reason category (a change either way is a failure: a served class kept loses the feature, a kept one served
#: loses its guard)
KEPT = {"nan_score_under_gathering_mask": NOT_EXACT, "threshold_per_batch": NOT_ON_CUDNN}


def test_every_class_is_pinned():
    assert set(KEPT) <= set(CASES) and len(CASES) >= 45


@pytest.mark.parametrize("name", sorted(CASES))
def test_fuzz_class_matches_eager_and_keeps_its_decision(name, backend):
    outcome, detail, decisions = fuzz.compare(CASES[name], "cpu", backend)
    if name in KEPT:
        assert outcome == "kept", f"{name}: {outcome}: {detail}"
        assert {category(d.reason) for d in decisions if not d.rewrite} == {KEPT[name]}, [d.reason for d in decisions]
    else:
        assert outcome == "pass", f"{name}: {outcome}: {detail}"
        assert decisions and all(d.runs_on == "reference" for d in decisions), [(d.runs_on, d.reason) for d in decisions]


def test_affinity_is_structural():
    for text in ("(add (mul score 2) (gt score 0))", "(rem score 1.0)", "(cast int32 score)",
                 "(mul (cast int32 score) 2.0)", "(add score (mul score (ge q_idx kv_idx)))"):
        assert ir.linear_in_score(ir.parse(text)) is None, text
    a, g = ir.linear_in_score(ir.parse("(div (add score 3.0) -4.0)"))
    assert a == -0.25 and str(g) == "-0.75"


def test_bool_identities_keep_their_type():
    e = ir.parse("(add (mul (ge q_idx kv_idx) 1) (mul (le q_idx kv_idx) 1))")
    assert ir.simplify(e) == e  # bool * 1 is an int: dropping it would make + a logical or
    grids = {"q_idx": torch.arange(3).view(3, 1), "kv_idx": torch.arange(3).view(1, 3)}
    assert ir.evaluate(ir.simplify(e), grids)[1, 1].item() == 2


def test_strict_terms_for_cudnn():
    """Per-batch terms and compared (b, h) terms are not pointwise on cuDNN."""
    for text, why in (("(lt kv_idx (index (buf 0) b))", "batch index"), ("(le q_idx h)", "compares")):
        with pytest.raises(ir.NotPointwise, match=why):
            ir.extract_bh_terms(ir.parse(text), strict=True)
    (e,), terms = ir.extract_bh_terms(ir.parse("(add score (mul (index (buf 0) h) (sub kv_idx q_idx)))"), strict=True)
    assert str(e) == "(add score (mul (in 0) (sub kv_idx q_idx)))" and len(terms) == 1


def test_bias_keeps_only_gathered_terms():
    """Pointwise index terms stay in the score_mod (fp32 in cuDNN), only gathers go to the bf16 bias."""
    e = ir.parse("(add (sub (neg score) (index (buf 0) h (sub q_idx kv_idx))) (mul (index (buf 1) h) (sub kv_idx q_idx)))")

    def pointwise(t):
        try:
            ir.extract_bh_terms(t, strict=True)
            return True
        except ir.NotPointwise:
            return False
    f, g = ir.split_additive(e, pointwise)
    assert "buf 1" in str(f) and "buf 0" not in str(f) and "buf 0" in str(g) and "buf 1" not in str(g)
    f, g = ir.split_additive(ir.parse("(add score (mul (add (index (buf 0) b) kv_idx) 0.1))"), pointwise)
    assert str(g) == "(mul (index (buf 0) b) 0.1)" and "kv_idx" in str(f)


def test_inf_input_gives_nan_rows_as_eager():
    import torch.nn.functional as F
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 1, 4, 8, dtype=torch.float64, generator=g) for _ in range(3))
    k[0, 0, :2, 0], k[0, 0, 2:, 0] = 1.0, -1.0  # row 1's scores: +inf and -inf, so its lse is +inf
    q[0, 0, 1, 0] = math.inf
    fn = lambda q, k, v: F.scaled_dot_product_attention(q, k, v)  # noqa: E731
    got = torch.compile(fn, backend=te_compile.backend(inner="aot_eager", target="reference"))(q, k, v)
    want = fn(q, k, v)
    assert torch.equal(torch.isnan(got), torch.isnan(want)) and torch.isnan(want[0, 0, 1]).all()
    torch.testing.assert_close(got[0, 0, [0, 2, 3]], want[0, 0, [0, 2, 3]])


def test_half_rewritten_graph_is_restored(monkeypatch):
    """A rewrite that fails half-way hands on the graph as Dynamo captured it (not a broken one)."""
    import torch.nn.functional as F
    from te_compile.passes import rewrite

    real = rewrite.apply
    calls = []

    def flaky(gm, d):
        calls.append(d)
        if len(calls) == 2:
            raise RuntimeError("boom")
        real(gm, d)
    monkeypatch.setattr(rewrite, "apply", flaky)
    fn = lambda q, k, v: F.scaled_dot_product_attention(F.scaled_dot_product_attention(q, k, v), k, v)  # noqa: E731
    q, k, v = (torch.randn(1, 2, 8, 8) for _ in range(3))
    torch._dynamo.reset()
    got = torch.compile(fn, backend=te_compile.backend(inner="aot_eager", target="reference"))(q, k, v)
    torch.testing.assert_close(got, fn(q, k, v))
    assert len(calls) == 2


def test_a_select_masks_a_singular_outer_derivative():
    """d/ds sqrt(max(s, 0)) is 0 for s < 0 (eager: maximum's backward masks sqrt'(0) = inf), not inf * 0;
    d/ds |s| is 0 at s == 0 (eager: grad * sgn(s))."""
    s = torch.tensor([-1.0, 0.0, 4.0], dtype=torch.float64)
    grids = {"score": s}
    d = ir.derivative(ir.parse("(sqrt (max score 0.0))"))
    assert ir.evaluate(d, grids).tolist() == [0.0, math.inf, 0.25]
    d = ir.derivative(ir.parse("(abs score)"))
    assert ir.evaluate(d, grids).tolist() == [-1.0, 0.0, 1.0]
    x = s.clone().requires_grad_()  # the same numbers from eager autograd
    (g,) = torch.autograd.grad(torch.sqrt(torch.clamp(x, min=0.0)).sum(), x)
    assert g[0].item() == 0.0 and g[2].item() == 0.25


@pytest.mark.parametrize("text", ["(sub -0.5 (add (add (mul score 2) (mul (eq q_idx (floordiv h 7)) 1)) (gt score 0)))",
                                  "(add (add (mul score 2) (gt score 0)) (add (lt kv_idx 3) (gt q_idx 2)))",
                                  "(neg (add (mul score 0.5) (ge kv_idx q_idx)))"])
def test_split_additive_keeps_bool_terms_numeric(text):
    """Regrouping an additive chain keeps torch's values where a bool term was promoted by the chain's add
    (CPU fuzzer seed 29541: ``-0.5 - ((score * 2 + ...) + (score > 0))`` raised "Subtraction ... with a bool
    tensor"; two bool terms regrouped would add as a logical or)."""
    e = ir.parse(text)
    f, g = ir.split_additive(e)
    gen = torch.Generator().manual_seed(0)
    env = {"score": torch.randn(2, 3, 5, 7, dtype=torch.float64, generator=gen),
           "b": torch.arange(2).view(2, 1, 1, 1), "h": torch.arange(3).view(1, 3, 1, 1),
           "q_idx": torch.arange(5).view(1, 1, 5, 1), "kv_idx": torch.arange(7).view(1, 1, 1, 7)}
    parts = [ir.evaluate(x, env).double() for x in (f, g) if x is not None]
    torch.testing.assert_close(sum(parts).expand_as(env["score"]), ir.evaluate(e, env).double().expand_as(env["score"]))


def test_negative_scale_with_is_causal_stays_with_torch(backend):  # backend: CPU flex with grad (fuzz._prepare)
    """torch's CPU flash SDPA gives NaN in causal rows at a negative scale, its math kernel does not: te_compile
    keeps such a call (its result is torch's own); without is_causal, and for flex, a negative scale is served."""
    import torch.nn.functional as F
    from torch.nn.attention.flex_attention import flex_attention
    from te_compile.reasons import UNSUPPORTED_ARGS, category
    q, k, v = (torch.randn(1, 2, 12, 8, dtype=torch.float64, requires_grad=True) for _ in range(3))
    for causal, served in ((True, False), (False, True)):
        fn = lambda q, k, v: F.scaled_dot_product_attention(q, k, v, scale=-0.3, is_causal=causal)  # noqa: E731
        torch._dynamo.reset()
        (d,) = te_compile.explain(fn, q, k, v, target="reference").decisions
        assert d.rewrite == served, d.reason
        if not served:
            assert "negative scale" in d.reason and category(d.reason) == UNSUPPORTED_ARGS
        torch._dynamo.reset()
        got = torch.compile(fn, backend=te_compile.backend(inner="aot_eager", target="reference"))(q, k, v)
        torch.testing.assert_close(got, fn(q, k, v), equal_nan=True)

    def flex(q, k, v):
        return flex_attention(q, k, v, score_mod=lambda s, b, h, qi, ki: torch.where(qi >= ki, s, -float("inf")),
                              scale=-0.3)
    torch._dynamo.reset()
    got = torch.compile(flex, backend=te_compile.backend(inner="aot_eager", target="reference"))(q, k, v)
    want = flex(q, k, v)
    torch.testing.assert_close(got, want)
    grads = torch.autograd.grad(got.square().sum(), (q, k, v))
    for g, w in zip(grads, torch.autograd.grad(want.square().sum(), (q, k, v))):
        torch.testing.assert_close(g, w)


def test_a_float32_cast_can_make_eager_the_inexact_side(backend):
    """exp of a cubed score cast to float32: eager's gradient is off by ~1e11 against the same math in float64,
    te_compile's matches that math; the fuzzer's CPU tolerance follows eager's own error there."""
    c = CASES["float32_cast_ill_conditioned"]
    want = fuzz.run(c, "cpu", torch.float64)
    high = fuzz._uncast_run(c)
    torch._dynamo.reset()
    got = fuzz.run(c, "cpu", torch.float64, compiled_with=backend)
    for i in (0, 1):  # dq, dk
        assert fuzz._err(want["grads"][i], high["grads"][i], 1.0) > 1e3  # eager's float32 loss (torch's)
        assert fuzz._err(got["grads"][i], high["grads"][i], 1.0) < 1e-3


def _no_shift(q, k, term, *bufs):
    """materialize_bias as it was: the bias rows cast to q's dtype without subtracting their top."""
    from te_compile.passes import inserted
    bias, shift = inserted.materialize_bias(q, k, term, *bufs)
    return (bias.float() + shift.unsqueeze(-1)).to(q.dtype), torch.zeros_like(shift)


@pytest.mark.parametrize("shifted", [True, False])
def test_a_large_gathered_bias_in_bfloat16_on_the_cpu(shifted, backend, monkeypatch):
    """``--cpu-dtype bfloat16`` runs the reference target in bf16 against eager float32 with the CUDA tolerance,
    so the CPU fuzzer sees what a bf16 bias loses: with the bias rows unshifted the class is wrong, as on the GPU."""
    import te_compile.passes.flex as flex_pass
    monkeypatch.setattr(fuzz, "CPU_LOW", torch.bfloat16)
    if not shifted:
        monkeypatch.setattr(flex_pass, "materialize_bias", _no_shift)
    case = cases(cuda=True)["large_gathered_bias"]  # the GPU's shape: q_idx + 7 reaches 262
    outcome, detail, _ = fuzz.compare(case, "cpu", backend)
    assert outcome == ("pass" if shifted else "wrong"), f"{outcome}: {detail}"


CUDA_CASES = cases(cuda=True)


@pytest.mark.parametrize("name", sorted(CUDA_CASES))
def test_cuda_class_decisions_as_pinned(name, backend):  # (backend: flex on CPU with gradients, as the fuzzer)
    """What te_compile decides at compile time for each CUDA case (cuDNN's support as the installed frontend checks
    it, no GPU needed): kept with the pinned reason category, or every site on cuDNN."""
    c = CUDA_CASES[name]
    low, _ = fuzz._dtypes(c, "cuda")
    ns, _, qkv = fuzz.build(c, "cpu", low)
    attn, _ = fuzz._attention_fn(c, ns, "cpu", low)
    leaves = [t.detach().requires_grad_(not c.no_grad) for t in qkv]
    grad = torch.no_grad() if c.no_grad else torch.enable_grad()
    cast = torch.autocast("cpu", dtype=torch.bfloat16) if c.autocast else torch.enable_grad()
    with grad, cast:
        rows = te_compile.explain(attn, *leaves, for_device="cuda", serve="always").rows()
    assert rows, name
    if name in CUDA_KEPT:
        assert {(r["runs_on"], category(r["reason"])) for r in rows} == {("kept", CUDA_KEPT[name])}, rows
    else:
        assert {r["runs_on"] for r in rows} == {"cudnn"}, rows


def _edited_block_mask_case(edit):
    """A causal case of the fuzzer's hand-edited BlockMask class whose seed draws ``edit``."""
    from torch.nn.attention.flex_attention import create_block_mask
    from tools import fuzz_blockmask

    bm = create_block_mask(lambda b, h, q, kv: q >= kv, 1, 2, 24, 24, device="cpu", BLOCK_SIZE=8)
    seed = next(s for s in range(1000) if fuzz_blockmask.edit(bm, s)[0].startswith(edit))
    return fuzz.Case(seed=seed, kind="flex_edited", B=1, H=2, HKV=2, L=24, S=24, D=8, DV=8, block=8, return_lse=True,
                     lse_loss=True, mask="def mask_mod(b, h, q_idx, kv_idx):\n    return q_idx >= kv_idx\n")


@pytest.mark.parametrize("edit", ["drop_full", "add_full", "move_full", "partial_to_full", "drop_partial"])
def test_the_edited_block_mask_class_judges_by_flex_block_semantics(edit, backend, monkeypatch):
    """The fuzzer's hand-edited BlockMask class (tools/fuzz_blockmask.py): te_compile refuses the edited BlockMask
    (kept at compile time, a RuntimeError at run time); with the BlockMask check switched off the class reports the
    served answer as wrong (it compares with flex's block semantics, not with mask_mod element-wise)."""
    from te_compile.runtime import blockmask

    case = _edited_block_mask_case(edit)
    outcome, detail, _ = fuzz.compare(case, "cpu", backend)
    assert outcome == "kept" and edit in detail and "refused at run time" in detail, detail
    monkeypatch.setattr(blockmask, "mismatch", lambda *a, **k: None)
    outcome, detail, _ = fuzz.compare(case, "cpu", backend)
    assert outcome == "wrong" and "not flex's answer" in detail, detail


def test_the_edited_block_mask_class_follows_the_peers():
    """cases_for adds one edited-BlockMask case per 20 random cases, after the peers, at its own seeds: the seeds of
    the other classes are what they were."""
    from tools import fuzz_blockmask

    cs = fuzz.cases_for(40, 3, "cpu", True)
    edited = [c for c in cs if c.kind == "flex_edited"]
    assert [c.seed for c in edited] == [3 * fuzz.SEED_STRIDE + fuzz_blockmask.EDIT_OFFSET + i for i in range(2)]
    assert cs[-2:] == edited and [c.seed for c in cs[:40]] == [3 * fuzz.SEED_STRIDE + i for i in range(40)]
    assert fuzz.Case.from_json(edited[0].to_json()) == edited[0]
