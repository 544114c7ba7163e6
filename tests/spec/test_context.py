"""The context length a spec's engines enforce, as the simulator reads it (spec.model, or the engine's flag)."""

from pathlib import Path

import pytest

from fleetserve.spec import load_spec
from fleetserve.spec.context import context_limit
from fleetserve.spec.load import load_spec_data

EXAMPLES = Path(__file__).parents[2] / "examples"
LLAMA_MAXIMUM = (131072, "the model's own maximum (llama-3.1-8b-instruct, engine/catalog.py)")


def _spec(engine: dict, model: dict | None = None):
    return load_spec_data({"apiVersion": "fleetserve.io/v1", "kind": "Endpoint", "metadata": {"name": "c"},
                           "spec": {"model": {"source": "hf:meta-llama/Llama-3.1-8B-Instruct", **(model or {})},
                                    "engine": engine}}).endpoint.spec


@pytest.mark.parametrize("engine,model,expected", [
    ({"kind": "vllm", "args": ["--max-model-len", "8192"]}, None, (8192, "spec.engine.args --max-model-len")),
    ({"kind": "vllm", "args": ["--max-model-len=2048", "--dtype", "bfloat16"]}, None,
     (2048, "spec.engine.args --max-model-len")),
    ({"kind": "sglang", "args": ["--context-length", "4096"]}, None, (4096, "spec.engine.args --context-length")),
    ({"kind": "vllm", "args": ["--max-model-len", "1024"]}, {"contextLength": 1024},
     (1024, "spec.model.contextLength")),
    ({"kind": "vllm"}, {"contextLength": 1024}, (1024, "spec.model.contextLength")),
    ({"kind": "sglang", "args": ["--max-model-len", "8192"]}, None, LLAMA_MAXIMUM),  # not SGLang's flag
    ({"kind": "vllm", "args": ["--max-model-len", "4k"]}, None, (4000, "spec.engine.args --max-model-len")),
    ({"kind": "vllm", "args": ["--max-model-len=32K"]}, None, (32768, "spec.engine.args --max-model-len")),
    ({"kind": "vllm", "args": ["--max-model-len", "-1"]}, None, LLAMA_MAXIMUM),  # vLLM: the model's maximum
    ({"kind": "vllm", "args": ["--max-model-len", "auto"]}, None, LLAMA_MAXIMUM),
    ({"kind": "vllm", "args": ["--max-model-len", "200000"]}, None, LLAMA_MAXIMUM),  # vLLM would not start
    ({"kind": "builtin"}, None, None),
])
def test_context_limit_from_the_spec_or_the_engines_flag(engine, model, expected):
    assert context_limit(_spec(engine, model)) == expected


@pytest.mark.parametrize("args", [["--max-model-len"], ["--max-model-len", "abc"], ["--max-model-len=0"],
                                  ["--max-model-len", "-5"]])
def test_a_context_flag_the_engine_would_refuse_is_a_spec_error(args):
    """`plan` used to copy such a value into the spec it wrote; the engine would not have started."""
    from fleetserve.spec import SpecError

    with pytest.raises(SpecError, match="--max-model-len"):
        _spec({"kind": "vllm", "args": args})


def test_hyperpods_example_declares_its_limit_in_the_vllm_args():
    assert context_limit(load_spec(EXAMPLES / "hyperpod.yaml").endpoint.spec) == (
        4096, "spec.engine.args --max-model-len")


@pytest.mark.parametrize("engine,model", [
    ({"kind": "vllm", "args": ["/m", "--max-model-len", "4096"]}, None),
    ({"kind": "vllm", "args": ["--max-model-len=4096"]}, None),
    ({"kind": "sglang", "args": ["--context-length", "4096"]}, None),
    ({"kind": "vllm", "args": ["--max-model-len", "4096"]}, {"contextLength": 4096}),
])
def test_a_raised_limit_is_written_where_it_was_declared_and_read_back(engine, model):
    from fleetserve.spec.context import with_context_limit

    spec = _spec(engine, model)
    tokens, where = context_limit(spec)
    data = {"apiVersion": "fleetserve.io/v1", "kind": "Endpoint", "metadata": {"name": "c"},
            "spec": {"model": {"source": "hf:meta-llama/Llama-3.1-8B-Instruct", **(model or {})}, "engine": engine}}
    raised = load_spec_data(with_context_limit(data, 16384, where)).endpoint.spec
    assert tokens == 4096 and context_limit(raised) == (16384, where)


SMOLLM2_MAX = (8192, "the model's own maximum (smollm2-135m, engine/catalog.py)")


