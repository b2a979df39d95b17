"""The default serve decision (te_compile.tuning.rules): each rule against the committed measurements it cites, the site
classes the lowering's decisions map to, and the reasons the report shows."""

from __future__ import annotations

import dataclasses
import inspect
import json
import pathlib
import re

import pytest
import torch
import torch.nn.functional as F

import te_compile
from te_compile.backend import Options, _checker

from te_compile.tuning import rules
from te_compile.reasons import SLOWER, category
from te_compile.spec import AttentionSpec

DATA = pathlib.Path(__file__).resolve().parent.parent / "docs" / "data"


def _best(r, cols, key):
    xs = [r[c][key] for c in cols if r.get(c) and r[c].get(key)]
    return min(xs) if xs else None


def _measured(files, cases, cls=None):
    """(file, case, query tokens, step ratio, kernel ratio or None) of every cited row whose te_compile column
    ran on cuDNN: torch.compile's time over te_compile's (> 1: te_compile faster). The step ratio is the loop
    throughput's (a loop of steps between two events, what a training loop sees; the per-step events leave out a
    host-bound step's host time after its last launch) where the row has it, else the per-step median's. Where a
    row measured both sides twice (serve="always" and a default that served the same sites; torch.compile and its
    A/A control), each side counts its better time; where te_compile's side ran once, torch.compile's first column
    alone counts (the same number of samples each). A Hugging Face model row (case: the model) counts its training and
    its inference step, at the sequence length its file is named for. A row that records the class its site was served
    as counts for that class only (``cls``)."""
    out = []
    for f in ([files] if isinstance(files, str) else files):
        d = json.loads((DATA / f).read_text())
        for r in d["rows"]:
            if "model" in r:
                if r["model"] in cases:
                    L = int(re.search(r"\dx(\d+)", f).group(1))
                    out += [(f, f"{r['model']} {m}", L, min(r[m]["torch.compile"], r[m].get("control", 1e9))
                             / r[m]["always"], None) for m in ("train", "infer")]
                continue
            if r["case"] not in cases:
                continue
            te_cols = [c for c in ("always", "te_compile") if r.get(c) and (c == "always" or r.get("served"))]
            if not te_cols:
                continue
            tc_cols = [c for c in ("torch.compile", "control") if r.get(c)][:len(te_cols)]
            te_cols = te_cols[:len(tc_cols)]
            kernel = None
            if _best(r, te_cols, "kernel_ms") and r["torch.compile"].get("kernel_ms"):
                kernel = r["torch.compile"]["kernel_ms"] / _best(r, te_cols, "kernel_ms")
            key = "loop_ms" if _best(r, te_cols, "loop_ms") and _best(r, tc_cols, "loop_ms") else "ms"
            if cls and r.get("class") and r["class"] != cls:
                continue  # its site was served as another class (a sweep's window of 1024 keys is causal up to 2048)
            out.append((f, r["case"], r["shape"][2], _best(r, tc_cols, key) / _best(r, te_cols, key), kernel))
    return out


CITED = [(cls, r) for cls, r in rules.RULES.items() if r.cites]


def test_a_forward_without_gradients_follows_the_training_threshold():
    """A sliding window of 1024 keys: kept at 3072 tokens, served from 4096, with or without gradients; at 1024
    tokens it covers every key (a causal band, served from 128); the reason names the rule and its threshold."""
    spec = AttentionSpec(source="flex", scale=0.1, mask_mod="(and (ge q_idx kv_idx) (le (sub q_idx kv_idx) 1024))")
    big, mid, small = _t(2, 16, 4096, 128), _t(2, 16, 3072, 128), _t(2, 16, 1024, 128)
    for needs_grad in (True, False):
        assert rules.slower_reason(big, big, big, None, spec, needs_grad, False) is None
        assert rules.decide(big, big, big, None, spec, needs_grad, False)[1].startswith(
            "served by the rule for flex narrow band (from 4096 tokens)")
        assert "3072 tokens, served from 4096" in rules.slower_reason(mid, mid, mid, None, spec, needs_grad, False)
        assert rules.decide(small, small, small, None, spec, needs_grad, False)[1].startswith(
            "served by the rule for flex native band (from 128 tokens)")


