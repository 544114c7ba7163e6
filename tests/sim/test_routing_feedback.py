"""The simulator feeds the engines' cached tokens back to the live policy, as the gateway does."""

import pytest

from fleetserve.bench.routing_sim import endpoint_for, lru_token_hits
from fleetserve.sim.perf import profile
from fleetserve.sim.run import simulate
from fleetserve.sim.setup import SimOptions
from fleetserve.sim.workload import build_workload
from fleetserve.traces.model import TraceRequest


def test_text_prompts_in_blind_mode_keep_the_routers_own_estimate():
    text = "the cache of the router " * 200
    trace = [TraceRequest(0.0, 10, 4, messages=({"role": "user", "content": text},))]
    blind = build_workload(trace, 16, informed=False)[0]
    assert not blind.exact and blind.prompt == len(f"user: {text}\n".split())  # the engine counts its tokens
    assert blind.router_prompt == len(f"user: {text}\n") // 4  # the router only has characters


def test_blind_prefixaware_learns_from_every_finished_response(mooncake):
    prof = profile("h100-8b")
    from dataclasses import replace

    prof = replace(prof, cache_blocks=3000)
    result = simulate(endpoint_for("prefixaware", 2), mooncake, SimOptions(knowledge="blind", profile=prof))
    learned = result.fleet.feedback_summary()
    finished = sum(1 for r in result.fleet.requests if r.done is not None and r.error is None and r.spec.router_keys)
    assert finished > 50  # (a prompt shorter than one key predicts nothing and teaches nothing)
    assert sum(v["observations"] for v in learned.values()) == finished
    assert any(v["lowered"] for v in learned.values())  # the engines' misses moved it off the default
    leastload = simulate(endpoint_for("leastload", 2), mooncake[:50], SimOptions(profile=prof))
    assert leastload.fleet.feedback_summary() is None  # a policy that does not learn gets nothing


def test_oracle_is_one_pooled_lru_and_ideal_unbounded():
    trace = [TraceRequest(float(i), 1024, 1, hash_ids=(1, 2)) for i in range(3)]
    work = build_workload(trace, 256, informed=True)
    # the first request misses, the others hit 3 of their 4 blocks: the last holds the token an engine computes
    assert lru_token_hits(work, 256, None) == 0.5
    # 2 blocks hold the first two of a 4-block prompt: a chain is evicted from its tail (head-first, as until
    # 2026-12-05, it kept the last two, unusable: 0.0)
    assert lru_token_hits(work, 256, 2) == pytest.approx(1 / 3)


def test_a_trace_without_prefix_blocks_gets_figures_and_a_warning_not_a_traceback():
    """An Azure CSV (lengths only) crashed `bench routing` after every simulation: its cache warning formatted
    effective_cache_fraction, which is None without blocks."""
    from fleetserve.bench.routing_sim import run
    from tests.sim.conftest import AZURE

    result = run(str(AZURE), 2, ("roundrobin", "prefixaware"), ("blind",), 40, "h100-llama-8b", 0.25, 0.65, None,
                 None, 0, sweep_utilizations=())
    assert result["effective_cache_fraction"] is None and result["oracle_hit_rate"] == 0
    assert result["targets"]["met"] is None and "nothing to find" in result["targets"]["reason"]
    assert any("no prefix blocks" in w for w in result["warnings"])


def test_the_seed_breaks_the_policys_ties_and_seed_0_is_the_live_routers(mooncake):
    """`--seed` never reached the routing policy: every seed gave the same numbers, and no command could show
    how much of a routing figure is the tie-break's draw."""
    prof = profile("h100-8b")

    def placement(seed: int) -> list[str]:
        result = simulate(endpoint_for("prefixaware", 4), mooncake[:300], SimOptions(profile=prof, seed=seed))
        return [r.replica.id if r.replica else "" for r in result.fleet.requests]

    zero = placement(0)
    assert placement(0) == zero
    assert placement(1) != zero
