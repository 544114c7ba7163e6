"""Offline validation of rendered objects: built-in kinds with kubernetes-validate (strict, pinned version),
custom resources against their CRD's openAPIV3Schema with unknown fields rejected (the API server would
prune them) and the CRD's plain CEL rules (x-kubernetes-validations) when cel-python is installed."""

from __future__ import annotations

from functools import cache
from pathlib import Path

import jsonschema
import yaml

KUBERNETES_VERSION = "1.33"
CRDS = Path(__file__).parent.parent / "data" / "crds"


@cache
def _crd_schemas() -> dict[tuple[str, str], dict]:
    out = {}
    for path in sorted(CRDS.glob("*.yaml")):
        crd = yaml.safe_load(path.read_text())
        group, kind = crd["spec"]["group"], crd["spec"]["names"]["kind"]
        for version in crd["spec"]["versions"]:
            out[(f"{group}/{version['name']}", kind)] = version["schema"]["openAPIV3Schema"]
    return out


def strict(schema):
    if isinstance(schema, dict):
        schema = {k: strict(v) for k, v in schema.items()}
        if "properties" in schema and "additionalProperties" not in schema and \
                not schema.get("x-kubernetes-preserve-unknown-fields"):
            schema["additionalProperties"] = False
    elif isinstance(schema, list):
        schema = [strict(s) for s in schema]
    return schema


def _cel_errors(schema: dict, obj, where: str) -> list[str]:
    try:
        import celpy
        from celpy import json_to_cel
    except ImportError:
        return []
    errors = []
    for rule in schema.get("x-kubernetes-validations", []):
        env = celpy.Environment()
        try:
            ok = env.program(env.compile(rule["rule"])).evaluate({"self": json_to_cel(obj)})
        except Exception:  # a rule using Kubernetes-only CEL libraries: not checkable here
            continue
        if not ok:
            errors.append(f"{where or '<root>'}: {rule.get('message', rule['rule'])}")
    if isinstance(obj, dict):
        for key, sub in (schema.get("properties") or {}).items():
            if key in obj:
                errors += _cel_errors(sub, obj[key], f"{where}.{key}".lstrip("."))
    return errors


def validate_custom(obj: dict) -> list[str]:
    key = (obj["apiVersion"], obj["kind"])
    schema = _crd_schemas().get(key)
    if schema is None:
        raise LookupError(f"no CRD for {key} under {CRDS}")
    checked = strict(schema)
    checked["properties"]["metadata"] = {"type": "object"}
    validator = jsonschema.Draft7Validator(checked)
    errors = [f"{'.'.join(map(str, e.path)) or '<root>'}: {e.message}" for e in validator.iter_errors(obj)]
    return errors + _cel_errors(schema, obj, "")


def validate(obj: dict) -> list[str]:
    """Problems with one object ([] when valid)."""
    if (obj["apiVersion"], obj["kind"]) in _crd_schemas():
        return validate_custom(obj)
    import kubernetes_validate

    try:
        kubernetes_validate.validate(obj, KUBERNETES_VERSION, strict=True)
    except kubernetes_validate.ValidationError as exc:
        return [f"{'.'.join(map(str, exc.path)) or '<root>'}: {exc.message}"]
    return []
