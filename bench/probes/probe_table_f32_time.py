"""What the float32 bias of a learned table costs: a training step (forward + backward) of flex with
``score + table[h, q_idx - kv_idx + L - 1]`` (a learned float32 [H, 2L - 1] table, the benchmark's learned rel-pos
row), te_compile with the bias in float32 (the flex rewrite now) vs forced to bf16 (before) vs torch.compile, in
alternating rounds, median ms of each round's 20 steps, the best round kept. GPU; the cuDNN that is loaded.

    python3 bench/probes/probe_table_f32_time.py B,H,L,D [B,H,L,D ...]
"""
import sys

import torch
from torch.nn.attention.flex_attention import flex_attention

import te_compile
from te_compile import inserted
from te_compile.passes import flex as flex_pass

orig = inserted.materialize_bias
SMALL = {"BLOCK_M": 32, "BLOCK_N": 32, "BLOCK_M1": 16, "BLOCK_N1": 32, "BLOCK_M2": 32, "BLOCK_N2": 16,
         "num_stages": 1, "num_warps": 4}
print(torch.__version__, torch.backends.cudnn.version(), torch.cuda.get_device_name(), flush=True)


def step_ms(fn, args, n=20):
    ts = []
    for _ in range(n):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        out = fn(*args)
        out.backward(torch.ones_like(out))
        b.record()
        torch.cuda.synchronize()
        ts.append(a.elapsed_time(b))
    return sorted(ts)[n // 2]


for shp in sys.argv[1:] or ["2,16,4096,128"]:
    B, H, L, D = (int(x) for x in shp.split(","))
    g = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (torch.randn(B, H, L, D, device="cuda", dtype=torch.bfloat16, generator=g).requires_grad_()
               for _ in range(3))
    table = (torch.randn(H, 2 * L - 1, device="cuda", generator=g) * 0.5).requires_grad_()

    def fn(q, k, v, table):
        return flex_attention(q, k, v, score_mod=lambda s, b, h, q_, kv: s + table[h, q_ - kv + L - 1])

    def fn_small(q, k, v, table):  # Inductor's default blocks run out of shared memory here (te_compile.benchmark)
        return flex_attention(q, k, v, score_mod=lambda s, b, h, q_, kv: s + table[h, q_ - kv + L - 1],
                              kernel_options=SMALL)
    fns = {}
    for name in ("te float32 bias", "te bf16 bias", "torch.compile"):
        torch._dynamo.reset()
        flex_pass.materialize_bias = orig if name != "te bf16 bias" else (lambda *a, float32=False: orig(*a))
        f = (torch.compile(fn_small) if name == "torch.compile" else
             torch.compile(fn, backend=te_compile.backend(serve="always")))
        try:
            step_ms(f, (q, k, v, table), 3)
            fns[name] = f
        except Exception as e:  # noqa: BLE001
            print(f"{shp} {name}: {type(e).__name__}: {str(e)[:200]}", flush=True)
        flex_pass.materialize_bias = orig
    best = {}
    for _ in range(3):
        for name, f in fns.items():
            t = step_ms(f, (q, k, v, table))
            best[name] = min(best.get(name, t), t)
    tc = best.get("torch.compile", float("nan"))
    print(f"{shp}  " + "  ".join(f"{n} {t:.3f} ms ({tc / t:.2f}x tc)" for n, t in best.items()), flush=True)
