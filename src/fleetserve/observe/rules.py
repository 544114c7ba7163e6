"""Prometheus recording rules and alerts, one source for the local fleet's Prometheus and Kubernetes.

`rule_groups(target)` returns rule groups as plain dicts: `fleetserve up` writes them to `rules.yml` beside
its Prometheus configuration (fleet/prometheus.py), and `fleetserve render k8s` wraps them in a
PrometheusRule (k8s/monitoring.py). Both are checked by `promtool check rules` and unit-tested with
`promtool test rules` (tests/observe/).

Recording rules, per namespace/model_name/model_version/instance_type (the labels that separate cost and
cause), over the HyperPod `model_*` metrics the engines export (the router, in front of vLLM and SGLang):
- invocations and errors per second (1 m), concurrent requests;
- TTFB (time to first token) and end-to-end latency p50 and p95 (5 m);
- error ratio = server errors (5xx and 429; a client's 4xx spends no budget) / invocations over 5 m, 30 m, 1 h
  and 6 h (the burn-rate windows);
- slow ratio = the share of requests whose TTFB is above the SLO's TTFT bound (the first histogram bucket
  at or above `slo.ttftP95Ms`), over 5 m and 1 h: the latency SLO's "error" rate;
- hit ratio per KV tier = hits / (hits + misses) of `fleetserve_kv_tier_*` (5 m; the built-in engine's), and
  the engines' prefix cache hit ratio = vllm:prefix_cache_hits / vllm:prefix_cache_queries (the built-in
  engine and vLLM), sglang:cached_tokens / sglang:prompt_tokens (SGLang), 5 m and 1 h.

Alerts:
- SLO burn rate over two windows (Google SRE workbook, multiwindow multi-burn-rate): the error budget is
  `slo.maxErrorRate` (errors) and 5 % (a p95 latency target lets 5 % of requests be slower); page when both
  the 1 h and the 5 m ratio burn faster than 14.4x the budget (2 % of a 30-day budget in an hour), ticket
  when both the 6 h and 30 m ratios burn faster than 6x. The short window ends the alert soon after the
  burn stops; the long one keeps a brief spike from paging;
- cache-hit collapse: the prefix-cache hit ratio of the last 5 m is under half of the last hour's, and the
  last hour's was worth having (>= 10 %) (a routing change, an eviction storm, a restarted L2);
- replicas not ready: fewer ready than desired for longer than a cold start;
- cost over budget: the fleet's cost per hour above `slo.costPerHourUsd` (only when it is set);
- router not scraped: no sample of the router's pending gauge for 5 m (every autoscaling query reads it);
- plus a high error rate, requests held at zero, a slow router TTFB and platform-specific extras.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field

from fleetserve.observe.vocabulary import LATENCY_BUCKETS_MS

LABELS = "namespace, model_name, model_version, instance_type"
ENDPOINT_LABELS = "namespace, model_name, model_version"
PREFIX = "fleetserve:"
LATENCY_BUDGET = 0.05  # a p95 target: 5 % of requests may be slower than it
BURN_WINDOWS = (("5m", "1h", 14.4, "critical"), ("30m", "6h", 6.0, "warning"))  # (short, long, factor, severity)
ERROR_WINDOWS = ("5m", "30m", "1h", "6h")
SLOW_WINDOWS = ("5m", "1h")
PENDING_METRIC = "fleetserve_router_pending_requests"
# what burns the error budget: the server's failures and its refusals for load, not a client's bad request (a
# client sending 400s and 404s at 15 % of the traffic paged on-call)
SERVER_ERRORS = 'status=~"5..|429"'


def is_server_error(status: str) -> bool:
    """SERVER_ERRORS for one status label (the live dashboard reads the same split as the rules)."""
    return status.startswith("5") or status == "429"
PREFIX_CACHE_COUNTERS = {"vllm": ("vllm:prefix_cache_hits_total", "vllm:prefix_cache_queries_total"),
                         "sglang": ("sglang:cached_tokens_total", "sglang:prompt_tokens_total")}
LEGACY_VLLM_PREFIX_CACHE = ("vllm:gpu_prefix_cache_hits_total", "vllm:gpu_prefix_cache_queries_total")
KV_TIER_ENGINES = ("builtin", "external")  # engines that export fleetserve_kv_tier_* (external: maybe ours)


def rate_window(window: str, scrape_interval_s: float) -> str:
    """`window` ("1m", "5m", "1h"), widened to at least four scrapes: rate() needs two samples in its window, and
    with fewer than four one missed scrape empties it (Grafana's $__rate_interval follows the same rule). At a
    120 s scrape a fixed [1m] read nothing: the request-rate trigger fell to 0 under load and the 1 m recording
    rules stayed empty. Named by what it is: a rule over a widened window says so in its name."""
    seconds = {"s": 1, "m": 60, "h": 3600}[window[-1]] * int(window[:-1])
    seconds = max(seconds, math.ceil(4 * scrape_interval_s))
    if seconds % 3600 == 0:
        return f"{seconds // 3600}h"
    return f"{seconds // 60}m" if seconds % 60 == 0 else f"{seconds}s"


def promql_string(value: str) -> str:
    """A PromQL string literal: model names come from specs (HyperPod allows quotes and spaces in them)."""
    return json.dumps(value)  # the escapes of a PromQL double-quoted string are Go's, which JSON's are a subset of


@dataclass(frozen=True)
class RuleTarget:
    """What the rules are about and where the non-model metrics come from on this platform.

    `router`: the label selector of the router's series; `desired`/`ready`: expressions of the desired and
    ready replica counts (None: no alert); `cost_per_hour`: an expression of the fleet's cost per hour
    (None: no cost alert); `extra_alerts`: platform-specific alerts appended to the alert group."""

    namespace: str
    model_name: str
    group: str  # rule group name prefix
    router: str
    ttft_p95_ms: float = 2000.0
    max_error_rate: float = 0.01
    cost_per_hour_usd: float | None = None
    hold_seconds: int = 600  # a cold start: how long replicas may stay unready, requests held, before an alert
    scrape_interval_s: float = 15.0  # every rate window is at least four of these (rate_window)
    engines: str = ""  # the label selector of this endpoint's engine targets (their KV-tier series carry no model)
    engine_kind: str = "builtin"  # which engine's cache counters exist (PREFIX_CACHE_COUNTERS)
    desired: str | None = None
    ready: str | None = None
    cost_per_hour: str | None = None
    extra_alerts: tuple[dict, ...] = field(default_factory=tuple)

    def window(self, nominal: str) -> str:
        return rate_window(nominal, self.scrape_interval_s)

    @property
    def selector(self) -> str:
        return f'namespace={promql_string(self.namespace)},model_name={promql_string(self.model_name)}'

    @classmethod
    def from_endpoint(cls, endpoint, group: str, router: str, cold_start_allowance_s: int = 0,
                      **kwargs) -> RuleTarget:
        """`cold_start_allowance_s`: what a cold start takes on this platform besides the engine's own start (on
        Kubernetes a new GPU node, the image pull, the model fetch)."""
        slo = endpoint.spec.slo
        return cls(namespace=endpoint.metadata.namespace, model_name=endpoint.served_model_name, group=group,
                   router=router, ttft_p95_ms=slo.ttft_p95_ms if slo else 2000.0,
                   max_error_rate=slo.max_error_rate if slo else 0.01,
                   cost_per_hour_usd=slo.cost_per_hour_usd if slo else None,
                   hold_seconds=max(60, int(endpoint.spec.engine.startup_timeout_seconds)) + cold_start_allowance_s,
                   scrape_interval_s=endpoint.spec.metrics.scrape_interval_seconds,
                   engine_kind=endpoint.spec.engine.kind, **kwargs)


def slow_bucket(ttft_ms: float) -> float:
    """The histogram bucket that bounds the TTFT target: the smallest `le` at or above it (or the largest)."""
    return next((b for b in LATENCY_BUCKETS_MS if b >= ttft_ms), LATENCY_BUCKETS_MS[-1])


def _le(bound: float) -> str:
    return f"{bound:g}" if bound != int(bound) else f"{int(bound)}.0"


def _rec(name: str, expr: str, labels: dict[str, str] | None = None) -> dict:
    out = {"record": PREFIX + name, "expr": expr}
    if labels:
        out["labels"] = labels  # series that keep no label of their endpoint get its namespace and model
    return out


def _ratio(num: str, den: str) -> str:
    return f"({num}) / ({den})"


def recording_rules(t: RuleTarget) -> list[dict]:
    sel = t.selector
    by = f"sum by ({LABELS})"

    w1, w5 = t.window("1m"), t.window("5m")

    def quantile(q: float, metric: str) -> str:
        return f"histogram_quantile({q}, sum by (le, {LABELS}) (rate({metric}_bucket{{{sel}}}[{w5}])))"

    rules = [
        _rec(f"model_invocations:rate{w1}", f"{by} (rate(model_invocations_total{{{sel}}}[{w1}]))"),
        _rec(f"model_errors:rate{w1}", f"{by} (rate(model_errors_total{{{sel}}}[{w1}]))"),
        _rec("model_concurrent_requests:sum", f"{by} (model_concurrent_requests{{{sel}}})"),
    ]
    for q in (0.5, 0.95):
        suffix = f"p{round(q * 100)}"
        rules.append(_rec(f"model_ttfb_milliseconds:{suffix}", quantile(q, "model_ttfb_milliseconds")))
        rules.append(_rec(f"model_latency_milliseconds:{suffix}", quantile(q, "model_latency_milliseconds")))
    # per endpoint, not per instance type: the router's refusals before any replica carry no replica's type,
    # and a series of their own read 100 % at one refusal among thousands of answers
    endpoint = f"sum by ({ENDPOINT_LABELS})"
    for w in map(t.window, ERROR_WINDOWS):
        rules.append(_rec(f"model_error_ratio:rate{w}", _ratio(
            f"{endpoint} (rate(model_errors_total{{{sel},{SERVER_ERRORS}}}[{w}]))",
            f"{endpoint} (rate(model_invocations_total{{{sel}}}[{w}]))")))
    le = _le(slow_bucket(t.ttft_p95_ms))
    for w in map(t.window, SLOW_WINDOWS):
        fast = f'{by} (rate(model_ttfb_milliseconds_bucket{{{sel},le="{le}"}}[{w}]))'
        total = f"{by} (rate(model_ttfb_milliseconds_count{{{sel}}}[{w}]))"
        rules.append(_rec(f"model_ttfb_slow_ratio:rate{w}", f"1 - ({fast}) / ({total})"))
    # the KV-tier series name no model: they are this endpoint's by its engine targets, and its recorded ratio
    # carries its namespace and model (a cluster-wide `sum by (tier)` was written by every endpoint's rules alike)
    own = {"namespace": t.namespace, "model_name": t.model_name}
    engines = f"{{{t.engines}}}" if t.engines else ""
    if t.engine_kind in KV_TIER_ENGINES:
        hits = f"sum by (tier) (rate(fleetserve_kv_tier_hits_total{engines}[{w5}]))"
        misses = f"sum by (tier) (rate(fleetserve_kv_tier_misses_total{engines}[{w5}]))"
        rules.append(_rec(f"kv_tier_hit_ratio:rate{w5}", f"{hits} / ({hits} + {misses})", own))
    model = ",".join(x for x in (f"model_name={promql_string(t.model_name)}", t.engines) if x)

    def rate(metrics: tuple[str, ...], w: str) -> str:  # the current name, else an older engine's
        return "sum by (model_name) (" + " or ".join(f"rate({m}{{{model}}}[{w}])" for m in metrics) + ")"

    pairs = prefix_cache_counter_names(t.engine_kind)
    for w in map(t.window, ("5m", "1h")):
        rules.append(_rec(f"prefix_cache_hit_ratio:rate{w}", _ratio(
            rate(tuple(hits for hits, _ in pairs), w), rate(tuple(queries for _, queries in pairs), w)), own))
    return rules


def prefix_cache_counters(engine_kind: str) -> tuple[str, str]:
    """(cached prompt tokens, prompt tokens looked up) counters of `engine_kind`: the built-in engine exports
    vLLM's names; SGLang has its own, and read vLLM's the hit ratio and its collapse alert stayed empty."""
    return PREFIX_CACHE_COUNTERS.get(engine_kind, PREFIX_CACHE_COUNTERS["vllm"])


def prefix_cache_counter_names(engine_kind: str) -> list[tuple[str, str]]:
    """`prefix_cache_counters`, then the names older releases of the engine publish instead (vLLM V1 around 0.8-0.9:
    `vllm:gpu_prefix_cache_*` only, whose replicas' hit ratio stayed empty)."""
    current = prefix_cache_counters(engine_kind)
    return [current, *([LEGACY_VLLM_PREFIX_CACHE] if current == PREFIX_CACHE_COUNTERS["vllm"] else [])]


def alert(name: str, expr: str, for_: str, severity: str, summary: str) -> dict:
    return {"alert": name, "expr": expr, "for": for_, "labels": {"severity": severity},
            "annotations": {"summary": summary}}


def alerting_rules(t: RuleTarget) -> list[dict]:
    who = f"{t.model_name} in {t.namespace}"
    sel = t.selector
    w5, w1h = t.window("5m"), t.window("1h")
    errors = f"sum(rate(model_errors_total{{{sel},{SERVER_ERRORS}}}[{w5}]))"
    calls = f"clamp_min(sum(rate(model_invocations_total{{{sel}}}[{w5}])), 1e-9)"
    # streamed answers' first token less a cold start's wait (as the ttft_p95 trigger reads it): the raw TTFB of a
    # non-streamed answer is its whole generation, and the alert fired on fleets whose clients do not stream
    router_ttfb = f"sum by (le) (rate(fleetserve_router_served_ttfb_milliseconds_bucket{{{t.router}}}[{w5}]))"
    alerts = []
    for short, long, factor, severity in BURN_WINDOWS:
        short, long = t.window(short), t.window(long)
        speed = "Fast" if severity == "critical" else "Slow"
        bound = factor * t.max_error_rate
        alerts.append(alert(
            f"FleetserveErrorBudgetBurn{speed}",
            f"{PREFIX}model_error_ratio:rate{long}{{{sel}}} > {bound:g} "
            f"and {PREFIX}model_error_ratio:rate{short}{{{sel}}} > {bound:g}",
            "2m", severity,
            f"{who}: errors burn the {t.max_error_rate:g} error budget {factor:g}x too fast ({long} and {short})"))
    bound = 14.4 * LATENCY_BUDGET
    alerts.append(alert(
        "FleetserveLatencyBudgetBurn",
        f"{PREFIX}model_ttfb_slow_ratio:rate{w1h}{{{sel}}} > {bound:g} "
        f"and {PREFIX}model_ttfb_slow_ratio:rate{w5}{{{sel}}} > {bound:g}",
        "2m", "critical",
        f"{who}: more than {bound:.0%} of requests miss the TTFT target of {t.ttft_p95_ms:g} ms (counted at the "
        f"histogram's {slow_bucket(t.ttft_p95_ms):g} ms bucket; {w1h} and {w5}); "
        "check cache reuse and instance type before adding replicas"))
    alerts.append(alert(
        "FleetserveCacheHitCollapse",
        f"{PREFIX}prefix_cache_hit_ratio:rate{w5}{{{sel}}} < 0.5 * {PREFIX}prefix_cache_hit_ratio:rate{w1h}{{{sel}}} "
        f"and {PREFIX}prefix_cache_hit_ratio:rate{w1h}{{{sel}}} >= 0.1",
        "10m", "warning",
        f"{who}: the prefix-cache hit ratio fell below half of the last hour's (routing, evictions, a lost L2?)"))
    if t.desired and t.ready:
        alerts.append(alert(
            "FleetserveReplicasNotReady", f"({t.ready}) < ({t.desired})", f"{t.hold_seconds}s", "warning",
            f"{who}: fewer replicas ready than desired for longer than a cold start"))
    if t.cost_per_hour and t.cost_per_hour_usd:
        alerts.append(alert(
            "FleetserveCostOverBudget", f"{t.cost_per_hour} > {t.cost_per_hour_usd:g}", "5m", "warning",
            f"{who}: the fleet costs more than ${t.cost_per_hour_usd:g} per hour (spec.slo.costPerHourUsd)"))
    alerts += [
        alert("FleetserveHighErrorRate", f"{errors} / {calls} > {t.max_error_rate:g}", "10m", "warning",
               f"{who}: more than {t.max_error_rate:.2%} of invocations fail"),
        alert("FleetserveRequestsHeldAtZero", f"sum({PENDING_METRIC}{{{t.router}}}) > 0", f"{t.hold_seconds}s",
               "warning", f"{who}: requests wait at the router longer than a cold start (scale-from-zero is not "
                          "happening)"),
        alert("FleetserveRouterNotScraped", f"absent({PENDING_METRIC}{{{t.router}}})", "5m", "critical",
              f"{who}: Prometheus has no sample of the router: autoscaling reads nothing (check the router's "
              "scrape target, its token and selector)"),
        alert("FleetserveSlowTimeToFirstByte", f"histogram_quantile(0.95, {router_ttfb}) > {t.ttft_p95_ms:g}",
               "15m", "warning", f"{who}: streamed answers' TTFT p95 at the router above {t.ttft_p95_ms:g} ms; "
                                 "check cache reuse and instance type before adding replicas"),
        *t.extra_alerts,
    ]
    # the endpoint's own labels on every alert: the ones summed over the endpoint carried only `severity`, so two
    # endpoints' alerts of one name were one label set (Alertmanager merged them and could not route them)
    return [{**a, "labels": {**a["labels"], "namespace": t.namespace, "model_name": t.model_name}} for a in alerts]


def rule_groups(t: RuleTarget) -> list[dict]:
    return [{"name": f"{t.group}.records", "rules": recording_rules(t)},
            {"name": f"{t.group}.alerts", "rules": alerting_rules(t)}]
