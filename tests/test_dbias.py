"""The AOT backward graph asks for dBias exactly when the bias needs a gradient."""

import re

import pytest
import torch
import torch.nn.functional as F
from torch._dynamo.backends.common import aot_autograd
from functorch.compile import make_boxed_func

from te_compile.passes.rewrite import rewrite_graph


def _backward_graphs(fn, *args):
    graphs = {"fw": [], "bw": []}

    def cap(kind):
        def compiler(gm, example_inputs):
            graphs[kind].append(gm.code)
            return make_boxed_func(gm.forward)
        return compiler

    def backend(gm, example_inputs):
        rewrite_graph(gm, "reference")
        return aot_autograd(fw_compiler=cap("fw"), bw_compiler=cap("bw"))(gm, example_inputs)

    torch._dynamo.reset()
    out = torch.compile(fn, backend=backend, fullgraph=True)(*args)
    if out.requires_grad:
        out.sum().backward()
    return graphs


def _need_dbias_flags(code):
    calls = re.findall(r"te_compile\.attn_bwd\.default\((.*?)\);", code)
    return [c.split(", ")[-1].strip() for c in calls]


def _qkv():
    return [torch.randn(1, 2, 8, 8, requires_grad=True) for _ in range(3)]


def fn_bias(q, k, v, b):
    return F.scaled_dot_product_attention(q, k, v, attn_mask=b)


def test_learned_bias_requests_dbias():
    g = _backward_graphs(fn_bias, *_qkv(), torch.randn(8, 8, requires_grad=True))
    assert _need_dbias_flags(g["bw"][0]) == ["True"]


def test_frozen_bias_does_not_request_dbias():
    g = _backward_graphs(fn_bias, *_qkv(), torch.randn(8, 8))
    assert _need_dbias_flags(g["bw"][0]) == ["False"]


def test_bool_mask_does_not_request_dbias():
    g = _backward_graphs(fn_bias, *_qkv(), torch.ones(8, 8, dtype=torch.bool).tril())
    assert _need_dbias_flags(g["bw"][0]) == ["False"]


def test_bias_derived_from_a_parameter_requests_dbias():
    w = torch.randn(8, 8, requires_grad=True)
    mask = torch.ones(8, 8, dtype=torch.bool).tril()

    def fn(q, k, v):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=(w * 2).masked_fill(~mask, float("-inf")))
    g = _backward_graphs(fn, *_qkv())
    assert _need_dbias_flags(g["bw"][0]) == ["True"]


def test_no_grad_has_no_backward_at_all():
    with torch.no_grad():
        g = _backward_graphs(fn_bias, *_qkv(), torch.randn(8, 8, requires_grad=True))
    assert g["bw"] == []
    assert "attn_fwd" in g["fw"][0]


@pytest.mark.parametrize("learned", [False, True])
def test_bias_grad_matches_eager(learned):
    q, k, v = _qkv()
    b = torch.randn(2, 8, 8, requires_grad=learned)
    _backward_graphs(fn_bias, q, k, v, b)
    got = b.grad
    b.grad = None
    F.scaled_dot_product_attention(q, k, v, attn_mask=b).sum().backward()
    if learned:
        torch.testing.assert_close(got, b.grad, rtol=1e-5, atol=1e-5)
    else:
        assert got is None and b.grad is None


def test_flex_table_bias_requests_dbias_only_when_the_table_is_learned(monkeypatch):
    import torch.nn.attention.flex_attention as fa
    from torch.nn.attention.flex_attention import flex_attention

    monkeypatch.setattr(fa, "_validate_device", lambda *a, **k: None)
    for learned, flag in ((True, "True"), (False, "False")):
        table = torch.randn(2, 15, requires_grad=learned)

        def fn(q, k, v):
            return flex_attention(q, k, v, score_mod=lambda s, b, h, q_, kv: s + table[h, q_ - kv + 7])
        g = _backward_graphs(fn, *_qkv())
        assert _need_dbias_flags(g["bw"][0]) == [flag]


