"""fleetserve's own endpoint spec (`apiVersion: fleetserve.io/v1`, `kind: Endpoint`).

One declarative document describes a served model: where the weights come from, which engine runs them, how
many replicas, where they are placed, how they scale, the KV cache tiers, routing, limits, metrics, TLS and
auth. Every component reads its section from here; nothing else carries configuration.
"""

from __future__ import annotations

import ipaddress
import math
import re
from typing import Annotated, Any, Literal

from pydantic import AliasChoices, BeforeValidator, Field, WithJsonSchema, field_validator, model_validator

from fleetserve.api.internal import HEADER_TEXT, NO_TENANT
from fleetserve.capacity.catalog import Catalog
from fleetserve.spec.base import SpecModel, TakesQuantity
from fleetserve.spec.kubernetes_schema import schema_problem

API_VERSION = "fleetserve.io/v1"
KIND = "Endpoint"

#: HyperPod's four strategy names plus leastload; the router registry says which ones it implements.
ROUTING_STRATEGIES = ("prefixaware", "kvaware", "session", "roundrobin", "leastload")
ENGINE_KINDS = ("builtin", "vllm", "sglang", "container", "external")
SOURCE_SCHEMES = ("local path", "s3://bucket/prefix", "hf:org/name", "builtin:NAME", "catalog:NAME")

_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_ENV_NAME = re.compile(r"^[-._a-zA-Z][-._a-zA-Z0-9]*$")
# Kubernetes' quantity grammar, no negative ones for resources: a decimal number and a binary-SI, decimal-SI
# or exponent suffix
_QUANTITY = re.compile(r"^\+?(\d+\.?\d*|\.\d+)(Ki|Mi|Gi|Ti|Pi|Ei|m|k|M|G|T|P|E|[eE][+-]?\d+)?$")
RESOURCE_SECTIONS = ("limits", "requests")


def _byte_count(value: object) -> object:
    """A byte count as a number or a Kubernetes quantity (`4Gi`, `512Mi`, `2G`): the memory fields of the pods it
    sizes are written so, and `maxBytes: 4Gi` had been refused as no integer."""
    if not isinstance(value, str):
        return value
    from fleetserve.capacity.placement import quantity

    text = value.strip()
    if not _QUANTITY.match(text):
        raise ValueError(f"expected a number of bytes or a Kubernetes quantity (4Gi, 512Mi, 2G), got {value[:40]!r}")
    amount = quantity(text)
    if not math.isfinite(amount):  # '1e400': int() of it had been an OverflowError, a traceback in validate
        raise ValueError(f"{value[:40]!r} is too large to be a number of bytes")
    if amount != int(amount):
        raise ValueError(f"{value!r} is {amount:g} bytes: not a whole number of bytes")
    return int(amount)


# the most a Kubernetes quantity, Redis' maxmemory or a log size takes: a signed 64-bit integer
MAX_BYTES = 2**63 - 1
# bytes as a number or a quantity string; the CRD takes either (x-kubernetes-int-or-string)
Bytes = Annotated[int, TakesQuantity(), BeforeValidator(_byte_count), Field(le=MAX_BYTES),
                  WithJsonSchema({"x-kubernetes-int-or-string": True})]
_LABEL_NAME = re.compile(r"(?=.{1,63}\Z)[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?\Z")  # \Z: no newline at the end
_DNS_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*\Z")


def is_dns_label(value: str) -> bool:
    """A namespace's or a Service's name as Kubernetes takes it."""
    return len(value) <= 63 and bool(_DNS_LABEL.fullmatch(value))


def is_dns_subdomain(value: str) -> bool:
    """Most objects' names (a service account, a claim, a NodeClass) as Kubernetes takes them."""
    return len(value) <= 253 and bool(_DNS_SUBDOMAIN.match(value))


def is_label_value(value: str) -> bool:
    """A non-empty label value (a zone) as Kubernetes takes it: the grammar of a label key's name part."""
    return bool(_LABEL_NAME.match(value))


def is_label_key(key: str) -> bool:
    """A label key (a taint's key too): an optional DNS-subdomain prefix and '/', then a name."""
    prefix, slash, name = key.rpartition("/")
    return bool(_LABEL_NAME.match(name)) and (not slash or (len(prefix) <= 253 and bool(_DNS_SUBDOMAIN.match(prefix))))


# a container image reference as the container runtimes read it: [registry[:port]/]path[:tag][@digest], the path in
# lower case (distribution's reference grammar, simplified: `UPPER:tag`, `foo::bar` and `Bad Image` rendered)
_PATH_PART = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
_IMAGE = re.compile(rf"(?:[A-Za-z0-9.-]+(?::[0-9]+)?/)?{_PATH_PART}(?:/{_PATH_PART})*"
                    r"(?::[A-Za-z0-9_][A-Za-z0-9_.-]{0,127})?(?:@[A-Za-z][A-Za-z0-9]*(?:[-_+.][A-Za-z][A-Za-z0-9]*)*:[0-9a-fA-F]{32,})?\Z")
IMAGE_RULE = ("[registry[:port]/]path[:tag][@digest], the path in lower-case letters, digits and separators "
              "(e.g. ghcr.io/org/fleetserve:1.0)")


def is_image_reference(value: str) -> bool:
    return len(value) <= 4096 and bool(_IMAGE.match(value))


LABEL_KEY_RULE = ("an optional DNS-subdomain prefix and '/', then at most 63 of letters, digits, '-', '_' and '.', "
                  "starting and ending with a letter or digit")
LABEL_VALUE_RULE = "at most 63 of letters, digits, '-', '_' and '.', starting and ending with a letter or digit"


# the API server's limit on an object's annotations together (256 KiB), less room for those fleetserve adds to the
# engine Deployment and its pods (metrics path, model source and version): a spec at the limit rendered objects
# over it
ANNOTATIONS_MAX_BYTES = 256 * 1024 - 8 * 1024


class Metadata(SpecModel):
    name: str = Field(min_length=1, max_length=63)
    namespace: str = Field(default="default", min_length=1, max_length=63)
    labels: dict[str, str] = Field(default_factory=dict)
    annotations: dict[str, str] = Field(default_factory=dict, description="Kubernetes annotations of the engine "
                                        "Deployments and their pods")

    @field_validator("name", "namespace")
    @classmethod
    def _dns_label(cls, value: str) -> str:
        if not _DNS_LABEL.match(value):
            raise ValueError(
                f"{value!r} is not a DNS label: use lower-case letters, digits and '-', starting and ending "
                "with a letter or digit"
            )
        return value

    @field_validator("annotations")
    @classmethod
    def _annotation_keys(cls, value: dict[str, str]) -> dict[str, str]:
        """The engine pods carry them: a key the API server refuses (`bad key!`) failed the Deployment."""
        for key in value:
            if not is_label_key(key):
                raise ValueError(f"annotation key {key!r} is not a Kubernetes annotation key: {LABEL_KEY_RULE}")
        size = sum(len(k.encode()) + len(v.encode()) for k, v in value.items())
        if size > ANNOTATIONS_MAX_BYTES:  # the API server's limit on an object's annotations together
            raise ValueError(f"{size:,} bytes of keys and values together; at most {ANNOTATIONS_MAX_BYTES:,} (the "
                             "256 KiB Kubernetes takes on an object, less 8 KiB for fleetserve's own annotations)")
        return value

    @field_validator("labels")
    @classmethod
    def _kubernetes_labels(cls, value: dict[str, str]) -> dict[str, str]:
        """Every rendered object carries these: one the API server refuses failed the whole `kubectl apply`."""
        for key, text in value.items():
            if not is_label_key(key):
                raise ValueError(f"label key {key!r} is not a Kubernetes label key: {LABEL_KEY_RULE}")
            if not isinstance(text, str) or (text and not _LABEL_NAME.match(text)):
                raise ValueError(f"label {key!r}: value {text!r} is not a Kubernetes label value: empty, or "
                                 f"{LABEL_VALUE_RULE}")
        return value

    @field_validator("name")
    @classmethod
    def _service_name(cls, value: str) -> str:
        if value[0].isdigit():  # Services take an RFC 1035 label: the API server refuses `1chat-router`
            raise ValueError(f"{value!r} starts with a digit; it names Kubernetes Services "
                             f"(NAME-router, NAME-engine), which must start with a letter (e.g. 'ep-{value}')")
        return value


class SecretKeyRef(SpecModel):
    name: str = Field(min_length=1)
    key: str = Field(min_length=1)


PROBE_NAMES = ("startupProbe", "readinessProbe", "livenessProbe")


