"""Learned score_mod tables: te_compile's table gradient is the true one, against float64 math (never against
eager flex, whose gradient for the chained spelling T[q_idx][kv_idx] is wrong: every row of dT gets the sum
over rows, on torch 2.11 CUDA and 2.13 CPU alike)."""

import pytest
import torch
import torch.nn.attention.flex_attention as fa
import torch.nn.functional as F

import te_compile
from tools.fuzz import eager_source

L, S = 24, 40


@pytest.fixture(autouse=True)
def _cpu_flex(monkeypatch):
    monkeypatch.setattr(fa, "_validate_device", lambda *a, **k: None)


def _grads(score_mod_of, compiled: bool, L: int = L, S: int = S):
    g = torch.Generator().manual_seed(0)
    table = torch.randn(L, S, generator=g, dtype=torch.float64).requires_grad_(True)
    q, k, v = (torch.randn(2, 4, n, 8, generator=g, dtype=torch.float64).requires_grad_(True) for n in (L, S, S))
    fn = lambda q, k, v: fa.flex_attention(q, k, v, score_mod=score_mod_of(table))  # noqa: E731
    if compiled:
        torch._dynamo.reset()
        fn = torch.compile(fn, backend=te_compile.backend(inner="aot_eager", target="reference"))
    out = fn(q, k, v)
    out.backward(torch.randn(out.shape, generator=g, dtype=torch.float64))
    return out, table.grad, q.grad


def _dense(L: int = L, S: int = S):
    g = torch.Generator().manual_seed(0)
    table = torch.randn(L, S, generator=g, dtype=torch.float64).requires_grad_(True)
    q, k, v = (torch.randn(2, 4, n, 8, generator=g, dtype=torch.float64).requires_grad_(True) for n in (L, S, S))
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=table)
    out.backward(torch.randn(out.shape, generator=g, dtype=torch.float64))
    return out, table.grad, q.grad


@pytest.mark.parametrize("spelling", ["chained", "comma"])
def test_table_gradient_matches_float64_math(spelling):
    if spelling == "chained":
        mod = lambda t: (lambda s, b, h, qi, ki: s + t[qi][ki])  # noqa: E731
    else:
        mod = lambda t: (lambda s, b, h, qi, ki: s + t[qi, ki])  # noqa: E731
    for got, want in zip(_grads(mod, compiled=True), _dense()):
        torch.testing.assert_close(got, want)


def test_eager_flex_chained_table_gradient_is_wrong():
    """The fact the fuzzer's eager_source works around: if torch fixes it, this test says so (at L != S eager
    raises instead: "idx shape must match value shape")."""
    eager = _grads(lambda t: (lambda s, b, h, qi, ki: s + t[qi][ki]), compiled=False, L=S)
    want = _dense(L=S)
    torch.testing.assert_close(eager[0], want[0])
    assert not torch.allclose(eager[1], want[1], rtol=1e-3, atol=1e-3)


def test_eager_source_reads_chained_learned_tables_with_a_comma():
    src = "def score_mod(score, b, h, q_idx, kv_idx):\n    return score + T0[q_idx][kv_idx] + T1[b][q_idx]\n"
    assert eager_source(src, ["T0"]) == src.replace("T0[q_idx][kv_idx]", "T0[q_idx, kv_idx]")
    assert eager_source(src, []) == src


def test_fuzzer_counts_torch_compiles_own_failure_as_invalid():
    """A kept site that plain torch.compile (same inner compiler) cannot run either is not te_compile's crash."""
    from tools import fuzz
    case = fuzz.Case(seed=3, L=16, S=24, score="def score_mod(score, b, h, q_idx, kv_idx):\n"
                     "    return torch.exp2(torch.clamp(score + T1[q_idx][kv_idx], max=4.0))\n",
                     captured=[{"name": "T1", "shape": ["L", "S"], "make": "randn", "dtype": "float32", "learned": True}])
    outcome, detail, _ = fuzz.compare(case, "cpu", fuzz._prepare("cpu"))
    assert outcome == "invalid" and "plain torch.compile raises too" in detail, (outcome, detail)
