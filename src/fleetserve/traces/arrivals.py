"""Arrival processes for generated workloads: Poisson, diurnal and bursty, all deterministic by seed.

Each is a non-homogeneous Poisson process with a rate function r(t) whose mean over the run is `rate`,
sampled by thinning (draw at the peak rate, keep each point with probability r(t)/peak), so every process
is exact for its rate function and needs no time stepping:

- poisson: r(t) = rate;
- diurnal: r(t) = rate * (1 + a cos(2 pi (t - peak_at_s) / period_s)), a = (k - 1) / (k + 1) for a
  peak-to-trough ratio k (what a day of real traffic looks like; ServeGen's m-large has peak/mean ~3); the peak
  falls at 14:00 of the clock the trace is replayed on (`traces.clock`: it starts at 10:00, so 4/24 of the
  period in) unless `peak_at_s` says otherwise;
- bursts: bursts start as a Poisson process (one per `every_s` on average), last `burst_s`, and multiply the
  base rate by `factor` (overlapping bursts do not stack); the base rate is lowered so that the mean over the
  run stays `rate` given the time the bursts cover (Azure's code trace has minutes at 4x its mean and idle
  minutes between).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

from fleetserve.traces.clock import hour_of_day

ARRIVALS = ("poisson", "diurnal", "bursts")
PEAK_HOUR = 14.0  # a diurnal day's busiest hour (UTC, on the clock of traces without one)


def _thinned(rate_fn: Callable[[np.ndarray], np.ndarray], peak: float, duration_s: float,
             rng: np.random.Generator) -> np.ndarray:
    if peak <= 0 or duration_s <= 0:
        return np.empty(0)
    n = rng.poisson(peak * duration_s)
    t = np.sort(rng.random(n) * duration_s)
    keep = rng.random(n) * peak < rate_fn(t)
    return t[keep]


def poisson(rate: float, duration_s: float, rng: np.random.Generator) -> np.ndarray:
    return _thinned(lambda t: np.full_like(t, rate), rate, duration_s, rng)


def default_peak_s(period_s: float) -> float:
    """Where a diurnal period peaks, in seconds after the trace's start: 4/24 of the way through, which for a
    one-day period is 14:00 of the clock a trace without one is replayed on (it starts at 10:00); a shorter
    period is a day compressed into it (a 1-hour period peaks 10 minutes in), not a peak at 14:00."""
    return period_s * ((PEAK_HOUR - hour_of_day()) % 24) / 24


def diurnal(rate: float, duration_s: float, rng: np.random.Generator, period_s: float = 86400.0,
            peak_to_trough: float = 3.0, peak_at_s: float | None = None) -> np.ndarray:
    a = (peak_to_trough - 1) / (peak_to_trough + 1)
    if peak_at_s is None:
        peak_at_s = default_peak_s(period_s)

    def rate_fn(t: np.ndarray) -> np.ndarray:
        return rate * (1 + a * np.cos(2 * math.pi * (t - peak_at_s) / period_s))

    return _thinned(rate_fn, rate * (1 + a), duration_s, rng)


def bursts(rate: float, duration_s: float, rng: np.random.Generator, factor: float = 8.0, every_s: float = 300.0,
           burst_s: float = 20.0) -> np.ndarray:
    starts = np.sort(rng.random(rng.poisson(duration_s / every_s)) * duration_s)
    # bursts that overlap do not stack, so the time in a burst is the union of the bursts, not their count x
    # burst_s (with bursts as long as the gaps, that mistake gave 0.8/s for --rate 2)
    ends = np.minimum(starts + burst_s, duration_s)
    covered = float(np.sum(np.minimum(ends, np.append(starts[1:], np.inf)) - starts)) if len(starts) else 0.0
    base = rate / (1 + (factor - 1) * covered / duration_s)

    def rate_fn(t: np.ndarray) -> np.ndarray:
        if not len(starts):
            return np.full_like(t, base)
        i = np.searchsorted(starts, t, side="right") - 1
        inside = (i >= 0) & (t - starts[np.maximum(i, 0)] < burst_s)
        return np.where(inside, base * factor, base)

    return _thinned(rate_fn, base * factor, duration_s, rng)


def arrivals(kind: str, rate: float, duration_s: float, rng: np.random.Generator, **options) -> np.ndarray:
    """Arrival times in [0, duration_s) for a process named in ARRIVALS."""
    if kind == "poisson":
        return poisson(rate, duration_s, rng)
    if kind == "diurnal":
        return diurnal(rate, duration_s, rng, **options)
    if kind == "bursts":
        return bursts(rate, duration_s, rng, **options)
    raise ValueError(f"unknown arrival process {kind!r}; allowed: {', '.join(ARRIVALS)}")
