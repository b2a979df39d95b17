"""te_compile.explain called again and again on one model: every call reports every site, and the
model's recompile budget is left for the user's own torch.compile (issue: a newcomer's first hour)."""

import pytest
import torch
import torch.nn.functional as F

import te_compile
from te_compile.report import record_reports


class TwoSites(torch.nn.Module):
    def __init__(self, graph_break: bool):
        super().__init__()
        self.graph_break = graph_break

    def forward(self, q, k, v):
        x = F.scaled_dot_product_attention(q, k, v, is_causal=True) * 2
        if self.graph_break:
            torch._dynamo.graph_break()
        return F.scaled_dot_product_attention(x, k, v)


@pytest.mark.parametrize("graph_break", [False, True])
def test_twelve_explains_then_compile(graph_break):
    torch._dynamo.reset()
    m = TwoSites(graph_break)
    q = torch.randn(1, 2, 16, 8)
    for i in range(12):  # more than Dynamo's recompile_limit (8)
        report = te_compile.explain(m, q, q, q, target="reference")
        assert report.summary() == {"sites": 2, "cudnn": 0, "reference": 2, "kept": 0}, (i, str(report))
        assert not report.note
    # the user's own compile afterwards is still compiled (not run eagerly without a word)
    with record_reports() as graphs:
        out = torch.compile(m, backend=te_compile.backend(target="reference", inner="aot_eager"))(q, q, q)
    assert sum(len(g.decisions) for g in graphs) == 2
    torch.testing.assert_close(out, m(q, q, q))


def test_empty_report_says_why():
    def no_tensor_work(q):
        return q  # Dynamo compiles no graph for this

    with pytest.warns(RuntimeWarning, match="compiled no graph"):
        report = te_compile.explain(no_tensor_work, torch.randn(1, 2, 8, 8))
    assert report.summary()["sites"] == 0 and "ran eagerly" in report.note
    assert "ran eagerly" in str(report).splitlines()[1]


def test_site_report_is_a_structured_trace_artifact():
    """TORCH_TRACE / tlparse users find the site report as a `te_compile_sites` artifact."""
    import json
    import logging

    from torch._logging._internal import trace_log

    records = []

    class Grab(logging.Handler):
        def emit(self, record):
            records.append(record)

    h = Grab(level=logging.DEBUG)
    trace_log.addHandler(h)
    try:
        def f(q):
            return F.scaled_dot_product_attention(q, q, q, is_causal=True)

        te_compile.explain(f, torch.randn(1, 2, 8, 8), target="reference")
    finally:
        trace_log.removeHandler(h)
    ours = [r for r in records if "te_compile_sites" in str(r.msg) or "te_compile_sites" in str(getattr(r, "metadata", ""))]
    assert ours, [str(r.msg)[:80] for r in records][:20]
    payload = json.loads(ours[0].payload)
    assert payload["summary"]["reference"] == 1 and payload["sites"][0]["mask"] == "causal"


@pytest.mark.parametrize("graph_break", [False, True])
def test_twelve_explains_without_isolate_recompiles(monkeypatch, graph_break):
    """torch 2.11 has no isolate_recompiles: explain compiles through a copy of the code instead."""
    import sys

    monkeypatch.setattr(sys.modules["te_compile.api.explain"], "_ISOLATE", False)
    torch._dynamo.reset()
    m = TwoSites(graph_break)
    q = torch.randn(1, 2, 16, 8)

    def fn(q, k, v):
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)

    for i in range(12):
        assert te_compile.explain(m, q, q, q, target="reference").summary()["reference"] == 2, i
        assert te_compile.explain(fn, q, q, q, target="reference").summary()["reference"] == 1, i
    assert "forward" not in vars(m)  # the copy of forward is gone again
    with record_reports() as graphs:
        torch.compile(m, backend=te_compile.backend(target="reference", inner="aot_eager"))(q, q, q)
    assert sum(len(g.decisions) for g in graphs) == 2


def test_report_shows_infix_beside_the_sexpr():
    from torch.nn.attention.flex_attention import flex_attention

    def fn(q):
        return flex_attention(q, q, q, score_mod=lambda s, b, h, qi, kv: torch.tanh(s / 30.0) * 30.0)

    report = te_compile.explain(fn, torch.randn(1, 2, 16, 8), target="reference")
    row = report.to_dict()["sites"][0]
    assert row["score_mod"] == "tanh(score / 30.0) * 30.0"
    assert row["score_mod_sexpr"] == "(mul (tanh (div score 30.0)) 30.0)"
    assert "tanh(score / 30.0) * 30.0" in str(report)


def test_dynamic_shapes_report_the_sizes_seen():
    """After a second shape Dynamo compiles with symbolic sizes; the report names the concrete size too."""
    torch._dynamo.reset()
    m = TwoSites(False)
    rows = []
    for n in (16, 32):
        q = torch.randn(1, 2, n, 8)
        rows.append(te_compile.explain(m, q, q, q, target="reference").rows()[0]["q"])
    assert rows[0] == "[1,2,16,8]"
    assert rows[1].endswith("=32)") and rows[1].startswith("[1,2,s"), rows[1]
