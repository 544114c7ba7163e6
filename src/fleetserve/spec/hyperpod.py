"""HyperPod `InferenceEndpointConfig` (apiVersion inference.sagemaker.aws.amazon.com/v1, or v1alpha1) accepted as is.

The document is validated against the openAPIV3Schema of its version of the CRD HyperPod ships
(`spec/data/`, unmodified, source and checksum in its README), with unknown fields rejected where the CRD
lists properties (the API server would prune them silently), then against the HyperPod SDK's cross-field
rules (the CRD has no CEL for them). It is then mapped onto our `Endpoint`. Pod-level settings (command,
workingDir, probes, resources, volumes, secrets) are carried into the spec, where `fleetserve render k8s`
renders them; whatever has no meaning outside AWS (SageMaker endpoint registration, S3 certificate upload,
ALB settings, ...) is left out and reported as a warning naming the field: nothing is dropped silently.
"""

from __future__ import annotations

import re
import shlex
from functools import cache
from importlib import resources
from typing import TYPE_CHECKING, Any

import yaml

from fleetserve.spec.context import flag_in_args
from fleetserve.spec.endpoint import SERVED_NAME_FLAG, shell_script_at
from fleetserve.spec.errors import SpecError, SpecProblem, pattern_hint, short_value

if TYPE_CHECKING:
    import jsonschema  # imported where a HyperPod document is checked: a third of every command's start

GROUP = "inference.sagemaker.aws.amazon.com"
API_VERSION = f"{GROUP}/v1"
# v1alpha1, which the CRD still serves (HyperPod's first samples and docs use it), is a subset of v1: the same fields
# under the same names, with instanceType required and S3 or FSx sources only. It is checked against its own schema
# and then read as v1, field for field.
API_VERSIONS = (API_VERSION, f"{GROUP}/v1alpha1")
KIND = "InferenceEndpointConfig"
CRD_FILE = "inference.sagemaker.aws.amazon.com_inferenceendpointconfigs.yaml"
CRD_VERSION = "v1"

HYPERPOD_METRICS_PORT = 8080  # the CRD's default for metrics.modelMetrics.port
# invocationEndpoint values the gateway serves: the CRD's default (SageMaker's, router/invocations.py) and OpenAI's
SERVED_INVOCATION_PATHS = ("invocations", "v1/chat/completions", "v1/completions")


def _strict(schema: Any) -> Any:
    """Reject unknown fields wherever the CRD lists properties (and does not preserve unknown fields)."""
    if isinstance(schema, dict):
        out = {k: _strict(v) for k, v in schema.items()}
        if "properties" in out and "additionalProperties" not in out and \
                not out.get("x-kubernetes-preserve-unknown-fields"):
            out["additionalProperties"] = False
        return out
    if isinstance(schema, list):
        return [_strict(s) for s in schema]
    return schema


@cache
def crd() -> dict[str, Any]:
    """The shipped CRD, as HyperPod publishes it."""
    text = resources.files("fleetserve.spec").joinpath("data", CRD_FILE).read_text()
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    return yaml.load(text, Loader=loader)  # noqa: S506 (a safe loader)


@cache
def crd_schema(version: str = CRD_VERSION) -> dict[str, Any]:
    """openAPIV3Schema of one version of the CRD (v1 unless named), unmodified."""
    served = next(v for v in crd()["spec"]["versions"] if v["name"] == version)
    return served["schema"]["openAPIV3Schema"]


@cache
def _validator(version: str = CRD_VERSION) -> jsonschema.Draft7Validator:
    import jsonschema

    schema = _strict(crd_schema(version))
    # ObjectMeta is not in the CRD (the API server owns it): the fields HyperPod documents use.
    schema["properties"]["metadata"] = {
        "type": "object",
        "required": ["name"],
        "properties": {"name": {"type": "string"}, "namespace": {"type": "string"},
                       "labels": {"type": "object", "additionalProperties": {"type": "string"}},
                       "annotations": {"type": "object", "additionalProperties": {"type": "string"}}},
        "additionalProperties": False,
    }
    schema["properties"].pop("status", None)  # written by the operator, never by users
    schema["required"] = ["apiVersion", "kind", "metadata", "spec"]
    schema["properties"]["apiVersion"] = {"enum": [f"{GROUP}/{version}"]}
    schema["properties"]["kind"] = {"enum": [KIND]}
    return jsonschema.Draft7Validator(schema)


def _path(parts) -> str:
    out = ""
    for part in parts:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


_TYPE_NAMES = {"object": "a mapping", "array": "a list", "string": "a string", "integer": "an integer",
               "number": "a number", "boolean": "true or false"}


def _problem(error: jsonschema.ValidationError) -> SpecProblem:
    """One schema error in our style: the path, the bad value, the allowed values."""
    path = list(error.absolute_path)
    kind, schema, value = error.validator, error.schema, error.instance
    if kind == "additionalProperties":
        allowed = sorted(schema.get("properties", {}))
        extra = sorted(set(value) - set(allowed)) if isinstance(value, dict) else []
        return SpecProblem(_path(path + extra[:1]), f"unknown field; allowed fields: {', '.join(allowed)}")
    if kind == "required":
        missing = re.match(r"'([^']+)'", error.message)
        return SpecProblem(_path(path + ([missing.group(1)] if missing else [])), "required field is missing")
    if kind == "enum":
        allowed = [repr(v) for v in error.validator_value]
        words = allowed[0] if len(allowed) == 1 else ", ".join(allowed[:-1]) + " or " + allowed[-1]
        return SpecProblem(_path(path), f"got {short_value(value)}; allowed values: {words}")
    if kind == "type":
        wanted = error.validator_value
        wanted = " or ".join(_TYPE_NAMES.get(w, w) for w in (wanted if isinstance(wanted, list) else [wanted]))
        return SpecProblem(_path(path), f"expected {wanted} (got {short_value(value)})")
    if kind == "pattern":
        hint = pattern_hint(str(error.validator_value))
        said = f"expected {hint}" if hint else f"does not match the pattern {error.validator_value!r}"
        return SpecProblem(_path(path), f"{said} (got {short_value(value)})")
    if kind in ("minimum", "maximum", "minLength", "maxLength", "minItems", "maxItems"):
        return SpecProblem(_path(path), f"{kind} is {error.validator_value} (got {short_value(value)})")
    return SpecProblem(_path(path), f"{error.message} (got {short_value(value)})")