def test_a_window_of_fewer_than_1024_keys_is_kept_at_every_length():
    """Models' sliding windows of 512 (Mistral, Gemma-3) are a class of their own: kept at 8192 and 16384 tokens,
    with and without CUDA graphs, where the sweep's windows of 1024 keys are served."""
    for window, cls in ((510, "flex narrow window"), (1022, "flex narrow window"), (1023, "flex narrow band")):
        spec = AttentionSpec(source="flex", scale=0.1, mask_mod=f"(and (ge q_idx kv_idx) (le (sub q_idx kv_idx) {window}))")
        assert rules.site_class(spec, False, False, 8192, 8192, 32) == cls, window
    spec = AttentionSpec(source="flex", scale=0.1, mask_mod="(and (ge q_idx kv_idx) (lt (sub q_idx kv_idx) 512))")
    for L in (8192, 16384):
        t = _t(1, 32, L, 128)
        for graphs in (False, True):
            why = rules.slower_reason(t, t, t, None, spec, True, False, cuda_graphs=graphs)
            assert why and "rule for flex narrow window" in why and "fewer than 1024 keys" in why, why


@pytest.mark.parametrize("cls, rule", CITED, ids=[c for c, _ in CITED])
def test_each_rule_agrees_with_the_rows_it_cites(cls, rule):
    """Where the rule serves, every cited row measured te_compile's training step at least as fast as plain
    torch.compile's, within the sweeps' A/A noise (3%). Where it keeps, every cited row measured it slower or within the sweeps' A/A noise (3%), or
    its kernels no faster (no host time can make cuDNN win then), or another cited row at that length measured it
    slower (the rows disagree: the rule keeps, "never slower" first). Under CUDA graphs (kernels only) likewise
    with the kernel ratio."""
    rows = [m for files, cases in rule.cites for m in _measured(files, cases, cls)]
    assert rows, f"{cls}: the cited rows are not in docs/data"
    slower_at = {L for _, _, L, step, _ in rows if step < 1.0}
    kernels_slower_at = {L for _, _, L, _, kernel in rows if kernel is not None and kernel < 1.0}
    wrong = []
    for f, case, L, step, kernel in rows:
        served = rule.min_tokens is not None and L >= rule.min_tokens
        if served and step < 0.97:
            wrong.append(f"{f} {case} L={L}: step {step:.2f}x, rule serves")
        if not served and step >= 1.03 and not (kernel is not None and kernel < 1.05) and L not in slower_at:
            wrong.append(f"{f} {case} L={L}: step {step:.2f}x, rule keeps")
        if kernel is not None:
            g_served = rule.graphs_min_tokens is not None and L >= rule.graphs_min_tokens
            if g_served and kernel < 1.0:
                wrong.append(f"{f} {case} L={L}: kernels {kernel:.2f}x, rule serves under CUDA graphs")
            if not g_served and kernel > 1.05 and rule.graphs_min_tokens is not None and L not in kernels_slower_at:
                wrong.append(f"{f} {case} L={L}: kernels {kernel:.2f}x, rule keeps under CUDA graphs")
    assert not wrong, "\n".join(wrong)


def test_every_class_the_lowering_can_name_has_a_rule():
    named = set(re.findall(r'"((?:sdpa|flex) [^"]*|sdpa)"', inspect.getsource(rules.site_class)))
    assert named and named <= set(rules.RULES), named - set(rules.RULES)


CAUSAL = "(ge q_idx kv_idx)"
SOFTCAP = "(mul (tanh (div score 30.0)) 30.0)"


@pytest.mark.parametrize("spec, L, want", [
    (AttentionSpec(source="flex", scale=0.1), 4096, "flex plain"),
    (AttentionSpec(source="flex", scale=0.1, mask_mod=CAUSAL), 4096, "flex native band"),
    (AttentionSpec(source="flex", scale=0.1, mask_mod="(and (ge q_idx kv_idx) (le (sub q_idx kv_idx) 1024))"), 4096,
     "flex narrow band"),
    (AttentionSpec(source="flex", scale=0.1, mask_mod="(and (ge q_idx kv_idx) (le (sub q_idx kv_idx) 3000))"), 4096,
     "flex native band"),
    (AttentionSpec(source="flex", scale=0.1, score=SOFTCAP), 4096, "flex score_mod"),
    (AttentionSpec(source="flex", scale=0.1, score=SOFTCAP, mask_mod=CAUSAL), 4096, "flex score_mod"),
    (AttentionSpec(source="flex", scale=0.1, mask_mod="(or (lt kv_idx 1024) (ge q_idx kv_idx))"), 4096,
     "flex prefix split"),
    (AttentionSpec(), 4096, "sdpa"),
])
def test_site_classes(spec, L, want):
    assert rules.site_class(spec, False, False, L, L, 16) == want


