"""Does a float32 bias input (with bf16 q / k / v and a bf16 dBias) build, and how much closer to float64 is dBias
than with the bias rounded to bf16? (GPU; the cuDNN that is loaded.)

One cuDNN backward (B 2, H 4, D 64, causal) on a float32 table T (randn * 2) as the bias, against float64 math on
the unrounded T. The lse and O handed to the backward are the float64 ones for both columns, so the bf16 column
carries the bias's rounding and, unlike a served site (whose forward used the same rounded bias), an lse that does
not match it: it overstates what a served site loses (bench/probes/probe_w2.py measures the served case). Max error relative to the reference's largest
value, for dBias and for dQ.

    python3 bench/probes/probe_bias_f32.py
"""
import torch

import cudnn

print(torch.__version__, "cudnn", cudnn.backend_version(), torch.cuda.get_device_name(), flush=True)
F32, BF = cudnn.data_type.FLOAT, cudnn.data_type.BFLOAT16


def run(L, S, bias_type):
    torch.manual_seed(0)
    B, H, D = 2, 4, 64
    q, k, v, do = (torch.randn(B, H, n, D, device="cuda", dtype=torch.bfloat16) for n in (L, S, S, L))
    table = torch.randn(1, 1, L, S, device="cuda") * 2
    bias = table.contiguous() if bias_type == "float" else table.to(torch.bfloat16).contiguous()
    scale = D ** -0.5
    mask = torch.arange(L, device="cuda")[:, None] >= torch.arange(S, device="cuda")[None, :]
    b64 = table.double().requires_grad_()
    q64 = q.double().requires_grad_()
    s = (q64 @ k.double().transpose(-1, -2)) * scale + b64
    s = s.masked_fill(~mask, float("-inf"))
    o64 = s.softmax(-1) @ v.double()
    o64.backward(do.double())
    lse = torch.logsumexp(s, -1, keepdim=True).float().contiguous()
    o = o64.detach().to(torch.bfloat16).contiguous()
    h = cudnn.create_handle()
    g = cudnn.pygraph(io_data_type=BF, intermediate_data_type=F32, compute_data_type=F32, handle=h)
    T = lambda name, t, dt=BF: g.tensor(name=name, dim=list(t.shape), stride=list(t.stride()), data_type=dt)
    tq, tk, tv, to, tdo = T("q", q), T("k", k), T("v", v), T("o", o), T("dO", do)
    tst, tb = T("stats", lse, F32), T("bias", bias, F32 if bias_type == "float" else BF)
    db = torch.empty(1, 1, L, S, device="cuda", dtype=torch.bfloat16)
    tdb = T("dBias", db, BF)
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
        return f"no plan: {str(e)[:160]}"
    ws = torch.empty(g.get_workspace_size(), device="cuda", dtype=torch.uint8)
    pack = {tq: q, tk: k, tv: v, to: o, tdo: do, tst: lse, tb: bias, tdb: db}
    pack.update({t: buf for t, buf in outs.values()})
    g.execute(pack, ws, handle=h)
    torch.cuda.synchronize()
    e = lambda a, r: float((a.double() - r).abs().max() / r.abs().max().clamp_min(1e-30))
    return f"dBias rel err {e(db, b64.grad):.2e}  dQ rel err {e(outs['dq'][1], q64.grad):.2e}"


for L, S in [(129, 200), (256, 256), (1024, 1024)]:
    for t in ("bf16", "float"):
        try:
            r = run(L, S, t)
        except Exception as ex:  # noqa: BLE001
            r = f"raised {type(ex).__name__}: {str(ex)[:160]}"
        print(f"L {L} S {S} bias {t}: {r}", flush=True)
