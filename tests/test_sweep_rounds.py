"""bench/sweep.py's paired-round ratios (CPU: the arithmetic only; the sweep itself needs CUDA)."""

from __future__ import annotations

import importlib.util
import os

import pytest

HERE = os.path.dirname(__file__)


def _sweep():
    spec = importlib.util.spec_from_file_location("bench_sweep", os.path.join(HERE, "..", "bench", "sweep.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_paired_rounds_cancel_drift_that_best_rounds_do_not():
    # the machine slows down 2x in the second round for everyone: best rounds would compare round 1 of one
    # implementation with round 1 of another anyway here, but a paired ratio never mixes rounds
    row = {"te_compile": {"rounds_ms": [1.0, 2.0, 1.1]}, "torch.compile": {"rounds_ms": [1.2, 2.4, 1.21]},
           "always": {"rounds_ms": [1.0, 2.2, 1.0]}, "control": {"rounds_ms": [1.2, 2.4, 1.3]}}
    got = _sweep()._paired(row)
    assert got["te_compile"] == pytest.approx(1.2) and got["control"] == pytest.approx(1.0)
    assert got["always"] == pytest.approx(1.2)
    # default vs the faster of always and torch.compile, per round: 1.0/1.0, 2.2/2.0, 1.0/1.1
    assert got["vs_oracle"] == pytest.approx(1.0)


def test_paired_rounds_need_torch_compile_rounds():
    assert _sweep()._paired({"te_compile": {"rounds_ms": [1.0]}}) == {}


def test_native_calls_are_counted_per_column_between_snapshots():
    """The sweep keeps, per column, how te_compile's op calls ran in its measured rounds (native, replayed, captured,
    handed to Python), so a slow te_compile round can be told apart from one that captured graphs."""
    count = _sweep().count_native
    calls: dict = {}
    snap = lambda h, r, c, m: {"hits": h, "replays": r, "captures": c, "misses": m, "declined": {}}  # noqa: E731
    count(calls, "te_compile", snap(10, 4, 2, 1), snap(40, 30, 2, 1))
    count(calls, "te_compile", snap(40, 30, 2, 1), snap(70, 58, 3, 2))
    count(calls, "torch.compile", {}, {})  # the native path is off: nothing to count
    assert calls == {"te_compile": {"calls": 60, "replays": 54, "captures": 1, "to_python": 1}}


def test_cases_are_named_with_or_without_the_flex_prefix_and_an_unknown_one_is_refused():
    sweep = _sweep()
    assert sweep.cases_wanted("prefix-LM, flex document") == ["flex prefix-LM", "flex document"]
    assert sweep.cases_wanted("") == []
    # the loader variant: a name with a space and parentheses, taken as it is written
    assert sweep.cases_wanted("document (loader),document") == ["flex document (loader)", "flex document"]
    with pytest.raises(ValueError, match="unknown flex prefix;.* prefix-LM, document"):
        sweep.cases_wanted("prefix,document")


def test_a_benchmark_json_records_whether_the_interval_kernels_could_run(tmp_path):
    import json
    import sys
    sys.path.insert(0, os.path.join(HERE, "..", "bench"))
    import record
    from te_compile.cudnn.flexkernel import frontend_reason
    record.write(str(tmp_path / "r.json"), {"rows": []})
    got = json.loads((tmp_path / "r.json").read_text())["interval_kernels"]
    assert got == (frontend_reason() or "available") and got  # on the CPU suite's machine: the frontend's reason


def test_the_prefix_lm_variant_masks_something_at_every_length():
    """The prefix is 512 keys, at most half the sequence: at 256-512 tokens a prefix of 512 keys would be every key
    (no mask at all, measured under the prefix-LM name); from 1024 tokens it is the 512 of the committed runs."""
    sweep = _sweep()
    for L in (128, 256, 512, 1024, 2048, 4096, 32768):
        P = sweep.prefix_keys(L)
        assert 0 < P < L and (P == 512) == (L >= 1024), (L, P)
