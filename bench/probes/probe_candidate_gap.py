"""The measurement-vs-step gap of te_compile.tuning (GPU): a site's two compiled candidates (what tuning times)
next to the compiled training steps of the same call (te_compile serve="always", plain torch.compile), rows
interleaved in one process. Per row: ms per call (synchronized loop) and host µs per call (bursts, no sync).

    python3 bench/probes/probe_candidate_gap.py [--shape 4,16,1024,64,4] [--causal]

Seen in the tuned SDPA grid (H200, 9.19): GQA 4x16x1024x64 with 4 KV heads measured 1.119 (cuDNN) vs 0.825 ms
(torch.compile) while tuning, but served steps ran 0.696 vs 0.732 ms in the same process.
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.nn.functional as F


def ms_per_call(fn, n=20) -> float:
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) / n * 1e3


def host_us(fn, n=10) -> float:
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    dt = (time.perf_counter() - t0) / n * 1e6
    torch.cuda.synchronize()
    return dt


def main() -> int:
    import te_compile
    from te_compile.spec import AttentionSpec
    from te_compile.tuning import candidates
    p = argparse.ArgumentParser()
    p.add_argument("--shape", default="4,16,1024,64,4")
    p.add_argument("--causal", action="store_true")
    p.add_argument("--rounds", type=int, default=15)
    a = p.parse_args()
    B, H, L, D, HKV = (int(x) for x in a.shape.split(","))
    q = torch.randn(B, H, L, D, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    k, v = (torch.randn(B, HKV, L, D, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(2))
    do = torch.randn_like(q)
    gqa = H != HKV

    def f(q, k, v):
        return F.scaled_dot_product_attention(q, k, v, is_causal=a.causal, enable_gqa=gqa)

    steps = {}
    for name, kw in (("step te always", {"backend": te_compile.backend(serve="always")}),
                     ("step torch.compile", {})):
        g = torch.compile(f, dynamic=False, **kw)
        steps[name] = (lambda g=g: torch.autograd.grad(g(q, k, v), (q, k, v), do))
    spec = AttentionSpec(mask="causal" if a.causal else "none")
    pair = candidates.build(q.detach(), k.detach(), v.detach(), None, spec, True, False)
    rows = dict(steps, **{"candidate te": pair[0], "candidate torch.compile": pair[1]})
    for fn in rows.values():
        for _ in range(5):
            fn()
    res = {n: ([], []) for n in rows}
    for _ in range(a.rounds):
        for n, fn in rows.items():
            res[n][0].append(ms_per_call(fn))
            res[n][1].append(host_us(fn))
    # the same two candidates timed from inside a torch.compile backend, as tuning runs them (Dynamo compiling)
    inside = {"candidate te (in a compile)": [], "candidate torch.compile (in a compile)": []}

    def timing_backend(gm, example_inputs):
        for _ in range(a.rounds):
            for (n, xs), fn in zip(inside.items(), pair):
                xs.append(ms_per_call(fn))
        return gm.forward
    torch.compile(lambda x: x + 1, backend=timing_backend)(torch.ones(2, device="cuda"))
    print(torch.cuda.get_device_name(), "cuDNN", torch.backends.cudnn.version(), a.shape, "causal" if a.causal else "")
    for n, xs in inside.items():
        print(f"{n:40s} {statistics.median(xs):7.3f} ms")
    for n, (ms, us) in res.items():
        print(f"{n:40s} {statistics.median(ms):7.3f} ms  host {statistics.median(us):7.0f} us")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
