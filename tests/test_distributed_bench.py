"""bench/distributed.py on the CPU: two processes (gloo), 2-way tensor parallelism under FSDP2, packed documents
with a new BlockMask every step; te_compile (the reference target here) trains the same first steps as
torch.compile, every column is timed, and the JSON carries what the GPU tables need."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.distributed

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_smoke_run_trains_the_same_first_steps_under_fsdp2_and_tp(tmp_path):
    out = tmp_path / "dist.json"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
           os.path.join(ROOT, "bench", "distributed.py"), "--smoke", "--tp", "2", "--attn", "flex-docs",
           "--json", str(out)]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=ROOT,
                       env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert out.exists(), f"rc {p.returncode}\n{p.stdout[-3000:]}\n{p.stderr[-5000:]}"
    row = json.loads(out.read_text())["rows"][0]
    assert (row["world"], row["tp"], row["dp"]) == (2, 2, 1)
    assert [runs_on for runs_on, _ in row["sites"]] == ["reference"], row["sites"]  # every site rewritten
    assert "key intervals" in row["sites"][0][1]
    ref = row["losses_torch.compile"]
    assert len(ref) == 2 and ref[0] != ref[1]
    for name in ("control", "te_compile"):
        assert row[f"loss_rel_diff_{name}"] < 1e-4, (name, row[f"losses_{name}"], ref)
    for name, col in row["columns"].items():
        assert len(col["rounds_ms"]) == 1 and col["step_ms"] > 0 and col["tokens_per_s_per_gpu"] > 0, (name, col)
    assert row["ratio_te_compile"] == row["columns"]["torch.compile"]["step_ms"] / row["columns"]["te_compile"]["step_ms"]
