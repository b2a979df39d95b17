"""A site kept for speed whose graph Inductor cannot compile is served instead, and the report says why.

Inductor's flex backward can fail to compile (on an H100 it ran out of shared memory for a learned
relative-position table); on this CPU it fails for any flex backward, which stands in for that failure here.
The cost model is replaced by one that keeps every site for speed, and the sites go to the reference kernel.
"""

import importlib

import pytest
import torch
import torch.nn.attention.flex_attention as fa
import torch.nn.functional as F

import te_compile
from te_compile.passes.decision import Decision
from te_compile.passes.find import find_sites
from te_compile.reasons import SERVED_AFTER_INNER_FAILURE, SLOWER, Reason, category
from te_compile.report import Report, record_reports

backend_mod = importlib.import_module("te_compile.backend")


@pytest.fixture
def kept_for_speed(monkeypatch):
    """serve="fastest" keeps every site for speed; serve="always" serves it on the reference kernel."""
    monkeypatch.setattr(fa, "_validate_device", lambda *a, **k: None)
    real = backend_mod.rewrite_graph
    monkeypatch.setattr(backend_mod, "_checker", lambda target, serve="fastest", cuda_graphs=False: serve)

    def rewrite(gm, target, checker, verify=False):
        if checker == "fastest":
            return [Decision(site=s).keep(Reason("kept for speed: test", SLOWER)) for s in find_sites(gm.graph)]
        return real(gm, "reference", None, verify)
    monkeypatch.setattr(backend_mod, "rewrite_graph", rewrite)


def test_served_when_inductor_cannot_compile_the_kept_site(kept_for_speed):
    g = torch.Generator().manual_seed(0)
    table0 = torch.randn(4, 63, generator=g, dtype=torch.float64)
    qkv0 = [torch.randn(1, 4, 32, 16, generator=g, dtype=torch.float64) for _ in range(3)]
    table = table0.clone().requires_grad_(True)
    q, k, v = (t.clone().requires_grad_(True) for t in qkv0)

    def fn(q, k, v):
        return fa.flex_attention(q, k, v, score_mod=lambda s, b, h, qi, ki: s + table[h, qi - ki + 31])
    torch._dynamo.reset()
    with record_reports() as reports:
        out = torch.compile(fn, backend=te_compile.backend(target="reference", serve="fastest"))(q, k, v)
    out.sum().backward()
    (d,) = Report(reports).decisions
    assert d.rewrite and category(d.reason) == SERVED_AFTER_INNER_FAILURE
    assert "Inductor could not compile" in d.reason

    # float64 math with the gathered table as a dense bias
    t2 = table0.clone().requires_grad_(True)
    q2, k2, v2 = (t.clone().requires_grad_(True) for t in qkv0)
    idx = torch.arange(32)
    want = F.scaled_dot_product_attention(q2, k2, v2, attn_mask=t2[:, idx[:, None] - idx[None, :] + 31])
    want.sum().backward()
    for got, ref in ((out, want), (q.grad, q2.grad), (v.grad, v2.grad), (table.grad, t2.grad)):
        torch.testing.assert_close(got, ref)


def test_kept_site_that_compiles_stays_kept(kept_for_speed):
    """Without grads there is no flex backward to fail: the site stays kept, as the cost model says."""
    q, k, v = (torch.randn(1, 2, 16, 8) for _ in range(3))
    torch._dynamo.reset()
    with record_reports() as reports:
        torch.compile(lambda q, k, v: fa.flex_attention(q, k, v), backend=te_compile.backend(target="reference", serve="fastest"))(q, k, v)
    (d,) = Report(reports).decisions
    assert not d.rewrite and category(d.reason) == SLOWER
