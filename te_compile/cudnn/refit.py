"""Refit the cost model from the project's own measurements: ``bench/sweep.py --json`` files -> a Calibration.

    te-compile calibrate sweep-flex.json sweep-sdpa.json [--cudnn 9.27] [--out my-gpu.json]

Run the sweep with ``TE_COMPILE_SERVE=always`` (every site served, so each row times cuDNN against
torch.compile) on the GPU and cuDNN to calibrate, or with ``--always`` (its ``always`` column is then te_compile's
side). Per row:

* its site class is the row's ``class`` (the sweep records ``cost.site_class`` of the served site) or, for files
  from before it did, ``CASE_CLASS`` by the row's case name;
* its kernel times are the rows' ``kernel_ms`` (CUDA kernel time per step from the profiler) where the sweep
  recorded them; otherwise its step times, and a row where either side's host time per step reaches
  ``HOST_BOUND`` of its step time is left out (the step then times the host, not the kernels);
* rows te_compile did not serve are left out (both sides ran torch.compile).

A class's ratio is the median of its rows' torch.compile / te_compile kernel times; cuDNN's throughput is the
median over the no-mask rows; host time per step is the median of each side's host column (training files give
"train", ``--infer`` files "infer"). What no row fits stays as the built-in calibration has it, and
``report`` lists every row with what was done with it.
"""

from __future__ import annotations

import json
import os
import statistics
from typing import Optional

from .calibration import Calibration, by_tokens_key
from .cost import BUILTIN, BWD_FLOPS
from .sweep_rows import CASE_CLASS, density
from .sweep_rows import site_class as row_class
from .versions import describe

#: a side whose host time per step is at least this fraction of its step time is host-bound
HOST_BOUND = 0.75
#: classes whose rows give cuDNN's throughput (density 1: every tile computed)
PLAIN = ("flex plain",)


def _kernel(side: dict) -> Optional[float]:
    return side.get("kernel_ms") or None


def _row_ratio(row: dict) -> tuple[Optional[float], str]:
    """(torch.compile / te_compile kernel time, what was done) for one served row."""
    te, tc = row.get("te_compile", {}), row.get("torch.compile", {})
    if "ms" not in te or "ms" not in tc:
        return None, "left out: a side has no time"
    if _kernel(te) and _kernel(tc):
        return tc["kernel_ms"] / te["kernel_ms"], "kernel times"
    for name, side in (("te_compile", te), ("torch.compile", tc)):
        if side.get("host_us", 0.0) / 1e3 >= HOST_BOUND * side["ms"]:
            return None, f"left out: {name} host-bound ({side['host_us'] / 1e3:.2f} ms host, {side['ms']:.2f} ms step)"
    return tc["ms"] / te["ms"], "step times (both sides kernel-bound)"


def _flops(row: dict, infer: bool) -> float:
    B, H, L, D = row["shape"][:4]
    return 2.0 * B * H * L * L * (2 * D) * (1.0 if infer else 1.0 + BWD_FLOPS)


def fit(files: list[dict], cudnn: Optional[int] = None, names: Optional[list[str]] = None
        ) -> tuple[Calibration, list[str]]:
    """A calibration from parsed sweep files (one GPU, one cuDNN version), and the report of every row."""
    gpus = {f.get("device", "?") for f in files}
    if len(gpus) != 1:
        raise ValueError(f"sweep files from more than one GPU: {sorted(gpus)}")
    versions = {cudnn or f.get("cudnn") or 0 for f in files}
    if len(versions) != 1 or 0 in versions:
        raise ValueError(f"need one cuDNN version (the files say {sorted(versions)}): pass --cudnn")
    base, report = BUILTIN, []
    ratios: dict = {}
    tflops: list = []
    host: dict = {}
    for f in files:
        mode = "infer" if f.get("infer") else "train"
        for row in f.get("rows", []):
            _fit_row(row, mode, ratios, tflops, host, report)
    host_ms = {side: {m: (statistics.median(host[(side, m)]) if host.get((side, m)) else v)
                      for m, v in modes.items()} for side, modes in base.host_ms.items()}
    te_tflops = statistics.median(tflops) if tflops else base.te_tflops
    cal = Calibration(gpus.pop(), versions.pop(), te_tflops, host_ms,
                      {c: statistics.median(r) for c, r in sorted(ratios.items())},
                      "refit (te_compile.cudnn.refit) from bench/sweep.py: " +
                      "; ".join(f"{n}: {len(f.get('rows', []))} rows, torch {f.get('torch', '?')}"
                                for n, f in zip(names or ["file"] * len(files), files)),
                      _arch(files), _by_tokens(files, te_tflops))
    return cal, report


