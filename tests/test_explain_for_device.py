"""``explain(..., for_device="cuda")`` on a CPU: what te_compile would run on a CUDA GPU, with the dtype, support
and speed reasons, and a note naming what cannot be known without the GPU."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch.nn.attention.flex_attention import flex_attention

import te_compile
from te_compile.tuning import rules
from te_compile.api.explain import FOR_CUDA_NOTE

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
    """At 256 tokens the rules keep plain SDPA (torch's own kernel) and serve the softcap flex call; at 64 tokens
    (not measured) they keep both."""
    report = te_compile.explain(_model, *_qkv(torch.bfloat16), for_device="cuda", serve="fastest")
    assert [d.runs_on for d in report.decisions] == ["kept", "cudnn"], str(report)
    assert "served: a non-linear score_mod, cuDNN faster from 128 tokens" in str(report), str(report)
    short = [torch.randn(1, 4, 64, 64, dtype=torch.bfloat16) for _ in range(3)]
    report = te_compile.explain(_model, *short, for_device="cuda", serve="fastest")
    assert all(d.runs_on == "kept" and d.reason.startswith("kept for speed") for d in report.decisions), str(report)


def test_the_command_line(capsys):
    from te_compile.__main__ import main
    assert main(["explain", "te_compile.cli.demo:example", "--for", "cuda"]) == 0
    out = capsys.readouterr().out
    assert "decided for a CUDA GPU here" in out and "inputs on cpu" not in out


@pytest.mark.parametrize("kw,msg", [({"for_device": "tpu"}, "for_device must be None or 'cuda'"),
                                    ({"for_device": "cuda", "target": "reference"}, "goes with target='auto'")])
def test_bad_for_device(kw, msg):
    with pytest.raises(ValueError, match=msg):
        te_compile.explain(_model, *_qkv(torch.bfloat16), **kw)


# a flex model that trains: causal BlockMask and a softcap score_mod; its parameters need gradients, which flex
# cannot run backward for on a CPU (explain runs its forward only)
FLEX_TRAINING_MODEL = '''
import torch
import torch.nn as nn
from torch.nn.attention.flex_attention import create_block_mask, flex_attention


class Attn(nn.Module):
    def __init__(self, dim=64, heads=1, seq=4096):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(dim, 3 * dim)
        self.block_mask = create_block_mask(lambda b, h, q, kv: q >= kv, None, None, seq, seq, device="cpu")

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.qkv(x).view(B, T, 3, self.heads, C // self.heads).permute(2, 0, 3, 1, 4)
        o = flex_attention(q, k, v, score_mod=lambda s, b, h, qi, ki: 30.0 * torch.tanh(s / 30.0),
                           block_mask=self.block_mask)
        return o.sum()


def make():
    torch.manual_seed(0)
    return Attn().to(torch.bfloat16), (torch.randn(1, 4096, 64, dtype=torch.bfloat16),)
'''


def _explain_without_frontend(tmp_path, *flags):
    """``te-compile explain flexmod:make --for cuda FLAGS`` in a process where the cuDNN frontend cannot be
    imported (as after ``pip install .`` with CPU torch)."""
    import os
    import subprocess
    import sys
    (tmp_path / "flexmod.py").write_text(FLEX_TRAINING_MODEL)
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    code = ("import sys; sys.modules['cudnn'] = None\n"
            "from te_compile.__main__ import main\n"
            "sys.exit(main(sys.argv[1:]))\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([root, str(tmp_path)]), "TE_COMPILE_SERVE": "fastest"}
    env.pop("TORCH_LOGS", None)
    return subprocess.run([sys.executable, "-c", code, "explain", "flexmod:make", "--for", "cuda", *flags],
                          cwd=str(tmp_path), env=env, capture_output=True, text=True, timeout=600)


def test_a_flex_training_model_for_cuda_without_the_frontend(tmp_path):
    r = _explain_without_frontend(tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    lines = r.stdout.splitlines()
    assert lines[0].endswith("1 on cuDNN, 0 on the reference kernel, 0 kept (cuDNN unknown)"), r.stdout
    assert lines[1] == "  (decided for a CUDA GPU here: support from te_compile's own rules (no cuDNN frontend))"
    row = lines[3].split()
    assert "q,k,v" in row and row[-1] == "cudnn" and "tanh(score" in lines[3] and "q_idx >= kv_idx" in lines[3]
    assert lines[4] == "   served: a non-linear score_mod, cuDNN faster from 128 tokens", r.stdout
    assert "backward" not in r.stderr and "Traceback" not in r.stderr


def test_infer_decides_the_same_model_as_inference(tmp_path):
    r = _explain_without_frontend(tmp_path, "--infer", "--verbose")
    assert r.returncode == 0, r.stderr[-3000:]
    row = r.stdout.splitlines()[3].split()
    assert row[-1] == "cudnn" and "none" in row, r.stdout
    assert "pip install --no-deps 'nvidia-cudnn-frontend>=1.32'" in r.stdout  # the long note: --verbose


def test_train_and_infer_choose_the_step():
    from torch.nn.attention.flex_attention import flex_attention as flex

    class Model(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.w = torch.nn.Linear(64, 64).to(torch.bfloat16).requires_grad_(False)

        def forward(self, x):
            q = self.w(x)
            return flex(q, q, q, score_mod=lambda s, b, h, q_, kv: 30.0 * torch.tanh(s / 30.0))

    m, x = Model(), torch.randn(1, 2, 256, 64, dtype=torch.bfloat16)
    grads = {train: te_compile.explain(m, x, for_device="cuda", serve="always", train=train).decisions[0].grads.describe()
             for train in (None, True, False)}
    assert grads == {None: "none", True: "q,k,v", False: "none"}, grads
    assert not any(p.requires_grad for p in m.parameters())  # --train's flip is undone


def test_the_demo_models_report_for_a_gpu_fits_a_terminal(capsys):
    from te_compile.__main__ import main
    from te_compile.reasons import MAX_SHORT
    assert main(["explain", "te_compile.cli.demo:example", "--for", "cuda"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert max(map(len, out)) <= 160, out
    reasons = [ln for ln in out if ln.startswith("   ") and not ln.startswith("   (")]
    assert len(reasons) == 3 and all(len(ln.strip()) <= MAX_SHORT for ln in reasons), out


def test_decoding_is_served_without_a_mask_and_kept_with_a_blockmask_that_reads_the_cache_offset(monkeypatch):
    """One query against a cache of 1024 keys: flex without a mask_mod is served by the decoding rule; the bottom-right
    BlockMask a decoding loop builds (its mask_mod reads the offset from a tensor) stays with Inductor, whose
    decoding kernel skips its blocks (the rule for a mask carried as a bias, not the decoding rule)."""
    from torch.nn.attention.flex_attention import create_block_mask
    q = torch.randn(1, 8, 1, 64, dtype=torch.bfloat16)
    k, v = (torch.randn(1, 8, 1024, 64, dtype=torch.bfloat16) for _ in range(2))
    offset = torch.tensor(1023)
    bm = create_block_mask(lambda b, h, q_idx, kv_idx: kv_idx <= q_idx + offset, None, None, 1, 1024, device="cpu")
    plain = te_compile.explain(lambda q, k, v: flex_attention(q, k, v), q, k, v, for_device="cuda", serve="fastest")
    masked = te_compile.explain(lambda q, k, v: flex_attention(q, k, v, block_mask=bm), q, k, v, for_device="cuda",
                                serve="fastest")
    assert [d.runs_on for d in plain.decisions] == ["cudnn"], str(plain)
    (d,) = masked.decisions
    assert d.runs_on == "kept" and "decoding" not in d.reason, d.reason
    # the decoding rule is what serves the plain call: without it the call is kept by the rule for flex plain
    from te_compile.tuning import rules
    monkeypatch.setitem(rules.RULES, "flex decoding", rules.Rule(None, None, "kept (test)"))
    torch._dynamo.reset()
    again = te_compile.explain(lambda q, k, v: flex_attention(q, k, v), q, k, v, for_device="cuda", serve="fastest")
    assert [d.runs_on for d in again.decisions] == ["kept"] and "flex decoding" in again.decisions[0].reason


def _interval_site(name: str, L: int, serve: str = "fastest"):
    from torch.nn.attention.flex_attention import create_block_mask
    docs = torch.arange(L) // (L // 4)
    masks = {"prefix-LM": lambda b, h, q, kv: (kv < 64) | (q >= kv),
             "documents": lambda b, h, q, kv: (docs[q] == docs[kv]) & (q >= kv)}
    bm = create_block_mask(masks[name], 1, 1, L, L, device="cpu")
    q = torch.randn(1, 8, L, 128, dtype=torch.bfloat16)
    (d,) = te_compile.explain(lambda q, k, v: flex_attention(q, k, v, block_mask=bm), q, q, q, for_device="cuda",
                              serve=serve).decisions
    torch._dynamo.reset()
    return d


def test_a_mask_of_key_intervals_is_decided_for_the_interval_kernels(monkeypatch):
    """A static mask cuDNN's interval kernels take, decided for a GPU (a te_compile[cuda] install: the frontend's CuTe
    DSL, the native call path): served there from its rule's length on (128 tokens); below it kept by its rule, which
    names it (serve="always" runs it there), not by the graph path's reason. Where the kernels cannot run, the graph
    path's keep names why."""
    cls = "flex intervals"
    need = rules.RULES[cls].min_tokens
    d = _interval_site("prefix-LM", 4096)
    assert d.runs_on == "cudnn" and d.spec.intervals, d.reason
    d = _interval_site("prefix-LM", 64)
    assert d.runs_on == "kept" and d.reason.startswith(f"kept for speed by the rule for {cls}: 64 tokens, "
                                                       f"served from {need}"), d.reason
    from te_compile.cudnn import flexkernel
    monkeypatch.setattr(flexkernel, "unavailable", lambda q, k, v: "no CuTe DSL (test)")
    d = _interval_site("prefix-LM", 4096)
    assert d.runs_on == "kept" and d.reason.endswith("; cuDNN's interval kernels: no CuTe DSL (test)"), d.reason


