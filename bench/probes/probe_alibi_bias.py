"""ALiBi + causal as cuDNN's native causal band plus a small bias, or as cuDNN's native ALiBi (GPU, raw FE graphs).

    python3 bench/probes/probe_alibi_bias.py [--shape 2,16,4096,128]   (H not a power of two: --shape 2,12,4096,128)

Native ALiBi: ``use_alibi_mask=True`` with the causal band; cuDNN makes its own slopes (``cudnn_slopes``, the
frontend's ``get_alibi_slope``). Is it exact forward and backward against eager float32 ALiBi with those slopes,
and does it skip the masked tiles (time near "causal, no bias")?

ALiBi's term slope[h] * (kv - q) splits into slope[h] * kv (a [1, H, 1, S] bias) and -slope[h] * q,
which is constant along each softmax row and drops out of the softmax (only the lse moves, by
-slope[h] * q). A bias keeps the native causal band, which skips masked tiles, where the emitted
score_mod does not (cudnn-notes). Does cuDNN take a [1, H, 1, S] bias, in bf16 and in float32, with
a causal band? fwd / bwd ms and max relative error (out, lse, dq, dk, dv) vs eager float32.
"""

from __future__ import annotations

import argparse
import math

import cudnn
import torch


def _t(g, name, x):
    dt = {torch.bfloat16: cudnn.data_type.BFLOAT16, torch.float32: cudnn.data_type.FLOAT}[x.dtype]
    return g.tensor(name=name, dim=list(x.shape), stride=list(x.stride()), data_type=dt)


def _graph(handle):
    return cudnn.pygraph(handle=handle, io_data_type=cudnn.data_type.BFLOAT16,
                         intermediate_data_type=cudnn.data_type.FLOAT, compute_data_type=cudnn.data_type.FLOAT)


def _finish(g):
    g.validate()
    g.build_operation_graph()
    g.create_execution_plans([cudnn.heur_mode.A, cudnn.heur_mode.FALLBACK])
    g.check_support()
    g.build_plans()
    return g


def _timed(fn, iters=30):
    for _ in range(5):
        fn()
    torch.cuda.synchronize()
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record()
    for _ in range(iters):
        fn()
    b.record()
    torch.cuda.synchronize()
    return a.elapsed_time(b) / iters


def cudnn_slopes(H: int) -> torch.Tensor:
    """ALiBi slopes as cuDNN makes them: 2^(-8(h+1)/n) for the first n heads (n the largest power of two <= H),
    then the odd-indexed slopes of 2n heads, 2^(-4(2j+1)/n), for the rest (the ALiBi paper's recipe)."""
    n = 1 << (H.bit_length() - 1)
    first = [2.0 ** (-8.0 * (h + 1) / n) for h in range(n)]
    rest = [2.0 ** (-4.0 * (2 * j + 1) / n) for j in range(H - n)]
    return torch.tensor(first + rest, dtype=torch.float32)


