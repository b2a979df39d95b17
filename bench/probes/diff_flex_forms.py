"""Ad-hoc differential check on the CPU (reference target, float64) of forms the fuzzer does not draw; prints
ok / BAD / ERR per form against eager. Run: python3 bench/probes/diff_flex_forms.py"""
import torch, te_compile, warnings
warnings.filterwarnings("ignore")
from torch.nn.attention.flex_attention import flex_attention, create_block_mask
import torch.nn.attention.flex_attention as fa
fa._validate_device = lambda *a, **k: None
be = te_compile.backend(inner="aot_eager", serve="always", target="reference")
def t(*s, g=True): return torch.randn(*s, dtype=torch.float64, requires_grad=g)
def err(a, b):
    if a is None or b is None: return 0.0 if a is b else float('inf')
    a, b = a.double(), b.double()
    if (torch.isnan(a) != torch.isnan(b)).any(): return float('nan')
    a, b = torch.nan_to_num(a, posinf=1e300, neginf=-1e300), torch.nan_to_num(b, posinf=1e300, neginf=-1e300)
    return ((a - b).abs().max() / (b.abs().max() + 1e-6)).item()
def check(name, fn, *args, lse=False):
    leaves = [a for a in args if isinstance(a, torch.Tensor) and a.requires_grad]
    def run(f):
        out = f(*args)
        o = out[0] if isinstance(out, tuple) else out
        loss = o.square().sum() + (out[1].nan_to_num(0, 0, 0).sum() if lse and isinstance(out, tuple) else 0)
        return [o] + ([out[1]] if isinstance(out, tuple) else []) + list(torch.autograd.grad(loss, leaves, allow_unused=True))
    torch._dynamo.reset()
    try: want = run(fn)
    except Exception as e: print("eager raised", name, type(e).__name__, str(e)[:100]); return
    torch._dynamo.reset()
    rep = te_compile.explain(fn, *args, serve="always", target="reference")
    served = [d.runs_on for d in rep.decisions]
    torch._dynamo.reset()
    try: got = run(torch.compile(fn, backend=be))
    except Exception as e: print("ERR", name, served, type(e).__name__, str(e)[:200]); return
    es = [err(a, b) for a, b in zip(got, want)]
    bad = any(not (e < 1e-6) for e in es)
    print(f"{'BAD' if bad else 'ok '} {name} {served}: " + " ".join(f"{e:.1e}" for e in es))
