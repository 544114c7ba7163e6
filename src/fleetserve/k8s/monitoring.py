"""Prometheus-operator objects: ServiceMonitors for the router and the engines, and a PrometheusRule.

Scrapes run every `metrics.scrapeIntervalSeconds`; /metrics of both servers needs the internal token
(router metrics name tenants), so the ServiceMonitors send it as a bearer token from `<name>-internal`
(vLLM and SGLang engines: their own key, `engine-token`).
The PromQL rules come from observe/rules.py, the one source the local fleet's Prometheus also loads: records
per namespace/model_name/model_version/instance_type (invocations, errors, concurrency, TTFB and latency
p50/p95, error ratios, hit ratios) and alerts on what leaks money or latency (SLO burn rate over two windows,
cache-hit collapse, replicas not ready, errors, requests held at zero, slow TTFB, an engine tier that cannot
be placed).
"""

from __future__ import annotations

from fleetserve.k8s.context import ENGINE_TOKEN_KEY, GPU_ENGINES, Context
from fleetserve.k8s.engine import PROGRESS_ALLOWANCE_S
from fleetserve.k8s.labels import DISCOVERY_LABEL
from fleetserve.observe.rules import RuleTarget, alert, rule_groups


def _meta(ctx: Context, name: str, component: str) -> dict:
    """An object the Prometheus operator must select: our labels, plus --monitoring-label's (which never replace
    ours: selectors and ownership read them)."""
    meta = ctx.meta(name, component)
    meta["labels"] = {**dict(ctx.options.monitoring_labels), **meta["labels"]}
    return meta


def _service_monitor(ctx: Context, name: str, component: str, port: str, scheme: str,
                     path: str = "/metrics", key: str | None = "token") -> dict:
    """`key`: the internal Secret's key Prometheus sends as a bearer token; None for an image run as given, which
    must never see the fleet's token."""
    interval = f"{ctx.endpoint.spec.metrics.scrape_interval_seconds}s"
    endpoint: dict = {"port": port, "path": path, "interval": interval, "scheme": scheme}
    if key is not None:
        endpoint["authorization"] = {"type": "Bearer", "credentials": {"name": ctx.internal_secret, "key": key}}
    if scheme == "https":
        endpoint["tlsConfig"] = {"insecureSkipVerify": True}  # the router's certificate names its public host
    return {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "ServiceMonitor",
        "metadata": _meta(ctx, name, component),
        # the headless Service over the same pods is for the router's DNS: scraping it too counted every engine
        # series twice in any sum without a `service` filter (invocations, concurrency, users' KEDA queries)
        "spec": {"selector": {"matchLabels": ctx.selector(component),
                              "matchExpressions": [{"key": DISCOVERY_LABEL, "operator": "DoesNotExist"}]},
                 "namespaceSelector": {"matchNames": [ctx.namespace]},
                 "endpoints": [endpoint]},
    }


def _rules(ctx: Context) -> dict:
    """The rules of observe/rules.py (the local fleet's Prometheus loads the same ones), with Kubernetes sources:
    replicas from kube-state-metrics, and an alert for engine pods no tier can place."""
    ns, model = ctx.namespace, ctx.endpoint.served_model_name
    engines = f'namespace="{ns}",deployment=~"{ctx.engine_deployments_regex()}"'
    # the first tier's spec is the autoscaler's ask; later tiers serve for its pods that cannot be placed
    # (keda.py): their spec counted too, the alert fired while the overflow served every replica asked for
    desired = f'sum(kube_deployment_spec_replicas{{namespace="{ns}",deployment="{ctx.engine_name(0)}"}})'
    ready = f"sum(kube_deployment_status_replicas_available{{{engines}}})"
    pending = f'kube_pod_status_unschedulable{{namespace="{ns}"}}'
    # the last tier's pods, or any tier's while fewer are ready than asked for: an earlier tier's Pending pods are
    # what the next tier serves for (keda.py), and counting them alone fired "cannot be placed on any tier" in
    # every shortage over 15 minutes with every replica up; the second arm is an overflow that does not take them
    # (KEDA down, its query failing, its maximum reached)
    tiers = [ctx.tier_pods(t, pending) for t in range(len(ctx.tiers))]
    expr = f"sum({tiers[-1]}) > 0"
    if len(tiers) > 1:
        expr = f"{expr} or (sum({' or '.join(tiers)}) > 0 and on() ({ready} < {desired}))"
    unschedulable = alert(
        "FleetserveEngineUnschedulable", expr, "15m",
        "warning",
        f"{model} in {ns}: engine pods cannot be placed on any tier")
    target = RuleTarget.from_endpoint(
        ctx.endpoint, f"fleetserve.{ns}.{ctx.name}", f'namespace="{ns}",service="{ctx.router_name}"',
        # a cold start here also waits for a GPU node, the image and the model (the Deployments' progress deadline
        # allows as much): without it, replicas-not-ready and held-at-zero fired during normal cold starts
        cold_start_allowance_s=PROGRESS_ALLOWANCE_S,
        engines=f'namespace="{ns}",service="{ctx.engine_service}"',
        desired=desired, ready=ready, extra_alerts=(unschedulable,))
    return {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "PrometheusRule",
        "metadata": _meta(ctx, ctx.name, "monitoring"),
        "spec": {"groups": rule_groups(target)},
    }


def monitoring_objects(ctx: Context, warn) -> list[dict]:
    spec = ctx.endpoint.spec
    if not spec.metrics.enabled:
        return []
    out = [_service_monitor(ctx, ctx.router_name, "router", "https" if spec.tls.enabled else "http",
                            "https" if spec.tls.enabled else "http")]
    container = spec.engine.kind == "container"
    told = spec.metrics.model_metrics_path or spec.metrics.model_metrics_port
    if container and not told:
        warn("spec.metrics", f"no engine ServiceMonitor: where the image {spec.engine.image} serves metrics is not "
                             "known (set metrics.modelMetricsPath / modelMetricsPort); HyperPod's model_* series "
                             "come from the router, per replica")
    if spec.engine.kind != "external" and (told or not container):
        # metrics.modelMetricsPath/Port (HyperPod's metrics.modelMetrics): a separate port is named "metrics"
        from fleetserve.k8s.engine import engine_port, metrics_port

        port = "metrics" if metrics_port(ctx) != engine_port(ctx) else "http"
        if port == "metrics" and not spec.engine.command and not container:
            warn("spec.metrics.modelMetricsPort", f"{metrics_port(ctx)}: the {spec.engine.kind} engine serves "
                 f"/metrics on its serving port {engine_port(ctx)} only, so the engine ServiceMonitor scrapes a "
                 "closed port; drop it, or set it to the serving port, unless the image serves metrics there")
        out.append(_service_monitor(ctx, ctx.engine_service, "engine", port, "http",
                                    spec.metrics.model_metrics_path or "/metrics",
                                    None if container else ENGINE_TOKEN_KEY if spec.engine.kind in GPU_ENGINES
                                    else "token"))
    if spec.engine.kind in GPU_ENGINES:
        warn("spec.metrics", f"{spec.engine.kind} exports no fleetserve_kv_tier_* series: the KV-tier ratio and "
                             "panel stay empty (the prefix-cache hit ratio reads the engine's own counters, and "
                             "HyperPod's model_* series come from the router, per replica)")
    out.append(_rules(ctx))
    return out
