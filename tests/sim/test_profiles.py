import json
from pathlib import Path

import pytest

from fleetserve.sim.perf import PerfProfile
from fleetserve.sim.profiles import PRESETS, ProfileError, load_profile_file, profile_from_dict, resolve
from tests.helpers import fleetserve


def said(result) -> str:
    """stderr with rich's box borders and line wrapping undone."""
    return " ".join(result.stderr.replace("│", " ").split())


def test_presets_cover_common_gpus_and_models_with_sources():
    gpus = {d["gpu"] for d in PRESETS.values()}
    assert {"A10G", "L4", "L40S", "A100-40GB", "H100-80GB"} <= gpus
    assert {d["model"] for d in PRESETS.values()} == {"llama-3.1-8b", "llama-3.1-70b"}
    for name, data in PRESETS.items():
        p = resolve(name)
        assert isinstance(p, PerfProfile) and p.cache_blocks > 0, name
        assert "datasheet" in data["source"] or "Baseten" in data["source"], name
        assert "config.json" in data["source"], name


def test_presets_order_hardware_and_models_sensibly():
    a10g, h100 = resolve("a10g-llama-8b"), resolve("h100-llama-8b")
    assert h100.prefill_time(4096) < a10g.prefill_time(4096) / 5
    assert h100.decode_time(1, 2048) < a10g.decode_time(1, 2048) / 3
    assert h100.cache_blocks > 5 * a10g.cache_blocks  # 80 GB vs 24 GB, same 16 GB of weights
    assert PRESETS["h100-x4-llama-70b"]["kv_bytes_per_token"] == 327_680  # 80 layers x 8 heads x 128 x 2 x 2
    assert PRESETS["h100-llama-8b"]["kv_bytes_per_token"] == 131_072


def test_profile_dicts_take_declared_fields_and_name_what_is_missing(tmp_path):
    data = {**PRESETS["l4-llama-8b"], "measurements": {"anything": 1}, "future_field": 3}
    assert profile_from_dict(data).name == "l4-llama-8b"
    with pytest.raises(ProfileError, match="lacks decode_base_s"):
        profile_from_dict({k: v for k, v in data.items() if k != "decode_base_s"})
    bad = tmp_path / "p.json"
    bad.write_text("{not json")
    with pytest.raises(ProfileError, match="p.json: not JSON"):
        load_profile_file(bad)
    with pytest.raises(ProfileError, match="allowed: a10g-llama-8b"):
        resolve("tpu-9000")
    later = tmp_path / "v9.json"  # a later format may mean other units: refused, not misread
    later.write_text(json.dumps({**PRESETS["l4-llama-8b"], "format": "fleetserve.profile/v9"}))
    with pytest.raises(ProfileError, match="format 'fleetserve.profile/v9' is not one this version reads"):
        load_profile_file(later)


def test_a_profile_file_without_a_chunk_budget_gets_vllms_default_not_whole_prompt_steps(tmp_path):
    """A hand-written file without prefill_chunk prefilled every admitted prompt whole in one step, so a short
    prompt got its first token when the longest beside it was done; no current engine schedules so."""
    from fleetserve.sim.profiles import FILE_DEFAULT_PREFILL_CHUNK

    hand = tmp_path / "hand.json"
    hand.write_text(json.dumps({k: v for k, v in PRESETS["l4-llama-8b"].items() if k != "prefill_chunk"}))
    assert load_profile_file(hand).prefill_chunk == FILE_DEFAULT_PREFILL_CHUNK == 2048
    stated = tmp_path / "stated.json"
    stated.write_text(json.dumps({**PRESETS["l4-llama-8b"], "prefill_chunk": 512}))
    assert load_profile_file(stated).prefill_chunk == 512


