"""One clock type for the router, the backend pool and the supervisor, so timing tests run in virtual time.

A clock is a zero-argument callable returning seconds: `time.monotonic` for deadlines, cooldowns and
cold starts, `time.time` where a wall time is needed (cron floors, cost). Tests pass a `ManualClock` and
advance it instead of sleeping.
"""

from __future__ import annotations

from collections.abc import Callable

Clock = Callable[[], float]


class ManualClock:
    """Virtual time that moves only when a test advances it (or sets `now`)."""

    def __init__(self, start: float = 1000.0):
        self.now = float(start)

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> float:
        if seconds < 0:
            raise ValueError("a clock does not go back")
        self.now += seconds
        return self.now
