"""`fleetserve dashboard grafana`: an importable dashboard whose every query parses (promtool)."""

from __future__ import annotations

import json
import re
import shutil
import subprocess

import pytest
import yaml
from typer.testing import CliRunner

from fleetserve.cli.app import app
from fleetserve.observe.grafana import (
    FILTER_LABELS,
    PANELS,
    build_dashboard,
    check_exprs,
    concrete,
    panel_targets,
    structure_errors,
)


@pytest.fixture(scope="module")
def board(tmp_path_factory) -> dict:
    out = tmp_path_factory.mktemp("grafana") / "d.json"
    result = CliRunner().invoke(app, ["dashboard", "grafana", "-o", str(out)])
    assert result.exit_code == 0, result.output
    assert str(out) in result.output
    return json.loads(out.read_text())


def promtool_errors(exprs: list[str], tmp_path) -> str:
    """Each expression as a recording rule: `promtool check rules` parses all of them offline."""
    rules = {"groups": [{"name": "dashboard", "rules": [{"record": f"dashboard:q{i}", "expr": e}
                                                        for i, e in enumerate(exprs)]}]}
    path = tmp_path / "rules.yml"
    path.write_text(yaml.safe_dump(rules))
    run = subprocess.run(["promtool", "check", "rules", str(path)], capture_output=True, text=True, timeout=60)
    return "" if run.returncode == 0 else run.stdout + run.stderr


def test_cli_dashboard_names_the_hyperpod_metrics_and_labels(board):
    text = json.dumps(board)
    for name in ("model_latency_milliseconds", "model_ttfb_milliseconds", "model_concurrent_requests",
                 "model_errors_total", "model_invocations_total"):
        assert name in text, name
    for label in ("instance_type", "namespace", "model_version", "model_name"):
        assert f'{label}=~\\"${label}\\"' in text, label


def test_structure_panels_targets_variables(board):
    assert structure_errors(board) == []
    assert board["schemaVersion"] >= 36 and board["uid"] == "fleetserve"
    variables = {v["name"]: v for v in board["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource" and variables["datasource"]["query"] == "prometheus"
    for label in FILTER_LABELS:
        v = variables[label]
        assert (v["type"], v["multi"], v["includeAll"], v["allValue"]) == ("query", True, True, ".*")
        assert v["datasource"]["uid"] == "${datasource}" and label in v["query"]
    titles = [p["title"] for p in board["panels"] if p["type"] == "timeseries"]
    assert titles == [p.title for p in PANELS]
    for _title, target in panel_targets(board):
        assert target["datasource"]["uid"] == "${datasource}" and target["expr"] and target["refId"]
    (decisions,) = board["annotations"]["list"]
    assert "fleetserve_autoscaler_decisions_total" in decisions["expr"] and decisions["enable"]
    text = json.dumps(board)
    for name in ("fleetserve_kv_tier_hits_total", 'fleetserve_router_cached_tokens_total',
                 "fleetserve_autoscaler_desired_replicas", "fleetserve_autoscaler_ready_replicas",
                 "fleetserve_nodes", "fleetserve_cost_per_hour_dollars"):
        assert name in text, name


def test_structure_check_catches_broken_dashboards():
    board = build_dashboard()
    board["panels"][1]["gridPos"]["w"] = 30
    board["panels"][2]["id"] = board["panels"][1]["id"]
    board["panels"][3]["datasource"] = "prom"
    board["templating"]["list"] = board["templating"]["list"][1:]
    errors = "\n".join(structure_errors(board))
    for fragment in ("bad gridPos", "missing or repeated", "reference object", "no datasource variable"):
        assert fragment in errors


@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool missing: scripts/setup.sh installs "
                                                              "prometheus from Debian as root")
def test_every_query_parses_with_promtool(board, tmp_path):
    exprs = check_exprs(board)
    assert len(exprs) == sum(len(p.series) for p in PANELS) + 1  # + the scaling-decision annotation
    assert all("$" not in e for e in exprs)
    assert promtool_errors(exprs, tmp_path) == ""
    # and the check has teeth: a query that does not parse fails it
    broken = promtool_errors([*exprs, concrete('sum(rate(model_errors_total{namespace=~"$namespace"}[5m])')],
                             tmp_path)
    assert "parse error" in broken


def test_concrete_replaces_grafana_variables():
    assert concrete('rate(x{a=~"$a",b=~"${b}"}[$__rate_interval])') == 'rate(x{a=~".*",b=~".*"}[5m])'


def promtool_evaluates(tmp_path, exprs: dict[str, str], inputs: list[tuple[str, str]],
                       expected: dict[str, list[tuple[str, float]]]) -> None:
    """`exprs` (record name -> PromQL) evaluated by `promtool test rules` on `inputs` (series, values) at 10 min: each
    record in `expected` must give exactly those (labels, value) samples."""
    rules = [{"record": name, "expr": expr} for name, expr in exprs.items()]
    (tmp_path / "rules.yml").write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]}))
    tests = [{"expr": name, "eval_time": "10m",
              "exp_samples": [{"labels": f"{name}{{{labels}}}" if labels else name, "value": v}
                              for labels, v in samples]}
             for name, samples in expected.items()]
    spec = {"rule_files": ["rules.yml"], "evaluation_interval": "1m",
            "tests": [{"interval": "1m", "input_series": [{"series": s, "values": v} for s, v in inputs],
                       "promql_expr_test": tests}]}
    (tmp_path / "test.yml").write_text(yaml.safe_dump(spec))
    run = subprocess.run(["promtool", "test", "rules", "test.yml"], cwd=tmp_path, capture_output=True, text=True,
                         timeout=60)
    assert run.returncode == 0, run.stdout + run.stderr


