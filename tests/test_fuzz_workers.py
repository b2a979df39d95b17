"""The fuzzer's --jobs runner: a worker that dies (a segfault) or ends on a poisoned CUDA context is restarted
after the case it was running, which counts as a crash; no case is lost or run twice."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys

from te_compile.testing import fuzz

# a stand-in worker: writes one result per case from `resume`; dies by SIGSEGV on case 1 of its first start,
# and exits POISONED after writing case 3 (a crash it recorded itself)
WORKER = r"""
import json, os, signal, sys
path, resume, n = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
for i in range(resume, n):
    if i == 1 and resume == 0:
        os.kill(os.getpid(), signal.SIGSEGV)
    out = "crash" if i == 3 else "pass"
    with open(path, "a") as f:
        f.write(json.dumps({"outcome": out, "case": str(i), "detail": ""}) + "\n")
    if i == 3:
        sys.exit(%d)
""" % fuzz.POISONED


def test_parallel_restarts_dead_and_poisoned_workers(monkeypatch, tmp_path):
    cases = fuzz.cases_for(5, 5, "cpu", False)[:5]
    assert len(cases) == 5
    starts = []

    def start(a, i, resume, path):
        starts.append((i, resume))
        n = len(cases[i::a.jobs])
        log = open(f"{path}.{resume}.out", "w")
        proc = subprocess.Popen([sys.executable, "-c", WORKER, path, str(resume), str(n)], stdout=log)
        proc.log = log
        return proc

    monkeypatch.setattr(fuzz, "_start_worker", start)
    a = argparse.Namespace(jobs=1, json=str(tmp_path / "f.jsonl"), seed=5, device="cpu", cases=3, no_peers=True, emit=[])
    results = fuzz._parallel(a, cases)
    assert [r["outcome"] for r in results] == ["pass", "crash", "pass", "crash", "pass"]
    assert "worker died" in results[1]["detail"] and json.loads(results[1]["case"]) == json.loads(cases[1].to_json())
    assert starts == [(0, 0), (0, 2), (0, 4)]