def run(q, k, v, do, bias, scale, handle, alibi=False):
    """(fwd ms, bwd ms, out, lse, dq, dk, dv) of cuDNN SDPA with top-left causal and ``bias`` (or None);
    ``alibi``: cuDNN's native ALiBi on top."""
    B, H, L, D = q.shape
    kw = dict(attn_scale=scale, diagonal_alignment=cudnn.diagonal_alignment.TOP_LEFT, diagonal_band_right_bound=0)
    if alibi:
        kw["use_alibi_mask"] = True
    g = _graph(handle)
    qt, kt, vt = _t(g, "q", q), _t(g, "k", k), _t(g, "v", v)
    bt = None if bias is None else _t(g, "bias", bias)
    o, st = g.sdpa(name="fwd", q=qt, k=kt, v=vt, generate_stats=True, bias=bt, **kw)
    out = torch.empty_like(q)
    lse = torch.empty(B, H, L, 1, device=q.device, dtype=torch.float32)
    o.set_output(True).set_dim(list(out.shape)).set_stride(list(out.stride()))
    st.set_output(True).set_dim(list(lse.shape)).set_stride(list(lse.stride())).set_data_type(cudnn.data_type.FLOAT)
    _finish(g)
    ws = torch.empty(max(1, g.get_workspace_size()), device=q.device, dtype=torch.uint8)
    pack = {qt: q, kt: k, vt: v, o: out, st: lse}
    if bt is not None:
        pack[bt] = bias
    fwd = _timed(lambda: g.execute(pack, ws, handle=handle))

    gb = _graph(handle)
    qt, kt, vt = _t(gb, "q", q), _t(gb, "k", k), _t(gb, "v", v)
    ot, dot, stt = _t(gb, "o", out), _t(gb, "do", do), _t(gb, "stats", lse)
    bt = None if bias is None else _t(gb, "bias", bias)
    dq, dk, dv = gb.sdpa_backward(name="bwd", q=qt, k=kt, v=vt, o=ot, dO=dot, stats=stt, bias=bt, **kw)
    grads = [torch.empty_like(x) for x in (q, k, v)]
    for t, x in zip((dq, dk, dv), grads):
        t.set_output(True).set_dim(list(x.shape)).set_stride(list(x.stride()))
    _finish(gb)
    wsb = torch.empty(max(1, gb.get_workspace_size()), device=q.device, dtype=torch.uint8)
    packb = {qt: q, kt: k, vt: v, ot: out, dot: do, stt: lse, dq: grads[0], dk: grads[1], dv: grads[2]}
    if bt is not None:
        packb[bt] = bias
    bwd = _timed(lambda: gb.execute(packb, wsb, handle=handle))
    return fwd, bwd, out, lse, *grads


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--shape", default="2,16,4096,128")
    a = p.parse_args()
    B, H, L, D = (int(x) for x in a.shape.split(","))
    g = torch.Generator(device="cuda").manual_seed(0)
    q, k, v, do = (torch.randn(B, H, L, D, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(4))
    scale = 1 / math.sqrt(D)
    slopes = cudnn_slopes(H).cuda()
    idx = torch.arange(L, device="cuda", dtype=torch.float32)
    # eager float32 reference: ALiBi + causal
    qf, kf, vf = (x.float().requires_grad_() for x in (q, k, v))
    s = qf @ kf.transpose(-1, -2) * scale + slopes.view(1, H, 1, 1) * (idx.view(1, 1, 1, L) - idx.view(1, 1, L, 1))
    s = s.masked_fill(idx.view(1, 1, 1, L) > idx.view(1, 1, L, 1), float("-inf"))
    ref_lse = torch.logsumexp(s, dim=-1, keepdim=True)
    ref = torch.softmax(s, dim=-1) @ vf
    ref_g = torch.autograd.grad(ref, (qf, kf, vf), do.float())
    ref_lse, ref = ref_lse.detach(), ref.detach()
    del s
    handle = cudnn.create_handle()
    cudnn.set_stream(handle=handle, stream=torch.cuda.current_stream().cuda_stream)
    kv_term = (slopes.view(1, H, 1, 1) * idx.view(1, 1, 1, L)).contiguous()  # [1, H, 1, S]
    full = slopes.view(1, H, 1, 1) * (idx.view(1, 1, 1, L) - idx.view(1, 1, L, 1))  # [1, H, L, S]
    cases = {"causal, no bias (speed reference)": None,
             "bias [1,H,1,S] float32": kv_term,
             "bias [1,H,1,S] bf16": kv_term.bfloat16(),
             "bias [1,H,L,S] bf16 (full ALiBi)": full.bfloat16().contiguous(),
             "native ALiBi (use_alibi_mask)": "alibi"}
    q_shift = (slopes.view(1, H, 1, 1) * idx.view(1, 1, L, 1))  # lse_true = lse - slope * q for the kv-only bias
    print(f"{torch.cuda.get_device_name()}  cudnn {cudnn.backend_version()}  shape {a.shape}")
    for name, bias in cases.items():
        try:
            if isinstance(bias, str):
                fwd, bwd, out, lse, *gr = run(q, k, v, do, None, scale, handle, alibi=True)
                bias = None
            else:
                fwd, bwd, out, lse, *gr = run(q, k, v, do, bias, scale, handle)
        except Exception as e:  # noqa: BLE001
            print(f"{name:36s} not supported: {type(e).__name__}: {str(e).splitlines()[0][:160]}")
            continue
        if bias is not None and bias.shape[2] == 1:
            lse = lse - q_shift
        rel = lambda x, y: ((x.float() - y).abs().max() / y.abs().max()).item()  # noqa: E731
        errs = [rel(out, ref), rel(lse, ref_lse)] + [rel(x, y) for x, y in zip(gr, ref_g)]
        print(f"{name:36s} fwd {fwd:6.3f} ms  bwd {bwd:6.3f} ms  rel err out {errs[0]:.1e} lse {errs[1]:.1e} "
              f"dq {errs[2]:.1e} dk {errs[3]:.1e} dv {errs[4]:.1e}", flush=True)


if __name__ == "__main__":
    main()
