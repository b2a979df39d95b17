"""Measured decisions (te_compile.tuning): the cache, the decision with a fake timer, the site key, the
candidates (checked against each other on the CPU), measuring once and then reading the cache."""

from __future__ import annotations

import dataclasses
import json
import multiprocessing
import os

import pytest
import torch

from te_compile import tuning
from te_compile.reasons import SLOWER, category
from te_compile.spec import AttentionSpec
from te_compile.tuning import cache, candidates
from te_compile.tuning.timing import MIN_MARGIN, Measurement, measure_pair, serve_on_cudnn

SDPA = AttentionSpec(mask="causal")
PLAT = {"gpu": "NVIDIA H100 80GB HBM3", "cudnn": 91900, "torch": "2.11.0"}


@pytest.fixture(autouse=True)
def _cache_dir(tmp_path, monkeypatch):
    monkeypatch.setenv(cache.ENV, str(tmp_path / "cache"))


def _meta(*shape, dtype=torch.bfloat16):
    return torch.empty(*shape, dtype=dtype, device="meta")


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


def test_site_key_changes_with_the_platform_and_the_site():
    q = _meta(2, 8, 1024, 64)
    key = tuning.site_key(q, q, q, None, SDPA, True, False, PLAT)
    assert key == tuning.site_key(q, q, q, None, SDPA, True, False, dict(PLAT))
    assert key != tuning.site_key(q, q, q, None, SDPA, True, False, {**PLAT, "cudnn": 92700})
    assert key != tuning.site_key(q, q, q, None, SDPA, True, False, {**PLAT, "gpu": "NVIDIA H200"})
    assert key != tuning.site_key(q, q, q, None, SDPA, False, False, PLAT)
    assert key != tuning.site_key(_meta(2, 8, 2048, 64), q, q, None, SDPA, True, False, PLAT)


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


@pytest.mark.parametrize("te,tc,noise,serve", [(1.0, 2.0, 0.0, True), (1.0, 1.02, 0.0, False),
                                               (1.0, 1.1, 0.2, False), (1.0, 1.3, 0.2, True), (2.0, 1.0, 0.0, False)])
def test_serve_only_when_faster_by_more_than_the_noise(te, tc, noise, serve):
    assert serve_on_cudnn(Measurement(te, tc, noise, 5)) is serve
    assert MIN_MARGIN > 0


def test_speed_reason_reads_the_cache(monkeypatch):
    monkeypatch.setattr(tuning, "platform", lambda *a: PLAT)
    q = _meta(2, 8, 4096, 128)
    key = tuning.site_key(q, q, q, None, SDPA, True, False)
    cache.put(key, Measurement(0.61, 1.01, 0.02, 5).as_entry())
    assert tuning.speed_reason(q, q, q, None, SDPA, True, False) is None
    assert tuning.served_note(SDPA, q).startswith("served: measured: 0.610 ms on cuDNN vs 1.010 ms torch.compile")
    cache.put(key, Measurement(1.01, 0.61, 0.02, 5, seconds=3.25).as_entry())
    why = tuning.speed_reason(q, q, q, None, SDPA, True, False)
    assert category(why) == SLOWER and "measured: 1.010 ms on cuDNN vs 0.610 ms torch.compile" in why
    assert "NVIDIA H100 80GB HBM3, cuDNN 9.19, tuning took 3.2 s" in why  # the tuning time of the site


def test_without_a_measurement_the_rule_decides_and_says_so(monkeypatch):
    monkeypatch.setattr(tuning, "platform", lambda *a: PLAT)
    q = _meta(4, 8, 1024, 64)
    why = tuning.speed_reason(q, q, q, None, SDPA, True, False)
    assert why is not None and "kept for speed by the rule for sdpa:" in why and "te-compile tune" in why
    softcap = AttentionSpec(scale=0.1, source="flex", score="(mul (tanh (div score 30.0)) 30.0)")
    big = _meta(2, 16, 4096, 128)
    assert tuning.speed_reason(big, big, big, None, softcap, True, False) is None  # the rule serves it
    note = tuning.served_note(softcap, big)
    assert note.startswith("served by the rule for flex score_mod (from 4096 tokens)") and "not measured here" in note


def test_measuring_fills_the_cache_once(monkeypatch):
    """A site measured inside measuring() is stored; the second decision reads the cache (0 new measurements)."""
    monkeypatch.setattr(tuning, "platform", lambda *a: PLAT)
    q = torch.randn(1, 2, 64, 16, dtype=torch.bfloat16)
    before = len(tuning.measured_log)
    with tuning.measuring():
        first = tuning.speed_reason(q, q, q, None, SDPA, True, False)
        second = tuning.speed_reason(q, q, q, None, SDPA, True, False)
    assert len(tuning.measured_log) == before + 1
    assert first == second
    assert len(cache.entries()) == 1


