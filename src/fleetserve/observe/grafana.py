"""The fleet's Grafana dashboard, built with the Grafana foundation SDK (`fleetserve dashboard grafana`).

The panels are declared once in `PANELS` (title, unit, PromQL per series); the built-in live dashboard
(observe/dashboard.py) draws the same titles from the fleet's own /metrics. Every model query carries the
four filters of the label design (namespace, model_name, model_version, instance_type) as template
variables, so cost and cause can be separated: a slow p95 is split by instance type in its own panel.

`check_exprs` turns each query into plain PromQL (template variables replaced by matching values) so that
`promtool check rules` or a Prometheus's /api/v1/query can parse it; `structure_errors` checks the JSON's
shape (panels, targets, variables, grid) because no dashboard JSON Schema exists offline.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

from fleetserve.observe.rules import SERVER_ERRORS
from fleetserve.observe.vocabulary import MARKED_REASONS

FILTER_LABELS = ("namespace", "model_name", "model_version", "instance_type")
MODEL = ",".join(f'{label}=~"${label}"' for label in FILTER_LABELS)  # the HyperPod model_* series
NAME = 'model_name=~"$model_name"'  # the vLLM-compatible series carry only model_name
RATE = "[$__rate_interval]"
DATASOURCE_VAR = "datasource"


def _quantile(q: float, metric: str, by: str = "") -> str:
    group = f"le, {by}" if by else "le"
    return f"histogram_quantile({q}, sum by ({group}) (rate({metric}_bucket{{{MODEL}}}{RATE})))"


@dataclass(frozen=True)
class Series:
    legend: str
    expr: str


@dataclass(frozen=True)
class PanelDef:
    key: str  # also the id of the live dashboard's panel
    title: str
    unit: str  # Grafana unit id
    series: tuple[Series, ...]
    description: str = ""
    width: int = 12


# series with no model label (the engines' KV tiers, the router's): on Kubernetes their targets' namespace
NAMESPACE = 'namespace=~"$namespace"'
_TIER_HITS = f"rate(fleetserve_kv_tier_hits_total{{{NAMESPACE}}}{RATE})"
ERROR_SERIES = ("server (5xx, 429)", "client (other 4xx)")  # rules.SERVER_ERRORS spend the error budget
# the engine Deployments of every tier (NAME-engine, NAME-engine-t1, ...), read from kube-state-metrics where no
# supervisor exports the autoscaler's gauges (Kubernetes)
ENGINE_DEPLOYMENTS = f'{NAMESPACE},deployment=~".+-engine(-t[0-9]+)?"'
# what the autoscaler asks for is the first tier's spec; later tiers stand in for its pods that cannot be placed
# (k8s/keda.py), so counting their spec too doubled "desired" while the overflow served
FIRST_TIER_DEPLOYMENTS = f'{NAMESPACE},deployment=~".+-engine(-t0)?"'
# Karpenter's per-node gauge; `render k8s` names an endpoint's NodePools `<namespace>-<name>-t<tier>` (karpenter.py)
KARPENTER_NODES = 'karpenter_nodes_allocatable{resource_type="cpu",nodepool=~"$namespace-.+"}'
PANELS: tuple[PanelDef, ...] = (
    PanelDef("latency", "Invocation latency (p50 / p95 / p99)", "ms",
             tuple(Series(f"p{int(q * 100)}", _quantile(q, "model_latency_milliseconds")) for q in (0.5, 0.95, 0.99)),
             "model_latency_milliseconds: end-to-end latency of a model invocation"),
    PanelDef("ttfb", "Time to first byte (p50 / p95 / p99)", "ms",
             tuple(Series(f"p{int(q * 100)}", _quantile(q, "model_ttfb_milliseconds")) for q in (0.5, 0.95, 0.99)),
             "model_ttfb_milliseconds: time to the first streamed byte"),
    PanelDef("concurrency", "Concurrent requests", "short",
             (Series("{{instance_type}}", f"sum by (instance_type) (model_concurrent_requests{{{MODEL}}})"),),
             "model_concurrent_requests, per instance type"),
    PanelDef("errors", "Error rate", "percentunit",
             (Series(ERROR_SERIES[0], f"sum(rate(model_errors_total{{{MODEL},{SERVER_ERRORS}}}{RATE})) / "
                                      f"sum(rate(model_invocations_total{{{MODEL}}}{RATE}))"),
              # no client error yet is no series at all (the engines make only 429 and 5xx at 0): 0 %, not "no
              # data", while there are invocations
              Series(ERROR_SERIES[1], f'(sum(rate(model_errors_total{{{MODEL},status=~"4..",status!="429"}}'
                                      f"{RATE})) or vector(0)) / sum(rate(model_invocations_total{{{MODEL}}}{RATE}))"),
              ),
             "model_errors_total / model_invocations_total: the server's errors spend the error budget, a "
             "client's bad requests do not"),
    PanelDef("throughput", "Invocations per second", "reqps",
             (Series("{{model_version}}",
                     f"sum by (model_version) (rate(model_invocations_total{{{MODEL}}}{RATE}))"),),
             "model_invocations_total, per model version"),
    PanelDef("latency_by_instance", "p95 latency by instance type", "ms",
             (Series("{{instance_type}}", _quantile(0.95, "model_latency_milliseconds", "instance_type")),),
             "When it is slow, suspect the instance type (and cache reuse) before the replica count"),
    PanelDef("cache_tiers", "KV cache hit rate per tier", "percentunit",
             (Series("{{tier}}",
                     f"sum by (tier) ({_TIER_HITS}) / ignoring (tier) group_left sum({_TIER_HITS}) "
                     f"* ignoring (tier) group_left () (sum(rate(vllm:prefix_cache_hits_total{{{NAME},{NAMESPACE}}}"
                     f"{RATE})) / sum(rate(vllm:prefix_cache_queries_total{{{NAME},{NAMESPACE}}}{RATE})))"),),
             "Share of looked-up prompt blocks found in each tier (engine memory, L1 CPU, L2 Redis): "
             "fleetserve_kv_tier_hits_total split of vllm:prefix_cache_hits/queries"),
    PanelDef("cached_tokens", "Cached prompt tokens: predicted vs reported", "suffix: tokens/s",
             (Series("{{source}}",
                     f"sum by (source) (rate(fleetserve_router_cached_tokens_total{{{NAMESPACE}}}{RATE}))"),),
             "fleetserve_router_cached_tokens_total{source}: what the routing policy expected the replica to "
             "have cached, and what the engine reported (cache-aware policies only: empty under leastload, "
             "roundrobin and session)"),
    PanelDef("replicas", "Replicas desired / ready", "short",
             # the supervisor's series carry the fleet's namespace (its scrape target's label): a Prometheus of
             # several fleets showed the largest count and the total cost of all of them under any namespace
             (Series("desired", f"sum(fleetserve_autoscaler_desired_replicas{{{NAMESPACE}}}) or "
                                f"sum(kube_deployment_spec_replicas{{{FIRST_TIER_DEPLOYMENTS}}})"),
              Series("ready", f"sum(fleetserve_autoscaler_ready_replicas{{{NAMESPACE}}}) or "
                              f"sum(kube_deployment_status_replicas_available{{{ENGINE_DEPLOYMENTS}}}) or "
                              # engine Deployments whose names were hashed (long endpoint names) lose the -engine
                              # suffix: then what a router sees healthy, by name of nothing
                              f"max(sum by (pod) (fleetserve_router_backend_healthy{{{NAMESPACE}}}))")),
             "The autoscaler's target and the replicas answering /health (on Kubernetes: the engine Deployments' "
             "spec and available replicas, from kube-state-metrics, for the namespace, or the backends a router "
             "sees healthy when the Deployments' names were hashed); decisions are annotations (fleetserve up "
             "only)"),
    PanelDef("nodes", "Nodes by instance type", "short",
             (Series("{{instance_type}} {{capacity_type}}",
                     'sum by (instance_type, capacity_type) (fleetserve_nodes{instance_type=~"$instance_type",'
                     f'{NAMESPACE}}}) or '
                     f"count by (instance_type, capacity_type) ({KARPENTER_NODES})"),),
             "fleetserve_nodes by instance and capacity type: the fleet supervisor's (fleetserve up); on "
             "Kubernetes, the nodes of the namespace's NodePools from Karpenter's karpenter_nodes_allocatable "
             "(one series per node and resource: the cpu one is counted)"),
    PanelDef("cost", "Cost per hour", "currencyUSD",
             (Series("$/h", f"sum(fleetserve_cost_per_hour_dollars{{{NAMESPACE}}})"),),
             "fleetserve_cost_per_hour_dollars: what the fleet's nodes cost, from the fleet supervisor (fleetserve "
             "up); Kubernetes has no price source, so the panel is empty there"),
    # a request that woke the fleet from zero waited a cold start in the router, before any engine saw it: the
    # latency panels (the engines' own figures) showed 50 ms for a 6.9 s answer
    PanelDef("held", "Wait for a replica (scale from zero)", "ms",
             tuple(Series(f"p{int(q * 100)}", f"histogram_quantile({q}, sum by (le) (rate("
                                             f"fleetserve_router_buffer_wait_seconds_bucket{{{NAMESPACE}}}{RATE})))"
                                             " * 1000") for q in (0.5, 0.95)),
             "fleetserve_router_buffer_wait_seconds: how long the router held requests while no replica was "
             "ready (a wake from zero, a fleet whose replicas all failed); the engines' latency starts after it"),
)

# per namespace as every panel; over the data source's rate interval (at least four scrapes: a fixed [1m] held
# fewer than two samples at a 60 s scrape interval and never marked anything)
DECISIONS = ('sum by (reason) (increase(fleetserve_autoscaler_decisions_total{reason=~"'
             + "|".join(MARKED_REASONS) + f'",{NAMESPACE}}}{RATE})) > 0')
VARIABLE_SOURCE = "model_invocations_total"


def _variable_query(label: str) -> str:
    earlier = FILTER_LABELS[:FILTER_LABELS.index(label)]
    selector = ",".join(f'{e}=~"${e}"' for e in earlier)
    return f"label_values({VARIABLE_SOURCE}{{{selector}}}, {label})" if selector else \
        f"label_values({VARIABLE_SOURCE}, {label})"


def build_dashboard(title: str = "fleetserve", uid: str = "fleetserve") -> dict:
    """The dashboard as a JSON-ready dict (Grafana 11.6 schema)."""
    from grafana_foundation_sdk.builders import dashboard as gd
    from grafana_foundation_sdk.builders.prometheus import Dataquery
    from grafana_foundation_sdk.builders.timeseries import Panel as TimeSeries
    from grafana_foundation_sdk.cog.encoder import JSONEncoder
    from grafana_foundation_sdk.models.dashboard import (
        DataSourceRef,
        VariableOption,
        VariableRefresh,
        VariableSort,
    )

    ds = DataSourceRef(type_val="prometheus", uid=f"${{{DATASOURCE_VAR}}}")
    board = (gd.Dashboard(title).uid(uid).tags(["fleetserve", "llm-inference"]).refresh("30s")
             .time("now-1h", "now").timezone("browser")
             .description("fleetserve fleet: invocation latency, TTFB, concurrency, errors; KV cache tiers; "
                          "routing predictions; replicas, nodes and cost. Filters: namespace, model_name, "
                          "model_version, instance_type."))
    board = board.with_variable(gd.DatasourceVariable(DATASOURCE_VAR).label("Data source").type("prometheus"))
    for label in FILTER_LABELS:
        board = board.with_variable(
            gd.QueryVariable(label).label(label).datasource(ds).query(_variable_query(label))
            .multi(True).include_all(True).all_value(".*").refresh(VariableRefresh.ON_TIME_RANGE_CHANGED)
            .sort(VariableSort.ALPHABETICAL_ASC).current(VariableOption(selected=True, text="All", value="$__all")))
    board = board.annotation(
        gd.AnnotationQuery().name("Scaling decisions").datasource(ds).enable(True).icon_color("orange")
        .expr(DECISIONS))
    rows = (("Model: the first metrics to look at", PANELS[:6]), ("Cache and routing", PANELS[6:8]),
            ("Capacity and cost", PANELS[8:]))
    for row_title, panels in rows:
        board = board.with_row(gd.Row(row_title))
        for p in panels:
            panel = (TimeSeries().title(p.title).description(p.description).datasource(ds).unit(p.unit)
                     .height(8).span(p.width if p.key != "cost" else 12))
            if p.unit == "percentunit":
                panel = panel.min(0)
            for i, s in enumerate(p.series):
                panel = panel.with_target(Dataquery().expr(s.expr).legend_format(s.legend)
                                          .ref_id(chr(ord("A") + i)).datasource(ds))
            board = board.with_panel(panel)
    built = json.loads(json.dumps(board.build(), cls=JSONEncoder))
    next_id = 1
    for panel in built.get("panels", []):  # the builders leave ids unset; Grafana wants them unique
        for inner in [panel, *panel.get("panels", [])]:
            inner["id"], next_id = next_id, next_id + 1
    # annotations need the title field Grafana's Prometheus annotation editor fills in
    for a in built.get("annotations", {}).get("list", []):
        if a.get("expr") == DECISIONS:
            a.update({"titleFormat": "scaling: {{reason}}", "useValueForTime": False, "step": "30s"})
    return built


# --- validation helpers (tests, and `fleetserve dashboard grafana --check`) ----------------------------------

def panel_targets(board: dict) -> list[tuple[str, dict]]:
    """(panel title, target) for every target, including panels inside collapsed rows."""
    found = []
    for panel in board.get("panels", []):
        for inner in [panel, *panel.get("panels", [])]:
            for t in inner.get("targets", []) or []:
                found.append((inner.get("title", ""), t))
    return found


def check_exprs(board: dict) -> list[str]:
    """Every PromQL in the dashboard (targets and annotations), with template variables made concrete."""
    exprs = [t["expr"] for _title, t in panel_targets(board)]
    exprs += [a["expr"] for a in board.get("annotations", {}).get("list", []) if a.get("expr")]
    return [concrete(e) for e in exprs]


def concrete(expr: str) -> str:
    """Grafana's template variables replaced the way Grafana would (All -> .*, intervals -> durations)."""
    expr = expr.replace("$__rate_interval", "5m").replace("$__interval", "1m").replace("$__range", "1h")
    return re.sub(r"\$\{?(\w+)\}?", ".*", expr)