@pytest.mark.parametrize("field, value, says", [
    ("max_batch", 0, "max_batch must be a whole number from 1"),  # simulate hung: nothing was admitted
    ("prefill_chunk", 0, "prefill_chunk must be a whole number from 1"),  # hung too
    ("block_size", 0, "block_size must be a whole number from 1"),  # ZeroDivisionError
    ("cache_blocks", -5, "cache_blocks must be a whole number from 1"),
    ("cache_blocks", 10**400, "cache_blocks must be a whole number from 1"),  # was an OverflowError
    ("max_batch", 2.5, "max_batch must be a whole number"),
    ("prefill_base_s", -1, "prefill_base_s must not be negative"),  # gave 0 ms latencies, exit 0
    ("load_s", -100, "load_s must not be negative"),
    ("l2_gbps", 0, "l2_gbps must be above 0"),
    ("decode_base_s", float("nan"), "decode_base_s must be a number"),
    ("decode_base_s", 1e4, "decode_base_s must be at most 60 seconds"),  # simulate ran for ever
    ("prefill_per_token_s", 1e300, "prefill_per_token_s must be at most 60 seconds"),
    ("load_s", 1e5, "load_s must be at most 3600 seconds"),
    ("request_overhead_samples", [float("inf")], "request_overhead_samples must be a list of seconds"),
    ("cache_blocks", True, "cache_blocks must be a number"),
])
def test_profile_values_out_of_range_are_refused_naming_the_field(field, value, says):
    with pytest.raises(ProfileError, match=says):
        profile_from_dict({**PRESETS["l4-llama-8b"], field: value})


