"""Measurement on request (te_compile.tuning.graph_ab): the graph's signature, when a graph is not measured, one
A/B per class with a fake compiler and a fake timer, its cache entry and the random state it leaves, and the
decisions the backend takes from it."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from te_compile import tuning
from te_compile.reasons import SLOWER, category
from te_compile.spec import AttentionSpec
from te_compile.tuning import cache, graph_ab
from te_compile.tuning.timing import Measurement

PLAT = {"gpu": "NVIDIA H100 80GB HBM3", "cudnn": 91900, "torch": "2.11.0"}


@pytest.fixture(autouse=True)
def _cache_dir(tmp_path, monkeypatch):
    monkeypatch.setenv(cache.ENV, str(tmp_path / "cache"))
    graph_ab.measured_log.clear()


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
    a = graph_ab.signature(*_captured(Block(), x))
    b = graph_ab.signature(*_captured(Renamed(), x))
    assert a is not None and a == b
    assert graph_ab.signature(*_captured(Block(), torch.randn(1, 2, 16, 64))) != a  # another shape
    other = graph_ab.signature(*_captured(lambda x, w: F.scaled_dot_product_attention(x @ w, x, x), x,
                                          torch.randn(64, 64)))
    assert other != a


def test_signature_is_none_with_symbolic_shapes():
    gm, inputs = _captured(Block(), torch.randn(1, 2, 8, 64), dynamic=True)
    assert graph_ab.signature(gm, inputs) is None


def test_a_write_into_an_input_or_a_view_of_one_is_found():
    def writes(x):
        x[0].mul_(2)
        return x @ x

    def intermediate(x):
        y = x @ x
        y.add_(1)
        return y
    assert graph_ab.writes_an_input(_captured(writes, torch.randn(4, 4))[0].graph)
    assert not graph_ab.writes_an_input(_captured(intermediate, torch.randn(4, 4))[0].graph)


def test_graphs_under_cuda_graphs_or_writing_an_input_are_not_measured():
    gm, inputs = _captured(lambda q: F.scaled_dot_product_attention(q, q, q), torch.randn(1, 2, 8, 64))
    assert graph_ab.skip_reason(gm.graph, inputs, False) is None  # one site and nothing else: measured too
    assert "CUDA graphs" in graph_ab.skip_reason(gm.graph, inputs, True)
    assert graph_ab.keyer(gm, gm.graph, inputs, True, PLAT) is None

    def writes(x):
        x[0].mul_(2)
        return F.scaled_dot_product_attention(x, x, x)
    gm, inputs = _captured(writes, torch.randn(1, 2, 8, 64))
    assert "writes into one of its inputs" in graph_ab.skip_reason(gm.graph, inputs, False)


def test_the_key_is_per_class_platform_and_grad_mode():
    gm, inputs = _captured(Block(), torch.randn(1, 2, 8, 64))
    sig = graph_ab.signature(gm, inputs)
    k = graph_ab.key(sig, "sdpa", True, PLAT)
    assert k != graph_ab.key(sig, "flex plain", True, PLAT)
    assert k != graph_ab.key(sig, "sdpa", False, PLAT)
    assert k != graph_ab.key(sig, "sdpa", True, {**PLAT, "cudnn": 92801})
    assert k != graph_ab.key(sig, "sdpa", True, {**PLAT, "gpu": "NVIDIA H200"})
    grad = graph_ab.needs_grad_of(inputs)
    assert graph_ab.keyer(gm, gm.graph, inputs, False, PLAT)("sdpa") == graph_ab.key(sig, "sdpa", grad, PLAT)


def _variants(gm):
    """variant(force) -> the graph with a marker node where the forced class is served."""
    from te_compile.fxcopy import copy_module

    def variant(force):
        g = copy_module(gm, gm.graph)
        if any(force.values()):
            out = next(n for n in g.graph.nodes if n.op == "output")
            with g.graph.inserting_before(out):
                g.graph.create_node("call_function", torch.add, (1, 1), name="served_marker")
            g.recompile()
        return g
    return variant


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


@pytest.mark.parametrize("served_ms, kept_ms, served", [(2.0, 1.0, False), (1.0, 1.5, True)])
def test_one_measurement_per_class_stored_once(served_ms, kept_ms, served):
    gm, inputs = _captured(Block(), torch.randn(1, 2, 8, 64))
    key_of = graph_ab.keyer(gm, gm.graph, inputs, False, PLAT)
    compiled = []
    compile_fn, timer = _fake(served_ms, kept_ms, compiled)
    before = torch.get_rng_state()
    made = graph_ab.measure_classes(_variants(gm), inputs, ["flex plain", "sdpa"], key_of, timer=timer,
                                    compile_fn=compile_fn)
    assert made == 2 and sorted(compiled) == ["kept", "kept", "served", "served"]  # two variants per class
    assert torch.equal(torch.get_rng_state(), before)  # timing left the random state as it was
    assert len(cache.entries()) == 2 and [c["served"] for c in graph_ab.measured_log] == [served, served]
    m = Measurement.from_entry(cache.get(key_of("sdpa")))
    assert (m.te_ms, m.tc_ms) == (served_ms, kept_ms) and cache.get(key_of("sdpa"))["site"] == "sdpa"
    again = []
    compile_fn2, _ = _fake(served_ms, kept_ms, again)
    assert graph_ab.measure_classes(_variants(gm), inputs, ["flex plain", "sdpa"], key_of, timer=timer,
                                    compile_fn=compile_fn2) == 0 and again == []


def test_a_failed_measurement_leaves_the_class_to_the_rules(monkeypatch):
    warned = []
    monkeypatch.setattr(graph_ab.log, "warning", lambda msg, *a: warned.append(msg % a))
    gm, inputs = _captured(Block(), torch.randn(1, 2, 8, 64))

    def broken(gm, inputs, needs_grad):
        raise RuntimeError("no compiler here")
    key_of = graph_ab.keyer(gm, gm.graph, inputs, False, PLAT)
    assert graph_ab.measure_classes(_variants(gm), inputs, ["sdpa"], key_of, compile_fn=broken) == 0
    assert "for its sdpa sites failed" in warned[0] and "no compiler here" in warned[0]
    assert cache.entries() == {}


def test_measure_graph_times_both_variants_forward_and_backward_on_the_cpu():
    """The real step functions (no fake compiler): the training step runs a backward without touching .grad."""
    model = Block(16)
    gm, inputs = _captured(model, torch.randn(1, 2, 8, 16))
    inputs = [t.requires_grad_() if t.is_floating_point() else t for t in inputs]

    def eager(gm, inputs, needs_grad):
        return gm.forward
    m = graph_ab.measure_graph(gm, gm, inputs, True, compile_fn=eager)
    assert m.te_ms > 0 and m.tc_ms > 0 and m.rounds >= 7
    assert all(p.grad is None for p in model.parameters())


# --------------------------------------------------------------------------- the decision from a measurement

def _meta(*shape):
    return torch.empty(*shape, dtype=torch.bfloat16, device="meta")


SDPA = AttentionSpec(mask="causal")


def test_speed_reason_reads_its_graphs_measurement(monkeypatch):
    monkeypatch.setattr(tuning, "platform", lambda *a: PLAT)
    q = _meta(2, 8, 4096, 128)
    scope = tuning.GraphScope(lambda cls: f"graph-1|{cls}")
    cache.put("graph-1|sdpa", Measurement(0.61, 1.01, 0.02, 7, ratios=(1.6,) * 7).as_entry())
    with tuning.graph(scope):
        assert tuning.speed_reason(q, q, q, None, SDPA, True, False) is None
    assert scope.classes == {"sdpa": True}
    assert tuning.served_note(SDPA, q).startswith(
        "served: measured: the graph ran 0.610 ms with its sdpa sites on cuDNN vs 1.010 ms on torch.compile")
    cache.put("graph-1|sdpa", Measurement(1.01, 0.61, 0.02, 7, seconds=3.25, ratios=(0.6,) * 7).as_entry())
    with tuning.graph(scope):
        why = tuning.speed_reason(q, q, q, None, SDPA, True, False)
    assert category(why) == SLOWER and why.startswith("kept for speed (training step): measured: the graph ran 1.010")
    assert "cuDNN faster in 0 of 7 rounds (NVIDIA H100 80GB HBM3, cuDNN 9.19, measuring took 3.2 s)" in why
    cache.put("graph-1|sdpa", Measurement(1.2, 1.0, 0.02, 7, ratios=(0.8,) * 7).as_entry(scope="model"))
    with tuning.graph(scope):
        why = tuning.speed_reason(q, q, q, None, SDPA, True, False)
    assert "of the whole model" in why and "te_compile.api.model_check" in why


def test_without_a_measurement_the_rule_decides_and_says_so(monkeypatch):
    monkeypatch.setattr(tuning, "platform", lambda *a: PLAT)
    q = _meta(4, 8, 1024, 64)
    with tuning.graph(tuning.GraphScope(lambda cls: f"graph-2|{cls}")):
        why = tuning.speed_reason(q, q, q, None, SDPA, True, False)
    assert why is not None and "kept for speed by the rule for sdpa:" in why and "te-compile tune" in why
    softcap = AttentionSpec(scale=0.1, source="flex", score="(mul (tanh (div score 30.0)) 30.0)")
    big = _meta(2, 16, 4096, 128)
    assert tuning.speed_reason(big, big, big, None, softcap, True, False) is None  # the rule serves it
    note = tuning.served_note(softcap, big)
    assert note.startswith("served by the rule for flex score_mod (from 128 tokens)") and "not measured here" in note


def test_a_forced_class_is_served_or_kept_whatever_its_rule(monkeypatch):
    q = _meta(4, 8, 1024, 64)
    with tuning.forcing({"sdpa": True}):
        assert tuning.speed_reason(q, q, q, None, SDPA, True, False) is None
    with tuning.forcing({"sdpa": False}):
        assert "while its graph is measured" in tuning.speed_reason(q, q, q, None, SDPA, True, False)


def _cuda_like(monkeypatch):
    """Decide CPU graphs as CUDA ones (explain's for_device="cuda"), with measuring's A/B faked."""
    import importlib
    backend = importlib.import_module("te_compile.backend")
    monkeypatch.setattr(backend, "_is_cuda_graph", lambda inputs: True)
    monkeypatch.setattr(tuning, "platform", lambda *a: PLAT)
    monkeypatch.delenv("TE_COMPILE_SERVE", raising=False)  # the suite serves always; this is "fastest"


class M(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = torch.nn.Linear(64, 64), torch.nn.Linear(64, 64)

    def forward(self, x):
        q = self.a(x).view(2, 8, 4, 16).transpose(1, 2)
        o = F.scaled_dot_product_attention(q, q, q, is_causal=True)
        return self.b(o.transpose(1, 2).reshape(2, 8, 64)).sum()


@pytest.mark.parametrize("te_ms, tc_ms, served", [(1.0, 2.0, True), (2.0, 1.0, False)])
def test_tune_decides_a_class_by_its_graph_and_later_compiles_follow_the_cache(monkeypatch, te_ms, tc_ms, served):
    """te_compile.tune measures the graph once per class (the rule alone keeps plain SDPA); the verdict decides
    the site, in tune's report and in a later compile of the same model that measures nothing."""
    import te_compile
    _cuda_like(monkeypatch)
    calls = []

    def fake(served_gm, kept_gm, inputs, needs_grad, timer=None, compile_fn=None, fresh=()):
        calls.append((served_gm, kept_gm))
        ratio = tc_ms / te_ms
        return Measurement(te_ms, tc_ms, 0.01, 7, 0.5, (ratio,) * 7)
    monkeypatch.setattr(graph_ab, "measure_graph", fake)
    monkeypatch.setattr("te_compile.api.model_check.check", lambda *a, **k: None)
    m, x = M().to(torch.bfloat16), torch.randn(2, 8, 64, dtype=torch.bfloat16)
    torch._dynamo.reset()
    report, made = te_compile.tune(m, x, echo=None, for_device="cuda")
    assert len(calls) == 1 and [c["class"] for c in made] == ["sdpa"]
    want = "cudnn" if served else "kept"
    assert [d.runs_on for d in report.decisions] == [want]
    if not served:
        assert report.decisions[0].reason.startswith("kept for speed (training step): measured: the graph ran 2.000")
    torch._dynamo.reset()
    again = te_compile.explain(m, x, for_device="cuda")
    assert len(calls) == 1 and [d.runs_on for d in again.decisions] == [want]


def test_tune_and_the_users_compile_see_the_same_graph_key(monkeypatch):
    """The verdict te_compile.tune stores must be found by the user's torch.compile of the same model: both
    compile paths (explain's and the backend's) give the graph the same key."""
    import te_compile
    _cuda_like(monkeypatch)
    seen = []
    real = graph_ab.keyer

    def spy(*a, **k):
        key_of = real(*a, **k)
        seen.append(key_of("sdpa") if key_of else None)
        return key_of
    monkeypatch.setattr(graph_ab, "keyer", spy)
    monkeypatch.setattr(graph_ab, "measure_classes", lambda *a, **k: 0)
    m, x = M().to(torch.bfloat16), torch.randn(2, 8, 64, dtype=torch.bfloat16)
    torch._dynamo.reset()
    te_compile.tune(m, x, echo=None, for_device="cuda")
    torch._dynamo.reset()
    torch.compile(m, backend=te_compile.backend())(x)
    assert len(seen) == 2 and seen[0] is not None and seen[0] == seen[1]


def test_document_ids_are_measured_as_a_loader_gives_them():
    """A graph measured for its document-id sites sees every integer input with a new version before each call of
    either variant (the same values): what te_compile keeps per ids is built again per call, as with a loader's new
    packing every step. Other classes are timed on their inputs as they are."""
    x = torch.randn(1, 2, 8, 16)
    ids = torch.arange(8) // 4
    versions = {"served": [], "kept": []}

    def compile_fn(gm, inputs, needs_grad):
        side = "served" if gm.meta.get("side") == "served" else "kept"

        def run(*args):
            versions[side].append(ids._version)
            assert torch.equal(ids, torch.arange(8) // 4)  # the values are the loader's, unchanged
            return args[0] * 2
        return run

    def variant(force):
        g = torch.fx.symbolic_trace(lambda a, b: a * 2)
        g.meta["side"] = "served" if all(force.values()) else "kept"
        return g
    keys = {"flex intervals, document ids": "k-docs", "flex intervals": "k-static"}
    timer = lambda fn, iters: [fn() for _ in range(iters)] and 1.0  # noqa: E731
    made = graph_ab.measure_classes(variant, [x, ids], ["flex intervals, document ids"], keys.get, timer=timer,
                                    compile_fn=compile_fn)
    assert made == 1
    for side in ("served", "kept"):
        vs = versions[side]
        assert len(vs) > 3 and all(b > a for a, b in zip(vs, vs[1:])), (side, vs[:8])
    before = ids._version
    assert graph_ab.measure_classes(variant, [x, ids], ["flex intervals"], keys.get, timer=timer,
                                    compile_fn=compile_fn) == 1
    assert ids._version == before  # a static mask's class: the inputs as they are
