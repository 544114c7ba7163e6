"""HyperPod `InferenceEndpointConfig` (apiVersion inference.sagemaker.aws.amazon.com/v1) accepted as is.

The document is validated against the CRD's shape (field names as the CRD spells them, the SDK's cross-field
rules), then mapped onto our `Endpoint`. Whatever has no local meaning (SageMaker endpoint registration, S3
certificate upload, ALB settings, ...) is kept out of the mapping and reported as a warning naming the field.
"""

from __future__ import annotations

import re
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from fleetserve.spec.errors import SpecError, SpecProblem, problems_from_validation

API_VERSION = "inference.sagemaker.aws.amazon.com/v1"
KIND = "InferenceEndpointConfig"


class _CRD(BaseModel):
    """CRD objects: field names exactly as the CRD spells them, unknown fields rejected."""

    model_config = ConfigDict(extra="forbid", frozen=True)


class NameValue(_CRD):
    name: str
    value: str | None = None
    valueFrom: dict[str, Any] | None = None


class S3Storage(_CRD):
    bucketName: str
    region: str


class FsxStorage(_CRD):
    fileSystemId: str
    dnsName: str | None = None
    mountName: str | None = None


class HuggingFaceModel(_CRD):
    modelId: str = Field(pattern=r"^[a-zA-Z0-9_.-]+/[a-zA-Z0-9_.-]+$")
    commitSHA: str | None = Field(default=None, pattern=r"^[0-9a-f]{40}$")
    tokenSecretRef: dict[str, Any] | None = None


class ModelSourceConfig(_CRD):
    modelSourceType: Literal["fsx", "s3", "huggingface", "kubernetesVolume"]
    modelLocation: str | None = None
    prefetchEnabled: bool = False
    s3Storage: S3Storage | None = None
    fsxStorage: FsxStorage | None = None
    huggingFaceModel: HuggingFaceModel | None = None
    kubernetesVolume: dict[str, Any] | None = None

    @model_validator(mode="after")
    def _source_details(self) -> ModelSourceConfig:
        needed = {"s3": "s3Storage", "fsx": "fsxStorage", "huggingface": "huggingFaceModel"}
        field = needed.get(self.modelSourceType)
        if field and getattr(self, field) is None:
            raise ValueError(f"modelSourceType {self.modelSourceType!r} requires modelSourceConfig.{field}")
        return self


class Port(_CRD):
    containerPort: int = Field(ge=1, le=65535)
    name: Literal["http", "grpc"] = "http"


class VolumeMount(_CRD):
    name: str
    mountPath: str = "/opt/ml/model"


class RequestLimits(_CRD):
    maxConcurrentRequests: int | None = Field(default=None, ge=1)
    maxQueueSize: int | None = Field(default=None, ge=0)
    overflowStatusCode: int = Field(default=429, ge=400, le=599)


class Worker(_CRD):
    image: str
    resources: dict[str, Any]
    modelInvocationPort: Port
    modelVolumeMount: VolumeMount
    args: list[str] = Field(default_factory=list)
    command: list[str] = Field(default_factory=list)
    workingDir: str | None = None
    environmentVariables: list[NameValue] = Field(default_factory=list)
    probes: dict[str, Any] | None = None
    requestLimits: RequestLimits | None = None

    @field_validator("resources")
    @classmethod
    def _resource_maps(cls, value: dict[str, Any]) -> dict[str, Any]:
        """Kubernetes ResourceRequirements: limits and requests map a resource name to a quantity."""
        for section in ("limits", "requests"):
            if section in value and not isinstance(value[section], dict | None):
                raise ValueError(f"resources.{section} must be a mapping such as {{nvidia.com/gpu: 1}}, "
                                 f"got {type(value[section]).__name__}")
        return value


class _Trigger(_CRD):
    name: str | None = None
    targetValue: float | None = None
    activationTargetValue: float = 0
    metricType: Literal["Value", "Average"] = "Average"
    useCachedMetrics: bool = True
    namespace: str | None = None


