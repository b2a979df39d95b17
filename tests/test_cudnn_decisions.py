"""The cuDNN target's decisions, on CPU: fake CUDA example values + cuDNN FE's own validator."""

import pytest
import torch
import torch.nn.functional as F
from torch._subclasses.fake_tensor import FakeTensorMode

from te_compile.cudnn.check import check
from te_compile.reasons import NOT_ON_CUDNN
from te_compile.passes.rewrite import rewrite_graph
from te_compile.spec import AttentionSpec


def _graph(fn, shapes, dtype=torch.bfloat16, mask=None, requires_grad=True):
    """symbolic_trace ``fn`` and attach fake CUDA example values (what Dynamo would record)."""
    gm = torch.fx.symbolic_trace(fn)
    with FakeTensorMode():
        vals = [torch.empty(*s, device="cuda", dtype=dtype, requires_grad=requires_grad) for s in shapes]
        if mask is not None:
            shape, mdtype, rg = mask
            vals.append(torch.empty(*shape, device="cuda", dtype=mdtype, requires_grad=rg))
        out = torch.empty(shapes[0][:3] + (shapes[2][3],), device="cuda", dtype=dtype,
                          requires_grad=any(v.requires_grad for v in vals))
    it = iter(vals)
    for n in gm.graph.nodes:
        if n.op == "placeholder":
            n.meta["example_value"] = next(it)
        elif n.op == "call_function":
            n.meta["example_value"] = out
    return gm


def _decide(fn, shapes, **kw):
    gm = _graph(fn, shapes, **kw)
    (d,) = rewrite_graph(gm, "auto", check)
    return d, gm


def sdpa(q, k, v):
    return F.scaled_dot_product_attention(q, k, v, is_causal=True)


def sdpa_mask(q, k, v, m):
    return F.scaled_dot_product_attention(q, k, v, attn_mask=m)


def test_bf16_cuda_goes_to_cudnn():
    d, gm = _decide(sdpa, [(2, 8, 128, 64)] * 3)
    assert d.rewrite and d.runs_on == "cudnn", d.reason
    assert '"impl":"cudnn"' in gm.code and '"mask":"causal"' in gm.code


def test_learned_bias_reports_dbias():
    d, _ = _decide(sdpa_mask, [(2, 8, 128, 64)] * 3, mask=((1, 8, 128, 128), torch.bfloat16, True))
    assert d.rewrite and d.grads.bias and d.dbias_note.startswith("yes")


def test_frozen_bias_and_bool_mask_need_no_dbias():
    d, _ = _decide(sdpa_mask, [(2, 8, 128, 64)] * 3, mask=((128, 128), torch.bfloat16, False))
    assert d.rewrite and not d.grads.bias and d.dbias_note.startswith("no")
    d, gm = _decide(sdpa_mask, [(2, 8, 128, 64)] * 3, mask=((128, 128), torch.bool, False))
    assert d.rewrite and d.dbias_note == "no (bool mask)" and "mask_to_bias" in gm.code


@pytest.mark.parametrize("shapes,dtype,why", [
    ([(2, 8, 128, 64)] * 3, torch.float32, "dtype float32: cuDNN SDPA serves float16 and bfloat16 only"),
    ([(2, 8, 128, 60)] * 3, torch.bfloat16, "head dim 60/60 is not a multiple of 8"),
    ([(2, 8, 128, 512)] * 3, torch.bfloat16, "head dim 512 > 256"),
])
def test_unsupported_configs_are_kept_with_reason(shapes, dtype, why):
    d, gm = _decide(sdpa, shapes, dtype=dtype)
    assert not d.rewrite and d.runs_on == "kept"
    assert why in d.reason
    assert "scaled_dot_product_attention" in gm.code


def test_validator_reason_is_reported():
    # 6 query heads over 4 kv heads: cuDNN's own validator rejects the GQA ratio
    assert check(*(torch.empty(s, device="meta", dtype=torch.bfloat16) for s in
                   [(2, 6, 64, 64), (2, 4, 64, 64), (2, 4, 64, 64)]),
                 None, AttentionSpec(), True, False).startswith("cuDNN support check:")


def test_check_accepts_supported_shapes_with_and_without_dbias():
    q, k, v = (torch.empty(2, 8, 256, 128, device="meta", dtype=torch.float16) for _ in range(3))
    bias = torch.empty(1, 8, 256, 256, device="meta", dtype=torch.float16)
    for spec in (AttentionSpec(), AttentionSpec(mask="causal", scale=0.2)):
        assert check(q, k, v, None, spec, True, False) is None
        assert check(q, k, v, bias, spec, True, True) is None


