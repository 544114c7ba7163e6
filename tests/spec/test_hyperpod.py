from pathlib import Path

import pytest
import yaml

from fleetserve.spec import SpecError, load_spec, load_spec_text

EXAMPLE = Path(__file__).parents[2] / "examples" / "hyperpod.yaml"


def test_example_maps_onto_endpoint():
    loaded = load_spec(EXAMPLE)
    e = loaded.endpoint
    assert loaded.source_format == "hyperpod"
    assert e.metadata.name == "llama-8b-kv-routing" and e.metadata.namespace == "ns-team-a"
    assert e.served_model_name == "Llama-3.1-8B-Instruct" and e.spec.model.version == "1.0"
    assert e.spec.model.source == "s3://my-model-bucket/models/Llama-3.1-8B-Instruct"
    assert e.spec.model.s3_region == "us-west-2"
    assert e.spec.engine.kind == "vllm" and e.spec.engine.port == 8000 and e.spec.engine.gpus == 1
    assert e.spec.engine.health_path == "/health"
    assert e.spec.replicas == 2
    assert e.spec.placement.instance_types == ["ml.g5.8xlarge"]
    assert e.spec.kv_cache.l1.enabled and e.spec.kv_cache.l2.enabled
    assert e.spec.kv_cache.l2.url == "redis://redis.ns-team-a.svc.cluster.local:6379"
    assert e.spec.routing.strategy == "prefixaware" and e.spec.routing.session_key == "user_id"
    a = e.spec.autoscaling
    assert (a.min_replica_count, a.max_replica_count, a.polling_interval, a.cooldown_period) == (1, 4, 30, 300)
    (trigger,) = a.triggers
    assert trigger.metric == "prometheus" and trigger.target == 8 and trigger.activation_target == 1
    assert e.spec.tls.enabled


def test_example_warns_about_what_has_no_local_effect():
    said: dict[str, str] = {}
    for w in load_spec(EXAMPLE).warnings:  # one field may be named by several warnings
        said[w.path] = said.get(w.path, "") + w.message + "\n"
    assert "spec.endpointName" in said
    assert "spec.tlsConfig.tlsCertificateOutputS3Uri" in said
    # vLLM needs a GPU; named by the user's own field (it read spec.engine.kind, a field the file does not have)
    assert "(fleetserve's spec.engine.kind)" in said["spec.worker.image"]
    assert "(fleetserve's spec.routing.sessionKey)" in said["spec.worker.environmentVariables[SESSION_KEY]"]
    assert not [p for p in said if p.startswith(("spec.engine", "spec.model.", "spec.routing", "spec.placement"))]


def _doc(**spec_changes):
    doc = yaml.safe_load(EXAMPLE.read_text())
    for key, value in spec_changes.items():
        if value is None:
            doc["spec"].pop(key, None)
        else:
            doc["spec"][key] = value
    return yaml.safe_dump(doc)


def _problems(text):
    with pytest.raises(SpecError) as info:
        load_spec_text(text)
    return [str(p) for p in info.value.problems]


def test_sdk_rule_instance_type_exclusive():
    msgs = _problems(_doc(instanceTypes=["ml.g5.8xlarge", "ml.g5.12xlarge"]))
    assert any("instanceType and instanceTypes are mutually exclusive" in m for m in msgs)


def test_sdk_rule_placement_required():
    msgs = _problems(_doc(instanceType=None))
    assert any("one of instanceType, instanceTypes or nodeAffinity is required" in m for m in msgs)