def schema_problems(data: Any) -> list[SpecProblem]:
    """Every place where `data` breaks the CRD's schema of its apiVersion (v1 when it names none we know; [] when
    it conforms)."""
    api_version = data.get("apiVersion") if isinstance(data, dict) else None
    version = api_version.removeprefix(f"{GROUP}/") if api_version in API_VERSIONS else CRD_VERSION
    errors = sorted(_validator(version).iter_errors(data), key=lambda e: [str(p) for p in e.absolute_path])
    return [_problem(e) for e in errors]


def _sdk_problems(spec: dict[str, Any]) -> list[SpecProblem]:
    """The HyperPod SDK's cross-field rules (the CRD has no CEL; HyperPod's webhook enforces these)."""
    out = []

    def rule(path: str, message: str) -> None:
        out.append(SpecProblem(path, message))

    src = spec["modelSourceConfig"]
    needed = {"s3": "s3Storage", "fsx": "fsxStorage", "huggingface": "huggingFaceModel"}
    field = needed.get(src["modelSourceType"])
    if field and not src.get(field):
        rule("spec.modelSourceConfig", f"modelSourceType {src['modelSourceType']!r} requires modelSourceConfig.{field}")
    if src["modelSourceType"] == "kubernetesVolume":
        name = spec["worker"]["modelVolumeMount"]["name"]
        volumes = (spec.get("kubernetes") or {}).get("volumes") or []
        if not any(v.get("name") == name for v in volumes):
            rule("spec.kubernetes.volumes", f"modelSourceType 'kubernetesVolume' needs a volume named {name!r} "
                                            "(worker.modelVolumeMount.name)")
    resources = spec["worker"].get("resources") or {}
    asked, cap = ((resources.get(section) or {}).get("nvidia.com/gpu") for section in ("requests", "limits"))
    for section, value in (("requests", asked), ("limits", cap)):
        # a count of whole GPUs: "500m", "1k" or "2Gi" had become 0 GPUs without a word (a vLLM pod that never
        # started), and Kubernetes refuses a fraction of an extended resource
        if value is not None and not re.fullmatch(r"\d+", str(value)):
            rule(f"spec.worker.resources.{section}.nvidia.com/gpu",
                 f"got {value!r}; a whole number of GPUs, written without a unit (0, 1, 2, ...)")
    if asked is not None and (cap is None or str(asked) != str(cap)):  # as the API server, and our own spec
        rule("spec.worker.resources.requests.nvidia.com/gpu",
             f"{asked} needs limits.nvidia.com/gpu of the same amount (got {cap}): extended resources cannot be "
             "overcommitted")
    if spec.get("instanceType") and spec.get("instanceTypes"):
        rule("spec", "instanceType and instanceTypes are mutually exclusive")
    if spec.get("nodeAffinity") and (spec.get("instanceType") or spec.get("instanceTypes")):
        rule("spec", "nodeAffinity cannot be combined with instanceType or instanceTypes")
    if not (spec.get("instanceType") or spec.get("instanceTypes") or spec.get("nodeAffinity")):
        rule("spec", "one of instanceType, instanceTypes or nodeAffinity is required")
    cert = (spec.get("tlsConfig") or {}).get("customCertificateConfig")
    if cert and bool(cert.get("acmArn")) != bool(cert.get("domainName")):
        rule("spec.tlsConfig.customCertificateConfig", "needs both acmArn and domainName")
    if spec.get("dnsConfig") and not (cert and cert.get("acmArn")):
        rule("spec.dnsConfig", "dnsConfig requires tlsConfig.customCertificateConfig")
    l2 = (spec.get("kvCacheSpec") or {}).get("l2CacheSpec")
    if l2 and not l2.get("l2CacheBackend"):  # the CRD says "required when l2CacheSpec is provided" in prose only
        rule("spec.kvCacheSpec.l2CacheSpec.l2CacheBackend", "required when l2CacheSpec is given; allowed values: "
                                                            "redis, tieredstorage")
    return out


def _k8s_name(value: str) -> str:
    """HyperPod model names allow upper case; our metadata is a DNS label, and a name that names Services starts
    with a letter: `Llama_3.1` -> `llama-3-1`, `3b-chat` -> `ep-3b-chat`; over 63 characters, cut and 8 hex digits
    of the whole name (two long names that began alike were one endpoint, each apply taking the other's objects)."""
    from fleetserve.k8s.labels import dns_name

    name = _dns_label_of(value)
    return dns_name(name) if name else "endpoint"


def _dns_label_of(value: str) -> str:
    name = re.sub(r"[^a-z0-9-]+", "-", value.lower()).strip("-")
    return "ep-" + name if name[:1].isdigit() else name