def test_check_takes_a_float32_bias_next_to_half_precision_q_and_nothing_else():
    """A learned table's bias is float32 (inserted.materialize_bias); a float16 bias next to bf16 q is refused
    with a reason, not handed to cuDNN."""
    q, k, v = (torch.empty(2, 8, 256, 128, device="meta", dtype=torch.bfloat16) for _ in range(3))
    wide = torch.empty(1, 8, 256, 256, device="meta", dtype=torch.float32)
    assert check(q, k, v, wide, AttentionSpec(), True, True) is None
    why = check(q, k, v, wide.to(torch.float16), AttentionSpec(), True, True)
    assert why is not None and "torch.float16 bias" in why


@pytest.mark.parametrize("mask,band", [
    ("(ge q_idx kv_idx)", (None, 0)),
    ("(le kv_idx q_idx)", (None, 0)),
    ("(and (ge q_idx kv_idx) (le (sub q_idx kv_idx) 5))", (6, 0)),
    ("(and (and (ge q_idx kv_idx) (le (sub q_idx kv_idx) 9)) (le (sub q_idx kv_idx) 5))", (6, 0)),  # the tighter
    ("(and (ge q_idx kv_idx) (lt (sub q_idx kv_idx) 1024))", (1024, 0)),
    ("(le q_idx kv_idx)", None),  # inverse causal: in-graph mask
    ("(ge (add q_idx 256) kv_idx)", (None, 256)),  # bottom-right causal for S - L = 256
    ("(and (ge (add q_idx 8) kv_idx) (le (sub q_idx kv_idx) 5))", (6, 8)),
    ("(gt q_idx kv_idx)", None),  # strictly causal: right of the diagonal excluded, in-graph mask
    ("(and (ge q_idx kv_idx) (eq (rem q_idx 2) 0))", None),
    # symmetric windows spelled with abs: kv in [q - W, q + W]
    ("(le (abs (sub q_idx kv_idx)) 64)", (65, 64)),
    ("(lt (abs (sub kv_idx q_idx)) 64)", (64, 63)),
    ("(ge 64 (abs (sub q_idx kv_idx)))", (65, 64)),
    ("(le (abs (sub (sub q_idx kv_idx) 8)) 64)", (73, 56)),  # -56 <= q - kv <= 72
    ("(le (abs (sub (sub q_idx kv_idx) 100)) 64)", None),  # 36 <= q - kv: the diagonal is masked
    ("(le (abs (sub q_idx (mul kv_idx 2))) 64)", None),  # not a band
    ("(ge (abs (sub q_idx kv_idx)) 64)", None),  # outside a window: not a band
])
def test_builtin_band_recognition(mask, band):
    from te_compile.lowering.lower import lower
    assert lower(AttentionSpec(mask_mod=mask, source="flex")).band == band
    assert lower(AttentionSpec(mask_mod=mask, source="flex")).emitted == (band is None)
    # with a score_mod, cuDNN disables built-in masks: the mask goes inside the score_mod
    assert lower(AttentionSpec(mask_mod=mask, score="(mul score 2.0)", source="flex")).band is None


@pytest.mark.parametrize("L,S,mask,score,bias,may", [
    (128, 128, "(ge q_idx kv_idx)", "", False, False),                           # built-in causal
    (96, 128, "(ge (add q_idx 32) kv_idx)", "", False, False),                   # bottom-right causal
    (256, 128, "(ge q_idx kv_idx)", "", False, False),                           # causal, L > S
    (128, 128, "(and (ge q_idx kv_idx) (le (sub q_idx kv_idx) 64))", "", False, False),  # sliding window
    (256, 128, "(and (ge q_idx kv_idx) (le (sub q_idx kv_idx) 64))", "", False, True),   # L > S: emitted
    (128, 128, "(ge q_idx kv_idx)", "(mul score 2.0)", False, True),            # a score_mod
    (128, 128, "(ge q_idx kv_idx)", "", True, True),                            # a bias
    (128, 128, "(eq (rem kv_idx 2) 0)", "", False, True),                       # emitted mask
    (128, 128, "", "", False, False),                                           # nothing to mask
])
def test_lse_guard_only_where_rows_can_be_empty(L, S, mask, score, bias, may):
    """The backward's lse guard (one kernel) runs unless no query row can lose every key; where it is skipped,
    the mask evaluated like eager's leaves every row a key."""
    from te_compile.score import ir
    from te_compile.cudnn import runners
    from te_compile.reference import index_grids
    spec = AttentionSpec(mask_mod=mask, score=score, source="flex")
    assert runners.may_have_empty_rows(spec, L, S, bias) == may
    if not may and mask:
        keep = ir.evaluate(ir.parse(mask), index_grids(1, 1, L, S, torch.device("cpu")))
        assert bool(keep.to(torch.bool).expand(1, 1, L, S).any(dim=-1).all())


