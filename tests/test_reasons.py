"""Kept sites carry a reason category (te_compile.reasons) that code reads instead of the sentence."""

import ast
import glob
import os

import pytest
import torch
import torch.nn.attention.flex_attention as fa
import torch.nn.functional as F
from torch.nn.attention.flex_attention import BlockMask, flex_attention

import te_compile
from te_compile import reasons
from te_compile.cudnn.check import check
from te_compile.cudnn.install import frontend_missing
from te_compile.passes import rewrite
from te_compile.passes.decision import Keep
from te_compile.reasons import (BLOCK_MASK, CATEGORIES, CUDNN_UNAVAILABLE, DEVICE, INTERNAL_ERROR, NEEDS_GRAD,
                                NOT_EXACT, NOT_ON_CUDNN, OTHER, UNSUPPORTED_ARGS, Reason, category)
from te_compile.spec import AttentionSpec

PASSES = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "te_compile", "passes")


def _keep_calls():
    """(file:line, the category argument's AST) for every ``Keep(...)`` call in te_compile/passes."""
    out = []
    for path in sorted(glob.glob(os.path.join(PASSES, "*.py"))):
        with open(path) as f:
            tree = ast.parse(f.read())
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and getattr(node.func, "id", getattr(node.func, "attr", None)) == "Keep":
                cat = node.args[1] if len(node.args) > 1 else next(
                    (kw.value for kw in node.keywords if kw.arg == "category"), None)
                out.append((f"{os.path.basename(path)}:{node.lineno}", cat))
    return out


def _static_categories(cat) -> list:
    """The categories a Keep's argument names: a te_compile.reasons constant, either branch of a
    conditional, or "forwarded" for ``category(reason)`` (the Reason a checker or the translator
    returned keeps its own); None for anything else."""
    if isinstance(cat, ast.IfExp):
        return _static_categories(cat.body) + _static_categories(cat.orelse)
    name = cat.id if isinstance(cat, ast.Name) else cat.attr if isinstance(cat, ast.Attribute) else None
    if name is not None and name.isupper():
        return [getattr(reasons, name, None)]
    if isinstance(cat, ast.Call) and getattr(cat.func, "id", None) == "category" and len(cat.args) == 1:
        return ["forwarded"]
    return [None]


def test_every_keep_in_the_passes_names_a_category():
    calls = _keep_calls()
    assert len(calls) > 30, calls  # the walk found the raise sites
    bad = [(where, ast.dump(cat) if cat else None) for where, cat in calls
           if cat is None or any(c not in (*CATEGORIES, "forwarded") for c in _static_categories(cat))]
    assert not bad, f"Keep(...) without a te_compile.reasons category: {bad}"
    # OTHER is a last resort for code outside the passes; every pass knows what kind of reason it raises
    assert not [where for where, cat in calls if OTHER in _static_categories(cat)]


def test_keep_requires_a_category_and_makes_a_reason():
    with pytest.raises(TypeError):
        Keep("no category")  # noqa
    k = Keep("why", DEVICE)
    assert isinstance(k.reason, Reason) and k.reason == "why" and k.reason.category == DEVICE
    with pytest.raises(ValueError, match="unknown reason category"):
        Keep("why", "slow")


def test_reason_rejects_unknown_categories():
    with pytest.raises(ValueError, match="unknown reason category 'nope'"):
        Reason("text", "nope")
    assert len(set(CATEGORIES)) == len(CATEGORIES)
    r = Reason("inputs on cpu", DEVICE)
    assert r == "inputs on cpu" and isinstance(r, str) and category(r) == DEVICE
    assert category("a plain string") == OTHER and Reason("x").category == OTHER


# --------------------------------------------------------------------------- end to end


def _decision(fn, *args, target="reference"):
    (d,) = te_compile.explain(fn, *args, target=target).decisions
    return d


def _qkv(*shape):
    return [torch.randn(*shape) for _ in range(3)]


@pytest.mark.parametrize("fn,args,target,want", [
    (lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True), _qkv(1, 2, 8, 8), "auto", DEVICE),
    (lambda q, k, v: F.scaled_dot_product_attention(q, k, v, dropout_p=0.1), _qkv(1, 2, 8, 8), "reference",
     UNSUPPORTED_ARGS),
    (lambda q, k, v: F.scaled_dot_product_attention(q, k, v, attn_mask=torch.zeros(8, 8), is_causal=True),
     _qkv(1, 2, 8, 8), "reference", NOT_EXACT),
    (lambda q, k, v: F.scaled_dot_product_attention(q, k, v), _qkv(2, 8, 8), "reference", NOT_ON_CUDNN),
], ids=["cpu", "dropout", "mask_and_causal", "3d"])
def test_sdpa_kept_sites_carry_their_category(fn, args, target, want):
    d = _decision(fn, *args, target=target)
    assert not d.rewrite and category(d.reason) == want, (d.reason, category(d.reason))