def _engine_kind(image: str) -> str:
    lowered = image.lower()
    if "sglang" in lowered:
        return "sglang"
    if "vllm" in lowered:
        return "vllm"
    if "fleetserve" in lowered:
        return "builtin"
    return "container"  # TGI, DJL-LMI, one's own: the image is the server, run as given


def _container_health_path(image: str) -> str:
    """Where an image run as given answers health checks: DJL-LMI's (SageMaker's /ping), else /health (TGI's)."""
    lowered = image.lower()
    return "/ping" if "djl" in lowered or "lmi" in lowered else "/health"


def _gpu_count(resources: dict[str, Any]) -> int:
    for section in ("limits", "requests"):
        value = (resources.get(section) or {}).get("nvidia.com/gpu")
        if value is not None:
            try:
                return int(str(value))
            except ValueError:
                return 0
    return 0


def _model_source(spec: dict[str, Any]) -> tuple[str, str | None]:
    """Our `model.source` for a HyperPod modelSourceConfig, and the revision if any."""
    src = spec["modelSourceConfig"]
    location = (src.get("modelLocation") or "").strip("/")
    kind = src["modelSourceType"]
    if kind == "s3":
        return f"s3://{src['s3Storage']['bucketName']}/{location}".rstrip("/"), None
    if kind == "huggingface":
        hf = src["huggingFaceModel"]
        return f"hf:{hf['modelId']}", hf.get("commitSHA")
    if kind == "fsx":
        # FSx for Lustre is a POSIX mount: locally the directory where it is mounted (/fsx, as AWS mounts it), on
        # Kubernetes a PVC. Its mountName is the file system's own name in the mount command (`...@tcp:/abcdefgh`),
        # not a local folder: the model had been looked for in /abcdefgh/...
        return f"/fsx/{location}".rstrip("/"), None
    mount_path = spec["worker"]["modelVolumeMount"].get("mountPath", "/opt/ml/model").rstrip("/")
    return f"{mount_path}/{location}".rstrip("/"), None


_METRIC_TYPES = {"Average": "AverageValue", "Value": "Value"}


def _triggers(a: dict[str, Any], warn) -> list[dict[str, Any]]:
    listed = a.get("prometheusTriggerList") or ([a["prometheusTrigger"]] if a.get("prometheusTrigger") else [])
    field = "prometheusTriggerList" if a.get("prometheusTriggerList") else "prometheusTrigger"
    if a.get("prometheusTriggerList") and a.get("prometheusTrigger"):  # it had been dropped without a word
        warn("spec.autoScalingSpec.prometheusTrigger", "ignored: prometheusTriggerList is given too, and its "
                                                       "triggers are used; move this one into the list")
    out = []
    for i, trig in enumerate(listed):
        where = f"spec.autoScalingSpec.{field}" + (f"[{i}]" if field.endswith("List") else "")
        if trig.get("targetValue") is None or not trig.get("query"):
            warn(where, "needs query and targetValue; trigger ignored")
            continue
        out.append({
            "metric": "prometheus",
            "query": trig["query"],
            # none: the fleet's own Prometheus locally, `render k8s --prometheus-url` on Kubernetes
            "serverAddress": trig.get("serverAddress") or None,
            "target": trig["targetValue"],
            "activationTarget": trig.get("activationTargetValue", 0),
            "metricType": _METRIC_TYPES[trig.get("metricType", "Average")],
            "useCachedMetrics": trig.get("useCachedMetrics", True),
            "customHeaders": trig.get("customHeaders"),
            "namespace": trig.get("namespace") or None,  # KEDA's, sent with each query (it had been dropped)
        })
        if trig.get("name"):
            warn(f"{where}.name", f"the ScaledObject trigger is named t{len(out) - 1}-prometheus")
    watched = [("spec.autoScalingSpec.cloudWatchTrigger", a["cloudWatchTrigger"])] if a.get("cloudWatchTrigger") \
        else [(f"spec.autoScalingSpec.cloudWatchTriggerList[{i}]", t)
              for i, t in enumerate(a.get("cloudWatchTriggerList") or [])]
    for where, trig in watched:  # each named: a list of two (Invocations, ModelLatency) read as one trigger
        what = " ".join(str(trig.get(k)) for k in ("metricName", "metricStat", "targetValue") if trig.get(k)) \
            if isinstance(trig, dict) else ""
        warn(where, f"CloudWatch{' ' + repr(what) if what else ''} is AWS-only: not rendered; "
                    + ("the fleet scales on concurrency (target 4 per replica) on its own metrics instead"
                       if where == watched[0][0] else "the concurrency trigger above replaces the list"),
             everywhere=True)  # what the simulator scales on too: verify and plan had judged it without a word
    if watched:
        out.append({"metric": "concurrency", "target": 4, "activationTarget": 0})
    return out


def _take_flag(args: list[str], flag: str) -> tuple[str, str] | None:
    """Remove the first `flag VALUE` or `flag=VALUE` from `args`: (what was removed, as written; the value, ""
    for a flag last without one); None when absent."""
    for i, a in enumerate(args):
        if a == flag or a.startswith(flag + "="):
            taken = args[i:i + 2] if a == flag else args[i:i + 1]
            del args[i:i + len(taken)]
            return " ".join(taken), taken[1] if len(taken) == 2 else a.partition("=")[2]
    return None