def test_flex_candidates_compute_eagers_attention():
    """Both measured candidates compute what eager flex_attention computes with the user's own score_mod and
    mask_mod (CPU: te_compile's op runs its reference kernel; flex has no CPU backward, so the forward)."""
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention
    spec = AttentionSpec(scale=0.25, source="flex", score="(mul (tanh (div score 20.0)) 20.0)",
                         mask_mod="(ge q_idx kv_idx)", block_q=128, block_kv=128, block_full=True)
    q = torch.empty(1, 2, 128, 16)
    te, tc = candidates.build(q, q, q, None, spec, False, False, device=torch.device("cpu"))
    got_te, got_tc = te(), tc()
    qkv, _, _ = candidates._inputs(q, q, q, None, False, False, torch.device("cpu"))  # the inputs build() makes
    bm = create_block_mask(lambda b, h, qi, kv: qi >= kv, 1, 1, 128, 128, device="cpu")
    want = flex_attention(*qkv, score_mod=lambda s, b, h, qi, kv: torch.tanh(s / 20.0) * 20.0, block_mask=bm,
                          scale=0.25)
    torch.testing.assert_close(got_te, want, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(got_tc, want, rtol=1e-5, atol=1e-5)


def test_gathered_flex_sites_are_left_to_the_model():
    spec = AttentionSpec(scale=0.25, source="flex", empty_rows=True)
    q = torch.empty(1, 2, 64, 16)
    assert candidates.build(q, q, q, q, spec, False, False, device=torch.device("cpu")) is None


def test_tune_on_a_cpu_model_measures_nothing_and_says_so():
    import te_compile
    lines = []
    q = torch.randn(1, 2, 32, 16)
    report, made = te_compile.tune(lambda q: torch.nn.functional.scaled_dot_product_attention(q, q, q), q,
                                   echo=lines.append)
    assert made == [] and len(report.decisions) == 1
    assert lines[-1].startswith("te-compile tune: 0 site(s) measured")


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


def test_candidates_are_compiled_and_never_share_a_recompile_budget():
    """Each candidate is compiled with a code object of its own: measuring more sites than Dynamo's recompile
    limit still compiles every candidate, and flex_attention's own code object (which users compile) gets no
    entry from a measurement."""
    from torch._dynamo.utils import counters
    from torch.nn.attention.flex_attention import flex_attention
    limit = "recompile_limit" if hasattr(torch._dynamo.config, "recompile_limit") else "cache_size_limit"
    with torch._dynamo.config.patch(**{limit: 1}):
        _build_three_sites(counters)
    entries = torch._C._dynamo.eval_frame._debug_get_cache_entry_list(flex_attention.__code__)
    assert entries == []


def _build_three_sites(counters) -> None:
    q = torch.empty(1, 2, 64, 16)
    for i in range(3):
        before = counters["stats"]["unique_graphs"]
        spec = AttentionSpec(scale=0.1 * (i + 1), source="flex", score=f"(mul (tanh (div score {20 + i}.0)) {20 + i}.0)")
        te, tc = candidates.build(q, q, q, None, spec, False, False, device=torch.device("cpu"))
        torch.testing.assert_close(te(), tc(), rtol=1e-4, atol=1e-4)
        assert counters["stats"]["unique_graphs"] - before == 2, f"site {i}: a candidate ran without compiling"


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
    assert not serve_on_cudnn(dataclasses.replace(m, ratios=()))  # the older rule on the same times keeps it


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


def test_round_ratios_survive_the_cache_and_old_entries_still_decide(monkeypatch):
    m = Measurement(1.0, 1.2, 0.3, 7, 2.0, (1.2,) * 6 + (0.9,))
    back = Measurement.from_entry(json.loads(json.dumps(m.as_entry(site="x"))))
    assert back.ratios == m.ratios and serve_on_cudnn(back)
    old = Measurement.from_entry({"te_ms": 1.0, "tc_ms": 1.2, "noise": 0.3, "rounds": 5})
    assert old.ratios == () and not serve_on_cudnn(old)  # the older rule: 20% is inside 30% noise
    monkeypatch.setattr(tuning, "platform", lambda *a: PLAT)
    assert "cuDNN faster in 6 of 7 rounds" in tuning.describe(back)
    assert "noise 30%" in tuning.describe(old)
