"""The one prefix match over chained block keys, and the bounded LRU of keys it runs on.

A block key hashes its parent's key, so a prompt's cached prefix is its leading run of keys a cache holds:
the first miss ends it. The engine, the simulator, both router indexes and the benchmarks' oracle all ask
this question; they share this code so they cannot drift apart.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Container, Iterable


def match_prefix(held: Container, keys: Iterable, touch: bool = False) -> int:
    """How many leading `keys` `held` holds (anything with `in`: a dict, or a view that also checks an
    entry's age or expiry). `touch` marks the matched keys most recently used (`held` an OrderedDict)."""
    n = 0
    if touch:
        move = held.move_to_end
        for key in keys:
            if key not in held:
                break
            move(key)
            n += 1
        return n
    for key in keys:
        if key not in held:
            break
        n += 1
    return n


class KeyLRU:
    """Chained keys, least recently used first out beyond `capacity`; `entries` maps key -> value."""

    __slots__ = ("capacity", "entries")

    def __init__(self, capacity: int):
        self.capacity = capacity
        self.entries: OrderedDict = OrderedDict()

    def __len__(self) -> int:
        return len(self.entries)

    def __contains__(self, key) -> bool:
        return key in self.entries

    def match(self, keys: Iterable, touch: bool = False) -> int:
        return match_prefix(self.entries, keys, touch)

    def put(self, keys: Iterable, value=None) -> list:
        """Insert `keys` with `value`, or refresh them (keeping their value), in order, so a prompt's last
        block ends most recent; returns the keys that were new. Trimming is the caller's (`trim`)."""
        entries = self.entries
        new = []
        for key in keys:
            if key in entries:
                entries.move_to_end(key)
            else:
                entries[key] = value
                new.append(key)
        return new

    def trim(self, capacity: int | None = None) -> list:
        """Evict the least recently used keys beyond `capacity` (default: its own); returns them."""
        entries = self.entries
        over = len(entries) - (self.capacity if capacity is None else capacity)
        return [entries.popitem(last=False)[0] for _ in range(over)] if over > 0 else []