def _server_args(args: list[str], kind: str, port: int, warn) -> list[str]:
    """A vLLM or SGLang `worker.args` as the adapter's own command line takes it. HyperPod's samples start with
    the launcher (`python3 -m sglang.launch_server`, `vllm serve MODEL`) and set `--port`/`--host`: the adapter
    writes those itself, from the model section and worker.modelInvocationPort (a second `-m` module after ours
    stopped SGLang, and `--port 8000` beside engine.port was refused)."""
    args = list(args)
    launcher = []  # leading words before the first flag, and `-m MODULE` after a python
    while args and (not args[0].startswith("-") or (args[0] == "-m" and launcher[-1:] and
                                                     launcher[-1].split("/")[-1].startswith("python"))):
        launcher += args[:2] if args[0] == "-m" else args[:1]
        del args[:2 if args[0] == "-m" else 1]
    named = []  # `--model PATH` / `--model-path PATH` (SGLang's): the same as a positional path
    for flag in ("--model", "--model-path"):
        while (taken := _take_flag(args, flag)) is not None:
            named.append(taken[0])
    if launcher or named:
        warn("spec.worker.args", f"{' '.join(launcher + named)!r} dropped: the {kind} command line (launcher and "
                                 "model path) comes from the model section; a second one would stop the server")
    for flag in ("--port", "--host"):
        while (taken := _take_flag(args, flag)) is not None:
            value = taken[1] or "(no value)"
            where = (f"worker.modelInvocationPort.containerPort {port}, where the Service sends requests"
                     if flag == "--port" else "0.0.0.0 in the pod, 127.0.0.1 locally")
            warn("spec.worker.args", f"{flag} {value} dropped: the server listens on {where}")
    return args


SHELL_SYNTAX = re.compile(r"[;&|<>$`(){}\\\n*?~]")


def _unwrapped_script(command: list[str], args: list[str], warn) -> tuple[list[str], list[str]]:
    """`worker.command: [/bin/bash, -c]` with a one-line `vllm serve ...` (in args, or after the -c) is that command
    line: read as worker.args, the adapter then launches it with its own flags. A script that does more (`pip
    install ... && vllm serve ...`, variables, pipes) stays, and the spec refuses it (engine.command): flags added
    after it are the script's $0, $1, ..., which it ignores, and the pod served without the model's name, prefix
    caching or tensor parallelism."""
    at = shell_script_at(command)
    if at is None:
        return command, args
    script_words = command[at + 1:] + args
    if len(script_words) != 1 or SHELL_SYNTAX.search(script_words[0]):
        return command, args
    words = shlex.split(script_words[0])
    if words[:1] == ["exec"]:
        words = words[1:]
    if not words:
        return command, args
    warn("spec.worker.command", f"{' '.join(command[:at + 1])!r} with the one-line script {script_words[0]!r} is "
                                "read as that command line (worker.args), which the engine adapter launches with "
                                "its own flags")
    return [], words


def _engine(spec: dict[str, Any], warn) -> tuple[dict[str, Any], dict[str, str]]:
    """Our engine section from `worker`, and the plain environment (SESSION_KEY feeds routing)."""
    w = spec["worker"]
    env, env_from = {}, {}
    for i, e in enumerate(w.get("environmentVariables") or []):
        if e.get("valueFrom") is not None:
            env_from[e["name"]] = e["valueFrom"]
        else:
            env[e["name"]] = e.get("value", "")
        if e.get("value") is not None and e.get("valueFrom") is not None:
            warn(f"spec.worker.environmentVariables[{i}]", "both value and valueFrom: valueFrom is used")
    kind = _engine_kind(w["image"])
    image, command, args = w["image"], list(w.get("command") or []), [str(a) for a in w.get("args") or []]
    if kind == "container":  # a DJL/LMI or TGI image got `fleetserve engine ...` as its command line and
        # crash-looped, then was replaced by the built-in engine: it now runs as given
        served = (spec.get("invocationEndpoint") or "invocations").strip("/")
        where = "the OpenAI paths" if served.startswith("v1/") else f"/{served} (invocationEndpoint)"
        warn("spec.worker.image",
             f"image {image!r} is neither vLLM nor SGLang: it runs as given (engine.kind container) on Kubernetes; "
             f"the router sends it chat and completions bodies on {where}; `fleetserve up` cannot run it")
    port = w["modelInvocationPort"]["containerPort"]
    if kind in ("vllm", "sglang"):
        command, args = _unwrapped_script(command, args, warn)
        args = _server_args(args, kind, port, warn)
    res = {section: {k: v for k, v in (w["resources"].get(section) or {}).items() if k != "nvidia.com/gpu"}
           for section in ("limits", "requests") if w["resources"].get(section)}
    if w["resources"].get("claims"):  # a list, refused with its name by the spec (it had crashed the mapping)
        res["claims"] = w["resources"]["claims"]
    engine: dict[str, Any] = {
        "kind": kind,
        "image": image,
        "args": args,
        "command": command,
        "workingDir": w.get("workingDir"),
        "env": env,
        "envFrom": env_from,
        "port": port,
        "startupTimeoutSeconds": spec.get("maxDeployTimeInSeconds", 3600),
        "gpus": _gpu_count(w["resources"]),
        "probes": {k: v for k, v in (w.get("probes") or {}).items() if v} or None,
        "resources": {k: v for k, v in res.items() if v} or None,
    }
    if w["modelInvocationPort"].get("name", "http") != "http":
        warn("spec.worker.modelInvocationPort.name", "engines speak HTTP; the container port is named 'http'")
    if spec.get("loadBalancer", {}).get("healthCheckPath"):
        engine["healthPath"] = spec["loadBalancer"]["healthCheckPath"]
    elif kind == "container":
        engine["healthPath"] = _container_health_path(image)
    if kind == "container":
        served = (spec.get("invocationEndpoint") or "invocations").strip("/")
        if not served.startswith("v1/"):
            engine["invocationPath"] = f"/{served}"
    return engine, env