class ModelSection(SpecModel):
    """The model to serve and where its weights live."""

    source: str = Field(min_length=1, description="local path, s3://, hf:, builtin: or catalog: source")
    name: str | None = Field(default=None, description="served model name (default: metadata.name)")
    version: str = "1"
    revision: str | None = None
    context_length: int | None = Field(default=None, gt=0)
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = "auto"
    prefetch: bool = False
    s3_region: str | None = None
    mount_path: str | None = Field(default=None, pattern=r"^/", description="where the engine container sees the "
                                   "model volume on Kubernetes (default /models)")
    volume: dict[str, Any] | None = Field(default=None, description="a Kubernetes volume source "
                                          "(persistentVolumeClaim, nfs, csi, hostPath, ...) holding a local-path "
                                          "model; default: the PVC NAME-model")
    token_secret: SecretKeyRef | None = Field(default=None, description="a Secret key holding the Hugging Face token, "
                                              "given to the model fetcher as HF_TOKEN on Kubernetes")

    @field_validator("name")
    @classmethod
    def _served_name(cls, value: str | None) -> str | None:
        """The name clients send as `model`: "" had become metadata.name unsaid, and " " was served as is."""
        if value is not None and (not value.strip() or value != value.strip() or len(value) > 256):
            raise ValueError(f"{value!r}: the served model name clients send as `model`: not empty, no leading or "
                             "trailing spaces, at most 256 characters (or leave it out: metadata.name)")
        return value

    @field_validator("volume")
    @classmethod
    def _volume_source(cls, value: dict[str, Any] | None) -> dict[str, Any] | None:
        """Rendered as the pod's `model` volume, as given: `{bogus: 1}` went into the Deployment."""
        if value is not None and (problem := schema_problem("Volume", {**value, "name": "model"})) is not None:
            raise ValueError(problem)
        return value

    @field_validator("source")
    @classmethod
    def _known_scheme(cls, value: str) -> str:
        if "://" in value and not value.startswith("s3://"):
            raise ValueError(f"unsupported source {value!r}; allowed: {', '.join(SOURCE_SCHEMES)}")
        if value.startswith("s3://") and len(value) <= len("s3://"):
            raise ValueError("s3 source needs a bucket: s3://bucket/prefix")
        for prefix in ("hf:", "builtin:", "catalog:"):
            if value.startswith(prefix) and len(value) == len(prefix):
                raise ValueError(f"source {value!r} names nothing after {prefix!r}")
        if value.startswith("catalog:"):
            from fleetserve.engine.catalog import CATALOG

            if value.removeprefix("catalog:") not in CATALOG:
                raise ValueError(f"unknown catalog model {value.removeprefix('catalog:')!r}; allowed: "
                                 f"{', '.join(sorted(CATALOG))} (fleetserve models list)")
        if value.startswith("builtin:"):  # found only when `up` started, and never by render k8s
            from fleetserve.engine.demo import DEMO_NAME

            if value.removeprefix("builtin:") != DEMO_NAME:
                raise ValueError(f"unknown builtin model {value.removeprefix('builtin:')!r}; allowed: {DEMO_NAME}")
        if value.startswith("hf:") and not HF_REPO.fullmatch(value.removeprefix("hf:")):
            raise ValueError(f"{value!r}: expected hf:ORG/NAME (a Hugging Face repository id; the revision goes in "
                             "model.revision)")
        return value


# a Hugging Face repository id: an optional owner, a name; letters, digits, - _ . (as huggingface_hub checks)
HF_REPO = re.compile(r"(?:[A-Za-z0-9][\w.-]{0,95}/)?[A-Za-z0-9][\w.-]{0,95}")
GPU_RESOURCE = "nvidia.com/gpu"
MIG_RESOURCE_PREFIX = "nvidia.com/mig-"  # a MIG slice of a GPU (nvidia.com/mig-3g.20gb), as the GPU operator names it


def mig_slices(resources: dict | None) -> list[str]:
    """The MIG slice resources a container's ResourceRequirements name (HyperPod's MIG deployments), sorted."""
    return sorted({name for amounts in (resources or {}).values() if isinstance(amounts, dict)
                   for name in amounts if str(name).startswith(MIG_RESOURCE_PREFIX)})
# flags of vLLM and SGLang that the adapters set (engine/adapters.py), with where to say what they say
# (a key of the user's own, --api-key, stays a warning of render: spec/effects names the 401s it brings)
_TENSOR = "use engine.gpus: fleetserve runs tensor parallelism over the replica's GPUs"
_PIPELINE = ("pipeline parallelism is not supported: fleetserve runs tensor parallelism over engine.gpus (a pod "
             "with tensor x pipeline GPUs it never asked for would not start)")
SHELLS = frozenset({"sh", "bash", "dash", "zsh", "ash", "ksh"})


def shell_script_at(command: list[str]) -> int | None:
    """Where a shell's `-c` (also `-lc`, `-ec`, ...) stands in `command`, or None when it is no shell running a
    script: after `bash -c` the next word is a script, and flags given after it are $0, $1, ... of it."""
    if not command or str(command[0]).rsplit("/", 1)[-1] not in SHELLS:
        return None
    for i, word in enumerate(command[1:], 1):
        if re.fullmatch(r"-[a-z]*c[a-z]*", str(word)):
            return i
    return None


OWNED_ENGINE_FLAGS = {"--port": "use engine.port", "--host": "the engine listens on every interface of its pod",
                      "--model": "use model.source", "--model-path": "use model.source",
                      "--pipeline-parallel-size": _PIPELINE, "-pp": _PIPELINE, "--pp-size": _PIPELINE,
                      "--pp": _PIPELINE}
# flags the adapters also set, allowed only with the value they set: a size of the args' own left GPUs idle or
# asked for more than the pod has; another served name was a 404 for every request (router and metrics use ours)
TENSOR_FLAGS = ("--tensor-parallel-size", "-tp", "--tp-size", "--tp")
SERVED_NAME_FLAG = "--served-model-name"
DTYPE_ALIASES = {"half": "float16", "float": "float32"}  # vLLM's and SGLang's other names for model.dtype's


def _check_requests_within_limits(resources: dict[str, Any]) -> None:
    """What the API server refuses: a request above its limit, and an extended resource (a name with a `/`, such
    as nvidia.com/gpu) requested without an equal limit (they cannot be overcommitted)."""
    from fleetserve.capacity.placement import quantity

    requests, limits = resources.get("requests") or {}, resources.get("limits") or {}
    for name, asked in requests.items():
        cap = limits.get(name)
        if "/" in name and (cap is None or quantity(cap) != quantity(asked)):
            raise ValueError(f"requests.{name} ({asked}) needs limits.{name} of the same amount: extended resources "
                             "cannot be overcommitted")
        if cap is not None and quantity(asked) > quantity(cap):
            raise ValueError(f"requests.{name} ({asked}) is above limits.{name} ({cap})")


def invocation_path_problem(path: str) -> str | None:
    """Why `path` cannot be a server's generation path (engine.invocationPath, router --invocation-path), or None."""
    if not re.fullmatch(r"/[A-Za-z0-9._~\-/]*", path):
        return (f"{path!r} must be an absolute URL path of letters, digits and . _ ~ - / (such as /invocations), "
                "with no query")
    return None


