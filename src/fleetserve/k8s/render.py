"""`render(endpoint, options) -> Rendered`: the whole desired state of an endpoint, as plain objects.

One pure function, shared by `fleetserve render k8s` and the operator's reconcile: no clock, no I/O, no
randomness, so two renders are byte-identical. Object families live in their own modules (engine, router,
keda, karpenter, redis, monitoring); this one orders the objects, names their files and writes them.
Settings that render differently from the local fleet, or not at all, come back as warnings that name the
field; they never vanish silently.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import yaml

from fleetserve.k8s.context import Context, RenderOptions
from fleetserve.k8s.engine import engine_objects
from fleetserve.k8s.karpenter import karpenter_objects
from fleetserve.k8s.keda import keda_objects
from fleetserve.k8s.monitoring import monitoring_objects
from fleetserve.k8s.redis import redis_objects
from fleetserve.k8s.router import router_objects
from fleetserve.spec.endpoint import Endpoint
from fleetserve.spec.errors import SpecProblem

#: apply order: what others reference first (kubectl apply -f DIR applies files in name order)
KIND_ORDER = ("Secret", "Service", "StatefulSet", "Deployment", "PodDisruptionBudget", "NodePool", "ScaledObject",
              "ServiceMonitor", "PodMonitor", "PrometheusRule")


@dataclass(frozen=True)
class Rendered:
    objects: tuple[dict, ...]
    warnings: tuple[SpecProblem, ...] = field(default_factory=tuple)

    def files(self) -> dict[str, str]:
        """File name -> YAML text, one object per file, names unique and in apply order."""
        out: dict[str, str] = {}
        for obj in self.objects:
            out[file_name(obj)] = to_yaml(obj)
        return out


def _sort_key(obj: dict) -> tuple:
    kind = obj["kind"]
    return (KIND_ORDER.index(kind) if kind in KIND_ORDER else len(KIND_ORDER), kind, obj["metadata"]["name"])


def file_name(obj: dict) -> str:
    kind = obj["kind"]
    rank = KIND_ORDER.index(kind) if kind in KIND_ORDER else len(KIND_ORDER)
    return f"{rank:02d}-{kind.lower()}-{obj['metadata']['name']}.yaml"


def to_yaml(obj: dict) -> str:
    return yaml.safe_dump(obj, sort_keys=False, default_flow_style=False, width=120, allow_unicode=True)


def render(endpoint: Endpoint, options: RenderOptions | None = None) -> Rendered:
    ctx = Context.build(endpoint, options or RenderOptions())
    notes: list[SpecProblem] = []

    def warn(path: str, message: str) -> None:
        notes.append(SpecProblem(path, message))

    objects: list[dict] = []
    for family in (engine_objects, router_objects, redis_objects, keda_objects, karpenter_objects,
                   monitoring_objects):
        objects += family(ctx, warn)
    names = [file_name(o) for o in objects]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise ValueError(f"two rendered objects share a file name: {', '.join(duplicates)}")
    objects.sort(key=_sort_key)
    return Rendered(tuple(objects), tuple(notes))


def write(rendered: Rendered, directory: str | Path) -> list[Path]:
    """Write one file per object; files from an earlier render that are no longer wanted are removed."""
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    files = rendered.files()
    for stale in sorted(out.glob("[0-9][0-9]-*.yaml")):
        if stale.name not in files:
            stale.unlink()
    paths = []
    for name, text in files.items():
        path = out / name
        path.write_text(text)
        paths.append(path)
    return paths
