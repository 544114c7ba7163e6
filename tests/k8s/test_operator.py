"""The operator against the recording fake client (no API server exists here): create, idempotence, minimal
patches, deletion through ownerReferences, a bad spec, status as Deployments become ready."""

from __future__ import annotations

import copy
import json

import pytest

from fleetserve.k8s.client import ApiError, Conflict, NotFound, RecordingClient, apply_merge_patch
from fleetserve.k8s.operator import Reconciler, build_registry
from fleetserve.k8s.reconcile import (
    ENDPOINT_LABEL,
    LAST_APPLIED,
    OWNER_API_VERSION,
    Owner,
    child_kind,
    key,
    own,
    reconcile,
)
from fleetserve.k8s.render import render
from fleetserve.k8s.webhook import admission_response, endpoint_from_resource, validate_handler
from tests.k8s.test_render import FULL
from tests.k8s.validate import validate

NS, NAME = "team-b", "chat"


class Clock:
    def __init__(self):
        self.t = 0

    def __call__(self) -> str:
        self.t += 1
        return f"2026-01-01T00:00:{self.t:02d}Z"


def _resource(spec: dict | None = None, labels: dict | None = None) -> dict:
    return {"apiVersion": OWNER_API_VERSION, "kind": "Endpoint",
            "metadata": {"name": NAME, "namespace": NS, "labels": labels if labels is not None else {"team": "b"}},
            "spec": copy.deepcopy(spec if spec is not None else FULL["spec"])}


@pytest.fixture
def env():
    client = RecordingClient()
    client.create(_resource())
    return client, Reconciler(client, clock=Clock())


def _endpoint(client):
    return client.get(OWNER_API_VERSION, "Endpoint", NS, NAME)


def _update_spec(client, change):
    body = _endpoint(client)
    spec = copy.deepcopy(body["spec"])
    change(spec)
    client.patch(OWNER_API_VERSION, "Endpoint", NS, NAME, {"spec": spec})
    return _endpoint(client)


def _children(client):
    return [o for k, o in sorted(client.objects.items(), key=lambda kv: str(kv[0])) if k[1] != "Endpoint"]


def test_create_from_scratch_owns_and_validates_every_child(env):
    client, reconciler = env
    outcome = reconciler.reconcile(_endpoint(client))
    assert outcome.failure is None
    assert {a.verb for a in outcome.actions} == {"create"}
    expected = render(endpoint_from_resource(_endpoint(client)).endpoint).objects
    assert sorted((o["kind"], o["metadata"]["name"]) for o in _children(client)) == \
        sorted((o["kind"], o["metadata"]["name"]) for o in expected)
    uid = _endpoint(client)["metadata"]["uid"]
    for obj in _children(client):
        meta = obj["metadata"]
        assert meta["labels"][ENDPOINT_LABEL] == NAME
        if child_kind(obj["apiVersion"], obj["kind"]).namespaced:
            assert meta["ownerReferences"] == [{"apiVersion": "fleetserve.io/v1", "kind": "Endpoint", "name": NAME,
                                                "uid": uid, "controller": True, "blockOwnerDeletion": True}]
        else:  # a namespaced owner cannot own a cluster-scoped NodePool: the finalizer deletes it
            assert "ownerReferences" not in meta
        stored = {k: v for k, v in obj.items() if k != "status"}
        stored["metadata"] = {k: v for k, v in meta.items() if k not in ("uid", "resourceVersion", "generation")}
        assert validate(stored) == [], obj["kind"]
    assert outcome.status["state"] == "DeploymentInProgress"
    assert _endpoint(client)["status"]["state"] == "DeploymentInProgress"


def test_second_pass_changes_nothing(env):
    client, reconciler = env
    reconciler.reconcile(_endpoint(client))
    client.clear()
    outcome = reconciler.reconcile(_endpoint(client))
    assert outcome.actions == []
    assert client.writes() == []  # not even the status


def test_spec_change_patches_only_the_affected_objects_minimally(env):
    client, reconciler = env
    reconciler.reconcile(_endpoint(client))
    before = copy.deepcopy(client.objects)
    body = _update_spec(client, lambda s: s["autoscaling"].update(cooldownPeriod=900))
    client.clear()
    outcome = reconciler.reconcile(body)
    assert [(a.verb, a.kind) for a in outcome.actions] == [("patch", "ScaledObject")]
    patch = outcome.actions[0].body
    assert patch["spec"] == {"cooldownPeriod": 900}
    assert set(patch) == {"metadata", "spec"} and set(patch["metadata"]) == {"annotations"}
    assert outcome.actions[0].reason == "spec.cooldownPeriod"
    changed = [k for k in client.objects if k[1] not in ("Endpoint",) and client.objects[k] != before.get(k)]
    assert [k[1] for k in changed] == ["ScaledObject"]
    assert reconciler.reconcile(_endpoint(client)).actions == []


def test_a_removed_field_is_patched_to_null(env):
    client, reconciler = env
    reconciler.reconcile(_endpoint(client))
    client.patch(OWNER_API_VERSION, "Endpoint", NS, NAME, {"metadata": {"labels": {"team": None}}})
    outcome = reconciler.reconcile(_endpoint(client))
    assert outcome.actions and {a.verb for a in outcome.actions} == {"patch"}
    for action in outcome.actions:
        assert action.body["metadata"]["labels"] == {"team": None}
    for obj in _children(client):
        assert "team" not in obj["metadata"]["labels"]


def test_keda_owns_the_replicas_of_scaled_deployments(env):
    client, reconciler = env
    reconciler.reconcile(_endpoint(client))
    engine = next(k for k in client.objects if k[1] == "Deployment" and k[3].endswith("engine-t0"))
    client.objects[engine]["spec"]["replicas"] = 5  # the HPA scaled it
    assert reconciler.reconcile(_endpoint(client)).actions == []
    router = next(k for k in client.objects if k[1] == "Deployment" and k[3].endswith("router"))
    client.objects[router]["spec"]["replicas"] = 7  # nobody scales the router: drift is corrected
    actions = reconciler.reconcile(_endpoint(client)).actions
    assert [(a.kind, a.body["spec"]) for a in actions] == [("Deployment", {"replicas": 2})]