@pytest.mark.parametrize("source,model,expected", [
    ("builtin:smollm2-135m", {}, SMOLLM2_MAX),  # nothing declared: the engine serves the model's own 8,192
    ("catalog:smollm2-135m", {}, SMOLLM2_MAX),
    ("builtin:smollm2-135m", {"contextLength": 32768}, SMOLLM2_MAX),  # the runner clamps a longer one to it
    ("builtin:smollm2-135m", {"contextLength": 2048}, (2048, "spec.model.contextLength")),
    ("hf:HuggingFaceTB/SmolLM2-135M-Instruct", {}, None),  # not in the catalog: unknown without loading it
])
def test_the_builtin_engine_never_serves_more_than_the_models_own_maximum(source, model, expected):
    spec = load_spec_data({"apiVersion": "fleetserve.io/v1", "kind": "Endpoint", "metadata": {"name": "c"},
                           "spec": {"model": {"source": source, **model}, "engine": {"kind": "builtin"}}}
                          ).endpoint.spec
    assert context_limit(spec) == expected


def test_the_quickstart_serves_the_demo_models_context():
    assert context_limit(load_spec(EXAMPLES / "quickstart.yaml").endpoint.spec) == SMOLLM2_MAX


def test_a_context_given_twice_must_agree():
    """vLLM gets both flags and keeps the last (the args'): a spec that says 32768 and serves 8192 is refused."""
    from fleetserve.spec import SpecError

    with pytest.raises(SpecError, match="disagrees with model.contextLength 32768"):
        _spec({"kind": "vllm", "args": ["--max-model-len", "8192"]}, {"contextLength": 32768})


def test_a_catalog_models_context_replaces_the_presets_flag():
    """`catalog:llama-3.1-8b-instruct` brings `--max-model-len 8192`; a contextLength of its own wins, once."""
    from fleetserve.engine.adapters import vllm_launch

    spec = load_spec_data({"apiVersion": "fleetserve.io/v1", "kind": "Endpoint", "metadata": {"name": "c"},
                           "spec": {"model": {"source": "catalog:llama-3.1-8b-instruct", "contextLength": 32768}}}
                          ).endpoint.spec
    argv = vllm_launch(spec, "/models/current", 8000).argv
    assert argv.count("--max-model-len") == 1 and argv[argv.index("--max-model-len") + 1] == "32768"
    assert context_limit(spec) == (32768, "spec.model.contextLength")


def test_the_models_maximum_is_known_from_a_folder_named_like_a_preset_and_warned_past():
    """HyperPod specs load weights from S3 folders; a folder named as a preset's weights has its maximum, and a
    longer context is a warning (vLLM refuses to start with it)."""
    text = (EXAMPLES / "hyperpod.yaml").read_text().replace('"--max-model-len", "4096"', '"--max-model-len", "200000"')
    from fleetserve.spec.load import load_spec_text

    loaded = load_spec_text(text)
    assert context_limit(loaded.endpoint.spec) == LLAMA_MAXIMUM
    assert any("refuses to start" in w.message for w in loaded.warnings)
    unknown = _spec({"kind": "vllm", "args": ["--max-model-len", "auto"]}, {"source": "hf:acme/house-model"})
    assert context_limit(unknown) is None


def test_an_empty_context_keeps_the_presets_flag_and_external_servers_keep_their_own():
    """`contextLength:` with no value dropped the preset's --max-model-len 8192 (vLLM then took 131,072 on a
    24 GB GPU); an external server's context is its own business, not the catalog's."""
    spec = load_spec_data({"apiVersion": "fleetserve.io/v1", "kind": "Endpoint", "metadata": {"name": "c"},
                           "spec": {"model": {"source": "catalog:llama-3.1-8b-instruct", "contextLength": None}}}
                          ).endpoint.spec
    assert context_limit(spec) == (8192, "spec.engine.args --max-model-len, from the catalog:llama-3.1-8b-instruct "
                                         "preset's arguments (engine/catalog.py)")
    external = _spec({"kind": "external", "urls": ["http://x:8000"]}, {"contextLength": 200000})
    assert context_limit(external) == (200000, "spec.model.contextLength")


def test_every_preset_lists_the_context_its_arguments_serve():
    """`models list` showed 32,768 for qwen2.5-7b while its preset served --max-model-len 16384."""
    from fleetserve.engine.catalog import CATALOG
    from fleetserve.spec.context import ENGINE_FLAGS, flag_tokens

    for preset in CATALOG.values():
        flag = ENGINE_FLAGS.get(preset.engine)
        if flag in preset.args:
            served = flag_tokens(preset.engine, preset.args[preset.args.index(flag) + 1])
            assert served == preset.context_length <= preset.model_maximum, preset.name


