"""Where a sliding-window training step's time goes, te_compile (serve="always", native band) vs Inductor (GPU).

    python3 bench/probes/probe_sliding_profile.py [--shape 2,16,4096,128] [--window 1024]

Per side: wall ms per step (a loop of steps, one sync at the end), the CUDA kernels' total ms per step from the
profiler, and the top kernels. A step whose wall time is well above its kernel time is host-bound.
"""

from __future__ import annotations

import argparse
import time

import torch
from torch.nn.attention.flex_attention import create_block_mask, flex_attention
from torch.profiler import ProfilerActivity, profile

import te_compile


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--shape", default="2,16,4096,128")
    p.add_argument("--window", type=int, default=1024)
    a = p.parse_args()
    B, H, L, D = (int(x) for x in a.shape.split(","))
    W = a.window
    q, k, v, do = (torch.randn(B, H, L, D, device="cuda", dtype=torch.bfloat16) for _ in range(4))
    qg, kg, vg = (x.clone().requires_grad_() for x in (q, k, v))
    bm = create_block_mask(lambda b, h, i, j: (i >= j) & (i - j <= W), 1, 1, L, L, device="cuda")

    def call(q_, k_, v_):
        return flex_attention(q_, k_, v_, block_mask=bm)
    print(f"{torch.cuda.get_device_name()}  cuDNN {torch.backends.cudnn.version()}  shape {a.shape}  W {W}", flush=True)
    for name, be in (("te_compile", te_compile.backend(serve="always")), ("torch.compile", "inductor")):
        torch._dynamo.reset()
        f = torch.compile(call, backend=be, dynamic=False)

        def step():
            f(qg, kg, vg).backward(do)
        for _ in range(5):
            step()
        torch.cuda.synchronize()
        n = 30
        t0 = time.perf_counter()
        for _ in range(n):
            step()
        torch.cuda.synchronize()
        wall = (time.perf_counter() - t0) / n * 1e3
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            for _ in range(10):
                step()
            torch.cuda.synchronize()
        ev = [e for e in prof.key_averages() if e.device_type == torch.autograd.DeviceType.CUDA]
        total = sum(e.self_device_time_total for e in ev) / 10 / 1e3
        print(f"{name:14s} wall {wall:.3f} ms/step  kernels {total:.3f} ms/step", flush=True)
        for e in sorted(ev, key=lambda e: -e.self_device_time_total)[:6]:
            print(f"    {e.self_device_time_total / 10 / 1e3:7.3f} ms  x{e.count // 10:<3d} {e.key[:110]}", flush=True)


if __name__ == "__main__":
    main()