class PrometheusTrigger(_Trigger):
    query: str | None = None
    serverAddress: str | None = None
    customHeaders: str | None = None


class CloudWatchTrigger(_Trigger):
    metricName: str | None = None
    dimensions: list[NameValue] = Field(default_factory=list)
    metricStat: str = "Average"
    metricCollectionPeriod: int = 300
    metricCollectionStartTime: int = 300
    minValue: float = 0


class AutoScalingSpec(_CRD):
    minReplicaCount: int = Field(default=1, ge=0)
    maxReplicaCount: int = Field(default=5, ge=0)
    pollingInterval: int = Field(default=30, ge=0)
    cooldownPeriod: int = Field(default=300, ge=0)
    initialCooldownPeriod: int = Field(default=300, ge=0)
    scaleUpStabilizationTime: int = Field(default=0, ge=0)
    scaleDownStabilizationTime: int = Field(default=300, ge=0)
    prometheusTrigger: PrometheusTrigger | None = None
    prometheusTriggerList: list[PrometheusTrigger] = Field(default_factory=list, max_length=100)
    cloudWatchTrigger: CloudWatchTrigger | None = None
    cloudWatchTriggerList: list[CloudWatchTrigger] = Field(default_factory=list, max_length=100)


class L2CacheSpec(_CRD):
    l2CacheBackend: str = Field(pattern=r"(?i)^(redis|tieredstorage)$")
    l2CacheLocalUrl: str | None = None


class KvCacheSpec(_CRD):
    enableL1Cache: bool = True
    enableL2Cache: bool = False
    l2CacheSpec: L2CacheSpec | None = None
    cacheConfigFile: str | None = None


class IntelligentRoutingSpec(_CRD):
    enabled: bool = False
    routingStrategy: Literal["prefixaware", "kvaware", "session", "roundrobin"] = "prefixaware"
    autoScalingSpec: AutoScalingSpec | None = None


class ModelMetrics(_CRD):
    path: str = "/metrics"
    port: int = Field(default=8080, ge=1024, le=65535)


class Metrics(_CRD):
    enabled: bool = True
    metricsScrapeIntervalSeconds: int = Field(default=15, ge=5, le=300)
    modelMetrics: ModelMetrics | None = None


class LoadBalancer(_CRD):
    healthCheckPath: str = Field(default="/ping", pattern=r"^/.*")
    routingAlgorithm: Literal["least_outstanding_requests", "round_robin"] = "least_outstanding_requests"


class CustomCertificateConfig(_CRD):
    acmArn: str | None = None
    domainName: str | None = None


class TlsConfig(_CRD):
    tlsCertificateOutputS3Uri: str | None = None
    customCertificateConfig: CustomCertificateConfig | None = None


