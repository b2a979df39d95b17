"""Under CUDA graphs, an overwritten CUDA-graph output reaching a kernel must raise, not kill the process.

torch's CUDA-graph trees free the outputs of an earlier replay when a new one starts and mark their storages,
so that touching such a tensor raises "accessing tensor output of CUDAGraphs that has been overwritten by a
subsequent run". When the caller passes such an output back in (Hugging Face ``generate`` with a static cache
and ``mode="reduce-overhead"`` does), the tree can mark it while the call is under way and then hand it to an
Inductor kernel. If that kernel is launched by Inductor's static CUDA launcher, the process dies with a
segfault; Triton's own launcher reads the pointer through ``data_ptr()`` and raises. Plain torch.compile
shows both outcomes on the same script, depending on incidental state (docs/cudnn-notes.md, "A segfault
under CUDA graphs").

So the graphs te_compile compiles under CUDA graphs use Triton's launcher (kernel launches are recorded into
the graph, so replays cost the same), and the Triton launcher's TypeError about the pointer is re-raised as
torch's own RuntimeError naming the overwritten output.
"""

from __future__ import annotations

import functools
from typing import Any, Callable, Optional

import torch

#: the Inductor setting for the static launcher (torch >= 2.11 spells it this way; 2.13 also has an alias)
STATIC_LAUNCHER = "use_static_cuda_launcher"
_POINTER_ERROR = "Pointer argument"


def without_static_launcher(config: Optional[dict]) -> dict:
    """Inductor config patches with the static launcher off, unless the user set it."""
    config = dict(config or {})
    import torch._inductor.config as ic
    if STATIC_LAUNCHER not in config and hasattr(ic, STATIC_LAUNCHER):
        config[STATIC_LAUNCHER] = False
    return config


def _tensors(args: tuple) -> list:
    if len(args) == 1 and isinstance(args[0], (list, tuple)):  # a boxed call: one list of inputs
        args = tuple(args[0])
    return [a for a in args if isinstance(a, torch.Tensor)]


def _overwritten(t: torch.Tensor) -> Optional[RuntimeError]:
    """The RuntimeError torch raises for ``t`` if it is a freed CUDA-graph output, else None."""
    try:
        t.data_ptr()
    except RuntimeError as e:
        return e
    return None


def raising_on_overwritten(compiled: Callable) -> Callable:
    """``compiled``, with Triton's pointer TypeError for an overwritten input turned into torch's RuntimeError."""

    @functools.wraps(compiled)
    def run(*args: Any) -> Any:
        try:
            return compiled(*args)
        except TypeError as e:
            if _POINTER_ERROR not in str(e):
                raise
            for t in _tensors(args):
                err = _overwritten(t)
                if err is not None:
                    raise RuntimeError(str(err)) from e
            raise

    return run
