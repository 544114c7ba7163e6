"""Metric definitions in one place, so names and labels stay consistent across servers.

Label design from day one (the third pitfall): every model metric carries namespace, model_name,
model_version, instance_type and replica, which separate cost and cause in any dashboard.
"""

from __future__ import annotations

from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

MODEL_LABELS = ("namespace", "model_name", "model_version", "instance_type", "replica")
LATENCY_BUCKETS_MS = (5, 10, 25, 50, 100, 250, 500, 1000, 2500, 5000, 10000, 30000, 60000, 120000)
SECONDS_BUCKETS = tuple(b / 1000 for b in LATENCY_BUCKETS_MS)


@dataclass(frozen=True)
class ModelIdentity:
    namespace: str = "default"
    model_name: str = "model"
    model_version: str = "1"
    instance_type: str = "local"
    replica: str = "r0"

    def labels(self) -> dict[str, str]:
        return {name: getattr(self, name) for name in MODEL_LABELS}


class EngineMetrics:
    """Per-replica engine metrics; gauges of the scheduler are sampled at scrape time."""

    def __init__(self, identity: ModelIdentity, registry: CollectorRegistry | None = None):
        self.registry = registry or CollectorRegistry()
        self.identity = identity
        r, labels = self.registry, list(MODEL_LABELS)
        vllm_labels = ["model_name"]
        self.invocations = Counter("model_invocations", "Model invocations", labels, registry=r)
        self.errors = Counter("model_errors", "Model invocations that failed", labels + ["status"], registry=r)
        self.concurrent = Gauge("model_concurrent_requests", "Requests in flight", labels, registry=r)
        self.latency_ms = Histogram("model_latency_milliseconds", "End-to-end latency", labels,
                                    buckets=LATENCY_BUCKETS_MS, registry=r)
        self.ttfb_ms = Histogram("model_ttfb_milliseconds", "Time to first byte (token)", labels,
                                 buckets=LATENCY_BUCKETS_MS, registry=r)
        self.running = Gauge("vllm:num_requests_running", "Requests in the running batch", vllm_labels, registry=r)
        self.waiting = Gauge("vllm:num_requests_waiting", "Requests waiting to run", vllm_labels, registry=r)
        self.prompt_tokens = Counter("vllm:prompt_tokens", "Prompt tokens processed", vllm_labels, registry=r)
        self.generation_tokens = Counter("vllm:generation_tokens", "Tokens generated", vllm_labels, registry=r)
        self.ttft_s = Histogram("vllm:time_to_first_token_seconds", "Time to first token", vllm_labels,
                                buckets=SECONDS_BUCKETS, registry=r)
        self.e2e_s = Histogram("vllm:e2e_request_latency_seconds", "End-to-end request latency", vllm_labels,
                               buckets=SECONDS_BUCKETS, registry=r)
        self._labels = identity.labels()
        self._vllm = {"model_name": identity.model_name}

    def model(self, metric):
        return metric.labels(**self._labels)

    def vllm(self, metric):
        return metric.labels(**self._vllm)

    def error(self, status: int) -> None:
        self.errors.labels(**self._labels, status=str(status)).inc()


def exposition(registry: CollectorRegistry) -> tuple[bytes, str]:
    return generate_latest(registry), CONTENT_TYPE_LATEST


class PrefixCacheCollector:
    """vLLM's prefix-cache counters and fleetserve's per-tier ones, read from the cache at scrape time."""

    def __init__(self, cache, model_name: str):
        self.cache = cache
        self.model_name = model_name

    def collect(self):
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily

        c = self.cache
        block = c.block_shape[3]
        queries = CounterMetricFamily("vllm:prefix_cache_queries", "Prompt tokens looked up", labels=["model_name"])
        queries.add_metric([self.model_name], c.queries * block)
        hits = CounterMetricFamily("vllm:prefix_cache_hits", "Prompt tokens found cached", labels=["model_name"])
        hits.add_metric([self.model_name], sum(c.hits.values()) * block)
        yield queries
        yield hits
        usage = GaugeMetricFamily("vllm:kv_cache_usage_perc", "Engine KV working set used (0-1)",
                                  labels=["model_name"])
        usage.add_metric([self.model_name], len(c._blocks) / max(c.engine_blocks, 1))
        yield usage
        tier_hits = CounterMetricFamily("fleetserve_kv_tier_hits", "Blocks found per tier", labels=["tier"])
        for tier, n in c.hits.items():
            tier_hits.add_metric([tier], n)
        yield tier_hits
        stores = [(s.name, s) for s in (c.l1, c.l2) if s is not None]
        stores += [(f"l2:{tenant}", s) for tenant, s in c.tenant_l2.items()]
        for tier, store in stores:
            st = store.stats
            for name, value in (("misses", st.misses), ("evictions", st.evictions), ("bytes_in", st.bytes_in),
                                ("bytes_out", st.bytes_out), ("failures", st.failures),
                                ("rejected", st.rejected)):
                fam = CounterMetricFamily(f"fleetserve_kv_tier_{name}", f"Tier {name}", labels=["tier"])
                fam.add_metric([tier], value)
                yield fam
            for kind, samples in (("get", st.get_seconds), ("put", st.put_seconds)):
                buckets = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0)
                counts = [sum(1 for x in samples if x <= b) for b in buckets]
                hist = HistogramMetricFamily(f"fleetserve_kv_tier_{kind}_seconds",
                                             f"Tier {kind} latency (recent operations)", labels=["tier"])
                hist.add_metric([tier], [(str(b), n) for b, n in zip(buckets, counts, strict=True)]
                                + [("+Inf", len(samples))], sum_value=sum(samples))
                yield hist
