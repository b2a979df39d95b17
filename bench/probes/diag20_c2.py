import sys, dataclasses
import torch
from te_compile.testing import fuzz
from te_compile.cudnn import lowering
be = fuzz._prepare("cuda")
T = "def score_mod(score, b, h, q_idx, kv_idx):\n    return {}\n"
base = fuzz.Case(seed=11, B=2, H=8, HKV=8, L=128, S=128, D=16, DV=16, scale=0.3, score=T.format("torch.tanh(score)"),
                 return_lse=True)
var = {"base": {}, "no_lse": dict(return_lse=False), "scale_none": dict(scale=None), "scale_1": dict(scale=1.0),
       "H2": dict(H=2, HKV=2), "B1": dict(B=1), "L256": dict(L=256, S=256), "L129": dict(L=129, S=129),
       "softcap": dict(score=T.format("30 * torch.tanh(score / 30)")), "sigmoid": dict(score=T.format("torch.sigmoid(score)")),
       "tanh_x2": dict(score=T.format("torch.tanh(score * 2)")), "seed2": dict(seed=2), "L128S256": dict(S=256),
       "L256S128": dict(L=256)}
for name, ch in var.items():
    c = dataclasses.replace(base, **ch)
    print(name, *fuzz.compare(c, "cuda", be)[:2], flush=True)
lowering.KV_TILE = 1 << 30
lowering.lower.cache_clear()
for name in ("base", "no_lse", "softcap", "L256", "H2"):
    c = dataclasses.replace(base, **var[name])
    print("guard-always", name, *fuzz.compare(c, "cuda", be)[:2], flush=True)