def _pod(spec: dict[str, Any], model: dict[str, Any]) -> dict[str, Any]:
    """`spec.kubernetes` as our pod section; the model volume (kubernetesVolume) moves to model.volume."""
    k = spec.get("kubernetes") or {}
    volumes = list(k.get("volumes") or [])
    mount = spec["worker"]["modelVolumeMount"]
    if spec["modelSourceConfig"]["modelSourceType"] == "kubernetesVolume":
        chosen = next(v for v in volumes if v.get("name") == mount["name"])
        volumes.remove(chosen)
        model["volume"] = {key: value for key, value in chosen.items() if key != "name"}
    return {"initContainers": list(k.get("initContainers") or []), "schedulerName": k.get("schedulerName"),
            "serviceAccountName": k.get("serviceAccountName"), "volumes": volumes}


def to_endpoint_dict(doc: dict[str, Any], warn) -> dict[str, Any]:
    """Map a validated HyperPod document onto the dict form of our `Endpoint`; `warn(path, msg)` collects notes."""
    s, meta = doc["spec"], doc["metadata"]
    src = s["modelSourceConfig"]
    source, revision = _model_source(s)
    if src["modelSourceType"] == "fsx":
        fsx = src["fsxStorage"]
        warn("spec.modelSourceConfig.fsxStorage", f"FSx {fsx['fileSystemId']} is read from the mount {source!r}: "
                                                  "locally a directory, on Kubernetes the PVC NAME-model "
                                                  "(--model-pvc) bound to that file system")
    engine, env = _engine(s, warn)
    served = s["modelName"]
    if engine["kind"] in ("vllm", "sglang"):  # the server answers to its --served-model-name, and HyperPod's
        # clients call it so (AWS's prefetch samples): that name is the model's, not a disagreement to refuse
        found = flag_in_args(engine["args"], SERVED_NAME_FLAG)
        value = found[1] if found else None
        if value and value != served:
            warn("spec.worker.args", f"the model is served as {value!r} ({SERVED_NAME_FLAG}), not as modelName "
                                     f"{served!r}: clients name it so")
            served = value
    model: dict[str, Any] = {
        "name": served,
        "version": s.get("modelVersion") or "1",
        "source": source,
        "revision": revision,
        "prefetch": src.get("prefetchEnabled", False),
        "s3Region": src["s3Storage"]["region"] if src.get("s3Storage") else None,
        "mountPath": s["worker"]["modelVolumeMount"].get("mountPath", "/opt/ml/model"),
    }
    token = (src.get("huggingFaceModel") or {}).get("tokenSecretRef")
    if token:
        model["tokenSecret"] = {"name": token.get("name") or "", "key": token.get("key") or "token"}
    pod = _pod(s, model)
    name = _k8s_name(meta["name"])
    if len(_dns_label_of(meta["name"])) > 63:  # cut without a word, two names sharing 63 characters were one
        warn("metadata.name", f"{len(meta['name'])} characters: the endpoint is named {name!r} (a DNS label holds "
                              "63; the last 8 characters stand for the whole name)")
    elif name != meta["name"]:  # its objects, metrics and `fleetserve status` go by the DNS label: say which
        warn("metadata.name", f"{meta['name']!r} is named {name!r} here (a DNS label: lower case, digits and '-'; "
                              "a name that names Services starts with a letter)")
    metrics = s.get("metrics") or {}
    model_metrics = metrics.get("modelMetrics") or {}
    out: dict[str, Any] = {
        "apiVersion": "fleetserve.io/v1",
        "kind": "Endpoint",
        "metadata": {
            "name": name,
            # as given (empty: default): a namespace Kubernetes holds is a DNS label already, and one that is not
            # is refused naming metadata.namespace (`NS_A` had been rendered into ns-a, another namespace, unsaid)
            "namespace": meta.get("namespace") or "default",
            "labels": dict(meta.get("labels") or {}),
            "annotations": dict(meta.get("annotations") or {}),
        },
        "spec": {
            "model": model,
            "engine": engine,
            "replicas": s.get("replicas", 1),
            "metrics": {"enabled": metrics.get("enabled", True),
                        "scrapeIntervalSeconds": metrics.get("metricsScrapeIntervalSeconds", 15)},
            "pod": pod,
        },
    }
    spec = out["spec"]
    if model_metrics:
        spec["metrics"]["modelMetricsPath"] = model_metrics.get("path", "/metrics")
        if engine["kind"] in ("vllm", "sglang") and spec["metrics"]["modelMetricsPath"] != "/metrics":
            warn("spec.metrics.modelMetrics.path", f"{spec['metrics']['modelMetricsPath']!r}: {engine['kind']} serves "
                 "its metrics at /metrics only, so the engine ServiceMonitor scrapes a path that answers 404")
        spec["metrics"]["modelMetricsPort"] = model_metrics.get("port", HYPERPOD_METRICS_PORT)
        serves = s["worker"]["modelInvocationPort"]["containerPort"]
        if "port" not in model_metrics and serves != HYPERPOD_METRICS_PORT:
            warn("spec.metrics.modelMetrics.port", f"not set: HyperPod's default {HYPERPOD_METRICS_PORT} is scraped, "
                 f"but the model server listens on {serves} (worker.modelInvocationPort), where vLLM, SGLang and "
                 f"the built-in engine serve /metrics; set port: {serves} unless the image serves metrics on "
                 f"{HYPERPOD_METRICS_PORT}")
    types = [s["instanceType"]] if s.get("instanceType") else list(s.get("instanceTypes") or [])
    spec["placement"] = {"instanceTypes": types, "nodeAffinity": s.get("nodeAffinity")}
    # HyperPod names the types and Kubernetes packs pods onto them (a 1-GPU replica on ml.p4d.24xlarge is eight
    # to a node): verify and plan refused every replica there while render placed them
    spec.setdefault("capacity", {})["allowLargerInstances"] = True
    if s["worker"].get("requestLimits"):
        rl = s["worker"]["requestLimits"]
        spec["requestLimits"] = {
            "maxConcurrentRequests": rl.get("maxConcurrentRequests"),
            "maxQueueSize": rl.get("maxQueueSize"),
            "overflowStatusCode": rl.get("overflowStatusCode", 429),
        }
        if not metrics.get("enabled", True):
            warn("spec.worker.requestLimits", "HyperPod enforces requestLimits only with metrics.enabled; we always do")
    if s.get("autoScalingSpec") is not None:
        a = s["autoScalingSpec"]
        if a.get("pollingInterval") == 0:  # HyperPod's CRD takes 0; ours refuses it: said, not changed unsaid
            warn("spec.autoScalingSpec.pollingInterval", "0 is read as 30 s (KEDA's default): a poll without a pause "
                                                         "has no meaning here (fleetserve's spec.autoscaling."
                                                         "pollingInterval)")
        spec["autoscaling"] = {
            "minReplicaCount": a.get("minReplicaCount", 1),
            "maxReplicaCount": a.get("maxReplicaCount", 5),
            "pollingInterval": a.get("pollingInterval") or 30,
            "cooldownPeriod": a.get("cooldownPeriod", 300),
            "initialCooldownPeriod": a.get("initialCooldownPeriod", 300),
            "scaleUpStabilizationTime": a.get("scaleUpStabilizationTime", 0),
            "scaleDownStabilizationTime": a.get("scaleDownStabilizationTime", 300),
            "triggers": _triggers(a, warn),
        }
    if s.get("kvCacheSpec") is not None and engine["kind"] == "container":
        warn("spec.kvCacheSpec", "HyperPod's tiers are LMCache inside vLLM: an image run as given keeps its own KV "
                                 "cache, so no L1 or L2 is wired to it")
        spec["kvCache"] = {"l1": {"enabled": False}}
    elif s.get("kvCacheSpec") is not None:
        kv = s["kvCacheSpec"]
        l2: dict[str, Any] = {"enabled": kv.get("enableL2Cache", False)}
        l2spec = kv.get("l2CacheSpec") or {}
        if l2["enabled"] and l2spec:
            backend = l2spec["l2CacheBackend"].lower()
            if backend == "tieredstorage":
                warn("spec.kvCacheSpec.l2CacheSpec.l2CacheBackend",
                     "'tieredstorage' is HyperPod-managed; fleetserve starts and uses its own Redis")
            elif l2spec.get("l2CacheLocalUrl"):
                url = l2spec["l2CacheLocalUrl"]
                l2["url"] = url if "://" in url else f"redis://{url}"
        l1: dict[str, Any] = {"enabled": kv.get("enableL1Cache", True)}
        ranks = max(int(engine.get("gpus") or 1), 1)
        if l1["enabled"] and engine["kind"] == "sglang" and ranks > 2:
            # SGLang's host cache is whole GB a rank: the 2 GiB default over 4 ranks was refused, naming
            # kvCacheSpec.l1.maxBytes, a field HyperPod does not have; HyperPod's spec states no size, so a GiB a rank
            l1["maxBytes"] = ranks << 30
        spec["kvCache"] = {"l1": l1, "l2": l2}
        if kv.get("cacheConfigFile") and engine["kind"] == "vllm":  # LMCache reads the file, not its environment
            engine["env"]["LMCACHE_CONFIG_FILE"] = kv["cacheConfigFile"]
            warn("spec.kvCacheSpec.cacheConfigFile", "LMCache reads this file (LMCACHE_CONFIG_FILE) instead of the "
                 "chunk size, CPU buffer and Redis URL that kvCacheSpec sets: the file's settings apply to the "
                 "server; the router, the simulator and the pod's memory request read kvCacheSpec's")
        elif kv.get("cacheConfigFile"):
            warn("spec.kvCacheSpec.cacheConfigFile", f"not read: LMCache config files are vLLM's; the "
                                                     f"{engine['kind']} engine uses kvCacheSpec's settings")
    else:
        # HyperPod offloads KV to CPU memory only when kvCacheSpec is given (its L1 default applies inside it);
        # our own default L1 turned on LMCache / SGLang's HiCache for a spec that asked for none
        spec["kvCache"] = {"l1": {"enabled": False}}
    routing = s.get("intelligentRoutingSpec") or {}
    lb = s.get("loadBalancer") or {}
    if routing.get("enabled"):
        strategy = routing.get("routingStrategy", "prefixaware")
        if routing.get("autoScalingSpec"):
            warn("spec.intelligentRoutingSpec.autoScalingSpec",
                 "the router is not autoscaled: one process locally, --router-replicas pods on Kubernetes")
        if lb.get("routingAlgorithm"):
            warn("spec.loadBalancer.routingAlgorithm", f"{lb['routingAlgorithm']!r} not used: intelligent routing "
                                                       f"is on, and the gateway routes by {strategy}")
    elif lb.get("routingAlgorithm") == "round_robin":
        strategy = "roundrobin"
    else:
        strategy = "leastload"  # the ALB's least_outstanding_requests
    if not routing.get("enabled") and routing.get("routingStrategy"):  # dropped without a word
        warn("spec.intelligentRoutingSpec.routingStrategy", f"{routing['routingStrategy']!r} not used: intelligent "
                                                            f"routing is off (enabled: false), and the gateway "
                                                            f"routes by {strategy}")
    spec["routing"] = {"strategy": strategy, "sessionKey": env.get("SESSION_KEY")}
    if s.get("tlsConfig") is not None:
        spec["tls"] = {"enabled": True}
        if s["tlsConfig"].get("tlsCertificateOutputS3Uri"):
            warn("spec.tlsConfig.tlsCertificateOutputS3Uri",
                 "the self-signed certificate is written locally (Kubernetes: the Secret NAME-tls), not to S3")
        if s["tlsConfig"].get("customCertificateConfig"):
            warn("spec.tlsConfig.customCertificateConfig", "ACM certificates are AWS-only; a self-signed one is used")
    for field, why in (
        ("endpointName", "no SageMaker endpoint is registered outside AWS"),
        ("tags", "SageMaker tags have no effect outside AWS"),
        ("InitialReplicaCount", "deprecated in HyperPod and without effect; use replicas"),
        ("dnsConfig", "Route 53 records are AWS-only"),
        ("dataCapture", "data capture to S3 is not supported"),
        ("pdSpec", "disaggregated prefill/decode is not supported; replicas serve both phases"),
    ):
        if s.get(field):
            warn(f"spec.{field}", why)
    if str(s.get("invocationEndpoint") or "invocations").strip("/") not in SERVED_INVOCATION_PATHS:
        served = ", ".join(f"/{p}" for p in SERVED_INVOCATION_PATHS)
        path = str(s["invocationEndpoint"]).strip("/")
        if _engine_kind(s["worker"]["image"]) == "container" and not path.startswith("v1/"):  # as `_engine` sets
            # invocationPath (the router's --invocation-path): it had read as if the path were dropped
            warn("spec.invocationEndpoint", f"{s['invocationEndpoint']!r}: clients call the gateway on {served} (not "
                                            f"this path), and the gateway sends their requests to the image on "
                                            f"/{path}")
        else:
            warn("spec.invocationEndpoint", f"{s['invocationEndpoint']!r}: the gateway serves {served}, not this "
                                            "path")
    return out


