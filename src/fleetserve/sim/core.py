"""The discrete-event core: an event heap, a virtual clock and a seeded RNG (SimPy's core, without generators).

Events are `(time, sequence, callback, argument)`; the per-instance sequence number breaks ties in the order
events were scheduled, so two runs with the same seed take the same path. Nothing here reads the wall clock,
starts a thread or touches asyncio: time only moves when the next event is popped.
"""

from __future__ import annotations

import heapq
import itertools
import random
from collections.abc import Callable, Sequence
from typing import Any


class Simulation:
    def __init__(self, seed: int = 0, start: float = 0.0):
        self.now = start
        self.rng = random.Random(seed)
        self._heap: list[tuple[float, int, Callable[[Any], None], Any]] = []
        self._seq = itertools.count()
        self.events = 0
        self._stream: tuple[Sequence[float], Callable[[int], None]] | None = None
        self._next = 0

    def at(self, when: float, callback: Callable[[Any], None], arg: Any = None) -> None:
        """Run `callback(arg)` at virtual time `when` (never earlier than now)."""
        heapq.heappush(self._heap, (max(when, self.now), next(self._seq), callback, arg))

    def after(self, delay: float, callback: Callable[[Any], None], arg: Any = None) -> None:
        heapq.heappush(self._heap, (self.now + max(0.0, delay), next(self._seq), callback, arg))

    def stream(self, times: Sequence[float], callback: Callable[[int], None]) -> None:
        """A sorted stream of arrivals: `callback(i)` at `times[i]`, without a heap entry per arrival. At equal
        times an arrival runs before heap events scheduled for that instant."""
        self._stream = (times, callback)

    def run(self, until: float | None = None, stop: Callable[[], bool] | None = None) -> None:
        """Pop events in time order until none is left, `until` is reached, or `stop()` says so."""
        heap, pop = self._heap, heapq.heappop
        limit = float("inf") if until is None else until
        times, on_arrival = self._stream or ((), None)
        n, i = len(times), self._next
        inf = float("inf")
        next_arrival = times[i] if i < n else inf
        count = 0
        while heap or next_arrival < inf:
            if next_arrival <= (heap[0][0] if heap else inf):
                if next_arrival > limit:
                    self.now = limit
                    break
                self.now = next_arrival
                self._next = i + 1
                on_arrival(i)
                i += 1
                next_arrival = times[i] if i < n else inf
            else:
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
