"""KEDA ScaledObjects from the live controller's `ScalingPolicy` (autoscale/policy.py), field by field.

- min_replicas / max_replicas -> spec.minReplicaCount / maxReplicaCount;
- polling_interval, cooldown, initial_cooldown -> pollingInterval, cooldownPeriod, initialCooldownPeriod;
- up_window / down_window -> advanced.horizontalPodAutoscalerConfig.behavior.scaleUp/scaleDown
  .stabilizationWindowSeconds; up_policies / down_policies -> behavior.*.policies (Percent/Pods per
  periodSeconds) with selectPolicy Max (the policy allowing the larger change, as `_rate_limit` does);
- triggers[i] (metric, target, activation_target) -> triggers[i]: prometheus, threshold,
  activationThreshold, metricType (AverageValue for totals, Value for latencies: `Trigger.kind`);
- fallback_threshold / fallback_replicas -> fallback.failureThreshold / replicas;
- schedule windows (cron, zone, floor) + schedule_lead -> cron triggers: start (moved earlier by the
  lead), end, timezone, desiredReplicas; a cron trigger is active for its whole window, so cooldownPeriod
  counts from its end, as `decide` counts an open window as activity;
- requests pending at zero activate -> a prometheus trigger on fleetserve_router_pending_requests with
  activationThreshold 0; requests routed to replicas in the rate window are activity (the cooldown to zero waits
  for them) -> a trigger on fleetserve_router_requests_routed_total, activationThreshold 0.

The built-in metrics are read from the router, as the live controller reads the router's /admin/load:
concurrency = requests in flight at the engines + held at the router; queue_depth = engines' waiting
(`vllm:num_requests_waiting`, SGLang's `sglang:num_queue_reqs`; the built-in engine exports vLLM's name)
+ held; request_rate = answered requests per second; ttft_p95 = the router's time to first byte less any wait for
a cold start in its scale-from-zero buffer, p95 over 1 m (a cold start is not a reason for more replicas).
Later placement tiers get an overflow ScaledObject: they scale on the earlier tier's pods that stay
unschedulable for the placement's unavailable-offering TTL (the fall-through of capacity/placement.py).
"""

from __future__ import annotations

import re

from fleetserve.api.protocol import GENERATION_PATHS
from fleetserve.autoscale.policy import RatePolicy, ScalingPolicy
from fleetserve.autoscale.schedule import Cron
from fleetserve.k8s.context import Context, num
from fleetserve.k8s.labels import TIER_LABEL, dns_name
from fleetserve.observe.rules import rate_window
from fleetserve.router.engine_queue import QUEUE_GAUGES
from fleetserve.router.invocations import INVOCATIONS_PATH

PENDING_METRIC = "fleetserve_router_pending_requests"
QUEUED_METRIC = "fleetserve_router_queued_requests"  # requests waiting for a replica slot (requestLimits)
ACTIVITY_THRESHOLD = 1e9  # the activity trigger's: ceil(routed requests / this) is 1 whatever the traffic


def _router_sel(ctx: Context) -> str:
    return f'namespace="{ctx.namespace}",service="{ctx.router_name}"'


def _engine_sel(ctx: Context) -> str:
    return f'namespace="{ctx.namespace}",service="{ctx.engine_service}"'


def _pending(ctx: Context) -> str:
    """The router's buffer at zero: a gauge without labels, so a scraped router always has its sample."""
    return f"sum({PENDING_METRIC}{{{_router_sel(ctx)}}})"


def _or0(ctx: Context, expr: str) -> str:
    """`expr`, or 0 while the router is scraped and `expr` has no series (no replica, no request yet): nothing when
    the router is not scraped either. `or vector(0)` made a lost scrape (a wrong token or selector) read as an
    idle fleet: ignoreNullValues passed the 0, the fleet scaled to zero and never woke, and the fallback never
    applied; now such a query is empty, KEDA counts a failure (ignoreNullValues false) and the fallback holds."""
    return f"({expr} or 0 * {_pending(ctx)})"


def _window(ctx: Context) -> str:
    """The triggers' rate window: a minute, or four scrapes when they are slower (observe/rules.rate_window)."""
    return rate_window("1m", ctx.endpoint.spec.metrics.scrape_interval_seconds)