def test_a_bad_profile_file_is_exit_2_before_anything_runs(tmp_path):
    import subprocess
    import sys

    data = {**PRESETS["l4-llama-8b"], "max_batch": 0}
    path = tmp_path / "p.json"
    path.write_text(__import__("json").dumps(data))
    trace = tmp_path / "t.jsonl"
    trace.write_text('{"timestamp": 0, "input_length": 100, "output_length": 5, "hash_ids": [1]}\n')
    spec = tmp_path / "s.yaml"
    spec.write_text("apiVersion: fleetserve.io/v1\nkind: Endpoint\nmetadata: {name: p}\n"
                    "spec: {model: {source: 'builtin:smollm2-135m'}}\n")
    done = subprocess.run([sys.executable, "-m", "fleetserve", "simulate", str(spec), "--trace", str(trace),
                           "--profile", str(path)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "max_batch" in done.stderr, done.stdout + done.stderr


def test_profile_command_measures_the_tiny_model(tmp_path):
    from fleetserve.engine.tiny import create_tiny_model

    tiny_model = create_tiny_model(tmp_path / "tiny-gqa", heads=4, kv_heads=1, context_length=512)  # 1 KV head
    out = tmp_path / "profile.json"
    result = fleetserve("profile", "--model", str(tiny_model), "--json", "-o", str(out), "--threads", "1",
                        "--repeats", "2", "--batches", "1,4", "--max-prompt", "128", "--max-batch", "6")
    assert result.returncode == 0, result.stderr
    data = json.loads(out.read_text())
    assert json.loads(result.stdout) == data
    config = json.loads((tiny_model / "config.json").read_text())
    head_dim = config["hidden_size"] // config["num_attention_heads"]
    width = {"float32": 4, "bfloat16": 2, "float16": 2}[data["dtype"]]
    assert data["kv_bytes_per_token"] == config["num_hidden_layers"] * config["num_key_value_heads"] * head_dim * 2 \
        * width
    m = data["measurements"]
    assert [p["tokens"] for p in m["prefill"]] == [32, 64, 128]
    assert {(d["batch"], d["context"]) for d in m["decode"]} >= {(1, 64), (4, 64)}
    assert all(p["seconds"] > 0 for p in m["prefill"]) and all(d["step_s"] > 0 for d in m["decode"])
    assert data["load_s"] > 0 and data["cache_blocks"] == (512 << 20) // (data["kv_bytes_per_token"] * 256)
    # the cold start is an engine process's, start to /health 200: the model's load is a part of it (the load alone
    # had verify pass a scale-from-zero spec whose live cold starts took twice as long)
    assert data["load_s"] == m["load_s"] > 0 and m["model_load_s"] > 0
    profile = load_profile_file(out)  # what the simulator builds from the file
    assert profile.prefill_time(128) > 0 and profile.decode_time(4, 256) > 0
    assert profile.max_batch == 6  # the engine's limit, not the largest batch measured (--batches 1,4 set 4)
    assert isinstance(data["warnings"], list)  # a noisy fit is said (fit_warnings); a quiet one says nothing
    assert all(f"warning: {w}" in " ".join(result.stderr.split()) for w in data["warnings"])
    # a cache that holds no block makes a profile every reader refuses: refused here, naming the option
    result = fleetserve("profile", "--model", str(tiny_model), "--cache-bytes", "100", "--batches", "1",
                        "--repeats", "1", "--max-prompt", "64")
    assert result.returncode == 2 and "--cache-bytes" in said(result) and "bytes per block" in said(result)
    # the block size is half of it: a block too large for the cache blamed --cache-bytes alone
    result = fleetserve("profile", "--model", str(tiny_model), "--block-size", "100000000", "--batches", "1",
                        "--repeats", "1", "--max-prompt", "64")
    assert result.returncode == 2 and "--cache-bytes/--block-size" in said(result)


def test_profile_bad_input_exits_2():
    result = fleetserve("profile", "--model", "builtin:nope")
    assert result.returncode == 2 and "--model" in said(result)
    result = fleetserve("profile", "--model", "x", "--batches", "1,zero")
    assert result.returncode == 2 and "--batches" in said(result)
    result = fleetserve("profile", "--model", "x", "--batches", "1,,2")  # the empty item was dropped silently
    assert result.returncode == 2 and "--batches" in said(result)
    # one prompt length (32) gives no per-token slope: the fit said 0 s/token and blamed a busy machine
    result = fleetserve("profile", "--model", "x", "--max-prompt", "32")
    assert result.returncode == 2 and "--max-prompt" in said(result)
    # 100,000 threads could not start: a traceback and a segfault (exit 139)
    result = fleetserve("profile", "--model", "x", "--threads", "100000")
    assert result.returncode == 2 and "--threads" in said(result) and "1024" in said(result)


def test_profile_never_writes_over_the_model_or_a_read_only_file(tiny_model, tmp_path):
    """`-o MODEL/config.json` replaced the model's config (the next profile of it was a traceback), and a read-only
    file was overwritten, where simulate --report, plan -o and trace scale -o refuse both."""
    config = (tiny_model / "config.json").read_text()
    result = fleetserve("profile", "--model", str(tiny_model), "-o", str(tiny_model / "config.json"))
    assert result.returncode == 2 and "--output" in said(result) and "inside the model folder" in said(result)
    assert (tiny_model / "config.json").read_text() == config
    locked = tmp_path / "locked.json"
    locked.write_text("{}")
    locked.chmod(0o444)
    result = fleetserve("profile", "--model", str(tiny_model), "-o", str(locked))
    assert result.returncode == 2 and "read-only" in said(result) and locked.read_text() == "{}"


def test_presets_schedule_with_vllms_own_budgets_per_gpu():
    """vLLM's OpenAI server: 8,192 tokens and 1,024 sequences per step on >= 70 GiB GPUs other than the A100,
    2,048 and 256 elsewhere (EngineArgs.get_batch_defaults)."""
    for name, (chunk, seqs) in {"h100-llama-8b": (8192, 1024), "h100-x4-llama-70b": (8192, 1024),
                                "a100-llama-8b": (2048, 256), "l40s-llama-8b": (2048, 256),
                                "a10g-llama-8b": (2048, 256)}.items():
        assert (PRESETS[name]["prefill_chunk"], PRESETS[name]["max_batch"]) == (chunk, seqs), name


def test_the_coarse_presets_chunk_prefill_so_a_short_prompt_is_not_held_for_a_long_one():
    """h100-8b and a10g-8b prefilled every admitted prompt in one step, so a 2,000-token prompt admitted with a
    40,000-token one got its first token when the long one did (2 s on h100-8b); vLLM V1 chunks at its budget
    and serves the prompts in order, so the first prompt's first token comes at its own time."""
    from fleetserve.sim.perf import profile
    from fleetserve.sim.replica import ReplicaModel, Seq

    assert (profile("h100-8b").prefill_chunk, profile("a10g-8b").prefill_chunk) == (8192, 2048)
    prof = profile("h100-8b")
    model = ReplicaModel(prof)
    short, long = Seq(2_000, 1), Seq(40_000, 1)
    model.add(short)
    model.add(long)
    t, first = 0.0, {}
    while (d := model.begin_step()) is not None:
        t += d
        for s in model.end_step(t)[0]:
            first[s.id] = t
    assert first[short.id] < prof.prefill_time(8_192) + 1e-9 < first[long.id]


def test_a_70b_model_is_simulated_with_its_own_roofline_and_a_guess_is_said():
    """A 70B catalog model on 4 x L40S was simulated at an 8B's speed (TTFT 122 ms for 1,000 tokens where the 70B
    roofline gives 312) and plan verified it."""
    from fleetserve.sim.run import simulate
    from fleetserve.sim.setup import SimOptions
    from fleetserve.spec.load import load_spec_data
    from fleetserve.traces.model import TraceRequest

    def endpoint(model: dict, types: list[str]):
        return load_spec_data({"apiVersion": "fleetserve.io/v1", "kind": "Endpoint", "metadata": {"name": "m"},
                               "spec": {"model": model, "replicas": 1, "placement": {"instanceTypes": types}}}
                              ).endpoint

    one = [TraceRequest(0.0, 1000, 1, (1, 2))]
    big = simulate(endpoint({"source": "catalog:llama-3.1-70b-instruct"}, ["g6e.12xlarge"]), one, SimOptions()).report
    l40s = resolve("l40s-x4-llama-70b")
    assert big["ttft_ms"]["p50"] == pytest.approx(l40s.prefill_time(1000) * 1000, rel=1e-3)
    assert big["warnings"] == []
    vague = simulate(endpoint({"source": "s3://models/house-model"}, ["g6e.xlarge"]), one, SimOptions()).report
    assert any("size is not in its name" in w and "--profile" in w for w in vague["warnings"])


@pytest.mark.parametrize("source, shape, guessed", [
    ("hf:meta-llama/Llama-3.1-70B-Instruct", "llama-3.1-70b", False),
    ("catalog:llama-3.1-8b-instruct", "llama-3.1-8b", False),
    ("hf:Qwen/Qwen2.5-72B-Instruct", "llama-3.1-70b", True),  # stood in for, and said so
    ("hf:mistralai/Mistral-7B-Instruct-v0.3", "llama-3.1-8b", True),
    ("s3://bucket/ckpt-3c70b91", "llama-3.1-8b", True),  # a hash, not a size
    ("hf:mistralai/Mixtral-8x7B-Instruct-v0.1", "llama-3.1-8b", True),  # no size of its own word
    ("hf:HuggingFaceTB/SmolLM2-135M-Instruct", "llama-3.1-8b", True),  # 0.135B, stood in for and said so
])
def test_the_model_shape_comes_from_a_stated_parameter_count(source, shape, guessed):
    from fleetserve.sim.setup import model_shape
    from fleetserve.spec.load import load_spec_data

    spec = load_spec_data({"apiVersion": "fleetserve.io/v1", "kind": "Endpoint", "metadata": {"name": "m"},
                           "spec": {"model": {"source": source}, "engine": {"kind": "vllm"}}}).endpoint.spec
    got, why = model_shape(spec)
    assert got == shape and bool(why) == guessed, (got, why)
    if "135M" in source:
        assert "a 0.135B model" in why


def test_a_size_in_millions_counts_in_the_models_name_only():
    from types import SimpleNamespace

    from fleetserve.capacity.model_fit import stated_size
    assert stated_size(SimpleNamespace(source="builtin:smollm2-135m", name=None), SimpleNamespace(args=[])) == 0.135
    assert stated_size(SimpleNamespace(source="s3://m/house", name=None),
                       SimpleNamespace(args=["--swap-space", "4m"])) is None


def test_a_model_its_gpus_cannot_hold_never_starts():
    """A 70B on one 24 GB A10G ran at the A10G's 8B speed (with a warning only) and verify passed it."""
    from fleetserve.sim.run import simulate
    from fleetserve.sim.setup import SimOptions
    from fleetserve.spec.load import load_spec_data
    from fleetserve.traces.model import TraceRequest

    endpoint = load_spec_data({"apiVersion": "fleetserve.io/v1", "kind": "Endpoint", "metadata": {"name": "m"},
                               "spec": {"model": {"source": "hf:meta-llama/Llama-3.3-70B-Instruct"},
                                        "engine": {"kind": "vllm", "gpus": 1}, "replicas": 1,
                                        "placement": {"instanceTypes": ["g5.2xlarge"]}}}).endpoint
    report = simulate(endpoint, [TraceRequest(0.0, 500, 10)], SimOptions()).report
    assert report["error_rate"] == 1.0 and report["replicas_max"] == 0
    assert any("no replica could be placed" in w and "GPU memory" in w for w in report["warnings"])


def test_a_fit_a_busy_machine_spoiled_is_said_not_written_in_silence():
    from fleetserve.analyze.measure import fit_warnings

    clean = [{"tokens": n, "seconds": 0.01 + 0.0001 * n} for n in (32, 64, 128, 256)]
    decodes = [{"batch": b, "context": c, "step_s": 0.002 + 0.0005 * b} for b in (1, 4) for c in (64, 256)]
    assert fit_warnings(clean, 0.0001, decodes, (0.01, 0.002, 0.0005, 0.0)) == []
    noisy = [{"tokens": 32, "seconds": 0.062}, {"tokens": 64, "seconds": 0.01}, {"tokens": 128, "seconds": 0.03},
             {"tokens": 512, "seconds": 0.018}]
    said = " ".join(fit_warnings(noisy, 0.0, decodes, (0.03, 0.002, 0.0005, 0.0)))
    assert "prefill_per_token_s is 0" in said and "64 tokens < 32" in said and "prefill fit explains" in said
    assert "measure again on a quiet one" in said


def test_a_profile_measured_on_another_model_is_said(tmp_path):
    """A tiny CPU model's profile simulated HyperPod's 8B spec at the tiny model's speed without a word."""
    measured = tmp_path / "tiny.json"
    measured.write_text(json.dumps({**PRESETS["l4-llama-8b"], "model": "/models/tiny"}))
    trace = str(Path(__file__).parents[1] / "data" / "mooncake_sample.jsonl")
    examples = Path(__file__).parents[2] / "examples"
    r = fleetserve("simulate", str(examples / "hyperpod.yaml"), "--trace", trace, "--limit", "5",
                   "--profile", str(measured), "--json")
    said = " ".join(r.stderr.split())
    assert r.returncode == 0, r.stderr
    assert "measured on /models/tiny; the spec serves s3://" in said


def test_profile_files_that_cannot_stand_for_an_engine_are_refused_naming_the_file(tmp_path):
    """A file nested past Python's recursion limit, bytes that are not UTF-8 and a 5,000-digit number were
    tracebacks; an engine that takes no time at all answered every request in 0 ms and passed verify; a file that
    is not there was "an unknown profile"."""
    base = dict(PRESETS["l4-llama-8b"])
    cases = {"deep.json": ("[" * 100_000 + "]" * 100_000, "nested too deeply"),
             "latin.json": (b'{"name": "\xe9"}', "not JSON"),
             "digits.json": ('{"cache_blocks": ' + "9" * 5000 + "}", "not JSON"),
             "zero.json": (json.dumps({**base, "prefill_base_s": 0, "prefill_per_token_s": 0, "decode_base_s": 0,
                                       "decode_per_seq_s": 0}), "are all 0")}
    for name, (content, says) in cases.items():
        path = tmp_path / name
        path.write_bytes(content if isinstance(content, bytes) else content.encode())
        with pytest.raises(ProfileError, match=says):
            load_profile_file(path)
    with pytest.raises(ProfileError, match="no such file"):
        resolve(str(tmp_path / "missing.json"))


def test_a_profile_of_the_same_model_under_another_source_form_is_not_another_model(tmp_path):
    """measured on builtin:smollm2-135m, the spec serving catalog:smollm2-135m: warned as another model."""
    from types import SimpleNamespace

    from fleetserve.cli.sim_commands import _profile_of_another_model

    path = tmp_path / "p.json"
    path.write_text(json.dumps({"model": "builtin:smollm2-135m"}))

    def spec(source):
        return SimpleNamespace(model=SimpleNamespace(source=source))

    for same in ("catalog:smollm2-135m", "builtin:smollm2-135m", str(tmp_path / "models" / "smollm2-135m")):
        assert _profile_of_another_model(str(path), spec(same)) is None, same
    assert "was measured on" in _profile_of_another_model(str(path), spec("catalog:llama-3.1-8b-instruct"))


def test_the_cold_start_measure_never_blocks_on_an_engine_that_writes_much(tmp_path, monkeypatch):
    """Found in review: the engine's stderr went to a pipe read only after it exited; an engine writing more than
    the pipe holds before it was ready (a long load's progress bar, a burst of warnings) blocked there, and the
    profile failed "not ready" after its timeout."""
    from fleetserve.analyze.measure import cold_start_s
    from fleetserve.engine.tiny import create_tiny_model

    model = create_tiny_model(tmp_path / "tiny", context_length=128)
    monkeypatch.setenv("PYTHONVERBOSE", "1")  # every import said on stderr: far more than a pipe holds
    assert 0 < cold_start_s(str(model), threads=1, timeout_s=240) < 240
