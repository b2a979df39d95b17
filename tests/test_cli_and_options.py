"""The opt-in API (te_compile.compile, verify), the CLI, torch._logging, and report goldens."""

import json
import os
import subprocess
import sys

import expecttest
import pytest
import torch
import torch.nn.functional as F
from torch.nn.attention.flex_attention import create_block_mask, flex_attention

import te_compile
from te_compile.runtime import verify

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _cli(*args, env=None):
    return subprocess.run([sys.executable, "-m", "te_compile", *args], capture_output=True, text=True,
                          cwd=ROOT, env={**os.environ, **(env or {})}, timeout=600)


def attn(q, k, v):
    return F.scaled_dot_product_attention(q, k, v, is_causal=True)


def test_compile_as_function_and_decorator():
    q, k, v = (torch.randn(1, 2, 16, 8) for _ in range(3))
    compiled = te_compile.compile(attn, inner="aot_eager", target="reference", fullgraph=True)
    torch.testing.assert_close(compiled(q, k, v), attn(q, k, v))

    @te_compile.compile(inner="eager", target="reference")
    def decorated(q, k, v):
        return attn(q, k, v) * 2

    torch.testing.assert_close(decorated(q, k, v), attn(q, k, v) * 2)


def test_verify_flag_reaches_the_spec():
    q, k, v = (torch.randn(1, 2, 16, 8) for _ in range(3))
    report = te_compile.explain(attn, q, k, v, target="reference", verify=True)
    (d,) = report.decisions
    assert d.spec.verify and '"verify":true' in report.code()
    plain = te_compile.explain(attn, q, k, v, target="reference")
    assert not plain.decisions[0].spec.verify and "verify" not in plain.code()


def test_verify_without_cudnn_says_so():
    """verify=True on a graph with no cuDNN site (CPU) warns instead of silently checking nothing."""
    import warnings
    x = torch.randn(1, 2, 8, 8)
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        te_compile.compile(attn, verify=True, inner="eager", target="reference")(x, x, x)
    assert any("nothing is verified" in str(m.message) for m in w)


def test_verify_compare_reports_figures():
    a = torch.ones(4, 4)
    assert verify.compare("forward", ["out"], [a], [a + 1e-4]) is None
    msg = verify.compare("forward", ["out", "lse"], [a, a], [a * 1.5, a])
    assert msg.startswith("forward: relative error vs the reference above 0.02") and "out 0.333" in msg
    inf = torch.tensor([float("-inf"), 1.0])
    assert verify.compare("fwd", ["lse"], [inf], [inf]) is None
    assert "lse inf" in verify.compare("fwd", ["lse"], [torch.tensor([0.0, 1.0])], [inf])
    assert issubclass(te_compile.VerificationError, RuntimeError)


def test_cli_explain_table_and_json():
    r = _cli("explain", "te_compile.cli.demo:example", "--target", "reference")
    assert r.returncode == 0, r.stderr
    assert "3 attention site(s) in 1 graph(s): 0 on cuDNN, 3 on the reference kernel, 0 kept" in r.stdout
    assert "compiling te_compile.cli.demo:example" in r.stderr and "done in" in r.stderr
    r = _cli("explain", "te_compile.cli.demo:example", "--target", "reference", "--json")
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    assert d["summary"]["reference"] == 3 and d["sites"][2]["dbias"].startswith("yes")


