"""Which engine pod a scale-in removes on Kubernetes: the operator ranks them with the local fleet's `victims`
and writes the rank as `controller.kubernetes.io/pod-deletion-cost`. Without it the ReplicaSet removed the newest
pod whatever its node cost: a fleet scaled down to one replica kept its $5.67/h 4-GPU node."""

from __future__ import annotations

from fleetserve.capacity.catalog import Catalog
from fleetserve.k8s.client import ApiError, RecordingClient
from fleetserve.k8s.deletion_cost import ANNOTATION, deletion_costs, node_price, scale_in_order
from fleetserve.k8s.failing import pods_selector
from fleetserve.k8s.operator import Reconciler
from fleetserve.k8s.reconcile import OWNER_API_VERSION
from tests.k8s.test_failing import NS, SPEC, pod, resource

CATALOG = Catalog.builtin()


def node(name: str, instance_type: str, capacity_type: str = "on-demand") -> dict:
    return {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": {
        "node.kubernetes.io/instance-type": instance_type, "karpenter.sh/capacity-type": capacity_type}}}


def placed(name: str, node_name: str, created: str, ready: bool = True, labels: dict | None = None) -> dict:
    p = pod(name, ready=ready, labels=labels, created=created)
    p["spec"] = {"nodeName": node_name}
    return p


def test_nodes_are_priced_by_their_labels():
    assert node_price(node("a", "g5.12xlarge"), CATALOG) == CATALOG.get("g5.12xlarge").on_demand
    assert node_price(node("b", "g5.12xlarge", "spot"), CATALOG) == CATALOG.get("g5.12xlarge").spot
    assert node_price(node("c", "ml.g5.xlarge"), CATALOG) == CATALOG.get("g5.xlarge").on_demand  # HyperPod's name
    assert node_price(node("d", "m7i.large"), CATALOG) == 0.0  # not priced here: counted as free
    assert node_price({"metadata": {"name": "e"}}, CATALOG) == 0.0


def test_the_dear_node_is_emptied_first_whatever_the_pods_ages():
    # the 4-GPU node's two pods are the oldest: without a cost the ReplicaSet removed the newest (the cheap node's)
    pods = [placed("big-0", "big", "2026-01-01T00:00:00Z"), placed("big-1", "big", "2026-01-01T00:01:00Z"),
            placed("small-0", "small", "2026-01-01T00:02:00Z")]
    nodes = {"big": node("big", "g5.12xlarge"), "small": node("small", "g6.xlarge")}
    costs = deletion_costs({"engine": pods}, nodes, CATALOG)
    assert costs["small-0"] == 3  # the last to go: at one replica the fleet pays $0.81/h, not $5.67/h
    assert {costs["big-0"], costs["big-1"]} == {1, 2}


def test_not_ready_pods_go_first_and_a_node_another_tier_keeps_is_not_emptied_by_this_one():
    t0 = [placed("a", "shared", "2026-01-01T00:00:00Z"), placed("b", "alone", "2026-01-01T00:01:00Z"),
          placed("c", "cheap", "2026-01-01T00:02:00Z", ready=False)]
    t1 = [placed("x", "shared", "2026-01-01T00:03:00Z")]  # the overflow tier's pod on the same node as "a"
    nodes = {"shared": node("shared", "g5.12xlarge"), "alone": node("alone", "g5.xlarge"),
             "cheap": node("cheap", "g6.xlarge")}
    costs = deletion_costs({"t0": t0, "t1": t1}, nodes, CATALOG)
    assert costs["c"] == 1  # not ready: no use yet
    assert costs["b"] == 2  # its node empties; "a" leaving would leave the dear node running for "x"
    assert costs["a"] == 3
    assert costs["x"] == 1  # ranked within its own Deployment (a ReplicaSet compares its own pods only)


def test_pods_not_placed_are_not_ranked():
    pending = pod("p", phase="Pending")
    gone = placed("g", "n", "2026-01-01T00:00:00Z")
    gone["metadata"]["deletionTimestamp"] = "2026-01-01T00:05:00Z"
    assert scale_in_order([pending, gone], {"n": 1}, {"n": 1.0}) == []


def _engine_labels(client) -> dict:
    (engine,) = [o for k, o in client.objects.items() if k[1] == "Deployment" and "engine" in k[3]]
    return dict(part.split("=") for part in pods_selector(engine).split(","))


def test_the_operator_writes_the_ranks_once_and_survives_what_it_cannot_read():
    client = RecordingClient()
    client.create(resource({**SPEC, "replicas": 3}))
    reconciler = Reconciler(client, clock=lambda: "2026-01-01T00:10:00Z")
    endpoint = lambda: client.get(OWNER_API_VERSION, "Endpoint", NS, "demo")  # noqa: E731
    reconciler.reconcile(endpoint())
    labels = _engine_labels(client)
    client.create(node("big", "g5.12xlarge"))
    client.create(node("small", "g6.xlarge"))
    for name, where, created in (("e-0", "big", "2026-01-01T00:00:00Z"), ("e-1", "big", "2026-01-01T00:01:00Z"),
                                 ("e-2", "small", "2026-01-01T00:02:00Z")):
        client.create({**placed(name, where, created, labels=labels)})
    client.create(placed("other", "small", "2026-01-01T00:03:00Z"))  # not this endpoint's: never touched
    outcome = reconciler.reconcile(endpoint())
    assert outcome.failure is None
    cost = {n: client.objects[("v1", "Pod", NS, n)]["metadata"].get("annotations", {}).get(ANNOTATION)
            for n in ("e-0", "e-1", "e-2", "other")}
    assert cost["e-2"] == "3" and {cost["e-0"], cost["e-1"]} == {"1", "2"} and cost["other"] is None
    client.clear()
    reconciler.reconcile(endpoint())
    assert client.writes() == []  # the same ranks: nothing written again
    # a node that cannot be read (no RBAC for nodes yet after an upgrade) fails nothing, and changes no rank
    client.fail("get", "Node", ApiError("nodes is forbidden", 403, "Forbidden"))
    client.patch(OWNER_API_VERSION, "Endpoint", NS, "demo", {"spec": {**SPEC, "replicas": 4}})
    outcome = reconciler.reconcile(endpoint())
    assert outcome.failure is None
    (engine,) = [o for k, o in client.objects.items() if k[1] == "Deployment" and "engine" in k[3]]
    assert engine["spec"]["replicas"] == 4  # the spec was applied
    after = {n: client.objects[("v1", "Pod", NS, n)]["metadata"].get("annotations", {}).get(ANNOTATION)
             for n in ("e-0", "e-1", "e-2", "other")}
    assert after == cost  # the ranks stay as they were
