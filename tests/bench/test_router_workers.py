"""`fleetserve bench router-workers`: the hit rate with `router --workers 2` against 1, run tiny."""

import json

from tests.helpers import fleetserve


def test_router_workers_bench_reports_both_configurations_and_both_workers_served():
    result = fleetserve("bench", "router-workers", "--strategies", "prefixaware", "--requests", "40",
                        "--replicas", "2", "--duration", "4", "--json", timeout=600)
    assert result.returncode == 0, result.stderr
    figures = json.loads(result.stdout)
    assert figures["benchmark"] == "router-workers"
    assert figures["trace"]["kind"] == "chat" and figures["trace"]["requests"] == 40
    assert "simulated engines" in figures["note"] and "one run" in figures["note"]
    assert set(figures["strategies"]) == {"prefixaware"}
    row = figures["strategies"]["prefixaware"]
    assert {"hit_rate", "ratio", "loss_pct", "worker_requests", "requests"} <= set(row)
    assert set(row["hit_rate"]) == {"workers_1", "workers_2"}
    for hit_rate in row["hit_rate"].values():
        assert 0 <= hit_rate <= 1
    assert row["requests"] == 40 and row["lost"] == {"workers_1": 0, "workers_2": 0}
    assert row["failed"] == {"workers_1": 0, "workers_2": 0}
    # fresh connections per request: the kernel spread them over both workers
    assert len(row["worker_requests"]) == 2 and all(n > 0 for n in row["worker_requests"])
    assert sum(row["worker_requests"]) == 40


def test_router_workers_bench_rejects_a_strategy_without_a_cache():
    result = fleetserve("bench", "router-workers", "--strategies", "roundrobin")
    assert result.returncode == 2 and "prefixaware" in result.stderr