class EngineSection(SpecModel):
    """Which server runs the model on each replica."""

    kind: Literal["builtin", "vllm", "sglang", "container", "external"] = "builtin"
    urls: list[str] = Field(default_factory=list, description="backends for kind=external")
    image: str | None = None

    @field_validator("image")
    @classmethod
    def _image_reference(cls, value: str | None) -> str | None:
        if value is not None and not is_image_reference(value):
            raise ValueError(f"{value!r} is not an image reference: {IMAGE_RULE}")
        return value

    invocation_path: str | None = Field(default=None, description="container, external: the path the server "
                                        "serves chat and completions on when not OpenAI's (a SageMaker-style "
                                        "image's /invocations, which reads the body's shape)")
    args: list[str] = Field(default_factory=list)
    env: dict[str, str] = Field(default_factory=dict)
    port: int | None = Field(default=None, ge=1, le=65535)
    health_path: str = "/health"
    threads: int | None = Field(default=None, ge=1, le=1024, description="torch threads per builtin replica (at "
                                "most 1024: 100,000 could not start and took the process down)")
    startup_timeout_seconds: float = Field(default=600.0, gt=0, le=86400)
    drain_timeout_seconds: float = Field(default=120.0, gt=0, le=86400, description="how long a replica that "
                                         "scale-down, consolidation or a rollout stops may finish its in-flight "
                                         "requests; streams still running then are cut (Kubernetes: the "
                                         "engine pod's terminationGracePeriodSeconds, after its preStop)")
    gpus: int = Field(default=0, ge=0, le=64, description="GPUs per replica (no node has more than 64)")
    command: list[str] = Field(default_factory=list, description="container entrypoint override (Kubernetes)")
    working_dir: str | None = Field(default=None, description="container working directory (Kubernetes)")
    probes: dict[str, dict[str, Any]] | None = Field(default=None, description="Kubernetes Probe objects by name "
                                                     "(startupProbe, readinessProbe, livenessProbe) replacing ours")
    resources: dict[str, Any] | None = Field(default=None, description="Kubernetes ResourceRequirements (cpu, "
                                             "memory, ...); GPUs come from engine.gpus")
    env_from: dict[str, dict[str, Any]] = Field(default_factory=dict, description="environment variables from a "
                                                "Kubernetes EnvVarSource (secretKeyRef, configMapKeyRef, fieldRef)")

    @field_validator("env", "env_from")
    @classmethod
    def _env_names(cls, value: dict) -> dict:
        """The API server refuses an environment variable name outside its rule (a C-like identifier, '-' and '.'
        allowed): `1BAD=` or an empty name rendered, and the whole `kubectl apply` of the Deployment failed."""
        for name in value:
            if not _ENV_NAME.match(name):
                raise ValueError(f"{name!r} is not an environment variable name: letters, digits, '_', '-' and '.', "
                                 "not starting with a digit")
        return value

    @field_validator("env_from")
    @classmethod
    def _env_sources(cls, value: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
        """Each rendered as the variable's valueFrom, as given: `{y: 1}` went into the Deployment."""
        for name, source in value.items():
            if (problem := schema_problem("EnvVarSource", source)) is not None:
                raise ValueError(f"{name!r}: {problem}")
        return value

    @field_validator("resources")
    @classmethod
    def _resource_quantities(cls, value: dict[str, Any] | None) -> dict[str, Any] | None:
        """The API server refuses a Deployment with `memory: 30GB` or `cpu: two`; say so at validate time."""
        for section, amounts in (value or {}).items():
            if section == "claims":  # a container's claim names one of the pod's resourceClaims, which the
                # spec does not carry: the API server refused the Deployment (or a cluster without DRA dropped it)
                raise ValueError("claims: a container's resource claim needs the pod's spec.resourceClaims, which "
                                 "fleetserve does not render; leave claims out (GPUs: engine.gpus)")
            if section not in RESOURCE_SECTIONS:
                raise ValueError(f"{section}: unknown field; allowed: {', '.join(RESOURCE_SECTIONS)}")
            if not isinstance(amounts, dict):
                raise ValueError(f"{section} must map resource names to quantities (memory: 30Gi)")
            for name, amount in amounts.items():
                if isinstance(amount, bool) or not _QUANTITY.match(str(amount)):
                    raise ValueError(f"{section}.{name}: {amount!r} is not a Kubernetes quantity (e.g. "
                                     "500m, 4, 30Gi, 32G, 1e9; binary suffixes Ki Mi Gi Ti Pi Ei, decimal k M G T P "
                                     "E)")
        _check_requests_within_limits(value or {})
        return value

    @field_validator("probes")
    @classmethod
    def _probe_names(cls, value: dict[str, dict[str, Any]] | None) -> dict[str, dict[str, Any]] | None:
        for name in value or {}:
            if name not in PROBE_NAMES:
                raise ValueError(f"unknown probe {name!r}; allowed: {', '.join(PROBE_NAMES)}")
        return value

    @model_validator(mode="after")
    def _no_flags_we_set(self) -> EngineSection:
        """vLLM and SGLang take the last of a repeated flag: a --port in args after ours moved the server away from
        the port the container, probes and Service use (the pod never became ready)."""
        if self.kind not in ("vllm", "sglang"):
            return self
        for arg in self.args:
            flag = str(arg).split("=", 1)[0]
            if flag in OWNED_ENGINE_FLAGS:
                raise ValueError(f"engine.args: sets {flag}, which fleetserve sets itself: "
                                 f"{OWNED_ENGINE_FLAGS[flag]}")
        from fleetserve.spec.context import flag_in_args

        for flag in TENSOR_FLAGS:
            found = flag_in_args(self.args, flag)
            if found and found[1] != str(max(self.gpus, 1)):
                raise ValueError(f"engine.args: sets {flag} {found[1]}, but the replica has engine.gpus "
                                 f"({self.gpus}) and fleetserve runs tensor parallelism over them: use engine.gpus")
        return self

    @model_validator(mode="after")
    def _no_shell_script(self) -> EngineSection:
        """`bash -c SCRIPT`: the flags the adapter gives vLLM or SGLang (served name, port, prefix caching, tensor
        parallelism over engine.gpus) landed after the script as its $0, $1, ..., or replaced it, and the pod
        crash-looped or served under another name without a word."""
        if self.kind in ("vllm", "sglang") and shell_script_at(self.command) is not None:
            raise ValueError(f"engine.command: {' '.join(self.command[:2])!r} runs a shell script, which cannot be "
                             f"given the flags fleetserve runs {self.kind} with (the served model name, the port, "
                             "prefix caching, tensor parallelism over engine.gpus): use the engine's own command "
                             "(vllm serve, python3 -m vllm.entrypoints.openai.api_server, python3 -m "
                             "sglang.launch_server) with its extra flags in engine.args, or leave engine.command out "
                             "(the image's entrypoint); set-up steps belong in the image")
        return self

    @model_validator(mode="after")
    def _gpus_agree(self) -> EngineSection:
        """GPUs come from engine.gpus; a different count in resources was overridden without a word."""
        for section, amounts in (self.resources or {}).items():
            asked = amounts.get(GPU_RESOURCE) if isinstance(amounts, dict) else None
            if asked is not None and self.gpus and str(asked) != str(self.gpus):
                raise ValueError(f"engine.resources.{section}.{GPU_RESOURCE} ({asked}) disagrees with engine.gpus "
                                 f"({self.gpus}); GPUs come from engine.gpus: drop it from resources or make them "
                                 "equal")
        return self

    @model_validator(mode="after")
    def _container_runs_its_image(self) -> EngineSection:
        """kind container runs an OpenAI-compatible server image as given (TGI, DJL-LMI, one's own): the image is
        the server, so it must be named; the invocation path is where it serves generation."""
        if self.kind == "container" and not self.image:
            raise ValueError("engine.image: required with engine.kind 'container', which runs the image as given "
                             "(an OpenAI-compatible server: TGI, DJL-LMI, one's own)")
        if self.invocation_path is not None:
            if self.kind not in ("container", "external"):
                raise ValueError(f"engine.invocationPath: for engine.kind 'container' or 'external' (servers "
                                 f"that may not serve the OpenAI paths), not {self.kind!r}")
            problem = invocation_path_problem(self.invocation_path)
            if problem:
                raise ValueError(f"engine.invocationPath: {problem}")
        return self

    @model_validator(mode="after")
    def _external_needs_urls(self) -> EngineSection:
        if self.kind == "external" and not self.urls:
            raise ValueError("engine.urls: required with engine.kind 'external' (one URL per backend)")
        if self.kind != "external" and self.urls:
            raise ValueError(f"engine.urls: only for engine.kind 'external', not {self.kind!r}")
        from fleetserve.router.upstream import backend_url_problem

        for url in self.urls:  # the router's own check: a URL it refuses crash-looped the router pod
            if (problem := backend_url_problem(url)) is not None:
                raise ValueError(f"engine.urls: entry {problem}")
        if not self.health_path.startswith("/"):
            raise ValueError(f"engine.healthPath: {self.health_path!r} must be a path starting with /")
        return self


NODE_OPERATORS = ("In", "NotIn", "Exists", "DoesNotExist", "Gt", "Lt")


KARPENTER_KEYS_ALLOWED = ("karpenter.sh/capacity-type",)  # the only karpenter.sh/ key a NodePool may require


def _check_term(term: Any, where: str, required: bool = False) -> None:
    """A Kubernetes NodeSelectorTerm: {matchExpressions: [{key, operator, values}]}, with the values each operator
    takes (the API server's rules); a `required` one also as the NodePools it is copied into take it."""
    if not isinstance(term, dict):
        raise ValueError(f"{where} must be an object with matchExpressions")
    exprs = term.get("matchExpressions") or []
    if not isinstance(exprs, list):
        raise ValueError(f"{where}.matchExpressions must be a list")
    for j, expr in enumerate(exprs):
        at = f"{where}.matchExpressions[{j}]"
        if not isinstance(expr, dict) or not isinstance(expr.get("key"), str):
            raise ValueError(f"{at} must be an object with a key, an operator and values")
        if expr.get("operator", "In") not in NODE_OPERATORS:
            raise ValueError(f"{at}.operator {expr.get('operator')!r}; allowed: {', '.join(NODE_OPERATORS)}")
        values = expr.get("values", [])
        if not isinstance(values, list) or not all(isinstance(v, str) for v in values):
            raise ValueError(f"{at}.values must be a list of strings")
        operator = expr.get("operator", "In")
        if operator in ("In", "NotIn") and not values:
            raise ValueError(f"{at}.values: {operator} needs at least one value")
        if operator in ("Exists", "DoesNotExist") and values:
            raise ValueError(f"{at}.values: {operator} takes no values")
        if operator in ("Gt", "Lt") and (len(values) != 1 or not re.fullmatch(r"-?[0-9]{1,18}", values[0])):
            raise ValueError(f"{at}.values: {operator} takes exactly one whole number, got {values!r}")
        key = expr["key"]
        # Karpenter's rule is on the domain (the text before the first "/"): node.karpenter.sh/x is refused too
        if required and key.split("/", 1)[0].endswith("karpenter.sh") and key not in KARPENTER_KEYS_ALLOWED:
            raise ValueError(f"{at}.key {key!r}: Karpenter refuses it in the NodePools fleetserve makes for the "
                             "endpoint (and pods held to another NodePool never get a node of theirs); choose nodes "
                             "with placement.instanceTypes, capacityTypes or node labels")


def _check_node_affinity(affinity: dict) -> None:
    """The shape Kubernetes' NodeAffinity has, checked here: render and placement read it as such (a string where
    an object belongs was a traceback in `render k8s` after `validate` passed it)."""
    required = affinity.get("requiredDuringSchedulingIgnoredDuringExecution")
    if required is not None:
        where = "nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution"
        if not isinstance(required, dict) or not isinstance(required.get("nodeSelectorTerms", []), list):
            raise ValueError(f"{where} must be an object with a nodeSelectorTerms list")
        for i, term in enumerate(required.get("nodeSelectorTerms", [])):
            _check_term(term, f"{where}.nodeSelectorTerms[{i}]", required=True)
    preferred = affinity.get("preferredDuringSchedulingIgnoredDuringExecution")
    if preferred is not None:
        where = "nodeAffinity.preferredDuringSchedulingIgnoredDuringExecution"
        if not isinstance(preferred, list):
            raise ValueError(f"{where} must be a list of {{weight, preference}}")
        for i, pref in enumerate(preferred):
            weight = pref.get("weight") if isinstance(pref, dict) else None
            if not isinstance(weight, int) or isinstance(weight, bool) or not 1 <= weight <= 100:
                raise ValueError(f"{where}[{i}].weight must be a whole number from 1 to 100")
            _check_term(pref.get("preference") or {}, f"{where}[{i}].preference")


_INSTANCE_TYPE = re.compile(r"^[a-z0-9]([a-z0-9.-]{0,61}[a-z0-9])?$")


class PlacementSection(SpecModel):
    """Where replicas may run: an instance-type priority list or Kubernetes node affinity."""

    instance_types: list[str] = Field(default_factory=list)
    node_affinity: dict[str, Any] | None = None

    @model_validator(mode="after")
    def _exclusive(self) -> PlacementSection:
        if self.instance_types and self.node_affinity:
            raise ValueError("placement.instanceTypes and placement.nodeAffinity are mutually exclusive")
        seen: dict[str, int] = {}
        for i, name in enumerate(self.instance_types):  # ml.g5.xlarge is g5.xlarge: two tiers of one EC2 type
            j = seen.setdefault(Catalog.canonical(name), i)
            if j != i:
                same = "" if self.instance_types[j] == name else f" (as {self.instance_types[j]!r}: SageMaker's ml. " \
                                                                 "names the same EC2 type)"
                raise ValueError(f"placement.instanceTypes lists a type twice: [{j}] and [{i}] {name!r}{same}")
        for i, name in enumerate(self.instance_types):  # a label value Karpenter matches: `In [""]` never did
            if not _INSTANCE_TYPE.match(name):
                raise ValueError(f"placement.instanceTypes[{i}]: {name!r} is not an instance type name: lower-case "
                                 "letters, digits, '.' and '-', as EC2 names them (g5.xlarge, or ml.g5.xlarge)")
        if self.node_affinity:
            _check_node_affinity(self.node_affinity)
        return self


class ScalingTrigger(SpecModel):
    """One KEDA-style trigger: a metric, its per-replica target and the 0<->1 activation threshold."""

    metric: Literal["concurrency", "queue_depth", "request_rate", "ttft_p95", "prometheus"]
    # KEDA hands a threshold to the HPA in thousandths (a milli-quantity of an int64): 1e-9 became 0, which the HPA
    # refuses, and 1e300 rendered a 300-digit threshold
    target: float = Field(ge=0.001, le=1e12, description="per replica (AverageValue) or for the fleet (Value); "
                          "0.001 to 1e12, as KEDA passes it to the HPA in thousandths")
    activation_target: float = Field(default=0.0, ge=0, le=1e12)
    query: str | None = None
    server_address: str | None = None
    metric_type: Literal["AverageValue", "Value"] | None = Field(
        default=None, description="KEDA metricType; default AverageValue for totals, Value for ttft_p95")
    use_cached_metrics: bool = Field(default=False, description="KEDA: cache the value for the polling interval")
    custom_headers: str | None = Field(default=None, description="KEDA prometheus customHeaders (k=v,k2=v2)")
    namespace: str | None = Field(default=None, pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,252}$",
                                  description="KEDA prometheus namespace: sent with each query for namespaced "
                                              "queries (Thanos' querier tenancy)")

    @field_validator("server_address")
    @classmethod
    def _server_is_a_url(cls, value: str | None) -> str | None:
        """KEDA and the local autoscaler read Prometheus at this address: `not a url` rendered with exit 0 and
        failed every poll at run time."""
        if value is None:
            return value
        from urllib.parse import urlsplit

        try:
            parts = urlsplit(value)
            parts.port  # noqa: B018  (ValueError: a port that is no number)
        except ValueError as exc:
            raise ValueError(f"{value!r}: {exc}") from None
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"{value!r}: a Prometheus URL, http(s)://host[:port][/path]")
        return value

    @field_validator("query")
    @classmethod
    def _query_brackets_close(cls, value: str | None) -> str | None:
        """A query whose brackets or quotes do not close (`sum(foo`) rendered and failed at every KEDA poll; the
        whole of PromQL is checked by Prometheus, this much here."""
        if value is None:
            return value
        depth: list[str] = []
        quote, escaped = None, False
        for ch in value:
            if quote:
                if escaped:
                    escaped = False
                elif ch == "\\" and quote != "`":
                    escaped = True
                elif ch == quote:
                    quote = None
            elif ch in "\"'`":
                quote = ch
            elif ch in "([{":
                depth.append({"(": ")", "[": "]", "{": "}"}[ch])
            elif ch in ")]}":
                if not depth or depth.pop() != ch:
                    raise ValueError(f"{value!r}: {ch!r} closes nothing")
        if quote or depth:
            raise ValueError(f"{value!r}: {'a quote' if quote else 'a bracket'} is never closed"
                             + ("" if quote else f" (a {depth[-1]!r} is missing)"))
        return value

    @model_validator(mode="after")
    def _prometheus_needs_query(self) -> ScalingTrigger:
        if self.metric == "prometheus" and not self.query:
            raise ValueError("a prometheus trigger needs a query (serverAddress: default the fleet's Prometheus)")
        if self.metric != "prometheus":
            given = [name for name, value in (("query", self.query), ("serverAddress", self.server_address),
                                              ("customHeaders", self.custom_headers),
                                              ("namespace", self.namespace)) if value]
            if given:  # the built-in metrics read the router's own gauges: these were ignored without a word
                raise ValueError(f"{', '.join(given)} apply to metric 'prometheus' only; a {self.metric!r} trigger "
                                 "reads the router's own gauge (use metric: prometheus for a query of yours)")
        return self


