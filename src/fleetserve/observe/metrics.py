"""The servers' collectors, each built from the one vocabulary (fleetserve.observe.vocabulary).

Label design from day one (the third pitfall): every model metric carries namespace, model_name,
model_version, instance_type and replica, which separate cost and cause in any dashboard.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from fleetserve.api.protocol import GENERATION_PATHS
from fleetserve.observe import vocabulary as v
from fleetserve.observe.vocabulary import LATENCY_BUCKETS_MS, MODEL_LABELS, SECONDS_BUCKETS
from fleetserve.router.invocations import INVOCATIONS_PATH

__all__ = ["LATENCY_BUCKETS_MS", "MODEL_LABELS", "SECONDS_BUCKETS", "EngineMetrics", "ModelIdentity",
           "PrefixCacheCollector", "RouterMetrics", "SimEngineMetrics", "exposition"]


PRESET_ERROR_STATUSES = ("429", "500", "502", "503", "504")  # model_errors_total series made at 0 at start
# fleetserve_router_retries_total's reasons (router/dispatch.py), made at 0 at start: the series did not exist until
# the first retry, so rate() missed an incident's first burst and a panel over it read "no data"
RETRY_REASONS = ("unreachable", "dropped", "stalled", "busy", "refused_router", "status_502", "status_503",
                 "status_504", "timeout_not_retried", "dropped_not_retried")
EJECTION_REASONS = ("breaker", "unreachable")


@dataclass(frozen=True)
class ModelIdentity:
    namespace: str = "default"
    model_name: str = "model"
    model_version: str = "1"
    instance_type: str = "local"
    replica: str = "r0"

    def labels(self) -> dict[str, str]:
        return {name: getattr(self, name) for name in MODEL_LABELS}


def start_model_series(m, labels: dict[str, str]) -> None:
    """A replica's model_* series at 0 from its start (`m`: an engine's metrics, built-in or simulated). rate()
    reads a counter's first sample as its start, so the first burst of a status that appeared mid-run (an
    incident's beginning) was lost to every panel and alert, a new replica's first request too, and an idle
    replica was missing from the concurrency panel."""
    for metric in (m.invocations, m.concurrent, m.latency_ms, m.ttfb_ms):
        metric.labels(**labels)
    for status in PRESET_ERROR_STATUSES:
        m.errors.labels(**labels, status=status)


class EngineMetrics:
    """Per-replica engine metrics; gauges of the scheduler are sampled at scrape time."""

    def __init__(self, identity: ModelIdentity, registry: CollectorRegistry | None = None):
        self.registry = r = registry or CollectorRegistry()
        self.identity = identity
        self.invocations = v.MODEL_INVOCATIONS.make(r)
        self.errors = v.MODEL_ERRORS.make(r)
        self.concurrent = v.MODEL_CONCURRENT.make(r)
        self.latency_ms = v.MODEL_LATENCY.make(r)
        self.ttfb_ms = v.MODEL_TTFB.make(r)
        self.running = v.VLLM_RUNNING.make(r)
        self.waiting = v.VLLM_WAITING.make(r)
        self.prompt_tokens = v.VLLM_PROMPT_TOKENS.make(r)
        self.generation_tokens = v.VLLM_GENERATION_TOKENS.make(r)
        self.ttft_s = v.VLLM_TTFT.make(r)
        self.e2e_s = v.VLLM_E2E.make(r)
        self._labels = identity.labels()
        self._vllm = {"model_name": identity.model_name}
        start_model_series(self, self._labels)
        for metric in (self.prompt_tokens, self.generation_tokens, self.ttft_s, self.e2e_s):
            self.vllm(metric)

    def model(self, metric):
        return metric.labels(**self._labels)

    def vllm(self, metric):
        return metric.labels(**self._vllm)

    def error(self, status: int) -> None:
        self.errors.labels(**self._labels, status=str(status)).inc()


class SimEngineMetrics:
    """The simulated engine's metrics: HyperPod's model_* ones, and vLLM's names (legacy ones included)."""

    def __init__(self, registry: CollectorRegistry | None = None):
        self.registry = r = registry or CollectorRegistry()
        self.invocations = v.MODEL_INVOCATIONS.make(r)
        self.errors = v.MODEL_ERRORS.make(r)
        self.concurrent = v.MODEL_CONCURRENT.make(r)
        self.latency_ms = v.MODEL_LATENCY.make(r)
        self.ttfb_ms = v.MODEL_TTFB.make(r)
        self.running = v.VLLM_RUNNING.make(r)
        self.waiting = v.VLLM_WAITING.make(r)
        self.usage = v.VLLM_KV_USAGE.make(r)
        self.usage_legacy = v.VLLM_GPU_CACHE_USAGE.make(r)
        self.queries = v.VLLM_PREFIX_QUERIES.make(r)
        self.hits = v.VLLM_PREFIX_HITS.make(r)
        self.gpu_queries = v.VLLM_GPU_PREFIX_QUERIES.make(r)
        self.gpu_hits = v.VLLM_GPU_PREFIX_HITS.make(r)
        self.ttft = v.VLLM_TTFT.make(r)
        self.busy = v.SIM_BUSY.make(r)
        self.config = v.VLLM_CACHE_CONFIG.make(r)


