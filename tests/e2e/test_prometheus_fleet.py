"""Issue 12's first must-show: a fleet with its own Prometheus, under load, scaled from 1 to 2 replicas, read
back through Prometheus's HTTP API, the new replica included (file-based service discovery follows it)."""

import json
import os
import shutil
import signal
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from fleetserve.fleet.prometheus import with_credentials
from tests.helpers import fleet_status, fleetserve, http_ok, processes_with_env, wait_until

pytestmark = [pytest.mark.e2e, pytest.mark.skipif(
    shutil.which("prometheus") is None,
    reason="Debian's prometheus is not installed (scripts/setup.sh installs it as root): no Prometheus to start")]

SPEC = """
apiVersion: fleetserve.io/v1
kind: Endpoint
metadata: {{name: watched}}
spec:
  model: {{name: tiny, source: "{source}", version: "7"}}
  engine: {{threads: 1}}
  replicas: 1
  routing: {{strategy: leastload}}
  metrics: {{scrapeIntervalSeconds: 5}}
  autoscaling:
    minReplicaCount: 1
    maxReplicaCount: 2
    pollingInterval: 1
    cooldownPeriod: 600
    initialCooldownPeriod: 0
    scaleDownStabilizationTime: 600
    triggers:
      # no serverAddress: the fleet's own Prometheus answers (a target this high never scales; first, so that
      # its reading is the decision's reason when both triggers want the same, i.e. once the load stops)
      - {{metric: prometheus, query: "sum(model_concurrent_requests) or vector(0)", target: 1000}}
      - {{metric: concurrency, target: 1}}
"""

LABELS = {"namespace": "default", "model_name": "tiny", "model_version": "7"}


def status(home):
    return json.loads(fleetserve("status", "--json", env=home, check=True).stdout)[0]


def query(prometheus: str, promql: str) -> list[dict]:
    r = httpx.get(prometheus + "/api/v1/query", params={"query": promql}, timeout=5)
    r.raise_for_status()
    body = r.json()
    assert body["status"] == "success", body
    return body["data"]["result"]


def by_replica(prometheus: str, metric: str) -> dict[str, tuple[dict, float]]:
    """The engines' series (the router's, replica "router", carry only the errors it produces itself)."""
    sel = ",".join(f'{k}="{v}"' for k, v in {**LABELS, "component": "engine"}.items())
    found = query(prometheus, f"{metric}{{{sel}}}")
    return {s["metric"]["replica"]: (s["metric"], float(s["value"][1])) for s in found}


