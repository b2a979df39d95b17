"""Warnings that point at the user's code: the line of the model or call that led to them, not a line of
te_compile or torch, and shown once per message and place (torch.compile resets Python's own once-per-place
registry, so te_compile keeps its own)."""

from __future__ import annotations

import os
import sys
import threading
import warnings

_OURS = os.path.dirname(os.path.abspath(__file__))
_shown: set = set()
_lock = threading.Lock()


def _internal(filename: str) -> bool:
    if filename.startswith("<"):  # <frozen importlib...>, <string>
        return True
    path = os.path.abspath(filename)
    import torch
    torch_dir = os.path.dirname(os.path.abspath(torch.__file__))
    return path.startswith((_OURS + os.sep, torch_dir + os.sep)) or os.sep + "contextlib.py" in path


def warn(message: str, category: type = RuntimeWarning) -> None:
    """Warn at the innermost calling frame outside te_compile and torch (the user's line)."""
    frame = sys._getframe(1)
    while frame is not None and _internal(frame.f_code.co_filename):
        frame = frame.f_back
    if frame is None:
        warnings.warn(message, category, stacklevel=2)
        return
    where = (message, category, frame.f_code.co_filename, frame.f_lineno)
    with _lock:
        if where in _shown:
            return
        _shown.add(where)
    module = frame.f_globals.get("__name__", "<unknown>")
    try:  # module_globals lets the warning show the user's source line
        warnings.warn_explicit(message, category, frame.f_code.co_filename, frame.f_lineno, module=module,
                               module_globals=frame.f_globals)
    except (ImportError, OSError):  # a script run as ``python -m pkg.mod``: its loader refuses the name __main__
        warnings.warn_explicit(message, category, frame.f_code.co_filename, frame.f_lineno, module=module)
