"""The validating admission answer: an Endpoint is admitted only if `fleetserve validate` would accept it.

    endpoint_from_resource(body) -> LoadedSpec            raises SpecError (the same messages as the CLI)
    admission_response(review) -> AdmissionReview          admission.k8s.io/v1, for any HTTP front
    validate_handler(body, operation, warnings, ...)      the kopf @on.validate handler (operator.py)

The CRD's schema (crd.py) catches types and ranges; everything pydantic checks beyond them (cross-field
rules, catalog names, schedules, ...) is answered here, naming the field: a denial says
`spec.autoscaling: maxReplicaCount (1) is below minReplicaCount (3)`. What `render k8s` would warn about
(settings that render differently or not at all, a label fleetserve overrides, a credential in plain text)
comes back as admission warnings, which kubectl prints; a spec that cannot be rendered is denied.
"""

from __future__ import annotations

from fleetserve.k8s.context import RenderOptions
from fleetserve.k8s.reconcile import GROUP, OWNER_API_VERSION, OWNER_KIND
from fleetserve.k8s.render import render, rendered_warnings
from fleetserve.spec.errors import SpecError, SpecProblem
from fleetserve.spec.exported import KUBECTL_ANNOTATIONS
from fleetserve.spec.load import LoadedSpec, load_spec_data


def _bookkeeping(key: str) -> bool:
    """The tools' own records, not the user's settings: kopf's (under our group's prefix) and kubectl's copy of
    the whole object."""
    return key in KUBECTL_ANNOTATIONS or key.startswith(f"{GROUP}/") or key.startswith(f"kopf.{GROUP}")


def endpoint_from_resource(body: dict) -> LoadedSpec:
    """The Endpoint custom resource as our spec: its name, namespace, labels and annotations (less the tools'
    bookkeeping), and its spec as written."""
    meta = body.get("metadata") or {}
    doc = {"apiVersion": OWNER_API_VERSION, "kind": OWNER_KIND,
           "metadata": {"name": meta.get("name") or meta.get("generateName") or "",
                        "namespace": meta.get("namespace") or "default"},
           "spec": body.get("spec")}
    if meta.get("labels"):
        doc["metadata"]["labels"] = dict(meta["labels"])
    annotations = {k: v for k, v in (meta.get("annotations") or {}).items() if not _bookkeeping(k)}
    if annotations:  # they go onto the engine pods, as `render k8s` puts them (an istio sidecar switch, ...)
        doc["metadata"]["annotations"] = annotations
    source = f"{doc['metadata']['namespace']}/{doc['metadata']['name']}"
    return load_spec_data(doc, source)


def check(body: dict, options: RenderOptions | None = None) -> tuple[list[SpecProblem], list[str]]:
    """(problems, warnings) of one Endpoint resource; no problems means admitted. The warnings are what
    `render k8s` would print (with the operator's rendering options, when it answers)."""
    try:
        loaded = endpoint_from_resource(body)
        rendered = render(loaded.endpoint, options)
    except SpecError as exc:
        return list(exc.problems), []
    except ValueError as exc:  # the operator could not render it either (RenderFailed)
        return [SpecProblem("spec", str(exc))], []
    return [], rendered_warnings(loaded, rendered)


def denial_message(problems: list[SpecProblem]) -> str:
    return "invalid Endpoint spec: " + "; ".join(str(p) for p in problems)


def judged(obj: dict, old: dict | None) -> bool:
    """Whether an admission request is the spec's to pass: not an update that leaves the spec and labels as they
    were (kopf's finalizer and annotation patches), nor one of an object being deleted. Refusing those kept an
    Endpoint made invalid by a stricter version (or created before the webhook) Terminating for ever."""
    if (obj.get("metadata") or {}).get("deletionTimestamp"):
        return False
    if not old:
        return True
    labels = lambda o: (o.get("metadata") or {}).get("labels")  # noqa: E731
    return obj.get("spec") != old.get("spec") or labels(obj) != labels(old)


def admission_response(review: dict) -> dict:
    """An AdmissionReview (admission.k8s.io/v1) answered: allowed, or denied with 422 and our messages."""
    request = review.get("request") or {}
    response: dict = {"uid": request.get("uid", ""), "allowed": True}
    if request.get("operation", "CREATE") in ("CREATE", "UPDATE") and judged(request.get("object") or {},
                                                                           request.get("oldObject")):
        problems, warnings = check(request.get("object") or {})
        if problems:
            response.update(allowed=False, status={"code": 422, "reason": "Invalid",
                                                   "message": denial_message(problems)})
        elif warnings:
            response["warnings"] = warnings
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "response": response}


def validate_handler(body, operation=None, warnings=None, old=None, options: RenderOptions | None = None, **_):
    """kopf's @on.validate: raise AdmissionError (422) with our messages; add warnings to kopf's list."""
    import kopf

    if operation not in (None, "CREATE", "UPDATE") or not judged(dict(body), dict(old) if old else None):
        return
    problems, notes = check(dict(body), options)
    if problems:
        raise kopf.AdmissionError(denial_message(problems), code=422)
    if warnings is not None:
        warnings.extend(notes)
