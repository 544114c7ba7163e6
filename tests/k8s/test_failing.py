"""Why no engine pod can start, on Kubernetes: read from the pods by the operator, rendered into the router's state
ConfigMap, which the router pods mount and re-read (`--failing-file`). A crash loop had held every request for
the buffer timeout (10 minutes) for a 503 naming nothing."""

from __future__ import annotations

import copy

import pytest

from fleetserve.autoscale.failing import CRASH_LOOP, STATIC_ZERO
from fleetserve.k8s.client import RecordingClient
from fleetserve.k8s.failing import STATE_KEY, engines_failing, pods_selector
from fleetserve.k8s.operator import Reconciler
from fleetserve.k8s.reconcile import OWNER_API_VERSION
from fleetserve.k8s.render import render
from fleetserve.k8s.router import STATE_DIR
from fleetserve.k8s.webhook import endpoint_from_resource

NS, NAME = "team-c", "demo"
SPEC = {"model": {"name": "m", "source": "/fsx/models/small"}, "replicas": 2}


def pod(name: str, ready: bool = False, waiting: str | None = None, phase: str = "Running",
        deleting: bool = False, labels: dict | None = None, restarts: int = 2,
        created: str = "2025-12-31T23:00:00Z") -> dict:
    status: dict = {"phase": phase, "conditions": [{"type": "Ready", "status": "True" if ready else "False"}]}
    if waiting:
        status["containerStatuses"] = [{"name": "engine", "state": {"waiting": {"reason": waiting}},
                                        "restartCount": restarts}]
    meta: dict = {"name": name, "namespace": NS, "labels": labels or {}, "creationTimestamp": created}
    if deleting:
        meta["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "status": status}


def test_the_rule_is_the_fleets_rule_read_from_pods():
    crash, pull = pod("a", waiting="CrashLoopBackOff"), pod("b", waiting="ImagePullBackOff")
    assert engines_failing([crash], 1, False, False) == CRASH_LOOP
    assert engines_failing([crash, pull], 2, True, False) == CRASH_LOOP
    assert engines_failing([crash, pod("c", ready=True)], 2, False, False) is None  # one serves
    assert engines_failing([crash, pod("c", waiting="ContainerCreating")], 2, False, False) is None  # on its way
    assert engines_failing([crash, pod("c", phase="Pending")], 2, False, False) is None  # scheduling, a node coming
    assert engines_failing([crash, pod("old", ready=True, deleting=True)], 1, False, False) == CRASH_LOOP
    assert engines_failing([], 1, False, False) is None  # nothing created yet: on its way
    assert engines_failing([], 0, True, False) is None  # KEDA scaled it to zero: the next request wakes it
    assert engines_failing([], 0, False, False) == STATIC_ZERO


def test_what_may_still_pass_is_no_failure_yet():
    """The kubelet says CrashLoopBackOff after one crash (an OOM once refused requests while the pod restarted),
    ErrImagePull at the first try, and a config error for a Secret created a moment after the Deployment."""
    from datetime import datetime

    now = datetime.fromisoformat("2026-01-01T00:00:00+00:00")
    assert engines_failing([pod("a", waiting="CrashLoopBackOff", restarts=1)], 1, False, False, now) is None
    assert engines_failing([pod("a", waiting="CrashLoopBackOff", restarts=2)], 1, False, False, now) == CRASH_LOOP
    assert engines_failing([pod("a", waiting="ErrImagePull")], 1, False, False, now) is None
    assert engines_failing([pod("a", waiting="ImagePullBackOff")], 1, False, False, now) == CRASH_LOOP
    young = pod("a", waiting="CreateContainerConfigError", created="2025-12-31T23:59:30Z")
    assert engines_failing([young], 1, False, False, now) is None
    old = pod("a", waiting="CreateContainerConfigError", created="2025-12-31T23:55:00Z")
    assert engines_failing([old], 1, False, False, now) == CRASH_LOOP


def test_the_router_mounts_its_state_and_a_static_zero_is_rendered():
    rendered = render(endpoint_from_resource(resource({**SPEC, "replicas": 0})).endpoint).objects
    (state,) = [o for o in rendered if o["kind"] == "ConfigMap"]
    assert state["data"] == {STATE_KEY: STATIC_ZERO}
    router = next(o for o in rendered if o["kind"] == "Deployment" and o["metadata"]["name"].endswith("router"))
    pod_spec = router["spec"]["template"]["spec"]
    args = pod_spec["containers"][0]["args"]
    assert args[args.index("--failing-file") + 1] == f"{STATE_DIR}/{STATE_KEY}"
    assert {"name": "state", "configMap": {"name": state["metadata"]["name"], "optional": True}} in pod_spec["volumes"]
    rendered = render(endpoint_from_resource(resource(SPEC)).endpoint).objects
    assert next(o for o in rendered if o["kind"] == "ConfigMap")["data"] == {STATE_KEY: ""}


def resource(spec: dict) -> dict:
    return {"apiVersion": OWNER_API_VERSION, "kind": "Endpoint", "metadata": {"name": NAME, "namespace": NS},
            "spec": copy.deepcopy(spec)}


@pytest.fixture
def cluster():
    client = RecordingClient()
    client.create(resource(SPEC))
    return client, Reconciler(client, clock=lambda: "2026-01-01T00:00:00Z")


def test_pods_that_cannot_be_read_hold_back_nothing_and_keep_the_last_word(cluster):
    """Listing pods ran inside the pass that applies the spec: without RBAC for pods (an operator upgraded before
    its ClusterRole) or at an API timeout, no spec change was applied at all, and the Endpoint read Forbidden."""
    from fleetserve.k8s.client import ApiError

    client, reconciler = cluster
    endpoint = lambda: client.get(OWNER_API_VERSION, "Endpoint", NS, NAME)  # noqa: E731
    reconciler.reconcile(endpoint())
    (engine,) = [o for k, o in client.objects.items() if k[1] == "Deployment" and "engine" in k[3]]
    labels = dict(part.split("=") for part in pods_selector(engine).split(","))
    client.create(pod("engine-0", waiting="CrashLoopBackOff", labels=labels))
    reconciler.reconcile(endpoint())
    assert reason(client) == CRASH_LOOP
    client.patch(OWNER_API_VERSION, "Endpoint", NS, NAME, {"spec": {**SPEC, "replicas": 3}})
    client.fail("list", "Pod", ApiError("pods is forbidden", 403, "Forbidden"))
    outcome = reconciler.reconcile(endpoint())
    assert outcome.failure is None
    (engine,) = [o for k, o in client.objects.items() if k[1] == "Deployment" and "engine" in k[3]]
    assert engine["spec"]["replicas"] == 3  # applied
    assert reason(client) == CRASH_LOOP  # kept, not cleared on a guess


def reason(client) -> str:
    (state,) = [o for k, o in client.objects.items() if k[1] == "ConfigMap"]
    return state["data"][STATE_KEY]


def test_the_operator_tells_the_router_when_every_engine_pod_crash_loops_and_when_one_serves(cluster):
    client, reconciler = cluster
    endpoint = lambda: client.get(OWNER_API_VERSION, "Endpoint", NS, NAME)  # noqa: E731
    reconciler.reconcile(endpoint())
    assert reason(client) == ""
    (engine,) = [o for k, o in client.objects.items() if k[1] == "Deployment" and "engine" in k[3]]
    labels = dict(part.split("=") for part in pods_selector(engine).split(","))
    for i in range(2):
        client.create(pod(f"engine-{i}", waiting="CrashLoopBackOff", labels=labels))
    client.create(pod("someone-else", waiting="CrashLoopBackOff"))  # not an engine pod of this endpoint
    status = reconciler.reconcile(endpoint()).status
    assert reason(client) == CRASH_LOOP
    # and the Endpoint's status says it (kubectl get endpoint), not only the router's ConfigMap
    assert status["state"] == "DeploymentFailed" and CRASH_LOOP in status["failureReason"]
    assert "app.kubernetes.io/instance=demo,app.kubernetes.io/component=engine" in status["failureReason"]
    client.clear()
    reconciler.reconcile(endpoint())
    assert client.writes() == []  # the same reason: nothing written again
    client.objects[("v1", "Pod", NS, "engine-1")]["status"] = pod("x", ready=True)["status"]
    status = reconciler.reconcile(endpoint()).status
    assert reason(client) == "" and status["state"] != "DeploymentFailed"


def test_a_static_zero_over_two_instance_types_keeps_its_reason_through_the_operator():
    """The overflow tier's ScaledObject (made for any two or more instance types) counted as autoscaling: the
    operator cleared the static-zero reason render had written, and the router held each request for its buffer
    timeout (10 minutes) where it answers 503 replicas_failing at once."""
    spec = {"model": {"name": "llama", "source": "hf:meta-llama/Llama-3.1-8B-Instruct"},
            "engine": {"kind": "vllm", "gpus": 1}, "replicas": 0,
            "placement": {"instanceTypes": ["ml.g5.2xlarge", "ml.g6e.xlarge"]}}
    rendered = render(endpoint_from_resource(resource(spec)).endpoint).objects
    assert sum(o["kind"] == "ScaledObject" for o in rendered) >= 1  # the overflow tier's, which wakes nothing
    client = RecordingClient()
    client.create(resource(spec))
    Reconciler(client, clock=lambda: "2026-01-01T00:00:00Z").reconcile(
        client.get(OWNER_API_VERSION, "Endpoint", NS, NAME))
    assert reason(client) == STATIC_ZERO
