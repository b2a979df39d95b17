"""te_compile: a torch.compile backend that runs attention on cached cuDNN graphs.

    torch.compile(model, backend="te_compile")                 # no import needed
    torch.compile(model, backend=te_compile.backend(inner="aot_eager", target="reference"))
    print(te_compile.explain(model, x))                        # what was rewritten, and why
"""

from __future__ import annotations

from . import ops  # noqa: F401  (registers torch.ops.te_compile.*)
from .backend import backend, te_compile_backend
from .explain import Report, explain
from .spec import AttentionSpec

__version__ = "0.1.0"
__all__ = ["backend", "te_compile_backend", "explain", "Report", "AttentionSpec", "__version__"]