def test_autoscaling_removed_deletes_the_scaled_object_before_the_replicas_are_set(env):
    """The Deployment's replicas were patched first and the ScaledObject deleted after: until KEDA removed its HPA,
    the HPA could scale the Deployment back from the count the spec now asks for."""
    client, reconciler = env
    reconciler.reconcile(_endpoint(client))
    engine = next(k for k in client.objects if k[1] == "Deployment" and k[3].endswith("engine-t0"))
    client.objects[engine]["spec"]["replicas"] = 5  # the HPA had scaled it
    body = _update_spec(client, lambda s: s.update(autoscaling=None))  # a merge patch removes it with null
    actions = reconciler.reconcile(body).actions
    order = [(a.verb, a.kind, a.name) for a in actions]
    deleted = [i for i, (verb, kind, _) in enumerate(order) if (verb, kind) == ("delete", "ScaledObject")]
    resized = [i for i, (verb, kind, name) in enumerate(order) if (verb, kind, name) == ("patch", "Deployment",
                                                                                          engine[3])]
    assert deleted and resized and max(deleted) < min(resized), order


def test_server_defaults_are_not_drift(env):
    client, reconciler = env
    reconciler.reconcile(_endpoint(client))
    for obj in _children(client):
        if obj["kind"] == "Deployment":  # what the API server adds
            obj["spec"]["revisionHistoryLimit"] = 10
            for c in obj["spec"]["template"]["spec"]["containers"]:
                c["terminationMessagePath"] = "/dev/termination-log"
                c["imagePullPolicy"] = "IfNotPresent"
    assert reconciler.reconcile(_endpoint(client)).actions == []


def test_empty_lists_the_api_server_omits_are_not_drift():
    """A container engine without args renders `args: []`; the API server stores no args (omitempty), and every
    pass patched the Deployment's whole container list again."""
    spec = {"model": {"name": "m", "source": "/models/x", "volume": {"persistentVolumeClaim": {"claimName": "w"}}},
            "engine": {"kind": "container", "image": "docker.io/acme/server:1.0", "port": 8080, "gpus": 1},
            "replicas": 1}
    client = RecordingClient()
    client.create(_resource(spec))
    reconciler = Reconciler(client, clock=Clock())
    assert reconciler.reconcile(_endpoint(client)).failure is None
    dropped = 0
    for obj in _children(client):
        if obj["kind"] == "Deployment":
            for c in obj["spec"]["template"]["spec"]["containers"]:
                for field in [f for f, v in c.items() if v == [] or v == {}]:
                    del c[field]
                    dropped += 1
    assert dropped  # the case is there
    client.clear()
    assert reconciler.reconcile(_endpoint(client)).actions == []


def test_an_immutable_field_change_recreates_the_object():
    owner = Owner(NAME, NS, "u1")
    desired = render(endpoint_from_resource(_resource()).endpoint).objects
    observed = [own(o, owner) for o in desired]
    dep = next(o for o in observed if o["kind"] == "Deployment")
    dep["spec"]["selector"]["matchLabels"]["app.kubernetes.io/component"] = "old"  # an older release's
    actions = reconcile(desired, observed, owner)
    assert [(a.verb, a.kind, a.name) for a in actions] == [("delete", "Deployment", dep["metadata"]["name"]),
                                                          ("create", "Deployment", dep["metadata"]["name"])]
    assert "spec.selector" in actions[0].reason


def test_objects_no_longer_rendered_are_deleted_and_foreign_ones_left_alone(env):
    client, reconciler = env
    foreign = {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "other", "namespace": NS,
                                                                   "labels": {ENDPOINT_LABEL: NAME,
                                                                              "fleetserve.io/endpoint-namespace": NS}},
               "spec": {"ports": [{"port": 1}]}}
    client.create(foreign)
    reconciler.reconcile(_endpoint(client))
    body = _update_spec(client, lambda s: s.update(metrics={"enabled": False}))
    outcome = reconciler.reconcile(body)
    deleted = sorted(a.kind for a in outcome.actions if a.verb == "delete")
    assert deleted == ["PrometheusRule", "ServiceMonitor", "ServiceMonitor"]
    assert client.get("v1", "Service", NS, "other") is not None


def test_deleting_the_endpoint_deletes_its_children(env):
    client, reconciler = env
    reconciler.reconcile(_endpoint(client))
    body = _endpoint(client)
    assert any(o["kind"] == "NodePool" for o in _children(client))
    gone = reconciler.cleanup(body)  # kopf's delete handler, behind the finalizer
    assert gone and all(g.startswith("NodePool ") for g in gone)
    client.delete(OWNER_API_VERSION, "Endpoint", NS, NAME)  # then the garbage collector
    assert _children(client) == []


def test_a_bad_spec_fails_with_our_message_and_keeps_the_children(env):
    client, reconciler = env
    reconciler.reconcile(_endpoint(client))
    count = len(_children(client))
    body = _update_spec(client, lambda s: s["autoscaling"].update(minReplicaCount=9))
    client.clear()
    outcome = reconciler.reconcile(body)
    assert outcome.failure is not None and outcome.failure.reason == "InvalidSpec" and not outcome.retry
    assert "spec.autoscaling" in outcome.failure.message and "maxReplicaCount (6) is below minReplicaCount (9)" \
        in outcome.failure.message
    status = _endpoint(client)["status"]
    assert status["state"] == "DeploymentFailed"
    failed = next(c for c in status["conditions"] if c["type"] == "Failed")
    assert failed["status"] == "True" and failed["reason"] == "InvalidSpec" and "spec.autoscaling" in failed["message"]
    assert [c.verb for c in client.writes()] == ["patch_status"]
    assert len(_children(client)) == count
    # fixed: the failure clears
    body = _update_spec(client, lambda s: s["autoscaling"].update(minReplicaCount=0))
    reconciler.reconcile(body)
    assert "failureReason" not in _endpoint(client)["status"]


