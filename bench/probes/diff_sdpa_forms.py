"""Ad-hoc differential check on the CPU (reference target, float64) of forms the fuzzer does not draw; prints
ok / BAD / ERR per form against eager. Run: python3 bench/probes/diff_sdpa_forms.py"""
import torch, torch.nn.functional as F, te_compile
torch.manual_seed(0)
be = te_compile.backend(inner="aot_eager", serve="always", target="reference")
def check(name, fn, *args, grads=True):
    torch._dynamo.reset()
    try:
        want = fn(*args)
        wg = torch.autograd.grad(want.float().pow(2).sum(), [a for a in args if isinstance(a, torch.Tensor) and a.requires_grad], allow_unused=True) if grads else ()
    except Exception as e:
        want = e
    try:
        got = torch.compile(fn, backend=be, fullgraph=False)(*args)
        gg = torch.autograd.grad(got.float().pow(2).sum(), [a for a in args if isinstance(a, torch.Tensor) and a.requires_grad], allow_unused=True) if grads else ()
    except Exception as e:
        got = e
    if isinstance(want, Exception) or isinstance(got, Exception):
        same = type(want) == type(got)
        print(f"{'ok ' if same else 'ERR'} {name}: eager {type(want).__name__ if isinstance(want, Exception) else 'ok'} / te {type(got).__name__ if isinstance(got, Exception) else 'ok'} {str(got)[:150] if isinstance(got, Exception) else ''}")
        return
    def err(a, b):
        if a is None or b is None: return 0.0 if a is b else float('inf')
        a, b = a.double(), b.double()
        nan = torch.isnan(a) != torch.isnan(b)
        if nan.any(): return float('nan')
        a, b = torch.nan_to_num(a), torch.nan_to_num(b)
        return ((a - b).abs().max() / (b.abs().max() + 1e-6)).item()
    es = [err(got, want)] + [err(x, y) for x, y in zip(gg, wg)]
    bad = any(not (e < 1e-3) for e in es)
    print(f"{'BAD' if bad else 'ok '} {name}: " + " ".join(f"{e:.1e}" for e in es))

def t(*s, g=True, dt=torch.float64): return torch.randn(*s, dtype=dt, requires_grad=g)
sd = F.scaled_dot_product_attention
check("3d", lambda q, k, v: sd(q, k, v), t(2, 16, 8), t(2, 16, 8), t(2, 16, 8))
check("5d", lambda q, k, v: sd(q, k, v, is_causal=True), t(2, 3, 2, 16, 8), t(2, 3, 2, 16, 8), t(2, 3, 2, 16, 8))
check("q only grad", lambda q, k, v: sd(q, k, v), t(2, 2, 16, 8), t(2, 2, 16, 8, g=False), t(2, 2, 16, 8, g=False))
check("v only grad", lambda q, k, v: sd(q, k, v, is_causal=True), t(2, 2, 16, 8, g=False), t(2, 2, 16, 8, g=False), t(2, 2, 16, 8))
check("mask2d learned", lambda q, k, v, m: sd(q, k, v, attn_mask=m), t(2, 2, 16, 8), t(2, 2, 20, 8), t(2, 2, 20, 8), t(16, 20))
check("mask (H,1,S) learned", lambda q, k, v, m: sd(q, k, v, attn_mask=m), t(2, 2, 16, 8), t(2, 2, 20, 8), t(2, 2, 20, 8), t(2, 1, 20))
bm = torch.rand(2, 1, 16, 20) > 0.5; bm[:, :, 3] = False
check("bool mask empty rows", lambda q, k, v: sd(q, k, v, attn_mask=bm), t(2, 2, 16, 8), t(2, 2, 20, 8), t(2, 2, 20, 8))
fm = torch.zeros(2, 1, 16, 20, dtype=torch.float64); fm[:, :, 3] = float("-inf")
check("float -inf rows", lambda q, k, v: sd(q, k, v, attn_mask=fm), t(2, 2, 16, 8), t(2, 2, 20, 8), t(2, 2, 20, 8))
check("causal L<S", lambda q, k, v: sd(q, k, v, is_causal=True), t(2, 2, 12, 8), t(2, 2, 20, 8), t(2, 2, 20, 8))
check("causal L>S", lambda q, k, v: sd(q, k, v, is_causal=True), t(2, 2, 20, 8), t(2, 2, 12, 8), t(2, 2, 12, 8))
check("gqa", lambda q, k, v: sd(q, k, v, enable_gqa=True), t(2, 4, 16, 8), t(2, 2, 16, 8), t(2, 2, 16, 8))
check("gqa causal", lambda q, k, v: sd(q, k, v, is_causal=True, enable_gqa=True), t(2, 6, 16, 8), t(2, 2, 16, 8), t(2, 2, 16, 8))
check("scale 0", lambda q, k, v: sd(q, k, v, scale=0.0), t(2, 2, 16, 8), t(2, 2, 16, 8), t(2, 2, 16, 8))
check("scale neg", lambda q, k, v: sd(q, k, v, scale=-0.3, is_causal=True), t(2, 2, 16, 8), t(2, 2, 16, 8), t(2, 2, 16, 8))
check("DV != D", lambda q, k, v: sd(q, k, v), t(2, 2, 16, 8), t(2, 2, 16, 8), t(2, 2, 16, 4))
check("mask + causal", lambda q, k, v: sd(q, k, v, attn_mask=fm, is_causal=True), t(2, 2, 16, 8), t(2, 2, 20, 8), t(2, 2, 20, 8))
check("kv batch bcast", lambda q, k, v: sd(q, k, v), t(2, 2, 16, 8), t(1, 2, 16, 8), t(1, 2, 16, 8))
check("fp32", lambda q, k, v: sd(q, k, v, is_causal=True), t(2, 2, 16, 8, dt=torch.float32), t(2, 2, 16, 8, dt=torch.float32), t(2, 2, 16, 8, dt=torch.float32))
check("bf16", lambda q, k, v: sd(q, k, v, is_causal=True).float(), t(2, 2, 16, 8, dt=torch.bfloat16), t(2, 2, 16, 8, dt=torch.bfloat16), t(2, 2, 16, 8, dt=torch.bfloat16))
check("mask bcast both", lambda q, k, v, m: sd(q, k, v, attn_mask=m), t(2, 2, 16, 8), t(2, 2, 20, 8), t(2, 2, 20, 8), t(1, 2, 1, 20))
check("out used twice", lambda q, k, v: sd(q, k, v) * sd(q, k, v, is_causal=True), t(2, 2, 16, 8), t(2, 2, 16, 8), t(2, 2, 16, 8))
check("q=k=v same", lambda x: sd(x, x, x, is_causal=True), t(2, 2, 16, 8))
check("dropout eval", lambda q, k, v: sd(q, k, v, dropout_p=0.0), t(2, 2, 16, 8), t(2, 2, 16, 8), t(2, 2, 16, 8))
check("L=1", lambda q, k, v: sd(q, k, v, is_causal=True), t(2, 2, 1, 8), t(2, 2, 16, 8), t(2, 2, 16, 8))
check("S=1", lambda q, k, v: sd(q, k, v), t(2, 2, 16, 8), t(2, 2, 1, 8), t(2, 2, 1, 8))
check("int mask?", lambda q, k, v, m: sd(q, k, v, attn_mask=m), t(2, 2, 16, 8), t(2, 2, 16, 8), t(2, 2, 16, 8), torch.randn(16, 16, dtype=torch.float64))