def test_guard_lse_is_the_three_op_form():
    from te_compile.cudnn import runners
    lse = torch.tensor([1.5, float("-inf"), float("nan"), float("inf"), -3.0e38])
    want = torch.where(torch.isneginf(lse), torch.full_like(lse, 1e30), lse)
    torch.testing.assert_close(runners.guard_lse(lse), want, equal_nan=True)


@pytest.mark.parametrize("L,S,mask,keys", [
    (4096, 4096, "(or (lt kv_idx 512) (ge q_idx kv_idx))", 512),
    (4096, 4096, "(or (ge q_idx kv_idx) (lt kv_idx 512))", 512),   # either order
    (4096, 4096, "(or (le kv_idx 511) (le kv_idx q_idx))", 512),   # <= spellings
    (4096, 4096, "(or (gt 512 kv_idx) (ge q_idx kv_idx))", 512),   # the constant first
    (200, 256, "(or (lt kv_idx 72) (ge q_idx kv_idx))", 72),       # L < S
    (4096, 4096, "(or (gt 512 kv_idx) (gt q_idx kv_idx))", None),  # strict causal: no top-left causal tail
    (4096, 4096, "(or (lt kv_idx 512) (ge q_idx (sub kv_idx 2)))", None),  # q - kv >= -2
    (4096, 4096, "(or (lt q_idx 512) (ge q_idx kv_idx))", None),          # a query bound, not a key bound
    (4096, 4096, "(and (lt kv_idx 512) (ge q_idx kv_idx))", None),        # and, not or
    (4096, 4096, "(or (lt kv_idx 5000) (ge q_idx kv_idx))", None),        # the prefix covers every key
    (4096, 4096, "(or (gt kv_idx 512) (ge q_idx kv_idx))", None),         # a lower key bound
])
def test_prefix_split_recognition(L, S, mask, keys):
    """A prefix-LM mask splits into every query over the prefix keys (no mask) and the later queries over
    the later keys (top-left causal, a built-in band) (te_compile.lowering.prefix)."""
    from te_compile.lowering import prefix
    from te_compile.lowering.lower import lower

    spec = AttentionSpec(mask_mod=mask, source="flex")
    sp = prefix.split(spec, L, S)
    assert (None if sp is None else sp.keys) == keys
    if sp is not None:
        assert sp.prefix.mask_mod == "" and lower(sp.prefix, (L, keys)).band is None
        assert lower(sp.causal, (L - keys, S - keys)).band == (None, 0)
        assert sp.prefix.scale == spec.scale and sp.causal.source == "flex"
    # a score_mod keeps the mask emitted (no split)
    assert prefix.split(AttentionSpec(mask_mod=mask, score="(mul (tanh score) 2.0)", source="flex"), L, S) is None


def test_emission_support_reasons():
    from te_compile.lowering.lower import lower

    def unsupported_reason(spec):
        return lower(spec).unsupported
    ok = ["(mul (tanh (div score 30.0)) 30.0)", "(add score (mul (in 0) (sub kv_idx q_idx)))",
          "(where (ge q_idx kv_idx) (sin score) -inf)", "(add score (rem (sub q_idx kv_idx) 4))"]
    for e in ok:
        assert unsupported_reason(AttentionSpec(score=e, source="flex")) is None, e
    assert "erf" in unsupported_reason(AttentionSpec(score="(add score (erf score))", source="flex"))
    assert "pow" in unsupported_reason(AttentionSpec(score="(pow 2.0 score)", source="flex"))


@pytest.mark.parametrize("score,mask,want", [
    # softcap + causal: mask first, min() restores -inf (softcap(-inf) = -30), bprop without select
    ("(mul (tanh (div score 30.0)) 30.0)", "(ge q_idx kv_idx)", "min"),
    ("(add score (mul (in 0) (sub kv_idx q_idx)))", "(ge q_idx kv_idx)", "plain"),  # f(-inf) = -inf
    ("(mul score 2.0)", "(le kv_idx q_idx)", "plain"),  # integer constant derivative: RUNTIME_PARAM
    ("(mul score 0.5)", "(ge q_idx kv_idx)", None),  # non-integer constant derivative: no engine
    ("(mul score score)", "(ge q_idx kv_idx)", None),  # f'(-inf) = -inf: 0 * inf would be NaN
    ("(exp score)", "(ge q_idx kv_idx)", "min"),  # exp(-inf) = 0, exp'(-inf) = 0
    ("(sin score)", "(ge q_idx kv_idx)", None),  # sin(-inf) is NaN
    ("(mul (tanh (div score 30.0)) 30.0)", "(and (ge q_idx kv_idx) (le (sub q_idx kv_idx) 10))", None),  # compound
    ("(mul (tanh (div score 30.0)) 30.0)", "(ge q_idx 5)", None),  # index vs constant
    ("(mul (tanh (div score 30.0)) 30.0)", "(ge (add q_idx 256) kv_idx)", None),  # offset: cuDNN skips wrongly
    # inverse causal: cuDNN skipped tiles as if causal (GPU fuzzer, L = S = 200, D 128: out ~100% off)
    ("(mul (tanh (div score 30.0)) 30.0)", "(le q_idx kv_idx)", None),
    ("(add score -0.5)", "(ge kv_idx q_idx)", None),
    # strict or equality compares: cuDNN takes a raw-score select for causal (fuzzer: wrong results)
    ("(mul (tanh (div score 30.0)) 30.0)", "(lt kv_idx q_idx)", None),
    ("(mul (tanh (div score 30.0)) 30.0)", "(gt q_idx kv_idx)", None),
    ("(mul (tanh (div score 30.0)) 30.0)", "(ne q_idx kv_idx)", None),
])
def test_mask_first_lowering(score, mask, want):
    from te_compile.lowering.lower import BIG, lower
    lw = lower(AttentionSpec(score=score, mask_mod=mask, source="flex"))
    mf = lw.mask_first
    assert (mf is None) == (want is None)
    if mf is not None:
        assert mf.needs_min == (want == "min")
        assert (BIG in lw.constants) == mf.needs_min