class InferenceEndpointConfigSpec(_CRD):
    modelName: str = Field(pattern=r"^[a-zA-Z0-9](-*[a-zA-Z0-9]){0,62}", max_length=63)  # unanchored, as in the CRD
    modelSourceConfig: ModelSourceConfig
    worker: Worker
    modelVersion: str | None = None
    endpointName: str = Field(default="", pattern=r"^$|^[a-zA-Z0-9](-*[a-zA-Z0-9]){0,62}$", max_length=63)
    invocationEndpoint: str = "invocations"
    tags: list[NameValue] = Field(default_factory=list)
    maxDeployTimeInSeconds: int = 3600
    replicas: int = Field(default=1, ge=0)
    InitialReplicaCount: int | None = None
    instanceType: str | None = Field(default=None, pattern=r"^ml\..*")
    instanceTypes: list[str] = Field(default_factory=list)
    nodeAffinity: dict[str, Any] | None = None
    kubernetes: dict[str, Any] | None = None
    autoScalingSpec: AutoScalingSpec | None = None
    kvCacheSpec: KvCacheSpec | None = None
    intelligentRoutingSpec: IntelligentRoutingSpec | None = None
    metrics: Metrics = Field(default_factory=Metrics)
    loadBalancer: LoadBalancer | None = None
    tlsConfig: TlsConfig | None = None
    dnsConfig: dict[str, Any] | None = None
    dataCapture: dict[str, Any] | None = None
    pdSpec: dict[str, Any] | None = None

    @model_validator(mode="after")
    def _sdk_rules(self) -> InferenceEndpointConfigSpec:
        # The HyperPod SDK's cross-field rules (the CRD has no CEL; the operator's webhook enforces these).
        if self.instanceType and self.instanceTypes:
            raise ValueError("instanceType and instanceTypes are mutually exclusive")
        if self.nodeAffinity and (self.instanceType or self.instanceTypes):
            raise ValueError("nodeAffinity cannot be combined with instanceType or instanceTypes")
        if not (self.instanceType or self.instanceTypes or self.nodeAffinity):
            raise ValueError("one of instanceType, instanceTypes or nodeAffinity is required")
        cert = self.tlsConfig.customCertificateConfig if self.tlsConfig else None
        if cert and bool(cert.acmArn) != bool(cert.domainName):
            raise ValueError("tlsConfig.customCertificateConfig needs both acmArn and domainName")
        if self.dnsConfig and not (cert and cert.acmArn):
            raise ValueError("dnsConfig requires tlsConfig.customCertificateConfig")
        return self


class Metadata(_CRD):
    name: str
    namespace: str = "default"
    labels: dict[str, str] = Field(default_factory=dict)
    annotations: dict[str, str] = Field(default_factory=dict)


class InferenceEndpointConfig(_CRD):
    apiVersion: Literal["inference.sagemaker.aws.amazon.com/v1"]
    kind: Literal["InferenceEndpointConfig"]
    metadata: Metadata
    spec: InferenceEndpointConfigSpec


def _k8s_name(value: str) -> str:
    """HyperPod model names allow upper case; our metadata is a DNS label."""
    name = re.sub(r"[^a-z0-9-]+", "-", value.lower()).strip("-")
    return name[:63] or "endpoint"


def _engine_kind(image: str) -> str:
    lowered = image.lower()
    if "sglang" in lowered:
        return "sglang"
    if "vllm" in lowered:
        return "vllm"
    return "builtin"


def _gpu_count(resources: dict[str, Any]) -> int:
    for section in ("limits", "requests"):
        value = (resources.get(section) or {}).get("nvidia.com/gpu")
        if value is not None:
            try:
                return int(str(value))
            except ValueError:
                return 0
    return 0


def _model_source(src: ModelSourceConfig) -> tuple[str, str | None]:
    """Our `model.source` for a HyperPod modelSourceConfig, and the revision if any."""
    location = (src.modelLocation or "").strip("/")
    if src.modelSourceType == "s3":
        assert src.s3Storage is not None
        return f"s3://{src.s3Storage.bucketName}/{location}".rstrip("/"), None
    if src.modelSourceType == "huggingface":
        assert src.huggingFaceModel is not None
        return f"hf:{src.huggingFaceModel.modelId}", src.huggingFaceModel.commitSHA
    if src.modelSourceType == "fsx":
        # FSx for Lustre is a POSIX mount: locally it is the directory where the filesystem is mounted.
        assert src.fsxStorage is not None
        mount = src.fsxStorage.mountName or "fsx"
        return f"/{mount}/{location}".rstrip("/"), None
    return f"/opt/ml/model/{location}".rstrip("/"), None