@pytest.mark.parametrize("start_learned", [False, True])
def test_requires_grad_flip_after_compiling(start_learned):
    """Flipping a parameter's requires_grad after compiling must neither lose its gradient nor keep
    computing one: te_compile turns Dynamo's dict-tag guard skip off while it compiles (stale on torch 2.11)."""
    import te_compile

    class M(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.bias = torch.nn.Parameter(torch.randn(1, 2, 8, 8), requires_grad=start_learned)

        def forward(self, q, k, v):
            return F.scaled_dot_product_attention(q, k, v, attn_mask=self.bias)

    m = M()
    compiled = torch.compile(m, backend=te_compile.backend(inner="aot_eager", target="reference"))
    q, k, v = _qkv()
    for learned in (start_learned, not start_learned, start_learned):
        m.bias.requires_grad_(learned)
        m.bias.grad = None
        compiled(q, k, v).sum().backward()
        if learned:
            assert m.bias.grad is not None
            want = torch.autograd.grad(m(q, k, v).sum(), m.bias)[0]
            torch.testing.assert_close(m.bias.grad, want, rtol=1e-5, atol=1e-5)
        else:
            assert m.bias.grad is None
    # the setting is te_compile's only while it compiles a frame: afterwards it is Dynamo's default again
    assert torch._dynamo.config.skip_tensor_guards_with_matching_dict_tags is True


@pytest.mark.parametrize("case", ["plain", "causal", "learned bias", "frozen bias", "kept"])
def test_parameter_guards_only_where_a_served_site_reads_more_than_qkv(monkeypatch, case):
    """te_compile turns Dynamo's dict-tag guard skip off (guards on every parameter, host time on every
    call) only for frames with a served site that reads a tensor besides q/k/v (an SDPA attn_mask, a flex
    score_mod / mask_mod's captured tensors): their graphs depend on that tensor's requires_grad. A frame
    whose sites are all kept, or served on q/k/v alone, keeps Dynamo's default like plain torch.compile."""
    import importlib

    import te_compile

    be = importlib.import_module("te_compile.backend")  # the module (te_compile.backend is the function)
    calls = []
    monkeypatch.setattr(be, "_guard_requires_grad_flips", lambda: calls.append(1))

    class M(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.proj = torch.nn.Linear(8, 8)
            self.bias = torch.nn.Parameter(torch.randn(1, 2, 8, 8), requires_grad=case == "learned bias")

        def forward(self, q, k, v):
            q = self.proj(q)
            if case in ("learned bias", "frozen bias"):
                return F.scaled_dot_product_attention(q, k, v, attn_mask=self.bias)
            if case == "kept":
                return F.scaled_dot_product_attention(q, k, v, dropout_p=0.5)
            return F.scaled_dot_product_attention(q, k, v, is_causal=case == "causal")

    from te_compile.report import record_reports

    torch._dynamo.reset()
    compiled = torch.compile(M(), backend=te_compile.backend(inner="aot_eager", target="reference"))
    with record_reports() as graphs:
        compiled(*_qkv()).sum().backward()
    served = [d for g in graphs for d in g.decisions if d.rewrite]
    assert len(served) == (0 if case == "kept" else 1)
    assert len(calls) == (1 if case in ("learned bias", "frozen bias") else 0)


def test_importing_te_compile_leaves_dynamo_config_alone():
    import subprocess
    import sys

    code = ("import torch; before = torch._dynamo.config.skip_tensor_guards_with_matching_dict_tags; "
            "import te_compile; assert torch._dynamo.config.skip_tensor_guards_with_matching_dict_tags == before; "
            "print(before)")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and r.stdout.strip() == "True", r.stderr[-2000:]


@pytest.mark.parametrize("case", ["learned 1HLS", "learned 11LS", "learned 1H1S", "learned from a parameter",
                                  "frozen", "bool"])
def test_the_pass_reads_dbias_as_the_backward_computes_it(case):
    """The pass's reading of which bias needs a gradient (passes/grad.py: the report's dbias column and cuDNN's
    support check with or without the dBias plan) is what the backward computes, and the gradients of q, k, v and
    of a learned bias (or the parameter it is computed from) match eager's in float64."""
    shape = {"learned 11LS": (1, 1, 8, 8), "learned 1H1S": (1, 2, 1, 8)}.get(case, (1, 2, 8, 8))
    w = torch.randn(shape, dtype=torch.float64, requires_grad=case.startswith("learned"))
    if case == "bool":
        w = torch.rand(8, 8) > 0.3
    bias_of = (lambda: w * 2 - 1) if case == "learned from a parameter" else (lambda: w)

    def fn(q, k, v):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=bias_of())
    decisions, bw = [], []

    def backend(gm, example_inputs):
        decisions.extend(rewrite_graph(gm, "reference"))

        def bw_compiler(g, ex):
            bw.append(g.code)
            return make_boxed_func(g.forward)
        return aot_autograd(fw_compiler=lambda g, ex: make_boxed_func(g.forward), bw_compiler=bw_compiler)(
            gm, example_inputs)

    torch._dynamo.reset()
    g = torch.Generator().manual_seed(0)
    qkv = [torch.randn(1, 2, 8, 8, generator=g, dtype=torch.float64, requires_grad=True) for _ in range(3)]
    dout = torch.randn(1, 2, 8, 8, generator=g, dtype=torch.float64)
    leaves = qkv + ([w] if w.requires_grad else [])
    got = torch.autograd.grad((torch.compile(fn, backend=backend, fullgraph=True)(*qkv) * dout).sum(), leaves)
    want = torch.autograd.grad((fn(*qkv) * dout).sum(), leaves)
    (d,) = decisions
    assert d.rewrite and _need_dbias_flags(bw[0]) == [str(d.need_dbias)]
    assert d.need_dbias == case.startswith("learned")
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-10)
