"""`fleetserve operator`: kopf handlers that keep each `Endpoint` resource's children as `render` makes them.

    Reconciler(client, options, clock).reconcile(body) -> Outcome     one pass: spec -> render -> actions -> status
    Reconciler.cleanup(body)                                          on deletion: cluster-scoped children
    build_registry(reconciler) -> kopf.OperatorRegistry              the handlers, for kopf.run

One pass reads the Endpoint as our spec (webhook.endpoint_from_resource: the CLI's messages), renders the
desired objects (`render`, the function behind `fleetserve render k8s`) with the router's state ConfigMap
saying why no engine pod can start (failing.py: read from the engine pods), lists the children it owns,
computes the actions (`reconcile`, pure) and applies them through the one client port (client.py), then
writes the status computed from the child Deployments (status.py), with the warnings `render k8s` would
print (`status.warnings`: settings that render differently or not at all). An invalid spec or a render error leaves
the children as they are and sets `DeploymentFailed` with the reason; an API error does the same and asks
kopf to retry. A pass over an unchanged Endpoint makes no writes at all.

Handlers: create/update/resume reconcile; a timer re-reconciles every minute (drift, and status while
pods come up); events of child Deployments (label fleetserve.io/endpoint) reconcile their Endpoint, so the
status follows ready replicas; delete removes cluster-scoped children (NodePools) behind kopf's finalizer
(namespaced ones go with the garbage collector, through their ownerReferences); validate answers the
admission webhook. kopf keeps its bookkeeping in annotations (fleetserve.io/...), not in the status, which
the CRD's structural schema would prune.
"""

from __future__ import annotations

import datetime
import logging
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from fleetserve.autoscale.failing import STATIC_ZERO
from fleetserve.capacity.catalog import Catalog
from fleetserve.k8s.client import ApiError, Client, Conflict, NotFound, apply_merge_patch
from fleetserve.k8s.context import RenderOptions
from fleetserve.k8s.deletion_cost import cost_patches, deletion_costs
from fleetserve.k8s.failing import current_reason, engine_pods, engines_failing, with_reason
from fleetserve.k8s.keda import scaler_warnings
from fleetserve.k8s.reconcile import (
    CHILD_KINDS,
    ENDPOINT_LABEL,
    ENDPOINT_NAMESPACE_LABEL,
    GROUP,
    OWNER_API_VERSION,
    OWNER_KIND,
    OWNER_PLURAL,
    VERSION,
    Action,
    Owner,
    reconcile,
)
from fleetserve.k8s.render import render, rendered_warnings
from fleetserve.k8s.status import Failure, endpoint_status
from fleetserve.k8s.webhook import endpoint_from_resource, validate_handler
from fleetserve.spec.errors import SpecError

log = logging.getLogger(__name__)

WEBHOOK_ID = "validate-endpoint"  # kopf serves it at /validate-endpoint
WEBHOOK_PORT = 9443
RESYNC_SECONDS = 60


