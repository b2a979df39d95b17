"""The cost model's calibrations (te_compile.cudnn.calibration) and their refit from sweep files
(te_compile.cudnn.refit): which one decides on which GPU and cuDNN, and what a refit takes from which row."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch

from te_compile.cudnn import calibration, cost, refit
from te_compile.cudnn.calibration import Calibration
from te_compile.spec import AttentionSpec

H100 = "NVIDIA H100 80GB HBM3"


def _cal(gpu=H100, cudnn=91900, arch="sm90", **ratios) -> Calibration:
    base = cost.BUILTIN
    return Calibration(gpu, cudnn, base.te_tflops, base.host_ms, ratios, "test", arch)


def test_this_gpu_first_then_its_architecture_then_the_builtin():
    cals = [_cal(cudnn=91900), _cal(cudnn=92700), _cal(gpu="NVIDIA H200", cudnn=92700)]
    base = cost.BUILTIN
    assert calibration.choose(cals, H100, 92700, base, "sm90") == (cals[1], "fitted on this GPU and cuDNN")
    got, how = calibration.choose(cals, H100, 92800, base, "sm90")
    assert got is cals[1] and how == f"fitted on this GPU at another cuDNN version (running {H100}, cuDNN 9.28)"
    # another sm90 GPU: the same architecture, this cuDNN version first (the built-in H200 / 9.19 table here)
    got, how = calibration.choose(cals, "NVIDIA H800", 91900, base, "sm90")
    assert got is base and how.startswith("fitted on another GPU of this architecture, sm90 (running NVIDIA H800")
    assert calibration.choose(cals, "NVIDIA H800", 92700, base, "sm90")[0].cudnn == 92700
    got, how = calibration.choose(cals, "NVIDIA B200", 91900, base, "sm100")
    assert got is base and how == "not fitted on this GPU, its architecture or cuDNN (running NVIDIA B200, cuDNN 9.19)"
    assert calibration.choose([], "NVIDIA H200", 91900, base, "sm90") == (base, "fitted on this GPU and cuDNN")
    shipped = calibration.load()  # no H200 refit ships: the built-in table (H200, 9.19) decides at 9.27 too
    assert calibration.choose(shipped, "NVIDIA H200", 92700, base, "sm90") == (
        base, "fitted on this GPU at another cuDNN version (running NVIDIA H200, cuDNN 9.27)")


def test_shipped_and_user_files_load_and_a_broken_one_is_skipped(tmp_path, monkeypatch, caplog):
    shipped = calibration.load()
    assert shipped and all(c.speed_ratio and c.te_tflops > 0 for c in shipped)
    assert set(shipped[0].speed_ratio) <= set(cost.SPEED_RATIO)  # classes the model knows
    good, bad = tmp_path / "mine.json", tmp_path / "bad.json"
    good.write_text(json.dumps(_cal(cudnn=92800, **{"flex score_mod": 3.0}).to_json()))
    bad.write_text("{not json")
    monkeypatch.setenv(calibration.ENV, f"{good}:{bad}")
    loaded = calibration.load()
    assert loaded[-1] == _cal(cudnn=92800, **{"flex score_mod": 3.0}) and len(loaded) == len(shipped) + 1
    assert "ignoring calibration" in caplog.text and "bad.json" in caplog.text


def _softcap_site():
    spec = AttentionSpec(scale=0.125, source="flex", score="(mul (tanh (div score 30.0)) 30.0)")
    q = torch.empty(8, 16, 1024, 64, dtype=torch.bfloat16, device="meta")
    return q, spec


@pytest.mark.parametrize("ratio,kept", [(0.5, True), (5.0, False)])
def test_the_cost_model_decides_with_the_chosen_calibration(monkeypatch, ratio, kept):
    cal = _cal(**{"flex score_mod": ratio})
    monkeypatch.setattr(calibration, "current", lambda base: (cal, "fitted on this GPU and cuDNN"))
    q, spec = _softcap_site()
    why = cost.slower_reason(q, q, q, None, spec, True, False, cuda_graphs=True)
    assert bool(why) is kept
    if kept:
        assert f"calibrated on {H100}, cuDNN 9.19, fitted on this GPU and cuDNN" in why


def test_a_class_the_refit_did_not_fit_says_its_ratio_is_the_builtin_one(monkeypatch):
    monkeypatch.setattr(calibration, "current", lambda base: (_cal(**{"flex plain": 1.0}), "fitted on this GPU and cuDNN"))
    q, spec = _softcap_site()
    est = cost.estimate(q, q, q, None, spec, True, False, cuda_graphs=True)
    assert "its 'flex score_mod' ratio is the built-in one" in est["calibration"]
    assert est["torch.compile"] == pytest.approx(est["te_compile"] * cost.SPEED_RATIO["flex score_mod"])


def _row(case, te_ms, tc_ms, te_host=0.1, tc_host=0.1, served=1, **kernels):
    row = {"case": case, "shape": [2, 16, 4096, 128, 16], "served": served,
           "te_compile": {"ms": te_ms, "host_us": te_host * 1e3}, "torch.compile": {"ms": tc_ms, "host_us": tc_host * 1e3}}
    if kernels:
        row["te_compile"]["kernel_ms"], row["torch.compile"]["kernel_ms"] = kernels["te"], kernels["tc"]
    return row


def test_refit_takes_kernel_bound_rows_and_kernel_times_and_leaves_out_the_rest():
    rows = [_row("flex softcap", 2.0, 4.0), _row("flex softcap + causal", 1.3, 2.9, te_host=1.2),  # host-bound
            _row("flex causal", 1.1, 1.5, te_host=1.0, te=0.5, tc=1.0),  # host-bound, but kernel times recorded
            _row("flex none", 1.8, 2.4), _row("flex document", 0.6, 0.6, served=0),
            {**_row("flex odd", 1.0, 3.0), "class": "flex score_mod"}]  # a recorded class beats the case name
    cal, report = refit.fit([{"device": H100, "cudnn": 92700, "rows": rows}])
    assert cal.gpu == H100 and cal.cudnn == 92700
    assert cal.speed_ratio == {"flex score_mod": pytest.approx(2.5), "flex native band": pytest.approx(2.0),
                               "flex plain": pytest.approx(2.4 / 1.8)}
    flops = 2.0 * 2 * 16 * 4096 * 4096 * 256 * (1 + cost.BWD_FLOPS)
    assert cal.te_tflops == pytest.approx(flops / 1.8e9)
    assert cal.host_ms["te_compile"]["train"] == pytest.approx(0.1)  # median over the served rows
    assert cal.host_ms["te_compile"]["infer"] == cost.BUILTIN.host_ms["te_compile"]["infer"]  # no infer file
    text = "\n".join(report)
    assert "flex softcap + causal [2, 16, 4096, 128, 16]: flex score_mod: left out: te_compile host-bound" in text
    assert "flex document [2, 16, 4096, 128, 16]: left out: not served" in text
    assert "flex causal [2, 16, 4096, 128, 16]: flex native band: 2.00x (kernel times)" in text


def test_refit_needs_one_gpu_and_a_cudnn_version():
    with pytest.raises(ValueError, match="more than one GPU"):
        refit.fit([{"device": H100, "cudnn": 91900, "rows": []}, {"device": "NVIDIA H200", "cudnn": 91900, "rows": []}])
    with pytest.raises(ValueError, match="pass --cudnn"):
        refit.fit([{"device": H100, "rows": []}])
    assert refit.parse_version("9.27") == 92700 and refit.parse_version("91900") == 91900


def test_cli_calibrate_writes_a_calibration_that_loads(tmp_path, monkeypatch, capsys):
    from te_compile.__main__ import main
    src, out = tmp_path / "sweep.json", tmp_path / "cal.json"
    src.write_text(json.dumps({"device": H100, "torch": "2.11.0", "rows": [_row("flex softcap", 2.0, 4.0)]}))
    assert main(["calibrate", str(src), "--cudnn", "9.19", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "flex score_mod: 2.00x (built-in 2.37x)" in printed and "flex plain: not fitted" in printed
    monkeypatch.setenv(calibration.ENV, str(out))
    got, how = calibration.choose(calibration.load(), H100, 91900, cost.BUILTIN, "sm90")
    assert got.speed_ratio == {"flex score_mod": 2.0} and how == "fitted on this GPU and cuDNN"
    assert "sweep.json: 1 rows" in got.source and got.arch == "sm90"  # from the GPU's name (older sweep files)


def test_refit_reads_the_always_column_of_a_tuned_sweep():
    """A ``bench/sweep.py --always`` row: the default policy's column may have kept the site (then it ran
    torch.compile), the ``always`` column served it; the refit reads that one."""
    kept = {**_row("flex sliding <=", 0.8, 0.8, served=0), "class": None,
            "always": {"ms": 1.2, "host_us": 1100.0, "kernel_ms": 0.64}}
    kept["torch.compile"]["kernel_ms"] = 0.80
    cal, report = refit.fit([{"device": H100, "cudnn": 92700, "rows": [kept]}])
    assert cal.speed_ratio == {"flex native band": pytest.approx(0.80 / 0.64)}
    assert "flex sliding <= [2, 16, 4096, 128, 16]: flex native band: 1.25x (kernel times)" in "\n".join(report)


def test_by_tokens_interpolates_in_log_length_and_holds_the_ends():
    cal = Calibration(H100, 91900, 500.0, cost.BUILTIN.host_ms, {}, "test", "sm90",
                      {"flex plain": [[1024, 0.5, 1.2], [4096, 1.0, 1.4]],
                       "flex native band, masked": [[2048, 0.8, 1.3]]})
    assert cal.at("flex plain", 2048) == pytest.approx((0.75, 1.3))  # halfway in log2
    assert cal.at("flex plain", 256) == (0.5, 1.2) and cal.at("flex plain", 65536) == (1.0, 1.4)
    assert cal.at("flex plain", 2048, density=0.5) is None  # masked sites have points of their own
    assert cal.at("flex native band", 2048, density=0.25) == (0.8, 1.3)
    assert cal.at("flex native band", 2048) is None and cal.at("flex score_mod", 2048) is None
    assert Calibration.from_json(json.loads(json.dumps(cal.to_json()))) == cal
    old = {k: v for k, v in cal.to_json().items() if k != "by_tokens"}  # files from before by_tokens still load
    assert Calibration.from_json(old).by_tokens == {}


def test_step_ms_uses_the_length_fit_for_training_steps_only():
    base = Calibration(H100, 91900, 500.0, {"te_compile": {"train": 0.0, "infer": 0.0},
                                            "torch.compile": {"train": 0.0, "infer": 0.0}}, {"flex plain": 1.5})
    fitted = dataclasses.replace(base, by_tokens={"flex plain": [[4096, 0.5, 2.0]]})
    shape = (2, 16, 4096, 4096, 128, 128)
    te, tc = cost.step_ms(base, "flex plain", 1.0, shape, True)
    te2, tc2 = cost.step_ms(fitted, "flex plain", 1.0, shape, True)
    assert te2 == pytest.approx(2 * te) and tc2 == pytest.approx(te2 * 2.0) and tc == pytest.approx(te * 1.5)
    assert cost.step_ms(fitted, "flex plain", 1.0, shape, False) == cost.step_ms(base, "flex plain", 1.0, shape, False)


def test_refit_fits_efficiency_and_ratio_per_length_from_kernel_times():
    flops = 2.0 * 2 * 16 * 4096 * 4096 * 256 * (1 + cost.BWD_FLOPS)
    full = flops / 500e9  # te_compile's kernel ms at 500 TFLOP/s
    rows = [_row("flex none", full, 1.3 * full, te=full, tc=1.3 * full),
            _row("flex causal", 1.0, 1.5, te=full / 2 / 0.8, tc=1.4 * full / 2 / 0.8),  # 80% efficient, 1.4x
            {**_row("flex causal", 1.0, 1.5, te=1.0, tc=1.0), "shape": [1, 16, 8192, 128, 16]},
            _row("flex softcap", 2.0, 4.0)]  # no kernel times: no point
    cal, _ = refit.fit([{"device": H100, "cudnn": 91900, "rows": rows}])
    assert cal.te_tflops == pytest.approx(500.0)
    assert cal.by_tokens["flex plain"] == [[4096, pytest.approx(1.0), pytest.approx(1.3)]]
    band = cal.by_tokens["flex native band, masked"]
    assert band[0] == [4096, pytest.approx(0.8, abs=1e-4), pytest.approx(1.4, abs=1e-4)] and band[1][0] == 8192
    assert "flex score_mod" not in cal.by_tokens and "flex score_mod, masked" not in cal.by_tokens


def test_the_shipped_h100_refit_decides_on_an_h100_at_its_version_and_the_next():
    shipped = calibration.load()
    for version in (91900, 92700):
        got, how = calibration.choose(shipped, H100, version, cost.BUILTIN, "sm90")
        assert got.gpu == H100 and got.cudnn == 91900 and got.by_tokens


@pytest.mark.parametrize("ratio,kept", [(1.04, True), (1.06, False)])
def test_the_model_serves_only_past_its_margin_and_says_so_when_close(monkeypatch, ratio, kept):
    cal = _cal(**{"flex score_mod": ratio})
    monkeypatch.setattr(calibration, "current", lambda base: (cal, "fitted on this GPU and cuDNN"))
    q, spec = _softcap_site()
    why = cost.slower_reason(q, q, q, None, spec, True, False, cuda_graphs=True)  # kernels only: tc = ratio x te
    assert bool(why) is kept
    if kept:
        assert f"not {100 * cost.MARGIN:.0f}% less (the model's margin)" in why
    assert cost.serves(1.0, 1.0 + 2 * cost.MARGIN) and not cost.serves(1.0, 1.0 + cost.MARGIN / 2)


def test_the_prefix_split_pays_its_measured_host_time_in_training():
    host = {"te_compile": {"train": 1.0, "infer": 0.2}, "torch.compile": {"train": 0.5, "infer": 0.1}}
    cal = Calibration(H100, 91900, 500.0, host, {"flex prefix split": 5.0})
    tiny = (1, 1, 128, 128, 64, 64)  # kernels far under the host time: the step is the host's
    assert cost.step_ms(cal, "flex prefix split", 1.0, tiny, True)[0] == pytest.approx(
        1.0 + cost.SPLIT_HOST_MS["train"])
    assert cost.step_ms(cal, "flex plain", 1.0, tiny, True)[0] == pytest.approx(1.0)
    assert cost.step_ms(cal, "flex prefix split", 1.0, tiny, True, cuda_graphs=True)[0] < 0.01
