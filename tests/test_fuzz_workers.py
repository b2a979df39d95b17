"""The fuzzer's --jobs runner: a worker that dies (a segfault) or ends on a poisoned CUDA context is restarted
after the case it was running, which counts as a crash; no case is lost or run twice."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import warnings

import pytest

from tools import fuzz

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
    assert not list(tmp_path.glob("fuzz-shards-*"))  # the shards' files go once their results are read


def test_results_say_when_a_served_site_ran_the_reference_fallback(monkeypatch, capsys):
    """Every call cuDNN declines counts (the warning is once per spec), and the fuzzer's result for a case says
    how many of its calls ran the reference math, so a wrong answer tells which implementation gave it."""
    import io

    from te_compile import counters
    from te_compile.runtime import kernels
    from te_compile.spec import AttentionSpec
    key = AttentionSpec(mask="causal").key()

    def compare(c, device, backend):
        if c.seed % 2:
            for _ in range(3):  # a forward and two backward calls that cuDNN declined
                kernels._warn_fallback(key, "backward", "no engine (test)")
            return "wrong", "grad0 err 1 > tol 0.01", []
        return "pass", "", []
    monkeypatch.setattr(fuzz, "compare", compare)
    monkeypatch.setattr(fuzz, "_prepare", lambda device: None)
    cases = [fuzz.Case(seed=s) for s in (2, 3)]
    before = counters.fallbacks[(key, "backward")]
    out = io.StringIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        results = fuzz.run_cases(cases, "cpu", out=out)
    assert "reference_fallback_calls" not in results[0]
    assert results[1]["reference_fallback_calls"] == 3
    assert counters.fallbacks[(key, "backward")] == before + 3
    assert "(reference fallback in 3 call(s))" in out.getvalue()
    assert fuzz.summary(results, "cpu").endswith("; 1 served case(s) ran the reference fallback at run time")
    assert "fallback" not in fuzz.summary(results[:1], "cpu")


def test_runtime_fallbacks_lists_sites_with_calls_and_reason():
    import te_compile
    from te_compile.runtime import kernels
    from te_compile.spec import AttentionSpec
    key = AttentionSpec(mask="causal", scale=0.2).key()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for why in ("no engine (first)", "no engine (last)"):
            kernels._warn_fallback(key, "forward", why)
    (row,) = [r for r in te_compile.runtime_fallbacks() if r["spec"] == key]
    assert row["direction"] == "forward" and row["calls"] == 2 and row["reason"] == "no engine (last)"
    assert row["site"] == AttentionSpec.from_key(key).describe()


def test_runs_at_different_seeds_draw_disjoint_cases():
    """Case seeds were seed + i, so runs at seeds 2 apart shared all but two cases. Now each run's seeds are
    its own range; seed 0 keeps the case seeds 0 .. n-1 (the peers follow at PEER_OFFSET)."""
    a = {c.seed for c in fuzz.cases_for(50, 9107, "cpu", True)}
    b = {c.seed for c in fuzz.cases_for(50, 9109, "cpu", True)}
    c = {c.seed for c in fuzz.cases_for(50, 9108, "cpu", True)}
    assert not (a & b) and not (a & c) and not (b & c)
    assert [x.seed for x in fuzz.cases_for(3, 0, "cpu", False)] == [0, 1, 2]
    assert fuzz.cases_for(1, 0, "cpu", True)[1].seed == fuzz.PEER_OFFSET
    with pytest.raises(ValueError):
        fuzz.cases_for(fuzz.MAX_CASES + 1, 0, "cpu", False)


def test_each_result_records_its_errors_and_tolerances(tmp_path):
    """The JSON-lines record of a case keeps each compared tensor's error, tolerance and eager's own low-precision
    error (what a fixed tolerance per dtype is read from); a passing case is within every tolerance."""
    import io
    sink = tmp_path / "r.jsonl"
    fuzz.run_cases(fuzz.cases_for(6, 7, "cpu", peers=False), "cpu", out=io.StringIO(), sink=str(sink))
    records = [json.loads(line) for line in sink.read_text().splitlines()]
    passed = [r for r in records if r["outcome"] == "pass"]
    assert passed, [r["outcome"] for r in records]
    for r in passed:
        assert {"out", "lse"} <= set(r["errors"]), r["errors"]
        assert all(err <= tol for err, tol, *_ in r["errors"].values()), r["errors"]


# a stand-in worker that reports a wrong case, then hangs (a run that a timeout stops)
HANGING = r"""
import json, sys, time
path = sys.argv[1]
with open(path, "a") as f:
    f.write(json.dumps({"outcome": "wrong", "case": "0", "detail": "out err 1 > tol 0.01"}) + "\n")
