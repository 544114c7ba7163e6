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
    empty = fleetserve("bench", "router-workers", "--strategies", "")  # it had run both, at full size
    assert empty.returncode == 2 and "--strategies" in empty.stderr and "prefixaware" in empty.stderr
    missing = fleetserve("bench", "router-workers", "--trace", "no-such-trace.jsonl")
    assert missing.returncode == 2 and "--trace: " in missing.stderr and "system-prompt" in missing.stderr


def test_a_prompt_log_of_chats_is_sent_as_chats(tmp_path):
    """A prompt log's `messages` went to /v1/completions: every request failed ("prompt: is required"), and the
    run exited 0 with a null ratio."""
    log = tmp_path / "chat.jsonl"
    log.write_text("".join(json.dumps({"timestamp": i * 0.2, "max_tokens": 3, "messages": [
        {"role": "system", "content": "You answer briefly. " * 40}, {"role": "user", "content": f"question {i}"}]})
        + "\n" for i in range(6)))
    result = fleetserve("bench", "router-workers", "--strategies", "prefixaware", "--requests", "6", "--replicas",
                        "1", "--duration", "2", "--trace", str(log), "--json", timeout=600)
    assert result.returncode == 0, result.stderr
    row = json.loads(result.stdout)["strategies"]["prefixaware"]
    assert row["failed"] == {"workers_1": 0, "workers_2": 0} and row["answered"] == {"workers_1": 6, "workers_2": 6}
