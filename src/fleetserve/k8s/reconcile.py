"""`reconcile(desired, observed, owner) -> [Action]`: what to create, patch and delete, as values.

One pure function, fed the objects `render` produces (the desired state) and the children the API server
holds (the observed state); the operator applies the actions through its client (client.py). No I/O, no
clock: a second pass over what the first one produced returns no actions.

Ownership. Every child carries the labels `fleetserve.io/endpoint` and `fleetserve.io/endpoint-namespace`
(so the operator can list them) and, when namespaced, an ownerReference to the Endpoint with
`controller: true, blockOwnerDeletion: true`, so the garbage collector deletes it with the Endpoint.
Cluster-scoped children (Karpenter NodePools) cannot have a namespaced owner (the garbage collector treats
such a reference as unresolvable), so the operator deletes them itself, behind the Endpoint's finalizer.

Minimal patches (a three-way merge, like `kubectl apply`). Each child keeps the object last applied in the
annotation `fleetserve.io/last-applied`. A JSON merge patch (RFC 7386) then holds:
- every field we want that the observed object does not already hold (fields the API server adds, such as
  defaults and status, are not ours and never compared);
- a list, whole, when we changed it or the observed list does not hold ours element by element (merge
  patches replace lists);
- `null` for a field we applied last time and want no longer.
Fields that cannot change in place (a Deployment's selector, a StatefulSet's volumeClaimTemplates) turn a
patch into delete + create. A Deployment that a ScaledObject scales keeps its `spec.replicas`: KEDA owns it
after creation, and patching it back would fight the autoscaler. A renamed engine Deployment is handed over make before
break (`handover.py`).
"""

from __future__ import annotations

import copy
import json
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Literal

GROUP = "fleetserve.io"
VERSION = "v1"
OWNER_API_VERSION = f"{GROUP}/{VERSION}"
OWNER_KIND = "Endpoint"
OWNER_PLURAL = "endpoints"
ENDPOINT_LABEL = "fleetserve.io/endpoint"
ENDPOINT_NAMESPACE_LABEL = "fleetserve.io/endpoint-namespace"
LAST_APPLIED = "fleetserve.io/last-applied"


@dataclass(frozen=True)
class ChildKind:
    api_version: str
    kind: str
    plural: str
    namespaced: bool = True

    @property
    def group(self) -> str:
        return self.api_version.rpartition("/")[0]


#: every kind `render` produces (render.KIND_ORDER), in apply order; the operator lists these, RBAC grants these
CHILD_KINDS: tuple[ChildKind, ...] = (
    ChildKind("v1", "Secret", "secrets"),
    ChildKind("v1", "ConfigMap", "configmaps"),
    ChildKind("v1", "Service", "services"),
    ChildKind("apps/v1", "StatefulSet", "statefulsets"),
    ChildKind("apps/v1", "Deployment", "deployments"),
    ChildKind("policy/v1", "PodDisruptionBudget", "poddisruptionbudgets"),
    ChildKind("karpenter.sh/v1", "NodePool", "nodepools", namespaced=False),
    ChildKind("keda.sh/v1alpha1", "TriggerAuthentication", "triggerauthentications"),
    ChildKind("keda.sh/v1alpha1", "ScaledObject", "scaledobjects"),
    ChildKind("monitoring.coreos.com/v1", "ServiceMonitor", "servicemonitors"),
    ChildKind("monitoring.coreos.com/v1", "PrometheusRule", "prometheusrules"),
)
_BY_KIND = {(c.api_version, c.kind): c for c in CHILD_KINDS}

#: paths the API server refuses to change in place: a change there means delete + create
IMMUTABLE: dict[str, tuple[tuple[str, ...], ...]] = {
    "Deployment": (("spec", "selector"),),
    "StatefulSet": (("spec", "selector"), ("spec", "serviceName"), ("spec", "volumeClaimTemplates"),
                    ("spec", "podManagementPolicy")),
    "PodDisruptionBudget": (),
    "Service": (("spec", "clusterIP"),),
    "Secret": (("type",),),
}

Verb = Literal["create", "patch", "delete"]
#: the verbs an action may carry; install.py derives the operator's RBAC from them
ACTION_VERBS: tuple[Verb, ...] = ("create", "patch", "delete")


def child_kind(api_version: str, kind: str) -> ChildKind:
    try:
        return _BY_KIND[(api_version, kind)]
    except KeyError:
        raise ValueError(f"{api_version}/{kind} is not a kind the operator manages; known: "
                         f"{', '.join(f'{c.api_version}/{c.kind}' for c in CHILD_KINDS)}") from None


