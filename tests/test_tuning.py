"""Measured decisions (te_compile.tuning): the cache, the timing rule with a fake timer, tune on a CPU model and the
command line (the graph measurements themselves: tests/test_graph_ab.py)."""

from __future__ import annotations

import json
import multiprocessing
import os

import pytest
import torch

from te_compile import tuning
from te_compile.tuning import cache
from te_compile.tuning.timing import MIN_MARGIN, Measurement, measure_pair, serve_on_cudnn

PLAT = {"gpu": "NVIDIA H100 80GB HBM3", "cudnn": 91900, "torch": "2.11.0"}


@pytest.fixture(autouse=True)
def _cache_dir(tmp_path, monkeypatch):
    monkeypatch.setenv(cache.ENV, str(tmp_path / "cache"))


def test_cache_miss_then_hit():
    assert cache.get("k") is None
    cache.put("k", {"te_ms": 1.0})
    assert cache.get("k") == {"te_ms": 1.0}
    assert cache.path().startswith(os.environ[cache.ENV])


def test_corrupt_cache_reads_empty_and_is_replaced(monkeypatch):
    warned = []
    monkeypatch.setattr(cache.log, "warning", lambda msg, *a: warned.append(msg % a))
    os.makedirs(cache.cache_dir(), exist_ok=True)
    with open(cache.path(), "w") as f:
        f.write("{not json")
    assert cache.get("k") is None
    assert "unreadable measurement cache" in warned[0]
    cache.put("k", {"te_ms": 2.0})
    assert cache.get("k") == {"te_ms": 2.0}


def test_other_format_is_ignored():
    os.makedirs(cache.cache_dir(), exist_ok=True)
    with open(cache.path(), "w") as f:
        json.dump({"format": cache.FORMAT + 1, "entries": {"k": {"te_ms": 1.0}}}, f)
    assert cache.get("k") is None


def _writer(args):
    d, i = args
    os.environ[cache.ENV] = d
    for j in range(10):
        cache.put(f"w{i}-{j}", {"i": i, "j": j})


def test_concurrent_writers_keep_every_entry(tmp_path):
    d = str(tmp_path / "shared")
    with multiprocessing.get_context("spawn").Pool(4) as pool:
        pool.map(_writer, [(d, i) for i in range(4)])
    os.environ[cache.ENV] = d
    assert len(cache.entries()) == 40


def _fake_timer(times):
    """timer whose result depends on which candidate runs (fn() returns its name) and on the call count."""
    calls = {"n": 0}

    def timer(fn, iters):
        calls["n"] += 1
        return times[fn()](calls["n"])
    return timer


def test_measure_pair_alternates_and_takes_medians():
    order = []
    te = lambda: order.append("te") or "te"  # noqa: E731
    tc = lambda: order.append("tc") or "tc"  # noqa: E731
    m = measure_pair(te, tc, _fake_timer({"te": lambda n: 1.0, "tc": lambda n: 2.0 + (n % 2) * 0.1}),
                     rounds=4, warmup=0)
    assert order == ["te", "tc", "tc", "te", "te", "tc", "tc", "te"]
    assert m.te_ms == 1.0 and 2.0 <= m.tc_ms <= 2.1 and m.rounds == 4 and m.noise == pytest.approx(0.1 / m.tc_ms)


def test_margin_is_positive():
    assert MIN_MARGIN > 0
    assert not serve_on_cudnn(Measurement(1.0, 1.0 + MIN_MARGIN / 2, 0.0, 7, ratios=(1.0 + MIN_MARGIN / 2,) * 7))
    assert serve_on_cudnn(Measurement(1.0, 1.0 + 2 * MIN_MARGIN, 0.0, 7, ratios=(1.0 + 2 * MIN_MARGIN,) * 7))


def test_tune_on_a_cpu_model_measures_nothing_and_says_so():
    import te_compile
    lines = []
    q = torch.randn(1, 2, 32, 16)
    report, made = te_compile.tune(lambda q: torch.nn.functional.scaled_dot_product_attention(q, q, q), q,
                                   echo=lines.append)
    assert made == [] and len(report.decisions) == 1
    assert lines[-1].startswith("te-compile tune: 0 graph measurement(s)")


def test_max_autotune_modes_measure():
    import importlib
    backend = importlib.import_module("te_compile.backend")
    assert backend._autotunes("max-autotune", None) and backend._autotunes("max-autotune-no-cudagraphs", None)
    assert backend._autotunes(None, {"max_autotune": True})
    assert not backend._autotunes(None, None) and not backend._autotunes("reduce-overhead", None)
    import torch._inductor.config as ic
    with ic.patch(max_autotune=True):  # Inductor's own switch (TORCHINDUCTOR_MAX_AUTOTUNE=1)
        assert backend._autotunes(None, None)


def test_cli_tune_list(capsys):
    from te_compile.__main__ import main
    cache.put("k", {"site": "mask=causal", "te_ms": 0.5, "tc_ms": 0.7})
    assert main(["tune", "--list"]) == 0
    out = capsys.readouterr().out
    assert "1 measurement(s)" in out and "mask=causal: 0.500 ms cuDNN vs 0.700 ms torch.compile" in out
    cache.put("k", {"site": "mask=causal", "te_ms": 0.5, "tc_ms": 0.7, "ratios": [1.4, 1.3, 0.9]})
    assert main(["tune", "--list"]) == 0
    assert "torch.compile (cuDNN faster in 2 of 3 rounds)" in capsys.readouterr().out


