"""The site report: every attention site te_compile saw, what it did and why.

``GraphReport`` is what the backend records per Dynamo graph; ``Report`` collects them (``print``
gives a compact table: one row per site and, under it, its reason in one short line; ``table(verbose=True)`` the
long reasons with their evidence; ``to_dict()`` JSON-ready rows with both; ``code()`` the rewritten graphs' code);
``record_reports()`` collects the reports of every graph compiled inside it.
"""

from __future__ import annotations

import dataclasses
import re
import threading
from typing import Any

from .score.infix import infix
from .passes.decision import Decision
from .passes.find import example_value
from .reasons import category, short


@dataclasses.dataclass
class GraphReport:
    """The decisions taken for one Dynamo graph and its code after the rewrite."""

    index: int
    decisions: list[Decision]
    code: str
    options: Any  # te_compile.backend.Options
    #: the cuDNN version the graph's sites were decided for ("9.19"), "" when no site targets cuDNN
    cudnn: str = ""
    #: which call path runs the graph's cuDNN sites: "on" (native, C++) or "off: <why>"; "" when none runs on cuDNN
    native: str = ""
    #: the graph holds only te_compile's ops and is called without Inductor (te_compile.runtime.direct)
    direct: bool = False


_recorders = threading.local()


class record_reports:
    """Context manager collecting the GraphReport of every graph compiled inside it."""

    def __init__(self) -> None:
        self.reports: list[GraphReport] = []

    def __enter__(self) -> list[GraphReport]:
        stack = getattr(_recorders, "stack", None)
        if stack is None:
            stack = _recorders.stack = []
        stack.append(self.reports)
        return self.reports

    def __exit__(self, *exc: Any) -> None:
        _recorders.stack.pop()


def record(report: GraphReport) -> None:
    """Add ``report`` to every active recorder that does not hold it yet."""
    for sink in getattr(_recorders, "stack", []) or []:
        if not any(r is report for r in sink):
            sink.append(report)


def _shape(n: Any) -> str:
    """``[1,2,32,8]``; with dynamic shapes ``[1,2,s0,8] (s0=32)``: the symbol and the size this compile saw."""
    ev = example_value(n)
    if ev is None:
        return "?"
    hints = {}
    for d in ev.shape:
        if not isinstance(d, int):
            hint = getattr(getattr(d, "node", None), "hint", None)
            if hint is not None and str(d).isidentifier():
                hints[str(d)] = hint
    text = "[" + ",".join(str(d) for d in ev.shape) + "]"
    return text + (" (" + ", ".join(f"{k}={v}" for k, v in hints.items()) + ")" if hints else "")


def _dtype(n: Any) -> str:
    ev = example_value(n)
    return "?" if ev is None else str(ev.dtype).replace("torch.", "")


def site_row(d: Decision) -> dict[str, Any]:
    """One report row. ``mask`` and ``score_mod`` are readable infix (``tanh(score / 30.0) * 30.0``);
    ``mask_sexpr`` / ``score_mod_sexpr`` are te_compile's ScoreExpr text (what the spec carries);
    ``category`` is the reason's te_compile.reasons category (None for a site served without a reason); ``reason``
    is the long form (the evidence, the runs a rule cites), ``why`` its one line (te_compile.reasons.short)."""
    s = d.site
    mask = f"mask_mod {infix(d.mask_expr)}" if d.mask_expr is not None else d.mask
    return {
        "site": s.name,
        "source": s.source_line(),
        "kind": s.kind,
        "q": _shape(s.q),
        "k": _shape(s.k),
        "v": _shape(s.v),
        "dtype": _dtype(s.q),
        "mask": mask,
        "score_mod": (infix(d.score_expr) if d.score_expr is not None else (d.score or "-"))
        + (" (ALiBi with cuDNN's slopes)" if d.spec and d.spec.alibi_heads else ""),
        "mask_sexpr": d.mask,
        "score_mod_sexpr": d.score or "-",
        "grads": d.grads.describe() if d.grads else "?",
        "dbias": d.dbias_note,
        "runs_on": d.runs_on,
        "spec": d.spec.key() if d.spec else None,
        "reason": d.reason or d.note,
        "why": short(d.reason or d.note) if (d.reason or d.note) else "",
        "category": category(d.reason) if d.reason else None,
    }


