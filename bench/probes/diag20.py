"""Diagnostics for the independent check's four classes (one GPU call). Not a test."""
import os, sys, traceback, math
import torch
import torch.nn.functional as F
from torch.nn.attention.flex_attention import flex_attention, create_block_mask
import te_compile
from te_compile.testing import fuzz

dev = "cuda"
print("torch", torch.__version__, "cudnn", torch.backends.cudnn.version(), torch.cuda.get_device_name())
import torch._functorch.config as fc
print("force_non_lazy_backward_lowering in functorch config:", hasattr(fc, "force_non_lazy_backward_lowering"))
import torch._inductor.config as ic
print("graph_partition:", getattr(ic, "graph_partition", None), "static launcher:", getattr(ic, "use_static_cuda_launcher", None))

def rel(a, b):
    return ((a.double() - b.double()).norm() / b.double().norm().clamp_min(1e-30)).item()

# ---- class 1: chained table gradient
def c1():
    B, H, L, D = 2, 4, 256, 32
    g = torch.Generator().manual_seed(0)
    tab0 = torch.randn(L, L, generator=g)
    qkv0 = [torch.randn(B, H, L, D, generator=g) for _ in range(3)]
    dout = torch.randn(B, H, L, D, generator=g)
    # gold: dense float64 math
    bias = tab0.double().cuda().requires_grad_(True)
    q, k, v = [t.double().cuda().requires_grad_(True) for t in qkv0]
    o = F.scaled_dot_product_attention(q, k, v, attn_mask=bias)
    o.backward(dout.double().cuda())
    gold = bias.grad
    for kind in ("chain", "comma"):
        for name, dt, how in (("eager fp32", torch.float32, None), ("inductor fp32", torch.float32, "inductor"),
                              ("te_compile bf16", torch.bfloat16, te_compile.backend(serve="always")),
                              ("te_compile ref fp32", torch.float32, te_compile.backend(target="reference"))):
            torch._dynamo.reset()
            try:
                tab = tab0.to(dev, dt).requires_grad_(True)
                q, k, v = [t.to(dev, dt).requires_grad_(True) for t in qkv0]
                sm = (lambda s, b, h, qi, ki: s + tab[qi][ki]) if kind == "chain" else (lambda s, b, h, qi, ki: s + tab[qi, ki])
                fn = lambda q, k, v: flex_attention(q, k, v, score_mod=sm)
                if how is not None:
                    fn = torch.compile(fn, backend=how)
                o = fn(q, k, v)
                o.backward(dout.to(dev, dt))
                print(f"c1 {kind:5s} {name:20s} bias.grad rel err vs float64 math {rel(tab.grad, gold):.3g}")
            except Exception as e:
                print(f"c1 {kind} {name} raised {type(e).__name__}: {str(e)[:200]}")

# ---- class 2: tanh + return_lse at D 16
def c2():
    be = fuzz._prepare("cuda")
    for D in (16, 32, 64):
        for lse_loss in (False, True):
            for mask in (None, "def mask_mod(b, h, q_idx, kv_idx):\n    return q_idx >= 0\n"):
                c = fuzz.Case(seed=11, B=2, H=8, HKV=8, L=128, S=128, D=D, DV=D, scale=0.3,
                              score="def score_mod(score, b, h, q_idx, kv_idx):\n    return torch.tanh(score)\n",
                              mask=mask, return_lse=True, lse_loss=lse_loss)
                out, det, _ = fuzz.compare(c, "cuda", be)
                print(f"c2 D={D} lse_loss={lse_loss} mask={'noop' if mask else None}: {out} {det}")
    # direct: graphs.backward with dlse None / zeros, and Dv != D
    from te_compile.cudnn import graphs
    from te_compile.spec import AttentionSpec
    from te_compile import reference
    print("spec fields:", [f for f in AttentionSpec.__dataclass_fields__])

# ---- class 4: learned rel-pos table, default policy, training
def c4():
    B, H, S, D = 2, 8, 256, 64
    for kind in ("relpos", "t5"):
        for be_name, be in (("inductor", "inductor"), ("te_compile default", "te_compile"),
                            ("te_compile always", te_compile.backend(serve="always"))):
            torch._dynamo.reset()
            try:
                rel_t = torch.nn.Parameter(torch.randn(H, 2 * S - 1, device=dev, dtype=torch.bfloat16))
                t5 = torch.nn.Parameter(torch.randn(H, 32, device=dev, dtype=torch.bfloat16))
                def bucket(d):
                    d = torch.abs(d)
                    return torch.where(d < 16, d, 16 + torch.clamp((torch.log((d + 1).float() / 16) * 5).to(torch.int32), max=15))
                if kind == "relpos":
                    sm = lambda s, b, h, qi, ki: s + rel_t[h, qi - ki + S - 1]
                else:
                    sm = lambda s, b, h, qi, ki: s + t5[h, bucket(qi - ki)]
                q, k, v = [torch.randn(B, H, S, D, device=dev, dtype=torch.bfloat16, requires_grad=True) for _ in range(3)]
                fn = torch.compile(lambda q, k, v: flex_attention(q, k, v, score_mod=sm), backend=be)
                o = fn(q, k, v); o.float().sum().backward()
                print(f"c4 {kind} {be_name}: ok, grad norm {(rel_t.grad if kind=='relpos' else t5.grad).float().norm().item():.4g}")
            except Exception as e:
                print(f"c4 {kind} {be_name}: {type(e).__name__}: {str(e).splitlines()[0][:300]}")

for f in (c1, c2, c4):
    try:
        f()
    except Exception:
        traceback.print_exc()
    sys.stdout.flush()
