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
    names = {p["name"] for p in json.loads(result.stdout)}
    assert {"smollm2-135m", "llama-3.1-8b-instruct"} <= names
