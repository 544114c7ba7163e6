"""fleet/prometheus.py: the generated configuration passes `promtool check config`, targets files carry the
labels the rules select on, and the spec's default follows the binary."""

import json
import shutil
import subprocess

import pytest
import yaml

from fleetserve.fleet import prometheus
from fleetserve.fleet.prometheus import Target, read_targets, write_files, write_targets
from fleetserve.spec.effects import inert_settings
from fleetserve.spec.load import load_spec_text

SPEC = """
apiVersion: fleetserve.io/v1
kind: Endpoint
metadata: {{name: chat}}
spec:
  model: {{name: tiny, source: builtin:smollm2-135m}}
  metrics: {{scrapeIntervalSeconds: 5}}
  {extra}
"""


def endpoint(extra: str = ""):
    return load_spec_text(SPEC.format(extra=extra)).endpoint


def test_config_has_three_jobs_with_the_token_and_the_rules(tmp_path):
    token = tmp_path / "internal.token"
    token.write_text("x" * 32)
    path = write_files(tmp_path / "prometheus", endpoint(), "chat", scrape_interval_s=5, token_file=token,
                       router_scheme="https", router_ca=str(tmp_path / "ca.pem"))
    config = yaml.safe_load(path.read_text())
    assert config["global"]["scrape_interval"] == "5s"
    jobs = {j["job_name"]: j for j in config["scrape_configs"]}
    assert set(jobs) == {"fleetserve-engine", "fleetserve-router", "fleetserve-supervisor"}
    for name in ("fleetserve-engine", "fleetserve-router"):
        assert jobs[name]["authorization"] == {"type": "Bearer", "credentials_file": str(token)}
    assert "authorization" not in jobs["fleetserve-supervisor"]
    assert jobs["fleetserve-router"]["scheme"] == "https" and jobs["fleetserve-router"]["tls_config"]["ca_file"]
    assert all(j["honor_labels"] for j in jobs.values())  # the engines' replica/instance_type labels stay as-is
    assert "x" * 32 not in path.read_text()  # the token itself is never in the configuration
    rules = yaml.safe_load((tmp_path / "prometheus" / "rules.yml").read_text())
    assert [g["name"] for g in rules["groups"]] == ["fleetserve.default.chat.records", "fleetserve.default.chat.alerts"]
    assert read_targets(tmp_path / "prometheus", "engine") == []  # empty lists exist from the start


def test_targets_are_replaced_whole_with_fleet_and_component_labels(tmp_path):
    write_targets(tmp_path, "engine", "chat", [Target("http://127.0.0.1:8001", "engine", "r0", "local")])
    write_targets(tmp_path, "engine", "chat", [Target("http://127.0.0.1:8001", "engine", "r0", "local"),
                                                Target("http://127.0.0.1:8002", "engine", "r1", "local")])
    groups = read_targets(tmp_path, "engine")
    assert groups[1] == {"targets": ["127.0.0.1:8002"],
                         "labels": {"fleet": "chat", "component": "engine", "replica": "r1", "instance_type": "local"}}
    assert [p.name for p in (tmp_path / "targets").iterdir()] == ["engine.json"]  # no temporary files left
    write_targets(tmp_path, "router", "chat", [Target("https://127.0.0.1:9000", "router")])
    assert json.loads((tmp_path / "targets" / "router.json").read_text())[0]["labels"] == {
        "fleet": "chat", "component": "router"}
    # the endpoint's namespace, as Kubernetes targets carry it: the dashboard's namespace filter keeps the series
    # that name no model (a picked namespace emptied the KV-tier and cached-token panels of a local fleet)
    write_targets(tmp_path, "router", "chat", [Target("https://127.0.0.1:9000", "router")], "team-a")
    assert json.loads((tmp_path / "targets" / "router.json").read_text())[0]["labels"]["namespace"] == "team-a"


def test_default_follows_the_binary(monkeypatch):
    monkeypatch.setattr(prometheus, "binary", lambda: None)
    assert not prometheus.wanted(endpoint().spec)
    notes = {p.path: p.message for p in inert_settings(endpoint())}
    assert "prometheus binary is not installed" in notes["spec.observability.prometheus"]
    assert "spec.metrics.scrapeIntervalSeconds" in notes  # no local Prometheus: the interval is for k8s only
    off = endpoint("observability: {prometheus: {enabled: false}}")
    assert not prometheus.wanted(off.spec)
    assert "spec.observability.prometheus" not in {p.path for p in inert_settings(off)}
    on = {p.path: p.message for p in inert_settings(endpoint("observability: {prometheus: {enabled: true}}"))}
    assert "`fleetserve up` will refuse to start" in on["spec.observability.prometheus.enabled"]  # validate said ok

    monkeypatch.setattr(prometheus, "binary", lambda: "/usr/bin/prometheus")
    assert prometheus.wanted(endpoint().spec)
    notes = {p.path for p in inert_settings(endpoint())}
    assert "spec.observability.prometheus" not in notes and "spec.metrics.scrapeIntervalSeconds" not in notes
    assert not prometheus.wanted(off.spec)


