"""KV events: which block keys an engine holds per tier, as a bounded, resumable log.

Transport (documented in docs/architecture.md): `GET /kv/blocks` gives a snapshot with the current sequence
number; `GET /kv/events?since=N&wait=S` long-polls the events after N. When N is older than the bounded
log reaches back, the answer is `{"resync": true}` and the subscriber fetches the snapshot again.
Thread-safe: the real engine appends from its generation thread.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections import deque

MAX_EVENTS = 20_000


class KVEventLog:
    def __init__(self, max_events: int = MAX_EVENTS):
        self._log: deque[tuple[int, dict]] = deque(maxlen=max_events)
        self._lock = threading.Lock()
        self.seq = 0

    def publish(self, kind: str, keys: list[int], tier: str) -> None:
        if not keys:
            return
        with self._lock:
            self.seq += 1
            self._log.append((self.seq, {"type": kind, "keys": list(keys), "tier": tier}))

    def resync(self) -> None:
        """What was published cannot be trusted any more (an L2 Redis restarted empty): every subscriber is told to
        fetch the snapshot again, which lists what this engine holds now (L2 left out: learnt again from later
        events)."""
        with self._lock:
            self.seq += 1
            self._log.clear()

    def since(self, seq: int) -> dict:
        with self._lock:
            oldest = self._log[0][0] if self._log else self.seq + 1
            if seq + 1 < oldest and seq < self.seq:
                return {"resync": True, "seq": self.seq}
            return {"seq": self.seq, "events": [e for s, e in self._log if s > seq]}

    async def wait_since(self, seq: int, wait: float) -> dict:
        deadline = time.monotonic() + wait
        while self.seq <= seq and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        return self.since(seq)
