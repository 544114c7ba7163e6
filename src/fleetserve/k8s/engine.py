"""Engine Deployments (one per placement tier) and the engine Service.

- Tiers come from `capacity.placement.tiers_from_spec`, the same tiers the local fleet and the simulator
  place on. Each tier's Deployment requires its instance types and capacity types (node affinity); tier 0
  carries the endpoint's replicas and autoscaling, later tiers start at 0 and take the overflow (keda.py).
- Engines: the built-in one (`fleetserve engine`), vLLM and SGLang; GPU engine command lines come from
  `engine.adapters` (LMCache environment for the L1/L2 tiers), never written here.
- The model: a local path is read from a PersistentVolumeClaim (an FSx or NFS volume, read-only); any other
  source (s3://, hf:, builtin:, catalog:) is fetched by an init container running `fleetserve model
  prepare` into an emptyDir, which the engine reads as /models/current.
- Probes: startup allows `engine.startupTimeoutSeconds` (the model load), readiness takes a pod out after 2
  failed probes like the router does, liveness restarts a hung engine. The rollout's progress deadline is
  that plus `PROGRESS_ALLOWANCE_S` for a new node, the image pull and the model fetch: at Kubernetes' default
  600 s a large model that starts slowly but well read ProgressDeadlineExceeded (the Endpoint Failed).
- Graceful termination drains: preStop waits until the endpoints and the router's health probes have
  moved traffic away, then SIGTERM lets in-flight requests finish within the grace period.
"""

from __future__ import annotations

import copy
import math
import re
from pathlib import PurePosixPath

from fleetserve.api.limits import engine_body_limit, engine_header_limit, stream_keepalive_s
from fleetserve.capacity.catalog import Catalog
from fleetserve.capacity.placement import (
    CAPACITY_TYPE_LABEL,
    INSTANCE_TYPE_LABEL,
    ZONE_LABEL,
    l1_memory_bytes,
    quantity,
)
from fleetserve.engine.adapters import ENGINE_TOKEN_ENV, VLLM_TOKEN_ENV, args_after, launch_for, replaced_env
from fleetserve.k8s.context import (
    DEFAULT_IMAGE,
    ENGINE_PORT,
    ENGINE_TOKEN_KEY,
    EXIT_SECONDS,
    GPU_ENGINES,
    INTERNAL_TOKEN_DIR,
    MODELS_DIR,
    Context,
)
from fleetserve.k8s.labels import DISCOVERY_LABEL, ENDPOINT_LABEL, TIER_LABEL, node_owner
from fleetserve.k8s.redis import engine_l2
from fleetserve.k8s.security import restricted_engine
from fleetserve.spec.endpoint import FETCH_MODEL, GPU_RESOURCE, SHARED_MEMORY, mig_slices

GPU = GPU_RESOURCE
PROGRESS_ALLOWANCE_S = 900  # a GPU node from Karpenter, a ~10 GB engine image, the model fetch
ROLLOUT_SURGE = 1  # pods a rolling update adds before it removes one; the NodePool's GPU limit leaves room for it


def engine_port(ctx: Context) -> int:
    return ctx.endpoint.spec.engine.port or ENGINE_PORT


def models_dir(ctx: Context) -> str:
    """Where the model volume is mounted: `model.mountPath` (HyperPod's modelVolumeMount) or /models."""
    return (ctx.endpoint.spec.model.mount_path or MODELS_DIR).rstrip("/") or MODELS_DIR


QUANTIZED = re.compile(r"awq|gptq|fp8|int4|int8|4bit|8bit|bnb|gguf|quantiz")  # weights not in bf16: size unknown
FETCH_DIR = "/fetch"  # the fetch-model init container's mount of the model volume, for an image run as given

#: top-level folders of the engine image (a Debian-based Python image): a model volume mounted there hides them
IMAGE_ROOTS = frozenset({"/", "/bin", "/boot", "/dev", "/etc", "/lib", "/lib64", "/opt", "/proc", "/root", "/run",
                         "/sbin", "/sys", "/tmp", "/usr", "/var"})


def _fetched_disk_gib(ctx: Context) -> int | None:
    """Node disk a fetched model takes, from the parameter count its name or source states (bf16 weights, a tenth
    more for the tokenizer, config and download's partial files); None when no size is stated."""
    from fleetserve.capacity.model_fit import BYTES_PER_PARAMETER, stated_size

    spec = ctx.endpoint.spec
    said = " ".join(str(t) for t in (spec.model.source, spec.model.name, *spec.engine.args)).lower()
    if QUANTIZED.search(said):  # fewer bytes a parameter than bf16: a bf16 estimate kept such pods Pending
        return None
    size = stated_size(spec.model, spec.engine)
    return math.ceil(size * 1e9 * BYTES_PER_PARAMETER * 1.1 / 2**30) if size else None


