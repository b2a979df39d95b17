"""ScoreExpr -> cuDNN pointwise ops inside the score_mod / score_mod_bprop callbacks."""

from __future__ import annotations

from typing import Optional

from ..spec import AttentionSpec


def unsupported_reason(spec: AttentionSpec) -> Optional[str]:
    """Why the spec's score_mod / mask_mod cannot be emitted to cuDNN, or None."""
    return "flex score_mod / mask_mod on cuDNN: not emitted yet (Inductor keeps the call)"