def test_prometheus_follows_the_fleet_as_it_scales(tmp_path, tiny_model, home):
    spec = tmp_path / "watched.yaml"
    spec.write_text(SPEC.format(source=tiny_model))
    up = fleetserve("up", str(spec), "--detach", env=home)
    assert up.returncode == 0, up.stderr
    stop = threading.Event()
    try:
        s = status(home)
        plain = s["prometheus_url"]
        assert plain.startswith("http://127.0.0.1:") and f"prometheus: {plain}" in up.stdout
        assert f"prometheus: {plain}" in fleetserve("status", env=home).stdout
        # its series name the tenants: basic auth, the password in the run folder (it answered any local process)
        assert httpx.get(plain + "/api/v1/query", params={"query": "up"}, timeout=5).status_code == 401
        password = (Path(home["FLEETSERVE_HOME"]) / "run" / "watched" / "prometheus.password").read_text()
        assert oct((Path(home["FLEETSERVE_HOME"]) / "run" / "watched" / "prometheus.password").stat().st_mode
                   )[-3:] == "600"
        # Prometheus writes its WAL, tenant names and all, 0644: the run folder keeps other users out
        assert oct((Path(home["FLEETSERVE_HOME"]) / "run" / "watched").stat().st_mode)[-3:] == "700"
        prom = with_credentials(plain, password)
        assert s["ready"] == 1 and [r["id"] for r in s["replicas"]] == ["r0"]

        def load(i: int) -> None:  # four clients back to back: concurrency 4 against a target of 1
            with httpx.Client(base_url=s["url"], timeout=120) as client:
                while not stop.is_set():
                    r = client.post("/chat/completions", json={"model": "tiny", "max_tokens": 32, "messages": [
                        {"role": "user", "content": f"client {i} says hello"}]})
                    assert r.status_code == 200, r.text

        pool = ThreadPoolExecutor(4)
        workers = [pool.submit(load, i) for i in range(4)]
        wait_until(lambda: fleet_status(home)[0]["ready"] == 2, 180, interval=0.5,
                   what="the scale-up to 2 ready replicas")
        assert {r["id"] for r in status(home)["replicas"]} == {"r0", "r1"}

        # the replica that started after the fleet did is scraped, with the model labels and real traffic
        def both_seen() -> bool:
            seen = by_replica(prom, "model_invocations_total")
            return {"r0", "r1"} <= seen.keys() and all(v > 0 for _, v in seen.values())

        wait_until(both_seen, 90, interval=1, what="model_invocations_total of r0 and r1 in Prometheus")
        stop.set()
        for w in workers:
            w.result(timeout=180)
        pool.shutdown()

        instance_types = {r["id"]: r["instance_type"] for r in status(home)["replicas"]}
        for metric in ("model_invocations_total", "model_latency_milliseconds_count", "model_ttfb_milliseconds_count",
                       "model_latency_milliseconds_sum"):
            wait_until(lambda m=metric: {"r0", "r1"} <= by_replica(prom, m).keys(), 60, interval=1, what=metric)
            for replica, (labels, value) in by_replica(prom, metric).items():
                assert value > 0, (metric, replica)
                assert {k: labels[k] for k in LABELS} == LABELS
                assert labels["instance_type"] == instance_types[replica] and labels["instance_type"], labels
                assert labels["fleet"] == "watched" and labels["component"] == "engine"
        assert {"r0", "r1"} <= by_replica(prom, "model_concurrent_requests").keys()
        # nothing failed: the error series exist from the start (rate() sees an incident's first burst), at 0
        assert all(value == 0 for _, value in by_replica(prom, "model_errors_total").values())
        router_errors = query(prom, 'sum(model_errors_total{fleet="watched",component="router"})')
        assert router_errors and float(router_errors[0]["value"][1]) == 0

        # every component is a target and up: router (bearer token), engines (bearer token), supervisor
        up_by = {(t["metric"]["component"], t["metric"].get("replica", "")): t["value"][1]
                 for t in query(prom, 'up{fleet="watched"}')}
        assert up_by == {("router", ""): "1", ("supervisor", ""): "1", ("engine", "r0"): "1", ("engine", "r1"): "1"}
        router = query(prom, 'sum(fleetserve_router_requests_total{fleet="watched"})')
        assert router and float(router[0]["value"][1]) > 0
        desired = query(prom, 'fleetserve_autoscaler_desired_replicas{fleet="watched"}')
        assert desired and desired[0]["value"][1] == "2"

        # the recording rules are loaded and evaluate against these series
        wait_until(lambda: query(prom, "fleetserve:model_invocations:rate1m"), 60, interval=1,
                   what="the recording rule fleetserve:model_invocations:rate1m")
        rules = httpx.get(prom + "/api/v1/rules", timeout=5).json()["data"]["groups"]
        assert {g["name"] for g in rules} == {"fleetserve.default.watched.records", "fleetserve.default.watched.alerts"}

        # the PromQL trigger without serverAddress reads this Prometheus (a failed read would say so)
        def read_by_prometheus() -> bool:
            reason = status(home)["last_decision"]["reason"]
            assert "failed" not in reason, reason
            return "prometheus=" in reason

        wait_until(read_by_prometheus, 60, interval=1, what="a decision on the prometheus trigger's reading")

        # a Prometheus that dies is restarted (the Redis back-off) on the same port, its TSDB kept
        old_pid = status(home)["prometheus_pid"]
        os.kill(old_pid, signal.SIGKILL)
        wait_until(lambda: fleet_status(home)[0]["prometheus_pid"] not in (None, old_pid), 60, interval=0.5,
                   what="the supervisor to restart prometheus")
        wait_until(lambda: http_ok(prom + "/-/ready"), 60, interval=0.5, what="the restarted prometheus")
        wait_until(lambda: {"r0", "r1"} <= by_replica(prom, "model_invocations_total").keys(), 60, interval=1,
                   what="the series after the restart")
    finally:
        stop.set()
        down = fleetserve("down", env=home)
    assert down.returncode == 0, down.stderr
    assert processes_with_env("FLEETSERVE_HOME", home["FLEETSERVE_HOME"]) == []
    # started again, its Prometheus keeps its address and password: a Grafana data source given them works on
    # (each start had picked a new port and made a new password)
    again = fleetserve("up", str(spec), "--detach", env=home)
    try:
        assert again.returncode == 0, again.stderr
        assert status(home)["prometheus_url"] == plain
        wait_until(lambda: http_ok(prom + "/-/ready"), 60, interval=0.5, what="prometheus with the same credentials")
    finally:
        assert fleetserve("down", env=home).returncode == 0
