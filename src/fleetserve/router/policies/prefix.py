"""Cache-aware policies: `prefixaware` (router-side index) and `kvaware` (engine KV events).

Both score every eligible replica with the same TTFT estimate (`cost.py`) using the tokens it would have to
prefill given the blocks it already holds; they differ only in where that knowledge comes from. Both credit a
prefix that much of the recent traffic carries to every replica before scoring (`popularity.py`: it must be
copied, or the replica that computed it first keeps all the work); the Choice still books what the chosen
replica really has to compute.

- prefixaware keeps, per replica, an LRU of the prefix keys it sent there. When the replica states its cache
  capacity (`cache_blocks`), the index holds that many keys (so it forgets roughly when the engine would).
  When it does not (engines that publish nothing: the blind router), the index predicts with keys younger
  than a horizon learned from what the engines report back (`router.feedback`: cached tokens per response
  against the prediction), keeps `SHADOW` x that horizon of history (at least `MIN_HISTORY`) so a larger cache
  can be discovered,
  and is hard-capped in memory;
- kvaware reads the KV index the engines' events feed (per tier: engine blocks count fully, L1/L2 hits
  partially) and speculatively inserts what it just routed, with a short TTL, to bridge event lag.

An entry's age is the number of new keys sent to its replica since the entry was last sent there.
"""

from __future__ import annotations

import random
from collections import OrderedDict

from fleetserve.kvcache.prefix_match import match_prefix
from fleetserve.router.feedback import CapacityLearner, Prediction
from fleetserve.router.policies.base import Choice, FleetSnapshot, Needs, RouteRequest, register
from fleetserve.router.policies.cost import CostWeights, cheapest
from fleetserve.router.policies.popularity import PrefixPopularity

DEFAULT_CACHE_BLOCKS = 4096
# history kept however low the learned horizon went: the evidence that raises a horizon a passing miss cut deep
# (router.feedback) lies past 2 x H, where the index had forgotten it
MIN_HISTORY = DEFAULT_CACHE_BLOCKS
MAX_INDEX_BLOCKS = 1_000_000  # hard cap over all replicas, whatever they report
SHADOW = 2  # unknown capacity: history kept beyond the learned horizon, to see hits past it
HOT_ROOM = 0.5  # hot prefixes are credited everywhere only while together they fit in this share of a cache


def _branch(uncached: int, best_possible: int, prompt_tokens: int, credited: tuple[int, int]) -> str:
    """`credited`: what the chosen replica computes with hot prefixes credited to every replica, and the fewest
    any would: equal, the replica was as good as any once a hot prefix counts as everywhere."""
    if uncached > best_possible:
        if credited[0] < uncached and credited[0] <= credited[1]:
            return "hot_copy"  # a hot prefix credited everywhere (popularity.py) is copied here, on purpose
        return "load_over_hit"  # another replica holds more of the prefix, but is too busy
    return "miss" if uncached >= prompt_tokens else "hit"


class _Younger:
    """The entries sent after tick `oldest`: what the index predicts the replica still holds."""

    __slots__ = ("entries", "oldest")

    def __init__(self, entries: OrderedDict, oldest: float):
        self.entries, self.oldest = entries, oldest

    def __contains__(self, key) -> bool:
        entry = self.entries.get(key)
        return entry is not None and entry[0] > self.oldest


class _ReplicaIndex:
    """One replica's keys: key -> [tick of its last sending, confirmed by a response]; `tick` counts new keys."""

    __slots__ = ("entries", "tick")

    def __init__(self) -> None:
        self.entries: OrderedDict[int, list] = OrderedDict()
        self.tick = 0

    def matched(self, keys: tuple[int, ...], horizon: float) -> int:
        return match_prefix(_Younger(self.entries, self.tick - horizon), keys)

    def ages(self, keys: tuple[int, ...]) -> tuple[tuple[int, ...], tuple[bool, ...]]:
        ages, confirmed = [], []
        for key in keys:
            entry = self.entries.get(key)
            if entry is None:
                ages.append(-1)
                confirmed.append(False)
            else:
                ages.append(self.tick - entry[0])
                confirmed.append(entry[1])
        return tuple(ages), tuple(confirmed)

    def remember(self, keys: tuple[int, ...], cap: int, max_age: float) -> None:
        """Keys sent: last first, so the head is youngest, as the engines order a chain for eviction
        (`kvcache.prefix_match.touch_chain`)."""
        entries = self.entries
        for key in reversed(keys):
            entry = entries.get(key)
            if entry is None:
                self.tick += 1
                entries[key] = [self.tick, False]
            else:
                entry[0] = self.tick
                entries.move_to_end(key)
        oldest = self.tick - max_age
        while entries and (len(entries) > cap or next(iter(entries.values()))[0] <= oldest):
            entries.popitem(last=False)

    def confirm(self, keys: tuple[int, ...]) -> None:
        entries = self.entries
        for key in reversed(keys):
            entry = entries.get(key)
            if entry is not None:
                entry[1] = True