class ScheduleFloor(SpecModel):
    """A time-of-day floor: between `start` and `end` (cron, in `timezone`) keep at least `minReplicas`."""

    name: str
    timezone: str = "UTC"
    start: str
    end: str
    min_replicas: int = Field(ge=0)


class ScalingFallback(SpecModel):
    failure_threshold: int = Field(default=3, ge=1)
    replicas: int = Field(default=1, ge=0)


KEDA_INT32 = 2_147_483_647


class AutoscalingSection(SpecModel):
    """KEDA ScaledObject semantics, with KEDA's and HyperPod's defaults."""

    enabled: bool = True
    min_replica_count: int = Field(default=1, ge=0, le=256)
    max_replica_count: int = Field(default=5, ge=0, le=256, description="at most 256, as spec.replicas")
    # KEDA's ScaledObject holds them as int32 seconds: 1e12 rendered an object KEDA cannot decode
    polling_interval: float = Field(default=30, gt=0, le=KEDA_INT32)
    cooldown_period: float = Field(default=300, ge=0, le=KEDA_INT32)
    initial_cooldown_period: float = Field(default=300, ge=0, le=KEDA_INT32)
    # at most an hour: the HorizontalPodAutoscaler KEDA makes refuses a longer window (the ScaledObject never got
    # Ready), and the local controller and the simulator keep the same bound
    scale_up_stabilization_time: float = Field(default=0, ge=0, le=3600)
    scale_down_stabilization_time: float = Field(default=300, ge=0, le=3600)
    triggers: list[ScalingTrigger] = Field(default_factory=list)
    schedules: list[ScheduleFloor] = Field(default_factory=list)
    schedule_lead_time: float = Field(default=0, ge=0, le=86400,
                                      description="raise floors this early (>= cold start; at most a day)")
    fallback: ScalingFallback | None = None

    @model_validator(mode="after")
    def _bounds(self) -> AutoscalingSection:
        if self.max_replica_count < self.min_replica_count:
            raise ValueError(
                f"maxReplicaCount ({self.max_replica_count}) is below minReplicaCount ({self.min_replica_count})"
            )
        if self.max_replica_count == 0:
            raise ValueError("maxReplicaCount must be at least 1")
        if self.fallback is not None and self.fallback.replicas > self.max_replica_count:
            raise ValueError(f"fallback.replicas ({self.fallback.replicas}) is above maxReplicaCount "
                             f"({self.max_replica_count}): the HPA caps it there; raise maxReplicaCount or lower it")
        for i, floor in enumerate(self.schedules):
            if floor.min_replicas > self.max_replica_count:
                raise ValueError(f"schedules[{i}].minReplicas ({floor.min_replicas}) is above maxReplicaCount "
                                 f"({self.max_replica_count}): the floor cannot be kept; raise maxReplicaCount "
                                 "or lower the floor")
        from fleetserve.autoscale.schedule import Schedule, ScheduleError

        try:
            Schedule.from_spec(self.schedules)
        except ScheduleError as exc:
            raise ValueError(str(exc).removeprefix("spec.autoscaling.")) from None
        return self


class L1Section(SpecModel):
    enabled: bool = True
    max_bytes: Bytes = Field(default=2 << 30, gt=0)


REDIS_SCHEMES = ("redis://", "rediss://", "unix://")  # what redis-py's from_url reads


_HOST_LABEL = re.compile(r"[A-Za-z0-9_](?:[A-Za-z0-9_-]{0,61}[A-Za-z0-9_])?")