def _model_volume(ctx: Context) -> tuple[list[dict], list[dict], list[dict], str]:
    """(init containers, volumes, engine mounts, model path inside the engine container)."""
    model = ctx.endpoint.spec.model
    source = model.source
    fetched = source.startswith(("s3://", "hf:", "builtin:", "catalog:"))
    if model.volume is not None and not fetched:
        # a Kubernetes volume source holding the weights (HyperPod's kubernetesVolume), at model.mountPath
        root = models_dir(ctx)
        path = source if PurePosixPath(source).is_absolute() else f"{root}/{source}"
        return [], [{"name": "model", **model.volume}], [{"name": "model", "mountPath": root}], path
    if not fetched:
        path = PurePosixPath(source)
        volumes = [{"name": "model", "persistentVolumeClaim": {"claimName": ctx.model_claim, "readOnly": True}}]
        if ctx.endpoint.spec.engine.kind == "container" and model.mount_path:
            # an image run as given reads its model folder itself (DJL-LMI: /opt/ml/model): the weights' folder of
            # the volume is mounted there. It had been mounted at /fsx, and the image found an empty folder
            mount = models_dir(ctx)
            inside = PurePosixPath(*path.parts[2:]) if path.is_absolute() else path  # past the volume's own folder
            if path.is_relative_to("/opt/ml/model"):  # a folder boundary: /opt/ml/models/x is not under it
                inside = path.relative_to("/opt/ml/model")
            sub = {"subPath": str(inside)} if str(inside) not in ("", ".") else {}
            return [], volumes, [{"name": "model", "mountPath": mount, **sub, "readOnly": True}], mount
        if path.is_absolute():
            parts = path.parts
            # at a folder boundary: /opt/ml/models/x had been mounted at /opt/ml/model, outside its own path
            root = "/opt/ml/model" if path.is_relative_to("/opt/ml/model") else str(PurePosixPath(*parts[:2]))
            if root in IMAGE_ROOTS:
                # the volume is mounted at the path's first folder: /usr/local/models/m hid the image's /usr
                # (Python), /opt its fleetserve, and the pod never started
                raise ValueError(f"spec.model.source: {source!r} would mount the model volume at {root}, over the "
                                 "image's own folder; keep the weights under a folder of their own (/fsx/..., "
                                 "/mnt/models/..., /opt/ml/model/...) or give a relative path (under "
                                 f"{MODELS_DIR}/volume)")
            model_path = source
        else:
            root, model_path = f"{MODELS_DIR}/volume", f"{MODELS_DIR}/volume/{path}"
        return [], volumes, [{"name": "model", "mountPath": root, "readOnly": True}], model_path
    root = models_dir(ctx)
    if ctx.endpoint.spec.engine.kind == "container":
        # an image run as given reads its model folder itself (DJL-LMI: /opt/ml/model, where HyperPod mounts the
        # S3 prefix): the files go to the volume's `model` folder (hard links to the fetched ones, symlinks
        # followed) and the engine mounts that folder at model.mountPath. It had found `cache/` and `current`.
        # made again on every run: a pod's restart reruns it on the same emptyDir, and cp refused what was there
        fetch_root, link = FETCH_DIR, (f'rm -rf {FETCH_DIR}/model; mkdir -p {FETCH_DIR}/model; '
                                       f'cp -rlL "$d"/. {FETCH_DIR}/model/')
    else:
        fetch_root, link = root, f'ln -sfn "$d" {root}/current'
    args = ["sh", "-c", f'set -e; d="$(fleetserve model prepare --download "$@")"; {link}', "fetch", source]
    if model.revision:
        args += ["--revision", model.revision]
    if model.s3_region:
        args += ["--region", model.s3_region]
    init = {
        "name": FETCH_MODEL,
        "image": ctx.options.image,
        "command": args[:3],
        "args": args[3:],
        "env": [{"name": "FLEETSERVE_HOME", "value": f"{fetch_root}/cache"}],
        "volumeMounts": [{"name": "model", "mountPath": fetch_root}],
        "securityContext": restricted_engine(),  # fleetserve's image: the restricted level's container settings
    }
    disk = _fetched_disk_gib(ctx)
    if disk:  # the copy lands in an emptyDir on the node's disk: asked for, so a node without the room is not
        # picked (a 20 GiB root volume evicted the pod mid-download); the init container's request holds for the pod
        init["resources"] = {"requests": {"ephemeral-storage": f"{disk}Gi"}}
    if model.token_secret:  # HyperPod's tokenSecretRef: the fetcher only, as HyperPod does
        init["env"].append({"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {
            "name": model.token_secret.name, "key": model.token_secret.key}}})
    volumes = [{"name": "model", "emptyDir": {}}]
    if ctx.endpoint.spec.engine.kind == "container":
        return [init], volumes, [{"name": "model", "mountPath": root, "subPath": "model"}], root
    return [init], volumes, [{"name": "model", "mountPath": root}], f"{root}/current"


