"""te_compile's warnings point at the user's line (not te_compile's or torch's) and show once per place."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import warnings

import torch
import torch.nn.functional as F

import te_compile


def _attn(q, k, v):
    return F.scaled_dot_product_attention(q, k, v, is_causal=True)


def test_verify_without_cudnn_points_at_the_call_and_shows_once():
    q = torch.randn(1, 2, 8, 8)
    compiled = te_compile.compile(_attn, inner="aot_eager", verify=True)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("default")  # Python's own filter: once per place
        for _ in range(2):
            torch._dynamo.reset()
            compiled(q, q, q)  # the line the warning names
    ours = [w for w in seen if "nothing is verified" in str(w.message)]
    assert len(ours) == 1, [str(w.message) for w in seen]
    assert ours[0].filename == __file__ and ours[0].lineno == _line_of("compiled(q, q, q)  # the line")


def test_explain_without_a_graph_points_at_the_explain_call():
    def no_tensor_work(x):
        return x  # Dynamo compiles no graph for this

    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        te_compile.explain(no_tensor_work, torch.ones(2))  # the explain line
    (w,) = [w for w in seen if "compiled no graph" in str(w.message)]
    assert w.filename == __file__ and w.lineno == _line_of("te_compile.explain(no_tensor_work, torch.ones(2))  #")


def _line_of(text: str) -> int:
    with open(__file__) as f:
        return next(i for i, line in enumerate(f, 1) if text in line and "_line_of" not in line)


ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_warning_from_a_module_run_with_dash_m(tmp_path):
    pkg = tmp_path / "pk"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "train.py").write_text(textwrap.dedent("""
        from te_compile import user_warnings

        def step():
            user_warnings.warn("te_compile: a reason")

        step()
        print("after the warning")
    """))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([ROOT, str(tmp_path)]))
    r = subprocess.run([sys.executable, "-m", "pk.train"], cwd=tmp_path, env=env, capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stderr
    assert "after the warning" in r.stdout
    assert "train.py:5: RuntimeWarning: te_compile: a reason" in r.stderr
