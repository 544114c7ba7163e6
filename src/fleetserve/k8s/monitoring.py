"""Prometheus-operator objects: ServiceMonitors for the router and the engines, and a PrometheusRule.

Scrapes run every `metrics.scrapeIntervalSeconds`; /metrics of both servers needs the internal token
(router metrics name tenants), so the ServiceMonitors send it as a bearer token from `<name>-internal`.
The rule file records the first metrics to look at (invocations, errors, concurrency, TTFB p95) per
namespace/model_name/model_version/instance_type and alerts on what leaks money or latency: errors,
requests held at zero for long, a slow TTFB against the spec's SLO, an engine tier that cannot be placed.
"""

from __future__ import annotations

from fleetserve.k8s.context import Context
from fleetserve.k8s.keda import PENDING_METRIC

LABELS = "namespace, model_name, model_version, instance_type"


def _service_monitor(ctx: Context, name: str, component: str, port: str, scheme: str,
                     path: str = "/metrics") -> dict:
    interval = f"{ctx.endpoint.spec.metrics.scrape_interval_seconds}s"
    endpoint: dict = {"port": port, "path": path, "interval": interval, "scheme": scheme,
                      "authorization": {"type": "Bearer",
                                        "credentials": {"name": ctx.internal_secret, "key": "token"}}}
    if scheme == "https":
        endpoint["tlsConfig"] = {"insecureSkipVerify": True}  # the router's certificate names its public host
    return {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "ServiceMonitor",
        "metadata": ctx.meta(name, component),
        "spec": {"selector": {"matchLabels": ctx.selector(component)},
                 "namespaceSelector": {"matchNames": [ctx.namespace]},
                 "endpoints": [endpoint]},
    }


def _rules(ctx: Context) -> dict:
    ns, model = ctx.namespace, ctx.endpoint.served_model_name
    sel = f'namespace="{ns}",model_name="{model}"'
    router = f'namespace="{ns}",service="{ctx.router_name}"'
    slo = ctx.endpoint.spec.slo
    ttft_ms = slo.ttft_p95_ms if slo else 2000.0
    hold_s = max(60, int(ctx.endpoint.spec.engine.startup_timeout_seconds))
    def rec(name: str, expr: str) -> dict:
        return {"record": f"fleetserve:{name}", "expr": expr}

    ttfb = f"rate(model_ttfb_milliseconds_bucket{{{sel}}}[5m])"
    records = [
        rec("model_invocations:rate1m", f"sum by ({LABELS}) (rate(model_invocations_total{{{sel}}}[1m]))"),
        rec("model_errors:rate1m", f"sum by ({LABELS}) (rate(model_errors_total{{{sel}}}[1m]))"),
        rec("model_concurrent_requests:sum", f"sum by ({LABELS}) (model_concurrent_requests{{{sel}}})"),
        rec("model_ttfb_milliseconds:p95", f"histogram_quantile(0.95, sum by (le, {LABELS}) ({ttfb}))"),
    ]
    errors = f"sum(rate(model_errors_total{{{sel}}}[5m]))"
    calls = f"clamp_min(sum(rate(model_invocations_total{{{sel}}}[5m])), 1e-9)"
    router_ttfb = f"sum by (le) (rate(fleetserve_router_ttfb_milliseconds_bucket{{{router}}}[5m]))"
    alerts = [
        {"alert": "FleetserveHighErrorRate",
         "expr": f"{errors} / {calls} > 0.01",
         "for": "10m", "labels": {"severity": "warning"},
         "annotations": {"summary": f"{model} in {ns}: more than 1% of invocations fail"}},
        {"alert": "FleetserveRequestsHeldAtZero",
         "expr": f"sum({PENDING_METRIC}{{{router}}}) > 0",
         "for": f"{hold_s}s", "labels": {"severity": "warning"},
         "annotations": {"summary": f"{model} in {ns}: requests wait at the router longer than a cold start "
                                    "(scale-from-zero is not happening)"}},
        {"alert": "FleetserveSlowTimeToFirstByte",
         "expr": f"histogram_quantile(0.95, {router_ttfb}) > {ttft_ms:g}",
         "for": "15m", "labels": {"severity": "warning"},
         "annotations": {"summary": f"{model} in {ns}: TTFB p95 above {ttft_ms:g} ms; check cache reuse and "
                                    "instance type before adding replicas"}},
        {"alert": "FleetserveEngineUnschedulable",
         "expr": f'sum(kube_pod_status_unschedulable{{namespace="{ns}",pod=~"{ctx.name}-engine.*"}}) > 0',
         "for": "15m", "labels": {"severity": "warning"},
         "annotations": {"summary": f"{model} in {ns}: engine pods cannot be placed on any tier"}},
    ]
    return {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "PrometheusRule",
        "metadata": ctx.meta(ctx.name, "monitoring"),
        "spec": {"groups": [{"name": f"fleetserve.{ns}.{ctx.name}.records", "rules": records},
                            {"name": f"fleetserve.{ns}.{ctx.name}.alerts", "rules": alerts}]},
    }


def monitoring_objects(ctx: Context, warn) -> list[dict]:
    spec = ctx.endpoint.spec
    if not spec.metrics.enabled:
        return []
    out = [_service_monitor(ctx, ctx.router_name, "router", "https" if spec.tls.enabled else "http",
                            "https" if spec.tls.enabled else "http")]
    if spec.engine.kind != "external":
        # metrics.modelMetricsPath/Port (HyperPod's metrics.modelMetrics): a separate port is named "metrics"
        from fleetserve.k8s.engine import engine_port, metrics_port

        port = "metrics" if metrics_port(ctx) != engine_port(ctx) else "http"
        out.append(_service_monitor(ctx, ctx.engine_service, "engine", port, "http",
                                    spec.metrics.model_metrics_path or "/metrics"))
    out.append(_rules(ctx))
    return out
