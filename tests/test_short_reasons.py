"""Every site's reason reads in one line: at most te_compile.reasons.MAX_SHORT characters, from the reason's own
short form, the SHORT_FORMS row that matches it, or the rule's short text; the long form stays in the JSON and
``table(verbose=True)``."""

from __future__ import annotations

import ast
import glob
import os
import re

import pytest
import torch
import torch.nn.functional as F
from torch.nn.attention.flex_attention import flex_attention

import te_compile
from te_compile.tuning import rules
from te_compile.cudnn import versions
from te_compile.cudnn.install import frontend_missing
from te_compile.reasons import MAX_SHORT, SHORT_FORMS, Reason, clip, rule_short, short

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _fields(pattern: str, width: int = 12) -> dict:
    return {name: "x" * width for name in re.compile(pattern).groupindex}


@pytest.mark.parametrize("pattern,template", SHORT_FORMS, ids=[t[:40] for _, t in SHORT_FORMS])
def test_every_short_form_fits(pattern, template):
    assert len(template.format(**_fields(pattern))) <= MAX_SHORT


@pytest.mark.parametrize("cls", list(rules.RULES))
def test_every_rule_has_a_short_text_and_its_reasons_fit(cls):
    rule = rules.RULES[cls]
    assert rule.short and len(rule.short) <= 48, (cls, rule.short)
    for graphs in (False, True):
        need = rule.graphs_min_tokens if graphs else rule.min_tokens
        lines = [rule_short(rule.short, False, 1_048_576, need, graphs)]
        if need is not None:
            lines.append(rule_short(rule.short, True, 1_048_576, need, graphs))
        for line in lines:
            assert len(line) <= MAX_SHORT, (cls, line)


