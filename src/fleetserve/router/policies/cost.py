"""The joint score of cache-aware policies: an estimate of time to first token, in prefill-token units.

    cost(replica) = backlog + uncached + decode_weight * running - affinity * cached

`backlog` is prefill work already sent to the replica and not started, `uncached` the prompt tokens it
would have to compute, `running` the sequences it decodes (each slows its steps). The cheapest replica
wins; a cold prefix therefore goes to the least busy replica, and a hot prefix spreads once queueing
behind it costs more than recomputing it elsewhere. `affinity` values the cached tokens beyond this request:
leaving the replica that holds a prefix also copies it (less room for others) and splits the conversation's
later turns, so a hit is kept unless the queue behind it is clearly worse. Ties are broken at random
(seeded) so misses spread.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from fleetserve.router.policies.base import ReplicaView


@dataclass(frozen=True)
class CostWeights:
    decode_weight: float = 64.0  # prefill tokens one running sequence is worth
    reported_weight: float = 512.0  # tokens per request the replica reports waiting (other routers' work)
    affinity: float = 6.0  # value of a cached token beyond this request (0: pure TTFT greed)


def ttft_cost(r: ReplicaView, uncached: int, cached: int, w: CostWeights) -> float:
    backlog = max(r.prefill_backlog, r.waiting * w.reported_weight)
    return backlog + uncached + w.decode_weight * max(r.in_flight, r.running + r.waiting) - w.affinity * cached


def cheapest(candidates: list[tuple[ReplicaView, int]], w: CostWeights, rng: random.Random, prompt_tokens: int
             ) -> tuple[ReplicaView, int]:
    costs = [(ttft_cost(r, u, prompt_tokens - u, w), r, u) for r, u in candidates]
    low = min(c for c, _, _ in costs)
    best = [(r, u) for c, r, u in costs if c <= low + 1e-9]
    return best[rng.randrange(len(best))] if len(best) > 1 else best[0]