MODEL_LABELS = 'namespace="ns",model_name="m",model_version="1",instance_type="g5",replica="r0"'
INPUT = [  # one minute a step, ten steps: rates per second are these increments / 60
    (f"model_invocations_total{{{MODEL_LABELS}}}", "0+60x10"),
    (f'model_errors_total{{{MODEL_LABELS},status="500"}}', "0+6x10"),
    (f"model_concurrent_requests{{{MODEL_LABELS}}}", "3x10"),
    *[(f'{m}_bucket{{{MODEL_LABELS},le="{le}"}}', v) for m in ("model_latency_milliseconds", "model_ttfb_milliseconds")
      for le, v in (("100", "0+30x10"), ("1000", "0+60x10"), ("+Inf", "0+60x10"))],
    ('fleetserve_kv_tier_hits_total{tier="engine"}', "0+30x10"),
    ('fleetserve_kv_tier_hits_total{tier="l1"}', "0+30x10"),
    ('vllm:prefix_cache_hits_total{model_name="m"}', "0+400x10"),
    ('vllm:prefix_cache_queries_total{model_name="m"}', "0+800x10"),
    ('fleetserve_router_cached_tokens_total{policy="prefixaware",source="predicted"}', "0+120x10"),
    ("fleetserve_autoscaler_desired_replicas", "2x10"),
    ('fleetserve_nodes{instance_type="g5",capacity_type="spot"}', "2x10"),
    ("fleetserve_cost_per_hour_dollars", "1.5x10"),
]
EXPECTED = {  # (panel key, series index): [(labels, value)]
    ("latency", 0): [("", 100.0)],  # p50: half the observations are <= 100 ms
    ("ttfb", 0): [("", 100.0)],
    ("concurrency", 0): [('instance_type="g5"', 3.0)],
    ("errors", 0): [("", 0.1)],
    ("errors", 1): [("", 0.0)],  # no client error series at all: 0 %, where it had been "no data"
    ("throughput", 0): [('model_version="1"', 1.0)],
    ("cache_tiers", 0): [('tier="engine"', 0.25), ('tier="l1"', 0.25)],  # an even split of a 50% token hit rate
    ("cached_tokens", 0): [('source="predicted"', 2.0)],
    ("replicas", 0): [("", 2.0)],
    ("nodes", 0): [('capacity_type="spot",instance_type="g5"', 2.0)],
    ("cost", 0): [("", 1.5)],
}


