"""Serve only where faster (te_compile.cudnn.cost): which sites the cost model keeps for torch.compile.

The expected decisions are the measured H200 outcomes the model was calibrated on (bench/sweep.py,
training steps, docs/benchmarks.md): plain SDPA and short sequences measured slower on te_compile
(0.58-1.0x) and must be kept; score_mods and long full / causal flex measured faster (1.24-2.37x)
and must be served; sliding windows (0.65x), ALiBi + causal (0.80x) and prefix-LM masks (0.27x)
measured slower at 2x16x4096x128 and must be kept."""


import pytest
import torch
import torch.nn.functional as F

import te_compile
from te_compile.backend import Options, _checker
from te_compile.cudnn.cost import estimate, slower_reason
from te_compile.reasons import SLOWER, category
from te_compile.spec import AttentionSpec



def _t(*shape):
    return torch.empty(*shape, dtype=torch.bfloat16, device="meta")


def _qkv(B, H, L, D, Hkv=None):
    return _t(B, H, L, D), _t(B, Hkv or H, L, D), _t(B, Hkv or H, L, D)


SOFTCAP = "(mul (tanh (div score 30.0)) 30.0)"
ALIBI = "(add score (mul (in 0) (sub kv_idx q_idx)))"
CAUSAL = "(ge q_idx kv_idx)"
SLIDING = "(and (ge q_idx kv_idx) (le (sub q_idx kv_idx) 1024))"
PREFIX = "(or (lt kv_idx 512) (ge q_idx kv_idx))"


@pytest.mark.parametrize("shape,spec,served", [
    # measured slower: plain SDPA at every shape of the sweep, HF-like shapes
    ((4, 16, 1024, 64), AttentionSpec(mask="causal"), False),
    ((2, 16, 4096, 128), AttentionSpec(mask="none"), False),
    ((1, 16, 16384, 128), AttentionSpec(mask="causal"), False),
    # flex at 2x16x4096x128: faster -> served
    ((2, 16, 4096, 128), AttentionSpec(source="flex"), True),
    ((2, 16, 4096, 128), AttentionSpec(source="flex", mask_mod=CAUSAL), True),
    ((2, 16, 4096, 128), AttentionSpec(source="flex", score=SOFTCAP), True),
    ((2, 16, 4096, 128), AttentionSpec(source="flex", score=SOFTCAP, mask_mod=CAUSAL), True),
    ((2, 16, 4096, 128), AttentionSpec(source="flex", score=ALIBI, n_inputs=1), True),
    # flex at 2x16x4096x128: slower -> kept
    ((2, 16, 4096, 128), AttentionSpec(source="flex", mask_mod=SLIDING), False),
    ((2, 16, 4096, 128), AttentionSpec(source="flex", score=ALIBI, n_inputs=1, mask_mod=CAUSAL), False),
    ((2, 16, 4096, 128), AttentionSpec(source="flex", mask_mod=PREFIX), False),
    # short sequences: host time dominates -> kept (measured 0.43-0.76x)
    ((1, 8, 512, 64), AttentionSpec(source="flex", score=SOFTCAP), False),
    ((8, 16, 1024, 64), AttentionSpec(source="flex", mask_mod=CAUSAL), False),
])
def test_decisions_match_the_measurements(shape, spec, served):
    q, k, v = _qkv(*shape)
    why = slower_reason(q, k, v, None, spec, True, False)
    assert (why is None) == served, (shape, spec.describe(), why, estimate(q, k, v, None, spec, True, False))
    if why:
        assert category(why) == SLOWER and "serve='always'" in why


def test_learned_bias_is_served_when_long_and_kept_when_short():
    spec = AttentionSpec(mask="none")
    for L, served in ((4096, True), (512, False)):
        q, k, v = _qkv(2, 16, L, 128)
        why = slower_reason(q, k, v, _t(1, 16, L, L), spec, True, True)
        assert (why is None) == served, (L, why)
    # the same bias frozen (no dBias): torch runs its own kernel with it -> kept
    q, k, v = _qkv(2, 16, 4096, 128)
    assert slower_reason(q, k, v, _t(1, 16, 4096, 4096), spec, True, False) is not None


def test_symbolic_or_reference_sites_are_not_judged():
    q, k, v = _qkv(1, 8, 512, 64)
    assert slower_reason(q, k, v, None, AttentionSpec(mask="causal", impl="reference"), True, False) is None


