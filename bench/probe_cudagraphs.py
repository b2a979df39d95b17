"""Which te_compile op output is not in the CUDA-graph pool under mode="reduce-overhead"? (diagnostic)

    python3 bench/probe_cudagraphs.py
"""

import torch
import torch.nn.functional as F

import te_compile  # noqa: F401
from te_compile import kernels
from torch._inductor import cudagraph_trees

seen = {}


def wrap(name, f):
    def g(*a, **k):
        out = f(*a, **k)
        outs = out if isinstance(out, tuple) else (out,)
        for i, t in enumerate(outs):
            if isinstance(t, torch.Tensor):
                seen[t.untyped_storage().data_ptr()] = f"{name} output {i} shape {tuple(t.shape)} numel {t.numel()}"
        ins = [x for x in a if isinstance(x, torch.Tensor)]
        for i, t in enumerate(ins):
            seen.setdefault(t.untyped_storage().data_ptr(), f"{name} input {i} shape {tuple(t.shape)}")
        return out
    return g


kernels.attn_fwd_cuda = wrap("attn_fwd", kernels.attn_fwd_cuda)
kernels.attn_bwd_cuda = wrap("attn_bwd", kernels.attn_bwd_cuda)
import te_compile.ops as ops  # noqa: E402
ops.attn_fwd_cuda, ops.attn_bwd_cuda = kernels.attn_fwd_cuda, kernels.attn_bwd_cuda
orig = cudagraph_trees.check_memory_pool


def check(device, pool_id, live):
    try:
        return orig(device, pool_id, live)
    except RuntimeError as e:
        import re
        for p in re.findall(r"\{([0-9, ]+)\}", str(e))[0].split(","):
            print("NOT IN POOL:", int(p), "->", seen.get(int(p), "unknown (not an op tensor)"))
        raise


cudagraph_trees.check_memory_pool = check


def fn(q, k, v):
    return F.scaled_dot_product_attention(q, k, v, is_causal=True)


compiled = torch.compile(fn, backend=te_compile.backend(serve="always"), mode="reduce-overhead")
for step in range(3):
    q, k, v = (torch.randn(2, 4, 256, 64, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
    try:
        out = compiled(q, k, v)
        out.backward(torch.randn_like(out))
        print("step", step, "ok")
    except RuntimeError as e:
        print("step", step, "failed:", str(e)[:200])
        break
