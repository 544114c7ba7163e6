"""The restricted Pod Security level for the pods that run fleetserve's own image (the operator, the routers).

The image runs as uid 10001 (container/Containerfile); nothing of it writes outside /tmp, which is an emptyDir,
so the root filesystem is read-only. Engine pods run an engine's image (vLLM, SGLang: their own users and
writes), so they get only what `spec.pod.securityContext` gives them.
"""

from __future__ import annotations

IMAGE_UID = 10001


def restricted_pod() -> dict:
    return {"runAsNonRoot": True, "runAsUser": IMAGE_UID, "runAsGroup": IMAGE_UID,
            "seccompProfile": {"type": "RuntimeDefault"}}


def restricted_container() -> dict:
    return {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True, "runAsNonRoot": True,
            "capabilities": {"drop": ["ALL"]}}


TMP_VOLUME = {"name": "tmp", "emptyDir": {}}
TMP_MOUNT = {"name": "tmp", "mountPath": "/tmp"}