def _builtin_args(ctx: Context, model_path: str, instance_type: str) -> list[str]:
    spec, meta = ctx.endpoint.spec, ctx.endpoint.metadata
    limits = spec.request_limits
    args = ["engine", "--model", model_path, "--host", "0.0.0.0", "--port", str(engine_port(ctx)),
            "--served-model-name", ctx.endpoint.served_model_name, "--model-version", spec.model.version,
            "--namespace", meta.namespace, "--instance-type", instance_type, "--replica", "$(POD_NAME)",
            "--dtype", spec.model.dtype]
    if spec.engine.threads:
        args += ["--threads", str(spec.engine.threads)]
    if spec.model.context_length:
        args += ["--context-length", str(spec.model.context_length)]
    kv = spec.kv_cache
    args += ["--block-size", str(kv.block_size)]
    if kv.l1.enabled:
        args += ["--l1-bytes", str(kv.l1.max_bytes)]
    args += ["--internal-token-file", f"{INTERNAL_TOKEN_DIR}/token",
             "--max-body-bytes", str(engine_body_limit(limits.max_body_bytes)),
             "--max-header-bytes", str(engine_header_limit(limits.max_header_bytes)),
             "--drain-timeout", str(ctx.drain_seconds),  # after SIGTERM: in-flight requests finish
             "--stream-keepalive", f"{stream_keepalive_s(spec.router.stream_silence_seconds):g}"]
    return args + list(spec.engine.args)


SGLANG_HEALTH_SECONDS = 25  # SGLang's own health check timeout (20 s) and some margin


def _probes(ctx: Context) -> dict:
    """Ours, sized to the model's load time; `engine.probes` (HyperPod's worker.probes) replaces them by name."""
    engine = ctx.endpoint.spec.engine
    get = {"path": engine.health_path, "port": "http"}
    period = 10
    ours = {
        "startupProbe": {"httpGet": get, "periodSeconds": period, "timeoutSeconds": 5,
                         "failureThreshold": max(1, math.ceil(engine.startup_timeout_seconds / period))},
        "readinessProbe": {"httpGet": get, "periodSeconds": 5, "timeoutSeconds": 3, "failureThreshold": 2},
        "livenessProbe": {"httpGet": get, "periodSeconds": 10, "timeoutSeconds": 5, "failureThreshold": 3},
    }
    if engine.kind == "sglang":  # its /health generates a token, waiting up to SGLANG_HEALTH_CHECK_TIMEOUT (20 s)
        # behind the running batch: a 3 s probe took a busy replica out of the Service and a 5 s one restarted it
        ours["readinessProbe"].update(periodSeconds=10, timeoutSeconds=SGLANG_HEALTH_SECONDS)
        ours["livenessProbe"].update(periodSeconds=30, timeoutSeconds=SGLANG_HEALTH_SECONDS)
    return {**ours, **(engine.probes or {})}


L2_ENV = ("FLEETSERVE_L2_URL", "FLEETSERVE_L2_TENANTS")  # what `fleetserve engine` reads them from


def l2_env(url: str | None, tenants: dict[str, str]) -> dict[str, str]:
    """The built-in engine's L2 URLs, in its environment: as arguments, the Redis password the kubelet expands
    into them ($(REDIS_PASSWORD)) was on the process's command line, which `ps` on the node shows."""
    env = {L2_ENV[0]: url} if url else {}
    if tenants:
        env[L2_ENV[1]] = " ".join(f"{t}={u}" for t, u in tenants.items())
    return env


def reserved_env(ctx: Context) -> set[str]:
    """Environment variables the engine container gets from us: a user's value for one would be a duplicate."""
    kind = ctx.endpoint.spec.engine.kind
    names = {"POD_NAME"} | {e["name"] for e in engine_l2(ctx)[2]}
    if kind == "builtin":
        names |= {"FLEETSERVE_HOME", *L2_ENV}
    elif kind in GPU_ENGINES:
        names.add(VLLM_TOKEN_ENV if kind == "vllm" else ENGINE_TOKEN_ENV)
    return names