def _triggers(spec: AutoScalingSpec, warn) -> list[dict[str, Any]]:
    prometheus = spec.prometheusTriggerList or ([spec.prometheusTrigger] if spec.prometheusTrigger else [])
    out = []
    for i, trig in enumerate(prometheus):
        if trig.targetValue is None or not trig.query:
            warn(f"spec.autoScalingSpec.prometheusTrigger[{i}]", "needs query and targetValue; trigger ignored")
            continue
        out.append(
            {
                "metric": "prometheus",
                "query": trig.query,
                "serverAddress": trig.serverAddress or "http://127.0.0.1:9090",
                "target": trig.targetValue,
                "activationTarget": trig.activationTargetValue,
            }
        )
    if spec.cloudWatchTrigger or spec.cloudWatchTriggerList:
        warn(
            "spec.autoScalingSpec.cloudWatchTrigger",
            "CloudWatch is AWS-only; replaced by a concurrency trigger (target 4 per replica) on our own metrics",
        )
        out.append({"metric": "concurrency", "target": 4, "activationTarget": 0})
    return out


def to_endpoint_dict(doc: InferenceEndpointConfig, warn) -> dict[str, Any]:
    """Map a validated HyperPod document onto the dict form of our `Endpoint`; `warn(path, msg)` collects notes."""
    s = doc.spec
    source, revision = _model_source(s.modelSourceConfig)
    if s.modelSourceConfig.modelSourceType == "fsx":
        warn("spec.modelSourceConfig.fsxStorage", f"FSx is read from the local mount {source!r}")
    env = {e.name: e.value or "" for e in s.worker.environmentVariables if e.value is not None}
    for e in s.worker.environmentVariables:
        if e.valueFrom is not None:
            warn(f"spec.worker.environmentVariables[{e.name}]", "valueFrom (Kubernetes secrets) has no local effect")
    kind = _engine_kind(s.worker.image)
    if kind == "builtin":
        warn(
            "spec.worker.image",
            f"image {s.worker.image!r} is neither vLLM nor SGLang; locally the built-in engine serves the model",
        )
    engine: dict[str, Any] = {
        "kind": kind,
        "image": s.worker.image,
        "args": list(s.worker.args),
        "env": env,
        "port": s.worker.modelInvocationPort.containerPort,
        "startupTimeoutSeconds": s.maxDeployTimeInSeconds,
        "gpus": _gpu_count(s.worker.resources),
    }
    if s.loadBalancer:
        engine["healthPath"] = s.loadBalancer.healthCheckPath
    out: dict[str, Any] = {
        "apiVersion": "fleetserve.io/v1",
        "kind": "Endpoint",
        "metadata": {
            "name": _k8s_name(doc.metadata.name),
            "namespace": _k8s_name(doc.metadata.namespace),
            "labels": dict(doc.metadata.labels),
        },
        "spec": {
            "model": {
                "name": s.modelName,
                "version": s.modelVersion or "1",
                "source": source,
                "revision": revision,
                "prefetch": s.modelSourceConfig.prefetchEnabled,
                "s3Region": s.modelSourceConfig.s3Storage.region if s.modelSourceConfig.s3Storage else None,
            },
            "engine": engine,
            "replicas": s.replicas,
            "metrics": {"enabled": s.metrics.enabled, "scrapeIntervalSeconds": s.metrics.metricsScrapeIntervalSeconds},
        },
    }
    spec = out["spec"]
    types = [s.instanceType] if s.instanceType else list(s.instanceTypes)
    spec["placement"] = {"instanceTypes": types, "nodeAffinity": s.nodeAffinity}
    if s.worker.requestLimits:
        rl = s.worker.requestLimits
        spec["requestLimits"] = {
            "maxConcurrentRequests": rl.maxConcurrentRequests,
            "maxQueueSize": rl.maxQueueSize,
            "overflowStatusCode": rl.overflowStatusCode,
        }
        if not s.metrics.enabled:
            warn("spec.worker.requestLimits", "HyperPod enforces requestLimits only with metrics.enabled; we always do")
    if s.autoScalingSpec:
        a = s.autoScalingSpec
        spec["autoscaling"] = {
            "minReplicaCount": a.minReplicaCount,
            "maxReplicaCount": a.maxReplicaCount,
            "pollingInterval": a.pollingInterval or 30,
            "cooldownPeriod": a.cooldownPeriod,
            "initialCooldownPeriod": a.initialCooldownPeriod,
            "scaleUpStabilizationTime": a.scaleUpStabilizationTime,
            "scaleDownStabilizationTime": a.scaleDownStabilizationTime,
            "triggers": _triggers(a, warn),
        }
    if s.kvCacheSpec:
        kv = s.kvCacheSpec
        l2: dict[str, Any] = {"enabled": kv.enableL2Cache}
        if kv.enableL2Cache and kv.l2CacheSpec:
            backend = kv.l2CacheSpec.l2CacheBackend.lower()
            if backend == "tieredstorage":
                warn(
                    "spec.kvCacheSpec.l2CacheSpec.l2CacheBackend",
                    "'tieredstorage' is HyperPod-managed; locally fleetserve starts and uses its own Redis",
                )
            elif kv.l2CacheSpec.l2CacheLocalUrl:
                url = kv.l2CacheSpec.l2CacheLocalUrl
                l2["url"] = url if "://" in url else f"redis://{url}"
        spec["kvCache"] = {"l1": {"enabled": kv.enableL1Cache}, "l2": l2}
        if kv.cacheConfigFile:
            warn("spec.kvCacheSpec.cacheConfigFile", "LMCache config files are passed to vLLM only; builtin ignores it")
    routing = s.intelligentRoutingSpec
    if routing and routing.enabled:
        strategy = routing.routingStrategy
        if routing.autoScalingSpec:
            warn("spec.intelligentRoutingSpec.autoScalingSpec", "the local router runs as one process; not scaled")
    elif s.loadBalancer and s.loadBalancer.routingAlgorithm == "round_robin":
        strategy = "roundrobin"
    else:
        strategy = "leastload"  # the ALB's least_outstanding_requests
    spec["routing"] = {"strategy": strategy, "sessionKey": env.get("SESSION_KEY")}
    if s.tlsConfig:
        spec["tls"] = {"enabled": True}
        if s.tlsConfig.tlsCertificateOutputS3Uri:
            warn("spec.tlsConfig.tlsCertificateOutputS3Uri",
                 "the self-signed certificate is written locally, not to S3")
        if s.tlsConfig.customCertificateConfig:
            warn("spec.tlsConfig.customCertificateConfig", "ACM certificates are AWS-only; a self-signed one is used")
    for field, why in (
        ("endpointName", "no SageMaker endpoint is registered outside AWS"),
        ("tags", "SageMaker tags have no local effect"),
        ("InitialReplicaCount", "deprecated in HyperPod and without effect; use replicas"),
        ("kubernetes", "pod customisations apply to `fleetserve render k8s` only"),
        ("dnsConfig", "Route 53 records are AWS-only"),
        ("dataCapture", "data capture to S3 is not supported"),
        ("pdSpec", "disaggregated prefill/decode is not supported; replicas serve both phases"),
    ):
        if getattr(s, field):
            warn(f"spec.{field}", why)
    if s.invocationEndpoint not in ("invocations", "v1/chat/completions", "v1/completions"):
        warn("spec.invocationEndpoint", "the gateway serves the OpenAI paths /v1/chat/completions and /v1/completions")
    return out


def parse(data: dict[str, Any]) -> tuple[dict[str, Any], list[SpecProblem]]:
    """Validate a HyperPod document; return our Endpoint as a dict and the warnings of the mapping."""
    try:
        doc = InferenceEndpointConfig.model_validate(data)
    except ValidationError as exc:
        raise SpecError(problems_from_validation(exc, InferenceEndpointConfig)) from None
    notes: list[SpecProblem] = []
    mapped = to_endpoint_dict(doc, lambda path, msg: notes.append(SpecProblem(path, msg)))
    return mapped, notes
