"""The context length a spec's engines enforce, as the simulator reads it (spec.model, or the engine's flag)."""

from pathlib import Path

import pytest

from fleetserve.spec import load_spec
from fleetserve.spec.context import context_limit
from fleetserve.spec.load import load_spec_data

EXAMPLES = Path(__file__).parents[2] / "examples"


def _spec(engine: dict, model: dict | None = None):
    return load_spec_data({"apiVersion": "fleetserve.io/v1", "kind": "Endpoint", "metadata": {"name": "c"},
                           "spec": {"model": {"source": "hf:meta-llama/Llama-3.1-8B-Instruct", **(model or {})},
                                    "engine": engine}}).endpoint.spec


@pytest.mark.parametrize("engine,model,expected", [
    ({"kind": "vllm", "args": ["--max-model-len", "8192"]}, None, (8192, "spec.engine.args --max-model-len")),
    ({"kind": "vllm", "args": ["--max-model-len=2048", "--dtype", "bfloat16"]}, None,
     (2048, "spec.engine.args --max-model-len")),
    ({"kind": "sglang", "args": ["--context-length", "4096"]}, None, (4096, "spec.engine.args --context-length")),
    ({"kind": "vllm", "args": ["--max-model-len", "8192"]}, {"contextLength": 1024},
     (1024, "spec.model.contextLength")),
    ({"kind": "sglang", "args": ["--max-model-len", "8192"]}, None, None),  # not SGLang's flag
    ({"kind": "vllm", "args": ["--max-model-len", "4k"]}, None, (4000, "spec.engine.args --max-model-len")),
    ({"kind": "vllm", "args": ["--max-model-len=32K"]}, None, (32768, "spec.engine.args --max-model-len")),
    ({"kind": "vllm", "args": ["--max-model-len", "-1"]}, None, None),  # vLLM: as long as memory allows
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
    ({"kind": "vllm", "args": ["--max-model-len", "8192"]}, {"contextLength": 4096}),
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