def builtin_query(ctx: Context, metric: str) -> str:
    r, e = _router_sel(ctx), _engine_sel(ctx)
    pending = _pending(ctx)
    if metric == "concurrency":
        return f"{_or0(ctx, f'sum(fleetserve_router_backend_in_flight{{{r}}})')} + {pending}"
    if metric == "queue_depth":
        # the engines' own waiting gauge: SGLang names it sglang:num_queue_reqs (vLLM's name read nothing there,
        # and `or vector(0)` hid it: queue_depth scaling saw only the router's buffer)
        waiting = QUEUE_GAUGES["sglang" if ctx.endpoint.spec.engine.kind == "sglang" else "vllm"][0]
        # plus the requests the router queues for a slot (requestLimits), as /admin/load and the simulator count
        queued = _or0(ctx, f"sum({QUEUED_METRIC}{{{r}}})")
        return f"{_or0(ctx, f'sum({waiting}{{{e}}})')} + {queued} + {pending}"
    if metric == "request_rate":
        # model requests only, as the local controller counts them (/admin/load): every path counted, a client
        # polling GET /v1/models scaled a Kubernetes fleet and not a local one
        paths = "|".join(sorted(GENERATION_PATHS | {INVOCATIONS_PATH}))
        # as they arrive (requests_total counts an answer when it ends: a rush of long streams read minutes late)
        return _or0(ctx, f'sum(rate(fleetserve_router_requests_received_total{{{r},path=~"{paths}"}}'
                         f'[{_window(ctx)}]))')
    if metric == "ttft_p95":
        # NaN while nothing was served in the window (an idle fleet): `>= 0` drops it and `_or0` reads 0, as for
        # the other triggers; KEDA releases before kedacore/keda#7522 turned the NaN into -9.2e15
        p95 = ("histogram_quantile(0.95, sum by (le) "
               f"(rate(fleetserve_router_served_ttfb_milliseconds_bucket{{{r}}}[{_window(ctx)}])))")
        return _or0(ctx, f"({p95} >= 0)")
    raise ValueError(f"no query for metric {metric!r}")


def _prometheus(name: str, server: str, query: str, threshold: float, activation: float, kind: str,
                ignore_null: bool = True) -> dict:
    """`ignore_null`: an empty answer reads 0 (KEDA's default); our own queries of the router are empty only when
    it is not scraped, which must count as a failure (fallback), not as an idle fleet."""
    return {
        "type": "prometheus",
        "name": name,
        "metricType": "AverageValue" if kind == "average" else "Value",
        "metadata": {"serverAddress": server, "query": query, "threshold": num(threshold),
                     "activationThreshold": num(activation), "ignoreNullValues": "true" if ignore_null else "false"},
    }


# Amazon Managed Service for Prometheus: queries must be SigV4-signed, which KEDA does with `awsRegion` and an
# `aws` pod identity (its operator's IAM role); unsigned, every query of HyperPod's example trigger failed
AMP_SERVER = re.compile(r"^https://aps-workspaces\.([a-z0-9-]+)\.amazonaws\.com/")


def amp_auth_name(ctx: Context) -> str:
    return dns_name(ctx.name, "amp")


def amp_auth(ctx: Context) -> dict:
    """The TriggerAuthentication the AMP triggers refer to: the KEDA operator's own AWS identity."""
    return {"apiVersion": "keda.sh/v1alpha1", "kind": "TriggerAuthentication",
            "metadata": ctx.meta(amp_auth_name(ctx), "engine"),
            "spec": {"podIdentity": {"provider": "aws", "identityOwner": "keda"}}}


def _signed_for_amp(ctx: Context, trigger: dict) -> None:
    match = AMP_SERVER.match(trigger["metadata"]["serverAddress"] or "")
    if match:
        trigger["metadata"]["awsRegion"] = match.group(1)
        trigger["authenticationRef"] = {"name": amp_auth_name(ctx)}


def _rates(policies: tuple[RatePolicy, ...]) -> list[dict]:
    return [{"type": "Percent" if p.kind == "percent" else "Pods", "value": int(p.value),
             "periodSeconds": int(p.period)} for p in policies]


def shift_earlier(cron: Cron, seconds: float) -> str | None:
    """The cron text fired `seconds` earlier (whole minutes, rounded up), or None where no cron can say it."""
    from fleetserve.autoscale.schedule import lead_minutes

    return cron.shifted(-lead_minutes(seconds))


