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


def write(path: str, data: dict) -> None:
    """``data`` as indented JSON at ``path`` (nothing when ``path`` is empty), replacing the file in one step."""
    if not path:
        return
    with open(path + ".tmp", "w") as f:
        json.dump(data, f, indent=1)
    os.replace(path + ".tmp", path)
