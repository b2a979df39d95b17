"""Where a CUDA-graph step's time goes, te_compile vs plain torch.compile (GPU, mode="reduce-overhead").

    python3 bench/probes/probe_graph_host.py [--shape 4,16,1024,64] [--variants none,softcap] [--train]

Per variant: loop ms per step and host µs per step in alternating rounds, the GPU kernels of one
step (torch.profiler, CUDA activity: name, count, µs), and a cProfile of the host side (top rows by
own time). Forward-only (inference, inputs need no gradient) unless --train.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import statistics
import time

import torch


def variants(H: int, L: int):
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    causal = create_block_mask(lambda b, h, q, kv: q >= kv, 1, 1, L, L, device="cuda")
    sliding = create_block_mask(lambda b, h, q, kv: (q >= kv) & (q - kv < 512), 1, 1, L, L, device="cuda")

    softcap = lambda s, b, h, q, kv: 30.0 * torch.tanh(s / 30.0)  # noqa: E731
    alibi = lambda s, b, h, q, kv: s + torch.exp2(-((h + 1) * 8.0 / H)) * (kv - q)  # noqa: E731
    return {
        "none": lambda q, k, v: flex_attention(q, k, v),
        "softcap": lambda q, k, v: flex_attention(q, k, v, score_mod=softcap),
        "alibi": lambda q, k, v: flex_attention(q, k, v, score_mod=alibi),
        "causal": lambda q, k, v: flex_attention(q, k, v, block_mask=causal),
        "sliding512": lambda q, k, v: flex_attention(q, k, v, block_mask=sliding),
        "sdpa": lambda q, k, v: torch.nn.functional.scaled_dot_product_attention(q, k, v),
    }


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--shape", default="4,16,1024,64")
    p.add_argument("--variants", default="none,softcap")
    p.add_argument("--train", action="store_true")
    p.add_argument("--iters", type=int, default=200)
    a = p.parse_args()
    import torch._inductor.config as ic
    ic.compile_threads = 1
    B, H, L, D = (int(x) for x in a.shape.split(","))
    g = torch.Generator(device="cuda").manual_seed(0)
    args = [torch.randn(B, H, L, D, device="cuda", dtype=torch.bfloat16, generator=g).requires_grad_(a.train)
            for _ in range(3)]
    dout = torch.randn_like(args[0])
    import te_compile

    for name in a.variants.split(","):
        fn = variants(H, L)[name]
        torch._dynamo.reset()
        fns = {"te_compile": torch.compile(fn, backend=te_compile.backend(serve="always"), mode="reduce-overhead"),
               "torch.compile": torch.compile(fn, mode="reduce-overhead")}

        def stepper(f):
            def step():
                torch.compiler.cudagraph_mark_step_begin()
                for x in args:
                    x.grad = None
                o = f(*args)
                if a.train:
                    o.backward(dout)
            return step
        steps = {k: stepper(f) for k, f in fns.items()}
        for s in steps.values():
            for _ in range(20):
                s()
        torch.cuda.synchronize()
        res: dict = {k: {"loop": [], "host": []} for k in steps}
        for _ in range(5):
            for k, s in steps.items():
                t0 = time.perf_counter()
                e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                e0.record()
                for _ in range(a.iters):
                    s()
                e1.record()
                host = (time.perf_counter() - t0) / a.iters * 1e6
                torch.cuda.synchronize()
                res[k]["loop"].append(e0.elapsed_time(e1) / a.iters * 1e3)
                res[k]["host"].append(host)
        print(f"== {name} {a.shape} {'train' if a.train else 'infer'} reduce-overhead ({torch.cuda.get_device_name()})")
        for k, r in res.items():
            print(f"  {k:14s} loop {statistics.median(r['loop']):7.1f} us/step  host {statistics.median(r['host']):7.1f} "
                  f"us/step  (loop rounds {' '.join(f'{x:.0f}' for x in r['loop'])})")
        from torch.profiler import ProfilerActivity, profile
        for k, s in steps.items():
            n = 20
            with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
                for _ in range(n):
                    s()
                torch.cuda.synchronize()
            print(f"  -- {k}: GPU kernels per step")
            for e in sorted(prof.key_averages(), key=lambda e: -e.device_time_total)[:8]:
                if e.device_time_total > 0:
                    print(f"     {e.key[:80]:80s} x{e.count / n:4.1f}  {e.device_time_total / n:7.1f} us/step")
            print(f"  -- {k}: CPU ops per step (self)")
            for e in sorted(prof.key_averages(), key=lambda e: -e.self_cpu_time_total)[:10]:
                print(f"     {e.key[:80]:80s} x{e.count / n:4.1f}  {e.self_cpu_time_total / n:7.1f} us/step")
            pr = cProfile.Profile()
            pr.enable()
            for _ in range(a.iters):
                s()
            pr.disable()
            torch.cuda.synchronize()
            buf = io.StringIO()
            pstats.Stats(pr, stream=buf).sort_stats("tottime").print_stats(18)
            print(f"  -- {k}: cProfile of {a.iters} steps (tottime)")
            print("\n".join("     " + ln for ln in buf.getvalue().splitlines()[6:32]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
