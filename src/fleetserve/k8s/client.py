"""The operator's one port to the Kubernetes API, a recording fake beside it, and the real one.

    get(api_version, kind, namespace, name) -> dict | None       None when it does not exist
    list(api_version, kind, namespace, selector) -> list[dict]   [] when the kind is not installed
    create(obj) -> dict                                          raises Conflict (exists), ApiError
    patch(api_version, kind, namespace, name, patch) -> dict     JSON merge patch; raises NotFound, ApiError
    delete(api_version, kind, namespace, name) -> None           raises NotFound
    patch_status(api_version, kind, namespace, name, status) -> dict   the status subresource

Errors are part of the contract: NotFound and Conflict are answers the operator acts on (a vanished child
is created again, an existing object it does not own fails the Endpoint with the reason); Forbidden means
the RBAC from `render k8s --install` is missing a rule; any other ApiError is retried later. `namespace` is
None for cluster-scoped kinds (and for `list`, all namespaces).

`RecordingClient` keeps objects in memory the way the API server would for what the operator touches:
uids, resourceVersion, metadata.generation bumped on spec changes, merge patches, a status subresource, what
it rewrites (`server_normalized`: stringData into data, false omitempty bools dropped, canonical quantities),
and the garbage collector: deleting an owner deletes (cascading) every object whose ownerReferences name its
uid. Every call is recorded in `calls`; `fail(verb, kind, error)` injects one failure; `set_ready` plays
the Deployment controller. No Kubernetes API server runs where fleetserve is developed: this fake is what
the operator's tests run against.
"""

from __future__ import annotations

import copy
import itertools
from dataclasses import dataclass, field
from typing import Protocol


class ApiError(Exception):
    """The API server refused or failed; retry later unless a subclass says otherwise."""

    def __init__(self, message: str, code: int = 500, reason: str = "InternalError"):
        super().__init__(message)
        self.code = code
        self.reason = reason


class NotFound(ApiError):
    def __init__(self, message: str):
        super().__init__(message, 404, "NotFound")


class Conflict(ApiError):
    def __init__(self, message: str):
        super().__init__(message, 409, "AlreadyExists")


class Forbidden(ApiError):
    def __init__(self, message: str):
        super().__init__(message, 403, "Forbidden")


class Client(Protocol):
    def get(self, api_version: str, kind: str, namespace: str | None, name: str) -> dict | None: ...

    def list(self, api_version: str, kind: str, namespace: str | None, selector: str = "") -> list[dict]: ...

    def create(self, obj: dict) -> dict: ...

    def patch(self, api_version: str, kind: str, namespace: str | None, name: str, patch: dict) -> dict: ...

    def delete(self, api_version: str, kind: str, namespace: str | None, name: str) -> None: ...

    def patch_status(self, api_version: str, kind: str, namespace: str | None, name: str, status: dict) -> dict: ...


#: the RBAC verbs each client call needs (install.py grants exactly these); watch: kopf's event streams
READ_VERBS = ("get", "list", "watch")


