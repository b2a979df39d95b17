"""A float32 bias with bf16 q / k / v: does a float32 dBias build too, how close is each to float64, and what
does the float32 bias cost in kernel time? (GPU; the cuDNN that is loaded.)

Part 1 (accuracy): one cuDNN backward (B 2, H 4, D 64, causal) on a float32 table as the bias, for each
(bias type, dBias type) pair, against float64 math on the unrounded table.
Part 2 (time): forward and backward with dBias at B x H x L x D (argv, default 2,16,4096,128), bias [1, H, L, L],
median of 30 runs after warm-up, for bias / dBias types bf16/bf16, float/bf16, float/float, plus the
bf16 -> float32 copy of dBias the float/bf16 column needs.

    python3 bench/probes/probe_bias_f32_time.py [B,H,L,D]
"""
import sys

import torch

import cudnn

print(torch.__version__, "cudnn", cudnn.backend_version(), torch.cuda.get_device_name(), flush=True)
F32, BF = cudnn.data_type.FLOAT, cudnn.data_type.BFLOAT16
DT = {"bf16": (BF, torch.bfloat16), "float": (F32, torch.float32)}


def graphs(q, k, v, bias, db, scale, causal=True):
    """(forward graph, backward graph) builders sharing one handle; each returns (graph, pack, outs)."""
    h = cudnn.create_handle()
    kw = dict(diagonal_band_right_bound=0, diagonal_alignment=cudnn.diagonal_alignment.TOP_LEFT) if causal else {}

    def T(g, name, t, dt=BF):
        return g.tensor(name=name, dim=list(t.shape), stride=list(t.stride()), data_type=dt)

    def tdt(t):
        return F32 if t.dtype == torch.float32 else BF

    def fwd():
        g = cudnn.pygraph(io_data_type=BF, intermediate_data_type=F32, compute_data_type=F32, handle=h)
        tq, tk, tv, tb = T(g, "q", q), T(g, "k", k), T(g, "v", v), T(g, "bias", bias, tdt(bias))
        o, st = g.sdpa(q=tq, k=tk, v=tv, generate_stats=True, attn_scale=scale, bias=tb, name="fwd", **kw)
        B, H, L, D = q.shape
        out = torch.empty_like(q)
        lse = torch.empty(B, H, L, 1, device="cuda", dtype=torch.float32)
        o.set_output(True).set_dim(list(out.shape)).set_stride(list(out.stride())).set_data_type(BF)
        st.set_output(True).set_dim(list(lse.shape)).set_stride(list(lse.stride())).set_data_type(F32)
        return g, {tq: q, tk: k, tv: v, tb: bias, o: out, st: lse}, (out, lse)

    def bwd(o, do, lse):
        g = cudnn.pygraph(io_data_type=BF, intermediate_data_type=F32, compute_data_type=F32, handle=h)
        tq, tk, tv, to, tdo = T(g, "q", q), T(g, "k", k), T(g, "v", v), T(g, "o", o), T(g, "dO", do)
        tst, tb, tdb = T(g, "stats", lse, F32), T(g, "bias", bias, tdt(bias)), T(g, "dBias", db, tdt(db))
        dq, dk, dv = g.sdpa_backward(q=tq, k=tk, v=tv, o=to, dO=tdo, stats=tst, attn_scale=scale, bias=tb, dBias=tdb,
                                     name="bwd", **kw)
        pack = {tq: q, tk: k, tv: v, to: o, tdo: do, tst: lse, tb: bias, tdb: db}
        outs = []
        for t, ref in ((dq, q), (dk, k), (dv, v)):
            buf = torch.empty_like(ref)
            t.set_output(True).set_dim(list(ref.shape)).set_stride(list(ref.stride())).set_data_type(BF)
            pack[t] = buf
            outs.append(buf)
        return g, pack, outs

    def ready(g, pack):
        g.validate(); g.build_operation_graph(); g.create_execution_plans([cudnn.heur_mode.A, cudnn.heur_mode.FALLBACK])
        g.check_support(); g.build_plans()
        ws = torch.empty(g.get_workspace_size(), device="cuda", dtype=torch.uint8)
        return lambda: g.execute(pack, ws, handle=h)
    return fwd, bwd, ready


