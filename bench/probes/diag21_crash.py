"""cuDNN 9.27 illegal memory access: one variant per process (the error poisons the CUDA context).

    python3 bench/probes/diag21_crash.py VARIANT      (LD_PRELOAD=$CUDNN_NEW for 9.27)
"""
import dataclasses, sys, os
import torch
from te_compile.testing import fuzz
from te_compile.cudnn import graphs
import cudnn
T = "def score_mod(score, b, h, q_idx, kv_idx):\n    return {}\n"
M = "def mask_mod(b, h, q_idx, kv_idx):\n    return {}\n"
ss = fuzz.Case(seed=7, B=2, H=4, HKV=4, L=512, S=512, D=32, DV=32, score=T.format("score * score"))
cap = fuzz.Case(seed=8, B=2, H=4, HKV=4, L=256, S=256, D=64, DV=64,
                score=T.format("torch.tanh(torch.exp2(score * 0.125)) * 8"))
band = fuzz.Case(seed=9, B=2, H=4, HKV=2, L=300, S=300, D=64, DV=64,
                 score=T.format("torch.exp2(torch.rsqrt(1 + score * score) * 0.25)"),
                 mask=M.format("(q_idx >= kv_idx) & (q_idx - kv_idx < 114)"))
V = {
    "ss": (ss, {}), "ss_fwd": (ss, dict(no_grad=True)), "ss_D64": (ss, dict(D=64, DV=64)),
    "ss_L256": (ss, dict(L=256, S=256)), "ss_L128": (ss, dict(L=128, S=128)), "ss_B1H1": (ss, dict(B=1, H=1, HKV=1)),
    "ss_plus": (ss, dict(score=T.format("score + score"))), "ss_ident": (ss, dict(score=T.format("score"))),
    "ss_x2": (ss, dict(score=T.format("score * 2.0"))), "ss_sq": (ss, dict(score=T.format("torch.square(score)"))),
    "ss_noraw": (ss, {}), "ss_bigws": (ss, {}), "ss_lse": (ss, dict(return_lse=True)),
    "cap": (cap, {}), "cap_fwd": (cap, dict(no_grad=True)), "band": (band, {}), "band_fwd": (band, dict(no_grad=True)),
}
name = sys.argv[1]
base, ch = V[name]
c = dataclasses.replace(base, **ch)
if name.endswith("_noraw"):
    graphs.RAW_EXECUTE = False
if name.endswith("_bigws"):
    _ws = graphs.new_workspace
    graphs.new_workspace = lambda n, d: _ws(4 * n + (256 << 20), d)
be = fuzz._prepare("cuda")
print(f"{name}: cuDNN {cudnn.backend_version()} torch-cudnn {torch.backends.cudnn.version()} {c.describe()}", flush=True)
try:
    out = fuzz.compare(c, "cuda", be)
    torch.cuda.synchronize()
    print(f"{name}: {out[0]} {out[1][:300]}", flush=True)
except Exception as e:
    print(f"{name}: raised {type(e).__name__}: {str(e).splitlines()[0][:300]}", flush=True)
