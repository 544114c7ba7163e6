"""Which leading part of a prompt the recent traffic shares widely: a prefix that must live on every replica.

A prefix that a large share of the requests carries (a chat service's system prompt, a common instruction
block) cannot stay on the replica that computed it first without holding all the work there: the cache-aware
cost would keep choosing the holder, and a replica that never received it would never be chosen, however
idle (one replica of four got no request at all on a generated chat trace). Such a prefix is worth copying,
so the policies credit it to every replica: requests that share it spread by load and by what they do not
share (the conversation, the document), and a replica without it computes it once.

`hot_depth(keys, replicas)` is the number of leading keys that at least `hot_share` of one replica's fair
share of the traffic (1 / replicas) carries, over the last `window` requests. Chained keys make the count
non-increasing along a prompt, so the scan stops at the first key below the bar. Until `sample` requests
were seen the bar is that of `sample` requests: two requests with one prefix are no pattern yet.
"""

from __future__ import annotations

import math
from collections import deque


class PrefixPopularity:
    __slots__ = ("window", "hot_share", "sample", "_recent", "_counts")

    def __init__(self, window: int = 256, hot_share: float = 0.5, sample: int = 32):
        self.window = window
        self.sample = sample  # the bar is computed as if at least this many requests were seen: a pattern
        self.hot_share = hot_share
        self._recent: deque[tuple] = deque()
        self._counts: dict = {}

    def carried(self, key) -> int:
        """How many of the recent requests carried `key`."""
        return self._counts.get(key, 0)

    def hot_depth(self, keys: tuple, replicas: int) -> int:
        n = len(self._recent)
        if not n or not keys:
            return 0
        need = math.ceil(self.hot_share * max(n, self.sample) / max(replicas, 1))
        counts = self._counts
        depth = 0
        for key in keys:
            if counts.get(key, 0) < need:
                break
            depth += 1
        return depth

    def add(self, keys: tuple) -> None:
        """One request carried `keys` (its chained prefix keys); the oldest request leaves the window."""
        recent, counts = self._recent, self._counts
        recent.append(keys)
        for key in keys:
            counts[key] = counts.get(key, 0) + 1
        if len(recent) > self.window:
            for key in recent.popleft():
                left = counts[key] - 1
                if left:
                    counts[key] = left
                else:
                    del counts[key]