def test_noise_leaves_out_one_stray_round():
    from te_compile.tuning.timing import spread
    assert spread([1.0, 1.0, 1.0, 1.0, 5.0]) == 0.0  # one stray round among five
    assert spread([1.0, 1.1, 1.2, 1.3, 1.4]) == pytest.approx(0.2 / 1.2)
    assert spread([1.0, 2.0]) == pytest.approx(1.0 / 1.5)  # too few rounds to leave any out


def test_rounds_last_about_the_target_time():
    seen = []

    def timer(fn, iters):
        seen.append(iters)
        return {"te": 1.0, "tc": 2.0}[fn()]
    measure_pair(lambda: "te", lambda: "tc", timer, rounds=2, warmup=0, target_ms=20.0)
    assert seen[:2] == [1, 1] and set(seen[2:]) == {10}  # one probe call each, then 20 ms / 2 ms per call


def _drifting_timer(te_ms, tc_ms, drift, lose=()):
    """Both sides of round r scaled by drift[r] (the machine's host load moving); in the rounds ``lose`` cuDNN is
    slower than torch.compile."""
    seen = {"te": 0, "tc": 0}

    def timer(fn, iters):
        side = fn()
        r = seen[side]
        seen[side] += 1
        d = drift[r % len(drift)]
        if side == "te":
            return (tc_ms * 1.05 if r in lose else te_ms) * d
        return tc_ms * d
    return timer, seen


def test_paired_rounds_serve_a_steady_winner_through_drift():
    """cuDNN 12% faster in every round while the host drifts by 40%: served. The spread of the absolute round
    times (the noise) is far above 12%, so a rule on it kept such sites (ALiBi + causal on cuDNN 9.27)."""
    timer, seen = _drifting_timer(1.0, 1.12, [1.0, 1.4, 1.1, 1.3, 1.0, 1.2, 1.35])
    m = measure_pair(lambda: "te", lambda: "tc", timer, rounds=7, warmup=0)
    assert m.noise > 0.12 and m.rounds == 7 and m.wins == 7
    assert serve_on_cudnn(m)


def test_paired_rounds_keep_a_small_or_unsteady_win():
    timer, _ = _drifting_timer(1.0, 1.02, [1.0, 1.2])  # 2% faster in every round: below the margin
    assert not serve_on_cudnn(measure_pair(lambda: "te", lambda: "tc", timer, rounds=7, warmup=0))
    timer, _ = _drifting_timer(1.0, 1.2, [1.0], lose=range(0, 14, 2))  # loses every other round
    m = measure_pair(lambda: "te", lambda: "tc", timer, rounds=7, warmup=0)
    assert m.rounds == 7 and m.wins == 3 and not serve_on_cudnn(m)  # the median round lost: no more rounds
    timer, _ = _drifting_timer(1.0, 1.2, [1.0], lose=(0, 3, 8, 10, 12))  # 2 of 7 lost, then 3 of the next 7
    m = measure_pair(lambda: "te", lambda: "tc", timer, rounds=7, warmup=0)
    assert m.rounds == 14 and m.wins == 9 and not serve_on_cudnn(m)


def test_unsure_after_seven_rounds_measures_seven_more_once():
    timer, seen = _drifting_timer(1.0, 1.2, [1.0], lose=(0, 3))  # two lost rounds of seven: unsure
    m = measure_pair(lambda: "te", lambda: "tc", timer, rounds=7, warmup=0)
    assert seen == {"te": 14, "tc": 14} and m.rounds == 14
    assert m.wins == 12 and serve_on_cudnn(m)  # 2 lost of 14 is within the sign test's 3
    timer, seen = _drifting_timer(1.0, 1.2, [1.0], lose=(3,))  # one lost round of seven: decided at once
    m = measure_pair(lambda: "te", lambda: "tc", timer, rounds=7, warmup=0)
    assert seen == {"te": 7, "tc": 7} and serve_on_cudnn(m)


def test_sign_test_allows_few_losses():
    from te_compile.tuning.timing import allowed_losses
    assert [allowed_losses(n) for n in (3, 4, 5, 7, 14)] == [0, 0, 0, 1, 3]


def test_round_ratios_survive_the_cache_and_entries_without_them_are_not_read(monkeypatch):
    m = Measurement(1.0, 1.2, 0.3, 7, 2.0, (1.2,) * 6 + (0.9,))
    back = Measurement.from_entry(json.loads(json.dumps(m.as_entry(site="x"))))
    assert back.ratios == m.ratios and serve_on_cudnn(back)
    assert Measurement.from_entry({"te_ms": 1.0, "tc_ms": 1.2, "noise": 0.3, "rounds": 5}) is None  # the rules decide
    monkeypatch.setattr(tuning, "platform", lambda *a: PLAT)
    assert "cuDNN faster in 6 of 7 rounds" in tuning.describe(back, "sdpa")