def test_installed_script_finds_a_module_in_the_current_folder(tmp_path):
    """`te-compile explain mymodule:make` from the folder that holds mymodule.py (the console script,
    unlike `python -m`, does not put the current folder on sys.path)."""
    (tmp_path / "mymodule.py").write_text(
        "import torch, torch.nn.functional as F\n"
        "def make():\n"
        "    q = torch.randn(1, 2, 8, 8)\n"
        "    return (lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True)), (q, q, q)\n")
    script = "import sys; from te_compile.__main__ import main; sys.exit(main())"
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    r = subprocess.run([sys.executable, "-I", "-c", script, "explain", "mymodule:make", "--target", "reference"],
                       capture_output=True, text=True, cwd=tmp_path, env=env, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "1 attention site(s) in 1 graph(s): 0 on cuDNN, 1 on the reference kernel" in r.stdout


def test_cli_errors_are_clear():
    r = _cli("explain", "no_such_module:f")
    assert r.returncode != 0 and "cannot load 'no_such_module:f'" in r.stderr
    if not torch.cuda.is_available():
        r = _cli("bench")
        assert r.returncode == 1 and "needs a CUDA GPU" in r.stderr
        r = _cli("demo", "--device", "cuda")
        assert r.returncode == 1 and "needs a CUDA GPU" in r.stderr and "Traceback" not in r.stderr


def test_torch_logs_show_the_site_report():
    code = ("import torch, torch.nn.functional as F, te_compile\n"
            "f = lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True)\n"
            "x = torch.randn(1, 2, 8, 8)\n"
            "torch.compile(f, backend=te_compile.backend(inner='eager'))(x, x, x)\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=300,
                       env={**os.environ, "TORCH_LOGS": "+te_compile"})
    assert r.returncode == 0, r.stderr
    assert "te_compile: graph" in r.stderr and "kept: inputs on cpu" in r.stderr


def test_torch_logs_print_each_line_once():
    """TORCH_LOGS naming te_compile must not set torch's handlers up twice (every line printed twice)."""
    code = ("import torch, torch.nn.functional as F, te_compile\n"
            "f = lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True)\n"
            "x = torch.randn(1, 2, 8, 8)\n"
            "torch.compile(f, backend=te_compile.backend(inner='eager'))(x, x, x)\n")
    counts = {}
    for logs in ("guards", "+te_compile,guards"):
        r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=300,
                           env={**os.environ, "TORCH_LOGS": logs})
        assert r.returncode == 0, r.stderr[-2000:]
        counts[logs] = (r.stderr.count("GUARDS"), r.stderr.count("te_compile: graph"))
    assert counts["guards"][0] >= 1 and counts["+te_compile,guards"][0] == counts["guards"][0], counts
    assert counts["+te_compile,guards"][1] == 1, counts


def _no_lines(report) -> str:
    """The report with source line numbers masked (editing a file must not break the golden)."""
    import re
    return re.sub(r"\.py:\d+", ".py:N", str(report))


class TestReportGoldens(expecttest.TestCase):
    def test_demo_model_report(self):
        from te_compile.cli.demo import example
        model, args = example()
        report = te_compile.explain(model, *args, target="reference")
        self.assertExpectedInline(_no_lines(report), """\
te_compile: 3 attention site(s) in 1 graph(s): 0 on cuDNN, 3 on the reference kernel, 0 kept
#  site  source                 kind  q            dtype    mask                            score_mod  grads       dbias                  runs_on
1  a     demo.py:N in forward  sdpa  [2,4,64,32]  float32  causal                          -          q,k,v       -                      reference
2  a_1   demo.py:N in forward  sdpa  [2,4,64,32]  float32  causal                          -          q,k,v       -                      reference
3  a_2   demo.py:N in forward  sdpa  [2,4,64,32]  float32  float bias float32 [1,4,64,64]  -          q,k,v,bias  yes (bias needs grad)  reference""")

    def test_flex_model_report(self):
        import torch.nn.attention.flex_attention as fa
        fa._validate_device = lambda *a, **k: None
        bm = create_block_mask(lambda b, h, q, kv: q >= kv, 1, 1, 32, 32, device="cpu", BLOCK_SIZE=16)
        table = torch.randn(63)

        def fn(q, k, v):
            a = flex_attention(q, k, v, score_mod=lambda s, b, h, q_, kv: 20.0 * torch.tanh(s / 20.0), block_mask=bm)
            c = flex_attention(q, k, v, score_mod=lambda s, b, h, q_, kv: s + table[q_ - kv + 31])
            d = flex_attention(q, k, v, score_mod=lambda s, b, h, q_, kv: s * table[q_ - kv + 31])
            return a + c + d
        q = torch.randn(1, 2, 32, 8)
        report = te_compile.explain(fn, q, q, q, target="reference")
        self.assertExpectedInline(_no_lines(report), """\
te_compile: 3 attention site(s) in 1 graph(s): 0 on cuDNN, 2 on the reference kernel, 1 kept
#  site              source                             kind  q           dtype    mask                      score_mod                          grads  dbias              runs_on
1  flex_attention    test_cli_and_options.py:N in fn  flex  [1,2,32,8]  float32  mask_mod q_idx >= kv_idx  tanh(score / 20.0) * 20.0          none   -                  reference
2  flex_attention_1  test_cli_and_options.py:N in fn  flex  [1,2,32,8]  float32  mask_mod True             score + buf0[q_idx - kv_idx + 31]  none   no (table frozen)  reference
3  flex_attention_2  test_cli_and_options.py:N in fn  flex  [1,2,32,8]  float32  mask_mod True             score * buf0[q_idx - kv_idx + 31]  none   -                  kept
   the score_mod gathers from a tensor and is not additive, so it cannot become a bias""")