@pytest.mark.parametrize("spec, L, want", [
    (AttentionSpec(source="flex", scale=0.1), 1, "flex decoding"),
    (AttentionSpec(source="flex", scale=0.1), 16, "flex decoding"),
    (AttentionSpec(source="flex", scale=0.1), 17, "flex plain"),
    (AttentionSpec(source="flex", scale=0.1, score=SOFTCAP), 1, "flex score_mod"),
    (AttentionSpec(), 1, "sdpa decoding"),
    (AttentionSpec(), 16, "sdpa decoding"),
    (AttentionSpec(), 17, "sdpa"),
    (AttentionSpec(mask="causal"), 1, "sdpa"),
    # a decoding mask (kv_idx <= q_idx + offset) as a BlockMask, or materialized as a bias: not unmasked decoding
    (AttentionSpec(source="flex", scale=0.1, block_q=128, block_kv=128), 1, "flex plain"),
    (AttentionSpec(source="flex", scale=0.1, empty_rows=True), 16, "flex mask as a bias"),
])
def test_a_few_queries_against_a_long_cache_are_decoding(spec, L, want):
    """Decoding (at most 16 query tokens against a KV cache of 32768 keys) is a class of its own: served where flex has
    no mask_mod and SDPA no mask; anything else keeps its class."""
    assert rules.site_class(spec, False, False, L, 32768, 32) == want
    if want.endswith("decoding"):
        served, why = rules.decide(_t(1, 32, L, 128), _t(1, 32, 32768, 128), _t(1, 32, 32768, 128), None, spec,
                                   False, False)
        assert served and want in why, why


def _t(*shape):
    return torch.empty(*shape, dtype=torch.bfloat16, device="meta")


def test_the_reason_names_the_rule_and_its_threshold():
    spec = AttentionSpec(source="flex", scale=0.1, mask_mod=SLIDING)
    small, big = _t(2, 16, 3072, 64), _t(2, 16, 4096, 128)
    why = rules.slower_reason(small, small, small, None, spec, True, False)
    assert category(why) == SLOWER
    assert why.startswith("kept for speed by the rule for flex narrow band: 3072 tokens, served from 4096:")
    assert "te_compile.backend(serve='always') serves it anyway" in why
    assert rules.slower_reason(big, big, big, None, spec, True, False) is None
    assert rules.decide(big, big, big, None, spec, True, False)[1].startswith(
        "served by the rule for flex narrow band (from 4096 tokens)")
    # under CUDA graphs no host time counts: the kernels decide, and they are faster from 1024 tokens
    assert rules.slower_reason(small, small, small, None, spec, True, False, cuda_graphs=True) is None


def test_a_class_that_never_serves_says_so():
    prefix = AttentionSpec(source="flex", scale=0.1, mask_mod="(or (lt kv_idx 1024) (ge q_idx kv_idx))")
    t = _t(2, 16, 4096, 128)
    why = rules.slower_reason(t, t, t, None, prefix, True, False)
    assert "rule for flex prefix split: 4096 tokens, served from 8192" in why
    sdpa = rules.slower_reason(t, t, t, None, AttentionSpec(), True, False)
    assert sdpa.startswith("kept for speed by the rule for sdpa: torch runs")


ALIBI = "(add score (mul (in 0) (sub kv_idx q_idx)))"
SLIDING = "(and (ge q_idx kv_idx) (le (sub q_idx kv_idx) 1024))"
PREFIX = "(or (lt kv_idx 512) (ge q_idx kv_idx))"


def _qkv(B, H, L, D, Hkv=None):
    return _t(B, H, L, D), _t(B, Hkv or H, L, D), _t(B, Hkv or H, L, D)