print("--- WRONG: case 0: out err 1 > tol 0.01", flush=True)
time.sleep(600)
"""


def test_a_stopped_run_keeps_and_prints_what_its_workers_finished(monkeypatch, tmp_path, capsys):
    """A run stopped from outside (a timeout's SIGTERM) stops its workers, prints their reports of wrong cases
    and returns the cases that finished, instead of ending with nothing."""
    cases = fuzz.cases_for(4, 5, "cpu", False)[:4]
    procs = []

    def start(a, i, resume, path):
        log = open(f"{path}.{resume}.out", "w")
        proc = subprocess.Popen([sys.executable, "-c", HANGING, path], stdout=log)
        proc.log = log
        procs.append(proc)
        return proc

    waited, real_sleep = [], fuzz.time.sleep

    def sleep(s):  # the supervisor's poll: the stop comes once both workers wrote their case
        waited.append(s)
        if len(waited) > 600:
            raise AssertionError("the workers never wrote")
        if sum(fuzz._count_lines(p) for p in tmp_path.glob("fuzz-shards-*/shard*.jsonl")) == 2:
            raise fuzz._Stop()
        real_sleep(0.05)

    monkeypatch.setattr(fuzz, "_start_worker", start)
    monkeypatch.setattr(fuzz.time, "sleep", sleep)
    a = argparse.Namespace(jobs=2, json=str(tmp_path / "f.jsonl"), seed=5, device="cpu", cases=4, no_peers=True, emit=[])
    results = fuzz._parallel(a, cases)
    assert [r["outcome"] for r in results] == ["wrong", "wrong"]
    assert all(p.poll() is not None for p in procs)  # no worker left running
    captured = capsys.readouterr()
    assert captured.out.count("--- WRONG: case 0") == 2
    assert "stopped before the end" in captured.err
    assert not list(tmp_path.glob("fuzz-shards-*"))


def test_a_wrong_case_is_named_on_stderr_when_it_happens(monkeypatch, capsys):
    import io
    monkeypatch.setattr(fuzz, "compare", lambda c, device, backend: ("wrong", "out err 1 > tol 0.01", []))
    monkeypatch.setattr(fuzz, "_prepare", lambda device: None)
    c = fuzz.cases_for(1, 3, "cpu", False)[0]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        fuzz.run_cases([c], "cpu", out=io.StringIO(), tag="shard 1/4: ")
    err = capsys.readouterr().err
    assert f"fuzz shard 1/4: WRONG: {c.describe()}: out err 1 > tol 0.01" in err
    import shlex
    rerun = shlex.split(err.split("rerun it alone: ")[1])
    assert rerun[:6] == ["python", "-m", "tools.fuzz", "--device", "cpu", "--case"]
    assert fuzz.Case.from_json(rerun[6]) == c


def test_bfloat16_tolerances_are_capped_and_ill_conditioned_tensors_not_judged(monkeypatch):
    """In bfloat16 a tolerance never exceeds BF16_CAP: a tensor eager itself gets that wrong in bfloat16 is not
    judged (and said so), while a wrong value in a tensor that is judged still fails the case."""
    import types

    import torch
    monkeypatch.setattr(fuzz, "CPU_LOW", torch.bfloat16)
    monkeypatch.setattr(fuzz, "_emission_crash", lambda c, decisions: None)
    ones = torch.ones(8, dtype=torch.float64)
    noisy = ones.clone()
    noisy[0] = 1.5  # off by 0.5 relative to the largest value
    compiled = {"grad0": noisy}

    def run(c, device, dtype, compiled_with=None):
        site = types.SimpleNamespace(decisions=[types.SimpleNamespace(rewrite=True, reason="")])
        if compiled_with is None and dtype == torch.float32:  # eager's reference
            return {"out": ones, "lse": ones, "grads": [ones], "reports": []}
        if compiled_with is None:  # eager in bfloat16: its own out is off by 0.5 (ill-conditioned), the rest exact
            return {"out": noisy, "lse": ones, "grads": [ones], "reports": []}
        return {"out": noisy, "lse": ones, "grads": [compiled.get("grad0", ones)], "reports": [site]}
    monkeypatch.setattr(fuzz, "run", run)
    c = fuzz.cases_for(1, 4, "cpu", False)[0]
    c.autocast = False
    outcome, detail, _ = fuzz.compare(c, "cpu", "te_compile")
    assert outcome == "wrong" and detail == "grad0 err 0.5 > tol 0.01", detail  # judged: fails at its tolerance
    assert fuzz.last_errors["out"][1] > fuzz.BF16_CAP  # out's tolerance would have been 1.5: not judged
    # the distance from eager's bfloat16 result is kept too: out is eager bfloat16's exactly, grad0 off by 0.5
    assert fuzz.last_errors["out"][3] == 0.0 and fuzz.last_errors["grad0"][3] == 0.5, fuzz.last_errors
    compiled.clear()
    outcome, detail, _ = fuzz.compare(c, "cpu", "te_compile")
    assert outcome == "pass" and detail == fuzz.NOT_JUDGED + "out", detail
    assert fuzz.summary([{"outcome": outcome, "detail": detail}], "cpu").endswith(
        "; 1 case(s) with tensors too ill-conditioned in bfloat16 to judge there")