def test_backend_composes_the_cost_model_only_for_fastest():
    import dataclasses
    from torch._subclasses.fake_tensor import FakeTensorMode

    from te_compile.passes.rewrite import rewrite_graph

    def fn(q, k, v):
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)

    def decide(serve):
        gm = torch.fx.symbolic_trace(fn)
        with FakeTensorMode():
            vals = [torch.empty(4, 16, 1024, 64, device="cuda", dtype=torch.bfloat16, requires_grad=True)
                    for _ in range(3)]
            out = torch.empty(4, 16, 1024, 64, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        it = iter(vals)
        for n in gm.graph.nodes:
            n.meta["example_value"] = next(it) if n.op == "placeholder" else out
        (d,) = rewrite_graph(gm, "auto", _checker("auto", serve))
        return d

    kept, served = decide("fastest"), decide("always")
    assert not kept.rewrite and category(kept.reason) == SLOWER, kept.reason
    assert served.rewrite and served.runs_on == "cudnn", served.reason
    assert dataclasses.fields(Options)  # the option exists and validates
    with pytest.raises(ValueError, match="serve policy"):
        Options(serve="sometimes")


def test_default_policy_comes_from_the_environment(monkeypatch):
    monkeypatch.setenv("TE_COMPILE_SERVE", "fastest")
    assert Options().serve == "fastest"
    monkeypatch.setenv("TE_COMPILE_SERVE", "always")
    assert Options().serve == "always"
    assert te_compile.backend(serve="fastest").options.serve == "fastest"


def test_prefix_lm_split_is_checked_and_kept_for_speed():
    """A prefix-LM mask is a two-call split on cuDNN (te_compile.cudnn.prefix): the support check validates
    those two graphs, and the cost model keeps the site, with or without CUDA graphs (1.63 vs 1.49 ms per
    step at 2x16x4096x128 on the H200)."""
    from te_compile.cudnn.check import check

    q, k, v = _qkv(2, 16, 4096, 128)
    spec = AttentionSpec(source="flex", mask_mod=PREFIX)
    assert check(q, k, v, None, spec, True, False) is None
    for graphs in (False, True):
        assert estimate(q, k, v, None, spec, True, False, graphs)["class"] == "flex prefix split"
        assert slower_reason(q, k, v, None, spec, True, False, graphs) is not None


def test_bottom_right_band_with_fewer_queries_is_kept():
    """kv <= q + (S - L) with L < S (flex's bottom-right causal) is a native band cuDNN 9.19 barely skips
    tiles in: kept, with or without CUDA graphs; the same band with L == S (top-left causal) is served."""
    q, k, v = _t(2, 16, 3584, 128), _t(2, 16, 4096, 128), _t(2, 16, 4096, 128)
    spec = AttentionSpec(source="flex", mask_mod="(ge (add q_idx 512) kv_idx)")
    for graphs in (False, True):
        assert estimate(q, k, v, None, spec, True, False, graphs)["class"] == "flex band without tile skipping"
        assert slower_reason(q, k, v, None, spec, True, False, graphs) is not None
    q, k, v = _qkv(2, 16, 4096, 128)
    assert slower_reason(q, k, v, None, AttentionSpec(source="flex", mask_mod=CAUSAL), True, False, True) is None


def test_under_cuda_graphs_only_the_kernels_count():
    """mode="reduce-overhead" replays CUDA graphs: no host time per call on either side, so a short
    softcap site (kept for its host time otherwise) is served, and plain SDPA (the same class of kernel
    on both sides) is still kept."""
    from te_compile.backend import _uses_cuda_graphs

    q, k, v = _qkv(1, 8, 512, 64)
    softcap = AttentionSpec(source="flex", score=SOFTCAP)
    assert slower_reason(q, k, v, None, softcap, True, False) is not None
    assert slower_reason(q, k, v, None, softcap, True, False, cuda_graphs=True) is None
    why = slower_reason(q, k, v, None, AttentionSpec(mask="causal"), True, False, cuda_graphs=True)
    assert why is not None and "under CUDA graphs" in why
    assert _uses_cuda_graphs("inductor", {"triton.cudagraphs": True})
    assert not _uses_cuda_graphs("inductor", {"max_autotune": True, "triton.cudagraphs": False})
    assert not _uses_cuda_graphs("aot_eager", {"triton.cudagraphs": True})
    assert _checker("auto", "fastest", cuda_graphs=True)(q, k, v, None, softcap, True, False) is None


def test_backend_and_explain_follow_cuda_graphs(monkeypatch):
    """The decision under CUDA graphs follows the backend's options: a short softcap flex site is kept for
    host time by default and served when the graph runs under CUDA graphs; explain(mode=...) asks the
    backend for the same (Options.cuda_graphs), so its report matches the compiled model's."""
    import sys

    from te_compile.backend import Options, backend

    q = _t(1, 8, 512, 64)
    softcap = AttentionSpec(source="flex", score=SOFTCAP)
    for graphs_on, served in ((False, False), (True, True)):
        why = _checker("auto", "fastest", graphs_on)(q, q, q, None, softcap, True, False)
        assert (why is None) == served, why
    assert backend(cuda_graphs=True).options == Options(cuda_graphs=True)
    assert backend(cuda_graphs=True) is backend(cuda_graphs=True) is not backend()

    explain_mod = sys.modules["te_compile.explain"]
    seen = []
    real = explain_mod.explain_backend

    def spy(measuring, **kw):
        seen.append(kw.get("cuda_graphs"))
        return real(measuring, **kw)
    monkeypatch.setattr(explain_mod, "explain_backend", spy)
    fn = lambda x: x * 2  # noqa: E731 - no attention needed: the options are what is checked
    for mode in (None, "reduce-overhead", "max-autotune-no-cudagraphs"):
        torch._dynamo.reset()
        explain_mod.explain(fn, torch.randn(2), mode=mode)
    assert seen == [None, True, False]


def test_dynamic_sizes_are_judged_at_their_hint_without_a_guard():
    """Under dynamic shapes the cost model reads a symbolic length as the size this compile saw; it must not
    install a guard (an int() on the SymInt would specialize the graph and recompile per length)."""
    from torch._dynamo.source import ConstantSource
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.symbolic_shapes import ShapeEnv

    env = ShapeEnv()
    q = FakeTensorMode(shape_env=env).from_tensor(torch.empty(1, 8, 512, 64, dtype=torch.bfloat16),
                                                  source=ConstantSource("q"), static_shapes=False)
    assert not isinstance(q.shape[2], int)
    est = estimate(q, q, q, None, AttentionSpec(mask="causal"), True, False)
    static = estimate(*_qkv(1, 8, 512, 64), None, AttentionSpec(mask="causal"), True, False)
    assert est == static
    assert not env.guards
