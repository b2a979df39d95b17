"""The whole-model check of te_compile.tune (te_compile.api.model_check): the model timed as called, with a
fake compiler and a fake timer; what it writes into the cache and the reason the next compile gives."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from te_compile.reasons import SLOWER, category
from te_compile.api import model_check
from te_compile.tuning.timing import step
from te_compile import tuning
from te_compile.spec import AttentionSpec
from te_compile.tuning import cache, graph_ab

PLAT = {"gpu": "NVIDIA H100 80GB HBM3", "cudnn": 91900, "torch": "2.11.0"}


@pytest.fixture(autouse=True)
def _cache_dir(tmp_path, monkeypatch):
    monkeypatch.setenv(cache.ENV, str(tmp_path / "cache"))
    graph_ab.measured_log.clear()
    model_check.model_log.clear()


class Model(torch.nn.Module):
    def __init__(self, d=16):
        super().__init__()
        self.proj = torch.nn.Linear(d, d)

    def forward(self, x, scale=1.0):
        q = self.proj(x)
        return {"out": F.scaled_dot_product_attention(q, q, q, is_causal=True) * scale, "aux": [q.sum()]}


def _fake(te_ms, tc_ms, compiled):
    side = {}

    def compile_fn(fn, backend, mode):
        name = "tc" if backend == "inductor" else "te"
        compiled.append(name)

        def run(*a, **k):
            side["now"] = name
            return fn(*a, **k)
        return run

    def timer(fn, iters):
        fn()
        return te_ms if side["now"] == "te" else tc_ms
    return compile_fn, timer


@pytest.mark.parametrize("te_ms, tc_ms, keep", [(1.2, 1.0, True), (1.0, 1.3, False), (1.0, 1.01, False)])
def test_a_model_slower_as_served_marks_its_graphs_kept(te_ms, tc_ms, keep):
    """Slower served: its measured classes are marked kept. Faster, even by less than the measurement's margin: the
    graph's verdict stands."""
    key = graph_ab.key("g" * 32, "sdpa", True, PLAT)
    compiled, lines = [], []
    compile_fn, timer = _fake(te_ms, tc_ms, compiled)
    m = model_check.check(Model(), (torch.randn(1, 2, 8, 16),), {}, None, [{"key": key, "served": True}],
                          echo=lines.append, timer=timer, compile_fn=compile_fn)
    assert sorted(compiled) == ["tc", "te"] and m.te_ms == te_ms and m.tc_ms == tc_ms
    assert model_check.model_log[-1]["served"] is (not keep) and "whole model" in lines[0]
    entry = cache.get(key)
    if not keep:
        assert entry is None  # the graph's own verdict stands
        return
    assert entry["scope"] == "model"
    # the next compile of a graph with that entry (the default policy) keeps the class's sites, naming the check
    reason = _reason_from(key)
    assert category(reason) == SLOWER and "whole model" in reason and f"{te_ms:.3f} ms" in reason


def _reason_from(key):
    """The reason the default policy gives a causal SDPA site of the graph whose cache entry is at ``key``."""
    q = torch.empty(2, 8, 4096, 128, dtype=torch.bfloat16, device="meta")
    with tuning.graph(tuning.GraphScope(lambda cls: key)):
        return tuning.speed_reason(q, q, q, None, AttentionSpec(mask="causal"), True, False)


def test_nothing_is_timed_without_a_served_graph():
    compiled = []
    compile_fn, timer = _fake(1.0, 2.0, compiled)
    assert model_check.check(Model(), (torch.randn(1, 2, 8, 16),), {}, None, [], timer=timer,
                             compile_fn=compile_fn) is None
    assert compiled == [] and model_check.model_log == [] and cache.entries() == {}


def test_the_training_step_takes_every_gradient_without_touching_grad():
    model, x = Model(), torch.randn(1, 2, 8, 16, requires_grad=True)
    grads = step(lambda: model(x, scale=2.0), model_check.leaves(model, (x,), {"scale": 2.0}), True)()
    assert len(grads) == 3 and all(g is not None for g in grads)  # weight, bias, x
    assert all(p.grad is None for p in model.parameters()) and x.grad is None
    out = step(lambda: model(x), model_check.leaves(model, (x,), {}), False)()
    assert not out["out"].requires_grad  # inference runs without grad


def test_isolated_compiles_keep_their_own_entries():
    """Two compiles of one model with different backends each compile (neither reuses the other's entry), and
    the user's own torch.compile of it still has its whole recompile budget."""
    from te_compile.api.explain import isolated_compile
    calls = []

    def backend(name):
        def be(gm, ex):
            calls.append(name)
            return gm.forward
        return be
    model, x = Model(), torch.randn(1, 2, 8, 16)
    torch._dynamo.reset()
    isolated_compile(model, backend("a"))(x)
    isolated_compile(model, backend("b"))(x)
    torch.compile(model, backend=backend("user"))(x)
    assert calls == ["a", "b", "user"]


@pytest.mark.parametrize("slower", [True, False])
def test_tune_times_the_model_after_a_served_graph_and_reports_the_new_decisions(slower, monkeypatch):
    """te_compile.tune hands the classes its run served (the graph measurements' log) to the model check, and when
    the model is slower served it reports the decisions again (now read from the cache)."""
    import sys

    import te_compile
    from te_compile.report import Report
    explain_mod = sys.modules["te_compile.api.explain"]
    from te_compile.tuning.timing import Measurement
    calls, seen = [], []

    def fake_explain(fn, *args, **kwargs):
        calls.append(kwargs.get("serve"))
        if len(calls) == 1:  # the measuring compile: one class measured and served, one measured and kept
            graph_ab.measured_log.extend([{"key": "a", "served": True}, {"key": "b", "served": False}])
        return Report([])

    def fake_check(fn, args, kwargs, mode, served, echo=None):
        seen.append([g["key"] for g in served])
        return Measurement(1.2, 1.0, 0.0, 7, 0.0, (0.8,) * 7) if slower else Measurement(1.0, 1.1, 0.0, 7, 0.0, (1.1,) * 7)
    monkeypatch.setattr(explain_mod, "explain", fake_explain)
    monkeypatch.setattr(model_check, "check", fake_check)
    lines = []
    te_compile.tune(Model(), torch.randn(1, 2, 8, 16), echo=lines.append)
    assert seen == [["a"]]
    assert len(calls) == (2 if slower else 1)
    assert "the whole model timed" in lines[-1]
