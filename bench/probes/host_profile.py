"""cProfile of the te_compile ops' host path (direct calls, cached graphs): what costs µs."""

from __future__ import annotations

import os
import sys
import time

import torch

import te_compile  # noqa: F401

sys.path.insert(0, os.path.dirname(__file__))
from layers import print_profile  # noqa: E402
from te_compile.spec import AttentionSpec


def main() -> None:
    B, H, L, D = 2, 16, 1024, 128
    q, k, v, do = (torch.randn(B, H, L, D, device="cuda", dtype=torch.bfloat16) for _ in range(4))
    spec = AttentionSpec(mask="causal").key()
    o, lse = torch.ops.te_compile.attn_fwd(q, k, v, None, [], spec)
    fwd = lambda: torch.ops.te_compile.attn_fwd(q, k, v, None, [], spec)  # noqa: E731
    bwd = lambda: torch.ops.te_compile.attn_bwd(do, q, k, v, o, lse, None, [], spec, False)  # noqa: E731
    @torch.library.custom_op("te_bench::nop", mutates_args=())
    def nop(x: torch.Tensor) -> torch.Tensor:  # the bare cost of a Python custom op
        return x.clone()

    noop = lambda: nop(q[0, 0, 0])  # noqa: E731
    from te_compile.cudnn import graphs
    direct = lambda: graphs.forward(q, k, v, None, AttentionSpec.from_key(spec))  # noqa: E731
    for name, f in (("custom_op dispatch+clone", noop), ("fwd graphs.forward direct", direct),
                    ("fwd op", fwd), ("bwd op", bwd)):
        for _ in range(20):
            f()
        torch.cuda.synchronize()
        n = 200
        t0 = time.perf_counter()
        for _ in range(n):
            f()
        dt = (time.perf_counter() - t0) / n * 1e6
        torch.cuda.synchronize()
        print(f"{name:28s} host {dt:7.1f} us/call")
    print_profile(bwd)


if __name__ == "__main__":
    main()
