"""Which engine pod a scale-in removes on Kubernetes: the one the local fleet and the simulator would drain.

KEDA lowers an engine Deployment's replicas, and its ReplicaSet picks the pods to delete: not yet scheduled, not
running and not ready ones first, then the lowest `controller.kubernetes.io/pod-deletion-cost`, then (without a
cost) the newest. Without a cost it ignored what the node costs: from 3 replicas to 1, a fleet kept a $5.67/h
4-GPU node with two replicas and dropped the $0.81/h 1-GPU node that could carry the one left (the local fleet
had done the same until `autoscale/scaledown.victims` learned node prices). Karpenter then removes the node left
empty, so which pod goes decides which node keeps billing.

So at every pass (and its one-minute resync) the operator ranks each engine Deployment's running pods with
`victims` asked for all of them: not ready ones first, then whole nodes, the dearest first, then the rest (the
emptiest node first, the newest pod first). The rank is the pod's deletion cost, the first to go 1, so a pod
ready since the last pass (no cost yet: 0) goes before the ranked ones, as `victims` puts the newest first
among equals. One order serves every scale-in, and `victims` asked for fewer can differ: from 3 to 2 it drops
the 1-GPU node's pod (that node's price stops at once), while this order drops one of the 4-GPU node's pods,
which saves nothing until its second one goes too. The order is for the deepest scale-in, since the floor a fleet
falls back to is where it spends its hours; ranked one step at a time, the fleet scaled down to 1 kept the
$5.67/h node. Node prices come from the node's instance-type and capacity-type labels (Karpenter's) and the
built-in catalog; a node of a type the catalog does not price counts as free, so it is emptied last.
A pod's requests in flight are not known here (the router counts them): the ranks ignore them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from fleetserve.autoscale.scaledown import Candidate, victims
from fleetserve.capacity.catalog import Catalog
from fleetserve.capacity.placement import CAPACITY_TYPE_LABEL, INSTANCE_TYPE_LABEL
from fleetserve.k8s.failing import pod_ready

ANNOTATION = "controller.kubernetes.io/pod-deletion-cost"


def node_price(node: Mapping, catalog: Catalog) -> float:
    """$/h of a node by its labels (0: unknown type)."""
    labels = (node.get("metadata") or {}).get("labels") or {}
    name = labels.get(INSTANCE_TYPE_LABEL, "")
    if not name or name not in catalog:
        return 0.0
    return catalog.get(name).price(labels.get(CAPACITY_TYPE_LABEL, "on-demand"))


def _placed(pod: Mapping) -> bool:
    """Scheduled, running and not on its way out: a pod the ReplicaSet ranks by its cost."""
    meta, status = pod.get("metadata") or {}, pod.get("status") or {}
    return bool((pod.get("spec") or {}).get("nodeName")) and not meta.get("deletionTimestamp") and \
        status.get("phase") == "Running"


def scale_in_order(pods: Sequence[Mapping], node_used: Mapping[str, int], prices: Mapping[str, float]) -> list[str]:
    """The names of one Deployment's placed pods, first to go first: `victims`' order for a scale-in of them all.
    `node_used`: the endpoint's engine pods per node (every tier's: a node another tier's
    pod keeps is not emptied by this one leaving)."""
    placed = sorted((p for p in pods if _placed(p)),
                    key=lambda p: ((p.get("metadata") or {}).get("creationTimestamp") or "", p["metadata"]["name"]))
    left = [Candidate(p["metadata"]["name"], "ready" if pod_ready(p) else "starting", p["spec"]["nodeName"], i)
            for i, p in enumerate(placed)]
    return [c.id for c in victims(left, node_used, len(left), prices)]


def deletion_costs(pods_by_deployment: Mapping[str, Sequence[Mapping]], nodes: Mapping[str, Mapping],
                   catalog: Catalog) -> dict[str, int]:
    """Pod name -> its deletion cost (1 for the first to go), for every placed engine pod. `nodes`: by name, the
    nodes the pods run on (one that could not be read counts as free)."""
    node_used: dict[str, int] = {}
    for pods in pods_by_deployment.values():
        for p in pods:
            if _placed(p):
                node_used[p["spec"]["nodeName"]] = node_used.get(p["spec"]["nodeName"], 0) + 1
    prices = {name: node_price(nodes[name], catalog) if name in nodes else 0.0 for name in node_used}
    costs = {}
    for pods in pods_by_deployment.values():
        for rank, name in enumerate(scale_in_order(pods, node_used, prices), start=1):
            costs[name] = rank
    return costs


def cost_patches(pods_by_deployment: Mapping[str, Sequence[Mapping]], costs: Mapping[str, int]
                 ) -> list[tuple[str, dict]]:
    """(pod name, merge patch) for the pods whose annotation differs from its rank."""
    out = []
    for pods in pods_by_deployment.values():
        for p in pods:
            name = p["metadata"]["name"]
            if name in costs and ((p["metadata"].get("annotations") or {}).get(ANNOTATION) != str(costs[name])):
                out.append((name, {"metadata": {"annotations": {ANNOTATION: str(costs[name])}}}))
    return out
