"""GPU: a real tuning run. te_compile.tune measures each class of sites of a graph once on this GPU (the graph with
those sites on cuDNN against it with them on torch.compile), the cache then decides a second compile with no new
measurement, and the decisions follow the measured numbers."""

from __future__ import annotations

import json

import pytest
import torch
from torch.nn.attention.flex_attention import create_block_mask, flex_attention

import te_compile
from te_compile.tuning import cache, graph_ab
from te_compile.tuning.timing import Measurement, serve_on_cudnn

pytestmark = [pytest.mark.cuda,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU with cuDNN")]


def test_tune_measures_each_class_once_then_reads_the_cache(tmp_path, monkeypatch):
    monkeypatch.setenv(cache.ENV, str(tmp_path))
    monkeypatch.delenv("TE_COMPILE_SERVE", raising=False)  # the suite serves always; tuning is about "fastest"
    # 4096 tokens: softcap's cuDNN kernels are about 2x Inductor's and the step follows (docs/data's tuned sweeps)
    B, H, L, D = 2, 8, 4096, 64
    bm = create_block_mask(lambda b, h, q, kv: q >= kv, 1, 1, L, L, device="cuda")
    proj = torch.nn.Linear(H * D, H * D, device="cuda", dtype=torch.bfloat16)

    def softcap(s, b, h, q, kv):
        return 30.0 * torch.tanh(s / 30.0)

    def model(x):
        q = proj(x).view(B, L, H, D).transpose(1, 2)
        a = flex_attention(q, q, q, score_mod=softcap, block_mask=bm)
        o = torch.nn.functional.scaled_dot_product_attention(a, q, q, is_causal=True)
        return o.transpose(1, 2).reshape(B, L, H * D)
    x = torch.randn(B, L, H * D, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    lines = []
    report, made = te_compile.tune(model, x, echo=lines.append)
    assert sorted(m["class"] for m in made) == ["flex score_mod", "sdpa"], made  # one graph, two classes
    entries = {json.loads(k)["class"]: Measurement.from_entry(e) for k, e in cache.entries().items()}
    assert set(entries) == {"flex score_mod", "sdpa"} and all(m.seconds > 0 for m in entries.values())
    assert any(line.startswith("  graph, flex score_mod sites:") for line in lines), lines  # progress lines
    flex_site = next(d for d in report.decisions if d.site.kind == "flex")
    # the decision follows the measurement (which side wins is the benchmark's business: the suite shares the GPU
    # between its workers, so a test must not depend on it)
    assert (flex_site.runs_on == "cudnn") is serve_on_cudnn(entries["flex score_mod"]), (flex_site.reason,
                                                                                         entries["flex score_mod"])
    sdpa_site = next(d for d in report.decisions if d.site.kind == "sdpa")
    assert (sdpa_site.runs_on == "cudnn") is serve_on_cudnn(entries["sdpa"]), (sdpa_site.reason, entries["sdpa"])
    torch._dynamo.reset()
    start = len(graph_ab.measured_log)
    report2, made2 = te_compile.tune(model, x, echo=None)
    assert made2 == [] and len(graph_ab.measured_log) == start
    assert [d.runs_on for d in report2.decisions] == [d.runs_on for d in report.decisions]
