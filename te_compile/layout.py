"""Output layouts shared by the fake kernels, the reference kernel and the cuDNN kernel.

Outputs adopt the layout of the input they mirror (O and dQ follow Q, dK follows K, dV
follows V), so a BSHD model (``x.view(B, S, H, D).transpose(1, 2)``) gets BSHD outputs and the
transpose back is free. All kernels must agree on these strides: the fake kernel promises
them to the compiler, the real kernels write them.
"""

from __future__ import annotations

from typing import Optional, Sequence

import torch
from torch import Tensor


def like_layout_strides(shape: Sequence[int], like: Tensor) -> tuple[int, ...]:
    """Dense strides for ``shape`` with ``like``'s dimension order (innermost = smallest stride).

    Falls back to row-major when ``like`` is broadcast (a zero stride) or its last dimension is
    not the innermost one, so the result always has a unit last stride (cuDNN needs it).
    """
    strides = like.stride()
    if len(shape) != like.dim() or 0 in strides or strides[-1] != 1:
        return contiguous_strides(shape)
    # stable sort, innermost first; ties (size-1 dims) keep row-major order from the right
    order = sorted(range(like.dim()), key=lambda d: (strides[d], -d))
    if order[0] != like.dim() - 1:
        return contiguous_strides(shape)
    out = [0] * len(shape)
    acc = 1
    for d in order:
        out[d] = acc
        acc = acc * shape[d]
    return tuple(out)


def contiguous_strides(shape: Sequence[int]) -> tuple[int, ...]:
    out = [0] * len(shape)
    acc = 1
    for d in range(len(shape) - 1, -1, -1):
        out[d] = acc
        acc = acc * shape[d]
    return tuple(out)


def empty_like_layout(shape: Sequence[int], like: Tensor, dtype: torch.dtype | None = None) -> Tensor:
    return torch.empty_strided(tuple(shape), like_layout_strides(shape, like),
                               dtype=like.dtype if dtype is None else dtype, device=like.device)


def concrete(dims) -> Optional[tuple[int, ...]]:
    """``dims`` as plain ints, or None when any is symbolic (a SymInt: reading it as an int would install a
    Dynamo guard and specialize the graph to this size)."""
    dims = tuple(dims)
    return dims if all(isinstance(d, int) and not isinstance(d, bool) for d in dims) else None


def size_hints(dims) -> Optional[tuple[int, ...]]:
    """``dims`` as ints, a symbolic size read as the size this compile saw (its hint) without a guard;
    None when a symbolic size has no hint."""
    out = []
    for d in dims:
        if isinstance(d, int):
            out.append(int(d))
            continue
        hint = getattr(getattr(d, "node", None), "hint", None)
        if not isinstance(hint, int):
            return None
        out.append(hint)
    return tuple(out)
