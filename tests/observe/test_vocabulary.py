"""The one metrics vocabulary: every server builds from it, docs/metrics.md is generated from it."""

from __future__ import annotations

import re
from pathlib import Path
from types import SimpleNamespace

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from fleetserve.kvcache.tiers import Latency
from fleetserve.observe import vocabulary as v
from fleetserve.observe.docs import DOC_PATH, REGENERATE, render_metrics_md
from fleetserve.observe.metrics import (
    EngineMetrics,
    ModelIdentity,
    PrefixCacheCollector,
    RouterMetrics,
    SimEngineMetrics,
)

ROOT = Path(__file__).resolve().parents[2]
FORBIDDEN_LABELS = {"prompt", "text", "completion", "content", "message", "user", "api_key", "key"}


def test_docs_metrics_md_is_generated_from_the_vocabulary():
    committed = (ROOT / DOC_PATH).read_text() if (ROOT / DOC_PATH).exists() else ""
    assert committed == render_metrics_md(), f"docs/metrics.md is stale; regenerate it with: {REGENERATE}"


def test_names_are_unique_and_every_label_is_documented_and_bounded():
    assert len(v.BY_NAME) == len(v.METRICS)
    for m in v.METRICS:
        assert m.group in v.GROUPS, m.name
        assert (m.kind == "counter") == m.name.endswith("_total"), m.name
        assert (m.kind == "histogram") == (m.buckets is not None), m.name
        assert m.emitted_by, m.name
        for label in m.labels:
            assert label in v.LABELS, f"{m.name}: label {label!r} has no documented bound in vocabulary.LABELS"
            assert label not in FORBIDDEN_LABELS, f"{m.name}: label {label!r} could carry request text"
    model = [m for m in v.METRICS if m.group == "model"]
    assert {m.name for m in model} == {"model_invocations_total", "model_errors_total", "model_concurrent_requests",
                                       "model_latency_milliseconds", "model_ttfb_milliseconds"}
    assert all(set(v.MODEL_LABELS) <= set(m.labels) for m in model)
    assert {"namespace", "model_version", "instance_type"} <= set(v.MODEL_LABELS)
    for group in v.GROUPS:
        assert any(m.group == group for m in v.METRICS), group


def _exposed(registry: CollectorRegistry) -> tuple[str, dict]:
    text = generate_latest(registry).decode()
    return text, {f.name: f for f in text_string_to_metric_families(text)}


def _check_against_vocabulary(registry: CollectorRegistry) -> set[str]:
    """Every family in the registry is in the vocabulary with the same type and labels; no _created."""
    text, families = _exposed(registry)
    assert "_created" not in text
    names = set()
    for name, fam in families.items():
        m = v.by_name(name + "_total" if fam.type == "counter" else name)
        assert fam.type == m.kind, name
        for s in fam.samples:
            assert set(s.labels) - {"le"} <= set(m.labels) | {"status"}, (name, s.labels)
        names.add(m.name)
    return names


