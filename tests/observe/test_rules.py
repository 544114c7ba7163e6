"""observe/rules.py: `promtool check rules` on what the fleet and Kubernetes load, and `promtool test rules`
unit tests of the PromQL (recording rules give known values, alerts fire on known series)."""

import shutil
import subprocess

import pytest
import yaml

from fleetserve.fleet.prometheus import rule_target
from fleetserve.k8s.context import Context, RenderOptions
from fleetserve.k8s.monitoring import monitoring_objects
from fleetserve.observe.rules import LABELS, RuleTarget, rule_groups, slow_bucket
from fleetserve.spec.load import load_spec_text

needs_promtool = pytest.mark.skipif(shutil.which("promtool") is None,
                                    reason="Debian's prometheus (promtool) is not installed (scripts/setup.sh)")

SPEC = """
apiVersion: fleetserve.io/v1
kind: Endpoint
metadata: {name: chat, namespace: team-a}
spec:
  model: {name: tiny, source: builtin:smollm2-135m}
  engine: {startupTimeoutSeconds: 300}
  slo: {ttftP95Ms: 900, maxErrorRate: 0.01, costPerHourUsd: 2}
"""


def endpoint():
    return load_spec_text(SPEC).endpoint


def promtool(*args, cwd=None) -> subprocess.CompletedProcess:
    return subprocess.run(["promtool", *args], capture_output=True, text=True, cwd=cwd, timeout=120)


def k8s_prometheus_rule() -> dict:
    objects = monitoring_objects(Context.build(endpoint(), RenderOptions()), lambda *a: None)
    (rule,) = [o for o in objects if o["kind"] == "PrometheusRule"]
    return rule


def names(groups) -> set[str]:
    return {r.get("record") or r.get("alert") for g in groups for r in g["rules"]}


def test_one_source_for_the_fleet_and_kubernetes():
    local = rule_groups(rule_target(endpoint(), "chat"))
    k8s_rule = k8s_prometheus_rule()
    k8s = k8s_rule["spec"]["groups"]
    # the same records and alerts; Kubernetes adds the unschedulable tier alert, has no supervisor cost gauge
    assert names(k8s) - names(local) == {"FleetserveEngineUnschedulable"}
    assert names(local) - names(k8s) == {"FleetserveCostOverBudget"}
    assert [g["name"] for g in local] == [g["name"] for g in k8s] == ["fleetserve.team-a.chat.records",
                                                                      "fleetserve.team-a.chat.alerts"]
    for wanted in ("fleetserve:model_ttfb_milliseconds:p50", "fleetserve:model_ttfb_milliseconds:p95",
                   "fleetserve:model_latency_milliseconds:p50", "fleetserve:model_latency_milliseconds:p95",
                   "fleetserve:model_error_ratio:rate5m", "fleetserve:kv_tier_hit_ratio:rate5m",
                   "FleetserveErrorBudgetBurnFast", "FleetserveErrorBudgetBurnSlow", "FleetserveLatencyBudgetBurn",
                   "FleetserveCacheHitCollapse", "FleetserveReplicasNotReady"):
        assert wanted in names(local)


@pytest.mark.parametrize("kind, hits, queries", [
    ("builtin", "vllm:prefix_cache_hits_total", "vllm:prefix_cache_queries_total"),
    ("vllm", "vllm:prefix_cache_hits_total", "vllm:prefix_cache_queries_total"),
    ("sglang", "sglang:cached_tokens_total", "sglang:prompt_tokens_total")])
def test_cache_rules_read_the_counters_their_engine_exports(kind, hits, queries):
    """SGLang's prefix-cache ratio read vLLM's counters, and vLLM's and SGLang's KV-tier ratio the built-in
    engine's: empty records, and a cache-hit-collapse alert that could never fire."""
    text = SPEC.replace("engine: {startupTimeoutSeconds: 300}",
                        f"engine: {{kind: {kind}, gpus: {0 if kind == 'builtin' else 1}, startupTimeoutSeconds: 300}}")
    records = {r["record"]: r["expr"] for g in rule_groups(rule_target(load_spec_text(text).endpoint, "chat"))
               for r in g["rules"] if "record" in r}
    ratio = records["fleetserve:prefix_cache_hit_ratio:rate5m"]
    assert hits in ratio and queries in ratio
    assert ("fleetserve:kv_tier_hit_ratio:rate5m" in records) == (kind == "builtin")