@pytest.mark.parametrize("expr,want", [
    ("score", "-inf"), ("(mul score 2.0)", "-inf"), ("(mul score -2.0)", "+inf"), ("(tanh score)", "fin"),
    ("(add score (in 0))", "-inf"), ("(sub (in 0) score)", "+inf"), ("(mul score (in 0))", "nan"),
    ("(add score (neg score))", "nan"), ("(exp (neg score))", "+inf"), ("(pow score 2)", "+inf"),
    ("(pow score 3)", "-inf"), ("(pow score -1)", "fin"), ("(max score 0.0)", "fin"), ("(min score 0.0)", "-inf"),
    ("(div 1.0 score)", "fin"), ("(log score)", "nan"), ("(where (ge q_idx kv_idx) score 0.0)", "nan"),
    ("(sigmoid score)", "fin"), ("(mul (in 0) (sub q_idx kv_idx))", "fin"),
    ("(div (tanh score) (sub q_idx kv_idx))", "nan"),  # the divisor may be 0
    ("(pow (tanh score) -1)", "nan"), ("(pow (tanh score) 2)", "fin"),
])
def test_at_neg_inf(expr, want):
    from te_compile.score import ir
    from te_compile.lowering.lower import at_neg_inf
    assert at_neg_inf(ir.parse(expr)) == want
    # cross-check with float arithmetic where the answer is a plain number
    env = {"score": torch.tensor(float("-inf")), "q_idx": torch.tensor(3), "kv_idx": torch.tensor(1),
           "inputs": [torch.tensor(0.7)]}
    got = ir.evaluate(ir.parse(expr), env).float()
    if want == "fin":
        assert torch.isfinite(got)
    elif want in ("-inf", "+inf"):
        assert got.item() == float(want)


def test_graph_structure_ignores_constant_values():
    """Specs that differ only in pass-by-value constants share one built cuDNN graph (cache key)."""
    from te_compile.cudnn.emit import structure as _structure
    from te_compile.cudnn.graphs import _graph_key
    from te_compile.lowering.lower import lower

    def constants(spec):
        return lower(spec).constants

    def structure(spec):
        return _structure(lower(spec))

    def _graph_spec(spec, lengths):
        return _graph_key(lower(spec, lengths))

    def softcap(c):
        return AttentionSpec(source="flex", score=f"(mul (tanh (div score {c})) {c})", mask_mod="(ge q_idx kv_idx)")

    assert constants(softcap(30.0)) != constants(softcap(50.0))
    assert _graph_spec(softcap(30.0), (4096, 4096)) == _graph_spec(softcap(50.0), (4096, 4096))
    # a different structure: another op, a constant that becomes 1 (no multiply), two distinct constants
    other = [AttentionSpec(source="flex", score="(mul (sigmoid (div score 30.0)) 30.0)", mask_mod="(ge q_idx kv_idx)"),
             AttentionSpec(source="flex", score="(mul (tanh (div score 30.0)) 50.0)", mask_mod="(ge q_idx kv_idx)"),
             AttentionSpec(source="flex", score="(mul (tanh (div score 30.0)) 30.0)")]
    for s in other:
        assert structure(s) != structure(softcap(30.0)), s.score
    assert structure(AttentionSpec(source="flex", score="(mul score 1.0)")) != \
        structure(AttentionSpec(source="flex", score="(mul score 2.0)"))
    # built-in masks keep their bounds in the key
    w = [AttentionSpec(source="flex", mask_mod=f"(and (ge q_idx kv_idx) (le (sub q_idx kv_idx) {n}))") for n in (8, 9)]
    assert _graph_spec(w[0], (4096, 4096)) != _graph_spec(w[1], (4096, 4096))


