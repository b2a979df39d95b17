"""``explain(..., for_device="cuda")`` on a CPU: what te_compile would run on a CUDA GPU, with the dtype, support
and speed reasons, and a note naming what cannot be known without the GPU."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch.nn.attention.flex_attention import flex_attention

import te_compile
from te_compile.explain import FOR_CUDA_NOTE

pytestmark = pytest.mark.skipif(torch.cuda.is_available(), reason="what a CPU machine reports about a GPU")


def _model(q, k, v):
    a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    return flex_attention(a, k, v, score_mod=lambda s, b, h, q_, kv: 30.0 * torch.tanh(s / 30.0))


def _qkv(dtype):
    return [torch.randn(1, 4, 256, 64, dtype=dtype) for _ in range(3)]


def test_a_float32_model_would_be_kept_for_its_dtype():
    report = te_compile.explain(_model, *_qkv(torch.float32), for_device="cuda")
    assert [d.runs_on for d in report.decisions] == ["kept", "kept"]
    assert all(d.reason == "dtype float32: cuDNN SDPA serves float16 and bfloat16 only" for d in report.decisions)
    assert report.note == FOR_CUDA_NOTE and "not known here: the cuDNN version" in report.table(verbose=True)
    assert "support from the cuDNN frontend's check" in str(report)
    plain = te_compile.explain(_model, *_qkv(torch.float32))  # without for_device: the CPU's own decision
    assert all(d.reason.startswith("inputs on cpu") for d in plain.decisions) and not plain.note


def test_a_bfloat16_model_would_be_served():
    report = te_compile.explain(_model, *_qkv(torch.bfloat16), for_device="cuda", serve="always")
    assert [d.runs_on for d in report.decisions] == ["cudnn", "cudnn"], str(report)
    head = str(report).splitlines()[0]
    assert head.endswith("2 on cuDNN, 0 on the reference kernel, 0 kept (cuDNN unknown)"), head


def test_the_speed_rules_decide_too():
    report = te_compile.explain(_model, *_qkv(torch.bfloat16), for_device="cuda", serve="fastest")
    assert all(d.runs_on == "kept" and d.reason.startswith("kept for speed") for d in report.decisions), str(report)


def test_the_command_line(capsys):
    from te_compile.__main__ import main
    assert main(["explain", "te_compile.demo:example", "--for", "cuda"]) == 0
    out = capsys.readouterr().out
    assert "decided for a CUDA GPU on a machine without one" in out and "inputs on cpu" not in out


@pytest.mark.parametrize("kw,msg", [({"for_device": "tpu"}, "for_device must be None or 'cuda'"),
                                    ({"for_device": "cuda", "target": "reference"}, "goes with target='auto'")])
def test_bad_for_device(kw, msg):
    with pytest.raises(ValueError, match=msg):
        te_compile.explain(_model, *_qkv(torch.bfloat16), **kw)
