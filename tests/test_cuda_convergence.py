"""A short convergence check on a GPU: a small byte-level decoder (bench/convergence.py's model, data and training
loop; 4 layers, hidden 256, 4 heads of 64, 512 tokens, batch 16, bf16 autocast, AdamW, 300 steps) trained through
te_compile with serve="always" (every site it can serve runs on cuDNN, forward and backward) against plain
torch.compile with two seeds, for each attention of the benchmark: flex causal + softcap, flex packed documents +
causal (a new BlockMask per step), flex causal + a learned relative-position bias and no rotary embedding (T5-style:
the table, and so cuDNN's dBias, carries all position information), causal SDPA. Two checks:

* **Same seed.** te_compile runs seed 0, the same initialisation and data order as torch.compile's seed-0 column A:
  the two differ only in their kernels' rounding. The mean absolute difference of their training-loss curves (30
  points, each the mean of 10 steps) stays below SAME_SEED = 0.015 nats per byte. Measured on an H200 (cuDNN 9.19,
  2026-11-29): 0.003-0.006 for te_compile and for eager (a third set of kernels), 0.033 for torch.compile's other
  seed.
* **Seed band.** At every validation point (steps 100, 200, 300) te_compile's loss lies in
  [min(A, B) - m, max(A, B) + m], with B torch.compile's seed-1 column and m = max(|A - B|, 0.03) nats per byte:
  whatever the same-seed check lets through stays inside what a change of seed does.

Injected errors, each in a copy of the tree on the H200 (2026-11-29): the backward's lse 0.7 too low on every other
query row (flex): same-seed gap 0.060, fails; dBias with its sign flipped (flex-bias): 0.028, and its validation loss
0.04 above the seed band at step 300, fails; the softcap derivative taken as 1 (cap 30: tanh' is near 1 where scores
are small): 0.011, passes both. The per-step checks against eager catch all three (tests/test_score_expr.py,
tests/test_ops.py's gradcheck, tests/test_convergence_bench.py's table gradient).

The three columns train at once, each in its own process on the one GPU (the step times are not measured here;
bench/convergence.py measures them, one column at a time).
"""

from __future__ import annotations

import importlib.util
import math
import os
import sys

import pytest
import torch

pytestmark = [pytest.mark.cuda,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU with cuDNN")]

HERE = os.path.dirname(__file__)
FLOOR = 0.03
SAME_SEED = 0.015


def _bench():
    spec = importlib.util.spec_from_file_location("bench_convergence",
                                                  os.path.join(HERE, "..", "bench", "convergence.py"))
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


def _band(a: float, b: float) -> tuple[float, float]:
    m = max(abs(a - b), FLOOR)
    return min(a, b) - m, max(a, b) + m


def test_band_catches_a_drift_the_seeds_do_not_show():
    lo, hi = _band(1.80, 1.81)
    assert lo <= 1.83 <= hi and not lo <= 1.85 <= hi
    lo, hi = _band(1.80, 1.90)
    assert lo <= 1.98 <= hi and not lo <= 2.01 <= hi


@pytest.mark.parametrize("attention", ["flex", "flex-docs", "flex-bias", "sdpa"])
def test_te_compile_trains_inside_torch_compiles_seed_spread(attention):
    conv = _bench()
    cfg = conv.Config(layers=4, hidden=256, heads=4, seq=512, batch=16, steps=300, lr=2e-3, warmup=30,
                      train_every=10, val_every=100, val_batches=8, max_train_bytes=20_000_000,
                      attention=attention)
    res = conv.run_columns_parallel(cfg, ["always", "torch.compile", "torch.compile-B"], timeout=240)
    for col, r in res.items():
        assert "final_val" in r, f"{col} failed:\n{r.get('error')}"
        assert all(math.isfinite(v) for _, v in r["train"] + r["val"]), (col, r["val"])
    te, a, b = res["always"], res["torch.compile"], res["torch.compile-B"]
    if attention == "flex-docs" and not any(runs_on == "cudnn" for runs_on, _ in te["sites"] or []):
        pytest.skip(f"te_compile keeps the packed-document site here: {te['sites']}")
    assert te["sites"] and all(runs_on == "cudnn" for runs_on, _ in te["sites"]), te["sites"]
    assert te["graphs"] <= a["graphs"], (te["graphs"], a["graphs"])  # no step recompiled (or fell back to eager)
    assert a["val"][-1][1] < math.log(256) - 1.5, a["val"]  # the model learned something
    gap = conv.same_seed_gap(te, a)
    assert gap is not None, ("the two curves recorded other steps", te["train"], a["train"])
    assert gap <= SAME_SEED, (f"{attention}: te_compile's training curve is {gap:.4f} nats per byte from "
                              f"torch.compile's on the same seed (mean absolute difference; at most {SAME_SEED})")
    for (step, v), (_, va), (_, vb) in zip(te["val"], a["val"], b["val"]):
        lo, hi = _band(va, vb)
        assert lo <= v <= hi, (f"{attention}: te_compile's validation loss {v:.4f} at step {step} is outside "
                               f"torch.compile's seed band [{lo:.4f}, {hi:.4f}] (seeds {va:.4f}, {vb:.4f})")
