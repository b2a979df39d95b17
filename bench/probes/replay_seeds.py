"""Replay one fuzzer case at several data seeds and print each outcome (GPU; the cuDNN that is loaded).

    python3 bench/probes/replay_seeds.py CASE.json [N]
"""
import json
import sys

from te_compile.testing import fuzz

case = json.load(open(sys.argv[1]))
for i in range(int(sys.argv[2]) if len(sys.argv) > 2 else 8):
    c = dict(case, seed=case["seed"] + i)
    fuzz.main(["--device", "cuda", "--case", json.dumps(c), "-v"])
