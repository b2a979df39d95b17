"""Which emission avoids the illegal memory access of cuDNN 9.27 / 9.28 on emitted score_mods (GPU)?

Each case of diag28_cases.jsonl (crashes of the fuzzer on 9.27 and 9.28, and ``score * score``) runs in its own
process (a sticky CUDA error poisons the context) with ``EmitOptions.score_identity`` off (0) and on (1), several
processes at once; prints a case x variant table of outcomes. (Run 2026-11-27 with a wider option, since removed:
"all", a fresh identity for every later use of any float value, fixed the same cases as the one identity on the
raw score.)

    LD_PRELOAD=$CUDNN_NEW TE_COMPILE_UNCHECKED_CUDNN=serve python3 bench/probes/diag28.py [--jobs 6] [NAME ...]
"""
import argparse
import concurrent.futures as cf
import json
import os
import subprocess
import sys

here = os.path.dirname(os.path.abspath(__file__))
VARIANTS = ["0", "1"]


def run(case: dict, variant: str) -> str:
    cmd = [sys.executable, "-m", "te_compile.testing.fuzz", "--device", "cuda", "--case", json.dumps(case), "-v",
           "--emit", f"score_identity={variant}"]
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=240)
    except subprocess.TimeoutExpired:
        return "timeout"
    text = p.stdout + p.stderr
    if "illegal memory access" in text:
        return "CRASH"
    for line in text.splitlines():
        if line.startswith(("pass", "kept", "invalid", "WRONG", "wrong", "--- ")):
            return line.split(":")[0].split()[0 if not line.startswith("---") else 1][:12]
    return f"rc{p.returncode}"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("names", nargs="*")
    ap.add_argument("--jobs", type=int, default=6)
    a = ap.parse_args()
    rows = [json.loads(l) for l in open(os.path.join(here, "diag28_cases.jsonl"))]
    rows = [r for r in rows if not a.names or any(r["name"].startswith(n) for n in a.names)]
    with cf.ThreadPoolExecutor(a.jobs) as ex:
        futs = {(r["name"], v): ex.submit(run, r["case"], v) for r in rows for v in VARIANTS}
        print(f"{'case':16s}" + "".join(f"{'score_identity=' + v:>18s}" for v in VARIANTS), flush=True)
        for r in rows:
            print(f"{r['name']:16s}" + "".join(f"{futs[(r['name'], v)].result():>18s}" for v in VARIANTS), flush=True)


if __name__ == "__main__":
    main()
