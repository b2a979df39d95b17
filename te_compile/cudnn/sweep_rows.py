"""What a ``bench/sweep.py`` row stands for, for the refit (te_compile.cudnn.refit) and the replay
(te_compile.cudnn.replay): its site class and the share of the score matrix te_compile computes for it."""

from __future__ import annotations

from typing import Optional

#: case name -> site class, for sweep files that do not record the class (bench/sweep.py's variants,
#: every site served: ALiBi + causal with cuDNN's slopes is native there; the document mask is never served)
CASE_CLASS = {
    "flex none": "flex plain", "flex causal": "flex native band", "flex sliding <=": "flex native band",
    "flex sliding <": "flex native band", "flex softcap": "flex score_mod", "flex softcap + causal": "flex score_mod",
    "flex ALiBi": "flex additive score_mod", "flex ALiBi + causal": "flex native ALiBi + causal",
    "flex prefix-LM": "flex prefix split", "sdpa none": "sdpa", "sdpa causal": "sdpa",
    "sdpa bool mask": "sdpa mask", "sdpa frozen bias": "sdpa mask", "sdpa learned bias": "sdpa learned bias",
}
#: bench/sweep.py's flex variants: the sliding window's keys and the prefix-LM's prefix
WINDOW, PREFIX = 1024, 512


def site_class(row: dict) -> Optional[str]:
    """The class the sweep recorded for the row's served site, else its case name's."""
    return row.get("class") or CASE_CLASS.get(row.get("case", ""))


def density(case: str, L: int, S: int) -> Optional[float]:
    """The share of the score matrix te_compile computes for a sweep case, as ``cost.site_class`` computes it for
    the case's mask (None: a case not known here)."""
    name = case.removeprefix("flex ").removeprefix("sdpa ")
    if name in ("none", "softcap", "ALiBi", "bool mask", "frozen bias", "learned bias"):
        return 1.0
    if name in ("causal", "softcap + causal", "ALiBi + causal"):
        return 0.5
    if name in ("sliding <=", "sliding <"):
        width = min(S, WINDOW if name == "sliding <=" else WINDOW - 1)
        return min(1.0, width / S)
    if name == "prefix-LM":
        m = min(L, S) - PREFIX
        return (L * PREFIX + m * (m + 1) // 2 + max(0, L - S) * (S - PREFIX)) / (L * S)
    return None


__all__ = ["CASE_CLASS", "site_class", "density", "WINDOW", "PREFIX"]