def _by_tokens(files: list[dict], te_tflops: float) -> dict:
    """Calibration.by_tokens: per class and sequence length, the medians of te_compile's efficiency and of the
    kernel-time ratio over the training rows with both sides' kernel times."""
    points: dict = {}
    for f in files:
        if f.get("infer"):
            continue
        for row in map(_as_served, f.get("rows", [])):
            te, tc, cls = row.get("te_compile", {}), row.get("torch.compile", {}), row_class(row)
            shape = row.get("shape") or []
            if not (row.get("served") and cls and _kernel(te) and _kernel(tc) and len(shape) >= 4):
                continue
            dens = density(row.get("case", ""), shape[2], shape[2])
            if dens is None:
                continue
            estimate = _flops(row, False) * dens / (te_tflops * 1e9)
            points.setdefault(by_tokens_key(cls, dens), {}).setdefault(shape[2], []).append((estimate / te["kernel_ms"],
                                                                         tc["kernel_ms"] / te["kernel_ms"]))
    return {cls: [[L, round(statistics.median(p[0] for p in pts), 4), round(statistics.median(p[1] for p in pts), 4)]
                  for L, pts in sorted(by_len.items())] for cls, by_len in sorted(points.items())}


def _arch(files: list[dict]) -> str:
    """The files' GPU architecture ("sm90"), from the sweep's header or the GPU's name."""
    for f in files:
        if f.get("arch"):
            return str(f["arch"])
    name = files[0].get("device", "")
    return "sm90" if any(g in name for g in ("H100", "H200", "H800", "H20")) else ""


def _as_served(row: dict) -> dict:
    """A ``--always`` sweep row read as if it came from a ``TE_COMPILE_SERVE=always`` sweep: its ``always`` column
    (every site served) is te_compile's side, whatever the default policy's column decided."""
    if not isinstance(row.get("always"), dict):
        return row
    return {**row, "te_compile": row["always"], "served": 1, "class": row_class(row)}


def _fit_row(row: dict, mode: str, ratios: dict, tflops: list, host: dict, report: list) -> None:
    row = _as_served(row)
    name = f"{row.get('case')} {row.get('shape')}"
    for side in ("te_compile", "torch.compile"):
        if "host_us" in row.get(side, {}) and (side == "torch.compile" or row.get("served")):
            host.setdefault((side, mode), []).append(row[side]["host_us"] / 1e3)
    if not row.get("served"):
        report.append(f"{name}: left out: not served (both sides ran torch.compile)")
        return
    cls = row_class(row)
    if cls is None:
        report.append(f"{name}: left out: no site class")
        return
    r, how = _row_ratio(row)
    report.append(f"{name}: {cls}: " + (f"{r:.2f}x ({how})" if r else how))
    if r:
        ratios.setdefault(cls, []).append(r)
        if cls in PLAIN:
            te = row["te_compile"]
            tflops.append(_flops(row, mode == "infer") / ((_kernel(te) or te["ms"]) * 1e9))


def parse_version(text: str) -> int:
    """"9.27" -> 92700, "92700" -> 92700."""
    if "." in text:
        major, minor = text.split(".")[:2]
        return int(major) * 10000 + int(minor) * 100
    return int(text)