@pytest.mark.parametrize("shape,spec,served", [
    # plain SDPA: torch runs the same class of kernel -> kept at every length
    ((4, 16, 1024, 64), AttentionSpec(mask="causal"), False),
    ((2, 16, 4096, 128), AttentionSpec(mask="none"), False),
    ((1, 16, 16384, 128), AttentionSpec(mask="causal"), False),
    # flex at 2x16x4096x128: faster -> served
    ((2, 16, 4096, 128), AttentionSpec(source="flex"), True),
    ((2, 16, 4096, 128), AttentionSpec(source="flex", mask_mod=CAUSAL), True),
    ((2, 16, 4096, 128), AttentionSpec(source="flex", score=SOFTCAP), True),
    ((2, 16, 4096, 128), AttentionSpec(source="flex", score=SOFTCAP, mask_mod=CAUSAL), True),
    ((2, 16, 4096, 128), AttentionSpec(source="flex", score=ALIBI, n_inputs=1), True),
    ((2, 16, 4096, 128), AttentionSpec(source="flex", mask_mod=SLIDING), True),
    # flex at 2x16x4096x128: slower -> kept
    ((2, 16, 4096, 128), AttentionSpec(source="flex", score=ALIBI, n_inputs=1, mask_mod=CAUSAL), False),
    ((2, 16, 4096, 128), AttentionSpec(source="flex", mask_mod=PREFIX), False),
    # long sequences: the sliding window and the prefix-LM split serve
    ((1, 16, 16384, 128), AttentionSpec(source="flex", mask_mod=SLIDING), True),
    ((1, 16, 16384, 128), AttentionSpec(source="flex", mask_mod=PREFIX), True),
    # short sequences on the native call path: served (less host time per call than Inductor's)
    ((1, 8, 512, 64), AttentionSpec(source="flex", score=SOFTCAP), True),
    ((8, 16, 1024, 64), AttentionSpec(source="flex", mask_mod=CAUSAL), True),
    ((1, 1, 256, 64), AttentionSpec(source="flex"), True),
    ((1, 8, 128, 64), AttentionSpec(source="flex", score=SOFTCAP), True),
    # below 128 tokens nothing was measured -> kept; ALiBi + causal and the prefix split stay kept at 1024
    ((1, 1, 64, 64), AttentionSpec(source="flex", score=SOFTCAP), False),
    ((8, 16, 1024, 64), AttentionSpec(source="flex", score=ALIBI, n_inputs=1, mask_mod=CAUSAL), False),
    ((8, 16, 1024, 64), AttentionSpec(source="flex", mask_mod=PREFIX), False),
])
def test_decisions_of_the_sweep_shapes(shape, spec, served):
    q, k, v = _qkv(*shape)
    why = rules.slower_reason(q, k, v, None, spec, True, False)
    assert (why is None) == served, (shape, spec.describe(), why)
    if why:
        assert category(why) == SLOWER and "serve='always'" in why


def test_learned_bias_is_served_when_long_and_kept_when_short():
    spec = AttentionSpec(mask="none")
    for L, served in ((4096, True), (512, False)):
        q, k, v = _qkv(2, 16, L, 128)
        why = rules.slower_reason(q, k, v, _t(1, 16, L, L), spec, True, True)
        assert (why is None) == served, (L, why)
    # the same bias frozen (no dBias): torch runs its own kernel with it -> kept
    q, k, v = _qkv(2, 16, 4096, 128)
    assert rules.slower_reason(q, k, v, _t(1, 16, 4096, 4096), spec, True, False) is not None


def test_symbolic_or_reference_sites_are_not_judged():
    q, k, v = _qkv(1, 8, 512, 64)
    assert rules.slower_reason(q, k, v, None, AttentionSpec(mask="causal", impl="reference"), True, False) is None


def test_backend_composes_the_rules_only_for_fastest():
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
    """A prefix-LM mask is a two-call split on cuDNN (te_compile.lowering.prefix): the support check validates
    those two graphs, and its rule keeps the site below 8192 tokens, with or without CUDA graphs."""
    from te_compile.cudnn.check import check

    q, k, v = _qkv(2, 16, 4096, 128)
    spec = AttentionSpec(source="flex", mask_mod=PREFIX)
    assert check(q, k, v, None, spec, True, False) is None
    for graphs in (False, True):
        assert rules.site_class(spec, False, False, 4096, 4096, 16) == "flex prefix split"
        assert rules.slower_reason(q, k, v, None, spec, True, False, graphs) is not None