def test_slo_shapes_the_rules():
    groups = rule_groups(rule_target(endpoint(), "chat"))
    text = yaml.safe_dump(groups)
    assert slow_bucket(900) == 1000 and 'le="1000.0"' in text  # the first bucket at or above the TTFT target
    assert "> 0.144" in text and "> 0.06" in text  # 14.4x and 6x the 1 % error budget
    assert "fleetserve_cost_per_hour_dollars" in text and "> 2" in text
    assert slow_bucket(10**9) == 120000
    no_budget = RuleTarget("ns", "m", "g", 'service="r"', desired="a", ready="b", cost_per_hour="c")
    assert "FleetserveCostOverBudget" not in names(rule_groups(no_budget))


@needs_promtool
def test_promtool_checks_both_rule_files(tmp_path):
    local = tmp_path / "local.yml"
    local.write_text(yaml.safe_dump({"groups": rule_groups(rule_target(endpoint(), "chat"))}))
    k8s_rule = k8s_prometheus_rule()
    k8s = tmp_path / "k8s.yml"
    k8s.write_text(yaml.safe_dump(k8s_rule["spec"]))
    for path in (local, k8s):
        done = promtool("check", "rules", str(path))
        assert done.returncode == 0, done.stdout + done.stderr
        assert "SUCCESS" in done.stdout


def test_rate_windows_hold_at_least_four_scrapes():
    from fleetserve.observe.rules import rate_window

    assert [rate_window("1m", s) for s in (5, 15, 30, 120)] == ["1m", "1m", "2m", "8m"]
    assert [rate_window("5m", s) for s in (15, 120, 300)] == ["5m", "8m", "20m"]
    assert rate_window("1h", 300) == "1h" and rate_window("1m", 16) == "64s"


@needs_promtool
def test_a_slow_scrape_widens_every_window_the_rules_and_triggers_read(tmp_path):
    """At a 120 s scrape the triggers and records read rate(...[1m]): never two samples, so the request-rate
    trigger read 0 under load (the fleet scaled down) and the 1 m records stayed empty."""
    import re

    from fleetserve.k8s.render import render

    text = SPEC.replace("  slo:", "  metrics: {scrapeIntervalSeconds: 120}\n  autoscaling: {maxReplicaCount: 4, "
                                  "triggers: [{metric: request_rate, target: 2}, {metric: ttft_p95, target: 900}]}\n"
                                  "  slo:")
    objects = render(load_spec_text(text).endpoint).objects
    (rule,) = [o for o in objects if o["kind"] == "PrometheusRule"]
    (scaled,) = [o for o in objects if o["kind"] == "ScaledObject"]
    queries = [t["metadata"]["query"] for t in scaled["spec"]["triggers"] if t["type"] == "prometheus"]
    local = rule_groups(rule_target(load_spec_text(text).endpoint, "chat"))
    for groups in (rule["spec"]["groups"], local):
        exprs = [r["expr"] for g in groups for r in g["rules"]]
        windows = {w for e in exprs + queries for w in re.findall(r"\[(\w+)\]", e)}
        assert windows == {"8m", "30m", "1h", "6h"}, windows  # 1m and 5m widened to four 120 s scrapes
        recorded = {r["record"] for g in groups for r in g["rules"] if "record" in r}
        assert "fleetserve:model_invocations:rate8m" in recorded  # named by the window it reads
        used = {name for e in exprs for name in re.findall(r"fleetserve:[\w:]+", e)}
        assert used <= recorded, used - recorded  # every alert reads a record that exists
        path = tmp_path / "rules.yml"
        path.write_text(yaml.safe_dump({"groups": groups}))
        done = promtool("check", "rules", str(path))
        assert done.returncode == 0, done.stdout + done.stderr