@pytest.mark.parametrize("score,mask,clamp", [
    ("(tanh score)", None, True),  # f(-inf) = -1: cuDNN's -inf positions must stay -inf (dV 50x off before)
    ("(sigmoid score)", None, True),
    ("(mul (tanh (div score 30.0)) 30.0)", None, True),  # softcap: exp(-30 - lse) hid it, but the rule is the same
    ("(tanh score)", "(ge q_idx 3)", True),  # a mask after the score_mod: the clamp comes before it
    ("(mul (tanh (div score 30.0)) 30.0)", "(ge q_idx kv_idx)", False),  # mask first has its own min
    ("(add score (mul q_idx 0.1))", None, False),  # f(-inf) = -inf already
    ("(sqrt (add (abs score) 0.5))", None, False),  # f(-inf) = +inf: the index guard masks every length instead
    ("(exp score)", None, True),
])
def test_neg_inf_clamp(score, mask, clamp):
    """min(f(s), s + BIG) after a score_mod whose value at -inf is finite, in the emitted graph."""
    from te_compile.cudnn.emit import structure
    from te_compile.lowering.lower import BIG, lower
    lw = lower(AttentionSpec(score=score, mask_mod=mask, source="flex"), (128, 128))
    assert lw.ninf_clamp == clamp
    ops = [e[0] for e in structure(lw)]
    assert (BIG in lw.constants) == (clamp or (lw.mask_first is not None and lw.mask_first.needs_min))
    if clamp:
        assert "min" in ops


@pytest.mark.parametrize("score,lengths,guard", [
    ("(add score (mul q_idx 1))", (200, 64), "(lt q_idx 200)"),  # padded query rows see f(0) = q_idx
    ("(add score (mul q_idx 1))", (256, 64), None),  # no padded query rows
    ("(add score (in 0))", (129, 255), "(lt q_idx 129)"),
    ("(mul score 0.5)", (200, 64), None),  # reads the score only: f(0) is a constant
    ("(tanh score)", (129, 255), "(and (lt kv_idx 255) (lt q_idx 129))"),
    ("(tanh score)", (128, 128), None),  # the clamp covers tile multiples
])
def test_padded_tile_guard(score, lengths, guard):
    from te_compile.lowering.lower import lower
    lw = lower(AttentionSpec(score=score, source="flex", n_inputs=1 if "(in 0)" in score else 0), lengths)
    assert (None if lw.guard is None else str(lw.guard)) == guard


def test_on_a_gpu_a_graph_no_engine_builds_is_kept_with_the_direction_and_version(monkeypatch):
    """cuDNN's validator accepts graphs for which no engine builds a plan (a learned bias with dBias under a
    causal band at L 129, S 300 on an H200); with the call's GPU at hand the check builds the plans, so such a
    site stays with Inductor instead of running the reference math at every call. Stand-in GPU: forward plans
    build, backward plans do not."""
    import cudnn

    from te_compile.cudnn import check as chk, graphs, versions

    built = []

    def finish(g, uids):
        built.append("backward" if int(graphs.UID.DQ) in uids else "forward")
        if built[-1] == "backward":
            raise cudnn.cudnnGraphNotSupportedError("No valid engine configs for ____________ {\"engineId\":0}")
        return None

    monkeypatch.setattr(chk, "_gpu", lambda q: "cuda:0")
    monkeypatch.setattr(graphs, "handle", lambda device: None)
    monkeypatch.setattr(graphs, "finish", finish)
    monkeypatch.setattr(versions, "running", lambda: 91900)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "Stand-in GPU")
    chk._validate.cache_clear()
    try:
        q = torch.empty(2, 4, 129, 64, device="meta", dtype=torch.bfloat16)
        k, v = (torch.empty(2, 4, 300, 64, device="meta", dtype=torch.bfloat16) for _ in range(2))
        bias = torch.empty(1, 1, 129, 300, device="meta", dtype=torch.bfloat16)
        spec = AttentionSpec(source="flex", scale=0.125, mask_mod="(ge q_idx kv_idx)")
        assert check(q, k, v, bias, spec, False, False) is None  # inference: the forward builds
        assert built == ["forward"]
        why = check(q, k, v, bias, spec, True, True)
        assert built == ["forward", "forward", "backward"]
        assert why == ("cuDNN 9.19 builds no backward plan for this graph on Stand-in GPU: "
                       "No valid engine configs for"), why
        assert why.category == NOT_ON_CUDNN
    finally:
        chk._validate.cache_clear()


