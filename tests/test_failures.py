"""One convention for failures: a usage error (an option or value a command does not take, an environment variable
te_compile does not accept) exits 2 with one line; a failure while running exits 1 with one line (``--traceback``:
the whole trace too); an interrupted run exits non-zero."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys

import pytest

from te_compile import env

from te_compile.cli import demo
from te_compile.__main__ import main

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _python(code: str, **extra_env: str) -> subprocess.CompletedProcess:
    environ = {k: v for k, v in os.environ.items() if not k.startswith("TE_COMPILE_") and k != "TORCH_LOGS"}
    environ.update(PYTHONPATH=ROOT, **extra_env)
    return subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=environ, capture_output=True, text=True,
                          timeout=300)


def test_a_bad_environment_variable_does_not_break_import():
    r = _python("import te_compile; print(te_compile.backend().options.serve)", TE_COMPILE_SERVE="sometimes")
    assert r.returncode == 0 and r.stdout.strip() == "fastest", r.stderr[-2000:]
    assert r.stderr.strip().splitlines() == [
        "te_compile: TE_COMPILE_SERVE='sometimes' is not valid: expected 'fastest', 'always' (te_compile uses "
        "'fastest', as when unset)"], r.stderr


@pytest.mark.parametrize("name,value", [("TE_COMPILE_SERVE", "sometimes"), ("TE_COMPILE_NATIVE", "yes")])
def test_the_command_line_stops_on_a_bad_environment_variable(name, value):
    r = _python("import sys; from te_compile.__main__ import main; sys.exit(main(['demo']))", **{name: value})
    assert r.returncode == 2, r.stderr
    (line,) = r.stderr.strip().splitlines()
    assert f"{name}={value!r} is not valid" in line and "Traceback" not in line


def test_every_variable_te_compile_reads_is_in_the_table():
    import glob
    import re
    read = set()
    for path in glob.glob(os.path.join(ROOT, "te_compile", "**", "*.py"), recursive=True):
        with open(path) as f:
            read |= set(re.findall(r"\b(TE_COMPILE_[A-Z_]+)\b", f.read()))
    assert read - {"TE_COMPILE_NATIVE_DEBUG"} <= set(env.VARIABLES), read - set(env.VARIABLES)


@pytest.mark.parametrize("argv,says", [
    (["demo", "--device", "tpu"], "argument --device: 'tpu': the demo runs on cpu or cuda"),
    (["demo", "--seq", "0"], "argument --seq: '0': expected a whole number of at least 1"),
    (["demo", "--batch", "-2"], "argument --batch: '-2': expected a whole number of at least 1"),
    (["explain", "te_compile.cli.demo:example", "--train", "--infer"], "not allowed with argument"),
])
def test_usage_errors_exit_2_with_one_line(argv, says, capsys):
    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert says in line and line.startswith(f"te-compile {argv[0]}: "), line


def test_a_failure_while_running_exits_1_with_one_line(monkeypatch, capsys):
    def broken(argv):
        raise RuntimeError("something inside failed\nsecond line")
    monkeypatch.setattr(demo, "_main", broken)
    assert main(["demo"]) == 1
    assert capsys.readouterr().err.strip().splitlines() == [
        "te-compile demo: RuntimeError: something inside failed (--traceback shows where)"]
    assert main(["demo", "--traceback"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("Traceback") and err.strip().splitlines()[-1] == \
        "te-compile demo: RuntimeError: something inside failed"


def test_an_interrupted_command_exits_non_zero(monkeypatch, capsys):
    def interrupted(argv):
        raise KeyboardInterrupt
    monkeypatch.setattr(demo, "_main", interrupted)
    assert main(["demo"]) == 130
    assert capsys.readouterr().err.strip().splitlines() == ["te-compile demo: interrupted"]


def test_an_interrupted_fuzz_run_exits_non_zero(monkeypatch, tmp_path):
    from tools import fuzz

    class Done:
        log = open(os.devnull, "w")

        def terminate(self):
            pass

        def wait(self):
            return 0

    def start(a, i, resume, path):
        proc = Done()
        proc.log = open(f"{path}.{resume}.out", "w")
        return proc

    def supervise(a, shards, live):
        raise KeyboardInterrupt  # Ctrl-C (make fuzz interrupted)
    monkeypatch.setattr(fuzz, "_start_worker", start)
    monkeypatch.setattr(fuzz, "_supervise", supervise)
    rc = fuzz.main(["--cases", "4", "--no-peers", "--jobs", "2", "--json", str(tmp_path / "f.jsonl")])
    assert rc == fuzz.INTERRUPTED != 0


def test_an_uninterrupted_fuzz_run_still_exits_0(monkeypatch, tmp_path):
    from tools import fuzz
    monkeypatch.setattr(fuzz, "_parallel", lambda a, cases: [])
    assert fuzz.main(["--cases", "0", "--no-peers", "--jobs", "2"]) == 0


def test_demo_parser_takes_cuda_devices():
    p = demo.parser()
    assert p.parse_args(["--device", "cuda:1", "--seq", "16"]).seq == 16
    with pytest.raises(argparse.ArgumentTypeError):
        demo._device("meta")