def test_a_context_flag_the_catalog_filled_in_is_named_as_the_presets():
    spec = load_spec_data({"apiVersion": "fleetserve.io/v1", "kind": "Endpoint", "metadata": {"name": "q"},
                           "spec": {"model": {"source": "catalog:qwen2.5-7b-instruct"}}}).endpoint.spec
    tokens, where = context_limit(spec)
    assert tokens == 16384 and "catalog:qwen2.5-7b-instruct preset's arguments" in where
    own = _spec({"kind": "vllm", "args": ["--max-model-len", "4096"]})
    assert context_limit(own) == (4096, "spec.engine.args --max-model-len")


def test_the_builtin_engines_folder_model_is_bounded_by_its_config_as_the_engine_clamps_it(tiny_model):
    """The simulator served a tiny model's 5,000-token requests that the built-in engine refuses (its config's
    max_position_embeddings); a contextLength above it is clamped by the engine, below it holds."""
    import json

    native = json.loads((tiny_model / "config.json").read_text())["max_position_embeddings"]
    plain = load_spec_data({"apiVersion": "fleetserve.io/v1", "kind": "Endpoint", "metadata": {"name": "t"},
                            "spec": {"model": {"source": str(tiny_model)}}}).endpoint.spec
    tokens, where = context_limit(plain)
    assert tokens == native and "config.json: max_position_embeddings" in where
    shorter = load_spec_data({"apiVersion": "fleetserve.io/v1", "kind": "Endpoint", "metadata": {"name": "t"},
                              "spec": {"model": {"source": str(tiny_model), "contextLength": 64}}}).endpoint.spec
    assert context_limit(shorter) == (64, "spec.model.contextLength")


def test_a_presets_larger_fallback_types_are_usable_unless_the_spec_says_otherwise():
    """The 70B preset lists 8-GPU p4d and p5 for its 4-GPU replica: without allowLargerInstances no replica could
    ever be placed on them, and the simulator failed every request."""
    def loaded(extra: dict):
        return load_spec_data({"apiVersion": "fleetserve.io/v1", "kind": "Endpoint", "metadata": {"name": "b"},
                               "spec": {"model": {"source": "catalog:llama-3.1-70b-instruct"}, **extra}}
                              ).endpoint.spec
    assert loaded({}).capacity.allow_larger_instances
    assert not loaded({"capacity": {"allowLargerInstances": False}}).capacity.allow_larger_instances
    own_types = loaded({"placement": {"instanceTypes": ["ml.g6e.12xlarge"]}})
    assert not own_types.capacity.allow_larger_instances  # the spec's own types: its own choice


@pytest.mark.parametrize("config, expected", [
    ({"n_positions": 1024}, (1024, "n_positions")),  # GPT-2's name for it, which transformers maps
    ({"max_position_embeddings": 4096, "n_positions": 1024}, (4096, "max_position_embeddings")),
    ({"hidden_size": 64}, None),  # the class default, unknown here: no bound rather than a guess
])
def test_a_folder_models_context_is_read_under_its_architectures_name(tmp_path, config, expected):
    import json

    (tmp_path / "config.json").write_text(json.dumps(config))
    spec = load_spec_data({"apiVersion": "fleetserve.io/v1", "kind": "Endpoint", "metadata": {"name": "t"},
                           "spec": {"model": {"source": str(tmp_path)}}}).endpoint.spec
    got = context_limit(spec)
    assert (got[0], got[1].rsplit(": ", 1)[-1].rstrip(")")) == expected if expected else got is None


def test_a_block_size_the_models_own_context_cannot_fill_is_warned_by_validate(tiny_model):
    """The replica's log alone had said that nothing would be cached: the model's context came from its folder's
    config, which the warning did not read (it knew model.contextLength only)."""
    import json

    native = json.loads((tiny_model / "config.json").read_text())["max_position_embeddings"]
    doc = {"apiVersion": "fleetserve.io/v1", "kind": "Endpoint", "metadata": {"name": "b"},
           "spec": {"model": {"source": str(tiny_model)}, "kvCache": {"blockSize": native}}}
    warned = [w.message for w in load_spec_data(doc).warnings if w.path == "spec.kvCache.blockSize"]
    assert len(warned) == 1 and "nothing is cached" in warned[0] and "config.json" in warned[0], warned
    doc["spec"]["kvCache"]["blockSize"] = native // 2
    assert not [w for w in load_spec_data(doc).warnings if w.path == "spec.kvCache.blockSize"]