def test_plans_are_built_only_where_the_calls_gpu_is_present(monkeypatch):
    from te_compile.cudnn import check as chk
    q = torch.empty(1, 1, 8, 8, device="meta")
    assert chk._gpu(q) is None
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with FakeTensorMode():
        fake = torch.empty(1, 1, 8, 8, device="cuda")
    assert chk._gpu(fake) is None  # fake CUDA values on a machine without a GPU: FE's validator only
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert chk._gpu(fake) == str(fake.device)  # the device the plans are built on


@pytest.mark.parametrize("learned", [True, False])
def test_a_site_whose_dbias_plan_does_not_build_is_kept_end_to_end(monkeypatch, learned):
    """The rewrite pass over an SDPA call with a float mask at S 300, on a stand-in GPU that builds every plan but
    the dBias backward (as cuDNN 9.19 / 9.27 on an H200): a learned mask keeps the node with the reason, a frozen
    one (no dBias) is served."""
    import cudnn

    from te_compile.cudnn import check as chk, graphs, versions

    def finish(g, uids):
        if int(graphs.UID.DBIAS) in uids:
            raise cudnn.cudnnGraphNotSupportedError("No valid engine configs for ____ {}")

    monkeypatch.setattr(chk, "_gpu", lambda q: "cuda:0")
    monkeypatch.setattr(graphs, "handle", lambda device: None)
    monkeypatch.setattr(graphs, "finish", finish)
    monkeypatch.setattr(versions, "running", lambda: 91900)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "Stand-in GPU")
    chk._validate.cache_clear()
    try:
        shapes = [(2, 4, 129, 64), (2, 4, 300, 64), (2, 4, 300, 64)]
        d, gm = _decide(sdpa_mask, shapes, mask=((1, 1, 129, 300), torch.bfloat16, learned))
    finally:
        chk._validate.cache_clear()
    if learned:
        assert not d.rewrite and d.runs_on == "kept"
        assert "cuDNN 9.19 builds no backward plan for this graph on Stand-in GPU" in d.reason, d.reason
        assert "scaled_dot_product_attention" in gm.code
    else:
        assert d.rewrite and d.runs_on == "cudnn", d.reason


SQRT_ABS_PER_HEAD = "(sqrt (add (abs (mul (mul (mul score 2) (in 0)) (sub kv_idx q_idx))) 0.5))"


@pytest.mark.parametrize("score,op_in", [
    # the GPU fuzzer's crash (cuDNN 9.19 and 9.27, misaligned address): the bprop multiplies the per-head input by 2
    (SQRT_ABS_PER_HEAD, "mul(input 0, a constant) in the derived backward"),
    ("(div score (mul (in 0) 2))", "mul(input 0, a constant) in the score_mod"),
    ("(mul (mul score (in 0)) (sub kv_idx q_idx))", None),  # every op has a full operand
    ("(add score (mul (in 0) (sub kv_idx q_idx)))", None),
    ("(mul 30.0 (tanh (div score 30.0)))", None),
])
def test_an_op_on_inputs_and_constants_alone_gets_full_inputs_or_is_kept(score, op_in):
    """By default a graph that would have an op with no full operand is emitted with its inputs broadcast first
    (served); without that (``full_inputs_where_needed=0``) the site is kept with the op named, and
    ``keep_broadcast_only=0`` serves it anyway (the diagnostic switch)."""
    from te_compile.lowering import lower as lowering
    from te_compile.cudnn import emit
    q = torch.empty(2, 2, 200, 64, device="meta", dtype=torch.bfloat16)
    k = torch.empty(2, 1, 200, 64, device="meta", dtype=torch.bfloat16)
    v = torch.empty(2, 1, 200, 128, device="meta", dtype=torch.bfloat16)
    spec = AttentionSpec(impl="cudnn", scale=0.3, score=score, n_inputs=score.count("(in 0)") and 1, source="flex")
    assert check(q, k, v, None, spec, True, False) is None
    assert emit.inputs_full(lowering.lower(spec, (200, 200))) is (op_in is not None)
    old = lowering.set_options(full_inputs_where_needed=False)
    try:
        why = check(q, k, v, None, spec, True, False)
        if op_in is None:
            assert why is None
            return
        assert why is not None and op_in in why and "misaligned address" in why and why.category == NOT_ON_CUDNN
        lowering.set_options(keep_broadcast_only=False)
        assert check(q, k, v, None, spec, True, False) is None
    finally:
        lowering.set_options(full_inputs_where_needed=old.full_inputs_where_needed,
                             keep_broadcast_only=old.keep_broadcast_only)


