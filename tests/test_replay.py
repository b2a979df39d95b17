"""Replaying the cost model's decisions on measured sweep rows (te_compile.cudnn.replay, ``te-compile calibrate
--check``): verdicts against the measured times, and what a sweep row stands for (te_compile.cudnn.sweep_rows)."""

from __future__ import annotations

import glob
import json
import os

import pytest
import torch
from torch.nn.attention.flex_attention import create_block_mask, flex_attention

import te_compile
from te_compile.cudnn import calibration, cost, refit, replay, sweep_rows
from te_compile.cudnn.calibration import Calibration

H100 = "NVIDIA H100 80GB HBM3"
HERE = os.path.dirname(__file__)
DATA = os.path.join(HERE, "..", "docs", "data")
NO_HOST = {"te_compile": {"train": 0.0, "infer": 0.0}, "torch.compile": {"train": 0.0, "infer": 0.0}}


def _row(case, always_ms, tc_ms, aa=1.0, shape=(2, 16, 4096, 128, 16)):
    return {"case": case, "shape": list(shape), "always": {"ms": always_ms}, "torch.compile": {"ms": tc_ms},
            "control_aa": [aa, aa]}


@pytest.mark.parametrize("ratio,always_ms,tc_ms,aa,verdict", [
    (2.0, 1.0, 1.5, 1.0, "agree"),                  # served, measured faster
    (0.5, 1.5, 1.0, 1.0, "agree"),                  # kept, measured slower
    (2.0, 1.5, 1.0, 1.0, "serves a slower site"),
    (0.5, 1.0, 1.5, 1.0, "keeps a faster site"),
    (2.0, 1.02, 1.0, 1.0, "within noise"),          # 2% apart: under the 3% floor
    (2.0, 1.08, 1.0, 0.9, "within noise"),          # 8% apart, but the A/A column moved 10%
])
def test_each_row_gets_the_verdict_its_measurement_gives(ratio, always_ms, tc_ms, aa, verdict):
    cal = Calibration(H100, 91900, 500.0, NO_HOST, {"flex score_mod": ratio})
    got = replay.check_row(cal, _row("flex softcap", always_ms, tc_ms, aa))
    assert got["verdict"] == verdict and got["serves"] is (ratio > 1)
    assert got["model"][1] == pytest.approx(got["model"][0] * ratio)


def test_rows_that_cannot_be_replayed_are_skipped_and_the_summary_counts_the_rest():
    cal = Calibration(H100, 91900, 500.0, NO_HOST, {"flex score_mod": 2.0})
    rows = [_row("flex softcap", 1.0, 2.0), _row("flex document", 1.0, 1.0),  # no class
            {"case": "flex softcap", "shape": [2, 16, 4096, 128], "torch.compile": {"ms": 1.0}}]  # no always column
    checks, lines = replay.check(cal, [{"rows": rows}])
    assert len(checks) == 1 and lines[-1].endswith(
        "1 rows: 1 agree, 0 within noise, 0 serves a slower site, 0 keeps a faster site")


def _spec(mask, L):
    torch._dynamo.reset()
    bm = create_block_mask(mask, 1, 1, L, L, device="cpu")
    q = torch.randn(1, 2, L, 16)
    rep = te_compile.explain(lambda q, k, v: flex_attention(q, k, v, block_mask=bm), q, q, q, target="reference")
    (d,) = rep.decisions
    return d.spec


@pytest.mark.parametrize("case,mask", [
    ("flex causal", lambda b, h, q, kv: q >= kv),
    ("flex sliding <=", lambda b, h, q, kv: (q >= kv) & (q - kv <= sweep_rows.WINDOW)),
    ("flex sliding <", lambda b, h, q, kv: (q >= kv) & (q - kv < sweep_rows.WINDOW)),
    ("flex prefix-LM", lambda b, h, q, kv: (kv < sweep_rows.PREFIX) | (q >= kv)),
])
def test_a_sweep_case_computes_the_share_the_cost_model_gives_its_mask(case, mask):
    L = 2048
    cls, dens = cost.site_class(_spec(mask, L), None, False, L, L, 2)
    assert cls == sweep_rows.CASE_CLASS[case]
    assert dens == pytest.approx(sweep_rows.density(case, L, L), rel=1e-3)


