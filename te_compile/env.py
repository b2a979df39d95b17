"""te_compile's environment variables: what each accepts, read in one place.

``value(NAME)`` is the variable's value, or its default when it is unset; a value it does not accept is named in
one line (a warning on te_compile's logger, once per variable and value) and the default is used, so a typo never
breaks ``import te_compile``. ``problems()`` lists every set variable whose value is not accepted: the command line
stops with exit code 2 (naming each one no warning has named yet).
"""

from __future__ import annotations

import logging
import os
import threading
from typing import Optional

#: name -> (accepted values, None: any non-empty text; the default; what it does)
VARIABLES: dict[str, tuple[Optional[tuple[str, ...]], str, str]] = {
    "TE_COMPILE_SERVE": (("fastest", "always"), "fastest",
                         "the serve policy: fastest (where cuDNN is faster) or always (wherever cuDNN can serve)"),
    "TE_COMPILE_DIRECT": (("0", "1"), "1", "0: call a graph of only te_compile's ops through Inductor too"),
    "TE_COMPILE_INTERVALS": (("0", "1"), "1", "0: flex masks of key intervals stay off cuDNN's interval kernels (read "
                             "at compile time)"),
    "TE_COMPILE_NATIVE": (("0", "1"), "1", "0: run cuDNN sites on the Python call path, not the C++ one"),
    "TE_COMPILE_NATIVE_REPLAY": (("0", "1"), "1", "0: the native call path launches without replays"),
    "TE_COMPILE_CUDAGRAPH_UNSAFE": (("0", "1"), "0", "1: tag te_compile's ops cudagraph_unsafe (read at import)"),
    "TE_COMPILE_UNCHECKED_CUDNN": (("serve", ""), "", "serve: serve emitted graphs on an unchecked cuDNN version"),
    "TE_COMPILE_CACHE_DIR": (None, "", "the folder of the measurement cache (te_compile.tune)"),
    "TE_COMPILE_NATIVE_DIR": (None, "", "the folder the native call path's extension is built in"),
    "TE_COMPILE_NATIVE_DEBUG": (None, "", "any text: build the native call path with debug symbols, trace its misses"),
}

log = logging.getLogger("te_compile")
_warned: set = set()
_lock = threading.Lock()


def problem(name: str) -> Optional[str]:
    """One line naming ``name`` and what it accepts when its value is not accepted, else None (also unset)."""
    accepted, _, _ = VARIABLES[name]
    raw = os.environ.get(name)
    if raw is None or accepted is None or raw in accepted:
        return None
    shown = ", ".join(repr(a) for a in accepted if a) + (" or empty" if "" in accepted else "")
    return f"{name}={raw!r} is not valid: expected {shown} (te_compile uses {VARIABLES[name][1]!r}, as when unset)"


def value(name: str) -> str:
    """The value of te_compile's variable ``name``: as set when it is accepted, else its default (a value it
    does not accept is named in one warning line)."""
    accepted, default, _ = VARIABLES[name]
    why = problem(name)
    if why is None:
        return os.environ.get(name, default) if accepted is not None else os.environ.get(name) or default
    with _lock:
        first = why not in _warned
        _warned.add(why)
    if first:
        log.warning("te_compile: %s", why)
    return default


def problems(unreported: bool = False) -> list[str]:
    """One line per set variable whose value is not accepted (empty: all are); ``unreported``: only those no
    warning has named yet."""
    return [why for why in map(problem, VARIABLES) if why and not (unreported and why in _warned)]


__all__ = ["VARIABLES", "value", "problem", "problems"]