@pytest.mark.parametrize("command,usage", [("demo", "te-compile demo"), ("explain", "te-compile explain"),
                                           ("bench", "te-compile bench")])
def test_each_command_has_its_own_help(command, usage, capsys):
    from te_compile.__main__ import main
    with pytest.raises(SystemExit) as e:
        main([command, "--help"])
    out = capsys.readouterr().out
    assert e.value.code == 0 and out.startswith(f"usage: {usage}")
    if command == "explain":
        assert "--target" in out


@pytest.mark.parametrize("body,msg", [
    ("return (lambda q: q), 5", "returned int as the args; expected a tuple"),
    ("return 5, (1,)", "returned int as the model"),
    ("return (lambda q: q), (1,), [1]", "returned list as the kwargs; expected a dict"),
    ("return 1", "must return (model_or_fn, args[, kwargs])"),
])
def test_cli_bad_factory_returns(tmp_path, monkeypatch, body, msg):
    from te_compile.__main__ import UserError, _load
    name = f"badfactory_{abs(hash(body))}"  # one module per case (imported modules are cached)
    (tmp_path / f"{name}.py").write_text(f"def make():\n    {body}\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(UserError) as e:
        _load(f"{name}:make")
    assert msg in str(e.value)


def test_option_types_are_checked():
    with pytest.raises(TypeError, match="verify must be True or False"):
        te_compile.backend(verify="yes")
    with pytest.raises(TypeError, match="cuda_graphs must be None, True or False"):
        te_compile.backend(cuda_graphs="on")


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message on a machine without a GPU")
def test_make_test_cuda_fails_clearly_without_a_gpu():
    """`make test-cuda` on a CPU machine must fail with a message, not report "N skipped" and exit 0."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    with open(os.path.join(root, "Makefile")) as f:
        recipe = f.read().split("\ntest-cuda:", 1)[1].split("\n\n", 1)[0]
    guard = next(ln.strip().lstrip("@") for ln in recipe.splitlines() if "cuda.is_available" in ln)
    cmd = guard.replace("$(PY)", sys.executable)
    r = subprocess.run(cmd, shell=True, capture_output=True, text=True, timeout=120)
    assert r.returncode != 0 and "no CUDA GPU here" in r.stderr and "make test" in r.stderr, (r.returncode, r.stderr)


def test_cli_explain_mode_and_code():
    """`te-compile explain MODULE:FACTORY --mode reduce-overhead --code` (docs/README.md's command line)."""
    r = _cli("explain", "te_compile.cli.demo:example", "--target", "reference", "--mode", "reduce-overhead", "--code")
    assert r.returncode == 0, r.stderr[-2000:]
    assert "3 attention site(s)" in r.stdout and "# graph 0" in r.stdout and "te_compile.attn_fwd" in r.stdout


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message on a machine without a GPU")
def test_cli_tune_without_a_gpu_says_so(tmp_path):
    """Without a GPU there is nothing to measure: tune exits non-zero with one line; --list still lists the cache."""
    env = {"TE_COMPILE_CACHE_DIR": str(tmp_path)}
    r = _cli("tune", "te_compile.cli.demo:example", env=env)
    assert r.returncode == 1 and r.stderr.strip().splitlines() == [
        "te-compile tune: needs a CUDA GPU (torch.cuda.is_available() is False here): it measures kernels on the "
        "GPU it runs on"], r.stderr
    r = _cli("tune", "--list", env=env)
    assert r.returncode == 0 and f"0 measurement(s) in {tmp_path}" in r.stdout
