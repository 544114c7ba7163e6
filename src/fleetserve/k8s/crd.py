"""The `Endpoint` CustomResourceDefinition (fleetserve.io/v1), its schema generated from the pydantic spec.

`endpoint_crd()` turns `EndpointSpec.model_json_schema()` into a *structural* OpenAPI v3 schema, the kind
the API server requires of apiextensions.k8s.io/v1 CRDs:
- `$ref`s are inlined (structural schemas have no references);
- `X | None` (`anyOf: [X, {type: null}]`) becomes X with `nullable: true`;
- JSON-schema 2020's numeric `exclusiveMinimum: n` becomes OpenAPI 3.0's `minimum: n, exclusiveMinimum: true`;
- `Literal` values become `enum`; titles are dropped; defaults move into the description (the operator
  applies them through pydantic, so stored objects keep what the user wrote and a new default reaches old
  objects);
- `additionalProperties: false` is dropped: a structural schema prunes unknown fields, and kubectl's strict
  field validation (on by default) rejects them; `additionalProperties: true` on a property-less object
  (placement.nodeAffinity, a Kubernetes NodeAffinity) becomes `x-kubernetes-preserve-unknown-fields: true`,
  the only place it is needed; typed maps (`dict[str, str]`) keep `additionalProperties: {type: ...}`.
`structural_problems(schema)` checks the result against the API server's rules, and the tests validate the
whole CRD with kubernetes-validate (strict) as a built-in apiextensions.k8s.io/v1 object.

Cross-field rules (maxReplicaCount >= minReplicaCount, a prometheus trigger needs a query, ...) stay in
pydantic: the validating webhook (webhook.py) answers them with the same messages as `fleetserve validate`.
"""

from __future__ import annotations

import copy
from typing import Any

from fleetserve.k8s.reconcile import GROUP, OWNER_KIND, OWNER_PLURAL, VERSION
from fleetserve.k8s.status import STATES
from fleetserve.spec.endpoint import EndpointSpec

CRD_NAME = f"{OWNER_PLURAL}.{GROUP}"
_DROP = {"title", "default", "$defs"}


class SchemaError(ValueError):
    """The pydantic schema holds a construct with no structural equivalent."""


def _resolve(node: Any, defs: dict) -> Any:
    if isinstance(node, list):
        return [_resolve(n, defs) for n in node]
    if not isinstance(node, dict):
        return node
    if "$ref" in node:
        target = copy.deepcopy(defs[node["$ref"].rsplit("/", 1)[-1]])
        rest = {k: v for k, v in node.items() if k != "$ref"}
        return _resolve({**target, **rest}, defs)
    return {k: _resolve(v, defs) for k, v in node.items()}


def _describe(node: dict, default: Any) -> None:
    if default is None or default == [] or default == {}:
        return
    shown = str(default).lower() if isinstance(default, bool) else default
    text = node.get("description", "").rstrip(".")
    node["description"] = f"{text} (default {shown})" if text else f"default {shown}"


def structural(node: Any, path: str = "spec") -> Any:
    """One pydantic (JSON schema 2020) node as a structural OpenAPI v3 node."""
    if not isinstance(node, dict):
        return node
    node = dict(node)
    default = node.get("default")
    if "anyOf" in node:
        options = [o for o in node.pop("anyOf") if o != {"type": "null"}]
        if len(options) != 1:
            raise SchemaError(f"{path}: a union of {len(options)} types has no structural form")
        merged = {**options[0], **{k: v for k, v in node.items() if k not in options[0]}}
        out = structural(merged, path)
        out["nullable"] = True
        if "enum" in out and None not in out["enum"]:
            out["enum"] = [*out["enum"], None]  # a null must pass the enum check too
        return out
    if "const" in node:
        node["enum"] = [node.pop("const")]
        node.setdefault("type", "string")
    out: dict = {}
    for k, v in node.items():
        if k in _DROP:
            continue
        if k == "properties":
            out[k] = {name: structural(sub, f"{path}.{name}") for name, sub in v.items()}
        elif k == "items":
            out[k] = structural(v, f"{path}[]")
        elif k == "additionalProperties":
            if isinstance(v, dict):
                out[k] = structural(v, f"{path}{{}}")
            elif v is True and "properties" not in node:
                out["x-kubernetes-preserve-unknown-fields"] = True
        elif k in ("exclusiveMinimum", "exclusiveMaximum") and not isinstance(v, bool):
            out["minimum" if k == "exclusiveMinimum" else "maximum"] = v
            out[k] = True
        else:
            out[k] = v
    if "type" not in out and not out.get("x-kubernetes-preserve-unknown-fields") and \
            not out.get("x-kubernetes-int-or-string"):
        raise SchemaError(f"{path}: no type")
    _describe(out, default)
    return out