def test_engine_router_and_sim_collectors_are_the_vocabulary():
    e = EngineMetrics(ModelIdentity("ns", "m", "2", "g5.xlarge", "r3"))
    e.model(e.invocations).inc()
    e.error(503)
    e.model(e.latency_ms).observe(12)
    e.model(e.ttfb_ms).observe(3)
    e.model(e.concurrent).set(1)
    for metric in (e.running, e.waiting):
        e.vllm(metric).set(1)
    for metric in (e.prompt_tokens, e.generation_tokens):
        e.vllm(metric).inc()
    e.vllm(e.ttft_s).observe(0.1)
    e.vllm(e.e2e_s).observe(0.2)
    names = _check_against_vocabulary(e.registry)
    assert {"model_invocations_total", "model_errors_total", "model_latency_milliseconds",
            "vllm:num_requests_running", "vllm:e2e_request_latency_seconds"} <= names
    text = generate_latest(e.registry).decode()
    assert 'model_invocations_total{instance_type="g5.xlarge",model_name="m",model_version="2",namespace="ns",' \
           'replica="r3"} 1.0' in text

    r = RouterMetrics()
    r.requests.labels("/v1/completions", "200").inc()
    r.tenant_requests.labels("alpha", "200").inc()
    r.retries.labels("unreachable").inc()
    r.decisions.labels("prefixaware", "hit").inc()
    r.ejections.labels("b0", "breaker").inc()
    r.cached_tokens.labels("prefixaware", "predicted").inc(5)
    r.ttfb_ms.observe(1)
    r.healthy.labels("b0").set(1)
    names = _check_against_vocabulary(r.registry)
    assert {"fleetserve_router_routing_decisions_total", "fleetserve_router_ejections_total",
            "fleetserve_router_pending_requests", "fleetserve_router_cached_tokens_total"} <= names

    s = SimEngineMetrics()
    s.running.labels(model_name="sim").set(1)
    s.queries.labels(model_name="sim").inc(4)
    s.config.labels("16", "100").set(1)
    names = _check_against_vocabulary(s.registry)
    assert {"vllm:num_requests_running", "vllm:prefix_cache_queries_total", "vllm:cache_config_info"} <= names


def test_supervisor_metrics_are_the_vocabulary():
    from fleetserve.fleet.metrics import SupervisorMetrics

    m = SupervisorMetrics()
    m.decisions.labels("scale_up").inc()
    m.nodes.labels("g5.xlarge", "spot").inc()
    m.cold_start.observe(3)
    names = _check_against_vocabulary(m.registry)
    assert {"fleetserve_autoscaler_desired_replicas", "fleetserve_autoscaler_decisions_total",
            "fleetserve_cost_per_hour_dollars", "fleetserve_cost_dollars", "fleetserve_nodes"} <= names


def test_prefix_cache_collector_exports_each_family_once_with_a_sample_per_tier():
    def store(name, hits):
        get, put = Latency(), Latency()
        for seconds in (0.002, 0.02):
            get.observe(seconds)
        put.observe(0.5)
        stats = SimpleNamespace(misses=1, evictions=2, bytes_in=3, bytes_out=4, failures=0, rejected=0,
                                get_seconds=get, put_seconds=put)
        return SimpleNamespace(name=name, stats=stats)

    cache = SimpleNamespace(block_shape=(2, 1, 1, 16, 8), queries=10, query_tokens=175,
                            hits={"engine": 3, "l1": 2, "l2": 1}, engine_misses=7, _blocks=[1, 2], engine_blocks=8,
                            engine_evictions=5, dropped_blocks=6, write_bytes=1024,
                            l1=store("l1", 2), l2=store("l2", 1),
                            tenant_l2={"acme": store("l2", 0)})
    cache.l1.used_bytes, cache.l1.max_bytes = 300, 1000
    reg = CollectorRegistry()
    reg.register(PrefixCacheCollector(cache, "m"))
    text = generate_latest(reg).decode()
    assert len(re.findall(r"^# TYPE fleetserve_kv_tier_misses_total counter", text, re.M)) == 1
    names = _check_against_vocabulary(reg)
    assert {"fleetserve_kv_tier_get_seconds", "fleetserve_kv_tier_evictions_total",
            "vllm:prefix_cache_hits_total"} <= names
    families = {f.name: f for f in text_string_to_metric_families(text)}
    tiers = {s.labels["tier"] for s in families["fleetserve_kv_tier_misses"].samples}
    assert tiers == {"engine", "l1", "l2", "l2:acme"}  # the engine tier's too, or its ratio is never recorded
    evictions = {s.labels["tier"]: s.value for s in families["fleetserve_kv_tier_evictions"].samples}
    assert evictions == {"engine": 5, "l1": 2, "l2": 2, "l2:acme": 2}  # the engine tier's had no series
    assert families["fleetserve_kv_writes_dropped_blocks"].samples[0].value == 6
    assert families["fleetserve_kv_write_queue_bytes"].samples[0].value == 1024
    # how full L1 is: it had to be worked out from bytes in, the block size and evictions (found in a black-box pass)
    assert [(s.labels["tier"], s.value) for s in families["fleetserve_kv_tier_used_bytes"].samples] == [("l1", 300)]
    assert families["fleetserve_kv_tier_capacity_bytes"].samples[0].value == 1000
    assert families["vllm:prefix_cache_queries"].samples[0].value == 175  # every prompt token, as vLLM counts
    get = {s.labels["le"]: s.value for s in families["fleetserve_kv_tier_get_seconds"].samples
           if s.name.endswith("_bucket") and s.labels["tier"] == "l1"}
    assert get["0.005"] == 1 and get["0.025"] == 2 and get["+Inf"] == 2


