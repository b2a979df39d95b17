"""docs/ follows the code: the feature tables list exactly the tested cases, every reason is documented."""

import os
import re

import torch
import torch.nn.functional as F

import te_compile
from forms import FORMS

DOCS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "docs", "README.md")


def _doc() -> str:
    with open(DOCS) as f:
        return f.read()


def _listed(prefix: str, text: str) -> set[str]:
    start = text.index(prefix)
    para = text[start: text.index("\n\n", start)]
    return set(re.findall(r"`([A-Za-z0-9_]+)`", para.split(":", 1)[1]))


def test_sdpa_feature_list_matches_the_tested_forms():
    assert _listed("Checked cases", _doc()) == {f.name for f in FORMS}


def test_flex_feature_list_matches_the_tested_mods():
    import test_flex
    doc = _doc()
    para = doc[doc.index("Checked score_mods"):]
    para = para[: para.index("\n\n")]
    scores, masks = para.split("mask_mods:")
    assert set(re.findall(r"`([A-Za-z0-9_]+)`", scores.split(":", 1)[1])) == set(test_flex.SCORE_MODS)
    assert set(re.findall(r"`([A-Za-z0-9_]+)`", masks)) == set(test_flex.MASK_MODS)


def test_every_kept_reason_seen_in_tests_is_documented():
    q = torch.randn(1, 2, 8, 8)
    reasons = []
    for fn, target in [
        (lambda q, k, v: F.scaled_dot_product_attention(q, k, v, dropout_p=0.1), "reference"),
        (lambda q, k, v: F.scaled_dot_product_attention(q, k, v, attn_mask=torch.zeros(8, 8), is_causal=True),
         "reference"),
        (lambda q, k, v: F.scaled_dot_product_attention(q, k, v), "auto"),
        (lambda q, k, v: F.scaled_dot_product_attention(q[0], k[0], v[0]), "reference"),
    ]:
        reasons += [d.reason for d in te_compile.explain(fn, q, q, q, target=target).decisions]
    doc = re.sub(r"\d+", "N", _doc())
    assert len(reasons) == 4
    for r in reasons:
        head = re.sub(r"\d+", "N", re.split(r"[=(:]", r)[0].strip())
        assert head in doc, r