def test_bottom_right_band_with_fewer_queries_is_kept():
    """kv <= q + (S - L) with L < S (flex's bottom-right causal) is a built-in band cuDNN 9.19 barely skips
    tiles in: kept, with or without CUDA graphs; the same band with L == S (top-left causal) is served."""
    q, k, v = _t(2, 16, 3584, 128), _t(2, 16, 4096, 128), _t(2, 16, 4096, 128)
    spec = AttentionSpec(source="flex", mask_mod="(ge (add q_idx 512) kv_idx)")
    for graphs in (False, True):
        assert rules.site_class(spec, False, False, 3584, 4096, 16) == "flex band without tile skipping"
        assert rules.slower_reason(q, k, v, None, spec, True, False, graphs) is not None
    q, k, v = _qkv(2, 16, 4096, 128)
    assert rules.slower_reason(q, k, v, None, AttentionSpec(source="flex", mask_mod=CAUSAL), True, False, True) is None


def test_a_gathering_mask_carried_as_a_bias_is_kept():
    """Document ids at 128 tokens (one tile: no block of the BlockMask to skip) that the rule for the interval kernels
    keeps for speed are not served as a dense 0/-inf bias on the graph path instead: that is a class of its own, kept at
    every length (cuDNN reads the bias and computes every tile), not the plain class served from 128 tokens."""
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    L = 128
    docs = torch.arange(L) // (L // 4)
    bm = create_block_mask(lambda b, h, q_, kv: (docs[q_] == docs[kv]) & (q_ >= kv), 1, 1, L, L, device="cpu")
    q, k, v = (torch.randn(16, 16, L, 64, dtype=torch.bfloat16) for _ in range(3))
    report = te_compile.explain(lambda q, k, v: flex_attention(q, k, v, block_mask=bm), q, k, v, for_device="cuda",
                                train=True, serve="fastest")
    (site,) = report.decisions
    assert site.runs_on == "kept" and category(site.reason) == SLOWER, str(report)
    # the interval kernels' rule keeps it for speed (from 4096 tokens); the graph path's dense bias is not served
    assert "document ids" in str(site.reason), str(report)
    for graphs in (False, True):
        spec = AttentionSpec(source="flex", scale=0.1, mask_mod="(ge q_idx kv_idx)", empty_rows=True)
        assert rules.site_class(spec, False, False, 8192, 8192, 16) == "flex mask as a bias"
        assert rules.slower_reason(*_qkv(1, 16, 8192, 128), None, spec, True, False, graphs) is not None


def test_under_cuda_graphs_only_the_kernels_count():
    """mode="reduce-overhead" replays CUDA graphs: no host time per call on either side, so a sliding window at
    3072 tokens (kept for its step time otherwise) is served, and plain SDPA (the same class of kernel on both
    sides) is still kept."""
    from te_compile.backend import _uses_cuda_graphs

    q, k, v = _qkv(1, 8, 3072, 64)
    softcap = AttentionSpec(source="flex", mask_mod=SLIDING)
    assert rules.slower_reason(q, k, v, None, softcap, True, False) is not None
    assert rules.slower_reason(q, k, v, None, softcap, True, False, cuda_graphs=True) is None
    why = rules.slower_reason(q, k, v, None, AttentionSpec(mask="causal"), True, False, cuda_graphs=True)
    assert why is not None and "under CUDA graphs" in why
    assert _uses_cuda_graphs("inductor", {"triton.cudagraphs": True})
    assert not _uses_cuda_graphs("inductor", {"max_autotune": True, "triton.cudagraphs": False})
    assert not _uses_cuda_graphs("aot_eager", {"triton.cudagraphs": True})
    assert _checker("auto", "fastest", cuda_graphs=True)(q, k, v, None, softcap, True, False) is None


