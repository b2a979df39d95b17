"""Probe the cuDNN failure classes the differential fuzzer found, under emission switches.

Each probe runs one spec through te_compile's op on cuDNN (bf16) and through the reference math
(float32 on the same bf16 inputs) and prints the largest error of out / lse / dq / dk / dv / dbias
relative to the reference's largest value, and separately the error in fully-masked rows.

    python bench/probes/probe_fuzz.py            (on the GPU machine)
"""
from __future__ import annotations

import dataclasses
import math
import sys

import torch

import te_compile  # noqa: F401  (registers the ops)
from te_compile.cudnn import emit, graphs
from te_compile.spec import AttentionSpec


def rel(a, b):
    if a is None or b is None or a.numel() == 0:
        return float("nan")
    a, b = a.float(), b.float()
    fin = torch.isfinite(b)
    if not torch.equal(torch.isfinite(a), fin):
        return math.inf
    if not fin.any():
        return 0.0
    return ((a[fin] - b[fin]).abs().max() / b[fin].abs().max().clamp_min(1e-3)).item()


def run(name, score="", mask="", L=128, S=128, B=2, H=2, D=64, inputs=(), scale=None, bias=None, need_dbias=False,
        dlse=False, empty_rows=False):
    g = torch.Generator(device="cuda").manual_seed(0)
    q = torch.randn(B, H, L, D, device="cuda", generator=g).bfloat16()
    k = torch.randn(B, H, S, D, device="cuda", generator=g).bfloat16()
    v = torch.randn(B, H, S, D, device="cuda", generator=g).bfloat16()
    do = torch.randn(B, H, L, D, device="cuda", generator=g).bfloat16()
    extra = [t.cuda() for t in inputs]
    b = None if bias is None else bias.cuda().bfloat16()
    spec = AttentionSpec(scale=scale, source="flex" if (score or mask) else "sdpa", score=score, mask_mod=mask,
                         n_inputs=len(extra), empty_rows=empty_rows)
    ref = dataclasses.replace(spec, impl="reference")
    res = []
    for s in (spec, ref):
        graphs.cache.clear()
        try:
            out, lse = torch.ops.te_compile.attn_fwd(q, k, v, b, extra, s.key())
            dl = torch.randn(lse.shape, device="cuda", generator=torch.Generator(device="cuda").manual_seed(3)) \
                if dlse else None
            grads = torch.ops.te_compile.attn_bwd(do, q, k, v, out, lse, b, extra, s.key(), need_dbias, dl)
            res.append((out, lse, *grads))
        except Exception as e:  # noqa: BLE001
            print(f"{name:40s} RAISED {type(e).__name__}: {str(e)[:150]}")
            return
    got, want = res
    masked = torch.isinf(want[1]) & (want[1] < 0)
    names = ("out", "lse", "dq", "dk", "dv", "dbias")
    errs = " ".join(f"{n}={rel(a, w):.3g}" for n, a, w in zip(names, got, want))
    extra_txt = ""
    if masked.any():
        mo = (got[0].float()[masked].abs().max().item(), got[1][masked].max().item())
        extra_txt = f" | fully-masked rows {int(masked.sum())}: |out| max {mo[0]:.3g}, lse max {mo[1]:.3g}"
        keep = ~masked
        extra_txt += f"; out err elsewhere {rel(got[0][keep], want[0][keep]):.3g}"
    print(f"{name:40s} {errs}{extra_txt}")