def test_full_inputs_leave_no_broadcast_only_op():
    """EmitOptions.full_inputs_where_needed: the crash's graph gets its captured input broadcast to the score's
    shape first, so no op has inputs and constants alone; the input is read only by that broadcast."""
    from te_compile.lowering import lower as lowering
    from te_compile.cudnn import emit
    spec = AttentionSpec(impl="cudnn", scale=0.3, score=SQRT_ABS_PER_HEAD, n_inputs=1, source="flex")
    lw = lowering.lower(spec, (200, 200))
    assert emit.broadcast_only_op(lw) is None
    ops = emit.structure(lw)
    uses = [e for e in ops if e[0] not in ("dtype", "score_mod", "bprop") and ("in", 0) in e[1]]
    assert uses and all(e[0] == "add" for e in uses)
    old = lowering.set_options(full_inputs_where_needed=False)
    try:
        assert emit.broadcast_only_op(lowering.lower(spec, (200, 200))) is not None
    finally:
        lowering.set_options(full_inputs_where_needed=old.full_inputs_where_needed)


@pytest.mark.parametrize("score,has_op", [
    ("(div score (in 0))", True),  # per-head temperature: its derivative is reciprocal(T[h])
    ("(mul (tanh (div score (in 0))) (in 0))", True),  # per-head tensor softcap
    ("(mul score (in 0))", False),  # derivative T[h], multiplied into dS directly
    ("(add score (mul (in 0) (sub kv_idx q_idx)))", False),  # ALiBi with captured slopes
])
def test_which_per_head_forms_get_full_inputs(score, has_op):
    """Only the forms that would have an op with no full operand pay for the broadcast; the others are emitted
    as before."""
    from te_compile.lowering import lower as lowering
    from te_compile.cudnn import emit
    lw = lowering.lower(AttentionSpec(impl="cudnn", score=score, n_inputs=1, source="flex"), (256, 256))
    assert emit.inputs_full(lw) is has_op
    assert emit.broadcast_only_op(lw) is None
    old = lowering.set_options(full_inputs_where_needed=False)
    try:
        lw = lowering.lower(AttentionSpec(impl="cudnn", score=score, n_inputs=1, source="flex"), (256, 256))
        assert (emit.broadcast_only_op(lw) is not None) is has_op
    finally:
        lowering.set_options(full_inputs_where_needed=old.full_inputs_where_needed)


@pytest.mark.parametrize("score,kept", [
    ("(log (rem (add score 2.0) 3.0))", True),  # the GPU fuzzer's case: dQ / dK inf on cuDNN 9.19 and 9.27
    ("(sqrt (rem score 1.0))", True),
    ("(pow (abs (rem (mul score 0.5) 1.0)) 0.5)", True),
    ("(div 1.0 (add (rem score 3.0) 0.0))", True),
    ("(pow (rem score 3.0) 3)", False),  # not singular at 0: served (passed on the GPU)
    ("(log (add (abs score) 1.0))", False),  # singular function, no remainder
    ("(rem (log (add (abs score) 1.0)) 3.0)", False),  # the remainder after the singular function
])
def test_a_singular_function_of_a_remainder_of_the_score_is_kept(score, kept):
    from te_compile.cudnn.check import singular_of_remainder
    from te_compile.reasons import NOT_EXACT
    q = torch.empty(1, 4, 255, 64, device="meta", dtype=torch.bfloat16)
    k = torch.empty(1, 4, 128, 64, device="meta", dtype=torch.bfloat16)
    v = torch.empty(1, 4, 128, 128, device="meta", dtype=torch.bfloat16)
    spec = AttentionSpec(impl="cudnn", score=score, mask_mod="(ge q_idx kv_idx)", source="flex")
    why = check(q, k, v, None, spec, True, False)
    if kept:
        assert why is not None and why.category == NOT_EXACT and "remainder" in why
    else:
        assert why is None or "remainder" not in why
    assert (singular_of_remainder(lowering_expr(score)) is not None) is kept


def lowering_expr(score):
    from te_compile.score import ir
    return ir.parse(score)


@pytest.mark.parametrize("score,grad,kept", [
    ("(pow (abs (neg score)) 0.5)", True, True),  # the GPU fuzzer's case as lowered (9.27): dQ, dK 25x off
    ("(sqrt (max score 0.0))", True, True),
    ("(log (abs score))", True, True),
    ("(div 1.0 score)", True, True),
    ("(rsqrt (add (tanh score) 1.0))", True, True),  # tanh reaches -1
    ("(pow (abs score) 0.5)", False, False),  # the forward is served
    ("(sqrt (add (abs score) 0.5))", True, False),
    ("(log (add (tanh score) 2.0))", True, False),
    ("(div score (add (exp score) 1.0))", True, False),
    ("(log (add (max score 0.0) 1.0))", True, False),
    ("(pow score 3)", True, False),
    ("(mul score (rsqrt (buf 0)))", True, False),  # no score inside
])
def test_a_derivative_singular_at_a_finite_score_is_kept_in_training(score, grad, kept):
    from te_compile.cudnn.check import singular_derivative
    from te_compile.reasons import NOT_EXACT
    q = torch.empty(2, 2, 255, 128, device="meta", dtype=torch.bfloat16)
    k = torch.empty(2, 2, 255, 128, device="meta", dtype=torch.bfloat16)
    spec = AttentionSpec(impl="cudnn", score=score, source="flex")
    why = check(q, k, k, None, spec, grad, False)
    if kept:
        assert why is not None and why.category == NOT_EXACT and "may reach 0" in why
    else:
        assert why is None or "may reach 0" not in why
    assert (singular_derivative(lowering_expr(score)) is not None) is (kept or score == "(pow (abs score) 0.5)")


