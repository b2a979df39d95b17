"""The cuDNN workaround table (te_compile/cudnn/workarounds.py) points at things that exist."""

from __future__ import annotations

import dataclasses
import importlib
import pathlib
import re

import pytest

from te_compile.lowering import lower as lowering
from te_compile.cudnn.workarounds import WORKAROUNDS

ROOT = pathlib.Path(__file__).resolve().parent.parent
HEADINGS = [line[3:] for line in (ROOT / "docs" / "cudnn-notes.md").read_text().splitlines() if line.startswith("## ")]


@pytest.mark.parametrize("w", WORKAROUNDS, ids=[w.name for w in WORKAROUNDS])
def test_row_points_at_real_things(w):
    module, attr = w.where.split(":")
    obj = importlib.import_module(f"te_compile.{module}")
    head, *rest = attr.split(".")
    obj = getattr(obj, head)
    for name in rest:  # a dataclass field (EmitOptions.kv_guard) or an attribute
        fields = {f.name for f in dataclasses.fields(obj)} if dataclasses.is_dataclass(obj) else set()
        assert name in fields or hasattr(obj, name), w.where
    assert any(h.startswith(w.note) for h in HEADINGS), f"no cudnn-notes heading starts with {w.note!r}"
    path, func = w.test.split("::")
    assert re.search(rf"^def {func}\(", (ROOT / path).read_text(), re.M), w.test


def test_every_emission_option_has_a_row():
    listed = {w.where.rsplit(".", 1)[1] for w in WORKAROUNDS if ":EmitOptions." in w.where}
    assert listed == {f.name for f in dataclasses.fields(lowering.EmitOptions)}