def bias_probes():
    B, H = 2, 2
    for L, S in ((100, 100), (256, 256), (300, 300)):
        run(f"sqrt(|s|+.5) + bias L{L} S{S}", score="(sqrt (add (abs score) 0.5))", L=L, S=S, bias=torch.randn(1, H, L, S))
        run(f"neg score + bias L{L} S{S}", score="(neg score)", L=L, S=S, bias=torch.randn(1, H, L, S))
        run(f"neg score + (in)*(kv-q) + bias L{L} S{S}", score="(add (neg score) (mul (in 0) (sub kv_idx q_idx)))",
            L=L, S=S, bias=torch.randn(1, H, L, S), inputs=[torch.rand(1, H, 1, 1)])
    for D in (64, 128):
        for L, S in ((64, 300), (64, 256), (128, 128)):
            bias = torch.randn(B, H, L, S)
            bias[:, :, :, S // 2:] = float("-inf")
            bias[1, 1, 3] = float("-inf")  # a fully-masked row
            run(f"bias with -inf, empty row D{D} L{L} S{S}", L=L, S=S, D=D, bias=bias, empty_rows=True)
            run(f"bias with -inf, no empty row D{D} L{L} S{S}", L=L, S=S, D=D, bias=bias.clamp_min(-1e4).masked_fill(
                torch.arange(S) >= S // 2, float("-inf")), empty_rows=True)
    for L, S in ((128, 128), (64, 256)):
        tab = torch.randn(1, H, L, S)
        run(f"learned bias dBias + tanh L{L} S{S}", score="(mul (tanh (div score 2.0)) 2.0)", L=L, S=S, bias=tab,
            need_dbias=True)
        run(f"learned bias dBias + 1.5*s L{L} S{S}", score="(mul score 1.5)", L=L, S=S, bias=tab, need_dbias=True)
        run(f"learned bias dBias + s L{L} S{S}", score="(add score (in 0))", L=L, S=S, bias=tab, need_dbias=True,
            inputs=[torch.rand(1, H, 1, 1)])


def probes():
    B, H = 2, 2
    lengths = torch.tensor([37.0, 90.0]).view(B, 1, 1, 1)
    run("b-term mask kv<len[b] L200 S100", mask="(lt kv_idx (in 0))", L=200, S=100, inputs=[lengths])
    run("b-term mask kv<len[b] L128 S128", mask="(lt kv_idx (in 0))", L=128, S=128, inputs=[lengths])
    run("b-term mask kv<len[b] [B,H] input", mask="(lt kv_idx (in 0))", L=128, S=128,
        inputs=[lengths.expand(B, H, 1, 1).contiguous()])
    # (a per-batch term in the score: the forward found no engine and the backward then failed with
    # "misaligned address", which poisons the CUDA context: not probed here, kept off cuDNN)
    run("h-term score+(in)[1,H]", score="(add score (in 0))", L=128, S=128, inputs=[torch.tensor([0.5, -1.0]).view(1, H, 1, 1)])
    run("b-term score+(in)[B,1]", score="(add score (in 0))", L=128, S=128, inputs=[torch.tensor([0.5, -1.0]).view(B, 1, 1, 1)])
    run("bh-term score+(in)[B,H]", score="(add score (in 0))", L=128, S=128, inputs=[torch.randn(B, H, 1, 1)])
    run("strict causal kv<q mask only L=S=128", mask="(lt kv_idx q_idx)")
    run("strict causal kv<q + score 3+s", score="(add 3.0 score)", mask="(lt kv_idx q_idx)")
    run("causal q>=kv + score 3+s", score="(add 3.0 score)", mask="(ge q_idx kv_idx)")
    run("causal q>=kv + tanh", score="(mul (tanh (div score 20.0)) 20.0)", mask="(ge q_idx kv_idx)")
    run("q>kv + tanh (mask first, strict)", score="(mul (tanh (div score 20.0)) 20.0)", mask="(gt q_idx kv_idx)")
    run("q-3>=kv mask only L256 S100", mask="(ge (add q_idx -3) kv_idx)", L=256, S=100)
    run("q-3>=kv mask only L128 S128", mask="(ge (add q_idx -3) kv_idx)")
    run("q+13>=kv mask only L64 S255", mask="(ge (add q_idx 13) kv_idx)", L=64, S=255)
    run("q<=q mask + (in)+score", score="(add (in 0) score)", mask="(le q_idx q_idx)", inputs=[torch.randn(B, H, 1, 1)])
    run("kv<20 | q>=kv mask", mask="(or (lt kv_idx 20) (ge q_idx kv_idx))")
    run("negative scale -0.125 S300", scale=-0.125, L=255, S=300)
    run("negative scale -0.125 S256", scale=-0.125, L=256, S=256)
    run("g + score (index first)", score="(add (mul (sub kv_idx q_idx) 0.5) score)")
    run("score + g (score first)", score="(add score (mul (sub kv_idx q_idx) 0.5))")
    run("(in)*(kv-q) + score", score="(add (mul (in 0) (sub kv_idx q_idx)) score)", inputs=[torch.rand(1, H, 1, 1)])
    run("sqrt(|s|+.5) L=S=100", score="(sqrt (add (abs score) 0.5))", L=100, S=100)
    run("sqrt(|s|+.5) L=S=256", score="(sqrt (add (abs score) 0.5))", L=256, S=256)
    run("sigmoid L=S=129", score="(sigmoid score)", L=129, S=129)
    run("s*s L=S=300", score="(mul score score)", L=300, S=300)
    run("floordiv mask kv-2 != kv//5", mask="(ne (sub kv_idx 2) (floordiv kv_idx 5))")
    run("score - q//(1+kv)", score="(sub score (floordiv q_idx (add 1 kv_idx)))", mask="(ge q_idx kv_idx)", L=255, S=255)
    for S in (255, 256):
        bias = torch.randn(1, H, 128, S)
        run(f"sdpa bias dBias L128 S{S}", L=128, S=S, bias=bias, need_dbias=True)
    run("neg score + bias (bias before score_mod?)", score="(neg score)", L=128, S=128, bias=torch.randn(1, H, 128, 128))
    run("tanh + bias (bias before score_mod?)", score="(mul (tanh (div score 2.0)) 2.0)", L=128, S=128,
        bias=torch.randn(1, H, 128, 128))
    run("score+(in)[1,H] + bias", score="(add score (in 0))", L=128, S=128, bias=torch.randn(1, H, 128, 128),
        inputs=[torch.randn(1, H, 1, 1)])
    run("where(q+8>=kv, score, -inf) L129 S128", score="(where (ge (add q_idx 8) kv_idx) score -inf)", L=129, S=128)
    run("q//3 > q%8 mask only (empty rows)", mask="(gt (floordiv q_idx 3) (rem q_idx 8))", L=255, S=300)
    run("tanh + q-3>=kv (empty rows)", score="(mul (tanh (div score 20.0)) 20.0)", mask="(ge (add q_idx -3) kv_idx)")
    run("dlse (lse in the loss) L=S=128", dlse=True)
    run("dlse + causal + tanh L=S=200", score="(mul (tanh (div score 20.0)) 20.0)", mask="(ge q_idx kv_idx)",
        L=200, S=200, dlse=True)


if __name__ == "__main__":
    for p in [a for a in sys.argv[1:] if "=" in a]:
        mod, val = p.split("=")
        m, n = mod.rsplit(".", 1)
        setattr(sys.modules.get(m) or __import__(m, fromlist=[n]), n, eval(val))  # noqa: S307
    print("switches:", sys.argv[1:] or "defaults")
    if "--bias" in sys.argv:
        bias_probes()
    else:
        probes()