def _cheapest_credited(request: RouteRequest, held: list[tuple], hot: int, weights: CostWeights,
                       rng: random.Random) -> tuple:
    """The cheapest replica with the request's first `hot` blocks credited to every one (`popularity.py`), given
    the blocks each holds; returns it, the prompt tokens it really computes, the fewest any would, and with
    the credit what it computes and the fewest any would (`_branch`)."""
    tokens, per_block = request.prompt_tokens, request.block_tokens
    computes = {r.id: max(0, int(tokens - blocks * per_block)) for r, blocks in held}
    candidates = [(r, max(0, int(tokens - max(blocks, hot) * per_block))) for r, blocks in held]
    replica, credited = cheapest(candidates, weights, rng, tokens)
    return replica, computes[replica.id], min(computes.values()), (credited, min(u for _, u in candidates))


@register("prefixaware")
class PrefixAware:
    needs = Needs(prefix_keys=True)

    def __init__(self, seed: int = 0, decode_weight: float = 64.0, affinity: float = 6.0, learn_rate: float = 0.05,
                 exclusive: bool = False, balance_rel: float = 1.0, balance_abs: float = 1.0,
                 balance_stake: float = 0.25, hot_share: float = 0.5, **_options):
        self.weights = CostWeights(decode_weight=decode_weight, affinity=affinity, exclusive=exclusive,
                                   balance_rel=balance_rel, balance_abs=balance_abs, balance_stake=balance_stake)
        self.popularity = PrefixPopularity(hot_share=hot_share)
        self.rng = random.Random(seed)
        self.index: dict[str, _ReplicaIndex] = {}
        self.learner = CapacityLearner(initial=DEFAULT_CACHE_BLOCKS, rate=learn_rate)

    def index_size(self) -> int:
        return sum(len(s.entries) for s in self.index.values())

    def replica_restarted(self, replica: str) -> None:
        """The replica's process was replaced: what it held is gone. Its learned cache size stays (the same
        engine, configured alike)."""
        self.index.pop(replica, None)

    def _horizon(self, replica, exact: bool) -> float:
        """Keys younger than this count as cached: the stated capacity, else the learned one."""
        if replica.cache_blocks:
            return replica.cache_blocks * (1 if exact else 2)
        if replica.id in self.learner.estimates:
            return self.learner.horizon(replica.id)
        # nothing learned yet: text chunks hold fewer tokens than engine blocks, forgetting early loses hits
        return DEFAULT_CACHE_BLOCKS * (1 if exact else 2)

    def choose(self, request: RouteRequest, snapshot: FleetSnapshot) -> Choice | None:
        eligible = snapshot.eligible(request.excluded)
        if not eligible:
            return None
        live = {r.id for r in snapshot.replicas}
        for gone in [rid for rid in self.index if rid not in live]:
            del self.index[gone]
            self.learner.forget(gone)
        hot = self._hot_depth(request, eligible, self.popularity)
        held = []
        for r in eligible:
            index = self.index.get(r.id)
            horizon = self._horizon(r, request.exact_keys)
            held.append((r, index.matched(request.blocks, horizon) if index is not None else 0))
        replica, uncached, best_possible, credited = _cheapest_credited(request, held, hot, self.weights, self.rng)
        branch = _branch(uncached, best_possible, request.prompt_tokens, credited)
        horizon = self._horizon(replica, request.exact_keys)
        index = self.index.get(replica.id)
        if index is None:
            index = self.index[replica.id] = _ReplicaIndex()
        prediction = None
        if request.blocks:
            ages, confirmed = index.ages(request.blocks)
            prediction = Prediction(replica.id, request.blocks, ages, confirmed, request.block_tokens,
                                    request.prompt_tokens, request.prompt_tokens - uncached)
        self._remember(index, replica, request.blocks, horizon, len(live))
        return Choice(replica, branch, uncached, prediction)

    def _hot_depth(self, request: RouteRequest, eligible: list, popularity: PrefixPopularity) -> int:
        """The leading keys of `request` that the traffic `popularity` counted shares widely, to be credited to
        every replica; none while the hot prefixes together would crowd the smallest cache this index knows."""
        hot = popularity.hot_depth(request.blocks, len(eligible))
        popularity.add(request.blocks)
        if hot:
            room = HOT_ROOM * min(self._horizon(r, request.exact_keys) for r in eligible)
            if popularity.hot_keys(len(eligible)) > room:
                return 0
        return hot

    def _remember(self, index: _ReplicaIndex, replica, blocks: tuple[int, ...], horizon: float, live: int) -> None:
        cap = MAX_INDEX_BLOCKS // max(live, 1)
        if replica.cache_blocks:
            cap, max_age = min(cap, int(horizon)), float("inf")
        else:
            max_age = max(SHADOW * horizon, MIN_HISTORY)
        index.remember(blocks, cap, max_age)

    def routed_elsewhere(self, replica, blocks: tuple[int, ...], exact: bool, live: int) -> None:
        """Another router process sent these keys to `replica` (router/workers.py): index them as if this one
        had, so every worker predicts from the whole fleet's traffic."""
        index = self.index.get(replica.id)
        if index is None:
            index = self.index[replica.id] = _ReplicaIndex()
        self._remember(index, replica, blocks, self._horizon(replica, exact), live)

    def observe(self, prediction: Prediction, cached_tokens: int, prompt_tokens: int | None = None) -> None:
        """A response came back (`router.feedback.report`): its keys are stored there; learn the horizon."""
        index = self.index.get(prediction.replica)
        if index is None:
            return  # the replica is gone
        index.confirm(prediction.keys)
        self.learner.observe(prediction, cached_tokens, prompt_tokens)