def _lead_problem(window, lead: float) -> str | None:
    """Why KEDA's cron trigger, its start moved `lead` seconds earlier, reads the window otherwise than fleetserve
    (which raises the floor `lead` early and holds it to the end): a lead as long as the gap between an end and
    the next start makes that start fire before the end, and KEDA then holds the floor only from it to the end."""
    from fleetserve.autoscale.schedule import OVERLAP_DAYS, OVERLAP_FROM

    spans = window.intervals(OVERLAP_FROM, OVERLAP_DAYS)
    for (_, end), (start, _) in zip(spans, spans[1:], strict=False):
        if (start - end).total_seconds() <= lead:
            return (f"scheduleLeadTime ({lead:g} s) is not shorter than the gap between its end at {end.isoformat()} "
                    f"and its next start at {start.isoformat()}: KEDA's cron trigger, started that much earlier, "
                    "would open before the end and hold the floor only until it; fleetserve and the simulator hold "
                    "it the whole window. Shorten the lead below the gap")
    return None


def triggers(ctx: Context, policy: ScalingPolicy, warn) -> list[dict]:
    spec_triggers = ctx.endpoint.spec.autoscaling.triggers if ctx.endpoint.spec.autoscaling else []
    server = ctx.options.prometheus_url
    out = []
    for i, trig in enumerate(policy.triggers):
        if trig.metric == "prometheus":
            # the policy keeps metric/target/activation; the query and server stay in the spec, same index
            st = spec_triggers[i]  # HyperPod's model_* series exist in front of vLLM and SGLang too: the router
            # counts them (k8s/router.model_metric_args), as HyperPod's reverse-proxy sidecar does
            out.append(_prometheus(f"t{i}-prometheus", st.server_address or server, st.query, trig.target,
                                   trig.activation_target, trig.kind))
        else:
            # every built-in query is empty only when the router is not scraped (ttft_p95's idle NaN reads 0 now,
            # builtin_query): KEDA counts that as a failure and the fallback holds
            out.append(_prometheus(f"t{i}-{trig.metric.replace('_', '-')}", server, builtin_query(ctx, trig.metric),
                                   trig.target, trig.activation_target, trig.kind, ignore_null=False))
    for i, st in enumerate(spec_triggers[:len(out)]):
        # KEDA-only trigger settings (HyperPod's metricType, useCachedMetrics, customHeaders, namespace)
        if st.metric_type:
            out[i]["metricType"] = st.metric_type
        if st.use_cached_metrics:
            out[i]["useCachedMetrics"] = True
        if st.custom_headers:
            out[i]["metadata"]["customHeaders"] = st.custom_headers
        if st.namespace:
            out[i]["metadata"]["namespace"] = st.namespace
    if policy.min_replicas == 0:
        # it activates and asks for one replica, never more: the triggers size the fleet, as the local controller
        # wakes to max(1, floor, the triggers' count). Its threshold is the most the routers can hold (bufferSize
        # per worker), so ceil(pending / threshold) is 1. It had been the first AverageValue trigger's target, or
        # 1: with only a ttft_p95 trigger a burst of N requests held at zero woke min(N, maxReplicaCount) GPU pods
        router = ctx.endpoint.spec.router  # each worker of each router pod holds its own buffer
        most = max(1, router.buffer_size * max(1, router.workers) * max(1, ctx.options.router_replicas))
        out.append(_prometheus("activation-pending", server, _pending(ctx), most, 0.0, "average",
                               ignore_null=False))
        # requests routed to replicas in the window are activity, as the local controller counts them since its
        # last poll (autoscale/policy.py): a fleet serving one short request every few seconds had no request in
        # flight at most polls and went to zero and cold-started over and over. Never more than one replica (the
        # threshold is out of any count's reach), and nothing at zero, where nothing is routed
        routed = f"sum(increase(fleetserve_router_requests_routed_total{{{_router_sel(ctx)}}}[{_window(ctx)}]))"
        out.append(_prometheus("activity-routed", server, _or0(ctx, routed), ACTIVITY_THRESHOLD, 0.0, "average",
                               ignore_null=False))
        elsewhere = sorted({st.server_address for st in spec_triggers if st.server_address
                            and st.server_address.rstrip("/") != server.rstrip("/")})
        if elsewhere:  # an Amazon Managed Prometheus workspace, say: the wake-up asked a server that may not exist
            warn("spec.autoscaling.triggers", f"the triggers that wake the endpoint from zero (activation-pending, "
                 f"activity-routed) read the router's series from {server} (--prometheus-url), while yours ask "
                 f"{', '.join(elsewhere)}: unless that Prometheus scrapes the routers, the endpoint never wakes from "
                 "zero; pass --prometheus-url with the server your triggers use")
    for i, window in enumerate(policy.schedule.windows):
        if window.floor <= policy.min_replicas:
            # no floor above minReplicaCount: nothing here or in the simulator. KEDA's cron trigger is active for its
            # whole window whatever its desiredReplicas (kedacore/keda#5586), so it held a replica up from zero
            continue
        start = shift_earlier(window.start, policy.schedule_lead)
        if start is None:
            warn(f"spec.autoscaling.schedules[{i}].start",
                 f"cannot move {window.start.text!r} earlier by scheduleLeadTime in cron; the cron trigger starts "
                 "on time")
            start = window.start.text
        elif policy.schedule_lead > 0 and (problem := _lead_problem(window, policy.schedule_lead)):
            # a whole day's lead gives the start's own text back: the check had been skipped there
            warn(f"spec.autoscaling.schedules[{i}]", problem)
        if start == window.end.text:  # KEDA's cron scaler refuses a start equal to its end
            warn(f"spec.autoscaling.schedules[{i}].start",
                 f"{window.start.text!r} moved earlier by scheduleLeadTime is its end {window.end.text!r}, which "
                 "KEDA's cron scaler refuses; the cron trigger starts on time")
            start = window.start.text
        # a DNS-label name, as KEDA's metric names need ("Bad Name!" went in as given)
        # metricType said, not left to the default: KEDA before 2.17 refuses a fallback beside any trigger whose
        # metricType field is not AverageValue, an empty one included
        out.append({"type": "cron", "name": dns_name("floor", window.name), "metricType": "AverageValue",
                    "metadata": {"timezone": window.tz.key, "start": start, "end": window.end.text,
                                 "desiredReplicas": str(window.floor)}})
    for trigger in out:  # every query of AMP, the activation on pending requests included
        if trigger["type"] == "prometheus":
            _signed_for_amp(ctx, trigger)
    return out