def test_kubernetes_cold_start_alerts_allow_for_a_node_an_image_and_the_model():
    """They fired after the engine's startup timeout alone, during a normal cold start on a new GPU node."""
    from fleetserve.k8s.engine import PROGRESS_ALLOWANCE_S

    local = {r["alert"]: r["for"] for g in rule_groups(rule_target(endpoint(), "chat")) for r in g["rules"]
             if "alert" in r}
    k8s = {r["alert"]: r["for"] for g in k8s_prometheus_rule()["spec"]["groups"] for r in g["rules"] if "alert" in r}
    assert local["FleetserveReplicasNotReady"] == local["FleetserveRequestsHeldAtZero"] == "300s"
    wanted = f"{300 + PROGRESS_ALLOWANCE_S}s"
    assert k8s["FleetserveReplicasNotReady"] == k8s["FleetserveRequestsHeldAtZero"] == wanted


MODEL = 'namespace="team-a",model_name="tiny",model_version="1",instance_type="g5.xlarge"'
ENDPOINT_LABELS = 'namespace="team-a",model_name="tiny",model_version="1"'
KEEP = {"namespace": "team-a", "model_name": "tiny", "model_version": "1", "instance_type": "g5.xlarge"}
ENDPOINT = {k: v for k, v in KEEP.items() if k != "instance_type"}
SUP = 'fleet="chat",component="supervisor"'
ENGINES = 'fleet="chat",component="engine"'  # the labels of the local fleet's engine targets


def _alerts(groups) -> dict[str, dict]:
    return {r["alert"]: r for g in groups for r in g["rules"] if "alert" in r}


def _fires(alerts, name, labels, eval_time) -> dict:
    rule = alerts[name]
    return {"eval_time": eval_time, "alertname": name, "exp_alerts": [
        {"exp_labels": {**labels, **rule["labels"]}, "exp_annotations": rule["annotations"]}]}


def _quiet(name, eval_time) -> dict:
    return {"eval_time": eval_time, "alertname": name, "exp_alerts": []}


