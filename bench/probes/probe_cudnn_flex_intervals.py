"""cuDNN frontend's own flex attention (``cudnn.flex_attention``: per-query key intervals, block-sparse sm90
kernels written in the CuTe DSL) on the flex sweep's masks, against Inductor's flex (GPU; needs the CuTe DSL and
tvm-ffi, which the FA4 carry installs: run after .fa4a/unpack.py and . .fa4b/install.sh).

The lever for the masks te_compile keeps today because cuDNN's graph API cannot skip their tiles: document
(document-causal, four documents), prefix-LM (P = 512) and the sliding windows. 2x16x4096x128 bf16, the sweep's
masks; per variant: max |difference| of out and dq / dk / dv against Inductor's flex (bf16 both), then ms per
call (CUDA events around loops of 20, median of 5 rounds) of the forward and of forward + backward, and the
plan build time.

    python3 bench/probes/probe_cudnn_flex_intervals.py
"""
import statistics
import time

import torch
from torch.nn.attention.flex_attention import create_block_mask, flex_attention

from cudnn.flex_attention import create_mask_plan, flex_attn_func

B, H, L, D, W, P = 2, 16, 4096, 128, 1024, 512
i = torch.arange(L, device="cuda", dtype=torch.int32)
docs = i // (L // 4)
start = docs * (L // 4)
zero = torch.zeros_like(i)


def rows(*ends):  # [1, nfunc, B * L] interval endpoints, batch-major
    return torch.stack(ends).repeat(1, B).unsqueeze(0).contiguous()


variants = {  # name: (mask_mod, endpoints [0,F0) u [F1,F2) ...)
    "causal": (lambda b, h, q, kv: q >= kv, rows(i + 1)),
    "sliding <=": (lambda b, h, q, kv: (q >= kv) & (q - kv <= W), rows(zero, (i - W).clamp_min(0), i + 1)),
    "sliding <": (lambda b, h, q, kv: (q >= kv) & (q - kv < W), rows(zero, (i - W + 1).clamp_min(0), i + 1)),
    "prefix-LM": (lambda b, h, q, kv: (kv < P) | (q >= kv), rows(torch.maximum(i + 1, torch.full_like(i, P)))),
    "document": (lambda b, h, q, kv: (docs[q] == docs[kv]) & (q >= kv), rows(zero, start, i + 1)),
}


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
q, k, v = (torch.randn(B, L, H, D, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
do = torch.randn(B, L, H, D, device="cuda", dtype=torch.bfloat16)
inductor = torch.compile(flex_attention, dynamic=False)
for name, (mask_mod, ends) in variants.items():
    t0 = time.perf_counter()
    try:
        plan = create_mask_plan(ends, q, k, v, build_backward=True)
        out = flex_attn_func(q, k, v, mask_plan=plan)
    except Exception as e:  # noqa: BLE001 - a variant the library refuses is a row
        print(f"{name:12s} cudnn.flex_attention refused: {type(e).__name__}: {str(e)[:200]}", flush=True)
        continue
    build_s = time.perf_counter() - t0
    bm = create_block_mask(mask_mod, 1, 1, L, L, device="cuda")

    def ind(bm=bm):
        return inductor(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), block_mask=bm).transpose(1, 2)

    def cud(plan=plan):
        return flex_attn_func(q, k, v, mask_plan=plan)
    g_c = torch.autograd.grad(cud(), (q, k, v), do)
    o_i = ind()
    g_i = torch.autograd.grad(o_i, (q, k, v), do)
    errs = [float((a.float() - b.float()).abs().max()) for a, b in zip((out, *g_c), (o_i, *g_i))]
    with torch.no_grad():
        f_c = statistics.median(timed(cud) for _ in range(5))
        f_i = statistics.median(timed(ind) for _ in range(5))
    s_c = statistics.median(timed(lambda: torch.autograd.grad(cud(), (q, k, v), do)) for _ in range(5))
    s_i = statistics.median(timed(lambda: torch.autograd.grad(ind(), (q, k, v), do)) for _ in range(5))
    print(f"{name:12s} plan {build_s:5.1f} s  |diff| out {errs[0]:.3g} dq {errs[1]:.3g} dk {errs[2]:.3g} dv {errs[3]:.3g}  "
          f"fwd {f_c:.3f} vs Inductor {f_i:.3f} ms ({f_i / f_c:.2f}x)  fwd+bwd {s_c:.3f} vs {s_i:.3f} ms "
          f"({s_i / s_c:.2f}x)", flush=True)
