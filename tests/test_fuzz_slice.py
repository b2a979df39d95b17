"""A seeded slice of the differential fuzzer (tools.fuzz) on CPU: random score_mods /
mask_mods and PyTorch's and attention-gym's own, compiled with te_compile's reference target against
eager flex_attention / SDPA in float64. `make fuzz` runs a large slice, `make fuzz-cuda` the GPU."""

import os
import re
import subprocess
import sys

#: random cases in `make test` (the 99 peer cases come on top); two worker processes
CASES = int(os.environ.get("TE_FUZZ_CASES", "200"))


def test_fuzz_slice_has_no_wrong_answer_and_no_crash():
    cmd = [sys.executable, "-m", "tools.fuzz", "--cases", str(CASES), "--seed", "2026", "--jobs", "2"]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=1500)
    summary = [ln for ln in r.stdout.splitlines() if ln.startswith("fuzz cpu:")]
    assert summary, r.stdout[-3000:] + r.stderr[-3000:]
    m = re.search(r"(\d+) valid: (\d+) pass, (\d+) wrong, (\d+) crash", summary[-1])
    valid, passed, wrong, crash = (int(x) for x in m.groups())
    assert (wrong, crash) == (0, 0), r.stdout[-6000:]
    assert valid >= 0.9 * (CASES + 99) and passed >= 0.75 * valid, summary[-1]
    assert r.returncode == 0