# where a field of our Endpoint came from in a HyperPod document (longest prefix first): an error found after the
# mapping names the user's field, not ours ("spec.placement.instanceTypes[0]" for a bad `instanceType`)
_SOURCES = (
    ("spec.autoscaling.triggers", "spec.autoScalingSpec.prometheusTrigger(List)"),
    ("spec.autoscaling", "spec.autoScalingSpec"),
    ("spec.placement.instanceTypes", "spec.instanceType(s)"),
    ("spec.placement.nodeAffinity", "spec.nodeAffinity"),
    ("spec.placement", "spec.instanceType(s)"),
    ("spec.requestLimits", "spec.worker.requestLimits"),
    ("spec.engine.port", "spec.worker.modelInvocationPort.containerPort"),
    ("spec.engine.args", "spec.worker.args"),
    ("spec.engine.envFrom", "spec.worker.environmentVariables"),  # the entries with valueFrom
    ("spec.engine.env", "spec.worker.environmentVariables"),
    ("spec.engine.image", "spec.worker.image"),
    ("spec.engine.resources", "spec.worker.resources"),
    ("spec.engine.kind", "spec.worker.image"),  # the engine is read from the image
    ("spec.engine.gpus", "spec.worker.resources"),
    ("spec.engine", "spec.worker"),
    ("spec.model.name", "spec.modelName"),
    ("spec.model.version", "spec.modelVersion"),
    ("spec.model.mountPath", "spec.worker.modelVolumeMount.mountPath"),
    ("spec.model", "spec.modelSourceConfig"),
    ("spec.kvCache.l2.url", "spec.kvCacheSpec.l2CacheSpec.l2CacheLocalUrl"),
    ("spec.kvCache.l1.maxBytes", "spec.kvCacheSpec.enableL1Cache"),  # HyperPod sizes no tier: the switch names it
    ("spec.kvCache.l1.enabled", "spec.kvCacheSpec.enableL1Cache"),
    ("spec.kvCache.l2.enabled", "spec.kvCacheSpec.enableL2Cache"),
    ("spec.kvCache", "spec.kvCacheSpec"),
    ("spec.routing.sessionKey", "spec.worker.environmentVariables[SESSION_KEY]"),
    ("spec.routing.strategy", "spec.intelligentRoutingSpec.routingStrategy"),  # "...Spec.strategy" named no field
    ("spec.routing", "spec.intelligentRoutingSpec"),
    ("spec.tls", "spec.tlsConfig"),
    ("spec.pod", "spec.kubernetes"),
    ("metadata.name", "metadata.name"),
)
_TRIGGER_FIELDS = {".target": ".targetValue", ".activationTarget": ".activationTargetValue"}


