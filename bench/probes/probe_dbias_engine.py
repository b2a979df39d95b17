"""Which bias / dBias backward graphs cuDNN builds a plan for (GPU; the cuDNN that is loaded): the compile-time
check (te_compile.cudnn.check, which builds plans on the GPU) over lengths, masks and dBias.

    python3 bench/probes/probe_dbias_engine.py
"""
import torch

import cudnn
from te_compile.cudnn.check import check
from te_compile.spec import AttentionSpec

print(torch.__version__, "cudnn", cudnn.backend_version(), torch.cuda.get_device_name(), flush=True)
masks = {"none": AttentionSpec(source="flex", scale=0.125),
         "causal": AttentionSpec(source="flex", scale=0.125, mask_mod="(ge q_idx kv_idx)"),
         "sdpa-causal": AttentionSpec(mask="causal", scale=0.125)}
for L, S in [(129, 300), (128, 300), (129, 256), (256, 300), (129, 129), (300, 300), (128, 256), (300, 129),
             (1024, 1024), (1000, 1024), (1024, 1000)]:
    q = torch.empty(2, 4, L, 64, device="cuda", dtype=torch.bfloat16)
    k, v = (torch.empty(2, 4, S, 64, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    for bshape in [(1, 1, L, S), (1, 4, L, S)]:
        bias = torch.empty(bshape, device="cuda", dtype=torch.bfloat16)
        row = []
        for name, spec in masks.items():
            for dbias in (False, True):
                why = check(q, k, v, bias, spec, True, dbias)
                row.append(f"{name}{'+dB' if dbias else ''}:{'ok' if why is None else 'NO'}")
        print(f"L {L:5d} S {S:5d} bias {bshape[:2]}: " + "  ".join(row), flush=True)