@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool missing: scripts/setup.sh installs "
                                                              "prometheus from Debian as root")
def test_queries_evaluate_to_the_expected_values_with_promtool_test_rules(tmp_path):
    """Parsing is not enough: vector matching (the tier split) and histogram quantiles must also evaluate."""
    exprs = {f"dash:{p.key}:{i}": concrete(s.expr) for p in PANELS for i, s in enumerate(p.series)}
    promtool_evaluates(tmp_path, exprs, INPUT, {f"dash:{key}:{i}": samples for (key, i), samples in EXPECTED.items()})


def test_dashboard_open_url_carries_a_login_that_expires_not_the_fleet_token(tmp_path):
    """The URL carried the internal token itself (the fleet's strongest secret) into terminals and histories."""
    from fleetserve.cli.dashboard_commands import dashboard_url
    from fleetserve.observe.dashboard import LOGIN_TTL_S, valid

    token = tmp_path / "internal.token"
    assert dashboard_url("http://127.0.0.1:8000/v1", token) == "http://127.0.0.1:8000/dashboard"
    token.write_text("s3cret-token-of-the-fleet\n")
    url = dashboard_url("https://h:1/v1", token, now=1_000_000)
    assert url.startswith("https://h:1/dashboard?login=") and "s3cret" not in url
    code = url.split("login=", 1)[1]
    assert valid(code, "login", ("s3cret-token-of-the-fleet",), now=1_000_000 + LOGIN_TTL_S - 1)
    assert not valid(code, "login", ("s3cret-token-of-the-fleet",), now=1_000_000 + LOGIN_TTL_S + 1)  # expired
    assert not valid(code, "session", ("s3cret-token-of-the-fleet",), now=1_000_000)  # a login is no session
    assert not valid(code, "login", ("another-fleet",), now=1_000_000)


def test_every_metric_and_label_the_dashboards_read_is_in_the_vocabulary():
    """A renamed metric or label must not leave a panel empty: the Grafana queries and the live dashboard's
    names (observe/livedata.py) are checked against observe/vocabulary.py."""
    import inspect

    from fleetserve.observe import livedata
    from fleetserve.observe.vocabulary import BY_NAME

    def family(name: str) -> str:
        return name if name in BY_NAME else re.sub(r"_(bucket|count|sum)$", "", name)

    exprs = " ".join(check_exprs(build_dashboard()))
    read = {n for n in re.findall(r"\b(?:model|fleetserve|vllm)[a-zA-Z0-9_:]*", exprs)}
    live = set(re.findall(r'"((?:model|fleetserve|vllm)[a-zA-Z0-9_:]*)"', inspect.getsource(livedata)))
    read, live = read - set(FILTER_LABELS), live - set(FILTER_LABELS)  # label names, not metrics
    assert {"model_latency_milliseconds_bucket", "fleetserve_nodes"} <= read & live
    missing = {n for n in read | live if family(n) not in BY_NAME}
    assert not missing, missing
    for name in read | live:  # the labels a query filters or groups by exist on that metric
        labels = set(BY_NAME[family(name)].labels) | ({"le"} if name.endswith("_bucket") else set())
        if name.startswith("model_"):
            assert set(FILTER_LABELS) <= labels, (name, labels)
    for name, label in (("fleetserve_kv_tier_hits_total", "tier"), ("fleetserve_router_cached_tokens_total", "source"),
                        ("fleetserve_nodes", "instance_type"), ("fleetserve_nodes", "capacity_type"),
                        ("fleetserve_autoscaler_decisions_total", "reason"), ("vllm:prefix_cache_hits_total",
                                                                                "model_name")):
        assert label in BY_NAME[name].labels, (name, label)