def _is_ip_address(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


def _host_name(host: str) -> bool:
    """A DNS name (RFC 1123 labels; `_` as resolvers take it) or an IP address."""
    if _is_ip_address(host):
        return True
    labels = host.removesuffix(".").split(".")
    return len(host) <= 253 and all(_HOST_LABEL.fullmatch(label) for label in labels)


def redis_url_problem(url: str) -> None:
    """ValueError naming what redis-py would refuse or misread: the scheme, a port out of range, no host, a
    database that is not a number (`redis://h/abc` started engines that only warned at the first read)."""
    from urllib.parse import parse_qs, unquote, urlsplit

    from fleetserve.kvcache.tiers import split_credentials

    if not url.lower().startswith(REDIS_SCHEMES):
        raise ValueError(f"{url!r} must be a {', '.join(REDIS_SCHEMES[:-1])} or {REDIS_SCHEMES[-1]} URL "
                         "(rediss: TLS; unix: a socket path)")
    try:  # without the credentials: a password may hold a /, which urlsplit reads as the path's start
        parts = urlsplit(split_credentials(url)[0])
    except ValueError as exc:  # a bracket left open: "Invalid IPv6 URL"
        raise ValueError(f"{url!r}: {exc}") from None
    for db in parse_qs(parts.query).get("db", []):
        if not db.isdigit():
            raise ValueError(f"{url!r}: db= is a database number, got {db!r}")
    _redis_query_problem(url, parts)
    if parts.scheme.lower() == "unix":
        if not parts.path:
            raise ValueError(f"{url!r}: a unix:// URL needs the socket's path (unix:///run/redis.sock)")
        return
    try:
        port = parts.port
    except ValueError:
        port = -1
    if port is not None and not 1 <= port <= 65535:
        raise ValueError(f"{url!r}: the port must be a number from 1 to 65535")
    if not parts.hostname:
        raise ValueError(f"{url!r}: give the host (redis://host:6379/0)")
    if not _host_name(parts.hostname):  # `redis://not a url` passed, and every engine failed to resolve it
        raise ValueError(f"{url!r}: {parts.hostname!r} is no host name or IP address (letters, digits, '-', '_' "
                         "and '.', or an address such as 10.0.0.5 or [::1])")
    db = unquote(parts.path.strip("/"))
    if db and not db.isdigit():
        raise ValueError(f"{url!r}: the database after the host is a number (redis://host:6379/0), got {db!r}")


def _redis_query_problem(url: str, parts) -> None:
    """A query parameter redis-py refuses (`?socket_timeout=abc`: ValueError), does not know (`?foo=1`: TypeError
    at the first connection) or that breaks the tier had passed validate, and every replica died at its start
    with a traceback (or read nothing from L2)."""
    import inspect
    from urllib.parse import parse_qs

    import redis.connection as rc

    from fleetserve.kvcache.tiers import split_credentials

    if not parts.query:
        return
    try:
        rc.parse_url(split_credentials(url)[0])
    except ValueError as exc:
        raise ValueError(f"{url!r}: {exc}") from None
    # what the URL may set: the typed settings redis-py parses, names, and the scheme's own connection options
    # (TLS files, a socket path); not what changes the replies (decode_responses=true made every block read a
    # malformed reply) nor classes and hooks, which a URL can only name as text
    own = {"rediss": rc.SSLConnection, "unix": rc.UnixDomainSocketConnection}.get(parts.scheme.lower())
    known = set(rc.URL_QUERY_ARGUMENT_PARSERS) | {"client_name", "lib_name", "lib_version", "username", "password"}
    if own is not None:
        known |= set(inspect.signature(vars(own)["__init__"]).parameters) - {"self", "args", "kwargs"}
    unknown = sorted(set(parse_qs(parts.query)) - known)
    if unknown:
        raise ValueError(f"{url!r}: query parameter(s) {', '.join(unknown)} not taken here; allowed: "
                         f"{', '.join(sorted(known))}")


TENANT_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._@:+-]{0,127}")
TENANT_NAME_RULE = ("letters, digits and . _ @ : + -, beginning with a letter or a digit, at most 128 characters (a "
                    "tenant with its own Redis travels in a TENANT=URL flag and a space-separated variable)")


def tenant_name_problem(tenant: str) -> None:
    """ValueError for a tenant name that cannot have a Redis of its own: `team=b` passed validate, and `up` started
    engines that read `--l2-tenant team=b=redis://...` as tenant `team` (exit 2); `acme corp` split in
    $FLEETSERVE_L2_TENANTS. Other tenants' names are free text (a header carries them)."""
    if not TENANT_NAME.fullmatch(tenant):
        raise ValueError(f"tenant {tenant!r}: {TENANT_NAME_RULE}")


def rendered_tenant_service(url: str) -> str | None:
    """The Service a tenant URL names for the render to deploy (a bare host), or None for a Redis of the user's."""
    if url.startswith("rediss://"):  # TLS: a Redis of the user's own (the rendered one speaks plain redis://)
        return None
    from urllib.parse import urlsplit

    host = urlsplit(url).hostname or ""
    if not host or "." in host or host == "localhost" or _is_ip_address(host):
        return None
    return host


def _enabled_by(data, *given: str):
    """`enabled` left out of a section that lists what only an enabled one uses (API keys, certificate files):
    on, not off. Off had served the endpoint to anyone, in plain HTTP, while the spec read as protected."""
    if isinstance(data, dict) and "enabled" not in data and any(data.get(k) for k in given):
        return {**data, "enabled": True}
    return data


class L2Section(SpecModel):
    enabled: bool = Field(default=False, description="left out: on when url or tenantUrls is given")
    backend: Literal["redis"] = "redis"
    url: str | None = Field(default=None, description="redis://host:port/db; empty: fleetserve starts Redis")
    max_bytes: Bytes = Field(default=4 << 30, gt=0)
    tenant_urls: dict[str, str] = Field(default_factory=dict, description="hard isolation: a Redis per tenant")
    price_per_hour: float = Field(default=0, ge=0, description="$/hour of the Redis server (a managed cache, a node): "
                                                               "simulate, verify, plan and up add it to the fleet's "
                                                               "cost for the whole run; 0: not counted")

    @model_validator(mode="before")
    @classmethod
    def _on_with_a_url(cls, data):
        return _enabled_by(data, "url", "tenantUrls", "tenant_urls")

    @field_validator("url")
    @classmethod
    def _redis_url(cls, value: str | None) -> str | None:
        """`http://...` passed validate, and every replica of `up` died in redis-py's URL parser."""
        if value is not None:
            redis_url_problem(value)
        return value

    @field_validator("tenant_urls")
    @classmethod
    def _redis_urls(cls, value: dict[str, str]) -> dict[str, str]:
        for tenant, url in value.items():
            try:
                tenant_name_problem(tenant)
                redis_url_problem(url)
            except ValueError as exc:
                raise ValueError(f"tenantUrls[{tenant}]: {exc}") from None
        return value

    @model_validator(mode="after")
    def _a_tenant_redis_is_its_own(self) -> L2Section:
        """Hard isolation is a Redis database per tenant: a tenant URL reaching the shared L2's database or another
        tenant's passed, and the tenants' blocks mixed (each engine's eviction watch also counted the other's)."""
        from fleetserve.kvcache.redis_urls import redis_database

        taken = {redis_database(self.url): "url"} if self.url else {}
        for tenant, url in sorted(self.tenant_urls.items()):
            where = taken.setdefault(redis_database(url), f"tenantUrls[{tenant}]")
            if where != f"tenantUrls[{tenant}]":
                raise ValueError(f"tenantUrls[{tenant}]: {url!r} reaches the same Redis database as {where}; a "
                                 "tenant's L2 is its own: give it another server or another database number")
        return self


class KVCacheSection(SpecModel):
    block_size: int = Field(default=256, gt=0)
    l1: L1Section = Field(default_factory=L1Section)
    l2: L2Section = Field(default_factory=L2Section)


class RoutingSection(SpecModel):
    strategy: Literal["prefixaware", "kvaware", "session", "roundrobin", "leastload"] = "prefixaware"
    session_key: str | None = Field(default=None, description="header or body key for session routing")


class RequestLimitsSection(SpecModel):
    max_concurrent_requests: int | None = Field(default=None, ge=1)
    max_queue_size: int | None = Field(default=None, ge=0)
    overflow_status_code: int = Field(default=429, ge=400, le=599)
    max_body_bytes: int = Field(default=4 * 1024 * 1024, ge=1024, le=1024**3,
                                description="larger request bodies get 413 at the router and the engines")
    max_header_bytes: int = Field(default=64 * 1024, ge=1024, le=16 * 1024**2,
                                  description="larger request headers get 431")


class MetricsSection(SpecModel):
    enabled: bool = True
    scrape_interval_seconds: int = Field(default=15, ge=5, le=300)
    model_metrics_path: str | None = Field(default=None, pattern=r"^/", description="engine metrics path "
                                           "(default: the engine's own)")
    model_metrics_port: int | None = Field(default=None, ge=1, le=65535, description="engine metrics port "
                                           "(default: the engine port)")


class PrometheusSection(SpecModel):
    """A Prometheus that `fleetserve up` starts with the fleet (scraping every `metrics.scrapeIntervalSeconds`)."""

    enabled: bool | None = Field(default=None, description="default: on where the prometheus binary is "
                                 "installed (a warning otherwise)")
    port: int = Field(default=0, ge=0, le=65535, description="0: a free loopback port")
    retention: str = Field(default="1d", pattern=r"^\d+[smhdwy]$", description="--storage.tsdb.retention.time")


