"""The whole-graph check on one Hugging Face row: tune (per-site measurements, then the whole graph timed both
ways), then the default policy against plain torch.compile, in one mode, alternating rounds.

    python3 bench/probes/graph_check_hf.py --model llama --batch 4 --seq 1024 --mode infer
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # bench/: hf_models
from hf_models import _inputs, _model, _time  # noqa: E402


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--model", default="llama")
    p.add_argument("--impl", default="flex_attention")
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--seq", type=int, default=1024)
    p.add_argument("--mode", choices=("train", "infer"), default="infer")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--json", default="")
    a = p.parse_args()
    import te_compile
    from te_compile.report import Report, record_reports

    model, extra = _model(a.model, a.impl)
    ids = torch.randint(0, 32000, (a.batch, a.seq), device="cuda")
    grad = a.mode == "train"
    with torch.set_grad_enabled(grad):
        rep, made = te_compile.tune(model, echo=lambda line: print(line, flush=True), **_inputs(ids, extra, grad))
    torch._dynamo.reset()
    fns = {"te_compile": torch.compile(model, backend="te_compile"), "torch.compile": torch.compile(model)}

    def step(f):
        def run():
            if grad:
                model.zero_grad(set_to_none=True)
                f(**_inputs(ids, extra, True)).loss.backward()
            else:
                with torch.no_grad():
                    f(**_inputs(ids, extra, False))
        return run
    with record_reports() as graphs:
        step(fns["te_compile"])()
    got = Report(list(graphs)).summary()
    step(fns["torch.compile"])()
    best: dict = {}
    for _ in range(a.rounds):
        for n, f in fns.items():
            t = _time(step(f), 10)
            best[n] = min(best.get(n, t), t)
    reasons = sorted({d.reason.split(":")[0] for g in graphs for d in g.decisions if d.reason})
    row = {"model": a.model, "shape": f"{a.batch}x{a.seq}", "mode": a.mode, "ms": best,
           "ratio": best["torch.compile"] / best["te_compile"], "sites": got, "reasons": reasons}
    print(json.dumps(row), flush=True)
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(), "torch": torch.__version__,
                       "cudnn": torch.backends.cudnn.version(), "rows": [row]}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
