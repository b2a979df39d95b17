"""The backend as users reach it: by name, with options, through explain, and the demo."""

import json
import logging

import pytest
import torch
import torch.nn.functional as F

import te_compile
from te_compile.report import record_reports
from te_compile.cli.demo import main as demo_main


def attn(q, k, v):
    return F.scaled_dot_product_attention(q, k, v, is_causal=True)


def _qkv():
    return [torch.randn(1, 2, 16, 8) for _ in range(3)]


def test_backend_by_name_without_import_of_options():
    # resolved through the torch_dynamo_backends entry point
    from torch._dynamo.backends.registry import lookup_backend
    assert lookup_backend("te_compile") is te_compile.te_compile_backend
    q, k, v = _qkv()
    with record_reports() as graphs:
        out = torch.compile(attn, backend="te_compile")(q, k, v)
    # the backend ran (a CPU site under target="auto" is kept, with its reason), and the kept node is eager's
    (d,) = [d for g in graphs for d in g.decisions]
    assert d.runs_on == "kept" and d.reason.startswith("inputs on cpu"), d.reason
    torch.testing.assert_close(out, attn(q, k, v))


@pytest.mark.parametrize("kw,match", [(dict(inner="tvm"), "inner compiler"), (dict(target="gpu"), "target")])
def test_bad_options_raise_clearly(kw, match):
    with pytest.raises(ValueError, match=match):
        te_compile.backend(**kw)


def test_eager_inner_compiler():
    q, k, v = _qkv()
    out = torch.compile(attn, backend=te_compile.backend(inner="eager", target="reference"))(q, k, v)
    torch.testing.assert_close(out, attn(q, k, v))


def test_explain_table_and_dict():
    def two_sites(q, k, v):
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return a + F.scaled_dot_product_attention(q, k, v, dropout_p=0.2)

    report = te_compile.explain(two_sites, *_qkv(), target="reference")
    text = str(report)
    lines = text.splitlines()
    assert lines[0] == ("te_compile: 2 attention site(s) in 1 graph(s): 0 on cuDNN, "
                        "1 on the reference kernel, 1 kept")
    assert lines[1].split() == ["#", "site", "source", "kind", "q", "dtype", "mask", "score_mod", "grads",
                                "dbias", "runs_on"]
    assert "test_backend.py:" in lines[2] and "reference" in lines[2] and "causal" in lines[2]
    assert lines[3].endswith("kept") and lines[4] == "   dropout_p=0.2 > 0: cuDNN's dropout RNG cannot reproduce torch's"
    d = json.loads(json.dumps(report.to_dict()))
    assert d["summary"] == {"sites": 2, "cudnn": 0, "reference": 1, "kept": 1}
    assert d["sites"][0]["q"] == "[1,2,16,8]" and d["sites"][0]["dtype"] == "float32"
    assert "te_compile.attn_fwd" in report.code()


def test_decisions_are_logged(caplog):
    with caplog.at_level(logging.INFO, logger="te_compile"):
        torch.compile(attn, backend="te_compile")(*_qkv())
    assert any("kept: inputs on cpu" in r.getMessage() for r in caplog.records)


def test_demo_runs_on_cpu(capsys):
    assert demo_main(["--device", "cpu", "--seq", "32", "--batch", "2"]) == 0
    out = capsys.readouterr().out
    assert "3 attention site(s) in 1 graph(s): 0 on cuDNN, 3 on the reference kernel, 0 kept" in out
    line = next(ln for ln in out.splitlines() if ln.startswith("max rel. error"))
    errs = [float(tok.rstrip(",")) for tok in line.split() if tok.rstrip(",").replace(".", "").replace("e-", "").isdigit()]
    assert errs and max(errs) < 1e-4, line


def test_torch_compile_mode_and_options_reach_the_backend(caplog):
    """torch.compile(..., backend="te_compile", mode=...) passes mode/options to the backend: they
    configure Inductor (mode="reduce-overhead" is CUDA graphs) instead of failing with a TypeError."""
    import torch.nn.functional as F

    fn = lambda q: F.scaled_dot_product_attention(q, q, q, is_causal=True)  # noqa: E731
    q = torch.randn(1, 2, 8, 8)
    for kw in ({"mode": "max-autotune-no-cudagraphs"}, {"options": {"max_autotune": False}}):
        torch._dynamo.reset()
        with record_reports() as graphs:
            torch.compile(fn, backend="te_compile", **kw)(q)
        assert [d.runs_on for g in graphs for d in g.decisions] == ["kept"], kw  # te_compile decided, no TypeError
    torch._dynamo.reset()
    be = te_compile.backend(inner="aot_eager", target="reference")
    with caplog.at_level("WARNING", logger="te_compile"):
        out = torch.compile(fn, backend=lambda gm, ex: be(gm, ex, mode="reduce-overhead"))(q)
    torch.testing.assert_close(out, fn(q))
    assert "inner='aot_eager' ignores it" in caplog.text


def test_ops_are_recordable_in_cuda_graphs_unless_opted_out():
    """te_compile's ops carry no cudagraph_unsafe tag (mode="reduce-overhead" records them; GPU test in
    test_cuda_graphs.py); TE_COMPILE_CUDAGRAPH_UNSAFE=1 tags them so Inductor leaves their graphs out."""
    import subprocess
    import sys

    for op in (torch.ops.te_compile.attn_fwd.default, torch.ops.te_compile.attn_bwd.default):
        assert torch.Tag.cudagraph_unsafe not in op.tags and torch.Tag.pt2_compliant_tag in op.tags
    code = ("import torch, te_compile.runtime.ops; "
            "print(torch.Tag.cudagraph_unsafe in torch.ops.te_compile.attn_fwd.default.tags)")
    import os
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env={**os.environ, "TE_COMPILE_CUDAGRAPH_UNSAFE": "1"}).stdout
    assert out.strip() == "True"


def test_a_graph_whose_sites_are_all_kept_runs_the_inner_compilers_callable_itself(monkeypatch):
    """A kept site costs what torch.compile costs: the graph reaches Inductor as Dynamo captured it, the backend
    returns Inductor's callable unwrapped, and Dynamo's guard settings stay its defaults."""
    import sys
    B = sys.modules["te_compile.backend"]  # te_compile.backend is the function
    inner_got, returned = {}, {}

    def inner(name, gm, example_inputs, config):
        inner_got["code"], inner_got["fn"] = gm.code, lambda *args: gm.forward(*args)
        return inner_got["fn"]

    real = B.compile_graph

    def spy(*args, **kw):
        returned["fn"] = real(*args, **kw)
        return returned["fn"]

    monkeypatch.setattr(B, "_inner_compile", inner)
    monkeypatch.setattr(B, "compile_graph", spy)
    skip = getattr(torch._dynamo.config, "skip_tensor_guards_with_matching_dict_tags", None)
    torch._dynamo.reset()
    q, k, v = _qkv()
    with record_reports() as graphs:
        out = torch.compile(attn, backend="te_compile")(q, k, v)
    assert [d.runs_on for g in graphs for d in g.decisions] == ["kept"]
    assert returned["fn"] is inner_got["fn"]
    assert "scaled_dot_product_attention" in inner_got["code"] and "te_compile" not in inner_got["code"]
    assert getattr(torch._dynamo.config, "skip_tensor_guards_with_matching_dict_tags", None) == skip
    torch.testing.assert_close(out, attn(q, k, v))
