"""te_compile: a torch.compile backend that runs attention on cached cuDNN graphs.

    torch.compile(model, backend="te_compile")                 # no import needed
    torch.compile(model, backend=te_compile.backend(inner="aot_eager", target="reference"))
    print(te_compile.explain(model, x))                        # what was rewritten, and why
    te_compile.tune(model, x)                                  # measure its sites on this GPU (cached)
    te_compile.runtime_fallbacks()                             # served calls cuDNN declined at run time
    te_compile.counters.snapshot()                             # every count: compile phases, fallbacks, native calls
"""

from __future__ import annotations

from .runtime import ops  # noqa: F401  (registers torch.ops.te_compile.*)
from . import counters
from .backend import backend, compile, te_compile_backend  # noqa: A004
from .api.explain import Report, explain
from .runtime.kernels import runtime_fallbacks
from .spec import AttentionSpec
from .api.autotune import tune
from .runtime.verify import VerificationError

__version__ = "0.1.0"
__all__ = ["backend", "compile", "te_compile_backend", "explain", "tune", "Report", "AttentionSpec",
           "VerificationError", "runtime_fallbacks", "counters", "__version__"]


def _inside_torch_log_setup() -> bool:
    """Is torch importing te_compile from its own log setup (then torch sets up our logger too)?"""
    import sys

    f = sys._getframe(1)
    while f is not None:
        if f.f_code.co_name == "_init_logs" and "torch" in f.f_code.co_filename:
            return True
        f = f.f_back
    return False


def _register_torch_logs() -> None:
    """Make ``TORCH_LOGS="+te_compile"`` (and ``torch._logging.set_logs(modules={"te_compile": ...})``)
    show te_compile's decisions and site reports next to the other compile logs."""
    import os

    try:
        import logging

        from torch._logging import _internal

        _internal.register_log("te_compile", "te_compile")
        if "te_compile" in os.environ.get("TORCH_LOGS", "") and not _inside_torch_log_setup():
            # set up te_compile's own logger only: torch may import te_compile (its Dynamo backend entry
            # point) while it sets up logging itself, and a second _init_logs() there printed every torch
            # log line twice
            _internal._update_log_state_from_env()
            log = logging.getLogger("te_compile")
            level = dict(_internal.log_state.get_log_level_pairs()).get("te_compile")
            if level is not None:
                log.setLevel(level)
                log.propagate = False
            if not any(_internal._is_torch_handler(h) for h in log.handlers):
                _internal._setup_handlers(logging.StreamHandler, log)
    except Exception:  # noqa: BLE001 - logging integration must never break import
        pass


_register_torch_logs()


def _register_backend_name() -> None:
    """``torch.compile(model, backend="te_compile")`` finds te_compile through its entry point once it is installed;
    a checkout used without installing (on ``PYTHONPATH``) registers the name when imported."""
    try:
        from importlib.metadata import entry_points

        if any(ep.name == "te_compile" for ep in entry_points(group="torch_dynamo_backends")):
            return
        from torch._dynamo.backends.registry import _COMPILER_FNS, register_backend

        if "te_compile" not in _COMPILER_FNS:
            register_backend(compiler_fn=te_compile_backend, name="te_compile")
    except Exception:  # noqa: BLE001 - registering the name must never break import
        pass


_register_backend_name()