@register("kvaware")
class KVAware:
    needs = Needs(prefix_keys=True, kv_events=True)

    def __init__(self, seed: int = 0, decode_weight: float = 64.0, affinity: float = 6.0, balance_stake: float = 0.25,
                 hot_share: float = 0.5, **_options):
        self.weights = CostWeights(decode_weight=decode_weight, affinity=affinity, balance_stake=balance_stake)
        self.popularity = PrefixPopularity(hot_share=hot_share)
        self.rng = random.Random(seed)
        self.fallback = PrefixAware(seed=seed, decode_weight=decode_weight, affinity=affinity,
                                    balance_stake=balance_stake, hot_share=hot_share)

    def choose(self, request: RouteRequest, snapshot: FleetSnapshot) -> Choice | None:
        index = snapshot.kv_index
        if index is None or not request.exact_keys:  # no events, or text the router cannot key like the
            # engines (no tokenizer here): the router-side index stands in
            choice = self.fallback.choose(request, snapshot)
            return Choice(choice.replica, "no_events_" + choice.branch, choice.prefill_tokens,
                          choice.prediction) if choice else None
        eligible = snapshot.eligible(request.excluded)
        if not eligible:
            return None
        hot = self.fallback._hot_depth(request, eligible, self.popularity)  # cache sizes as the index knows them
        held = [(r, index.credit(r.id, request.blocks, snapshot.now)) for r in eligible]
        replica, uncached, best_possible, credited = _cheapest_credited(request, held, hot, self.weights, self.rng)
        branch = _branch(uncached, best_possible, request.prompt_tokens, credited)
        index.speculate(replica.id, request.blocks, snapshot.now)
        return Choice(replica, branch, uncached)

    def routed_elsewhere(self, replica, blocks: tuple[int, ...], exact: bool, live: int) -> None:
        """Another router process's decision: its router-side index stands in here too (no events, or text)."""
        self.fallback.routed_elsewhere(replica, blocks, exact, live)

    def replica_restarted(self, replica: str) -> None:
        """Its router-side index forgets the replica's old contents (the KV events resync the event index)."""
        self.fallback.replica_restarted(replica)

    def observe(self, prediction: Prediction, cached_tokens: int, prompt_tokens: int | None = None) -> None:
        """Responses to requests the router-side index placed (no events, or text keys) teach that index."""
        self.fallback.observe(prediction, cached_tokens, prompt_tokens)
