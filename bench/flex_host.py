"""Where does a compiled flex call's time go? Host µs per call, wall, kernels, and a cProfile.

    python3 bench/flex_host.py [--shape 2,16,4096,128] [--profile causal]
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import sys

import torch

sys.path.insert(0, __import__("os").path.dirname(__file__))
from overhead import host_us, kernels, wall_ms  # noqa: E402


def main() -> None:
    import te_compile  # noqa: F401
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    p = argparse.ArgumentParser()
    p.add_argument("--shape", default="2,16,4096,128")
    p.add_argument("--profile", default="causal")
    a = p.parse_args()
    B, H, L, D = (int(x) for x in a.shape.split(","))
    q, k, v = (torch.randn(B, H, L, D, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
    causal = create_block_mask(lambda b, h, q_, kv: q_ >= kv, 1, 1, L, L, device="cuda")
    window = create_block_mask(lambda b, h, q_, kv: (q_ >= kv) & (q_ - kv <= 1024), 1, 1, L, L, device="cuda")
    softcap = lambda s, b, h, q_, kv: 30.0 * torch.tanh(s / 30.0)  # noqa: E731
    cases = {"none": (None, None), "causal": (None, causal), "sliding": (None, window),
             "softcap": (softcap, None), "softcap+causal": (softcap, causal)}
    for name, (sm, bm) in cases.items():
        def fn(q, k, v, sm=sm, bm=bm):
            return flex_attention(q, k, v, score_mod=sm, block_mask=bm)
        torch._dynamo.reset()
        for impl, f in (("te_compile", torch.compile(fn, backend="te_compile")), ("inductor", torch.compile(fn))):
            g = lambda f=f: f(q, k, v)  # noqa: E731
            out = g()
            dout = torch.randn_like(out)
            bwd = lambda out=out, dout=dout: torch.autograd.grad(out, (q, k, v), dout, retain_graph=True)  # noqa: E731
            for direction, h in (("fwd", g), ("bwd", bwd)):
                ks = kernels(h)
                print(f"{name:15s} {impl:10s} {direction}: host {host_us(h):7.1f} us/call, wall {wall_ms(h):7.3f} ms, "
                      f"kernels {sum(t for t, _ in ks) / 1e3:7.3f} ms ({len(ks)} kernels)", flush=True)
                for t, kname in ks[:4]:
                    print(f"      {t / 1e3:7.3f} ms  {kname}")
            if impl == "te_compile" and name == a.profile:
                pr = cProfile.Profile()
                pr.enable()
                for _ in range(200):
                    g()
                pr.disable()
                torch.cuda.synchronize()
                pstats.Stats(pr, stream=sys.stdout).sort_stats("tottime").print_stats(30)
                pr = cProfile.Profile()
                pr.enable()
                for _ in range(200):
                    bwd()
                pr.disable()
                torch.cuda.synchronize()
                pstats.Stats(pr, stream=sys.stdout).sort_stats("tottime").print_stats(30)


if __name__ == "__main__":
    main()
