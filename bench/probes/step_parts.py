"""Where a served flex training step's host time goes, without a profiler (GPU).

    python3 bench/probes/step_parts.py [--shape 8,16,1024,64] [--variant softcap]

Host µs per call in bursts of 10 calls, the rows interleaved burst by burst in one process (median, quartiles):
the compiled training step with te_compile (serve="always") and with plain torch.compile; the te ops alone
(fwd op + bwd op, as the compiled graphs call them, and their CUDA kernel functions); te_compile's step with the
earlier three-op lse guard on every masked call; and te_compile's step with its ops' CUDA kernels replaced by
allocation-only stand-ins (what the step costs around the ops).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import torch
from torch.nn.attention.flex_attention import flex_attention

sys.path.insert(0, os.path.dirname(__file__))

MODS = {
    "softcap": (lambda s, b, h, i, j: 30.0 * torch.tanh(s / 30.0), None),
    "causal": (None, lambda b, h, i, j: i >= j),
    "sliding": (None, lambda b, h, i, j: (i >= j) & (i - j <= 1024)),
}


def burst_us(fn, n=10, reps=21) -> float:
    xs = []
    for _ in range(reps):
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        xs.append((time.perf_counter() - t0) / n * 1e6)
        torch.cuda.synchronize()
    return statistics.median(xs)


def main() -> int:
    import te_compile
    from te_compile import kernels, ops
    p = argparse.ArgumentParser()
    p.add_argument("--shape", default="8,16,1024,64")
    p.add_argument("--variant", default="softcap", choices=sorted(MODS))
    p.add_argument("--reps", type=int, default=40)
    a = p.parse_args()
    import torch._inductor.config as ic
    ic.compile_threads = 1
    B, H, L, D = (int(x) for x in a.shape.split(","))
    q, k, v, do = (torch.randn(B, H, L, D, device="cuda", dtype=torch.bfloat16) for _ in range(4))
    q, k, v = (t.requires_grad_() for t in (q, k, v))
    score_mod, mask_mod = MODS[a.variant]
    bm = None
    if mask_mod is not None:
        from torch.nn.attention.flex_attention import create_block_mask
        bm = create_block_mask(mask_mod, None, None, L, L, device="cuda")

    def fn(q, k, v):
        return flex_attention(q, k, v, score_mod=score_mod, block_mask=bm)

    rows = {}
    for name, be in (("te_compile step", te_compile.backend(serve="always")), ("torch.compile step", "inductor")):
        f = torch.compile(fn, backend=be, dynamic=False)

        def step(f=f):
            f(q, k, v).backward(do)
        step()
        rows[name] = step
    calls = []
    real_fwd, real_bwd = ops.attn_fwd_cuda, ops.attn_bwd_cuda

    def rec_fwd(*args):
        calls.append(("fwd", args))
        return real_fwd(*args)

    def rec_bwd(*args):
        calls.append(("bwd", args))
        return real_bwd(*args)
    ops.attn_fwd_cuda, ops.attn_bwd_cuda = rec_fwd, rec_bwd
    ops._DIRECT.clear()
    rows["te_compile step"]()
    ops.attn_fwd_cuda, ops.attn_bwd_cuda = real_fwd, real_bwd
    print("te ops per step:", [c[0] for c in calls])
    fargs = next(c[1] for c in calls if c[0] == "fwd")
    bargs = next(c[1] for c in calls if c[0] == "bwd")
    def no_grad(f):
        def g():
            with torch.no_grad():
                return f()
        return g
    rows["te fwd op (dispatcher)"] = no_grad(lambda: torch.ops.te_compile.attn_fwd(*fargs))
    rows["te bwd op (dispatcher)"] = no_grad(lambda: torch.ops.te_compile.attn_bwd(*bargs))
    rows["te fwd kernel fn"] = no_grad(lambda: kernels.attn_fwd_cuda(*fargs))
    rows["te bwd kernel fn"] = no_grad(lambda: kernels.attn_bwd_cuda(*bargs))
    fake_out = [kernels.attn_fwd_cuda(*fargs)]
    fake_grads = [kernels.attn_bwd_cuda(*bargs)]

    def stand_ins(on: bool):
        ops.attn_fwd_cuda = (lambda *a: tuple(torch.empty_like(t) for t in fake_out[0])) if on else real_fwd
        ops.attn_bwd_cuda = (lambda *a: tuple(torch.empty_like(t) for t in fake_grads[0])) if on else real_bwd
        ops._DIRECT.clear()

    from te_compile.cudnn import graphs
    new_guard, new_may = graphs.guard_lse, graphs._may_have_empty_rows

    def old_guard(on: bool):  # the three-op guard, on every masked / scored / biased call
        graphs.guard_lse = ((lambda lse: torch.where(torch.isneginf(lse), torch.full_like(lse, 1e30), lse))
                            if on else new_guard)
        graphs._may_have_empty_rows = ((lambda spec, L, S, b: bool(spec.mask_mod or spec.score or b))
                                       if on else new_may)

    def with_old_guard():
        old_guard(True)
        try:
            rows["te_compile step"]()
        finally:
            old_guard(False)

    def with_stand_ins():
        stand_ins(True)
        try:
            rows["te_compile step"]()
        finally:
            stand_ins(False)
    rows["te_compile step, old lse guard"] = with_old_guard
    rows["te_compile step, ops as stand-ins"] = with_stand_ins
    times = {name: [] for name in rows}
    for f in rows.values():
        burst_us(f, n=10, reps=2)
    for _ in range(a.reps):  # interleaved bursts: drift on the host hits every row alike
        for name, f in rows.items():
            times[name].append(burst_us(f, n=10, reps=1))
    for name, xs in times.items():
        xs.sort()
        print(f"{name:40s} median {statistics.median(xs):8.1f} us  (p25 {xs[len(xs) // 4]:7.1f}, "
              f"p75 {xs[3 * len(xs) // 4]:7.1f}, {len(xs)} bursts of 10)", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
