"""te_compile: a torch.compile backend that runs attention on cached cuDNN graphs.

    torch.compile(model, backend="te_compile")                 # no import needed
    torch.compile(model, backend=te_compile.backend(inner="aot_eager", target="reference"))
    print(te_compile.explain(model, x))                        # what was rewritten, and why
"""

from __future__ import annotations

from . import ops  # noqa: F401  (registers torch.ops.te_compile.*)
from .backend import backend, compile, te_compile_backend  # noqa: A004
from .explain import Report, explain
from .spec import AttentionSpec
from .verify import VerificationError

__version__ = "0.1.0"
__all__ = ["backend", "compile", "te_compile_backend", "explain", "Report", "AttentionSpec",
           "VerificationError", "__version__"]


def _register_torch_logs() -> None:
    """Make ``TORCH_LOGS="+te_compile"`` (and ``torch._logging.set_logs(modules={"te_compile": ...})``)
    show te_compile's decisions and site reports next to the other compile logs."""
    import os

    try:
        from torch._logging import _internal

        _internal.register_log("te_compile", "te_compile")
        if "te_compile" in os.environ.get("TORCH_LOGS", ""):
            _internal._init_logs()
    except Exception:  # noqa: BLE001 - logging integration must never break import
        pass


_register_torch_logs()