def test_report_rows_carry_the_category():
    def two_sites(q, k, v):
        return (F.scaled_dot_product_attention(q, k, v, is_causal=True)
                + F.scaled_dot_product_attention(q, k, v, dropout_p=0.2))
    rows = te_compile.explain(two_sites, *_qkv(1, 2, 8, 8), target="reference").to_dict()["sites"]
    assert [r["category"] for r in rows] == [None, UNSUPPORTED_ARGS]


@pytest.fixture
def _cpu_flex_with_grad(monkeypatch):
    # eager/compiled flex refuse CPU inputs that require grad; the math path itself is fine
    monkeypatch.setattr(fa, "_validate_device", lambda *a, **k: None)


def _flex_inputs(requires_grad=False):
    return [torch.randn(1, 2, 16, 8, dtype=torch.float64).requires_grad_(requires_grad) for _ in range(3)]


def test_flex_captured_tensor_that_needs_grad(_cpu_flex_with_grad):
    w = torch.rand(2, requires_grad=True)
    fn = lambda q, k, v: flex_attention(q, k, v, score_mod=lambda s, b, h, q_, kv: s * w[h])  # noqa: E731
    d = _decision(fn, *_flex_inputs(True))
    assert not d.rewrite and category(d.reason) == NEEDS_GRAD, d.reason


def test_flex_hand_built_block_mask():
    bm = BlockMask.from_kv_blocks(torch.ones(1, 1, 2, dtype=torch.int32), torch.zeros(1, 1, 2, 2, dtype=torch.int32),
                                  BLOCK_SIZE=8)
    d = _decision(lambda q, k, v, bm: flex_attention(q, k, v, block_mask=bm), *_flex_inputs(), bm)
    assert not d.rewrite and category(d.reason) == BLOCK_MASK, d.reason


def test_flex_untranslatable_score_mod_forwards_the_translator_category():
    fn = lambda q, k, v: flex_attention(q, k, v, score_mod=lambda s, b, h, q_, kv: torch.special.erf(s))  # noqa: E731
    d = _decision(fn, *_flex_inputs())
    assert not d.rewrite and category(d.reason) == NOT_ON_CUDNN and "erf" in d.reason, d.reason


def test_internal_error_while_deciding(monkeypatch):
    def broken(*a):
        raise RuntimeError("boom")
    monkeypatch.setitem(rewrite.SITE_KINDS, "sdpa", (broken, rewrite.SITE_KINDS["sdpa"][1]))
    d = _decision(lambda q, k, v: F.scaled_dot_product_attention(q, k, v), *_qkv(1, 2, 8, 8))
    assert not d.rewrite and category(d.reason) == INTERNAL_ERROR and "boom" in d.reason


# --------------------------------------------------------------------------- the cuDNN support check


def _meta(*shape, dtype=torch.bfloat16):
    return torch.empty(*shape, device="meta", dtype=dtype)


@pytest.mark.parametrize("qkv,spec,want", [
    ([(2, 8, 64, 64)] * 3, AttentionSpec(), None),
    ([(2, 8, 64, 60)] * 3, AttentionSpec(), NOT_ON_CUDNN),  # head dim
    ([(2, 6, 64, 64), (2, 4, 64, 64), (2, 4, 64, 64)], AttentionSpec(), NOT_ON_CUDNN),  # cuDNN's validator
    ([(2, 8, 64, 64)] * 3, AttentionSpec(scale=-0.5), NOT_EXACT),
    ([(2, 8, 64, 64)] * 3, AttentionSpec(source="flex", score="(erf score)"), NOT_ON_CUDNN),
])
def test_check_returns_reasons_with_a_category(qkv, spec, want):
    why = check(*(_meta(*s) for s in qkv), None, spec, True, False)
    assert (why is None) if want is None else (isinstance(why, Reason) and why.category == want), why
    why = check(*(_meta(2, 8, 64, 64, dtype=torch.float32) for _ in range(3)), None, AttentionSpec(), True, False)
    assert isinstance(why, Reason) and why.category == NOT_ON_CUDNN and why.startswith("dtype float32")


def test_a_checker_reason_keeps_its_category_and_a_plain_string_is_other():
    """``decide`` keeps a Reason's category from the checker (the backend's, when the frontend is
    missing, returns ``frontend_missing``'s); a checker's plain string reads as OTHER."""
    from test_cudnn_decisions import _graph, sdpa

    missing = frontend_missing(ModuleNotFoundError("No module named 'cudnn'", name="cudnn"))
    assert category(missing) == CUDNN_UNAVAILABLE
    for why, want in ((missing, CUDNN_UNAVAILABLE), ("some prose", OTHER)):
        (d,) = rewrite.rewrite_graph(_graph(sdpa, [(2, 8, 128, 64)] * 3), "auto", lambda *a, w=why: w)
        assert not d.rewrite and d.reason == why and category(d.reason) == want
    (d,) = rewrite.rewrite_graph(_graph(sdpa, [(2, 8, 128, 64)] * 3, dtype=torch.float32), "auto", check)
    assert not d.rewrite and category(d.reason) == NOT_ON_CUDNN, d.reason