def test_the_admission_webhook_denies_a_bad_spec_naming_the_field():
    bad = _resource()
    bad["spec"]["autoscaling"]["minReplicaCount"] = 9
    answer = admission_response({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
                                 "request": {"uid": "r1", "operation": "CREATE", "object": bad}})
    response = answer["response"]
    assert response["uid"] == "r1" and response["allowed"] is False
    assert response["status"]["code"] == 422
    assert "spec.autoscaling: maxReplicaCount (6) is below minReplicaCount (9)" in response["status"]["message"]
    typo = _resource()
    typo["spec"]["replicaz"] = 1
    message = admission_response({"request": {"uid": "r2", "object": typo}})["response"]["status"]["message"]
    assert "spec.replicaz: unknown field" in message
    ok = admission_response({"request": {"uid": "r3", "operation": "CREATE", "object": _resource()}})
    assert ok["response"]["allowed"] is True
    assert admission_response({"request": {"uid": "r4", "operation": "DELETE", "object": bad}})["response"]["allowed"]

    import kopf

    with pytest.raises(kopf.AdmissionError) as info:
        validate_handler(bad, operation="CREATE", warnings=[])
    assert "spec.autoscaling" in str(info.value)
    warnings: list[str] = []
    validate_handler(_resource(), operation="UPDATE", warnings=warnings)


def test_the_webhook_lets_an_invalid_endpoint_lose_its_finalizer_and_be_deleted():
    """kopf removes its finalizer with an UPDATE: refusing it for the spec kept an Endpoint made invalid by a
    stricter version (or created before the webhook) Terminating for ever."""
    import copy

    import kopf

    bad = _resource()
    bad["spec"]["autoscaling"]["minReplicaCount"] = 9
    bad["metadata"]["finalizers"] = ["fleetserve.io/cleanup"]
    unfinalized = copy.deepcopy(bad)
    unfinalized["metadata"]["finalizers"] = []
    same_spec = {"uid": "u1", "operation": "UPDATE", "object": unfinalized, "oldObject": bad}
    assert admission_response({"request": same_spec})["response"]["allowed"] is True
    deleting = copy.deepcopy(unfinalized)
    deleting["metadata"]["deletionTimestamp"] = "2026-12-04T10:00:00Z"
    assert admission_response({"request": {"uid": "u2", "operation": "UPDATE", "object": deleting}}
                              )["response"]["allowed"] is True
    validate_handler(unfinalized, operation="UPDATE", warnings=[], old=bad)  # kopf's own path: no AdmissionError
    # a change of the spec is still judged, and so is a change of the labels
    changed = copy.deepcopy(bad)
    changed["spec"]["replicas"] = 2
    assert admission_response({"request": {"uid": "u3", "operation": "UPDATE", "object": changed,
                                           "oldObject": bad}})["response"]["allowed"] is False
    with pytest.raises(kopf.AdmissionError):
        validate_handler(changed, operation="UPDATE", warnings=[], old=bad)


def test_status_follows_ready_replicas(env):
    client, reconciler = env
    clock = reconciler.clock
    status = reconciler.reconcile(_endpoint(client)).status
    assert status["state"] == "DeploymentInProgress"
    deployments = [k for k in client.objects if k[1] == "Deployment"]
    router = next(k for k in deployments if k[3].endswith("router"))
    engines = [k for k in deployments if k != router]
    for k in engines:
        client.set_ready(NS, k[3])
    status = reconciler.reconcile_owner_of(client.objects[engines[0]]).status
    assert status["state"] == "DeploymentInProgress" and f"{router[3]} 0/2" in \
        next(c["message"] for c in status["conditions"] if c["status"] == "True")
    client.set_ready(NS, router[3], 1)
    assert reconciler.reconcile_owner_of(client.objects[router]).status["state"] == "DeploymentInProgress"
    client.set_ready(NS, router[3])
    # the L2 Redis counts too: an Endpoint whose Redis pod cannot start is not complete
    (redis,) = [k for k in client.objects if k[1] == "StatefulSet"]
    status = reconciler.reconcile_owner_of(client.objects[router]).status
    assert status["state"] == "DeploymentInProgress" and f"{redis[3]} 0/1" in \
        next(c["message"] for c in status["conditions"] if c["status"] == "True")
    client.set_ready(NS, redis[3], kind="StatefulSet")
    t_before = clock.t
    status = reconciler.reconcile_owner_of(client.objects[router]).status
    assert status["state"] == "DeploymentComplete" and status["readyReplicas"] == status["replicas"]
    complete = next(c for c in status["conditions"] if c["type"] == "DeploymentComplete")
    assert complete["status"] == "True" and complete["lastTransitionTime"] == f"2026-01-01T00:00:{t_before + 1:02d}Z"
    client.clear()
    reconciler.reconcile(_endpoint(client))
    assert client.writes() == []  # complete and unchanged: no status write either
    # a rollout that cannot progress fails with the Deployment's reason
    client.objects[router]["status"]["conditions"] = [{"type": "Progressing", "status": "False",
                                                       "reason": "ProgressDeadlineExceeded",
                                                       "message": "ReplicaSet has timed out progressing."}]
    status = reconciler.reconcile(_endpoint(client)).status
    assert status["state"] == "DeploymentFailed" and "timed out" in status["failureReason"]


def test_api_errors_fail_the_endpoint_and_ask_for_a_retry(env):
    client, reconciler = env
    client.fail("create", "ScaledObject", NotFound("the API server does not serve keda.sh/v1alpha1/ScaledObject"))
    outcome = reconciler.reconcile(_endpoint(client))
    assert outcome.retry and outcome.failure.reason == "NotFound"
    assert "create ScaledObject" in outcome.failure.message and "keda.sh" in outcome.failure.message
    assert _endpoint(client)["status"]["state"] == "DeploymentFailed"
    # what comes after it was applied all the same: KEDA not installed had left the fleet without monitoring
    kinds = {k[1] for k in client.objects}
    assert {"ServiceMonitor", "PrometheusRule"} <= kinds, kinds
    outcome = reconciler.reconcile(_endpoint(client))  # the retry creates what is missing, and only that
    assert outcome.failure is None and [(a.verb, a.kind) for a in outcome.actions] == [("create", "ScaledObject")]
    assert _endpoint(client)["status"]["state"] != "DeploymentFailed"


