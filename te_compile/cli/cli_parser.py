"""The command line's argument parser: defaults shown in every option's help, a usage error as one line."""

from __future__ import annotations

import argparse
import sys
from typing import Any


class DefaultsFormatter(argparse.HelpFormatter):
    """Each option's help ends with its default, where it has one (not None, not a switch's False)."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        if "%(default)" in text or action.default in (None, False, argparse.SUPPRESS) or not action.option_strings:
            return text
        return f"{text} (default: %(default)s)"


class Parser(argparse.ArgumentParser):
    """argparse with its defaults in the help, and a usage error as one line (the options: ``--help``)."""

    def __init__(self, prog: str, description: str, **kw: Any):
        kw.setdefault("formatter_class", DefaultsFormatter)
        super().__init__(prog=prog, description=description, **kw)

    def error(self, message: str) -> None:  # type: ignore[override]
        print(f"{self.prog}: {message} ('{self.prog} --help' lists the options)", file=sys.stderr)
        raise SystemExit(2)
