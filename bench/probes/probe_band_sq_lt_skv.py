"""Does cuDNN skip the masked tiles of a band with fewer queries than keys? (GPU; the cuDNN that is loaded)

te_compile serve="always" (and Inductor's flex beside it), 2x16xLxSx128 bf16, fwd and fwd+bwd ms per call
(loops of 20 between CUDA events, median of 5 rounds): the square causal (L = S = 4096), the band
`q_idx + 512 >= kv_idx` at L 3584 / S 4096 (a top-left band, right bound 512: the same tiles as causal over
the last 3584 rows), and no mask at L 3584 / S 4096. A band that skips its masked tiles costs about what the
causal square's last 3584 rows cost, well under the unmasked row.

    python3 bench/probes/probe_band_sq_lt_skv.py
"""
import statistics

import torch
from torch.nn.attention.flex_attention import create_block_mask, flex_attention

import te_compile
from te_compile.report import record_reports

torch._inductor.config.compile_threads = 1
cases = {"causal L=S=4096": (4096, 4096, lambda b, h, q, k: q >= k),
         "band q+512>=kv L=3584 S=4096": (3584, 4096, lambda b, h, q, k: q + 512 >= k),
         "no mask L=3584 S=4096": (3584, 4096, None)}


def timed(fn, n=20):
    fn()
    torch.cuda.synchronize()
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record()
    for _ in range(n):
        fn()
    b.record()
    torch.cuda.synchronize()
    return a.elapsed_time(b) / n


print(torch.cuda.get_device_name(), "cuDNN", torch.backends.cudnn.version(), flush=True)
for name, (L, S, mm) in cases.items():
    q = torch.randn(2, 16, L, 128, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    k, v = (torch.randn(2, 16, S, 128, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(2))
    bm = None if mm is None else create_block_mask(mm, 1, 1, L, S, device="cuda")
    do = torch.randn_like(q)

    def f(q, k, v):
        return flex_attention(q, k, v, block_mask=bm)
    row = []
    for impl, be in (("te", te_compile.backend(serve="always")), ("inductor", "inductor")):
        torch._dynamo.reset()
        g = torch.compile(f, backend=be, dynamic=False)
        with record_reports() as reps:
            g(q, k, v)
        served = sum(d.rewrite for r in reps for d in r.decisions) if impl == "te" else "-"
        with torch.no_grad():
            fwd = statistics.median(timed(lambda: g(q, k, v)) for _ in range(5))
        step = statistics.median(timed(lambda: torch.autograd.grad(g(q, k, v), (q, k, v), do)) for _ in range(5))
        row.append(f"{impl} (served {served}) fwd {fwd:.3f} fwd+bwd {step:.3f}")
    print(f"{name:30s} " + "  |  ".join(row), flush=True)