def _text(node) -> str | None:
    """The text of a string literal, an f-string (each field read as "1") or a sum of them."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr):
        return "".join(v.value if isinstance(v, ast.Constant) else "1" for v in node.values)
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        a, b = _text(node.left), _text(node.right)
        return None if a is None or b is None else a + b
    return None


def _long_reasons() -> list[tuple[str, str, bool]]:
    """(file:line, text, has its own short=) for every Keep(...) / Reason(...) in te_compile whose text is longer
    than MAX_SHORT, and every long string a cuDNN check returns as a reason."""
    out = []
    for path in sorted(glob.glob(os.path.join(ROOT, "te_compile", "**", "*.py"), recursive=True)):
        with open(path) as f:
            tree = ast.parse(f.read())
        here = os.path.relpath(path, ROOT)
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and getattr(node.func, "id", getattr(node.func, "attr", None)) in (
                    "Keep", "Reason") and node.args:
                text = _text(node.args[0])
                own = any(kw.arg == "short" for kw in node.keywords)
                if text is not None and len(text) > MAX_SHORT:
                    out.append((f"{here}:{node.lineno}", text, own))
            elif here == os.path.join("te_compile", "cudnn", "check.py") and isinstance(node, ast.Return) \
                    and node.value is not None:
                text = _text(node.value)
                if text is not None and len(text) > MAX_SHORT:
                    out.append((f"{here}:{node.lineno}", text, False))
    return out


def test_every_long_reason_in_the_code_has_a_short_form():
    found = _long_reasons()
    assert len(found) > 10, found
    missing = [where for where, text, own in found if not own and not any(re.search(p, text) for p, _ in SHORT_FORMS)]
    assert not missing, missing


def test_real_reasons_read_short(monkeypatch):
    monkeypatch.delenv(versions.ENV, raising=False)
    reasons = [frontend_missing(ModuleNotFoundError("No module named 'cudnn'", name="cudnn")),
               frontend_missing(ImportError("libcudnn.so.9: cannot open shared object file")),
               versions.emitted_reason(92000)]
    q = torch.randn(1, 2, 8, 8)
    for fn in (lambda q, k, v: F.scaled_dot_product_attention(q, k, v, attn_mask=torch.zeros(8, 8), is_causal=True),
               lambda q, k, v: F.scaled_dot_product_attention(q, k, v, scale=-1.0, is_causal=True),
               lambda q, k, v: F.scaled_dot_product_attention(q, k, v)):
        reasons += [d.reason for d in te_compile.explain(fn, q, q, q).decisions]
    assert all(len(r) > MAX_SHORT for r in reasons), [len(r) for r in reasons]
    shorts = [short(r) for r in reasons]
    assert shorts == [
        "cuDNN frontend not installed: pip install 'nvidia-cudnn-frontend>=1.32'",
        "cuDNN frontend fails to load: pip install 'nvidia-cudnn-frontend>=1.32'",
        "cuDNN 9.20 is not checked with emitted score_mod graphs (TE_COMPILE_UNCHECKED_CUDNN=serve)",
        "attn_mask with is_causal=True: eager differs by backend; fold the causal mask into attn_mask",
        "a negative scale with is_causal: torch's own kernels disagree there",
        "inputs on cpu: cuDNN serves CUDA inputs (target='reference' runs the reference kernel)",
    ], shorts


@pytest.mark.skipif(torch.cuda.is_available(), reason="decided for a GPU from a CPU")
def test_a_rule_decision_reads_short_and_keeps_its_evidence():
    def softcap(q, k, v):
        return flex_attention(q, k, v, score_mod=lambda s, b, h, q_, kv: 30.0 * torch.tanh(s / 30.0))
    qkv = [torch.randn(1, 2, 64, 64, dtype=torch.bfloat16) for _ in range(3)]
    report = te_compile.explain(softcap, *qkv, for_device="cuda", serve="fastest")
    (row,) = report.to_dict()["sites"]
    assert row["why"] == "kept for speed: a non-linear score_mod, 64 tokens (cuDNN faster from 128)", row["why"]
    assert row["reason"].startswith("kept for speed by the rule for flex score_mod") and "1.10-2.58x" in row["reason"]
    assert f"   {row['why']}" in str(report).splitlines()
    assert "1.10-2.58x" in report.table(verbose=True) and "1.10-2.58x" not in str(report)


def test_clip_keeps_a_line_of_at_most_max_short():
    assert clip("dtype float32: cuDNN SDPA serves float16 and bfloat16 only") == \
        "dtype float32: cuDNN SDPA serves float16 and bfloat16 only"
    long = "a fact (with an aside that runs on and on and on and on and on) and more words; " * 4
    assert len(clip(long)) <= MAX_SHORT and "aside" not in clip(long)
    assert clip("word " * 60).endswith("\u2026") and len(clip("word " * 60)) <= MAX_SHORT
    assert short(Reason("x" * 300, short="the short one")) == "the short one"


def test_the_compact_table_clips_long_cells_and_verbose_shows_them():
    def long_mod(q, k, v):
        return flex_attention(q, k, v, score_mod=lambda s, b, h, q_, kv: s + 0.001 * (q_ - kv) + 0.002 * (q_ + kv)
                              + 0.003 * (q_ * kv) + 0.004 * (q_ - 2 * kv) + 0.005 * (2 * q_ - kv))
    q = torch.randn(1, 2, 16, 8, dtype=torch.float64)
    report = te_compile.explain(long_mod, q, q, q, target="reference")
    full = report.to_dict()["sites"][0]["score_mod"]
    assert len(full) > 48 and full not in str(report) and full in report.table(verbose=True)
    assert max(map(len, str(report).splitlines())) < max(map(len, report.table(verbose=True).splitlines()))


def test_the_logs_carry_the_long_form(caplog):
    import logging

    def fn(q, k, v):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=torch.zeros(8, 8), is_causal=True)
    q = torch.randn(1, 2, 8, 8)
    with caplog.at_level(logging.INFO, logger="te_compile"):
        report = te_compile.explain(fn, q, q, q, target="reference")
    (reason,) = [d.reason for d in report.decisions]
    assert len(reason) > MAX_SHORT and short(reason) in str(report) and reason not in str(report)
    logged = " ".join(" ".join(r.getMessage().split()) for r in caplog.records)
    assert "(error on math, AND on CPU flash)" in logged and "(error on math, AND on CPU flash)" in reason
