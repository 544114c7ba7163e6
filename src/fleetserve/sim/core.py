"""The discrete-event core: an event heap, a virtual clock and a seeded RNG (SimPy's core, without generators).

Events are `(time, sequence, callback, argument)`; the per-instance sequence number breaks ties in the order
events were scheduled, so two runs with the same seed take the same path. Nothing here reads the wall clock,
starts a thread or touches asyncio: time only moves when the next event is popped.
"""

from __future__ import annotations

import heapq
import itertools
import random
from collections.abc import Callable
from typing import Any


class Simulation:
    def __init__(self, seed: int = 0, start: float = 0.0):
        self.now = start
        self.rng = random.Random(seed)
        self._heap: list[tuple[float, int, Callable[[Any], None], Any]] = []
        self._seq = itertools.count()
        self.events = 0

    def at(self, when: float, callback: Callable[[Any], None], arg: Any = None) -> None:
        """Run `callback(arg)` at virtual time `when` (never earlier than now)."""
        heapq.heappush(self._heap, (max(when, self.now), next(self._seq), callback, arg))

    def after(self, delay: float, callback: Callable[[Any], None], arg: Any = None) -> None:
        heapq.heappush(self._heap, (self.now + max(0.0, delay), next(self._seq), callback, arg))

    def run(self, until: float | None = None, stop: Callable[[], bool] | None = None) -> None:
        """Pop events in time order until the heap is empty, `until` is reached, or `stop()` says so."""
        heap, pop = self._heap, heapq.heappop
        limit = float("inf") if until is None else until
        count = 0
        while heap:
            if heap[0][0] > limit:
                self.now = limit
                break
            when, _, callback, arg = pop(heap)
            self.now = when
            callback(arg)
            count += 1
            if stop is not None and not count & 1023 and stop():
                break
        self.events += count

    @property
    def pending(self) -> int:
        return len(self._heap)