@needs_promtool
def test_promtool_unit_tests_of_records_and_alerts(tmp_path):
    groups = rule_groups(rule_target(endpoint(), "chat"))
    (tmp_path / "rules.yml").write_text(yaml.safe_dump({"groups": groups}))
    alerts = _alerts(groups)
    r0 = MODEL + ',replica="r0"'
    # per minute: 600 invocations (10/s), 120 errors (2/s: ratio 0.2, 20x a 1 % budget); TTFB: 50/s under 50 ms,
    # 90/s under 100 ms, all under 250 ms of 100/s; KV tier l1: 1 hit and 3 misses a second
    healthy_then_failing = {
        "interval": "1m",
        "input_series": [
            {"series": f"model_invocations_total{{{r0}}}", "values": "0+600x420"},
            {"series": f'model_errors_total{{{r0},status="500"}}', "values": "0+120x420"},
            # a client's bad requests (20 % more of the traffic) spend no error budget
            {"series": f'model_errors_total{{{r0},status="400"}}', "values": "0+90x420"},
            {"series": f'model_errors_total{{{r0},status="404"}}', "values": "0+30x420"},
            {"series": f'model_ttfb_milliseconds_bucket{{{r0},le="50.0"}}', "values": "0+3000x420"},
            {"series": f'model_ttfb_milliseconds_bucket{{{r0},le="100.0"}}', "values": "0+5400x420"},
            {"series": f'model_ttfb_milliseconds_bucket{{{r0},le="1000.0"}}', "values": "0+6000x420"},
            {"series": f'model_ttfb_milliseconds_bucket{{{r0},le="+Inf"}}', "values": "0+6000x420"},
            {"series": f"model_ttfb_milliseconds_count{{{r0}}}", "values": "0+6000x420"},
            {"series": f'model_latency_milliseconds_bucket{{{r0},le="100.0"}}', "values": "0+3000x420"},
            {"series": f'model_latency_milliseconds_bucket{{{r0},le="250.0"}}', "values": "0+6000x420"},
            {"series": f'model_latency_milliseconds_bucket{{{r0},le="+Inf"}}', "values": "0+6000x420"},
            {"series": f"model_concurrent_requests{{{r0}}}", "values": "3x420"},
            {"series": f'fleetserve_kv_tier_hits_total{{tier="l1",replica="r0",{ENGINES}}}', "values": "0+60x420"},
            {"series": f'fleetserve_kv_tier_misses_total{{tier="l1",replica="r0",{ENGINES}}}', "values": "0+180x420"},
            {"series": f'fleetserve_kv_tier_hits_total{{tier="engine",replica="r0",{ENGINES}}}', "values": "0+180x420"},
            {"series": f'fleetserve_kv_tier_misses_total{{tier="engine",replica="r0",{ENGINES}}}',
             "values": "0+60x420"},
            # another fleet's engines on the same Prometheus: never in this endpoint's ratios
            {"series": 'fleetserve_kv_tier_hits_total{tier="l1",fleet="other",component="engine"}',
             "values": "0+6000x420"},
            # hit ratio 0.8 for an hour, then nothing hits any more
            {"series": f'vllm:prefix_cache_queries_total{{model_name="tiny",{ENGINES}}}', "values": "0+600x420"},
            {"series": f'vllm:prefix_cache_hits_total{{model_name="tiny",{ENGINES}}}', "values": "0+480x60 28800x360"},
            {"series": f"fleetserve_autoscaler_desired_replicas{{{SUP}}}", "values": "2x420"},
            {"series": f"fleetserve_autoscaler_ready_replicas{{{SUP}}}", "values": "1x420"},
            {"series": f"fleetserve_cost_per_hour_dollars{{{SUP}}}", "values": "3x420"},
        ],
        "promql_expr_test": [
            {"expr": "fleetserve:model_error_ratio:rate5m", "eval_time": "30m",
             "exp_samples": [{"labels": f"fleetserve:model_error_ratio:rate5m{{{ENDPOINT_LABELS}}}", "value": 0.2}]},
            {"expr": "fleetserve:model_invocations:rate1m", "eval_time": "30m",
             "exp_samples": [{"labels": f"fleetserve:model_invocations:rate1m{{{MODEL}}}", "value": 10}]},
            {"expr": "fleetserve:model_concurrent_requests:sum", "eval_time": "30m",
             "exp_samples": [{"labels": f"fleetserve:model_concurrent_requests:sum{{{MODEL}}}", "value": 3}]},
            {"expr": "fleetserve:model_ttfb_milliseconds:p50", "eval_time": "30m",
             "exp_samples": [{"labels": f"fleetserve:model_ttfb_milliseconds:p50{{{MODEL}}}", "value": 50}]},
            # rank 95 of 100: half-way through the 100-1000 ms bucket (90 -> 100)
            {"expr": "fleetserve:model_ttfb_milliseconds:p95", "eval_time": "30m",
             "exp_samples": [{"labels": f"fleetserve:model_ttfb_milliseconds:p95{{{MODEL}}}", "value": 550}]},
            {"expr": "fleetserve:model_latency_milliseconds:p50", "eval_time": "30m",
             "exp_samples": [{"labels": f"fleetserve:model_latency_milliseconds:p50{{{MODEL}}}", "value": 100}]},
            # nothing is slower than the 1000 ms bucket (the TTFT target 900 ms rounds up to it)
            {"expr": "fleetserve:model_ttfb_slow_ratio:rate5m", "eval_time": "30m",
             "exp_samples": [{"labels": f"fleetserve:model_ttfb_slow_ratio:rate5m{{{MODEL}}}", "value": 0}]},
            {"expr": "fleetserve:kv_tier_hit_ratio:rate5m", "eval_time": "30m",
             "exp_samples": [{"labels": 'fleetserve:kv_tier_hit_ratio:rate5m{namespace="team-a",model_name="tiny",'
                                        'tier="engine"}', "value": 0.75},
                             {"labels": 'fleetserve:kv_tier_hit_ratio:rate5m{namespace="team-a",model_name="tiny",'
                                        'tier="l1"}', "value": 0.25}]},
            {"expr": "fleetserve:prefix_cache_hit_ratio:rate5m", "eval_time": "30m",
             "exp_samples": [{"labels": 'fleetserve:prefix_cache_hit_ratio:rate5m'
                                        '{model_name="tiny",namespace="team-a"}',
                              "value": 0.8}]},
        ],
        "alert_rule_test": [
            # both windows of the fast burn are over 14.4x once an hour of errors is in
            _fires(alerts, "FleetserveErrorBudgetBurnFast", ENDPOINT, "70m"),  # per endpoint: the router's
            _fires(alerts, "FleetserveErrorBudgetBurnSlow", ENDPOINT, "70m"),  # refusals carry no instance type
            _quiet("FleetserveLatencyBudgetBurn", "70m"),
            _quiet("FleetserveCacheHitCollapse", "50m"),
            _fires(alerts, "FleetserveCacheHitCollapse", {"model_name": "tiny", "namespace": "team-a"}, "80m"),
            _quiet("FleetserveReplicasNotReady", "4m"),  # not yet longer than a cold start (300 s)
            _fires(alerts, "FleetserveReplicasNotReady", {}, "10m"),
            _fires(alerts, "FleetserveCostOverBudget", {}, "10m"),
            # no router series in this test: absent() keeps the selector's labels
            _fires(alerts, "FleetserveRouterNotScraped", {"fleet": "chat", "component": "router"}, "10m"),
        ],
    }
    # a quiet fleet: no errors, all fast, replicas ready, within budget: nothing fires
    quiet = {
        "interval": "1m",
        "input_series": [
            {"series": f"model_invocations_total{{{r0}}}", "values": "0+600x120"},
            {"series": f'model_errors_total{{{r0},status="500"}}', "values": "0x120"},
            {"series": f'model_errors_total{{{r0},status="400"}}', "values": "0+150x120"},  # 25 % bad requests
            {"series": f'model_ttfb_milliseconds_bucket{{{r0},le="1000.0"}}', "values": "0+600x120"},
            {"series": f"model_ttfb_milliseconds_count{{{r0}}}", "values": "0+600x120"},
            {"series": f"fleetserve_autoscaler_desired_replicas{{{SUP}}}", "values": "2x120"},
            {"series": f"fleetserve_autoscaler_ready_replicas{{{SUP}}}", "values": "2x120"},
            {"series": f"fleetserve_cost_per_hour_dollars{{{SUP}}}", "values": "1x120"},
            {"series": 'fleetserve_router_pending_requests{fleet="chat",component="router"}', "values": "0x120"},
        ],
        "alert_rule_test": [_quiet(name, "90m") for name in (
            "FleetserveErrorBudgetBurnFast", "FleetserveErrorBudgetBurnSlow", "FleetserveLatencyBudgetBurn",
            "FleetserveReplicasNotReady", "FleetserveCostOverBudget", "FleetserveHighErrorRate",
            "FleetserveRouterNotScraped")],
    }
    test_file = tmp_path / "rules_test.yml"
    test_file.write_text(yaml.safe_dump({"rule_files": ["rules.yml"], "evaluation_interval": "1m",
                                         "tests": [healthy_then_failing, quiet]}, sort_keys=False))
    done = promtool("test", "rules", str(test_file), cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SUCCESS" in done.stdout


def test_labels_are_the_cost_and_cause_labels():
    assert LABELS == "namespace, model_name, model_version, instance_type"


def test_every_metric_the_rules_read_is_in_the_vocabulary():
    """A renamed metric must not leave a rule reading nothing: each name in an expression is defined once in
    observe/vocabulary.py (histograms by their _bucket/_count/_sum series), or is kube-state-metrics'."""
    import re

    from fleetserve.observe.vocabulary import BY_NAME

    local = rule_groups(rule_target(endpoint(), "chat"))
    exprs = " ".join(r["expr"] for g in local + k8s_prometheus_rule()["spec"]["groups"] for r in g["rules"])
    exprs = re.sub(r'"[^"]*"', '""', exprs)  # label values are not names
    functions = {"sum", "by", "rate", "histogram_quantile", "clamp_min", "max", "and", "le", "or", "vector",
                 "on", "group_left"}
    read = {n for n in re.findall(r"[a-zA-Z_:][a-zA-Z0-9_:]*", exprs)
            if n not in functions and not n.startswith(("fleetserve:", "kube_")) and "_" in n}
    read -= set(LABELS.replace(" ", "").split(",")) | {"model_name", "fleet", "component", "service",
                                                       "owner_kind", "owner_name"}  # kube_pod_owner's
    missing = {n for n in read if n not in BY_NAME and re.sub(r"_(bucket|count|sum)$", "", n) not in BY_NAME}
    assert read and not missing, missing


def test_alerts_read_only_their_own_endpoints_recorded_series():
    """The burn, latency and cache alerts read recorded series with no selector: every endpoint's rules fired on
    every other endpoint's ratios, with its own threshold and a summary naming its own model."""
    import re

    for target in (rule_target(endpoint(), "chat"),):
        for group in rule_groups(target):
            for rule in group["rules"]:
                if "alert" not in rule:
                    continue
                for use in re.findall(r"fleetserve:[a-z_:0-9]+(\{[^}]*\})?", rule["expr"]):
                    assert use.startswith("{") and 'model_name="tiny"' in use, (rule["alert"], rule["expr"])


@needs_promtool
def test_promtool_sglang_prefix_cache_ratio_sums_its_cache_sources(tmp_path):
    """SGLang counts cached prompt tokens per cache_source (device, host, storage): the ratio sums them."""
    text = SPEC.replace("engine: {startupTimeoutSeconds: 300}", "engine: {kind: sglang, gpus: 1}")
    groups = rule_groups(rule_target(load_spec_text(text).endpoint, "chat"))
    (tmp_path / "rules.yml").write_text(yaml.safe_dump({"groups": groups}))
    case = {
        "interval": "1m",
        "input_series": [
            {"series": f'sglang:prompt_tokens_total{{model_name="tiny",{ENGINES}}}', "values": "0+1000x30"},
            {"series": f'sglang:cached_tokens_total{{model_name="tiny",cache_source="device",{ENGINES}}}',
             "values": "0+500x30"},
            {"series": f'sglang:cached_tokens_total{{model_name="tiny",cache_source="host",{ENGINES}}}',
             "values": "0+250x30"},
        ],
        "promql_expr_test": [{"expr": "fleetserve:prefix_cache_hit_ratio:rate5m", "eval_time": "20m",
                              "exp_samples": [{"labels": 'fleetserve:prefix_cache_hit_ratio:rate5m'
                                                         '{model_name="tiny",namespace="team-a"}', "value": 0.75}]}],
    }
    test_file = tmp_path / "rules_test.yml"
    test_file.write_text(yaml.safe_dump({"rule_files": ["rules.yml"], "evaluation_interval": "1m",
                                         "tests": [case]}, sort_keys=False))
    done = promtool("test", "rules", str(test_file), cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr


@needs_promtool
@pytest.mark.parametrize("names,ratio", [(("vllm:gpu_prefix_cache",), 0.5),  # vLLM V1 around 0.8-0.9 only
                                         (("vllm:prefix_cache", "vllm:gpu_prefix_cache"), 0.5)])  # both: not summed
def test_promtool_vllm_prefix_cache_ratio_reads_the_older_names_and_never_both(tmp_path, names, ratio):
    text = SPEC.replace("engine: {startupTimeoutSeconds: 300}", "engine: {kind: vllm, gpus: 1}")
    groups = rule_groups(rule_target(load_spec_text(text).endpoint, "chat"))
    (tmp_path / "rules.yml").write_text(yaml.safe_dump({"groups": groups}))
    series = []
    for name, hits in zip(names, ("0+500x30", "0+100x30")[:len(names)], strict=True):  # summed, both read 0.3
        series += [{"series": f'{name}_queries_total{{model_name="tiny",{ENGINES}}}', "values": "0+1000x30"},
                   {"series": f'{name}_hits_total{{model_name="tiny",{ENGINES}}}', "values": hits}]
    case = {
        "interval": "1m",
        "input_series": series,
        "promql_expr_test": [{"expr": "fleetserve:prefix_cache_hit_ratio:rate5m", "eval_time": "20m",
                              "exp_samples": [{"labels": 'fleetserve:prefix_cache_hit_ratio:rate5m'
                                                         '{model_name="tiny",namespace="team-a"}', "value": ratio}]}],
    }
    test_file = tmp_path / "rules_test.yml"
    test_file.write_text(yaml.safe_dump({"rule_files": ["rules.yml"], "evaluation_interval": "1m",
                                         "tests": [case]}, sort_keys=False))
    done = promtool("test", "rules", str(test_file), cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr


TIERED = SPEC.replace("  engine: {startupTimeoutSeconds: 300}\n", """  engine: {startupTimeoutSeconds: 300, gpus: 1}
  placement: {instanceTypes: [ml.g5.xlarge, ml.g6e.xlarge]}
""")


@needs_promtool
def test_promtool_kubernetes_alerts_of_a_tiered_endpoint_and_non_streamed_answers(tmp_path):
    """Two findings of one pass. (1) The first tier's pods that cannot be placed stay Pending on purpose: the overflow
    tier serves for them. Desired summed every tier's spec (3 + 2), so ReplicasNotReady fired while 3 of the 3 replicas
    asked for served. (2) SlowTimeToFirstByte read the router's raw TTFB, a non-streamed answer's whole generation:
    it fired on a fleet whose clients do not stream, at a TTFT of 100 ms."""
    ctx = Context.build(load_spec_text(TIERED).endpoint, RenderOptions())
    assert [ctx.engine_name(t) for t in range(len(ctx.tiers))] == ["chat-engine-t0", "chat-engine-t1"]
    (rule,) = [o for o in monitoring_objects(ctx, lambda *a: None) if o["kind"] == "PrometheusRule"]
    groups = rule["spec"]["groups"]
    (tmp_path / "rules.yml").write_text(yaml.safe_dump({"groups": groups}))
    alerts = _alerts(groups)
    router = 'namespace="team-a",service="chat-router"'

    def deployment(metric, name, values):
        return {"series": f'{metric}{{namespace="team-a",deployment="{name}"}}', "values": values}

    def ttfb(name, le, values):
        return {"series": f'{name}_bucket{{{router},le="{le}"}}', "values": values}

    overflow_serving = {
        "interval": "1m",
        "input_series": [
            deployment("kube_deployment_spec_replicas", "chat-engine-t0", "3x60"),
            deployment("kube_deployment_status_replicas_available", "chat-engine-t0", "1x60"),
            deployment("kube_deployment_spec_replicas", "chat-engine-t1", "2x60"),
            deployment("kube_deployment_status_replicas_available", "chat-engine-t1", "2x60"),
            # non-streamed answers: raw TTFB all over 2.5 s; no streamed answer at all
            ttfb("fleetserve_router_ttfb_milliseconds", "1000.0", "0x60"),
            ttfb("fleetserve_router_ttfb_milliseconds", "5000.0", "0+600x60"),
            ttfb("fleetserve_router_ttfb_milliseconds", "+Inf", "0+600x60"),
        ],
        "alert_rule_test": [_quiet("FleetserveReplicasNotReady", "30m"),
                            _quiet("FleetserveSlowTimeToFirstByte", "30m")],
    }
    short = {
        "interval": "1m",
        "input_series": [
            deployment("kube_deployment_spec_replicas", "chat-engine-t0", "3x60"),
            deployment("kube_deployment_status_replicas_available", "chat-engine-t0", "1x60"),
            deployment("kube_deployment_spec_replicas", "chat-engine-t1", "2x60"),
            deployment("kube_deployment_status_replicas_available", "chat-engine-t1", "1x60"),
            ttfb("fleetserve_router_served_ttfb_milliseconds", "1000.0", "0x60"),
            ttfb("fleetserve_router_served_ttfb_milliseconds", "5000.0", "0+600x60"),
            ttfb("fleetserve_router_served_ttfb_milliseconds", "+Inf", "0+600x60"),
        ],
        "alert_rule_test": [_fires(alerts, "FleetserveReplicasNotReady", {}, "30m"),
                            _fires(alerts, "FleetserveSlowTimeToFirstByte", {}, "30m")],
    }
    test_file = tmp_path / "rules_test.yml"
    test_file.write_text(yaml.safe_dump({"rule_files": ["rules.yml"], "evaluation_interval": "1m",
                                         "tests": [overflow_serving, short]}, sort_keys=False))
    done = promtool("test", "rules", str(test_file), cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr


def test_every_alert_names_its_endpoint_in_its_labels():
    """Alerts summed over the endpoint carried `severity` only: two endpoints' FleetserveReplicasNotReady were one
    label set in Alertmanager, merged, and could not be routed by namespace."""
    for groups in (rule_groups(rule_target(endpoint(), "chat")), k8s_prometheus_rule()["spec"]["groups"]):
        alerts = [r for g in groups for r in g["rules"] if "alert" in r]
        assert alerts and all(set(a["labels"]) == {"severity", "namespace", "model_name"} for a in alerts)
        assert {a["labels"]["namespace"] for a in alerts} == {alerts[0]["labels"]["namespace"]}
