"""Why no engine pod can start, read from the pods: the third place of `autoscale/failing.py`'s rule.

The local supervisor tells its router why no replica can start (a static zero, a crash loop, no capacity), the
router refuses held requests at once with 503 `replicas_failing`, and the simulator refuses alike. On Kubernetes
the router finds its replicas through DNS and cannot tell an engine pod loading its model from one that never
will start: each held request waited out the buffer timeout (10 minutes by default) for a 503 naming nothing.

So the operator reads the engine pods at every pass (and its one-minute resync), asks `why_failing`, and writes
the reason into the router's state ConfigMap (`<name>-router-state`, key `failing`), which the router pods mount
and re-read every health round (`fleetserve router --failing-file`). The kubelet refreshes a mounted ConfigMap
within about a minute, so a crash loop is refused within about two; a reason that is stale when a replica is
ready stops nothing (the router refuses only requests that would wait for one). `render k8s` without the
operator writes what the spec alone decides: a static zero.

A pod cannot start when one of its containers waits for a reason that will not pass by waiting: a crash loop (a
second restart, as the local rule counts two failed starts in a row), an image that cannot be pulled (after its
first try), a configuration that names what does not exist (after two minutes: a Secret may come a moment
later). A pod still scheduling, pulling or loading is on its way, and while one is, nothing is refused (as the
supervisor does with a replica starting).
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime

from fleetserve.autoscale.failing import why_failing
from fleetserve.k8s.labels import COMPONENT_LABEL

STATE_KEY = "failing"
# waiting reasons of a container that will not start by waiting, and what makes each final:
CRASH_LOOP_RESTARTS = 2  # CrashLoopBackOff after this many restarts (the local rule: failed to start twice in a row;
# the kubelet says CrashLoopBackOff after one crash, and an OOM once had refused requests while the pod restarted)
PULL_FAILED = frozenset({"ImagePullBackOff", "InvalidImageName"})  # ErrImagePull is the first try: it may pass
CONFIG_FAILED = frozenset({"CreateContainerConfigError", "CreateContainerError", "RunContainerError"})
CONFIG_GRACE_S = 120.0  # ... once the pod is this old (a Secret created a moment after the Deployment is no failure)


def _statuses(pod: dict) -> list[dict]:
    status = pod.get("status") or {}
    return [*(status.get("initContainerStatuses") or []), *(status.get("containerStatuses") or [])]


def pod_ready(pod: dict) -> bool:
    return any(c.get("type") == "Ready" and c.get("status") == "True"
               for c in (pod.get("status") or {}).get("conditions") or [])


def _age_s(pod: dict, now: datetime | None) -> float:
    created = (pod.get("metadata") or {}).get("creationTimestamp")
    if now is None or not created:
        return float("inf")
    try:
        return (now - datetime.fromisoformat(created.replace("Z", "+00:00"))).total_seconds()
    except ValueError:
        return float("inf")


def pod_cannot_start(pod: dict, now: datetime | None = None) -> bool:
    """One of its containers waits for a reason that waiting will not cure (see CRASH_LOOP_RESTARTS, PULL_FAILED,
    CONFIG_FAILED)."""
    for status in _statuses(pod):
        reason = ((status.get("state") or {}).get("waiting") or {}).get("reason")
        if reason == "CrashLoopBackOff" and (status.get("restartCount") or 0) >= CRASH_LOOP_RESTARTS:
            return True
        if reason in PULL_FAILED:
            return True
        if reason in CONFIG_FAILED and _age_s(pod, now) >= CONFIG_GRACE_S:
            return True
    return False


def _counts(pod: dict) -> bool:
    """A pod that is not on its way out (deleted, or ended: a Job-like exit, an eviction)."""
    return not (pod.get("metadata") or {}).get("deletionTimestamp") and \
        (pod.get("status") or {}).get("phase") not in ("Succeeded", "Failed")


def engines_failing(pods: Iterable[dict], desired: int, autoscaled: bool, external: bool,
                    now: datetime | None = None) -> str | None:
    """The reason no engine pod can start now, or None while one may (or one serves). `desired`: the replicas
    the engine Deployments want now (KEDA's choice when it scales them); `now`: for the pods' ages."""
    live = [p for p in pods if _counts(p)]
    serving = any(pod_ready(p) for p in live)
    stuck = [p for p in live if not pod_ready(p) and pod_cannot_start(p, now)]
    on_the_way = any(not pod_ready(p) and not pod_cannot_start(p, now) for p in live)
    return why_failing(desired, autoscaled, external, serving, on_the_way, "",
                       crash_looping=bool(stuck) and not on_the_way)


def static_reason(desired: int, autoscaled: bool, external: bool) -> str | None:
    """What the spec alone decides (rendered without the operator): a static zero."""
    return why_failing(desired, autoscaled, external, False, True, "")


def _component(obj: dict) -> str | None:
    return ((obj.get("metadata") or {}).get("labels") or {}).get(COMPONENT_LABEL)


def _engine_deployments(objects: Iterable[dict]) -> dict[str, dict]:
    return {o["metadata"]["name"]: o for o in objects if o.get("kind") == "Deployment" and _component(o) == "engine"}


def pods_selector(deployment: dict) -> str:
    """The label selector of a Deployment's pods, as the API's `labelSelector` parameter reads it."""
    match = ((deployment.get("spec") or {}).get("selector") or {}).get("matchLabels") or {}
    return ",".join(f"{k}={v}" for k, v in sorted(match.items()))


def engine_pods(rendered: Iterable[dict], observed: Iterable[dict], list_pods) -> tuple[int, dict[str, list[dict]]]:
    """The replicas the engine Deployments want now (as the cluster holds them: KEDA's choice; one not created
    yet: as rendered) and, per Deployment the cluster holds, its pods (`list_pods(selector)`)."""
    wanted, running = _engine_deployments(tuple(rendered)), _engine_deployments(observed)
    desired, pods = 0, {}
    for name, deployment in wanted.items():
        current = running.get(name, deployment)
        replicas = (current.get("spec") or {}).get("replicas")
        desired += 1 if replicas is None else int(replicas)  # the API's default is 1
        if name in running:
            pods[name] = list_pods(pods_selector(current))
    return desired, pods


def current_reason(observed: Iterable[dict]) -> str | None:
    """What the router's state ConfigMap says now (kept when the pods cannot be read)."""
    for obj in observed:
        if obj.get("kind") == "ConfigMap" and STATE_KEY in (obj.get("data") or {}):
            return obj["data"][STATE_KEY] or None
    return None


def with_reason(objects: Iterable[dict], reason: str | None) -> tuple[dict, ...]:
    """The rendered objects with the router's state ConfigMap (the one holding STATE_KEY) saying `reason`."""
    out = []
    for obj in objects:
        if obj.get("kind") == "ConfigMap" and STATE_KEY in (obj.get("data") or {}):
            obj = {**obj, "data": {**obj["data"], STATE_KEY: reason or ""}}
        out.append(obj)
    return tuple(out)