def test_every_refusal_in_a_pass_is_counted_in_its_failure(env):
    client, reconciler = env
    client.fail("create", "ServiceMonitor", ApiError("servicemonitors.monitoring.coreos.com not found", 404,
                                                     "NotFound"))
    client.fail("create", "PrometheusRule", ApiError("admission webhook denied the rule", 422, "Invalid"))
    outcome = reconciler.reconcile(_endpoint(client))
    assert outcome.retry and outcome.failure.message.startswith("create ServiceMonitor")
    assert "(and 1 more: create PrometheusRule" in outcome.failure.message
    assert {"ScaledObject", "Deployment"} <= {k[1] for k in client.objects}


def test_a_failed_scaled_object_delete_holds_back_the_replica_patches_it_precedes(env):
    """While the ScaledObject is there KEDA scales the Deployment: a replica count patched anyway would be
    scaled back."""
    client, reconciler = env
    reconciler.reconcile(_endpoint(client))
    engine = next(k for k in client.objects if k[1] == "Deployment" and k[3].endswith("engine-t0"))
    client.objects[engine]["spec"]["replicas"] = 5
    body = _update_spec(client, lambda s: s.update(autoscaling=None))
    client.fail("delete", "ScaledObject", ApiError("etcdserver: request timed out", 500, "InternalError"))
    client.clear()
    outcome = reconciler.reconcile(body)
    assert outcome.retry and "delete ScaledObject" in outcome.failure.message
    assert not [c for c in client.writes() if c.kind == "Deployment"]
    assert reconciler.reconcile(_endpoint(client)).failure is None
    assert client.objects[engine]["spec"]["replicas"] != 5


def test_a_scaled_object_keda_holds_not_ready_is_a_status_warning(env):
    """KEDA accepted it and cannot use it (a trigger it cannot evaluate): the status read DeploymentComplete and
    nothing said that the engines were not autoscaled."""
    client, reconciler = env
    reconciler.reconcile(_endpoint(client))
    scaled = next(k for k in client.objects if k[1] == "ScaledObject")
    client.objects[scaled]["status"] = {"conditions": [
        {"type": "Ready", "status": "False", "reason": "ScaledObjectCheckFailed",
         "message": "error parsing prometheus metadata: no serverAddress given"}]}
    status = reconciler.reconcile(_endpoint(client)).status
    assert any(f"ScaledObject {scaled[3]} is not ready (ScaledObjectCheckFailed: error parsing prometheus" in w
               for w in status["warnings"]), status["warnings"]
    client.objects[scaled]["status"]["conditions"][0]["status"] = "True"
    status = reconciler.reconcile(_endpoint(client)).status
    assert not any("is not ready" in w for w in status["warnings"] or ())


def test_an_existing_object_we_do_not_own_is_a_conflict(env):
    client, reconciler = env
    client.create({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "chat-router", "namespace": NS},
                   "spec": {"ports": [{"port": 1}]}})
    outcome = reconciler.reconcile(_endpoint(client))
    assert outcome.failure.reason == "AlreadyExists" and "chat-router" in outcome.failure.message
    assert isinstance(Conflict("x"), Exception)


def test_merge_patch_round_trip():
    owner = Owner(NAME, NS, "u1")
    desired = render(endpoint_from_resource(_resource()).endpoint).objects
    old = [own(o, owner) for o in render(endpoint_from_resource(_resource(labels={"a": "1"})).endpoint).objects]
    by_key = {key(o): o for o in old}
    for action in reconcile(desired, old, owner):
        assert action.verb == "patch"
        patched = apply_merge_patch(by_key[key(action.body | {"apiVersion": action.api_version, "kind": action.kind,
                                                                "metadata": {"name": action.name,
                                                                             "namespace": action.namespace}})],
                                    action.body)
        want = own(next(o for o in desired if key(o) == (action.api_version, action.kind,
                                                          action.namespace, action.name)), owner)
        assert patched == want
        assert LAST_APPLIED in patched["metadata"]["annotations"]


def test_the_kopf_registry_holds_every_handler():
    registry = build_registry(Reconciler(RecordingClient()))
    ids = {h.id for h in registry._webhooks.get_all_handlers()}
    assert "validate-endpoint" in ids
    changing = {h.id for h in registry._changing.get_all_handlers()}
    assert any("reconcile_endpoint" in i for i in changing) and any("delete_endpoint" in i for i in changing)
    assert registry._spawning.get_all_handlers() and registry._watching.get_all_handlers()


def test_kopf_keeps_its_bookkeeping_out_of_the_status():
    import kopf

    registry = build_registry(Reconciler(RecordingClient()), webhook_cert_dir="/certs")
    settings = kopf.OperatorSettings()
    for handler in registry._activities.get_all_handlers():
        handler.fn(settings=settings)
    assert isinstance(settings.persistence.progress_storage, kopf.AnnotationsProgressStorage)
    assert settings.persistence.finalizer == "fleetserve.io/cleanup" and settings.scanning.disabled
    assert settings.admission.server is not None