def structure_errors(board: dict) -> list[str]:
    """Shape checks Grafana's importer relies on; an empty list when the dashboard is well formed."""
    errors = []
    for key in ("title", "uid", "panels", "templating", "schemaVersion"):
        if key not in board:
            errors.append(f"missing top-level key {key!r}")
    ids, panels = set(), []
    for panel in board.get("panels", []):
        panels += [panel, *panel.get("panels", [])]
    for p in panels:
        pid = p.get("id")
        if not isinstance(pid, int) or pid in ids:
            errors.append(f"panel {p.get('title')!r}: id {pid!r} missing or repeated")
        ids.add(pid)
        pos = p.get("gridPos") or {}
        if not all(isinstance(pos.get(k), int) for k in "hwxy") or pos["x"] + pos["w"] > 24:
            errors.append(f"panel {p.get('title')!r}: bad gridPos {pos}")
        if p.get("type") == "row":
            continue
        if not p.get("title"):
            errors.append(f"panel id {pid}: no title")
        targets = p.get("targets") or []
        if not targets:
            errors.append(f"panel {p.get('title')!r}: no targets")
        for t in targets:
            if not t.get("expr") or not t.get("refId"):
                errors.append(f"panel {p.get('title')!r}: target without expr or refId")
        if not isinstance(p.get("datasource"), dict):
            errors.append(f"panel {p.get('title')!r}: datasource must be a reference object")
    variables = {v.get("name"): v for v in board.get("templating", {}).get("list", [])}
    if variables.get(DATASOURCE_VAR, {}).get("type") != "datasource":
        errors.append("no datasource variable")
    for label in FILTER_LABELS:
        v = variables.get(label)
        if v is None or v.get("type") != "query" or "label_values" not in json.dumps(v.get("query")):
            errors.append(f"no query variable for {label}")
    return errors
