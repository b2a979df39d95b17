"""Ad-hoc differential check on the CPU (reference target, float64) of forms the fuzzer does not draw; prints
ok / BAD / ERR per form against eager. Run: python3 bench/probes/diff_edges.py"""
import torch, te_compile, warnings, torch.nn.functional as F
warnings.filterwarnings("ignore")
import torch.nn.attention.flex_attention as fa
fa._validate_device = lambda *a, **k: None
from torch.nn.attention.flex_attention import flex_attention
be = te_compile.backend(inner="aot_eager", serve="always", target="reference")
sd = F.scaled_dot_product_attention
def t(*s, g=True, dt=torch.float64): return torch.randn(*s, dtype=dt, requires_grad=g)
def go(name, fn, *args):
    torch._dynamo.reset()
    try:
        w = fn(*args); ew = None
    except Exception as e: w, ew = None, type(e).__name__
    torch._dynamo.reset()
    try:
        g = torch.compile(fn, backend=be)(*args); eg = None
    except Exception as e: g, eg = None, f"{type(e).__name__}: {str(e)[:120]}"
    if ew or eg:
        print(("ok " if (ew is None) == (eg is None) else "ERR"), name, "eager:", ew, "te:", eg); return
    same = torch.allclose(g, w, equal_nan=True, atol=1e-5, rtol=1e-5) and g.shape == w.shape and g.dtype == w.dtype
    print("ok " if same else "BAD", name, tuple(g.shape), g.dtype, w.dtype)
go("L=0", lambda q,k,v: sd(q,k,v), t(1,2,0,8), t(1,2,4,8), t(1,2,4,8))
go("S=0", lambda q,k,v: sd(q,k,v), t(1,2,4,8), t(1,2,0,8), t(1,2,0,8))
go("B=0", lambda q,k,v: sd(q,k,v, is_causal=True), t(0,2,4,8), t(0,2,4,8), t(0,2,4,8))
go("fp16", lambda q,k,v: sd(q,k,v, is_causal=True), t(1,2,16,8,dt=torch.float16), t(1,2,16,8,dt=torch.float16), t(1,2,16,8,dt=torch.float16))
go("fp16 flex", lambda q,k,v: flex_attention(q,k,v, score_mod=lambda s,b,h,i,j: s*2), t(1,2,16,8,dt=torch.float16), t(1,2,16,8,dt=torch.float16), t(1,2,16,8,dt=torch.float16))
go("bf16 flex", lambda q,k,v: flex_attention(q,k,v, score_mod=lambda s,b,h,i,j: s*2), t(1,2,16,8,dt=torch.bfloat16), t(1,2,16,8,dt=torch.bfloat16), t(1,2,16,8,dt=torch.bfloat16))
go("fp32 mask fp64 q", lambda q,k,v,m: sd(q,k,v, attn_mask=m), t(1,2,4,8), t(1,2,4,8), t(1,2,4,8), torch.randn(4,4))
go("D=1", lambda q,k,v: sd(q,k,v), t(1,2,4,1), t(1,2,4,1), t(1,2,4,1))
go("D=300", lambda q,k,v: sd(q,k,v), t(1,2,4,300), t(1,2,4,300), t(1,2,4,300))
go("int scale", lambda q,k,v: sd(q,k,v, scale=1), t(1,2,4,8), t(1,2,4,8), t(1,2,4,8))
go("no grad", lambda q,k,v: sd(q,k,v, is_causal=True), t(1,2,4,8,g=False), t(1,2,4,8,g=False), t(1,2,4,8,g=False))
go("expanded k", lambda q,k,v: sd(q,k.expand(2,2,4,8),v.expand(2,2,4,8)), t(2,2,4,8), t(1,2,4,8), t(1,2,4,8))
go("strided zero", lambda q,k,v: sd(q,k,v), t(2,2,4,8), t(2,1,4,8).expand(2,2,4,8), t(2,2,4,8))
go("flex L=1", lambda q,k,v: flex_attention(q,k,v, score_mod=lambda s,b,h,i,j: s + i - j), t(1,2,1,8), t(1,2,5,8), t(1,2,5,8))
# mutation between calls
T = torch.randn(8, 8, dtype=torch.float64)
def f(q,k,v): return flex_attention(q,k,v, score_mod=lambda s,b,h,i,j: s + T[i, j])
q,k,v = t(1,2,8,8,g=False), t(1,2,8,8,g=False), t(1,2,8,8,g=False)
torch._dynamo.reset()
cf = torch.compile(f, backend=be)
a = cf(q,k,v); T.mul_(3); b = cf(q,k,v); w = f(q,k,v)
print("ok " if torch.allclose(b, w) and not torch.allclose(a, b) else "BAD", "captured table mutated in place between calls")
s = 2.0
def g(q,k,v): return flex_attention(q,k,v, score_mod=lambda x,b,h,i,j: x * s)
torch._dynamo.reset()
cg = torch.compile(g, backend=be)
a = cg(q,k,v); s = 5.0; b = cg(q,k,v); w = g(q,k,v)
print("ok " if torch.allclose(b, w) else "BAD", "python scalar changed between calls")
mask = torch.zeros(8, 8, dtype=torch.float64)
def h(q,k,v): return sd(q,k,v, attn_mask=mask)
torch._dynamo.reset()
ch = torch.compile(h, backend=be)
a = ch(q,k,v); mask[:, 4:] = float("-inf"); b = ch(q,k,v); w = h(q,k,v)
print("ok " if torch.allclose(b, w) else "BAD", "sdpa mask mutated between calls")
