"""Write src/fleetserve/spec/data/kubernetes-core-v1.json: the JSON schemas of the Kubernetes core/v1 types that a
spec passes through to its pods as given (containers, volumes, mounts, security contexts, env sources), with every
type they refer to, from kubernetes-validate's strict schemas (generated from Kubernetes' OpenAPI, Apache-2.0).
Descriptions are dropped (a quarter of the size). Run with the test extras installed:

    .venv/bin/python scripts/vendor_kubernetes_schema.py [VERSION]
"""

from __future__ import annotations

import json
import re
import sys
from importlib import resources
from pathlib import Path

ROOTS = ("Container", "Volume", "VolumeMount", "PodSecurityContext", "EnvVarSource")
OUT = Path(__file__).parents[1] / "src" / "fleetserve" / "spec" / "data" / "kubernetes-core-v1.json"


def _plain(node):
    if isinstance(node, dict):
        return {k: _plain(v) for k, v in node.items() if k != "description"}
    if isinstance(node, list):
        return [_plain(v) for v in node]
    if isinstance(node, str):
        return re.sub(r"^/api/_definitions\.json#", "#", node)
    return node


def main(version: str = "1.33") -> None:
    folder = resources.files("kubernetes_validate") / "kubernetes-json-schema" / f"v{version}.0-local-strict"
    defs = json.loads((folder / "_definitions.json").read_text())["$defs"]
    wanted, stack = {}, [f"io.k8s.api.core.v1.{r}" for r in ROOTS]
    while stack:
        name = stack.pop()
        if name in wanted:
            continue
        wanted[name] = _plain(defs[name])
        stack += re.findall(r"#/\$defs/([A-Za-z0-9_.-]+)", json.dumps(defs[name]))
    out = {"kubernetes": version, "source": "kubernetes-validate strict schemas (Kubernetes OpenAPI, Apache-2.0)",
           "$defs": dict(sorted(wanted.items()))}
    OUT.write_text(json.dumps(out, separators=(",", ":"), sort_keys=True) + "\n")
    print(f"{len(wanted)} types, {OUT.stat().st_size} bytes -> {OUT}")


if __name__ == "__main__":
    main(*sys.argv[1:])
