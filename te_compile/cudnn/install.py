"""How te_compile is installed, and what to tell a user whose install cannot run the cuDNN target.

Installing te_compile (``pip install .`` from a checkout) brings torch and numpy only: enough for the reference target (the exact
attention math, on any device) and for ``explain`` on a CPU. The cuDNN target needs the cuDNN
frontend (``nvidia-cudnn-frontend``, about 600 MB with the CUDA-only libraries it pulls in), which
comes with the ``cuda`` extra (``pip install '.[cuda]'`` from a checkout) or on its own:
``pip install 'nvidia-cudnn-frontend>=1.32'``. Without it, every CUDA site is kept
(it runs through Inductor, as with plain ``torch.compile``) with the reason ``frontend_missing`` gives
(category ``cudnn-unavailable``).
"""

from __future__ import annotations

from ..reasons import CUDNN_UNAVAILABLE, Reason

#: the extra that brings the cuDNN frontend (pyproject.toml's [project.optional-dependencies])
CUDA_EXTRA = "cuda"
#: the frontend's distribution and the lowest version te_compile's graphs are written for
FRONTEND = "nvidia-cudnn-frontend>=1.32"
INSTALL_HINT = f"pip install '{FRONTEND}' (te_compile's [{CUDA_EXTRA}] extra)"


def _detail(e: BaseException) -> str:
    text = str(e).strip().splitlines()[0] if str(e).strip() else ""
    if len(text) > 160:
        text = text[:157] + "..."
    return f"{type(e).__name__}: {text}" if text else type(e).__name__


def frontend_missing(e: BaseException) -> Reason:
    """The user-facing reason a site is kept when ``import cudnn`` (or a te_compile module built on it)
    raised ``e``.

    The frontend's own package missing reads "cuDNN frontend not installed (...): pip install
    'nvidia-cudnn-frontend>=1.32' (te_compile's [cuda] extra)"; anything else (the frontend or one of its libraries present but failing to
    load) reads "cuDNN frontend unavailable (...)" with the same install line, which also repairs it.
    """
    missing = isinstance(e, ModuleNotFoundError) and (e.name or "").split(".")[0] == "cudnn"
    if missing:
        return Reason(f"cuDNN frontend not installed ({_detail(e)}): {INSTALL_HINT}", CUDNN_UNAVAILABLE)
    return Reason(f"cuDNN frontend unavailable ({_detail(e)}): {INSTALL_HINT}", CUDNN_UNAVAILABLE)
