"""The one prefix match over chained block keys, and the bounded LRU of keys it runs on.

A block key hashes its parent's key, so a prompt's cached prefix is its leading run of keys a cache holds:
the first miss ends it. The engine, the simulator, both router indexes and the benchmarks' oracle all ask
this question; they share this code so they cannot drift apart.

For the same reason a chain is evicted from its tail: whatever touches a prompt's keys leaves its first block
the most recently used (`touch_chain`), as vLLM frees a request's blocks last-first and SGLang evicts radix
leaves. Until 2026-12-05 every tier touched them first-to-last, so the first block went first and took the
usefulness of every block after it with it while they still filled the cache.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Container, Sequence


def match_prefix(held: Container, keys: Sequence, touch: bool = False) -> int:
    """How many leading `keys` `held` holds (anything with `in`: a dict, or a view that also checks an
    entry's age or expiry). `touch` marks the matched keys most recently used, the first one last
    (`touch_chain`; `held` an OrderedDict)."""
    n = 0
    for key in keys:
        if key not in held:
            break
        n += 1
    if touch and n:
        touch_chain(held, keys[:n])
    return n


def touch_chain(held: OrderedDict, keys: Sequence) -> None:
    """Mark a chain's `keys` most recently used with its head newest (those not held are skipped): an LRU then
    evicts the chain from its tail, and what stays is still a usable prefix."""
    move = held.move_to_end
    for key in reversed(keys):
        if key in held:
            move(key)


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

    def match(self, keys: Sequence, touch: bool = False) -> int:
        return match_prefix(self.entries, keys, touch)

    def put(self, keys: Sequence, value=None, head: Sequence = ()) -> list:
        """Insert `keys` (a chain, or part of one) with `value`, or refresh them (keeping their value), last
        first, then touch the `head` keys held (the chain's blocks before `keys`), so the chain's first block
        ends most recent (`touch_chain`); returns the keys that were new, in chain order. Trimming is the
        caller's (`trim`)."""
        entries = self.entries
        new = []
        for key in reversed(keys):
            if key in entries:
                entries.move_to_end(key)
            else:
                entries[key] = value
                new.append(key)
        if head:
            touch_chain(entries, head)
        new.reverse()
        return new

    def trim(self, capacity: int | None = None) -> list:
        """Evict the least recently used keys beyond `capacity` (default: its own); returns them."""
        entries = self.entries
        over = len(entries) - (self.capacity if capacity is None else capacity)
        return [entries.popitem(last=False)[0] for _ in range(over)] if over > 0 else []
