"""Every metric fleetserve exports, defined once: name, type, unit, buckets, labels, help, who emits it.

Servers never call `Counter(...)`/`Gauge(...)`/`Histogram(...)` with a literal name: they build their
collectors from these definitions (`make`, or `family` inside a scrape-time collector), and
`docs/metrics.md` is generated from this module (`fleetserve docs metrics`), so names, labels and help text
cannot drift between the engine, the simulated engine, the router, the supervisor and the docs.

Names: HyperPod's `model_*` for invocations (the names its dashboards and alarms use), vLLM's `vllm:*` for
engine state (so peer routers and KEDA recipes work unchanged), `fleetserve_*` for everything else.
A counter's `name` is the series name with `_total`, as it is queried.

Labels are designed on day one (the seed's third pitfall): every model metric carries namespace,
model_name, model_version, instance_type and replica. Every label has a documented bound (`LABELS`); none
carries prompt or completion text. Tenant names appear only in the router's per-tenant counter and in the
per-tenant L2 tier label, both bounded by configuration (the API key file and `kvCache.l2.tenantUrls`), and
the router's /metrics is admin-only while API keys are on.

No `_created` series: `disable_created_metrics()` runs when this module is imported (every server imports
it before building a collector). They double the series count and no query here uses them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, disable_created_metrics

from fleetserve.kvcache.tiers import TIER_LATENCY_BUCKETS_S  # the tiers count into these (kvcache/tiers.Latency)

disable_created_metrics()

Kind = Literal["counter", "gauge", "histogram"]

LATENCY_BUCKETS_MS = (5, 10, 25, 50, 100, 250, 500, 1000, 2500, 5000, 10000, 30000, 60000, 120000)
SECONDS_BUCKETS = tuple(b / 1000 for b in LATENCY_BUCKETS_MS)
# a local cold start takes 10-30 s: from 10 straight to 30 s, histogram_quantile read a 13 s wait as 20 s
BUFFER_WAIT_BUCKETS_S = (0.1, 0.5, 1, 2, 5, 10, 15, 20, 25, 30, 45, 60, 90, 120, 180, 300, 600)
COLD_START_BUCKETS_S = (1, 2, 5, 10, 20, 30, 60, 120, 300, 600)

MODEL_LABELS = ("namespace", "model_name", "model_version", "instance_type", "replica")

#: Every label used below: what it holds and why its number of values is bounded.
LABELS: dict[str, str] = {
    "namespace": "the endpoint's metadata.namespace (one per endpoint)",
    "model_name": "the served model name (one per endpoint)",
    "model_version": "spec.model.version (one per deployed version)",
    "instance_type": "the instance type the replica was placed on (the spec's priority list, by its EC2 name: "
                     "SageMaker's `ml.g5.xlarge` reads `g5.xlarge`, `local` on this machine; on Kubernetes the "
                     "tier's one type, or `kubernetes` where a tier allows several: a pod cannot read its node's "
                     "labels)",
    "replica": "replica id, r0, r1, ... (grows with replacements over a fleet's life; one per live replica; in "
               "the router's series also a replica that left within 5 minutes, so its last increments are "
               "scraped)",
    "status": "HTTP status code of a failed invocation (a few dozen values at most)",
    "path": "the router's API path (/v1/chat/completions, /v1/completions, /v1/models, /v1/models/{model}, "
            "/invocations), or other: "
            "errors on any other path and input refused before its path was read (404, 413, 431, 400)",
    "code": "HTTP status code answered",
    "tenant": "tenant name from the router's API key file; '-' without keys, and for answers given before a "
              "request's key was read (404, 405, 413, 431, a HEAD at zero replicas, the router's own 500). Bounded "
              "by the key file; never derived from request content",
    "reason": "a fixed set per metric: retry reasons (status_502, status_503, status_504, busy: a 503 with "
              "Retry-After, unreachable, dropped: closed under the request, stalled: its replica was taken out by "
              "its health checks before it answered, refused_router: a replica's 401 "
              "to the router's own credentials (a token that does not match the engines'), dropped_not_retried, "
              "timeout_not_retried), ejection reasons (breaker, unreachable), autoscaler decision kinds "
              "(DECISION_REASONS: the decision's full text, with numbers, goes to the supervisor's log as "
              "`autoscaler: REASON` once per change, steady ones not; not to the label)",
    "policy": "routing strategy name from the policy registry (prefixaware, kvaware, session, roundrobin, "
              "leastload, ...)",
    "branch": "the policy's decision branch, a fixed set per policy: prefixaware and kvaware hit, miss, "
              "load_over_hit (a holder of more of the prefix was too busy), hot_copy (a hot prefix copied to "
              "another replica), kvaware no_events_* (its prefixaware fallback); session sticky, reassigned, "
              "overload_fallback, all_overloaded, no_key; roundrobin rotate; leastload least_load; retry (a "
              "retried request, any policy)",
    "source": "predicted (the policy's estimate) or reported (the engine's usage.cached_tokens)",
    "service": "one of the fleet's own services: router, redis or prometheus",
    "backend": "backend id of a replica behind the router (one per live replica; the counters also keep a "
               "replica that left within 5 minutes, so its last increments are scraped)",
    "tier": "KV tier: engine, l1, l2, or l2:TENANT for a tenant's own Redis (bounded by "
            "kvCache.l2.tenantUrls)",
    "state": "a Redis tier's state: up, full, read_only, unavailable or unknown",
    "capacity_type": "on-demand or spot",
    "block_size": "KV block size in tokens (one value per engine)",
    "num_gpu_blocks": "KV capacity in blocks (one value per engine)",
}

#: Group order in docs/metrics.md.
GROUPS = {
    "model": "HyperPod model metrics (engine and simulated engine; per invocation)",
    "vllm": "vLLM-compatible engine metrics (engine and simulated engine)",
    "router": "Router (gateway)",
    "kv": "KV cache tiers (engine)",
    "autoscaler": "Autoscaler (fleet supervisor)",
    "capacity": "Capacity and cost (fleet supervisor)",
}


@dataclass(frozen=True)
class Metric:
    """One exported metric family. `name` is the series name as queried (a counter's ends in `_total`)."""

    name: str
    kind: Kind
    help: str
    group: str
    unit: str = ""
    labels: tuple[str, ...] = ()
    buckets: tuple[float, ...] | None = None
    emitted_by: tuple[str, ...] = ()
    # a gauge kept by several processes of one server (router --workers): their values add up, or the
    # largest counts (prometheus_client's multiprocess mode; counters and histograms always add up)
    across_processes: str = "sum"

    @property
    def base(self) -> str:
        """The name prometheus_client takes (it appends `_total` to counters itself)."""
        return self.name[:-6] if self.kind == "counter" and self.name.endswith("_total") else self.name

    def make(self, registry: CollectorRegistry, extra_labels: tuple[str, ...] = ()):
        """A prometheus_client collector for this metric in `registry`."""
        labels = list(self.labels) + list(extra_labels)
        if self.kind == "counter":
            return Counter(self.base, self.help, labels, registry=registry)
        if self.kind == "gauge":
            return Gauge(self.base, self.help, labels, registry=registry,
                         multiprocess_mode="live" + self.across_processes)
        return Histogram(self.base, self.help, labels, buckets=self.buckets, registry=registry)

    def family(self):
        """A metric family for a scrape-time collector (values read from an object when scraped)."""
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily

        cls = {"counter": CounterMetricFamily, "gauge": GaugeMetricFamily, "histogram": HistogramMetricFamily}
        return cls[self.kind](self.base, self.help, labels=list(self.labels))


def _m(name: str, kind: Kind, help: str, group: str, unit: str = "", labels: tuple[str, ...] = (),
       buckets: tuple[float, ...] | None = None, by: tuple[str, ...] = (), across: str = "sum") -> Metric:
    if kind == "histogram" and buckets is None:
        raise ValueError(f"{name}: a histogram needs buckets")
    return Metric(name, kind, help, group, unit, labels, buckets, by, across)


ENGINE, SIM, ROUTER, SUPERVISOR = "engine", "simulated engine", "router", "supervisor"
_V = ("model_name",)

# --- HyperPod model metrics -------------------------------------------------------------------------------
MODEL_INVOCATIONS = _m("model_invocations_total", "counter", "Model invocations", "model", "requests",
                       MODEL_LABELS, by=(ENGINE, SIM, ROUTER))
MODEL_ERRORS = _m("model_errors_total", "counter", "Model invocations that failed", "model", "requests",
                  MODEL_LABELS + ("status",), by=(ENGINE, SIM, ROUTER))
MODEL_CONCURRENT = _m("model_concurrent_requests", "gauge", "Requests in flight", "model", "requests",
                      MODEL_LABELS, by=(ENGINE, SIM, ROUTER))
MODEL_LATENCY = _m("model_latency_milliseconds", "histogram", "End-to-end latency", "model", "milliseconds",
                   MODEL_LABELS, LATENCY_BUCKETS_MS, by=(ENGINE, SIM, ROUTER))
MODEL_TTFB = _m("model_ttfb_milliseconds", "histogram", "Time to first byte (token)", "model", "milliseconds",
                MODEL_LABELS, LATENCY_BUCKETS_MS, by=(ENGINE, SIM, ROUTER))

# --- vLLM-compatible engine metrics -----------------------------------------------------------------------
VLLM_RUNNING = _m("vllm:num_requests_running", "gauge", "Requests in the running batch", "vllm", "requests", _V,
                  by=(ENGINE, SIM))
VLLM_WAITING = _m("vllm:num_requests_waiting", "gauge", "Requests waiting to run", "vllm", "requests", _V,
                  by=(ENGINE, SIM))
VLLM_KV_USAGE = _m("vllm:kv_cache_usage_perc", "gauge", "Engine KV working set used (0-1)", "vllm", "ratio", _V,
                   by=(ENGINE, SIM))
VLLM_GPU_CACHE_USAGE = _m("vllm:gpu_cache_usage_perc", "gauge", "KV cache usage (0-1), vLLM's legacy name",
                          "vllm", "ratio", _V, by=(SIM,))
VLLM_PREFIX_QUERIES = _m("vllm:prefix_cache_queries_total", "counter", "Prompt tokens looked up in the prefix "
                         "cache", "vllm", "tokens", _V, by=(ENGINE, SIM))
VLLM_PREFIX_HITS = _m("vllm:prefix_cache_hits_total", "counter", "Prompt tokens found in the prefix cache",
                      "vllm", "tokens", _V, by=(ENGINE, SIM))
VLLM_GPU_PREFIX_QUERIES = _m("vllm:gpu_prefix_cache_queries_total", "counter", "Prompt tokens looked up, "
                             "vLLM's legacy name", "vllm", "tokens", _V, by=(SIM,))
VLLM_GPU_PREFIX_HITS = _m("vllm:gpu_prefix_cache_hits_total", "counter", "Prompt tokens found cached, vLLM's "
                          "legacy name", "vllm", "tokens", _V, by=(SIM,))
VLLM_PROMPT_TOKENS = _m("vllm:prompt_tokens_total", "counter", "Prompt tokens processed", "vllm", "tokens", _V,
                        by=(ENGINE,))
VLLM_GENERATION_TOKENS = _m("vllm:generation_tokens_total", "counter", "Tokens generated", "vllm", "tokens", _V,
                            by=(ENGINE,))
VLLM_TTFT = _m("vllm:time_to_first_token_seconds", "histogram", "Time to first token", "vllm", "seconds", _V,
               SECONDS_BUCKETS, by=(ENGINE, SIM))
VLLM_E2E = _m("vllm:e2e_request_latency_seconds", "histogram", "End-to-end request latency", "vllm", "seconds",
              _V, SECONDS_BUCKETS, by=(ENGINE,))
VLLM_CACHE_CONFIG = _m("vllm:cache_config_info", "gauge", "Cache configuration (value 1)", "vllm", "",
                       ("block_size", "num_gpu_blocks"), by=(SIM,))
SIM_BUSY = _m("fleetserve_sim_busy_seconds_total", "counter", "Time the simulated engine spent computing", "vllm",
              "seconds", _V, by=(SIM,))

# --- router -----------------------------------------------------------------------------------------------
ROUTER_REQUESTS = _m("fleetserve_router_requests_total", "counter", "Requests answered, counted when the answer "
                     "ends with the status the client got (a stream cut after its 200 line: its 502 or 504; one its "
                     "client left: 499)", "router", "requests",
                     ("path", "code"), by=(ROUTER,))
ROUTER_REQUESTS_RECEIVED = _m("fleetserve_router_requests_received_total", "counter", "Model requests (POST) as "
                              "they arrive, before any answer, once their API key is valid (not a wrong model refused "
                              "at zero replicas): the request_rate scaling "
                              "signal on Kubernetes, as the local autoscaler and the simulator count arrivals",
                              "router", "requests", ("path",),
                              by=(ROUTER,))
ROUTER_TENANT_REQUESTS = _m("fleetserve_router_tenant_requests_total", "counter", "Requests by tenant (tenants "
                            "from the API key file; '-' without keys)", "router", "requests", ("tenant", "code"),
                            by=(ROUTER,))
ROUTER_RETRIES = _m("fleetserve_router_retries_total", "counter", "Attempts moved to another replica", "router",
                    "attempts", ("reason",), by=(ROUTER,))
ROUTER_REQUESTS_ROUTED = _m("fleetserve_router_requests_routed_total", "counter", "Model requests (the "
                            "generation and SageMaker paths; a model listing is none) sent to a replica, retries "
                            "included: activity that holds off scale-to-zero (the activity trigger on Kubernetes, "
                            "/admin/load's routed_total locally)", "router", "requests", (), by=(ROUTER,))
ROUTER_DECISIONS = _m("fleetserve_router_routing_decisions_total", "counter", "Routing decisions per policy and "
                      "branch", "router", "decisions", ("policy", "branch"), by=(ROUTER,))
ROUTER_EJECTIONS = _m("fleetserve_router_ejections_total", "counter", "Replicas taken out of rotation by a "
                      "request failure (circuit breaker opened, or unreachable)", "router", "ejections",
                      ("backend", "reason"), by=(ROUTER,))
ROUTER_BACKEND_HEALTHY = _m("fleetserve_router_backend_healthy", "gauge", "1 if the backend takes traffic",
                            "router", "", ("backend",), by=(ROUTER,), across="max")
ROUTER_BACKEND_IN_FLIGHT = _m("fleetserve_router_backend_in_flight", "gauge", "Requests outstanding", "router",
                              "requests", ("backend",), by=(ROUTER,))
ROUTER_TTFB = _m("fleetserve_router_ttfb_milliseconds", "histogram", "Time to first byte through the router",
                 "router", "milliseconds", (), LATENCY_BUCKETS_MS, by=(ROUTER,))
ROUTER_SERVED_TTFB = _m("fleetserve_router_served_ttfb_milliseconds", "histogram", "Time to first token of "
                        "streamed answers (200) through the router, less the wait for a cold start in the "
                        "scale-from-zero buffer (the ttft_p95 scaling signal: a cold start is not a reason for more "
                        "replicas; a non-streamed answer's first byte is its whole generation)", "router",
                        "milliseconds",
                        (), LATENCY_BUCKETS_MS, by=(ROUTER,))
ROUTER_LATENCY = _m("fleetserve_router_latency_milliseconds", "histogram", "Latency through the router",
                    "router", "milliseconds", (), LATENCY_BUCKETS_MS, by=(ROUTER,))
ROUTER_KV_SUBSCRIPTIONS = _m("fleetserve_router_kv_subscriptions", "gauge", "Backends whose KV events are "
                             "followed", "router", "backends", by=(ROUTER,), across="max")
ROUTER_INDEX_BLOCKS = _m("fleetserve_router_index_blocks", "gauge", "Blocks in the router's prefix/KV index",
                         "router", "blocks", by=(ROUTER,), across="max")
ROUTER_QUEUED = _m("fleetserve_router_queued_requests", "gauge", "Requests waiting for a replica slot (limits)",
                   "router", "requests", by=(ROUTER,))
ROUTER_PENDING = _m("fleetserve_router_pending_requests", "gauge", "Requests held until a replica is ready "
                    "(the buffer at zero replicas)", "router", "requests", by=(ROUTER,))
ROUTER_BUFFER_WAIT = _m("fleetserve_router_buffer_wait_seconds", "histogram", "Time requests waited for a "
                        "replica", "router", "seconds", (), BUFFER_WAIT_BUCKETS_S, by=(ROUTER,))
ROUTER_CACHED_TOKENS = _m("fleetserve_router_cached_tokens_total", "counter", "Prompt tokens the policy "
                          "predicted the replica to find cached, and those the engine reported", "router",
                          "tokens", ("policy", "source"), by=(ROUTER,))
ROUTER_BACKEND_CACHED_TOKENS = _m("fleetserve_router_backend_cached_tokens_total", "counter", "Per replica: prompt "
                                  "tokens the policy predicted cached there, and those the engine reported (in "
                                  "the engine's tokens; over backend_prompt_tokens: predicted and actual hit "
                                  "rate)", "router", "tokens", ("backend", "source"), by=(ROUTER,))
ROUTER_BACKEND_PROMPT_TOKENS = _m("fleetserve_router_backend_prompt_tokens_total", "counter", "Per replica: "
                                  "prompt tokens of the responses whose cached tokens were counted", "router",
                                  "tokens", ("backend",), by=(ROUTER,))
ROUTER_BACKEND_CACHE_HORIZON = _m("fleetserve_router_backend_cache_horizon_blocks", "gauge", "Per replica: the "
                                  "cache size the router learned from reported cached tokens (router keys; "
                                  "router/feedback.py)", "router", "blocks", ("backend",), by=(ROUTER,), across="max")

ROUTER_BACKEND_ENGINE_HIT_RATE = _m("fleetserve_router_backend_engine_hit_rate", "gauge", "Per replica: the "
                                    "prefix-cache hit rate the engine itself publishes (vllm:prefix_cache_hits / "
                                    "queries over the watcher's last interval), beside the router's predicted and "
                                    "reported tokens; absent for engines that publish no such counters", "router",
                                    "ratio", ("backend",), by=(ROUTER,), across="max")

# --- KV tiers (read from the engine's prefix cache at scrape time) ----------------------------------------
_T = ("tier",)
KV_TIER_HITS = _m("fleetserve_kv_tier_hits_total", "counter", "Blocks found per tier", "kv", "blocks", _T,
                  by=(ENGINE,))
KV_TIER_MISSES = _m("fleetserve_kv_tier_misses_total", "counter", "Blocks that reached the tier and were not "
                    "found there (a prefix ends at its first miss)", "kv", "blocks", _T, by=(ENGINE,))
KV_TIER_EVICTIONS = _m("fleetserve_kv_tier_evictions_total", "counter", "Blocks evicted (l2: the shared Redis's "
                       "evictions of this model's blocks, which every replica sees alike: take the max across "
                       "replicas, not the sum)", "kv", "blocks", _T, by=(ENGINE,))
KV_TIER_BYTES_IN = _m("fleetserve_kv_tier_bytes_in_total", "counter", "Bytes written to the tier", "kv",
                      "bytes", _T, by=(ENGINE,))
KV_TIER_BYTES_OUT = _m("fleetserve_kv_tier_bytes_out_total", "counter", "Bytes loaded from the tier", "kv",
                       "bytes", _T, by=(ENGINE,))
KV_TIER_FAILURES = _m("fleetserve_kv_tier_failures_total", "counter", "Tier operations that failed (e.g. Redis "
                      "down)", "kv", "operations", _T, by=(ENGINE,))
KV_TIER_REJECTED = _m("fleetserve_kv_tier_rejected_total", "counter", "Values whose header did not match the "
                      "key or whose bytes did not match their checksum (foreign or corrupt; never used)", "kv",
                      "blocks", _T, by=(ENGINE,))
KV_WRITES_DROPPED = _m("fleetserve_kv_writes_dropped_blocks_total", "counter", "New blocks not written to L1/L2 "
                       "(kept in the engine tier only): the writes already queued held the engine tier's size, "
                       "the tiers below being slower than the prefills", "kv", "blocks", by=(ENGINE,))
KV_WRITE_QUEUE = _m("fleetserve_kv_write_queue_bytes", "gauge", "Bytes of blocks queued for writing to L1/L2 (at "
                    "most the engine tier's size)", "kv", "bytes", by=(ENGINE,))
KV_TIER_USED = _m("fleetserve_kv_tier_used_bytes", "gauge", "Bytes of blocks the tier holds (L1, in this engine's "
                  "memory): beside fleetserve_kv_tier_capacity_bytes, how full it is", "kv", "bytes", _T,
                  by=(ENGINE,))
KV_TIER_CAPACITY = _m("fleetserve_kv_tier_capacity_bytes", "gauge", "Most bytes of blocks the tier holds (L1: "
                      "kvCache.l1.maxBytes)", "kv", "bytes", _T, by=(ENGINE,))
KV_TIER_STATES = ("up", "full", "read_only", "unavailable", "unknown")
KV_TIER_STATE = _m("fleetserve_kv_tier_state", "gauge", "1 for what the tier's last operation found: up, full "
                   "(writes refused for memory, reads go on), read_only (writes refused: a replica, or an ACL; "
                   "reads go on), unavailable, or unknown before the first (Redis tiers)", "kv", "",
                   ("tier", "state"), by=(ENGINE,))
KV_TIER_GET = _m("fleetserve_kv_tier_get_seconds", "histogram", "Tier load latency", "kv",
                 "seconds", _T, TIER_LATENCY_BUCKETS_S, by=(ENGINE,))
KV_TIER_PUT = _m("fleetserve_kv_tier_put_seconds", "histogram", "Tier store latency", "kv",
                 "seconds", _T, TIER_LATENCY_BUCKETS_S, by=(ENGINE,))

# --- autoscaler -------------------------------------------------------------------------------------------
AUTOSCALER_DESIRED = _m("fleetserve_autoscaler_desired_replicas", "gauge", "Replicas the policy wants",
                        "autoscaler", "replicas", by=(SUPERVISOR,))
AUTOSCALER_READY = _m("fleetserve_autoscaler_ready_replicas", "gauge", "Replicas serving: ready (answering "
                      "/health) and not taken out by the router's health checks",
                      "autoscaler", "replicas", by=(SUPERVISOR,))
AUTOSCALER_DECISIONS = _m("fleetserve_autoscaler_decisions_total", "counter", "Scaling decisions by reason",
                          "autoscaler", "decisions", ("reason",), by=(SUPERVISOR,))
SERVICE_RESTARTS = _m("fleetserve_service_restarts_total", "counter", "The fleet's own services restarted after "
                      "they exited (the router, the L2 Redis, Prometheus): the replicas' restarts are in status",
                      "autoscaler", "restarts", ("service",), by=(SUPERVISOR,))
REPLICA_COLD_START = _m("fleetserve_replica_cold_start_seconds", "histogram", "From the request for a replica "
                        "to its first healthy answer", "autoscaler", "seconds", (), COLD_START_BUCKETS_S,
                        by=(SUPERVISOR,))

# --- capacity and cost ------------------------------------------------------------------------------------
COST_PER_HOUR = _m("fleetserve_cost_per_hour_dollars", "gauge", "What the fleet's nodes cost per hour",
                   "capacity", "dollars per hour", by=(SUPERVISOR,))
COST_TOTAL = _m("fleetserve_cost_dollars", "gauge", "Dollars spent since the fleet started (cumulative)",
                "capacity", "dollars", by=(SUPERVISOR,))
NODES = _m("fleetserve_nodes", "gauge", "Nodes by instance and capacity type", "capacity", "nodes",
           ("instance_type", "capacity_type"), by=(SUPERVISOR,))

#: The whole vocabulary, in documentation order.
METRICS: tuple[Metric, ...] = tuple(v for v in dict(globals()).values() if isinstance(v, Metric))
BY_NAME: dict[str, Metric] = {m.name: m for m in METRICS}


#: The autoscaler decision label's values (`decision_reason`), in the order they are matched.
DECISION_REASONS = (("scale up", "scale up"), ("scale down", "scale down"), ("steady", "steady"),
                    ("idle at", "idle"), ("activated from zero", "activated from zero"),
                    ("no activity for", "cooldownPeriod elapsed"), ("fallback", "fallback"),
                    ("holding", "metrics not ready"))
# the decisions that change the fleet (or how it is decided), marked on dashboards; steady, idle and "metrics not
# ready" come every poll (35 marks in 70 s covered every panel)
MARKED_REASONS = ("scale up", "scale down", "activated from zero", "cooldownPeriod elapsed", "fallback")


def decision_reason(reason: str) -> str:
    """The bounded label for a ScaleDecision's reason text ("scale up 1 -> 3: ..." -> "scale up")."""
    return next((label for prefix, label in DECISION_REASONS if reason.startswith(prefix)), "other")


def by_name(name: str) -> Metric:
    try:
        return BY_NAME[name]
    except KeyError:
        raise KeyError(f"{name!r} is not in the metrics vocabulary (fleetserve.observe.vocabulary)") from None
