"""An Endpoint's status from its child Deployments and StatefulSets (the L2 Redis), with HyperPod's state names.

    endpoint_status(workloads, generation, previous, now, failure=None, warnings=()) -> status

`state` is one of DeploymentPending (nothing created yet), DeploymentInProgress (some workload has fewer
ready replicas than it wants, has not seen its latest spec, or is still replacing old pods),
DeploymentComplete (every workload has observed its generation and its rollout is done, as `kubectl rollout
status` judges it: all replicas updated and available, no old pod left; one scaled to zero counts as ready)
and DeploymentFailed (an invalid spec, an API error, or a Deployment past its progress deadline), the values
of HyperPod's `status.state`. `conditions` holds one condition per state with `status: "True"` on the
current one only; its `reason` and `message` say why. `lastTransitionTime` changes only when a condition's
status flips, so a status computed twice from the same observations is equal (no needless status writes).
`warnings` lists what `render k8s` would warn about the spec (None when there is nothing, or the spec was
refused), so `kubectl get endpoint -o yaml` shows it without the admission webhook's one-time print.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from fleetserve.k8s.labels import COMPONENT_LABEL, TIER_LABEL

PENDING = "DeploymentPending"
IN_PROGRESS = "DeploymentInProgress"
COMPLETE = "DeploymentComplete"
FAILED = "DeploymentFailed"
STATES = (PENDING, IN_PROGRESS, COMPLETE, FAILED)
#: condition type per state (HyperPod's `Failed` condition for DeploymentFailed)
CONDITION = {PENDING: "DeploymentPending", IN_PROGRESS: "DeploymentInProgress", COMPLETE: "DeploymentComplete",
             FAILED: "Failed"}


@dataclass(frozen=True)
class Failure:
    reason: str  # InvalidSpec, RenderFailed, an API error's reason (AlreadyExists, ...), ProgressDeadlineExceeded
    message: str


def _rolled_out(d: dict, wanted: int) -> bool:
    """`kubectl rollout status`'s verdict: every replica updated, no old pod left, the updated ones available
    (a StatefulSet: every replica updated and ready, its current revision the update revision)."""
    status = d.get("status") or {}
    updated = status.get("updatedReplicas") or 0
    if d.get("kind") == "StatefulSet":
        revision = status.get("updateRevision")
        return (status.get("readyReplicas") or 0) >= wanted and (
            revision is None or status.get("currentRevision") == revision or updated >= wanted)
    return updated >= wanted and (status.get("replicas") or 0) <= updated and \
        (status.get("availableReplicas") or 0) >= updated


def _deployment_progress(d: dict) -> tuple[int, int, bool, str | None, bool]:
    """(ready, wanted, settled, deadline message, seen by its controller) of one Deployment or StatefulSet."""
    spec, status, meta = d.get("spec") or {}, d.get("status") or {}, d.get("metadata") or {}
    wanted = spec.get("replicas", 1)
    ready = min(status.get("readyReplicas") or 0, status.get("updatedReplicas") or 0) \
        if d.get("kind") != "StatefulSet" else status.get("readyReplicas") or 0
    seen = (status.get("observedGeneration") or 0) >= meta.get("generation", 1)
    deadline = next((c.get("message") or "progress deadline exceeded" for c in status.get("conditions") or ()
                     if c.get("type") == "Progressing" and c.get("status") == "False"
                     and c.get("reason") == "ProgressDeadlineExceeded"), None)
    return ready, wanted, seen and ready >= wanted and _rolled_out(d, wanted), deadline, seen


def _engine_tier(d: dict) -> int | None:
    """The placement tier of an engine Deployment (its tier label), None for any other workload."""
    labels = (d.get("metadata") or {}).get("labels") or {}
    tier = labels.get(TIER_LABEL)
    if d.get("kind") != "Deployment" or labels.get(COMPONENT_LABEL) != "engine" or not (tier or "").isdigit():
        return None
    return int(tier)


def _rows(workloads: Sequence[dict]) -> tuple[list[tuple], int, int]:
    """(name, ready, wanted, settled, deadline message, seen) per workload, and the endpoint's ready and wanted.

    With several placement tiers, the engines are one fleet: the first tier's Deployment holds what the
    autoscaler asks for, and the later tiers take the replicas it cannot place (its pods stay Pending meanwhile,
    k8s/keda.py). Counted per Deployment, a shortage the overflow tier served in full read as a rollout in
    progress for as long as it lasted, with its Pending pods counted twice in `replicas`. So the engines want
    the first tier's count, are ready by all tiers' ready pods, and are settled once those are enough and no
    tier is still replacing old pods."""
    rows = sorted((d["metadata"]["name"], *_deployment_progress(d)) for d in workloads)
    tiers = {d["metadata"]["name"]: (t, d) for d in workloads if (t := _engine_tier(d)) is not None}
    if len(tiers) < 2:
        return rows, sum(r[1] for r in rows), sum(r[2] for r in rows)
    first = min(tiers.values(), key=lambda td: td[0])[1]["metadata"]["name"]
    engines = [r for r in rows if r[0] in tiers]
    asked = next(r[2] for r in engines if r[0] == first)
    served = sum(r[1] for r in engines)
    no_old_pods = all((tiers[r[0]][1].get("status") or {}).get("replicas", 0) <=
                      (tiers[r[0]][1].get("status") or {}).get("updatedReplicas", 0) for r in engines)
    fleet_settled = all(r[5] for r in engines) and served >= asked and no_old_pods
    # settled, a tier's progress deadline is the shortage its Pending pods wait out, not a failed rollout; and
    # the overflow's replicas not yet scaled in do not make 5 of 3 ready
    rows = [(name, ready, wanted, settled or fleet_settled, None if fleet_settled else late, seen)
            if name in tiers else (name, ready, wanted, settled, late, seen)
            for name, ready, wanted, settled, late, seen in rows]
    others = [r for r in rows if r[0] not in tiers]
    return rows, min(served, asked) + sum(r[1] for r in others), asked + sum(r[2] for r in others)


def endpoint_status(workloads: Sequence[dict], generation: int, previous: dict | None, now: str,
                    failure: Failure | None = None, warnings: Sequence[str] = ()) -> dict:
    previous = previous or {}
    rows, ready, wanted = _rows(workloads)
    late = [(name, msg) for name, _, _, _, msg, _ in rows if msg]
    if failure is None and late:
        failure = Failure("ProgressDeadlineExceeded", "; ".join(f"Deployment {n}: {m}" for n, m in late))
    if failure is not None:
        state, reason, message = FAILED, failure.reason, failure.message
    elif not rows:
        state, reason, message = PENDING, "NoDeployments", "no Deployment created yet"
    elif all(r[3] for r in rows):
        state, reason, message = COMPLETE, "AllReplicasReady", f"{ready}/{wanted} replicas ready"
    else:
        # a Deployment its controller has not read yet (a new tier's, at 0/0) is no rollout of old pods
        waiting = ", ".join(f"{n} {r}/{w}" + ("" if r < w else " (rolling out: old pods still running)" if seen
                                              else " (not yet seen by its controller)")
                            for n, r, w, settled, _, seen in rows if not settled)
        state, reason, message = IN_PROGRESS, "ReplicasNotReady", f"waiting for {waiting}"
    old = {c.get("type"): c for c in previous.get("conditions") or ()}
    conditions = []
    for s in STATES:
        flag = "True" if s == state else "False"
        before = old.get(CONDITION[s])
        since = before["lastTransitionTime"] if before and before.get("status") == flag and \
            before.get("lastTransitionTime") else now
        cond = {"type": CONDITION[s], "status": flag, "lastTransitionTime": since}
        if flag == "True":
            cond.update(reason=reason, message=message)
        conditions.append(cond)
    # a merge patch keeps keys it does not name: a workload no longer there (renamed tiers) is removed by name
    gone = dict.fromkeys(set(previous.get("deployments") or {}) - {r[0] for r in rows})
    out = {"state": state, "observedGeneration": generation, "replicas": wanted, "readyReplicas": ready,
           "deployments": {**gone, **{n: f"{r}/{w}" for n, r, w, _, _, _ in rows}} or None, "conditions": conditions}
    out["failureReason"] = message if state == FAILED else None  # None: a merge patch removes an old one
    out["warnings"] = list(warnings) or None
    return out
