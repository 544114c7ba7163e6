"""From reuse figures to advice: which cache tiers, which routing strategy, or that caching will not pay.

    caching will not pay   when even an unbounded cache reuses < 10% of prompt tokens, or the whole tiered
                           cache of the fleet would reuse < 5%;
    L1+L2                  when the shared L2 adds >= 5 points of hit rate over engine memory + L1 (L2 only
                           when L1 adds < 1 point: at its size it holds copies of what the engines hold);
    L1 only                when L1 adds >= 1 point (an L2 < 5), or when the engines' own memory already holds
                           nearly all the reuse and L1 is larger than it (a cheap margin for longer traffic);
    engine only            otherwise: L1 adds < 1 point and L2 < 5, or the engines hold nearly all the reuse
                           and an L1 no larger than their memory would only copy it.
    strategy               the cache-aware strategy with the best hit rate (prefixaware unless another beats
                           it by > 1 point); leastload when routing by cache wins < 2 points over roundrobin,
                           and with one replica, where every strategy sends it everything.

The capacities are the fleet's, pooled as one LRU (the oracle's bound) and written through as the engines do:
replicas x the larger of engine blocks and L1 blocks, then the larger of that and the shared L2 (a tier holds
copies of what the engines stored, so it adds only what it holds beyond them). Every hit rate compared here
counts prompt tokens (the ideal: `ideal_token_hit_rate`), as the strategies' do.
"""

from __future__ import annotations

NOT_WORTH_IDEAL = 0.10
NOT_WORTH_REACHABLE = 0.05
L1_GAIN = 0.01
L2_GAIN = 0.05
STRATEGY_MARGIN = 0.01
ROUTING_GAIN = 0.02
CACHE_AWARE = ("prefixaware", "kvaware", "session")


