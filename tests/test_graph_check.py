"""The whole-graph check of measured decisions (te_compile.tuning.graph_check): the graph's signature, when it
is skipped, the verdict with a fake compiler and a fake timer, its cache entry, and the random state it leaves."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from te_compile.reasons import SLOWER, category
from te_compile.tuning import cache, graph_check

PLAT = {"gpu": "NVIDIA H100 80GB HBM3", "cudnn": 91900, "torch": "2.11.0"}


@pytest.fixture(autouse=True)
def _cache_dir(tmp_path, monkeypatch):
    monkeypatch.setenv(cache.ENV, str(tmp_path / "cache"))
    graph_check.checked_log.clear()


def _captured(fn, *args, dynamic=False):
    got = []

    def grab(gm, example_inputs):
        got.append((gm, list(example_inputs)))
        return gm.forward
    torch._dynamo.reset()
    torch.compile(fn, backend=grab, fullgraph=True, dynamic=dynamic)(*args)
    return got[0]


class Block(torch.nn.Module):
    def __init__(self, d=64):
        super().__init__()
        self.proj = torch.nn.Linear(d, d)

    def forward(self, x):
        q = self.proj(x)
        return F.scaled_dot_product_attention(q, q, q, is_causal=True)


class Renamed(torch.nn.Module):
    def __init__(self, d=64):
        super().__init__()
        self.other_name = torch.nn.Linear(d, d)

    def forward(self, x):
        q = self.other_name(x)
        return F.scaled_dot_product_attention(q, q, q, is_causal=True)


def test_signature_follows_structure_and_shapes_not_names():
    x = torch.randn(1, 2, 8, 64)
    a = graph_check.signature(*_captured(Block(), x))
    b = graph_check.signature(*_captured(Renamed(), x))
    assert a is not None and a == b
    assert graph_check.signature(*_captured(Block(), torch.randn(1, 2, 16, 64))) != a  # another shape
    other = graph_check.signature(*_captured(lambda x, w: F.scaled_dot_product_attention(x @ w, x, x), x,
                                             torch.randn(64, 64)))
    assert other != a


def test_signature_is_none_with_symbolic_shapes():
    gm, inputs = _captured(Block(), torch.randn(1, 2, 8, 64), dynamic=True)
    assert graph_check.signature(gm, inputs) is None


def test_a_write_into_an_input_or_a_view_of_one_is_found():
    def writes(x):
        x[0].mul_(2)
        return x @ x
    def intermediate(x):
        y = x @ x
        y.add_(1)
        return y
    assert graph_check.writes_an_input(_captured(writes, torch.randn(4, 4))[0].graph)
    assert not graph_check.writes_an_input(_captured(intermediate, torch.randn(4, 4))[0].graph)


def test_graphs_without_other_work_or_under_cuda_graphs_are_skipped():
    gm, inputs = _captured(lambda q: F.scaled_dot_product_attention(q, q, q), torch.randn(1, 2, 8, 64))
    assert "no other work" in graph_check.skip_reason(gm.graph, inputs, False)
    gm, inputs = _captured(Block(), torch.randn(1, 2, 8, 64))
    assert graph_check.skip_reason(gm.graph, inputs, False) is None
    assert "CUDA graphs" in graph_check.skip_reason(gm.graph, inputs, True)


def _fake(served_ms, kept_ms, compiled):
    """A compile stand-in that records what it compiled, and a timer that reads which variant ran."""
    last = {}

    def compile_fn(gm, inputs, needs_grad):
        side = "served" if any(n.name == "served_marker" for n in gm.graph.nodes) else "kept"
        compiled.append(side)

        def run(*args):
            last["side"] = side
            torch.rand(3)  # consumes the random state, as dropout would
            return gm(*args)
        return run

    def timer(fn, iters):
        fn()
        return served_ms if last["side"] == "served" else kept_ms
    return compile_fn, timer


def _with_marker(gm):
    """(the rewritten graph: a marker node added, the original graph)."""
    from te_compile.fxcopy import copy_graph
    original = copy_graph(gm.graph)
    out = next(n for n in gm.graph.nodes if n.op == "output")
    with gm.graph.inserting_before(out):
        gm.graph.create_node("call_function", torch.add, (1, 1), name="served_marker")
    gm.recompile()
    return original


@pytest.mark.parametrize("served_ms, kept_ms, keep", [(2.0, 1.0, True), (1.0, 1.5, False)])
def test_the_verdict_keeps_every_site_when_the_whole_graph_measured_slower(served_ms, kept_ms, keep):
    gm, inputs = _captured(Block(), torch.randn(1, 2, 8, 64))
    original = _with_marker(gm)
    compiled = []
    compile_fn, timer = _fake(served_ms, kept_ms, compiled)
    before = torch.get_rng_state()
    why = graph_check.verdict(gm, original, inputs, 1, 1, False, True, PLAT, timer=timer, compile_fn=compile_fn)
    assert sorted(compiled) == ["kept", "served"]  # each variant compiled once
    assert torch.equal(torch.get_rng_state(), before)  # timing left the random state as it was
    assert len(cache.entries()) == 1 and len(graph_check.checked_log) == 1
    assert graph_check.checked_log[0]["served"] is (not keep)  # what bench/hf_models.py records per tune
    if keep:
        assert category(why) == SLOWER and "whole graph" in why and f"{served_ms:.3f} ms" in why
    else:
        assert why is None
    # a second compile of the same graph reads the verdict and compiles nothing, measuring or not
    again = []
    compile_fn2, _ = _fake(served_ms, kept_ms, again)
    for measuring in (False, True):
        why2 = graph_check.verdict(gm, original, inputs, 1, 1, False, measuring, PLAT, timer=timer,
                                   compile_fn=compile_fn2)
        assert again == [] and (why2 is None) == (why is None)


def test_nothing_is_measured_without_a_measured_site_or_outside_measuring():
    gm, inputs = _captured(Block(), torch.randn(1, 2, 8, 64))
    original = _with_marker(gm)
    compiled = []
    compile_fn, timer = _fake(2.0, 1.0, compiled)
    assert graph_check.verdict(gm, original, inputs, 0, 1, False, True, PLAT, timer=timer,
                               compile_fn=compile_fn) is None
    assert graph_check.verdict(gm, original, inputs, 1, 1, False, False, PLAT, timer=timer,
                               compile_fn=compile_fn) is None
    assert compiled == [] and cache.entries() == {}


def test_the_verdict_is_keyed_by_platform_and_grad_mode():
    gm, inputs = _captured(Block(), torch.randn(1, 2, 8, 64))
    sig = graph_check.signature(gm, inputs)
    k = graph_check.key(sig, True, PLAT)
    assert k != graph_check.key(sig, False, PLAT)
    assert k != graph_check.key(sig, True, {**PLAT, "cudnn": 92801})
    assert k != graph_check.key(sig, True, {**PLAT, "gpu": "NVIDIA H200"})


def test_a_failed_graph_measurement_leaves_the_site_decisions(monkeypatch):
    warned = []
    monkeypatch.setattr(graph_check.log, "warning", lambda msg, *a: warned.append(msg % a))
    gm, inputs = _captured(Block(), torch.randn(1, 2, 8, 64))
    original = _with_marker(gm)

    def broken(gm, inputs, needs_grad):
        raise RuntimeError("no compiler here")
    assert graph_check.verdict(gm, original, inputs, 1, 1, False, True, PLAT, compile_fn=broken) is None
    assert "measuring the whole graph failed" in warned[0] and "no compiler here" in warned[0]
    assert cache.entries() == {}


def test_measure_graph_times_both_variants_forward_and_backward_on_the_cpu():
    """The real step functions (no fake compiler): the training step runs a backward without touching .grad."""
    model = Block(16)
    x = torch.randn(1, 2, 8, 16)
    gm, inputs = _captured(model, x)
    inputs = [t.requires_grad_() if t.is_floating_point() else t for t in inputs]

    def eager(gm, inputs, needs_grad):
        return gm.forward
    m = graph_check.measure_graph(gm, gm.graph, gm.graph, inputs, True, compile_fn=eager)
    assert m.te_ms > 0 and m.tc_ms > 0 and m.rounds >= 7
    assert all(p.grad is None for p in model.parameters())


def test_tune_and_the_users_compile_see_the_same_graph_signature(monkeypatch):
    """The verdict te_compile.tune stores must be found by the user's torch.compile of the same model: both
    compile paths (explain's and the backend's) give the graph the same signature."""
    import te_compile
    from te_compile.fxcopy import copy_module
    seen = []
    real = graph_check.verdict

    def spy(gm, original, example_inputs, *a, **k):
        seen.append(graph_check.signature(copy_module(gm, original), example_inputs))
        return real(gm, original, example_inputs, *a, **k)
    monkeypatch.setattr(graph_check, "verdict", spy)
    monkeypatch.delenv("TE_COMPILE_SERVE", raising=False)  # the suite serves always; the check is for "fastest"

    class M(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b = torch.nn.Linear(64, 64), torch.nn.Linear(64, 64)

        def forward(self, x):
            q = self.a(x).view(2, 8, 4, 16).transpose(1, 2)
            o = F.scaled_dot_product_attention(q, q, q, is_causal=True)
            return self.b(o.transpose(1, 2).reshape(2, 8, 64)).sum()
    m, x = M(), torch.randn(2, 8, 64)
    torch._dynamo.reset()
    te_compile.tune(m, x, echo=None)
    torch._dynamo.reset()
    torch.compile(m, backend=te_compile.backend())(x)
    assert len(seen) == 2 and seen[0] is not None and seen[0] == seen[1]
