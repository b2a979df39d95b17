"""Host µs per call of a te op and of its bare cuDNN execute, per score_mod / mask variant (GPU).

    python3 bench/probes/exec_host.py [--shape 8,16,1024,64]

For each variant: the te fwd / bwd op as called from a compiled graph (no grad), the cuDNN graph's
execute alone (te_compile's Built.run), and the CUDA driver / runtime calls one execute makes
(torch profiler, CPU side). aten's cuDNN SDPA is the reference for the plain row. Host time is the
loop time of short bursts (the GPU queue never fills), median over bursts.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch


def burst_us(fn, n=20, reps=15) -> float:
    for _ in range(5):
        fn()
    torch.cuda.synchronize()
    xs = []
    for _ in range(reps):
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        xs.append((time.perf_counter() - t0) / n * 1e6)
        torch.cuda.synchronize()
    return statistics.median(xs)


def api_calls(fn, n=5) -> str:
    from torch.profiler import ProfilerActivity, profile
    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(n):
            fn()
        torch.cuda.synchronize()
    rows = []
    for e in sorted(prof.key_averages(), key=lambda e: -e.self_cpu_time_total):
        if e.self_cpu_time_total <= 0 or e.key.startswith("cudaDeviceSynchronize"):
            continue
        rows.append(f"{e.key[:40]}x{e.count / n:g}:{e.self_cpu_time_total / n:.1f}us")
    gpu = sum(e.self_device_time_total for e in prof.key_averages()) / n
    return f"gpu {gpu:.1f}us | " + " ".join(rows[:8])


VARIANTS = {
    "plain": dict(),
    "causal": dict(mask="causal"),
    "softcap": dict(score="(mul (tanh (div score 30.0)) 30.0)"),
    "softcap+causal": dict(score="(mul (tanh (div score 30.0)) 30.0)", mask="causal"),
    "score*score": dict(score="(mul score score)"),
}


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--shape", default="8,16,1024,64")
    a = p.parse_args()
    from te_compile.cudnn import graphs
    from te_compile.spec import AttentionSpec
    B, H, L, D = (int(x) for x in a.shape.split(","))
    q, k, v, do = (torch.randn(B, H, L, D, device="cuda", dtype=torch.bfloat16) for _ in range(4))
    print(torch.__version__, "cudnn", torch.backends.cudnn.version(), torch.cuda.get_device_name(), a.shape)
    for name, kw in VARIANTS.items():
        s = AttentionSpec(source="flex", scale=D ** -0.5, **kw)
        key = s.key()
        out, lse = torch.ops.te_compile.attn_fwd(q, k, v, None, [], key)
        torch.ops.te_compile.attn_bwd(do, q, k, v, out, lse, None, [], key, False)
        fplan = graphs.plans()[graphs.signature("fwd", s, None, (q, k, v, None))]
        bplan = graphs.plans()[graphs.signature("bwd", s, False, (do, q, k, v, out, lse, None))]
        h = graphs.handle(q.device)
        o2, l2 = torch.empty_like(out), torch.empty_like(lse)
        dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
        fws = graphs.new_workspace(fplan.built.workspace, q.device)
        bws = graphs.new_workspace(bplan.built.workspace, q.device)
        fbuf = [q, k, v, o2, l2] + list(fplan.consts)
        bbuf = [q, k, v, out, do, lse, dq, dk, dv] + list(bplan.consts)
        rows = {
            "op fwd": lambda: torch.ops.te_compile.attn_fwd(q, k, v, None, [], key),
            "op bwd": lambda: torch.ops.te_compile.attn_bwd(do, q, k, v, out, lse, None, [], key, False),
            "exec fwd": lambda: fplan.built.run(fbuf, fws, h),
            "exec bwd": lambda: bplan.built.run(bbuf, bws, h),
        }
        raw = ("raw" if fplan.built._raw not in (None, graphs._FIRST) else "public",
               "raw" if bplan.built._raw not in (None, graphs._FIRST) else "public")
        print(f"== {name}: fwd {raw[0]} ws {fplan.built.workspace}, bwd {raw[1]} ws {bplan.built.workspace}", flush=True)
        for d, b in (("fwd", fplan.built), ("bwd", bplan.built)):
            if b._raw is None:  # why the raw-pointer execute declined this graph
                g = b.graph
                try:
                    lw = g._lowered_graph
                    lw._prepare_variant_pack_template()
                    order = [int(u) for u in lw._get_variant_pack_uids_sorted()]
                except Exception as e:  # noqa: BLE001
                    order = f"{type(e).__name__}: {e}"
                print(f"   {d} public: selected_engine {g.selected_engine!r}, plans {bool(g._plans)}, "
                      f"backend uids {order}, ours {[int(u) for u in b.uids]}", flush=True)
        for r, fn in rows.items():
            print(f"  {r:9s} host {burst_us(fn):7.1f} us   {api_calls(fn)}", flush=True)
    qa, ka, va = (t.detach().requires_grad_() for t in (q, k, v))
    from torch.nn.attention import SDPBackend, sdpa_kernel
    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
        f = lambda: torch.nn.functional.scaled_dot_product_attention(q, k, v)  # noqa: E731
        print(f"== aten cuDNN SDPA fwd (no grad) host {burst_us(f):7.1f} us   {api_calls(f)}")
        o = torch.nn.functional.scaled_dot_product_attention(qa, ka, va)
        g = lambda: torch.autograd.grad(o, (qa, ka, va), do, retain_graph=True)  # noqa: E731
        print(f"== aten cuDNN SDPA bwd host {burst_us(g):7.1f} us   {api_calls(g)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