class ObservabilitySection(SpecModel):
    prometheus: PrometheusSection = Field(default_factory=PrometheusSection)
    log_format: Literal["text", "json"] = Field(default="text", description="router and engine logs: text, or "
                                                "JSON lines (one per request: id, hashed tenant, replica, policy "
                                                "and branch, timings)")
    log_prompts: bool = Field(default=False, description="put prompt text in the request lines (default: never)")
    log_max_bytes: Bytes = Field(default=100 << 20, ge=0, description="a local fleet's log file past this many bytes "
                               "is rotated (NAME.1 to NAME.3 kept); 0: never. Kubernetes: the kubelet rotates "
                               "container logs")


class TLSSection(SpecModel):
    enabled: bool = Field(default=False, description="left out: on when certFile and keyFile are given")
    cert_file: str | None = None
    key_file: str | None = None

    @model_validator(mode="before")
    @classmethod
    def _on_with_files(cls, data):
        return _enabled_by(data, "certFile", "cert_file", "keyFile", "key_file")

    @model_validator(mode="after")
    def _pair(self) -> TLSSection:
        if bool(self.cert_file) != bool(self.key_file):
            raise ValueError("tls.certFile and tls.keyFile go together (or neither, for a self-signed one)")
        return self


class APIKey(SpecModel):
    tenant: str = Field(min_length=1)
    key_sha256: str | None = Field(default=None, pattern=r"^[0-9a-f]{64}$")
    key_env: str | None = None

    @field_validator("tenant")
    @classmethod
    def _tenant_in_a_header(cls, value: str) -> str:
        """Free text, as a header carries it to the engines: a line break in it wrote a header of its own into
        every upstream request, and a letter past ASCII reached the engines as another tenant (read as latin-1)."""
        if not HEADER_TEXT.fullmatch(value):
            raise ValueError(f"tenant {value!r}: printable ASCII (letters, digits, spaces and punctuation), not "
                             "beginning or ending with a space (it travels in a header)")
        if value == NO_TENANT:  # the metrics' label of requests without a tenant: the two were one series
            raise ValueError(f"tenant {NO_TENANT!r} names requests without a tenant in the metrics; give it "
                             "another name")
        return value

    @model_validator(mode="after")
    def _one_source(self) -> APIKey:
        if bool(self.key_sha256) == bool(self.key_env):
            raise ValueError("an API key needs exactly one of keySha256 or keyEnv")
        return self


class AuthSection(SpecModel):
    enabled: bool = Field(default=False, description="left out: on when apiKeys lists keys")
    api_keys: list[APIKey] = Field(default_factory=list)

    @model_validator(mode="before")
    @classmethod
    def _on_with_keys(cls, data):
        return _enabled_by(data, "apiKeys", "api_keys")

    @model_validator(mode="after")
    def _keys_when_enabled(self) -> AuthSection:
        """Enabled without keys, every request would be a 401: `validate` said valid, and `up` failed (exit 1)."""
        if self.enabled and not self.api_keys:
            raise ValueError("enabled is true but apiKeys is empty: list at least one key (keySha256 or keyEnv), or "
                             "set enabled: false")
        return self

    @model_validator(mode="after")
    def _one_tenant_per_key(self) -> AuthSection:
        """A key names one tenant: listed twice, the last tenant took it and the first one vanished (its requests
        counted, salted and billed as the other's). The same key twice for the same tenant is harmless."""
        first: dict[str, tuple[int, str]] = {}
        for i, key in enumerate(self.api_keys):
            if not key.key_sha256:
                continue
            digest = key.key_sha256.lower()
            if digest in first and first[digest][1] != key.tenant:
                j, tenant = first[digest]
                raise ValueError(f"apiKeys[{i}] (tenant {key.tenant!r}) has the keySha256 of apiKeys[{j}] (tenant "
                                 f"{tenant!r}): one key can name one tenant only")
            first.setdefault(digest, (i, key.tenant))
        return self


class RouterSection(SpecModel):
    host: str = "127.0.0.1"
    port: int = Field(default=0, ge=0, le=65535, description="0: a free port")
    buffer_size: int = Field(default=256, ge=0, description="requests held while no replica is ready")
    buffer_timeout_seconds: float = Field(
        default=600, gt=0, le=86400, description="longer than the cold start (at most a day: no client waits longer, "
        "and the simulator walked a week of holding in seconds of wall time per request)")
    upstream_timeout_seconds: float = Field(
        default=1800, ge=0.1, le=86400, description="longest silence from a replica (before a non-streamed answer, "
        "its whole generation) before the router answers 504 (sglang-router's default)")
    stream_idle_timeout_seconds: float = Field(
        default=60, ge=0.1, le=86400, description="longest silence from a replica once its answer has begun (a "
        "stream between two chunks; nginx's proxy_read_timeout) before the router ends it with an error: a hung "
        "replica's streams ended only after upstreamTimeoutSeconds")
    workers: int = Field(default=1, ge=1, le=64, description="router processes sharing the port (one per core the "
                                                             "router may use)")

    @property
    def stream_silence_seconds(self) -> float:
        """The longest silence the router allows a stream once it began: the shorter of its two timeouts."""
        return min(self.stream_idle_timeout_seconds, self.upstream_timeout_seconds)


class BudgetSpec(SpecModel):
    """A Karpenter disruption budget; unlike Karpenter's, its schedule may name a time zone."""

    nodes: str = Field(default="10%", pattern=r"^\d+%?$")
    schedule: str | None = None

    @field_validator("nodes")
    @classmethod
    def _percent_at_most_100(cls, value: str) -> str:
        if value.endswith("%") and int(value[:-1]) > 100:
            raise ValueError(f"{value!r}: a share of the nodes is at most 100%")
        if value.endswith("%") and value != f"{int(value[:-1])}%":  # Karpenter's pattern refuses "007%"
            raise ValueError(f"{value!r}: write the share without leading zeros ({int(value[:-1])}%)")
        return value

    # a year at most, as consolidateAfter: Karpenter reads a Go duration (1e30 s rendered, and overflowed it)
    duration_seconds: float = Field(default=0, ge=0, le=365 * 86400)
    timezone: str = "UTC"

    @model_validator(mode="after")
    def _schedule_with_duration(self) -> BudgetSpec:
        if bool(self.schedule) != bool(self.duration_seconds):
            raise ValueError("budget schedule and durationSeconds go together")
        from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

        try:
            ZoneInfo(self.timezone)
        except (ZoneInfoNotFoundError, ValueError):
            raise ValueError(f"budget timezone {self.timezone!r} is not an IANA time zone (like UTC or "
                             "Europe/Berlin)") from None
        if self.schedule:
            from fleetserve.autoscale.schedule import Cron, ScheduleError

            try:
                Cron.parse(self.schedule)
            except (ScheduleError, ValueError) as exc:
                raise ValueError(f"budget schedule: {exc}") from None
        return self


class ConsolidationSection(SpecModel):
    policy: Literal["WhenEmpty", "WhenEmptyOrUnderutilized"] = "WhenEmptyOrUnderutilized"
    # a year at most: Karpenter reads it as a Go duration, and 1e12 s overflowed it (292 years is its limit)
    consolidate_after: float = Field(default=0, ge=0, le=365 * 86400)
    budgets: list[BudgetSpec] = Field(default_factory=lambda: [BudgetSpec()])


class ShortageSpec(SpecModel):
    instance_type: str
    start_seconds: float = Field(ge=0, description="after the fleet starts")
    end_seconds: float = Field(gt=0, allow_inf_nan=True, description=".inf: short until the end")
    capacity_type: Literal["spot", "on-demand"] | None = None

    @field_validator("end_seconds")
    @classmethod
    def _not_nan(cls, value: float) -> float:
        if math.isnan(value):
            raise ValueError("must be a number of seconds or .inf")
        return value

    @model_validator(mode="after")
    def _ends_after_it_starts(self) -> ShortageSpec:
        if self.end_seconds <= self.start_seconds:  # never active: a shortage that silently never happens
            raise ValueError(f"endSeconds ({self.end_seconds:g}) must be after startSeconds ({self.start_seconds:g})")
        return self


class SimulatedCloudSection(SpecModel):
    """A cloud in the loop for local runs: nodes are virtual, replicas are real processes."""

    provisioning_delay_seconds: float = Field(default=5, ge=0, le=86400, description="a node's start, at most a day")
    limits: dict[str, Annotated[int, Field(ge=0)]] = Field(default_factory=dict, description="most nodes of a type")
    shortages: list[ShortageSpec] = Field(default_factory=list)
    spot_interruption_rate_per_hour: float = Field(default=0, ge=0)
    seed: int = 0


class CapacitySection(SpecModel):
    provider: Literal["local", "simulated"] = "local"
    local_slots: int | None = Field(default=None, ge=1, description="replicas this machine holds")
    local_price_per_hour: float = Field(default=0, ge=0)
    capacity_types: list[Literal["spot", "on-demand"]] = Field(default_factory=lambda: ["on-demand"], min_length=1)
    allow_larger_instances: bool = False
    unavailable_offering_ttl: float = Field(default=180, ge=0)
    consolidation: ConsolidationSection = Field(default_factory=ConsolidationSection)
    simulated: SimulatedCloudSection = Field(default_factory=SimulatedCloudSection)

    @field_validator("capacity_types")
    @classmethod
    def _once_each(cls, value: list[str]) -> list[str]:
        if len(set(value)) != len(value):
            raise ValueError(f"lists a capacity type twice ({value}); allowed: spot, on-demand, each once")
        return value


