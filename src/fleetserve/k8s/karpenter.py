"""Karpenter NodePools, one per placement tier, weighted by the priority list.

Karpenter tries NodePools by descending `weight`; tier 0 gets the highest. Each pool requires its tier's
instance types (`node.kubernetes.io/instance-type`, EC2 names: HyperPod's `ml.` prefix is dropped as
`Catalog.canonical` does) and capacity types; zones come from `--zone` or the spec's nodeAffinity terms.
Disruption comes from the same `ConsolidationPolicy` the local fleet and the simulator consolidate with:
consolidationPolicy, consolidateAfter, budgets (a budget's cron window is written in UTC, the only zone
Karpenter knows; a zone with DST shifts the window by an hour for part of the year, and a warning says so).
Limits: GPUs (or vCPUs) for the autoscaling maximum of replicas on the tier's largest type.
NodePools are cluster-scoped, so their names carry the namespace.
"""

from __future__ import annotations

import hashlib
import math
from datetime import UTC, datetime
from zoneinfo import ZoneInfo

from fleetserve.capacity.consolidation import Budget
from fleetserve.capacity.placement import (
    CAPACITY_TYPE_LABEL,
    INSTANCE_TYPE_LABEL,
    ZONE_LABEL,
    replica_request,
    replicas_per_node,
)
from fleetserve.k8s.context import Context
from fleetserve.k8s.engine import GPU, ROLLOUT_SURGE, no_zone_left, required_extras
from fleetserve.k8s.labels import ENDPOINT_LABEL, TIER_LABEL, dns_name, node_owner

REFERENCE_DAY = datetime(2026, 1, 15, 12, tzinfo=UTC)  # a fixed instant: output must not depend on today