class RouterMetrics:
    """The gateway's metrics. `tenant` labels come from the API key file only (bounded); the router's /metrics
    is admin-only while keys are on."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = r = registry or CollectorRegistry()
        self.requests = v.ROUTER_REQUESTS.make(r)
        self.received = v.ROUTER_REQUESTS_RECEIVED.make(r)
        self.tenant_requests = v.ROUTER_TENANT_REQUESTS.make(r)
        self.retries = v.ROUTER_RETRIES.make(r)
        for reason in RETRY_REASONS:  # at 0 from the start, as model_errors_total: rate() sees a first burst
            self.retries.labels(reason)
        for path in sorted(GENERATION_PATHS):  # the model paths' counts too: an outage's first 502s, and the
            child(self.received, path)  # request_rate trigger's first burst, had been lost to rate()
            for code in ("200", *PRESET_ERROR_STATUSES):
                child(self.requests, path, code)
        child(self.received, INVOCATIONS_PATH)  # SageMaker's path arrives as itself (then answered as its route)
        self.decisions = v.ROUTER_DECISIONS.make(r)
        self.routed = v.ROUTER_REQUESTS_ROUTED.make(r)
        self.ejections = v.ROUTER_EJECTIONS.make(r)
        self.healthy = v.ROUTER_BACKEND_HEALTHY.make(r)
        self.in_flight = v.ROUTER_BACKEND_IN_FLIGHT.make(r)
        self.ttfb_ms = v.ROUTER_TTFB.make(r)
        self.served_ttfb_ms = v.ROUTER_SERVED_TTFB.make(r)
        self.kv_subscriptions = v.ROUTER_KV_SUBSCRIPTIONS.make(r)
        self.index_blocks = v.ROUTER_INDEX_BLOCKS.make(r)
        self.queued = v.ROUTER_QUEUED.make(r)
        self.pending = v.ROUTER_PENDING.make(r)
        self.buffer_wait_s = v.ROUTER_BUFFER_WAIT.make(r)
        self.latency_ms = v.ROUTER_LATENCY.make(r)
        self.cached_tokens = v.ROUTER_CACHED_TOKENS.make(r)
        self.backend_cached_tokens = v.ROUTER_BACKEND_CACHED_TOKENS.make(r)
        self.backend_prompt_tokens = v.ROUTER_BACKEND_PROMPT_TOKENS.make(r)
        self.backend_cache_horizon = v.ROUTER_BACKEND_CACHE_HORIZON.make(r)
        self.backend_engine_hit_rate = v.ROUTER_BACKEND_ENGINE_HIT_RATE.make(r)


def child(metric, *labels: str):
    """`metric.labels(*labels)`, remembered on the metric: `labels()` takes a lock and builds a key on every
    call, which at thousands of requests a second is a measurable share of the gateway's CPU."""
    cache = metric.__dict__.get("_fleetserve_children")
    if cache is None:
        cache = metric._fleetserve_children = {}
    found = cache.get(labels)
    if found is None:
        found = cache[labels] = metric.labels(*labels)
    return found


def clear(metric) -> None:
    """Drop every labelled series of `metric` (and the children `child` remembered)."""
    metric.clear()
    metric.__dict__.pop("_fleetserve_children", None)


