"""Modules checked directly (not only through the backend): expression building, output layouts, which inputs
need gradients, the SDPA pass's decisions, te_compile.tune on a CPU model, and the benchmark's tables."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from te_compile import layout

from te_compile.cli import benchmark

from te_compile.score import expr
from te_compile.passes import find, grad, rewrite, sdpa


# --------------------------------------------------------------------------- expr

def test_constants_fold_and_identities_drop():
    x = expr.parse("score")
    two, three = expr.Expr.const(2.0), expr.Expr.const(3)
    assert expr.add(two, three).value == 5.0 and expr.add(expr.Expr.const(2), three).value == 5  # int stays int
    assert expr.mul(x, expr.Expr.const(1)) is x and expr.mul(expr.Expr.const(0.0), x).is_const(0.0)
    assert expr.sub(expr.Expr.const(0), x) == expr.neg(x) and expr.neg(two).value == -2.0
    assert expr.div(x, expr.Expr.const(0)).op == "div"  # never folded into an infinity
    assert str(expr.add(x, expr.mul(x, two))) == "(add score (mul score 2.0))"
    assert expr.parse(str(expr.sub(x, two))) == expr.sub(x, two)  # text round trip


# --------------------------------------------------------------------------- layout

def test_outputs_follow_the_inputs_layout():
    bshd = torch.empty(2, 5, 3, 8).transpose(1, 2)  # [B, H, S, D] view of [B, S, H, D] storage
    assert layout.like_layout_strides((2, 3, 5, 4), bshd) == (60, 4, 12, 1)  # D=4 now, same order
    assert layout.like_layout_strides((2, 3, 5, 8), torch.empty(2, 3, 5, 8)) == (120, 40, 8, 1)
    broadcast = torch.empty(1, 3, 5, 8).expand(2, 3, 5, 8)
    assert layout.like_layout_strides((2, 3, 5, 8), broadcast) == layout.contiguous_strides((2, 3, 5, 8))
    transposed_last = torch.empty(2, 3, 8, 5).transpose(-1, -2)  # last dim not innermost: row-major instead
    assert layout.like_layout_strides((2, 3, 5, 8), transposed_last)[-1] == 1
    out = layout.empty_like_layout((2, 3, 5, 4), bshd, dtype=torch.float64)
    assert out.stride() == (60, 4, 12, 1) and out.dtype == torch.float64


def test_sizes_read_without_guards():
    assert layout.concrete((1, 2, 3)) == (1, 2, 3)
    assert layout.size_hints((4, 5)) == (4, 5)

    class Sym:  # a SymInt-like size: read through its hint
        class node:
            hint = 32
    assert layout.concrete((1, Sym())) is None and layout.size_hints((1, Sym())) == (1, 32)


# --------------------------------------------------------------------------- grad and the SDPA pass

def _sites(fn, *args):
    graphs = []

    def capture(gm, example_inputs):
        graphs.append(gm)
        return gm.forward
    torch._dynamo.reset()
    torch.compile(fn, backend=capture)(*args)
    (g,) = graphs
    return g, find.find_sites(g.graph)


def test_which_inputs_need_gradients():
    q = torch.randn(1, 2, 8, 4, requires_grad=True)
    k, v = torch.randn(1, 2, 8, 4), torch.randn(1, 2, 8, 4, requires_grad=True)
    bias = torch.randn(8, 8, requires_grad=True)
    _, (site,) = _sites(lambda q, k, v, b: F.scaled_dot_product_attention(q, k, v, attn_mask=b), q, k, v, bias)
    g = grad.site_grads(site)
    assert (g.q, g.k, g.v, g.bias) == (True, False, True, True) and g.describe() == "q,v,bias"
    with torch.no_grad():
        _, (site,) = _sites(lambda q, k, v, b: F.scaled_dot_product_attention(q, k, v, attn_mask=b), q, k, v, bias)
        assert not grad.site_grads(site).any


@pytest.mark.parametrize("kw,runs_on,reason", [
    ({"is_causal": True}, "reference", ""),
    ({"dropout_p": 0.1}, "kept", "dropout"),
])
def test_the_sdpa_pass_decides(kw, runs_on, reason):
    q = torch.randn(1, 2, 8, 4)
    _, (site,) = _sites(lambda q: F.scaled_dot_product_attention(q, q, q, **kw), q)
    d = rewrite.decide(site, "reference", None)  # the SDPA pass (passes/sdpa.py) behind the registry
    assert d.runs_on == runs_on and reason in (d.reason or ""), d.reason
    if runs_on == "reference":
        assert d.spec.is_causal and d.spec.impl == "reference"
    assert sdpa.describe_mask(site) == ("causal" if kw.get("is_causal") else "none")


def test_tune_on_a_cpu_model_measures_nothing_and_says_so(tmp_path, monkeypatch):
    from te_compile.api.autotune import tune
    monkeypatch.setenv("TE_COMPILE_CACHE_DIR", str(tmp_path))
    lines = []
    q = torch.randn(1, 2, 8, 4)
    report, made = tune(lambda q: F.scaled_dot_product_attention(q, q, q, is_causal=True), q, echo=lines.append)
    assert made == [] and [d.runs_on for d in report.decisions] == ["kept"]
    assert lines[-1].startswith("te-compile tune: 0 graph measurement(s)") and "1 site(s) in the model, 0 on cuDNN" in lines[-1]


# --------------------------------------------------------------------------- benchmark tables

def test_the_benchmark_tables():
    rows = [{"case": "causal", "impl": "te_compile", "fwd_ms": 1.0, "fwd_tflops": 100.0, "bwd_ms": 2.0,
             "bwd_tflops": 125.0},
            {"case": "causal", "impl": "torch.compile flex (inductor)", "fwd_ms": 2.0, "fwd_tflops": 50.0,
             "bwd_ms": 4.0, "bwd_tflops": 62.5},
            {"case": "none", "impl": "te_compile", "fwd_ms": None, "fwd_tflops": None, "bwd_ms": None,
             "bwd_tflops": None}]
    table = benchmark.to_markdown(rows).splitlines()
    assert table[2] == "| causal | te_compile | 1.000 | 100 | 2.000 | 125 |" and table[4] == "| none | te_compile | n/a | | n/a | |"
    speed = benchmark.speedups(rows).splitlines()
    assert speed[2] == "| causal | 2.00x | 2.00x | 2.00x |" and speed[-1].endswith("| **2.00x** |")


def test_per_row_error_sees_a_wrong_row_that_the_global_error_dilutes():
    """tests/forms.rows_err, the cuda tests' per-row check: one row (a ragged last tile's) whose values are under 1% of
    the tensor's scale and all wrong passes the global relative error's 2e-2 and fails the per-row tolerance."""
    from forms import ROWS_TOL, rel_err, rows_err

    ref = torch.randn(2, 4, 129, 64, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    ref[..., 128, :] *= 0.008 * ref.abs().max() / ref[..., 128, :].abs().amax(-1, keepdim=True)
    got = ref.clone()
    got[1, 3, 128] = -got[1, 3, 128]  # the last row of one head, sign-flipped
    assert rel_err(got, ref) <= 2e-2
    assert rows_err(got, ref) > ROWS_TOL
    assert rows_err(ref + 1e-4 * torch.randn_like(ref), ref) < ROWS_TOL