def weight(tier: int, tiers: int) -> int:
    step = max(1, min(10, 99 // max(tiers - 1, 1)))
    return max(1, 100 - tier * step)


def nodepool_name(ctx: Context, tier: int) -> str:
    """`NAMESPACE-NAME-DIGEST-tK`: NodePools are cluster-wide, and `team-a`/`chat` and `team`/`a-chat` had both made
    `team-a-chat-t0` (the second apply took the first endpoint's pool, whose pods then never got a node); the
    digest of namespace/name keeps them apart."""
    digest = hashlib.sha256(f"{ctx.namespace}/{ctx.name}".encode()).hexdigest()[:6]
    return dns_name(ctx.namespace, ctx.name, digest, f"t{ctx.tier_id(tier)}")


def _duration(seconds: float) -> str:
    s = int(seconds)
    return f"{s // 3600}h" if s and s % 3600 == 0 else f"{s // 60}m" if s and s % 60 == 0 else f"{s}s"


def _budget_duration(seconds: float, index: int, warn) -> str:
    """Karpenter v1 takes a budget's duration in whole minutes (its CRD's pattern: `90s` refused the NodePool, and
    the operator retried the same API error for ever): rounded up, with a warning when that changed it."""
    minutes = math.ceil(seconds / 60)
    if minutes * 60 != seconds:
        warn(f"spec.capacity.consolidation.budgets[{index}].durationSeconds",
             f"{seconds:g} s: Karpenter budgets last whole minutes; rendered as {minutes} min (the local fleet and "
             "the simulator keep the exact duration)")
    return _duration(minutes * 60)


def _whole_seconds(seconds: float, path: str, warn) -> str:
    whole = math.ceil(seconds)
    if whole != seconds:
        warn(path, f"{seconds:g} s: Karpenter takes whole seconds; rendered as {whole} s")
    return _duration(whole)


def _utc_cron(budget: Budget, index: int, warn) -> str:
    cron = budget.schedule
    assert cron is not None
    if budget.timezone == "UTC":
        return cron.text
    offset = ZoneInfo(budget.timezone).utcoffset(REFERENCE_DAY.replace(tzinfo=None))
    minutes = int(offset.total_seconds() // 60)
    if len(cron.minutes) != 1 or len(cron.hours) != 1:
        warn(f"spec.capacity.consolidation.budgets[{index}].timezone",
             f"Karpenter schedules are UTC; {cron.text!r} cannot be shifted from {budget.timezone}, used as UTC")
        return cron.text
    # weekdays move with it: 01:00 Monday in Berlin is 00:00 Monday UTC, 02:00 Monday in Kolkata 20:30 Sunday UTC
    utc = cron.shifted(-minutes)
    if utc is None:  # a day of the month would move across month ends with it
        warn(f"spec.capacity.consolidation.budgets[{index}].timezone",
             f"{cron.text!r} in {budget.timezone} falls on another UTC day; used as UTC")
        return cron.text
    if ZoneInfo(budget.timezone).utcoffset(datetime(2026, 7, 15)) != offset:
        warn(f"spec.capacity.consolidation.budgets[{index}].timezone",
             f"{budget.timezone} has daylight saving time; the UTC schedule is off by an hour half the year")
    return utc


NODEPOOL_RESTRICTED = frozenset({"kubernetes.io/hostname"})  # karpenter.sh_nodepools: "label ... is restricted"


def _requirements(ctx: Context, tier: int) -> list[dict]:
    t = ctx.tiers[tier]
    reqs = [{"key": INSTANCE_TYPE_LABEL, "operator": "In", "values": sorted(t.instance_types)},
            {"key": CAPACITY_TYPE_LABEL, "operator": "In", "values": sorted(t.capacity_types)}]
    zones = list(ctx.options.zones)
    extras = [e for e in required_extras(ctx) if not no_zone_left(e)]  # the terms --zone leaves
    if len(extras) == 1:  # extra keys (zones, custom labels) carry over when the terms are not alternatives
        # but not a key Karpenter v1 refuses in a NodePool (kubernetes.io/hostname: the API server rejected the
        # whole NodePool); the pods keep it, so the scheduler still honours it
        reqs += [e for e in extras[0] if e.get("key") not in NODEPOOL_RESTRICTED]
    if zones and not any(r.get("key") == ZONE_LABEL and r.get("operator") == "In" for r in reqs):  # or the
        # term's own zones, already narrowed to --zone's (required_extras)
        reqs.append({"key": ZONE_LABEL, "operator": "In", "values": sorted(zones)})
    return reqs


def _limits(ctx: Context, tier: int) -> dict | None:
    spec = ctx.endpoint.spec
    # one replica over the maximum: a rolling update surges one pod (maxSurge 1, maxUnavailable 0), and at the
    # maximum its node was over the limit, so Karpenter refused it and the rollout never finished
    most = (ctx.policy.max_replicas if ctx.policy is not None else max(spec.replicas, 1)) + ROLLOUT_SURGE
    known = [ctx.catalog.get(n) for n in ctx.tiers[tier].instance_types if n in ctx.catalog]
    if spec.engine.gpus:
        # Karpenter counts whole nodes against the limit: the nodes max replicas need on any of the tier's types,
        # packed as the simulator packs them (GPUs, cpu, memory), must fit, or a type is never launched ("all
        # available instance types exceed limits")
        asked = replica_request(spec.engine, spec.model, spec.kv_cache)
        need = most * spec.engine.gpus
        for t in known:
            if t.gpus >= spec.engine.gpus:
                need = max(need, math.ceil(most / replicas_per_node(t, asked)) * t.gpus)
        return {GPU: str(need)}
    if not known:
        return None
    return {"cpu": str(most * max(t.vcpu for t in known))}


def nodepool(ctx: Context, tier: int, warn) -> dict:
    c = ctx.consolidation
    budgets = []
    for i, b in enumerate(c.budgets):
        entry: dict = {"nodes": b.nodes}
        if b.schedule is not None:
            entry["schedule"] = _utc_cron(b, i, warn)
            entry["duration"] = _budget_duration(b.duration, i, warn)
        budgets.append(entry)
    template_spec: dict = {
        "nodeClassRef": {"group": ctx.options.node_class_group, "kind": ctx.options.node_class_kind,
                         "name": ctx.options.node_class},
        "requirements": _requirements(ctx, tier),
    }
    if ctx.endpoint.spec.engine.gpus:
        template_spec["taints"] = [{"key": GPU, "value": "true", "effect": "NoSchedule"}]
    spec: dict = {
        "weight": weight(tier, len(ctx.tiers)),
        "template": {"metadata": {"labels": {ENDPOINT_LABEL: node_owner(ctx.namespace, ctx.name),
                                             TIER_LABEL: ctx.tier_id(tier)}},
                     "spec": template_spec},
        "disruption": {"consolidationPolicy": c.policy,
                       "consolidateAfter": _whole_seconds(c.consolidate_after,
                                                          "spec.capacity.consolidation.consolidateAfter", warn),
                       "budgets": budgets},
    }
    limits = _limits(ctx, tier)
    if limits:
        spec["limits"] = limits
    return {"apiVersion": "karpenter.sh/v1", "kind": "NodePool",
            "metadata": ctx.meta(nodepool_name(ctx, tier), "nodepool", namespaced=False,
                                 **{TIER_LABEL: ctx.tier_id(tier)}),
            "spec": spec}


def karpenter_objects(ctx: Context, warn) -> list[dict]:
    if not ctx.placed or ctx.endpoint.spec.engine.kind == "external":
        return []
    if ctx.pinned:
        warn("spec.placement.nodeAffinity", "names its nodes by hostname (kubernetes.io/hostname): the engine pods "
             "take this affinity as given and no Karpenter NodePool is rendered (a node Karpenter launches has a name "
             "of its own); replicas beyond what those nodes hold stay Pending")
        return []
    if len([e for e in required_extras(ctx) if not no_zone_left(e)]) > 1:  # said: it had been silent (a black-box
        # pass found it)
        warn("spec.placement.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms",
             "several terms are alternatives a NodePool's requirements cannot carry: the NodePools require the "
             "instance and capacity types alone (their other keys, zones included, are left out), while the pods "
             "keep every term, so Karpenter launches only nodes some term admits")
    return [nodepool(ctx, i, warn) for i in range(len(ctx.tiers))]
