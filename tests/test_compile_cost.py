"""What a compile costs for sites te_compile keeps: no cuDNN plan build for a site the speed decision keeps, and a
graph whose sites are all kept goes to Inductor as plain torch.compile hands it over (graph and config)."""

from __future__ import annotations

import types

import pytest
import torch
import torch.nn.functional as F

import te_compile
from te_compile.tuning import rules
from te_compile.backend import _checker
from te_compile.reasons import NOT_ON_CUDNN, SLOWER, category
from te_compile.spec import AttentionSpec

KEEP = rules.Rule(None, None, "kept in this test")
SERVE = rules.Rule(1, 1, "served in this test")


@pytest.fixture
def stand_in_gpu(monkeypatch):
    """The support check as on a machine with the call's GPU: plan builds (``graphs.finish``) are recorded, not run;
    FE's validator runs as on the CPU."""
    pytest.importorskip("cudnn")
    from te_compile.cudnn import check as chk, graphs, versions

    built: list = []

    def finish(g, uids):
        built.append("backward" if int(graphs.UID.DQ) in uids else "forward")

    monkeypatch.setattr(chk, "_gpu", lambda q: "cuda:0")
    monkeypatch.setattr(graphs, "handle", lambda device: None)
    monkeypatch.setattr(graphs, "finish", finish)
    monkeypatch.setattr(versions, "running", lambda: 91900)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "Stand-in GPU")
    chk._validate.cache_clear()
    yield built
    chk._validate.cache_clear()


def _qkv(B, H, L, D, Hkv=None):
    q = torch.empty(B, H, L, D, device="meta", dtype=torch.bfloat16)
    kv = torch.empty(B, Hkv or H, L, D, device="meta", dtype=torch.bfloat16)
    return q, kv, kv


def test_a_site_kept_for_speed_costs_no_plan_build(stand_in_gpu, monkeypatch):
    monkeypatch.setitem(rules.RULES, "sdpa", KEEP)
    q, k, v = _qkv(2, 8, 1024, 64)
    spec = AttentionSpec(mask="causal")
    why = _checker("auto", "fastest")(q, k, v, None, spec, True, False)
    assert stand_in_gpu == []
    assert category(why) == SLOWER and "kept for speed by the rule for sdpa" in why and "kept in this test" in why
    assert why == rules.slower_reason(q, k, v, None, spec, True, False)


def test_a_served_site_still_builds_its_plans(stand_in_gpu, monkeypatch):
    q, k, v = _qkv(2, 8, 1024, 64)
    spec = AttentionSpec(mask="causal")
    monkeypatch.setitem(rules.RULES, "sdpa", SERVE)
    assert _checker("auto", "fastest")(q, k, v, None, spec, True, False) is None
    assert stand_in_gpu == ["forward", "backward"]
    monkeypatch.setitem(rules.RULES, "sdpa", KEEP)
    assert _checker("auto", "always")(q, k, v, None, spec, False, False) is None  # serve="always": no speed rule
    assert stand_in_gpu == ["forward", "backward", "forward"]


def test_a_validator_rejection_comes_before_the_speed_decision(stand_in_gpu, monkeypatch):
    """6 query heads over 4 key heads: cuDNN's validator rejects the graph, and that stays the reason (as on a GPU,
    where the validator runs first in the plan build) although the rule would also keep the site."""
    monkeypatch.setitem(rules.RULES, "sdpa", KEEP)
    q, k, v = _qkv(2, 6, 64, 64, Hkv=4)
    why = _checker("auto", "fastest")(q, k, v, None, AttentionSpec(), False, False)
    assert category(why) == NOT_ON_CUDNN
    assert why.startswith("cuDNN 9.19 builds no forward plan for this graph on Stand-in GPU: "), why
    assert stand_in_gpu == []


def test_a_measurement_builds_the_plans_first(stand_in_gpu, monkeypatch):
    """When measuring (te_compile.tune, mode="max-autotune") the plans come first: the measurement times the classes
    of the sites cuDNN can serve."""
    from te_compile import tuning
    monkeypatch.setitem(rules.RULES, "sdpa", KEEP)
    q, k, v = _qkv(2, 8, 1024, 64)
    with tuning.measuring():
        why = _checker("auto", "fastest")(q, k, v, None, AttentionSpec(mask="causal"), False, False)
    assert category(why) == SLOWER and stand_in_gpu == ["forward"]


def test_a_model_whose_sites_the_rules_keep_builds_no_plan(stand_in_gpu, monkeypatch):
    """End to end: the compile of a model with two SDPA sites the rules keep, decided as on a GPU, builds no plan and
    reports both kept for speed; the same model under serve="always" builds its plans."""
    monkeypatch.setitem(rules.RULES, "sdpa", KEEP)

    class Model(torch.nn.Module):
        def forward(self, q, k, v):
            x = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            return F.scaled_dot_product_attention(x, k, v)

    q, k, v = (torch.randn(1, 2, 128, 64, dtype=torch.bfloat16) for _ in range(3))
    rep = te_compile.explain(Model(), q, k, v, for_device="cuda", serve="fastest")
    assert [category(d.reason) for d in rep.decisions] == [SLOWER, SLOWER], [d.reason for d in rep.decisions]
    assert stand_in_gpu == []
    rep = te_compile.explain(Model(), q, k, v, for_device="cuda", serve="always")
    assert [d.runs_on for d in rep.decisions] == ["cudnn", "cudnn"]
    assert stand_in_gpu == ["forward", "forward"]


