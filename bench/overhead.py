"""Where does te_compile's time go? Host time per call and device (kernel) time per call.

    python3 bench/overhead.py [--shape 2,16,4096,128] [--causal]

For the te_compile ops called directly (eager autograd), the te_compile backend (Inductor),
and torch's cuDNN SDPA: host µs per call (a loop without syncs, so the GPU does not gate it
unless the queue fills), wall ms per call with a sync, and the kernels' device time from the
profiler. A gap between wall time and kernel time is host overhead the GPU waits for.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.profiler import ProfilerActivity, profile


def host_us(fn, n=50):
    fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    host = (time.perf_counter() - t0) / n * 1e6
    torch.cuda.synchronize()
    return host


def wall_ms(fn, n=30):
    fn()
    torch.cuda.synchronize()
    ts = []
    for _ in range(n):
        t0 = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts) * 1e3


def kernels(fn, n=10):
    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(n):
            fn()
        torch.cuda.synchronize()
    rows = []
    for e in prof.key_averages():
        t = getattr(e, "self_device_time_total", None) or getattr(e, "self_cuda_time_total", 0)
        if t > 0:
            rows.append((t / n, e.key[:90]))
    rows.sort(reverse=True)
    return rows


def main() -> None:
    import te_compile  # noqa: F401
    from te_compile.spec import AttentionSpec

    p = argparse.ArgumentParser()
    p.add_argument("--shape", default="2,16,4096,128")
    p.add_argument("--causal", action="store_true")
    a = p.parse_args()
    B, H, L, D = (int(x) for x in a.shape.split(","))
    q, k, v = (torch.randn(B, H, L, D, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
    spec = AttentionSpec(mask="causal" if a.causal else "none").key()

    def sdpa(q, k, v):
        return F.scaled_dot_product_attention(q, k, v, is_causal=a.causal)

    te_op = lambda: torch.ops.te_compile.attn_fwd(q, k, v, None, [], spec)[0]  # noqa: E731
    te_be = torch.compile(sdpa, backend="te_compile")
    ind = torch.compile(sdpa)

    def torch_cudnn():
        with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
            return sdpa(q, k, v)

    impls = {"te op (eager autograd)": te_op, "te_compile backend": lambda: te_be(q, k, v),
             "torch.compile inductor": lambda: ind(q, k, v), "torch SDPA cudnn": torch_cudnn}
    for name, f in impls.items():
        out = f()
        dout = torch.randn_like(out)
        fwd = f
        bwd = lambda: torch.autograd.grad(out, (q, k, v), dout, retain_graph=True)  # noqa: E731
        for direction, g in (("fwd", fwd), ("bwd", bwd)):
            ks = kernels(g)
            ktot = sum(t for t, _ in ks)
            print(f"{name:26s} {direction}: host {host_us(g):7.1f} us/call, wall {wall_ms(g):7.3f} ms, "
                  f"kernels {ktot / 1e3:7.3f} ms")
            for t, kname in ks[:4]:
                print(f"      {t / 1e3:7.3f} ms  {kname}")


if __name__ == "__main__" and "--flex" not in __import__("sys").argv:
    main()


def flex_main() -> None:
    """Host vs kernel time per call for flex variants: te_compile vs Inductor flex."""
    import sys
    sys.argv = sys.argv[:1]
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention
    B, H, L, D = 2, 16, 4096, 128
    q, k, v = (torch.randn(B, H, L, D, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
    window = create_block_mask(lambda b, h, q_, kv: (q_ >= kv) & (q_ - kv <= 1024), 1, 1, L, L, device="cuda")
    cases = {"none": (None, None), "sliding": (None, window),
             "softcap": (lambda s, b, h, q_, kv: 30.0 * torch.tanh(s / 30.0), None)}
    for name, (sm, bm) in cases.items():
        def fn(q, k, v, sm=sm, bm=bm):
            return flex_attention(q, k, v, score_mod=sm, block_mask=bm)
        torch._dynamo.reset()
        for impl, f in (("te_compile", torch.compile(fn, backend="te_compile")), ("inductor", torch.compile(fn))):
            g = lambda f=f: f(q, k, v)  # noqa: E731
            ks = kernels(g)
            print(f"flex {name:8s} {impl:10s} fwd: host {host_us(g):7.1f} us/call, wall {wall_ms(g):7.3f} ms, "
                  f"kernels {sum(t for t, _ in ks) / 1e3:7.3f} ms ({len(ks)} kernels)")
            for t, kname in ks[:3]:
                print(f"      {t / 1e3:7.3f} ms  {kname}")
        from te_compile.blockmask import verified
        print(f"      BlockMask checks so far: {verified.checks}")


if __name__ == "__main__" and "--flex" in __import__("sys").argv:
    flex_main()
