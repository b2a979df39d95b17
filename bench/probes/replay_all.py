"""Replay the cost model's decisions (te_compile.cudnn.replay) on every sweep file in docs/data with a cuDNN column and
a torch.compile one, grouped by GPU and cuDNN version, under the calibration that decides there now and under the
built-in table. CPU only.

    python3 bench/probes/replay_all.py [--rows]     # --rows: print the rows where the model disagrees
"""

from __future__ import annotations

import collections
import glob
import json
import os
import sys

from te_compile.cudnn import calibration, cost, replay

DATA = os.path.join(os.path.dirname(__file__), "..", "..", "docs", "data")


def groups() -> dict:
    out = collections.defaultdict(list)
    for path in sorted(glob.glob(os.path.join(DATA, "*.json"))):
        with open(path) as f:
            d = json.load(f)
        # sweep files only; CUDA-graph runs (the replay decides without them) and second processes left out
        if not isinstance(d, dict) or "device" not in d or d.get("mode") or "cached" in path or "second" in path:
            continue
        if any(isinstance(r, dict) and "torch.compile" in r for r in d.get("rows", [])):
            out[(d["device"], d.get("cudnn") or 91900)].append(d)
    return out


def main(argv: list[str]) -> int:
    for (gpu, version), files in groups().items():
        arch = "sm90" if any(g in gpu for g in ("H100", "H200")) else ""
        now, how = calibration.choose(calibration.load(), gpu, version, cost.BUILTIN, arch)
        for title, cal in (("deciding now", now), ("built-in", cost.BUILTIN)):
            checks, lines = replay.check(cal, files)
            print(f"{gpu}, cuDNN {version}, {len(files)} files, {title} ({cal.label()}): {lines[-1].split(': ', 1)[1]}")
            if "--rows" in argv:
                for c in checks:
                    if c["verdict"] in ("serves a slower site", "keeps a faster site"):
                        print(f"    {c['case']} {c['shape']}: {c['verdict']}, model {c['model'][0]:.2f} vs "
                              f"{c['model'][1]:.2f} ms, measured {c['measured'][0]:.2f} vs {c['measured'][1]:.2f} ms")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