@dataclass(frozen=True)
class Owner:
    """The Endpoint resource whose children these are."""

    name: str
    namespace: str
    uid: str

    def reference(self) -> dict:
        return {"apiVersion": OWNER_API_VERSION, "kind": OWNER_KIND, "name": self.name, "uid": self.uid,
                "controller": True, "blockOwnerDeletion": True}

    @property
    def labels(self) -> dict[str, str]:
        return {ENDPOINT_LABEL: self.name, ENDPOINT_NAMESPACE_LABEL: self.namespace}

    @property
    def selector(self) -> str:
        return ",".join(f"{k}={v}" for k, v in self.labels.items())

    def owns(self, obj: dict) -> bool:
        meta = obj.get("metadata", {})
        if any(ref.get("uid") == self.uid for ref in meta.get("ownerReferences") or ()):
            return True
        # cluster-scoped children carry no ownerReference: the labels are the claim
        return not child_kind(obj["apiVersion"], obj["kind"]).namespaced and \
            all((meta.get("labels") or {}).get(k) == v for k, v in self.labels.items())


@dataclass(frozen=True)
class Action:
    verb: Verb
    api_version: str
    kind: str
    namespace: str | None
    name: str
    body: dict | None = field(default=None, compare=True)  # create: the object; patch: a merge patch
    reason: str = ""

    def __str__(self) -> str:
        where = f"{self.namespace}/{self.name}" if self.namespace else self.name
        return f"{self.verb} {self.kind} {where}" + (f" ({self.reason})" if self.reason else "")


Key = tuple[str, str, str | None, str]


def key(obj: dict) -> Key:
    meta = obj["metadata"]
    namespaced = child_kind(obj["apiVersion"], obj["kind"]).namespaced
    return obj["apiVersion"], obj["kind"], meta.get("namespace") if namespaced else None, meta["name"]


def _canonical(obj: dict) -> str:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"))


def own(obj: dict, owner: Owner) -> dict:
    """The object as the operator applies it: ownership labels, ownerReference, last-applied annotation."""
    out = copy.deepcopy(obj)
    meta = out.setdefault("metadata", {})
    meta["labels"] = {**(meta.get("labels") or {}), **owner.labels}
    if child_kind(out["apiVersion"], out["kind"]).namespaced:
        meta["ownerReferences"] = [owner.reference()]
    annotations = dict(meta.get("annotations") or {})
    annotations.pop(LAST_APPLIED, None)
    if annotations:
        meta["annotations"] = annotations
    else:
        meta.pop("annotations", None)
    applied = _canonical(out)
    meta["annotations"] = {**annotations, LAST_APPLIED: applied}
    return out


def last_applied(obj: dict) -> dict | None:
    text = ((obj.get("metadata") or {}).get("annotations") or {}).get(LAST_APPLIED)
    if not text:
        return None
    try:
        value = json.loads(text)
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


_MISSING = object()


#: maps whose values are resource quantities, which the API server writes back in its canonical form
#: (`4000000000` as `4G`, `0.5` as `500m`): equal amounts are no drift
QUANTITY_MAPS = frozenset({"limits", "requests"})


def _same_quantity(have: object, want: object) -> bool:
    from fleetserve.capacity.placement import quantity

    if not isinstance(have, str | int | float) or not isinstance(want, str | int | float) or \
            isinstance(have, bool) or isinstance(want, bool):
        return False
    try:
        a, b = quantity(have), quantity(want)
    except ValueError:
        return False
    return math.isclose(a, b, rel_tol=1e-12, abs_tol=0.0)


#: bools the API server leaves out when false (non-pointer, omitempty): their absence holds `false`. Pointer
#: bools (allowPrivilegeEscalation, readOnlyRootFilesystem) come back as written, and a missing one is drift
OMITTED_WHEN_FALSE = frozenset({"publishNotReadyAddresses", "hostNetwork", "hostPID", "hostIPC", "readOnly",
                                "stdin", "tty"})


def _held(have: dict, k: str, want: object, quantities: bool) -> bool:
    """`have[k]` holds `want`."""
    if k not in have:  # the API server omits empty lists and maps (omitempty): `args: []` comes back without args,
        # and a container engine without args was patched at every pass
        return (want is False and k in OMITTED_WHEN_FALSE) or (isinstance(want, (list, dict)) and not want)
    return covers(have[k], want, k in QUANTITY_MAPS) or (quantities and _same_quantity(have[k], want))


def covers(have: object, want: object, quantities: bool = False) -> bool:
    """`have` holds `want`: every wanted key (recursively), lists element by element, scalars equal (quantities
    in `QUANTITY_MAPS` by amount)."""
    if isinstance(want, dict):
        return isinstance(have, dict) and all(_held(have, k, v, quantities) for k, v in want.items())
    if isinstance(want, list):
        return isinstance(have, list) and len(have) == len(want) and all(map(covers, have, want))
    if isinstance(want, bool) or isinstance(have, bool):
        return type(want) is type(have) and want == have
    return have == want


