"""GPU engine adapters (checked on what they generate: no GPU here) and the model catalog."""

import json

import pytest

from fleetserve.engine.adapters import args_after, launch_for, lmcache_url, sglang_launch, vllm_launch
from fleetserve.engine.catalog import CATALOG, preset
from fleetserve.engine.sources import resolve_source
from fleetserve.spec import SpecError, load_spec_text
from fleetserve.spec.effects import inert_settings
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


def test_a_tensor_parallel_flag_the_user_gives_is_not_repeated():
    """`--tensor-parallel-size 4` came twice (ours from engine.gpus, then the user's): harmless, untidy."""
    for launch, kind, flag in ((vllm_launch, "vllm", "--tensor-parallel-size"), (sglang_launch, "sglang", "--tp-size")):
        s = spec(kind)
        given = s.model_copy(update={"engine": s.engine.model_copy(update={"args": [f"{flag}=2"]})})
        argv = launch(given, "/m", 8000).argv
        assert sum(a.split("=")[0] == flag for a in argv) == 1, argv
        assert sum(a.split("=")[0] == flag for a in launch(s, "/m", 8000).argv) == 1  # engine.gpus alone


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
    assert env["LMCACHE_MAX_LOCAL_CPU_SIZE"] == "10"  # 20 GiB a replica: LMCache allocates it on each of 2 ranks
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


def test_sglang_host_cache_is_whole_gb_per_rank_and_off_unless_asked():
    """--hicache-size is an integer of GB (1e9 bytes) per GPU rank; SGLang (0.5.x) stops at start when it is not
    larger than the GPU's KV pool, so the default L1's 2 GiB is not turned on for SGLang."""
    argv = sglang_launch(spec("sglang"), "/m", 30000).argv  # 20 GiB over 2 ranks
    assert argv[argv.index("--hicache-size") + 1] == "10"
    default = load_spec_text(SPEC.format(kind="sglang").replace(
        'l1: {enabled: true, maxBytes: 21474836480}, ', "")).endpoint.spec
    assert not default.kv_cache.l1.enabled and "--enable-hierarchical-cache" not in sglang_launch(
        default, "/m", 1).argv
    assert load_spec_text(SPEC.format(kind="vllm").replace(  # vLLM keeps the default L1 (LMCache's CPU buffer)
        'l1: {enabled: true, maxBytes: 21474836480}, ', "")).endpoint.spec.kv_cache.l1.enabled
    with pytest.raises(SpecError, match=r"kvCache.l1.maxBytes.*whole GB.*at least 2000000000"):
        load_spec_text(SPEC.format(kind="sglang").replace("21474836480", "1500000000"))


def test_a_host_cache_below_the_gpu_kv_pool_is_warned_for_sglang():
    small = load_spec_text(SPEC.format(kind="sglang").replace(
        "kvCache:", "placement: {instanceTypes: [p5.48xlarge]}\n  kvCache:")).endpoint  # 10 GB a rank, 80 GB GPUs
    notes = {n.path: n.message for n in inert_settings(small)}
    assert "refuses to start" in notes["spec.kvCache.l1.maxBytes"], notes
    big = load_spec_text(SPEC.format(kind="sglang").replace("21474836480", "300000000000").replace(
        "kvCache:", "placement: {instanceTypes: [p5.48xlarge]}\n  kvCache:")).endpoint
    assert "spec.kvCache.l1.maxBytes" not in {n.path for n in inert_settings(big)}


def test_vllm_l2_only_sizes_lmcache_staging_and_the_url_gets_a_port():
    s = load_spec_text(SPEC.format(kind="vllm").replace(
        "l1: {enabled: true, maxBytes: 21474836480}", "l1: {enabled: false}").replace(
        "redis://r:6379", "redis://r")).endpoint.spec
    env = vllm_launch(s, "/m", 8000).env
    assert env["LMCACHE_LOCAL_CPU"] == "False" and env["LMCACHE_MAX_LOCAL_CPU_SIZE"] == "1"  # not its 5 GiB default
    assert env["LMCACHE_REMOTE_URL"] == "redis://r:6379"
    assert lmcache_url("rediss://:p@h/0") == "rediss://:p@h:6379/0" and lmcache_url("h:7000") == "redis://h:7000"
    assert lmcache_url("redis://[::1]") == "redis://[::1]:6379" and lmcache_url("redis://[::1]:1") == "redis://[::1]:1"
    assert lmcache_url("redis://h?ssl=1") == "redis://h:6379?ssl=1"  # the port went after the query
    with pytest.raises(SpecError, match=r"kvCache.l2.url.*not a unix socket"):
        load_spec_text(SPEC.format(kind="vllm").replace("redis://r:6379", "unix:///run/r.sock"))


@pytest.mark.parametrize("kind,command,expected", [
    ("vllm", ["vllm", "serve"], ["/m", "--host"]),
    ("vllm", ["/usr/local/bin/vllm"], ["serve", "/m", "--host"]),
    ("vllm", ["python3", "-m", "vllm.entrypoints.openai.api_server"], ["--model", "/m", "--host"]),
    ("sglang", ["python3", "-m", "sglang.launch_server"], ["--model-path", "/m", "--host"]),
    ("sglang", ["python3"], ["-m", "sglang.launch_server", "--model-path", "/m"]),
])
def test_a_replaced_entrypoint_gets_the_arguments_without_our_launcher(kind, command, expected):
    """HyperPod's worker.command replaced `vllm serve`, and `serve serve /m` (or a module without --model) exited."""
    argv = launch_for(spec(kind), "/m", 8000).argv
    args = args_after(kind, argv, command)
    assert args[:len(expected)] == expected and args.count("/m") == 1


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


@pytest.mark.parametrize("kind", ["vllm", "sglang"])
def test_kvaware_in_front_of_a_gpu_engine_says_it_routes_as_prefixaware(kind):
    """Neither publishes KV events the router reads: kvaware quietly became prefixaware."""
    endpoint = load_spec_text(SPEC.format(kind=kind) + "  routing: {strategy: kvaware}\n").endpoint
    assert "routes as prefixaware" in {n.path: n.message for n in inert_settings(endpoint)}["spec.routing.strategy"]
