"""Hit rate per routing strategy for N replicas: the live policies over the trace, per-replica LRU caches.

Each strategy is the registered policy itself (`create_policy(name)`), asked `choose(request, snapshot)` for
every request in arrival order; nothing here decides where a request goes. The replicas are LRU caches of
`cache_blocks` blocks each (an engine's prefix cache: a hit is the leading run of the prompt's blocks it
holds). The load a policy sees is an estimate, not a queueing simulation: a request counts as in flight on
its replica from its arrival until arrival + prefill(uncached) + output x decode step (from the profile),
and its uncached tokens count as prefill backlog until its prefill would end. The fleet simulator
(`sim/`) gives the full answer with queues and batching; this is the quick look `analyze` needs.

Modes (what the router may know): `blind`, no KV events (kvaware cannot act; text prompts are keyed in
character chunks by `router.features`, as the gateway keys them); `informed`, the engines' KV events feed a
`KVIndex` (stored on insert, removed on eviction) and prompts are keyed with the engine's token blocks.
A strategy that cannot act on the trace says so (`None` with a reason) instead of reporting what its
fallback did: session without session keys, kvaware in blind mode.
"""

from __future__ import annotations

import heapq
from collections import OrderedDict
from dataclasses import dataclass

from fleetserve.analyze.blocks import BlockTrace
from fleetserve.router.features import KVLayout, request_features
from fleetserve.router.kvindex import KVIndex
from fleetserve.router.policies import FleetSnapshot, ReplicaView, RouteRequest, create_policy, registered_policies
from fleetserve.sim.perf import PerfProfile

MODES = ("blind", "informed")


@dataclass
class _Replica:
    id: str
    capacity: int
    lru: OrderedDict
    busy_until: list  # heap of (end, prefill_end, uncached tokens)
    requests: int = 0

    def view(self, now: float) -> ReplicaView:
        while self.busy_until and self.busy_until[0][0] <= now:
            heapq.heappop(self.busy_until)
        backlog = sum(u for _, p_end, u in self.busy_until if p_end > now)
        return ReplicaView(id=self.id, url=f"sim://{self.id}", in_flight=len(self.busy_until),
                           prefill_backlog=backlog, cache_blocks=self.capacity)

    def serve(self, keys: tuple[int, ...]) -> tuple[int, list[int], list[int]]:
        """(leading blocks hit, keys stored, keys evicted)."""
        hit = 0
        for k in keys:
            if k not in self.lru:
                break
            hit += 1
        stored = [k for k in keys if k not in self.lru]
        for k in keys:
            self.lru[k] = None
            self.lru.move_to_end(k)
        evicted = []
        while len(self.lru) > self.capacity:
            evicted.append(self.lru.popitem(last=False)[0])
        return hit, stored, evicted


def cannot_act(name: str, trace: BlockTrace, mode: str) -> str | None:
    if name == "session" and not any(r.session for r in trace.requests):
        return "the trace has no session keys: session routing would send every request to the least loaded " \
               "replica (leastload's numbers, not session's)"
    if name == "kvaware" and mode == "blind":
        return "needs the engines' KV events, which blind mode does not have (its fallback is prefixaware)"
    return None


def strategy_hit_rates(trace: BlockTrace, replicas: int, cache_blocks: int, perf: PerfProfile,
                       strategies: tuple[str, ...] | None = None, mode: str = "blind", seed: int = 0) -> dict:
    """{strategy: {"hit_rate", "load_skew", "decisions"} or {"hit_rate": None, "reason"}}."""
    if mode not in MODES:
        raise ValueError(f"unknown mode {mode!r}; allowed: {', '.join(MODES)}")
    out = {}
    for name in strategies or registered_policies():
        reason = cannot_act(name, trace, mode)
        out[name] = {"hit_rate": None, "reason": reason} if reason else _run(name, trace, replicas, cache_blocks,
                                                                                perf, mode, seed)
    return out


def _route_request(trace: BlockTrace, i: int, mode: str, layout: KVLayout) -> RouteRequest:
    r = trace.requests[i]
    headers = {"x-session-id": r.session} if r.session else {}
    if trace.bodies is not None and mode == "blind":  # the gateway sees text and keys it in chunks
        body = trace.bodies[i]
        keys, prompt_tokens, block_tokens, exact = request_features(body, layout)
        return RouteRequest(path="/v1/chat/completions", body=body, headers=headers, blocks=keys,
                            block_tokens=block_tokens, prompt_tokens=prompt_tokens, exact_keys=exact)
    body = trace.bodies[i] if trace.bodies is not None else ({"user": r.session} if r.session else {})
    return RouteRequest(path="/v1/completions", body=body, headers=headers, blocks=trace.keys[i],
                        block_tokens=trace.block_tokens, prompt_tokens=trace.prompt_tokens[i], exact_keys=True)


def _run(name: str, trace: BlockTrace, n: int, capacity: int, perf: PerfProfile, mode: str, seed: int) -> dict:
    policy = create_policy(name, seed=seed)
    reps = [_Replica(f"r{i}", capacity, OrderedDict(), []) for i in range(n)]
    by_id = {r.id: r for r in reps}
    index = KVIndex(max_blocks_per_replica=max(capacity, 1)) if mode == "informed" else None
    layout = KVLayout(block_size=trace.block_tokens)
    hits = total = 0
    branches: dict[str, int] = {}
    for i, r in enumerate(trace.requests):
        now = r.arrival_s
        snapshot = FleetSnapshot(tuple(rep.view(now) for rep in reps), now=now, kv_index=index)
        choice = policy.choose(_route_request(trace, i, mode, layout), snapshot)
        rep = by_id[choice.replica.id]
        keys = trace.keys[i]
        hit, stored, evicted = rep.serve(keys)
        if index is not None:
            index.stored(rep.id, stored)
            index.removed(rep.id, evicted)
        hits += hit
        total += len(keys)
        rep.requests += 1
        branches[choice.branch] = branches.get(choice.branch, 0) + 1
        uncached = max(0, trace.prompt_tokens[i] - hit * trace.block_tokens)
        prefill_end = now + perf.prefill_time(uncached)
        end = prefill_end + r.output_tokens * perf.decode_time(1, trace.prompt_tokens[i])
        heapq.heappush(rep.busy_until, (end, prefill_end, uncached))
    mean = len(trace.requests) / n
    return {"hit_rate": round(hits / max(total, 1), 4), "load_skew": round(max(r.requests for r in reps) / mean, 3),
            "decisions": dict(sorted(branches.items()))}
