"""The rest of a graph's GPU work (te_compile.tuning.graph_work): counted from the FX graph, shared over its
attention sites, run before each call when a site is measured (not for sliding windows), and not credited by
the rules, which cannot see the graph's host time."""

import torch
import torch.nn.functional as F

from te_compile.tuning import graph_work
from te_compile.rules import site_class, slower_reason
from te_compile.spec import AttentionSpec

CAUSAL = "(ge q_idx kv_idx)"
SLIDING = "(and (ge q_idx kv_idx) (le (sub q_idx kv_idx) 512))"


def _t(*shape):
    return torch.empty(*shape, dtype=torch.bfloat16, device="meta")


def _captured(fn, *args) -> torch.fx.GraphModule:
    got = []

    def grab(gm, example_inputs):
        got.append(gm)
        return gm.forward
    torch._dynamo.reset()
    torch.compile(fn, backend=grab, fullgraph=True)(*args)
    return got[0]


def test_counts_the_forward_matrix_multiplies_of_a_dynamo_graph():
    w, w2 = torch.randn(32, 64), torch.randn(3, 16)

    def f(x, b):
        h = F.linear(x, w)                  # [2, 10, 32] from K = 64
        return torch.bmm(h, b), F.linear(h[..., :16], w2)  # [2, 10, 5] from K = 32; [2, 10, 3] from K = 16
    gm = _captured(f, torch.randn(2, 10, 64), torch.randn(2, 32, 5))
    want = 2 * (2 * 10 * 32) * 64 + 2 * (2 * 10 * 5) * 32 + 2 * (2 * 10 * 3) * 16
    assert graph_work.forward_gemm_flops(gm.graph) == want


def test_a_graph_without_matrix_multiplies_adds_nothing():
    gm = _captured(lambda x: torch.tanh(x) * 2, torch.randn(4, 4))
    assert graph_work.forward_gemm_flops(gm.graph) == 0.0
    with graph_work.graph(gm):
        assert graph_work.rest_ms(True, 500.0) == 0.0


def _site(L, mask_mod):
    q, k, v = _t(1, 16, L, 64), _t(1, 16, L, 64), _t(1, 16, L, 64)
    return q, k, v, None, AttentionSpec(source="flex", scale=0.125, mask_mod=mask_mod), True, False


def test_the_rules_do_not_credit_the_graph_work():
    """The rules cannot see the rest of the graph's host time, so a site they keep alone stays kept in a busy
    graph (served that way, sites of a near host-bound model ran slower); measuring runs the share instead."""
    site = _site(1024, CAUSAL)
    alone = slower_reason(*site)
    assert alone is not None and "kept for speed by the rule for flex native band" in alone
    token = graph_work._rest_flops.set(1.4e12)  # a 4-layer model's matrix multiplies at 8192 tokens
    try:
        assert slower_reason(*site) == alone
        assert graph_work.rest_ms(True, 500.0) > 5.0  # what a measurement of the site would run first
    finally:
        graph_work._rest_flops.reset(token)


def test_the_backend_decides_each_graph_knowing_its_matrix_multiplies(monkeypatch):
    import te_compile
    import sys
    backend_mod = sys.modules["te_compile.backend"]
    seen = []
    rewrite = backend_mod.rewrite_graph

    def spy(gm, *a, **k):
        seen.append(graph_work._rest_flops.get())
        return rewrite(gm, *a, **k)
    monkeypatch.setattr(backend_mod, "rewrite_graph", spy)
    w = torch.randn(64, 64)

    def f(x):
        q = F.linear(x, w)
        return F.scaled_dot_product_attention(q, q, q, is_causal=True)
    torch._dynamo.reset()
    torch.compile(f, backend=te_compile.backend(inner="eager"))(torch.randn(1, 2, 8, 64))
    assert seen == [2.0 * (1 * 2 * 8 * 64) * 64]
    assert graph_work._rest_flops.get() == 0.0


def test_each_of_n_sites_gets_one_nth_of_the_graph_work():
    w = torch.randn(64, 64)

    def f(x):
        q = F.linear(x, w)
        a = F.scaled_dot_product_attention(q, q, q, is_causal=True)
        return F.scaled_dot_product_attention(a, q, q)
    gm = _captured(f, torch.randn(1, 2, 8, 64))
    assert graph_work.attention_sites(gm.graph) == 2
    with graph_work.graph(gm):
        assert graph_work.rest_ms(False, 1.0) == 2.0 * (1 * 2 * 8 * 64) * 64 / 1e9 / 2
        assert abs(graph_work.rest_ms(True, 1.0) - 3 * graph_work.rest_ms(False, 1.0)) < 1e-15
    assert graph_work.rest_ms(True, 1.0) == 0.0


def test_measurements_are_keyed_by_the_graph_work_they_ran_with():
    from te_compile import tuning
    q, k, v, bias, spec, grad, dbias = _site(1024, CAUSAL)
    plat = {"gpu": "X", "cudnn": 91900, "torch": "2.11"}
    alone = tuning.site_key(q, k, v, bias, spec, grad, dbias, plat)
    assert tuning.site_key(q, k, v, bias, spec, grad, dbias, plat, rest=0.01) == alone  # negligible: as before
    busy = tuning.site_key(q, k, v, bias, spec, grad, dbias, plat, rest=1.734)
    assert busy != alone and '"rest":1.7' in busy
    assert tuning.site_key(q, k, v, bias, spec, grad, dbias, plat, rest=1.71) == busy  # two significant digits


def test_a_measured_site_runs_with_its_share_of_the_graph_work(monkeypatch):
    """speed_reason measures a site with its share of the graph work, and keys it so."""
    import sys
    from te_compile.tuning.timing import Measurement
    tuning_mod = sys.modules["te_compile.tuning"]
    q, k, v, bias, spec, grad, dbias = _site(1024, CAUSAL)
    seen = {}

    def fake_measure(q, k, v, bias, spec, needs_grad, need_dbias, key, timer=None, rest=0.0):
        seen.update(key=key, rest=rest)
        return Measurement(1.0, 1.2, 0.01, 7, 0.0, (1.2,) * 7)
    monkeypatch.setattr(tuning_mod, "measure", fake_measure)
    monkeypatch.setattr(tuning_mod, "lookup", lambda key: None)
    monkeypatch.setattr(tuning_mod, "rest_ms", lambda *a: 0.8)
    with tuning_mod.measuring():
        assert tuning_mod.speed_reason(q, k, v, bias, spec, grad, dbias) is None
    assert seen["rest"] == 0.8 and '"rest":0.8' in seen["key"]


def test_the_share_is_zero_off_cuda_and_for_sliding_windows():
    from te_compile import tuning
    token = graph_work._rest_flops.set(1.4e12)
    try:
        assert tuning.rest_ms(*_site(8192, CAUSAL)) == 0.0  # meta tensors: not on a GPU, nothing to simulate
    finally:
        graph_work._rest_flops.reset(token)
    # a sliding window is a band narrower than causal: tuning.rest_ms gives it no share on a GPU either
    assert site_class(_site(8192, SLIDING)[4], False, False, 8192, 8192, 16) == "flex narrow band"
    assert site_class(_site(8192, CAUSAL)[4], False, False, 8192, 8192, 16) == "flex native band"
