"""GPU: a real tuning run. te_compile.tune measures each site once on this GPU (cuDNN op vs torch.compile's
candidate), the cache then decides a second compile with no new measurement, and the decisions follow the
measured numbers."""

from __future__ import annotations

import json

import pytest
import torch
from torch.nn.attention.flex_attention import create_block_mask, flex_attention

import te_compile
from te_compile import tuning
from te_compile.tuning import cache
from te_compile.tuning.timing import Measurement, serve_on_cudnn

pytestmark = [pytest.mark.cuda,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU with cuDNN")]


def test_tune_measures_once_then_reads_the_cache(tmp_path, monkeypatch):
    monkeypatch.setenv(cache.ENV, str(tmp_path))
    monkeypatch.delenv("TE_COMPILE_SERVE", raising=False)  # the suite serves always; tuning is about "fastest"
    # 4096 tokens: softcap's cuDNN kernels are about 2x Inductor's and the step follows (docs/data's tuned sweeps)
    B, H, L, D = 2, 8, 4096, 64
    bm = create_block_mask(lambda b, h, q, kv: q >= kv, 1, 1, L, L, device="cuda")

    def softcap(s, b, h, q, kv):
        return 30.0 * torch.tanh(s / 30.0)

    def model(q, k, v):
        a = flex_attention(q, k, v, score_mod=softcap, block_mask=bm)
        return torch.nn.functional.scaled_dot_product_attention(a, k, v, is_causal=True)
    q, k, v = (torch.randn(B, H, L, D, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
    report, made = te_compile.tune(model, q, k, v, echo=None)
    assert len(made) == 2, made  # the flex site and the SDPA site
    entries = cache.entries()
    assert len(entries) == 2
    by_spec = {json.loads(key)["spec"]: Measurement.from_entry(e) for key, e in entries.items()}
    flex_site = next(d for d in report.decisions if d.site.kind == "flex")
    assert flex_site.runs_on == "cudnn", flex_site.reason  # softcap + causal at 4096 tokens: measured faster
    for d in report.decisions:
        if d.runs_on == "cudnn":  # served: the measurement said cuDNN is faster (median and nearly every round)
            assert serve_on_cudnn(by_spec[d.spec.key()]), by_spec
        else:  # kept for speed, from the measurement, with the time tuning took
            assert "measured:" in d.reason and "tuning took" in d.reason, d.reason
    assert all(e["seconds"] > 0 for e in entries.values())  # the candidates' compiles are counted
    torch._dynamo.reset()
    report2, made2 = te_compile.tune(model, q, k, v, echo=None)
    assert made2 == []
    assert [d.runs_on for d in report2.decisions] == [d.runs_on for d in report.decisions]
    assert len(tuning.measured_log) >= 2


def test_busy_candidates_run_the_graph_work_before_each_call():
    """candidates.busy launches the rest of the graph's GPU work (one sleep kernel) before each call of either
    candidate, and leaves their results unchanged."""
    from torch.profiler import ProfilerActivity, profile

    from te_compile.tuning.candidates import busy
    x = torch.randn(256, 256, device="cuda")
    pair = (lambda: x @ x, lambda: x + 1)
    slow = busy(pair, 0.5, x.device)
    for plain, padded in zip(pair, slow):
        torch.testing.assert_close(padded(), plain())
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(3):
            slow[0]()
            slow[1]()
        torch.cuda.synchronize()
    sleeps = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA and "spin" in e.name]
    assert len(sleeps) == 6, sorted({e.name for e in prof.events()})


def test_tune_checks_the_whole_graph_of_a_measured_site_once(tmp_path, monkeypatch):
    """A graph with other work besides a site served because it measured faster is timed whole, both ways, with
    Inductor; the decisions follow that verdict, and a second tune reads it from the cache."""
    from te_compile.tuning import graph_check
    monkeypatch.setenv(cache.ENV, str(tmp_path))
    monkeypatch.delenv("TE_COMPILE_SERVE", raising=False)
    B, H, L, D = 2, 8, 4096, 64  # softcap at 4096 tokens: the site wins alone, and the graph is timed whole
    proj = torch.nn.Linear(H * D, H * D, device="cuda", dtype=torch.bfloat16)

    def softcap(s, b, h, q, kv):
        return 30.0 * torch.tanh(s / 30.0)

    def model(x):
        q = proj(x).view(B, L, H, D).transpose(1, 2)
        return flex_attention(q, q, q, score_mod=softcap).transpose(1, 2).reshape(B, L, H * D)
    x = torch.randn(B, L, H * D, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    start = len(graph_check.checked_log)
    lines = []
    report, made = te_compile.tune(model, x, echo=lines.append)
    site_entries = [e for k, e in cache.entries().items() if '"graph"' not in k]
    graph_entries = [e for k, e in cache.entries().items() if '"graph"' in k]
    assert len(made) == 1 and len(site_entries) == 1
    (d,) = report.decisions
    assert serve_on_cudnn(Measurement.from_entry(site_entries[0])), site_entries  # the site alone won
    assert len(graph_entries) == 1 and len(graph_check.checked_log) == start + 1
    assert any(line.startswith("  graph with 1 site(s)") for line in lines), lines  # progress line
    assert "1 graph(s) timed whole" in lines[-1], lines[-1]
    whole = Measurement.from_entry(graph_entries[0])
    assert whole.te_ms > 0 and whole.tc_ms > 0 and whole.seconds > 0
    assert serve_on_cudnn(whole) and d.runs_on == "cudnn", (whole, d.reason)  # one linear does not hide a 2x site
    torch._dynamo.reset()
    report2, made2 = te_compile.tune(model, x, echo=None)
    assert made2 == [] and len(graph_check.checked_log) == start + 1
    assert [d.runs_on for d in report2.decisions] == [d.runs_on for d in report.decisions]
