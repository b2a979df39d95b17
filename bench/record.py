"""How a benchmark's JSON is written: the command that made it (without where it went) and an atomic write, so a
run cut short leaves the rows it measured and never half a file."""

from __future__ import annotations

import json
import os
import sys


def command(script: str) -> str:
    """This run's command line, ``script`` first, without its ``--json`` destination (the JSON records how it was
    made, not where it was written)."""
    args, out, i = sys.argv[1:], [script], 0
    while i < len(args):
        if args[i] == "--json":
            i += 2
            continue
        if not args[i].startswith("--json="):
            out.append(args[i])
        i += 1
    return " ".join(out)


def interval_kernels() -> str:
    """"available", or why cuDNN's interval kernels (``cudnn.flex_attention``: documents, prefix-LM, sink + local from
    4096 tokens) cannot run here: without them such sites take the graph path or stay with Inductor, so a run's
    numbers for them say nothing about the interval kernels."""
    try:
        from te_compile.cudnn.flexkernel import frontend_reason
        why = frontend_reason()
    except Exception as e:  # noqa: BLE001 - any failure means: not available
        why = f"{type(e).__name__}: {e}"
    return why or "available"


def write(path: str, data: dict) -> None:
    """``data`` as indented JSON at ``path`` (nothing when ``path`` is empty), replacing the file in one step; the
    JSON records whether cuDNN's interval kernels could run (``interval_kernels``)."""
    if not path:
        return
    data = {**data, "interval_kernels": data.get("interval_kernels") or interval_kernels()}
    with open(path + ".tmp", "w") as f:
        json.dump(data, f, indent=1)
    os.replace(path + ".tmp", path)
