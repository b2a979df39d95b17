"""Sliding windows in training: why `q - kv < W` and `q - kv <= W` differ (GPU).

    python3 bench/probes/probe_sliding.py [--shape 2,16,4096,128] [--windows 511,512,1023,1024,1025]

For each window W and spelling (causal & `q - kv < W`, causal & `q - kv <= W`): the forward (inputs without
grad) and the whole training step (forward + backward), te_compile with serve="always" (cuDNN's native band:
left bound W for `<`, W + 1 for `<=`) vs torch.compile's flex (Inductor), median ms of alternating rounds in
one process. The backward is step - forward. Tile alignment shows as a step between W = 1023/1024 and
1024/1025 on one side only.
"""

from __future__ import annotations

import argparse
import statistics

import torch
from torch.nn.attention.flex_attention import create_block_mask, flex_attention

import te_compile


def _ms(fn, iters=20):
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    ts = []
    for _ in range(iters):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        torch.cuda.synchronize()
        ts.append(a.elapsed_time(b))
    return statistics.median(ts)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--shape", default="2,16,4096,128")
    p.add_argument("--windows", default="511,512,1023,1024,1025")
    p.add_argument("--rounds", type=int, default=3)
    a = p.parse_args()
    B, H, L, D = (int(x) for x in a.shape.split(","))
    q, k, v, do = (torch.randn(B, H, L, D, device="cuda", dtype=torch.bfloat16) for _ in range(4))
    qg, kg, vg = (x.clone().requires_grad_() for x in (q, k, v))
    te = te_compile.backend(serve="always")
    print(f"{torch.cuda.get_device_name()}  cuDNN {torch.backends.cudnn.version()}  shape {a.shape}", flush=True)
    for W in (int(w) for w in a.windows.split(",")):
        for spelling, m in (("<", lambda b, h, i, j, W=W: (i >= j) & (i - j < W)),
                            ("<=", lambda b, h, i, j, W=W: (i >= j) & (i - j <= W))):
            torch._dynamo.reset()  # each window compiles afresh (the lambdas share one code object)
            bm = create_block_mask(m, 1, 1, L, L, device="cuda")

            def call(q_, k_, v_, bm=bm):
                return flex_attention(q_, k_, v_, block_mask=bm)
            impls = {"te_compile": torch.compile(call, backend=te, dynamic=False),
                     "torch.compile": torch.compile(call, dynamic=False)}
            res = {n: {"fwd": [], "step": []} for n in impls}
            for _ in range(a.rounds):
                for n, f in impls.items():
                    with torch.no_grad():
                        res[n]["fwd"].append(_ms(lambda f=f: f(q, k, v)))
                    res[n]["step"].append(_ms(lambda f=f: f(qg, kg, vg).backward(do)))
            row = []
            for n in impls:
                fwd, step = statistics.median(res[n]["fwd"]), statistics.median(res[n]["step"])
                row.append(f"{n} fwd {fwd:6.3f} bwd {step - fwd:6.3f} step {step:6.3f}")
            ratio = statistics.median(res["torch.compile"]["step"]) / statistics.median(res["te_compile"]["step"])
            print(f"W {W:5d} {spelling:2s}  " + "  |  ".join(row) + f"  | step ratio {ratio:.2f}x", flush=True)


if __name__ == "__main__":
    main()