KUBERNETES_ONLY = "applies to Kubernetes rendering only"  # the start of effects' note on such a setting


def _steps(path: str) -> list[str]:
    """A HyperPod path's steps: `spec.a[0].b` is spec, a, [0], b."""
    return [p for p in re.split(r"\.|(\[\d+\])", path) if p]


def _in_crd(path: str) -> bool:
    """Whether a HyperPod path (`spec.a.b[0].c`) is a field of the CRD's schema."""
    node: Any = crd_schema()
    for step in _steps(path):
        if step.startswith("["):
            node = node.get("items") if isinstance(node, dict) else None
        else:
            node = (node.get("properties") or {}).get(step) if isinstance(node, dict) else None
        if node is None:
            return False
    return True


def _written(doc: dict, path: str) -> bool | None:
    """Whether the document has the field at a HyperPod path (`spec.a.b[0].c`): None when a step before the last
    is not there to look in, so nothing can be said."""
    node: Any = doc
    steps = _steps(path)
    for k, step in enumerate(steps):
        last = k == len(steps) - 1
        if step.startswith("["):
            i = int(step[1:-1])
            if not isinstance(node, list) or i >= len(node):
                return False if last else None
            node = node[i]
        else:
            if not isinstance(node, dict):
                return None
            if step not in node:
                return False if last else None
            node = node[step]
    return True


