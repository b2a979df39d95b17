"""Which calibration of the cost model (``te_compile.cudnn.cost``) decides here: one per GPU and cuDNN version.

The cost model's constants (cuDNN's throughput, host time per step, torch.compile's kernel time over
te_compile's per site class) are measurements, and GPUs, cuDNN versions and host CPUs move them. A
``Calibration`` is one set of them with what it was fitted on. ``cost.BUILTIN`` is the hand-fitted table in
cost.py; ``te_compile/cudnn/calibrations/*.json`` are refits from the project's own sweeps, and the files
named in ``$TE_COMPILE_CALIBRATION`` (``os.pathsep``-separated) a user's own (``te-compile calibrate``,
``te_compile.cudnn.refit``). For the running GPU and cuDNN, ``current()`` takes, in order: one fitted on
this GPU and this cuDNN version; one fitted on this GPU at the nearest cuDNN version; the built-in one.
Its ``how`` says which, so a reason never passes another GPU's calibration off as this one's. A class a
calibration did not fit falls back to the built-in ratio for it (``cost.ratio``).
"""

from __future__ import annotations

import dataclasses
import functools
import glob
import json
import logging
import math
import os
from typing import Optional

from .versions import describe

log = logging.getLogger("te_compile")
ENV = "TE_COMPILE_CALIBRATION"
HERE = os.path.join(os.path.dirname(__file__), "calibrations")


@dataclasses.dataclass(frozen=True)
class Calibration:
    gpu: str
    cudnn: int
    #: cuDNN SDPA throughput te_compile reaches, fwd+bwd TFLOP/s
    te_tflops: float
    #: host ms per step of a one-site compiled graph: {"te_compile" | "torch.compile": {"train", "infer"}}
    host_ms: dict
    #: torch.compile's kernel time / te_compile's, by site class (cost.site_class)
    speed_ratio: dict
    #: what it was fitted on (files, dates)
    source: str = ""
    #: the GPU's architecture, "sm90" ("" when not recorded)
    arch: str = ""
    #: by site class (``by_tokens_key``: sites computing part of the score matrix apart from those computing all of
    #: it), points [tokens, efficiency, ratio] measured at that sequence length: efficiency = te_compile's kernel
    #: time estimated from its FLOPs (computed share of the score matrix included) at ``te_tflops`` over the
    #: measured one, ratio = torch.compile's kernel time / te_compile's. Between points both follow log2(tokens)
    #: linearly; outside them, the nearest point's. A class without points: efficiency 1, ``speed_ratio``.
    by_tokens: dict = dataclasses.field(default_factory=dict)

    def label(self) -> str:
        return f"{self.gpu}, cuDNN {describe(self.cudnn)}"

    def at(self, cls: str, tokens: int, density: float = 1.0) -> Optional[tuple[float, float]]:
        """(efficiency, ratio) of a ``cls`` site computing ``density`` of its score matrix at ``tokens`` queries,
        from ``by_tokens``; None where it has no points for it."""
        pts = sorted(self.by_tokens.get(by_tokens_key(cls, density)) or [])
        if not pts:
            return None
        x = math.log2(max(tokens, 1))
        xs = [math.log2(p[0]) for p in pts]
        if x <= xs[0]:
            return float(pts[0][1]), float(pts[0][2])
        if x >= xs[-1]:
            return float(pts[-1][1]), float(pts[-1][2])
        i = next(i for i in range(1, len(xs)) if x <= xs[i])
        w = (x - xs[i - 1]) / (xs[i] - xs[i - 1])
        return tuple(float(pts[i - 1][j] + w * (pts[i][j] - pts[i - 1][j])) for j in (1, 2))  # type: ignore[return-value]

    def to_json(self) -> dict:
        return dataclasses.asdict(self)

    @staticmethod
    def from_json(d: dict) -> "Calibration":
        return Calibration(str(d["gpu"]), int(d["cudnn"]), float(d["te_tflops"]),
                           {k: {m: float(x) for m, x in v.items()} for k, v in d["host_ms"].items()},
                           {k: float(x) for k, x in d["speed_ratio"].items()}, str(d.get("source", "")),
                           str(d.get("arch", "")),
                           {k: [[int(t), float(e), float(r)] for t, e, r in v] for k, v in d.get("by_tokens", {}).items()})


def by_tokens_key(cls: str, density: float) -> str:
    """The ``Calibration.by_tokens`` key of a site class computing ``density`` of its score matrix: masked sites
    (causal, windows) and full ones run at different efficiencies and ratios in one class."""
    return cls if density >= 1.0 else f"{cls}, masked"


def _files() -> list[str]:
    extra = [p for p in os.environ.get(ENV, "").split(os.pathsep) if p]
    return sorted(glob.glob(os.path.join(HERE, "*.json"))) + extra


def load() -> list[Calibration]:
    """Every calibration te_compile knows: the shipped refits, then the user's (later ones win ties)."""
    out = []
    for path in _files():
        try:
            with open(path) as f:
                out.append(Calibration.from_json(json.load(f)))
        except (OSError, ValueError, KeyError, TypeError) as e:
            log.warning("te_compile: ignoring calibration %s (%s: %s)", path, type(e).__name__, e)
    return out


def _nearest(cals: list[Calibration], cudnn: int) -> Calibration:
    """The one at this cuDNN version (the last such), else the nearest version."""
    exact = [c for c in cals if c.cudnn == cudnn]
    return exact[-1] if exact else min(cals, key=lambda c: abs(c.cudnn - cudnn))


def choose(cals: list[Calibration], gpu: str, cudnn: int, base: Calibration, arch: str = ""
           ) -> tuple[Calibration, str]:
    """(the calibration for this GPU, architecture and cuDNN version, how it was chosen); ``base``: the built-in
    one, taken last."""
    running = f"running {gpu}, cuDNN {describe(cudnn)}"
    same_gpu = [c for c in cals + [base] if c.gpu == gpu]
    if same_gpu:
        got = _nearest(same_gpu, cudnn)
        return got, ("fitted on this GPU and cuDNN" if got.cudnn == cudnn
                     else f"fitted on this GPU at another cuDNN version ({running})")
    same_arch = [c for c in cals + [base] if arch and c.arch == arch]
    if same_arch:
        got = _nearest(same_arch, cudnn)
        return got, f"fitted on another GPU of this architecture, {arch} ({running})"
    return base, f"not fitted on this GPU, its architecture or cuDNN ({running})"


@functools.lru_cache(maxsize=8)
def _loaded(files: tuple) -> tuple:
    return tuple(load())


def current(base: Calibration) -> tuple[Calibration, str]:
    """The calibration for the running GPU (device 0) and cuDNN, and how it was chosen."""
    import torch

    from .versions import running
    gpu, arch = "cpu", ""
    if torch.cuda.is_available():
        gpu = torch.cuda.get_device_name(0)
        arch = "sm{}{}".format(*torch.cuda.get_device_capability(0))
    return choose(list(_loaded(tuple(_files()))), gpu, running(), base, arch)


__all__ = ["Calibration", "by_tokens_key", "load", "choose", "current", "ENV"]
