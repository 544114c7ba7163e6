"""KV block tiers of a simulated engine: L1 (CPU memory, per replica) and L2 (shared store, per fleet).

The engine tier itself lives in `replica.py` because it shares its capacity with running sequences. New
blocks are written through to L1 and to L2 (when configured), as the live engine's background writer does;
each tier is an LRU of block keys with its own capacity, and what a tier evicts is gone from it. Eviction
callbacks publish KV events only when somebody listens (informed routers), so the blind hot path does no event
work.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Sequence

from fleetserve.kvcache.prefix_match import KeyLRU

Listener = Callable[[str, list, str], None]  # (kind "stored"|"removed", keys, tier)


class BlockLRU(KeyLRU):
    """An LRU set of block keys with a capacity; overflow goes to `spill` (the next tier) when given."""

    __slots__ = ("name", "spill", "listener")

    def __init__(self, name: str, capacity: int, spill: BlockLRU | None = None, listener: Listener | None = None):
        super().__init__(capacity)
        self.name = name
        self.spill = spill
        self.listener = listener

    @property
    def blocks(self) -> OrderedDict:
        return self.entries

    def put(self, keys: Sequence, head: Sequence = ()) -> None:
        """New blocks of a chain, its `head` (the blocks before them) touched after them where held, as the
        engine's writer does (`kvcache.tiers`)."""
        if self.capacity <= 0:
            if self.spill is not None:
                self.spill.put(keys, head)
            return
        stored = KeyLRU.put(self, keys, head=head)
        if self.listener is not None and stored:
            self.listener("stored", stored, self.name)
        if len(self.entries) > self.capacity:
            evicted = self.trim()
            if self.listener is not None:
                self.listener("removed", evicted, self.name)
            if self.spill is not None:
                self.spill.put(evicted[::-1])  # evicted tail first: put takes a chain in order