def _fresh(fn):
    """``fn`` with a code object of its own (Dynamo's compiled entries live on the code object)."""
    return types.FunctionType(fn.__code__.replace(), fn.__globals__, fn.__name__, fn.__defaults__, fn.__closure__)


def _sdpa_twice(q, k, v):
    return F.scaled_dot_product_attention(q, k, v, is_causal=True).sin() * 2


def test_a_graph_whose_sites_are_all_kept_goes_to_inductor_as_torch_compile_hands_it(monkeypatch):
    """A training step with its site kept for speed (decided as on a GPU): Inductor receives the same graph and
    config from te_compile as from plain torch.compile, compiles the backward lazily as there, and the callable
    te_compile returns is Inductor's own; forward and gradients match eager."""
    import torch._functorch.config as functorch_config
    import torch._inductor.compile_fx as cfx

    from te_compile.backend import Options, _make_backend
    from te_compile.report import Report, record_reports

    monkeypatch.setitem(rules.RULES, "sdpa", KEEP)
    seen, returned = [], []
    real = cfx.compile_fx

    def spy(gm, inputs, *a, **kw):
        seen.append((gm.code, kw.get("config_patches"), functorch_config.force_non_lazy_backward_lowering))
        out = real(gm, inputs, *a, **kw)
        returned.append(out)
        return out
    monkeypatch.setattr(cfx, "compile_fx", spy)

    te_backend = _make_backend(Options(for_device="cuda", serve="fastest"))
    handed = []

    def te(gm, inputs, **kw):
        handed.append(te_backend(gm, inputs, **kw))
        return handed[-1]

    g = torch.Generator().manual_seed(0)
    qkv0 = [torch.randn(1, 2, 64, 16, generator=g, dtype=torch.bfloat16) for _ in range(3)]
    results = []
    for backend in ("inductor", te, "eager"):
        qkv = [t.clone().requires_grad_(True) for t in qkv0]
        fn = _fresh(_sdpa_twice) if backend == "eager" else torch.compile(_fresh(_sdpa_twice), backend=backend)
        with record_reports() as reports:
            out = fn(*qkv)
        out.float().sum().backward()
        results.append([out, *(t.grad for t in qkv)])
        if backend is te:
            assert [category(d.reason) for d in Report(reports).decisions] == [SLOWER]
            assert handed == [returned[-1]] and handed[0] is returned[-1]  # no wrapper of te_compile's
    half = len(seen) // 2  # per backend: compile_fx (and again inside its config patches, where it has some)
    assert half and seen[:half] == seen[half:], seen
    assert not any(lazy for _, _, lazy in seen)
    for compiled in results[:2]:
        for got, want in zip(compiled, results[2]):
            torch.testing.assert_close(got, want, atol=2e-2, rtol=2e-2)


def test_only_a_graph_whose_site_the_speed_decision_looks_up_is_hashed(monkeypatch):
    """The graph signature (the measurement cache's key, te_compile.tuning.graph_ab) is computed for a graph with a
    site the speed decision looks up, once, and for no other graph (here: one without attention)."""
    import importlib

    from te_compile import tuning
    from te_compile.tuning import graph_ab
    backend_mod = importlib.import_module("te_compile.backend")
    monkeypatch.setattr(backend_mod, "_is_cuda_graph", lambda inputs: True)  # decide these CPU graphs as CUDA ones
    monkeypatch.setattr(tuning, "platform", lambda *a: {"gpu": "Stand-in GPU", "cudnn": 91900, "torch": "2.13"})
    monkeypatch.setitem(rules.RULES, "sdpa", KEEP)
    hashed = []
    real = graph_ab.signature
    monkeypatch.setattr(graph_ab, "signature", lambda *a: hashed.append(1) or real(*a))

    def attention(x):
        return F.scaled_dot_product_attention(x, x, x, is_causal=True).sum()

    def no_attention(x):
        return (x.sin() * 2).sum()

    x = torch.randn(1, 2, 32, 16, dtype=torch.bfloat16)
    for fn, want in ((no_attention, []), (attention, [1])):
        hashed.clear()
        torch._dynamo.reset()
        rep = te_compile.explain(_fresh(fn), x, for_device="cuda", serve="fastest")
        assert [category(d.reason) for d in rep.decisions] == [SLOWER] * len(want)
        assert hashed == want


def test_counters_count_the_compile_phases(stand_in_gpu, monkeypatch):
    """te_compile.counters (what bench/compile_time.py reports): a compile counts its decide and support-check
    phases, and the check's plan builds only where a site is served."""
    from te_compile import counters
    monkeypatch.setitem(rules.RULES, "sdpa", KEEP)
    q = torch.randn(1, 2, 64, 64, dtype=torch.bfloat16)
    for serve, builds in (("fastest", 0), ("always", 1)):
        counters.reset()
        te_compile.explain(lambda q: F.scaled_dot_product_attention(q, q, q), q, for_device="cuda", serve=serve)
        got = counters.phases()
        assert got["decide"]["count"] == 1 and got["support check"]["count"] >= 1, got
        assert got.get("check plan builds", {}).get("count", 0) == builds, got
        assert ("speed decision" in got) == (serve == "fastest"), got