def accuracy(L, S, bt, dbt):
    torch.manual_seed(0)
    B, H, D = 2, 4, 64
    q, k, v, do = (torch.randn(B, H, n, D, device="cuda", dtype=torch.bfloat16) for n in (L, S, S, L))
    table = torch.randn(1, 1, L, S, device="cuda") * 2
    bias = table.to(DT[bt][1]).contiguous()
    scale = D ** -0.5
    mask = torch.arange(L, device="cuda")[:, None] >= torch.arange(S, device="cuda")[None, :]
    b64 = table.double().requires_grad_()
    q64 = q.double().requires_grad_()
    s = ((q64 @ k.double().transpose(-1, -2)) * scale + b64).masked_fill(~mask, float("-inf"))
    o64 = s.softmax(-1) @ v.double()
    o64.backward(do.double())
    lse = torch.logsumexp(s, -1, keepdim=True).float().contiguous()
    o = o64.detach().to(torch.bfloat16).contiguous()
    db = torch.empty(1, 1, L, S, device="cuda", dtype=DT[dbt][1])
    _, bwd, ready = graphs(q, k, v, bias, db, scale)
    g, pack, (dq, _, _) = bwd(o, do, lse)
    try:
        ready(g, pack)()
    except Exception as e:  # noqa: BLE001
        return f"no plan: {str(e)[:200]}"
    torch.cuda.synchronize()
    e = lambda a, r: float((a.double() - r).abs().max() / r.abs().max().clamp_min(1e-30))
    return f"dBias rel err {e(db, b64.grad):.2e}  dQ rel err {e(dq, q64.grad):.2e}"


def median_ms(fn, n=30):
    for _ in range(5):
        fn()
    ts = []
    for _ in range(n):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record(); fn(); b.record(); torch.cuda.synchronize()
        ts.append(a.elapsed_time(b))
    return sorted(ts)[n // 2]


def timing(B, H, L, D, bt, dbt):
    g0 = torch.Generator(device="cuda").manual_seed(0)
    q, k, v, do = (torch.randn(B, H, L, D, device="cuda", dtype=torch.bfloat16, generator=g0) for _ in range(4))
    bias = (torch.randn(1, H, L, L, device="cuda", generator=g0) * 0.5).to(DT[bt][1])
    db = torch.empty(1, H, L, L, device="cuda", dtype=DT[dbt][1])
    fwd, bwd, ready = graphs(q, k, v, bias, db, D ** -0.5)
    g, pack, (out, lse) = fwd()
    try:
        f = ready(g, pack)
        f()
        g2, pack2, _ = bwd(out, do, lse)
        b = ready(g2, pack2)
    except Exception as e:  # noqa: BLE001
        return f"no plan: {str(e)[:200]}"
    tf, tb = median_ms(f), median_ms(b)
    extra = ""
    if bt == "float" and dbt == "bf16":
        wide = torch.empty(1, H, L, L, device="cuda", dtype=torch.float32)
        extra = f"  + dBias copy to float32 {median_ms(lambda: wide.copy_(db)):.3f} ms"
    return f"fwd {tf:.3f} ms  bwd {tb:.3f} ms  step {tf + tb:.3f} ms{extra}"


PAIRS = [("bf16", "bf16"), ("float", "bf16"), ("float", "float"), ("bf16", "float")]
for L, S in [(129, 200), (1024, 1024)]:
    for bt, dbt in PAIRS:
        try:
            r = accuracy(L, S, bt, dbt)
        except Exception as ex:  # noqa: BLE001
            r = f"raised {type(ex).__name__}: {str(ex)[:200]}"
        print(f"accuracy L {L} S {S} bias {bt} dBias {dbt}: {r}", flush=True)
for shp in sys.argv[1:] or ["2,16,4096,128"]:
    B, H, L, D = (int(x) for x in shp.split(","))
    for bt, dbt in PAIRS:
        try:
            r = timing(B, H, L, D, bt, dbt)
        except Exception as ex:  # noqa: BLE001
            r = f"raised {type(ex).__name__}: {str(ex)[:200]}"
        print(f"time {B}x{H}x{L}x{D} bias {bt} dBias {dbt}: {r}", flush=True)
