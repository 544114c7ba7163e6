"""Crash back-off, one rule for everything the fleet supervises (replicas, the router, Redis).

The delay doubles with each crash in the last `window` seconds: 1, 2, 4, ... capped at `cap`, so a process
that crashes at start-up does not spin, and one that crashed once long ago comes back at once.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Backoff:
    cap: float = 30.0
    window: float = 300.0
    crashes: list[float] = field(default_factory=list)
    restart_at: float | None = None  # monotonic time of the pending restart, if any

    def crashed(self, mono: float) -> float:
        """Record a crash now; returns the delay before the restart (and schedules it)."""
        self.crashes = [t for t in self.crashes if mono - t < self.window] + [mono]
        delay = min(self.cap, 2.0 ** (len(self.crashes) - 1))
        self.restart_at = mono + delay
        return delay

    def due(self, mono: float) -> bool:
        """True once, when the scheduled restart time has come."""
        if self.restart_at is not None and mono >= self.restart_at:
            self.restart_at = None
            return True
        return False
