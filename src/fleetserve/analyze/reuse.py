"""How much of a trace's prompt KV an ideal cache, and an LRU cache of a given size, could reuse.

- ideal (unbounded cache): the fraction of all blocks whose id was already seen in an earlier request,
  requests in arrival order (also counted on leading prefixes only, as an engine's prefix cache matches, and
  weighted by tokens);
- LRU curve: one pass computes every access's LRU stack distance (distinct blocks touched since that block's
  previous access, via a Fenwick tree over access times: O(n log n)); an LRU cache of C blocks hits exactly
  the accesses with distance < C, so the hit rate at *any* size is a count over the sorted distances.
  A request is looked up before it touches its own blocks, and touches them last first, as the engines order a
  chain for eviction (`kvcache.prefix_match.touch_chain`): a block's parent is touched right after it, so its
  distance is never larger, LRU keeps prefixes whole and the per-block hit rate is the prefix-cache hit rate.
  Until 2026-12-05 each block was looked up as it was touched, in prompt order: a prompt's own first blocks
  counted against its later ones (a 10-block document missed whole in a cache of 8 that held it all), and a
  parent could miss where its child hit.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from fleetserve.kvcache.blocks import reusable_blocks

COLD = 1 << 62  # distance of a first access: misses at every size


@dataclass(frozen=True)
class Ideal:
    hit_rate: float  # blocks already seen / all blocks
    prefix_hit_rate: float  # leading-prefix blocks already seen / all blocks
    token_hit_rate: float  # leading-prefix tokens already seen / prompt tokens
    requests_with_hit: float  # fraction of requests with at least one block seen before
    blocks: int
    unique_blocks: int


def ideal_reuse(keys: list[tuple[int, ...]], prompt_tokens: list[int], block_tokens: int) -> Ideal:
    seen: dict[int, int] = {}  # block id -> the most tokens it was computed with
    hits = prefix = tokens_hit = with_hit = total = 0
    for ks, sizes in zip(keys, _block_sizes(keys, prompt_tokens, block_tokens), strict=True):
        h = sum(k in seen for k in ks)
        p = 0
        for k, size in zip(ks, sizes, strict=True):
            if k not in seen:
                break
            p += 1
            tokens_hit += min(size, seen[k])  # a block computed partial holds no more than it was computed with
        hits += h
        prefix += p
        with_hit += h > 0
        total += len(ks)
        for k, size in zip(ks, sizes, strict=True):
            seen[k] = max(seen.get(k, 0), size)
    all_tokens = sum(prompt_tokens) or 1
    return Ideal(hits / max(total, 1), prefix / max(total, 1), tokens_hit / all_tokens,
                 with_hit / max(len(keys), 1), total, len(seen))


def stack_distances(keys: list[tuple[int, ...]], stored: list[int] | None = None) -> list[int]:
    """LRU stack distance of every block of every request, in prompt order (COLD for blocks never stored
    before): the distinct blocks touched since the block's last touch, taken when the request is looked up,
    before it touches its own blocks (last first) as an engine does. `stored`: per request, how many of its
    leading blocks the cache stores (an engine, whole blocks only: a prompt's partial last block takes no room);
    default all."""
    n = sum(len(ks) for ks in keys)
    tree = [0] * (n + 1)  # Fenwick tree over access times 1..n: 1 where a block was last touched
    last: dict[int, int] = {}
    out: list[int] = []
    marked = 0  # marks in the tree (= distinct blocks so far)
    t = 0

    def add(i: int, delta: int) -> None:
        while i <= n:
            tree[i] += delta
            i += i & -i

    def before(i: int) -> int:  # marks at times <= i
        s = 0
        while i > 0:
            s += tree[i]
            i -= i & -i
        return s

    for i, ks in enumerate(keys):
        for k in ks:  # the lookup: marks after the block's last touch
            p = last.get(k)
            out.append(COLD if p is None else marked - before(p))
        for k in reversed(ks if stored is None else ks[:stored[i]]):  # then the touches, the head last
            t += 1
            p = last.get(k)
            if p is not None:
                add(p, -1)
                marked -= 1
            add(t, 1)
            marked += 1
            last[k] = t
    return out


def _block_sizes(keys: list[tuple[int, ...]], prompt_tokens: list[int], block_tokens: int):
    """Tokens of each request's blocks: whole blocks, and what is left of the prompt in its last (one request's
    list at a time)."""
    return ([max(0, min(block_tokens, n - j * block_tokens)) for j in range(len(ks))]
            for ks, n in zip(keys, prompt_tokens, strict=True))


def block_tokens_of(keys: list[tuple[int, ...]], prompt_tokens: list[int], block_tokens: int) -> list[int]:
    """Tokens a hit on every block access would save, in access order: the block's tokens in this prompt, but no
    more than the id was computed with before (a trace that reuses a partial last block's id as a fuller block
    credited tokens never computed: 0.625 where 0.375 was possible)."""
    stored: dict[int, int] = {}
    out = []
    for ks, sizes, n in zip(keys, _block_sizes(keys, prompt_tokens, block_tokens), prompt_tokens, strict=True):
        reusable = reusable_blocks(n, block_tokens)  # an engine computes the last token: its block is no hit
        for j, (k, size) in enumerate(zip(ks, sizes, strict=True)):
            out.append(min(size, stored.get(k, size)) if j < reusable else 0)
            stored[k] = max(stored.get(k, 0), size)
    return out


class HitCurve:
    """LRU hit rate at any cache size, from the sorted stack distances: the share of block accesses that hit, or
    with `weights` (tokens per access, `block_tokens_of`) the share of `total` prompt tokens (all of them, also
    the tail no block key covers), as the simulator counts a strategy's hit rate."""

    def __init__(self, distances: list[int], weights: list[int] | None = None, total: int | None = None):
        d = np.asarray(distances, dtype=np.int64)
        w = np.ones(len(d), dtype=np.int64) if weights is None else np.asarray(weights, dtype=np.int64)
        order = np.argsort(d, kind="stable")
        self.sorted = d[order]
        self._cumulative = np.concatenate(([0], np.cumsum(w[order])))  # hits below each size, by weight
        self.total = int(total if total is not None else self._cumulative[-1])

    def hit_rate(self, cache_blocks: int) -> float:
        if not self.total:
            return 0.0
        size = min(cache_blocks, COLD)  # a first access misses at every size (2**62 blocks had read as hits)
        return float(self._cumulative[int(np.searchsorted(self.sorted, size, side="left"))]) / self.total

    def points(self, unique_blocks: int, smallest: int = 16) -> list[dict]:
        """Powers of two from `smallest` up to the unique block count (where the curve reaches the ideal); none
        for a trace with no whole block (it printed one point, `1: 0.0%`, where there is no curve)."""
        if unique_blocks <= 0:
            return []
        sizes = []
        c = smallest
        while c < unique_blocks:
            sizes.append(c)
            c *= 2
        sizes.append(max(unique_blocks, 1))
        return [{"cache_blocks": s, "hit_rate": round(self.hit_rate(s), 4)} for s in sizes]
