"""Timing two candidates for one site, and the decision that follows from the numbers.

``measure_pair`` runs te_compile's candidate and torch.compile's in alternating rounds (so drift in clocks or
host load falls on both), each round a loop of calls after warm-up (as many as fill ``target_ms``), and reports
each side's median over rounds and the noise: the spread of the rounds, leaving out the fastest and the slowest
one when there are four or more (one stray round must not decide). ``serve_on_cudnn`` says cuDNN wins only when it is
faster by more than the noise (and at least ``MIN_MARGIN``): when unsure, the site stays with torch.compile.
The timer is a parameter, so the decision is tested on the CPU with a fake one.
"""

from __future__ import annotations

import dataclasses
import statistics
import time
from typing import Callable, Optional

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

    def as_entry(self, **extra: object) -> dict:
        return {"te_ms": self.te_ms, "tc_ms": self.tc_ms, "noise": self.noise, "rounds": self.rounds,
                "seconds": self.seconds, **extra}

    @staticmethod
    def from_entry(e: dict) -> Optional["Measurement"]:
        try:
            return Measurement(float(e["te_ms"]), float(e["tc_ms"]), float(e["noise"]), int(e["rounds"]),
                               float(e.get("seconds", 0.0)))
        except (KeyError, TypeError, ValueError):
            return None


def serve_on_cudnn(m: Measurement) -> bool:
    """cuDNN is faster by more than the noise (and MIN_MARGIN)."""
    return m.te_ms * (1.0 + max(MIN_MARGIN, m.noise)) < m.tc_ms


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
    for r in range(rounds):
        first, second = ((te, a), (tc, b)) if r % 2 == 0 else ((tc, b), (te, a))
        for fn, out in (first, second):
            out.append(timer(fn, iters))
    ma, mb = statistics.median(a), statistics.median(b)
    noise = max(spread(a), spread(b))
    return Measurement(ma, mb, noise, rounds, time.perf_counter() - t0)


__all__ = ["Measurement", "measure_pair", "serve_on_cudnn", "spread", "wall_timer", "MIN_MARGIN", "Timer"]