class SloSection(SpecModel):
    """The latency target and GPU budget a scaling policy must meet at peak and at idle (`fleetserve verify`).

    Defaults (used when a spec has no `slo`): TTFT p95 2000 ms, E2E p95 30000 ms, no cost limit, at most 1 %
    of requests refused or failed.
    """

    ttft_p95_ms: float = Field(default=2000.0, ge=1, description="time to first token, 95th percentile")
    e2e_p95_ms: float = Field(default=30000.0, ge=1, alias="e2eP95Ms",  # to_camel's "e2EP95Ms" still read
                              validation_alias=AliasChoices("e2eP95Ms", "e2EP95Ms"),
                              description="end-to-end latency, 95th percentile")
    cost_per_hour_usd: float | None = Field(default=None, ge=0.0001,  # as the flags
                                            description="GPU spend per hour; none: no limit")
    max_error_rate: float = Field(default=0.01, ge=0, le=1, description="refused or failed requests, fraction")


class Toleration(SpecModel):
    """A Kubernetes toleration (core/v1), checked as the API server checks it."""

    key: str | None = None
    operator: Literal["Equal", "Exists"] = "Equal"
    value: str | None = None
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] | None = None
    toleration_seconds: int | None = Field(default=None, ge=0, description="NoExecute only: how long the pod "
                                                                            "stays on a node that gets the taint")

    @model_validator(mode="after")
    def _as_the_api_server_checks(self) -> Toleration:
        if self.key is not None and not is_label_key(self.key):
            raise ValueError(f"key {self.key!r} is not a taint key: {LABEL_KEY_RULE}")
        if self.value and not is_label_value(self.value):
            raise ValueError(f"value {self.value!r} is not a taint value: empty, or {LABEL_VALUE_RULE}")
        if self.operator == "Exists" and self.value:
            raise ValueError(f"value {self.value!r} with operator Exists: Exists matches any value; leave value out")
        if self.key is None and self.operator != "Exists":
            raise ValueError("a toleration without a key must have operator Exists (it tolerates every taint)")
        if self.toleration_seconds is not None and self.effect != "NoExecute":
            raise ValueError("tolerationSeconds applies to effect NoExecute only")
        return self


RENDERED_VOLUMES = frozenset({"model", "internal-token", "dshm"})  # the engine pod's own (k8s/engine.py)
FETCH_MODEL = "fetch-model"  # the init container that downloads the model (k8s/engine.py)
RENDERED_INIT_CONTAINERS = frozenset({FETCH_MODEL})  # the engine pod's own init containers
SHARED_MEMORY = "/dev/shm"  # where the engine container mounts `dshm` (GPU engines)
POSIX_ID_MAX = 2147483647  # runAsUser, runAsGroup, fsGroup: the API server's range is 0 to this


def engine_pod_volumes(kind: str) -> frozenset[str]:
    """The volumes an engine pod of this kind has of its own (k8s/engine.py): the internal token's for the
    built-in engine, shared memory for the others'."""
    return frozenset({"model", "internal-token" if kind == "builtin" else "dshm"})


