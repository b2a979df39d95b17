"""`make demo` on a fresh CPU venv prints one short site report and no warnings."""

import logging
import os
import re
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _demo_output() -> tuple[int, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("TORCH_LOGS", "PYTHONWARNINGS")}
    env["PYTHONPATH"] = ROOT + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    p = subprocess.run([sys.executable, "-m", "te_compile", "demo", "--device", "cpu"], cwd=ROOT, env=env,
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=300)
    return p.returncode, p.stdout


def test_demo_prints_one_report_and_no_warnings():
    rc, out = _demo_output()
    assert rc == 0, out
    headers = re.findall(r"^te_compile: \d+ attention site\(s\)", out, flags=re.M)
    assert len(headers) == 1, out
    assert "Failed to initialize NumPy" not in out, out
    assert not [ln for ln in out.splitlines() if "Warning" in ln], out
    # no per-site INFO log lines ("te_compile: a -> reference (...)") next to the table
    assert not re.search(r"^te_compile: \S+ (->|kept:)", out, flags=re.M), out
    assert "max rel. error vs eager float32" in out
    assert len(out.splitlines()) < 15, out
    assert max(len(ln) for ln in out.splitlines()) <= 160, out  # fits a terminal


def test_demo_restores_the_log_level():
    from te_compile.cli.demo import _quiet_site_logs

    log = logging.getLogger("te_compile")
    old = log.level
    try:
        log.setLevel(logging.INFO)
        with _quiet_site_logs():
            assert not log.isEnabledFor(logging.INFO) or "te_compile" in os.environ.get("TORCH_LOGS", "")
        assert log.level == logging.INFO
    finally:
        log.setLevel(old)