def _h100_files(version="919"):
    paths = sorted(p for p in glob.glob(os.path.join(DATA, f"tuned-flex-h100-{version}-*.json")) if "cached" not in p)
    assert paths, "the H100 sweeps the shipped calibration was fitted on"
    return paths, [json.load(open(p)) for p in paths]


def test_the_shipped_h100_calibration_serves_no_site_its_measurements_found_slower():
    """The H100 refit (te_compile/cudnn/calibrations) replayed on the sweeps it was fitted on, on each of them under
    a refit from the others (out of sample), and on the H100 sweeps at cuDNN 9.27 it was not fitted on."""
    shipped = [c for c in calibration.load() if c.gpu == H100 and c.cudnn == 91900]
    assert len(shipped) == 1
    paths, files = _h100_files()
    checks, _ = replay.check(shipped[0], files)
    assert len(checks) >= 30 and not [c for c in checks if c["verdict"] == "serves a slower site"]
    held = refit.holdout(files, [os.path.basename(p) for p in paths])
    assert "serves a slower site" not in held[-1] and "agree" in held[-1]
    checks, _ = replay.check(shipped[0], _h100_files("927")[1])
    assert checks and not [c for c in checks if c["verdict"] == "serves a slower site"]
    # and it is no worse than the built-in table, which it replaces on this GPU
    agree = sum(c["verdict"] == "agree" for c in replay.check(shipped[0], files)[0])
    assert agree >= sum(c["verdict"] == "agree" for c in replay.check(cost.BUILTIN, files)[0])


def test_cli_check_prints_the_replay_of_each_calibration(tmp_path, capsys):
    from te_compile.__main__ import main
    src = tmp_path / "sweep.json"
    rows = [{**_row("flex softcap", 1.0, 2.0), "served": 1, "te_compile": {"ms": 1.0},
             "class": "flex score_mod"}]
    src.write_text(json.dumps({"device": H100, "cudnn": 91900, "rows": rows}))
    other = tmp_path / "other.json"
    other.write_text(json.dumps(Calibration(H100, 91900, 500.0, NO_HOST, {"flex score_mod": 0.5}).to_json()))
    assert main(["calibrate", str(src), "--check", "--with", str(other), "--holdout"]) == 0
    out = capsys.readouterr().out
    assert "== deciding now (fitted on this GPU and cuDNN)" in out and "== this refit" in out
    assert f"== {other}" in out and "1 keeps a faster site" in out
    assert "held out: no rows" in out  # one file: nothing to fit the others on


def _groups() -> dict:
    """Every training-step sweep in docs/data with a cuDNN and a torch.compile column, by (GPU, cuDNN version)
    (CUDA-graph runs, which the replay decides without, and second-process runs left out)."""
    import collections
    import glob
    out = collections.defaultdict(list)
    for path in sorted(glob.glob(os.path.join(DATA, "*.json"))):
        with open(path) as f:
            d = json.load(f)
        if not isinstance(d, dict) or "device" not in d or d.get("mode") or "cached" in path or "second" in path:
            continue
        if any(isinstance(r, dict) and "torch.compile" in r for r in d.get("rows", [])):
            out[(d["device"], d.get("cudnn") or 91900)].append(d)
    return out


def test_what_decides_on_each_measured_gpu_and_version_does_no_worse_than_the_builtin_table():
    """Every sweep in docs/data, by GPU and cuDNN version: the calibration chosen there agrees with the measured
    winner at least as often as the built-in table, and serves no site measured slower (the H200 9.19 group holds
    two ALiBi + causal rows from before cuDNN's native ALiBi, which the replay reads as the native class)."""
    groups = _groups()
    assert len(groups) >= 5
    for (gpu, version), files in groups.items():
        now, _ = calibration.choose(calibration.load(), gpu, version, cost.BUILTIN, "sm90")
        mine, base = replay.check(now, files)[0], replay.check(cost.BUILTIN, files)[0]
        agree = lambda checks: sum(c["verdict"] == "agree" for c in checks)  # noqa: E731
        assert agree(mine) >= agree(base), (gpu, version)
        slower = [c for c in mine if c["verdict"] == "serves a slower site"]
        assert all(c["case"] == "flex ALiBi + causal" for c in slower) and (not slower or version == 91900), slower
