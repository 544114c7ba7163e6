"""A resource as `kubectl get -o yaml` prints it: the fields the API server and kubectl wrote are not the user's.

HyperPod's YAML is accepted as is, and the natural way to get it is from a cluster: `status`, `metadata.uid`,
`resourceVersion`, `creationTimestamp` and kubectl's last-applied annotation made such a file exit 2 ("unknown
field"), ours and HyperPod's alike. They are dropped with one note; everything the user writes is still checked.
"""

from __future__ import annotations

from typing import Any

SERVER_METADATA = ("uid", "resourceVersion", "generation", "creationTimestamp", "deletionTimestamp",
                   "deletionGracePeriodSeconds", "managedFields", "selfLink", "finalizers", "ownerReferences")
KUBECTL_ANNOTATIONS = ("kubectl.kubernetes.io/last-applied-configuration",)


def without_server_fields(data: Any) -> tuple[Any, list[str]]:
    """(the document without what the API server and kubectl wrote, the paths dropped)."""
    if not isinstance(data, dict):
        return data, []
    dropped = []
    out = dict(data)
    if "status" in out:
        del out["status"]
        dropped.append("status")
    meta = out.get("metadata")
    if isinstance(meta, dict):
        meta = dict(meta)
        for key in SERVER_METADATA:
            if key in meta:
                del meta[key]
                dropped.append(f"metadata.{key}")
        notes = meta.get("annotations")
        if isinstance(notes, dict) and any(k in notes for k in KUBECTL_ANNOTATIONS):
            meta["annotations"] = {k: v for k, v in notes.items() if k not in KUBECTL_ANNOTATIONS}
            dropped += [f"metadata.annotations.{k}" for k in KUBECTL_ANNOTATIONS if k in notes]
            if not meta["annotations"]:
                del meta["annotations"]
        out["metadata"] = meta
    return out, dropped
