"""Host time of one compiled SDPA training step, te_compile (serve="always") vs plain torch.compile,
and where te_compile's goes (GPU).

    python3 bench/probes/step_host.py [--shape 4,16,1024,64] [--profile]

Rows: host µs per step (fwd + bwd, a loop without syncs; the kernels here are short so the host
shows), host µs per call of the te ops and of aten's cuDNN SDPA called directly, and with --profile
a cProfile of the te_compile step (top rows by own time) and the aten ops each step issues.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(__file__))
from layers import print_profile  # noqa: E402


def host_us(fn, n=300) -> float:
    for _ in range(20):
        fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    dt = (time.perf_counter() - t0) / n * 1e6
    torch.cuda.synchronize()
    return dt


def aten_ops(fn, n=5) -> list[str]:
    from torch.profiler import ProfilerActivity, profile

    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(n):
            fn()
    rows = sorted(prof.key_averages(), key=lambda e: -e.self_cpu_time_total)
    return [f"{e.key[:70]:70s} calls/step {e.count / n:5.1f} self {e.self_cpu_time_total / n:7.1f} us/step"
            for e in rows[:25]]


def parts(q, k, v, do, o, lse) -> None:
    """Host µs of each layer of a steady-state te op call, outermost first (forward, then backward)."""
    from te_compile import kernels
    from te_compile.cudnn import graphs
    from te_compile.spec import AttentionSpec

    s = AttentionSpec(mask="causal")
    key = s.key()
    raw = (q, k, v, None)
    plan = graphs.plans()[graphs.signature("fwd", s, None, raw)]
    built = plan.built
    h = graphs.handle(q.device)
    out = torch.empty_like(o)
    lse2 = torch.empty_like(lse)
    ws = graphs.new_workspace(built.workspace, q.device)
    rows = {
        "op attn_fwd (dispatcher + Autograd kernel)": lambda: torch.ops.te_compile.attn_fwd(q, k, v, None, [], key),
        "kernels.attn_fwd_cuda": lambda: kernels.attn_fwd_cuda(q, k, v, None, [], key),
        "AttentionSpec.from_key": lambda: AttentionSpec.from_key(key),
        "graphs.forward": lambda: graphs.forward(q, k, v, None, s),
        "graphs.signature + plans lookup": lambda: graphs.plans().get(graphs.signature("fwd", s, None, raw)),
        "graphs.handle (set_stream)": lambda: graphs.handle(q.device),
        "torch.empty_strided out": lambda: torch.empty_strided(o.shape, o.stride(), dtype=q.dtype, device=q.device),
        "torch.empty lse": lambda: torch.empty(o.shape[:3], dtype=torch.float32, device=q.device),
        "workspace alloc": lambda: graphs.new_workspace(built.workspace, q.device),
        "_Built.run (raw execute)": lambda: built.run([q, k, v, out, lse2], ws, h),
        "op attn_bwd": lambda: torch.ops.te_compile.attn_bwd(do, q, k, v, o, lse, None, [], key, False),
        "kernels.attn_bwd_cuda": lambda: kernels.attn_bwd_cuda(do, q, k, v, o, lse, None, [], key, False),
        "graphs.backward": lambda: graphs.backward(do, q, k, v, o, lse, None, s, False),
    }
    print(f"fwd graph workspace bytes: {built.workspace}")
    for name, f in rows.items():
        print(f"part {name:44s} {min(host_us(f) for _ in range(3)):7.1f} us", flush=True)


def main() -> int:
    import te_compile
    from te_compile.spec import AttentionSpec

    p = argparse.ArgumentParser()
    p.add_argument("--shape", default="4,16,1024,64")
    p.add_argument("--profile", action="store_true")
    p.add_argument("--parts", action="store_true", help="host us of each layer under the te ops")
    p.add_argument("--parts-only", action="store_true", help="only --parts (no compiled steps)")
    a = p.parse_args()
    import torch._inductor.config as ic
    ic.compile_threads = 1
    B, H, L, D = (int(x) for x in a.shape.split(","))
    g = torch.Generator(device="cuda").manual_seed(0)
    q, k, v, do = (torch.randn(B, H, L, D, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(4))
    q, k, v = (t.requires_grad_() for t in (q, k, v))

    def fn(q, k, v):
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)

    if a.parts_only:
        import te_compile.ops  # noqa: F401 - registers the ops
        qd, kd, vd = q.detach(), k.detach(), v.detach()
        o, lse = torch.ops.te_compile.attn_fwd(qd, kd, vd, None, [], AttentionSpec(mask="causal").key())
        print("te_compile from", te_compile.__file__)
        for r in range(2):
            parts(qd, kd, vd, do, o, lse)
        return 0
    steps = {}
    for name, be, mode in (("te_compile", te_compile.backend(serve="always"), None), ("torch.compile", "inductor", None),
                           ("te_compile cudagraphs", te_compile.backend(serve="always"), "reduce-overhead"),
                           ("torch.compile cudagraphs", "inductor", "reduce-overhead")):
        f = torch.compile(fn, backend=be, dynamic=False, mode=mode)

        def step(f=f):
            f(q, k, v).backward(do)
        steps[name] = step
        step()
    for _ in range(3):  # alternate rounds, best of
        for name, step in steps.items():
            t = host_us(step)
            print(f"step host {name:26s} {t:8.1f} us", flush=True)
    qd, kd, vd = q.detach(), k.detach(), v.detach()
    spec = AttentionSpec(mask="causal").key()
    o, lse = torch.ops.te_compile.attn_fwd(qd, kd, vd, None, [], spec)
    calls = {
        "te attn_fwd op (no grad)": lambda: torch.ops.te_compile.attn_fwd(qd, kd, vd, None, [], spec),
        "te attn_bwd op": lambda: torch.ops.te_compile.attn_bwd(do, qd, kd, vd, o, lse, None, [], spec, False),
    }
    if hasattr(torch.ops.aten, "_scaled_dot_product_cudnn_attention"):
        r = torch.ops.aten._scaled_dot_product_cudnn_attention(qd, kd, vd, None, True, 0.0, True)
        calls["aten cudnn sdpa fwd"] = lambda: torch.ops.aten._scaled_dot_product_cudnn_attention(
            qd, kd, vd, None, True, 0.0, True)
        if hasattr(torch.ops.aten, "_scaled_dot_product_cudnn_attention_backward"):
            out, lse2, cq, ckv, mq, mk, seed, off = r[:8]
            calls["aten cudnn sdpa bwd"] = lambda: torch.ops.aten._scaled_dot_product_cudnn_attention_backward(
                do, qd, kd, vd, out, lse2, seed, off, None, cq, ckv, mq, mk, 0.0, True)
    from te_compile.cudnn import graphs
    for raw in (True, False, True, False):
        graphs.RAW_EXECUTE = raw
        for name, c in calls.items():
            if name.startswith("aten") and not raw:
                continue
            try:
                print(f"call host {name:26s} {'' if name.startswith('aten') else f'raw={raw!s:5s}'} "
                      f"{host_us(c):8.1f} us", flush=True)
            except Exception as e:  # noqa: BLE001
                print(f"call host {name:26s} error {type(e).__name__}: {str(e)[:100]}")
        for name, step in steps.items():
            if "cudagraphs" not in name:
                print(f"step host {name:26s} raw={raw!s:5s} {host_us(step):8.1f} us", flush=True)
    graphs.RAW_EXECUTE = True
    # the two execute paths give the same numbers (same plan, same kernel)
    graphs.RAW_EXECUTE = False
    ref = torch.ops.te_compile.attn_fwd(qd, kd, vd, None, [], spec)[0].clone()
    graphs.RAW_EXECUTE = True
    got = torch.ops.te_compile.attn_fwd(qd, kd, vd, None, [], spec)[0]
    raws = [type(b._raw).__name__ for b in graphs.cache._entries.values()]
    print("raw == public execute (fwd, bitwise):", bool(torch.equal(ref, got)), "executors:", raws)
    if a.parts:
        parts(qd, kd, vd, do, o, lse)
    if a.profile:
        for name, step in steps.items():
            print(f"--- ops issued per step: {name}")
            print("\n".join(aten_ops(step)))
        for name in ("te_compile", "torch.compile"):
            print(f"--- cProfile {name} step (200 steps, by own time)")
            print_profile(steps[name], n=200, limit=40)
    # wall time per step with syncs too (the GPU side included): CUDA graphs vs not
    for name, step in steps.items():
        for _ in range(10):
            step()
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(200):
            step()
        torch.cuda.synchronize()
        print(f"step wall {name:26s} {(time.perf_counter() - t0) / 200 * 1e6:8.1f} us", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
