"""The joint score of cache-aware policies: an estimate of time to first token, in prefill-token units.

    cost(replica) = backlog + uncached + decode_weight * running - affinity * cached

`backlog` is prefill work already sent to the replica and not started, `uncached` the prompt tokens it
would have to compute, `running` the sequences it decodes (each slows its steps). The cheapest replica
wins; a cold prefix therefore goes to the least busy replica, and a hot prefix spreads once queueing
behind it costs more than recomputing it elsewhere. `affinity` values the cached tokens beyond this request:
leaving the replica that holds a prefix also copies it (less room for others) and splits the conversation's
later turns, so a hit is kept unless the queue behind it is clearly worse. Ties are broken at random
(seeded) so misses spread.

Balance guard: a replica whose load (requests in flight, or its reported running + waiting) exceeds
`balance_rel` x the candidates' mean + `balance_abs` is not a candidate (unless none is left). Without it a
prefix every request shares (a chat service's system prompt) keeps all new conversations on the replica that
computed it first: at low load the queue term never outweighs the hit, and one replica does all the work
while the others idle (busy-time skew 2.4 on a generated chat trace, 1.05 with the guard at 1.0 x mean + 1).

A prefix that a large share of the traffic carries is credited to every replica before this score
(`popularity.py`): it must be copied, and crediting it lets the requests that share it spread by load. The
guard is then for the rest, and it yields when much is at stake: a replica over the bound stays a candidate
when every replica within it would recompute at least `balance_stake` of the prompt more than it (a long
document, or a conversation, whose only copy is there). Then the TTFT estimate decides, queue included.
Without the exception the guard moved such requests off their only copy whenever their home was one request
busier than the mean, which at high load is most of the time (figures in docs/simulator.md, routing).
`exclusive` (off by default) values only the cached tokens no other candidate holds.
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
    exclusive: bool = False  # affinity only for cached tokens no other candidate holds
    balance_rel: float = 1.0  # > 0: a replica loaded over balance_rel x mean + balance_abs is not a candidate
    balance_abs: float = 1.0
    balance_stake: float = 0.25  # an over-bound replica stays a candidate if the others recompute this share more


def ttft_cost(r: ReplicaView, uncached: int, cached: int, w: CostWeights) -> float:
    # the reported queue counts for the requests it held beyond ours at report time (ReplicaView.load): ours
    # are in prefill_backlog, fresh; the whole stale queue kept a drained replica "busy" until the next probe
    queued = r.waiting if r.reported_in_flight is None else min(r.waiting, r.load - r.in_flight)
    backlog = max(r.prefill_backlog, queued * w.reported_weight)
    return backlog + uncached + w.decode_weight * r.load - w.affinity * cached


def cheapest(candidates: list[tuple[ReplicaView, int]], w: CostWeights, rng: random.Random, prompt_tokens: int
             ) -> tuple[ReplicaView, int]:
    """The replica with the lowest TTFT cost among those the balance guard leaves."""
    if w.balance_rel > 0 and len(candidates) > 1:
        mean = sum(r.load for r, _ in candidates) / len(candidates)
        bound = w.balance_rel * mean + w.balance_abs
        within = [(r, u) for r, u in candidates if r.load <= bound]
        if within and len(within) < len(candidates) and w.balance_stake > 0:
            # what the best replica within the bound would recompute, against each one over it
            stake = w.balance_stake * max(prompt_tokens, 1)
            best_within = min(u for _, u in within)
            within += [(r, u) for r, u in candidates if r.load > bound and best_within - u >= stake]
        candidates = within or candidates
    if w.exclusive and len(candidates) > 1:
        cached = sorted((prompt_tokens - u for _, u in candidates), reverse=True)
        first, second = cached[0], cached[1]
        costs = [(ttft_cost(r, u, max(0, prompt_tokens - u - (second if prompt_tokens - u == first else first)), w),
                  r, u) for r, u in candidates]
    else:
        costs = [(ttft_cost(r, u, prompt_tokens - u, w), r, u) for r, u in candidates]
    low = min(c for c, _, _ in costs)
    best = [(r, u) for c, r, u in costs if c <= low + 1e-9]
    return best[rng.randrange(len(best))] if len(best) > 1 else best[0]
