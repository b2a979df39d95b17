"""Does cuDNN skip masked tiles for ALiBi + causal (mask first, an additive score_mod reading an (in 0)
input)? fwd / bwd ms of te_compile (serve="always") and the error vs eager float32, with ALiBi without a
mask and softcap + causal as references.

    python3 bench/probes/probe_alibi.py [--shape 2,16,4096,128]

H200, 2026-11-26: ALiBi + causal 0.534 / 1.345 ms vs ALiBi 0.506 / 1.306 (no skipping, forward or
backward); softcap + causal 0.351 / 0.879 (skips). An explicit dS * 1 bprop changed nothing (1.370 ms);
a constant slope + causal 0.583 / 1.323 does not skip either (so not the (in 0) input: index math after
the mask).
"""

from __future__ import annotations

import argparse

import torch
from torch.nn.attention.flex_attention import create_block_mask, flex_attention

import te_compile
from te_compile.benchmark import measure


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--shape", default="2,16,4096,128")
    a = p.parse_args()
    B, H, L, D = (int(x) for x in a.shape.split(","))
    g = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (torch.randn(B, H, L, D, device="cuda", dtype=torch.bfloat16, generator=g).requires_grad_() for _ in range(3))
    bm = create_block_mask(lambda b, h, q_, kv: q_ >= kv, 1, 1, L, L, device="cuda")
    alibi = lambda s, b, h, q_, kv: s + torch.exp2(-((h + 1) * 8.0 / H)) * (kv - q_)  # noqa: E731
    softcap = lambda s, b, h, q_, kv: 30.0 * torch.tanh(s / 30.0)  # noqa: E731
    const_slope = lambda s, b, h, q_, kv: s + 0.0625 * (kv - q_)  # noqa: E731 - no (in i) input
    cases = {"ALiBi + causal": (alibi, bm), "ALiBi": (alibi, None), "softcap + causal": (softcap, bm),
             "const slope + causal": (const_slope, bm), "const slope": (const_slope, None)}
    for _ in range(1):
        for name, (sm, mask) in cases.items():
            def fn(q, k, v, sm=sm, mask=mask):
                return flex_attention(q, k, v, score_mod=sm, block_mask=mask)
            torch._dynamo.reset()
            f = torch.compile(fn, backend=te_compile.backend(serve="always"))
            fwd, bwd = measure(f, [q, k, v], [0, 1, 2], 30)
            out = f(q, k, v)
            dout = torch.randn_like(out)
            got = torch.autograd.grad(out, (q, k, v), dout)
            qf, kf, vf = (t.detach().float().requires_grad_() for t in (q, k, v))
            ref = fn(qf, kf, vf)
            want = torch.autograd.grad(ref, (qf, kf, vf), dout.float())
            err = max(((x.float() - y).abs().max() / y.abs().max()).item() for x, y in zip((out, *got), (ref, *want)))
            print(f"{name:18s} fwd {fwd:6.3f} ms  bwd {bwd:6.3f} ms  max rel err {err:.2e}",
                  flush=True)


if __name__ == "__main__":
    main()
