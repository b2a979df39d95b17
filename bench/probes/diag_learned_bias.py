"""Replay the learned [L]+[S] bias case at data seeds and say, per seed, the outcome and whether any call ran the
reference fallback (GPU; the cuDNN that is loaded).  python3 bench/probes/diag_learned_bias.py [N]"""
import json
import sys

import te_compile
from te_compile.testing import fuzz

case = json.load(open("bench/probes/diag_learned_bias_case.json"))
backend = fuzz._prepare("cuda")
for i in range(int(sys.argv[1]) if len(sys.argv) > 1 else 4):
    before = sum(r["calls"] for r in te_compile.runtime_fallbacks())
    c = fuzz.Case.from_json(json.dumps(dict(case, seed=case["seed"] + i)))
    outcome, detail, decisions = fuzz.compare(c, "cuda", backend)
    after = sum(r["calls"] for r in te_compile.runtime_fallbacks())
    print(f"seed {c.seed}: {outcome} served={[d.rewrite for d in decisions]} fallback calls {after - before}: {detail}",
          flush=True)
for r in te_compile.runtime_fallbacks():
    print("FALLBACK", r["direction"], r["calls"], r["reason"][:300])