def test_render_warnings_reach_the_status_and_the_local_fleets_notes_stay_out(env):
    """The operator dropped what `render k8s` warns about (a label it overrides, a plain credential), and the
    admission webhook printed the local fleet's notes ("applies to Kubernetes rendering only") on Kubernetes."""
    client, reconciler = env
    client.patch(OWNER_API_VERSION, "Endpoint", NS, NAME, {"metadata": {"labels": {"app.kubernetes.io/name": "x"}}})
    reconciler.reconcile(_endpoint(client))
    warnings = _endpoint(client)["status"]["warnings"]
    assert any(w.startswith("metadata.labels.app.kubernetes.io/name: is a label fleetserve sets") for w in warnings)
    assert any(w.startswith("spec.engine.args: vLLM aborts its in-flight requests") for w in warnings)
    for local in ("spec.placement:", "spec.engine.gpus:", "metadata.labels: applies to Kubernetes"):
        assert not any(w.startswith(local) for w in warnings), local
    said: list[str] = []
    validate_handler(_endpoint(client), operation="CREATE", warnings=said)
    assert said and not any(w.startswith(("spec.placement:", "metadata.labels: applies")) for w in said)
    client.clear()
    reconciler.reconcile(_endpoint(client))
    assert client.writes() == []  # the same warnings: no status write
    # the label goes: its warning leaves the status
    client.patch(OWNER_API_VERSION, "Endpoint", NS, NAME, {"metadata": {"labels": {"app.kubernetes.io/name": None}}})
    reconciler.reconcile(_endpoint(client))
    assert not any("app.kubernetes.io/name" in w for w in _endpoint(client)["status"]["warnings"])


def test_the_simulated_clouds_notes_stay_out_of_kubernetes_warnings():
    """The SageMaker-at-EC2-rates note and the simulated cloud's limit notes reached kubectl and the status."""
    from pathlib import Path

    from fleetserve.k8s.render import kubernetes_warnings
    from fleetserve.spec.load import load_spec_text

    text = (Path(__file__).parents[2] / "examples" / "simulated-cloud.yaml").read_text()
    text = text.replace("    simulated:", "    simulated:\n      limits: {p5.48xlarge: 1}", 1)
    loaded = load_spec_text(text)
    local = {w.path for w in loaded.warnings}
    assert {"spec.placement.instanceTypes", "spec.capacity.simulated.limits.p5.48xlarge"} <= local
    assert not [w for w in kubernetes_warnings(loaded) if w.path.startswith(("spec.placement", "spec.capacity"))]


def test_two_passes_over_one_endpoint_take_turns():
    """kopf runs the create handler, the timer and child events in threads at once: a second pass that ran
    inside the first created what the first was about to, and the new Endpoint failed AlreadyExists."""
    import threading

    class Interleaving(RecordingClient):
        second: threading.Thread | None = None
        armed = False

        def create(self, obj):
            if self.armed and self.second is None:  # the first child: its event starts another pass now
                self.second = threading.Thread(target=lambda: results.append(reconciler.reconcile(_endpoint(self))))
                self.second.start()
                self.second.join(0.2)
                assert self.second.is_alive()  # it waits for this pass
            return super().create(obj)

    results: list = []
    client = Interleaving()
    client.create(_resource())
    reconciler = Reconciler(client, clock=Clock())
    client.armed = True
    first = reconciler.reconcile(_endpoint(client))
    client.second.join(10)
    assert first.failure is None and results and results[0].failure is None, (first.failure, results)
    assert results[0].actions == []  # the second pass found everything made


def test_a_create_that_finds_our_own_object_is_not_a_conflict(env):
    """A list that had not caught up with an earlier create (a watch cache, another operator replica): the
    object is ours, so the pass goes on; an object someone else owns is still the Endpoint's failure."""
    client, reconciler = env
    reconciler.reconcile(_endpoint(client))
    real_list = client.list
    client.list = lambda av, kind, ns, sel="": [] if kind == "Deployment" else real_list(av, kind, ns, sel)
    outcome = reconciler.reconcile(_endpoint(client))
    assert outcome.failure is None and {a.kind for a in outcome.actions if a.verb == "create"} == {"Deployment"}


