import dataclasses, json
from te_compile.testing import fuzz
be = fuzz._prepare("cuda")
T = "def score_mod(score, b, h, q_idx, kv_idx):\n    return {}\n"
base = fuzz.Case(seed=1436, B=1, H=2, HKV=2, L=200, S=64, D=64, DV=128, score=T.format("(q_idx * 1) + score"))
var = {"base": {}, "DV64": dict(DV=64), "LeqS": dict(S=200), "L64S200": dict(L=64, S=200), "L256": dict(L=256),
       "kv": dict(score=T.format("score + kv_idx")), "q01": dict(score=T.format("score + q_idx * 0.1")),
       "L129": dict(L=129), "L200S128": dict(S=128)}
for n, ch in var.items():
    print("q", n, *fuzz.compare(dataclasses.replace(base, **ch), "cuda", be)[:2], flush=True)