#: the widest a compact table's cell (a long mask_mod or score_mod) gets; ``table(verbose=True)`` shows it whole
CELL = 48
#: the width the verbose table wraps its long reasons to
WIDTH = 120


def _cell(text: str) -> str:
    """A compact table's cell: at most CELL characters, cut in the middle of its expression (a trailing
    parenthesized note, such as "(ALiBi with cuDNN's slopes)", stays)."""
    if len(text) <= CELL:
        return text
    m = re.search(r" \([^()]*\)$", text)
    tail = m.group(0) if m and len(m.group(0)) <= CELL - 16 else ""
    return text[:CELL - len(tail) - 1] + "\u2026" + tail


def _wrap(text: str, width: int) -> list[str]:
    import textwrap
    return textwrap.wrap(" ".join(str(text).split()), width, break_on_hyphens=False) or [""]


def _wrap_note(note: str, verbose: bool) -> str:
    return note if verbose else short(note)


@dataclasses.dataclass
class Report:
    graphs: list[GraphReport]
    #: why the report is empty, when it is (explain sets it)
    note: str = ""

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
            "note": self.note,
            "code": [g.code for g in self.graphs],
        }

    def summary(self) -> dict[str, int]:
        out = {"sites": 0, "cudnn": 0, "reference": 0, "kept": 0}
        for d in self.decisions:
            out["sites"] += 1
            out[d.runs_on] = out.get(d.runs_on, 0) + 1
        return out

    def code(self) -> str:
        return "\n".join(f"# graph {i}\n{g.code.strip()}\n" for i, g in enumerate(self.graphs))

    def table(self, verbose: bool = False) -> str:
        """One row per site and, under it, its reason: one line (``short``), or with ``verbose`` the long form."""
        cols = ["#", "site", "source", "kind", "q", "dtype", "mask", "score_mod", "grads", "dbias", "runs_on"]
        cell = (lambda v: v) if verbose else _cell  # noqa: E731
        sites = self.rows()
        rows = [[str(i + 1)] + [cell(str(r[c])) for c in cols[1:]] for i, r in enumerate(sites)]
        widths = [max(len(c), *(len(r[j]) for r in rows)) if rows else len(c) for j, c in enumerate(cols)]
        line = lambda vals: "  ".join(v.ljust(w) for v, w in zip(vals, widths)).rstrip()  # noqa: E731
        indent = " " * (widths[0] + 2)
        body = []
        for r, site in zip(rows, sites):
            body.append(line(r))
            why = site["reason"] if verbose else site["why"]
            if why:
                body += [indent + ln for ln in (_wrap(why, WIDTH - len(indent)) if verbose else [why])]
        note = [f"  ({_wrap_note(self.note, verbose)})"] if self.note else []
        return "\n".join([self.head()] + note + [line(cols)] + body)

    def head(self) -> str:
        """The first line: how many sites, where they run, the cuDNN version and call path."""
        s = self.summary()
        head = (f"te_compile: {s['sites']} attention site(s) in {len(self.graphs)} graph(s): "
                f"{s['cudnn']} on cuDNN, {s['reference']} on the reference kernel, {s['kept']} kept")
        versions = sorted({g.cudnn for g in self.graphs if getattr(g, "cudnn", "")})
        paths = sorted({g.native for g in self.graphs if getattr(g, "native", "")})
        direct = sum(bool(getattr(g, "direct", False)) for g in self.graphs)
        if versions or paths or direct:
            head += " (" + "; ".join([f"cuDNN {', '.join(versions)}"] * bool(versions)
                                     + [f"native call path: {p}" for p in paths]
                                     + [f"{direct} graph(s) of te_compile ops only, called without Inductor"]
                                     * bool(direct)) + ")"
        return head

    def __str__(self) -> str:
        return self.table()