def scaled_object(ctx: Context, policy: ScalingPolicy, warn) -> dict:
    target = ctx.engine_name(0)
    spec: dict = {
        "scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": target},
        "pollingInterval": max(1, int(policy.polling_interval)),  # 0 s: KEDA polls without a pause
        "cooldownPeriod": int(policy.cooldown),
        "initialCooldownPeriod": int(policy.initial_cooldown),
        "minReplicaCount": policy.min_replicas,
        "maxReplicaCount": policy.max_replicas,
        "advanced": {"horizontalPodAutoscalerConfig": {"behavior": {
            "scaleUp": {"stabilizationWindowSeconds": int(policy.up_window), "selectPolicy": "Max",
                        "policies": _rates(policy.up_policies)},
            "scaleDown": {"stabilizationWindowSeconds": int(policy.down_window), "selectPolicy": "Max",
                          "policies": _rates(policy.down_policies)},
        }}},
        "triggers": triggers(ctx, policy, warn),
    }
    if policy.fallback_threshold is not None:
        spec["fallback"] = {"failureThreshold": policy.fallback_threshold, "replicas": policy.fallback_replicas}
        uncovered = [f"triggers[{i}] ({t.metric})" for i, t in enumerate(policy.triggers) if t.kind == "value"]
        if uncovered:
            warn("spec.autoscaling.fallback", f"{', '.join(uncovered)} (metricType Value) fall back only on KEDA "
                                              "2.18 or later, as the local controller and the simulator do; older "
                                              "KEDA refuses a fallback over a Value trigger")
    fields = {"polling_interval": "pollingInterval", "cooldown": "cooldownPeriod",
              "initial_cooldown": "initialCooldownPeriod", "up_window": "scaleUpStabilizationTime",
              "down_window": "scaleDownStabilizationTime"}  # the spec's names: the warnings named the policy's
    for name, field in fields.items():
        value = getattr(policy, name)
        if name == "polling_interval" and value < 1:
            warn("spec.autoscaling.pollingInterval", f"{value:g}s is raised to KEDA's least, 1 s (0 would poll "
                                                      "the metrics without a pause)")
        elif not float(value).is_integer():
            warn(f"spec.autoscaling.{field}", f"{value:g}s is rounded down to whole seconds for KEDA")
    return {"apiVersion": "keda.sh/v1alpha1", "kind": "ScaledObject",
            "metadata": ctx.meta(target, "engine", **{TIER_LABEL: ctx.tier_id(0)}), "spec": spec}