def test_no_server_declares_a_metric_outside_the_vocabulary():
    """Counter/Gauge/Histogram(...) and *MetricFamily(...) with a literal name belong in vocabulary.py only."""
    pattern = re.compile(r"\b(Counter|Gauge|Histogram|Summary|CounterMetricFamily|GaugeMetricFamily|"
                         r"HistogramMetricFamily)\(\s*[\"']")
    offenders = []
    for path in (ROOT / "src" / "fleetserve").rglob("*.py"):
        if path.name == "vocabulary.py":
            continue
        for n, line in enumerate(path.read_text().splitlines(), 1):
            if pattern.search(line):
                offenders.append(f"{path.relative_to(ROOT)}:{n}: {line.strip()}")
    assert not offenders, "define these in src/fleetserve/observe/vocabulary.py:\n" + "\n".join(offenders)


def test_autoscaler_decision_reasons_are_a_bounded_set():
    from fleetserve.observe.vocabulary import DECISION_REASONS, decision_reason

    assert decision_reason("scale up 1 -> 3: queue 12 > 4") == "scale up"
    assert decision_reason("no activity for 345s >= cooldownPeriod 300s") == "cooldownPeriod elapsed"
    assert decision_reason("activated from zero: 2 request(s) waiting") == "activated from zero"
    assert decision_reason("steady at 2: ok (wants 3, held by stabilization window)") == "steady"
    assert decision_reason("something new") == "other"
    assert len({label for _, label in DECISION_REASONS}) == len(DECISION_REASONS)


def test_the_docs_command_writes_what_the_test_compares(tmp_path):
    from typer.testing import CliRunner

    from fleetserve.cli.app import app

    out = tmp_path / "metrics.md"
    result = CliRunner().invoke(app, ["docs", "metrics", "-o", str(out)])
    assert result.exit_code == 0, result.output
    assert out.read_text() == render_metrics_md()


def test_a_tier_the_engine_does_not_have_has_no_hit_series():
    """An engine without L2 exported fleetserve_kv_tier_hits_total{tier="l2"} 0: the tier panels drew an "l2 0%"
    line for a tier that did not exist."""
    stats = SimpleNamespace(misses=1, evictions=0, bytes_in=0, bytes_out=0, failures=0, rejected=0,
                            get_seconds=Latency(), put_seconds=Latency())
    cache = SimpleNamespace(block_shape=(2, 1, 1, 16, 8), queries=1, query_tokens=16,
                            hits={"engine": 3, "l1": 2, "l2": 0}, engine_misses=1, _blocks=[], engine_blocks=8,
                            engine_evictions=0, dropped_blocks=0, write_bytes=0,
                            l1=SimpleNamespace(name="l1", stats=stats, used_bytes=0, max_bytes=1024), l2=None,
                            tenant_l2={})
    reg = CollectorRegistry()
    reg.register(PrefixCacheCollector(cache, "m"))
    families = {f.name: f for f in text_string_to_metric_families(generate_latest(reg).decode())}
    assert {s.labels["tier"] for s in families["fleetserve_kv_tier_hits"].samples} == {"engine", "l1"}