def _container(ctx: Context, tier: int, model_path: str, mounts: list[dict]) -> dict:
    spec = ctx.endpoint.spec
    kind = spec.engine.kind
    instance_type = instance_label(ctx.tiers[tier].instance_types)
    l2_url, tenant_urls, secret_env = engine_l2(ctx)
    env: list[dict] = [{"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}]
    env += secret_env  # before any value that expands $(REDIS_PASSWORD...)
    if kind == "builtin":
        image = spec.engine.image or ctx.options.image
        if spec.engine.gpus and not spec.engine.image and image == DEFAULT_IMAGE:
            # the default image carries the CPU torch wheel: a GPU was requested, paid for and never used
            image = f"{DEFAULT_IMAGE}-cuda"
        command, args = ["fleetserve"], _builtin_args(ctx, model_path, instance_type)
        extra_env = dict(spec.engine.env)
        metrics_path = "/metrics"
    elif kind == "container":  # the image as given: its own entrypoint (or engine.command), args and environment
        image, command, args = spec.engine.image, [], list(spec.engine.args)
        extra_env = dict(spec.engine.env)
        metrics_path = "/metrics"
    else:
        served = spec.model.model_copy(update={"name": ctx.endpoint.served_model_name})
        launch = launch_for(spec.model_copy(update={"model": served}), model_path, engine_port(ctx), l2_url=l2_url)
        image = spec.engine.image or (ctx.options.vllm_image if kind == "vllm" else ctx.options.sglang_image)
        command, args = launch.argv[:1], launch.argv[1:]
        extra_env = launch.env
        metrics_path = launch.metrics_path
        env.append({"name": launch.token_env, "valueFrom": {"secretKeyRef": {"name": ctx.internal_secret,
                                                                             "key": ENGINE_TOKEN_KEY}}})
    # references first (a value may expand $(VAR) of any of them), then values in the spec's own order (one
    # value may expand another written before it); names we set are ours (engine_objects warns)
    reserved = reserved_env(ctx)
    env += [{"name": k, "valueFrom": v} for k, v in spec.engine.env_from.items() if k not in reserved]
    env += [{"name": k, "value": v} for k, v in extra_env.items() if k not in reserved]
    if kind == "builtin":  # after the passwords they expand
        env += [{"name": k, "value": v} for k, v in l2_env(l2_url, tenant_urls).items()]
    if spec.engine.command:  # HyperPod's worker.command: the image's entrypoint replaced; our launcher words go
        command = list(spec.engine.command)
        if kind in GPU_ENGINES:
            args = args_after(kind, launch.argv, command)
    ports = [{"name": "http", "containerPort": engine_port(ctx), "protocol": "TCP"}]
    if metrics_port(ctx) != engine_port(ctx):
        ports.append({"name": "metrics", "containerPort": metrics_port(ctx), "protocol": "TCP"})
    container = {
        "name": "engine",
        "image": image,
        **({"command": command} if command else {}),  # none: the image's own entrypoint
        "args": args,
        "ports": ports,
        "env": env,
        "volumeMounts": list(mounts),
        **_probes(ctx),
        "lifecycle": {"preStop": {"sleep": {"seconds": ctx.options.prestop_seconds}}},
    }
    if kind == "builtin" and not spec.engine.image:  # fleetserve's image (uid 10001), not one of the user's
        container["securityContext"] = restricted_engine()
    if kind == "builtin":
        container["env"].append({"name": "FLEETSERVE_HOME", "value": f"{models_dir(ctx)}/cache"})
        container["volumeMounts"].append({"name": "internal-token", "mountPath": INTERNAL_TOKEN_DIR,
                                          "readOnly": True})
    else:
        container["volumeMounts"].append({"name": "dshm", "mountPath": SHARED_MEMORY})
    if spec.engine.working_dir:
        container["workingDir"] = spec.engine.working_dir
    own = {m["mountPath"].rstrip("/") or "/": m["name"] for m in container["volumeMounts"]}
    for i, mount in enumerate(spec.pod.volume_mounts):  # one mount a path (the API server refuses a second)
        path = mount["mountPath"].rstrip("/") or "/"
        if path in own:
            raise ValueError(f"spec.pod.volumeMounts[{i}].mountPath: {mount['mountPath']!r} is where the engine "
                             f"container mounts its {own[path]!r} volume; a path takes one mount in a container")
    container["volumeMounts"] += [dict(m) for m in spec.pod.volume_mounts]
    resources = {k: dict(v) if isinstance(v, dict) else v for k, v in (spec.engine.resources or {}).items()}
    if spec.engine.gpus:
        for section in ("limits", "requests"):
            resources[section] = {**resources.get(section, {}), GPU: str(spec.engine.gpus)}
    resources, _warning = memory_for_l1(ctx, resources)
    if resources:
        container["resources"] = resources
    container["__metrics_path"] = spec.metrics.model_metrics_path or metrics_path
    return container


def instance_label(types) -> str:
    """The `instance_type` label of model metrics on Kubernetes: the one type pods run on, else `kubernetes` (a
    pod cannot read its node's labels)."""
    types = sorted(set(types))
    return types[0] if len(types) == 1 and types[0] != "local" else "kubernetes"


def memory_quantity(n: int) -> str:
    """Bytes as a Kubernetes quantity a person reads: 64Gi, else whole MiB rounded up."""
    return f"{n >> 30}Gi" if n % (1 << 30) == 0 else f"{-(-n // (1 << 20))}Mi"


def memory_for_l1(ctx: Context, resources: dict) -> tuple[dict, str | None]:
    """The pod's resources with memory for its L1 tier (`placement.l1_memory_bytes`), and why when the spec's own
    memory cannot hold it. A vLLM pod with a 64 GiB LMCache buffer requested no memory: it was scheduled on any
    node and OOM-killed when L1 filled; the simulator and `plan` placed it by that memory all along."""
    need = l1_memory_bytes(ctx.endpoint.spec.kv_cache, ctx.endpoint.spec.engine)
    if not need:
        return resources, None
    requests, limits = dict(resources.get("requests") or {}), resources.get("limits") or {}
    l1 = f"the L1 tier's {memory_quantity(need)} (kvCache.l1.maxBytes)" if ctx.endpoint.spec.kv_cache.l1.enabled \
        else f"LMCache's {memory_quantity(need)} staging buffer for L2 (1 GiB a GPU rank)"
    if "memory" in limits and quantity(limits["memory"]) < need:
        return resources, (f"limits.memory {limits['memory']} is below {l1}: the engine is OOM-killed when L1 "
                           "fills; raise the limit or lower l1.maxBytes")
    asked = requests.get("memory", limits.get("memory"))
    if asked is not None and quantity(asked) >= need:
        return resources, None
    requests["memory"] = memory_quantity(need)
    why = None if asked is None else (f"requests.memory {asked} is below {l1}: the pod requests "
                                      f"{memory_quantity(need)} so that it lands on a node that holds its L1")
    return {**resources, "requests": requests}, why


def _affinity(ctx: Context, tier: int) -> dict | None:
    """The tier's instance and capacity types, and every other key the spec's required node affinity names (a zone,
    a team's own label), term by term: they were in the NodePool only, so pods could land on any zone's nodes. A
    term keeps its own instance types (of the tier's): each term had admitted every type of the tier, the other
    terms' included; a term that admits none of them, or no zone of --zone, is left out."""
    if not ctx.placed:
        return None
    if ctx.pinned:
        return {"nodeAffinity": copy.deepcopy(ctx.endpoint.spec.placement.node_affinity)}
    t = ctx.tiers[tier]
    common = [{"key": CAPACITY_TYPE_LABEL, "operator": "In", "values": list(t.capacity_types)},
              {"key": ENDPOINT_LABEL, "operator": "In", "values": [node_owner(ctx.namespace, ctx.name)]}]
    zone = [{"key": ZONE_LABEL, "operator": "In", "values": list(ctx.options.zones)}] if ctx.options.zones else []
    terms = []
    for term, extra in zip(required_terms(ctx), required_extras(ctx), strict=True):
        allowed = term_instance_types(term)
        types = [x for x in t.instance_types if allowed is None or x in allowed]
        if types and not no_zone_left(extra):
            own_zones = any(e.get("key") == ZONE_LABEL and e.get("operator") == "In" for e in extra)  # narrowed
            terms.append({"matchExpressions": [{"key": INSTANCE_TYPE_LABEL, "operator": "In", "values": types},
                                               *common, *([] if own_zones else zone), *extra]})
    if not terms:  # no required terms (or none left: `render` refuses a --zone that leaves none)
        terms = [{"matchExpressions": [{"key": INSTANCE_TYPE_LABEL, "operator": "In",
                                        "values": list(t.instance_types)}, *common, *zone]}]
    unique = [t for i, t in enumerate(terms) if t not in terms[:i]]
    node = {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": unique}}
    preferred = (ctx.endpoint.spec.placement.node_affinity or {}).get("preferredDuringSchedulingIgnoredDuringExecution")
    if preferred:  # soft: the scheduler weighs them among the nodes the tier allows (they were dropped); types
        # named as the tiers name them (EC2's, as Karpenter labels nodes: ml.g5.8xlarge -> g5.8xlarge)
        node["preferredDuringSchedulingIgnoredDuringExecution"] = [
            {**p, "preference": {**(p.get("preference") or {}), "matchExpressions": [
                {**e, "values": [Catalog.canonical(v) for v in e.get("values") or []]}
                if e.get("key") == INSTANCE_TYPE_LABEL and "values" in e else dict(e)
                for e in (p.get("preference") or {}).get("matchExpressions") or []]}} for p in preferred]
    return {"nodeAffinity": node}


def required_terms(ctx: Context) -> list[dict]:
    """The spec's required node-affinity terms (alternatives)."""
    affinity = ctx.endpoint.spec.placement.node_affinity or {}
    return (affinity.get("requiredDuringSchedulingIgnoredDuringExecution") or {}).get("nodeSelectorTerms") or []


def term_instance_types(term: dict) -> set[str] | None:
    """The instance types (EC2's names, as the tiers give them) one required term admits; None: it names none."""
    for e in term.get("matchExpressions") or []:
        if e.get("key") == INSTANCE_TYPE_LABEL and e.get("operator") == "In":
            return {Catalog.canonical(v) for v in e.get("values") or []}
    return None


def no_zone_left(extra: list[dict]) -> bool:
    """A term whose zones --zone removed all of (`required_extras`)."""
    return any(e.get("key") == ZONE_LABEL and e.get("operator") == "In" and not e.get("values") for e in extra)


def required_extras(ctx: Context) -> list[list[dict]]:
    """Per term of the spec's required node affinity, the expressions on keys the tiers do not set themselves
    (a zone, a team's own label): pods and NodePools both carry them. With --zone, a term's zones are narrowed to
    those of --zone (never widened: the spec's had been replaced by --zone's without a word)."""
    zones = set(ctx.options.zones or ())
    extras = []
    for term in required_terms(ctx):
        exprs = []
        for e in term.get("matchExpressions", []):
            if e.get("key") in (INSTANCE_TYPE_LABEL, CAPACITY_TYPE_LABEL):
                continue
            e = {k: e[k] for k in ("key", "operator", "values") if k in e}
            if zones and e.get("key") == ZONE_LABEL and e.get("operator") == "In":
                e["values"] = [z for z in e.get("values") or [] if z in zones]
            exprs.append(e)
        extras.append(exprs)
    return extras


def zone_problem(ctx: Context) -> str | None:
    """Why --zone leaves the pods no node: none of it is a zone any required term allows."""
    extras = required_extras(ctx)
    if not ctx.options.zones or not extras or not all(no_zone_left(e) for e in extras):
        return None
    allowed = sorted({z for term in required_terms(ctx) for e in term.get("matchExpressions") or []
                      if e.get("key") == ZONE_LABEL and e.get("operator") == "In" for z in e.get("values") or []})
    return (f"--zone {', '.join(ctx.options.zones)}: none is a zone spec.placement.nodeAffinity allows "
            f"({', '.join(allowed)}), so no node could take the pods; give one of those, or leave --zone out")


def metrics_port(ctx: Context) -> int:
    """The engine's metrics port: `metrics.modelMetricsPort` (HyperPod's modelMetrics.port) or the engine port."""
    return ctx.endpoint.spec.metrics.model_metrics_port or engine_port(ctx)


def tier_replicas(ctx: Context, tier: int) -> int:
    """The first tier starts at spec.replicas, within the autoscaler's bounds (a count above maxReplicaCount ran
    pods past the NodePool's GPU limit until KEDA scaled them down)."""
    if tier:
        return 0
    spec = ctx.endpoint.spec
    auto = spec.autoscaling
    if auto is not None and auto.enabled:
        return min(max(spec.replicas, auto.min_replica_count), auto.max_replica_count)
    return spec.replicas


def engine_deployment(ctx: Context, tier: int) -> dict:
    spec = ctx.endpoint.spec
    inits, volumes, mounts, model_path = _model_volume(ctx)
    container = _container(ctx, tier, model_path, mounts)
    metrics_path = container.pop("__metrics_path")
    volumes = list(volumes)
    if spec.engine.kind == "builtin":
        volumes.append({"name": "internal-token", "secret": {"secretName": ctx.internal_secret,
                                                            "items": [{"key": "token", "path": "token"}]}})
    else:
        volumes.append({"name": "dshm", "emptyDir": {"medium": "Memory"}})
    extra = {TIER_LABEL: ctx.tier_id(tier)}
    pod_spec: dict = {}
    account = spec.pod.service_account_name or ctx.options.service_account
    if account:
        pod_spec["serviceAccountName"] = account
    if spec.pod.scheduler_name:
        pod_spec["schedulerName"] = spec.pod.scheduler_name
    affinity = _affinity(ctx, tier)
    if affinity:
        pod_spec["affinity"] = affinity
    tolerations = [{"key": GPU, "operator": "Exists", "effect": "NoSchedule"}] if spec.engine.gpus else []
    tolerations += [t.model_dump(by_alias=True, exclude_none=True) for t in spec.pod.tolerations
                    if t.model_dump(by_alias=True, exclude_none=True) not in tolerations]
    if tolerations:
        pod_spec["tolerations"] = tolerations
    if spec.pod.priority_class_name:
        pod_spec["priorityClassName"] = spec.pod.priority_class_name
    if spec.pod.security_context:
        pod_spec["securityContext"] = dict(spec.pod.security_context)
    if ctx.image_pull_secrets():
        pod_spec["imagePullSecrets"] = ctx.image_pull_secrets()
    inits = list(inits) + [dict(c) for c in spec.pod.init_containers]
    volumes += [dict(v) for v in spec.pod.volumes]
    if inits:
        pod_spec["initContainers"] = inits
    pod_spec.update({
        "containers": [container],
        "volumes": volumes,
        "terminationGracePeriodSeconds": ctx.options.prestop_seconds + ctx.drain_seconds + EXIT_SECONDS,
    })
    user = dict(ctx.endpoint.metadata.annotations)
    annotations = {**user, "fleetserve.io/metrics-path": metrics_path, "fleetserve.io/model-source": spec.model.source}
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {**ctx.meta(ctx.engine_name(tier), "engine", **extra), "annotations": annotations},
        "spec": {
            "replicas": tier_replicas(ctx, tier),
            "selector": {"matchLabels": ctx.selector("engine", **extra)},
            "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": ROLLOUT_SURGE, "maxUnavailable": 0}},
            "progressDeadlineSeconds": max(600, math.ceil(spec.engine.startup_timeout_seconds) + PROGRESS_ALLOWANCE_S),
            "template": {
                "metadata": {"labels": ctx.labels("engine", **extra),
                             "annotations": {**user, "fleetserve.io/model-version": spec.model.version}},
                "spec": pod_spec,
            },
        },
    }


