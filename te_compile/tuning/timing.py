"""Timing two variants of a graph (or a model), and the decision that follows from the numbers.

``measure_pair`` runs te_compile's variant and torch.compile's back to back in alternating rounds (drift in
clocks or host load moves both), each round a loop of calls after warm-up, and keeps each round's ratio
torch.compile / cuDNN. ``serve_on_cudnn``: the median ratio is at least ``1 + MIN_MARGIN`` and cuDNN was faster
in all rounds but a sign test's few (``allowed_losses``); when unsure, as many rounds again, once. The timer is a
parameter, so the decision is tested on the CPU with a fake one.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
import time
from typing import Any, Callable, Mapping, Optional

import torch

#: the smallest advantage that serves a site on cuDNN (relative), whatever the measured noise
MIN_MARGIN = 0.03

#: timer(fn, iters) -> ms per call of fn
Timer = Callable[[Callable[[], object], int], float]


@dataclasses.dataclass(frozen=True)
class Measurement:
    te_ms: float
    tc_ms: float
    #: relative spread of the rounds ((max - min) / median without the extreme rounds, the larger side)
    noise: float
    rounds: int
    #: seconds the measurement took (warm-up included): part of compile time
    seconds: float = 0.0
    #: torch.compile ms / cuDNN ms of each round
    ratios: tuple[float, ...] = ()

    @property
    def wins(self) -> int:
        """Rounds in which cuDNN was faster."""
        return sum(r > 1.0 for r in self.ratios)

    def as_entry(self, **extra: object) -> dict:
        return {"te_ms": self.te_ms, "tc_ms": self.tc_ms, "noise": self.noise, "rounds": self.rounds,
                "seconds": self.seconds, "ratios": [round(r, 5) for r in self.ratios], **extra}

    @staticmethod
    def from_entry(e: dict) -> Optional["Measurement"]:
        """The entry's measurement; None when it is unreadable or has no round ratios (the rules decide then)."""
        try:
            m = Measurement(float(e["te_ms"]), float(e["tc_ms"]), float(e["noise"]), int(e["rounds"]),
                            float(e.get("seconds", 0.0)), tuple(float(r) for r in e.get("ratios") or ()))
        except (KeyError, TypeError, ValueError):
            return None
        return m if m.ratios else None


def allowed_losses(n: int) -> int:
    """Rounds cuDNN may lose out of ``n`` and still be called faster: a one-sided sign test at about 6%
    (7 rounds: 1; 14 rounds: 3), none below 5 rounds."""
    if n < 5:
        return 0
    k, total, tail = 0, 2 ** n, 1  # tail = rounds-lost counts 0..k, as a number of outcomes
    while (tail + math.comb(n, k + 1)) / total <= 0.0625:
        k += 1
        tail += math.comb(n, k)
    return k


def serve_on_cudnn(m: Measurement) -> bool:
    """cuDNN is faster: the median round ratio is at least 1 + MIN_MARGIN and cuDNN won all rounds but
    ``allowed_losses``."""
    return (statistics.median(m.ratios) >= 1.0 + MIN_MARGIN
            and len(m.ratios) - m.wins <= allowed_losses(len(m.ratios)))


def undecided(ratios: list[float]) -> bool:
    """Worth more rounds: the median says cuDNN wins by the margin, too many rounds say otherwise."""
    return (statistics.median(ratios) >= 1.0 + MIN_MARGIN
            and sum(r <= 1.0 for r in ratios) > allowed_losses(len(ratios)))


def tensors(x: Any) -> list[torch.Tensor]:
    """Every tensor in ``x`` (tensors, tuples, lists, dicts and dict-like outputs)."""
    if isinstance(x, torch.Tensor):
        return [x]
    if isinstance(x, Mapping):
        x = list(x.values())
    if isinstance(x, (list, tuple)):
        return [t for item in x for t in tensors(item)]
    return []


def step(call: Callable[[], object], leaves: list, needs_grad: bool) -> Callable[[], object]:
    """One timed call: ``call()`` without grad, or ``call()`` and the gradients of ``leaves`` of its floating outputs
    that require grad (nothing accumulates into ``.grad``)."""
    if not needs_grad:
        def infer() -> object:
            with torch.no_grad():
                return call()
        return infer

    def train() -> object:
        outs = [o for o in tensors(call()) if o.requires_grad and o.is_floating_point()]
        if not outs or not leaves:
            return outs
        return torch.autograd.grad(outs, leaves, [torch.ones_like(o) for o in outs], allow_unused=True)
    return train


def wall_timer(sync: Optional[Callable[[], None]] = None) -> Timer:
    """ms per call by the host clock, with ``sync`` (torch.cuda.synchronize on a GPU) around the loop."""
    def timer(fn: Callable[[], object], iters: int) -> float:
        if sync:
            sync()
        t0 = time.perf_counter()
        for _ in range(iters):
            fn()
        if sync:
            sync()
        return (time.perf_counter() - t0) * 1e3 / iters
    return timer


def spread(xs: list[float]) -> float:
    """(max - min) / median of ``xs``, without the smallest and the largest when there are four or more."""
    s = sorted(xs)
    if len(s) >= 4:
        s = s[1:-1]
    m = statistics.median(xs)
    return (s[-1] - s[0]) / m if m > 0 else 0.0


def measure_pair(te: Callable[[], object], tc: Callable[[], object], timer: Timer, rounds: int = 7,
                 iters: int = 10, warmup: int = 3, target_ms: Optional[float] = None) -> Measurement:
    """Median ms per call of each candidate over ``rounds`` alternating rounds of ``iters`` calls (with
    ``target_ms``: as many calls as make a round of the slower candidate last about that long)."""
    t0 = time.perf_counter()
    for _ in range(warmup):
        te()
        tc()
    if target_ms:
        one = max(timer(te, 1), timer(tc, 1), 1e-3)
        iters = max(3, min(1000, int(target_ms / one)))
    a, b = [], []

    def run(n: int) -> None:
        for _ in range(n):
            first, second = ((te, a), (tc, b)) if len(a) % 2 == 0 else ((tc, b), (te, a))
            for fn, out in (first, second):
                out.append(timer(fn, iters))
    run(rounds)
    if undecided([y / x for x, y in zip(a, b)]):
        run(rounds)
    ma, mb = statistics.median(a), statistics.median(b)
    noise = max(spread(a), spread(b))
    ratios = tuple(y / x if x > 0 else math.inf for x, y in zip(a, b))
    return Measurement(ma, mb, noise, len(a), time.perf_counter() - t0, ratios)


__all__ = ["Measurement", "measure_pair", "serve_on_cudnn", "spread", "wall_timer", "allowed_losses", "undecided",
           "MIN_MARGIN", "Timer", "step", "tensors"]