def test_every_fleet_panel_follows_the_namespace_filter_and_replicas_read_kubernetes_too():
    """The KV-tier and cached-token panels mixed every endpoint whatever was picked, and the replicas panel read
    only the local supervisor's gauges, empty on Kubernetes."""
    from fleetserve.observe.grafana import PANELS

    supervisor_only = {"cost"}  # documented: the fleet supervisor's, no Kubernetes source
    for panel in PANELS:
        if panel.key in supervisor_only:
            assert "fleetserve up" in panel.description
            continue
        for series in panel.series:
            assert "$namespace" in series.expr, (panel.key, series.expr)
    replicas = next(p for p in PANELS if p.key == "replicas")
    assert [("kube_deployment_spec_replicas" in s.expr, "kube_deployment_status_replicas_available" in s.expr)
            for s in replicas.series] == [(True, False), (False, True)]


K8S_INPUT = [  # a Kubernetes namespace: no fleet supervisor, kube-state-metrics and Karpenter instead
    ('kube_deployment_spec_replicas{namespace="ns",deployment="chat-engine-t0"}', "3x10"),
    ('kube_deployment_spec_replicas{namespace="ns",deployment="chat-engine-t1"}', "2x10"),
    ('kube_deployment_spec_replicas{namespace="ns",deployment="chat-router"}', "2x10"),
    ('kube_deployment_status_replicas_available{namespace="ns",deployment="chat-engine-t0"}', "1x10"),
    ('kube_deployment_status_replicas_available{namespace="ns",deployment="chat-engine-t1"}', "1x10"),
    *[(f'karpenter_nodes_allocatable{{nodepool="{pool}",node_name="{node}",instance_type="{it}",'
       f'capacity_type="{ct}",resource_type="{res}"}}', "4x10")
      for pool, node, it, ct in (("ns-chat-t0", "n1", "g5.xlarge", "spot"), ("ns-chat-t0", "n2", "g5.xlarge", "spot"),
                                 ("ns-chat-t1", "n3", "g6.xlarge", "on-demand"),
                                 ("other-web-t0", "n4", "m5.large", "on-demand"))
      for res in ("cpu", "memory", "pods")],
]
HASHED_INPUT = [  # an endpoint name long enough to be hashed: its Deployments lost the -engine suffix
    ('kube_deployment_spec_replicas{namespace="ns",deployment="a-very-long-endpoint-name-3f2a9c1b"}', "5x10"),
    ('kube_deployment_status_replicas_available{namespace="ns",deployment="a-very-long-endpoint-name-3f2a9c1b"}',
     "5x10"),  # never matched: the routers' count (2 healthy of 3) is what the panel shows
    *[(f'fleetserve_router_backend_healthy{{namespace="ns",pod="{pod}",backend="{b}"}}', v)
      for pod in ("router-0", "router-1") for b, v in (("10.0.0.1:8000", "1x10"), ("10.0.0.2:8000", "1x10"),
                                                        ("10.0.0.3:8000", "0x10"))],
]
K8S_EXPECTED = {
    # the first tier's spec (what the autoscaler asks for: the overflow tier stands in for its pods that cannot be
    # placed, and counting its spec too read 5 desired), not the router; ready in every tier
    ("replicas", 0): [("", 3.0)],
    ("replicas", 1): [("", 2.0)],
    ("nodes", 0): [('capacity_type="spot",instance_type="g5.xlarge"', 2.0),  # one per node, not per resource
                   ('capacity_type="on-demand",instance_type="g6.xlarge"', 1.0)],  # another namespace's pool: out
}


@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool missing: scripts/setup.sh installs "
                                                              "prometheus from Debian as root")
def test_replicas_and_nodes_panels_read_kubernetes_sources_for_the_picked_namespace(tmp_path):
    """On Kubernetes the Nodes panel was empty (it read only the fleet supervisor's gauge): it counts the nodes of
    the namespace's Karpenter NodePools, named `<namespace>-<endpoint>-t<tier>` by `render k8s`."""
    from fleetserve.k8s.karpenter import nodepool_name

    ctx = type("Ctx", (), {"namespace": "ns", "name": "chat", "tier_id": lambda self, t: str(t)})()
    assert nodepool_name(ctx, 1).startswith("ns-chat-") and nodepool_name(ctx, 1).endswith("-t1")
    panels = {p.key: p for p in PANELS}
    exprs = {f"dash:{key}:{i}": concrete(panels[key].series[i].expr.replace("$namespace", "ns"))
             for key, i in K8S_EXPECTED}
    promtool_evaluates(tmp_path, exprs, K8S_INPUT,
                       {f"dash:{key}:{i}": samples for (key, i), samples in K8S_EXPECTED.items()})



