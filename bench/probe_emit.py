"""Probe cuDNN's acceptance of ScoreExpr emission choices on this GPU (fwd + bwd, vs reference).

    python3 bench/probe_emit.py      # prints a matrix: config x expression -> ok / no-engine / wrong
"""

from __future__ import annotations

import itertools
import warnings

import torch

import te_compile  # noqa: F401
from te_compile.cudnn import emit, graphs
from te_compile.spec import AttentionSpec

EXPRS = [
    ("rel_scalar", "(add score (mul (sub q_idx kv_idx) 0.05))", ""),
    ("x2+window", "(mul score 2.0)", "(and (ge q_idx kv_idx) (le (sub q_idx kv_idx) 100))"),
    ("softcap", "(mul (tanh (div score 30.0)) 30.0)", ""),
    ("softcap+causal", "(mul (tanh (div score 30.0)) 30.0)", "(ge q_idx kv_idx)"),
    ("window_only_lo", "", "(le (sub q_idx kv_idx) 100)"),
    ("rem", "(add score (rem (sub q_idx kv_idx) 4))", ""),
    ("where", "(where (ge q_idx kv_idx) (mul score 0.5) score)", ""),
    ("one_minus", "(sub 1.0 (mul score 0.1))", ""),
    ("pos_bias_where", "(add score (where (ge q_idx kv_idx) 0.0 -2.5))", ""),
    ("or_mask", "", "(or (ge q_idx kv_idx) (lt kv_idx 4))"),
]


def run_one(score, mask):
    g = torch.Generator(device="cuda").manual_seed(0)
    q, k, v, do = (torch.randn(1, 2, 128, 64, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(4))
    spec = AttentionSpec(scale=0.125, source="flex", score=score, mask_mod=mask)
    ref = AttentionSpec(scale=0.125, source="flex", score=score, mask_mod=mask, impl="reference")
    res = []
    for direction in ("fwd", "bwd"):
        try:
            if direction == "fwd":
                o, l = graphs.forward(q, k, v, None, spec)
                ro, rl = torch.ops.te_compile.attn_fwd(q, k, v, None, [], ref.key())
                a, b = o.float(), ro.float()
            else:
                ro, rl = torch.ops.te_compile.attn_fwd(q, k, v, None, [], ref.key())
                got = graphs.backward(do, q, k, v, ro, rl, None, spec, False)
                want = torch.ops.te_compile.attn_bwd(do, q, k, v, ro, rl, None, [], ref.key(), False)
                a = torch.cat([x.float().flatten() for x in got[:3]])
                b = torch.cat([x.float().flatten() for x in want[:3]])
            torch.cuda.synchronize()
            if a.isnan().any():
                res.append("nan")
            else:
                err = ((a - b).abs().max() / b.abs().max()).item()
                res.append("ok" if err < 2e-2 else f"wrong({err:.2g})")
        except graphs.Unsupported as e:
            msg = str(e)
            res.append("no-engine" if "no engine" in msg or "No valid" in msg else "err:" + msg[:40])
        except Exception as e:  # noqa: BLE001
            res.append(f"exc:{type(e).__name__}:{str(e)[:40]}")
    return "/".join(res)


def main():
    warnings.simplefilter("ignore")
    for const_mode, swap in itertools.product(["scalar", "pbv", "pbv_nonint"], [False, True]):
        emit.CONST_MODE, emit.SWAP_SCALAR_FIRST = const_mode, swap
        graphs.cache.clear()
        row = [run_one(s, m) for _, s, m in EXPRS]
        print(f"const={const_mode:10s} swap={swap!s:5s} | "
              + " | ".join(f"{n}:{r}" for (n, _, _), r in zip(EXPRS, row)), flush=True)


if __name__ == "__main__":
    main()
