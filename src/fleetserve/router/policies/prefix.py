"""Cache-aware policies: `prefixaware` (router-side index) and `kvaware` (engine KV events).

Both score every eligible replica with the same TTFT estimate (`cost.py`) using the tokens it would have to
prefill given the blocks it already holds; they differ only in where that knowledge comes from.

- prefixaware keeps, per replica, an LRU set of the prefix keys it sent there, sized to the replica's
  cache capacity (so the index forgets roughly when the engine would), hard-capped in memory;
- kvaware reads the KV index the engines' events feed (per tier: engine blocks count fully, L1/L2 hits
  partially) and speculatively inserts what it just routed, with a short TTL, to bridge event lag.
"""

from __future__ import annotations

import random
from collections import OrderedDict

from fleetserve.router.policies.base import Choice, FleetSnapshot, RouteRequest, register
from fleetserve.router.policies.cost import CostWeights, cheapest

DEFAULT_CACHE_BLOCKS = 4096
MAX_INDEX_BLOCKS = 1_000_000  # hard cap over all replicas, whatever they report


def _matched(index: OrderedDict, keys: tuple[int, ...]) -> int:
    n = 0
    for key in keys:
        if key not in index:
            break
        n += 1
    return n


def _branch(uncached: int, best_possible: int, prompt_tokens: int) -> str:
    if uncached > best_possible:
        return "load_over_hit"  # another replica holds more of the prefix, but is too busy
    return "miss" if uncached >= prompt_tokens else "hit"


@register("prefixaware")
class PrefixAware:
    def __init__(self, seed: int = 0, decode_weight: float = 64.0, affinity: float = 6.0, **_options):
        self.weights = CostWeights(decode_weight=decode_weight, affinity=affinity)
        self.rng = random.Random(seed)
        self.index: dict[str, OrderedDict[int, None]] = {}

    def index_size(self) -> int:
        return sum(len(s) for s in self.index.values())

    def choose(self, request: RouteRequest, snapshot: FleetSnapshot) -> Choice | None:
        eligible = snapshot.eligible(request.excluded)
        if not eligible:
            return None
        live = {r.id for r in snapshot.replicas}
        for gone in [rid for rid in self.index if rid not in live]:
            del self.index[gone]
        candidates = []
        for r in eligible:
            hit = _matched(self.index.get(r.id, OrderedDict()), request.blocks)
            candidates.append((r, max(0, request.prompt_tokens - hit * request.block_tokens)))
        replica, uncached = cheapest(candidates, self.weights, self.rng, request.prompt_tokens)
        best_possible = min(u for _, u in candidates)
        branch = _branch(uncached, best_possible, request.prompt_tokens)
        capacity = replica.cache_blocks or DEFAULT_CACHE_BLOCKS
        if not request.exact_keys:
            capacity *= 2  # text chunks hold fewer tokens than engine blocks: forgetting too early loses hits
        self._remember(replica.id, request.blocks, capacity, len(live))
        return Choice(replica, branch, uncached)

    def _remember(self, replica: str, keys: tuple[int, ...], capacity: int, replicas: int) -> None:
        entries = self.index.setdefault(replica, OrderedDict())
        for key in keys:
            entries[key] = None
            entries.move_to_end(key)
        cap = min(capacity, MAX_INDEX_BLOCKS // max(replicas, 1))
        while len(entries) > cap:
            entries.popitem(last=False)


@register("kvaware")
class KVAware:
    def __init__(self, seed: int = 0, decode_weight: float = 64.0, affinity: float = 6.0, **_options):
        self.weights = CostWeights(decode_weight=decode_weight, affinity=affinity)
        self.rng = random.Random(seed)
        self.fallback = PrefixAware(seed=seed, decode_weight=decode_weight, affinity=affinity)

    def choose(self, request: RouteRequest, snapshot: FleetSnapshot) -> Choice | None:
        index = snapshot.kv_index
        if index is None or not request.exact_keys:  # no events, or text the router cannot key like the
            # engines (no tokenizer here): the router-side index stands in
            choice = self.fallback.choose(request, snapshot)
            return Choice(choice.replica, "no_events_" + choice.branch, choice.prefill_tokens) if choice else None
        eligible = snapshot.eligible(request.excluded)
        if not eligible:
            return None
        candidates = []
        for r in eligible:
            credit = index.credit(r.id, request.blocks, snapshot.now)
            candidates.append((r, max(0, int(request.prompt_tokens - credit * request.block_tokens))))
        replica, uncached = cheapest(candidates, self.weights, self.rng, request.prompt_tokens)
        best_possible = min(u for _, u in candidates)
        branch = _branch(uncached, best_possible, request.prompt_tokens)
        index.speculate(replica.id, request.blocks, snapshot.now)
        return Choice(replica, branch, uncached)
