"""Host µs per backward call: compiled flex sliding window (te_compile vs Inductor), the bwd op
alone, and a cProfile of te_compile's backward (cumulative).

    python3 bench/probes/bwd_host.py
"""

from __future__ import annotations

import os
import sys

import torch

sys.path.insert(0, os.path.dirname(__file__))
from layers import host_us, print_profile  # noqa: E402


def main() -> None:
    import torch._inductor.config as inductor_config

    import te_compile  # noqa: F401

    inductor_config.compile_threads = 1  # no compile workers starting in the background (bench/probes/jitter.py)
    from te_compile.spec import AttentionSpec
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    B, H, L, D = 2, 16, 1024, 128
    q, k, v = (torch.randn(B, H, L, D, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
    bm = create_block_mask(lambda b, h, q_, kv: (q_ >= kv) & (q_ - kv <= 256), 1, 1, L, L, device="cuda")

    def fn(q, k, v):
        return flex_attention(q, k, v, block_mask=bm)

    for name, f in (("te_compile", torch.compile(fn, backend="te_compile")), ("inductor", torch.compile(fn))):
        out = f(q, k, v)
        dout = torch.randn_like(out)
        bwd = lambda out=out, dout=dout: torch.autograd.grad(out, (q, k, v), dout, retain_graph=True)  # noqa: E731
        print(f"{name:12s} compiled fwd {host_us(lambda f=f: f(q, k, v)):7.1f} us/call, bwd {host_us(bwd):7.1f} us/call",
              flush=True)
        print(f"--- {name} backward, by own time")
        print_profile(bwd, sort="tottime", limit=18)
    spec = AttentionSpec(source="flex", mask_mod="(and (ge q_idx kv_idx) (le (sub q_idx kv_idx) 256))").key()
    qd, kd, vd = q.detach(), k.detach(), v.detach()
    o, lse = torch.ops.te_compile.attn_fwd(qd, kd, vd, None, [], spec)
    do = torch.randn_like(o)
    print(f"attn_bwd op alone {host_us(lambda: torch.ops.te_compile.attn_bwd(do, qd, kd, vd, o, lse, None, [], spec, False)):7.1f} us/call")


if __name__ == "__main__":
    main()
