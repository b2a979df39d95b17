"""Check a calibration of the cost model against measurements: replay its decisions on ``bench/sweep.py`` rows.

    te-compile calibrate --check SWEEP.json...            # the calibration that would decide on the files' GPU
    te-compile calibrate --check SWEEP.json... --with F   # a calibration file (a refit) instead

A sweep run with ``--always`` times, per row, te_compile with every site served (its ``always`` column) and plain
torch.compile, in alternating rounds, with an A/A column (``--control``: torch.compile against itself); in a sweep
without that column, a row whose site was served has cuDNN's time in its te_compile column. Each row is
one site, so the cost model's decision for it (``cost.step_ms``: no tuning cache, no CUDA graphs) can be compared
with what was measured, offline, for any calibration:

* ``agree``: the model serves the row and ``always`` measured faster, or keeps it and torch.compile did;
* ``within noise``: it disagrees, but the two measured times differ by less than the row's noise (its A/A spread,
  at least ``MIN_NOISE``);
* ``serves a slower site`` / ``keeps a faster site``: it disagrees by more than the noise.

A row's site class is the one the sweep recorded (``cost.site_class`` of the served site), else the case name's
(``refit.CASE_CLASS``); the share of the score matrix it computes comes from the case name and the sweep's own
constants (a 1024-key window, a 512-key prefix), as ``cost.site_class`` computes it for those masks.
"""

from __future__ import annotations

import math
from typing import Optional

from . import cost
from .calibration import Calibration
from .sweep_rows import density, site_class

#: the least relative difference of two measured step times counted as a real difference
MIN_NOISE = 0.03


def check_row(cal: Calibration, row: dict, infer: bool = False) -> Optional[dict]:
    """The model's decision on one ``--always`` sweep row and how it compares with the measurement; None when the
    row cannot be replayed (no ``always`` or torch.compile time, an unknown case)."""
    # cuDNN's side: the serve="always" column, else a served row's te_compile column (a TE_COMPILE_SERVE=always
    # sweep, or a site the default policy served)
    alw = row.get("always") or (row.get("te_compile", {}) if row.get("served") else {})
    tc = row.get("torch.compile", {})
    shape = row.get("shape") or []
    cls = site_class(row)
    if "ms" not in alw or "ms" not in tc or len(shape) < 4 or cls is None:
        return None
    B, H, L, D = shape[:4]
    dens = density(row.get("case", ""), L, L)
    if dens is None:
        return None
    te_est, tc_est = cost.step_ms(cal, cls, dens, (B, H, L, L, D, D), not infer)
    serves = cost.serves(te_est, tc_est)
    measured = tc["ms"] / alw["ms"]  # > 1: cuDNN served was faster
    aa = row.get("control_aa") or [1.0]
    noise = max(MIN_NOISE, abs(aa[0] - 1.0))
    if serves == (measured > 1.0):
        verdict = "agree"
    elif abs(math.log(measured)) < math.log1p(noise):
        verdict = "within noise"
    else:
        verdict = "serves a slower site" if serves else "keeps a faster site"
    return {"case": row.get("case"), "shape": shape, "class": cls, "model": (te_est, tc_est), "serves": serves,
            "measured": (alw["ms"], tc["ms"]), "noise": noise, "verdict": verdict}


def check(cal: Calibration, files: list[dict]) -> tuple[list[dict], list[str]]:
    """Every replayable row of ``files`` under ``cal``: (the rows' checks, a report with a line per row and a
    summary)."""
    checks, lines = [], []
    for f in files:
        for row in f.get("rows", []):
            c = check_row(cal, row, bool(f.get("infer")))
            if c is None:
                continue
            checks.append(c)
            (te_e, tc_e), (te_m, tc_m) = c["model"], c["measured"]
            lines.append(f"{c['case']:24s} {str(c['shape']):24s} model {te_e:7.3f} vs {tc_e:7.3f} ms "
                         f"({'serve' if c['serves'] else 'keep '})  measured always {te_m:7.3f} vs torch.compile "
                         f"{tc_m:7.3f} ms ({tc_m / te_m:4.2f}x, noise {c['noise']:.0%})  {c['verdict']}")
    counts = {v: sum(c["verdict"] == v for c in checks)
              for v in ("agree", "within noise", "serves a slower site", "keeps a faster site")}
    lines.append(f"calibration {cal.label()}: {len(checks)} rows: " + ", ".join(f"{n} {v}" for v, n in counts.items()))
    return checks, lines


__all__ = ["check", "check_row", "MIN_NOISE"]