def utc_now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def plain(value):
    """A kopf Body (read-only mapping views) as plain dicts and lists."""
    if isinstance(value, Mapping):
        return {k: plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [plain(v) for v in value]
    return value


class StatusUnread(Exception):
    """The children could not be listed for the status (an API error): it is left as it was."""

    def __init__(self, error: ApiError):
        super().__init__(str(error))
        self.error = error


@dataclass
class Outcome:
    actions: list[Action] = field(default_factory=list)
    status: dict = field(default_factory=dict)
    failure: Failure | None = None
    retry: bool = False  # an API error: try again later (kopf.TemporaryError)


class Reconciler:
    def __init__(self, client: Client, options: RenderOptions | None = None, clock: Callable[[], str] = utc_now):
        self.client = client
        self.options = options or RenderOptions()
        self.clock = clock
        self.catalog = Catalog.builtin()  # node prices for the scale-in ranks (deletion_cost.py)
        # kopf runs the Endpoint's handlers, its timer and child events in threads at once: one pass per Endpoint
        # at a time, or a second pass creates what the first is about to and the first fails AlreadyExists
        self._locks: dict[str, threading.Lock] = {}
        self._locks_guard = threading.Lock()

    def _lock(self, uid: str) -> threading.Lock:
        with self._locks_guard:
            return self._locks.setdefault(uid, threading.Lock())

    @staticmethod
    def owner(body: Mapping) -> Owner:
        meta = body["metadata"]
        return Owner(meta["name"], meta.get("namespace") or "default", meta["uid"])

    def observed(self, owner: Owner) -> list[dict]:
        out = []
        for kind in CHILD_KINDS:
            namespace = owner.namespace if kind.namespaced else None
            out += [o for o in self.client.list(kind.api_version, kind.kind, namespace, owner.selector)
                    if owner.owns(o)]
        return out

    def _apply(self, action: Action, owner: Owner) -> None:
        c = self.client
        if action.verb == "create":
            try:
                c.create(action.body)
            except Conflict:
                # a list that had not caught up with an earlier create (another operator replica, a watch
                # lag): ours already, the next pass compares it; anything else's is the Endpoint's failure
                existing = c.get(action.api_version, action.kind, action.namespace, action.name)
                if existing is None or not owner.owns(existing):
                    raise
        elif action.verb == "patch":
            c.patch(action.api_version, action.kind, action.namespace, action.name, action.body)
        else:
            try:
                c.delete(action.api_version, action.kind, action.namespace, action.name)
            except NotFound:
                pass  # already gone: what we wanted

    def _apply_all(self, actions: list[Action], owner: Owner) -> Failure | None:
        """Apply every action, each whatever the others did: one the API server refuses (KEDA's CRD not installed,
        an object its webhook rejects) had held back everything after it, monitoring and all, until it was
        fixed. A failed delete of a ScaledObject stops the pass: the Deployment patches after it assume KEDA no
        longer scales them. The failure names the first refusal and counts the rest."""
        failed: list[tuple[Action, ApiError]] = []
        for action in actions:
            try:
                self._apply(action, owner)
            except ApiError as exc:
                failed.append((action, exc))
                if action.verb == "delete" and action.kind == "ScaledObject":
                    break
        if not failed:
            return None
        action, exc = failed[0]
        more = f" (and {len(failed) - 1} more: {'; '.join(str(a) for a, _ in failed[1:4])})" if len(failed) > 1 else ""
        return Failure(exc.reason, f"{action}: {exc}{more}")

    def reconcile(self, body: Mapping) -> Outcome:
        body = plain(body)
        owner = self.owner(body)
        with self._lock(owner.uid):
            # what the pass waited behind may have changed it, or begun its deletion: a pass over a stale body
            # recreated the NodePools that the delete handler had just removed (cluster-scoped: nothing collects
            # them)
            try:
                fresh = self.client.get(OWNER_API_VERSION, OWNER_KIND, owner.namespace, owner.name)
            except ApiError as exc:  # the status cannot be written either: kopf retries the pass
                return Outcome(failure=Failure(exc.reason, f"read Endpoint {owner.namespace}/{owner.name}: {exc}"),
                               retry=True)
            if fresh is None or (fresh.get("metadata") or {}).get("deletionTimestamp") or \
                    (fresh.get("metadata") or {}).get("uid") != owner.uid:
                return Outcome()
            return self._reconcile(plain(fresh), owner)

    def _reconcile(self, body: dict, owner: Owner) -> Outcome:
        outcome = Outcome()
        now = self.clock()  # one reading per pass: the pods' ages and the status's transition times
        warnings: list[str] = []
        stuck: Failure | None = None  # engine pods that cannot start: the status's failure, never kopf's retry
        try:
            loaded = endpoint_from_resource(body)
            rendered = render(loaded.endpoint, self.options)
        except SpecError as exc:
            outcome.failure = Failure("InvalidSpec", "; ".join(str(p) for p in exc.problems))
        except ValueError as exc:
            outcome.failure = Failure("RenderFailed", str(exc))
        else:
            warnings = rendered_warnings(loaded, rendered)
            try:
                observed = self.observed(owner)
                reason, pods = self.failing(loaded.endpoint, rendered.objects, observed, owner, now)
                if reason and reason != STATIC_ZERO:  # pods that cannot start: the status says so too, not only
                    # the router's ConfigMap (a static zero is the spec's choice, no failure)
                    stuck = Failure("EnginePodsCannotStart", f"{reason}: kubectl -n {owner.namespace} describe pods "
                                    f"-l app.kubernetes.io/instance={owner.name},app.kubernetes.io/component=engine")
                objects = with_reason(rendered.objects, reason)
                outcome.actions = reconcile(objects, observed, owner)
                failed = self._apply_all(outcome.actions, owner)
                if failed:
                    outcome.failure, outcome.retry = failed, True
                warnings += scaler_warnings(observed)
                self.rank_for_scale_in(pods, owner)
            except ApiError as exc:  # the children or the pods could not be listed
                outcome.failure, outcome.retry = Failure(exc.reason, str(exc)), True
        try:
            outcome.status = self.write_status(body, owner, outcome.failure or stuck, warnings, now)
        except StatusUnread as exc:
            outcome.status = body.get("status") or {}
            outcome.retry = True  # even after an invalid spec, whose status is not written yet
            if outcome.failure is None:
                outcome.failure = Failure(exc.error.reason, f"list workloads: {exc.error}")
        return outcome

    def failing(self, endpoint, rendered: tuple[dict, ...], observed: list[dict], owner: Owner,
                now_text: str) -> tuple[str | None, dict[str, list[dict]]]:
        """Why no engine pod can start, for the router's state ConfigMap (failing.py), and the engine pods per
        Deployment. Pods that cannot be read (no RBAC for them yet after an upgrade, an API timeout) keep what the
        ConfigMap says: a hint must never hold back the pass that applies the spec."""
        def list_pods(selector: str) -> list[dict]:
            return self.client.list("v1", "Pod", owner.namespace, selector)

        try:
            now = datetime.datetime.fromisoformat(now_text.replace("Z", "+00:00"))
        except ValueError:
            now = None
        try:
            desired, pods = engine_pods(rendered, observed, list_pods)
        except ApiError as exc:
            log.warning("engine pods of %s/%s not read (%s): the router keeps its last word on them",
                        owner.namespace, owner.name, exc)
            return current_reason(observed), {}
        # the spec's word, as render's router_state: the overflow tiers' ScaledObjects (made for any two or more
        # instance types) scale on tier 0's unschedulable pods and wake nothing, yet had counted as autoscaling,
        # and the operator cleared the static-zero reason render had written (10-minute holds, not a 503)
        scaling = endpoint.spec.autoscaling
        autoscaled = scaling is not None and scaling.enabled
        return engines_failing([p for ps in pods.values() for p in ps], desired, autoscaled,
                               endpoint.spec.engine.kind == "external", now), pods

    def rank_for_scale_in(self, pods: dict[str, list[dict]], owner: Owner) -> None:
        """Each engine pod's deletion cost: which one a scale-in removes, as the local fleet would drain
        (deletion_cost.py). A node or pod that cannot be read or written leaves the ranks as they are: a
        hint, never the pass's failure."""
        names = {p["spec"]["nodeName"] for ps in pods.values() for p in ps if (p.get("spec") or {}).get("nodeName")}
        if not names:
            return
        try:
            nodes = {}
            for name in sorted(names):
                node = self.client.get("v1", "Node", None, name)
                if node is not None:
                    nodes[name] = node
            for name, patch in cost_patches(pods, deletion_costs(pods, nodes, self.catalog)):
                try:
                    self.client.patch("v1", "Pod", owner.namespace, name, patch)
                except NotFound:
                    continue  # deleted since the list: nothing to rank
        except ApiError as exc:
            log.warning("scale-in ranks of %s/%s not written (%s): a scale-in picks pods without them",
                        owner.namespace, owner.name, exc)

    def write_status(self, body: dict, owner: Owner, failure: Failure | None, warnings: list[str] | None = None,
                     now: str | None = None) -> dict:
        previous = body.get("status") or {}
        try:
            workloads = [d for kind in ("Deployment", "StatefulSet")
                         for d in self.client.list("apps/v1", kind, owner.namespace, owner.selector) if owner.owns(d)]
        except ApiError as exc:
            # no observation is not "nothing created yet": the status stays as it was, and the pass is retried
            raise StatusUnread(exc) from None
        status = endpoint_status(workloads, body["metadata"].get("generation", 1), previous, now or self.clock(),
                                 failure, warnings or ())
        if apply_merge_patch(previous, status) != previous:
            self.client.patch_status(OWNER_API_VERSION, OWNER_KIND, owner.namespace, owner.name, status)
        return status

    def cleanup(self, body: Mapping) -> list[str]:
        """Delete the cluster-scoped children (no ownerReference can reach them); names deleted."""
        owner = self.owner(plain(body))
        with self._lock(owner.uid):  # after any pass under way, which could create one more
            gone = self._cleanup(owner)
        with self._locks_guard:
            self._locks.pop(owner.uid, None)
        return gone

    def _cleanup(self, owner: Owner) -> list[str]:
        gone = []
        for kind in CHILD_KINDS:
            if kind.namespaced:
                continue
            for obj in self.client.list(kind.api_version, kind.kind, None, owner.selector):
                if owner.owns(obj):
                    try:
                        self.client.delete(kind.api_version, kind.kind, None, obj["metadata"]["name"])
                    except NotFound:
                        continue
                    gone.append(f"{kind.kind} {obj['metadata']['name']}")
        return gone

    def reconcile_owner_of(self, child: Mapping) -> Outcome | None:
        """A child changed (a Deployment's ready replicas): reconcile the Endpoint it belongs to."""
        labels = (child.get("metadata") or {}).get("labels") or {}
        name, namespace = labels.get(ENDPOINT_LABEL), labels.get(ENDPOINT_NAMESPACE_LABEL)
        if not name or not namespace:
            return None
        body = self.client.get(OWNER_API_VERSION, OWNER_KIND, namespace, name)
        if body is None or (body.get("metadata") or {}).get("deletionTimestamp"):
            return None
        return self.reconcile(body)


def build_registry(reconciler: Reconciler, webhook_cert_dir: str | None = None, webhook_port: int = WEBHOOK_PORT):
    """The kopf handlers, in a registry of their own (nothing registers at import time)."""
    import logging

    import kopf

    registry = kopf.OperatorRegistry()
    resource = (GROUP, VERSION, OWNER_PLURAL)

    def outcome_to_kopf(outcome: Outcome, logger) -> None:
        for action in outcome.actions:
            logger.info(str(action))
        if outcome.failure is not None:
            message = f"{outcome.failure.reason}: {outcome.failure.message}"
            if outcome.retry:
                raise kopf.TemporaryError(message, delay=30)
            raise kopf.PermanentError(message)

    @kopf.on.startup(registry=registry)
    def configure(settings: kopf.OperatorSettings, **_):
        settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=GROUP)
        settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(prefix=GROUP)
        settings.persistence.finalizer = f"{GROUP}/cleanup"
        settings.posting.level = logging.WARNING
        settings.scanning.disabled = True  # no CRD/namespace watching: RBAC stays minimal
        if webhook_cert_dir:
            settings.admission.server = kopf.WebhookServer(
                addr="0.0.0.0", port=webhook_port, certfile=f"{webhook_cert_dir}/tls.crt",
                pkeyfile=f"{webhook_cert_dir}/tls.key")

    @kopf.on.create(*resource, registry=registry)
    @kopf.on.update(*resource, registry=registry)
    @kopf.on.resume(*resource, registry=registry)
    def reconcile_endpoint(body, logger, **_):
        outcome_to_kopf(reconciler.reconcile(body), logger)

    @kopf.timer(*resource, interval=RESYNC_SECONDS, idle=RESYNC_SECONDS / 2, registry=registry)
    def resync(body, logger, **_):
        outcome = reconciler.reconcile(body)
        for action in outcome.actions:
            logger.info(f"drift: {action}")
        if outcome.failure is not None:  # the status says it too; the log had nothing
            logger.warning(f"resync: {outcome.failure.reason}: {outcome.failure.message}")

    @kopf.on.event("apps", "v1", "deployments", labels={ENDPOINT_LABEL: kopf.PRESENT}, registry=registry)
    @kopf.on.event("apps", "v1", "statefulsets", labels={ENDPOINT_LABEL: kopf.PRESENT}, registry=registry)
    def child_changed(body, **_):
        reconciler.reconcile_owner_of(plain(body))

    @kopf.on.delete(*resource, registry=registry)
    def delete_endpoint(body, logger, **_):
        for name in reconciler.cleanup(body):
            logger.info(f"deleted {name}")

    @kopf.on.validate(*resource, id=WEBHOOK_ID, registry=registry)
    def validate(**kwargs):
        validate_handler(**kwargs, options=reconciler.options)
    return registry


def run(client: Client | None = None, options: RenderOptions | None = None, namespaces: tuple[str, ...] = (),
        liveness: str | None = "http://0.0.0.0:8081/healthz", webhook_cert_dir: str | None = None,
        webhook_port: int = WEBHOOK_PORT) -> None:
    """Run the operator until it is stopped (cluster-wide unless namespaces are given)."""
    import kopf

    from fleetserve.k8s.client import KubeClient

    reconciler = Reconciler(client or KubeClient(), options)
    registry = build_registry(reconciler, webhook_cert_dir, webhook_port)
    kopf.run(registry=registry, standalone=True, clusterwide=not namespaces, namespaces=namespaces,
             liveness_endpoint=liveness)
