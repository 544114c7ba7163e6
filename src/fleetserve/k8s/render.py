"""`render(endpoint, options) -> Rendered`: the whole desired state of an endpoint, as plain objects.

One pure function, shared by `fleetserve render k8s` and the operator's reconcile: no clock, no I/O, no
randomness, so two renders are byte-identical. Object families live in their own modules (engine, router,
keda, karpenter, redis, monitoring); this one orders the objects, names their files and writes them.
Settings that render differently from the local fleet, or not at all, come back as warnings that name the
field; they never vanish silently.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from fleetserve.k8s.context import Context, RenderOptions
from fleetserve.k8s.engine import engine_objects, no_zone_left, required_extras, zone_problem
from fleetserve.k8s.karpenter import karpenter_objects
from fleetserve.k8s.keda import keda_objects
from fleetserve.k8s.labels import RESERVED_PREFIX, TIER_LABEL, labels
from fleetserve.k8s.monitoring import monitoring_objects
from fleetserve.k8s.redis import redis_objects, rendered_tenant_service
from fleetserve.k8s.router import router_objects
from fleetserve.kvcache.tiers import split_credentials
from fleetserve.spec.effects import takes_effect_on_kubernetes
from fleetserve.spec.endpoint import Endpoint
from fleetserve.spec.errors import SpecProblem
from fleetserve.spec.hyperpod import source_of
from fleetserve.spec.load import LoadedSpec

#: apply order: what others reference first (kubectl apply -f DIR applies files in name order)
KIND_ORDER = ("Secret", "ConfigMap", "Service", "StatefulSet", "Deployment", "PodDisruptionBudget", "NodePool",
              "TriggerAuthentication", "ScaledObject", "ServiceMonitor", "PrometheusRule")


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


class _NoAliases(yaml.SafeDumper):
    """Each object written out whole: a dict shared by two places (the probes, a PrometheusRule's labels) was
    written once as &id001 and then *id001, which kubectl takes but diffs, greps and reviewers do not."""

    def ignore_aliases(self, data) -> bool:
        return True


# plain scalars Kubernetes' YAML parser (go-yaml) reads as numbers, booleans or null where PyYAML's YAML 1.1 rules
# read strings: `7e1`, `1e-5`, `0o17`, `+1e3` were written unquoted, and kubectl refused the whole file ("cannot
# unmarshal number into ... of type string")
_NOT_A_STRING_TO_GO_YAML = re.compile(r"""^(?:
    [-+]?(?:\.[0-9_]+|[0-9][0-9_]*(?:\.[0-9_]*)?)(?:[eE][-+]?[0-9]+)?
  | [-+]?0[xX][0-9a-fA-F_]+ | [-+]?0[oO]?[0-7_]+ | [-+]?0[bB][01_]+
  | [-+]?\.(?:inf|Inf|INF) | \.(?:nan|NaN|NAN)
  | [-+]?[0-9][0-9_]*(?::[0-5]?[0-9])+(?:\.[0-9_]*)?
  | y|Y|yes|Yes|YES|n|N|no|No|NO|true|True|TRUE|false|False|FALSE|on|On|ON|off|Off|OFF
  | ~|null|Null|NULL
)$""", re.X)


def _string(dumper: yaml.SafeDumper, data: str) -> yaml.ScalarNode:
    style = "'" if _NOT_A_STRING_TO_GO_YAML.match(data) else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", data, style=style)


_NoAliases.add_representer(str, _string)


def to_yaml(obj: dict) -> str:
    return yaml.dump(obj, Dumper=_NoAliases, sort_keys=False, default_flow_style=False, width=120,
                     allow_unicode=True)


def _machine_local_redis(endpoint: Endpoint) -> list[tuple[str, str]]:
    """L2 URLs that reach the local machine only: `fleetserve up` runs beside them, a pod does not."""
    from fleetserve.kvcache.redis_urls import redis_server
    from fleetserve.kvcache.tiers import split_credentials

    l2 = endpoint.spec.kv_cache.l2
    if not l2.enabled:
        return []
    urls = [("spec.kvCache.l2.url", l2.url)] + [(f"spec.kvCache.l2.tenantUrls.{t}", u)
                                                 for t, u in sorted(l2.tenant_urls.items())]
    local = []
    for path, url in urls:
        kind, host, *_ = redis_server(url) if url else ("", "")
        if kind == "unix" or host == "loopback":
            local.append((path, split_credentials(url)[0]))
    return local


def _plain_credentials(endpoint: Endpoint) -> list[tuple[str, str]]:
    """Spec fields that carry a password or token in their value: URLs with user information, KEDA headers
    that authorize. (A password the renderer takes from a Secret is written as $(VAR), never as itself.)"""
    spec = endpoint.spec
    urls = [("spec.kvCache.l2.url", spec.kv_cache.l2.url)]
    urls += [(f"spec.kvCache.l2.tenantUrls.{t}", u) for t, u in spec.kv_cache.l2.tenant_urls.items()
             if spec.engine.kind != "builtin" or not rendered_tenant_service(u)]  # its password is replaced (redis.py)
    urls += [(f"spec.engine.urls[{i}]", u) for i, u in enumerate(spec.engine.urls)]
    triggers = spec.autoscaling.triggers if spec.autoscaling is not None else []
    urls += [(f"spec.autoscaling.triggers[{i}].serverAddress", t.server_address) for i, t in enumerate(triggers)]
    found = [(path, "a password in the URL") for path, url in urls  # the last @ ends it (it may hold a /)
             if url and split_credentials(url)[2] and "$(" not in url]
    found += [(f"spec.autoscaling.triggers[{i}].customHeaders", "an authorization header")
              for i, t in enumerate(triggers) if t.custom_headers and "authorization" in t.custom_headers.lower()]
    found += [(f"spec.engine.env.{name}", "a credential (by its name)")  # HF_TOKEN: hf_... went in silently
              for name, value in sorted(spec.engine.env.items())
              if CREDENTIAL_NAME.search(name) and value and "$(" not in value]
    found += [(f"spec.engine.args[{i}]", f"a credential ({flag})") for i, flag in _credential_flags(spec.engine.args)]
    return found


def _credential_flags(args: list[str]) -> list[tuple[int, str]]:
    """(index, flag) of the engine arguments that give a credential as a value: `--api-key sk-...`,
    `--hf-token=hf_...` (went into the container's arguments without a word)."""
    found = []
    for i, arg in enumerate(args):
        flag, eq, value = arg.partition("=")
        words = tuple(flag.lower().lstrip("-").replace("_", "-").split("-"))
        if not flag.startswith("--") or not (words[-1] in CREDENTIAL_WORDS or words[-2:] in CREDENTIAL_PAIRS):
            continue  # --tokenizer, --max-num-batched-tokens, --password-file: no credential in the value
        value = value if eq else (args[i + 1] if i + 1 < len(args) else "")
        if value and not value.startswith(("-", "/", "./", "~")) and "$(" not in value:  # a path names a file
            found.append((i, flag))
    return found


CREDENTIAL_NAME = re.compile(r"TOKEN|SECRET|PASSWORD|PASSWD|API_?KEY|ACCESS_KEY|CREDENTIAL", re.I)
# a flag whose value is a credential ends in one of these words (`--hf-token`, `--api-key`)
CREDENTIAL_WORDS = frozenset({"token", "secret", "password", "passwd", "apikey", "credential", "credentials"})
CREDENTIAL_PAIRS = frozenset({("api", "key"), ("api", "keys"), ("access", "key"), ("secret", "key"),
                              ("private", "key")})


#: warnings about settings that only the local fleet ignores: they render here (and the local fleet's count of
#: router processes for split limits: the rendering counts pods x workers itself; the simulated cloud's prices)
LOCAL_ONLY = frozenset({"spec.engine.image", "spec.engine.gpus", "spec.engine.kind", "spec.placement",
                        "spec.placement.instanceTypes", "spec.metrics.enabled", "spec.model.prefetch",
                        "spec.requestLimits.maxConcurrentRequests"})
LOCAL_ONLY_UNDER = ("spec.capacity.simulated",)  # the simulated cloud is not Kubernetes


def kubernetes_warnings(loaded: LoadedSpec) -> list[SpecProblem]:
    """The spec's warnings that hold on Kubernetes: not the local fleet's notes about settings rendered here
    (the admission answer printed "no effect" for spec.placement, which becomes the NodePools)."""
    def local_only(w: SpecProblem) -> bool:
        path = w.fleetserve_path
        return path in LOCAL_ONLY or path.startswith(LOCAL_ONLY_UNDER) or takes_effect_on_kubernetes(path)

    return [w for w in loaded.warnings if w.everywhere or not local_only(w)]


def rendered_warnings(loaded: LoadedSpec, rendered: Rendered) -> list[str]:
    """What a user of the rendered objects should read: the spec's warnings that hold on Kubernetes, then the
    rendering's own (`render k8s` prints them, the admission webhook answers them, the operator writes them
    into the Endpoint's status)."""
    own = rendered.warnings
    if loaded.source_format == "hyperpod":  # named by the user's own fields (our path in the message)
        own = [source_of(w, loaded.document) or w for w in own]
    return list(dict.fromkeys([str(w) for w in kubernetes_warnings(loaded)] + [str(w) for w in own]))


def render(endpoint: Endpoint, options: RenderOptions | None = None) -> Rendered:
    ctx = Context.build(endpoint, options or RenderOptions())
    notes: list[SpecProblem] = []

    def warn(path: str, message: str) -> None:
        note = SpecProblem(path, message)
        if note not in notes:  # one per finding, however many objects (a budget's NodePool per tier) meet it
            notes.append(note)

    for why in ctx.left_out:
        warn("spec.placement.nodeAffinity", why)
    problem = zone_problem(ctx)
    if problem:
        raise ValueError(problem)
    for i, extra in enumerate(required_extras(ctx)):
        if no_zone_left(extra):
            warn(f"spec.placement.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms[{i}]",
                 f"none of its zones is among --zone ({', '.join(ctx.options.zones)}): the term is left out of the "
                 "pods' affinity")
    objects: list[dict] = []
    for family in (engine_objects, router_objects, redis_objects, keda_objects, karpenter_objects,
                   monitoring_objects):
        objects += family(ctx, warn)
    ours = labels(ctx.name, "engine", **{TIER_LABEL: "0"})
    for key in sorted(endpoint.metadata.labels):
        if key in ours or key.startswith(RESERVED_PREFIX):
            warn(f"metadata.labels.{key}", "is a label fleetserve sets on its objects (selectors, tiers, "
                                           "ownership): its own value replaces yours, or none where it sets none")
    for path, url in _machine_local_redis(endpoint):
        warn(path, f"{url!r} names this machine (a unix socket or a loopback address): in a pod it is the pod "
                   "itself, where no Redis runs, so the engines never reach it; give the Redis's Service or host "
                   "(or leave l2.url empty for the Redis render k8s makes)")
    for path, value in _plain_credentials(endpoint):
        warn(path, f"{value} goes into the rendered manifests as plain text (container arguments, environment or "
                   "ScaledObject metadata, readable by anyone who can read the objects): keep it in a Secret and "
                   "reference it (engine.envFrom, a KEDA TriggerAuthentication)")
    names = [file_name(o) for o in objects]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise ValueError(f"two rendered objects share a file name: {', '.join(duplicates)}")
    objects.sort(key=_sort_key)
    return Rendered(tuple(objects), tuple(notes))


def _owner(obj: dict) -> tuple | None:
    meta = obj.get("metadata") or {}
    labels = meta.get("labels") or {}
    if labels.get("app.kubernetes.io/managed-by") != "fleetserve":
        return None
    return labels.get("app.kubernetes.io/instance"), meta.get("namespace")


def write(rendered: Rendered, directory: str | Path, removed: list[dict] | None = None) -> list[Path]:
    """Write one file per object. Files an earlier render of the same endpoint wrote that are no longer wanted
    are removed, and their objects appended to `removed` (`kubectl apply` of the folder leaves them running:
    a tier dropped from instanceTypes kept its pods behind the Service, and its GPU NodePool);
    anything else in the folder (a user's own manifests, another endpoint's) is left alone."""
    out = Path(directory)
    if out.exists() and not out.is_dir():
        raise NotADirectoryError(f"{out} is a file; give a folder for the manifests")
    out.mkdir(parents=True, exist_ok=True)
    files = rendered.files()
    ours = {_owner(o) for o in rendered.objects} - {None}
    for name, text in files.items():  # a file of the same name that is not this endpoint's is never replaced
        there = out / name
        if not there.is_file() or there.read_text(errors="replace") == text:
            continue
        try:
            owner = _owner(yaml.safe_load(there.read_text()) or {})
        except (yaml.YAMLError, UnicodeDecodeError, AttributeError):
            owner = None
        if owner not in ours:
            whose = (f"endpoint {owner[0]} in namespace {owner[1]}" if owner[1] else f"a cluster-wide object of "
                     f"endpoint {owner[0]}") if owner else "a file that is not this endpoint's"
            raise FileExistsError(f"{there} holds {whose}: render this one into another folder (file names carry "
                                  "the object's name, not its namespace)")
    for stale in sorted(out.glob("[0-9][0-9]-*.yaml")):
        if stale.name in files:
            continue
        try:
            obj = yaml.safe_load(stale.read_text()) or {}
            owner = _owner(obj)
        except (yaml.YAMLError, UnicodeDecodeError, AttributeError):
            continue
        if owner in ours:
            stale.unlink()
            if removed is not None:
                removed.append(obj)
    paths = []
    for name, text in files.items():
        path = out / name
        path.write_text(text)
        paths.append(path)
    return paths


def delete_commands(objects: list[dict]) -> list[str]:
    """`kubectl delete` lines for objects a render no longer makes (the reverse of the apply order)."""
    lines = []
    for obj in sorted(objects, key=_sort_key, reverse=True):
        meta = obj.get("metadata") or {}
        group = (obj.get("apiVersion") or "").rpartition("/")[0]
        kind = obj.get("kind", "").lower() + (f".{group}" if group else "")
        where = f"-n {meta['namespace']} " if meta.get("namespace") else ""
        lines.append(f"kubectl {where}delete {kind} {meta.get('name')}")
    return lines
