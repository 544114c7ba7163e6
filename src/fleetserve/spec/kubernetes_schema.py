"""Kubernetes fields a spec passes through to its pods as given, checked against the API's own schema.

`pod.initContainers`, `pod.volumes`, `pod.securityContext`, `pod.volumeMounts`, `model.volume` and the sources of
`engine.envFrom` go into the rendered Deployments unchanged. `validate` passed `{nam: x}` as an init container,
`runAsUser: root`, a volume with an unknown field and a mount of a volume that does not exist; `render k8s` then
wrote Deployments the API server or the kubelet refused. The schemas are Kubernetes' own (core/v1 types, strict:
unknown fields are errors), vendored in `data/kubernetes-core-v1.json` by `scripts/vendor_kubernetes_schema.py`.
"""

from __future__ import annotations

import functools
import json
from importlib import resources
from typing import Any

TYPES = ("Container", "Volume", "VolumeMount", "PodSecurityContext", "EnvVarSource")


@functools.cache
def _validator(kind: str):
    from jsonschema import Draft202012Validator

    data = json.loads(resources.files("fleetserve.spec").joinpath("data/kubernetes-core-v1.json").read_text())
    schema = {"$defs": data["$defs"], "$ref": f"#/$defs/io.k8s.api.core.v1.{kind}"}
    return Draft202012Validator(schema)


def schema_problem(kind: str, value: Any) -> str | None:
    """Why `value` is not a Kubernetes `kind` (one of TYPES), naming the field within it; None when it is."""
    errors = sorted(_validator(kind).iter_errors(value), key=lambda e: (len(e.absolute_path), list(e.absolute_path)))
    if not errors:
        return _one_source(value) if kind == "Volume" else None
    first = errors[0]
    where = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in first.absolute_path)
    message = first.message if len(first.message) <= 200 else first.message[:200] + "..."
    return f"{where.lstrip('.') + ': ' if where else ''}{message} (a Kubernetes {kind})"


def _one_source(volume: dict) -> str | None:
    """A Volume has exactly one source, which a JSON schema of its fields cannot say (the API server refuses two:
    "may not specify more than 1 volume type", after `validate` and `render` had passed it)."""
    sources = sorted(k for k in volume if k != "name")
    if len(sources) == 1:
        return None
    said = f"{len(sources)} ({', '.join(sources)})" if sources else "none"
    return f"a volume has exactly one source (emptyDir, persistentVolumeClaim, hostPath, ...), got {said} " \
           "(a Kubernetes Volume)"