def compare(cal: Calibration) -> list[str]:
    """The fitted calibration against the built-in one, a line per constant."""
    base = BUILTIN
    lines = [f"calibration for {cal.gpu}, cuDNN {describe(cal.cudnn)} (built-in: {base.label()})",
             f"  cuDNN throughput {cal.te_tflops:.0f} TFLOP/s (built-in {base.te_tflops:.0f})"]
    for side, modes in cal.host_ms.items():
        lines += [f"  host {side} {m} {v:.2f} ms (built-in {base.host_ms[side][m]:.2f})" for m, v in modes.items()]
    for cls in sorted(set(base.speed_ratio) | set(cal.speed_ratio)):
        got = cal.speed_ratio.get(cls)
        lines.append(f"  {cls}: " + (f"{got:.2f}x" if got else "not fitted") + f" (built-in {base.speed_ratio[cls]:.2f}x)")
    return lines


def main(argv: list[str]) -> int:
    import argparse
    p = argparse.ArgumentParser(prog="te-compile calibrate", description="refit te_compile's cost model from "
                                "bench/sweep.py --json files (run with TE_COMPILE_SERVE=always) on one GPU and cuDNN")
    p.add_argument("files", nargs="+")
    p.add_argument("--cudnn", default="", help="the cuDNN version the files ran on (9.27), when they do not say")
    p.add_argument("--out", default="", help="write the calibration here (JSON); TE_COMPILE_CALIBRATION=PATH uses it")
    p.add_argument("--check", action="store_true",
                   help="replay the cost model's decisions on the files' --always rows (te_compile.cudnn.replay): "
                        "under the calibration that decides on their GPU and cuDNN now, and under this refit")
    p.add_argument("--with", dest="other", default="", help="with --check: also replay this calibration file")
    p.add_argument("--holdout", action="store_true",
                   help="with --check: also replay each file under a refit from the other files (out of sample)")
    a = p.parse_args(argv)
    files = []
    for path in a.files:
        with open(path) as f:
            files.append(json.load(f))
    names = [os.path.basename(p) for p in a.files]
    cal, report = fit(files, parse_version(a.cudnn) if a.cudnn else None, names)
    print("\n".join(report + compare(cal)))
    if a.out:
        with open(a.out, "w") as f:
            json.dump(cal.to_json(), f, indent=1)
        print(f"wrote {a.out}")
    if a.check:
        _check(files, cal, a.other)
        if a.holdout:
            print("== each file under a refit from the others")
            print("\n".join(holdout(files, names, parse_version(a.cudnn) if a.cudnn else None)))
    return 0


def holdout(files: list[dict], names: list[str], cudnn: Optional[int] = None) -> list[str]:
    """Replay each file under a refit from the other files (te_compile.cudnn.replay): the refit's decisions on
    measurements it was not fitted on. The last line sums the verdicts."""
    from . import replay
    lines, counts = [], {}
    for i, name in enumerate(names):
        rest = files[:i] + files[i + 1:]
        if not rest:
            continue
        checks, text = replay.check(fit(rest, cudnn)[0], [files[i]])
        lines += [f"{name}: {line}" for line in text[:-1]]
        for c in checks:
            counts[c["verdict"]] = counts.get(c["verdict"], 0) + 1
    lines.append("held out: " + (", ".join(f"{n} {v}" for v, n in sorted(counts.items())) or "no rows"))
    return lines


def _check(files: list[dict], refit: Calibration, other: str) -> None:
    """Print the replay of each calibration on ``files`` (te_compile.cudnn.replay)."""
    from . import calibration, replay
    now, how = calibration.choose(calibration.load(), refit.gpu, refit.cudnn, BUILTIN, refit.arch)
    cals = [(f"deciding now ({how})", now), ("this refit", refit)]
    if other:
        with open(other) as f:
            cals.append((other, Calibration.from_json(json.load(f))))
    for title, cal in cals:
        print(f"== {title}: {cal.label()} ({cal.source[:80]})")
        print("\n".join(replay.check(cal, files)[1]))


__all__ = ["fit", "compare", "main", "parse_version", "CASE_CLASS", "HOST_BOUND"]
