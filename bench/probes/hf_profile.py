"""Where does a Hugging Face training step spend GPU time, te_compile (serve="always") vs torch.compile?

    python3 bench/probes/hf_profile.py [--model llama] [--impl sdpa] [--batch 1 --seq 4096]

Prints, per implementation, the step's kernels by total device time (count, total ms per step) from the
torch profiler, so extra copies or layout kernels around the attention op show up.
"""

from __future__ import annotations

import argparse
import os
import sys

import torch
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # bench/: hf_models
from hf_models import _model  # noqa: E402


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--model", default="llama")
    p.add_argument("--impl", default="sdpa")
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--seq", type=int, default=4096)
    p.add_argument("--top", type=int, default=18)
    a = p.parse_args()
    import te_compile

    model = _model(a.model, a.impl)
    ids = torch.randint(0, 32000, (a.batch, a.seq), device="cuda")
    for name, be in (("te_compile", te_compile.backend(serve="always")), ("torch.compile", "inductor")):
        torch._dynamo.reset()
        f = torch.compile(model, backend=be)

        def step():
            model.zero_grad(set_to_none=True)
            f(input_ids=ids, labels=ids).loss.backward()
        for _ in range(3):
            step()
        torch.cuda.synchronize()
        n = 3
        with profile(activities=[ProfilerActivity.CUDA, ProfilerActivity.CPU]) as prof:
            for _ in range(n):
                step()
            torch.cuda.synchronize()
        rows = []
        for e in prof.key_averages():
            t = getattr(e, "self_device_time_total", 0) or getattr(e, "self_cuda_time_total", 0)
            if t > 0:
                rows.append((t / n / 1e3, e.count // n, e.key[:110]))
        rows.sort(reverse=True)
        total = sum(r[0] for r in rows)
        print(f"\n== {name}: {a.model}/{a.impl} {a.batch}x{a.seq}: {total:.2f} ms of kernels per step")
        for t, c, k in rows[: a.top]:
            print(f"  {t:7.3f} ms  x{c:3d}  {k}")
        # host side: syncs and copies (a sync makes every later host microsecond visible), te_compile's ops
        host = [(e.cpu_time_total / n / 1e3, e.count // n, e.key[:90]) for e in prof.key_averages()
                if any(w in e.key for w in ("Synchronize", "Memcpy", "te_compile", "item", "_local_scalar"))]
        for t, c, k in sorted(host, reverse=True)[:12]:
            print(f"  host {t:7.3f} ms  x{c:3d}  {k}")
        import time
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(5):
            step()
        t1 = time.perf_counter()
        torch.cuda.synchronize()
        t2 = time.perf_counter()
        print(f"  host {1e3 * (t1 - t0) / 5:.2f} ms per step issued, wall {1e3 * (t2 - t0) / 5:.2f} ms per step")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
