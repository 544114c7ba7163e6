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
    paths = {w.path for w in load_spec(EXAMPLE).warnings}
    assert "spec.endpointName" in paths
    assert "spec.tlsConfig.tlsCertificateOutputS3Uri" in paths
    assert "spec.engine.kind" in paths  # vLLM needs a GPU


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


def test_without_intelligent_routing_uses_alb_algorithm():
    doc = yaml.safe_load(EXAMPLE.read_text())
    del doc["spec"]["intelligentRoutingSpec"]
    assert load_spec_text(yaml.safe_dump(doc)).endpoint.spec.routing.strategy == "leastload"
    doc["spec"]["loadBalancer"]["routingAlgorithm"] = "round_robin"
    assert load_spec_text(yaml.safe_dump(doc)).endpoint.spec.routing.strategy == "roundrobin"


def test_builtin_image_falls_back_with_warning():
    doc = yaml.safe_load(EXAMPLE.read_text())
    doc["spec"]["worker"]["image"] = "763104351884.dkr.ecr.us-west-2.amazonaws.com/djl-inference:0.32.0"
    loaded = load_spec_text(yaml.safe_dump(doc))
    assert loaded.endpoint.spec.engine.kind == "builtin"
    assert "spec.worker.image" in {w.path for w in loaded.warnings}
