"""``te_compile.explain``: compile, run once, and report every attention site (te_compile.report).

``te_compile.explain(model_or_fn, *args, **kwargs)`` compiles with the backend, runs once, and
returns a ``Report``; ``print(report)`` is a compact table, ``report.to_dict()`` is JSON-ready,
``report.code()`` is the rewritten graphs' code.
"""

from __future__ import annotations

from typing import Any, Callable

import torch

from .backend import backend
from .report import Report, record_reports


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