def engine_service(ctx: Context) -> dict:
    """One Service over every tier's pods: the router's backend and the metrics scrape target."""
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": ctx.meta(ctx.engine_service, "engine"),
        "spec": {
            "selector": ctx.selector("engine"),
            "ports": [{"name": "http", "port": engine_port(ctx), "targetPort": "http", "protocol": "TCP"}] + (
                [{"name": "metrics", "port": metrics_port(ctx), "targetPort": "metrics", "protocol": "TCP"}]
                if metrics_port(ctx) != engine_port(ctx) else []),
        },
    }


def engine_pods_service(ctx: Context) -> dict:
    """Headless: DNS returns each ready engine pod's IP, so the router sees every replica (cache-aware routing
    needs them apart; a ClusterIP would hide them behind one address). `fleetserve router --backend-dns`."""
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": ctx.meta(ctx.engine_pods_service, "engine", **{DISCOVERY_LABEL: "dns"}),
        "spec": {
            "clusterIP": "None",
            "publishNotReadyAddresses": False,
            "selector": ctx.selector("engine"),
            "ports": [{"name": "http", "port": engine_port(ctx), "targetPort": "http", "protocol": "TCP"}],
        },
    }


# Hugging Face repos that answer 401 without the token of an account that accepted their licence
GATED_HF_ORGS = ("meta-llama/", "google/gemma", "mistralai/")