def forget(metric, position: int, values) -> None:
    """Remove the series of `metric` made through `child` whose label at `position` is one of `values` (a replica
    that left: router/departed.py)."""
    cache = metric.__dict__.get("_fleetserve_children")
    if not cache or not values:
        return
    for labels in [k for k in cache if k[position] in values]:
        with contextlib.suppress(KeyError):
            metric.remove(*labels)
        del cache[labels]


def exposition(registry: CollectorRegistry) -> tuple[bytes, str]:
    return generate_latest(registry), CONTENT_TYPE_LATEST


_TIER_COUNTERS = (("evictions", v.KV_TIER_EVICTIONS),
                  ("bytes_in", v.KV_TIER_BYTES_IN), ("bytes_out", v.KV_TIER_BYTES_OUT),
                  ("failures", v.KV_TIER_FAILURES), ("rejected", v.KV_TIER_REJECTED))


class PrefixCacheCollector:
    """vLLM's prefix-cache counters and fleetserve's per-tier ones, read from the cache at scrape time.

    One family per metric with one sample per tier (a family repeated per tier is invalid exposition)."""

    def __init__(self, cache, model_name: str):
        self.cache = cache
        self.model_name = model_name

    def collect(self):
        c = self.cache
        block = c.block_shape[3]
        queries = v.VLLM_PREFIX_QUERIES.family()
        # every prompt token, as vLLM counts them: counting only the whole blocks that could be reused read
        # 1.0 where vLLM's definition gives 0.9 (5 x 512 tokens of 572-token prompts)
        queries.add_metric([self.model_name], c.query_tokens)
        hits = v.VLLM_PREFIX_HITS.family()
        hits.add_metric([self.model_name], sum(c.hits.values()) * block)
        usage = v.VLLM_KV_USAGE.family()
        usage.add_metric([self.model_name], len(c._blocks) / max(c.engine_blocks, 1))
        yield from (queries, hits, usage)
        engine_evictions = v.KV_TIER_EVICTIONS.family()
        engine_evictions.add_metric(["engine"], c.engine_evictions)
        stores = [(s.name, s) for s in (c.l1, c.l2) if s is not None]
        stores += [(f"l2:{tenant}", s) for tenant, s in c.tenant_l2.items()]
        present = {"engine", *(tier for tier, _ in stores)}
        tier_hits = v.KV_TIER_HITS.family()
        for tier, n in list(c.hits.items()):
            if tier in present:  # a tier the engine does not have is no 0 % tier (its panels drew an "l2 0%" line)
                tier_hits.add_metric([tier], n)
        yield tier_hits
        misses = v.KV_TIER_MISSES.family()  # the engine tier's too: without it its hit ratio was never recorded
        misses.add_metric(["engine"], c.engine_misses)
        for tier, store in stores:
            misses.add_metric([tier], store.stats.misses)
        yield misses
        if not stores:
            yield engine_evictions
            return
        for attr, metric in _TIER_COUNTERS:
            fam = engine_evictions if metric is v.KV_TIER_EVICTIONS else metric.family()
            for tier, store in stores:
                fam.add_metric([tier], getattr(store.stats, attr))
            yield fam
        dropped = v.KV_WRITES_DROPPED.family()
        dropped.add_metric([], c.dropped_blocks)
        queued = v.KV_WRITE_QUEUE.family()
        queued.add_metric([], c.write_bytes)
        yield from (dropped, queued)
        if c.l1 is not None:  # how full L1 is could only be worked out from bytes in, block size and evictions
            used, capacity = v.KV_TIER_USED.family(), v.KV_TIER_CAPACITY.family()
            used.add_metric([c.l1.name], c.l1.used_bytes)
            capacity.add_metric([c.l1.name], c.l1.max_bytes)
            yield from (used, capacity)
        states = v.KV_TIER_STATE.family()
        for tier, store in stores:
            if isinstance(getattr(store, "state", None), str):
                for state in v.KV_TIER_STATES:
                    states.add_metric([tier, state], 1.0 if store.state == state else 0.0)
        yield states
        for kind, metric in (("get", v.KV_TIER_GET), ("put", v.KV_TIER_PUT)):
            hist = metric.family()
            for tier, store in stores:
                latency = getattr(store.stats, f"{kind}_seconds")
                *counts, total = latency.cumulative()
                hist.add_metric([tier], [(str(b), n) for b, n in zip(latency.buckets, counts, strict=True)]
                                + [("+Inf", total)], sum_value=latency.total)
            yield hist
