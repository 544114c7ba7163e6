"""Findings 4 and 6 with real processes: Redis is supervised like a replica; a killed supervisor leaves a state
that `status` shows as stale, `down` cleans, and `up` carries on from; cold start after a crash is the restart's."""

import json
import os
import shutil
import signal
import time

import httpx
import pytest
import redis

from tests.helpers import fleet_status, fleetserve, processes_with_env, wait_until

SPEC = """
apiVersion: fleetserve.io/v1
kind: Endpoint
metadata: {{name: {name}}}
spec:
  model: {{name: tiny, source: "{source}"}}
  engine: {{threads: 1}}
  replicas: 1
  routing: {{strategy: leastload}}
"""


def _status(home, name):
    (state,) = json.loads(fleetserve("status", name, "--json", env=home, check=True).stdout)
    return state


def _spec(tmp_path, source, name, extra=""):
    path = tmp_path / f"{name}.yaml"
    path.write_text(SPEC.format(name=name, source=source) + extra)
    return str(path)


def test_killed_redis_is_restarted_and_the_l2_tier_comes_back(tmp_path, tiny_model, home):
    if shutil.which("redis-server") is None:
        pytest.skip("redis-server is not installed")
    spec = _spec(tmp_path, tiny_model, "l2", "  kvCache: {blockSize: 16, l2: {enabled: true, maxBytes: 67108864}}\n")
    assert fleetserve("up", spec, "--detach", env=home).returncode == 0
    try:
        state = _status(home, "l2")
        assert state["l2_status"] == "up" and state["redis_pid"]
        os.kill(state["redis_pid"], signal.SIGKILL)
        wait_until(lambda: (lambda st: st["redis_pid"] not in (None, state["redis_pid"]) and st["l2_status"] == "up")(
            fleet_status(home, "l2")[0]), 60, interval=0.3, what="redis restarted")
        log = (tmp_path / "home" / "run" / "l2" / "supervisor.log").read_text()
        assert "redis-server (the L2 tier) exited with code" in log and "restarted" in log
        token = (tmp_path / "home" / "run" / "l2" / "internal.token").read_text().strip()
        replica = _status(home, "l2")["replicas"][0]["url"]
        body = {"model": "tiny", "prompt": "after the restart, a prefix long enough for blocks " * 3, "max_tokens": 2}
        password = (tmp_path / "home" / "run" / "l2" / "redis.password").read_text()
        with pytest.raises(redis.AuthenticationError):  # no AUTH, no blocks: local processes cannot read or forge
            redis.Redis.from_url(state["l2_url"]).dbsize()
        store = redis.Redis.from_url(state["l2_url"], password=password)

        def written():  # the engine reconnects by itself and writes its new blocks to the new Redis
            httpx.post(state["url"] + "/completions", json=body, timeout=60).raise_for_status()
            httpx.post(replica + "/admin/kv/flush", headers={"x-fleetserve-internal": token}, timeout=30)
            return store.dbsize() > 0

        wait_until(written, 60, interval=1.0, what="L2 writes to the restarted Redis")
    finally:
        assert fleetserve("down", "l2", env=home).returncode == 0
    assert processes_with_env("FLEETSERVE_HOME", home["FLEETSERVE_HOME"]) == []


AUTOSCALED = """  autoscaling:
    minReplicaCount: 1
    maxReplicaCount: 2
    pollingInterval: 1
    triggers: [{metric: concurrency, target: 4}]
"""


def test_after_a_supervisor_sigkill_status_is_stale_down_cleans_and_up_carries_on(tmp_path, tiny_model, home):
    spec = _spec(tmp_path, tiny_model, "phoenix", AUTOSCALED)
    assert fleetserve("up", spec, "--detach", env=home).returncode == 0
    first = _status(home, "phoenix")
    os.kill(first["supervisor_pid"], signal.SIGKILL)
    wait_until(lambda: processes_with_env("FLEETSERVE_HOME", home["FLEETSERVE_HOME"]) == [], 30,
               what="children to die with their supervisor")
    stale = _status(home, "phoenix")
    assert stale["status"] == "dead" and stale["ready"] == 0
    assert [r["state"] for r in stale["replicas"]] == ["stale"]  # never "ready" for a process that is gone
    shown = fleetserve("status", "phoenix", env=home).stdout  # "dead", and what to do about it, and where to look
    assert "`fleetserve down phoenix` stops what it left running" in shown and "supervisor.log" in shown
    down = fleetserve("down", env=home)  # no name: the one stale fleet
    assert down.returncode == 0 and "supervisor had died" in down.stdout
    stopped = _status(home, "phoenix")
    assert stopped["status"] == "stopped" and stopped["router_status"] == "stopped" and stopped["router_pid"] is None
    # killed again, then straight back up: the new supervisor carries on from the old scaling state
    assert fleetserve("up", spec, "--detach", env=home).returncode == 0
    os.kill(_status(home, "phoenix")["supervisor_pid"], signal.SIGKILL)
    wait_until(lambda: processes_with_env("FLEETSERVE_HOME", home["FLEETSERVE_HOME"]) == [], 30)
    try:
        assert fleetserve("up", spec, "--detach", env=home).returncode == 0
        log = (tmp_path / "home" / "run" / "phoenix" / "supervisor.log").read_text()
        assert "restored the scaling state of the previous supervisor" in log
        assert _status(home, "phoenix")["status"] == "ready"
    finally:
        fleetserve("down", "phoenix", env=home)


def test_cold_start_after_a_crash_counts_from_the_crash(tmp_path, tiny_model, home):
    spec = _spec(tmp_path, tiny_model, "cold")
    assert fleetserve("up", spec, "--detach", env=home).returncode == 0
    try:
        replica = _status(home, "cold")["replicas"][0]
        killed_at = time.monotonic()
        os.kill(replica["pid"], signal.SIGKILL)
        wait_until(lambda: (lambda r: r["restarts"] == 1 and r["state"] == "ready")(
            fleet_status(home, "cold")[0]["replicas"][0]), 120, interval=0.3)
        seen_ready_after = time.monotonic() - killed_at
        restarted = _status(home, "cold")["replicas"][0]
        # consistency, not speed: the restart cannot have taken longer than the test saw it take
        assert restarted["cold_start_s"] <= seen_ready_after
    finally:
        fleetserve("down", "cold", env=home)