def test_a_promql_trigger_may_leave_the_server_to_the_fleet():
    trigger = "autoscaling: {triggers: [{metric: prometheus, query: 'sum(up)', target: 2}]}"
    spec = endpoint(trigger).spec
    assert spec.autoscaling.triggers[0].server_address is None
    off = endpoint(trigger + "\n  observability: {prometheus: {enabled: false}}")
    notes = {p.path: p.message for p in inert_settings(off)}
    assert "the fleet runs no Prometheus" in notes["spec.autoscaling.triggers[0].serverAddress"]
    assert "spec.autoscaling.triggers[0].serverAddress" not in {p.path for p in inert_settings(endpoint(
        "autoscaling: {triggers: [{metric: prometheus, query: 'sum(up)', target: 2, serverAddress: 'http://p:9090'}]}"
        "\n  observability: {prometheus: {enabled: false}}"))}
    with pytest.raises(Exception, match="needs a query"):
        endpoint("autoscaling: {triggers: [{metric: prometheus, target: 2}]}")


@pytest.mark.skipif(shutil.which("promtool") is None, reason="Debian's prometheus (promtool) is not installed")
def test_promtool_checks_the_generated_config(tmp_path):
    token = tmp_path / "internal.token"
    token.write_text("x" * 32)
    path = write_files(tmp_path / "prometheus", endpoint("slo: {costPerHourUsd: 3}"), "chat", scrape_interval_s=5,
                       token_file=token)
    write_targets(tmp_path / "prometheus", "engine", "chat", [Target("http://127.0.0.1:8001", "engine", "r0", "x")])
    done = subprocess.run(["promtool", "check", "config", str(path)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SUCCESS" in done.stdout and "rules found" in done.stdout


@pytest.mark.skipif(shutil.which("prometheus") is None, reason="Debian's prometheus is not installed")
def test_prometheus_logs_json_lines_when_the_fleet_does(tmp_path):
    """logFormat json left prometheus.log in logfmt beside the router's and engines' JSON lines."""
    from fleetserve.fleet.process import free_port
    from tests.helpers import wait_until

    folder = tmp_path / "prom"
    folder.mkdir()
    (folder / "prometheus.yml").write_text("global: {scrape_interval: 15s}\n")
    (folder / "web.yml").write_text("{}\n")
    log = tmp_path / "prometheus.log"
    child = prometheus.child(folder, free_port(), "1h", log, "json")
    child.start()
    try:
        wait_until(lambda: log.exists() and log.read_text().count("\n") >= 2, 30, what="prometheus's first lines")
    finally:
        child.proc.kill()
        child.proc.wait()
    lines = [line for line in log.read_text().splitlines() if line.strip()]
    assert lines and all(isinstance(json.loads(line), dict) for line in lines[:2]), lines[:2]


@pytest.mark.skipif(shutil.which("prometheus") is None, reason="Debian's prometheus is not installed")
def test_an_alert_firing_before_a_prometheus_crash_keeps_its_start_after_the_restart(tmp_path):
    """Prometheus restores an alert's `for` state only for a `for` longer than --rules.alert.for-grace-period
    (10m by default, longer than every alert of ours): after a crash every alert started over as pending, and a
    cost alert was silent for its whole `for` again."""
    import httpx

    from fleetserve.fleet.process import free_port
    from tests.helpers import wait_until

    folder = tmp_path / "prom"
    folder.mkdir()
    (folder / "rules.yml").write_text("groups:\n- name: g\n  rules:\n  - alert: AlwaysOn\n    expr: vector(1)\n"
                                      "    for: 3s\n")
    (folder / "prometheus.yml").write_text("global: {scrape_interval: 1s, evaluation_interval: 1s}\n"
                                           f"rule_files: [{folder / 'rules.yml'}]\n")
    (folder / "web.yml").write_text("{}\n")
    port = free_port()

    def alert() -> dict | None:
        try:
            found = httpx.get(f"http://127.0.0.1:{port}/api/v1/alerts", timeout=2).json()["data"]["alerts"]
        except (httpx.HTTPError, ValueError, KeyError):
            return None
        return found[0] if found else None

    child = prometheus.child(folder, port, "1h", tmp_path / "prometheus.log")
    child.start()
    try:
        wait_until(lambda: (alert() or {}).get("state") == "firing", 60, what="the alert to fire")
        first = alert()["activeAt"]
        child.proc.kill()  # a crash, as SIGKILL: its WAL holds ALERTS_FOR_STATE
        child.proc.wait()
        child.start()
        wait_until(lambda: (alert() or {}).get("state") == "firing", 60, what="the alert to fire again")
        assert alert()["activeAt"][:19] == first[:19]  # restored: the same alert, not a new one
    finally:
        child.proc.kill()
        child.proc.wait()