@pytest.mark.parametrize("score,grad,kept", [
    ("(exp (div (pow (abs (mul score 2)) 2.25) 8.0))", True, True),  # the GPU fuzzer's case: grads 30% off
    ("(exp (mul score score))", True, True),  # grads off by 1e21 on cuDNN 9.19
    ("(tanh (exp (mul score score)))", True, True),  # passed on the GPU, kept by the rule all the same
    ("(exp (mul score score))", False, False),  # the forward passed
    ("(exp (mul score 4.0))", True, False),  # affine inside: passed
    ("(exp (add (mul score 0.5) (buf 0)))", True, False),
    ("(pow (mul score 2) 4)", True, False),  # no exp: passed
    ("(mul score (exp (buf 0)))", True, False),  # exp of a captured tensor
])
def test_a_super_exponential_score_mod_is_kept_in_training(score, grad, kept):
    from te_compile.cudnn.check import super_exponential
    from te_compile.reasons import NOT_EXACT
    q = torch.empty(2, 4, 200, 64, device="meta", dtype=torch.bfloat16)
    k = torch.empty(2, 4, 200, 64, device="meta", dtype=torch.bfloat16)
    spec = AttentionSpec(impl="cudnn", score=score, mask_mod="(le (sub q_idx kv_idx) 10)", source="flex")
    why = check(q, k, k, None, spec, grad, False)
    if kept:
        assert why is not None and why.category == NOT_EXACT and "not affine" in why
    else:
        assert why is None or "not affine" not in why
    assert (super_exponential(lowering_expr(score)) is not None) is (kept or not grad and score == "(exp (mul score score))")


@pytest.mark.parametrize("S,score,grad,kept", [
    (64, "(add (mul (add (mul kv_idx kv_idx) q_idx) 0.1) score)", True, True),  # the GPU fuzzer's case: dQ inf
    (64, "(add (mul (add (mul kv_idx kv_idx) q_idx) 0.1) score)", False, False),  # the forward passed
    (96, "(add (mul (add (mul kv_idx kv_idx) q_idx) 0.1) score)", True, False),
    (64, "(mul (tanh (div score 30.0)) 30.0)", True, False),  # no index term
])
def test_short_keys_with_index_terms_are_kept_in_training(S, score, grad, kept):
    q = torch.empty(2, 4, 64, 64, device="meta", dtype=torch.bfloat16)
    k = torch.empty(2, 1, S, 64, device="meta", dtype=torch.bfloat16)
    v = torch.empty(2, 1, S, 64, device="meta", dtype=torch.bfloat16)
    spec = AttentionSpec(impl="cudnn", score=score, source="flex")
    why = check(q, k, v, None, spec, grad, False)
    assert (why is not None and "keys with grads" in why) is kept


@pytest.mark.parametrize("score,kept", [("softcap", True), ("plain", False)])
def test_dbias_with_a_non_unit_derivative_is_kept_for_cudnn(monkeypatch, score, kept):
    """A learned relative-position table under a score_mod whose derivative is not 1 (softcap): cuDNN's dBias is
    not flex's table gradient there (GPU fuzzer: dTable 0.9-1.0 off), so the site is kept for cuDNN; a score_mod
    with derivative 1 is not kept for that reason."""
    import torch.nn.attention.flex_attention as fa
    from torch.nn.attention.flex_attention import flex_attention

    import te_compile

    monkeypatch.setattr(fa, "_validate_device", lambda *a, **k: None)
    L = 128
    table = torch.randn(4, 2 * L - 1, requires_grad=True)
    f = (lambda s: 20.0 * torch.tanh(s / 20.0)) if score == "softcap" else (lambda s: s)

    def fn(q, k, v):
        return flex_attention(q, k, v, score_mod=lambda s, b, h, q_, kv: f(s) + table[h, q_ - kv + L - 1])
    q, k, v = (torch.randn(1, 4, L, 64, dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
    (d,) = te_compile.explain(fn, q, k, v, for_device="cuda", serve="always").decisions
    assert ("cuDNN's dBias is not flex's table gradient" in d.reason) == kept, d.reason
    assert d.runs_on == "kept" if kept else d.dbias_note == "yes (table needs grad)"