OVERFLOW_STEP_S = 15  # the overflow query's subquery resolution


def overflow_object(ctx: Context, tier: int, max_replicas: int) -> dict:
    """Tier k > 0 takes the replicas that tier k-1 cannot place (pods unschedulable for the whole ICE TTL).

    kube-state-metrics writes `kube_pod_status_unschedulable` (1) only while a pod is unschedulable, and no sample
    at all once it is placed, so `min_over_time` over the TTL was 1 from a pod's first unschedulable second: every
    pod waiting its minute or two for Karpenter's new node started a second, dearer node on the next tier. A pod
    counts once it has been unschedulable at every 15 s step spanning the TTL (rounded up to 15 s): `steps`
    steps, the first and the last (steps - 1) x 15 s apart, in a range that holds no more than steps + 1 of them
    (Prometheus 3 reads a range left-open, 2 closed). A scrape missed (kube-state-metrics restarting) is bridged
    by the series' max over a minute: its gap had started every pod's count again."""
    ttl = int(ctx.endpoint.spec.capacity.unavailable_offering_ttl) or 60
    steps = -(-ttl // OVERFLOW_STEP_S) + 1
    pending = ctx.tier_pods(tier - 1, f'kube_pod_status_unschedulable{{namespace="{ctx.namespace}"}}', bridge="1m")
    window = steps * OVERFLOW_STEP_S
    query = f'count(count_over_time(({pending})[{window}s:{OVERFLOW_STEP_S}s]) >= {steps}) or vector(0)'
    name = ctx.engine_name(tier)
    trigger = _prometheus("overflow", ctx.options.prometheus_url, query, 1.0, 0.0, "average")
    _signed_for_amp(ctx, trigger)
    return {
        "apiVersion": "keda.sh/v1alpha1",
        "kind": "ScaledObject",
        "metadata": ctx.meta(name, "engine", **{TIER_LABEL: ctx.tier_id(tier)}),
        "spec": {
            "scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": name},
            "pollingInterval": 30,
            "cooldownPeriod": 300,
            "minReplicaCount": 0,
            "maxReplicaCount": max_replicas,
            "triggers": [trigger],
        },
    }


def keda_objects(ctx: Context, warn) -> list[dict]:
    spec = ctx.endpoint.spec
    if spec.engine.kind == "external":
        return []
    out = []
    if ctx.policy is not None:
        out.append(scaled_object(ctx, ctx.policy, warn))
        if not spec.metrics.enabled:
            warn("spec.metrics.enabled", "false: no ServiceMonitor scrapes the router, whose series every built-in "
                                         "trigger reads (and the activation at zero replicas): they fail on every "
                                         "poll and KEDA holds the fallback, or the fleet never wakes from zero; "
                                         "enable metrics, or have your Prometheus scrape NAME-router")
    most = ctx.policy.max_replicas if ctx.policy is not None else max(spec.replicas, 1)
    out += [overflow_object(ctx, k, most) for k in range(1, len(ctx.tiers))]
    if any("authenticationRef" in t for o in out for t in o["spec"]["triggers"]):
        warn("spec.autoscaling.triggers", "Amazon Managed Service for Prometheus: queries are signed with the KEDA "
                                          f"operator's AWS identity (TriggerAuthentication {amp_auth_name(ctx)}); its "
                                          "service account needs an IAM role with aps:QueryMetrics (EKS Pod "
                                          "Identity or IRSA)")
        out.append(amp_auth(ctx))
    return out


__all__ = ["keda_objects", "scaled_object", "builtin_query", "shift_earlier"]


def scaler_warnings(observed) -> list[str]:
    """ScaledObjects KEDA holds as not ready (a trigger it cannot evaluate, a target it refuses): their
    Deployments are not autoscaled, and the Endpoint's status had read DeploymentComplete without a word."""
    out = []
    for obj in observed:
        if obj.get("kind") != "ScaledObject":
            continue
        for cond in (obj.get("status") or {}).get("conditions") or ():
            if cond.get("type") == "Ready" and cond.get("status") == "False":
                why = ": ".join(str(x) for x in (cond.get("reason"), cond.get("message")) if x) or "no reason given"
                name = (obj.get("metadata") or {}).get("name", "?")
                target = ((obj.get("spec") or {}).get("scaleTargetRef") or {}).get("name", "its target")
                out.append(f"ScaledObject {name} is not ready ({why}): KEDA does not scale {target}")
    return out
