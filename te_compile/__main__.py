"""Command line: ``python -m te_compile demo`` (also installed as ``te-compile``)."""

from __future__ import annotations

import argparse
import sys
from typing import Optional


def main(argv: Optional[list[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    p = argparse.ArgumentParser(prog="te-compile", description="te_compile: attention on cuDNN for torch.compile")
    p.add_argument("command", choices=["demo"], help="demo: compile a small GPT and print the site report")
    a, rest = p.parse_known_args(argv)
    if a.command == "demo":
        from .demo import main as demo

        return demo(rest)
    return 2


if __name__ == "__main__":
    raise SystemExit(main())