B,H,L,D = 2,4,40,8
q,k,v = t(B,H,L,D), t(B,H,L,D), t(B,H,L,D)
kv2 = t(B,2,L,D), t(B,2,L,D)
check("gqa", lambda q,k,v: flex_attention(q,k,v, enable_gqa=True), q, *kv2)
check("gqa softcap", lambda q,k,v: flex_attention(q,k,v, score_mod=lambda s,b,h,i,j: 5*torch.tanh(s/5), enable_gqa=True), q, *kv2)
check("const score", lambda q,k,v: flex_attention(q,k,v, score_mod=lambda s,b,h,i,j: torch.zeros_like(s)), q,k,v)
check("index only", lambda q,k,v: flex_attention(q,k,v, score_mod=lambda s,b,h,i,j: (i - j).to(s.dtype) * 0.1), q,k,v)
check("score*0", lambda q,k,v: flex_attention(q,k,v, score_mod=lambda s,b,h,i,j: s * 0), q,k,v)
bm_none = create_block_mask(lambda b,h,i,j: i < 0, None, None, L, L, device="cpu", BLOCK_SIZE=16)
check("all masked", lambda q,k,v: flex_attention(q,k,v, block_mask=bm_none, return_lse=True), q,k,v, lse=True)
bm_some = create_block_mask(lambda b,h,i,j: (i >= 8) & (j <= i), None, None, L, L, device="cpu", BLOCK_SIZE=16)
check("some rows masked +lse", lambda q,k,v: flex_attention(q,k,v, block_mask=bm_some, return_lse=True), q,k,v, lse=True)
bmb = create_block_mask(lambda b,h,i,j: (j <= i) & ((b == 0) | (j < 10)), B, None, L, L, device="cpu", BLOCK_SIZE=16)
check("batch dep mask", lambda q,k,v: flex_attention(q,k,v, block_mask=bmb), q,k,v)
bmh = create_block_mask(lambda b,h,i,j: (j <= i + h), None, H, L, L, device="cpu", BLOCK_SIZE=(16, 32))
check("head dep mask tuple block", lambda q,k,v: flex_attention(q,k,v, block_mask=bmh), q,k,v)
T = torch.randn(B, H, dtype=torch.float64)
check("captured [b,h]", lambda q,k,v: flex_attention(q,k,v, score_mod=lambda s,b,h,i,j: s + T[b, h]), q,k,v)
Tl = torch.randn(H, requires_grad=True, dtype=torch.float64)
check("learned per head", lambda q,k,v,Tl: flex_attention(q,k,v, score_mod=lambda s,b,h,i,j: s * Tl[h]), q,k,v,Tl)
Tb = torch.randn(L, requires_grad=True, dtype=torch.float64)
check("learned per kv add", lambda q,k,v,Tb: flex_attention(q,k,v, score_mod=lambda s,b,h,i,j: s + Tb[j]), q,k,v,Tb)
check("where score", lambda q,k,v: flex_attention(q,k,v, score_mod=lambda s,b,h,i,j: torch.where(s > 0, s, s * 0.5)), q,k,v)
check("abs score", lambda q,k,v: flex_attention(q,k,v, score_mod=lambda s,b,h,i,j: s.abs()), q,k,v)
check("neg inf via where", lambda q,k,v: flex_attention(q,k,v, score_mod=lambda s,b,h,i,j: torch.where(j > i, float('-inf'), s)), q,k,v)
check("kernel options", lambda q,k,v: flex_attention(q,k,v, kernel_options={"BLOCK_M": 16, "BLOCK_N": 16}), q,k,v)
qs = t(B,H,24,D)
bm_rect = create_block_mask(lambda b,h,i,j: j <= i + 16, None, None, 24, L, device="cpu", BLOCK_SIZE=8)
check("rect mask L<S", lambda q,k,v: flex_attention(q,k,v, block_mask=bm_rect), qs,k,v)
vd = t(B,H,L,16)
check("DV != D", lambda q,k,v: flex_attention(q,k,v, score_mod=lambda s,b,h,i,j: s + 1.0), q,k,vd)
check("two calls share", lambda q,k,v: flex_attention(q,k,v) + flex_attention(q,k,v, score_mod=lambda s,b,h,i,j: s*2), q,k,v)
check("score pow", lambda q,k,v: flex_attention(q,k,v, score_mod=lambda s,b,h,i,j: s ** 2), q,k,v)
check("score exp", lambda q,k,v: flex_attention(q,k,v, score_mod=lambda s,b,h,i,j: torch.exp(s * 0.1)), q,k,v)
check("score clamp", lambda q,k,v: flex_attention(q,k,v, score_mod=lambda s,b,h,i,j: s.clamp(-1, 1)), q,k,v)
check("score sign", lambda q,k,v: flex_attention(q,k,v, score_mod=lambda s,b,h,i,j: torch.sign(s) * s), q,k,v)
check("max with const", lambda q,k,v: flex_attention(q,k,v, score_mod=lambda s,b,h,i,j: torch.maximum(s, torch.tensor(0.0, dtype=s.dtype))), q,k,v)
check("int division idx", lambda q,k,v: flex_attention(q,k,v, score_mod=lambda s,b,h,i,j: s + (i // 4 == j // 4).to(s.dtype)), q,k,v)
check("float idx div", lambda q,k,v: flex_attention(q,k,v, score_mod=lambda s,b,h,i,j: s - (i - j).abs() / 7), q,k,v)
check("scale=None lse", lambda q,k,v: flex_attention(q,k,v, return_lse=True), q,k,v, lse=True)
