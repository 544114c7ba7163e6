"""GPU engine adapters (checked on what they generate: no GPU here) and the model catalog."""

import json

import pytest

from fleetserve.engine.adapters import launch_for, sglang_launch, vllm_launch
from fleetserve.engine.catalog import CATALOG, preset
from fleetserve.engine.sources import resolve_source
from fleetserve.spec import SpecError, load_spec_text
from tests.helpers import fleetserve

SPEC = """
apiVersion: fleetserve.io/v1
kind: Endpoint
metadata: {{name: gpu}}
spec:
  model: {{name: llama, source: "catalog:llama-3.1-8b-instruct", contextLength: 8192, dtype: bfloat16}}
  engine: {{kind: {kind}, gpus: 2, args: [--gpu-memory-utilization, "0.9"], env: {{HF_HOME: /cache}}}}
  kvCache: {{blockSize: 256, l1: {{enabled: true, maxBytes: 21474836480}}, l2: {{enabled: true, url: "redis://r:6379"}}}}
"""


def spec(kind):
    return load_spec_text(SPEC.format(kind=kind)).endpoint.spec


def test_vllm_command_line_and_lmcache_environment():
    launch = vllm_launch(spec("vllm"), "/opt/ml/model", 8000)
    argv = launch.argv
    assert argv[:3] == ["vllm", "serve", "/opt/ml/model"]
    assert argv[argv.index("--port") + 1] == "8000"
    assert argv[argv.index("--served-model-name") + 1] == "llama"
    assert argv[argv.index("--max-model-len") + 1] == "8192"
    assert argv[argv.index("--tensor-parallel-size") + 1] == "2"
    assert argv[argv.index("--dtype") + 1] == "bfloat16"
    assert "--enable-prefix-caching" in argv and argv[-2:] == ["--gpu-memory-utilization", "0.9"]
    assert "--enable-prompt-tokens-details" in argv  # cached_tokens in usage: what the blind router learns from
    connector = json.loads(argv[argv.index("--kv-transfer-config") + 1])
    assert connector == {"kv_connector": "LMCacheConnectorV1", "kv_role": "kv_both"}
    env = launch.env
    assert env["LMCACHE_CHUNK_SIZE"] == "256" and env["LMCACHE_LOCAL_CPU"] == "True"
    assert env["LMCACHE_MAX_LOCAL_CPU_SIZE"] == "20"
    assert env["LMCACHE_REMOTE_URL"] == "redis://r:6379" and env["LMCACHE_REMOTE_SERDE"] == "naive"
    assert env["PYTHONHASHSEED"] == "0" and env["HF_HOME"] == "/cache"
    assert launch.health_path == "/health" and launch.metrics_path == "/metrics"


def test_vllm_without_tiers_has_no_lmcache():
    s = load_spec_text(SPEC.format(kind="vllm").replace(
        'kvCache: {blockSize: 256, l1: {enabled: true, maxBytes: 21474836480}, l2: {enabled: true, url: "redis://r:6379"}}',
        "kvCache: {l1: {enabled: false}}")).endpoint.spec
    launch = vllm_launch(s, "/m", 8000)
    assert "--kv-transfer-config" not in launch.argv and "LMCACHE_CHUNK_SIZE" not in launch.env


def test_sglang_command_line():
    launch = sglang_launch(spec("sglang"), "/opt/ml/model", 30000)
    argv = launch.argv
    assert argv[:3] == ["python3", "-m", "sglang.launch_server"]
    assert argv[argv.index("--model-path") + 1] == "/opt/ml/model"
    assert argv[argv.index("--tp-size") + 1] == "2"
    assert argv[argv.index("--context-length") + 1] == "8192"
    assert "--enable-hierarchical-cache" in argv and "--enable-metrics" in argv
    assert "--enable-cache-report" in argv  # cached_tokens in usage: what the blind router learns from


def test_launch_for_rejects_builtin():
    with pytest.raises(ValueError, match="allowed: vllm, sglang"):
        launch_for(spec("builtin"), "/m", 1)


def test_catalog_presets_and_source():
    assert preset("smollm2-135m").engine == "builtin"
    assert all(p.instance_types for p in CATALOG.values())
    with pytest.raises(KeyError, match="allowed:"):
        preset("gpt-9")
    path = resolve_source("catalog:smollm2-135m")
    assert (path / "config.json").is_file()


