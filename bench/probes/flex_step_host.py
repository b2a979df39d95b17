"""Why a served flex training step costs more host time than the bare te op (GPU).

    python3 bench/probes/flex_step_host.py [--shape 8,16,1024,64]

A softcap flex site as a compiled training step, te_compile (serve="always") vs plain torch.compile, and the
te ops called directly (fwd + bwd through autograd, as te_compile.tuning times them): host µs per step in
alternating rounds, the aten / custom ops each step issues (CPU profiler), and a cProfile of the te step.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import torch
from torch.nn.attention.flex_attention import flex_attention

sys.path.insert(0, os.path.dirname(__file__))
from layers import print_profile  # noqa: E402
from step_host import aten_ops, host_us  # noqa: E402


def main() -> int:
    import te_compile
    p = argparse.ArgumentParser()
    p.add_argument("--shape", default="8,16,1024,64")
    p.add_argument("--sort", default="tottime", help="cProfile order (tottime, cumulative)")
    a = p.parse_args()
    import torch._inductor.config as ic
    ic.compile_threads = 1
    B, H, L, D = (int(x) for x in a.shape.split(","))
    q, k, v, do = (torch.randn(B, H, L, D, device="cuda", dtype=torch.bfloat16) for _ in range(4))
    q, k, v = (t.requires_grad_() for t in (q, k, v))

    def fn(q, k, v):
        return flex_attention(q, k, v, score_mod=lambda s, b, h, i, j: 30.0 * torch.tanh(s / 30.0))

    steps = {}
    for name, be in (("te_compile", te_compile.backend(serve="always")), ("torch.compile", "inductor")):
        f = torch.compile(fn, backend=be, dynamic=False)

        def step(f=f):
            f(q, k, v).backward(do)
        steps[name] = step
        step()
    from te_compile.tuning.candidates import build
    from te_compile.spec import AttentionSpec
    spec = AttentionSpec(scale=D ** -0.5, source="flex", score="(mul (tanh (div score 30.0)) 30.0)")
    te, tc = build(q, k, v, None, spec, True, False)
    steps["te op direct (tuning's candidate)"] = te
    steps["flex compiled direct (tuning's candidate)"] = tc
    for _ in range(3):
        for name, s in steps.items():
            print(f"step host {name:44s} {host_us(s):8.1f} us", flush=True)
    for name, s in steps.items():
        print(f"--- ops issued per step: {name}")
        print("\n".join(aten_ops(s)))
    print("--- cProfile te_compile step (200 steps, by own time)")
    print_profile(steps["te_compile"], n=200, sort=a.sort, limit=70)
    print("--- cProfile te op direct (200 steps, by own time)")
    print_profile(steps["te op direct (tuning's candidate)"], n=200, limit=20)
    for name, s in steps.items():
        for _ in range(10):
            s()
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(200):
            s()
        torch.cuda.synchronize()
        print(f"step wall {name:44s} {(time.perf_counter() - t0) / 200 * 1e6:8.1f} us", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