def apply_merge_patch(target: object, patch: object) -> object:
    """RFC 7386: dicts merge recursively, null deletes, anything else (lists too) replaces."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    out = dict(target) if isinstance(target, dict) else {}
    for k, v in patch.items():
        if v is None:
            out.pop(k, None)
        else:
            out[k] = apply_merge_patch(out.get(k), v)
    return out


def matches(labels: dict[str, str], selector: str) -> bool:
    """Equality-based label selector `a=b,c=d` (and bare `a` for "present")."""
    for term in filter(None, (t.strip() for t in selector.split(","))):
        k, eq, v = term.partition("=")
        if (k not in labels) if not eq else (labels.get(k) != v):
            return False
    return True


_DECIMAL_SUFFIXES = ("", "k", "M", "G", "T", "P", "E")


def canonical_quantity(value: object) -> object:
    """A resource quantity as the API server writes it back (decimal ones: `4000000000` -> `4G`, `0.5` ->
    `500m`); binary-suffixed ones and what is not a quantity stay as they were."""
    from fleetserve.capacity.placement import quantity

    if isinstance(value, bool) or not isinstance(value, str | int | float) or str(value).endswith("i"):
        return value
    try:
        amount = quantity(value)
    except ValueError:
        return value
    if amount != int(amount):
        milli = amount * 1000
        return f"{int(milli)}m" if milli == int(milli) else value
    n, k = int(amount), 0
    while n and n % 1000 == 0 and k < len(_DECIMAL_SUFFIXES) - 1:
        n, k = n // 1000, k + 1
    return f"{n}{_DECIMAL_SUFFIXES[k]}"


def server_normalized(obj: object, key: str | None = None, quantities: bool = False) -> object:
    """What the API server stores and returns for what was written: Secret `stringData` folded into `data`,
    bools it omits when false left out, resource quantities in canonical form (the operator must see none of
    these as drift). Custom resources (the Endpoint) are stored as written."""
    import base64

    from fleetserve.k8s.reconcile import OMITTED_WHEN_FALSE, OWNER_KIND, QUANTITY_MAPS

    if key is None and isinstance(obj, dict) and obj.get("kind") == OWNER_KIND:
        return obj
    if isinstance(obj, dict):
        out = {k: server_normalized(v, k, key in QUANTITY_MAPS) for k, v in obj.items()
               if not (v is False and k in OMITTED_WHEN_FALSE)}
        if obj.get("kind") == "Secret" and "stringData" in out:
            data = dict(out.get("data") or {})
            data.update({k: base64.b64encode(str(v).encode()).decode() for k, v in out.pop("stringData").items()})
            out["data"] = data
        return out
    if isinstance(obj, list):
        return [server_normalized(v) for v in obj]
    return canonical_quantity(obj) if quantities else obj


@dataclass(frozen=True)
class Call:
    verb: str
    kind: str
    namespace: str | None
    name: str
    body: dict | None = None


@dataclass
class RecordingClient:
    """In-memory API server for the kinds the operator touches; records every call."""

    objects: dict[tuple, dict] = field(default_factory=dict)
    calls: list[Call] = field(default_factory=list)
    cluster_scoped: frozenset[str] = frozenset({"NodePool", "CustomResourceDefinition", "ClusterRole", "Node"})

    def __post_init__(self) -> None:
        self._uids = itertools.count(1)
        self._versions = itertools.count(1)
        self._failures: list[tuple[str, str, ApiError]] = []

    # --- test controls -------------------------------------------------------------------------------------
    def fail(self, verb: str, kind: str, error: ApiError) -> None:
        """The next `verb` on `kind` raises `error`."""
        self._failures.append((verb, kind, error))

    def writes(self) -> list[Call]:
        return [c for c in self.calls if c.verb not in ("get", "list")]

    def clear(self) -> None:
        self.calls.clear()

    def set_ready(self, namespace: str, name: str, ready: int | None = None, kind: str = "Deployment") -> dict:
        """Play the Deployment (or StatefulSet) controller: `ready` pods ready (default: all of spec.replicas)."""
        obj = self.objects[self._key("apps/v1", kind, namespace, name)]
        want = obj["spec"].get("replicas", 1)
        n = want if ready is None else ready
        obj["status"] = {"observedGeneration": obj["metadata"]["generation"], "replicas": want,
                         "updatedReplicas": n, "readyReplicas": n, "availableReplicas": n}
        if kind == "StatefulSet":
            obj["status"].update(currentRevision="r1", updateRevision="r1" if n >= want else "r2")
        obj["metadata"]["resourceVersion"] = str(next(self._versions))
        return copy.deepcopy(obj)

    # --- the port ------------------------------------------------------------------------------------------
    def _key(self, api_version: str, kind: str, namespace: str | None, name: str) -> tuple:
        return api_version, kind, None if kind in self.cluster_scoped else namespace, name

    def _check(self, verb: str, kind: str) -> None:
        for i, (v, k, error) in enumerate(self._failures):
            if v == verb and k == kind:
                del self._failures[i]
                raise error

    def get(self, api_version, kind, namespace, name):
        self.calls.append(Call("get", kind, namespace, name))
        self._check("get", kind)
        obj = self.objects.get(self._key(api_version, kind, namespace, name))
        return copy.deepcopy(obj) if obj is not None else None

    def list(self, api_version, kind, namespace, selector=""):
        self.calls.append(Call("list", kind, namespace, selector))
        self._check("list", kind)
        return [copy.deepcopy(o) for (av, k, ns, _), o in sorted(self.objects.items(), key=lambda kv: str(kv[0]))
                if av == api_version and k == kind and (namespace is None or ns == namespace)
                and matches(o["metadata"].get("labels") or {}, selector)]

    def create(self, obj):
        meta = obj["metadata"]
        self.calls.append(Call("create", obj["kind"], meta.get("namespace"), meta["name"], copy.deepcopy(obj)))
        self._check("create", obj["kind"])
        k = self._key(obj["apiVersion"], obj["kind"], meta.get("namespace"), meta["name"])
        if k in self.objects:
            raise Conflict(f"{obj['kind']} {meta['name']} already exists")
        stored = server_normalized(copy.deepcopy(obj))
        stored["metadata"].update(uid=f"uid-{next(self._uids)}", resourceVersion=str(next(self._versions)),
                                  generation=1)
        self.objects[k] = stored
        return copy.deepcopy(stored)

    def patch(self, api_version, kind, namespace, name, patch):
        self.calls.append(Call("patch", kind, namespace, name, copy.deepcopy(patch)))
        self._check("patch", kind)
        k = self._key(api_version, kind, namespace, name)
        if k not in self.objects:
            raise NotFound(f"{kind} {name} not found")
        old = self.objects[k]
        new = server_normalized(apply_merge_patch(old, {key: v for key, v in patch.items() if key != "status"}))
        new["metadata"]["resourceVersion"] = str(next(self._versions))
        if new.get("spec") != old.get("spec"):
            new["metadata"]["generation"] = old["metadata"].get("generation", 1) + 1
        self.objects[k] = new
        return copy.deepcopy(new)

    def patch_status(self, api_version, kind, namespace, name, status):
        self.calls.append(Call("patch_status", kind, namespace, name, copy.deepcopy(status)))
        self._check("patch_status", kind)
        k = self._key(api_version, kind, namespace, name)
        if k not in self.objects:
            raise NotFound(f"{kind} {name} not found")
        obj = self.objects[k]
        obj["status"] = apply_merge_patch(obj.get("status") or {}, status)
        obj["metadata"]["resourceVersion"] = str(next(self._versions))
        return copy.deepcopy(obj)

    def delete(self, api_version, kind, namespace, name):
        self.calls.append(Call("delete", kind, namespace, name))
        self._check("delete", kind)
        k = self._key(api_version, kind, namespace, name)
        obj = self.objects.pop(k, None)
        if obj is None:
            raise NotFound(f"{kind} {name} not found")
        self._collect(obj["metadata"]["uid"])

    def _collect(self, uid: str) -> None:
        """The garbage collector: dependents whose ownerReferences name a deleted uid go too, cascading."""
        for k, o in list(self.objects.items()):
            if k in self.objects and any(r.get("uid") == uid for r in o["metadata"].get("ownerReferences") or ()):
                del self.objects[k]
                self._collect(o["metadata"]["uid"])


REQUEST_TIMEOUT_S = 30  # connect and read, per API call


class KubeClient:
    """The port over the official `kubernetes` client's DynamicClient (in-cluster config, else kubeconfig).

    Merge patches go as application/merge-patch+json; a kind whose API is not served (KEDA or the
    Prometheus operator not installed) lists as [] and fails on create with an ApiError naming it.
    """

    def __init__(self, dynamic=None):
        from urllib3.exceptions import HTTPError  # the kubernetes client's transport

        self._transport = HTTPError
        if dynamic is None:
            from kubernetes import config
            from kubernetes.client import ApiClient
            from kubernetes.dynamic import DynamicClient

            try:
                config.load_incluster_config()
            except config.ConfigException:
                config.load_kube_config()
            dynamic = DynamicClient(ApiClient())
        self._dynamic = dynamic

    def _resource(self, api_version: str, kind: str):
        from kubernetes.dynamic.exceptions import ResourceNotFoundError

        try:
            return self._dynamic.resources.get(api_version=api_version, kind=kind)
        except self._transport as exc:  # discovery reads the API server too
            raise ApiError(f"the API server did not answer: {exc}", 504, "Timeout") from None
        except ResourceNotFoundError:
            raise NotFound(f"the API server does not serve {api_version}/{kind} (is its operator installed?)") \
                from None

    @staticmethod
    def _translate(exc: Exception) -> ApiError:
        status = getattr(exc, "status", None)
        message = f"{getattr(exc, 'reason', '')}: {getattr(exc, 'body', '') or exc}".strip(": ")
        if status == 404:
            return NotFound(message)
        if status == 409:
            return Conflict(message)
        if status == 403:
            return Forbidden(message)
        return ApiError(message, status or 500, getattr(exc, "reason", None) or "InternalError")

    def _call(self, fn, *args, **kwargs):
        from kubernetes.dynamic.exceptions import DynamicApiError
        kwargs.setdefault("_request_timeout", REQUEST_TIMEOUT_S)  # a hung connection held a kopf worker for ever
        try:
            result = fn(*args, **kwargs)
        except DynamicApiError as exc:
            raise self._translate(exc) from None
        except self._transport as exc:  # a timeout, a refused or reset connection: retried like a 5xx
            raise ApiError(f"the API server did not answer: {exc}", 504, "Timeout") from None
        return result.to_dict() if hasattr(result, "to_dict") else result

    def get(self, api_version, kind, namespace, name):
        try:
            return self._call(self._resource(api_version, kind).get, name=name, namespace=namespace)
        except NotFound:
            return None

    def list(self, api_version, kind, namespace, selector=""):
        try:
            resource = self._resource(api_version, kind)
        except NotFound:
            return []
        result = self._call(resource.get, namespace=namespace, label_selector=selector or None)
        return list(result.get("items") or [])

    def create(self, obj):
        resource = self._resource(obj["apiVersion"], obj["kind"])
        return self._call(resource.create, body=obj, namespace=obj["metadata"].get("namespace"))

    def patch(self, api_version, kind, namespace, name, patch):
        return self._call(self._resource(api_version, kind).patch, body=patch, name=name, namespace=namespace,
                          content_type="application/merge-patch+json")

    def patch_status(self, api_version, kind, namespace, name, status):
        resource = self._resource(api_version, kind).status
        return self._call(resource.patch, body={"status": status}, name=name, namespace=namespace,
                          content_type="application/merge-patch+json")

    def delete(self, api_version, kind, namespace, name):
        self._call(self._resource(api_version, kind).delete, name=name, namespace=namespace,
                   propagation_policy="Background")
