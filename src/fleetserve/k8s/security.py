"""The restricted Pod Security level for the containers that run fleetserve's own image, and for the L2 Redis.

The image runs as uid 10001 (container/Containerfile). The operator and the routers write nothing outside /tmp,
an emptyDir, so their root filesystem is read-only. The built-in engine and the fetch-model init container run
the same image with the restricted container settings (`restricted_engine`), but keep a writable root
filesystem: torch and the Hugging Face libraries write caches under the home folder. Engine containers that run
an engine's own image (vLLM, SGLang, `container`, or `engine.image`: their own users and writes) get only what
`spec.pod.securityContext` gives them. The Redis container replaces its image's entrypoint (the step that drops
from root to the `redis` user), so it is run as that user (uid 999 in the official images) with nothing else:
it keeps no file (`--save ''`, no append-only file), so its root filesystem is read-only too.
"""

from __future__ import annotations

IMAGE_UID = 10001


def restricted_pod() -> dict:
    return {"runAsNonRoot": True, "runAsUser": IMAGE_UID, "runAsGroup": IMAGE_UID,
            "seccompProfile": {"type": "RuntimeDefault"}}


def restricted_container() -> dict:
    return {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True, "runAsNonRoot": True,
            "capabilities": {"drop": ["ALL"]}}


def restricted_engine() -> dict:
    """fleetserve's image in an engine pod, whose pod-level context is the user's (`spec.pod.securityContext`):
    what Pod Security's restricted level asks of a container, set on the container."""
    return {"allowPrivilegeEscalation": False, "runAsNonRoot": True, "capabilities": {"drop": ["ALL"]},
            "seccompProfile": {"type": "RuntimeDefault"}}


REDIS_UID = 999  # the `redis` user of the official images (its group differs: 999 on Debian, 1000 on Alpine)


def restricted_redis() -> tuple[dict, dict]:
    """(pod, container) security contexts of the L2 Redis: its user, the image's own group (no runAsGroup)."""
    pod = {"runAsNonRoot": True, "runAsUser": REDIS_UID, "seccompProfile": {"type": "RuntimeDefault"}}
    return pod, restricted_container()


TMP_VOLUME = {"name": "tmp", "emptyDir": {}}
TMP_MOUNT = {"name": "tmp", "mountPath": "/tmp"}
