"""The site report: every attention site te_compile saw, what it did and why.

``te_compile.explain(model_or_fn, *args, **kwargs)`` compiles with the backend, runs once, and
returns a ``Report``; ``print(report)`` is a compact table, ``report.to_dict()`` is JSON-ready,
``report.code()`` is the rewritten graphs' code.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

import torch

from .backend import GraphReport, backend, record_reports
from .passes.find import example_value
from .passes.rewrite import Decision


def _shape(n: Any) -> str:
    ev = example_value(n)
    return "?" if ev is None else "[" + ",".join(str(s) for s in ev.shape) + "]"


def _dtype(n: Any) -> str:
    ev = example_value(n)
    return "?" if ev is None else str(ev.dtype).replace("torch.", "")


def site_row(d: Decision) -> dict[str, Any]:
    s = d.site
    return {
        "site": s.name,
        "source": s.source_line(),
        "kind": s.kind,
        "q": _shape(s.q),
        "k": _shape(s.k),
        "v": _shape(s.v),
        "dtype": _dtype(s.q),
        "mask": d.mask,
        "score_mod": d.score or "-",
        "grads": d.grads.describe() if d.grads else "?",
        "dbias": d.dbias,
        "target": d.target,
        "spec": d.spec.key() if d.spec else None,
        "reason": d.reason,
    }


@dataclasses.dataclass
class Report:
    graphs: list[GraphReport]

    @property
    def decisions(self) -> list[Decision]:
        return [d for g in self.graphs for d in g.decisions]

    def rows(self) -> list[dict[str, Any]]:
        return [site_row(d) for d in self.decisions]

    def to_dict(self) -> dict[str, Any]:
        return {
            "graphs": len(self.graphs),
            "sites": self.rows(),
            "summary": self.summary(),
            "code": [g.code for g in self.graphs],
        }

    def summary(self) -> dict[str, int]:
        out = {"sites": 0, "cudnn": 0, "reference": 0, "kept": 0}
        for d in self.decisions:
            out["sites"] += 1
            out[d.target] = out.get(d.target, 0) + 1
        return out

    def code(self) -> str:
        return "\n".join(f"# graph {i}\n{g.code.strip()}\n" for i, g in enumerate(self.graphs))

    def table(self) -> str:
        cols = ["#", "site", "source", "kind", "q", "dtype", "mask", "score_mod", "grads", "dbias", "target", "reason"]
        rows = [[str(i + 1)] + [str(r[c]) for c in cols[1:]] for i, r in enumerate(self.rows())]
        widths = [max(len(c), *(len(r[j]) for r in rows)) if rows else len(c) for j, c in enumerate(cols)]
        widths[-1] = len(cols[-1])  # the reason column is free text, not padded
        line = lambda vals: "  ".join(v.ljust(w) for v, w in zip(vals, widths)).rstrip()  # noqa: E731
        s = self.summary()
        head = (f"te_compile: {s['sites']} attention site(s) in {len(self.graphs)} graph(s): "
                f"{s['cudnn']} on cuDNN, {s['reference']} on the reference kernel, {s['kept']} kept")
        return "\n".join([head, line(cols)] + [line(r) for r in rows])

    def __str__(self) -> str:
        return self.table()


def explain(fn: Callable, *args: Any, target: str = "auto", inner: str = "aot_eager",
            verify: bool = False, **kwargs: Any) -> Report:
    """Compile ``fn`` (a module or function) with te_compile, call it once on ``args``, and report.

    Uses ``aot_eager`` by default (the decisions do not depend on the inner compiler, and it is
    quicker); pass ``inner="inductor"`` to see exactly what ``torch.compile`` would run.
    """
    compiled = torch.compile(fn, backend=backend(inner=inner, target=target, verify=verify))
    with record_reports() as graphs:
        compiled(*args, **kwargs)
    return Report(list(graphs))
