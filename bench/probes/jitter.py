"""Per-call times of a compiled flex causal forward, back to back (quantiles), and BlockMask checks.

    python3 bench/probes/jitter.py [--threads1]

The first te_compile row of a process measured ~2x the host time of the same code later on: Inductor's
compile workers were starting in the background. ``--threads1`` compiles in-process (what the
benchmark does) and the difference goes away.
"""

from __future__ import annotations

import gc
import time

import torch


def main() -> None:
    import sys
    if "--threads1" in sys.argv:
        import torch._inductor.config as ic
        ic.compile_threads = 1
    import te_compile  # noqa: F401
    from te_compile.blockmask import verified
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    B, H, L, D = 2, 16, 4096, 128
    q, k, v = (torch.randn(B, H, L, D, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
    bm = create_block_mask(lambda b, h, q_, kv: q_ >= kv, 1, 1, L, L, device="cuda")

    def fn(q, k, v):
        return flex_attention(q, k, v, block_mask=bm)

    for name in ("te_compile", "inductor", "te_compile"):
        torch._dynamo.reset()
        f = torch.compile(fn, backend="te_compile") if name == "te_compile" else torch.compile(fn)
        for gc_on in (True, False):
            if not gc_on:
                gc.disable()
            for _ in range(25):
                f(q, k, v)
            torch.cuda.synchronize()
            ev = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(200)]
            hs = []
            c0 = verified.checks
            for a, b in ev:
                t0 = time.perf_counter()
                a.record()
                f(q, k, v)
                b.record()
                hs.append((time.perf_counter() - t0) * 1e6)
            torch.cuda.synchronize()
            gc.enable()
            ts = sorted(a.elapsed_time(b) for a, b in ev)
            hs.sort()
            print(f"{name:10s} gc={'on ' if gc_on else 'off'} device ms p10 {ts[20]:.3f} p50 {ts[100]:.3f} "
                  f"p90 {ts[180]:.3f} max {ts[-1]:.3f} | host us p10 {hs[20]:.0f} p50 {hs[100]:.0f} p90 {hs[180]:.0f} "
                  f"max {hs[-1]:.0f} | block checks {verified.checks - c0}", flush=True)


if __name__ == "__main__":
    main()
