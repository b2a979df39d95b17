"""bench/host_time.py's alternating rounds (CPU: the order only; the timings need CUDA)."""

from __future__ import annotations

import importlib.util
import os
import sys

import torch

HERE = os.path.dirname(__file__)
BENCH = os.path.join(HERE, "..", "bench")


def _host_time():
    sys.path.insert(0, BENCH)  # the script imports its neighbours (record, sweep) as a script does
    try:
        spec = importlib.util.spec_from_file_location("bench_host_time", os.path.join(BENCH, "host_time.py"))
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        return mod
    finally:
        sys.path.remove(BENCH)


def test_each_round_starts_with_the_next_call(monkeypatch):
    """No call always runs first in its round (with a fixed order, each later column of a round measured a few µs
    faster than the one before it on an H200, 2026-11-29: order, not code): over as many rounds as calls, each call
    leads one round and the order within a round stays the calls' order."""
    ht = _host_time()
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a, **k: None)
    monkeypatch.syspath_prepend(BENCH)
    order: list[str] = []
    calls = {n: (lambda n=n: order.append(n)) for n in ("a", "b", "c")}
    got = ht.host_us(calls, iters=1, repeats=3)
    assert set(got) == {"a", "b", "c"}
    timed = order[9:]  # after the 3 warm-up calls of each
    rounds = [timed[i:i + 3] for i in range(0, 9, 3)]
    assert rounds == [["a", "b", "c"], ["b", "c", "a"], ["c", "a", "b"]]


def test_the_model_part_runs_the_same_block_with_flex_or_sdpa():
    """The whole-model part's two attention kinds are one computation: a block with flex and a causal BlockMask gives
    eager SDPA's causal output (same weights, float32, CPU forward)."""
    from torch.nn.attention.flex_attention import create_block_mask

    ht = _host_time()
    L = 128
    bm = create_block_mask(lambda b, h, q, kv: q >= kv, 1, 1, L, L, device="cpu")
    torch.manual_seed(0)
    flex = ht._Block(2, 32, "flex", bm)
    sdpa = ht._Block(2, 32, "sdpa", None)
    sdpa.load_state_dict(flex.state_dict())
    x = torch.randn(2, L, 64)
    with torch.no_grad():
        got, want = flex(x), sdpa(x)
    assert got.shape == x.shape
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
