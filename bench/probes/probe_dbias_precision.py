"""How precise cuDNN's dBias is, and whether a float32 dBias output builds (GPU; the cuDNN that is loaded).

Part 1: one cuDNN backward (bias [1,1,L,S] bf16, B 2, H 4, causal) with dBias declared HALF-family (the io type)
and FLOAT; each against a float64 reference, max error relative to the reference's largest value; then the
[S] table gradient (dBias summed over L in float32) the same way.
Part 2: the learned [L]+[S] fuzz case over data seeds at S 300 (keys padded) and S 304 (not padded).

    python3 bench/probes/probe_dbias_precision.py [SEEDS]
"""
import json
import sys

import torch

import cudnn

print(torch.__version__, "cudnn", cudnn.backend_version(), torch.cuda.get_device_name(), flush=True)
F32, BF = cudnn.data_type.FLOAT, cudnn.data_type.BFLOAT16


def part1(L, S, dbias_type):
    torch.manual_seed(0)
    B, H, D = 2, 4, 64
    q, k, v, do = (torch.randn(B, H, n, D, device="cuda", dtype=torch.bfloat16) for n in (L, S, S, L))
    bias = torch.randn(1, 1, L, S, device="cuda").to(torch.bfloat16)
    scale = D ** -0.5
    mask = torch.arange(L, device="cuda")[:, None] >= torch.arange(S, device="cuda")[None, :]
    b64 = bias.double().requires_grad_()
    s = (q.double() @ k.double().transpose(-1, -2)) * scale + b64
    s = s.masked_fill(~mask, float("-inf"))
    p = s.softmax(-1)
    o64 = p @ v.double()
    o64.backward(do.double())
    lse = torch.logsumexp(s, -1, keepdim=True).float().contiguous()
    o = o64.to(torch.bfloat16).contiguous()
    h = cudnn.create_handle()
    g = cudnn.pygraph(io_data_type=BF, intermediate_data_type=F32, compute_data_type=F32, handle=h)
    T = lambda name, t, dt=BF: g.tensor(name=name, dim=list(t.shape), stride=list(t.stride()), data_type=dt)
    tq, tk, tv, to, tdo = T("q", q), T("k", k), T("v", v), T("o", o), T("dO", do)
    tst, tb = T("stats", lse, F32), T("bias", bias)
    db = torch.empty(1, 1, L, S, device="cuda", dtype=torch.float32 if dbias_type == "float" else torch.bfloat16)
    tdb = T("dBias", db, F32 if dbias_type == "float" else BF)
    dq, dk, dv = g.sdpa_backward(q=tq, k=tk, v=tv, o=to, dO=tdo, stats=tst, attn_scale=scale, bias=tb, dBias=tdb,
                                 diagonal_band_right_bound=0, diagonal_alignment=cudnn.diagonal_alignment.TOP_LEFT,
                                 name="bwd")
    outs = {}
    for t, ref, n in ((dq, q, "dq"), (dk, k, "dk"), (dv, v, "dv")):
        t.set_output(True).set_dim(list(ref.shape)).set_stride(list(ref.stride())).set_data_type(BF)
        outs[n] = (t, torch.empty_like(ref))
    try:
        g.validate(); g.build_operation_graph(); g.create_execution_plans([cudnn.heur_mode.A, cudnn.heur_mode.FALLBACK])
        g.check_support(); g.build_plans()
    except Exception as e:  # noqa: BLE001
        return f"no plan: {str(e)[:120]}"
    ws = torch.empty(g.get_workspace_size(), device="cuda", dtype=torch.uint8)
    pack = {tq: q, tk: k, tv: v, to: o, tdo: do, tst: lse, tb: bias, tdb: db}
    pack.update({t: buf for t, buf in outs.values()})
    g.execute(pack, ws, handle=h)
    torch.cuda.synchronize()
    ref = b64.grad
    e = lambda a, r: float((a.double() - r).abs().max() / r.abs().max().clamp_min(1e-30))
    col, colr = db.float().sum(2), ref.sum(2)
    return (f"dBias rel err {e(db, ref):.2e}  [S]-table grad rel err {e(col, colr):.2e} (abs {float((col.double() - colr).abs().max()):.2e}, "
            f"max {float(colr.abs().max()):.2e})")


for L, S in [(129, 304), (256, 256), (1024, 1024)]:
    for t in ("io", "float"):
        try:
            r = part1(L, S, t)
        except Exception as ex:  # noqa: BLE001
            r = f"raised {type(ex).__name__}: {str(ex)[:150]}"
        print(f"part1 L {L} S {S} dBias {t}: {r}", flush=True)

import te_compile  # noqa: E402
from te_compile.testing import fuzz  # noqa: E402

case = json.load(open("bench/probes/diag_learned_bias_case.json"))
backend = fuzz._prepare("cuda")
n = int(sys.argv[1]) if len(sys.argv) > 1 else 8
for S in (300, 304):
    tally = {}
    for i in range(n):
        before = sum(r["calls"] for r in te_compile.runtime_fallbacks())
        c = fuzz.Case.from_json(json.dumps(dict(case, S=S, seed=case["seed"] + i)))
        outcome, detail, decisions = fuzz.compare(c, "cuda", backend)
        fb = sum(r["calls"] for r in te_compile.runtime_fallbacks()) - before
        tally[outcome] = tally.get(outcome, 0) + 1
        print(f"part2 S {S} seed {c.seed}: {outcome} served={[d.rewrite for d in decisions]} fallback {fb} {detail}",
              flush=True)
    print(f"part2 S {S}: {tally}", flush=True)
