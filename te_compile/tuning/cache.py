"""The persistent cache of speed measurements: one JSON file, safe under concurrent processes.

Where: ``$TE_COMPILE_CACHE_DIR/measurements-v1.json`` if set, else ``te_compile/`` under torch's Inductor
cache directory (``TORCHINDUCTOR_CACHE_DIR``, by default ``/tmp/torchinductor_<user>``). Each entry is keyed by
the graph and class measured (``tuning.graph_ab.key``: the graph's signature, the class, grads, GPU name, cuDNN
and torch versions), so another GPU or library version misses instead of reading a stale answer.

Writers take an exclusive lock on a lock file next to it, re-read the file, merge their entries and replace it
atomically (write a temporary file, then ``os.replace``), so readers never see a half-written file and
concurrent writers never lose each other's entries. A file that does not parse is read as empty (with a
warning) and replaced on the next write.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import tempfile
import threading
from typing import Any, Iterator, Optional

from .. import env

ENV = "TE_COMPILE_CACHE_DIR"
FILE = "measurements-v1.json"
#: bumped when an entry's meaning changes; entries of other formats are ignored
FORMAT = 1

log = logging.getLogger("te_compile")
_lock = threading.Lock()


def cache_dir() -> str:
    if env.value(ENV):
        return env.value(ENV)
    try:
        from torch._inductor.runtime.cache_dir_utils import cache_dir as inductor_dir
        return os.path.join(inductor_dir(), "te_compile")
    except Exception:  # noqa: BLE001 - older layouts: the same default Inductor uses
        return os.path.join(tempfile.gettempdir(), "te_compile")


def path() -> str:
    return os.path.join(cache_dir(), FILE)


def _read(p: str) -> dict[str, Any]:
    try:
        with open(p) as f:
            data = json.load(f)
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as e:
        log.warning("te_compile: ignoring the unreadable measurement cache %s (%s); it is rewritten on the next "
                    "measurement", p, e)
        return {}
    if not isinstance(data, dict) or data.get("format") != FORMAT or not isinstance(data.get("entries"), dict):
        return {}
    return data["entries"]


@contextlib.contextmanager
def _exclusive(p: str) -> Iterator[None]:
    os.makedirs(os.path.dirname(p), exist_ok=True)
    with _lock, open(p + ".lock", "a") as lf:
        try:
            import fcntl
            fcntl.flock(lf, fcntl.LOCK_EX)
        except ImportError:  # not POSIX: the in-process lock only
            pass
        yield


def get(key: str) -> Optional[dict[str, Any]]:
    """The entry stored under ``key``, or None."""
    entry = _read(path()).get(key)
    return entry if isinstance(entry, dict) else None


def put(key: str, entry: dict[str, Any]) -> None:
    """Store ``entry`` under ``key`` (other processes' entries written meanwhile are kept)."""
    p = path()
    with _exclusive(p):
        entries = _read(p)
        entries[key] = entry
        fd, tmp = tempfile.mkstemp(dir=os.path.dirname(p), prefix=".measurements-", suffix=".tmp")
        try:
            with os.fdopen(fd, "w") as f:
                json.dump({"format": FORMAT, "entries": entries}, f, indent=1, sort_keys=True)
            os.replace(tmp, p)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise


def entries() -> dict[str, Any]:
    """Every stored entry (for ``te-compile tune --list`` and tests)."""
    return dict(_read(path()))


__all__ = ["cache_dir", "path", "get", "put", "entries", "ENV", "FORMAT"]