def merge_patch(last: dict | None, desired: dict, observed: dict, quantities: bool = False) -> dict:
    """The smallest JSON merge patch that takes `observed` to `desired` (three-way, with `last` applied)."""
    last = last or {}
    patch: dict = {}
    for k, want in desired.items():
        have = observed.get(k, _MISSING)
        prev = last.get(k, _MISSING)
        if isinstance(want, dict) and isinstance(have, dict):
            sub = merge_patch(prev if isinstance(prev, dict) else None, want, have, k in QUANTITY_MAPS)
            if sub:
                patch[k] = sub
        elif not _held(observed, k, want, quantities) or \
                (isinstance(want, list) and prev is not _MISSING and prev != want):
            patch[k] = copy.deepcopy(want)
    for k in last:
        if k not in desired and k in observed:
            patch[k] = None
    return patch


def _has_path(patch: dict, path: tuple[str, ...]) -> bool:
    node: object = patch
    for part in path:
        if not isinstance(node, dict) or part not in node:
            return False
        node = node[part]
    return True


def _drop(obj: dict | None, path: tuple[str, ...]) -> dict | None:
    if obj is None:
        return None
    out = copy.deepcopy(obj)
    node = out
    for part in path[:-1]:
        node = node.get(part)
        if not isinstance(node, dict):
            return out
    node.pop(path[-1], None)
    return out


def scaled_targets(desired: Iterable[dict]) -> set[tuple[str | None, str]]:
    """(namespace, Deployment name) of every Deployment a desired ScaledObject scales."""
    out = set()
    for obj in desired:
        if obj["kind"] == "ScaledObject":
            ref = obj["spec"]["scaleTargetRef"]
            if ref.get("kind", "Deployment") == "Deployment":
                out.add((obj["metadata"].get("namespace"), ref["name"]))
    return out


def reconcile(desired: Sequence[dict], observed: Sequence[dict], owner: Owner) -> list[Action]:
    """Actions that take the observed children to the desired objects (ScaledObjects no longer rendered deleted
    first, creates and patches in the order of `desired`, which is render's apply order, then deletes in
    reverse)."""
    scaled = scaled_targets(desired)
    mine = {key(o): o for o in observed if owner.owns(o)}
    creates: list[Action] = []
    patches: list[Action] = []
    deletes: list[Action] = []
    wanted: set[Key] = set()
    for raw in desired:
        want = own(raw, owner)
        k = key(want)
        wanted.add(k)
        api_version, kind, namespace, name = k
        have = mine.get(k)
        if have is None:
            creates.append(Action("create", api_version, kind, namespace, name, want, "missing"))
            continue
        compare, previous = want, last_applied(have)
        if kind == "Deployment" and (namespace, name) in scaled:
            # KEDA owns spec.replicas once the ScaledObject exists; compare everything else
            compare, previous = _drop(want, ("spec", "replicas")), _drop(previous, ("spec", "replicas"))
        patch = merge_patch(previous, compare, have)
        if not patch:
            continue
        frozen = [".".join(p) for p in IMMUTABLE.get(kind, ()) if _has_path(patch, p)]
        if frozen:
            reason = f"immutable field {', '.join(frozen)} changed"
            deletes_first = Action("delete", api_version, kind, namespace, name, None, reason)
            patches += [deletes_first, Action("create", api_version, kind, namespace, name, want, reason)]
            continue
        changed = sorted(_leaves(patch))
        patches.append(Action("patch", api_version, kind, namespace, name, patch, ", ".join(changed)))
    from fleetserve.k8s.handover import handover  # it builds Actions of this module

    held, handing = handover(desired, mine, wanted, scaled, creates, patches)
    patches += handing
    for k in reversed(list(mine)):
        if k not in wanted and k not in held:
            api_version, kind, namespace, name = k
            deletes.append(Action("delete", api_version, kind, namespace, name, None, "no longer rendered"))
    # a ScaledObject goes first: while it exists its HPA scales the Deployment, and a replica count patched before
    # it (autoscaling removed from the spec) could be scaled back (nor does KEDA admit a second one on a target)
    unscaled = [a for a in deletes if a.kind == "ScaledObject"]
    return unscaled + creates + patches + [a for a in deletes if a.kind != "ScaledObject"]


def _leaves(patch: dict, prefix: str = "") -> list[str]:
    out = []
    for k, v in patch.items():
        path = f"{prefix}.{k}" if prefix else k
        if k == "metadata" and isinstance(v, dict) and set(v) == {"annotations"} and \
                set(v["annotations"] or {}) == {LAST_APPLIED}:
            continue  # bookkeeping, not a change worth naming
        if isinstance(v, dict) and v:
            out += _leaves(v, path)
        else:
            out.append(path)
    return out

