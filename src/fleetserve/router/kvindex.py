"""Which replica holds which KV blocks, fed by the engines' KV events (precise routing).

Per replica: block key -> the set of tiers holding it ("engine", "l1", "l2"), as a bit mask: an engine writes
a block to L2 while it still holds it, and its credit must stay the engine's until the engine evicts it.
`removed(tier)` drops only that tier; a block's credit is its fastest tier's. A speculative entry (the router
just sent the prefix there) holds until its TTL ends or an event confirms it, bridging the event lag. Memory
is bounded per replica (oldest entries go first) and a replica's set can be replaced after a resync.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable

from fleetserve.kvcache.prefix_match import match_prefix

TIER_CREDIT = {"engine": 1.0, "l1": 0.8, "l2": 0.5, "speculative": 1.0}
_BIT = {"engine": 1, "l1": 2, "l2": 4}
_OTHER = 8  # any tier this router does not know (credit 0.5); they share one bit
_CREDIT_BITS = ((1, TIER_CREDIT["engine"]), (2, TIER_CREDIT["l1"]), (4, TIER_CREDIT["l2"]), (_OTHER, 0.5))
BEST_CREDIT = tuple(max((c for bit, c in _CREDIT_BITS if mask & bit), default=0.0) for mask in range(16))


def tier_bit(tier: str) -> int:
    return _BIT.get(tier, _OTHER)


def tier_mask(tiers: str | Iterable[str]) -> int:
    if isinstance(tiers, str):
        return tier_bit(tiers)
    mask = 0
    for tier in tiers:
        mask |= tier_bit(tier)
    return mask


class _Held:
    """A replica's blocks as the router counts them: reported by events, or speculative and not expired."""

    __slots__ = ("blocks", "spec", "now")

    def __init__(self, blocks, spec, now: float):
        self.blocks, self.spec, self.now = blocks, spec, now

    def __contains__(self, key) -> bool:
        if key in self.blocks:
            return True
        expiry = self.spec.get(key)
        return expiry is not None and expiry >= self.now


class KVIndex:
    def __init__(self, max_blocks_per_replica: int = 200_000, speculative_ttl: float = 2.0):
        self.max_blocks = max_blocks_per_replica
        self.speculative_ttl = speculative_ttl
        self._blocks: dict[str, OrderedDict[int, int]] = {}  # key -> mask of tiers holding it
        self._speculative: dict[str, OrderedDict[int, float]] = {}

    def _set(self, replica: str) -> OrderedDict[int, int]:
        return self._blocks.setdefault(replica, OrderedDict())

    def stored(self, replica: str, keys: list[int], tier: str = "engine") -> None:
        blocks = self._set(replica)
        spec = self._speculative.get(replica)
        bit = tier_bit(tier)
        for key in reversed(keys):  # a chain's head newest, as the engines evict (`touch_chain`)
            blocks[key] = blocks.get(key, 0) | bit
            blocks.move_to_end(key)
            if spec is not None:
                spec.pop(key, None)
        while len(blocks) > self.max_blocks:
            blocks.popitem(last=False)

    def removed(self, replica: str, keys: list[int], tier: str | None = None) -> None:
        """`tier` no longer holds `keys` (None: no tier does); the other tiers' copies still count."""
        blocks = self._blocks.get(replica)
        if not blocks:
            return
        if tier is None:
            for key in keys:
                blocks.pop(key, None)
            return
        bit = tier_bit(tier)
        for key in keys:
            mask = blocks.get(key)
            if mask is not None and mask & bit:
                if mask == bit:
                    del blocks[key]
                else:
                    blocks[key] = mask & ~bit

    def tiers(self, replica: str, key: int) -> set[str]:
        """The tiers holding `key` on `replica` (tests, the admin view)."""
        mask = self._blocks.get(replica, {}).get(key, 0)
        return {tier for tier, bit in _BIT.items() if mask & bit} | ({"other"} if mask & _OTHER else set())

    def replace(self, replica: str, entries: dict[int, str | Iterable[str]]) -> None:
        """Resynchronise after a reconnect: the replica's full block set (key -> tier, or its tiers)."""
        self._blocks[replica] = OrderedDict((key, tier_mask(tiers)) for key, tiers in entries.items())
        self._speculative.pop(replica, None)

    def forget(self, replica: str) -> None:
        self._blocks.pop(replica, None)
        self._speculative.pop(replica, None)

    def speculate(self, replica: str, keys: tuple[int, ...], now: float) -> None:
        spec = self._speculative.setdefault(replica, OrderedDict())
        for key in reversed(keys):  # the head newest: trimmed last
            spec[key] = now + self.speculative_ttl
            spec.move_to_end(key)
        while len(spec) > self.max_blocks:
            spec.popitem(last=False)

    def credit(self, replica: str, keys: tuple[int, ...], now: float) -> float:
        """Cached blocks of the prefix on `replica`, each weighted by its tier; stops at the first miss."""
        blocks = self._blocks.get(replica, {})
        n = match_prefix(_Held(blocks, self._speculative.get(replica, {}), now), keys)
        total = 0.0
        for key in keys[:n]:
            mask = blocks.get(key)
            total += TIER_CREDIT["speculative"] if mask is None else BEST_CREDIT[mask]
        return total

    def size(self, replica: str | None = None) -> int:
        if replica is not None:
            return len(self._blocks.get(replica, {}))
        return sum(len(b) for b in self._blocks.values())
