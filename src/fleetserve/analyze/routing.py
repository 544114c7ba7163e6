"""Hit rate per routing strategy for N replicas, through the fleet simulator.

Each strategy is the registered policy itself (`create_policy(name)`), run by `sim.run.simulate` on a fixed
fleet of `replicas` engines with `cache_blocks` of KV memory each (the profile's speed; running sequences and
the prefix cache share the memory), the trace at its own arrival times. The hit rate is the simulator's:
prompt tokens the engines found cached over prompt tokens. Nothing here decides where a request goes.

Modes (what the router may know): `blind`, no KV events, capacity or queue (kvaware cannot act; text prompts
are keyed in character chunks by `router.features`, as the gateway keys them; the cache-aware policies learn
from the engines' reported cached tokens, `router.feedback`); `informed`, the engines' KV events feed a
`KVIndex` and prompts are keyed with the engine's token blocks. A strategy that cannot act on the trace says
so (`None` with a reason) instead of reporting what its fallback did: session without session keys, kvaware
in blind mode.
"""

from __future__ import annotations

import collections
from dataclasses import replace

from fleetserve.analyze.blocks import BlockTrace
from fleetserve.router.features import KVLayout, request_features
from fleetserve.router.policies import registered_policies
from fleetserve.sim.perf import PerfProfile
from fleetserve.sim.workload import ROUTER_DEFAULT_BLOCK, SimRequestSpec, build_workload
from fleetserve.sim.workload import cannot_act as shared_rule

MODES = ("blind", "informed")


def strategy_context() -> int:
    """The context of the model the strategies' fleet serves (the routing bench's): no completion is longer (a
    max_tokens of 16 M simulated days of decoding per strategy, minutes of wall)."""
    from fleetserve.bench.routing_sim import context_tokens

    return context_tokens()


def cannot_act(name: str, trace: BlockTrace, mode: str) -> str | None:
    """The shared rule (`sim.workload.cannot_act`); informed keys here are the model tokenizer's own blocks, exact
    for text prompts too (a router that tokenizes as the engine does)."""
    return shared_rule(name, mode, any(r.session for r in trace.requests))


def strategy_hit_rates(trace: BlockTrace, replicas: int, cache_blocks: int, perf: PerfProfile,
                       strategies: tuple[str, ...] | None = None, mode: str = "blind", seed: int = 0) -> dict:
    """{strategy: {"hit_rate", "load_skew", "ttft_ms", "decisions"} or {"hit_rate": None, "reason"}}."""
    if mode not in MODES:
        raise ValueError(f"unknown mode {mode!r}; allowed: {', '.join(MODES)}")
    names = [n for n in (strategies or registered_policies())]
    workload = _workload(trace, mode) if any(cannot_act(n, trace, mode) is None for n in names) else []
    limit = strategy_context()  # no engine generates more than its context (prompts stay whole, as the bench's)
    workload = [replace(w, output=min(w.output, limit)) for w in workload]
    prof = replace(perf, cache_blocks=max(1, cache_blocks), block_size=trace.block_tokens,
                   name=f"{perf.name}-cache{cache_blocks}")
    out = {}
    for name in names:
        reason = cannot_act(name, trace, mode)
        out[name] = {"hit_rate": None, "reason": reason} if reason else _run(name, workload, replicas, prof, mode,
                                                                                seed)
    return out


def _workload(trace: BlockTrace, mode: str) -> list[SimRequestSpec]:
    """The trace as the simulator's requests: the engines' keys are the analysed blocks (hash ids, or the
    model's tokens in chained blocks); the router's are the engines' own when informed, else its own."""
    if trace.fmt == "mooncake":
        return build_workload(trace.requests, trace.block_tokens, mode == "informed")
    out = []
    layout = KVLayout(block_size=ROUTER_DEFAULT_BLOCK)
    for i, r in enumerate(trace.requests):
        keys, prompt = trace.keys[i], max(1, trace.prompt_tokens[i])
        if mode == "informed":
            out.append(SimRequestSpec(r.arrival_s, prompt, r.output_tokens, keys, keys, trace.block_tokens, True,
                                      r.session))
        else:
            rkeys, tokens, rblock, exact = request_features(trace.bodies[i], layout)
            out.append(SimRequestSpec(r.arrival_s, prompt, r.output_tokens, keys, tuple(rkeys), rblock, exact,
                                      r.session, max(tokens, 1)))
    return out


class _Counted:
    """The policy, counting its decision branches (what the gateway's routing_decisions_total counts)."""

    def __init__(self, policy):
        self.policy = policy
        self.name = policy.name
        self.branches: collections.Counter[str] = collections.Counter()

    def choose(self, request, snapshot):
        choice = self.policy.choose(request, snapshot)
        if choice is not None:
            self.branches[choice.branch] += 1
        return choice

    def observe(self, prediction, cached_tokens, prompt_tokens=None):
        self.policy.observe(prediction, cached_tokens, prompt_tokens)


def _run(name: str, workload: list[SimRequestSpec], n: int, prof: PerfProfile, mode: str, seed: int) -> dict:
    from fleetserve.bench.routing_sim import endpoint_for
    from fleetserve.sim.fleet import SimFleet
    from fleetserve.sim.report import build_report, slo_of
    from fleetserve.sim.setup import SimOptions

    endpoint = endpoint_for(name, n)
    fleet = SimFleet(endpoint, workload, SimOptions(seed=seed, knowledge=mode, profile=prof))
    counted = fleet.policy = _Counted(fleet.policy)
    fleet.run()
    report = build_report(fleet, *slo_of(endpoint))
    counts = collections.Counter(r.replica.id for r in fleet.requests if r.replica is not None)
    per = [counts.get(r.id, 0) for r in fleet.replicas]
    mean = sum(per) / len(per) if per else 0.0
    return {"hit_rate": round(report["hit_rate"]["total"], 4),
            "load_skew": round(max(per) / mean, 3) if mean else None,
            "ttft_ms": report["ttft_ms"],
            "decisions": dict(sorted(counted.branches.items()))}
