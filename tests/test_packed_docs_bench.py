"""bench/packed_docs.py on the CPU: the loader's packings are document runs covering each row, and the smoke run
trains the packed-document stack through every column with a new mask per step, te_compile's reference target on
the interval path giving eager's numbers, and nothing recompiling while timed. (The timed run needs a GPU.)"""

from __future__ import annotations

import importlib.util
import json
import os
import sys

import torch

HERE = os.path.dirname(__file__)


def _bench():
    sys.path.insert(0, os.path.join(HERE, "..", "bench"))
    spec = importlib.util.spec_from_file_location("bench_packed_docs", os.path.join(HERE, "..", "bench", "packed_docs.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


pd = _bench()


def test_packings_are_runs_that_cover_each_row():
    ps = pd.packings(3, 500, 40, 4, seed=1)
    assert len(ps) == 4 and all(p.shape == (3, 500) and p.dtype == torch.int32 for p in ps)
    for p in ps:
        step = p[:, 1:] - p[:, :-1]
        assert bool(((step == 0) | (step == 1)).all()) and bool((p[:, 0] == 0).all())
        assert int(p[:, -1].min()) >= 3  # several documents per row
    assert not torch.equal(ps[0], ps[1])  # a new packing per step


def test_smoke_run_serves_the_documents_and_matches_eager(tmp_path):
    out = tmp_path / "pd.json"
    assert pd.main(["--smoke", "--json", str(out)]) == 0
    row = json.loads(out.read_text())["rows"][0]
    assert "error" not in row and not row["wrong"]
    assert row["sites_reference"] == [["reference", "key intervals"]]
    assert max(row["err_reference"]) < 1e-3 and max(row["eager_err"]) < 1e-3
    assert row["graphs_compiled_while_timed"] == 0
    assert set(row["train"]) == {"torch.compile", "control", "te_compile", "reference"}
