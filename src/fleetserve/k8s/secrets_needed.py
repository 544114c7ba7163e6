"""The Secrets (with the keys they read) and the PersistentVolumeClaims rendered objects use but do not create:
`render k8s` names them.

The pods of a render mount or read Secrets the user creates (the internal token, a Redis password, API keys, TLS):
under a long endpoint name their names are hashed, and nothing printed them, so pods sat in ContainerCreating or
CreateContainerConfigError without a word; the claim holding a model on a shared file system (FSx, NFS) was named
only inside a long warning. Pure: rendered objects in, names out.
"""

from __future__ import annotations

from collections.abc import Iterable


def _pod_specs(obj: dict) -> list[dict]:
    spec = obj.get("spec") or {}
    template = (spec.get("template") or {}).get("spec")
    return [template] if isinstance(template, dict) else []


def secrets_needed(objects: Iterable[dict]) -> list[tuple[str, list[str]]]:
    """(Secret name, keys read, sorted; empty when a whole Secret is mounted) for every Secret the objects'
    pods read that the objects do not themselves create, sorted by name."""
    objects = list(objects)
    created = {o["metadata"]["name"] for o in objects if o.get("kind") == "Secret"}
    needed: dict[str, set[str]] = {}
    for obj in objects:
        for pod in _pod_specs(obj):
            for pull in pod.get("imagePullSecrets") or []:  # a registry's credentials (.dockerconfigjson)
                needed.setdefault(pull["name"], set()).add(".dockerconfigjson")
            for volume in pod.get("volumes") or []:
                secret = volume.get("secret")
                if secret:
                    keys = needed.setdefault(secret["secretName"], set())
                    keys.update(item["key"] for item in secret.get("items") or [])
            for container in [*(pod.get("containers") or []), *(pod.get("initContainers") or [])]:
                for env in container.get("env") or []:
                    ref = (env.get("valueFrom") or {}).get("secretKeyRef")
                    if ref and not ref.get("optional"):
                        needed.setdefault(ref["name"], set()).add(ref["key"])
                for source in container.get("envFrom") or []:
                    ref = source.get("secretRef")
                    if ref and not ref.get("optional"):
                        needed.setdefault(ref["name"], set())
    return sorted((name, sorted(keys)) for name, keys in needed.items() if name not in created)


def claims_needed(objects: Iterable[dict]) -> list[str]:
    """The PersistentVolumeClaims the objects' pods mount that the objects do not create, sorted (a StatefulSet's
    volumeClaimTemplates make their own)."""
    objects = list(objects)
    created = {o["metadata"]["name"] for o in objects if o.get("kind") == "PersistentVolumeClaim"}
    return sorted({claim for obj in objects for pod in _pod_specs(obj) for volume in pod.get("volumes") or []
                   if (claim := (volume.get("persistentVolumeClaim") or {}).get("claimName")) and claim not in created})


def describe(needed: list[tuple[str, list[str]]], namespace: str, claims: list[str] | None = None) -> str:
    """One `note:` line, for the terminal: the Secrets and claims to create before `kubectl apply`."""
    each = [f"{name}" + (f" (keys {', '.join(keys)})" if keys else "") for name, keys in needed]
    parts = [f"the Secret(s) {'; '.join(each)}"] if each else []
    if claims:
        parts.append(f"the PersistentVolumeClaim(s) {', '.join(claims)}")
    return f"note: create before applying, in namespace {namespace}, {'; and '.join(parts)}"
