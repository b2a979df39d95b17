"""Why does te_compile.tune in bench/hf_models.py measure no training site? (GPU)

At 1x8192 on torch 2.11 (H200, cuDNN 9.19 and 9.27, every model tried), the training-mode tune that follows
bench/hf_models.py's explain printed "0 site(s) measured in 0.5 s; 0 site(s) in the model", with no "Dynamo
compiled no graph" warning; the inference tune right after measured its site. The same sequence at 1x2048,
without compile_threads = 1, measured the training site. This replays hf_models' exact sequence and prints,
for the training tune: the graphs te_compile's backend recorded, Dynamo's frame / graph / graph-break counters,
and the tune's report.

    python3 bench/probes/probe_tune_train_hf.py [llama] [8192]
"""
import os
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
import te_compile  # noqa: E402
from hf_models import _inputs, _model  # noqa: E402
from te_compile.report import record_reports  # noqa: E402
from torch._dynamo.utils import counters  # noqa: E402

torch._inductor.config.compile_threads = 1
kind = sys.argv[1] if len(sys.argv) > 1 else "llama"
L = int(sys.argv[2]) if len(sys.argv) > 2 else 8192
model, extra = _model(kind, "flex_attention")
ids = torch.randint(0, 32000, (1, L), device="cuda")
torch._dynamo.reset()
rep = te_compile.explain(model, **_inputs(ids, extra, False))
print("explain (grad on, no labels): sites", len(rep.decisions), "training", model.training, flush=True)
for mode, grad in (("train", True), ("infer", False)):
    before = {k: dict(v) for k, v in counters.items()}
    t0 = time.perf_counter()
    with torch.set_grad_enabled(grad), record_reports() as graphs:
        r, made = te_compile.tune(model, echo=None, **_inputs(ids, extra, grad))
    delta = {k: {n: c - before.get(k, {}).get(n, 0) for n, c in v.items() if c != before.get(k, {}).get(n, 0)}
             for k, v in counters.items()}
    print(f"tune {mode}: {time.perf_counter() - t0:.1f} s, graphs recorded {len(graphs)}, sites {len(r.decisions)}, "
          f"measured {len(made)}, note {getattr(r, 'note', '')!r}", flush=True)
    for k in ("stats", "graph_break", "recompiles", "frames"):
        if delta.get(k):
            print(f"  counters[{k!r}]: {dict(list(delta[k].items())[:8])}", flush=True)
