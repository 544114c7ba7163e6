"""KV block tiers of a simulated engine: L1 (CPU memory, per replica) and L2 (shared store, per fleet).

The engine tier itself lives in `replica.py` because it shares its capacity with running sequences. Blocks
the engine evicts go to L1; blocks L1 evicts go to L2 (when configured); each tier is an LRU of block keys
with its own capacity. Eviction callbacks publish KV events only when somebody listens (informed routers),
so the blind hot path does no event work.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Sequence

Listener = Callable[[str, list, str], None]  # (kind "stored"|"removed", keys, tier)


class BlockLRU:
    """An LRU set of block keys with a capacity; overflow goes to `spill` (the next tier) when given."""

    __slots__ = ("name", "capacity", "blocks", "spill", "listener")

    def __init__(self, name: str, capacity: int, spill: BlockLRU | None = None, listener: Listener | None = None):
        self.name = name
        self.capacity = capacity
        self.blocks: OrderedDict = OrderedDict()
        self.spill = spill
        self.listener = listener

    def __len__(self) -> int:
        return len(self.blocks)

    def put(self, keys: Sequence) -> None:
        if self.capacity <= 0:
            if self.spill is not None:
                self.spill.put(keys)
            return
        blocks = self.blocks
        stored = []
        for key in keys:
            if key in blocks:
                blocks.move_to_end(key)
            else:
                blocks[key] = None
                stored.append(key)
        if self.listener is not None and stored:
            self.listener("stored", stored, self.name)
        if len(blocks) > self.capacity:
            evicted = [blocks.popitem(last=False)[0] for _ in range(len(blocks) - self.capacity)]
            if self.listener is not None:
                self.listener("removed", evicted, self.name)
            if self.spill is not None:
                self.spill.put(evicted)


def engine_match(cache: OrderedDict, keys: Sequence) -> int:
    """Leading blocks of `keys` in the engine cache, touched as recently used."""
    n = 0
    for key in keys:
        if key not in cache:
            break
        cache.move_to_end(key)
        n += 1
    return n
