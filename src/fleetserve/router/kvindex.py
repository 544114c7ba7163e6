"""Which replica holds which KV blocks, fed by the engines' KV events (precise routing).

Per replica: block key -> tier ("engine", "l1", "l2"); a speculative entry (the router just sent the prefix
there) holds until its TTL ends or an event confirms it, bridging the event lag. Memory is bounded per
replica (oldest entries go first) and a replica's set can be replaced wholesale after a resync.
"""

from __future__ import annotations

from collections import OrderedDict

TIER_CREDIT = {"engine": 1.0, "l1": 0.8, "l2": 0.5, "speculative": 1.0}


class KVIndex:
    def __init__(self, max_blocks_per_replica: int = 200_000, speculative_ttl: float = 2.0):
        self.max_blocks = max_blocks_per_replica
        self.speculative_ttl = speculative_ttl
        self._blocks: dict[str, OrderedDict[int, str]] = {}
        self._speculative: dict[str, OrderedDict[int, float]] = {}

    def _set(self, replica: str) -> OrderedDict[int, str]:
        return self._blocks.setdefault(replica, OrderedDict())

    def stored(self, replica: str, keys: list[int], tier: str = "engine") -> None:
        blocks = self._set(replica)
        spec = self._speculative.get(replica)
        for key in keys:
            blocks[key] = tier
            blocks.move_to_end(key)
            if spec is not None:
                spec.pop(key, None)
        while len(blocks) > self.max_blocks:
            blocks.popitem(last=False)

    def removed(self, replica: str, keys: list[int], tier: str | None = None) -> None:
        blocks = self._blocks.get(replica)
        if not blocks:
            return
        for key in keys:
            if tier is None or blocks.get(key) == tier:
                blocks.pop(key, None)

    def replace(self, replica: str, entries: dict[int, str]) -> None:
        """Resynchronise after a reconnect: the replica's full block set."""
        self._blocks[replica] = OrderedDict(entries)
        self._speculative.pop(replica, None)

    def forget(self, replica: str) -> None:
        self._blocks.pop(replica, None)
        self._speculative.pop(replica, None)

    def speculate(self, replica: str, keys: tuple[int, ...], now: float) -> None:
        spec = self._speculative.setdefault(replica, OrderedDict())
        for key in keys:
            spec[key] = now + self.speculative_ttl
            spec.move_to_end(key)
        while len(spec) > self.max_blocks:
            spec.popitem(last=False)

    def credit(self, replica: str, keys: tuple[int, ...], now: float) -> float:
        """Cached blocks of the prefix on `replica`, each weighted by its tier; stops at the first miss."""
        blocks = self._blocks.get(replica, {})
        spec = self._speculative.get(replica, {})
        total = 0.0
        for key in keys:
            tier = blocks.get(key)
            if tier is None:
                expiry = spec.get(key)
                if expiry is None or expiry < now:
                    break
                tier = "speculative"
            total += TIER_CREDIT.get(tier, 0.5)
        return total

    def size(self, replica: str | None = None) -> int:
        if replica is not None:
            return len(self._blocks.get(replica, {}))
        return sum(len(b) for b in self._blocks.values())