def test_document_ids_are_kept_by_their_rule_and_served_when_asked():
    """Document ids on the interval kernels need a new plan for every packing: kept by their rule at every length
    (the reason names it and serve="always"), and serve="always" runs them on the interval kernels."""
    for L in (1024, 4096):
        d = _interval_site("documents", L)
        assert d.runs_on == "kept" and d.reason.startswith(
            "kept for speed by the rule for flex intervals, document ids: document ids change"), d.reason
        assert "serve='always'" in d.reason, d.reason
    d = _interval_site("documents", 4096, serve="always")
    assert d.runs_on == "cudnn" and d.spec.intervals, d.reason


@pytest.mark.parametrize("mode, says", [(None, "served by the rule for flex native band (from 128 tokens)"),
                                        ("reduce-overhead", "served by the rule for flex native band under CUDA "
                                                            "graphs (from 1024 tokens)")])
def test_a_site_served_by_a_rule_names_the_rule_with_and_without_cuda_graphs(mode, says):
    from torch.nn.attention.flex_attention import create_block_mask
    bm = create_block_mask(lambda b, h, q, kv: q >= kv, 1, 1, 2048, 2048, device="cpu")
    q = torch.randn(1, 8, 2048, 64, dtype=torch.bfloat16)
    (d,) = te_compile.explain(lambda q, k, v: flex_attention(q, k, v, block_mask=bm), q, q, q, for_device="cuda",
                              serve="fastest", mode=mode).decisions
    torch._dynamo.reset()
    assert d.runs_on == "cudnn" and d.note.startswith(says), d.note
