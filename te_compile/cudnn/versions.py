"""Which cuDNN versions te_compile has been checked on, and what it serves on the others.

te_compile's emitted score_mod / mask_mod graphs (``Lowering.emitted``) are pointwise graphs inside
cuDNN's SDPA; a cuDNN version can mis-run one of them so badly that the CUDA context dies (cuDNN
9.27: an illegal memory access, docs/cudnn-notes.md). So emitted graphs are served only on the
versions in ``CHECKED``; on any other version such sites stay with torch.compile, with a reason
that names the version. Native forms (plain SDPA, causal / band masks, bias tensors) are served on
every version the frontend accepts. ``TE_COMPILE_UNCHECKED_CUDNN=serve`` serves emitted graphs on
an unchecked version anyway (for checking a new version with the fuzzer).
"""

from __future__ import annotations

import functools
from typing import Optional

from .. import env
from ..reasons import CUDNN_VERSION, Reason

#: versions checked with te_compile's fuzzer and GPU suite (backend_version() -> what was run, when)
CHECKED = {91900: "2026-11-26: GPU fuzzer at 4 seeds and the cuda suite, H100 and H200; 2026-11-27 again, H200",
           92801: "2026-11-27: the full nvidia-cudnn-cu13 9.28.1 package; GPU fuzzer at 3 seeds with emitted graphs "
                  "served, and the cuda suite, H200",
           92700: "2026-11-27: nvidia-cudnn-jit-cu13 9.27.0.42 with the raw score behind one identity (it crashed "
                  "without it, docs/cudnn-notes.md); GPU fuzzer at 2 seeds with emitted graphs served, and the cuda "
                  "suite, H200"}

#: unchecked versions with a known failure of emitted graphs (version -> what it did); none known now
KNOWN: dict[int, str] = {}

ENV = "TE_COMPILE_UNCHECKED_CUDNN"


@functools.lru_cache(maxsize=1)
def running() -> int:
    """cuDNN's backend version as the frontend sees it (91900 for 9.19), 0 when unknown."""
    try:
        import cudnn
        return int(cudnn.backend_version())
    except Exception:  # noqa: BLE001 - no frontend: nothing is served on cuDNN anyway
        return 0


def describe(version: int) -> str:
    """91900 -> "9.19", 92700 -> "9.27" (cuDNN 9 encodes major * 10000 + minor * 100 + patch)."""
    if version <= 0:
        return "unknown"
    major, rest = divmod(version, 10000)
    minor, patch = divmod(rest, 100)
    return f"{major}.{minor}" + (f".{patch}" if patch else "")


def emitted_reason(version: Optional[int] = None) -> Optional[str]:
    """Why an emitted score_mod / mask_mod graph is not served on this cuDNN version, or None (served)."""
    v = running() if version is None else version
    if v == 0 or v in CHECKED or env.value(ENV) == "serve":
        return None  # 0: no cuDNN library runs here (a CPU machine explaining a GPU graph): nothing to crash
    checked = ", ".join(describe(c) for c in sorted(CHECKED))
    if v in KNOWN:
        return Reason(f"cuDNN {describe(v)} {KNOWN[v]}; emitted score_mod / mask_mod graphs are served on {checked}",
                      CUDNN_VERSION)
    return Reason(f"cuDNN {describe(v)} has not been checked with te_compile's emitted score_mod / mask_mod graphs "
            f"(checked: {checked}); kept rather than guessed ({ENV}=serve serves them)", CUDNN_VERSION)