def _fetch_credentials(ctx: Context, warn) -> None:
    """What the fetch-model init container will be refused without: a gated Hugging Face repo without
    model.tokenSecret (401), an S3 bucket without a service account that may read it (403)."""
    model, spec = ctx.endpoint.spec.model, ctx.endpoint.spec
    source = model.source
    if source.startswith("catalog:"):
        from fleetserve.engine.catalog import CATALOG

        source = CATALOG[source.removeprefix("catalog:")].source
    if source.startswith("hf:") and source[3:].startswith(GATED_HF_ORGS) and not model.token_secret:
        warn("spec.model.tokenSecret", f"{source[3:]} is gated on Hugging Face: without a token of an account that "
                                       "accepted its licence the fetch-model init container gets 401; set "
                                       "model.tokenSecret (a Secret key holding HF_TOKEN)")
    if source.startswith("s3://") and not (spec.pod.service_account_name or ctx.options.service_account):
        warn("spec.model.source", "an s3:// model is fetched with the pod's credentials: without a service account "
                                  "that may read the bucket (render --service-account, pod.serviceAccountName; "
                                  "IRSA or Pod Identity on EKS) the fetch gets 403")


def engine_objects(ctx: Context, warn) -> list[dict]:
    spec = ctx.endpoint.spec
    if spec.engine.kind == "external":
        warn("spec.engine.kind", "'external' engines run outside the cluster: no engine Deployment is rendered; "
                                 "the router forwards to spec.engine.urls")
        return []
    if spec.engine.kind == "container" and not spec.engine.gpus and not mig_slices(spec.engine.resources):
        # vLLM's and SGLang's: a spec warning (effects); so is a MIG slice's
        warn("spec.engine.gpus", f"0 GPUs for a {spec.engine.kind} engine: the pod requests no nvidia.com/gpu")
    if spec.engine.kind != "builtin" and any(a.split("=")[0] == "--api-key" for a in spec.engine.args):
        warn("spec.engine.args", f"the router authenticates to its {spec.engine.kind} engines with the key "
                                 f"{ENGINE_TOKEN_KEY} of {ctx.internal_secret}, which fleetserve passes as the "
                                 "engine's API key; an API key set here replaces it and the router's requests get "
                                 "401: remove it")  # one in engine.env is not used (reserved_env, below)
    kv = spec.kv_cache
    image = spec.engine.image or ctx.options.vllm_image
    if spec.engine.kind == "vllm" and (kv.l1.enabled or kv.l2.enabled) and "lmcache" not in image.lower():
        warn("spec.engine.image", f"{image} is started with LMCache's connector (--kv-transfer-config "
                                  "LMCacheConnectorV1) for kvCache's tiers: a vLLM image built without LMCache "
                                  "stops at start; use an image with it (lmcache/vllm-openai, the default) or turn "
                                  "kvCache.l1 and kvCache.l2 off")
    if spec.engine.kind == "vllm" and not any(a.split("=")[0].split()[0] == "--shutdown-timeout"
                                              for a in spec.engine.args if a.strip()):
        warn("spec.engine.args", f"vLLM aborts its in-flight requests at SIGTERM unless started with "
                                 f"--shutdown-timeout (vLLM 0.18 and later): the pod is given "
                                 f"engine.drainTimeoutSeconds ({ctx.drain_seconds} s) after preStop, but streams "
                                 f"still running at scale-down are cut; add `--shutdown-timeout={ctx.drain_seconds}` "
                                 "to engine.args when the image's vLLM has it")
    if spec.auth.enabled and spec.engine.kind in GPU_ENGINES and (spec.kv_cache.l1.enabled or
                                                                 spec.kv_cache.l2.enabled):
        warn("spec.kvCache", f"tenants reach {spec.engine.kind} as cache_salt, which divides its GPU prefix cache; "
                             "LMCache and SGLang's HiCache keep the salt in their CPU and remote tier keys only "
                             "in versions from 2026: check the image, or give tenants endpoints of their own")
    if spec.engine.kind in GPU_ENGINES:
        for name, probe in sorted((spec.engine.probes or {}).items()):
            path = str(((probe or {}).get("httpGet") or {}).get("path", ""))
            if path.startswith("/v1"):  # vLLM and SGLang check the API key on /v1/*; the kubelet sends none
                warn(f"spec.engine.probes.{name}", f"{path} needs the engine's API key (fleetserve gives "
                     f"{spec.engine.kind} one, {ENGINE_TOKEN_KEY} of {ctx.internal_secret}) and probes send none: "
                     "every probe gets 401 and the pod never becomes ready; probe /health")
    _fetch_credentials(ctx, warn)
    taken = sorted(reserved_env(ctx) & (set(spec.engine.env) | set(spec.engine.env_from)))
    if taken:
        warn("spec.engine.env", f"{', '.join(taken)} set by fleetserve in the engine container; yours not used")
    for name, setting in replaced_env(spec, engine_l2(ctx)[0]).items():
        warn(f"spec.engine.env.{name}", f"{spec.engine.env[name]!r} not used: for LMCache's L1/L2 tiers the "
                                        f"vLLM adapter sets {name} {setting}")
    _resources, memory = memory_for_l1(ctx, spec.engine.resources or {})
    if memory:
        warn("spec.engine.resources", memory)
    if spec.kv_cache.l2.tenant_urls and spec.engine.kind != "builtin":
        warn("spec.kvCache.l2.tenantUrls", f"a Redis per tenant is a built-in engine feature; {spec.engine.kind} "
                                           "engines share the one L2, and the tenants' Redis are not rendered")
    return [engine_deployment(ctx, i) for i in range(len(ctx.tiers))] + [engine_service(ctx),
                                                                        engine_pods_service(ctx), *engine_pdbs(ctx)]


def engine_pdbs(ctx: Context) -> list[dict]:
    """At most one engine pod of each tier evicted at a time. Karpenter's consolidation and drift and `kubectl
    drain` evict; without a budget they could take every replica at once (several share a node with
    allowLargerInstances), each back only after a cold start. Scale-in by KEDA and rollouts do not evict: the
    budget does not slow them.

    One budget per tier, not one over the endpoint: the disruption controller expects every replica its
    Deployments ask for, so a tier-0 pod left Pending in a shortage (the overflow tier serving for it) took one
    budget over all tiers to 0 allowed, and blocked consolidation, drift and drains of every node for the whole
    shortage. `AlwaysAllow`: a pod that is not ready (crash-looping, never loaded) may always be evicted, else it
    alone blocks a drain the same way."""
    return [{
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": ctx.meta(ctx.engine_name(tier), "engine", **{TIER_LABEL: ctx.tier_id(tier)}),
        "spec": {"maxUnavailable": 1, "unhealthyPodEvictionPolicy": "AlwaysAllow",
                 "selector": {"matchLabels": ctx.selector("engine", **{TIER_LABEL: ctx.tier_id(tier)})}},
    } for tier in range(len(ctx.tiers))]