def spec_schema() -> dict:
    raw = EndpointSpec.model_json_schema(by_alias=True, mode="validation")
    resolved = _resolve(raw, raw.get("$defs", {}))
    out = structural(resolved)
    out["description"] = "An LLM inference endpoint: fleetserve's spec (fleetserve validate SPEC checks one)."
    return out


def status_schema() -> dict:
    condition = {"type": "object", "required": ["type", "status"], "properties": {
        "type": {"type": "string"}, "status": {"type": "string", "enum": ["True", "False", "Unknown"]},
        "reason": {"type": "string"}, "message": {"type": "string"},
        "lastTransitionTime": {"type": "string", "format": "date-time"}}}
    return {"type": "object", "properties": {
        "state": {"type": "string", "enum": list(STATES)},
        "failureReason": {"type": "string", "nullable": True},
        "warnings": {"type": "array", "items": {"type": "string"}, "nullable": True,
                     "description": "what `fleetserve render k8s` warns about this spec"},
        "observedGeneration": {"type": "integer", "format": "int64"},
        "replicas": {"type": "integer"},
        "readyReplicas": {"type": "integer"},
        "deployments": {"type": "object", "additionalProperties": {"type": "string"},
                        "description": "ready/wanted replicas per Deployment"},
        "conditions": {"type": "array", "items": condition, "x-kubernetes-list-type": "map",
                       "x-kubernetes-list-map-keys": ["type"]},
    }}


def endpoint_crd() -> dict:
    schema = {"type": "object", "required": ["spec"], "properties": {
        "apiVersion": {"type": "string"}, "kind": {"type": "string"}, "metadata": {"type": "object"},
        "spec": spec_schema(), "status": status_schema()}}
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": CRD_NAME, "labels": {"app.kubernetes.io/name": "fleetserve",
                                                  "app.kubernetes.io/part-of": "fleetserve"}},
        "spec": {
            "group": GROUP,
            "scope": "Namespaced",
            "names": {"plural": OWNER_PLURAL, "singular": "endpoint", "kind": OWNER_KIND, "listKind": "EndpointList",
                      "shortNames": ["fse"], "categories": ["fleetserve"]},
            "versions": [{
                "name": VERSION, "served": True, "storage": True,
                "schema": {"openAPIV3Schema": schema},
                "subresources": {"status": {}},
                "additionalPrinterColumns": [
                    {"name": "State", "type": "string", "jsonPath": ".status.state"},
                    {"name": "Ready", "type": "integer", "jsonPath": ".status.readyReplicas"},
                    {"name": "Wanted", "type": "integer", "jsonPath": ".status.replicas"},
                    {"name": "Model", "type": "string", "jsonPath": ".spec.model.source", "priority": 1},
                    {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
                ],
            }],
        },
    }


_FORBIDDEN = ("$ref", "$defs", "definitions", "anyOf", "oneOf", "allOf", "not", "const", "title", "dependencies",
              "patternProperties", "additionalItems", "uniqueItems", "id", "$schema")


def structural_problems(schema: Any, path: str = "") -> list[str]:
    """Where `schema` breaks the API server's structural-schema rules ([] when none).

    Checked: every node has a type unless it preserves unknown fields or is int-or-string; no references or
    JSON-schema-only keywords; `properties` and `additionalProperties` not together; `items` on every
    array; `metadata` only typed as an object; numeric exclusive bounds as booleans (OpenAPI 3.0).
    """
    problems: list[str] = []
    if not isinstance(schema, dict):
        return [f"{path or '<root>'}: not a schema object"]
    where = path or "<root>"
    for k in _FORBIDDEN:
        if k in schema:
            problems.append(f"{where}: {k} is not allowed in a structural schema")
    if "type" not in schema and not schema.get("x-kubernetes-preserve-unknown-fields") and \
            not schema.get("x-kubernetes-int-or-string"):
        problems.append(f"{where}: no type")
    if "properties" in schema and "additionalProperties" in schema:
        problems.append(f"{where}: properties and additionalProperties together")
    if schema.get("type") == "array" and "items" not in schema:
        problems.append(f"{where}: array without items")
    for k in ("exclusiveMinimum", "exclusiveMaximum"):
        if k in schema and not isinstance(schema[k], bool):
            problems.append(f"{where}: {k} must be a boolean in OpenAPI 3.0")
    for name, sub in (schema.get("properties") or {}).items():
        problems += structural_problems(sub, f"{path}.{name}" if path else name)
    if isinstance(schema.get("items"), dict):
        problems += structural_problems(schema["items"], f"{path}[]")
    if isinstance(schema.get("additionalProperties"), dict):
        problems += structural_problems(schema["additionalProperties"], f"{path}{{}}")
    if path == "metadata" and set(schema) - {"type", "properties"}:
        problems.append("metadata: only type and name/generateName restrictions are allowed")
    return problems
