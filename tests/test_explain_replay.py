"""te_compile.explain reports the sites of graphs Dynamo did not trace again (a compiled entry reused past a
graph break), and te_compile.tune traces with a backend of its own (reusing an entry compiled without measuring
would measure nothing)."""

import sys
import warnings

import pytest
import torch
import torch.nn.functional as F

import te_compile
from te_compile import tuning
from te_compile.backend import explain_backend
from te_compile.report import record_reports


class Inner(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.p = torch.nn.Linear(8, 8)

    def forward(self, x):
        warnings.warn("a graph break inside a submodule, like a library's warning")
        q = self.p(x)
        return F.scaled_dot_product_attention(q, q, q, is_causal=True)


class Outer(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.inner = Inner()

    def forward(self, x, labels=None):
        y = self.inner(x * 2)
        return y.sum() if labels is None else (y - labels).pow(2).sum()


def test_a_reused_entry_reports_its_sites_again():
    def f(q):
        return F.scaled_dot_product_attention(q, q, q, is_causal=True)

    torch._dynamo.reset()
    compiled = torch.compile(f, backend=explain_backend(False, target="reference", inner="aot_eager"))
    q = torch.randn(1, 2, 8, 8)
    with record_reports() as first:
        compiled(q)
    with record_reports() as second:
        compiled(q)  # Dynamo's cache answers: no trace, the report comes from the compiled graph
    assert [g.index for g in first] == [g.index for g in second] and len(first) == 1
    assert second[0].decisions[0].runs_on == "reference"
    with record_reports() as third:
        compiled(q)
        compiled(q)
    assert len(third) == 1  # once per recorder, however often the graph runs


def test_measuring_gets_a_backend_of_its_own():
    a = explain_backend(False, target="reference", inner="aot_eager")
    assert a is explain_backend(False, target="reference", inner="aot_eager")
    assert a is not explain_backend(True, target="reference", inner="aot_eager")
    assert a is not te_compile.backend(target="reference", inner="aot_eager")


@pytest.mark.parametrize("isolate", [True, False])
def test_explain_again_and_tune_see_sites_past_a_submodule_graph_break(monkeypatch, isolate):
    monkeypatch.setattr(sys.modules["te_compile.api.explain"], "_ISOLATE", isolate and sys.modules[
        "te_compile.api.explain"]._ISOLATE)
    torch._dynamo.reset()
    m = Outer()
    x = torch.randn(1, 2, 8, 8)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for i in range(10):  # past Dynamo's recompile_limit (8)
            for kw in ({}, {"labels": x}):
                report = te_compile.explain(m, x, target="reference", **kw)
                assert report.summary()["reference"] == 1, (i, kw, str(report))
        with tuning.measuring():
            report = te_compile.explain(m, x, labels=x, target="reference")
        assert report.summary()["reference"] == 1, str(report)
        want = m(x)
    got = torch.compile(m, backend=te_compile.backend(target="reference", inner="aot_eager"))(x)
    torch.testing.assert_close(got, want)