def test_backend_and_explain_follow_cuda_graphs(monkeypatch):
    """The decision under CUDA graphs follows the backend's options: a sliding window at 3072 tokens is kept by
    default and served when the graph runs under CUDA graphs; explain(mode=...) asks the backend for the same
    (Options.cuda_graphs), so its report matches the compiled model's."""
    import sys

    from te_compile.backend import Options, backend

    q = _t(1, 8, 3072, 64)
    softcap = AttentionSpec(source="flex", mask_mod=SLIDING)
    for graphs_on, served in ((False, False), (True, True)):
        why = _checker("auto", "fastest", graphs_on)(q, q, q, None, softcap, True, False)
        assert (why is None) == served, why
    assert backend(cuda_graphs=True).options == Options(cuda_graphs=True)
    assert backend(cuda_graphs=True) is backend(cuda_graphs=True) is not backend()

    explain_mod = sys.modules["te_compile.api.explain"]
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




def test_document_ids_are_kept_at_every_length_native_or_not(monkeypatch):
    """Document ids change with every packing, and each new set needs a new interval plan (a host synchronisation and
    the plan's kernels): one site with new ids every step ran 0.07-0.29x of torch.compile at 128-32768 tokens, so the
    default keeps them at every length, whether C++ or Python would launch the kernels; the reason says why and
    that serve="always" serves them."""
    from te_compile.cudnn import native

    spec = AttentionSpec(source="flex", scale=0.1, mask_mod="(eq (buf 0 b q_idx) (buf 0 b kv_idx))", n_inputs=1,
                         intervals=True)
    for possible in (True, False):
        monkeypatch.setattr(native, "possible", lambda p=possible: p)
        for t in (_t(2, 16, 4096, 128), _t(1, 8, 32768, 128)):
            serve, why = rules.decide(t, t, t, None, spec, True, False)
            assert not serve and "rule for flex intervals, document ids:" in why and "new plan" in why, why
            assert "serve='always'" in rules.slower_reason(t, t, t, None, spec, True, False)
    # the same mask without captured tensors (a static interval mask) is served from 128 tokens
    static = dataclasses.replace(spec, mask_mod="(ge q_idx kv_idx)", n_inputs=0)
    monkeypatch.setattr(native, "possible", lambda: True)
    assert rules.decide(_t(1, 8, 128, 64), _t(1, 8, 128, 64), _t(1, 8, 128, 64), None, static, True, False)[0]


def test_the_native_call_path_is_possible_only_where_it_can_turn_on(monkeypatch):
    from te_compile.cudnn import native

    monkeypatch.setattr(native, "_ext", None)
    monkeypatch.setattr(native, "_tried", False)
    monkeypatch.setattr(native, "_unavailable", lambda: "")
    assert native.possible()
    monkeypatch.setattr(native, "_unavailable", lambda: "TE_COMPILE_NATIVE=0")
    assert not native.possible()
    monkeypatch.setattr(native, "_unavailable", lambda: "")
    monkeypatch.setattr(native, "_tried", True)  # tried and off: the build failed
    assert not native.possible()
    monkeypatch.setattr(native, "_ext", object())
    assert native.possible()


def test_a_static_interval_mask_is_served_from_128_tokens_on_the_native_call_path_only(monkeypatch):
    """A mask of key intervals without inputs (prefix-LM, sink + local) is served from 128 tokens where C++ launches
    the interval kernels, from 4096 where Python does (what the replay runs measured; shorter steps are host-bound);
    below 128 tokens nothing was measured: kept."""
    from te_compile.cudnn import native

    spec = AttentionSpec(source="flex", scale=0.1, mask_mod="(or (lt kv_idx 64) (ge q_idx kv_idx))", intervals=True)
    short, tiny, long = _t(1, 8, 512, 64), _t(1, 8, 64, 64), _t(2, 16, 4096, 128)
    monkeypatch.setattr(native, "possible", lambda: True)
    serve, why = rules.decide(short, short, short, None, spec, True, False)
    assert serve and why.startswith("served by the rule for flex intervals (from 128 tokens)"), why
    serve, why = rules.decide(tiny, tiny, tiny, None, spec, True, False)
    assert not serve and "64 tokens, served from 128" in why, why
    monkeypatch.setattr(native, "possible", lambda: False)
    serve, why = rules.decide(short, short, short, None, spec, True, False)
    assert not serve and "flex intervals, from Python" in why and "served from 4096" in why, why
    assert rules.decide(long, long, long, None, spec, True, False)[0]