def test_tier_latency_histograms_never_go_backwards():
    """The histograms were built from a window of the last 512-1,024 operations: their count read 200, 400, ...,
    1000 and then 688, a counter reset to Prometheus every ~512 operations, so rate() and quantiles were wrong."""
    from fleetserve.kvcache.tiers import TierStats

    stats = TierStats()
    cache = SimpleNamespace(block_shape=(2, 1, 1, 16, 8), queries=1, query_tokens=16, hits={"engine": 0, "l1": 0},
                            engine_misses=1, _blocks=[], engine_blocks=8, engine_evictions=0, dropped_blocks=0,
                            write_bytes=0, l1=SimpleNamespace(name="l1", stats=stats, used_bytes=0, max_bytes=1024),
                            l2=None, tenant_l2={})
    reg = CollectorRegistry()
    reg.register(PrefixCacheCollector(cache, "m"))
    counts = []
    for i in range(1, 2501):
        stats.timing("get", 0.002 if i % 2 else 0.3)
        if i % 250 == 0:
            families = {f.name: f for f in text_string_to_metric_families(generate_latest(reg).decode())}
            samples = {(s.name, s.labels.get("le")): s.value for s in families["fleetserve_kv_tier_get_seconds"].samples
                       if s.labels["tier"] == "l1"}
            counts.append(samples[("fleetserve_kv_tier_get_seconds_count", None)])
            assert samples[("fleetserve_kv_tier_get_seconds_bucket", "0.005")] == (i + 1) // 2
            assert samples[("fleetserve_kv_tier_get_seconds_bucket", "+Inf")] == i
    assert counts == [float(n) for n in range(250, 2501, 250)]


def test_every_reason_the_router_counts_is_documented():
    """`refused_router` was exported as a retry reason and missing from the documented values."""
    from fleetserve.observe.metrics import EJECTION_REASONS, RETRY_REASONS

    said = v.LABELS["reason"]
    assert [r for r in (*RETRY_REASONS, *EJECTION_REASONS) if r not in said] == []


def test_a_fresh_engine_exports_every_request_series_at_zero():
    """A new replica's first request was lost to rate() (its series appeared with it), and an idle replica was
    missing from the concurrency panel."""
    metrics = EngineMetrics(ModelIdentity("team", "tiny", "1", "local", "r0"))
    text = generate_latest(metrics.registry).decode()
    samples = {s.name: s.value for f in text_string_to_metric_families(text) for s in f.samples}
    for name in ("model_invocations_total", "model_concurrent_requests", "model_latency_milliseconds_count",
                 "model_ttfb_milliseconds_count", "vllm:prompt_tokens_total", "vllm:generation_tokens_total",
                 "vllm:time_to_first_token_seconds_count", "vllm:e2e_request_latency_seconds_count"):
        assert samples.get(name) == 0, name


def test_a_node_kind_once_seen_reads_0_at_zero_nodes():
    """At zero nodes `fleetserve_nodes` vanished: a gap in the panel (the built-in dashboard read 0)."""
    from types import SimpleNamespace

    from fleetserve.fleet.metrics import SupervisorMetrics

    def nodes(m) -> dict:
        return {(s.labels["instance_type"], s.labels["capacity_type"]): s.value for f in m.registry.collect()
                for s in f.samples if s.name == "fleetserve_nodes"}

    m = SupervisorMetrics()
    state = SimpleNamespace(desired=2, ready=2, cost_per_hour=1.0, cost_total=0.1, nodes=[
        SimpleNamespace(instance_type="g5.xlarge", capacity_type="spot")] * 2)
    m.update(state)
    assert nodes(m) == {("g5.xlarge", "spot"): 2.0}
    m.update(SimpleNamespace(desired=0, ready=0, cost_per_hour=0.0, cost_total=0.1, nodes=[
        SimpleNamespace(instance_type="g6e.xlarge", capacity_type="on-demand")]))
    assert nodes(m) == {("g5.xlarge", "spot"): 0.0, ("g6e.xlarge", "on-demand"): 1.0}
    m.update(SimpleNamespace(desired=0, ready=0, cost_per_hour=0.0, cost_total=0.1, nodes=[]))
    assert set(nodes(m).values()) == {0.0}
