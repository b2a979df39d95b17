"""Precision of cuDNN's dBias for a learned [L] + [S] bias (GPU): bf16 vs fp32 dBias output, bf16 vs fp32 bias.

    python3 bench/probes/probe_dbias_precision.py [--seeds 4]

The fuzzer's `pt_distinct_learned` case (score + bias1[q_idx] + bias2[kv_idx], both learned, causal, B 2, H 4,
L 129, S 300, D 64) missed its tolerance by a little on the gradient of bias2. This builds te_compile's backward
graph for a [1, 1, L, S] bias (graphs.define_backward) with the bias and dBias tensors declared bf16 or fp32,
runs it on the fp64 reference's O and lse, and compares dBias and its row / column sums (the two tables'
gradients) with fp64. Error: max |got - ref| / max(max |ref|, 1), as the fuzzer measures captured-tensor grads.
"""

from __future__ import annotations

import argparse

import torch

import cudnn
from te_compile.cudnn import graphs
from te_compile.cudnn.lowering import lower
from te_compile.spec import AttentionSpec


def reference(q, k, v, do, bias, scale, mask):
    s = (q.double() @ k.double().transpose(-1, -2)) * scale + bias.double()
    s = s.masked_fill(~mask, float("-inf"))
    lse = torch.logsumexp(s, -1)
    p = torch.exp(s - lse[..., None])
    o = p @ v.double()
    dp = do.double() @ v.double().transpose(-1, -2)
    ds = p * (dp - (do.double() * o).sum(-1, keepdim=True))
    return o, lse, ds.sum((0, 1), keepdim=True)


def err(a, b):
    return float((a.double() - b).abs().max() / max(float(b.abs().max()), 1.0))


def run(variant, q, k, v, do, bias32, o_ref, lse_ref, spec, scale):
    bias_dt, dbias_dt = variant
    B, H, L, D = q.shape
    S = k.shape[2]
    lw = lower(spec, (L, S))
    io = graphs.IO_TYPES[q.dtype]
    orig = graphs._tensor

    def tensor(g, name, m, io_, uid):
        dt = {"bias": bias_dt, "dBias": dbias_dt}.get(name)
        if dt is not None:
            data_type = graphs._F32 if dt == torch.float32 else graphs.IO_TYPES[dt]
            return g.tensor(name=name, dim=list(m[0]), stride=list(m[1]), data_type=data_type, uid=uid)
        return orig(g, name, m, io_, uid)
    graphs._tensor = tensor
    try:
        h = graphs.handle(q.device)
        g = graphs.new_graph(h, io)
        b = graphs._bias4d(bias32.to(bias_dt), B, H, L, S)  # rows padded to 16-byte strides, as te_compile does
        o = o_ref.to(q.dtype).contiguous()
        meta = graphs._meta
        built = graphs.finish(g, graphs.define_backward(
            g, io, lw, meta(q), meta(k), meta(v), meta(o), meta(do), meta(b), True,
            (q.stride(), k.stride(), v.stride())))
    except Exception as e:  # noqa: BLE001 - the point is which forms cuDNN takes
        return f"not built: {type(e).__name__}: {str(e)[:160]}"
    finally:
        graphs._tensor = orig
    dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    db = graphs._padded_empty(tuple(b.shape), dbias_dt, q.device)
    lse = lse_ref.float().contiguous()
    built.run([q, k, v, o, do, lse, dq, dk, dv, b, db], graphs.new_workspace(built.workspace, q.device), h)
    torch.cuda.synchronize()
    return db


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--seeds", type=int, default=4)
    a = p.parse_args()
    print(torch.__version__, "cudnn", cudnn.backend_version(), torch.cuda.get_device_name())
    B, H, L, S, D = 2, 4, 129, 300, 64
    scale = D ** -0.5
    spec = AttentionSpec(source="flex", scale=scale, mask_mod="(ge q_idx kv_idx)")
    mask = (torch.arange(L)[:, None] >= torch.arange(S)[None, :]).cuda()
    variants = {"bias bf16, dBias bf16 (today)": (torch.bfloat16, torch.bfloat16),
                "bias bf16, dBias fp32": (torch.bfloat16, torch.float32),
                "bias fp32, dBias fp32": (torch.float32, torch.float32)}
    for seed in range(a.seeds):
        g = torch.Generator(device="cuda").manual_seed(seed)
        q, do = (torch.randn(B, H, L, D, device="cuda", generator=g).bfloat16() for _ in range(2))
        k, v = (torch.randn(B, H, S, D, device="cuda", generator=g).bfloat16() for _ in range(2))
        b1 = torch.randn(L, device="cuda", generator=g)
        b2 = torch.randn(S, device="cuda", generator=g)
        bias32 = (b1[:, None] + b2[None, :])[None, None]
        o_ref, lse_ref, db_ref = reference(q, k, v, do, bias32, scale, mask)
        db_bf16_bias = reference(q, k, v, do, bias32.bfloat16(), scale, mask)[2]
        print(f"seed {seed}: fp64 with the bias rounded to bf16: dBias {err(db_bf16_bias, db_ref):.4f}, "
              f"bias1 {err(db_bf16_bias.sum(-1), db_ref.sum(-1)):.4f}, bias2 {err(db_bf16_bias.sum(-2), db_ref.sum(-2)):.4f}")
        for name, var in variants.items():
            db = run(var, q, k, v, do, bias32, o_ref, lse_ref, spec, scale)
            if isinstance(db, str):
                print(f"  {name:32s} {db}")
                continue
            db = db.double()
            print(f"  {name:32s} dBias {err(db, db_ref):.4f}  bias1 grad {err(db.sum(-1), db_ref.sum(-1)):.4f}  "
                  f"bias2 grad {err(db.sum(-2), db_ref.sum(-2)):.4f}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