def recommend(ideal: float, tiers: dict, strategies: dict, filled: bool = True, block_tokens: int = 256,
              engine_blocks: int | None = None, l1_blocks: int | None = None, replicas: int = 2,
              block_hint: str = "with a smaller engine block, give --block-size") -> dict:
    """`filled`: some prompt fills one block of `block_tokens` (else nothing cached is ever found again; `block_hint`
    says what to do about it);
    `engine_blocks` and `l1_blocks` (per replica) say why an L1 adds nothing when it is the smaller."""
    reasons = []
    ideal = round(ideal, 4)  # as the tiers' rates: 19.0 % ideal beside 19.1 % reachable read as a bounded cache
    # beating the unbounded one
    engine, l1, l2 = tiers["engine"]["hit_rate"], tiers["engine+l1"]["hit_rate"], tiers["engine+l1+l2"]["hit_rate"]
    if ideal < NOT_WORTH_IDEAL or l2 < NOT_WORTH_REACHABLE:
        if not filled:
            reasons.append(f"no prompt fills one {block_tokens}-token block, and engines cache whole blocks: nothing "
                           f"cached is found again ({block_hint})")
        elif ideal < NOT_WORTH_IDEAL:
            reasons.append(f"even an unbounded cache would reuse only {ideal:.1%} of prompt tokens "
                           f"(below {NOT_WORTH_IDEAL:.0%}): prompts share too little")
        else:
            reasons.append(f"the fleet's whole tiered cache would reuse only {l2:.1%} of prompt tokens "
                           f"(ideal {ideal:.1%}): "
                           "reuse is too far apart in time for any affordable cache")
        reasons.append("route by load (leastload) and spend the memory on batch size instead")
        return {"summary": "caching will not pay", "tiers": "none", "strategy": "leastload", "reasons": reasons}
    reasons.append(f"ideal (unbounded) hit rate {ideal:.1%}; engine memory alone reaches {engine:.1%}, "
                   f"with L1 {l1:.1%}, with L1 and L2 {l2:.1%}")
    l1_pays = l1 - engine >= L1_GAIN
    copies = (f"L1 ({l1_blocks} blocks per replica) is no larger than the engine's own memory ({engine_blocks} "
              "blocks): written through, it holds copies of what the engine holds and pays only when larger"
              if l1_blocks is not None and engine_blocks is not None and l1_blocks <= engine_blocks else
              f"L1 adds only {l1 - engine:.1%} over engine memory")
    if l2 - l1 >= L2_GAIN:
        tier = "L1+L2" if l1_pays else "L2 only"
        reasons.append(f"a shared L2 adds {l2 - l1:.1%} of hit rate over L1: reuse spans more than the replicas' "
                       "own memory holds")
        if not l1_pays:
            reasons.append(copies)
    elif ideal - engine <= 0.01 and (l1_blocks is None or engine_blocks is None or l1_blocks > engine_blocks):
        tier = "L1 only"
        reasons.append("engine memory already holds nearly all the reuse; L1, larger than it, is a cheap margin for "
                       "longer traffic, an L2 would add nothing")
    elif ideal - engine <= 0.01:  # an L1 no larger than the engine's memory only copies it: no margin
        tier = "engine only"
        reasons.append(f"engine memory already holds nearly all the reuse; {copies}")
    elif l1_pays:
        tier = "L1 only"
        reasons.append(f"L1 adds {l1 - engine:.1%} over engine memory; an L2 would add only {l2 - l1:.1%} "
                       f"(below {L2_GAIN:.0%}): not worth a Redis")
    else:
        tier = "engine only"
        reasons.append(f"{copies}; an L2 would add only {l2 - l1:.1%} (below {L2_GAIN:.0%}): not worth a Redis")
    if replicas == 1:  # "L1+L2 with prefixaware" had been advised for one replica, "as the L1s are per replica"
        strategy, why = "leastload", "one replica: every strategy sends it everything, so routing has no choice"
    else:
        strategy, why = _strategy(strategies, per_replica_tier=tier in ("L1 only", "L1+L2") and l1_pays)
    reasons.append(why)
    return {"summary": f"{tier} with {strategy} routing", "tiers": tier, "strategy": strategy, "reasons": reasons}


def _strategy(strategies: dict, per_replica_tier: bool = False) -> tuple[str, str]:
    """The strategies ran with engine memory only; `per_replica_tier`: the advice counts on each replica's L1,
    which a repeat finds only on the replica that computed it, so load-only routing would lose it even where the
    engines alone show no gain (the L1 hits were pooled, as cache-aware routing partitions prompts)."""
    rates = {n: s["hit_rate"] for n, s in strategies.items() if s.get("hit_rate") is not None}
    aware = {n: rates[n] for n in CACHE_AWARE if n in rates}
    if not aware:
        return "leastload", "no cache-aware strategy could act on this trace"
    best = max(aware, key=lambda n: aware[n])
    if "prefixaware" in aware and aware[best] - aware["prefixaware"] <= STRATEGY_MARGIN:
        best = "prefixaware"
    baseline = max((rates[n] for n in ("roundrobin", "leastload") if n in rates), default=0.0)
    if aware[best] - baseline < ROUTING_GAIN and per_replica_tier:
        return best, (f"the L1s are per replica: a repeat finds its blocks only where they were computed, which "
                      f"{best} keeps and load-only routing does not (with engine memory alone it gains "
                      f"{aware[best] - baseline:.1%})")
    if aware[best] - baseline < ROUTING_GAIN:
        return "leastload", (f"cache-aware routing gains only {aware[best] - baseline:.1%} of hit rate over load-only "
                             "routing here: balance load instead")
    skipped = [n for n, s in strategies.items() if s.get("hit_rate") is None]
    note = f" ({', '.join(skipped)} could not act on this trace)" if skipped else ""
    return best, (f"{best} reaches {aware[best]:.1%} hit rate against {baseline:.1%} for load-only routing"
                  f"{note}")