class PodSection(SpecModel):
    """Kubernetes pod settings of the engine pods, passed through as given (HyperPod's `spec.kubernetes`)."""

    init_containers: list[dict[str, Any]] = Field(default_factory=list)
    scheduler_name: str | None = None
    service_account_name: str | None = None
    volumes: list[dict[str, Any]] = Field(default_factory=list)
    volume_mounts: list[dict[str, Any]] = Field(default_factory=list, description="mounts in the engine container")
    tolerations: list[Toleration] = Field(default_factory=list, description="the engine pods' tolerations, besides "
                                          "the GPU taint's (a cluster's own node groups with taints of their own)")
    priority_class_name: str | None = Field(default=None, description="the engine pods' PriorityClass (which "
                                            "pods the scheduler preempts first)")
    image_pull_secrets: list[str] = Field(default_factory=list, description="Secrets of a private registry, for "
                                          "every pod the endpoint renders (engine, router, Redis)")
    security_context: dict[str, Any] | None = Field(default=None, description="the engine pods' pod-level "
                                                    "securityContext (runAsUser, runAsGroup, fsGroup, seccompProfile)")

    @field_validator("service_account_name", "scheduler_name")
    @classmethod
    def _object_names(cls, value: str | None) -> str | None:
        if value is not None and not is_dns_subdomain(value):  # the API server refused the Deployment
            raise ValueError(f"{value!r}: a Kubernetes object name (lower-case letters, digits, '-' and '.', starting "
                             "and ending with a letter or digit, at most 253)")
        return value

    @field_validator("volumes")
    @classmethod
    def _volume_names(cls, value: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """Each a DNS label, none twice, and none of the pod's own (`model`, the engine's token, shared memory):
        a duplicate or a `Bad_Vol` rendered, and the API server refused the Deployment."""
        seen: set[str] = set()
        for i, volume in enumerate(value):
            name = volume.get("name") if isinstance(volume, dict) else None
            if not isinstance(name, str) or not is_dns_label(name):
                raise ValueError(f"[{i}].name: {name!r} is not a volume name (a DNS label: lower-case letters, "
                                 "digits and '-', at most 63)")
            if name in RENDERED_VOLUMES or name in seen:
                taken = "a volume fleetserve renders" if name in RENDERED_VOLUMES else "given twice"
                raise ValueError(f"[{i}].name: {name!r} is {taken}; volume names in a pod are unique (fleetserve's "
                                 f"own: {', '.join(sorted(RENDERED_VOLUMES))})")
            seen.add(name)
        return value

    @field_validator("init_containers")
    @classmethod
    def _init_containers(cls, value: list[dict[str, Any]]) -> list[dict[str, Any]]:
        seen: set[str] = set()
        for i, container in enumerate(value):
            if (problem := schema_problem("Container", container)) is not None:
                raise ValueError(f"[{i}]: {problem}")
            name = container["name"]
            if name in RENDERED_INIT_CONTAINERS or name in seen:  # two `fetch-model`: the API server refused it
                taken = "an init container fleetserve renders" if name in RENDERED_INIT_CONTAINERS else "given twice"
                raise ValueError(f"[{i}].name: {name!r} is {taken}; container names in a pod are unique")
            seen.add(name)
        return value

    @field_validator("security_context")
    @classmethod
    def _pod_security_context(cls, value: dict[str, Any] | None) -> dict[str, Any] | None:
        if value is not None and (problem := schema_problem("PodSecurityContext", value)) is not None:
            raise ValueError(problem)
        for key in ("runAsUser", "runAsGroup", "fsGroup"):
            given = (value or {}).get(key)
            if isinstance(given, int) and not 0 <= given <= POSIX_ID_MAX:
                raise ValueError(f"{key}: got {given}; allowed values: 0 to {POSIX_ID_MAX}")
        return value

    @model_validator(mode="after")
    def _volumes_and_mounts(self) -> PodSection:
        """Volumes and mounts as Kubernetes reads them, and every mount of a volume the pod has (`nosuchvol`
        rendered a Deployment whose pods never started)."""
        for i, volume in enumerate(self.volumes):
            if (problem := schema_problem("Volume", volume)) is not None:
                raise ValueError(f"volumes[{i}]: {problem}")
        for i, mount in enumerate(self.volume_mounts):
            if (problem := schema_problem("VolumeMount", mount)) is not None:
                raise ValueError(f"volumeMounts[{i}]: {problem}")
        return self

    @field_validator("priority_class_name")
    @classmethod
    def _priority_class_is_a_name(cls, value: str | None) -> str | None:
        if value is not None and not is_dns_subdomain(value):
            raise ValueError(f"{value!r}: a PriorityClass name (lower-case letters, digits, '-' and '.', starting "
                             "and ending with a letter or digit, at most 253)")
        return value

    @field_validator("image_pull_secrets")
    @classmethod
    def _secrets_are_names(cls, value: list[str]) -> list[str]:
        for i, name in enumerate(value):
            if not is_dns_subdomain(name):
                raise ValueError(f"[{i}] {name!r}: a Secret name (lower-case letters, digits, '-' and '.', starting "
                                 "and ending with a letter or digit, at most 253)")
        return value


class EndpointSpec(SpecModel):
    model: ModelSection
    engine: EngineSection = Field(default_factory=EngineSection)
    replicas: int = Field(default=1, ge=0, le=256)
    placement: PlacementSection = Field(default_factory=PlacementSection)
    autoscaling: AutoscalingSection | None = None
    kv_cache: KVCacheSection = Field(default_factory=KVCacheSection)
    routing: RoutingSection = Field(default_factory=RoutingSection)
    request_limits: RequestLimitsSection = Field(default_factory=RequestLimitsSection)
    metrics: MetricsSection = Field(default_factory=MetricsSection)
    observability: ObservabilitySection = Field(default_factory=ObservabilitySection)
    tls: TLSSection = Field(default_factory=TLSSection)
    auth: AuthSection = Field(default_factory=AuthSection)
    router: RouterSection = Field(default_factory=RouterSection)
    capacity: CapacitySection = Field(default_factory=CapacitySection)
    slo: SloSection | None = None
    pod: PodSection = Field(default_factory=PodSection)

    @property
    def router_drain_seconds(self) -> int:
        """A stopping router's wait for what it serves: the streams it proxies (the engines' drain) and the requests
        it holds at zero replicas (`router.bufferTimeoutSeconds`), whichever is shorter, in whole seconds
        (Kubernetes' router pod and `fleetserve up`'s router alike)."""
        return math.ceil(min(self.router.buffer_timeout_seconds, self.engine.drain_timeout_seconds))

    @model_validator(mode="before")
    @classmethod
    def _catalog_defaults(cls, data: Any) -> Any:
        from fleetserve.spec.catalog_defaults import fill_from_catalog

        return _default_l1(fill_from_catalog(data))

    @model_validator(mode="after")
    def _mounts_name_volumes_the_pod_has(self) -> EndpointSpec:
        """Every mount names a volume the engine pod has: `nosuchvol`, or `dshm` on a built-in engine's pod (which
        has none), rendered a Deployment whose pods never started."""
        own = engine_pod_volumes(self.engine.kind)
        names = {v["name"] for v in self.pod.volumes} | own
        mounts = [(f"pod.volumeMounts[{i}]", m) for i, m in enumerate(self.pod.volume_mounts)]
        mounts += [(f"pod.initContainers[{c}].volumeMounts[{i}]", m)  # an init container's too: it had rendered
                   for c, container in enumerate(self.pod.init_containers)  # a pod that never started
                   for i, m in enumerate(container.get("volumeMounts") or [])]
        for where, mount in mounts:
            if mount["name"] not in names:
                raise ValueError(f"{where}.name: {mount['name']!r} is no volume of the pod; "
                                 f"pod.volumes names {', '.join(sorted(v['name'] for v in self.pod.volumes)) or 'none'}"
                                 f" (and the {self.engine.kind} engine's pod its own: {', '.join(sorted(own))})")
        paths: dict[str, int] = {}
        for i, mount in enumerate(self.pod.volume_mounts):  # one path, one mount in a container (the API server)
            path = mount["mountPath"].rstrip("/") or "/"
            if path in paths or ("dshm" in own and path == SHARED_MEMORY):
                other = f"pod.volumeMounts[{paths[path]}]" if path in paths else \
                    f"the {self.engine.kind} engine's shared memory"
                raise ValueError(f"pod.volumeMounts[{i}].mountPath: {mount['mountPath']!r} is mounted by {other} "
                                 "already; a path takes one mount in a container")
            paths[path] = i
        return self

    @model_validator(mode="after")
    def _context_flag_valid(self) -> EndpointSpec:
        from fleetserve.spec.context import context_flag_problem, flag_in_args

        problem = context_flag_problem(self)
        if problem:
            raise ValueError(f"engine.args: {problem}")
        dtype = flag_in_args(self.engine.args, "--dtype") if self.engine.kind in ("vllm", "sglang") else None
        if dtype and self.model.dtype != "auto" and \
                DTYPE_ALIASES.get(dtype[1] or "", dtype[1]) != self.model.dtype:  # the engine keeps the last
            raise ValueError(f"engine.args: --dtype {dtype[1]} disagrees with model.dtype {self.model.dtype}: give "
                             "the dtype once, in model.dtype")
        return self

    @model_validator(mode="after")
    def _zero_wakes_on_held_requests(self) -> EndpointSpec:
        """A fleet at zero wakes on the requests its router holds: with no buffer every request was refused at
        once (503 buffer_full) and none ever woke it."""
        auto = self.autoscaling
        if auto is not None and auto.enabled and auto.min_replica_count == 0 and self.router.buffer_size == 0:
            raise ValueError("router.bufferSize: 0 with autoscaling.minReplicaCount 0: at zero replicas every "
                             "request is refused and none wakes the fleet (it wakes on the requests the router "
                             "holds); give bufferSize at least 1, or minReplicaCount at least 1")
        return self

    @model_validator(mode="after")
    def _lmcache_reads_the_l2_url(self) -> EndpointSpec:
        """vLLM's L2 is LMCache's Redis backend, whose URL parser takes host:port: a unix socket became
        `redis://unix:///run/r.sock` and the server stopped at start."""
        url = self.kv_cache.l2.url
        if self.engine.kind == "vllm" and self.kv_cache.l2.enabled and url and url.lower().startswith("unix://"):
            raise ValueError(f"kvCache.l2.url: {url!r}: vLLM's L2 (LMCache) connects to redis://host:port or "
                             "rediss://host:port, not a unix socket")
        return self

    @model_validator(mode="after")
    def _sglang_host_cache(self) -> EndpointSpec:
        """An L1 an SGLang spec gives takes whole GB (1e9 bytes) per GPU rank (`--hicache-size`, an integer)."""
        if self.engine.kind != "sglang" or not self.kv_cache.l1.enabled:
            return self
        from fleetserve.engine.adapters import ranks, sglang_hicache_gb

        if sglang_hicache_gb(self) < 1:
            raise ValueError(f"kvCache.l1.maxBytes: {self.kv_cache.l1.max_bytes} bytes over {ranks(self)} GPU "
                             "rank(s) is below 1 GB a rank: SGLang's --hicache-size is whole GB (1e9 bytes) per "
                             f"rank; give at least {ranks(self) * 10**9}, or l1.enabled: false")
        return self

    @model_validator(mode="after")
    def _instance_types_known(self) -> EndpointSpec:
        if self.capacity.provider != "simulated":
            return self
        catalog = Catalog.builtin()
        unknown = catalog.first_unknown(self.placement.instance_types)
        if unknown:
            raise ValueError(f"placement.instanceTypes[{unknown[0]}]: unknown instance type {unknown[1]!r}; known: "
                             f"{', '.join(catalog.names())}")
        if not self.placement.instance_types and not self.placement.node_affinity:
            raise ValueError("capacity.provider 'simulated' needs placement.instanceTypes or nodeAffinity")
        cloud = self.capacity.simulated
        named = [(f"capacity.simulated.limits.{name}", name) for name in cloud.limits]
        named += [(f"capacity.simulated.shortages[{i}].instanceType", s.instance_type)
                  for i, s in enumerate(cloud.shortages)]
        for path, name in named:  # a typo here never applies, and said nothing
            if catalog.first_unknown([name]):
                raise ValueError(f"{path}: unknown instance type {name!r}; known: {', '.join(catalog.names())}")
        return self


def _default_l1(data: Any) -> Any:
    """The default L1 where it does harm or nothing: SGLang's L1 is its HiCache, which must be larger than the GPU's
    KV pool (0.5.x asserts so at start), and the default L1's 2 GiB stopped every SGLang server that did not ask for
    L1; an image run as given (`container`) has no tier of ours, and the simulator modelled one. For them it is off
    unless the spec gives `kvCache.l1` (raw `spec` mapping in, as the model reads it)."""
    if not isinstance(data, dict) or not isinstance(data.get("engine"), dict) or \
            data["engine"].get("kind") not in ("sglang", "container"):
        return data
    key = "kv_cache" if "kv_cache" in data else "kvCache"
    kv = data.get(key, {})
    if not isinstance(kv, dict) or "l1" in kv:
        return data  # a wrong type is named by the model's validation
    return {**data, key: {**kv, "l1": {"enabled": False}}}


class Endpoint(SpecModel):
    """The whole document."""

    api_version: Literal["fleetserve.io/v1"] = Field(alias="apiVersion")
    kind: Literal["Endpoint"]
    metadata: Metadata
    spec: EndpointSpec

    @property
    def served_model_name(self) -> str:
        return self.spec.model.name or self.metadata.name

    @model_validator(mode="after")
    def _tenant_redis_not_ours(self) -> Endpoint:
        """What `render k8s` would make two objects of one name, which it refused naming files after `validate`
        passed it: two tenants on one bare host, or a tenant's bare host named as one of the endpoint's own objects.
        A bare host names a Redis rendered for that tenant, for the built-in engine only (vLLM and SGLang share the
        one L2: k8s/redis.py), so only then."""
        if self.spec.engine.kind != "builtin":
            return self
        name = self.metadata.name
        ours = {name, *(f"{name}-{part}" for part in ("router", "engine", "engine-pods", "router-state", "redis"))}
        named: dict[str, str] = {}
        for tenant, url in sorted(self.spec.kv_cache.l2.tenant_urls.items()):
            service = (rendered_tenant_service(url) or "").lower()
            if service in ours:
                raise ValueError(f"spec.kvCache.l2.tenantUrls[{tenant}]: the host {service!r} is the name of one of "
                                 "this endpoint's own objects on Kubernetes, where a bare host is a Redis rendered "
                                 "for that tenant; name it otherwise")
            if service in named:
                raise ValueError(f"spec.kvCache.l2.tenantUrls[{tenant}]: names the Redis {service!r} that "
                                 f"tenantUrls[{named[service]}] names too; a tenant's own Redis is its alone (on "
                                 "Kubernetes a bare host is a Redis rendered for that tenant): give each tenant its "
                                 "own host, or a Redis of yours by a host with a dot")
            if service:
                named[service] = tenant
        return self

    @model_validator(mode="after")
    def _served_name_agrees(self) -> Endpoint:
        from fleetserve.spec.context import flag_in_args

        found = flag_in_args(self.spec.engine.args, SERVED_NAME_FLAG) if self.spec.engine.kind in ("vllm", "sglang") \
            else None
        if found and found[1] is None:
            raise ValueError(f"spec.engine.args: {SERVED_NAME_FLAG} is last, without a value; the model is served as "
                             f"{self.served_model_name!r} (spec.model.name, else metadata.name): leave the flag out")
        if found and found[1] != self.served_model_name:
            raise ValueError(f"spec.engine.args: sets {SERVED_NAME_FLAG} {found[1]}, but the router and the metrics "
                             f"serve the model as {self.served_model_name!r} (spec.model.name, else metadata.name): "
                             "use spec.model.name")
        return self
