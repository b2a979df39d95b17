"""AttentionSpec: the frozen, hashable description of one attention call.

The spec travels through the graph as a plain string argument of the te_compile ops
(``AttentionSpec.key()``), so a rewritten graph is self-describing: Inductor's FX cache,
AOTAutograd and a fresh process can all rebuild the exact computation from the graph
alone, with no registry to fill first. The string is canonical JSON (sorted keys), and
``from_key`` parses it back (memoized: ops call it on every run).
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
from typing import Optional

#: mask kinds the op understands; "causal" is SDPA's top-left causal (q_idx >= kv_idx)
MASK_KINDS: tuple[str, ...] = ("none", "causal")
#: which kernel serves the op on CUDA; "reference" forces the exact eager math everywhere
IMPLS: tuple[str, ...] = ("cudnn", "reference")


@dataclasses.dataclass(frozen=True)
class AttentionSpec:
    """Everything about an attention call that is not a tensor.

    Shapes, strides and dtypes are not part of the spec: they come with the tensors at
    run time and complete the cuDNN cache key there.
    """

    #: softmax scale; None = SDPA's default 1/sqrt(head dim), resolved from q at run time
    #: (so a symbolic head dim under dynamic shapes still rewrites)
    scale: Optional[float] = None
    mask: str = "none"
    impl: str = "cudnn"
    #: where the call came from, for messages only ("sdpa" or "flex")
    source: str = "sdpa"
    #: flex score_mod as ScoreExpr text (te_compile.score.ir), "" = identity. It may read the op's
    #: extra inputs as ``(in i)``: [B|1, H|1, 1, 1] float32 terms of (b, h, captured tensors).
    score: str = ""
    #: flex mask_mod as ScoreExpr text (bool), "" = no mask; applied after score_mod
    mask_mod: str = ""
    #: how many of the op's extra tensors are ``(in i)`` inputs (the rest are BlockMask tensors)
    n_inputs: int = 0
    #: the BlockMask's block sizes (0: no BlockMask): the op also receives its kv_num_blocks, kv_indices
    #: (and full_kv_num_blocks, full_kv_indices when block_full) after the (in i) inputs, and checks
    #: once per BlockMask that mask_mod explains it
    block_q: int = 0
    block_kv: int = 0
    block_full: bool = False
    #: the bias may hold rows that are -inf everywhere (a materialized mask): the cuDNN kernel sets
    #: those rows to output 0 / lse -inf itself (te_compile.cudnn.runners)
    empty_rows: bool = False
    #: the score_mod is ALiBi with cuDNN's own slopes for this many heads under a causal mask_mod (checked at
    #: compile time, te_compile.lowering.alibi): at that head count cuDNN's built-in ALiBi serves it; 0 = not ALiBi
    alibi_heads: int = 0
    #: cuDNN's interval-mask kernels serve the mask_mod (te_compile.lowering.intervals, te_compile.cudnn.flexkernel): the
    #: mask_mod reads the op's ``n_inputs`` extra inputs as its captured tensors ``(buf i)``; no score_mod, no bias
    intervals: bool = False
    #: compare with the reference math on the first call of each configuration (te_compile.runtime.verify)
    verify: bool = False

    def __post_init__(self) -> None:
        if self.mask not in MASK_KINDS:
            raise ValueError(f"unknown mask kind {self.mask!r}; expected one of {MASK_KINDS}")
        if self.impl not in IMPLS:
            raise ValueError(f"unknown impl {self.impl!r}; expected one of {IMPLS}")
        if self.scale is not None and not isinstance(self.scale, float):
            object.__setattr__(self, "scale", float(self.scale))

    def __hash__(self) -> int:
        # computed once: every op call looks the spec up in a few caches (plans, lowerings, splits), and a
        # frozen dataclass's generated hash rebuilds the tuple of all its fields each time
        h = self.__dict__.get("_hash")
        if h is None:
            h = hash(tuple(getattr(self, f.name) for f in dataclasses.fields(self)))
            object.__setattr__(self, "_hash", h)
        return h

    def __getstate__(self) -> dict:
        # str hashes differ between processes: a pickled spec must not carry this one's
        return {k: v for k, v in self.__dict__.items() if k != "_hash"}

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)

    def scale_for(self, head_dim: int) -> float:
        return self.scale if self.scale is not None else 1.0 / math.sqrt(head_dim)

    @property
    def is_causal(self) -> bool:
        return self.mask == "causal"

    def key(self) -> str:
        """Canonical string form; ``AttentionSpec.from_key(s.key()) == s``.

        Fields at their default are left out (except scale, mask, impl and source), so SDPA keys
        stay short and adding a field later does not change existing keys."""
        d = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)
             if f.name in _ALWAYS or getattr(self, f.name) != f.default}
        return json.dumps(d, sort_keys=True, separators=(",", ":"))

    @staticmethod
    def from_key(key: str) -> "AttentionSpec":
        return _parse(key)

    def score_expr(self):
        from .score.ir import parse
        return parse(self.score) if self.score else None

    def mask_expr(self):
        from .score.ir import parse
        return parse(self.mask_mod) if self.mask_mod else None

    def describe(self, with_mask: bool = True) -> str:
        """Short human-readable form for reports and warnings (``mask`` is the op's own mask kind: a
        bias given to the op is not part of the spec)."""
        scale = "default" if self.scale is None else f"{self.scale:.6g}"
        parts = ([f"mask={self.mask}"] if with_mask else []) + [f"scale={scale}"]
        if self.score:
            parts.append(f"score_mod={self.score}")
        if self.mask_mod:
            parts.append(f"mask_mod={self.mask_mod}")
        if self.alibi_heads:
            parts.append(f"alibi=cuDNN slopes for {self.alibi_heads} heads")
        if self.intervals:
            parts.append("cuDNN interval kernels")
        if self.impl != "cudnn":
            parts.append(f"impl={self.impl}")
        return ", ".join(parts)


_ALWAYS = ("scale", "mask", "impl", "source")


@functools.lru_cache(maxsize=1024)
def _parse(key: str) -> AttentionSpec:
    try:
        fields = json.loads(key)
        return AttentionSpec(**fields)
    except (ValueError, TypeError) as e:
        raise ValueError(f"not a te_compile attention spec: {key!r} ({e})") from None