def test_a_pass_over_an_endpoint_being_deleted_creates_nothing(env):
    """A timer pass that started before the deletion recreated the NodePools the delete handler removed
    (cluster-scoped: nothing else deletes them)."""
    client, reconciler = env
    stale = _endpoint(client)
    reconciler.reconcile(stale)
    reconciler.cleanup(stale)
    assert not [k for k in client.objects if k[1] == "NodePool"]
    client.objects[(OWNER_API_VERSION, "Endpoint", NS, NAME)]["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    client.clear()
    outcome = reconciler.reconcile(stale)
    assert outcome.actions == [] and client.writes() == []
    assert not [k for k in client.objects if k[1] == "NodePool"]


def test_a_renamed_deployment_leaves_the_status(env):
    """The status went out as a merge patch of a map: a Deployment renamed (one instance type instead of
    two) stayed listed forever."""
    client, reconciler = env
    reconciler.reconcile(_endpoint(client))
    before = set(_endpoint(client)["status"]["deployments"])
    _update_spec(client, lambda s: s["placement"].update(instanceTypes=s["placement"]["instanceTypes"][:1]))
    reconciler.reconcile(_endpoint(client))
    after = set(_endpoint(client)["status"]["deployments"])
    now = {k[3] for k in client.objects if k[1] in ("Deployment", "StatefulSet")}
    assert before != after and after == now


def test_a_rolling_update_is_not_complete_while_old_pods_serve(env):
    client, reconciler = env
    reconciler.reconcile(_endpoint(client))
    for k in [k for k in client.objects if k[1] in ("Deployment", "StatefulSet")]:
        client.set_ready(NS, k[3], kind=k[1])
    assert reconciler.reconcile(_endpoint(client)).status["state"] == "DeploymentComplete"
    router = next(k for k in client.objects if k[1] == "Deployment" and k[3].endswith("router"))
    # maxSurge 1: both new pods updated, one not ready yet, one old pod still serving
    client.objects[router]["status"].update(replicas=3, updatedReplicas=2, readyReplicas=2, availableReplicas=2)
    status = reconciler.reconcile(_endpoint(client)).status
    assert status["state"] == "DeploymentInProgress", status
    assert "rolling out" in next(c["message"] for c in status["conditions"] if c["status"] == "True")


def test_a_failed_list_keeps_the_status_and_retries(env):
    """A 500 on the Deployment list had set DeploymentPending, "no Deployment created yet"."""
    from fleetserve.k8s.client import ApiError

    client, reconciler = env
    reconciler.reconcile(_endpoint(client))
    before = _endpoint(client)["status"]
    client.fail("list", "Deployment", ApiError("etcd timeout", 500, "InternalError"))
    client.fail("list", "Deployment", ApiError("etcd timeout", 500, "InternalError"))  # the actions' list first
    outcome = reconciler.reconcile(_endpoint(client))
    assert outcome.retry and outcome.failure.reason == "InternalError"
    assert _endpoint(client)["status"] == before


def test_the_endpoints_annotations_reach_the_engine_pods_as_render_puts_them(env):
    """The operator read name, namespace and labels only: an istio sidecar switch on the Endpoint reached the
    pods through `render k8s` and not through the operator. kopf's and kubectl's own records stay off."""
    client, reconciler = env
    client.patch(OWNER_API_VERSION, "Endpoint", NS, NAME, {"metadata": {"annotations": {
        "sidecar.istio.io/inject": "false", "fleetserve.io/last-handled-configuration": "{}",
        "kubectl.kubernetes.io/last-applied-configuration": "{}"}}})
    reconciler.reconcile(_endpoint(client))
    engines = [o for k, o in client.objects.items() if k[1] == "Deployment" and "engine" in k[3]]
    assert engines
    for d in engines:
        pod = d["spec"]["template"]["metadata"].get("annotations") or {}
        assert pod.get("sidecar.istio.io/inject") == "false", pod
        assert not any(k.startswith(("fleetserve.io/last-handled", "kubectl.kubernetes.io")) for k in pod), pod


def test_what_the_api_server_rewrites_is_not_drift():
    """The API server returns stringData folded into data, leaves out false omitempty bools and writes
    quantities in canonical form (`4000000000` as `4G`, `0.5` as `500m`): compared as written, the API-key
    Secret, the engine-pods Service and the Redis StatefulSet were patched on every pass, forever."""
    spec = copy.deepcopy(FULL["spec"])
    spec["kvCache"]["l2"]["maxBytes"] = 4_000_000_000
    spec["engine"]["resources"] = {"requests": {"cpu": "0.5", "memory": "16000000000"}}
    client = RecordingClient()
    client.create(_resource(spec))
    reconciler = Reconciler(client, clock=Clock())
    reconciler.reconcile(_endpoint(client))
    stored = client.get("apps/v1", "StatefulSet", NS, "chat-redis")
    assert "G" in json.dumps(stored["spec"]["template"]["spec"]["containers"][0]["resources"])  # rewritten
    for _ in range(2):
        client.clear()
        assert reconciler.reconcile(_endpoint(client)).actions == []
        assert client.writes() == []
    # a real change of amount is still drift
    _update_spec(client, lambda s: s["kvCache"]["l2"].update(maxBytes=5_000_000_000))
    assert [a.name for a in reconciler.reconcile(_endpoint(client)).actions if a.verb == "patch"] == ["chat-redis"]


def test_renamed_engine_deployments_are_handed_over_make_before_break(env):
    """One instance type instead of two renames the engine Deployment: the new one was created with render's
    replica count (1) and the KEDA-scaled old ones (5 busy replicas) deleted in the same pass. Now the new tier
    0 starts at 5 and the old ones shrink as its replicas become available, their NodePools kept meanwhile (a
    NodePool's GPU limit that cannot hold both fleets frees a node per new replica)."""
    client, reconciler = env
    reconciler.reconcile(_endpoint(client))
    t0, t1 = sorted(k for k in client.objects if k[1] == "Deployment" and "-engine-t" in k[3])
    client.objects[t0]["spec"]["replicas"] = 3  # KEDA scaled tier 0, and the overflow tier took 2 more
    client.objects[t1]["spec"]["replicas"] = 2
    pool_t1 = next(k for k in client.objects if k[1] == "NodePool" and k[3].endswith("-t1"))
    _update_spec(client, lambda s: s["placement"].update(instanceTypes=s["placement"]["instanceTypes"][:1]))

    def deployments_deleted(outcome):
        return sorted(a.name for a in outcome.actions if a.verb == "delete" and a.kind == "Deployment")

    outcome = reconciler.reconcile(_endpoint(client))
    (created,) = [a for a in outcome.actions if a.verb == "create" and a.kind == "Deployment"]
    assert created.name == "chat-engine" and created.body["spec"]["replicas"] == 5  # not render's 1
    assert deployments_deleted(outcome) == [] and t0 in client.objects and t1 in client.objects
    assert pool_t1 in client.objects  # its replicas still serve there
    budgets = {k for k in client.objects if k[1] == "PodDisruptionBudget" and k[3] in (t0[3], t1[3])}
    # a drain evicts the old replicas still serving one at a time, not all at once: tier 1's pods keep their
    # budget; tier 0's are the new tier 0's pods' selector, whose budget covers them (two over one pod: the
    # Eviction API refuses it)
    assert {k[3] for k in budgets} == {t1[3]}
    selectors = [json.dumps(o["spec"]["selector"], sort_keys=True) for k, o in client.objects.items()
                 if k[1] == "PodDisruptionBudget"]
    assert len(selectors) == len(set(selectors)), selectors
    client.set_ready(NS, "chat-engine", 2)  # 2 of 5 available: the old ones serve the other 3
    outcome = reconciler.reconcile(_endpoint(client))
    assert deployments_deleted(outcome) == [t1[3]] and client.objects[t0]["spec"]["replicas"] == 3
    assert pool_t1 not in client.objects
    assert not [k for k in budgets if k in client.objects]  # gone with its Deployment
    client.set_ready(NS, "chat-engine", 4)
    reconciler.reconcile(_endpoint(client))
    assert client.objects[t0]["spec"]["replicas"] == 1  # shrinks with each new replica available
    client.set_ready(NS, "chat-engine")
    assert deployments_deleted(reconciler.reconcile(_endpoint(client))) == [t0[3]]
    assert not [k for k in budgets if k in client.objects]
    assert reconciler.reconcile(_endpoint(client)).actions == []


def _one_tier_going_to_two(replicas: int) -> tuple[RecordingClient, Reconciler, dict]:
    """An Endpoint on one instance type whose engine Deployment runs `replicas`, its spec just changed to FULL's
    two types (not reconciled yet); the one-type spec comes back too, to revert to."""
    one = copy.deepcopy(FULL["spec"])
    one["placement"]["instanceTypes"] = one["placement"]["instanceTypes"][:1]
    client = RecordingClient()
    client.create(_resource(one))
    reconciler = Reconciler(client, clock=Clock())
    reconciler.reconcile(_endpoint(client))
    client.objects[("apps/v1", "Deployment", NS, "chat-engine")]["spec"]["replicas"] = replicas
    _update_spec(client, lambda s: s["placement"].update(instanceTypes=FULL["spec"]["placement"]["instanceTypes"]))
    return client, reconciler, one


def test_a_static_fleet_handed_over_keeps_its_count_and_its_overflow_tier_starts_empty():
    """The replica bump went to every new scaled Deployment, the overflow tier included (10 new pods for 5)."""
    client, reconciler, _ = _one_tier_going_to_two(replicas=4)
    outcome = reconciler.reconcile(_endpoint(client))
    made = {a.name: a.body["spec"]["replicas"] for a in outcome.actions
            if a.verb == "create" and a.kind == "Deployment"}
    assert made == {"chat-engine-t0": 4, "chat-engine-t1": 0}
    client.set_ready(NS, "chat-engine-t0")
    deleted = [a.name for a in reconciler.reconcile(_endpoint(client)).actions if a.verb == "delete"]
    assert "chat-engine" in deleted

def test_the_kubernetes_client_bounds_every_call():
    """No timeout: a connection the API server never answered held one of kopf's worker threads for ever."""
    from fleetserve.k8s.client import REQUEST_TIMEOUT_S, KubeClient

    seen = []

    class Resource:
        def get(self, **kwargs):
            seen.append(kwargs)
            return {"items": []}

        patch = create = delete = get

    class Resources:
        def get(self, **_):
            return Resource()

    class Dynamic:
        resources = Resources()

    client = KubeClient(dynamic=Dynamic())
    client.list("apps/v1", "Deployment", "ns", "a=b")
    client.patch("apps/v1", "Deployment", "ns", "d", {"spec": {}})
    client.delete("apps/v1", "Deployment", "ns", "d")
    assert len(seen) == 3 and all(k["_request_timeout"] == REQUEST_TIMEOUT_S for k in seen)


def test_an_api_server_that_does_not_answer_is_an_api_error_retried():
    """A timeout escaped as urllib3's own exception: no status was written and kopf's retry was its default."""
    from urllib3.exceptions import ReadTimeoutError

    from fleetserve.k8s.client import ApiError, KubeClient

    class Resource:
        def get(self, **_):
            raise ReadTimeoutError(None, "/apis", "read timed out")

    class Resources:
        def get(self, **_):
            return Resource()

    class Dynamic:
        resources = Resources()

    with pytest.raises(ApiError) as info:
        KubeClient(dynamic=Dynamic()).list("apps/v1", "Deployment", "ns")
    assert info.value.code == 504 and info.value.reason == "Timeout"


def test_an_invalid_spec_whose_status_cannot_be_written_is_retried(env):
    from fleetserve.k8s.client import ApiError

    client, reconciler = env
    _update_spec(client, lambda s: s.update(replicas=-1))
    client.fail("list", "Deployment", ApiError("etcd timeout", 500, "InternalError"))
    outcome = reconciler.reconcile(_endpoint(client))
    assert outcome.failure.reason == "InvalidSpec" and outcome.retry  # PermanentError had left the status stale


def test_a_handover_reverted_midway_keeps_every_serving_replica():
    """1 tier -> 2 -> 1 before the handover ended: the old name, shrunk by the handover, was taken as the whole
    fleet, and the 3 serving replicas of the new tier 0 were deleted in that pass."""
    client, reconciler, one = _one_tier_going_to_two(replicas=5)
    reconciler.reconcile(_endpoint(client))
    client.set_ready(NS, "chat-engine-t0", 3)
    reconciler.reconcile(_endpoint(client))
    assert client.objects[("apps/v1", "Deployment", NS, "chat-engine")]["spec"]["replicas"] == 2  # handed over 3
    _update_spec(client, lambda s: s["placement"].update(instanceTypes=one["placement"]["instanceTypes"]))
    outcome = reconciler.reconcile(_endpoint(client))
    deleted = [(a.kind, a.name) for a in outcome.actions if a.verb == "delete"]
    assert ("Deployment", "chat-engine-t0") not in deleted  # its 3 replicas serve until chat-engine takes them
    assert client.objects[("apps/v1", "Deployment", NS, "chat-engine")]["spec"]["replicas"] == 5  # taken back


def test_replicas_the_overflow_tier_serves_count_in_the_handover():
    """Tier 0's type out of capacity: the overflow tier served the whole fleet, and the old Deployment was held
    beside it for ever (twice the GPUs)."""
    client, reconciler, one = _one_tier_going_to_two(replicas=5)
    reconciler.reconcile(_endpoint(client))
    client.objects[("apps/v1", "Deployment", NS, "chat-engine-t1")]["spec"]["replicas"] = 5  # KEDA's overflow
    client.set_ready(NS, "chat-engine-t0", 0)
    client.set_ready(NS, "chat-engine-t1")
    outcome = reconciler.reconcile(_endpoint(client))
    assert [a.name for a in outcome.actions if a.verb == "delete" and a.kind == "Deployment"] == ["chat-engine"]


def test_a_held_tiers_nodepool_keeps_the_old_instance_types_while_its_replicas_serve(env):
    """The pool of tier 0 narrowed to the new types at once: Karpenter replaced the held replicas' nodes as
    drifted, and nothing offered their type any more."""
    client, reconciler = env
    reconciler.reconcile(_endpoint(client))
    t0 = ("apps/v1", "Deployment", NS, "chat-engine-t0")
    client.objects[t0]["spec"]["replicas"] = 4
    pool = next(k for k in client.objects if k[1] == "NodePool" and k[3].endswith("-t0"))

    def types():
        reqs = client.objects[pool]["spec"]["template"]["spec"]["requirements"]
        return sorted(v for r in reqs if r["key"] == "node.kubernetes.io/instance-type" for v in r["values"])

    before = types()
    _update_spec(client, lambda s: s["placement"].update(instanceTypes=s["placement"]["instanceTypes"][1:]))
    reconciler.reconcile(_endpoint(client))
    assert set(before) < set(types())  # widened, not narrowed, while chat-engine-t0 serves
    client.set_ready(NS, "chat-engine")
    reconciler.reconcile(_endpoint(client))  # handed over: the old one goes
    reconciler.reconcile(_endpoint(client))  # and the pool narrows
    assert t0 not in client.objects and not set(before) & set(types())


def test_a_replica_no_listed_type_takes_is_warned_on_kubernetes_too():
    """`validate` said "no replica would start"; render k8s, the webhook and the status dropped it with every other
    note on spec.placement.instanceTypes, and the pods stayed Pending unsaid. A tier whose type takes no replica
    (the others do) is named too: it never starts one, and each scale-up waited for the next tier."""
    from fleetserve.k8s.render import kubernetes_warnings
    from fleetserve.spec.load import load_spec_data

    def spec(types: list[str]) -> dict:
        return {"apiVersion": "fleetserve.io/v1", "kind": "Endpoint", "metadata": {"name": "big"},
                "spec": {"model": {"source": "catalog:llama-3.1-8b-instruct"},
                         "engine": {"kind": "vllm", "gpus": 4}, "placement": {"instanceTypes": types}}}

    none_fit = [str(w) for w in kubernetes_warnings(load_spec_data(spec(["g5.8xlarge"])))]
    assert any("no listed type takes a replica of 4 GPU(s)" in w and "No replica would start" in w
               for w in none_fit), none_fit
    one_misfit = [str(w) for w in kubernetes_warnings(load_spec_data(spec(["g5.8xlarge", "g5.12xlarge"])))]
    assert any(w.startswith("spec.placement.instanceTypes[0]: g5.8xlarge (1 GPU(s)") and "no replica is placed"
               in w for w in one_misfit), one_misfit
    assert not any("instanceTypes[1]" in w for w in one_misfit)


def test_a_new_empty_tier_is_not_said_to_be_rolling_out_old_pods():
    """A new overflow tier at 0/0 its controller had not read yet read "(rolling out: old pods still running)"."""
    from fleetserve.k8s.status import endpoint_status

    new = {"kind": "Deployment", "metadata": {"name": "chat-engine-t1", "generation": 1}, "spec": {"replicas": 0},
           "status": {}}
    message = endpoint_status([new], 1, None, "2026-12-05T00:00:00Z")["conditions"]
    said = " ".join(c.get("message", "") for c in message)
    assert "old pods" not in said and "not yet seen by its controller" in said, said


def test_a_shortage_the_overflow_tier_serves_in_full_is_a_complete_deployment():
    """Tier 0 short of its type: 1 of its 3 pods placed, the overflow tier serving the other 2. Counted per
    Deployment it read DeploymentInProgress for the whole shortage, wanting 5 replicas where the autoscaler asked
    for 3."""
    from fleetserve.k8s.status import COMPLETE, IN_PROGRESS, endpoint_status

    def deployment(name: str, component: str, wanted: int, ready: int, tier: str | None = None,
                   updated: int | None = None, pods: int | None = None) -> dict:
        labels = {"app.kubernetes.io/component": component, **({"fleetserve.io/tier": tier} if tier else {})}
        return {"kind": "Deployment", "metadata": {"name": name, "generation": 1, "labels": labels},
                "spec": {"replicas": wanted},
                "status": {"observedGeneration": 1, "replicas": wanted if pods is None else pods,
                           "updatedReplicas": wanted if updated is None else updated, "readyReplicas": ready,
                           "availableReplicas": ready}}

    router = deployment("chat-router", "router", 1, 1)

    def status(*engines):
        return endpoint_status([*engines, router], 1, None, "2026-12-06T00:00:00Z")

    served = status(deployment("chat-engine-t0", "engine", 3, 1, "0"),
                    deployment("chat-engine-t1", "engine", 2, 2, "1"))
    assert (served["state"], served["replicas"], served["readyReplicas"]) == (COMPLETE, 4, 4)  # 3 engines + router
    assert served["deployments"] == {"chat-engine-t0": "1/3", "chat-engine-t1": "2/2", "chat-router": "1/1"}
    short = status(deployment("chat-engine-t0", "engine", 3, 1, "0"),
                   deployment("chat-engine-t1", "engine", 2, 1, "1"))
    assert (short["state"], short["readyReplicas"]) == (IN_PROGRESS, 3)
    rolling = status(deployment("chat-engine-t0", "engine", 3, 3, "0", updated=1, pods=4),
                     deployment("chat-engine-t1", "engine", 0, 0, "1"))
    assert rolling["state"] == IN_PROGRESS  # old pods left: a rollout, however many are ready
    late = deployment("chat-engine-t0", "engine", 3, 1, "0")  # Pending past its progress deadline: the shortage
    late["status"]["conditions"] = [{"type": "Progressing", "status": "False", "reason": "ProgressDeadlineExceeded",
                                     "message": "ReplicaSet chat-engine-t0-x has timed out progressing."}]
    lagging = status(late, deployment("chat-engine-t1", "engine", 4, 4, "1"))  # the overflow not yet scaled in
    assert (lagging["state"], lagging["replicas"], lagging["readyReplicas"]) == (COMPLETE, 4, 4)
    late_alone = status(late, deployment("chat-engine-t1", "engine", 2, 1, "1"))
    assert late_alone["state"] == "DeploymentFailed"  # short as well: the deadline is a failure again
    one_tier = endpoint_status([deployment("chat-engine", "engine", 3, 1, "0"), router], 1, None, "x")
    assert (one_tier["state"], one_tier["replicas"]) == (IN_PROGRESS, 4)
