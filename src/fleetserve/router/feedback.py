"""Learning from what engines report back: the cached prompt tokens of each response.

A router in front of engines that publish no KV events and no capacity (vLLM, SGLang without their event
streams: the `blind` mode) still gets one honest signal per response, `usage.prompt_tokens_details.
cached_tokens`: how much of the prompt the replica found in its cache. The router-side index of
`prefixaware` predicted a figure when it chose the replica; the difference says how large the replica's
cache effectively is (its memory minus what running sequences reserve, in the router's own units).

The estimate, per replica, is a horizon `H` on the *age* of an index entry: the number of new keys the router
sent to that replica since the entry was last sent there (an LRU engine forgets a block once about its
capacity of newer blocks arrived). A prediction counts only entries younger than `H`. Each response is
evidence:

    the engine found key i (a hit) and key i was `a` old   ->  capacity > a  : if a >= H, raise H
    the engine missed key i that the router had sent there,
    confirmed stored by an earlier response, `a` old      ->  capacity <= a : if a <  H, lower H

The keys found are `cached_tokens` over the router's tokens per key; for text, whose keys are character
chunks, the engine's tokens are first converted by the ratio of the router's prompt estimate to the engine's
`usage.prompt_tokens`. The engine's hit ends at one of its own block boundaries, and the engine never stores
the partial block at the end of a prompt: router keys there were sent and confirmed, yet the engine cannot
hold them. So a miss is read only from the first key that starts a whole engine block past the hit. The
router is not told the engine's block size; it learns it as the greatest common divisor of the cached counts
the engine reports (vLLM's 16, a 256-token block, SGLang's single-token pages all show that way), once it
has seen 8 distinct counts (a cache that only ever returns whole 12-block documents says nothing about its
block size); until then the key right after the hit is skipped. Without this, engine blocks of 256 tokens
read against text chunks of 64 counted the three keys after each hit as evictions: the learned horizons
collapsed to 23-222 keys on a chat trace whose caches held 2,600.

Raising evidence moves `H` just past the age seen, lowering evidence down to it, and each by at least a
fraction `rate`: `H` settles where raising and lowering evidence balance, the engine's own eviction horizon.
The evidence is lopsided, though: the router sends a request where it predicts a hit, so it sees misses
within `H` often and hits beyond `H` rarely, and `H` drifted low (Mooncake, 4 replicas holding 6,814 blocks
each: learned 3,000-4,500, hit rate 0.95 x oracle; with `H` fixed at the true size 0.99). So a hit near the
edge (older than (1 - `edge`) x `H`) also raises `H` by `rate`: the engine still held it, the edge may lie
further out (0.97 x oracle on the same run).
A key counts as stored only after a response for a request that carried it came back (`confirm`), so
misses of requests that raced an in-flight prefill are not mistaken for evictions. The ratio of reported
to predicted cached tokens is kept per replica as a plain figure for people (`summary`).

Entries older than the horizon are not deleted at once: the index keeps up to `shadow` x `H` of history, and
never less than the initial horizon's (`router.policies.prefix.MIN_HISTORY`), so hits beyond the current horizon
can still be seen (and `H` raised). A predicted hit the engine reported as a miss lowers `H` below that entry's
age, which takes it, and every older entry, out of the predictions. An engine's room for cached blocks shrinks
while long prompts run (their reservations), so such a miss may be a moment, not the cache's size: with only
2 x `H` of history, a horizon one such miss had cut to 66-128 keys (where the engine held ~3,500) never saw the
hits that would raise it again (Mooncake's trace at 0.9 utilization: one replica stayed there, 0.944 x oracle;
0.960 x with the floor under the history). Lowering straight to the age stays: a cache that really is small
(4 system prompts of 20,000 tokens over 187 blocks) is found at once; bounded to halving per miss, each step
cost a mispredicted 20,000-token prefill and TTFT p95 went from 0.09 to 0.72 x roundrobin.

The gateway and the simulator feed it the same way, through `report(policy, choice, cached_tokens)`; the
policy carries the prediction it made in `Choice.prediction`, so nothing is kept per request here. The
gateway calls `record`, which reports and also exports predicted against reported cached tokens per replica.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from fleetserve.kvcache.blocks import reusable_blocks


@dataclass(frozen=True)
class Prediction:
    """What a router-side index predicted for one routed request (carried in `Choice.prediction`)."""

    replica: str
    keys: tuple[int, ...]  # the router's prefix keys of the request, in prompt order
    ages: tuple[int, ...]  # per key, its age on `replica` at decision time; -1: not in the index
    confirmed: tuple[bool, ...]  # per key, whether a response already showed it stored there
    block_tokens: int  # tokens per router key (an estimate for text chunks)
    prompt_tokens: int
    predicted_tokens: int  # prompt tokens the router expected the replica to find cached


@dataclass
class ReplicaEstimate:
    horizon: float
    observations: int = 0
    raised: int = 0
    lowered: int = 0
    predicted_tokens: int = 0
    reported_tokens: int = 0
    engine_block: int = 0  # the engine's block size in its tokens, learned: gcd of the cached counts it reported
    block_samples: set = field(default_factory=set)  # distinct cached counts seen, up to BLOCK_EVIDENCE


BLOCK_EVIDENCE = 8  # distinct cached counts before their gcd is trusted as the engine's block size


@dataclass
class CapacityLearner:
    """Per replica: the learned horizon (in router keys), from predictions and reported cached tokens."""

    initial: int = 4096  # horizon before any evidence (router keys)
    floor: int = 16
    ceiling: int = 1_000_000
    rate: float = 0.05  # fraction of H one piece of evidence moves it
    edge: float = 0.1  # a hit older than (1 - edge) x H raises H by `rate`: the router rarely sends past H
    estimates: dict[str, ReplicaEstimate] = field(default_factory=dict)

    def horizon(self, replica: str) -> int:
        est = self.estimates.get(replica)
        return int(est.horizon) if est is not None else self.initial

    def forget(self, replica: str) -> None:
        self.estimates.pop(replica, None)

    def observe(self, prediction: Prediction, cached_tokens: int, prompt_tokens: int | None = None) -> str:
        """Apply one response's evidence; returns what it did: "raised", "lowered" or "kept".

        `prompt_tokens` is the engine's own count (`usage.prompt_tokens`): for text keyed by character chunks
        it converts the engine's tokens into the router's estimate before counting keys found."""
        est = self.estimates.get(prediction.replica)
        if est is None:
            est = self.estimates[prediction.replica] = ReplicaEstimate(float(self.initial))
        est.observations += 1
        scale = prediction.prompt_tokens / prompt_tokens if prompt_tokens else 1.0
        cached = cached_tokens * scale
        est.predicted_tokens += prediction.predicted_tokens
        est.reported_tokens += int(cached)
        keys, ages = prediction.keys, prediction.ages
        found = min(len(keys), int(max(0.0, cached) // max(prediction.block_tokens, 1)))
        h = est.horizon
        action = "kept"
        if found:
            oldest_hit = max(ages[:found])  # ages grow along a prefix; max() is robust to a re-sent block
            if oldest_hit >= h:
                est.horizon = min(self.ceiling, max(h * (1 + self.rate), oldest_hit + 1.0))
                est.raised += 1
                action = "raised"
            elif oldest_hit >= (1 - self.edge) * h:  # still held near the edge: it may lie further out
                est.horizon = min(self.ceiling, h * (1 + self.rate))
                est.raised += 1
                action = "raised"
        # the engine caches whole blocks of its own size: the block after its hit may hold router keys it never
        # stored as a full block (the end of the earlier prompt that sent them), so a miss is read only from the
        # first key that starts past that block. The size is learned (every cached count is a multiple of it);
        # until enough distinct counts were seen, one router key
        if cached_tokens > 0:
            est.engine_block = math.gcd(est.engine_block, int(cached_tokens))
            if len(est.block_samples) < BLOCK_EVIDENCE:
                est.block_samples.add(int(cached_tokens))
        block = prediction.block_tokens or 1
        engine_block = est.engine_block * scale if len(est.block_samples) >= BLOCK_EVIDENCE else block
        miss = max(found + 1, math.ceil((cached + engine_block) / block))
        # the engine computes at least the prompt's last token (vLLM, SGLang, ours): its last engine block is never
        # a hit, so a key that ends past the last whole engine block before it is no evidence (whole-block prompts
        # found whole read as a miss of their last key, and the horizons collapsed: prefixaware 0.90 -> 0.33)
        reach = reusable_blocks(prediction.prompt_tokens, engine_block) * engine_block \
            if prediction.prompt_tokens else math.inf
        if action == "kept" and miss < len(keys) and (miss + 1) * block <= reach:
            age = ages[miss]
            if prediction.confirmed[miss] and 0 <= age < h:
                est.horizon = max(self.floor, min(h * (1 - self.rate), max(age, self.floor)))
                est.lowered += 1
                action = "lowered"
        return action

    def summary(self) -> dict[str, dict]:
        return {rid: {"horizon": int(e.horizon), "observations": e.observations, "raised": e.raised,
                      "lowered": e.lowered,
                      "engine_block": e.engine_block if len(e.block_samples) >= BLOCK_EVIDENCE else None,
                      "reported_vs_predicted": round(e.reported_tokens / e.predicted_tokens, 3)
                      if e.predicted_tokens else None}
                for rid, e in sorted(self.estimates.items())}


def cached_tokens(usage: Mapping[str, Any] | None) -> int | None:
    """`usage.prompt_tokens_details.cached_tokens` of an OpenAI-shaped response (None when absent)."""
    if not isinstance(usage, Mapping):
        return None
    details = usage.get("prompt_tokens_details")
    if not isinstance(details, Mapping):
        return None
    value = details.get("cached_tokens")
    if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
        return None
    return int(value)


def report(policy: Any, choice: Any, cached: int | None, prompt_tokens: int | None = None) -> bool:
    """Feed one response's cached prompt tokens to the policy that made `choice` (gateway and simulator);
    `prompt_tokens` is the response's `usage.prompt_tokens` (the engine's count), when it has one.

    Returns whether the policy learned from it: policies without `observe`, choices without a prediction
    (load-only policies, kvaware on engine events) and responses without `cached_tokens` are ignored."""
    observe = getattr(policy, "observe", None)
    prediction = getattr(choice, "prediction", None)
    if observe is None or prediction is None or cached is None:
        return False
    observe(prediction, cached, prompt_tokens)
    return True


def learner_of(policy: Any) -> CapacityLearner | None:
    """The policy's cache-size learner (its own, or its router-side fallback's), if it learns."""
    learner = getattr(policy, "learner", None) or getattr(getattr(policy, "fallback", None), "learner", None)
    return learner if isinstance(learner, CapacityLearner) else None


def record(metrics: Any, policy: Any, choice: Any, cached: int | None, prompt_tokens: int | None = None,
           routed_prompt_tokens: int | None = None) -> bool:
    """What the gateway calls after each response: `report` it to the policy, and count predicted against
    reported cached tokens per policy and per replica in `metrics` (observe.metrics.RouterMetrics), with the
    replica's learned cache size. Returns whether the policy learned from it.

    `cached` and `prompt_tokens` are the response's `usage.prompt_tokens_details.cached_tokens` and
    `usage.prompt_tokens`; `routed_prompt_tokens` is the routed request's `prompt_tokens`, which gives the
    prediction of a choice that carries none (kvaware on engine events). Predictions are counted in the
    engine's tokens (scaled by prompt_tokens over the router's estimate), so both hit rates share one base."""
    if cached is None or choice is None:
        return False
    from fleetserve.observe.metrics import child  # the gateway's metrics; the simulator passes none of its own

    learned = report(policy, choice, cached, prompt_tokens)
    prediction = getattr(choice, "prediction", None)
    if prediction is not None:
        predicted, routed = prediction.predicted_tokens, prediction.prompt_tokens
    elif routed_prompt_tokens is not None:
        predicted, routed = max(0, routed_prompt_tokens - choice.prefill_tokens), routed_prompt_tokens
    else:
        predicted, routed = None, None
    if predicted is not None and prompt_tokens and routed:
        predicted = round(predicted * prompt_tokens / routed)
    name = getattr(policy, "name", type(policy).__name__)
    child(metrics.cached_tokens, name, "predicted").inc(predicted or 0)
    child(metrics.cached_tokens, name, "reported").inc(cached)
    backend = choice.replica.id
    if predicted is not None:
        child(metrics.backend_cached_tokens, backend, "predicted").inc(predicted)
    child(metrics.backend_cached_tokens, backend, "reported").inc(cached)
    if prompt_tokens or routed:
        child(metrics.backend_prompt_tokens, backend).inc(prompt_tokens or routed)
    learner = learner_of(policy)
    if learner is not None and backend in learner.estimates:
        child(metrics.backend_cache_horizon, backend).set(learner.horizon(backend))
    return learned
