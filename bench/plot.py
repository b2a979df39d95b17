"""Plot a benchmark JSON (``te-compile bench --json F``) as the PNG in docs/.

    python3 bench/plot.py docs/data/bench-h200-2026-11-26.json docs/benchmarks.png   (needs matplotlib)
"""

from __future__ import annotations

import json
import sys


def main(src: str, dst: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    data = json.load(open(src))
    rows = [r for r in data["rows"] if r["fwd_ms"] is not None]
    cases = list(dict.fromkeys(r["case"] for r in rows))
    impls = list(dict.fromkeys(r["impl"] for r in rows))
    colors = {"te_compile": "#76b900", "torch.compile (inductor)": "#ee4c2c", "torch.compile flex (inductor)": "#ee4c2c",
              "torch SDPA cudnn": "#1f77b4", "torch SDPA flash": "#9467bd", "torch SDPA efficient": "#8c564b",
              "torch.compile flex (inductor, small blocks)": "#f4a582", "te_compile, dense -inf bias forced": "#b8e186",
              "per-document causal SDPA cudnn (ragged estimate)": "#17becf",
              "cuDNN varlen THD (frontend op, with layout copies)": "#9edae5"}
    fig, axes = plt.subplots(1, 2, figsize=(15, 6.5), sharey=True)
    width = 0.8 / max(1, len([i for i in impls if i != "torch.compile flex (inductor)"]))
    for ax, key, title in ((axes[0], "fwd_ms", "forward"), (axes[1], "bwd_ms", "backward")):
        slot = {}
        for r in rows:
            impl = "torch.compile (inductor)" if r["impl"] == "torch.compile flex (inductor)" else r["impl"]
            slot.setdefault(impl, {})[r["case"]] = r[key]
        for j, impl in enumerate(slot):
            ys = [i - 0.4 + (j + 0.5) * width for i in range(len(cases))]
            xs = [slot[impl].get(c, 0) for c in cases]
            ax.barh(ys, xs, height=width, label=impl, color=colors.get(impl))
        ax.set_xscale("log")
        ax.set_title(f"{title} (ms, log scale, lower is better)")
        ax.set_yticks(range(len(cases)))
        ax.set_yticklabels(cases)
        ax.invert_yaxis()
        ax.grid(axis="x", alpha=0.3)
    axes[1].legend(loc="lower right", fontsize=8)
    fig.suptitle(f"te_compile vs Inductor (SDPA and flex_attention) vs torch SDPA — {data['env']}\n"
                 f"B,H,S,D = {tuple(data['shape'])}, bf16", fontsize=10)
    fig.tight_layout()
    fig.savefig(dst, dpi=110)


if __name__ == "__main__":
    main(*sys.argv[1:3])