@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool missing: scripts/setup.sh installs "
                                                              "prometheus from Debian as root")
def test_ready_replicas_of_hashed_deployment_names_come_from_what_the_routers_see(tmp_path):
    """Deployments of a long endpoint name are hashed and lose the -engine suffix the panel selected them by."""
    ready = next(p for p in PANELS if p.key == "replicas").series[1]
    promtool_evaluates(tmp_path, {"dash:ready": concrete(ready.expr.replace("$namespace", "ns"))}, HASHED_INPUT,
                       {"dash:ready": [("", 2)]})


@pytest.mark.parametrize("flag,value", [("--uid", ""), ("--uid", "a b/c"), ("--uid", "u" * 41), ("--title", " ")])
def test_a_uid_or_title_grafana_would_refuse_is_exit_2_naming_the_flag(flag, value):
    result = CliRunner().invoke(app, ["dashboard", "grafana", flag, value])
    assert result.exit_code == 2 and flag in result.output, result.output
    assert CliRunner().invoke(app, ["dashboard", "grafana", "--uid", "team-a_fleet1"]).exit_code == 0


@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool missing: scripts/setup.sh installs "
                                                              "prometheus from Debian as root")
def test_scaling_decision_annotations_mark_a_first_decision_of_the_picked_namespace_only(tmp_path):
    """The annotation read a fixed [1m] (under two samples at a 60 s scrape interval), had no namespace filter (every
    fleet's decisions on every view), and a reason's counter appeared at 1 on its first decision, which increase()
    never showed: the supervisor now exports every reason from 0."""
    from fleetserve.fleet.metrics import SupervisorMetrics
    from fleetserve.observe.grafana import DECISIONS

    assert "$__rate_interval" in DECISIONS and "$namespace" in DECISIONS
    metrics = SupervisorMetrics()
    for reason in ("scale up", "scale down", "activated from zero", "cooldownPeriod elapsed", "fallback"):
        assert metrics.registry.get_sample_value("fleetserve_autoscaler_decisions_total", {"reason": reason}) == 0
    expr = concrete(DECISIONS.replace("$namespace", "ns"))
    inputs = [('fleetserve_autoscaler_decisions_total{namespace="ns",reason="scale up"}', "0 0 0 0 0 0 0 0 1 1 1"),
              ('fleetserve_autoscaler_decisions_total{namespace="other",reason="scale down"}', "0 0 0 0 0 0 0 0 1 1 1"),
              ('fleetserve_autoscaler_decisions_total{namespace="ns",reason="steady"}', "0+1x10")]
    promtool_evaluates(tmp_path, {"dash:decisions": expr}, inputs, {"dash:decisions": [('reason="scale up"', 1)]})


def test_dashboard_open_says_when_no_browser_could_be_opened(tmp_path, monkeypatch):
    """With no display (or BROWSER failing) it printed the URL and exited 0 without a word that nothing opened."""
    from types import SimpleNamespace

    from typer.testing import CliRunner

    from fleetserve.cli.app import app
    from fleetserve.fleet import control

    monkeypatch.setattr(control, "pick_fleet", lambda name: SimpleNamespace(url="http://127.0.0.1:9/v1", name="f"))
    monkeypatch.setenv("FLEETSERVE_HOME", str(tmp_path))
    result = CliRunner().invoke(app, ["dashboard", "open", "f", "--browser"], env={"BROWSER": "/bin/false"})
    assert result.exit_code == 0 and "http://127.0.0.1:9/dashboard" in result.stdout
    assert "no web browser could be opened" in result.stderr