def test_spec_rejects_unknown_catalog_model_and_warns_on_engine_mismatch():
    with pytest.raises(SpecError, match="unknown catalog model 'gpt-9'"):
        load_spec_text(SPEC.format(kind="vllm").replace("llama-3.1-8b-instruct", "gpt-9"))
    warnings = {w.path for w in load_spec_text(SPEC.format(kind="sglang")).warnings}
    assert "spec.engine.kind" in warnings


def test_models_list_cli():
    result = fleetserve("models", "list", "--json")
    assert result.returncode == 0
    presets = {p["name"]: p for p in json.loads(result.stdout)}
    assert {"smollm2-135m", "llama-3.1-8b-instruct"} <= set(presets)
    # the model's own maximum: the field's 0 ("same as the context") printed as 0
    assert presets["smollm2-135m"]["max_context"] == 8192 and presets["llama-3.1-8b-instruct"]["max_context"] == 131072
    table = fleetserve("models", "list").stdout  # a pipe: names and sources whole (they were cut to `llama-3.1…`)
    for p in presets.values():
        assert p["name"] in table and p["source"] in table, p["name"]


CATALOG_ONLY = """
apiVersion: fleetserve.io/v1
kind: Endpoint
metadata: {name: llama}
spec:
  model: {source: "catalog:llama-3.1-8b-instruct"}
"""


def test_a_catalog_source_fills_engine_gpus_args_and_instance_types():
    s = load_spec_text(CATALOG_ONLY).endpoint.spec
    p = preset("llama-3.1-8b-instruct")
    assert (s.engine.kind, s.engine.gpus) == ("vllm", 1)
    assert s.engine.args == ["--max-model-len", "8192"]
    assert s.placement.instance_types == list(p.instance_types)
    assert vllm_launch(s, "/m", 8000).argv.count("--max-model-len") == 1


def test_what_the_spec_gives_wins_over_the_catalog():
    text = CATALOG_ONLY + ("  engine: {kind: vllm, gpus: 2, args: [--max-model-len=4096, --enforce-eager]}\n"
                           "  placement: {instanceTypes: [ml.g6e.xlarge]}\n")
    s = load_spec_text(text).endpoint.spec
    assert s.engine.gpus == 2 and s.engine.args == ["--max-model-len=4096", "--enforce-eager"]
    assert s.placement.instance_types == ["ml.g6e.xlarge"]
    # another engine than the preset's: none of the preset's engine settings (vLLM flags are not SGLang's)
    s = load_spec_text(CATALOG_ONLY + "  engine: {kind: sglang}\n").endpoint.spec
    assert s.engine.args == [] and s.engine.gpus == 0 and s.placement.instance_types == []
    # node affinity instead of instance types: no instance types added (the two are exclusive)
    affinity = ("  placement: {nodeAffinity: {requiredDuringSchedulingIgnoredDuringExecution: "
                "{nodeSelectorTerms: []}}}\n")
    assert load_spec_text(CATALOG_ONLY + affinity).endpoint.spec.placement.instance_types == []
    # the CPU demo preset fills nothing GPU-shaped
    s = load_spec_text(CATALOG_ONLY.replace("llama-3.1-8b-instruct", "smollm2-135m")).endpoint.spec
    assert (s.engine.kind, s.engine.gpus, s.engine.args, s.placement.instance_types) == ("builtin", 0, [], [])


def test_render_of_a_catalog_only_spec_is_the_presets_deployment(tmp_path):
    spec = tmp_path / "llama.yaml"
    spec.write_text(CATALOG_ONLY)
    result = fleetserve("render", "k8s", str(spec), "-o", str(tmp_path / "out"))
    assert result.returncode == 0, result.stderr
    rendered = "\n".join(p.read_text() for p in sorted((tmp_path / "out").glob("*.yaml")))
    assert "vllm-openai:" in rendered and "--max-model-len" in rendered and "nvidia.com/gpu" in rendered
    assert "- g5.2xlarge" in rendered and "- g6e.xlarge" in rendered  # the nodes of the preset's types