def test_instance_types_priority_list_and_node_affinity():
    e = load_spec_text(_doc(instanceType=None, instanceTypes=["ml.g5.24xlarge", "ml.g5.8xlarge"])).endpoint
    assert e.spec.placement.instance_types == ["ml.g5.24xlarge", "ml.g5.8xlarge"]
    affinity = {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": []}}
    e = load_spec_text(_doc(instanceType=None, nodeAffinity=affinity)).endpoint
    assert e.spec.placement.node_affinity == affinity


def test_unknown_crd_field_named_with_path():
    doc = yaml.safe_load(EXAMPLE.read_text())
    doc["spec"]["kvCacheSpec"]["enableL3Cache"] = True
    (msg,) = _problems(yaml.safe_dump(doc))
    assert msg.startswith("spec.kvCacheSpec.enableL3Cache: unknown field")
    assert "enableL1Cache" in msg


def test_bad_routing_strategy_lists_hyperpod_names():
    doc = yaml.safe_load(EXAMPLE.read_text())
    doc["spec"]["intelligentRoutingSpec"]["routingStrategy"] = "leastload"
    (msg,) = _problems(yaml.safe_dump(doc))
    assert msg.startswith("spec.intelligentRoutingSpec.routingStrategy:")
    assert "'prefixaware', 'kvaware', 'session' or 'roundrobin'" in msg


def test_l2_cache_spec_without_its_backend_is_named():  # found by the spec fuzzer: was a KeyError
    doc = yaml.safe_load(EXAMPLE.read_text())
    doc["spec"]["kvCacheSpec"]["enableL2Cache"] = True
    doc["spec"]["kvCacheSpec"]["l2CacheSpec"] = {"l2CacheLocalUrl": "redis:6379"}
    (msg,) = _problems(yaml.safe_dump(doc))
    assert msg.startswith("spec.kvCacheSpec.l2CacheSpec.l2CacheBackend:") and "redis, tieredstorage" in msg


def test_source_details_required():
    doc = yaml.safe_load(EXAMPLE.read_text())
    del doc["spec"]["modelSourceConfig"]["s3Storage"]
    assert any("requires modelSourceConfig.s3Storage" in m for m in _problems(yaml.safe_dump(doc)))


def test_huggingface_and_fsx_sources():
    doc = yaml.safe_load(EXAMPLE.read_text())
    doc["spec"]["modelSourceConfig"] = {
        "modelSourceType": "huggingface",
        "huggingFaceModel": {"modelId": "Qwen/Qwen2-7B-Instruct", "commitSHA": "a" * 40},
    }
    e = load_spec_text(yaml.safe_dump(doc)).endpoint
    assert e.spec.model.source == "hf:Qwen/Qwen2-7B-Instruct" and e.spec.model.revision == "a" * 40
    doc["spec"]["modelSourceConfig"] = {"modelSourceType": "fsx", "modelLocation": "deepseek-1-5b",
                                        "fsxStorage": {"fileSystemId": "fs-1234", "mountName": "fsx"}}
    e = load_spec_text(yaml.safe_dump(doc)).endpoint
    assert e.spec.model.source == "/fsx/deepseek-1-5b"
    # mountName is the file system's name in the mount command (HyperPod's CLI writes it): it had become the folder
    doc["spec"]["modelSourceConfig"]["fsxStorage"] = {"fileSystemId": "fs-1234", "mountName": "e3pfzb4v",
                                                     "dnsName": "fs-1234.fsx.us-west-2.amazonaws.com"}
    assert load_spec_text(yaml.safe_dump(doc)).endpoint.spec.model.source == "/fsx/deepseek-1-5b"


def test_without_intelligent_routing_uses_alb_algorithm():
    doc = yaml.safe_load(EXAMPLE.read_text())
    del doc["spec"]["intelligentRoutingSpec"]
    assert load_spec_text(yaml.safe_dump(doc)).endpoint.spec.routing.strategy == "leastload"
    doc["spec"]["loadBalancer"]["routingAlgorithm"] = "round_robin"
    assert load_spec_text(yaml.safe_dump(doc)).endpoint.spec.routing.strategy == "roundrobin"


def test_an_image_neither_vllm_nor_sglang_runs_as_given_with_a_warning():
    doc = yaml.safe_load(EXAMPLE.read_text())
    doc["spec"]["worker"]["image"] = "763104351884.dkr.ecr.us-west-2.amazonaws.com/djl-inference:0.32.0"
    loaded = load_spec_text(yaml.safe_dump(doc))
    assert loaded.endpoint.spec.engine.kind == "container"
    assert "spec.worker.image" in {w.path for w in loaded.warnings}


# --- against the shipped CRD (spec/data, v1) -----------------------------------------------------------------

def test_shipped_crd_is_the_vendored_one():
    import hashlib
    from importlib import resources

    from fleetserve.spec import hyperpod

    data = resources.files("fleetserve.spec").joinpath("data", hyperpod.CRD_FILE).read_bytes()
    assert len(data) == 456058 and hashlib.sha256(data).hexdigest()[:16] == "de0fab82c890cfe6"
    assert hyperpod.crd()["spec"]["names"]["kind"] == "InferenceEndpointConfig"
    assert "worker" in hyperpod.crd_schema()["properties"]["spec"]["properties"]


def test_example_conforms_to_the_real_crd():
    from fleetserve.spec.hyperpod import schema_problems

    assert schema_problems(yaml.safe_load(EXAMPLE.read_text())) == []
    assert schema_problems(yaml.safe_load(AUDIT)) == []


def test_wrong_type_names_its_path_and_value():
    doc = yaml.safe_load(EXAMPLE.read_text())
    doc["spec"]["replicas"] = "two"
    doc["spec"]["worker"]["modelInvocationPort"]["containerPort"] = "http"
    msgs = _problems(yaml.safe_dump(doc))
    assert "spec.replicas: expected an integer (got 'two')" in msgs
    assert "spec.worker.modelInvocationPort.containerPort: expected an integer (got 'http')" in msgs


def test_enum_and_required_in_our_style():
    doc = yaml.safe_load(EXAMPLE.read_text())
    doc["spec"]["autoScalingSpec"]["prometheusTrigger"]["metricType"] = "Averge"
    del doc["spec"]["worker"]["image"]
    msgs = _problems(yaml.safe_dump(doc))
    assert "spec.autoScalingSpec.prometheusTrigger.metricType: got 'Averge'; allowed values: 'Value' or 'Average'" \
        in msgs
    assert "spec.worker.image: required field is missing" in msgs


def test_unknown_field_in_a_kubernetes_object_of_the_crd():
    doc = yaml.safe_load(EXAMPLE.read_text())
    doc["spec"]["worker"]["probes"] = {"readinessProbe": {"httpGet": {"path": "/health", "port": 8000},
                                                          "periodSecond": 5}}
    msgs = _problems(yaml.safe_dump(doc))
    assert msgs[0].startswith("spec.worker.probes.readinessProbe.periodSecond: unknown field; allowed fields:")
    assert "periodSeconds" in msgs[0]


def test_kubernetes_volume_source_needs_its_volume():
    doc = yaml.safe_load(AUDIT)
    doc["spec"]["kubernetes"]["volumes"] = []
    msgs = _problems(yaml.safe_dump(doc))
    assert any("needs a volume named 'weights'" in m for m in msgs)


def test_gpu_requests_that_differ_from_the_limits_are_refused_as_in_our_own_spec():
    """They rendered the limit without a word (a fleetserve spec with the same mismatch is refused), and the
    API server refuses such a pod."""
    doc = yaml.safe_load(EXAMPLE.read_text())
    doc["spec"]["worker"]["resources"] = {"requests": {"nvidia.com/gpu": "1"}, "limits": {"nvidia.com/gpu": "2"}}
    msgs = _problems(yaml.safe_dump(doc))
    assert any("spec.worker.resources.requests.nvidia.com/gpu" in m and "limits.nvidia.com/gpu of the same" in m
               for m in msgs), msgs


def test_a_gpu_count_with_a_unit_is_refused_naming_the_field():
    """500m, 1k or 2Gi became 0 GPUs without a word: a vLLM pod without a GPU, which never starts."""
    doc = yaml.safe_load(EXAMPLE.read_text())
    for bad in ("500m", "1k", "2Gi", "1.5"):
        doc["spec"]["worker"]["resources"] = {"requests": {"nvidia.com/gpu": bad}, "limits": {"nvidia.com/gpu": bad}}
        msgs = _problems(yaml.safe_dump(doc))
        assert any(m.startswith("spec.worker.resources.limits.nvidia.com/gpu") and "whole number of GPUs" in m
                   and repr(bad) in m for m in msgs), (bad, msgs)
    doc["spec"]["worker"]["resources"] = {"requests": {"nvidia.com/gpu": 2}, "limits": {"nvidia.com/gpu": "2"}}
    assert load_spec_text(yaml.safe_dump(doc)).endpoint.spec.engine.gpus == 2


def test_names_become_valid_kubernetes_names():
    doc = yaml.safe_load(EXAMPLE.read_text())
    doc["metadata"]["name"] = "3B_Chat." + "x" * 60 + "-y"
    doc["metadata"]["namespace"] = "2024-team"
    meta = load_spec_text(yaml.safe_dump(doc)).endpoint.metadata
    assert meta.name.startswith("ep-3b-chat-xx") and len(meta.name) <= 63 and not meta.name.endswith("-")
    assert meta.namespace == "2024-team"  # a namespace may start with a digit; it is not renamed


#: every field of the audit (fields accepted but dropped silently before), with a value
AUDIT = """
apiVersion: inference.sagemaker.aws.amazon.com/v1
kind: InferenceEndpointConfig
metadata:
  name: audit
  namespace: team-a
  labels: {team: a}
  annotations: {owner: platform}
spec:
  modelName: audit-model
  instanceType: ml.g5.8xlarge
  modelSourceConfig:
    modelSourceType: kubernetesVolume
    modelLocation: llama
  worker:
    image: vllm/vllm-openai:v0.10.0
    command: ["python3", "-m", "vllm.entrypoints.openai.api_server"]
    workingDir: /workspace
    args: ["--max-model-len", "4096"]
    resources:
      limits: {nvidia.com/gpu: "1", memory: 30Gi}
      requests: {cpu: "6", nvidia.com/gpu: "1"}
    modelInvocationPort: {containerPort: 8000}
    modelVolumeMount: {name: weights, mountPath: /opt/ml/model}
    environmentVariables:
      - {name: LOG_LEVEL, value: info}
      - name: API_TOKEN
        valueFrom: {secretKeyRef: {name: api, key: token}}
    probes:
      readinessProbe: {httpGet: {path: /health, port: 8000}, periodSeconds: 7}
      livenessProbe: {httpGet: {path: /health, port: 8000}, failureThreshold: 9}
  kubernetes:
    schedulerName: gpu-scheduler
    serviceAccountName: model-reader
    initContainers:
      - {name: warm, image: busybox:1.36, command: ["true"]}
    volumes:
      - name: weights
        persistentVolumeClaim: {claimName: llama-weights}
      - name: scratch
        emptyDir: {}
  metrics:
    enabled: true
    metricsScrapeIntervalSeconds: 30
    modelMetrics: {path: /stats, port: 9100}
  autoScalingSpec:
    minReplicaCount: 1
    maxReplicaCount: 3
    prometheusTrigger:
      query: sum(vllm:num_requests_running)
      serverAddress: https://aps-workspaces.us-west-2.amazonaws.com/workspaces/ws-0123
      targetValue: 4
      metricType: Value
      useCachedMetrics: true
      customHeaders: X-Scope-OrgID=team-a
      namespace: team-a
"""

HF_TOKEN = """
apiVersion: inference.sagemaker.aws.amazon.com/v1
kind: InferenceEndpointConfig
metadata: {name: hf}
spec:
  modelName: hf
  instanceType: ml.g5.xlarge
  modelSourceConfig:
    modelSourceType: huggingface
    huggingFaceModel:
      modelId: Qwen/Qwen2-7B-Instruct
      tokenSecretRef: {name: hf-token, key: token}
  worker:
    image: vllm/vllm-openai:v0.10.0
    resources: {limits: {nvidia.com/gpu: 1}}
    modelInvocationPort: {containerPort: 8000}
    modelVolumeMount: {name: model}
"""


def test_audit_fields_are_carried_into_our_spec():
    loaded = load_spec_text(AUDIT)
    e = loaded.endpoint
    assert e.metadata.labels == {"team": "a"} and e.metadata.annotations == {"owner": "platform"}
    eng = e.spec.engine
    assert eng.command == ["python3", "-m", "vllm.entrypoints.openai.api_server"]
    assert eng.working_dir == "/workspace"
    assert eng.probes["readinessProbe"]["periodSeconds"] == 7
    assert eng.resources == {"limits": {"memory": "30Gi"}, "requests": {"cpu": "6"}} and eng.gpus == 1
    assert eng.env == {"LOG_LEVEL": "info"}
    assert eng.env_from == {"API_TOKEN": {"secretKeyRef": {"name": "api", "key": "token"}}}
    assert e.spec.model.source == "/opt/ml/model/llama" and e.spec.model.mount_path == "/opt/ml/model"
    assert e.spec.model.volume == {"persistentVolumeClaim": {"claimName": "llama-weights"}}
    assert e.spec.pod.scheduler_name == "gpu-scheduler" and e.spec.pod.service_account_name == "model-reader"
    assert [v["name"] for v in e.spec.pod.volumes] == ["scratch"]
    assert e.spec.metrics.scrape_interval_seconds == 30
    assert (e.spec.metrics.model_metrics_path, e.spec.metrics.model_metrics_port) == ("/stats", 9100)
    t = e.spec.autoscaling.triggers[0]
    assert (t.metric_type, t.use_cached_metrics, t.custom_headers) == ("Value", True, "X-Scope-OrgID=team-a")
    assert t.namespace == "team-a"  # KEDA's namespaced queries (Thanos): it had been dropped with a warning
    tok = load_spec_text(HF_TOKEN).endpoint.spec.model.token_secret
    assert (tok.name, tok.key) == ("hf-token", "token")


def test_audit_fields_warn_locally_never_silently():
    paths = {w.fleetserve_path: w.message for w in load_spec_text(AUDIT).warnings}
    for path in ("metadata.labels", "metadata.annotations", "spec.engine.command", "spec.engine.workingDir",
                 "spec.engine.probes", "spec.engine.resources", "spec.engine.env", "spec.engine.envFrom",
                 "spec.model.mountPath", "spec.model.volume", "spec.pod",
                 "spec.metrics.modelMetrics",
                 "spec.autoscaling.triggers[0].useCachedMetrics", "spec.autoscaling.triggers[0].customHeaders",
                 "spec.autoscaling.triggers[0].namespace"):
        assert "applies to Kubernetes rendering only" in paths[path], path
    assert "spec.autoscaling.triggers[0].metricType" not in paths  # the local controller and simulator read it
    # the scrape interval takes effect locally when the fleet runs its own Prometheus (fleet/prometheus.py)
    from fleetserve.fleet import prometheus

    assert ("spec.metrics.scrapeIntervalSeconds" in paths) == (prometheus.binary() is None)
    hf = {w.fleetserve_path: w.message for w in load_spec_text(HF_TOKEN).warnings}
    assert "applies to Kubernetes rendering only" in hf["spec.model.tokenSecret"]


def test_builtin_engine_port_warns_locally():
    doc = {"apiVersion": "fleetserve.io/v1", "kind": "Endpoint", "metadata": {"name": "p"},
           "spec": {"model": {"source": "builtin:smollm2-135m"}, "engine": {"port": 9000}}}
    paths = {w.path for w in load_spec_text(yaml.safe_dump(doc)).warnings}
    assert "spec.engine.port" in paths


def test_without_kv_cache_spec_nothing_is_offloaded():
    """HyperPod offloads KV to CPU memory only when kvCacheSpec is given; our own L1 default switched on LMCache
    (vLLM) or HiCache (SGLang) for a spec that asked for no cache tier."""
    doc = yaml.safe_load(EXAMPLE.read_text())
    del doc["spec"]["kvCacheSpec"]
    kv = load_spec_text(yaml.safe_dump(doc)).endpoint.spec.kv_cache
    assert not kv.l1.enabled and not kv.l2.enabled
    assert load_spec(EXAMPLE).endpoint.spec.kv_cache.l1.enabled  # given: its L1 default holds


def test_model_metrics_without_a_port_names_the_port_the_server_listens_on():
    """HyperPod's CRD defaults modelMetrics.port to 8080; a model server on 30000 (SGLang's habit) or 8000 then is
    scraped where nothing listens and every model_* / vllm:* panel stays empty without a word."""
    doc = yaml.safe_load(EXAMPLE.read_text())
    doc["spec"]["metrics"]["modelMetrics"] = {"path": "/metrics"}
    doc["spec"]["worker"]["modelInvocationPort"]["containerPort"] = 30000
    loaded = load_spec_text(yaml.safe_dump(doc))
    assert loaded.endpoint.spec.metrics.model_metrics_port == 8080  # the CRD's default is honoured
    message = {w.path: w.message for w in loaded.warnings}["spec.metrics.modelMetrics.port"]
    assert "30000" in message and "8080" in message
    assert "spec.metrics.modelMetrics.port" not in {w.path for w in load_spec(EXAMPLE).warnings}  # port: 8000 given
    doc["spec"]["worker"]["modelInvocationPort"]["containerPort"] = 8080  # the default is where it listens
    assert "spec.metrics.modelMetrics.port" not in {w.path for w in load_spec_text(yaml.safe_dump(doc)).warnings}


@pytest.mark.parametrize("old,new,path", [
    ("targetValue: 8", "targetValue: -8", "spec.autoScalingSpec.prometheusTrigger.targetValue"),
    ('"--max-model-len", "4096"', '"--max-model-len", "abc"', "spec.worker.args"),
])
def test_errors_after_the_mapping_name_the_hyperpod_field(old, new, path):
    """A HyperPod user was told about spec.autoscaling.triggers[0].target, a field their document has not."""
    text = EXAMPLE.read_text()
    assert old in text
    with pytest.raises(SpecError) as info:
        load_spec_text(text.replace(old, new))
    (problem,) = info.value.problems
    assert problem.path == path and "fleetserve's spec." in problem.message, problem


def test_worker_args_that_repeat_what_the_adapter_sets_are_accepted_and_a_named_model_path_dropped():
    """An InferenceEndpointConfig whose args repeat the tensor size and the served name (the values fleetserve
    sets) was refused; `--model PATH` was refused where the same path given positionally is dropped with a word."""
    from fleetserve.spec.load import load_spec_data

    doc = yaml.safe_load(EXAMPLE.read_text())
    doc["spec"]["worker"]["args"] = ["--model", "/opt/ml/model", "--max-model-len", "4096",
                                     "--tensor-parallel-size", "1", "--served-model-name", doc["spec"]["modelName"]]
    loaded = load_spec_data(doc)
    assert "--model" not in loaded.endpoint.spec.engine.args
    assert any(w.path == "spec.worker.args" and "'--model /opt/ml/model' dropped" in w.message
               for w in loaded.warnings)


def _loaded(mutate):
    from fleetserve.spec.load import load_spec_data

    doc = yaml.safe_load(EXAMPLE.read_text())
    mutate(doc["spec"])
    return load_spec_data(doc)


def test_an_image_neither_vllm_nor_sglang_runs_as_given():
    """AWS's DJL/LMI and TGI samples rendered their own image with `fleetserve engine ...` as its command line
    (the pod crash-looped), then the built-in engine in fleetserve's image instead of theirs. They run as given:
    their entrypoint, arguments and port, SageMaker's /ping and /invocations for DJL-LMI, /health for TGI."""
    def djl(spec):
        spec["worker"]["image"] = "763104351884.dkr.ecr.us-east-2.amazonaws.com/djl-inference:0.32.0-lmi14.0.0-cu124"
        spec["worker"]["command"] = ["dockerd-entrypoint.sh"]
        spec["worker"]["args"] = ["--model-id", "/opt/ml/model"]
        spec.pop("loadBalancer")  # its healthCheckPath would be the one probed
        spec["invocationEndpoint"] = "invocations"  # the CRD's default

    loaded = _loaded(djl)
    engine = loaded.endpoint.spec.engine
    assert (engine.kind, engine.command, engine.args) == ("container", ["dockerd-entrypoint.sh"],
                                                          ["--model-id", "/opt/ml/model"])
    assert "djl-inference" in engine.image and engine.health_path == "/ping"
    assert engine.invocation_path == "/invocations" and engine.port == 8000
    assert not loaded.endpoint.spec.kv_cache.l1.enabled  # no tier of ours inside someone else's image
    (why,) = [w.message for w in loaded.warnings if w.path == "spec.worker.image" and "runs as given" in w.message]
    assert "/invocations" in why
    tgi = _loaded(lambda spec: spec.update(invocationEndpoint="v1/chat/completions", loadBalancer={}) or
                  spec["worker"].update(image="ghcr.io/huggingface/text-generation-inference:3.0"))
    assert (tgi.endpoint.spec.engine.kind, tgi.endpoint.spec.engine.health_path,
            tgi.endpoint.spec.engine.invocation_path) == ("container", "/health", None)
    loaded = _loaded(lambda spec: spec["worker"].update(image="registry.example/fleetserve:1.2"))
    assert loaded.endpoint.spec.engine.kind == "builtin"  # our own image runs the built-in engine
    assert loaded.endpoint.spec.engine.image == "registry.example/fleetserve:1.2"


@pytest.mark.parametrize("image, args, kept", [
    # AWS's SGLang sample: the launcher, and the port and host the adapter sets itself
    ("lmsysorg/sglang:latest", ["python3", "-m", "sglang.launch_server", "--port", "8000", "--host", "0.0.0.0",
                                "--tp", "1"], ["--tp", "1"]),
    # AWS's vLLM sample: --port as containerPort (it was refused: "use engine.port", a field HyperPod has not)
    ("vllm/vllm-openai:v0.8.4", ["--port", "8000", "--download-dir", "/opt/ml/model"],
     ["--download-dir", "/opt/ml/model"]),
    ("vllm/vllm-openai:v0.8.4", ["vllm", "serve", "/opt/ml/model", "--port=9000"], []),
])
def test_worker_args_lose_the_launcher_port_and_host_the_adapter_writes(image, args, kept):
    loaded = _loaded(lambda spec: spec["worker"].update(image=image, args=args))
    assert loaded.endpoint.spec.engine.args == kept
    said = " ".join(w.message for w in loaded.warnings if w.path == "spec.worker.args")
    assert "--port" in said and "worker.modelInvocationPort.containerPort 8000" in said


def test_hyperpod_packs_replicas_onto_larger_instances_as_kubernetes_does():
    """A 1-GPU replica on ml.p4d.24xlarge: verify refused every replica (allowLargerInstances, which HyperPod has
    no field for) while render k8s placed eight to a node."""
    loaded = _loaded(lambda spec: spec.update(instanceType="ml.p4d.24xlarge"))
    assert loaded.endpoint.spec.capacity.allow_larger_instances
    assert not [w for w in loaded.warnings if "no replica would start" in w.message]


def test_null_fields_are_pruned_as_the_api_server_prunes_them():
    """`hyp`'s template writes `modelVersion:` empty; the API server drops the null, so HyperPod accepts it."""
    loaded = _loaded(lambda spec: spec.update(modelVersion=None, tags=None))
    assert loaded.endpoint.spec.model.version == "1"


def test_settings_the_gateway_does_not_honour_are_warned():
    loaded = _loaded(lambda spec: spec.update(invocationEndpoint="generate",
                                              loadBalancer={"routingAlgorithm": "round_robin"}))
    warned = {w.path: w.message for w in loaded.warnings}
    assert "/invocations, /v1/chat/completions, /v1/completions" in warned["spec.invocationEndpoint"]
    assert "'round_robin' not used" in warned["spec.loadBalancer.routingAlgorithm"]
    for served in (None, "invocations", "/invocations", "v1/chat/completions"):  # the CRD's default is served
        quiet = _loaded(lambda spec, path=served: spec.update(invocationEndpoint=path))
        assert "spec.invocationEndpoint" not in {w.path for w in quiet.warnings}


def test_each_cloudwatch_trigger_of_a_list_is_named_in_the_warning():
    """A list of two (Invocations, ModelLatency) became one concurrency trigger under a warning that named
    `cloudWatchTrigger`, a field the document did not have."""
    def two(spec):
        spec["autoScalingSpec"].pop("prometheusTrigger", None)
        spec["autoScalingSpec"]["cloudWatchTriggerList"] = [
            {"name": "inv", "metricName": "Invocations", "metricStat": "Sum", "targetValue": 10},
            {"name": "lat", "metricName": "ModelLatency", "metricStat": "Average", "targetValue": 500,
             "metricType": "Value"}]

    loaded = _loaded(two)
    warned = {w.path: w.message for w in loaded.warnings if "cloudWatch" in w.path}
    assert set(warned) == {"spec.autoScalingSpec.cloudWatchTriggerList[0]",
                           "spec.autoScalingSpec.cloudWatchTriggerList[1]"}
    assert "'Invocations Sum 10'" in warned["spec.autoScalingSpec.cloudWatchTriggerList[0]"]
    assert [t.metric for t in loaded.endpoint.spec.autoscaling.triggers] == ["concurrency"]


@pytest.mark.parametrize("args", [["--download-dir", "/tmp", "--port"], ["--host"], ["--served-model-name"]])
def test_a_flag_last_without_its_value_is_no_traceback(args):
    """`--port` as the last argument raised IndexError in the mapping: validate and the webhook failed."""
    from fleetserve.spec.load import load_spec_data

    doc = yaml.safe_load(EXAMPLE.read_text())
    doc["spec"]["worker"]["args"] = args
    try:
        load_spec_data(doc)
    except SpecError as exc:  # refused naming the flag is fine; a traceback is not
        assert args[-1] in str(exc) and "without a value" in str(exc)


def test_an_lmcache_config_file_reaches_vllm_and_is_said_to_override_the_spec():
    """kvCacheSpec.cacheConfigFile was dropped while its warning said it was passed to vLLM."""
    doc = yaml.safe_load(EXAMPLE.read_text())
    doc["spec"]["kvCacheSpec"]["cacheConfigFile"] = "/opt/ml/model/lmcache.yaml"
    loaded = load_spec_text(yaml.safe_dump(doc))
    assert loaded.endpoint.spec.engine.kind == "vllm"
    assert loaded.endpoint.spec.engine.env["LMCACHE_CONFIG_FILE"] == "/opt/ml/model/lmcache.yaml"
    assert "instead of" in {w.path: w.message for w in loaded.warnings}["spec.kvCacheSpec.cacheConfigFile"]


def test_an_sglang_worker_over_four_gpus_with_l1_gets_a_host_cache_it_can_start():
    """The 2 GiB default over 4 ranks is under SGLang's whole GB a rank: the spec was refused, naming
    kvCacheSpec.l1.maxBytes, a field HyperPod does not have. The conversion sizes it: a GiB a rank."""
    def sglang(spec):
        spec["worker"].update(image="lmsysorg/sglang:latest", args=["--tp", "4"])
        spec["worker"]["resources"] = {"requests": {"nvidia.com/gpu": "4"}, "limits": {"nvidia.com/gpu": "4"}}
        spec["instanceType"] = "ml.g5.12xlarge"
        spec["kvCacheSpec"] = {"enableL1Cache": True}

    engine = _loaded(sglang).endpoint.spec
    assert engine.engine.kind == "sglang" and engine.engine.gpus == 4
    assert engine.kv_cache.l1.enabled and engine.kv_cache.l1.max_bytes == 4 << 30


def test_every_field_a_translated_warning_or_error_names_is_in_hyperpods_crd():
    """Warnings named spec.worker.kind and spec.worker.gpus, fields HyperPod's worker does not have (the engine is
    read from worker.image, GPUs from worker.resources)."""
    import re

    from fleetserve.spec.hyperpod import _SOURCES, crd_schema

    def exists(path: str) -> bool:
        node = crd_schema()
        for part in re.sub(r"\[[^]]*\]", "", path).split("."):
            props = node.get("properties") or (node.get("items") or {}).get("properties") or {}
            base = re.sub(r"\((s|List)\)$", "", part)
            found = [props[n] for n in (base, part.replace("(s)", "s").replace("(List)", "List")) if n in props]
            if not found:
                return False
            node = found[0]
        return True

    missing = [theirs for _, theirs in _SOURCES if not theirs.startswith("metadata.") and not exists(theirs)]
    assert missing == []
    for w in load_spec(EXAMPLE).warnings:
        assert w.path in ("spec.endpointName", "spec.metrics") or exists(w.path), w.path


def test_warnings_and_errors_name_the_fields_the_user_wrote_not_the_mappings_defaults():
    """A HyperPod file was warned about useCachedMetrics (the mapping's default, not in the file), and problems named
    `spec.instanceType(s)`, `spec.autoScalingSpec.prometheusTrigger(List)` and `spec.kvCacheSpec.l2.url`: fields no
    HyperPod file has."""
    said = {w.path: w.message for w in load_spec(EXAMPLE).warnings}
    assert not [p for p in said if "useCachedMetrics" in p], said
    assert "spec.instanceType" in said and "spec.instanceType(s)" not in said
    empty = yaml.safe_load(EXAMPLE.read_text())
    empty["spec"]["autoScalingSpec"]["prometheusTrigger"]["useCachedMetrics"] = None  # left empty: not written
    assert not [w for w in load_spec_text(yaml.safe_dump(empty)).warnings if "useCachedMetrics" in w.path]
    doc = yaml.safe_load(EXAMPLE.read_text())
    doc["spec"]["autoScalingSpec"]["prometheusTrigger"]["useCachedMetrics"] = True  # written: warned
    assert any(w.path == "spec.autoScalingSpec.prometheusTrigger.useCachedMetrics"
               for w in load_spec_text(yaml.safe_dump(doc)).warnings)
    doc["spec"]["autoScalingSpec"]["prometheusTrigger"]["targetValue"] = -1
    (msg,) = _problems(yaml.safe_dump(doc))
    assert msg.startswith("spec.autoScalingSpec.prometheusTrigger.targetValue"), msg
    listed = yaml.safe_load(EXAMPLE.read_text())
    trigger = listed["spec"]["autoScalingSpec"].pop("prometheusTrigger")
    listed["spec"]["autoScalingSpec"]["prometheusTriggerList"] = [trigger, {**trigger, "targetValue": -1}]
    (msg,) = _problems(yaml.safe_dump(listed))
    assert msg.startswith("spec.autoScalingSpec.prometheusTriggerList[1].targetValue"), msg
    url = yaml.safe_load(EXAMPLE.read_text())
    url["spec"]["kvCacheSpec"]["l2CacheSpec"]["l2CacheLocalUrl"] = "http://redis:6379"
    (msg,) = _problems(yaml.safe_dump(url))
    assert msg.startswith("spec.kvCacheSpec.l2CacheSpec.l2CacheLocalUrl"), msg


def test_a_value_a_pattern_refuses_is_told_in_words_not_by_the_regular_expression():
    """`requests.memory: lots` said "does not match the pattern '^(\\+|-)?(([0-9]+(\\.[0-9]*)?)..." and a budget's
    `nodes: abc` "String should match pattern '^\\d+%?$'"."""
    doc = yaml.safe_load(EXAMPLE.read_text())
    doc["spec"]["worker"]["resources"].setdefault("requests", {})["memory"] = "lots"
    (msg,) = _problems(yaml.safe_dump(doc))
    assert msg == "spec.worker.resources.requests.memory: expected a Kubernetes quantity, like 30Gi, 500m or 2 " \
                  "(got 'lots')", msg
    ours = {"apiVersion": "fleetserve.io/v1", "kind": "Endpoint", "metadata": {"name": "b"},
            "spec": {"model": {"source": "builtin:smollm2-135m"},
                     "capacity": {"consolidation": {"budgets": [{"nodes": "abc"}]}}}}
    (msg,) = _problems(yaml.safe_dump(ours))
    assert msg == "spec.capacity.consolidation.budgets[0].nodes: expected a count or a percentage, like 1 or 10% " \
                  "(got 'abc')", msg



def test_an_sglang_host_cache_warning_names_the_hyperpod_switch_and_a_gpu_less_engine_reads_whole():
    """An SGLang image warned on `spec.kvCacheSpec.l1.maxBytes`, a field HyperPod has not, and a GPU-less vLLM
    worker read "spec.worker.resources: 0 for a vllm engine"."""
    doc = yaml.safe_load(EXAMPLE.read_text())
    doc["spec"]["worker"]["image"] = "lmsysorg/sglang:v0.4.9"
    doc["spec"]["worker"]["resources"] = {"limits": {"nvidia.com/gpu": 4}, "requests": {"nvidia.com/gpu": 4}}
    said = {w.path: w.message for w in load_spec_text(yaml.safe_dump(doc)).warnings}
    assert not [p for p in said if p.startswith("spec.kvCacheSpec.l1")], said
    assert "SGLang's host cache" in said["spec.kvCacheSpec.enableL1Cache"]  # the switch the file has
    none = yaml.safe_load(EXAMPLE.read_text())
    none["spec"]["worker"]["resources"] = {"limits": {}, "requests": {}}
    said = {w.path: w.message for w in load_spec_text(yaml.safe_dump(none)).warnings}
    assert said["spec.worker.resources"].startswith("a vllm engine given no GPU"), said


def test_a_hyperpod_name_longer_than_a_dns_label_is_warned():
    """A 76-character HyperPod name was cut to 63 without a word: two endpoints sharing their first 63 characters
    were the same endpoint."""
    import yaml

    from fleetserve.spec.load import load_spec_data

    doc = yaml.safe_load(EXAMPLE.read_text())
    doc["metadata"]["name"] = "n" * 76
    loaded = load_spec_data(doc)
    name = loaded.endpoint.metadata.name
    assert len(name) == 63 and name.startswith("n" * 54 + "-")  # and 8 hex digits of the whole name
    assert any("metadata.name" in str(w) and "76 characters" in str(w) for w in loaded.warnings), loaded.warnings


def test_a_namespace_is_taken_as_given_and_a_rewritten_name_is_said():
    """`NS_A` rendered into namespace ns-a, a 70-character one was cut to 63, both without a word; the name
    `3B_Chat` became ep-3b-chat unsaid. A namespace Kubernetes holds is a DNS label already: one that is not is
    an error naming metadata.namespace; an empty one is default."""
    doc = yaml.safe_load(EXAMPLE.read_text())
    for bad, said in (("NS_A", "is not a DNS label"), ("x" * 70, "at most 63 characters")):
        doc["metadata"]["namespace"] = bad
        with pytest.raises(SpecError) as caught:
            load_spec_text(yaml.safe_dump(doc))
        assert "metadata.namespace" in str(caught.value) and said in str(caught.value)
    doc["metadata"]["namespace"] = ""
    loaded = load_spec_text(yaml.safe_dump(doc))
    assert loaded.endpoint.metadata.namespace == "default"
    doc["metadata"]["name"] = "3B_Chat"
    warned = {w.path: w.message for w in load_spec_text(yaml.safe_dump(doc)).warnings}
    assert "'ep-3b-chat'" in warned["metadata.name"]


def test_a_trigger_beside_a_list_is_warned_and_warnings_name_the_routing_strategy_field():
    """prometheusTrigger beside prometheusTriggerList was dropped without a word; the kvaware warning named
    spec.intelligentRoutingSpec.strategy, a field HyperPod does not have (it is routingStrategy)."""
    import copy

    doc = yaml.safe_load(EXAMPLE.read_text())
    trigger = doc["spec"]["autoScalingSpec"]["prometheusTrigger"]
    doc["spec"]["autoScalingSpec"]["prometheusTriggerList"] = [copy.deepcopy(trigger)]
    doc["spec"]["intelligentRoutingSpec"]["routingStrategy"] = "kvaware"
    warned = {w.path: w.message for w in load_spec_text(yaml.safe_dump(doc)).warnings}
    assert "prometheusTriggerList is given too" in warned["spec.autoScalingSpec.prometheusTrigger"]
    assert "spec.intelligentRoutingSpec.routingStrategy" in warned


def test_resource_claims_are_refused_naming_the_field_not_a_traceback():
    """`worker.resources.claims`, which the CRD allows (a list), crashed the mapping (exit 1, AttributeError); ours
    was rendered into the container without the pod's resourceClaims, which the API server refuses."""
    doc = yaml.safe_load(EXAMPLE.read_text())
    doc["spec"]["worker"]["resources"]["claims"] = [{"name": "gpu"}]
    with pytest.raises(SpecError) as info:
        load_spec_text(yaml.safe_dump(doc))
    (problem,) = info.value.problems
    assert problem.path == "spec.worker.resources" and problem.message.startswith("claims: "), problem
    assert "resourceClaims" in problem.message
    ours = ("apiVersion: fleetserve.io/v1\nkind: Endpoint\nmetadata: {name: c}\nspec:\n  model: {source: hf:o/m}\n"
            "  engine: {kind: vllm, gpus: 1, resources: {claims: [{name: gpu}]}}\n")
    with pytest.raises(SpecError) as info:
        load_spec_text(ours)
    (problem,) = info.value.problems
    assert problem.path == "spec.engine.resources" and "claims: " in problem.message, problem


def test_long_names_that_begin_alike_stay_two_endpoints():
    """A name over 63 characters was cut to 63: two endpoints whose names began alike rendered the same objects,
    each apply taking the other's (found in review)."""
    names = []
    for tail in ("alpha", "bravo"):
        doc = yaml.safe_load(EXAMPLE.read_text())
        doc["metadata"]["name"] = "llama-" * 12 + tail
        loaded = load_spec_text(yaml.safe_dump(doc))
        names.append(loaded.endpoint.metadata.name)
        (said,) = [w.message for w in loaded.warnings if w.path == "metadata.name"]
        assert "the last 8 characters stand for the whole name" in said
    assert names[0] != names[1] and all(len(n) <= 63 and n[:54] == names[0][:54] for n in names), names


def test_a_resource_exported_from_a_cluster_is_accepted_as_is():
    """`kubectl get ... -o yaml` adds status, uid, resourceVersion, creationTimestamp, finalizers and kubectl's
    last-applied annotation: such a HyperPod file (and one of ours) exited 2 "unknown field"."""
    import yaml

    from fleetserve.spec.load import load_spec_data

    for example in ("hyperpod.yaml", "quickstart.yaml"):
        data = yaml.safe_load((Path(__file__).parents[2] / "examples" / example).read_text())
        plain = load_spec_data(data).endpoint
        data["metadata"].update(uid="5f1c", resourceVersion="123456", generation=1,
                                creationTimestamp="2025-07-01T10:00:00Z", finalizers=["x.io/finalizer"],
                                annotations={**data["metadata"].get("annotations", {}),
                                             "kubectl.kubernetes.io/last-applied-configuration": "{}"})
        data["status"] = {"state": "DeploymentComplete"}
        loaded = load_spec_data(data)
        assert loaded.endpoint == plain, example  # nothing of it reaches the endpoint (no annotation on the pods)
        (note,) = [w for w in loaded.warnings if "exported from a cluster" in w.message]
        assert "metadata.uid" in note.message and "status" in note.message and note.everywhere
    data["metadata"]["generateName"] = "x-"  # what a user may write is still checked
    with pytest.raises(SpecError) as exc:
        load_spec_data(data)
    assert "metadata.generateName" in str(exc.value)


def test_an_l2_local_url_is_checked_as_our_own_l2_url_is():
    """`l2CacheLocalUrl: not a url` rendered LMCACHE_REMOTE_URL redis://not a url:6379 without a word."""
    doc = yaml.safe_load(EXAMPLE.read_text())
    doc["spec"]["kvCacheSpec"] = {"enableL2Cache": True,
                                  "l2CacheSpec": {"l2CacheBackend": "redis", "l2CacheLocalUrl": "not a url"}}
    msgs = _problems(yaml.safe_dump(doc))
    assert any(m.startswith("spec.kvCacheSpec.l2CacheSpec.l2CacheLocalUrl") and "no host name" in m for m in msgs), msgs


def test_settings_read_otherwise_than_written_are_said():
    """pollingInterval 0 became 30, a routingStrategy beside enabled: false was dropped, and a metrics path vLLM never
    serves was scraped: each without a word."""
    doc = yaml.safe_load(EXAMPLE.read_text())
    doc["spec"]["autoScalingSpec"]["pollingInterval"] = 0
    doc["spec"]["intelligentRoutingSpec"] = {"enabled": False, "routingStrategy": "kvaware"}
    doc["spec"]["metrics"] = {"enabled": True, "modelMetrics": {"path": "/custom/metrics", "port": 8000}}
    loaded = load_spec_text(yaml.safe_dump(doc))
    said = {w.path: w.message for w in loaded.warnings}
    assert "0 is read as 30 s" in said["spec.autoScalingSpec.pollingInterval"]
    assert loaded.endpoint.spec.autoscaling.polling_interval == 30
    assert "'kvaware' not used" in said["spec.intelligentRoutingSpec.routingStrategy"]
    assert "serves its metrics at /metrics only" in said["spec.metrics.modelMetrics.path"]


SAMPLES = Path(__file__).parents[1] / "data" / "hyperpod"


def test_a_v1alpha1_document_is_read_as_v1_and_checked_against_its_own_schema():
    """HyperPod's own v1alpha1 samples (the CRD still serves that version) were refused: "apiVersion: got ...;
    allowed values: fleetserve.io/v1/Endpoint, ..." (the kinds glued onto the versions)."""
    text = (SAMPLES / "v1alpha1_s3_deepseek15b.yaml").read_text()
    alpha = load_spec_text(text)
    v1 = load_spec_text(text.replace("/v1alpha1", "/v1"))
    assert alpha.source_format == "hyperpod" and alpha.endpoint == v1.endpoint
    assert [str(w) for w in alpha.warnings] == [str(w) for w in v1.warnings]
    assert alpha.endpoint.spec.model.source == "s3://model-data-578732889311/deepseek15b"
    # v1alpha1's own rules: instanceType is required there, and a v1-only field is unknown
    doc = yaml.safe_load(text)
    del doc["spec"]["instanceType"]
    assert _problems(yaml.safe_dump(doc)) == ["spec.instanceType: required field is missing"]
    doc = yaml.safe_load(text)
    doc["spec"]["intelligentRoutingSpec"] = {"enabled": True}
    (msg,) = _problems(yaml.safe_dump(doc))
    assert msg.startswith("spec.intelligentRoutingSpec: unknown field; allowed fields: ") and "worker" in msg


def test_an_unknown_api_version_or_a_jumpstart_model_says_what_is_read():
    (msg,) = _problems("apiVersion: inference.sagemaker.aws.amazon.com/v2\nkind: InferenceEndpointConfig\n")
    assert msg == ("apiVersion: got 'inference.sagemaker.aws.amazon.com/v2'; allowed: fleetserve.io/v1 (kind "
                   "Endpoint), inference.sagemaker.aws.amazon.com/v1 or v1alpha1 (kind InferenceEndpointConfig)")
    (msg,) = _problems("apiVersion: inference.sagemaker.aws.amazon.com/v1\nkind: JumpStartModel\nspec: {}\n")
    assert msg.startswith("kind: JumpStartModel: a SageMaker JumpStart hub model") and "catalog:NAME" in msg
    (msg,) = _problems("apiVersion: fleetserve.io/v1\nkind: JumpStartModel\n")
    assert msg == "kind: got 'JumpStartModel'; allowed value for fleetserve.io/v1: 'Endpoint'"


def test_a_mig_slice_is_rendered_as_written_and_said_to_be_costed_as_whole_gpus():
    """HyperPod's MIG deployments request nvidia.com/mig-3g.20gb: validate said nothing, render warned "the pod
    requests no nvidia.com/gpu" (it requests a slice), and verify billed a whole ml.p4d.24xlarge per replica."""
    from fleetserve.k8s.render import render

    doc = yaml.safe_load((SAMPLES / "v1alpha1_s3_deepseek15b.yaml").read_text().replace("/v1alpha1", "/v1"))
    doc["spec"]["instanceType"] = "ml.p4d.24xlarge"
    doc["spec"]["worker"]["resources"] = {"requests": {"nvidia.com/mig-3g.20gb": 1, "cpu": "5600m", "memory": "10Gi"},
                                          "limits": {"nvidia.com/mig-3g.20gb": 1}}
    loaded = load_spec_text(yaml.safe_dump(doc))
    said = [str(w) for w in loaded.warnings if "MIG" in w.message]
    assert len(said) == 1 and said[0].startswith("spec.worker.resources: requests the MIG slice(s) "
                                                 "nvidia.com/mig-3g.20gb") and "whole instance apiece" in said[0]
    assert loaded.warnings[[str(w) for w in loaded.warnings].index(said[0])].everywhere  # simulate and render too
    rendered = render(loaded.endpoint)
    assert not [w for w in rendered.warnings if "requests no nvidia.com/gpu" in w.message]
    # a vLLM image on a slice: the MIG note, not "given no GPU ... cannot run"
    vllm = yaml.safe_load(EXAMPLE.read_text())
    for section in vllm["spec"]["worker"]["resources"].values():
        section["nvidia.com/mig-3g.20gb"] = section.pop("nvidia.com/gpu")
    said = [str(w) for w in load_spec_text(yaml.safe_dump(vllm)).warnings]
    assert [w for w in said if "MIG slice" in w] and not [w for w in said if "given no GPU" in w], said
    (engine,) = [o for o in rendered.objects if o["kind"] == "Deployment" and o["metadata"]["name"].endswith("engine")]
    container = engine["spec"]["template"]["spec"]["containers"][0]
    assert container["resources"]["limits"]["nvidia.com/mig-3g.20gb"] == 1


def test_every_pattern_of_a_field_a_user_writes_is_told_in_words():
    """HyperPod's published samples carry `<PLACEHOLDER_TLS_CERT_S3_URI>`, refused as "does not match the pattern
    '^s3://([^/]+)/?(.*)$'": a regular expression where the values allowed should be named."""
    from fleetserve.spec.errors import pattern_hint
    from fleetserve.spec.hyperpod import crd_schema

    def patterns(node, path):
        if isinstance(node, dict):
            if isinstance(node.get("pattern"), str):
                yield path, node["pattern"]
            for key, child in (node.get("properties") or {}).items():
                yield from patterns(child, f"{path}.{key}")
            for key in ("items", "additionalProperties"):
                yield from patterns(node.get(key), f"{path}[]")

    found = list(patterns(crd_schema()["properties"]["spec"], "spec"))
    assert len(found) > 20 and [(p, r) for p, r in found if not pattern_hint(r)] == []
    doc = yaml.safe_load(EXAMPLE.read_text())
    doc["spec"]["tlsConfig"] = {"tlsCertificateOutputS3Uri": "<PLACEHOLDER_TLS_CERT_S3_URI>"}
    (msg,) = _problems(yaml.safe_dump(doc))
    assert msg == "spec.tlsConfig.tlsCertificateOutputS3Uri: expected an s3:// URI, like s3://my-bucket/certs " \
                  "(got '<PLACEHOLDER_TLS_CERT_S3_URI>')", msg


def test_notes_name_the_fields_the_document_has_and_what_a_path_of_its_own_does():
    """A spec placed by nodeAffinity alone was warned on `spec.instanceType`, a field it has not; a TGI image's
    invocationEndpoint `generate` read "the gateway serves /invocations, ..., not this path", while the router does
    send the image its requests on /generate."""
    said = {w.path: str(w) for w in load_spec(SAMPLES / "v1_nvme_k8s_volume.yaml").warnings}
    assert "spec.instanceType" not in said and "capacity.provider is 'local'" in said["spec.nodeAffinity"]
    doc = yaml.safe_load(EXAMPLE.read_text())
    doc["spec"]["worker"]["image"] = "ghcr.io/huggingface/text-generation-inference:3.0"
    doc["spec"]["invocationEndpoint"] = "generate"
    loaded = load_spec_text(yaml.safe_dump(doc))
    assert loaded.endpoint.spec.engine.invocation_path == "/generate"
    said = {w.path: w.message for w in loaded.warnings}
    assert said["spec.invocationEndpoint"] == ("'generate': clients call the gateway on /invocations, "
                                               "/v1/chat/completions, /v1/completions (not this path), and the "
                                               "gateway sends their requests to the image on /generate")
    doc["spec"]["invocationEndpoint"] = "v1/embeddings"  # an OpenAI path: the image gets OpenAI's own paths
    loaded = load_spec_text(yaml.safe_dump(doc))
    assert loaded.endpoint.spec.engine.invocation_path is None
    said = {w.path: w.message for w in loaded.warnings}
    assert said["spec.invocationEndpoint"].endswith("the gateway serves /invocations, /v1/chat/completions, "
                                                    "/v1/completions, not this path")