def _their_names(theirs: str, ours: str, doc: dict) -> str:
    """The combined names made exact by what the document has: `instanceType(s)` is the one written, and a
    trigger `prometheusTrigger(List)` the single trigger or the list's entry (when none was dropped, so the
    indexes agree)."""
    spec = doc.get("spec") if isinstance(doc.get("spec"), dict) else {}
    if theirs.startswith("spec.instanceType(s)"):
        tail = theirs[len("spec.instanceType(s)"):]
        if "instanceTypes" in spec:
            return "spec.instanceTypes" + tail
        if "instanceType" not in spec and "nodeAffinity" in spec and not tail:  # placement by node affinity alone:
            return "spec.nodeAffinity"  # a note on the whole placement had named an instanceType the file has not
        return "spec.instanceType" + re.sub(r"^\[\d+\]", "", tail)  # one type, not a list
    combined = "spec.autoScalingSpec.prometheusTrigger(List)"
    if theirs.startswith(combined):
        scaling = spec.get("autoScalingSpec") if isinstance(spec.get("autoScalingSpec"), dict) else {}
        listed = scaling.get("prometheusTriggerList")
        index = re.match(r"spec\.autoscaling\.triggers\[(\d+)\]", ours)
        if isinstance(listed, list) and index and len(listed) == len(_kept_triggers(listed)):
            return f"spec.autoScalingSpec.prometheusTriggerList[{index.group(1)}]" + theirs[len(combined):]
        if "prometheusTrigger" in scaling and not listed:
            return "spec.autoScalingSpec.prometheusTrigger" + theirs[len(combined):]
    return theirs


def _kept_triggers(listed: list) -> list:
    """The list's triggers the mapping keeps (query and targetValue given), as `_triggers` keeps them."""
    return [t for t in listed if isinstance(t, dict) and t.get("targetValue") is not None and t.get("query")]


def source_of(problem: SpecProblem, doc: dict | None = None) -> SpecProblem | None:
    """The problem named by the HyperPod field it came from, our path kept in the message. With the user's document
    `doc`, a combined name is made exact, and a note that a Kubernetes-only setting has no local effect is dropped
    (None) when the user did not write it: the mapping's own default (useCachedMetrics) was warned as theirs."""
    named = _source_of(problem)
    if doc is None or named.ours == "":
        return named
    theirs = _their_names(named.path, named.ours, doc)
    if named.message.startswith(KUBERNETES_ONLY) and _in_crd(theirs) and _written(doc, theirs) is False:
        return None  # a HyperPod field the user left out: the value is the mapping's default
    return SpecProblem(theirs, named.message, named.everywhere, named.ours)


def _source_of(problem: SpecProblem) -> SpecProblem:
    path, message = problem.path, problem.message
    if path == "spec" and ":" in message:  # a rule over several fields: "engine.args: ..." names one
        head, rest = message.split(":", 1)
        if not head.startswith(("spec.", " ")) and "." in head:
            path, message = f"spec.{head}", rest.strip()
    for ours, theirs in _SOURCES:
        if path == ours or path.startswith((ours + ".", ours + "[")):
            tail = path[len(ours):]
            if ours == "spec.autoscaling.triggers":
                tail = tail.split("]", 1)[-1] if "]" in tail else tail
                tail = _TRIGGER_FIELDS.get(tail, tail)
            return SpecProblem(theirs + tail, f"{message} (fleetserve's {path})", problem.everywhere, path)
    return problem


def without_nulls(value: Any) -> Any:
    """The document as the Kubernetes API server stores it: a null field of a non-nullable schema (the shipped
    CRD marks none nullable) is pruned before validation, so `modelVersion:` left empty, as `hyp`'s template
    writes it, is accepted there and was refused here."""
    if isinstance(value, dict):
        return {k: without_nulls(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [without_nulls(v) for v in value]
    return value


def parse(data: dict[str, Any]) -> tuple[dict[str, Any], list[SpecProblem]]:
    """Validate a HyperPod document against the shipped CRD (its version's schema) and the SDK's rules; return our
    Endpoint as a dict and the warnings of the mapping (v1alpha1's fields are v1's: one mapping reads both)."""
    data = without_nulls(data)
    problems = schema_problems(data)
    if not problems:
        problems = _sdk_problems(data["spec"])
    if problems:
        raise SpecError(problems) from None
    notes: list[SpecProblem] = []
    mapped = to_endpoint_dict(data, lambda path, msg, everywhere=False: notes.append(SpecProblem(path, msg,
                                                                                                everywhere)))
    return mapped, notes
