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
    B, H, L, D = 2, 8, 1024, 64
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
