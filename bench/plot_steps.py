"""Plot training-step sweeps (``bench/sweep.py --json``) as one bar chart: ms per fwd+bwd step for
te_compile, plain torch.compile and, where present, the FLASH backend, one group per row (needs matplotlib).

    python3 bench/plot_steps.py docs/benchmarks-steps.png docs/data/flex-flash-a-h200-2026-11-26.json \
        docs/data/flex-flash-b-h200-2026-11-26.json
"""

from __future__ import annotations

import json
import sys


def main(dst: str, *srcs: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows, device = [], ""
    for src in srcs:
        data = json.load(open(src))
        rows += data["rows"]
        device = data.get("device", device)
    impls = [("te_compile", "te_compile (default serve policy)", "#76b900"),
             ("torch.compile", "torch.compile (Inductor flex)", "#ee4c2c"),
             ("FLASH", "torch.compile, FLASH backend (FA4)", "#1f77b4")]
    impls = [i for i in impls if any("ms" in r.get(i[0], {}) for r in rows)]
    fig, ax = plt.subplots(figsize=(14, 6))
    width = 0.8 / len(impls)
    for j, (key, label, color) in enumerate(impls):
        xs = [i + (j - (len(impls) - 1) / 2) * width for i in range(len(rows))]
        ys = [r.get(key, {}).get("ms", 0.0) for r in rows]
        ax.bar(xs, ys, width, label=label, color=color)
    for i, r in enumerate(rows):
        te = r.get("te_compile", {}).get("ms")
        if te and r.get("ratio"):
            note = f"{r['ratio']:.2f}x" + ("" if r.get("served") else "\nkept")
            ax.annotate(note, (i, te), textcoords="offset points", xytext=(0, 4), ha="center", fontsize=8)
    ax.set_xticks(range(len(rows)))
    ax.set_xticklabels([r["case"].removeprefix("flex ") for r in rows], rotation=20)
    shape = "x".join(str(x) for x in rows[0]["shape"][:4]) if rows else ""
    ax.set_ylabel("ms per training step (fwd + bwd), lower is better")
    ax.set_title(f"flex_attention variants, {shape} bf16, {device}: te_compile vs torch.compile "
                 f"(label: speedup over Inductor; 'kept': te_compile left the site to Inductor)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(dst, dpi=110)


if __name__ == "__main__":
    main(sys.argv[1], *sys.argv[2:])
